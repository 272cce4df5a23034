# What a JupyterLab terminal of `make lab` runs first (scripts/lab/jupyter_lab_config.py names it):
# the learner's own ~/.bashrc, then the course's .venv/bin put first on PATH, after whatever that file
# put there (pyenv, conda and cargo put themselves first), so `python` is the course's Python.
if [ -n "${BASH_VERSION:-}" ] && [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
if [ -n "${DPTEACH_VENV_BIN:-}" ]; then
  PATH="$DPTEACH_VENV_BIN:$PATH"
  export PATH VIRTUAL_ENV="${DPTEACH_VENV_BIN%/bin}"
fi
