"""The DataParallel explorer: a thin ipywidgets view over ``training.TrainingLab``.

Controls set the lab's strategy, slots, learning rate and steps; the buttons step it, run it or
reset it; then the view shows what the lab holds: a status line, the loss curve against one
device's, the gradient-norm table and the autograd graph of the current step. Only widgets and
calls that ipywidgets 7.7 (Colab) and 8 share.
"""

from __future__ import annotations

import time

from ._ipywidgets import Still, guarded, require, still_view
from .pictures import graph_html, loss_curve
from .tables import grad_table
from .training import STRATEGIES, TrainingLab

widgets = require()
WIDE = {"description_width": "initial"}


@still_view
class DataParallelExplorer(Still, widgets.VBox):
    """Train the course model under a strategy, step by step, beside one device."""

    def __init__(self, lab: TrainingLab | None = None, **settings):
        self.lab = lab or TrainingLab(**settings)
        self.error: Exception | None = None
        self.last_update_s = 0.0  # how long the last refresh took, in the kernel
        lab = self.lab
        self.strategy = widgets.Dropdown(options=list(STRATEGIES), value=lab.strategy, description="strategy")
        self.slots = widgets.IntSlider(
            value=lab.slots, min=1, max=8, description="slots", continuous_update=False
        )
        self.lr = widgets.FloatLogSlider(
            value=lab.lr,
            base=10,
            min=-2,
            max=0.3,
            step=0.1,
            description="learning rate",
            continuous_update=False,
            style=WIDE,
        )
        self.steps = widgets.IntSlider(
            value=lab.steps, min=1, max=300, description="steps", continuous_update=False
        )
        self.step_button = widgets.Button(description="▶ step", tooltip="one SGD step of both models")
        self.run_button = widgets.Button(description="▶▶ run", tooltip="step until `steps` steps are done")
        self.reset_button = widgets.Button(description="↺ reset", tooltip="fresh models, no steps taken")
        self.status = widgets.HTML()
        self.status.add_class("dpteach-status")
        self.curve = widgets.HTML(layout=widgets.Layout(width="490px"))
        # at most the page's width, so a table of 8 replicas scrolls inside it (tables.scrolled)
        self.grads = widgets.HTML(layout=widgets.Layout(max_width="100%"))
        self.graph = widgets.HTML()
        self.graph.add_class("dpteach-graph")
        for w in (self.strategy, self.slots, self.lr):
            w.observe(guarded(self, self._configure), names="value")
        self.steps.observe(
            guarded(self, lambda change: (lab.configure(steps=change["new"]), self.refresh())), names="value"
        )
        self.step_button.on_click(guarded(self, lambda _: (lab.step(), self.refresh())))
        self.run_button.on_click(guarded(self, self._run))
        self.reset_button.on_click(guarded(self, lambda _: (lab.reset(), self.refresh())))
        super().__init__(
            [
                widgets.HBox([self.strategy, self.slots]),
                widgets.HBox([self.lr, self.steps]),
                widgets.HBox([self.step_button, self.run_button, self.reset_button]),
                self.status,
                widgets.HBox([self.curve, self.grads], layout=widgets.Layout(flex_flow="row wrap")),
                self.graph,
            ]
        )
        self.add_class("dpteach-explorer")
        self.refresh()

    @property
    def still_when(self) -> str:
        """What the still shows: the step the lab is at when shown, step 0 in a fresh explorer, the chapter's
        predictions asked under it (the answers are the learner's to find, or in the fold below it)."""
        return f"at step {self.lab.step_count}, as it was shown"

    def _configure(self, change) -> None:
        self.lab.configure(strategy=self.strategy.value, slots=self.slots.value, lr=self.lr.value)
        self.refresh()

    def _run(self, _) -> None:
        self.run_button.disabled = self.step_button.disabled = True
        try:
            self.lab.run(
                callback=lambda lab: self.refresh(graph=False), every=10
            )  # the curve grows as it runs
        finally:
            self.run_button.disabled = self.step_button.disabled = False
        self.refresh()

    def refresh(self, graph: bool = True) -> None:
        """Show what the lab holds now."""
        start = time.perf_counter()
        lab = self.lab
        self.curve.value = loss_curve(lab.losses, lab.reference_losses, lab.strategy, lab.steps)
        self.grads.value = grad_table(lab)
        if graph:
            self.graph.value = graph_html(lab.graph, alt=f"autograd graph of step {lab.step_count}")
        self.run_button.disabled = lab.done
        # last: the status line says the step is shown, so a reader (or a test) that waits for it finds
        # the curve, the table and the graph already updated
        self.status.value = f"<b>{lab.status()}</b>"
        self.last_update_s = time.perf_counter() - start
