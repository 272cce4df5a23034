"""The README's first command, `make lab`, run as a learner runs it, up to a chapter run in the browser.

``test_make_lab_serves_the_course`` runs ``make lab`` itself as the user the suite runs as (root in CI
and in containers, where JupyterLab refuses to start without ``--allow-root``), with ``LAB_ARGS`` for
what a test needs on top (a free port, a "browser" that writes down the URL it was asked to open, the
app object exposed for Playwright), and a PATH without ``.venv/bin`` as a fresh shell has. Then, in
headless Chromium cut off from everything but this machine, in the URL the lab asked the browser to
open: chapter 00 is the open document, it runs to the end with no error, the file browser reaches
``dpteach/_devices.py`` (the checkout is the root), a JupyterLab terminal finds ``.venv``'s python first
on PATH, and the news setting is "Never". The server is stopped at the end.

Set-up (scripts/setup.sh) runs when make decides it is due, as on a learner's machine, except in a
git worktree whose ``.venv`` is a link to another checkout's: there make is told (``-o``) that the
set-up stamp is up to date, so the shared environment is not re-pointed at this worktree.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import offline
from traitlets.config.loader import PyFileConfigLoader

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "scripts" / "lab" / "jupyter_lab_config.py"
VENV = ROOT / ".venv"
CHAPTER = "notebooks/00_start_here.ipynb"


def _load_config(monkeypatch, euid: int):
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the file prepends .venv/bin here; monkeypatch puts it back
    monkeypatch.setenv("SHELL", "/bin/bash")
    return PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()


@pytest.mark.parametrize("euid, allowed", [(0, True), (1000, False)])
def test_allow_root_only_as_root(monkeypatch, euid, allowed):
    config = _load_config(monkeypatch, euid)
    assert config.ServerApp.allow_root is allowed


def test_config_roots_the_lab_at_the_checkout_and_puts_the_venv_first(monkeypatch):
    config = _load_config(monkeypatch, 1000)
    assert Path(config.ServerApp.root_dir) == ROOT
    if (VENV / "bin").is_dir():
        assert os.environ["PATH"].split(os.pathsep)[0] == str(VENV / "bin")
    # not a login shell (-l): it re-reads /etc/profile, which resets PATH on Debian
    assert "-l" not in config.ServerApp.terminado_settings["shell_command"]
    overrides = Path(config.LabApp.app_settings_dir) / "overrides.json"
    import json

    news = json.loads(overrides.read_text())["@jupyterlab/apputils-extension:notification"]
    assert news["fetchNews"] == "false"


def test_the_printed_url_opens_chapter_00_and_the_egg_info_is_hidden(monkeypatch, tmp_path):
    """After --no-browser a learner opens the URL the server prints: it must be the chapter make lab opens."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    config = _load_config(monkeypatch, 1000)
    chapter = config.LabApp.default_url.removeprefix("/lab/tree/")
    assert chapter == CHAPTER and CHAPTER in (ROOT / "Makefile").read_text()
    for folder in ("dpteach", "dpteach.egg-info", "__pycache__"):  # a checkout after `pip install -e .`
        (tmp_path / folder).mkdir()
    manager = FileContentsManager(config=config, root_dir=str(tmp_path))
    listed = {item["name"] for item in manager.get("", content=True)["content"]}
    assert listed == {"dpteach"}  # jupyter_server's hidden names still hidden, and the egg-info too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shared_venv() -> bool:
    """This checkout's .venv is a link to another checkout's (a developer's git worktree)."""
    return VENV.is_symlink() and ROOT not in VENV.resolve().parents


CHECK_JS = r"""async () => {  // what a learner can do in the lab: the file browser, a terminal, the settings
  const app = window.jupyterapp, services = app.serviceManager;
  const devices = await services.contents.get('dpteach/_devices.py', {content: false});
  const reply = await fetch('/lab/api/settings/@jupyterlab/apputils-extension:notification');
  const plugin = await reply.json();  // the learner's own value if any, else the default (overrides.json's)
  const news = {fetchNews: plugin.settings.fetchNews ?? plugin.schema.properties.fetchNews.default};
  const term = await services.terminals.startNew();
  let out = '';
  const found = await new Promise((resolve, reject) => {
    term.messageReceived.connect((_, msg) => {
      if (msg.type !== 'stdout') return;
      out += msg.content.join('');
      const path = out.match(/@@(\/[^@]*)@@/), python = out.match(/##(\/[^#]*)##/);
      if (path && python) resolve({path: path[1], python: python[1]});
    });
    setTimeout(() => reject(new Error('no answer from the terminal: ' + out.slice(-500))), 60000);
    term.send({type: 'stdin', content: ['echo "@@$PATH@@"; echo "##$(command -v python)##"\r']});
  });
  await term.shutdown();
  return {devices: devices.path, fetchNews: news.fetchNews, ...found};
}"""

OPEN_JS = """path => {  // the chapter make lab named is the open document, its kernel idle, every cell in the page
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && w.context.isReady && w.context.path === path;
}"""

RAN_JS = """() => {  // every code cell ran, none is running; the error outputs, if any
  const w = window.jupyterapp.shell.currentWidget;
  const code = w.content.widgets.filter(c => c.model.type === 'code' && c.model.sharedModel.getSource().trim());
  const busy = [...w.node.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));
  const errors = code.flatMap(c => c.model.outputs.toJSON().filter(o => o.output_type === 'error'))
                     .map(o => `${o.ename}: ${o.evalue}`);
  return (!busy && code.every(c => c.model.executionCount !== null)) || errors.length ? errors : null;
}"""


def test_make_lab_serves_the_course(chromium, tmp_path):
    port = _free_port()
    url_file = tmp_path / "opened-url"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {shlex.quote(str(url_file))}\n')
    browser.chmod(0o755)
    settings = tmp_path / "user-settings"  # the learner's own settings: a fresh learner has none
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": '{"windowingMode": "none", "autoStartDefaultKernel": true}',
        "@jupyterlab/docmanager-extension/plugin": '{"autosave": false}',  # chapter 00 stays as committed
    }.items():
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{plugin}.jupyterlab-settings").write_text(values)
    lab_args = [
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=True",
        f"--ServerApp.browser={browser} %s",
        "--LabApp.expose_app_in_browser=True",
        f"--FileCheckpoints.checkpoint_dir={tmp_path / 'checkpoints'}",
    ]
    path = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != VENV / "bin"]
    env = {
        **os.environ,
        "PATH": os.pathsep.join(path),  # as a fresh shell has it: make lab must find .venv itself
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "LAB_ARGS": " ".join(shlex.quote(a) for a in lab_args),
    }
    for name in ("MPLBACKEND", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(name, None)  # pytest's Agg backend, and this run's own environment, are not the learner's
    make = ["make", "--no-print-directory"]
    if _shared_venv():
        make += ["-o", str(VENV / ".dpteach-lab")]
    log = tmp_path / "make-lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*make, "lab"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = time.monotonic()
    try:
        deadline = started + 600  # set-up, when due, downloads PyTorch
        while not url_file.exists() or not url_file.read_text().strip():
            assert proc.poll() is None, f"make lab stopped:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"make lab opened no browser:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        timings = {"served_s": round(time.monotonic() - started, 1)}
        opened = url_file.read_text().strip()
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        refused = offline(page)
        try:
            page.goto(opened, wait_until="domcontentloaded")
            page.wait_for_function(OPEN_JS, arg=CHAPTER, timeout=180_000, polling=250)
            timings["chapter_open_s"] = round(time.monotonic() - started, 1)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            errors = page.wait_for_function(RAN_JS, timeout=300_000, polling=500).json_value()
            assert errors == [], f"{CHAPTER} failed in the lab: {errors}"
            timings["chapter_ran_s"] = round(time.monotonic() - started, 1)
            found = page.evaluate(CHECK_JS)
            page.evaluate(
                "() => window.jupyterapp.serviceManager.sessions.shutdownAll()"
            )  # as File > Shut Down
            timings["terminal_s"] = round(time.monotonic() - started, 1)
            print(f"make lab, seconds since it started: {timings}")  # for a reviewer; never asserted
        finally:
            page.close()
        assert found["devices"] == "dpteach/_devices.py"
        assert found["fetchNews"] == "false"  # no news toast
        assert found["path"].split(":")[0] == str(VENV / "bin"), found["path"]
        assert found["python"] == str(VENV / "bin" / "python")
        assert not [u for u in refused if "jupyter.org" in u], refused  # the lab asked no news feed
        text = log.read_text()
        assert ("--allow-root" not in text) and "Running as root is not recommended" not in text
    finally:
        stopping = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:  # after a browser was connected, the server can sit in its extensions' shutdown: not waited for
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 60  # stopped: the server (make's child) lets go of its port
    while True:
        with socket.socket() as s:
            # SO_REUSEADDR: connections the server closed itself linger in TIME_WAIT for a minute and
            # would refuse a plain bind; with it, only a socket still listening on the port does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline, f"the lab still holds port {port} after SIGTERM"
        time.sleep(0.5)
    print(f"make lab stopped {time.monotonic() - stopping:.1f} s after SIGTERM")


def test_set_up_prints_a_line_per_step_and_pip_progress_on_the_large_installs(tmp_path):
    """scripts/setup.sh in a copy whose .venv python is a stand-in that records how it was called."""
    (tmp_path / "scripts").mkdir()
    for name in ("scripts/setup.sh", "pyproject.toml"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "scripts/setup.sh").chmod(0o755)
    calls = tmp_path / "calls"
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\nif [ "$1" = -c ]; then echo "torch x | dpteach y"; fi\n'
    )
    fake.chmod(0o755)
    bin_dir = tmp_path / "bin"  # dot and chromium "installed", so no apt-get
    bin_dir.mkdir()
    for tool in ("dot", "chromium"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TORCH_SPEC": "torch==2.13.0"}
    done = subprocess.run(
        ["scripts/setup.sh", "lab"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split("]")[0] for line in lines if line.startswith("setup (lab) [")] == [
        f"setup (lab) [{k}/5" for k in range(1, 6)
    ]
    assert lines[-1].startswith("setup (lab): done")
    installs = [c for c in calls.read_text().splitlines() if c.startswith("-m pip install")]
    torch_install = next(c for c in installs if "torch==2.13.0" in c)
    extras_install = next(c for c in installs if "-e .[lab]" in c)
    assert " -q" not in torch_install and " -q" not in extras_install  # pip shows its progress
