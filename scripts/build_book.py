"""Build the course book: the chapters' executed copies, rendered by Sphinx + myst-nb + sphinx-book-theme.

    python scripts/build_book.py [--out artifacts/book] [--allow-missing-alt]      (make book)

The stack (docs/book/conf.py) does the book: sidebar, in-page contents, offline search, dark mode,
download and launch buttons, ``remove-cell`` / ``hide-input`` cell tags, alt text from each cell's
``mystnb.image.alt`` metadata. This script does what it cannot:

* it takes every chapter's executed copy from tests/executed.py, the one the test suite makes (cached
  under artifacts/notebooks/cache/ by a hash of the chapter and the library), so no chapter runs a
  second time for the book; a chapter with no copy yet runs there once, and its copy is kept;
* it turns each widget into a static view drawn from the widget state the kernel left (boxes, labels,
  sliders as text, and what their Output areas showed), since a live widget needs a kernel and a widget
  manager from a CDN;
* it drops each chapter's link cell (badges: images on other sites; the theme's buttons replace them);
* it refuses a figure with no alt text: every code cell whose output is a figure must say what it
  shows in ``mystnb.image.alt``; the build fails naming each chapter and cell that does not
  (``--allow-missing-alt`` lists them and builds anyway);
* it stages the copies in artifacts/book-src/ beside docs/book/index.md, and runs sphinx-build.
"""

from __future__ import annotations

import argparse
import base64
import html
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.append(str(ROOT))  # an installed dpteach wins; a bare checkout still works
from executed import executed_all  # noqa: E402  (the suite's one executed copy of each chapter)

from dpteach import _course  # noqa: E402

CONF = ROOT / "docs" / "book"
STAGE = ROOT / "artifacts" / "book-src"
FIGURES = ("image/png", "image/svg+xml", "image/jpeg", "image/gif")


# ------------------------------------------------------------------------------------------------
# Widgets: a static view from the saved widget state
# ------------------------------------------------------------------------------------------------

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
BOXES = {
    "VBoxModel": "column",
    "HBoxModel": "row",
    "BoxModel": "column",
    "GridBoxModel": "row",
    "TabModel": "column",
    "AccordionModel": "column",
    "StackModel": "column",
}


# ------------------------------------------------------------------------------------------------
# Widgets: a static view from the saved widget state
# ------------------------------------------------------------------------------------------------


def _output_html(output: dict, alt: str) -> str:
    """One saved output (inside an Output widget) as HTML; ``alt`` is the cell's alt text for its figures."""
    data = output.get("data", {})
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if output.get("output_type") == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"].strip()}" alt="{html.escape(alt, quote=True)}">'
    if "image/svg+xml" in data:
        svg = data["image/svg+xml"]
        svg = "".join(svg) if isinstance(svg, list) else svg
        return f'<img src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()}" alt="{html.escape(alt, quote=True)}">'
    if "text/html" in data:
        value = data["text/html"]
        return "".join(value) if isinstance(value, list) else value
    if "text/plain" in data:
        value = data["text/plain"]
        return f"<pre>{html.escape(''.join(value) if isinstance(value, list) else value)}</pre>"
    return ""


def widget_html(model_id: str, state: dict, alt: str = "", seen: set[str] | None = None) -> str:
    """A widget and its children as static HTML, from the kernel's saved widget state."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return ""
    seen.add(model_id)
    model = state[model_id]
    name, st = model.get("model_name", ""), model.get("state", {})
    description = html.escape(str(st.get("description", "")))
    if name in BOXES:
        children = [c.removeprefix("IPY_MODEL_") for c in st.get("children", [])]
        titles = st.get("titles") or st.get("_titles") or {}
        parts = []
        for i, child in enumerate(children):
            title = (
                titles.get(str(i)) if isinstance(titles, dict) else (titles[i] if i < len(titles) else None)
            )
            inner = widget_html(child, state, alt, seen)
            parts.append(f"<div><b>{html.escape(title)}</b>{inner}</div>" if title else f"<div>{inner}</div>")
        return (
            f'<div style="display:flex;flex-direction:{BOXES[name]};gap:6px;flex-wrap:wrap">'
            + "".join(parts)
            + "</div>"
        )
    if name == "OutputModel":
        return "".join(_output_html(o, alt) for o in st.get("outputs", []))
    if name in ("LabelModel", "HTMLModel", "HTMLMathModel"):
        value = str(st.get("value", ""))
        return f'<span class="control">{html.escape(value) if name == "LabelModel" else value}</span>'
    if name == "ImageModel":
        return ""  # raw bytes are not kept in the saved state
    if name == "ButtonModel":
        return f'<button class="control" disabled>{description}</button>'
    if name in ("DropdownModel", "ToggleButtonsModel", "RadioButtonsModel", "SelectModel"):
        labels, index = st.get("_options_labels", []), st.get("index")
        value = labels[index] if isinstance(index, int) and index < len(labels) else ""
        return f'<span class="control">{description} <b>{html.escape(str(value))}</b></span>'
    if "value" in st:
        value = st["value"]
        if isinstance(value, list):
            value = "–".join(map(str, value))
        return f'<span class="control">{description} <b>{html.escape(str(value))}</b></span>'
    return ""


def static_widgets(nb: nbformat.NotebookNode) -> int:
    """Replace every widget output by its static view; returns how many were replaced."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for i, output in enumerate(cell.outputs):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if not view:
                continue
            body = widget_html(view["model_id"], state, alt_text(cell) or "")
            note = (
                '<div class="note">A static view of the widget as the kernel left it: open the chapter on '
                "Colab or Binder to use it.</div>"
            )
            cell.outputs[i] = nbformat.v4.new_output(
                "display_data", data={"text/html": f'<div class="static-widget">{body or ""}{note}</div>'}
            )
            count += 1
    nb.metadata.pop("widgets", None)  # no widget manager from a CDN: the views above are static
    return count


# ------------------------------------------------------------------------------------------------
# Alt text
# ------------------------------------------------------------------------------------------------


def alt_text(cell) -> str | None:
    """The alt text a cell gives its figures (``metadata.mystnb.image.alt``), or None."""
    alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
    return alt.strip() if isinstance(alt, str) and alt.strip() else None


def _draws_a_figure(cell, state: dict) -> bool:
    """The cell shows a figure: an image output, or an image inside a widget it displays."""
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if any(k in data for k in FIGURES):
            return True
        view = data.get(WIDGET_VIEW)
        if view and "<img " in widget_html(view["model_id"], state, "x"):
            return True
    return False


def missing_alt(nb: nbformat.NotebookNode, name: str) -> list[str]:
    """'chapter cell N (id, first line)' for each figure cell of ``nb`` without alt text."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and _draws_a_figure(cell, state) and alt_text(cell) is None:
            first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
            found.append(f"{name} cell {i} (id {cell.get('id')}: {first!r})")
    return found


# ------------------------------------------------------------------------------------------------
# Staging and building
# ------------------------------------------------------------------------------------------------


def stage(stage_dir: Path = STAGE) -> tuple[list[Path], list[str]]:
    """Write the book's sources into ``stage_dir``: index.md and each chapter's executed copy, made static.

    Returns (the chapters, the figure cells without alt text).
    """
    chapters = _course.chapter_notebooks(ROOT)
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    shutil.copy(CONF / "index.md", stage_dir / "index.md")
    index = (CONF / "index.md").read_text()
    missing: list[str] = []
    for path in chapters:
        rel = path.relative_to(ROOT)
        if rel.with_suffix("").as_posix() not in index:
            raise SystemExit(f"book: {rel} is not in docs/book/index.md: add it to a toctree and the list")
    runs = executed_all(chapters, timeout=900)
    for path in chapters:
        rel = path.relative_to(ROOT)
        nb = runs[path.resolve()]
        missing += missing_alt(nb, rel.as_posix())
        for cell in nb.cells:  # the launch badges leave the page (the book has its own); a recap stays
            if cell.get("id") == _course.LINKS_CELL_ID:
                cell.source = cell.source.removeprefix(_course.badges(rel.as_posix())).strip()
        nb.cells = [c for c in nb.cells if c.get("id") != _course.LINKS_CELL_ID or c.source]
        static_widgets(nb)
        (stage_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, stage_dir / rel)
    return chapters, missing


def build(out: Path = ROOT / "artifacts" / "book", allow_missing_alt: bool = False) -> dict:
    """Stage the sources and build the HTML book in ``out``; returns what it built and how long it took."""
    start = time.perf_counter()
    chapters, missing = stage()
    if missing and not allow_missing_alt:
        raise SystemExit(
            "book: figures without alt text (give each cell metadata mystnb.image.alt, one sentence saying "
            "what the figure shows):\n  " + "\n  ".join(missing)
        )
    staged = time.perf_counter() - start
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(CONF), str(STAGE), str(out)]
    cmd += ["-d", str(STAGE.parent / "book-doctrees")]
    subprocess.run(cmd, check=True, cwd=ROOT)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    seconds = time.perf_counter() - start
    print(
        f"book: {len(chapters)} pages + index in {out} ({size / 1e6:.1f} MB) in {seconds:.0f} s "
        f"(staging {staged:.0f} s)"
    )
    for line in missing:
        print(f"book: no alt text: {line}")
    return {"pages": len(chapters), "bytes": size, "seconds": seconds, "missing_alt": missing}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "book")
    parser.add_argument(
        "--allow-missing-alt", action="store_true", help="list figures without alt text, build anyway"
    )
    args = parser.parse_args()
    build(args.out, args.allow_missing_alt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
