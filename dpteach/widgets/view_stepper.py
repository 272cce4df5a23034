"""The gradient-flow stepper: a thin ipywidgets view over ``flow.GradientFlow``.

Pick a strategy and a number of slots, then walk the backward pass with ◀ / ▶ (or the slider):
the picture marks the node that runs and the gradients it hands on, the table gives their shapes
and norms. Only widgets and calls that ipywidgets 7.7 (Colab) and 8 share.
"""

from __future__ import annotations

import time

from ._ipywidgets import Still, guarded, require, still_view
from .flow import GradientFlow
from .pictures import graph_html
from .tables import handoff_table, lines
from .training import STRATEGIES

widgets = require()


@still_view
class GradientStepper(Still, widgets.VBox):
    """Walk one backward pass node by node over its drawn autograd graph."""

    def __init__(self, flow: GradientFlow | None = None, **settings):
        self.flow = flow or GradientFlow(**settings)
        self.error: Exception | None = None
        self.last_update_s = 0.0
        self._moving = (
            False  # True while the slider is reset for a new flow: its events are ours, not the learner's
        )
        self.strategy = widgets.Dropdown(
            options=list(STRATEGIES), value=self.flow.strategy, description="strategy"
        )
        self.slots = widgets.IntSlider(
            value=self.flow.slots, min=1, max=4, description="slots", continuous_update=False
        )
        self.prev_button = widgets.Button(description="◀ back", tooltip="the node that ran before")
        self.next_button = widgets.Button(
            description="next ▶", tooltip="the next node the backward pass runs"
        )
        self.position = widgets.IntSlider(
            value=0,
            min=0,
            max=len(self.flow) - 1,
            description="backward step",
            style={"description_width": "initial"},
            continuous_update=False,
        )
        self.status = widgets.HTML()
        self.status.add_class("dpteach-stepper-status")
        self.handoffs = widgets.HTML()
        self.graph = widgets.HTML()
        self.graph.add_class("dpteach-graph")
        self.strategy.observe(guarded(self, self._rebuild), names="value")
        self.slots.observe(guarded(self, self._rebuild), names="value")
        self.position.observe(guarded(self, lambda change: self._moving or self.refresh()), names="value")
        self.prev_button.on_click(guarded(self, lambda _: self.go(self.position.value - 1)))
        self.next_button.on_click(guarded(self, lambda _: self.go(self.position.value + 1)))
        super().__init__(
            [
                widgets.HBox([self.strategy, self.slots]),
                widgets.HBox([self.prev_button, self.next_button, self.position]),
                self.status,
                self.handoffs,
                self.graph,
            ]
        )
        self.add_class("dpteach-stepper")
        self.refresh()

    @property
    def still_when(self) -> str:
        """What the still shows: the step the slider is at when shown, step 0 in a fresh stepper, where the
        chapter asks its predictions (the answers are the learner's to step to, or in the fold below it)."""
        return f"at step {self.position.value}, as it was shown"

    def go(self, i: int) -> None:
        """Show step ``i`` (clamped to the steps there are)."""
        self.position.value = max(0, min(len(self.flow) - 1, i))  # the slider's observer redraws

    def _rebuild(self, change) -> None:
        self.flow = GradientFlow(self.strategy.value, self.slots.value, self.flow.seed)
        self._moving = True
        try:
            self.position.value = 0
            self.position.max = len(self.flow) - 1
        finally:
            self._moving = False
        self.refresh()

    def refresh(self) -> None:
        start = time.perf_counter()
        i, flow = self.position.value, self.flow
        step = flow.steps[i]
        last = i == len(flow) - 1
        tail = f"<br><b>The backward pass is over</b>: {flow.summary()}." if last else ""
        self.handoffs.value = handoff_table(step)
        try:
            svg = flow.svg(i)
        except Exception:  # noqa: BLE001 - no Graphviz: graph_html shows the text form and says what to install
            svg = None
        # fitted to the output's width: with two slots a learner steps with the buttons, never scrolling
        self.graph.value = graph_html(flow.graph, svg, alt=f"backward step {i}: {step.label}")
        self.prev_button.disabled = i == 0
        self.next_button.disabled = last
        # last, as in the explorer: once the status names step i, the table and the graph show it too
        self.status.value = lines(f"<b>step {i} of {len(flow) - 1}</b>: {step.text}{tail}")
        self.last_update_s = time.perf_counter() - start
