"""Chapter 07: double backward through DataParallel matches one device under "broadcast"; "rewire" refuses.

The reference is the same model on one device; every comparison uses torch.testing.assert_close.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import dpteach
from dpteach.course import story
from dpteach.functions import Broadcast, ReduceAddCoalesced

GPU = [
    pytest.param(["cuda:0", "cuda:0"], marks=pytest.mark.cuda, id="cuda0x2"),
    pytest.param(["cuda:0", "cpu"], marks=pytest.mark.cuda, id="cuda0+cpu"),
]  # two distinct devices
DEVICES = [["cpu"] * 2, ["cpu"] * 3]


def tol(a, b):
    assert_close(a, b, rtol=1e-4, atol=1e-6)


def penalised_loss(net, x, y):
    x = x.clone().requires_grad_(True)
    output = net(x)
    (grad_x,) = torch.autograd.grad(output.sum(), x, create_graph=True)
    return F.mse_loss(output, y) + ((grad_x.norm(dim=1) - 1) ** 2).mean()


def gradient_norm_loss(net, model, x, y, weight=0.1):
    loss = F.mse_loss(net(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    return loss + weight * sum(g.pow(2).sum() for g in grads)


def hessian_vector_product(net, model, x, y, v):
    params = list(model.parameters())
    loss = F.mse_loss(net(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    return torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params)


@pytest.mark.parametrize("devices", DEVICES + GPU)
@pytest.mark.parametrize("strategy", ["broadcast", "rewire"])
def test_input_gradient_penalty_matches_one_device(strategy, devices):
    x, y = (t.to(devices[0]) for t in story.make_data())
    reference = story.make_model().to(devices[0])
    expected = penalised_loss(reference, x, y)
    expected.backward()
    model = story.make_model().to(devices[0])
    loss = penalised_loss(dpteach.DataParallel(model, devices, strategy=strategy), x, y)
    loss.backward()
    tol(loss, expected)  # the same penalised loss
    for p, q in zip(model.parameters(), reference.parameters()):
        tol(p.grad, q.grad)  # its first backward goes to x, never through ReduceAdd: rewire works too


@pytest.mark.parametrize("devices", DEVICES + GPU)
def test_parameter_gradient_penalty_matches_one_device_under_broadcast(devices):
    x, y = (t.to(devices[0]) for t in story.make_data())
    reference = story.make_model().to(devices[0])
    gradient_norm_loss(reference, reference, x, y).backward()
    model = story.make_model().to(devices[0])
    gradient_norm_loss(dpteach.DataParallel(model, devices), model, x, y).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        tol(p.grad, q.grad)  # second-order gradients through Broadcast / ReduceAddCoalesced are right


@pytest.mark.parametrize("devices", DEVICES + GPU)
def test_hessian_vector_product_matches_one_device_under_broadcast(devices):
    x, y = (t.to(devices[0]) for t in story.make_data())
    reference = story.make_model().to(devices[0])
    v = [torch.randn_like(p) for p in reference.parameters()]
    expected = hessian_vector_product(reference, reference, x, y, v)
    model = story.make_model().to(devices[0])
    hv = hessian_vector_product(dpteach.DataParallel(model, devices), model, x, y, v)
    for a, b in zip(hv, expected):
        tol(a, b)  # H v through DataParallel is H v on one device
    assert any(h.abs().sum() > 0 for h in hv)  # and not trivially zero


def test_hessian_vector_product_is_linear_in_v():
    x, y = story.make_data()
    model = story.make_model()
    net = dpteach.DataParallel(model, ["cpu"] * 2)
    v1 = [torch.randn_like(p) for p in model.parameters()]
    v2 = [torch.randn_like(p) for p in model.parameters()]
    h1, h2 = (hessian_vector_product(net, model, x, y, v) for v in (v1, v2))
    h12 = hessian_vector_product(net, model, x, y, [a + b for a, b in zip(v1, v2)])
    for a, b, c in zip(h12, h1, h2):
        tol(a, b + c)  # exercise 2: H(v1 + v2) = H v1 + H v2


@pytest.mark.parametrize("devices", [["cpu"] * 2] + GPU)
@pytest.mark.parametrize("loss", ["gradient_norm", "hvp"])
def test_rewire_refuses_double_backward_naming_reduce_add(loss, devices):
    x, y = (t.to(devices[0]) for t in story.make_data())
    model = story.make_model().to(devices[0])
    net = dpteach.DataParallel(model, devices, strategy="rewire")
    with pytest.raises(
        RuntimeError, match="ReduceAdd can only be used during the backward pass of data parallel"
    ):
        if loss == "gradient_norm":
            gradient_norm_loss(net, model, x, y)
        else:
            hessian_vector_product(net, model, x, y, [torch.ones_like(p) for p in model.parameters()])


def test_first_gradient_hangs_off_reduce_add_coalesced():
    x, y = story.make_data()
    model = story.make_model()
    loss = F.mse_loss(dpteach.DataParallel(model, ["cpu"] * 2)(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    assert all(
        type(g.grad_fn).__name__ == "ReduceAddCoalescedBackward" for g in grads
    )  # a differentiable node


@pytest.mark.parametrize("devices", DEVICES)
def test_broadcast_passes_gradgradcheck(devices):
    tensors = (
        torch.randn(3, 2, dtype=torch.double, requires_grad=True),
        torch.randn(4, dtype=torch.double, requires_grad=True),
    )
    assert torch.autograd.gradgradcheck(
        lambda *t: Broadcast.apply(devices, *t), tensors
    )  # second derivatives right


@pytest.mark.parametrize("devices", DEVICES)
def test_reduce_add_coalesced_passes_gradgradcheck(devices):
    tensors = tuple(torch.randn(3, dtype=torch.double, requires_grad=True) for _ in devices)
    assert torch.autograd.gradgradcheck(lambda *t: ReduceAddCoalesced.apply(devices[0], 1, *t), tensors)
    u = torch.randn(3, dtype=torch.double, requires_grad=True)  # a gradient that itself requires grad
    (out,) = ReduceAddCoalesced.apply(devices[0], 1, *tensors)
    grads = torch.autograd.grad((out * u).sum(), tensors, create_graph=True)
    assert {type(g.grad_fn).__name__ for g in grads} == {"BroadcastBackward"}  # its backward's partner
    (out,) = ReduceAddCoalesced.apply(devices[0], 1, *tensors)
    plain = torch.autograd.grad(out.sum(), tensors, create_graph=True)  # a gradient that needs none
    # apply records nothing for inputs that need no grad: exercise 5's DetachedBroadcast
    assert all(g.grad_fn is None for g in plain)


@pytest.mark.parametrize("devices", DEVICES)
def test_hessian_vector_product_traffic(devices):
    x, y = story.make_data()
    model = story.make_model()
    net = dpteach.DataParallel(model, devices)
    params = list(model.parameters())
    v = [torch.ones_like(p) for p in params]
    with dpteach.comm.traffic() as forward:
        loss = F.mse_loss(net(x), y)
    with dpteach.comm.traffic() as first:
        grads = torch.autograd.grad(loss, params, create_graph=True)
    with dpteach.comm.traffic() as second:
        torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params)
    P = sum(p.numel() * p.element_size() for p in params)
    out_bytes = x.shape[0] * 1 * 4  # the model's output: one float32 per row
    assert forward.by_op()["broadcast"] == (len(devices) - 1) * P  # the forward broadcasts the parameters
    assert first.bytes == 0  # summing gradients within one device copies nothing
    assert second.by_op() == {
        "broadcast": (len(devices) - 1) * P,
        "gather": out_bytes,
    }  # ReduceAddCoalesced's backward broadcasts again
    # the chapter's sentence: the second backward's Broadcast of v copies as many bytes as the forward's
    assert second.by_op()["broadcast"] == forward.by_op()["broadcast"]


@pytest.mark.parametrize("strategy, refused", [("rewire", {"b", "d"}), ("broadcast", set())])
def test_reduce_add_refuses_only_a_recording_backward_that_passes_it(strategy, refused):
    """Exercise 2: of four calls, only those that record (create_graph=True) and run ReduceAdd, on the way
    to the parameters, raise; the input's gradient never runs it. Under "broadcast" all four run."""
    import warnings

    x, y = story.make_data()
    calls = {
        "a": lambda loss, params, x_in: torch.autograd.grad(loss, params),
        "b": lambda loss, params, x_in: torch.autograd.grad(loss, params, create_graph=True),
        "c": lambda loss, params, x_in: torch.autograd.grad(loss, x_in, create_graph=True),
        "d": lambda loss, params, x_in: loss.backward(create_graph=True),
    }
    raised = set()
    for letter, call in calls.items():
        model = story.make_model()
        x_in = x.clone().requires_grad_()
        loss = F.mse_loss(dpteach.DataParallel(model, ["cpu"] * 2, strategy=strategy)(x_in), y)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # backward(create_graph=True)'s reference-cycle warning
                call(loss, list(model.parameters()), x_in)
        except RuntimeError as err:
            assert "ReduceAdd can only be used during the backward pass" in str(err)
            raised.add(letter)
    assert raised == refused


class _PenaltyInside(torch.nn.Module):
    """Exercise 3: the input-gradient penalty inside forward, its per-row terms returned beside the output."""

    def __init__(self, net, requires_grad=True):
        super().__init__()
        self.net, self.requires_grad = net, requires_grad

    def forward(self, x):
        if self.requires_grad:
            x = x.detach().requires_grad_()  # the scattered piece must require grad
        out = self.net(x)
        (grad_x,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return out, (grad_x.norm(dim=1) - 1) ** 2


def _inside_loss(module, x, y):
    out, terms = module(x)
    return F.mse_loss(out, y) + terms.mean()  # averaged once, over the whole batch's rows


@pytest.mark.parametrize("devices", DEVICES)
def test_exercise_3_penalty_inside_forward_matches_one_device(devices):
    x, y = story.make_data()
    reference = story.make_model()
    expected = _inside_loss(_PenaltyInside(reference), x, y)
    expected.backward()
    model = story.make_model()
    loss = _inside_loss(dpteach.DataParallel(_PenaltyInside(model), devices, strategy="broadcast"), x, y)
    loss.backward()
    tol(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        tol(p.grad, q.grad)
    with pytest.raises(RuntimeError, match="does not require grad"):  # the piece as scattered: no grad
        _inside_loss(dpteach.DataParallel(_PenaltyInside(story.make_model(), False), devices), x, y)


def test_every_node_of_the_penalty_graph_leads_to_weight():
    torch.manual_seed(0)
    devices = ["cpu"] * 2
    small = torch.nn.Linear(2, 1, bias=False)
    replicas = dpteach.replicate(small, devices, strategy="broadcast")
    pieces = dpteach.scatter(torch.randn(4, 2), devices)
    outputs = dpteach.parallel_apply(replicas, [(p,) for p in pieces], devices=devices)
    loss = F.mse_loss(dpteach.gather(outputs, devices[0]), torch.randn(4, 1))
    (grad,) = torch.autograd.grad(loss, [small.weight], create_graph=True)
    penalty = grad.pow(2).sum()
    reaches, order = {}, []

    def walk(fn):  # does fn lead to the original weight?
        if fn not in reaches:
            if type(fn).__name__ == "AccumulateGrad":
                reaches[fn] = fn.variable is small.weight
            else:
                reaches[fn] = any([walk(nxt) for nxt, _ in fn.next_functions if nxt is not None])
            order.append(type(fn).__name__)
        return reaches[fn]

    assert walk(penalty.grad_fn) and all(reaches.values())  # every node lies on a walk to weight
    names = sorted(order)
    expected = ["SumBackward0", "PowBackward0", "ReduceAddCoalescedBackward", "ScatterBackward"]
    expected += ["MseLossBackwardBackward0", "GatherBackward", "BroadcastBackward", "AccumulateGrad"]
    expected += ["TBackward0"] * 2 * 4 + [
        "MmBackward0"
    ] * 2 * 2  # per slot: T, T, Mm, T recorded; Mm, T forward
    assert names == sorted(expected)  # the nodes the first cells' Going-deeper block names, and no others


@pytest.mark.parametrize(
    "model, loss, refused",
    [
        ("linear", "sum", False),
        ("linear", "max", False),
        ("linear", "amax", False),
        ("linear", "mse", True),
        ("linear", "pow", True),
        ("course", "sum", True),
    ],
)
def test_reduce_add_refuses_only_gradients_that_require_grad(model, loss, refused):
    """The Going-deeper block under the first refusal: with create_graph=True, "rewire" takes a loss whose
    gradient needs no grad (one Linear's sum, max, amax) and refuses one computed from the output."""
    x, y = story.make_data()
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1) if model == "linear" else story.make_model()
    out = dpteach.DataParallel(module, ["cpu"] * 2, strategy="rewire")(x)
    value = {
        "sum": lambda: out.sum(),
        "max": lambda: out.max(),
        "amax": lambda: out.amax(dim=1).sum(),
        "mse": lambda: F.mse_loss(out, y),
        "pow": lambda: out.pow(2).sum(),
    }[loss]()
    try:
        grads = torch.autograd.grad(value, list(module.parameters()), create_graph=True)
    except RuntimeError as err:
        assert refused and "ReduceAdd can only be used during the backward pass" in str(err)
    else:
        assert not refused and not any(g.requires_grad for g in grads)


def _chapter_cell(tag):
    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "07_double_backward.ipynb"
    cells = nbformat.read(path, as_version=4).cells
    (at,) = [i for i, c in enumerate(cells) if tag in c.metadata.get("tags", [])]
    return cells, at


def _printed(source, scope):
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(source, scope)  # the cell as a learner runs it
    return printed.getvalue().strip().splitlines()


def _fold(title):
    """The markdown cell holding the Going-deeper block ``title``, its prose, and its python listings."""
    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "07_double_backward.ipynb"
    cells = nbformat.read(path, as_version=4).cells
    (cell,) = [
        c for c in cells if c.cell_type == "markdown" and f"<summary>Going deeper: {title}" in c.source
    ]
    return cell.source, re.findall(r"```python\n(.*?)```", cell.source, re.S)


@pytest.mark.parametrize("devices", DEVICES)
def test_the_byte_cell_prints_equal_broadcasts_of_the_parameters_and_of_v(devices):
    """The cell under "copies `v` to the slots" prints both counts; run as written, each is (slots - 1) times
    the parameters' bytes, and the sentence after it gives that count for two slots."""
    cells, at = _chapter_cell("hvp-bytes")
    before = " ".join(cells[at - 1].source.split("<details>")[0].split())
    assert "second backward runs it, and copies `v` to the slots" in before
    x, y = story.make_data()
    v = [torch.randn_like(p) for p in story.make_model().parameters()]
    scope = {"torch": torch, "F": F, "dpteach": dpteach, "story": story, "devices": devices, "x": x, "y": y}
    lines = _printed(cells[at].source, scope | {"v": v})
    counts = [int(re.fullmatch(r".*: +([\d,]+) bytes", line)[1].replace(",", "")) for line in lines]
    P = sum(p.numel() * p.element_size() for p in story.make_model().parameters())
    assert counts == [(len(devices) - 1) * P] * 2, lines
    after = " ".join(cells[at + 1].source.split())
    assert f"On two slots both are {P} bytes: `v` has the parameters' shapes" in after
    n = sum(p.numel() for p in story.make_model().parameters())
    assert f"{n} floats of 4 bytes, sent to the one slot after slot 0" in after  # the bytes, broken down
    assert P == n * 4


def test_the_gradgradcheck_listing_returns_true_as_the_fold_says():
    text, (listing,) = _fold("gradgradcheck")
    *body, last = listing.strip().splitlines()
    scope = {"torch": torch, "Broadcast": Broadcast, "devices": ["cpu"] * 2}
    exec("\n".join(body), scope)
    assert last.endswith("# True") and eval(last.split("  #")[0], scope) is True
    assert "For `Broadcast` it returns `True`" in text


def test_the_hvp_cell_runs_both_strategies_once():
    """One cell for the Hessian-vector product: "broadcast" matches one device, "rewire" stops at ReduceAdd."""
    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "07_double_backward.ipynb"
    (cell,) = [c for c in nbformat.read(path, as_version=4).cells if c.id == "c16"]
    scope = {"torch": torch, "dpteach": dpteach, "story": story, "devices": ["cpu"] * 2}
    scope["hessian_vector_product"] = hessian_vector_product
    scope["x"], scope["y"] = story.make_data()
    lines = _printed(cell.source, scope)
    assert lines[0].startswith("broadcast: H v matches one device")
    assert lines[1].startswith("rewire   : RuntimeError: ReduceAdd can only be used during the backward pass")


def test_the_ddp_cell_prints_the_tasks_lines_and_names_its_helpers():
    """The cell above the DDP run prints the task, and its comment says what each helper is."""
    import inspect

    cells, at = _chapter_cell("ddp-penalty")
    source = cells[at - 1].source
    printed = "\n".join(_printed(source, {"inspect": inspect}))
    assert printed.startswith("def autograd_grad(") and "penalised.backward()" in printed  # the whole task
    assert "whole=" in printed  # with the one-process run the cell compares against
    comment = " ".join(line for line in source.splitlines() if line.startswith("#"))
    for helper in ("make_model", "wrap", "local_shard", "make_data", "loss_fn", "_bucket_strides_quiet"):
        assert helper in printed and f"{helper} " in comment, helper


def test_the_reducer_log_line_is_quoted_as_the_installed_torch_writes_it():
    """The fold quotes the Reducer's message whole, its double spaces kept, as the pieces in libtorch join."""
    text, _ = _fold("why DDP does not average")
    (quote,) = re.findall(r"```text\n(.*?)\n```", text, re.S)
    lib = Path(torch.__file__).parent / "lib"
    blob = b"".join(f.read_bytes() for f in lib.glob("libtorch_cpu.*"))
    at = blob.find(b"Using DistributedDataParallel with create_graph=True")
    if at < 0:
        pytest.skip("this torch build has no libtorch_cpu with the Reducer's strings")
    pieces = [s.decode() for s in blob[at : at + 600].split(b"\x00") if s][:6]
    assert quote == "".join(pieces)
    assert "C10_LOG_EVERY_N(WARNING, 1000)" in text and "#63929" in text


@pytest.mark.slow  # the cell starts two DDP ranks: fresh interpreters importing torch
def test_the_ddp_cell_shows_unaveraged_first_gradients_and_an_averaged_grad():
    cells, at = _chapter_cell("ddp-penalty")
    from dpteach import distributed

    lines = _printed(cells[at].source, {"distributed": distributed})
    first, own, grad, whole = (float(re.search(r"(\S+)$", line)[1]) for line in lines)
    assert first > 1e-3  # the processes' torch.autograd.grad gradients differ: each is its own rows'
    assert own == 0.0 and grad == 0.0  # each is its module's alone; .grad is one average on both
    assert whole > 1e-3  # the average of per-process penalties is not one process's on all 8 rows
    prose = " ".join(cells[at + 1].source.split("<details>")[0].split())
    assert "differ between the processes" in prose and "the same in both" in prose
    assert "one process on all 8 rows leaves a different `.grad`" in prose


def test_the_try_it_section_warns_that_run_all_stops_at_the_stub():
    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "07_double_backward.ipynb"
    cells = nbformat.read(path, as_version=4).cells
    stub = next(i for i, c in enumerate(cells) if c.metadata.get("dpteach", {}).get("role") == "stub")
    assert "raises-exception" in cells[stub].metadata["tags"]  # the headless run expects its error
    assert (
        cells[stub - 1].cell_type == "markdown" and "Run All stops at the next cell" in cells[stub - 1].source
    )


def test_a_sentence_ending_in_a_colon_leads_straight_into_its_cell():
    """A markdown cell that ends on a colon introduces the next cell: no fold sits between them."""
    import nbformat

    path = Path(__file__).resolve().parents[2] / "notebooks" / "07_double_backward.ipynb"
    cells = nbformat.read(path, as_version=4).cells
    for i, cell in enumerate(cells[:-1]):
        text = re.sub(r"<details>.*?</details>", "", cell.source, flags=re.S).rstrip()
        if cell.cell_type == "markdown" and text.endswith(":"):
            assert cell.source.rstrip().endswith(":"), f"cell {cell.id}: a fold follows its colon"
            assert cells[i + 1].cell_type == "code", f"cell {cell.id} ends on a colon before markdown"


def test_the_small_models_replicas_are_shown_and_only_the_imports_hidden():
    """The first picture's model, replicas, scatter and gather sit in its visible cell; the hidden one imports."""
    cells, at = _chapter_cell("penalty-graph")
    shown, hidden = cells[at], cells[at - 1]
    assert "hide-input" not in shown.metadata.get("tags", [])
    for call in ("dpteach.replicate(small", "dpteach.scatter(", "dpteach.parallel_apply(", "dpteach.gather("):
        assert call in shown.source, call
    assert "hide-input" in hidden.metadata["tags"]
    assert all(line.startswith(("import", "from")) for line in hidden.source.split("\n") if line.strip())
