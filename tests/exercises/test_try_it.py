"""An untouched stub's error is two lines that name the task; a learner's own error keeps its traceback.

``exercises.try_it`` turns a stub's ``NotImplementedError("Task N (...): ...")`` into ``NotWrittenYet``,
which Jupyter shows through ``_render_traceback_`` instead of a traceback through dpteach's frames.
"""

from __future__ import annotations

import re

import pytest
from executed import ROOT, executed
from torch.autograd import Function

from dpteach import exercises
from dpteach.exercises import stubs
from dpteach.exercises._records import NotWrittenYet, by_task

STUBS = by_task(stubs)  # every task's untouched stub, named by its record

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("key", list(STUBS))
def test_an_untouched_stub_says_which_task_in_two_lines(key):
    task = exercises.TASKS[key]
    with pytest.raises(NotWrittenYet) as caught:
        exercises.try_it(key, *STUBS[key])
    shown = [ANSI.sub("", line) for line in caught.value._render_traceback_()]
    assert len(shown) == 2
    assert shown[0].startswith(f"NotImplementedError: Task {task.number} ({task.title})")
    assert "replace the `raise NotImplementedError(...)` in this cell" in shown[1]
    assert caught.value.__suppress_context__  # no "During handling of ..." chain under it


def test_a_learners_own_error_is_raised_as_it_was():
    class Broken(Function):
        @staticmethod
        def forward(ctx, original, *copies):
            raise ValueError("my own mistake")

        @staticmethod
        def backward(ctx, *grads):
            raise NotImplementedError("not the stub's message")

    with pytest.raises(ValueError, match="my own mistake") as caught:
        exercises.try_it("rewire", Broken)
    assert not isinstance(caught.value, NotWrittenYet)


def test_a_backward_with_too_few_values_is_told_how_many_to_return(capsys):
    class OneValue(Function):  # returns the sum only, not (sum, None, None) for apply(original, c0, c1)
        @staticmethod
        def forward(ctx, original, *copies):
            return tuple(c.detach() for c in copies)

        @staticmethod
        def backward(ctx, *grads):
            return sum(grads)

    exercises.try_it("rewire", OneValue)  # torch raises "returned an incorrect number of gradients": not here
    out = capsys.readouterr().out
    assert out.startswith("Not yet: OneValue.backward must return 3 values, one per argument of apply, not 1")
    assert "Change your code, then run this cell again." in out


def test_another_runtime_error_is_raised_as_it_was():
    class WrongShape(Function):
        @staticmethod
        def forward(ctx, original, *copies):
            return tuple(c.detach() for c in copies)

        @staticmethod
        def backward(ctx, *grads):
            return (grads[0].view(-1)[:1],) + (None,) * len(grads)  # a gradient of the wrong shape

    with pytest.raises(RuntimeError, match="shape|size"):
        exercises.try_it("rewire", WrongShape)


def test_a_learners_own_not_implemented_error_keeps_its_traceback():
    def replicate_by_clone(network, devices, detach=False):
        raise NotImplementedError("later")

    with pytest.raises(NotImplementedError, match="later") as caught:
        exercises.try_it("clone_bug", replicate_by_clone)
    assert type(caught.value) is NotImplementedError


WITH_STUBS = [
    p.name
    for p in sorted((ROOT / "notebooks").glob("[01][0-9]_*.ipynb"))
    if "raises-exception" in p.read_text()
]


def test_the_chapters_with_stubs_are_found():
    assert len(WITH_STUBS) >= 4  # 02, 03, 05, 07 and 11 have stub cells today


@pytest.mark.parametrize("name", WITH_STUBS)
def test_stub_cells_show_two_lines_not_a_traceback(name):
    nb, _, _ = executed(ROOT / "notebooks" / name)
    stubs = [c for c in nb.cells if "raises-exception" in c.metadata.get("tags", [])]
    for cell in stubs:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert len(errors) == 1, cell.source[:80]
        assert len(errors[0].traceback) == 2, ANSI.sub("", "\n".join(errors[0].traceback))[:500]
        assert "Not written yet" in errors[0].traceback[1]


def test_every_stub_cell_calls_try_it_itself():
    """The message says "in this cell": every chapter's ``try_it`` line sits in the cell of its stub's raise."""
    import nbformat

    cells = [
        (nb.name, c.source)
        for nb in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for c in nbformat.read(nb, as_version=4).cells
        if c.cell_type == "code" and "exercises.try_it(" in c.source
    ]
    assert len(cells) >= len(STUBS)
    for name, source in cells:
        assert "raise NotImplementedError(" in source, f"{name}: a try_it cell without its stub's raise"
        assert source.rstrip().splitlines()[-1].startswith("exercises.try_it("), name
