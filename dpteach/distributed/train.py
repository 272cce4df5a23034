"""Train the course's model (``dpteach.course.story``) under DistributedDataParallel, launched by torchrun.

    torchrun --standalone --nproc-per-node 2 -m dpteach.distributed.train --steps 20
    python -m dpteach.distributed.train --steps 20          # one process, world size 1

torchrun starts the processes and gives each ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; ``init_process_group()`` reads them (``env://``). Backend:
NCCL when every rank on this node has a GPU of its own, gloo otherwise.

The run is ``story.train`` (chapter 01's one-device reference) spread over the ranks: the same
model, the same 256 points, full-batch SGD with the same learning rate. DDP all-reduces the
gradients, so every rank takes the same step and the replicas never drift apart (checked at the
end); each rank keeps an equal shard of the points, so that step is one device's and the losses
printed are the one-device losses.

Buffers: DDP also broadcasts rank 0's buffers (BatchNorm's running statistics, chapter 05) when it
is built and, by default, at the start of every forward. In torch 2.13 the flag for the
per-forward sync is ``forward_sync_buffers``; the older ``broadcast_buffers`` is deprecated and not
quite the same: ``broadcast_buffers=False`` also left the buffers out of the sync at construction,
while ``forward_sync_buffers=False`` still syncs them there (``DistributedDataParallel``'s docstring).

Several machines (chapter 09 leaves this here): nothing in this file changes, only how the ranks
find each other. On each of two machines with 8 GPUs each::

    torchrun --nnodes 2 --nproc-per-node 8 \\
             --rdzv-backend c10d --rdzv-endpoint node0.example.com:29400 --rdzv-id run42 \\
             -m dpteach.distributed.train --steps 1000

- The rendezvous endpoint must be one every machine can reach (a host name or an IP on the
  cluster network, never ``127.0.0.1``); it plays the part of ``MASTER_ADDR:MASTER_PORT``.
- ``WORLD_SIZE`` becomes 16; ``RANK`` runs from 0 to 15 over all machines, and ``LOCAL_RANK``,
  0 to 7, picks the GPU on each machine.
- Rendezvous backends (``torch/distributed/run.py``): ``c10d`` (recommended: a store on the
  endpoint's machine, nothing to install; it also runs elastic jobs, ``--nnodes 1:4``),
  ``static`` (``--node-rank``, ``--master-addr`` and ``--master-port`` given by hand on each
  machine), ``etcd-v2`` and the legacy ``etcd``, both needing an etcd server with its v2 API.
- NCCL and gloo pick a network interface; on machines with several, set ``NCCL_SOCKET_IFNAME``
  or ``GLOO_SOCKET_IFNAME`` to the cluster network's. On one machine this script points gloo at the
  loopback interface itself, unless ``GLOO_SOCKET_IFNAME`` is set (:mod:`.loopback`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .loopback import gloo_on_loopback
from .model import loss_fn, make_data, make_model, shard_bounds

__all__ = ["main", "rank_device", "wrap", "local_shard"]


def rank_device() -> torch.device:
    """The device this rank's replica lives on: its own GPU under NCCL, the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wrap(model: nn.Module, **ddp_options) -> DDP:
    """``model`` on this rank's device, inside DDP (which broadcasts rank 0's weights once, here)."""
    device = rank_device()
    model = model.to(device)
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **ddp_options)


def local_shard(global_batch: int, seed: int, shards: Sequence[int] | None = None):
    """This rank's rows of the global batch ``seed``, on its device."""
    rank, world = dist.get_rank(), dist.get_world_size()
    start, end = shard_bounds(global_batch, world, shards)[rank]
    x, y = make_data(global_batch, seed)
    return x[start:end].to(rank_device()), y[start:end].to(rank_device())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dpteach.distributed.train", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument(
        "--global-batch", type=int, default=256, help="rows over all ranks (default 256, story's)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data (default 0)")
    parser.add_argument("--hidden", type=int, default=16, help="width of the hidden layers (default 16)")
    parser.add_argument(
        "--depth", type=int, default=1, help="hidden layers; 1 is the course model (default 1)"
    )
    parser.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (default 0.2)")
    parser.add_argument(
        "--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size (default 25)"
    )
    parser.add_argument(
        "--backend", choices=["gloo", "nccl"], help="default: nccl with a GPU per rank, else gloo"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds a collective may wait (default 120)"
    )
    return parser.parse_args(argv)


def _prepare_environment() -> None:
    """torchrun's variables for a world of one when run directly; gloo on loopback when every rank is here.

    Every rank is on this machine when ``LOCAL_WORLD_SIZE`` (set by torchrun, and above) equals
    ``WORLD_SIZE``; across machines, or without ``LOCAL_WORLD_SIZE``, gloo is left to the user."""
    if "RANK" not in os.environ:  # run directly, not by torchrun
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )
    if os.environ.get("LOCAL_WORLD_SIZE") == os.environ["WORLD_SIZE"]:
        gloo_on_loopback(os.environ)  # read by torch when the gloo group is created, in this process


def _join(args: argparse.Namespace) -> None:
    """``init_process_group`` from torchrun's environment variables, or as a world of one without them."""
    _prepare_environment()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    gpu_each = (
        torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    )  # a GPU for every local rank
    backend = args.backend or ("nccl" if gpu_each else "gloo")
    if backend == "nccl":
        from .launch import check_backend

        check_backend(backend, local_world)  # one sentence, not torch's "invalid device ordinal"
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # before init, so NCCL binds this rank's GPU
    # device_id= binds the group to this rank's GPU and forms NCCL's communicator at once
    # (init_process_group's docstring); gloo on CPU takes none
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else None
    # env://, as torchrun set it
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout), device_id=device)


def main(argv: Sequence[str] | None = None) -> int:
    """Train for ``--steps`` steps; rank 0 prints the loss; exit status 0 when all replicas agree."""
    args = _parse(argv)
    joined_here = not dist.is_initialized()  # False when a dpteach Ranks process runs main() as a task
    if joined_here:
        _join(args)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.global_batch % world:
            raise SystemExit(
                f"--global-batch {args.global_batch} must be a multiple of the world size {world}"
            )
        ddp = wrap(make_model(args.hidden, args.depth, args.seed), bucket_cap_mb=args.bucket_cap_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
        if rank == 0:
            print(
                f"world size {world}, backend {dist.get_backend()}, device {rank_device()}, "
                f"{args.global_batch // world} rows per rank",
                flush=True,
            )
        x, y = local_shard(args.global_batch, args.seed)  # this rank's rows, the same every step
        for step in range(1, args.steps + 1):
            loss = loss_fn(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces (averages) the gradients while backward runs
            opt.step()
            mean_loss = loss.detach().clone()
            dist.all_reduce(
                mean_loss
            )  # only for printing: with equal shards, the mean of means is the global mean
            if rank == 0:
                print(f"step {step:3d}/{args.steps}  loss {mean_loss.item() / world:.6f}", flush=True)
        # Same start, same averaged gradients, same steps: every replica must hold the same weights.
        flat = torch.cat([p.detach().flatten() for p in ddp.module.parameters()])
        copies = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(copies, flat)
        agree = all(torch.equal(copies[0], c) for c in copies)
        if rank == 0:
            print(f"done: parameters identical on all {world} ranks: {agree}", flush=True)
        return 0 if agree else 1
    finally:
        if joined_here:
            dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: with torch 2.13 (CPU), a two-rank gloo DDP script that has
    # already called destroy_process_group() still aborted in its teardown ("terminate called without an
    # active exception", SIGABRT) in 3 of 8 runs on our 2-core machine, and torchrun then reports the
    # whole job failed. Everything this script has to say is printed and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
