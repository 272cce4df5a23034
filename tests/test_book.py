"""The static book (`make book`): every chapter page opens in headless Chromium and shows its figures.

Builds the book from the executed notebooks in artifacts/notebooks/ (executing any chapter that has
none), then opens the index and every page with no network (every request outside file:// is
refused), checks that each figure the chapter drew is on its page and loaded, that widgets became
static views, that each page links to the chapter on Colab and Binder, and saves a screenshot of each
page's first figure to artifacts/book-screenshots/.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pytest

from dpteach import _course

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("nbconvert", reason="the book is built with nbconvert")
sys.path.insert(0, str(ROOT / "scripts"))
import build_book  # noqa: E402
from executed import executed  # noqa: E402  (each chapter runs once per test run)

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
SHOTS = ROOT / "artifacts" / "book-screenshots"

pytestmark = [pytest.mark.browser, pytest.mark.slow]
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs Playwright for Python: pip install playwright"
)
if CHROMIUM is None:
    pytest.skip("needs Chromium: apt-get install chromium", allow_module_level=True)


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = ROOT / "artifacts" / "book"
    start = time.perf_counter()
    executed_dir = tmp_path_factory.mktemp("executed")
    for path in _course.chapter_notebooks(ROOT):  # the run's one executed copy of each chapter, shared
        nbformat.write(executed(path)[0], executed_dir / path.name)
    summary = build_book.build(out, executed_dir)
    print(f"book built in {time.perf_counter() - start:.0f} s, {summary['bytes'] / 1e6:.1f} MB")
    return out


def _has_image(output: dict) -> bool:
    data = output.get("data", {})
    return "image/png" in data or "image/svg+xml" in data


def expected_figures(path: Path) -> tuple[int, int]:
    """(figures the chapter drew, widget outputs) in its executed copy; a figure inside a widget's
    Output area (the kernel's saved widget state) counts too."""
    nb = nbformat.read(ROOT / "artifacts" / "notebooks" / path.name, as_version=4)
    state = nb.metadata.get("widgets", {}).get(build_book.WIDGET_STATE, {}).get("state", {})
    figures = widgets = 0
    todo: list[str] = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            figures += _has_image(output)
            view = output.get("data", {}).get(build_book.WIDGET_VIEW)
            if view:
                widgets += 1
                todo.append(view["model_id"])
    seen: set[str] = set()
    while todo:  # every widget reachable from a displayed one
        model_id = todo.pop()
        if model_id in seen or model_id not in state:
            continue
        seen.add(model_id)
        st = state[model_id].get("state", {})
        todo += [c.removeprefix("IPY_MODEL_") for c in st.get("children", [])]
        figures += sum(_has_image(o) for o in st.get("outputs", []))
    return figures, widgets


CHAPTERS = _course.chapter_notebooks(ROOT)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield browser
        browser.close()


def _page(browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    refused: list[str] = []

    def offline(route):  # the book must stand alone: nothing from the network
        refused.append(route.request.url)
        route.abort()

    page.route(re.compile(r"^https?://"), offline)
    return page, refused


def test_index_lists_every_chapter(book, browser):
    page, _ = _page(browser)
    page.goto((book / "index.html").as_uri())
    links = page.locator("td a[href$='.html']")
    assert links.count() == len(CHAPTERS)
    for path in CHAPTERS:
        rel = path.relative_to(ROOT).as_posix()
        assert page.locator(f"a[href='{_course.colab_url(rel)}']").count() == 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "index.png"))
    page.close()


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_page_shows_its_figures(book, browser, path):
    page, refused = _page(browser)
    page.goto((book / build_book.page_name(path)).as_uri(), wait_until="load")
    rel = path.relative_to(ROOT).as_posix()
    assert page.locator(f".book-nav a.colab[href='{_course.colab_url(rel)}']").count() == 1
    assert page.locator(f".book-nav a.binder[href='{_course.binder_url(rel)}']").count() == 1
    figures, widgets = expected_figures(path)
    images = page.locator(".jp-OutputArea-output img, .jp-OutputArea-output svg")
    # every figure of the executed chapter is on the page (widget views may add more, never fewer)
    assert images.count() >= figures, (
        f"{path.name}: {images.count()} images on the page, {figures} in the notebook"
    )
    broken = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output img')]
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 60))""")
    assert broken == [], f"{path.name}: images that did not load: {broken}"
    assert page.locator(".static-widget").count() == widgets  # each widget became a static view
    assert page.locator("text=Click to show javascript error").count() == 0
    assert (
        page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] >> text=Traceback"
        ).count()
        == 0
        or "raises-exception" in path.read_text()
    )
    assert all("mathjax" in url.lower() for url in refused), refused  # only MathJax is ever asked for
    SHOTS.mkdir(parents=True, exist_ok=True)
    if images.count():
        images.first.scroll_into_view_if_needed()
        page.evaluate("window.scrollBy(0, -120)")  # the sticky link bar stays in the shot
    page.screenshot(path=str(SHOTS / f"{path.stem}.png"))
    page.close()


def test_a_print_split_into_two_stream_outputs_is_one_line_on_the_page():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('clone_then_to', 1.0)")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="clone_then_to "),
        nbformat.v4.new_output("stream", name="stdout", text="1.0 ms\n"),
    ]
    nb.cells = [cell]
    body, _ = build_book.page_exporter().from_notebook_node(nb)
    assert "clone_then_to 1.0 ms" in body  # joined, as JupyterLab shows it
