"""Chapter 10's cells: the key result comes first, with its question in prose above it; the graphs lead
straight into the C++ step's listing, before and after the fix; the hello-world extension comes after the
fix and before the optional section and exercise 3, and runs, with the boundary it crosses explained right
after it; every compiled cell says what it skipped without the module; exercise 3 is a loop the learner
fills in (and that passes with the chapter's own answer), and the chapter names the library's four moves.

One optimizer step moves the C++ original's weights only after the fix. Cells are found by their tags;
the compiled runs are skipped without a C++ compiler.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpteach
from dpteach import cpp
from dpteach.course import checks
from dpteach.data_parallel import four_moves

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "10_the_cpp_original.ipynb"
DETAILS = re.compile(r"<details>.*?</details>", re.S)


def cells():
    return nbformat.read(CHAPTER, as_version=4).cells


def tagged(tag: str) -> tuple[int, str]:
    ((index, source),) = [(i, c.source) for i, c in enumerate(cells()) if tag in c.metadata.get("tags", [])]
    return index, source


def needs_a_compiler():
    if cpp.compiler() is None or cpp.ninja() is None:
        pytest.skip("no C++ compiler or ninja found: load_inline cannot run")


def run(source: str, scope: dict) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(source, scope)
    return printed.getvalue()


PLAIN_CALL = 'load_inline(name="hello", cpp_sources=[hello], functions=["twice", "add_one_"]'


def test_the_key_result_comes_first_with_its_question_in_prose_above_it():
    key_at, key = tagged("key-result")
    first_load = min(i for i, c in enumerate(cells()) if c.cell_type == "code" and "cpp.load(" in c.source)
    assert first_load == key_at  # the chapter's result, before any C++ is shown
    above = cells()[key_at - 1]
    assert above.cell_type == "markdown"
    said = " ".join(DETAILS.sub("", above.source).split())
    for part in ("*the original*", "`Module::clone()`", "`cpp.rewire_step`", "Predict:"):
        assert part in said, part  # what "the original" is, how the replicas are made, and the question
    assert ".grad stays None" not in key and "stays None" not in key  # the cell does not give the answer away


def test_the_graphs_lead_straight_into_the_cpp_step_before_and_after_the_fix():
    drawn_at, _ = tagged("cpp-drawn")
    step_at, _ = tagged("cpp-step")
    clone_at = next(i for i, c in enumerate(cells()) if c.source.startswith("## Before the fix"))
    fix_at = next(i for i, c in enumerate(cells()) if c.source.startswith("## The fix"))
    hello_at, _ = tagged("hello-extension")
    assert step_at == drawn_at + 3  # the graphs' reading, the step's heading, then its listing
    assert cells()[step_at - 1].source.startswith("## One C++ step, move by move")
    assert drawn_at < step_at < clone_at < fix_at < hello_at  # no detour through load_inline on the way
    assert "source = cpp.SOURCE.read_text()" in cells()[step_at].source  # the first listing reads the file


def test_the_hello_extension_follows_the_fix_and_comes_before_exercise_3_and_the_optional_section():
    hello_at, hello = tagged("hello-extension")
    rewire_at, _ = tagged("reproof-03")
    optional_at = next(i for i, c in enumerate(cells()) if c.source.startswith("### Optional"))
    compile_at, _ = tagged("ex3-compile")
    bindings_at = next(
        i for i, c in enumerate(cells()) if c.cell_type == "code" and "PYBIND11_MODULE" in c.source
    )
    assert rewire_at < hello_at < bindings_at < compile_at < optional_at  # there before exercise 3 needs it
    for part in ("load_inline(", "cpp_sources=[hello]", "functions=[", "build_directory=", "perf_counter"):
        assert part in hello, part
    before = " ".join(DETAILS.sub("", c.source) for c in cells()[:hello_at] if c.cell_type == "markdown")
    assert PLAIN_CALL + ")" in before  # the plain call, on the main path before the cell that makes it
    assert PLAIN_CALL + "," in hello  # the cell makes that call, plus its two arguments
    after = cells()[hello_at + 1]
    assert after.cell_type == "markdown" and after.source.startswith("## What crosses the boundary")
    assert "That is why `add_one_` changed your `t`" in " ".join(
        DETAILS.sub("", after.source).split()
    )  # answers its question


def test_the_hello_extension_runs_and_its_tensors_cross_without_a_copy(tmp_path, monkeypatch):
    needs_a_compiler()
    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))  # an empty cache: the cell compiles
    _, hello = tagged("hello-extension")
    scope: dict = {"torch": torch, "cpp": cpp}  # the key-result cell imported both
    printed = run(hello, scope)
    assert re.match(r"built \(or found built\) and imported in [\d.]+ s", printed)  # the learner's own figure
    assert "twice(t) = tensor([2., 2., 2.])" in printed  # a tensor in, a new tensor out
    assert "after add_one_(t), t = tensor([2., 2., 2.])" in printed  # C++ changed Python's tensor in place
    (built,) = scope["folder"].glob("hello*.so")
    when = built.stat().st_mtime_ns
    again = run(hello, scope)  # compiled once: the same source again only loads
    assert re.match(r"built \(or found built\) and imported in [\d.]+ s", again)
    assert again.splitlines()[1:] == printed.splitlines()[1:]
    assert built.stat().st_mtime_ns == when  # the module was not built again


def test_exercise_3_is_a_loop_the_learner_fills_in():
    _, step1 = tagged("ex3-source")
    _, step2 = tagged("ex3-compile")
    _, step3 = tagged("ex3-check")
    assert re.search(r"^predicted_dead_ends = \.\.\.", step1, re.M)  # stubs, not the answer
    assert re.search(r"^deleted_line = \.\.\.", step1, re.M)
    assert "cpp.source_without(deleted_line)" in step2 and "name=cpp.extension_name(broken)" in step2
    assert "load_inline(" in step2 and "extension=my_dp" in step3
    assert (
        step3.rstrip().splitlines()[-1]
        == "checks.dead_ends_are_back(my_dp, deleted_line, graph, predicted_dead_ends)"
    )


def _answer_step1() -> str:
    (answer,) = [
        m.group(1)
        for c in cells()
        if c.cell_type == "markdown"
        for m in re.finditer(r"<summary>Answer 3</summary>(.*?)</details>", c.source, re.S)
    ]
    return textwrap.dedent(re.search(r"```python\n(.*?)```", answer, re.S).group(1))


def _chapter_scope() -> dict:
    from torch.utils.cpp_extension import load_inline

    ext, reason = cpp.load(progress=False)
    assert ext is not None, reason
    torch.manual_seed(0)
    shown: list = []
    return dict(
        ext=ext, reason=reason, cpp=cpp, checks=checks, dpteach=dpteach, time=time, load_inline=load_inline,
        model=nn.Linear(3, 2), x=torch.randn(6, 3), devices=["cpu", "cpu"], display=shown.append, shown=shown,
    )  # fmt: skip


def test_exercise_3_as_shipped_asks_for_the_stubs():
    needs_a_compiler()
    scope = _chapter_scope()
    for tag in ("ex3-source", "ex3-compile"):
        run(tagged(tag)[1], scope)
    assert scope["my_dp"] is None  # nothing is compiled before step 1 is filled in
    *body, last = tagged("ex3-check")[1].rstrip().splitlines()
    run("\n".join(body), scope)
    verdict = eval(last, scope)
    assert not verdict.ok and "fill in predicted_dead_ends" in verdict.message


def test_exercise_3_with_the_worked_answer_says_correct():
    needs_a_compiler()
    scope = _chapter_scope()
    run(_answer_step1(), scope)  # the learner's step 1, as the unfolded answer writes it
    run(
        tagged("ex3-compile")[1], scope
    )  # compiles once, then the cache (tests/core/test_cpp_exercise.py too)
    *body, last = tagged("ex3-check")[1].rstrip().splitlines()
    run("\n".join(body), scope)
    verdict = eval(last, scope)
    assert verdict.ok, verdict.message
    assert len(scope["graph"].dead_ends) == 6 and scope["shown"] == [scope["graph"]]  # 3 slots x 2; shown


def test_the_four_moves_are_the_librarys_wherever_the_chapter_lists_them():
    moves = re.findall(r'phase\("(\w+)"\)', inspect.getsource(four_moves))
    assert moves == ["scatter", "replicate", "parallel_apply", "gather"]
    listed = 0
    for c in cells():
        if c.cell_type != "markdown":
            continue
        for paragraph in re.split(r"\n\s*\n", c.source):
            if "four moves" in paragraph:
                listing = paragraph.lower()[paragraph.find("four moves") :]  # from where the list begins
                at = [listing.find(m) for m in moves]
                assert -1 not in at and at == sorted(at), paragraph  # each named, in the library's order
                listed += 1
    assert listed >= 2  # the main path and libtorch's own data_parallel (a Going deeper block)


def test_the_base_class_rename_is_stated_with_its_pr_in_a_folded_aside():
    text = " ".join(c.source for c in cells() if c.cell_type == "markdown")
    main_path = " ".join(DETAILS.sub("", c.source) for c in cells() if c.cell_type == "markdown")
    assert "`autograd::Function`" in text and "PR #23269" in text and "`Node`" in main_path
    assert "PR #23269" not in main_path  # history, one click away


def test_the_optimizer_step_moves_the_weights_only_after_the_fix():
    needs_a_compiler()
    scope = _chapter_scope()
    model, x, devices = scope["model"], scope["x"], scope["devices"]
    scope.update(
        torch=torch, before=cpp.clone_step(model, x, devices), after=cpp.rewire_step(model, x, devices)
    )
    before, after = scope["before"], scope["after"]
    printed = run(tagged("optimizer-step")[1], scope).splitlines()
    assert printed[0].endswith("changed the weight: False")  # clone(): no .grad, so SGD skips the weight
    assert printed[1].endswith("changed the weight: True")  # the fix: the weight takes the step
    assert printed[2].endswith("model.weight changed: False")  # the C++ module holds a copy of it
    assert torch.equal(before.params["weight"], model.weight)  # the C++ original's own tensor, unmoved
    assert torch.allclose(after.params["weight"], model.weight - 0.1 * after.grads["weight"])  # one SGD step


def test_the_one_line_comparison_with_python_tells_the_fix_from_clone():
    needs_a_compiler()
    from dpteach.course import demos

    scope = _chapter_scope()
    model, x, devices = scope["model"], scope["x"], scope["devices"]
    clone, rewire = cpp.clone_step(model, x, devices).grads, cpp.rewire_step(model, x, devices).grads
    assert demos.same_grads_as_python(rewire, model, x, devices, "rewire")
    assert not demos.same_grads_as_python(clone, model, x, devices, "rewire")  # None against a gradient
    assert demos.same_grads_as_python(clone, model, x, devices, "clone")  # None on both sides
    assert model.weight.grad is None  # the comparison steps a copy, never the chapter's model


def test_the_optional_why_section_follows_the_exercises_and_asks_one_question_per_cell():
    needs_a_compiler()
    scope = _chapter_scope()
    scope["torch"] = torch
    forward_at, forward = tagged("member-forward")
    history_at, history = tagged("set-history-member")
    drawn_at, _ = tagged("cpp-drawn")
    fix_at = next(
        i for i, c in enumerate(cells()) if c.cell_type == "code" and "void replicate_grad_edges" in c.source
    )
    rewire_at, _ = tagged("reproof-03")
    summary_at = next(i for i, c in enumerate(cells()) if c.source.startswith("## Summary"))
    last_answer_at, _ = tagged("ex4-check")
    # the graphs, the fix and its check against Python, the summary and the exercises, then the optional why
    assert drawn_at < fix_at < rewire_at < summary_at < last_answer_at < forward_at < history_at
    assert cells()[forward_at - 1].source.startswith("### Optional: why not swap")
    printed = run(forward, scope)
    assert "forward() used: the member, not the zeros" in printed  # answers its prediction in its own words
    assert "register_parameter" not in printed  # a side detail, kept for the folded aside
    assert run(history, scope).strip() == "the name() of the member's grad_fn after set_history: ReduceAdd"
    asks = [cells()[i - 1].source for i in (forward_at, history_at)]
    assert "zeros" in DETAILS.sub("", asks[0]) and "Predict" in asks[0]
    assert "grad_fn" in DETAILS.sub("", asks[1]) and "Predict" in asks[1]


def test_at_most_four_going_deeper_folds():
    text = " ".join(c.source for c in cells() if c.cell_type == "markdown")
    assert 1 <= text.count("<summary>Going deeper") <= 4  # the main path reads complete without them


def main_path_code() -> list[str]:
    chapter = cells()
    exercises = next(i for i, c in enumerate(chapter) if c.source.startswith("## Exercises"))
    return [c.source for c in chapter[:exercises] if c.cell_type == "code"]


def test_the_exercises_ask_what_the_main_path_never_printed():
    code = main_path_code()
    assert not any("FIX (#20910)" in s or "BROKEN" in s for s in code)  # no listing of the marked lines
    assert not any("Sequential" in s for s in code) and "nn.Sequential(" in tagged("ex1-check")[1]
    assert "deep_model" in tagged("ex2-check")[1]  # exercise 2 counts on exercise 1's new model
    three = '["cpu"] * 3'
    assert three in tagged("ex3-check")[1] and not any(three in s for s in code)  # not the drawn two slots


def test_data_parallel_step_makes_the_moves_and_no_optimizer_runs_in_cpp():
    source = cpp.SOURCE.read_text()

    def body(signature: str) -> str:
        start = source.index(signature)
        return source[start : source.index("\n}\n", start)]

    outer, inner = body("Result data_parallel_step("), body("std::pair<Tensor, Tensor> step(")
    assert outer.index("clone_replicas(") < outer.index("step(replicas")  # replicate, then the rest
    assert all(part in inner for part in ("x.chunk(", "forward(", "torch::cat(", "backward()"))
    assert "optim" not in source  # the SGD step is Python's
    assert "clone_replicas(" in tagged("cpp-step")[1]  # the listing shows the replicate move too
    (paragraph,) = [
        p
        for c in cells()
        if c.cell_type == "markdown"
        for p in re.split(r"\n\s*\n", DETAILS.sub("", c.source))
        if "four moves" in p
    ]
    assert "`data_parallel_step` makes" in " ".join(paragraph.split()) and "SGD ran in Python" in paragraph
    said = " ".join(paragraph.split())
    assert "`cpp.rewire_step` is `data_parallel_step` with `rewire=true`" in said  # what the listing shows
    assert "replicating first" in said and said.index("`clone_replicas`") < said.index(
        "`x.chunk`"
    )  # code order
    assert "/*rewire=*/true);" in body("Result rewire_step(") and "/*rewire=*/false);" in body(
        "Result clone_step("
    )


def test_reduce_adds_apply_is_printed_from_the_shipped_source_before_the_loop_that_makes_it():
    at, cell = tagged("reduce-add-source")
    loop_at = next(
        i for i, c in enumerate(cells()) if c.cell_type == "code" and "void replicate_grad_edges" in c.source
    )
    assert at < loop_at and cells()[at - 1].source.startswith("## The fix")
    source = cpp.SOURCE.read_text()
    printed = run(cell, {"source": source})
    assert printed.startswith("struct ReduceAdd : public torch::autograd::Node {")
    assert printed.rstrip().endswith("};") and printed.strip() in source  # the node as compiled, whole
    assert "variable_list apply(" in printed and "return {output};" in printed  # one sum, one output
    lead_in = " ".join(DETAILS.sub("", cells()[at - 1].source).split())
    assert "`apply`" in lead_in and "next edge" in lead_in


def test_the_summary_rests_on_the_main_path_not_on_the_optional_section():
    summary_at = next(i for i, c in enumerate(cells()) if c.source.startswith("## Summary"))
    optional_at = next(i for i, c in enumerate(cells()) if c.source.startswith("### Optional"))
    summary = cells()[summary_at].source
    optional = " ".join(
        c.source for c in cells()[optional_at:] if c.cell_type == "markdown"
    )  # the last section
    for word in ("member", "registry", "TensorImpl", "swap"):
        assert word in optional and word not in summary, word  # what the optional section alone shows


def test_the_swap_is_called_overkill_as_libtorchs_note_says():
    header = Path(torch.__file__).parent / "include/torch/csrc/api/include/torch/nn/parallel/data_parallel.h"
    if not header.exists():
        pytest.skip("this torch ships no C++ headers")
    full = header.read_text()
    note = full[full.index("// Note [Replicating Modules]") : full.index("struct ReduceAdd")]
    reduce_add = full[full.index("struct ReduceAdd") : full.index("void replicate_grad_edges(")]
    assert "name()" not in reduce_add  # libtorch's own ReduceAdd keeps Node::name(), as the fold says
    assert 'Linear.parameters_["weight"] will not' in " ".join(note.replace("//", "").split())
    assert "overkill" in note  # possible, with every module changed, and not worth it
    forward_at, _ = tagged("member-forward")
    why = " ".join(DETAILS.sub("", cells()[forward_at - 1].source).split())
    assert "cannot" not in why and "Note [Replicating Modules]" in why and "overkill" in why


def test_a_cpp_node_is_a_cppfunction_whose_name_is_its_cpp_name():
    needs_a_compiler()
    scope = _chapter_scope()
    node = cpp.rewire_step(scope["model"], scope["x"], scope["devices"]).replica_params[0]["weight"].grad_fn
    assert type(node).__name__ == "CppFunction" and node.name() == "ReduceAdd"
    assert 'std::string name() const override { return "ReduceAdd"; }' in cpp.SOURCE.read_text()
    text = " ".join(" ".join(c.source.split()) for c in cells() if c.cell_type == "markdown")
    main = " ".join(" ".join(DETAILS.sub("", c.source).split()) for c in cells() if c.cell_type == "markdown")
    assert "This file's copy names itself `\"ReduceAdd\"`, which Python's `grad_fn.name()` returns" in main
    assert "does not override `name()`" in text  # libtorch's own keeps the demangled name: a folded aside
    assert "CppFunction" not in main and "a `CppFunction`" in text  # the wrapper's type: a folded aside


def test_the_re_proofs_of_chapters_01_and_03_are_one_line_each_and_tell_a_wrong_step():
    needs_a_compiler()
    from dpteach.course import demos

    scope = _chapter_scope()
    model, x, devices = scope["model"], scope["x"], scope["devices"]
    one = cpp.single_step(model, x)
    scope.update(torch=torch, demos=demos, one=one)
    _, of01 = tagged("reproof-01")
    _, of03 = tagged("reproof-03")
    for cell in (of01, of03):  # one line that proves, and one that says what it skipped without the module
        code = [ln for ln in cell.strip().splitlines() if not ln.startswith("#")]
        assert len(code) == 2 and code[0].startswith("if ext: print(") and code[1].startswith("else: print(")
    said01 = "replicas' weight .grads add up to one device's: "
    said03 = "C++ rewire .grads == Python rewire .grads (same model, x and loss): "  # says what it compares

    scope.update(before=cpp.clone_step(model, x, devices), after=cpp.rewire_step(model, x, devices))
    assert run(of01, scope).strip() == said01 + "True"  # chapter 01: the replicas hold the whole gradient
    assert run(of03, scope).strip() == said03 + "True"  # chapter 03: the same gradients as Python's rewire

    # each line compares with its reference, not with itself: a step on other data prints False
    scope.update(before=cpp.clone_step(model, 2 * x, devices), after=cpp.rewire_step(model, 2 * x, devices))
    assert run(of01, scope).strip() == said01 + "False"
    assert run(of03, scope).strip() == said03 + "False"


def test_the_listing_numbers_the_lines_exercise_3_can_name():
    _, listing = next((i, c.source) for i, c in enumerate(cells()) if "void replicate_grad_edges" in c.source)
    scope = {"source": cpp.SOURCE.read_text()}
    printed = run(listing, scope).splitlines()
    lines = cpp.SOURCE.read_text().splitlines()
    numbered = [m for m in (re.match(r"^ *(\d+)  (.*)$", ln) for ln in printed) if m]
    assert len(numbered) == len(printed) - 1  # every line but the closing "..." carries its number
    for m in numbered:  # each number is that line's number in dp_original.cpp
        assert lines[int(m.group(1)) - 1] == m.group(2), m.group(0)
    numbered = [m.group(0) for m in numbered]
    shown = [ln for ln in numbered if "set_history(copy, grad_fn)" in ln]
    assert len(shown) == 2  # both the parameters' line and the buffers' line are on screen
    assert "named_children()" not in "\n".join(printed)


def test_exercise_3_step_2_prints_an_ambiguous_line_instead_of_raising():
    scope = _chapter_scope() if cpp.is_cached() or (cpp.compiler() and cpp.ninja()) else None
    if scope is None:
        pytest.skip("no C++ module")
    scope["deleted_line"] = "set_history(copy, grad_fn)"
    printed = run(tagged("ex3-compile")[1], scope)
    assert "is on 2 lines" in printed and printed.count("line ") >= 2 and scope["my_dp"] is None
    assert "likewise for a buffer" in printed and "now flows to grad_fn" in printed  # both lines quoted


def test_the_grad_fn_of_a_python_tensor_cannot_be_set():
    _, cell = tagged("grad-fn-read-only")
    printed = run(cell, {"torch": torch})
    assert printed.startswith("AttributeError:") and "grad_fn" in printed and "not writable" in printed
    main = " ".join(DETAILS.sub("", c.source) for c in cells() if c.cell_type == "markdown")
    assert "Python refuses the same move" in main


def test_every_compiled_cell_says_what_it_skipped_and_why_without_the_module():
    chapter = cells()
    exercises = next(i for i, c in enumerate(chapter) if c.source.startswith("## Exercises"))
    optional = next(i for i, c in enumerate(chapter) if c.source.startswith("### Optional"))
    guarded = [
        c.source
        for c in chapter[:exercises] + chapter[optional:]
        if c.cell_type == "code" and re.search(r"^if ext", c.source, re.M) and "cpp.load(" not in c.source
    ]  # the key-result cell loads the module and prints its reason itself
    _, key = tagged("key-result")
    assert "print(reason or " in key  # so the first thing a learner without a compiler reads is why
    assert len(guarded) >= 6  # the SGD step, the graphs, both re-proofs and the optional section's two
    why = "no C++ compiler was found (a stand-in reason)"
    for source in guarded:
        printed = run(source, {"ext": None, "reason": why}).splitlines()
        assert len(printed) == 1 and printed[0].startswith("skipped, ") and printed[0].endswith(why), source


def test_the_libtorch_facts_the_folds_and_comments_state_are_in_the_installed_headers():
    """What the chapter says about libtorch, read from torch's own headers and cpp_extension: the
    pybind wrapper's error and warning handling, parallel_apply's at::parallel_for, replicate_grad_edges'
    signature, and what makes a clone's parameter a fresh leaf."""
    from torch.utils import cpp_extension

    include = Path(torch.__file__).parent / "include" / "torch" / "csrc"
    exceptions = (include / "Exceptions.h").read_text()
    wrapper = exceptions[exceptions.index("auto wrap_pybind_function_impl_(") :]
    wrapper = wrapper[: wrapper.index("\n}\n")]
    assert "HANDLE_TH_ERRORS" in wrapper and "END_HANDLE_TH_ERRORS_PYBIND" in wrapper
    assert "_CATCH_GENERIC_ERROR(IndexError, PyExc_IndexError" in exceptions  # torch's classes, mapped
    assert "torch::PyWarningHandler __enforce_warning_buffer;" in exceptions  # TORCH_WARN -> Python warnings
    signature = inspect.signature(cpp_extension.load_inline)
    assert signature.parameters["with_pytorch_error_handling"].default is True
    assert "torch::wrap_pybind_function({function_name})" in inspect.getsource(cpp_extension)

    api = include / "api" / "include" / "torch" / "nn"
    data_parallel = (api / "parallel" / "data_parallel.h").read_text()
    apply_body = data_parallel[data_parallel.index("std::vector<Tensor> parallel_apply(") :]
    assert "at::parallel_for(" in apply_body[: apply_body.index("\n}\n")]
    assert (
        "const std::vector<std::shared_ptr<ModuleType>>& replicas,\n    const std::vector<Device>& devices)"
        in (data_parallel)
    )
    cloneable = (api / "cloneable.h").read_text()
    assert "NoGradGuard no_grad;" in cloneable and "copy->reset();" in cloneable
    assert "copy->parameters_[parameter.key()].set_data(data);" in cloneable

    source = cpp.SOURCE.read_text()
    assert "// in turn; libtorch's parallel_apply uses at::parallel_for" in source  # step()'s loop says so
    folds = " ".join(
        " ".join(m.split()) for c in cells() for m in re.findall(r"<details>.*?</details>", c.source, re.S)
    )
    assert "already arrive as their Python types" in folds and "PyWarningHandler" in folds
    assert "`TORCH_WARN` reaches Python's `warnings`" in folds and "differs mainly in three ways" in folds
    main = " ".join(" ".join(DETAILS.sub("", c.source).split()) for c in cells() if c.cell_type == "markdown")
    assert "`set_data` fills each with a copy of the original, under `NoGradGuard`" in main


def test_the_fold_quotes_the_shipped_replicate_grad_edges_as_torch_ships_it():
    """The fold says torch ships a reworked form of the PR's code and shows it: the lines must be the header's."""
    header = Path(torch.__file__).parent / "include/torch/csrc/api/include/torch/nn/parallel/data_parallel.h"
    if not header.exists():
        pytest.skip("this torch ships no C++ headers")
    (fold,) = [c.source for c in cells() if "a reworked form of PR #20910's code" in c.source]
    code = re.search(r"```cpp\n(.*?)```", fold, re.S).group(1)
    assert " ".join(code.split()) in " ".join(header.read_text().split())  # the loop, as installed
    assert (
        "torch::zeros_like(inputs[0]" in header.read_text()
    )  # where the other fold says an undefined one fails
