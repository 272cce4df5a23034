"""The book (`make book`): Sphinx + myst-nb + sphinx-book-theme over the suite's executed chapters.

Builds the book once (scripts/build_book.py, from tests/executed.py's copies: no chapter runs a second
time) and opens it in headless Chromium cut off from the network (every request that is not file:// or
this machine is refused). Checked:

* the index has one line per chapter, a viewport meta, and no horizontal overflow 400 px wide;
* every chapter page has the sidebar of chapters, an in-page table of contents, a download button for
  its notebook, Colab and Binder buttons at the URLs dpteach/_course.py gives, every figure of the
  executed chapter loaded, each widget as a static view, no set-up cell (tag ``remove-cell``), and
  ``hide-input`` cells folded;
* no image has an empty or default alt text; the build's own check names each chapter and cell whose
  figure has no ``mystnb.image.alt``;
* the offline search finds ``ReduceAdd`` in chapter 03; dark mode renders dark.

Screenshots for a reviewer go to artifacts/book-screenshots/.
"""

from __future__ import annotations

import re
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from conftest import offline

from dpteach import _course

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("myst_nb", reason="the book is built with myst-nb: pip install -e '.[book]'")
sys.path.insert(0, str(ROOT / "scripts"))
import build_book  # noqa: E402
from executed import executed  # noqa: E402  (each chapter runs once per test run)

SHOTS = ROOT / "artifacts" / "book-screenshots"
CHAPTERS = _course.chapter_notebooks(ROOT)
DEFAULT_ALT = "No description has been provided for this image"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def book():
    start = time.perf_counter()
    summary = build_book.build(allow_missing_alt=True)  # test_every_figure_has_alt_text reports them
    print(f"book built in {time.perf_counter() - start:.0f} s, {summary['bytes'] / 1e6:.1f} MB")
    return ROOT / "artifacts" / "book", summary


def _page_of(path: Path) -> str:
    return path.relative_to(ROOT).with_suffix(".html").as_posix()


def _open(chromium, url: str, width: int = 1280):
    page = chromium.new_page(viewport={"width": width, "height": 900})
    refused = offline(page)
    page.goto(url, wait_until="load")
    return page, refused


def expected_figures(nb) -> tuple[int, int]:
    """(figures the chapter drew, widget outputs) in its executed copy; a figure inside a widget's
    Output area (the kernel's saved widget state) counts too."""
    state = nb.metadata.get("widgets", {}).get(build_book.WIDGET_STATE, {}).get("state", {})
    figures = widgets = 0
    for cell in nb.cells:
        if "remove-cell" in cell.metadata.get("tags", []):
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            figures += any(k in data for k in build_book.FIGURES)
            view = data.get(build_book.WIDGET_VIEW)
            if view:
                widgets += 1
                figures += build_book.widget_html(view["model_id"], state, "x").count("<img ")
    return figures, widgets


def _no_overflow(page) -> None:
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"{page.url}: {width[0]} px of content in a {width[1]} px window"


def test_index_has_one_line_per_chapter_and_fits_a_phone(book, chromium):
    out, _ = book
    page, _ = _open(chromium, (out / "index.html").as_uri(), width=400)
    assert page.locator("meta[name=viewport][content*='width=device-width']").count() >= 1
    article = page.locator("article")
    for path in CHAPTERS:
        line = article.locator(
            f"li:has(> p > a[href='{_page_of(path)}']), li:has(> a[href='{_page_of(path)}'])"
        )
        assert line.count() == 1, f"the index has {line.count()} lines for {path.name}"
        assert len(line.first.inner_text().split()) >= 5, f"{path.name}: its index line says nothing"
    _no_overflow(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "index-400px.png"), full_page=True)
    page.close()


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_page(book, chromium, path):
    out, _ = book
    page, refused = _open(chromium, (out / _page_of(path)).as_uri())
    rel = path.relative_to(ROOT).as_posix()
    name = path.name
    sidebar = page.locator("nav.bd-docs-nav a.reference.internal")
    assert sidebar.count() >= len(CHAPTERS), f"{name}: {sidebar.count()} chapters in the sidebar"
    if page.locator("article h2").count():
        assert page.locator(".bd-sidebar-secondary nav.page-toc a").count() >= 1, (
            f"{name}: no in-page contents"
        )
    assert page.locator(f"a[href='{_course.colab_url(rel)}']").count() == 1, f"{name}: no Colab button"
    assert page.locator(f"a[href='{_course.binder_url(rel)}']").count() == 1, f"{name}: no Binder button"
    download = page.locator("a.btn-download-source-button")
    assert download.count() == 1 and download.get_attribute("href").endswith(path.name)
    assert (out / _page_of(path)).parent.joinpath(download.get_attribute("href")).resolve().is_file()

    nb = executed(path)[0]
    figures, widgets = expected_figures(nb)
    images = page.locator("article .cell_output img")
    assert images.count() >= figures, (
        f"{name}: {images.count()} images on the page, {figures} in the notebook"
    )
    broken = page.evaluate("""() => [...document.querySelectorAll('article img')]
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(-60))""")
    assert broken == [], f"{name}: images that did not load: {broken}"
    assert page.locator(".static-widget").count() == widgets  # each widget became a static view
    text = page.locator("article").inner_text()
    assert "Traceback" not in text or "raises-exception" in path.read_text()
    assert all("mathjax" in url.lower() for url in refused), refused  # only MathJax is ever asked for
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{path.stem}.png"))
    page.close()


class _Images(HTMLParser):
    """The alt text of every <img> in a page's article."""

    def __init__(self):
        super().__init__()
        self.depth, self.found = 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "article":
            self.depth += 1
        elif tag == "img" and self.depth:
            self.found.append(((attrs.get("alt") or "").strip(), (attrs.get("src") or "")[:80]))

    def handle_endtag(self, tag):
        if tag == "article":
            self.depth -= 1


def test_every_figure_has_alt_text(book):
    """No image of the book has an empty or default alt text; the build names each cell that lacks it."""
    out, summary = book
    bad = []
    for path in CHAPTERS:
        parser = _Images()
        parser.feed((out / _page_of(path)).read_text())
        for alt, src in parser.found:
            # no alt, nbconvert's default, or docutils' default (the image's own path)
            if not alt or alt == DEFAULT_ALT or alt.endswith((".png", ".svg", ".jpeg", ".gif")):
                bad.append(f"{path.name}: {src!r} has alt {alt!r}")
    assert not summary["missing_alt"] and not bad, (
        "figure cells without mystnb.image.alt metadata:\n  "
        + "\n  ".join(summary["missing_alt"])
        + f"\n{len(bad)} images on the pages with an empty or default alt text"
    )


def test_set_up_cell_removed_and_plumbing_folded(book):
    """The set-up cell (tag remove-cell) is not on any page; each hide-input cell is behind a toggle."""
    out, _ = book
    wrong = []
    for path in CHAPTERS:
        page = (out / _page_of(path)).read_text()
        nb = nbformat.read(path, as_version=4)
        if "Set-up: on Colab" in page:
            wrong.append(f"{path.name}: the set-up cell shows (give it the tag remove-cell)")
        folded = sum("hide-input" in c.metadata.get("tags", []) for c in nb.cells)
        toggles = len(
            re.findall(
                r'class="cell [^"]*tag_hide-input[^"]*">\s*<details class="[^"]*hide above-input"', page
            )
        )
        if toggles != folded:
            wrong.append(f"{path.name}: {folded} hide-input cells, {toggles} behind a toggle")
    assert not wrong, "\n".join(wrong)


def test_search_finds_reduceadd_in_chapter_03(book, chromium):
    out, _ = book
    page, _ = _open(chromium, (out / "search.html").as_uri() + "?q=ReduceAdd")
    results = page.locator("#search-results ul.search li a")
    results.first.wait_for(timeout=30_000)
    hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
    assert any("03_rewiring_gradient_edges" in h for h in hrefs), hrefs
    page.close()


def _luminance(css_color: str) -> float:
    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css_color)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def test_dark_mode_renders(book, chromium):
    out, _ = book
    page, _ = _open(chromium, (out / _page_of(CHAPTERS[3])).as_uri())
    background = "() => getComputedStyle(document.body).backgroundColor"
    assert _luminance(page.evaluate(background)) > 0.8  # light by default
    page.locator(".theme-switch-button:visible").first.click()  # the color-mode menu, as a reader opens it
    page.locator("button.theme-change-button[data-mode='dark']:visible").first.click()
    page.wait_for_function("() => document.documentElement.dataset.theme === 'dark'")
    assert _luminance(page.evaluate(background)) < 0.2
    text = page.evaluate("() => getComputedStyle(document.querySelector('article p')).color")
    assert _luminance(text) > 0.6  # light text on the dark page
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "dark-mode.png"))
    page.close()


@pytest.mark.parametrize("path", [CHAPTERS[3], CHAPTERS[6]], ids=lambda p: p.stem)
def test_a_400px_page_has_no_horizontal_overflow(book, chromium, path):
    out, _ = book
    page, _ = _open(chromium, (out / _page_of(path)).as_uri(), width=400)
    _no_overflow(page)
    page.close()


def test_widget_view_carries_the_cells_alt_text():
    """A figure inside a widget's Output area gets the cell's alt text, not a placeholder."""
    png = nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_out"]}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [png]}},
    }
    html = build_book.widget_html("box", state, "the loss curve falls")
    assert 'alt="the loss curve falls"' in html


def test_the_build_names_each_figure_cell_without_alt_text():
    nb = nbformat.v4.new_notebook()
    plot = nbformat.v4.new_code_cell("fig, ax = plt.subplots()")
    plot.outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
    described = nbformat.v4.new_code_cell("autograd_graph(loss)")
    described.outputs = [nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg/>"})]
    described.metadata["mystnb"] = {"image": {"alt": "the graph of loss: one MulBackward0 node"}}
    text = nbformat.v4.new_code_cell("print(1)")
    text.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells = [text, plot, described]
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    assert build_book.missing_alt(nb, "notebooks/99_x.ipynb") == [
        "notebooks/99_x.ipynb cell 1 (id c1: 'fig, ax = plt.subplots()')"
    ]
