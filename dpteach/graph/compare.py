"""One model, one input, several replication strategies: their graphs side by side.

``compare_strategies(model, x, devices)`` runs one step per strategy (``data_parallel.step``, which
keeps the replicas, so their parameters can be named) and shows the graphs next to each other.
"""

from __future__ import annotations

from html import escape
from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from ..replicate import STRATEGIES
from .autograd import AutogradGraph, autograd_graph
from .diff import GraphDiff, graph_diff
from .display import GraphvizMissing
from .dot import COMPACT_NODE
from .legend import legend_html

PER_ROW = 2  # pictures side by side: three drawn like chapter 03's single pictures are too wide for one row
MIN_LABEL_PX = 10  # side-by-side pictures never scale their node labels below this height (font size, px)


class StrategyComparison(Mapping[str, AutogradGraph]):
    """The graphs of one model and input under several strategies, by strategy name; shows them side by side."""

    def __init__(self, graphs: dict[str, AutogradGraph]) -> None:
        self.graphs = graphs

    def __getitem__(self, strategy: str) -> AutogradGraph:
        return self.graphs[strategy]

    def __iter__(self) -> Iterator[str]:
        return iter(self.graphs)

    def __len__(self) -> int:
        return len(self.graphs)

    def diff(self, before: str, after: str) -> GraphDiff:
        """``graph_diff`` of two of the strategies, e.g. ``.diff("clone", "rewire")``."""
        return graph_diff(self.graphs[before], self.graphs[after], title=f"{before!r} → {after!r}")

    @property
    def text(self) -> str:
        return "\n\n".join(f"=== strategy {name!r} ===\n{g.text}" for name, g in self.graphs.items())

    def html(self) -> str:
        """The graphs two to a row, drawn compact, with one legend under them; raises GraphvizMissing without Graphviz.

        One picture is about 670 px wide: three to a row of a 1,000 px notebook would shrink the labels
        to about 7 px; two keep them above ``MIN_LABEL_PX`` and put "clone" beside "rewire". Each column
        is as wide as its widest picture, so all share one scale; where even that would shrink labels
        below ``MIN_LABEL_PX``, the grid scrolls sideways.
        """
        drawings = {name: g.draw(legend=False, compact=True) for name, g in self.graphs.items()}
        widths = {name: d.width_px() for name, d in drawings.items()}
        cells = "".join(
            f'<figure style="margin:0;min-width:0;text-align:center">'
            f'<img style="width:100%;height:auto;display:block;max-width:{widths[name]}px;margin:0 auto" '
            f'alt="autograd graph, strategy {escape(name)}" src="{d.data_uri()}"></figure>'
            for name, d in drawings.items()
        )
        legend = legend_html(d.view for d in drawings.values())
        ops = {n.op for g in self.graphs.values() for n in g.nodes.values() if n.op}
        named = ", ".join(
            f"<code>{short}</code> is <code>{full}</code>"
            for short, full in (
                ("Addmm", "AddmmBackward0"),
                ("ReduceAdd", "ReduceAddBackward"),
                ("Broadcast", "BroadcastBackward"),
            )
            if full in ops or short == "Addmm"
        )
        note = (
            '<div style="font-size:12px;color:#555;margin:4px 0">Backward functions drop their '
            f"<code>Backward0</code> suffix here: {named}.</div>"
        )
        per_row = min(PER_ROW, len(widths))
        natural = list(widths.values())
        column_px = [max(natural[j::per_row]) for j in range(per_row)]
        columns = " ".join(f"minmax(0,{w}fr)" for w in column_px)
        gap = 6 * (per_row - 1)
        # the smallest grid width at which a label is still MIN_LABEL_PX tall: (font px at natural size) ->
        # the scale it may shrink to
        font_px = float(COMPACT_NODE["fontsize"]) * 4 / 3
        min_width = round(sum(column_px) * MIN_LABEL_PX / font_px) + gap
        return (
            f'<div style="overflow-x:auto"><div style="display:grid;grid-template-columns:{columns};'
            f'gap:6px;align-items:start;min-width:{min_width}px">{cells}</div></div>'
            f"{note}{legend}"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        try:
            return {"text/html": self.html(), "text/plain": repr(self)}
        except GraphvizMissing as err:  # the text forms one after another, and what to install
            return {"text/plain": f"{self.text}\n\n{err}"}

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{name}: {len(g.dead_ends)} dead ends, {len(g.unreached)} unreached"
            for name, g in self.graphs.items()
        )
        return f"<StrategyComparison {parts}>"


def compare_strategies(
    model: nn.Module,
    x: torch.Tensor,
    devices: Sequence | None = None,
    strategies: Sequence = tuple(STRATEGIES),
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StrategyComparison:
    """The graph of ``model`` on ``x`` under each strategy (default: all three), ready to be shown side by side."""
    from .._devices import default_devices
    from ..data_parallel import mean_square, step
    from ..replicate import strategy_name

    devices = default_devices() if devices is None else list(devices)
    graphs = {}
    for strategy in strategies:
        done = step(model, x, devices, strategy=strategy, loss_fn=loss_fn or mean_square, backward=False)
        name = strategy_name(strategy)
        graphs[name] = autograd_graph(
            done.loss, module=model, replicas=done.replicas, title=f"strategy={name!r}"
        )
    return StrategyComparison(graphs)
