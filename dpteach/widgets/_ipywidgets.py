"""ipywidgets, imported only when a widget is made (``import dpteach`` and the models never need it);
and what the views share: the error guard, and the still each carries for front ends without widgets."""

from __future__ import annotations

import re
from contextlib import nullcontext
from html import escape, unescape

INSTALL = (
    "dpteach's widgets need the ipywidgets package: install it with "
    '`pip install "ipywidgets>=7.6,<9"` (JupyterLab 4 needs 8; Colab\'s preinstalled 7.7 works as it is).'
)


def require():
    """The ``ipywidgets`` module, or an ImportError whose one sentence says what to install."""
    try:
        import ipywidgets
    except ImportError as err:
        raise ImportError(INSTALL) from err
    return ipywidgets


def guarded(view, fn):
    """A callback that shows its error in the view's status line (a widget callback's traceback is invisible)."""

    from .pictures import note

    def call(*args):
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - the learner must see it
            view.status.value = note(f"{type(err).__name__}: {err}")
            view.error = err

    return call


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def still_html(widget) -> str:
    """A widget and its children as static HTML: boxes as rows and columns, every HTML child's value (the
    pictures and tables), each control as its description and value; buttons are left out."""
    children = getattr(widget, "children", None)
    if children is not None:  # a box: an HBox lays its children in a row, every other box in a column
        row = type(widget).__name__ == "HBox"
        style = "display:flex;flex-wrap:wrap;gap:4px 16px" if row else ""
        return f'<div style="{style}">{"".join(still_html(c) for c in children)}</div>'
    kind = type(widget).__name__
    if kind in ("HTML", "HTMLMath"):
        return f"<div>{widget.value}</div>" if widget.value else ""
    if kind == "Button" or not getattr(widget, "description", ""):
        return ""
    value = getattr(widget, "label", None) or getattr(widget, "value", "")  # a selection slider's label
    if isinstance(value, float):
        value = f"{value:.3g}"
    return f"<span>{escape(widget.description)} <b>{escape(str(value))}</b></span>"


class Still:
    """A view that carries a still of itself beside the live widget: ``text/html`` (controls, pictures and
    tables as the kernel first showed them) and its status line as ``text/plain``.

    A front end with a widget manager (JupyterLab, Colab) draws the widget and ignores them; a saved copy
    read without a kernel (nbviewer, GitHub, an untrusted notebook, a headless run) shows the still, not
    the bare ``repr``. ipywidgets 8 displays a widget through ``_repr_mimebundle_``, 7 through
    ``_ipython_display_``; the still joins whichever this one has.
    """

    def still_text(self) -> str:
        status = re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", " ", self.status.value))
        status = " ".join(unescape(status).split())
        return f"{type(self).__name__}: {status} (a widget: run the chapter in Jupyter to use it)"

    still_when = "as it was first shown"  # what state the still shows, said under it

    def still_state(self):
        """A context in which the view shows what its still should: as it is now, unless a view says else."""
        return nullcontext()

    def still(self) -> str:
        note = (
            f'<div style="color:#616161;font-size:small">A still of the widget {escape(self.still_when)}: '
            "run the chapter in JupyterLab, Colab or Binder to use it.</div>"
        )
        # a still cannot be relied on to scroll (a sanitiser may drop the scroll box), so a graph's floor on
        # its width (pictures.fitted_img) is dropped: every picture shrinks to the page's width
        body = re.sub(r"min-width:\d+px;", "", still_html(self))
        return f'<div class="dpteach-still" style="max-width:100%;overflow:hidden">{body}{note}</div>'

    def _with_still(self, data: dict | None) -> dict | None:
        if data and WIDGET_VIEW in data:
            with self.still_state():
                data = {**data, "text/html": self.still(), "text/plain": self.still_text()}
        return data

    def _repr_mimebundle_(self, **kwargs):
        base = getattr(super(), "_repr_mimebundle_", None)  # ipywidgets 8; 7 builds its bundle as below
        if base is not None:
            return self._with_still(base(**kwargs))
        data = {"text/plain": repr(self)}
        if self._view_name is not None:
            data[WIDGET_VIEW] = {"version_major": 2, "version_minor": 0, "model_id": self._model_id}
        return self._with_still(data)


def _display_7(self, **kwargs):
    """ipywidgets 7's ``Widget._ipython_display_``, with the still in its bundle."""
    from IPython.display import display

    display(self._repr_mimebundle_(), raw=True)
    if self._view_name is not None:
        self._handle_displayed(**kwargs)


def still_view(view_class):
    """Class decorator for a view: the still joins ipywidgets 7's display path where that is the one used."""
    if "_ipython_display_" in vars(require().Widget):  # ipywidgets 7 (Colab) displays through it
        view_class._ipython_display_ = _display_7
    return view_class
