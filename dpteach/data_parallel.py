"""``DataParallel`` and ``data_parallel``: drop-ins for PyTorch's, on any device list, with a strategy.

One step is four moves (``torch/nn/parallel/data_parallel.py``):
scatter the batch over the slots, replicate the module, run the replicas in parallel threads,
gather the outputs on ``output_device``. Backward runs the same graph in reverse; how the
replicas' gradients reach ``module`` is what the replication strategy decides.

The four moves are written once, in :func:`four_moves`: ``DataParallel.forward``,
``data_parallel``, the course's story helpers, the profiler and the graph comparison all call it.
``with keep_replicas(dp) as replicas:`` keeps the replicas of the last step inside the block
(nested blocks each get them; another thread's steps are not seen).
"""

from __future__ import annotations

import contextlib
import dataclasses
from contextvars import ContextVar
from itertools import chain
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import nn

from ._devices import DeviceLike, as_devices, as_output_device, default_devices
from .parallel_apply import cores_shared, parallel_apply
from .replicate import Strategy, replicate, resolve_strategy
from .replicate._modules import check_not_compiled, check_on_first_slot
from .scatter_gather import gather, scatter_kwargs

__all__ = [
    "DataParallel",
    "data_parallel",
    "four_moves",
    "keep_replicas",
    "Moves",
    "Step",
    "step",
    "mean_square",
]

# Each keep_replicas block pushes (owner or None, list) here; four_moves fills every matching list.
# A ContextVar, so nested blocks stack and a block in one thread never sees another thread's steps.
_KEEPERS: ContextVar[tuple[tuple[Any, list], ...]] = ContextVar("dpteach_keep_replicas", default=())


@contextlib.contextmanager
def keep_replicas(of: Any = None) -> Iterator[list[nn.Module]]:
    """Keep the replicas the DataParallel steps inside the block make: ``with keep_replicas(dp) as replicas:``.

    The list holds the last step's replicas (empty while no step has replicated: one slot runs
    the module itself). ``of`` limits it to one ``DataParallel`` (or the module it wraps);
    ``None`` keeps every step's. Blocks nest, and each one gets the replicas.
    """
    kept: list[nn.Module] = []
    token = _KEEPERS.set(_KEEPERS.get() + ((of, kept),))
    try:
        yield kept
    finally:
        _KEEPERS.reset(token)


def _keep(owners: tuple[Any, ...], replicas: list[nn.Module]) -> None:
    for of, kept in _KEEPERS.get():
        if of is None or any(of is o for o in owners):
            kept[:] = replicas


def _no_phase(name: str) -> ContextManager[None]:
    return contextlib.nullcontext()


def four_moves(
    dp: Any,
    inputs: tuple,
    kwargs: dict | None,
    *,
    run_one_slot: bool = True,
    phase: Callable[[str], ContextManager[None]] = _no_phase,
) -> Any:
    """One forward of data parallelism, written once: scatter, replicate, parallel_apply, gather.

    ``dp`` is any object with ``module``, ``device_ids``, ``output_device`` and the four methods
    (a :class:`DataParallel`, or a subclass that overrides one of them, as torch allows). With one slot the module itself runs (``run_one_slot=True``, as
    ``torch.nn.DataParallel``); ``False`` replicates anyway, for a look at the one replica.
    ``phase(name)`` wraps each move (the profiler times them with it).
    """
    with phase("scatter"):
        inputs, kwargs = dp.scatter(inputs, kwargs, dp.device_ids)
    if not inputs and not kwargs:  # a forward with no inputs runs once, on slot 0, as in torch
        inputs, kwargs = ((),), ({},)
    if run_one_slot and len(dp.device_ids) == 1:
        return dp.module(*inputs[0], **kwargs[0])
    with phase("replicate"):
        replicas = dp.replicate(dp.module, dp.device_ids[: len(inputs)])
    _keep((dp, dp.module), replicas)
    with phase("parallel_apply"):
        outputs = dp.parallel_apply(replicas, inputs, kwargs)
    with phase("gather"):
        return dp.gather(outputs, dp.output_device)


def mean_square(out: torch.Tensor) -> torch.Tensor:
    """The loss every helper uses unless told otherwise: the mean of the squared output, a scalar."""
    return out.float().pow(2).mean()


@dataclasses.dataclass
class Step:
    """What one DataParallel step left behind: its output, its loss and the replicas it ran."""

    out: Any
    loss: torch.Tensor | None
    replicas: list[nn.Module]


def step(
    module: nn.Module,
    inputs: Any,
    devices: Sequence[DeviceLike],
    *,
    strategy: Strategy = "broadcast",
    loss_fn: Callable[[Any], torch.Tensor] | None = mean_square,
    backward: bool = True,
    replicate_one_slot: bool = True,
    phase: Callable[[str], ContextManager[None]] = _no_phase,
) -> Step:
    """One DataParallel step of ``module`` on ``inputs`` over ``devices``, its replicas kept.

    The four moves (:func:`four_moves`), then ``loss_fn(out)`` and, with ``backward=True``,
    ``loss.backward()`` (``loss_fn=None``: no loss, no backward). ``inputs`` is one tensor or a
    tuple of positional inputs. With ``replicate_one_slot=True`` a single slot is replicated
    too, so its one replica can be looked at (``DataParallel`` itself runs the module there).
    Several CPU slots run the backward, as the forward, with their share of the intra-op threads
    (:func:`~dpteach.parallel_apply.cores_shared`); a ``loss.backward()`` of your own runs with yours.
    Every wing that needs "a step, and what it did" calls this; ``phase`` is passed to the moves.
    """
    slots = as_devices(devices, "devices")
    if len(slots) == 1:  # DataParallel would move a one-slot module there: refuse instead, as replicate does
        check_on_first_slot(module, slots[0])
    dp = DataParallel(module, slots, strategy=strategy)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    with keep_replicas(dp) as replicas:
        out = four_moves(dp, inputs, {}, run_one_slot=not replicate_one_slot, phase=phase)
    loss = None if loss_fn is None else loss_fn(out)
    if loss is not None and backward:
        with phase("backward"), cores_shared(slots):  # CPU slots: backward with the forward's thread share
            loss.backward()
    return Step(out, loss, list(replicas))


def _tensors(obj: Any, path: str):
    """Every tensor in a nested input, with its path (``inputs[0]``, ``kwargs['mask']``)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from _tensors(item, f"{path}[{k!r}]")


def _check_not_empty(inputs: Any, kwargs: Any, dim: int, who: str) -> None:
    """An empty batch fails now, in words, rather than in backward ("Expected positive chunk size")."""
    if not torch.is_grad_enabled():
        return  # inference on an empty batch runs, as in torch: each slot gets an empty piece
    for path, t in chain(_tensors(inputs, "inputs"), _tensors(kwargs or {}, "kwargs")):
        if t.dim() > 0 and -t.dim() <= dim < t.dim() and t.size(dim) == 0:
            raise ValueError(
                f"{who} got an empty batch: {path} has size 0 along dim {dim}, so there is nothing to split over "
                "the slots, and backward would fail. Skip empty batches before calling the model (or run them "
                "under torch.no_grad(), where they pass through)"
            )


def _check_batch_dim(dim: Any) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int (the batch dimension), got {dim!r}")
    return dim


class DataParallel(nn.Module):
    """Implements data parallelism at the module level, on any list of slots.

    The same as ``torch.nn.DataParallel``, with two differences: ``device_ids`` may hold CPU
    devices and duplicates (``["cpu", "cpu"]``, ``["cuda:0", "cuda:0"]``), and ``strategy``
    chooses how replicas are made (``"broadcast"``, ``"rewire"``, ``"clone"`` or a callable).
    ``device_ids=None`` means :func:`dpteach.default_devices`.

    As in PyTorch, the module is replicated on every forward, so changes a replica makes to
    itself are lost. Under ``"broadcast"`` (torch's own ``replicate``) slot 0's tensors share
    storage with ``module`` when slot 0 is on its device, so in-place updates there are kept
    (BatchNorm's running statistics rely on this); ``"rewire"`` and ``"clone"`` copy slot 0 too.

    Also as in PyTorch, with one slot nothing is replicated: ``module`` itself runs, so every
    strategy learns there, ``"clone"`` included; its bug shows from two slots on. A
    ``torch.compile``'d module is refused (replicating the wrapper would empty the model it
    wraps): compile the DataParallel instead. Under grad mode an empty batch is refused.

    Its four methods (``scatter``, ``replicate``, ``parallel_apply``, ``gather``) are torch's; a
    subclass may override any of them, and :func:`four_moves` calls them.

    Random numbers: in torch each replica runs on a GPU of its own and draws from that GPU's
    generator. Slots that share a device (``["cpu", "cpu"]``, ``["cuda:0", "cuda:0"]``) share its
    one generator, so their forwards take turns, each with a generator state of its own (the
    first slot continues the caller's, the others are derived from it): a seeded run repeats bit
    for bit, and ``torch.utils.checkpoint`` replays each slot's own dropout masks. The cost is the
    overlap of those forwards: they run one after another on the calling thread, so on CPU no
    second team of intra-op threads starts, and each slot runs with its share of the caller's
    ``torch.get_num_threads()`` (at least one; the setting is back after the forward); on one
    GPU the slots already queue their kernels on one stream, so only one slot's Python
    overlapping another's is lost.
    Slots on distinct GPUs run at once, as in torch.

    The replicas live only during a step. To draw a step's graph, keep them with
    :func:`keep_replicas` (also ``dpteach.keep_replicas``)::

        dp = DataParallel(model, ["cpu", "cpu"], strategy="clone")
        with keep_replicas(dp) as replicas:
            loss = dp(x).pow(2).mean()
        dpteach.autograd_graph(loss, module=model, replicas=replicas)  # .dead_ends: the bug
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[DeviceLike] | None = None,
        output_device: DeviceLike | None = None,
        dim: int = 0,
        *,
        strategy: Strategy = "broadcast",
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"DataParallel wraps an nn.Module, got {type(module).__name__}; wrap it in an nn.Module whose "
                "forward calls it"
            )
        resolve_strategy(strategy)  # an unknown strategy fails now, not at the first forward
        self.strategy = strategy
        self.module = module
        self.device_ids = as_devices(default_devices() if device_ids is None else device_ids, "device_ids")
        self.output_device = self.device_ids[0] if output_device is None else as_output_device(output_device)
        self.dim = _check_batch_dim(dim)
        self.src_device_obj = self.device_ids[0]
        if len(self.device_ids) == 1:
            self.module.to(self.src_device_obj)
        else:  # refused now, before a forward copies it into the learner's model
            check_not_compiled(module, "DataParallel")

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if len(self.device_ids) > 1:
            _check_not_empty(inputs, kwargs, self.dim, "DataParallel")
        else:  # no replicate() to check the module: check it here (replicate() walks the tensors otherwise)
            check_on_first_slot(self.module, self.src_device_obj)
        return four_moves(self, inputs, kwargs)

    def replicate(self, module: nn.Module, device_ids: Sequence[torch.device]) -> list[nn.Module]:
        return replicate(module, list(device_ids), not torch.is_grad_enabled(), strategy=self.strategy)

    def scatter(self, inputs, kwargs, device_ids):
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas, inputs, kwargs):
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])

    def gather(self, outputs, output_device):
        return gather(outputs, output_device, dim=self.dim)

    def extra_repr(self) -> str:
        slots = ", ".join(str(d) for d in self.device_ids)
        return f"device_ids=[{slots}], output_device={self.output_device}, dim={self.dim}, strategy={self.strategy!r}"


# The four moves of a module without a wrapper of one's own, for callers of four_moves: a DataParallel.
Moves = DataParallel


def data_parallel(
    module: nn.Module,
    inputs: Any,
    device_ids: Sequence[DeviceLike] | None = None,
    output_device: DeviceLike | None = None,
    dim: int = 0,
    module_kwargs: dict[str, Any] | None = None,
    *,
    strategy: Strategy = "broadcast",
) -> Any:
    """Evaluate ``module(*inputs)`` in parallel over ``device_ids``: the functional form of DataParallel."""
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"data_parallel runs an nn.Module, got {type(module).__name__}; wrap it in an nn.Module whose "
            "forward calls it"
        )
    slots = as_devices(default_devices() if device_ids is None else device_ids, "device_ids")
    if len(slots) > 1:
        _check_not_empty(inputs, module_kwargs, dim, "data_parallel")
    else:  # before DataParallel, which would move the module: torch's data_parallel refuses instead
        check_on_first_slot(module, slots[0])
    dp = DataParallel(module, slots, output_device, dim, strategy=strategy)  # checks strategy, dim, compile
    return four_moves(dp, inputs, module_kwargs)
