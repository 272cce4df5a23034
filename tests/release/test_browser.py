"""End to end: every chapter opened in JupyterLab, in headless Chromium, as a learner sees it.

One JupyterLab server (loopback, no token, throw-away settings and workspaces, all cells kept in
the page, the news toast off) and one browser page serve the whole module; each chapter gets a
fresh kernel, shut down afterwards. For each chapter in ``notebooks/*.ipynb``:

* a chapter with widgets runs in the page (``notebook:run-all-cells``), since a widget needs a live
  kernel; every other chapter is the executed copy tests/course/test_notebooks.py made headless
  (``tests/executed.py``: each chapter runs once per test run), opened with its outputs. Either way
  every code cell ran and none shows an error, except cells tagged ``raises-exception``;
* stderr output is allowed when it is harmless: warnings (``UserWarning: ...`` and the source line
  Python prints under them), progress bars and log lines. It fails when it holds a traceback or a
  line that starts with an error (``SomethingError:`` / ``Exception:``), since that is a failure the
  cell caught and printed. Every stderr output is listed in ``artifacts/screenshots/report.json``;
* every image in the outputs loaded (graphs render as ``<img>`` of SVG in JupyterLab), a chapter that
  draws graphs shows at least one, and no widget failed ("Click to show javascript error", "Error
  displaying widget");
* in ``12_the_lab`` the widgets render, and the explorer's step button takes a step: its status line
  and loss curve change; the stepper's next button moves its status line. The time from click to
  changed text is recorded in ``report.json`` for a reviewer, never asserted: a loaded machine must not
  fail a functional test (the widgets' own speed is measured by ``scripts/bench_widgets.py``).

Chapters in ``OPEN_ONLY`` that would run in the page are opened and checked for rendering without
running their cells (the reason is next to each), unless they are cheap today (chapter 10 once its C++
build is cached); ``DPTEACH_BROWSER_FULL=1`` runs every chapter in the page. Screenshots for a reviewer go
to ``artifacts/screenshots/``. Skips, saying why, only where Chromium or Playwright cannot be had.
How: Python Playwright drives the system Chromium against a server configured as JupyterLab's own
Galata test tool configures it (``expose_app_in_browser``), and calls ``window.jupyterapp``'s
commands (open, run all); Galata itself needs a Node.js toolchain and is not used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
OPEN_ONLY = {  # chapter -> why it is opened and rendered but not run here (test_notebooks.py runs it headless)
    "10_the_cpp_original.ipynb": "compiles a C++ extension with the system compiler: 30 s or more cold on 2 cores",
}
FULL = os.environ.get("DPTEACH_BROWSER_FULL") == "1"
LIVE = re.compile(
    r"\bipywidgets\b|\bwidgets\.(explorer|gradient_stepper|cost_explorer)\("
)  # needs a kernel in the page


def _needs_a_live_kernel(nb) -> bool:
    """A chapter that shows widgets: they answer only while the page talks to a kernel."""
    return bool(LIVE.search("\n".join(c.source for c in nb.cells if c.cell_type == "code")))


def _cheap_now(name: str) -> bool:
    """An OPEN_ONLY chapter that runs in seconds today: chapter 10 once its C++ build is cached (by test_cpp.py)."""
    if name != "10_the_cpp_original.ipynb":
        return False
    try:
        from dpteach import cpp

        return cpp.is_cached()
    except Exception:  # noqa: BLE001 - no compiler, no cache: open it only
        return False


READY_JS = """cells => {  // the notebook is open, all its cells are in the page, and its kernel is idle
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && w.context.isReady &&
         w.node.querySelectorAll('.jp-Notebook .jp-Cell').length === cells;
}"""
BAD_STDERR = re.compile(r"Traceback \(most recent call last\)|^\s*\w*(Error|Exception)\b:", re.M)
DRAWS_GRAPHS = re.compile(r"autograd_graph|compare_strategies|graph_diff|gradient_stepper|widgets\.explorer")
TIMINGS: dict[str, object] = {}
TRUST: dict[str, Path] = {}
STARTED = time.time()  # checkpoint folders modified after this were made by this run

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs Playwright for Python: pip install playwright"
)
expect = sync_api.expect


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, method: str = "GET"):
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        body = r.read()
        return json.loads(body) if body else None


@pytest.fixture(scope="module")
def lab_url():
    """A token-less JupyterLab on loopback, rooted at the repository, with throw-away settings."""
    tmp = Path(tempfile.mkdtemp(prefix="dpteach-lab-"))
    settings = tmp / "settings"
    for plugin, values in {
        # every cell in the DOM; start the notebook's own kernel without asking ("Select Kernel" dialog)
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none", "autoStartDefaultKernel": True},
        "@jupyterlab/apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },  # no toast
        "@jupyterlab/docmanager-extension/plugin": {
            "autosave": False
        },  # never write outputs into the chapters
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    TRUST["data_dir"] = (
        tmp / "data"
    )  # the server's notebook secret and signatures: executed copies are signed there
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws"),
        "JUPYTER_DATA_DIR": str(TRUST["data_dir"]),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "TQDM_DISABLE": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    env.pop(
        "MPLBACKEND", None
    )  # conftest sets Agg for pytest; kernels must keep the inline backend, as a learner's do
    port = _free_port()
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--ServerApp.disable_check_xsrf=True",
            "--LabApp.expose_app_in_browser=True",
            f"--ServerApp.root_dir={ROOT}",
            # checkpoints of the opened chapters go to the throw-away folder, not notebooks/.ipynb_checkpoints
            # (copies there were collected as chapters, and rewritten by tools that walk notebooks/)
            f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            _http(f"{url}/api/status")
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"JupyterLab did not start:\n{(tmp / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
    yield url
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def lab_page(chromium, lab_url):
    """One headless Chromium page (conftest's browser) for every chapter; console errors are kept."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    pg = chromium.new_page(viewport={"width": 1400, "height": 2200})  # tall: a whole widget fits in one shot
    pg.console_errors = []
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    yield pg
    pg.close()
    TIMINGS["module_seconds"] = round(time.perf_counter() - started, 1)
    (SHOTS / "report.json").write_text(json.dumps(TIMINGS, indent=1, ensure_ascii=False))
    print(f"\nbrowser run: {json.dumps(TIMINGS, ensure_ascii=False)[:3000]}")


def _shut_down_kernels(lab_url: str) -> None:
    for session in _http(f"{lab_url}/api/sessions") or []:
        _http(f"{lab_url}/api/sessions/{session['id']}", "DELETE")


CLOSE_JS = """() => {  // close every open document without saving (it was run, so it is 'dirty')
  for (const w of [...window.jupyterapp.shell.widgets('main')]) {
    if (w.context) { w.context.model.dirty = false; }
    w.dispose();
  }
}"""


def _open(page, lab_url: str, rel: str, cells: int) -> None:
    """Open a chapter with a fresh kernel: in the running app when there is one (no reload), else by URL."""
    page.console_errors.clear()
    if page.url.startswith(lab_url) and page.evaluate("() => !!window.jupyterapp"):
        page.evaluate(CLOSE_JS)
        _shut_down_kernels(lab_url)
        page.evaluate("p => { window.jupyterapp.commands.execute('docmanager:open', {path: p}); }", rel)
    else:
        page.goto(f"{lab_url}/lab/tree/{rel}?reset", wait_until="domcontentloaded")  # ?reset: no old tabs
    page.wait_for_function(READY_JS, arg=cells, timeout=180_000, polling=250)


CELLS_JS = r"""() => {  // each cell as the notebook model holds it (outputs in nbformat's words), and rendered?
  const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets.map(c => {
    const code = c.model.type === 'code';
    const outputs = code ? c.model.outputs.toJSON() : [];
    return {
      code, empty: c.model.sharedModel.getSource().trim() === '', count: code ? c.model.executionCount : null,
      errors: outputs.filter(o => o.output_type === 'error')
                     .map(o => `${o.ename}: ${o.evalue}\n` + (o.traceback || []).join('\n').slice(-2000)),
      stderr: outputs.filter(o => o.output_type === 'stream' && o.name === 'stderr').map(o => String(o.text)),
      markdown: c.node.querySelector('.jp-RenderedMarkdown') !== null,
    };
  });
}"""

DONE_JS = """() => {  // nothing queued or running, and every code cell ran (or one failed and the rest were dropped)
  const w = window.jupyterapp.shell.currentWidget;
  const code = w.content.widgets.filter(c => c.model.type === 'code' && c.model.sharedModel.getSource().trim());
  const busy = [...w.node.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));
  const failed = code.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
  return !busy && (code.every(c => c.model.executionCount !== null) || failed);
}"""

IMAGES_JS = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea img')]
  .map(i => ({ok: i.complete && i.naturalWidth > 0, svg: i.src.startsWith('data:image/svg+xml') ||
               i.closest('.jp-RenderedSVG') !== null, alt: i.alt}))"""


def _run_all(page, timeout_s: float, cells: int) -> float:
    start = time.perf_counter()
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # don't await it
    page.wait_for_function(DONE_JS, timeout=timeout_s * 1000, polling=500)
    page.wait_for_function(READY_JS, arg=cells, timeout=120_000, polling=250)  # the kernel is idle again
    return time.perf_counter() - start


def _shoot(page, locator, path: Path) -> None:
    try:
        locator.scroll_into_view_if_needed(timeout=10_000)
        locator.screenshot(path=str(path), timeout=20_000)
    except sync_api.Error as err:  # a screenshot is for the reviewer; its failure is reported, not fatal
        TIMINGS.setdefault("screenshot_failures", []).append(f"{path.name}: {err}"[:300])


def _check_rendering(page, name: str, nb, ran: bool) -> dict:
    """The checks every chapter gets; returns what it found, for the report."""
    cells = page.evaluate(CELLS_JS)
    assert len(cells) == len(nb.cells), f"{name}: {len(cells)} cells in the page, {len(nb.cells)} in the file"
    for i, (dom, cell) in enumerate(zip(cells, nb.cells)):
        assert dom["code"] == (cell.cell_type == "code"), f"{name}: cell {i} shows as the wrong kind"
        if cell.cell_type == "markdown":
            assert dom["markdown"], (
                f"{name}: markdown cell {i} did not render"
            )  # the text shows, not its source
    text = page.locator(".jp-NotebookPanel:visible").inner_text()
    for bad in ("Click to show javascript error", "Error displaying widget"):
        assert bad not in text, (
            f"{name}: a widget failed to render ({bad!r}); console: {page.console_errors[-5:]}"
        )
    found = {"stderr": []}
    if not ran:
        return found
    for i, (dom, cell) in enumerate(zip(cells, nb.cells)):
        if not dom["code"] or dom["empty"]:
            continue
        source = cell.source.splitlines()[0][:60] if cell.source else ""
        assert dom["count"] is not None, (
            f"{name}: cell {i} ({source!r}) did not run (an earlier cell failed?)"
        )
        if "raises-exception" in cell.metadata.get("tags", []):
            continue  # the chapter shows this error on purpose
        assert not dom["errors"], f"{name}: cell {i} ({source!r}) failed:\n{dom['errors'][0][-2000:]}"
        for err in dom["stderr"]:
            assert not BAD_STDERR.search(err), (
                f"{name}: cell {i} ({source!r}) printed an error on stderr:\n{err[-2000:]}"
            )
            found["stderr"].append(f"cell {i}: {err[:300]}")
    images = page.evaluate(IMAGES_JS)
    assert all(im["ok"] for im in images), (
        f"{name}: images that did not load: {[im['alt'] for im in images if not im['ok']]}"
    )
    found["images"], found["svg_images"] = len(images), sum(im["svg"] for im in images)
    if DRAWS_GRAPHS.search("".join(c.source for c in nb.cells if c.cell_type == "code")):
        assert found["svg_images"] >= 1, (
            f"{name}: draws graphs, but no SVG picture shows"
        )  # graphviz's SVG rendered
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_in_jupyterlab(lab_page, lab_url, path):
    check_chapter(lab_page, lab_url, path)
    left = [
        p
        for folder in (ROOT / "notebooks", ROOT / "artifacts")
        for p in folder.rglob(".ipynb_checkpoints/*")
        if p.stat().st_mtime >= STARTED
    ]
    assert not left, f"JupyterLab left checkpoint folders in the repository: {left}"


def check_chapter(page, lab_url: str, path: Path) -> None:
    """Open ``path`` (under the repository), run it unless it is open-only, check it, take the screenshots."""
    name = path.name
    nb = nbformat.read(path, as_version=4)
    live = FULL or _needs_a_live_kernel(nb)
    run = live and (FULL or name not in OPEN_ONLY or _cheap_now(name))
    start = time.perf_counter()
    opened = path
    if not live:
        from executed import executed, stored_copy

        nb, _, _ = executed(path)  # the headless run every test shares (raises, with the cell, if it failed)
        opened = stored_copy(path)
        # outputs a kernel of ours wrote, as trusted as the learner's own run: JupyterLab shows their SVG
        from nbformat.sign import NotebookNotary

        NotebookNotary(data_dir=str(TRUST["data_dir"])).sign(nbformat.read(opened, as_version=4))
    try:
        _open(page, lab_url, opened.relative_to(ROOT).as_posix(), len(nb.cells))
        seconds = _run_all(page, 420, len(nb.cells)) if run else 0.0
        found = _check_rendering(page, name, nb, run or not live)
    except BaseException:
        page.screenshot(path=str(SHOTS / f"{path.stem}-FAILED.png"))  # what the page showed when it failed
        raise
    page.locator(".jp-NotebookPanel:visible .jp-WindowedPanel-outer").evaluate("e => e.scrollTo(0, 0)")
    page.screenshot(path=str(SHOTS / f"{path.stem}.png"))
    svgs = page.locator(
        ".jp-NotebookPanel:visible .jp-RenderedSVG img, .jp-NotebookPanel:visible .jp-OutputArea "
        "img[src^='data:image/svg+xml']"
    )
    if svgs.count():
        _shoot(page, svgs.first, SHOTS / f"{path.stem}-first-graph.png")
    if name == "12_the_lab.ipynb":
        found["widgets"] = _exercise_the_lab(page, path.stem)
    how = "run in the page" if run else "executed copy" if not live else f"opened only: {OPEN_ONLY[name]}"
    TIMINGS[name] = {
        "run": how,
        "run_seconds": round(seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
        **found,
    }


def _exercise_the_lab(page, stem: str) -> dict:
    """The three widgets rendered; the explorer and the stepper answer clicks (timed for the report)."""
    panel = page.locator(".jp-NotebookPanel:visible")
    explorer, stepper, cost = (
        panel.locator(f".{c}") for c in ("dpteach-explorer", "dpteach-stepper", "dpteach-cost")
    )
    for w in (explorer, stepper, cost):
        expect(w).to_have_count(
            1, timeout=30_000
        )  # each widget rendered once (a widget that fails shows no view)
        expect(w.locator("img").first).to_be_visible()  # with its pictures
    status = explorer.locator(".dpteach-status")
    expect(status).to_contain_text("step 0 of 60")
    for shot, w in (("explorer", explorer), ("stepper", stepper), ("cost", cost)):
        _shoot(page, w, SHOTS / f"{stem}-{shot}-before.png")
    curve = explorer.locator("img").first
    before = curve.get_attribute("src")
    explorer.locator("button", has_text="step").click()  # a real mouse click
    expect(status).to_contain_text(
        "step 1 of 60", timeout=30_000
    )  # reached the kernel, and the answer came back
    assert curve.get_attribute("src") != before  # the loss curve was redrawn
    expect(status).to_contain_text("None")  # clone: the original's .grad is None, said in the status line
    clicks = [
        _timed_click(page, "dpteach-explorer", "step", "dpteach-status", f"step {k} of 60")
        for k in range(2, 9)
    ]
    step_status = stepper.locator(".dpteach-stepper-status")
    expect(step_status).to_contain_text("step 0 of")
    stepper.locator("button", has_text="next").click()
    expect(step_status).to_contain_text("step 1 of", timeout=30_000)
    stepper_clicks = [
        _timed_click(page, "dpteach-stepper", "next", "dpteach-stepper-status", f"step {k} of")
        for k in range(2, 9)
    ]
    for shot, w in (("explorer", explorer), ("stepper", stepper)):
        _shoot(page, w, SHOTS / f"{stem}-{shot}-after.png")
    found = {
        "explorer_click_to_update_ms": clicks,
        "explorer_median_ms": statistics.median(clicks),
        "stepper_click_to_update_ms": stepper_clicks,
        "stepper_median_ms": statistics.median(stepper_clicks),
    }
    return found  # the timings are reported, not asserted (see the module docstring)


CLICK_JS = """async ([view, label, status, want]) => {  // ms from a click to the status text changing, in the page
  const root = document.querySelector(`.jp-NotebookPanel:not(.lm-mod-hidden) .${view}`);
  const button = [...root.querySelectorAll('button')].find(b => b.textContent.includes(label));
  const line = root.querySelector(`.${status}`);
  const start = performance.now();
  const changed = new Promise((resolve, reject) => {
    const seen = new MutationObserver(() => {
      if (line.innerText.includes(want)) { seen.disconnect(); resolve(performance.now() - start); }
    });
    seen.observe(line, {subtree: true, childList: true, characterData: true});
    setTimeout(() => reject(new Error(`no "${want}" after 30 s: ${line.innerText}`)), 30000);
  });
  button.click();
  return await changed;
}"""


def _timed_click(page, view: str, label: str, status: str, want: str) -> int:
    """Click a widget's button in the page and time (ms) until its status line says ``want``."""
    return round(page.evaluate(CLICK_JS, [view, label, status, want]))
