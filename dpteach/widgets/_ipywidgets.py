"""ipywidgets, imported only when a widget is made (``import dpteach`` and the models never need it);
and the one helper the views share."""

from __future__ import annotations

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
