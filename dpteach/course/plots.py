"""Small matplotlib helpers the chapters draw with, so a figure cell shows what it plots, not how.

* ``lines``: one line per series; series equal point for point are drawn once, under one label that
  names them all (chapter 05: ``"rewire"`` and ``"clone"`` both stay at 0).
* ``line_panels``: panels of such series side by side, one y axis, a series one colour in all of
  them (chapter 05's running means).
* ``side_by_side``: autograd graphs in one row, each with its legend (chapter 02's before and after).
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["lines", "line_panels", "side_by_side"]

ROW = '<div style="display:grid;grid-template-columns:repeat({n},minmax(0,1fr));gap:8px">{cells}</div>'


def lines(
    ax,
    series: Mapping[str, Sequence[float]],
    styles: Mapping[str, str],
    colours: Mapping[str, str] | None = None,
    **plot_kwargs,
) -> None:
    """Plot each series on ``ax`` with ``styles[name]`` as its line style (``"none"``: dots only).

    Series drawn as lines with equal values are drawn once, labelled ``"a, b (same line)"``, or ``"a, b
    (same line at 0)"`` when every value is 0, so that no line hides under another without the legend
    saying so. A dots-only series is always drawn: its dots lying on a line show the equality.
    ``colours`` maps a name to its colour (a merged line takes its first name's); else the axes' cycle.
    """
    groups: dict[tuple, list[str]] = {}
    for name, values in series.items():  # a dots-only series is never merged: dots on a line show it
        key = (tuple(values), styles[name] == "none" and name)
        groups.setdefault(key, []).append(name)
    for (values, _), names in groups.items():
        label = names[0]
        if len(names) > 1:
            label = ", ".join(names) + (" (same line at 0)" if not any(values) else " (same line)")
        style = styles[names[0]]
        marker = "o" if style == "none" else None
        colour = {"color": colours[names[0]]} if colours and names[0] in colours else {}
        ax.plot(list(values), ls=style, marker=marker, label=label, **colour, **plot_kwargs)


def line_panels(
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    styles: Mapping[str, str],
    *,
    xlabel: str,
    ylabel: str,
    hline: float | None = None,
    hline_label: str | None = None,
    figsize: tuple[float, float] = (10, 3.6),
    **plot_kwargs,
):
    """One panel per title in ``panels`` (title -> series), side by side on one y axis, each drawn by ``lines``.

    A name keeps its colour in every panel (colours go to names in the order they first appear);
    ``hline`` draws a thin grey reference line in each, named ``hline_label`` in the legends when given.
    Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=figsize, sharey=True, squeeze=False)
    names = dict.fromkeys(name for series in panels.values() for name in series)
    colours = {name: f"C{i}" for i, name in enumerate(names)}
    for ax, (title, series) in zip(axes[0], panels.items()):
        lines(ax, series, styles, colours, **plot_kwargs)
        if hline is not None:
            ax.axhline(hline, color="grey", lw=0.8, label=hline_label)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def side_by_side(*graphs):
    """The graphs in one row, each drawn with its legend, as IPython HTML.

    Without Graphviz, prints their text forms one under the other and returns None.
    """
    from IPython.display import HTML

    from ..graph import GraphvizMissing

    try:
        return HTML(ROW.format(n=len(graphs), cells="".join(graph.draw().html() for graph in graphs)))
    except GraphvizMissing:
        print(*graphs, sep="\n\n")
        return None
