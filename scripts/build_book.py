"""Build the course as a static HTML book: every chapter with its executed outputs, offline.

    python scripts/build_book.py [--execute] [--out artifacts/book]      (make book)

Source: the executed notebooks in artifacts/notebooks/ (tests/test_notebooks.py writes them). A chapter
with no executed copy there, or one older than its source, is executed here first (scripts/run_notebook.py),
and the copy is kept; --execute runs every chapter again.

Each page is nbconvert's HTML (the "lab" template, its CSS inlined; figures embedded as data, so every
page is one self-contained file). Widgets become static views drawn from the widget state the kernel
left: boxes, labels and sliders as text, and what their Output areas showed (plots, graphs, tables).
The top of each page links to the chapter on Colab and Binder (dpteach/_course.py), to the chapters
before and after, and to the index. Nothing is downloaded at build time; pages reference no theme or
script from the network except MathJax, which renders the few formulas when a reader is online (raw TeX
otherwise).
"""

from __future__ import annotations

import argparse
import base64
import html
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors.coalescestreams import CoalesceStreamsPreprocessor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.append(str(ROOT))  # an installed dpteach wins; a bare checkout still works
from run_notebook import execute  # noqa: E402

from dpteach import _course  # noqa: E402

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
CSS = """
.book-nav { font: 14px/1.5 system-ui, sans-serif; padding: 8px 16px; background: #f6f8fa; border-bottom: 1px solid #d0d7de;
            display: flex; gap: 18px; flex-wrap: wrap; position: sticky; top: 0; z-index: 10; }
.book-nav a { color: #0969da; text-decoration: none; } .book-nav a:hover { text-decoration: underline; }
.book-nav .launch { margin-left: auto; display: flex; gap: 12px; }
.book-nav .launch a { border: 1px solid #d0d7de; border-radius: 6px; padding: 0 8px; background: white; }
.static-widget { border: 1px dashed #d0d7de; border-radius: 6px; padding: 6px; margin: 4px 0; }
.static-widget .note { font: 12px system-ui, sans-serif; color: #57606a; }
.static-widget .control { font: 13px system-ui, sans-serif; margin: 2px 6px 2px 0; display: inline-block; }
"""


# ------------------------------------------------------------------------------------------------
# Widgets: a static view from the saved widget state
# ------------------------------------------------------------------------------------------------


def _output_html(output: dict) -> str:
    """One saved output (inside an Output widget) as HTML."""
    data = output.get("data", {})
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if output.get("output_type") == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"].strip()}" alt="figure">'
    if "image/svg+xml" in data:
        svg = data["image/svg+xml"]
        svg = "".join(svg) if isinstance(svg, list) else svg
        return f'<img src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()}" alt="graph">'
    if "text/html" in data:
        value = data["text/html"]
        return "".join(value) if isinstance(value, list) else value
    if "text/plain" in data:
        value = data["text/plain"]
        return f"<pre>{html.escape(''.join(value) if isinstance(value, list) else value)}</pre>"
    return ""


def widget_html(model_id: str, state: dict, seen: set[str] | None = None) -> str:
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
            inner = widget_html(child, state, seen)
            parts.append(f"<div><b>{html.escape(title)}</b>{inner}</div>" if title else f"<div>{inner}</div>")
        return (
            f'<div style="display:flex;flex-direction:{BOXES[name]};gap:6px;flex-wrap:wrap">'
            + "".join(parts)
            + "</div>"
        )
    if name == "OutputModel":
        return "".join(_output_html(o) for o in st.get("outputs", []))
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
            body = widget_html(view["model_id"], state)
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
# Pages
# ------------------------------------------------------------------------------------------------


def title_of(nb: nbformat.NotebookNode, path: Path) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (.+)$", cell.source, re.M)
            if match:
                return match.group(1).replace("`", "").strip()
    return path.stem.replace("_", " ")


def short(path: Path) -> str:
    """A chapter's short name for the link bar: "05 buffers and batchnorm"."""
    number, _, name = path.stem.partition("_")
    return f"{number} {name.replace('_', ' ')}"


def page_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "notebooks")
    return rel.with_suffix(".html").as_posix().replace("/", "__")


def nav(rel: str, prev: tuple[str, str] | None, nxt: tuple[str, str] | None) -> str:
    parts = ['<nav class="book-nav"><a href="index.html">dpteach: all chapters</a>']
    if prev:
        parts.append(f'<a href="{prev[0]}">← {html.escape(prev[1])}</a>')
    if nxt:
        parts.append(f'<a href="{nxt[0]}">{html.escape(nxt[1])} →</a>')
    parts.append(
        f'<span class="launch"><a class="colab" href="{_course.colab_url(rel)}">Open in Colab</a>'
        f'<a class="binder" href="{_course.binder_url(rel)}">Launch on Binder</a></span></nav>'
    )
    return "".join(parts)


def executed_copy(path: Path, source_dir: Path, force: bool) -> nbformat.NotebookNode:
    copy = source_dir / path.name
    if force or not copy.exists() or copy.stat().st_mtime < path.stat().st_mtime:
        print(f"book: executing {path.relative_to(ROOT)}", flush=True)
        nb, seconds = execute(path, timeout=900)
        source_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, copy)
        print(f"book: executed {path.name} in {seconds:.0f} s", flush=True)
    return nbformat.read(copy, as_version=4)


def page_exporter() -> HTMLExporter:
    """nbconvert's "lab" HTML without prompts, stream outputs joined as JupyterLab shows them.

    One ``print()`` can reach the notebook as two stream outputs; JupyterLab joins them on screen,
    nbconvert alone would put the second half on a line of its own.
    """
    exporter = HTMLExporter(template_name="lab")
    exporter.exclude_input_prompt = exporter.exclude_output_prompt = True
    exporter.register_preprocessor(CoalesceStreamsPreprocessor, enabled=True)
    return exporter


def build(out: Path, source_dir: Path, force: bool = False) -> dict:
    start = time.perf_counter()
    chapters = _course.chapter_notebooks(ROOT)
    notebooks = {p: executed_copy(p, source_dir, force) for p in chapters}
    titles = {p: title_of(nb, p) for p, nb in notebooks.items()}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    exporter = page_exporter()
    pages = []
    for i, path in enumerate(chapters):
        nb = notebooks[path]
        rel = path.relative_to(ROOT).as_posix()
        # the link cell's badges are images on other sites: the page's own bar links instead
        nb.cells = [c for c in nb.cells if c.get("id") != _course.LINKS_CELL_ID]
        widgets = static_widgets(nb)
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": titles[path]}})
        prev = (page_name(chapters[i - 1]), short(chapters[i - 1])) if i else None
        nxt = (page_name(chapters[i + 1]), short(chapters[i + 1])) if i + 1 < len(chapters) else None
        # require.js (from a CDN) only serves live widgets and JavaScript outputs; the pages have neither
        body = re.sub(r'<script src="[^"]*require(\.min)?\.js"></script>\s*', "", body)
        body = body.replace("</head>", f"<style>{CSS}</style></head>", 1)
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav(rel, prev, nxt), body, count=1)
        (out / page_name(path)).write_text(body)
        figures = sum(
            1
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            for key in ("image/png", "image/svg+xml")
            if key in o.get("data", {})
        )
        pages.append((path, rel, widgets, figures))
    rows = "".join(
        f'<tr><td><a href="{page_name(p)}">{html.escape(titles[p])}</a></td>'
        f'<td><a href="{_course.colab_url(rel)}">Colab</a> · <a href="{_course.binder_url(rel)}">Binder</a></td></tr>'
        for p, rel, _, _ in pages
    )
    index = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>dpteach: data parallelism in PyTorch, through one real bug and its fix</title>
<style>body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 860px; margin: 2em auto; padding: 0 1em; }}
td {{ padding: 4px 12px 4px 0; }} td:last-child {{ white-space: nowrap; }} a {{ color: #0969da; }}</style></head><body>
<h1>dpteach</h1>
<p><b>Learn data parallelism in PyTorch through one real bug and its fix</b> (PyTorch PR #20910). Each chapter
below is shown with the outputs it produced when it last ran; open it on Colab or Binder to run it yourself, or
install dpteach ({_course.VERSION}) and use it in your own notebooks: see the
<a href="{_course.REPOSITORY}">course repository</a>.</p>
<table><tr><th align="left">chapter</th><th align="left">run it</th></tr>{rows}</table>
</body></html>"""
    (out / "index.html").write_text(index)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    seconds = time.perf_counter() - start
    for path, _, widgets, figures in pages:
        print(f"book: {page_name(path)}: {figures} figures, {widgets} widget views")
    print(f"book: {len(pages)} pages + index in {out} ({size / 1e6:.1f} MB) in {seconds:.0f} s")
    return {"pages": len(pages), "bytes": size, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "book")
    parser.add_argument(
        "--notebooks",
        type=Path,
        default=ROOT / "artifacts" / "notebooks",
        help="executed notebooks (default: what tests/test_notebooks.py wrote)",
    )
    parser.add_argument("--execute", action="store_true", help="execute every chapter again first")
    args = parser.parse_args()
    build(args.out, args.notebooks, args.execute)
    return 0


if __name__ == "__main__":
    sys.exit(main())
