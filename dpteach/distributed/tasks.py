"""What chapter 09 asks the ranks to do, addressed by name: ``Ranks.run("gradients", ...)``.

Each function runs on every rank at once, inside a process group that is already up, and returns
plain data (CPU tensors, numbers, dicts) to the launcher. The training code is ``train.py``'s, so
the notebook and ``torchrun -m dpteach.distributed.train`` run the same DDP.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import warnings
from typing import Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..measure import timer
from .model import loss_fn, make_data, make_model, sgd_step
from .train import local_shard, rank_device, wrap

__all__ = [
    "hello",
    "start_weights",
    "all_reduce",
    "gradients",
    "autograd_grad",
    "ddp_from_scratch",
    "buckets",
    "bucket_order",
    "scratch_order",
    "traffic",
    "accumulate",
    "step_times",
    "extra_step",
    "fail",
    "hang",
]


def hello() -> dict:
    """Who am I: the rank's view of the world, as torchrun would have set it up."""
    me = dict(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        backend=dist.get_backend(),
        pid=os.getpid(),
        master=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        device=str(rank_device()),
    )
    print(f"rank {me['rank']} of {me['world_size']}, pid {me['pid']}, {me['backend']} via {me['master']}")
    return me


def start_weights(hidden: int = 16, depth: int = 1) -> dict:
    """A model seeded by this rank, so every rank starts with weights of its own, then wrapped in DDP:
    a few of its weights before and after (DDP's constructor broadcasts rank 0's, ``_sync_module_states``)."""
    model = make_model(hidden, depth, seed=dist.get_rank())
    before = model[0].weight[0].detach().clone()
    ddp = wrap(model)
    return dict(rank=dist.get_rank(), before=before.cpu(), after=ddp.module[0].weight[0].detach().cpu())


def all_reduce(values: Sequence[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank holds its own tensor; after ``all_reduce`` (SUM) every rank holds the sum. (before, after)"""
    rank = dist.get_rank()
    t = torch.tensor(values if values is not None else [rank + 1.0, 10.0 * (rank + 1)], device=rank_device())
    before = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place, on every rank: reduce and broadcast in one
    return before.cpu(), t.cpu()


def gradients(
    global_batch: int = 8,
    hidden: int = 16,
    depth: int = 1,
    seed: int = 0,
    shards: Sequence[int] | None = None,
) -> dict:
    """One DDP step's gradients on this rank: its shard, its own mean loss, then DDP's all-reduce mean."""
    ddp = wrap(make_model(hidden, depth, seed))
    x, y = local_shard(global_batch, seed, shards)
    loss = loss_fn(ddp(x), y)  # the mean over *this rank's* rows only
    loss.backward()  # returns with every gradient averaged over the ranks (DDP divides, then all-reduces)
    grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
    # and where they came from, for compare.on_ranks to print beside them
    return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend(), loss=loss.item())


@contextlib.contextmanager
def _bucket_strides_quiet():
    """Silence one warning of DDP's Reducer that says nothing wrong here: the output layer's (1, hidden)
    weight gets a gradient of strides (1, 1), not (hidden, 1), the same memory order, as its first
    dimension has size 1, and the Reducer warns at the strides."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Grad strides do not match bucket view strides")
        yield


def autograd_grad(global_batch: int = 8, hidden: int = 16, depth: int = 1, seed: int = 0) -> dict:
    """Chapter 07's gradient-norm penalty under DDP: the first gradient ``torch.autograd.grad`` returns,
    this rank's own gradient taken on the module alone, ``.grad`` after the penalised loss's backward, and
    ``whole``: the ``.grad`` the same penalty leaves on one process that takes all ``global_batch`` rows."""
    ddp = wrap(make_model(hidden, depth, seed))
    params = list(ddp.module.parameters())
    x, y = local_shard(global_batch, seed)
    loss = loss_fn(ddp(x), y)
    # torch.autograd.grad runs no AccumulateGrad, where DDP's hooks sit: nothing is averaged
    first = torch.autograd.grad(loss, params, create_graph=True)
    own = torch.autograd.grad(loss_fn(ddp.module(x), y), params)  # the module without DDP, on the same rows
    penalised = loss + 0.1 * sum(g.pow(2).sum() for g in first)
    with _bucket_strides_quiet():
        penalised.backward()  # accumulates into .grad: DDP averages it
    alone = make_model(hidden, depth, seed).to(x.device)  # one process, no DDP, every row of the batch
    x_all, y_all = (t.to(x.device) for t in make_data(global_batch, seed))
    loss_all = loss_fn(alone(x_all), y_all)
    grads_all = torch.autograd.grad(loss_all, list(alone.parameters()), create_graph=True)
    (loss_all + 0.1 * sum(g.pow(2).sum() for g in grads_all)).backward()
    return dict(
        first=[g.detach().cpu() for g in first],
        own=[g.cpu() for g in own],
        grad=[p.grad.cpu() for p in params],
        whole=[p.grad.cpu() for p in alone.parameters()],
    )


def ddp_from_scratch(global_batch: int = 8, hidden: int = 16, depth: int = 1, seed: int = 0) -> dict:
    """DDP's gradients without DDP: a hook per parameter all-reduces its gradient and divides by the ranks."""
    model = make_model(hidden, depth, seed).to(rank_device())
    world_size = dist.get_world_size()
    for p in model.parameters():
        dist.broadcast(p.detach(), src=0)  # start from rank 0's weights, as DDP's constructor does

    def average(p):  # runs once p.grad holds this rank's whole gradient for p
        # every rank puts in its gradient and gets back the sum; then the sum / the ranks: the mean
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(world_size)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(average)
    x, y = local_shard(global_batch, seed)
    loss = loss_fn(model(x), y)  # the mean over this rank's rows only
    loss.backward()  # the hooks all-reduce during backward, one parameter at a time
    grads = {name: p.grad.cpu() for name, p in model.named_parameters()}
    return dict(grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend(), loss=loss.item())


def _timed_allreduce(log: list, t0: list, marks: dict | None = None):
    """A comm hook: DDP's own all-reduce-and-average, noting when each bucket left and came back, and
    (into ``marks["nodes_done"]``) when backward's last node had run, where DDP starts to wait."""

    def hook(state, bucket):  # no annotations: DDP checks them, and ours would be strings (__future__)
        if marks is not None and bucket.is_last():
            # an engine callback runs once every node has run; queued here, at the last bucket, it runs
            # just before DDP's finalize_backward, which waits for every bucket (as in bucket_order)
            Variable._execution_engine.queue_callback(
                lambda: marks.__setitem__("nodes_done", time.perf_counter() - t0[0])
            )
        flat = bucket.buffer()  # the bucket's gradients, flattened into one tensor
        entry = dict(
            index=bucket.index(),
            numel=flat.numel(),
            bytes=flat.numel() * flat.element_size(),
            sent=time.perf_counter() - t0[0],
            params=[id(p) for p in bucket.parameters()],
        )
        log.append(entry)

        def done(fut):
            entry["done"] = time.perf_counter() - t0[0]
            return fut.value()  # the averaged bucket, handed back to DDP unchanged

        return default_hooks.allreduce_hook(state, bucket).then(done)

    return hook


def buckets(
    hidden: int = 256, depth: int = 3, global_batch: int = 64, bucket_cap_mb: float = 0.25, steps: int = 3
) -> dict:
    """How DDP packs gradients into buckets, and when each is all-reduced while backward still runs.

    DDP's bucket rules in torch 2.13 (chapter 09 leaves the detail here). Buckets are filled roughly
    in reverse order of ``model.parameters()``, because backward produces the last layer's gradients
    first. A bucket takes gradients until it holds at least ``bucket_cap_mb`` MiB (25 by default),
    then closes, so it can end one tensor past the cap (``compute_bucket_assignment_by_size`` in
    ``reducer.cpp``). With the default ``find_unused_parameters=False`` the first step puts every
    gradient in one bucket; the caps apply when DDP rebuilds its buckets after that step, in the
    order the gradients really arrived. If ``bucket_cap_mb`` is left at its default, the first
    bucket's cap is then 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``), so that its
    all-reduce can start sooner (``_BucketCapacityConfig`` in ``torch/nn/parallel/distributed.py``);
    passed by hand, even as 25, it caps the first bucket too. A bucket's all-reduce is launched
    asynchronously once its gradients are ready and every bucket before it has been launched
    (``Reducer::mark_bucket_ready``). This overlaps with backward because the engine runs a leaf's
    ``AccumulateGrad``, where DDP's hooks sit, as soon as its gradient is ready: ``AccumulateGrad``
    has the highest priority: its constructor sets its sequence number to ``UINT64_MAX``
    (``torch/csrc/autograd/functions/accumulate_grad.cpp``), and the engine runs higher sequence
    numbers first (``NOTE [ Sequence Number]`` in ``torch/csrc/autograd/node.h``).

    Times are seconds since backward began, from the last of ``steps`` steps (DDP rebuilds its
    buckets after the first step, in the order the gradients actually became ready). ``ready``
    says when each parameter's gradient was accumulated, ``nodes_done`` when backward's last node
    had run (from there to ``backward``, DDP waits for the buckets' all-reduces). On GPUs these are the times the CPU
    *launched* the work, which runs later on the GPU's streams. Buckets are launched in order but
    may come back out of order: gloo runs each process group's collectives on a pool of worker
    threads (``ProcessGroupGloo::Options::threads``, 2 by default), each taking the next queued one.
    """
    ddp = wrap(make_model(hidden, depth), bucket_cap_mb=bucket_cap_mb)
    names = {id(p): name for name, p in ddp.module.named_parameters()}
    log: list = []
    ready: dict = {}
    marks: dict = {}
    t0 = [0.0]
    ddp.register_comm_hook(dist.group.WORLD, _timed_allreduce(log, t0, marks))
    for name, p in ddp.module.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: ready.__setitem__(name, time.perf_counter() - t0[0])
        )
    x, y = local_shard(global_batch, seed=0)
    for _ in range(steps):
        log.clear()
        loss = loss_fn(ddp(x), y)
        dist.barrier()  # start backward together, as step_times does: a peer's head start is not waiting
        t0[0] = time.perf_counter()
        loss.backward()  # returns once every bucket's all-reduce has come back
        backward = time.perf_counter() - t0[0]
        ddp.zero_grad()
    for entry in log:
        entry["params"] = [names[i] for i in entry["params"]]
    log.sort(key=lambda e: e["index"])
    return dict(
        buckets=log,
        ready=ready,
        backward=backward,
        nodes_done=marks["nodes_done"],
        bucket_cap_mb=bucket_cap_mb,
    )


def _walk(fn, seen: set) -> list:
    """Every node of the autograd graph below ``fn``, each once."""
    nodes, todo = [], [fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        todo.extend(nxt for nxt, _ in node.next_functions)
    return nodes


def _recorder():
    """An event list, a ``note`` that appends to it, and which thread appended each event."""
    events: list = []
    threads: list = []

    def note(*event) -> None:  # hooks must return None: a returned value would replace the gradient
        events.append(event)
        threads.append(threading.get_ident())

    return events, threads, note


def _note_nodes(loss: torch.Tensor, note) -> None:
    """Note each backward node below ``loss`` as it starts (a parameter's AccumulateGrad is its "grad")."""
    for node in _walk(loss.grad_fn, set()):
        if type(node).__name__ != "AccumulateGrad":
            node.register_prehook(lambda grads, node=node: note("node", type(node).__name__))


def bucket_order(
    hidden: int = 256,
    depth: int = 3,
    global_batch: int = 64,
    bucket_cap_mb: float = 0.25,
    steps: int = 2,
    find_unused_parameters: bool = False,
) -> dict:
    """The order of one DDP backward, as events: each backward node as it starts, each parameter's
    gradient as it is accumulated, each bucket as DDP hands it to all-reduce, and the point where
    backward waits for the buckets. No clock is read, so the events are the same on every run and
    every machine (on CPU one thread runs the whole backward).

    Returns ``steps`` dicts, one per step: ``events``, a list of ``("node", name)``,
    ``("grad", parameter)``, ``("bucket", index, [parameters], bytes)`` and one ``("wait",)``;
    ``on_caller``, whether every event ran on the thread that called ``backward()``; and ``came_back``,
    for each bucket index, how many events had been noted when its all-reduce's future completed.
    ``came_back`` is the one clock-like figure: gloo completes the future on a thread of its own, so it
    can change from run to run. Plus this rank's process id. DDP's bucket rules, from torch 2.13's
    ``torch/nn/parallel/distributed.py`` and ``torch/csrc/distributed/c10d/reducer.cpp``:

    * The first step has one bucket, whatever ``bucket_cap_mb``, when ``find_unused_parameters=False``
      (the default) or ``static_graph=True`` and no ``bucket_cap_mb_list`` is given: the initial size
      limit is then ``sys.maxsize`` (``_BucketCapacityConfig.compute_bucket_size_limits``), because the
      parameters' order need not be backward's order. With ``find_unused_parameters=True`` (and no
      static graph) the caps apply from the first step: ``model.parameters()`` is cut from its front,
      the buckets are launched last one first (``DistributedDataParallel._ddp_init_helper`` reverses
      them), and they are never rebuilt (``Reducer::should_rebuild_buckets``).
    * During that step the ``Reducer`` notes the order in which gradients became ready
      (``rebuilt_params_``), and once, before the next forward, ``rebuild_buckets`` cuts that order into
      buckets of ``bucket_cap_mb`` (``compute_bucket_assignment_by_size``: a bucket closes once it holds
      at least its cap, so it can end one tensor past it). With ``bucket_cap_mb`` left at its default
      (25) the first bucket's cap is ``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB; passed by hand, the
      first bucket gets the same cap as the others.
    * ``Reducer::mark_bucket_ready`` launches buckets strictly in index order: a ready bucket waits
      until every bucket before it has been launched. ``all_reduce_bucket`` calls the comm hook and
      keeps the future it returns, without waiting: the comm hook runs at launch, on the autograd
      thread, so its place among the events is the launch's place.
    * Once the last bucket is launched, ``mark_variable_ready`` queues ``finalize_backward`` as an
      engine callback, which runs after every backward node and waits on each bucket's future. The
      comm hook queues a callback of its own at the last bucket, just before DDP's (the engine runs
      them in the order queued): that callback is the ``("wait",)`` event.

    Every node between a bucket's event and the wait is backward work that ran while that bucket's
    all-reduce was in flight. The tasks' comm hook is DDP's own ``allreduce_hook``; it only notes.
    """
    ddp = wrap(
        make_model(hidden, depth), bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters
    )
    names = {id(p): name for name, p in ddp.module.named_parameters()}
    events, threads, note = _recorder()
    came_back: dict = {}

    def hook(state, bucket):  # no annotations: DDP checks them, and ours would be strings (__future__)
        flat, index = bucket.buffer(), bucket.index()
        params = [names[id(p)] for p in bucket.parameters()]
        note("bucket", index, params, flat.numel() * flat.element_size())
        if bucket.is_last():  # runs once every node has run, just before DDP's finalize_backward
            Variable._execution_engine.queue_callback(lambda: note("wait"))

        def back(fut):  # on whichever thread completes the all-reduce: its place varies
            came_back[index] = len(events)
            return fut.value()

        return default_hooks.allreduce_hook(state, bucket).then(back)  # returned at once, not waited on

    ddp.register_comm_hook(dist.group.WORLD, hook)
    for name, p in ddp.module.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: note("grad", name))
    x, y = local_shard(global_batch, seed=0)
    report = []
    for _ in range(steps):
        events.clear()
        threads.clear()
        came_back.clear()
        loss = loss_fn(ddp(x), y)
        _note_nodes(loss, note)
        loss.backward()  # returns once every bucket's all-reduce has come back
        caller = threading.get_ident()
        report.append(
            dict(events=list(events), on_caller=all(t == caller for t in threads), came_back=dict(came_back))
        )
        sgd_step(ddp, lr=0.01)
        ddp.zero_grad()
    return dict(
        steps=report,
        pid=os.getpid(),
        bucket_cap_mb=bucket_cap_mb,
        find_unused_parameters=find_unused_parameters,
    )


def scratch_order(hidden: int = 256, depth: int = 3, global_batch: int = 64, steps: int = 2) -> dict:
    """``ddp_from_scratch``'s backward, recorded as ``bucket_order`` records DDP's: the same model,
    shard and events. Each parameter is a bucket of its own: ``("bucket", index, [parameter], bytes)``
    as its hook calls ``all_reduce``, then ``("done", index)`` once that call has returned; the next
    backward node starts after that. With gloo the call returns once the sum is back (``Work::wait``
    blocks); with NCCL and ``async_op=False`` it returns once the all-reduce is queued on the current
    CUDA stream (``ProcessGroupNCCL::collective``), where backward's next kernels queue behind it."""
    model = make_model(hidden, depth).to(rank_device())
    world_size = dist.get_world_size()
    for p in model.parameters():
        dist.broadcast(p.detach(), src=0)  # start from rank 0's weights, as DDP's constructor does
    events, threads, note = _recorder()

    def average(p, name):  # ddp_from_scratch's hook, with notes around its all_reduce
        note("grad", name)
        index = sum(e[0] == "bucket" for e in events)  # the buckets launched so far this step
        note("bucket", index, [name], p.grad.numel() * p.grad.element_size())
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # gloo: returns once every rank's sum is here
        note("done", index)
        p.grad.div_(world_size)

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: average(p, name))
    x, y = local_shard(global_batch, seed=0)
    report = []
    for _ in range(steps):
        events.clear()
        threads.clear()
        loss = loss_fn(model(x), y)
        _note_nodes(loss, note)
        loss.backward()
        caller = threading.get_ident()
        report.append(dict(events=list(events), on_caller=all(t == caller for t in threads)))
        sgd_step(model, lr=0.01)
        model.zero_grad()
    return dict(steps=report, pid=os.getpid())


def traffic(hidden: int = 16, depth: int = 1, global_batch: int = 64, steps: int = 3) -> dict:
    """What DDP moves per step, as its own comm hook sees it: all-reduce calls and bytes, and whether the
    parameters' storage is the same after ``steps`` steps (DDP keeps one replica for the whole run)."""
    ddp = wrap(make_model(hidden, depth))
    storage = [p.data_ptr() for p in ddp.parameters()]
    reduced: list = []
    ddp.register_comm_hook(dist.group.WORLD, _timed_allreduce(reduced, [time.perf_counter()]))
    for step in range(steps):
        x, y = local_shard(global_batch, seed=step)
        loss_fn(ddp(x), y).backward()
        sgd_step(ddp, lr=0.1)  # the same update on every rank: the gradients are the same
    return dict(
        allreduce_bytes_per_step=sum(e["bytes"] for e in reduced) // steps,
        allreduce_calls_per_step=len(reduced) // steps,  # buckets DDP's comm hook handed to all-reduce
        same_parameters=storage == [p.data_ptr() for p in ddp.parameters()],
    )


def accumulate(
    global_batch: int = 8,
    micro_batches: int = 2,
    no_sync: bool = True,
    hidden: int = 16,
    depth: int = 1,
    seed: int = 0,
) -> dict:
    """Gradient accumulation under DDP: this rank's rows in ``micro_batches`` equal pieces, each piece's
    mean loss divided by their number and backward run once per piece; with ``no_sync``, every piece
    but the last runs inside ``ddp.no_sync()``. The gradients, and the buckets DDP handed to all-reduce."""
    ddp = wrap(make_model(hidden, depth, seed))
    reduced: list = []
    ddp.register_comm_hook(dist.group.WORLD, _timed_allreduce(reduced, [time.perf_counter()]))
    x, y = local_shard(global_batch, seed)
    if len(x) % micro_batches:
        raise ValueError(
            f"{len(x)} rows on rank {dist.get_rank()} do not split into {micro_batches} equal pieces"
        )
    pieces = list(zip(x.chunk(micro_batches), y.chunk(micro_batches)))
    for i, (xb, yb) in enumerate(pieces):
        # the forward too must run inside no_sync, or DDP syncs the gradients all the same (its docstring)
        quiet = no_sync and i < len(pieces) - 1
        with ddp.no_sync() if quiet else contextlib.nullcontext():
            (loss_fn(ddp(xb), yb) / micro_batches).backward()  # adds into .grad
    grads = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
    return dict(
        grads=grads, rows=len(x), device=str(x.device), backend=dist.get_backend(), allreduces=len(reduced)
    )


def step_times(
    hiddens: Sequence[int] = (32, 128, 512),
    depth: int = 3,
    global_batch: int = 64,
    repeats: int = 12,
    warmup: int = 3,
    threads: int | None = 1,
) -> dict:
    """Median seconds per DDP training step for each hidden width (a step ends when the slowest rank is done).

    ``threads``: torch's intra-op threads per rank while timing on CPU, as ``compare.step_times(...,
    threads=1)`` gives each DataParallel replica one; ``None`` keeps the rank's own setting.
    """
    device = rank_device()
    with timer.threads_per_slot([device], threads):
        return _step_times(hiddens, depth, global_batch, repeats, warmup, device)


def _step_times(hiddens, depth, global_batch, repeats, warmup, device) -> dict:
    medians = {}
    for hidden in hiddens:
        ddp = wrap(make_model(hidden, depth))
        x, y = local_shard(global_batch, seed=0)
        times = []
        for i in range(warmup + repeats):
            dist.barrier()  # start together, so one rank's head start is not counted as speed
            start = time.perf_counter()
            loss_fn(ddp(x), y).backward()
            sgd_step(ddp, lr=0.01)  # as compare.step_times does, so the steps are the same work
            if device.type == "cuda":
                torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before reading the clock
            elapsed = torch.tensor([time.perf_counter() - start], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time is the step's time
            if i >= warmup:
                times.append(elapsed.item())
        medians[hidden] = statistics.median(times)
    return medians


def extra_step(
    on_rank: int = 0, steps: int = 2, global_batch: int = 8, join: bool = False, gradients: bool = False
) -> int | dict:
    """Every rank runs ``steps`` DDP backwards, rank ``on_rank`` one more, as with one batch more.

    That extra backward all-reduces a bucket no other rank sends: it waits until the process group's
    timeout, unless the launcher stops it first. ``join=True`` wraps the loop in ``ddp.join()``, whose
    docstring promises to "shadow" the forward and backward passes of ranks still running with the
    collectives they wait for, so every rank returns. Each rank returns the steps it ran; with
    ``gradients=True``, a dict of those ``steps``, the gradients of its ``last`` backward, and its
    ``own``: the same model's gradient of its rows' mean loss on this rank alone, with no all-reduce.
    Under ``join`` the joined ranks put zeros into the extra step's all-reduce and DDP still divides by
    the starting world size (``divide_by_initial_world_size=True``), so rank ``on_rank``'s ``last`` is
    its ``own`` over the world size.
    """
    ddp = wrap(make_model())
    x, y = local_shard(global_batch, 0)
    runs = steps + (dist.get_rank() == on_rank)
    with ddp.join() if join else contextlib.nullcontext():
        for _ in range(runs):
            ddp.zero_grad()  # each step's gradient on its own, as a training loop has it
            loss_fn(ddp(x), y).backward()
    if not gradients:
        return runs
    alone = make_model()
    alone.load_state_dict(ddp.module.state_dict())  # the same weights, outside DDP: no all-reduce
    loss_fn(alone(x), y).backward()
    last = {name: p.grad.cpu() for name, p in ddp.module.named_parameters()}
    return dict(steps=runs, last=last, own={name: p.grad.cpu() for name, p in alone.named_parameters()})


def fail(on_rank: int = 1) -> None:
    """Rank ``on_rank`` raises; the others wait in a barrier it will never reach.

    The worker catches the exception to report it, so rank ``on_rank``'s process lives on and its
    connections stay open: without the launcher's cleanup the others would wait here until the
    process group's timeout. (Had its process exited, gloo would have seen the connection close
    and failed the barrier at once.)
    """
    if dist.get_rank() == on_rank:
        raise ValueError(f"rank {on_rank} was told to fail (a bug in one rank's data, say)")
    dist.barrier()


def hang(on_rank: int = 1, seconds: float = 3600.0) -> None:
    """Rank ``on_rank`` goes silent for ``seconds``; the others wait in a barrier for it."""
    if dist.get_rank() == on_rank:
        time.sleep(seconds)
    dist.barrier()
