"""A cost model: the step time of DataParallel and of DDP on n GPUs of a named profile, from FLOPs and bytes.

Nothing here is timed. The inputs are counted on the learner's own model (:func:`workload`: FLOPs with
``torch.utils.flop_counter.FlopCounterMode``, bytes from the parameters, the batch and the output),
the GPU profiles come from spec sheets (``data/gpus.json``, each number with the page it was read
from), and the answer is a :class:`Prediction`: one bar (:class:`Part`) per piece of work, on the lane
that does it ("GPU 0", "GPU 1", ..., "link", "python"), placed after the work it waits for.

Assumptions, each one a simplification a real run will not honour exactly:

* **Compute** runs at ``EFFICIENCY`` (one fraction, for every GPU and dtype) of the spec sheet's
  dense peak for the dtype. A replica given ``batch / n`` rows does ``1 / n`` of the FLOPs.
* **Copies between GPUs** run at the profile's ``link_bw`` (one direction, all of the GPU's links at
  once; ``GPU.with_links`` gives two GPUs joined by fewer links what those links carry). A broadcast (replicate) or a reduce (the gradients' sum) is pipelined over a ring or
  tree, as NCCL does it, so each takes ``bytes / link_bw`` whatever n. The scatter sends ``(n-1)/n``
  of the batch out of GPU 0 and the gather brings ``(n-1)/n`` of the output back, one after another;
  the gather also copies GPU 0's own ``1/n`` into the gathered tensor, a read and a write at
  ``mem_bw``. The output is every tensor the model returns (``gather_map`` gathers each tensor of a
  tuple or dict); its gradient goes back only for ``Workload.grad_output_bytes``.
* **DataParallel** (``torch.nn.DataParallel`` and dpteach's, one process): on every step it
  scatters the batch, replicates the model (a broadcast of the parameters), starts one Python
  thread per replica (``PYTHON_THREAD_S`` each, one after another, since the starts take the GIL),
  runs the replicas' forwards, joins the threads, gathers the outputs onto GPU 0, runs the backwards (one autograd
  thread per GPU, so in parallel), and only when every replica's gradients exist, reduces them onto
  GPU 0: ``reduce_add_coalesced`` cuts each replica's gradients into chunks of 10 MiB
  (``torch._utils._take_tensors``, in parameter order) and flattens each chunk into one buffer: a read
  and a write of the chunk's bytes on every GPU, at ``mem_bw``, side by side, for a chunk of several
  tensors; a chunk of one tensor is flattened into a view of it (``flatten_dense_tensors`` in
  ``aten/src/ATen/native/TensorShape.cpp``) and costs nothing. Then ``reduce_add`` calls
  ``nccl.reduce``, which sums inside its kernel as the bytes arrive: one ``bytes / link_bw`` on the link.
* **DDP** (one process per GPU): no scatter, replicate or gather per step: each rank loads its own
  ``batch / n`` rows and keeps its own replica. Its gradients are all-reduced in buckets of
  ``bucket_bytes``, in the order backward produces them (the last layers first). A bucket is ready
  when backward has produced its share of the gradient bytes (backward's FLOPs are assumed spread
  evenly over the parameters' bytes); its ring all-reduce takes ``2(n-1)/n * bytes / link_bw``, one
  bucket at a time on the link, overlapped with the rest of backward. Buckets are filled as DDP fills
  them after its first step (torch/nn/parallel/distributed.py, ``_BucketCapacityConfig``): gradients in
  backward order, a bucket closing on the tensor that takes it to its cap, the first bucket's cap
  ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) when ``bucket_cap_mb`` is left unset, 25 MiB after it.
* **Latency per message**, only with ``predict(..., latency=True)``: NCCL's own tuning model
  (``src/graph/tuning.cc``, numbers in ``data/gpus.json`` with the commit they were read at). Each
  DDP bucket's ring all-reduce adds ``base + 2(n-1) * step``: a base latency, and one step latency
  per hop of its ``2(n-1)`` (n-1 to reduce-scatter, n-1 to all-gather). Each DataParallel message adds
  ``base + step``, NCCL's figure for one ring broadcast or reduce: one broadcast per 10 MiB chunk of
  the parameters, one reduce per chunk of the gradients, and one copy per other GPU for the scatter,
  the gather and the gather's backward (that these peer copies cost what an NCCL call does is an
  assumption). ``step`` is NVLink's or PCIe's, by the profile's link. The messages of one kind run one
  after another; NCCL's numbers are its estimates for choosing an algorithm, not measurements.
* **n = 1** is the plain step, forward then backward, for both: neither wrapper replicates there.
* Left out: optimizer steps, the loss, buffers, data loading, kernel launches, the latency of each
  message unless ``latency=True``, DataParallel's packing of the parameters before its broadcast, and DDP's autograd hooks,
  which copy each gradient into its bucket and back (``mark_variable_ready_dense`` and
  ``copy_bucket_to_grad`` in ``reducer.cpp``). ``gradient_as_bucket_view=True`` makes each ``.grad`` a view of
  its bucket, which saves the copy in only while the view lasts, and ``zero_grad(set_to_none=True)``,
  the default, drops it every step (torch 2.13's DDP docstring, under ``batched_grad_copy``): the
  model's overheads are lower bounds.
* **Threads:** ``torch.nn.parallel.parallel_apply`` calls ``start()`` on every thread, then ``join()``
  on every thread. ``Thread.start`` returns once the new thread runs (it waits on the thread's
  ``_started`` event), so the starts are serial: replica k's forward begins ``(k + 1) * thread_s``
  after the replicate. The joins overlap the replicas' work: each waits for its replica's forward,
  and the last returns as the last forward ends, so the model charges no join (a join of a finished
  thread costs microseconds).
* ``EFFICIENCY`` and ``PYTHON_THREAD_S`` are assumed, not measured: ``predict`` takes either as a
  keyword (``efficiency=``, ``thread_s=``), so a reader can see what another value does to a step.

So with infinite link and memory bandwidth, DDP takes compute / n and DataParallel compute / n plus
``n * PYTHON_THREAD_S``: what is left of DataParallel's serial work when bytes cost nothing; with
``latency=True`` the messages' latencies stay too.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..data_parallel import mean_square

__all__ = [
    "EFFICIENCY",
    "PYTHON_THREAD_S",
    "STRATEGIES",
    "STRATEGY_COLOURS",
    "GPU",
    "GPUS",
    "Workload",
    "workload",
    "count_gpt2",
    "large_workload",
    "Part",
    "Prediction",
    "predict",
    "profiles",
    "table",
    "draw_timeline",
    "draw_over_n",
    "breakdown",
    "against_one",
    "gap",
    "clone_over_to",
    "LANE_LABELS",
    "PARTS",
    "GAP_ROWS",
    "part_colour",
]

GPUS_FILE = Path(__file__).with_name("data") / "gpus.json"

# The one fraction of the spec sheet's peak FLOP/s a training step is assumed to reach: a round
# figure, not fitted to any measurement (data/published.json shows where it misses).
EFFICIENCY = 0.5
# What starting one Python thread per replica costs DataParallel, per replica: an assumed round
# figure for threading.Thread.start on a busy host, not measured here. An idle thread's start is set
# mostly by the OS scheduler waking the new thread, so measured medians range from tens of µs to ms.
PYTHON_THREAD_S = 100e-6
STRATEGIES = ("DataParallel", "DDP")
# One colour per strategy in every figure of a step (timelines, speed-up curves, published runs, the
# reader's own timings), so DataParallel and DDP read the same in each; the plain step is grey.
# ColorBrewer's PuOr pair: told apart in the common colour blindnesses.
STRATEGY_COLOURS = {"DataParallel": "#e66101", "DDP": "#5e3c99", "plain": "#777777"}
# torch.nn.parallel.comm's bucket for broadcast_coalesced and reduce_add_coalesced (buffer_size)
COMM_BUCKET_BYTES = 10 * 2**20
# what every figure of the model says it leaves out
LEFT_OUT = "no message latency, kernel launches or DDP hooks"
LEFT_OUT_WITH_LATENCY = "NCCL's latency model; no kernel launches or DDP hooks"


@dataclass(frozen=True)
class GPU:
    """One GPU profile: peak FLOP/s per dtype, memory and GPU-to-GPU bandwidth (bytes/s, one direction)."""

    name: str
    flops: dict[str, float]
    mem_bw: float
    link_bw: float
    link: str
    source: str
    # NCCL's latency model (data/gpus.json "latency"): per message, and per ring step on this link
    base_latency_s: float = 0.0
    step_latency_s: float = 0.0
    # what one of the GPU's links carries, one direction, and how many it has (0: not counted)
    link_bw_per_link: float = 0.0
    links: int = 0

    def with_links(self, links: int) -> GPU:
        """This profile with ``links`` of its links between each pair of GPUs: ``link_bw`` is what they carry.

        For a machine whose GPUs are not all joined by every link (``nvidia-smi topo -m``: NV1, NV2, ...),
        as ``data/published.json`` reads its topology."""
        if not self.link_bw_per_link or not 0 < links <= self.links:
            raise ValueError(f"{self.name} counts {self.links} links in gpus.json; {links} asked for")
        kind = self.link.split(",")[0]
        return dataclasses.replace(
            self, link_bw=links * self.link_bw_per_link, link=f"{kind}, {links} link{'s' * (links > 1)}"
        )

    def rate(self, dtype: str, efficiency: float | None = None) -> float:
        """FLOP/s this model assumes for ``dtype``: ``efficiency`` (default ``EFFICIENCY``) of the peak."""
        if dtype not in self.flops:
            raise ValueError(f"{self.name} has no {dtype} peak in gpus.json; it has {', '.join(self.flops)}")
        return self.flops[dtype] * (EFFICIENCY if efficiency is None else efficiency)


def _load_gpus(path: Path = GPUS_FILE) -> dict[str, GPU]:
    data = json.loads(path.read_text())
    latency = data["latency"]
    gpus = {}
    for name, g in data["gpus"].items():
        sources = "; ".join(f"{k}: {v['read']}" for k, v in g["numbers"].items())
        gpus[name] = GPU(
            name=name,
            flops={k: float(v) for k, v in g["flops"].items()},
            mem_bw=float(g["mem_bw"]),
            link_bw=float(g["link_bw"]),
            link=g["link"],
            source=f"{g['datasheet']} (read: {sources})",
            base_latency_s=float(latency["base_s"]),
            step_latency_s=float(latency["step_s"]["NVLink" if g["link"].startswith("NVLink") else "PCIe"]),
            link_bw_per_link=float(g.get("link_bw_per_link", 0.0)),
            links=int(g.get("links", 0)),
        )
    return gpus


GPUS: dict[str, GPU] = _load_gpus()


@dataclass(frozen=True)
class Workload:
    """What one training step of a model on a batch costs, counted, not timed."""

    flops_fwd: float
    flops_bwd: float
    param_bytes: int
    param_tensors: int
    input_bytes: int
    output_bytes: int
    batch: int
    # each parameter's bytes in the order backward produces its gradient (the last layer first)
    grad_bytes: tuple[int, ...] = ()
    # the output's bytes that backward sends a gradient back for (the gather's backward scatters
    # them); None: all of ``output_bytes``. A model that returns its loss with its logits gets a
    # gradient for the loss alone
    grad_output_bytes: int | None = None

    def scaled(self, batch: int) -> Workload:
        """The same model on ``batch`` rows: FLOPs and the batch's bytes in proportion, parameters the same.

        ``batch`` is a number of rows (a positive whole number), not a factor: a tenth of the batch is
        ``work.scaled(work.batch // 10)``.
        """
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
            raise ValueError(
                f"Workload.scaled takes the new batch as a number of rows, a positive whole number such as "
                f"{self.batch // 10 or 1}; it got {batch!r}. For a fraction of the batch pass "
                f"work.scaled(work.batch // 10), not a factor such as 0.1."
            )
        batch = int(batch)
        k = batch / self.batch
        return dataclasses.replace(
            self,
            flops_fwd=self.flops_fwd * k,
            flops_bwd=self.flops_bwd * k,
            input_bytes=round(self.input_bytes * k),
            output_bytes=round(self.output_bytes * k),
            grad_output_bytes=None if self.grad_output_bytes is None else round(self.grad_output_bytes * k),
            batch=batch,
        )

    @property
    def output_grad_bytes(self) -> int:
        """The bytes of the output's gradient that the gather's backward sends back."""
        return self.output_bytes if self.grad_output_bytes is None else self.grad_output_bytes


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def workload(module: nn.Module, inputs: Any, loss_fn: Callable = mean_square) -> Workload:
    """Count one step of ``module`` on ``inputs`` (a tensor or a tuple): FLOPs of forward and backward, bytes.

    Runs the forward and the backward once, under ``FlopCounterMode``; the parameters' ``.grad`` are
    put back as they were afterwards.
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    params = list(module.parameters())
    kept = [p.grad for p in params]
    with FlopCounterMode(display=False) as forward:
        out = module(*inputs)
    loss = loss_fn(out)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    for p, g in zip(params, kept):
        p.grad = g
    return Workload(
        flops_fwd=float(forward.get_total_flops()),
        flops_bwd=float(backward.get_total_flops()),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        param_tensors=len(params),
        input_bytes=sum(t.numel() * t.element_size() for t in _tensors(inputs)),
        output_bytes=sum(t.numel() * t.element_size() for t in _tensors(out)),
        batch=_tensors(inputs)[0].shape[0],
        grad_bytes=tuple(p.numel() * p.element_size() for p in reversed(params)),
    )


class _LanguageModelLoss(nn.Module):
    """A causal language model called as transformers' Trainer calls it, ``labels=`` given: its
    forward returns every tensor of the model's output, the loss first, then the logits and the cache
    of keys and values (``use_cache`` is on in ``GPT2Config()``), since under DataParallel
    ``gather_map`` (``torch/nn/parallel/scatter_gather.py``) gathers every tensor of an output dict.

    ``cache=False`` returns the loss and the logits alone, the tensors a model built with
    ``use_cache=False`` returns. The keys and values are computed either way, so the FLOPs are the same;
    the model keeps its cache on here because transformers' mask code without one reads a tensor's value
    (``find_packed_sequence_indices``), which the meta device cannot give."""

    def __init__(self, lm: nn.Module, cache: bool = True):
        super().__init__()
        self.lm, self.cache = lm, cache

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.lm(input_ids=ids, labels=ids)
        if not self.cache:
            return (out.loss, out.logits)
        cache = out.get("cache", out.get("past_key_values"))
        # transformers 5's DynamicCache holds per layer the key and value tensors that 4.x returned
        # as a tuple per layer in past_key_values
        kv = (
            [t for layer in cache.layers for t in (layer.keys, layer.values)]
            if hasattr(cache, "layers")
            else cache
        )
        return (out.loss, out.logits, *_tensors(kv))


def _first(out: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return out[0]  # the loss: backward starts from it alone


def count_gpt2(batch: int = 1, seq: int = 1024, use_cache: bool = True) -> Workload:
    """GPT-2 small, counted: transformers' ``GPT2LMHeadModel(GPT2Config())`` on the meta device (shapes,
    no data, so nothing is computed or allocated), one step on ``batch`` sequences of ``seq`` tokens.

    The output's bytes are the whole output, the loss, the logits and, under ``GPT2Config``'s default
    ``use_cache=True``, the keys and values, since DataParallel gathers them all; only the loss's bytes
    get a gradient back (``grad_output_bytes``). ``use_cache=False`` counts the loss and logits alone.
    Needs ``transformers`` (not a dependency of dpteach). ``large_workload("gpt2-small")`` is the
    same count, made once and shipped, so a chapter need not import transformers.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        lm = GPT2LMHeadModel(GPT2Config())  # 124,439,808 parameters: the output layer shares wte
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    work = workload(_LanguageModelLoss(lm, cache=use_cache), ids, loss_fn=_first)
    return dataclasses.replace(work, grad_output_bytes=4)  # one fp32 loss


def saved_for_backward(module: nn.Module, inputs: Any, loss_fn: Callable = mean_square) -> list[torch.Tensor]:
    """The tensors one forward of ``module`` keeps for backward, besides the parameters: each storage
    once (a view counts as the tensor it views). On the meta device this measures memory without any."""
    params = {id(p) for p in module.parameters()}
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if id(base) not in params:
            kept[id(base)] = base
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(module(*inputs) if isinstance(inputs, tuple) else module(inputs))
    return list(kept.values())


def count_gpt2_saved(seq: int = 1024) -> dict[str, int]:
    """Bytes GPT-2 small keeps for backward per fp32 sequence of ``seq`` tokens (meta device, as
    ``count_gpt2``), and how many of them are attention weights (``seq`` x ``seq`` per head)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        lm = GPT2LMHeadModel(GPT2Config())
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    kept = saved_for_backward(_LanguageModelLoss(lm), ids, loss_fn=_first)
    attention = [t for t in kept if t.dim() >= 2 and t.shape[-2:] == (seq, seq)]
    return {
        "saved_bytes": sum(t.numel() * t.element_size() for t in kept),
        "attention_bytes": sum(t.numel() * t.element_size() for t in attention),
    }


WORKLOADS_FILE = Path(__file__).with_name("data") / "workloads.json"


def large_workload(name: str) -> Workload:
    """A large model's counted workload from ``data/workloads.json`` (its ``counted`` field says how)."""
    shipped = json.loads(WORKLOADS_FILE.read_text())["workloads"]
    if name not in shipped:
        raise ValueError(f"no workload {name!r} in {WORKLOADS_FILE.name}: it has {', '.join(shipped)}")
    fields = dict(shipped[name]["workload"])
    fields["grad_bytes"] = tuple(fields.get("grad_bytes", ()))
    return Workload(**fields)


@dataclass(frozen=True)
class Part:
    """One bar of the dependency timeline: ``name`` on ``lane`` from ``start`` for ``seconds``."""

    name: str
    lane: str
    start: float
    seconds: float

    @property
    def end(self) -> float:
        return self.start + self.seconds


@dataclass(frozen=True)
class Prediction:
    """The modelled step: its parts, and its total (the end of the last part)."""

    strategy: str
    gpu: GPU
    n: int
    parts: tuple[Part, ...]
    total_s: float
    latency: bool = False  # whether the messages' latencies are in (``predict(..., latency=True)``)

    def seconds(self, name: str) -> float:
        """The summed seconds of every part called ``name`` (e.g. ``"all-reduce"``)."""
        return sum(p.seconds for p in self.parts if p.name == name)


def _gpu(gpu: GPU | str) -> GPU:
    if isinstance(gpu, GPU):
        return gpu
    if gpu not in GPUS:
        raise ValueError(f"no GPU profile {gpu!r}: the profiles are {', '.join(GPUS)}")
    return GPUS[gpu]


def _buckets(work: Workload, bucket_bytes: int, first_bucket_bytes: int | None = None) -> list[int]:
    """Gradient bytes per bucket, in the order backward fills them, as DDP's Reducer assigns them.

    Tensors go in backward order; a bucket closes on the tensor that takes it to its cap (so it can
    hold more than the cap); the first bucket's cap is ``first_bucket_bytes``. Without per-tensor
    sizes the bytes are cut into equal buckets of the cap.
    """
    sizes = list(work.grad_bytes) or [bucket_bytes] * (work.param_bytes // bucket_bytes) + (
        [work.param_bytes % bucket_bytes] if work.param_bytes % bucket_bytes else []
    )
    return fill_buckets(
        sizes, bucket_bytes, bucket_bytes if first_bucket_bytes is None else first_bucket_bytes
    )


def fill_buckets(sizes, bucket_bytes: int, first_bucket_bytes: int) -> list[int]:
    """Bytes per bucket for gradient ``sizes`` in backward order: a bucket closes on the tensor that takes
    it to its cap (``first_bucket_bytes`` for the first, ``bucket_bytes`` after), as the Reducer's
    ``_compute_bucket_assignment_by_size`` assigns whole tensors."""
    buckets, filled, cap = [], 0, first_bucket_bytes
    for nbytes in sizes:
        filled += nbytes
        if filled >= cap:
            buckets.append(filled)
            filled, cap = 0, bucket_bytes
    return buckets + ([filled] if filled else [])


def _link(nbytes: float, bw: float) -> float:
    return 0.0 if nbytes == 0 else nbytes / bw


def packed_bytes(work: Workload, buffer_size: int = COMM_BUCKET_BYTES) -> int:
    """The gradient bytes ``reduce_add_coalesced`` copies when it flattens one replica's chunks.

    Chunks as ``torch._utils._take_tensors`` cuts them, in parameter order: a chunk closes before the
    tensor that would take it past ``buffer_size``. A chunk of one tensor is flattened into a view and
    copies nothing. Without per-tensor sizes (``grad_bytes``) every byte is counted.
    """
    if not work.grad_bytes:
        return work.param_bytes
    return sum(sum(chunk) for chunk in _chunks(work, buffer_size) if len(chunk) > 1)


def _chunks(work: Workload, buffer_size: int = COMM_BUCKET_BYTES) -> list[list[int]]:
    """The parameters' bytes cut as ``torch._utils._take_tensors`` cuts them, in parameter order: a chunk
    closes before the tensor that would take it past ``buffer_size``. Without per-tensor sizes, equal
    chunks of ``buffer_size``."""
    if not work.grad_bytes:
        return [[buffer_size]] * (work.param_bytes // buffer_size) + (
            [[work.param_bytes % buffer_size]] if work.param_bytes % buffer_size else []
        )
    chunks, chunk = [], []
    for nbytes in reversed(work.grad_bytes):  # parameter order: grad_bytes is backward's
        if chunk and sum(chunk) + nbytes > buffer_size:
            chunks.append(chunk)
            chunk = []
        chunk.append(nbytes)
    return chunks + ([chunk] if chunk else [])


def messages(work: Workload, n: int) -> dict[str, int]:
    """How many messages each DataParallel copy of one step on ``n`` GPUs sends: one per other GPU for
    the scatter, the gather and the gather's backward; one per 10 MiB chunk for replicate and reduce."""
    chunks = len(_chunks(work)) if work.param_bytes else 0
    return {"scatter": n - 1, "replicate": chunks, "gather": n - 1, "scatter grad": n - 1, "reduce": chunks}


def _plain(work: Workload, rate: float) -> list[Part]:
    fwd, bwd = work.flops_fwd / rate, work.flops_bwd / rate
    return [Part("forward", "GPU 0", 0.0, fwd), Part("backward", "GPU 0", fwd, bwd)]


def _data_parallel(
    work: Workload, gpu: GPU, n: int, rate: float, thread_s: float, latency: bool = False
) -> list[Part]:
    bw = gpu.link_bw
    share = (n - 1) / n
    count = messages(work, n)
    # each message: NCCL's base latency and one ring step (data/gpus.json), when latency is on
    lat = {k: v * (gpu.base_latency_s + gpu.step_latency_s) if latency else 0.0 for k, v in count.items()}
    parts = [Part("scatter", "link", 0.0, _link(work.input_bytes * share, bw) + lat["scatter"])]
    parts.append(Part("replicate", "link", parts[-1].end, _link(work.param_bytes, bw) + lat["replicate"]))
    t = parts[-1].end
    ends = []
    for k in range(n):  # one Python thread per replica, started one after another
        parts.append(Part(f"start thread {k}", "python", t, thread_s))
        t = parts[-1].end
        parts.append(Part("forward", f"GPU {k}", t, work.flops_fwd / n / rate))
        ends.append(parts[-1].end)
    # torch::cuda::gather (torch/csrc/cuda/comm.cpp) allocates the result on GPU 0 and copies every
    # replica's output into it, GPU 0's own too: the others' over the link, then its own, a read and
    # a write at mem_bw
    own = _link(2 * work.output_bytes / n, gpu.mem_bw)
    parts.append(
        Part("gather", "link", max(ends), _link(work.output_bytes * share, bw) + own + lat["gather"])
    )
    # backward of the gather: the gradient of the output goes back to each GPU, for the tensors that
    # get one (a model that returns its loss and its logits: the loss alone)
    grad_out = _link(work.output_grad_bytes * share, bw) + lat["scatter grad"]
    parts.append(Part("scatter grad", "link", parts[-1].end, grad_out))
    start = parts[-1].end
    for k in range(n):  # one autograd thread per GPU: the backwards run side by side
        parts.append(Part("backward", f"GPU {k}", start, work.flops_bwd / n / rate))
    start = parts[-1].end
    flat = packed_bytes(work)  # reduce_add_coalesced flattens each replica's chunks of several tensors
    for k in range(n):
        parts.append(Part("flatten", f"GPU {k}", start, _link(2 * flat, gpu.mem_bw)))
    # reduce_add: nccl.reduce sums inside its kernel as the bytes arrive on GPU 0
    parts.append(Part("reduce", "link", parts[-1].end, _link(work.param_bytes, bw) + lat["reduce"]))
    return parts


def _ddp(
    work: Workload,
    gpu: GPU,
    n: int,
    bucket_bytes: int,
    first_bucket_bytes: int,
    rate: float,
    latency: bool = False,
) -> list[Part]:
    fwd, bwd = work.flops_fwd / n / rate, work.flops_bwd / n / rate
    parts = []
    for k in range(n):
        parts += [Part("forward", f"GPU {k}", 0.0, fwd), Part("backward", f"GPU {k}", fwd, bwd)]
    link_free, filled = 0.0, 0
    for nbytes in _buckets(work, bucket_bytes, first_bucket_bytes):
        filled += nbytes
        ready = fwd + bwd * filled / work.param_bytes
        seconds = ring_seconds(nbytes, n, gpu.link_bw)
        if latency:  # NCCL's ring: a base latency, and 2(n-1) steps of the link's
            seconds += gpu.base_latency_s + 2 * (n - 1) * gpu.step_latency_s
        parts.append(Part("all-reduce", "link", max(ready, link_free), seconds))
        link_free = parts[-1].end
    return parts


def predict(
    work: Workload,
    gpu: GPU | str,
    n: int,
    strategy: str = "DataParallel",
    bucket_bytes: int = 25 * 2**20,
    dtype: str = "fp32",
    first_bucket_bytes: int = 2**20,
    *,
    efficiency: float | None = None,
    thread_s: float | None = None,
    latency: bool = False,
) -> Prediction:
    """The modelled step of ``strategy`` ("DataParallel" or "DDP") on ``n`` GPUs of profile ``gpu``.

    DDP's buckets: ``first_bucket_bytes`` (1 MiB, DDP's default when ``bucket_cap_mb`` is unset) for
    the first, ``bucket_bytes`` for the rest; pass ``first_bucket_bytes=bucket_bytes`` for what DDP
    does with ``bucket_cap_mb`` given. ``efficiency`` and ``thread_s`` replace the assumed
    ``EFFICIENCY`` and ``PYTHON_THREAD_S`` for this prediction. ``latency=True`` adds each message's latency, by NCCL's model (module docstring).
    """
    profile = _gpu(gpu)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    if n < 1:
        raise ValueError(f"n must be 1 or more, not {n}")
    rate = profile.rate(dtype, efficiency)
    if n == 1:
        parts = _plain(work, rate)
    elif strategy == "DataParallel":
        thread = PYTHON_THREAD_S if thread_s is None else thread_s
        parts = _data_parallel(work, profile, n, rate, thread, latency)
    else:
        parts = _ddp(work, profile, n, bucket_bytes, first_bucket_bytes, rate, latency)
    parts = tuple(p for p in parts if p.seconds > 0 or p.lane != "link")
    return Prediction(strategy, profile, n, parts, max(p.end for p in parts), latency)


def _profile_names(names) -> tuple[str, ...]:
    """GPU profile names as a tuple; one name alone (``"A100-SXM"``) is one profile, not its letters."""
    return (names,) if isinstance(names, str) else tuple(names)


def profiles(names: tuple[str, ...] = ("T4", "A100-SXM", "H200-SXM")) -> str:
    """The GPU profiles the model reads, one line each: peaks from spec sheets (``data/gpus.json``, each
    number with the page it was read from). The link column is an input of the model, not a measurement:
    the spec sheet's one-direction peak, which the model gives every copy and every ring step."""
    names = _profile_names(names)
    lines = [
        f"{'GPU':<10}{'fp32 peak':>15}{'memory':>13}  {'link (modelled: spec-sheet peak, one way)'}",
    ]
    for name in names:
        gpu = GPUS[name]
        lines.append(
            f"{name:<10}{gpu.flops['fp32'] / 1e12:>8.1f} TFLOP/s{gpu.mem_bw / 1e9:>7.0f} GB/s"
            f"  {gpu.link_bw / 1e9:>4.0f} GB/s, {gpu.link}"
        )
    return "\n".join(lines)


def label(pred: Prediction) -> str:
    return f"modelled, {pred.gpu.name} ({pred.gpu.link})"


def left_out(pred: Prediction) -> str:
    """What a figure of ``pred`` says the model leaves out."""
    return LEFT_OUT_WITH_LATENCY if pred.latency else LEFT_OUT


def table(
    work: Workload,
    gpus: tuple[str, ...] = ("T4", "A100-SXM", "H200-SXM"),
    ns=(1, 2, 4, 8),
    *,
    thread_s: float | None = None,
    latency: bool = False,
) -> str:
    """Modelled ms per step for each GPU profile, strategy and n, with the speed-up over n = 1.

    ``thread_s``: a thread start measured by the reader, which the header then names as theirs; ``latency``: each message's latency, by NCCL's model.
    """
    thread = (
        f"thread start {thread_s * 1e6:.0f} µs, given"
        if thread_s is not None
        else f"thread start {PYTHON_THREAD_S * 1e6:.0f} µs, assumed"
    )
    gpus = _profile_names(gpus)
    extra = ", NCCL's latency per message" if latency else ""
    lines = [
        f"modelled ms per step (EFFICIENCY = {EFFICIENCY:.0%} of peak, {thread}, links at their "
        f"spec-sheet peak{extra})",
        "in brackets: the speed-up, that GPU's plain step (n=1) over this step",
        "",
    ]
    lines.append(f"{'GPU':<10}{'strategy':<14}" + "".join(f"{'n=' + str(n):>17}" for n in ns))
    for name in gpus:
        plain = predict(work, name, 1).total_s
        for strategy in STRATEGIES:
            cells = []
            for n in ns:
                t = predict(work, name, n, strategy, thread_s=thread_s, latency=latency).total_s
                up = plain / t  # two decimals below 0.1x, so a small speed-up does not print as 0.0x
                cells.append(f"{t * 1e3:9.3f} ({up:.2f}x)" if up < 0.095 else f"{t * 1e3:9.3f} ({up:3.1f}x)")
            lines.append(f"{name:<10}{strategy:<14}" + "".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


# Each part of a modelled step, once: its colour in the timelines (one per part, so every legend entry
# names one kind of bar) and, for DataParallel's parts beyond the compute, what gap() says it moves and
# where, in step order ("python" stands for the thread starts, "start thread k" on the host's lane)
PARTS = {
    "forward": ("#1f77b4", ""),
    "backward": ("#2ca02c", ""),
    "scatter": ("#ff7f0e", "scatter: the batch out of GPU 0"),
    "replicate": ("#d62728", "replicate: the model out of GPU 0"),
    "python": ("#bbbbbb", "Python thread starts"),
    "gather": ("#8c564b", "gather: the outputs onto GPU 0"),
    "scatter grad": ("#e377c2", "scatter grad: out of GPU 0"),
    "flatten": ("#bcbd22", "flatten: on each GPU, side by side"),
    "reduce": ("#17becf", "reduce: the gradients onto GPU 0"),
    "all-reduce": ("#9467bd", ""),
}
GAP_ROWS = {name: words for name, (_, words) in PARTS.items() if words}


def part_colour(name: str) -> str:
    """The colour of a part named ``name`` in every timeline of the model (grey for a thread start)."""
    return PARTS.get(name, PARTS["python"])[0]


# What a timeline's shared row carries, in words: DataParallel's copies and sums all go through GPU 0,
# DDP's all-reduces run among every GPU, each rank sending to the next
LANE_LABELS = {
    ("DataParallel", "link"): "to and from GPU 0\n(over the links)",
    ("DDP", "link"): "among all GPUs\n(over the links)",
    ("DataParallel", "python"): "host (Python)",
}


def _lanes(pred: Prediction) -> list[str]:
    gpus = sorted({p.lane for p in pred.parts if p.lane.startswith("GPU")}, key=lambda s: int(s.split()[1]))
    return gpus + [lane for lane in ("link", "python") if any(p.lane == lane for p in pred.parts)]


THIN = 0.005  # a bar under this share of the step is narrower than a pixel in a 9-inch figure
# DataParallel's moves that copy between GPUs with plain copies (``torch::cuda::scatter`` and ``gather``
# in torch/csrc/cuda/comm.cpp), not NCCL calls as replicate's broadcast and the gradients' reduce are
PEER_COPIES = ("scatter", "gather", "scatter grad")


def _widest(pred: Prediction, name: str) -> float:
    return max(p.seconds for p in pred.parts if p.name == name)


def draw_timeline(pred: Prediction, ax=None, span_s: float | None = None):
    """The dependency timeline of ``pred``: one row per lane, bar widths from the model, not the clock.

    ``span_s``: the seconds the time axis spans (default: ``pred``'s step), so that timelines drawn one
    above the other share one scale; what is "too thin to see" is judged against it."""
    import matplotlib.pyplot as plt

    span = pred.total_s if span_s is None else span_s
    # thread starts charged nothing (``predict(..., thread_s=0.0)``) leave no row: the x-label says so
    uncharged = (
        pred.n > 1
        and pred.strategy == "DataParallel"
        and not any(p.seconds for p in pred.parts if p.lane == "python")
    )
    if uncharged:
        pred = dataclasses.replace(pred, parts=tuple(p for p in pred.parts if p.lane != "python"))
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.45 * len(_lanes(pred)) + 1.2))
    lanes = _lanes(pred)
    scale = 1e3
    buckets = [p for p in pred.parts if p.name == "all-reduce"]
    # where the last bucket label above and below the link's row starts: labels closer than 10% of the
    # axis would overlap, so a label close to the last one above goes below, and one close to both is left out
    above = below = None
    # DataParallel's scatter, gather and the gather's backward are plain copies between GPUs, not NCCL
    # calls: charging them NCCL's latency is an assumption, so their bars are hatched and the legend says so
    assumed = pred.latency and pred.strategy == "DataParallel" and pred.n > 1
    for part in pred.parts:
        colour = part_colour(part.name)
        y = lanes.index(part.lane)
        hatch = "///" if assumed and part.name in PEER_COPIES else None
        ax.barh(y, part.seconds * scale, left=part.start * scale, color=colour, edgecolor="white", height=0.7,
                hatch=hatch)  # fmt: skip
        if part in buckets:  # DDP's all-reduces, one per bucket, numbered in the order backward fills them
            text = f"bucket {buckets.index(part) + 1}"
            if above is None or part.start - above >= 0.1 * span:
                ax.text(part.start * scale, y - 0.42, text, fontsize=7, va="bottom")
                above = part.start
            elif below is None or part.start - below >= 0.1 * span:
                ax.text(part.start * scale, y + 0.42, text, fontsize=7, va="top")
                below = part.start
    ax.set_yticks(range(len(lanes)), [LANE_LABELS.get((pred.strategy, lane), lane) for lane in lanes])
    if below is not None:  # room for a label under the last row
        ax.set_ylim(len(lanes) - 0.1, -0.5)
    else:
        ax.invert_yaxis()
    ax.set_xlabel(
        f"ms (modelled; {left_out(pred)}{'; thread starts not charged' if uncharged else ''})", fontsize=8
    )
    ax.set_xlim(0, span * scale * 1.02)
    names = list(dict.fromkeys(p.name for p in pred.parts if not p.name.startswith("start thread")))
    handles = [plt.Rectangle((0, 0), 1, 1, color=part_colour(n)) for n in names]
    # a kind of bar under 0.5% of the step is narrower than a pixel here: the legend says so
    names = [f"{n} (too thin to see)" if _widest(pred, n) < THIN * span else n for n in names]
    if any(p.lane == "python" for p in pred.parts):
        starts = [p.seconds for p in pred.parts if p.name.startswith("start thread")]
        thin = starts and max(starts) < THIN * span
        # the python row is an assumption, not a clock: the legend says how much of the step it makes
        source = "assumed" if max(starts) == PYTHON_THREAD_S else "given"
        share = f"{sum(starts) / pred.total_s:.0%} of the step, {max(starts) * 1e6:.0f} µs each, {source}"
        names = names + [f"thread start (too thin to see; {share})" if thin else f"thread start ({share})"]
        handles = handles + [plt.Rectangle((0, 0), 1, 1, color="#bbbbbb")]
    if assumed and any(p.name in PEER_COPIES for p in pred.parts):
        names = names + ["hatched: a plain copy, charged\nNCCL's latency (assumed)"]
        handles = handles + [plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="#555555", hatch="///")]
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    # the strategy's colour on the frame and the title, as in the chapter's other figures
    strategy = STRATEGY_COLOURS[pred.strategy] if pred.n > 1 else STRATEGY_COLOURS["plain"]
    for spine in ax.spines.values():
        spine.set_edgecolor(strategy)
        spine.set_linewidth(1.5)
    ax.set_title(
        f"{pred.strategy} on {pred.n} GPUs: {pred.total_s * 1e3:.2f} ms, {label(pred)}",
        fontsize=9,
        color=strategy,
    )
    return ax


def draw_over_n(
    work: Workload,
    gpus: tuple[str, ...] = ("T4", "A100-SXM", "H200-SXM"),
    ns=(1, 2, 4, 8),
    title: str = "",
    *,
    latency: bool = False,
    thread_s: float | None = None,
):
    """Modelled speed-up over the plain step against n, DataParallel and DDP, one panel per GPU profile;
    ``title`` (the workload, say) above the panels; ``latency``: each message's latency, by NCCL's model;
    ``thread_s``: DataParallel's thread start, as ``predict`` takes it (``0.0``: not charged)."""
    import matplotlib.pyplot as plt

    gpus = _profile_names(gpus)
    fig, axes = plt.subplots(1, len(gpus), figsize=(3.4 * len(gpus), 3.0), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, name in zip(axes, gpus):
        plain = predict(work, name, 1).total_s
        for strategy, style in zip(STRATEGIES, ("s-", "o-")):
            steps = [predict(work, name, n, strategy, latency=latency, thread_s=thread_s).total_s for n in ns]
            ax.plot(ns, [plain / t for t in steps], style, color=STRATEGY_COLOURS[strategy], label=strategy)
            ax.annotate(f"{plain / steps[-1]:.2f}", (ns[-1], plain / steps[-1]), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7,
                        color=STRATEGY_COLOURS[strategy])  # fmt: skip
        # no "n times faster" line: at n = 8 it would stretch the axis to 8 and flatten both curves
        ax.axhline(1, color="#bbbbbb", lw=1, ls="--", label="one GPU: below it, slower")
        ax.set_title(f"modelled, {name} ({GPUS[name].link})", fontsize=9)
        ax.set_xlabel("GPUs (n)", fontsize=8)
        ax.set_xticks(list(ns))
    axes[0].set_ylabel("one GPU's step / n GPUs' step\n(above 1: quicker than one GPU)", fontsize=8)
    axes[0].set_ylim(0, 1.2 * max(max(line.get_ydata()) for ax in axes for line in ax.get_lines()))
    axes[0].set_xlim(0.5, ns[-1] + 1.2)  # room for the values written at the widest n
    axes[0].legend(fontsize=8, loc="upper left")  # the curves climb to the right
    # what the model leaves out, once for the figure: per panel the captions would overlap
    starts = "; thread starts not charged" if thread_s == 0 else ""
    fig.text(
        0.5,
        0.01,
        f"modelled; {LEFT_OUT_WITH_LATENCY if latency else LEFT_OUT}, no Python overhead{starts}: "
        "read the shape, not the heights",
        ha="center",
        fontsize=7,
    )
    if title:
        how = "compute, bandwidth and NCCL's latency estimates" if latency else "compute and bandwidth"
        fig.suptitle(f"{title} (modelled from {how} only)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def breakdown(
    work: Workload,
    gpus: tuple[str, ...] = ("A100-SXM", "H200-SXM"),
    n: int = 4,
    *,
    latency: bool = False,
) -> str:
    """Why DDP's modelled step speeds up on one profile and not another, in µs, then in words.

    Per profile: one GPU's plain step; then DDP on ``n`` GPUs, as a sum: each GPU's share of the
    compute (forward and backward), plus the time the all-reduces keep the step going after that
    compute ends (the rest of them runs beside backward), equals the step. Splitting the compute saves
    the plain step minus that share; DDP's step is quicker than one GPU's exactly when that saving is
    more than the all-reduces' time after backward. ``latency``: NCCL's latency per message in."""
    names = _profile_names(gpus)
    width = max(len(name) for name in names) + 2
    lines = [
        f"modelled µs per step, {'with' if latency else 'without'} NCCL's latency per message: one GPU's; "
        f"DDP's on {n} GPUs = each GPU's compute + the all-reduce time after it",
        f"  {'':<{width}}{'one GPU':>7}{'DDP: compute':>16}{'all-reduce':>13}{'step':>8}{'speed-up':>11}",
    ]
    words = []
    for name in names:
        plain = predict(work, name, 1).total_s
        ddp = predict(work, name, n, "DDP", latency=latency)
        compute = ddp.seconds("forward") / n + ddp.seconds("backward") / n  # one GPU's share
        after = ddp.total_s - compute  # what the all-reduces add once that compute is done
        saved = plain - compute
        lines.append(
            f"  {name:<{width}}{plain * 1e6:7.0f}{compute * 1e6:16.0f} +{after * 1e6:11.0f} ="
            f"{ddp.total_s * 1e6:6.0f}{plain / ddp.total_s:10.2f}x"
        )
        if round(saved * 1e6) == round(after * 1e6):
            than, verdict = "as much as", "as quick as one GPU"
        else:
            than, verdict = ("more than", "quicker") if saved > after else ("less than", "slower")
            verdict += " than one GPU"
        words.append(
            f"  {name}: splitting the compute saves {saved * 1e6:.0f} µs, {than} the {after * 1e6:.0f} µs "
            f"the all-reduces add: {verdict}"
        )
    return "\n".join(lines + words)


def against_one(work: Workload, gpu: GPU | str = "A100-SXM", n: int = 4, **options) -> str:
    """What each wrapper gains over the plain step on one GPU, modelled: one GPU's step, then
    DataParallel's and DDP's on ``n`` GPUs of profile ``gpu``, each with its speed-up (one GPU's step
    over its own). ``options`` go to :func:`predict` for all three (``latency=True``, ``thread_s=0.0``)."""
    plain = predict(work, gpu, 1, **options)
    lines = [f"one step, {label(plain)}:", f"  {'one GPU':<22}{plain.total_s * 1e6:8.0f} µs"]
    for strategy in STRATEGIES:
        step = predict(work, gpu, n, strategy, **options)
        lines.append(
            f"  {f'{strategy} on {n} GPUs':<22}{step.total_s * 1e6:8.0f} µs  "
            f"{plain.total_s / step.total_s:.2f}x one GPU's speed"
        )
    return "\n".join(lines)


def _compute(pred: Prediction) -> float:
    """One GPU's forward and backward in ``pred``: the compute every GPU does, side by side."""
    return sum(p.seconds for p in pred.parts if p.lane == "GPU 0" and p.name in ("forward", "backward"))


def gap(dp: Prediction, ddp: Prediction) -> str:
    """Where DataParallel's modelled step spends the time DDP's does not, part by part.

    Each step is its compute (one GPU's forward and backward: both wrappers give each GPU the same
    rows) plus what keeps it going beyond that. For DataParallel that is every part of the step's path
    outside the compute, in step order (:data:`GAP_ROWS`): the copies to and from GPU 0, the thread
    starts (one after another), the flatten (side by side on every GPU, so counted once). For DDP it
    is the time its all-reduces add after backward. The two differences make the steps' gap."""
    if (dp.strategy, ddp.strategy) != STRATEGIES or (dp.gpu.name, dp.n) != (ddp.gpu.name, ddp.n):
        raise ValueError("gap takes DataParallel's prediction, then DDP's, on the same GPUs")
    ms = dp.total_s >= 1e-3  # the unit that keeps the rows readable: ms for a real model, µs for a toy
    scale, unit = (1e3, "ms") if ms else (1e6, "µs")
    seconds: dict[str, float] = {}
    for p in dp.parts:
        key = "python" if p.lane == "python" else p.name
        if key in GAP_ROWS and p.lane in ("link", "python", "GPU 0"):  # GPU 0's flatten: one of n alike
            seconds[key] = seconds.get(key, 0.0) + p.seconds
    starts = [p.seconds for p in dp.parts if p.lane == "python"]
    rows = dict(GAP_ROWS)
    if starts:
        each = (
            f"{len(starts)}, assumed {max(starts) * scale:g} {unit} each" if max(starts) else "assumed free"
        )
        rows["python"] += f" ({each})"
    beyond_dp, beyond_ddp = dp.total_s - _compute(dp), ddp.total_s - _compute(ddp)
    width = max(len(row) for row in rows.values()) + 2
    fmt = ".1f" if ms else ".0f"
    lines = [
        f"DataParallel's step over DDP's, {label(dp)}, {dp.n} GPUs:",
        f"  {'compute, each GPU (both wrappers)':<{width}}{_compute(dp) * scale:8{fmt}} {unit}",
        "  DataParallel, beyond that:",
    ]
    lines += [
        f"    {rows[k]:<{width - 2}}{seconds[k] * scale:8{fmt}} {unit}" for k in GAP_ROWS if k in seconds
    ]
    lines += [
        f"  {'  in all':<{width}}{beyond_dp * scale:8{fmt}} {unit}",
        f"  {'DDP, its all-reduces after backward':<{width}}{beyond_ddp * scale:8{fmt}} {unit}",
        f"  {'DataParallel over DDP':<{width}}{(dp.total_s - ddp.total_s) * scale:8{fmt}} {unit}",
    ]
    return "\n".join(lines)


def ring_seconds(nbytes: float, n: int, link_bw: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` GPUs: each sends and receives 2(n-1)/n of it."""
    return 0.0 if n < 2 else 2 * (n - 1) / n * nbytes / link_bw


def buckets(work: Workload, bucket_bytes: int = 25 * 2**20, first_bucket_bytes: int = 2**20) -> list[int]:
    """The bytes of each bucket DDP's all-reduce of ``work``'s gradients takes, in this model."""
    return _buckets(work, bucket_bytes, first_bucket_bytes)


def clone_over_to(gpu: GPU | str) -> float:
    """The time of a tensor's ``clone()`` on a GPU over that of its ``.to`` onto another GPU, modelled.

    The clone reads the tensor's bytes and writes them again in the GPU's own memory, at ``mem_bw``;
    the ``.to`` sends them once over the link, at ``link_bw``. So the ratio is ``2 * link_bw / mem_bw``,
    whatever the tensor's size (latency left out): the share of its time the pre-#20995
    ``clone()``-then-``.to`` added to each replica's copy."""
    g = _gpu(gpu)
    return 2 * g.link_bw / g.mem_bw
