"""How `make lab` serves the course: `jupyter lab --config=scripts/lab/jupyter_lab_config.py`.

* The file browser is rooted at the checkout, so every file a chapter names (``dpteach/_devices.py``,
  ``scripts/...``) opens from the lab; `make lab` opens chapter 00. So does the URL the server prints
  (its default URL is chapter 00), which is what a learner opens after ``--no-browser`` (a remote
  machine, a container); without it that URL opened the Launcher. The editable install's
  ``dpteach.egg-info`` folder is hidden from the file browser: nothing in it is for a learner.
* ``--allow-root`` only when the server runs as root (Docker, cloud VMs, WSL, CI): JupyterLab refuses
  root without it, and a normal user should keep the refusal.
* The server's environment, and so every kernel it starts, has the course's ``.venv/bin`` first on
  PATH, and so does every JupyterLab terminal: ``python -m dpteach`` there runs the course's Python. A
  terminal is bash reading ``terminal_rc.sh`` (the learner's ~/.bashrc, then ``.venv/bin`` put first
  again, since pyenv or conda lines there put themselves first), not a login shell, which re-reads
  /etc/profile (on Debian it sets PATH anew). Without bash, sh reads the same file through $ENV.
* Settings defaults come from ``scripts/lab/settings/overrides.json`` (the news toast off); a learner's
  own settings (Settings menu) still win over them.
"""

import os
import shutil
from pathlib import Path

c = get_config()  # noqa: F821  (traitlets defines it while it loads this file)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV_BIN = ROOT / ".venv" / "bin"

c.ServerApp.root_dir = str(ROOT)
c.LabApp.default_url = "/lab/tree/notebooks/00_start_here.ipynb"  # the printed URL, and where / leads
c.ContentsManager.hide_globs.extend(["*.egg-info"])  # onto jupyter_server's own list (__pycache__, ...)
c.ServerApp.allow_root = hasattr(os, "geteuid") and os.geteuid() == 0
c.LabApp.app_settings_dir = str(HERE / "settings")

if VENV_BIN.is_dir():
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != VENV_BIN]
    os.environ["PATH"] = os.pathsep.join([str(VENV_BIN), *path])
    os.environ["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    os.environ["DPTEACH_VENV_BIN"] = str(VENV_BIN)  # terminal_rc.sh puts it first after ~/.bashrc
RC = str(HERE / "terminal_rc.sh")
BASH = shutil.which("bash")
if BASH:
    c.ServerApp.terminado_settings = {"shell_command": [BASH, "--rcfile", RC, "-i"]}
else:
    os.environ["ENV"] = RC  # POSIX sh reads $ENV when it starts interactive
    c.ServerApp.terminado_settings = {"shell_command": ["/bin/sh", "-i"]}
