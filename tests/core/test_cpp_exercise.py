"""Chapter 10's exercise 3: ``cpp.source_without``, and the check ``dead_ends_are_back``.

The check passes the chapter's own worked answer, compiled as the chapter's step 2 compiles it
(skipped without a C++ compiler). Its failures run on stand-ins: objects named as ``load_inline``
names a module built from ``cpp.source_without(line)``, whose ``rewire_step`` is the chapter
module's ``clone_step`` or ``rewire_step``, which is what the source without that line computes for
an ``nn.Linear`` (it has no buffers, so its rewiring is the parameters' ``set_history`` alone).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from executed import chapter_10_first
from torch import nn

import dpteach
from dpteach import cpp
from dpteach.course import checks

DEVICES = ["cpu", "cpu"]
CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "10_the_cpp_original.ipynb"
LINES = cpp.SOURCE.read_text().splitlines()
PARAMETERS_FIX, BUFFERS_FIX = [n for n, line in enumerate(LINES, 1) if "FIX (#20910)" in line]
NEXT_EDGES = next(n for n, line in enumerate(LINES, 1) if "set_next_edges(" in line)  # the parameters' one
CALL = next(n for n, line in enumerate(LINES, 1) if "if (rewire) replicate_grad_edges(" in line)
NOTE = next(n for n, line in enumerate(LINES, 1) if "Note [Replicating Modules]" in line)  # a comment


@pytest.fixture(scope="module")
def ext(request):
    if cpp.compiler() is None:
        pytest.skip("no C++ compiler found (install g++ or clang): the C++ chapter's tests need one")
    chapter_10_first(request.session)  # in the whole suite: load chapter 10's build, not compile again
    module, reason = cpp.load(progress=False)
    assert module is not None, reason
    return module


pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


class Built:
    """A stand-in for what ``load_inline`` makes of ``cpp.source_without(line)``, computing as ``behaves_like``."""

    def __init__(self, line, behaves_like):
        self.__name__ = cpp.extension_name(cpp.source_without(line))
        self._behaves_like = behaves_like

    def rewire_step(self, *args):
        return self._behaves_like(*args)


def graph_of(step):
    original, replicas = step.modules()
    return dpteach.autograd_graph(step.output, module=original, replicas=replicas)


def linear_step(extension, devices=DEVICES):
    torch.manual_seed(0)
    return cpp.rewire_step(nn.Linear(3, 2), torch.randn(6, 3), devices, extension=extension)


def chapter_answer() -> tuple[str, int]:
    """``deleted_line`` and ``predicted_dead_ends`` as the chapter's worked answer writes them."""
    cells = nbformat.read(CHAPTER, as_version=4).cells
    (answer,) = [
        m.group(1)
        for c in cells
        if c.cell_type == "markdown"
        for m in re.finditer(r"<summary>Answer 3</summary>(.*?)</details>", c.source, re.S)
    ]
    scope: dict = {}
    exec(
        textwrap.dedent(re.search(r"```python\n(.*?)```", answer, re.S).group(1)), scope
    )  # the answer's step 1, as written
    return scope["deleted_line"], scope["predicted_dead_ends"]


# ------------------------------------------------------------------ cpp.source_without


def test_the_fix_lines_sit_in_the_loops_the_check_names():
    source = cpp.SOURCE.read_text()
    parameters_loop = source.index("module.named_parameters(/*recurse=*/false)")
    buffers_loop = source.index("module.named_buffers(/*recurse=*/false)")
    offset = lambda number: sum(len(line) + 1 for line in LINES[: number - 1])  # noqa: E731
    assert parameters_loop < offset(PARAMETERS_FIX) < buffers_loop < offset(BUFFERS_FIX)
    assert "set_history" in LINES[PARAMETERS_FIX - 1] and "set_history" in LINES[BUFFERS_FIX - 1]


@pytest.mark.parametrize(
    "line", [LINES[PARAMETERS_FIX - 1], "  FIX (#20910): the copy's gradient", PARAMETERS_FIX]
)
def test_source_without_removes_exactly_the_named_line(line):
    without = cpp.source_without(line).splitlines()
    assert without == LINES[: PARAMETERS_FIX - 1] + LINES[PARAMETERS_FIX:]  # one line gone, the rest in order
    assert cpp.find_line(line) == PARAMETERS_FIX
    assert cpp.source_without(line).endswith("\n")  # the file's last newline is kept


@pytest.mark.parametrize(
    "line, says",
    [
        ("set_history(copy, grad_fn);", r"is on 2 lines \(\d+, \d+\): give more of the line"),
        ("a line that is not there", "is on no line of dp_original.cpp: copy the line from the listing"),
        ("   ", "Give the line to delete as its text"),
        (None, "Give the line to delete as its text"),
        (0, "there is no line 0"),
        (len(LINES) + 1, f"there is no line {len(LINES) + 1}"),
    ],
)
def test_source_without_fails_clearly(line, says):
    with pytest.raises(ValueError, match=says):
        cpp.source_without(line)


# ------------------------------------------------------------------ the check, on the answer


@pytest.fixture(scope="module")
def answer_module(ext):
    """The chapter's answer compiled as its step 2 compiles it (cached like cpp.load(): minutes only once)."""
    from torch.utils.cpp_extension import load_inline

    deleted_line, _ = chapter_answer()
    broken = cpp.source_without(deleted_line)
    folder = cpp.build_directory(broken)
    folder.mkdir(parents=True, exist_ok=True)
    return load_inline(
        name=cpp.extension_name(broken),
        cpp_sources=[broken],
        no_implicit_headers=True,
        build_directory=str(folder),
    )


def test_the_chapters_answer_deletes_the_rewiring_line_and_passes(answer_module):
    deleted_line, predicted = chapter_answer()
    assert cpp.find_line(deleted_line) == PARAMETERS_FIX  # the answer names the parameters' FIX line
    step = linear_step(answer_module, ["cpu"] * 3)  # as the chapter's step 3 runs it: on three slots
    assert all(g is None for g in step.grads.values())  # the compiled module strands the gradient again
    graph = graph_of(step)
    assert len(graph.dead_ends) == len(graph.replica_params) == 6 == predicted  # 3 replicas x (weight, bias)
    verdict = checks.dead_ends_are_back(answer_module, deleted_line, graph, predicted)
    assert verdict.ok and verdict.message.startswith("Correct!")


def test_a_wrong_prediction_fails_and_says_what_to_change(answer_module):
    deleted_line, _ = chapter_answer()
    checks.reset()
    verdict = checks.dead_ends_are_back(answer_module, deleted_line, graph_of(linear_step(answer_module)), 2)
    assert not verdict.ok
    assert "you predicted 2 dead ends and the graph has 4" in verdict.message
    assert "Change predicted_dead_ends" in verdict.message
    hint = verdict.message.split("Hint 1 of 2:")[1]
    assert "dead end" in hint and "set_history" not in hint  # the hint is about counting, not the line
    checks.reset()


def test_the_prediction_is_the_graphs_count_on_three_slots(ext):
    slots = ["cpu"] * 3
    stranded = Built(PARAMETERS_FIX, ext.clone_step)
    graph = graph_of(linear_step(stranded, slots))
    assert checks.dead_ends_are_back(stranded, PARAMETERS_FIX, graph, 6).ok  # 3 replicas x 2 parameters
    assert not checks.dead_ends_are_back(stranded, PARAMETERS_FIX, graph, 4).ok


# ------------------------------------------------------------------ the check's failures


def test_nothing_deleted_fails_and_says_what_to_change(ext):
    graph = graph_of(linear_step(ext))
    for nothing in (None, ""):
        verdict = checks.dead_ends_are_back(ext, nothing, graph, 4)
        assert not verdict.ok and "nothing was deleted: set deleted_line" in verdict.message
    # the right line named, but my_dp is the chapter's module, compiled from the whole file
    verdict = checks.dead_ends_are_back(ext, LINES[PARAMETERS_FIX - 1], graph, 4)
    assert not verdict.ok and "my_dp is the chapter's own module" in verdict.message
    assert "compile broken = cpp.source_without(deleted_line)" in verdict.message


def test_the_buffers_line_fails_and_names_the_parameters_line(ext):
    unchanged = Built(BUFFERS_FIX, ext.rewire_step)  # a Linear has no buffers: nothing changes
    verdict = checks.dead_ends_are_back(unchanged, BUFFERS_FIX, graph_of(linear_step(unchanged)), 0)
    assert not verdict.ok and "you deleted the buffers' set_history line" in verdict.message
    assert "Delete the set_history line in the loop over named_parameters instead" in verdict.message


def test_a_line_that_changes_nothing_fails(ext):
    unchanged = Built(NOTE, ext.rewire_step)
    verdict = checks.dead_ends_are_back(unchanged, NOTE, graph_of(linear_step(unchanged)), 0)
    assert not verdict.ok and f"no dead ends: line {NOTE} " in verdict.message
    assert "Delete the set_history line in the loop over named_parameters instead" in verdict.message


def test_another_break_with_dead_ends_is_not_the_rewiring_line(ext):
    stranded = Built(
        CALL, ext.clone_step
    )  # without the call to replicate_grad_edges, rewire_step is clone_step
    verdict = checks.dead_ends_are_back(stranded, CALL, graph_of(linear_step(stranded)), 4)
    assert not verdict.ok and f"the dead ends are back, but through line {CALL}" in verdict.message
    assert "Delete the set_history line in the loop over named_parameters instead" in verdict.message


def test_a_deletion_that_breaks_backward_names_the_line_to_delete(ext):
    def fails(*args):  # what the source without the parameters' set_next_edges line raises, compiled
        raise RuntimeError(
            "Function ReduceAdd returned an invalid number of gradients - expected 0, but got 1"
        )

    failing = Built(NEXT_EDGES, fails)
    verdict = checks.dead_ends_are_back(failing, NEXT_EDGES, None, 4)  # step 3 caught the error: no graph
    assert not verdict.ok and f"deleting line {NEXT_EDGES} (" in verdict.message
    assert "breaks the step itself" in verdict.message and "invalid number of gradients" in verdict.message
    assert "Delete the set_history line in the loop over named_parameters instead" in verdict.message


def test_a_graph_of_another_step_fails(ext):
    stranded = Built(PARAMETERS_FIX, ext.clone_step)
    chapter_graph = graph_of(linear_step(ext))  # drawn from the chapter's module, not my_dp
    verdict = checks.dead_ends_are_back(stranded, PARAMETERS_FIX, chapter_graph, 4)
    assert not verdict.ok and "draw the graph of a step run with extension=my_dp" in verdict.message
    verdict = checks.dead_ends_are_back(stranded, PARAMETERS_FIX, None, 4)
    assert (
        not verdict.ok
        and "the graph has no replica parameters: draw a step run with my_dp" in verdict.message
    )


def test_a_module_from_another_source_fails(ext):
    other = Built(BUFFERS_FIX, ext.rewire_step)  # step 2 run before deleted_line was changed
    verdict = checks.dead_ends_are_back(other, PARAMETERS_FIX, graph_of(linear_step(other)), 4)
    assert not verdict.ok and "my_dp was compiled from another source" in verdict.message
    assert "run step 2 again" in verdict.message


def test_a_module_that_cannot_step_fails(ext):
    class Broken:
        __name__ = "my_module"  # a name of the learner's own: only what it does is checked

        def rewire_step(self, *args):
            raise RuntimeError("undefined symbol")

    verdict = checks.dead_ends_are_back(Broken(), PARAMETERS_FIX, graph_of(linear_step(ext)), 4)
    assert not verdict.ok and "my_dp could not run a step (RuntimeError: undefined symbol)" in verdict.message
    assert "compile cpp.source_without(deleted_line) in step 2" in verdict.message


def test_the_check_leaves_the_learners_random_state_alone(ext):
    stranded = Built(PARAMETERS_FIX, ext.clone_step)
    graph = graph_of(linear_step(stranded))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    checks.dead_ends_are_back(stranded, PARAMETERS_FIX, graph, 4)
    assert torch.equal(torch.rand(3), expected)


def test_unset_answers_cost_no_hint():
    for args in [(None, ..., None, 4), (None, LINES[PARAMETERS_FIX - 1], None, ...)]:
        verdict = checks.dead_ends_are_back(*args)
        assert (
            not verdict.ok
            and "fill in predicted_dead_ends" in verdict.message
            and "Hint" not in verdict.message
        )
    verdict = checks.dead_ends_are_back(None, PARAMETERS_FIX, None, "four")
    assert "a whole number such as 3" in verdict.message and "Hint" not in verdict.message
    verdict = checks.dead_ends_are_back(None, PARAMETERS_FIX, None, 4)  # step 2 never ran
    assert "my_dp is None" in verdict.message and "run step 2" in verdict.message
    verdict = checks.dead_ends_are_back(None, "no such line", None, 4)
    assert "is on no line of dp_original.cpp" in verdict.message and "Hint" not in verdict.message


def test_hints_grow_and_the_third_try_gives_the_answer(ext):
    graph = graph_of(linear_step(ext))
    said = [checks.dead_ends_are_back(ext, None, graph, 4).message for _ in range(3)]
    assert "Hint 1 of 2" in said[0] and "Hint 2 of 2" in said[1]
    assert "The answer:" in said[2] and repr(LINES[PARAMETERS_FIX - 1].strip()) in said[2]
    assert "predicted_dead_ends = 4" in said[2]


def test_a_piece_on_two_lines_quotes_both():
    with pytest.raises(ValueError) as caught:
        cpp.source_without("set_history(copy, grad_fn)")
    message = str(caught.value)
    for number in (PARAMETERS_FIX, BUFFERS_FIX):  # each line, by number and text, so the learner can pick
        assert f"line {number}: {LINES[number - 1].strip()}" in message


def test_the_answers_line_number_is_the_parameters_fix_line():
    text = " ".join(c.source for c in nbformat.read(CHAPTER, 4).cells if c.cell_type == "markdown")
    (number,) = re.findall(r"`deleted_line = (\d+)`", text)
    assert int(number) == PARAMETERS_FIX == cpp.find_line(int(number))
