"""The cost explorer: a thin ipywidgets view over ``cost.CostLab``.

Move the model width or the number of slots and the lab takes real steps under every strategy. The bars
are the bytes copied (counted by ``dpteach.comm.traffic()``, the same on every run); this run's median
time per step and its middle half stay folded under the table ("show this run's times"), never a bar
or a rank. Under them, the cost model's ranking of DataParallel and DDP in words, one labelled line
(``CostLab.modelled_line``); its figures, what it assumes and what it leaves out are on hover and in a
fold. A lab made with ``timed=False`` shows the counts alone. Only widgets and calls that ipywidgets 7.7 (Colab) and 8 share."""

from __future__ import annotations

import time
from html import escape

from ._ipywidgets import Still, guarded, require, still_view
from .cost import WIDTHS, CostLab, width_numel
from .pictures import cost_charts
from .tables import cost_table, fold

widgets = require()


@still_view
class CostExplorer(Still, widgets.VBox):
    """Model size and slots against bytes moved and time, per strategy."""

    def __init__(self, lab: CostLab | None = None, modelled: bool = True, **settings):
        self.lab = lab or CostLab(**settings)
        self.modelled = modelled  # False: counts and this machine's times only, no DataParallel-vs-DDP model
        self.error: Exception | None = None
        self.last_update_s = 0.0
        widths = sorted({*WIDTHS, self.lab.width})
        self.width = widgets.SelectionSlider(
            options=[(f"{w} ({width_numel(w):,} parameters)", w) for w in widths],
            value=self.lab.width,
            description="hidden width",
            continuous_update=False,
            style={"description_width": "initial"},
            layout=widgets.Layout(width="420px"),
        )
        self.slots = widgets.IntSlider(
            value=self.lab.slots, min=1, max=8, description="slots", continuous_update=False
        )
        self.again = widgets.Button(
            description="↻ measure again",
            tooltip="the times move with the machine's load" if self.lab.timed else "the counts repeat",
        )
        self.status = widgets.HTML()
        self.status.add_class("dpteach-cost-status")
        self.charts = widgets.HTML()
        self.table = widgets.HTML()
        self.assumed = widgets.HTML()  # the model's one line: its ranking and its assumed thread starts
        for w in (self.width, self.slots):
            w.observe(guarded(self, self._measure), names="value")
        self.again.on_click(guarded(self, self._measure))
        super().__init__(
            [
                widgets.HBox([self.width, self.slots, self.again]),
                self.status,
                self.charts,
                self.table,
                self.assumed,
            ]
        )
        self.add_class("dpteach-cost")
        self._measure(None)

    def _measure(self, _) -> None:
        start = time.perf_counter()
        self.lab.configure(width=self.width.value, slots=self.slots.value)
        self.lab.measure()
        lab = self.lab
        self.status.value = f"<b>{escape(lab.headline())}</b>"  # one line: the table under it has the figures
        self.charts.value = cost_charts(lab.costs, lab.model_bytes, lab.slots, lab.reference_s)
        self.table.value = cost_table(lab, modelled=False)  # the counted bytes: the ranking the page teaches
        # the cost model's ranking in words under the bytes; its figures on hover and in a fold
        figures = f"{lab.modelled_figures()}; {lab.assumption_line()}"
        self.assumed.value = (
            f'<small title="{escape(figures)}">{escape(lab.modelled_line())}</small>'
            + fold(
                "show the model's figures",
                f"<pre style='font-size:11px'>{escape(chr(10).join(lab.modelled_lines()))}</pre>",
            )
            if self.modelled
            else ""
        )
        self.last_update_s = time.perf_counter() - start
