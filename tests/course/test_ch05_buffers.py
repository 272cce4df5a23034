"""Chapter 05: buffers under each strategy; slot 0's in-place updates survive, every other slot's are lost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach.course import demos
from dpteach.replicate import STRATEGIES as REGISTRY

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = list(REGISTRY)
DEEP_COPY = ["clone", "rewire"]  # the strategies that deep-copy buffers, as Cloneable::clone did


GPU = [
    pytest.param(["cuda:0", "cuda:0"], marks=pytest.mark.cuda, id="cuda0x2"),
    pytest.param(["cuda:0", "cpu"], marks=pytest.mark.cuda, id="cuda0+cpu"),
    pytest.param(["cuda:0", "cuda:1"], marks=pytest.mark.multigpu, id="cuda0+cuda1"),
]  # torch.cuda.comm's path


def make_model(device="cpu"):
    torch.manual_seed(0)
    return nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 1)).to(device)


def batch(generator, rows=16):
    return torch.randn(rows, 4, generator=generator) * 2 + 3


@pytest.mark.parametrize("devices", [["cpu"] * 2, ["cpu"] * 3] + GPU)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_only_broadcast_slot0_shares_buffer_storage(strategy, devices):
    model = make_model(devices[0])
    replicas = dpteach.replicate(model, devices, strategy=strategy)
    shares = [r[0].running_mean.data_ptr() == model[0].running_mean.data_ptr() for r in replicas]
    expected = [strategy == "broadcast"] + [False] * (len(devices) - 1)
    assert shares == expected  # slot 0 aliases under broadcast only; every later slot owns its storage


@pytest.mark.parametrize("devices", [["cpu"] * 2, ["cpu"] * 4] + GPU)
def test_broadcast_running_stats_are_exactly_slot0s_update(devices):
    x = batch(torch.Generator().manual_seed(0)).to(devices[0])
    model = make_model(devices[0])
    dpteach.DataParallel(model, devices)(x)
    slot0_only = make_model(devices[0])[0]
    slot0_only(x.chunk(len(devices))[0])  # one device fed only what scatter gives slot 0
    assert_close(model[0].running_mean, slot0_only.running_mean)  # slot 0's in-place update survived ...
    assert_close(model[0].running_var, slot0_only.running_var)
    assert model[0].num_batches_tracked.item() == 1  # ... once: the other slots' updates were lost
    whole = make_model(devices[0])[0]
    whole(x)
    assert not torch.allclose(model[0].running_mean, whole.running_mean)  # not what the whole batch gives


@pytest.mark.parametrize("strategy", DEEP_COPY)
def test_deep_copied_buffers_never_move(strategy):
    model = make_model()
    dpteach.DataParallel(model, ["cpu"] * 2, strategy=strategy)(batch(torch.Generator().manual_seed(0)))
    assert torch.equal(model[0].running_mean, torch.zeros(4))  # no slot wrote into the model (#21144)
    assert torch.equal(model[0].running_var, torch.ones(4))
    assert model[0].num_batches_tracked.item() == 0


def test_slot1_updates_its_own_copy_then_it_is_dropped():
    x = batch(torch.Generator().manual_seed(0))
    model = make_model()
    replicas = dpteach.replicate(model, ["cpu"] * 2)
    pieces = dpteach.scatter(x, ["cpu"] * 2)
    for replica, piece in zip(replicas, pieces):
        replica(piece)
    slot1_only = make_model()[0]
    slot1_only(pieces[1])
    assert_close(replicas[1][0].running_mean, slot1_only.running_mean)  # slot 1 did the work ...
    assert not torch.allclose(
        model[0].running_mean, replicas[1][0].running_mean
    )  # ... in a copy the model never sees
    fresh = dpteach.replicate(model, ["cpu"] * 2)
    assert_close(
        fresh[1][0].running_mean, model[0].running_mean
    )  # the next replicas start from the model again


def run_many(steps=30):
    generator = torch.Generator().manual_seed(0)
    runs = {name: make_model() for name in ["one device", *STRATEGIES]}
    slot0_only = make_model()[0]
    for _ in range(steps):
        x = batch(generator)
        for name, net in runs.items():
            (net if name == "one device" else dpteach.DataParallel(net, ["cpu"] * 2, strategy=name))(x)
        slot0_only(x.chunk(2)[0])
    return runs, slot0_only, generator


def test_over_many_steps():
    runs, slot0_only, generator = run_many()
    assert_close(
        runs["broadcast"][0].running_mean, slot0_only.running_mean
    )  # the dots lie on the dashed line
    for name in DEEP_COPY:
        assert torch.equal(runs[name][0].running_mean, torch.zeros(4))  # never leaves zero
        assert runs[name][0].num_batches_tracked.item() == 0
    assert runs["broadcast"][0].running_mean[0].item() > 2  # climbs towards the true mean 3, like one device
    x = batch(generator)
    with torch.no_grad():
        expected = runs["one device"].eval()(x)
        gap = {n: (runs[n].eval()(x) - expected).abs().max().item() for n in ["broadcast", "rewire"]}
    assert gap["rewire"] > 5 * gap["broadcast"]  # in eval mode the never-updated statistics are far off


def sorted_batch(generator):
    """The chapter's sorted batch: the first 8 rows have mean 6, the last 8 mean 0."""
    return torch.cat([torch.randn(8, 4, generator=generator) + 6, torch.randn(8, 4, generator=generator)])


@pytest.mark.parametrize("slots", [2, 4])
def test_sorted_batches_follow_slot0s_half(slots):
    generator = torch.Generator().manual_seed(0)
    model, whole, slot0_only = make_model(), make_model()[0], make_model()[0]
    for _ in range(30):
        x = sorted_batch(generator)
        dpteach.DataParallel(model, ["cpu"] * slots, strategy="broadcast")(x)
        whole(x)
        slot0_only(x.chunk(slots)[0])
    assert_close(model[0].running_mean, slot0_only.running_mean)  # the right panel: dashes on the dots
    limit = 6 * (1 - 0.9**30)  # where 30 updates with momentum 0.1 take a mean of 6, from 0
    # slot 0's half, mean 6, on 2 slots and on 4 (exercise 2)
    assert (model[0].running_mean - limit).abs().max() < 0.5
    assert (whole.running_mean - 3 * (1 - 0.9**30)).abs().max() < 0.5  # the whole data has mean 3


def test_fewer_rows_on_slot0_give_a_noisier_batch_mean():
    generator = torch.Generator().manual_seed(0)
    spread = {
        n: torch.stack([sorted_batch(generator).chunk(n)[0].mean(0) for _ in range(400)]).std(0).mean().item()
        for n in (2, 4)
    }
    assert abs(spread[2] - 8**-0.5) < 0.05 and abs(spread[4] - 4**-0.5) < 0.05  # sigma / sqrt(rows)
    assert spread[4] > 1.2 * spread[2]  # exercise 2: four slots, half the rows, a wider spread


def test_momentum_none_averages_slot0s_batch_means_once_per_step():
    generator = torch.Generator().manual_seed(0)
    model = make_model()
    model[0].momentum = None  # exercise 3: make_model takes no momentum
    net = dpteach.DataParallel(model, ["cpu"] * 2, strategy="broadcast")
    seen = []
    for _ in range(200):
        x = batch(generator)
        seen.append(x.chunk(2)[0].mean(0))
        net(x)
    assert model[0].num_batches_tracked.item() == 200  # one count per step: slot 1's went to its copy
    assert_close(model[0].running_mean, torch.stack(seen).mean(0))  # the plain average of slot 0's means
    assert (model[0].running_mean - 3).abs().max() < 0.15  # about 3 for this data


@pytest.mark.parametrize("devices", [["cpu"] * 2, ["cpu"] * 3] + GPU)
def test_call_counter_what_survives(devices):
    x = torch.randn(8, 3, device=devices[0])
    expected = {"one device": (3, 3, 3), "broadcast": (0, 3, 0), "clone": (0, 0, 0), "rewire": (0, 0, 0)}
    for name, (calls, in_place, rebound) in expected.items():
        counter = demos.CallCounter().to(devices[0])
        net = counter if name == "one device" else dpteach.DataParallel(counter, devices, strategy=name)
        for _ in range(3):
            net(x)
        assert counter.calls == calls  # a plain attribute: rebound in the replica's own __dict__ (#2864)
        assert counter.calls_in_place.item() == in_place  # in place: slot 0 only, once per step
        assert counter.calls_rebound.item() == rebound  # rebinding: lost even on slot 0


def test_call_counter_replicas_each_count_their_own_call():
    counter = demos.CallCounter()
    replicas = dpteach.replicate(counter, ["cpu"] * 2)
    for replica in replicas:
        replica(torch.randn(2, 3))
    assert [r.calls for r in replicas] == [1, 1]  # each replica counted in its own copy
    assert counter.calls_in_place.item() == 1  # only slot 0's increment reached the module


def _counter(update_in_place: bool):
    class MyCounter(demos.CallCounter):
        def forward(self, x):
            self.calls += 1
            self.calls_in_place.add_(1)
            if update_in_place:
                self.calls_rebound.add_(1)
            else:
                self.calls_rebound = self.calls_rebound + 1
            return self.linear(x)

    return MyCounter


def test_exercise_1_check_accepts_the_worked_answer():
    from dpteach.course import checks

    verdict = checks.counter_survives(_counter(update_in_place=True), 3)
    assert verdict.ok and verdict.message.startswith("Correct!")


def test_exercise_1_check_says_what_to_change():
    from dpteach.course import checks

    checks.reset()
    tries = [checks.counter_survives(_counter(update_in_place=False), 3) for _ in range(3)]
    assert not any(t.ok for t in tries)
    assert "Update it in place" in tries[0].message and "add_(1)" not in tries[0].message  # no answer yet
    assert r"self.calls_rebound.add_(1)" in tries[2].message  # the third try gives the answer


@pytest.mark.parametrize(
    "predicted, why",
    [
        (0, "did not bind a new tensor"),
        (6, "one per replica call"),
        (1, "neither 0 nor one per replica call (6)"),
    ],
)
def test_exercise_1_check_checks_the_prediction(predicted, why):
    """A right class with a wrong prediction is not yet right: the message names the count and asks why."""
    from dpteach.course import checks

    checks.reset()
    verdict = checks.counter_survives(_counter(update_in_place=True), predicted)
    assert not verdict.ok and verdict.problem == "prediction"
    assert f"your class counts 3, and you predicted {predicted}" in verdict.message and why in verdict.message
    assert "predicted = 3" not in verdict.message  # the answer comes from the third try only
    assert "one per step" not in verdict.message  # one per step is the right answer, 3, not this guess
    unset = checks.counter_survives(_counter(update_in_place=True))
    assert not unset.ok and "Fill in `predicted`" in unset.message  # no prediction yet: no hint spent
    assert checks.counter_survives(_counter(update_in_place=True), "3").problem == "not an answer"


def test_plus_equals_on_a_buffer_is_in_place_and_the_check_accepts_it():
    from dpteach.course import checks

    class MyCounter(demos.CallCounter):
        def forward(self, x):
            self.calls += 1
            self.calls_in_place.add_(1)
            self.calls_rebound += 1  # exercise 1: Tensor.__iadd__ adds in place, the name keeps the tensor
            return self.linear(x)

    counter = MyCounter()
    net = dpteach.DataParallel(counter, ["cpu"] * 2)
    for _ in range(3):
        net(torch.randn(4, 3))
    assert counter.calls_rebound.item() == 3 and counter.calls == 0  # the tensor survives, the int does not
    assert checks.counter_survives(MyCounter, 3).ok


def test_exercise_1_check_names_a_missing_import_and_never_raises():
    from dpteach.course import checks

    class Broken(demos.CallCounter):
        def forward(self, x):
            return undefined_helper(x)  # noqa: F821

    checks.reset()
    verdict = checks.counter_survives(Broken, 3)
    assert not verdict.ok and "NameError: undefined_helper is not defined" in verdict.message
    assert "Hint" not in verdict.message  # a missing name costs no hint


@pytest.mark.parametrize("slots", [2, 4])
def test_running_means_is_the_figures_loop(slots):
    """demos.running_means feeds each model by its name, as the chapter's first figure says."""
    devices = ["cpu"] * slots
    models = {name: make_model() for name in ["one device", "broadcast", "clone", demos.SLOT0_ROWS]}
    drawn = torch.Generator().manual_seed(0)
    history = demos.running_means(models, lambda: batch(drawn), devices, forwards=5)
    assert {k: len(v) for k, v in history.items()} == dict.fromkeys(models, 5)
    assert_close(
        torch.tensor(history["broadcast"]), torch.tensor(history[demos.SLOT0_ROWS])
    )  # dashes on dots
    assert history["clone"] == [0.0] * 5 and history["one device"] != history["broadcast"]
    generator = torch.Generator().manual_seed(0)
    whole = make_model()
    for _ in range(5):
        whole(batch(generator))
    assert_close(
        models["one device"][0].running_mean, whole[0].running_mean
    )  # "one device" saw whole batches


def test_line_panels_keep_a_name_in_one_colour():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpteach.course import plots

    panels = {
        "left": {"a": [1.0, 2.0], "b": [0.0, 0.0], "c": [0.0, 0.0]},
        "right": {"a": [1.0, 3.0], "c": [2.0, 1.0]},
    }
    fig = plots.line_panels(panels, {"a": "-", "b": "--", "c": ":"}, xlabel="x", ylabel="y", hline=1)
    left, right = fig.axes
    colour = {ax.get_title(): {l.get_label(): l.get_color() for l in ax.get_lines()} for ax in (left, right)}
    assert colour["left"]["a"] == colour["right"]["a"] == "C0"  # a run keeps its colour in both panels
    assert colour["left"]["b, c (same line at 0)"] == "C1" and colour["right"]["c"] == "C2"
    plt.close(fig)


def test_each_replica_normalises_with_its_own_piece():
    """The chapter's section: training-mode outputs and gradients differ from one device's."""
    x = batch(torch.Generator().manual_seed(0))
    one, parallel = make_model(), make_model()
    out_one, out_parallel = one(x), dpteach.DataParallel(parallel, ["cpu"] * 2)(x)
    pieces = x.chunk(2)
    by_piece = torch.cat([make_model()(p) for p in pieces])  # each piece normalised by itself, on one device
    assert_close(out_parallel, by_piece)  # what each replica computes ...
    assert (out_one - out_parallel).abs().max() > 0.1  # ... is not the whole batch's normalisation
    out_one.pow(2).mean().backward()
    out_parallel.pow(2).mean().backward()
    assert not torch.allclose(one[1].weight.grad, parallel[1].weight.grad)  # so the gradients differ too


def _cells():
    import nbformat

    return nbformat.read(ROOT / "notebooks" / "05_buffers_and_batchnorm.ipynb", as_version=4).cells


def test_the_recipe_converts_every_batchnorm_to_syncbatchnorm():
    """The summary's recipe: its first line, run as printed, turns each BatchNorm*d into a SyncBatchNorm."""
    import re

    (cell,) = [c for c in _cells() if "batchnorm-recipe" in c.metadata.get("tags", [])]
    (line,) = [
        ln for ln in re.findall(r"```python\n(.*?)```", cell.source, re.S)[0].splitlines() if "convert" in ln
    ]
    scope = {"nn": nn, "model": make_model()}
    exec(line, scope)
    assert isinstance(scope["model"][0], nn.SyncBatchNorm)  # converted in place of the BatchNorm1d ...
    assert_close(scope["model"][0].running_var, torch.ones(4))  # ... keeping its statistics
    assert "DistributedDataParallel" in cell.source  # SyncBatchNorm syncs only under DDP


def test_exercise_2_leaves_devices_as_the_set_up_made_them():
    """Exercise 2 runs four slots from a list of its own, `four`: no exercise rebinds `devices`, which the
    cells above and the other exercises use."""
    cells = _cells()
    (exercises,) = [c.source for c in cells if c.source.startswith("## Exercises")]
    (ex2,) = [c.source for c in cells if "ex2-check" in c.metadata.get("tags", [])]
    assert "`four`" in exercises and "four = [devices[0]] * 4" in ex2
    rebinds = re.compile(r"^\s*devices\s*=", re.M)
    cells_ex = [c for c in cells if any(t.startswith("ex") for t in c.metadata.get("tags", []))]
    checks = [c for c in cells_ex if any(t.endswith("-check") for t in c.metadata["tags"])]
    assert len(checks) == 4 and not any(rebinds.search(c.source) for c in cells_ex)
    assert not rebinds.search(exercises)


# --- exercises 2 to 4: their checks ----------------------------------------------------------


def _spread(generator, n, batches=200):
    """Exercise 2's measurement, as its hint writes it: the std of slot 0's batch mean on n slots."""
    return torch.stack([sorted_batch(generator).chunk(n)[0].mean(0) for _ in range(batches)]).std(0)


def test_exercise_2_check_accepts_a_right_measurement_on_any_seed():
    from dpteach.course import checks

    for seed in range(20):  # the learner's generator is wherever the chapter left it: any seed
        generator = torch.Generator().manual_seed(seed)
        spread = {n: _spread(generator, n) for n in (2, 4)}
        assert checks.slot0_noise(6, spread).ok, (seed, spread)  # the four features' values
        one = {n: s[seed % 4].item() for n, s in spread.items()}
        assert checks.slot0_noise(5.8, one).ok, (seed, one)  # one feature's, and 6 read off the figure


@pytest.mark.parametrize(
    "follows, spread, problem",
    [
        (3, {2: 0.35, 4: 0.5}, "whole data"),
        (0, {2: 0.35, 4: 0.5}, "second half"),
        (6, {2: 0.5, 4: 0.35}, "swapped"),
        (6, {2: 0.125, 4: 0.25}, "variance"),
        (6, {2: 0.71, 4: 1.0}, "alike rows"),
        (6, {2: 0.25, 4: 0.25}, "whole batch"),
        (6, {2: 1.0, 4: 1.0}, "rows"),
        (6, {2: 0.35, 4: 0.8}, "off"),
        ("first half", {2: 0.35, 4: 0.5}, "not an answer"),
        (6, [0.35, 0.5], "not an answer"),
    ],
)
def test_exercise_2_check_names_the_slip(follows, spread, problem):
    from dpteach.course import checks

    checks.reset()
    verdict = checks.slot0_noise(follows, spread)
    assert not verdict.ok and verdict.problem == problem


def test_exercise_2_check_gives_the_answer_only_from_the_third_try():
    from dpteach.course import checks

    checks.reset()
    tries = [checks.slot0_noise(3, {2: 0.35, 4: 0.5}) for _ in range(3)]
    labels = [re.search(r"^(Hint \d of \d|The answer):", t.message, re.M).group(1) for t in tries]
    assert labels == ["Hint 1 of 2", "Hint 2 of 2", "The answer"]
    assert "range(200)" not in tries[0].message  # the first hint names the idea, not the code
    assert checks.slot0_noise(..., {2: 0.35, 4: 0.5}).problem == ""  # an unset answer costs no hint


def _momentum_none_run(devices=("cpu", "cpu"), steps=200):
    """Exercise 3 as its text says: a fresh model, momentum None, 200 "broadcast" forwards."""
    generator = torch.Generator().manual_seed(0)
    model = make_model()
    model[0].momentum = None
    net = dpteach.DataParallel(model, list(devices))
    for _ in range(steps):
        net(batch(generator))
    return model


@pytest.mark.parametrize("slots", [2, 3])
def test_exercise_3_check_accepts_the_worked_answer(slots):
    from dpteach.course import checks

    model = _momentum_none_run(["cpu"] * slots)
    verdict = checks.plain_average(200, 3, model, ["cpu"] * slots)
    assert verdict.ok and f"not {200 * slots} replica calls" in verdict.message
    read_off = checks.plain_average(
        model[0].num_batches_tracked, model[0].running_mean, model, ["cpu"] * slots
    )
    assert read_off.ok  # the tensors read off the model


def test_exercise_3_starter_cell_and_the_answers_loop_give_what_the_check_accepts():
    """The cell above the check builds the model as the exercise says; with Answer 3's loop the check passes,
    and unrun it says to run the forwards (no hint spent)."""
    from dpteach.course import checks

    cells = _cells()
    (starter,) = [c.source for c in cells if "ex3-run" in c.metadata.get("tags", [])]
    (exercises,) = [c.source for c in cells if c.source.startswith("## Exercises")]
    loop = re.search(r"(for _ in range\(200\):\n\s+net\(alike_batch\(\)\))", exercises)[1]
    generator = torch.Generator().manual_seed(0)
    scope = {"make_model": make_model, "dpteach": dpteach, "devices": ["cpu"] * 2}
    scope["alike_batch"] = lambda: batch(generator)
    exec(starter, scope)
    checks.reset()
    unrun = checks.plain_average(200, 3, scope["model"], scope["devices"])
    assert unrun.problem == "not run" and "Hint" not in unrun.message
    exec(" ".join(loop.split()).replace(": net", ":\n    net"), scope)
    assert scope["model"][0].num_batches_tracked.item() == 200  # one per step on 2 slots, not 400
    assert checks.plain_average(200, 3, scope["model"], scope["devices"]).ok


@pytest.mark.parametrize(
    "tracked, converges_to, problem",
    [
        (400, 3, "every slot"),  # one count per replica call, on 2 slots
        (0, 3, "no slot"),
        (100, 3, "count"),
        (200, 4, "variance"),
        (200, 0, "zero"),
        (200, 6, "wrong mean"),
        (200, "three", "not an answer"),
        (200.5, 3, "not an answer"),
    ],
)
def test_exercise_3_check_names_the_slip(tracked, converges_to, problem):
    from dpteach.course import checks

    checks.reset()
    verdict = checks.plain_average(tracked, converges_to, _momentum_none_run(), ["cpu"] * 2)
    assert not verdict.ok and verdict.problem == problem
    if problem == "every slot":
        assert "200" not in verdict.message  # what to change, not the count


def test_exercise_3_check_says_when_the_run_was_not_the_exercises():
    from dpteach.course import checks

    checks.reset()
    with_momentum = make_model()
    dpteach.DataParallel(with_momentum, ["cpu"] * 2)(batch(torch.Generator().manual_seed(0)))
    assert checks.plain_average(200, 3, with_momentum, ["cpu"] * 2).problem == "momentum"
    fresh = make_model()
    fresh[0].momentum = None
    assert checks.plain_average(200, 3, fresh, ["cpu"] * 2).problem == "not run"  # no forward yet
    clone = make_model()
    clone[0].momentum = None
    dpteach.DataParallel(clone, ["cpu"] * 2, strategy="clone")(batch(torch.Generator().manual_seed(0)))
    assert checks.plain_average(200, 3, clone, ["cpu"] * 2).problem == "not run"  # nothing reached it


@pytest.mark.parametrize("devices", [["cpu"] * 2, ["cpu"] * 3] + GPU)
def test_exercise_4_spectral_norm_iterates_the_model_once_per_step(devices):
    """What the check counts: after 3 forwards the model's weight_u has had 3 power iterations under
    broadcast (slot 0's, in place) and none under clone, whatever the number of slots."""
    from dpteach.course import checks

    assert checks._power_iterations("broadcast", devices, 3) == 3  # one per step, not one per replica call
    assert checks._power_iterations("clone", devices, 3) == 0  # every slot iterated a copy
    layer = torch.nn.utils.spectral_norm(nn.Linear(4, 3)).to(devices[0])
    replicas = dpteach.replicate(layer, devices, strategy="broadcast")
    shares = [r.weight_u.data_ptr() == layer.weight_u.data_ptr() for r in replicas]
    assert shares == [True] + [False] * (len(devices) - 1)  # slot 0's weight_u is the model's own


@pytest.mark.parametrize(
    "iterations, problem",
    [
        ({"broadcast": 6, "clone": 0}, "every slot"),
        ({"broadcast": 0, "clone": 0}, "no slot"),
        ({"broadcast": 2, "clone": 0}, "off"),
        ({"broadcast": 3, "clone": 3}, "clone shares"),
        ({"broadcast": True, "clone": False}, "not an answer"),
        ({"broadcast": "3", "clone": 0}, "not an answer"),
    ],
)
def test_exercise_4_check_names_the_slip(iterations, problem):
    from dpteach.course import checks

    checks.reset()
    verdict = checks.spectral_norm_iterations(iterations)
    assert not verdict.ok and verdict.problem == problem
    assert verdict.message.startswith("Not yet")


def test_exercise_4_check_accepts_the_count_and_gives_the_answer_from_the_third_try():
    from dpteach.course import checks

    checks.reset()
    state = torch.random.get_rng_state()
    assert checks.spectral_norm_iterations({"broadcast": 3, "clone": 0}).ok
    assert checks.spectral_norm_iterations({"broadcast": 3.0, "clone": 0}, ["cpu"] * 3).ok
    assert torch.equal(state, torch.random.get_rng_state())  # the learner's random numbers are untouched
    tries = [checks.spectral_norm_iterations({"broadcast": 6, "clone": 0}).message for _ in range(3)]
    assert all("one iteration per replica call" in t for t in tries)  # what a 6 means, from the first try
    assert '"broadcast": 3' not in tries[0] + tries[1] and '"broadcast": 3' in tries[2]
    assert "Fill in both" in checks.spectral_norm_iterations({"broadcast": ..., "clone": 0}).message


def test_exercises_1_to_4_call_their_checks():
    """Each check cell, found by its tag, calls its helper with the answer names the cell sets."""
    calls = {
        "ex1-check": 'checks.counter_survives(globals().get("MyCounter", ...), predicted)',
        "ex2-check": "checks.slot0_noise(follows, spread)",
        "ex3-check": "checks.plain_average(tracked, converges_to, model, devices)",
        "ex4-check": "checks.spectral_norm_iterations(iterations, devices)",
    }
    for tag, call in calls.items():
        (cell,) = [c for c in _cells() if tag in c.metadata.get("tags", [])]
        last = cell.source.rstrip().splitlines()[-1].split("  #")[0]
        assert last == call, tag  # the last line shows the verdict


def test_line_panels_name_the_reference_line_in_every_legend():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpteach.course import plots

    panels = {"left": {"a": [1.0, 2.0]}, "right": {"a": [2.0, 3.0]}}
    fig = plots.line_panels(panels, {"a": "-"}, xlabel="x", ylabel="y", hline=3, hline_label="mean, 3")
    for ax in fig.axes:  # the figure says what its grey line is
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "mean, 3"]
    plt.close(fig)
    bare = plots.line_panels(panels, {"a": "-"}, xlabel="x", ylabel="y", hline=3)
    assert [t.get_text() for t in bare.axes[0].get_legend().get_texts()] == ["a"]  # unnamed: no entry
    plt.close(bare)


def test_the_replicate_py_listing_is_the_installed_torchs_own():
    """The listing after "Which slots share storage" quotes the two calls of torch's replicate.py that
    copy the buffers; they must stand, in that order and one after the other, in the installed file."""
    import inspect

    (cell,) = [c for c in _cells() if c.id == "c09-source"]
    (listing,) = re.findall(r"```python\n(.*?)```", cell.source, re.S)
    quoted = [line.strip() for line in listing.strip().splitlines()]
    source = Path(inspect.getsourcefile(torch.nn.parallel.replicate)).read_text().splitlines()
    installed = [line.strip() for line in source]
    starts = [n for n in range(len(installed)) if installed[n : n + len(quoted)] == quoted]
    assert starts, (
        f"torch {torch.__version__}'s replicate.py no longer has the chapter's listing (cell c09-source): "
        "copy the calls that fill buffer_copies_rg and buffer_copies_not_rg from it into the listing, and "
        "check that the prose around it still holds"
    )
    assert "buffer_copies_rg = _broadcast_coalesced_reshape(buffers_rg, devices, detach=detach)" in quoted
    assert "buffers_not_rg, devices, detach=True" in quoted  # the buffers that need no grad: no Broadcast
    (prose,) = [c.source for c in _cells() if c.id == "c09-after"]
    assert "outputs[0] =\ntensors.vec()" in prose or "outputs[0] = tensors.vec()" in prose  # comm.cpp


def test_the_eval_cell_shows_sorted_rows_about_as_far_off_as_never_updating():
    """The eval-mode cell, run after the figure's cells: on alike rows "rewire" lands far off and "broadcast"
    close; on sorted rows "broadcast" keeps the first half's mean and lands within a factor 2 of "rewire",
    which never updated, as the prose under it says. Checked on 50 fresh eval batches, not only the chapter's:
    on 200 batches the ratio ran from 0.56 to 1.87, and the sorted gap was at least 20 times the alike one."""
    import contextlib
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells()
    scope: dict = {}
    for cell_id in ("c02", "c21"):
        (cell,) = [c for c in cells if c.id == cell_id]
        with contextlib.redirect_stdout(io.StringIO()):
            exec(cell.source, scope)
    plt.close("all")
    (cell,) = [c for c in cells if c.id == "c25"]
    for seed in range(50):  # the eval batch is wherever the chapter's generator is: any batch
        scope["generator"] = torch.Generator().manual_seed(seed)
        with contextlib.redirect_stdout(io.StringIO()):
            exec(cell.source, scope)  # the cell's own asserts: far from alike broadcast, near rewire
        gap = scope["gap_of"]
        assert gap["rewire"] > 5 * gap["broadcast"], seed  # alike rows: never-updated statistics are far off
    assert scope["sorted_models"]["broadcast"][0].running_mean[0].item() > 5  # the first half's, mean 6
    (prose,) = [c.source for c in cells if c.id == "c25-after"]
    assert "about as far off" in " ".join(prose.split()) and "never updated" in prose
