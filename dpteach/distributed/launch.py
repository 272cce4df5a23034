"""Start ranks from a notebook: torchrun's job, done by an object the caller can hold.

    with Ranks(2) as ranks:                                  # two processes; gloo on loopback, NCCL on GPUs
        grads = ranks.run("gradients", global_batch=8)      # one result per rank, in rank order

    run("gradients", world_size=2, global_batch=8)          # the same, start to finish

Why not ``mp.spawn(fn)``? A spawned worker is a fresh interpreter that imports ``fn`` by module
and name. A function defined in a notebook cell lives in ``__main__``, which the worker cannot
import (Lightning-AI/pytorch-lightning #7550), and spawn re-runs the caller's main script in each
worker. So, like torchrun, this starts fresh ``python`` processes of its own and names tasks:
``"gradients"`` is a function in :mod:`dpteach.distributed.tasks`, ``"package.module:function"``
any importable one.

Cleanup is the point. If a rank raises, the caller gets :class:`RankFailed` naming the rank and
carrying its traceback; if ranks go quiet, :class:`RankTimeout` after ``timeout`` seconds. Either
way every process is stopped and reaped before the exception reaches the caller.
"""

from __future__ import annotations

import multiprocessing as mp
import operator
import os
import signal
import subprocess
import sys
import time
import weakref
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from . import worker
from .loopback import gloo_on_loopback

__all__ = ["Ranks", "run", "RankFailed", "RankTimeout", "default_backend", "task_name"]

ADDR = "127.0.0.1"  # loopback: every rank is on this machine
# DDP's constructor imports torch._dynamo, seconds on a small CPU: each rank imports it while starting
PRELOAD = ("torch._dynamo",)
# What each rank's interpreter runs. Each rank starts in a session of its own, so the SIGINT that
# a terminal's Ctrl-C, Jupyter's "interrupt" or a kernel's shutdown sends to the launcher's process
# group never reaches it, not even while it is still importing (a SIGINT there is a "Fatal Python
# error"); the launcher catches Ctrl-C and stops the ranks itself. The rank also ignores SIGINT,
# in case it is started some other way. It exits by itself when the launcher dies (worker.py).
ENTRY = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "from dpteach.distributed.worker import main; main()"
)


class RankFailed(RuntimeError):
    """A rank raised (or died): ``rank``, ``exc_type``, ``message`` and ``traceback`` say where and why."""

    def __init__(self, rank: int, exc_type: str, message: str, traceback: str, output: str = "", others=()):
        self.rank, self.exc_type, self.message, self.traceback, self.output = (
            rank,
            exc_type,
            message,
            traceback,
            output,
        )
        self.others = tuple(others)  # ranks that failed later, usually because this one did
        also = f" (later also ranks {', '.join(map(str, self.others))})" if self.others else ""
        super().__init__(
            f"rank {rank} failed: {exc_type}: {message}{also}\n\n"
            f"Traceback from rank {rank}, which was stopped with all the others:\n{traceback}"
        )

    def __reduce__(self):  # picklable (pytest-xdist, multiprocessing) despite the custom signature
        return type(self), (self.rank, self.exc_type, self.message, self.traceback, self.output, self.others)


class RankTimeout(TimeoutError):
    """Some ranks did not answer in time; ``ranks`` lists them. They were stopped with all the others.
    ``answered`` maps each rank that did answer in time to its return value."""

    def __init__(self, ranks: list[int], what: str, timeout: float, answered: dict[int, Any] | None = None):
        self.ranks, self.what, self.timeout = ranks, what, timeout
        self.answered = dict(answered or {})
        super().__init__(
            f"rank(s) {', '.join(map(str, ranks))} gave no answer to {what} within {timeout:g} s "
            "(a hang, or a collective that one rank never entered); every rank was stopped"
        )

    def __reduce__(self):
        return type(self), (self.ranks, self.what, self.timeout, self.answered)


def default_backend(world_size: int) -> str:
    """NCCL when every rank can have a GPU of its own, gloo (CPU) otherwise."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def check_backend(backend: str, world_size: int) -> None:
    """Refuse, in one sentence, a backend this machine cannot run for ``world_size`` ranks.

    NCCL binds one GPU to each rank; without CUDA, or with fewer GPUs than ranks, torch would fail
    later inside a rank with an internal error ("invalid device ordinal", an AttributeError)."""
    if backend != "nccl":
        return
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"backend='nccl' needs a CUDA GPU for each of the {world_size} ranks, but CUDA is not available "
            "here; use backend='gloo' (the default without GPUs), which runs the ranks on the CPU."
        )
    gpus = torch.cuda.device_count()
    if gpus < world_size:
        raise RuntimeError(
            f"backend='nccl' needs a GPU for each of the {world_size} ranks, but only {gpus} GPU(s) exist "
            f"here; use at most {gpus} ranks with NCCL, or backend='gloo'."
        )
    if not dist.is_nccl_available():
        raise RuntimeError(
            "backend='nccl' was asked for, but this PyTorch was built without NCCL; use backend='gloo'."
        )


def task_name(task: str | Callable) -> str:
    """The name a rank imports a task by; refuses functions a spawned process cannot import."""
    if isinstance(task, str):
        worker.resolve(task)  # fail here, in the caller, on a typo
        return task
    module, qualname = getattr(task, "__module__", None), getattr(task, "__qualname__", "")
    if module in (None, "__main__") or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{getattr(task, '__name__', task)!r} is defined in {module or 'no module'}"
            f"{' (a notebook cell or script)' if module == '__main__' else ''}, so a spawned rank cannot "
            "import it; this is why mp.spawn fails in Jupyter. Move it into a .py file and import it "
            "from there, or use a task from dpteach.distributed.tasks by name."
        )
    return f"{module}:{qualname}"


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``p``'s process group: the rank and every process it started (DataLoader workers,
    a shell's children). Each rank leads a session of its own, so its group id is its pid; torchrun's
    agent signals the group the same way. An empty group is gone: nothing to do."""
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(processes: list, conns: list, grace: float) -> None:
    """Stop every process and its children: let it leave on its own for ``grace`` s, then SIGTERM,
    then SIGKILL, each to the rank's whole process group; reap every rank."""
    deadline = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in processes:  # also after the rank left: children it started may still run
        _signal_group(p, signal.SIGTERM)
    stop_by = time.monotonic() + 2.0
    for p in processes:
        try:
            p.wait(max(0.0, stop_by - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in processes:
        _signal_group(p, signal.SIGKILL)  # SIGTERM ignored or stuck in C++: no second chance
        p.wait()  # reaped: no zombie, returncode set
    for c in conns:
        c.close()


def _environment(
    rank: int, world_size: int, port: int, backend: str, timeout: float, threads: int, preload
) -> dict:
    """A rank's environment: torchrun's variables, plus how to find dpteach and what backend to use.

    Every rank runs on this machine, so gloo is pointed at the loopback interface unless the caller
    set ``GLOO_SOCKET_IFNAME`` (:mod:`.loopback`)."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # so the rank imports this very dpteach
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(
        MASTER_ADDR=ADDR,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS=str(threads),
        DPTEACH_BACKEND=backend,
        DPTEACH_TIMEOUT=str(timeout),
        DPTEACH_PRELOAD=",".join(preload),
        DPTEACH_LAUNCHER_PID=str(os.getpid()),  # the rank exits when this process is gone
    )
    gloo_on_loopback(env)
    return env


def _whole_number(value: Any, name: str, meaning: str) -> int:
    """``value`` as an int, or a sentence saying what ``name`` must be (``"2"`` and ``2.5`` fail in torch, unsaid)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a whole number, {meaning}; got {value!r}")
    try:
        return operator.index(value)  # an int or an integer-like (numpy.int64), never a float or a string
    except TypeError:
        raise TypeError(
            f"{name} must be a whole number, {meaning}; got {value!r} ({type(value).__name__})"
        ) from None


class Ranks:
    """``world_size`` worker processes in one process group, alive until :meth:`close`."""

    def __init__(
        self,
        world_size: int = 2,
        backend: str | None = None,
        *,
        timeout: float = 120.0,
        threads: int | None = None,
        preload: Sequence[str] = PRELOAD,
    ):
        world_size = _whole_number(
            world_size, "world_size", "the number of ranks (processes) to start, e.g. 2"
        )
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        if threads is not None:
            threads = _whole_number(threads, "threads", "intra-op threads per rank, e.g. 1")
        self.world_size = world_size
        self.backend = backend or default_backend(world_size)
        check_backend(self.backend, world_size)  # before any process starts
        self.timeout = timeout
        threads = threads or max(1, (os.cpu_count() or 1) // world_size)
        # The rendezvous store lives here, as torchrun's agent keeps it; port 0 lets the OS pick a free one.
        self.store = dist.TCPStore(
            ADDR, 0, world_size, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout)
        )
        self.port = self.store.port
        self.processes: list[subprocess.Popen] = []
        self._conns = []
        self.closed = False
        self.last_outputs: list[str] = []  # what each rank printed during the last run(), in rank order
        # stop the ranks even if the caller forgets close() (garbage collection, interpreter exit)
        self._finalizer = weakref.finalize(self, _stop, self.processes, self._conns, 0.0)
        try:
            for rank in range(world_size):
                ours, theirs = mp.Pipe()  # a socket pair: the rank's end is inherited by its fd number
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", ENTRY, str(theirs.fileno())],
                        env=_environment(
                            rank, world_size, self.port, self.backend, timeout, threads, preload
                        ),
                        pass_fds=[theirs.fileno()],
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # out of reach of signals sent to our process group
                    )
                )
                theirs.close()  # only the rank holds its end now, so its death reads as EOF here
                self._conns.append(ours)
        except BaseException:  # also Ctrl-C while the ranks start: none may be left running
            self.close(grace=0.0)
            raise
        self.pids = [p.pid for p in self.processes]
        self.ready = False  # the ranks import torch and join in the background; run() waits for them
        self._deadline = time.monotonic() + timeout

    def wait_ready(self) -> "Ranks":
        """Block until every rank has joined the process group (or raise, naming the rank that could not)."""
        if not self.ready:
            self._collect(max(0.0, self._deadline - time.monotonic()), "joining the process group")
            self.ready = True
        return self

    def run(
        self, task: str | Callable, *args: Any, timeout: float | None = None, echo: bool = True, **kwargs: Any
    ) -> list:
        """Run ``task(*args, **kwargs)`` on every rank at once; its return values, in rank order.

        What the ranks print comes back too, and is shown as ``[rank r] ...`` unless ``echo=False``;
        it is kept, one string per rank, in :attr:`last_outputs` until the next run.
        """
        if self.closed:
            raise RuntimeError("these ranks are closed (after close() or a failure); start new Ranks(...)")
        name, payload = task_name(task), worker.dumps((args, kwargs))
        self.wait_ready()
        for conn in self._conns:
            conn.send((name, payload))
        results, outputs = self._collect(self.timeout if timeout is None else timeout, f"task {name!r}")
        self.last_outputs = list(outputs)
        if echo:
            for rank, text in enumerate(outputs):
                for line in text.splitlines():
                    print(f"[rank {rank}] {line}")
        return results

    def _collect(self, timeout: float, what: str) -> tuple[list, list]:
        """One answer from every rank; on the first failure or at the deadline, stop them all and raise."""
        try:
            return self._gather_answers(timeout, what)
        except BaseException:  # RankFailed, RankTimeout, and Ctrl-C in the caller alike
            self.close(grace=0.0)
            raise

    def _gather_answers(self, timeout: float, what: str) -> tuple[list, list]:
        deadline = time.monotonic() + timeout
        answers: dict[int, tuple] = {}
        failures: dict[int, tuple] = {}
        while len(answers) < self.world_size and not failures:
            pending = {c: r for r, c in enumerate(self._conns) if r not in answers}  # EOF too: a rank died
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                answered = {r: worker.loads(answers[r][1]) for r in sorted(answers)}
                raise RankTimeout(sorted(set(pending.values())), what, timeout, answered)
            for obj in ready:
                self._read(pending[obj], answers, failures)
        if failures:
            # a rank that fails first makes its peers fail next (a closed connection): blame the earliest
            for obj in wait(self._conns, timeout=0.2):
                self._read(self._conns.index(obj), answers, failures)
            first = min(failures, key=lambda r: failures[r][1])
            _, _, exc_type, message, tb, output = failures[first]
            raise RankFailed(first, exc_type, message, tb, output, sorted(set(failures) - {first}))
        results = [worker.loads(answers[r][1]) for r in range(self.world_size)]
        return results, [answers[r][2] for r in range(self.world_size)]

    def _read(self, rank: int, answers: dict, failures: dict) -> None:
        """Take one message from ``rank``, or note that it died without one."""
        if rank in answers or rank in failures:
            return
        try:
            message = self._conns[rank].recv()
        except (EOFError, OSError):
            proc = self.processes[rank]
            try:
                code = proc.wait(2.0)
            except subprocess.TimeoutExpired:
                code = "none (it closed its end and kept running)"
            message = (
                "error",
                time.time(),
                "ProcessExit",
                f"exited with code {code} without an answer",
                "(no Python traceback: the process was killed, crashed, or exited early)\n",
                "",
            )
        (failures if message[0] == "error" else answers)[rank] = message

    def alive(self) -> list[bool]:
        """Whether each rank's process is still running."""
        return [p.poll() is None for p in self.processes]

    def close(self, grace: float = 5.0) -> None:
        """Ask every rank to leave the group and exit; stop any that do not within ``grace`` s. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if grace:
            for conn, p in zip(self._conns, self.processes):
                if p.poll() is None:
                    try:
                        conn.send(None)
                    except OSError:
                        pass
        self._finalizer.detach()
        _stop(self.processes, self._conns, grace)
        self.store = None  # the rendezvous port is free again

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.close(grace=0.0 if exc[0] is not None else 5.0)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pids {self.pids}" + ("" if self.ready else ", starting")
        return f"Ranks(world_size={self.world_size}, backend={self.backend!r}, {ADDR}:{self.port}, {state})"


def run(
    task: str | Callable,
    *args: Any,
    world_size: int = 2,
    backend: str | None = None,
    timeout: float = 120.0,
    echo: bool = True,
    **kwargs: Any,
) -> list:
    """Start ``world_size`` ranks, run one task on all of them, stop them; the results in rank order."""
    with Ranks(world_size, backend, timeout=timeout) as ranks:
        return ranks.run(task, *args, timeout=timeout, echo=echo, **kwargs)
