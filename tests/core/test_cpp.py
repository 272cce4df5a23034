"""The C++ original (dpteach/cpp): libtorch's clone() loses the gradient, PR #20910's ReduceAdd brings it back.

Every C++ result is compared with the same model, same weights, same input in Python: the
one-device reference and the Python strategies "clone" and "rewire" on ["cpu", "cpu"].
Skipped only when no C++ compiler is found; with one, a failed compile is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from executed import chapter_10_first
from torch import nn
from torch.testing import assert_close

import dpteach
from dpteach import cpp
from dpteach.cpp import _build

DEVICES = ["cpu", "cpu"]


@pytest.fixture(scope="module")
def ext(request):
    if cpp.compiler() is None:
        pytest.skip("no C++ compiler found (install g++ or clang): the C++ chapter's tests need one")
    chapter_10_first(request.session)  # in the whole suite: load chapter 10's build, not compile again
    module, reason = cpp.load(progress=False)
    assert module is not None, reason  # a compiler is there, so the source must compile
    return module


def linear():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def sequential():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))


MODELS = [linear, sequential]


def batch(rows=6):
    torch.manual_seed(1)
    return torch.randn(rows, 3)


def python_single(model, x):
    """The reference: the model on one device, loss = mean(output ** 2), as in the C++ step."""
    model.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def python_clone(model, x):
    """Python's "clone" strategy, step by step: replicas, scatter, run, gather, backward."""
    model.zero_grad(set_to_none=True)
    replicas = dpteach.replicate(model, DEVICES, strategy="clone")
    inputs = dpteach.scatter(x, DEVICES)
    outputs = dpteach.parallel_apply(replicas, [(i,) for i in inputs])
    dpteach.gather(outputs, "cpu").pow(2).mean().backward()
    return [{n: p.grad for n, p in r.named_parameters()} for r in replicas]


@pytest.mark.parametrize("make", MODELS)
def test_single_step_matches_python(ext, make):
    model, x = make(), batch()
    step = cpp.single_step(model, x)
    loss, grads = python_single(model, x)
    assert_close(step.output, model(x).detach())  # the C++ model computes what the Python one does
    assert_close(step.loss, loss)  # same loss
    assert step.grads.keys() == grads.keys()  # C++ names its parameters as Python does
    for name in grads:
        assert_close(step.grads[name], grads[name])  # and backward agrees, parameter by parameter


@pytest.mark.parametrize("make", MODELS)
def test_clone_leaves_the_original_without_gradient(ext, make):
    model, x = make(), batch()
    step = cpp.clone_step(model, x, DEVICES)
    _, reference = python_single(model, x)
    assert all(g is None for g in step.grads.values())  # issue #19540: the original's grad is undefined
    for replica in step.replica_grads:
        assert all(g is not None for g in replica.values())  # the gradient stopped in every replica
    for name, g in reference.items():
        # the gradient was computed, just stranded: the replicas' sum is the one-device gradient
        assert_close(sum(r[name] for r in step.replica_grads), g)


@pytest.mark.parametrize("make", MODELS)
def test_clone_matches_python_clone(ext, make):
    model, x = make(), batch()
    step = cpp.clone_step(model, x, DEVICES)
    python = python_clone(model, x)
    assert all(p.grad is None for p in model.parameters())  # Python's "clone" strands it the same way
    for cpp_replica, py_replica in zip(step.replica_grads, python, strict=True):
        for name, g in py_replica.items():
            assert_close(cpp_replica[name], g)  # replica by replica, the same stranded gradients


@pytest.mark.parametrize("make", MODELS)
def test_rewire_matches_python_rewire_and_one_device(ext, make):
    model, x = make(), batch()
    step = cpp.rewire_step(model, x, DEVICES)
    _, reference = python_single(model, x)
    model.zero_grad(set_to_none=True)
    loss = dpteach.DataParallel(model, DEVICES, strategy="rewire")(x).pow(2).mean()
    loss.backward()
    assert_close(step.loss, loss.detach())  # same forward under data parallel
    for name, p in model.named_parameters():
        assert step.grads[name] is not None  # PR #20910: the gradient reaches the original
        assert_close(step.grads[name], p.grad)  # exactly where Python's "rewire" puts it
        assert_close(step.grads[name], reference[name])  # and it is the one-device gradient


def test_rewire_builds_one_reduce_add_per_parameter(ext):
    model, x = sequential(), batch()
    step = cpp.rewire_step(model, x, ["cpu", "cpu", "cpu"])
    for name, original in step.params.items():
        nodes = [r[name].grad_fn for r in step.replica_params]
        assert all(
            n is not None and n.name() == "ReduceAdd" for n in nodes
        )  # set_history made ReduceAdd the grad_fn
        assert all(n is nodes[0] for n in nodes)  # one node per original parameter, shared by the replicas
        ((accumulate, _),) = nodes[0].next_functions
        assert accumulate.variable is original  # its one edge: the original's gradient accumulator
    assert all(
        all(g is None for g in r.values()) for r in step.replica_grads
    )  # replica copies are no longer leaves


def test_clone_replicas_are_fresh_leaves(ext):
    step = cpp.clone_step(linear(), batch(), DEVICES)
    for replica in step.replica_params:
        assert all(p.is_leaf and p.grad_fn is None for p in replica.values())  # clone() keeps no history


def test_member_handle(ext):
    model, x = linear(), batch()
    demo = cpp.member_handle(model, x)
    assert demo["shared_before"]  # after clone, Linear::weight and parameters_["weight"] share one TensorImpl
    assert "already defined" in demo["register_parameter_error"]  # the public way to replace it is refused
    assert not demo["shared_after"]  # assigning into parameters_ moved the registry handle only
    assert_close(demo["registry_weight"], torch.zeros_like(model.weight))  # the registry holds the stand-in
    assert_close(demo["member_weight"], model.weight.detach())  # the member still holds the old weight
    assert_close(demo["forward"], demo["forward_with_member"])  # and forward() reads the member
    assert not torch.allclose(demo["forward"], demo["forward_with_registry"])  # not the registry
    assert (
        demo["member_grad_fn_after_set_history"] == "ReduceAdd"
    )  # set_history on any handle reaches the member
    model._parameters["weight"] = nn.Parameter(torch.zeros_like(model.weight))
    assert model.weight is model._parameters["weight"]  # in Python the registry *is* the attribute


def test_no_compiler_gives_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(cpp, "_state", {})
    monkeypatch.setattr(cpp, "compiler", lambda: None)
    monkeypatch.setattr(cpp, "is_cached", lambda: False)  # a machine that never compiled it
    module, reason = cpp.load(progress=False)
    assert module is None  # nothing to load
    assert "compiler" in reason and "skipped" in reason  # one sentence that says why and what happens
    assert not cpp.available()  # cells can check this
    with pytest.raises(RuntimeError, match="compiler"):
        cpp.clone_step(linear(), batch())  # a call anyway fails with the same sentence


def test_no_ninja_gives_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(cpp, "_state", {})
    monkeypatch.setattr(cpp, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(cpp, "ninja", lambda: None)
    monkeypatch.setattr(cpp, "is_cached", lambda: False)
    module, reason = cpp.load(progress=False)
    assert module is None and "pip install ninja" in reason  # says what to install


def test_a_cached_binary_needs_no_compiler(ext, monkeypatch):
    monkeypatch.setattr(cpp, "_state", {})
    monkeypatch.setattr(cpp, "compiler", lambda: None)
    monkeypatch.setattr(cpp, "ninja", lambda: None)
    module, reason = cpp.load(progress=False)
    assert reason is None and module.__file__ == ext.__file__  # the cache is imported as it is


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script stand-in for ninja")
def test_a_pip_installed_ninja_is_found_off_path(monkeypatch, tmp_path):
    fake = tmp_path / "ninja"
    fake.write_text("#!/bin/sh\necho 1.11.1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setitem(
        sys.modules, "ninja", None
    )  # no pip `ninja` package either: only the venv's bin folder
    monkeypatch.setattr(
        _build.sys, "executable", str(tmp_path / "python")
    )  # a venv's bin folder, not on PATH
    assert _build.ninja() == str(fake)  # found beside the interpreter
    assert os.environ["PATH"] == "/nonexistent"  # a lookup changes nothing
    assert _build.put_ninja_on_path() == str(fake)  # the build puts it on PATH, where torch looks
    assert os.environ["PATH"].split(os.pathsep)[0] == str(tmp_path)


def test_failed_compile_gives_a_reason_not_an_error(monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("Error building extension 'dpteach_cpp'\nmain.cpp:1: error: expected ';'")

    monkeypatch.setattr(cpp, "_state", {})
    monkeypatch.setattr(cpp, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(cpp, "build", broken)
    module, reason = cpp.load(progress=False)
    assert module is None and "failed" in reason  # reported, not raised
    assert "expected ';'" in reason  # the compiler's first error line is quoted


def test_build_directory_is_keyed_by_torch_and_source():
    directory = _build.build_directory()
    assert torch.__version__ in directory.name  # a torch upgrade never loads a stale binary
    assert _build.build_directory("// another source") != directory  # nor does an edited source


PING = Path(__file__).parent / "fixtures" / "ping.cpp"

# build() as load() runs it, on the small source, with its messages on stdout
BUILD_PING = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from dpteach.cpp import _build
    _build.SOURCE = Path(sys.argv[1])
    print("ok", _build.build(progress=True).ping() == 1)
    """
)


def test_two_processes_building_at_once_and_a_stale_baton(monkeypatch, tmp_path):
    """Two kernels start compiling the same source at once, over a stale torch baton: one compiles,
    the other waits for it on the OS lock and then imports its binary; both load a working module.

    The test holds the OS lock itself until both processes say they wait, so the two really build
    at once on every run. The small source keeps the compile under a second; the cache is a
    temporary one, so no other test (or notebook) finds its binary gone.
    """
    if cpp.compiler() is None or cpp.ninja() is None:
        pytest.skip("no C++ compiler or ninja found: nothing can be built")
    import fcntl

    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))
    directory = _build.build_directory(PING.read_text())
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # torch's baton, as a kernel killed mid-build leaves it
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each "waiting" line reaches us when printed
    with open(directory / "dpteach.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a third process, mid-compile
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", BUILD_PING, str(PING)], env=env, stdout=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        for proc in procs:
            assert proc.stdout.readline().startswith("waiting for another process")
        fcntl.flock(held, fcntl.LOCK_UN)
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)  # torch alone would wait forever on the stale baton
        assert proc.returncode == 0 and out.splitlines()[-1] == "ok True"  # both loaded a working module
        outs.append(out)
    how = sorted(
        "compiled by the other process" if "compiled by the other process" in out else "compiled"
        for out in outs
    )
    assert how == ["compiled", "compiled by the other process"]  # one compiled, one imported its binary
    assert not (directory / "lock").exists()  # the stale baton is gone
    built = [line.split("\t")[3] for line in (directory / ".ninja_log").read_text().splitlines()[1:]]
    assert built.count("main.o") == 1 and len([b for b in built if b.endswith(".so")]) == 1


def test_step_modules_hold_the_cpp_tensors_in_the_models_order(ext):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    step = cpp.rewire_step(model, torch.randn(6, 3), DEVICES)
    original, replicas = step.modules()
    assert [n for n, _ in original.named_parameters()] == [n for n, _ in model.named_parameters()]
    held = dict(original.named_parameters())
    assert all(held[n] is t for n, t in step.params.items())  # the C++ tensors themselves, not copies
    for replica, params in zip(replicas, step.replica_params):
        held = dict(replica.named_parameters())
        assert all(held[n] is t for n, t in params.items())


def test_a_step_runs_with_another_extension(ext):
    class Spy:
        def __getattr__(self, name):
            def call(*args):
                calls.append(name)
                return getattr(ext, name)(*args)

            return call

    calls: list[str] = []
    step = cpp.rewire_step(nn.Linear(3, 2), torch.randn(6, 3), DEVICES, extension=Spy())
    assert calls == ["rewire_step"] and step.grads["weight"] is not None


def test_a_build_waits_for_the_process_that_compiles_and_says_so(ext, tmp_path, monkeypatch, capsys):
    """build() finds the OS lock held (build_in_background's process, compiling), waits, then imports its binary."""
    import fcntl
    import threading

    cached = _build.build_directory()  # the ext fixture's folder, binary and all
    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))
    directory = _build.build_directory()
    shutil.copytree(cached, directory)  # as the other process leaves it once it has compiled
    with open(directory / "dpteach.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the other process, mid-compile
        threading.Timer(1.0, fcntl.flock, (held, fcntl.LOCK_UN)).start()  # ... finishes after a second
        module = _build.build(progress=True)
    printed = capsys.readouterr().out
    assert "waiting for another process that is compiling dp_original.cpp" in printed  # never silent
    assert "compiled by the other process, loaded in" in printed  # not "compiled": this one did not
    assert module.rewire_step is not None


def test_build_in_background_starts_one_child_only_when_there_is_something_to_build(
    ext, tmp_path, monkeypatch
):
    started = []

    class Child:
        def __init__(self, args, **kwargs):
            started.append((args, kwargs["env"]["PYTHONPATH"]))

        def poll(self):
            return None  # still compiling

        def wait(self):  # what the reaping thread calls
            return 0

    monkeypatch.setattr(_build.subprocess, "Popen", Child)
    monkeypatch.setattr(_build, "_background", [])
    assert not cpp.build_in_background()  # the ext fixture's binary is cached: nothing to do
    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))  # an empty cache
    assert cpp.build_in_background() and not cpp.build_in_background()  # one child, not two at once
    ((args, path),) = started
    assert args[0] == sys.executable and "_build.build(progress=False)" in args[-1]
    assert path.split(os.pathsep)[0] == str(_build.Path(_build.__file__).resolve().parents[2])  # this dpteach
