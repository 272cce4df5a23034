"""The rank side of :mod:`dpteach.distributed.launch`: one process per rank, running tasks by name.

    python -c "...; from dpteach.distributed.worker import main; main()" FD      # started by Ranks

Like a torchrun worker, a rank finds ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``
and ``LOCAL_RANK`` in its environment, and the rendezvous store is the launcher's (torchrun's
agent keeps it the same way). It talks to the launcher over the inherited socket ``FD``. A task
arrives as a *name*, ``"gradients"`` or ``"package.module:function"``, never as a pickled function:
this is a fresh interpreter, and it can only import what lives in a module.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch
import torch.distributed as dist

TASKS_MODULE = "dpteach.distributed.tasks"  # where a bare task name is looked up


def _is_yours(module) -> bool:
    """Whether ``module`` is a file in the working directory (a notebook's folder), not an installed package."""
    path = getattr(module, "__file__", None)
    if not path:
        return False
    path, cwd = os.path.realpath(path), os.path.realpath(os.getcwd())
    return (
        os.path.dirname(path) == cwd
        and "site-packages" not in path
        and not module.__name__.startswith("dpteach")
    )


def resolve(name: str) -> Callable:
    """The function a task name stands for: ``"gradients"`` in dpteach's tasks, or ``"module:function"``."""
    module, _, attr = name.rpartition(":") if ":" in name else (TASKS_MODULE, ":", name)
    imported_before = module in sys.modules
    fn = importlib.import_module(module)
    if imported_before and _is_yours(fn):
        # a file of the caller's own (my_tasks.py beside the notebook) may have been edited since the
        # rank first imported it: read it again, so that the edit runs without starting new ranks
        fn = importlib.reload(fn)
    for part in attr.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise TypeError(f"task {name!r} is {type(fn).__name__}, not a function")
    return fn


def dumps(obj: Any) -> bytes:
    """Bytes for the pipe; torch.save copes with tensors and nested containers alike."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    # our own bytes from our own processes, so full unpickling is safe; results come back on the CPU
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def join() -> None:
    """Enter the process group described by the environment, as ``init_process_group("env://")`` would."""
    env = os.environ
    rank, world_size, backend = int(env["RANK"]), int(env["WORLD_SIZE"]), env["DPTEACH_BACKEND"]
    # Ranks always sets OMP_NUM_THREADS, to cpu_count // world_size unless told threads=, replacing any
    # value the caller had set; torchrun keeps a user's OMP_NUM_THREADS, and only when there is none
    # sets it to 1 whenever it starts more than one process per node (torch/distributed/run.py)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if backend == "nccl":
        torch.cuda.set_device(
            int(env["LOCAL_RANK"])
        )  # one GPU per rank: NCCL refuses two ranks on one device
    timeout = timedelta(
        seconds=float(env["DPTEACH_TIMEOUT"])
    )  # a collective waiting longer raises, not hangs
    # a client of the launcher's store; env:// would make rank 0 try to open a second one on the same port
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    # device_id= binds the group to this rank's GPU, as init_process_group's docstring advises for NCCL
    device = torch.device("cuda", int(env["LOCAL_RANK"])) if backend == "nccl" else None
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device
    )


def _orphan_watch(parent: int) -> None:
    """Exit if the launcher dies without stopping us (a killed kernel): no rank outlives its launcher.

    ``parent`` is the launcher's pid, from the environment: had the launcher died while this rank
    was still importing, ``os.getppid()`` would already name whoever adopted the orphan."""
    while os.getppid() == parent:
        time.sleep(0.5)
    if os.getpgid(0) == os.getpid():  # we lead our own group (Ranks starts us so): take our children along
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _failure(output: io.StringIO) -> tuple:
    """What the launcher needs to name this failure: when, which exception, and its traceback as text."""
    exc = sys.exc_info()[1]
    return ("error", time.time(), type(exc).__name__, str(exc), traceback.format_exc(), output.getvalue())


def serve(conn) -> None:
    """Join the group, say ready, run each task sent until told to stop."""
    launcher = int(os.environ.get("DPTEACH_LAUNCHER_PID", os.getppid()))
    threading.Thread(target=_orphan_watch, args=(launcher,), daemon=True).start()
    try:
        for module in filter(None, os.environ.get("DPTEACH_PRELOAD", "").split(",")):
            importlib.import_module(module)  # e.g. torch._dynamo, which DDP's constructor imports: pay it now
        join()
    except BaseException:
        conn.send(_failure(io.StringIO()))
        return
    conn.send(("ok", dumps(os.getpid()), ""))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the launcher is gone; nobody is left to answer
            break
        if message is None:  # the launcher's "close"
            break
        name, payload = message
        output = io.StringIO()
        try:
            args, kwargs = loads(payload)
            with contextlib.redirect_stdout(output):  # prints travel back to the notebook, not to a log
                value = resolve(name)(*args, **kwargs)
            conn.send(("ok", dumps(value), output.getvalue()))
        except BaseException:
            conn.send(_failure(output))
    dist.destroy_process_group()


def main() -> None:
    """The process's entry point; ``sys.argv[1]`` is the socket the launcher left open for this rank."""
    serve(Connection(int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is sent and the group is left: skip the interpreter's teardown, which for a process
    # that imported torch can take seconds of garbage collection on a small CPU.
    os._exit(0)
