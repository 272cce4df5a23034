#!/usr/bin/env bash
# Set up dpteach on a fresh machine: what `make lab` (scripts/setup.sh lab) and `make test`
# (scripts/setup.sh test) run first.
#  1. system packages: graphviz (the `dot` program), and for `test` chromium (browser tests), when
#     missing and this user may install them (root or sudo on Debian/Ubuntu); otherwise one line on how to.
#  2. .venv: PyTorch (TORCH_SPEC, CPU build 2.13.0 by default), then dpteach with the `lab` extra
#     (JupyterLab, ipywidgets 8, ninja), and for `test` also the `test`, `e2e` and `book` extras.
# It prints one line per step; the two large downloads (PyTorch, then JupyterLab and the rest) show
# pip's own progress, so a first run that takes minutes is never silent.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-lab}
case "$WHAT" in
  lab) EXTRAS="lab" ;;
  test) EXTRAS="lab,test,e2e,book" ;;
  *) echo "usage: scripts/setup.sh [lab|test]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
# A bare `torch` or an open range can pull a multi-GB CUDA build; pin the release CI uses.
# On a machine with an NVIDIA GPU, e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

step() { echo "setup ($WHAT) $1"; }

if [ "$WHAT" = test ]; then step "[1/5] system packages: graphviz (dot) and chromium"
else step "[1/5] system packages: graphviz (dot)"; fi
need=()
command -v dot >/dev/null 2>&1 || need+=(graphviz)
if [ "$WHAT" = test ]; then
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
fi
if ((${#need[@]})); then
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
    echo "setup: installing ${need[*]} with apt-get"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: ${need[*]} not found and not installable here; graphs print as text without dot"
    echo "       (macOS: brew install graphviz; Debian/Ubuntu: sudo apt-get install ${need[*]})"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  step "[2/5] a virtual environment in .venv (with $("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv .venv
else
  step "[2/5] the virtual environment in .venv is there"
fi
.venv/bin/python -m pip install -q --upgrade pip
step "[3/5] PyTorch ($TORCH_SPEC), the largest download: pip shows its progress"
# shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (--index-url ...)
.venv/bin/python -m pip install $TORCH_SPEC
step "[4/5] dpteach and its [$EXTRAS] extras (JupyterLab, ipywidgets, ...)"
.venv/bin/python -m pip install -e ".[$EXTRAS]"
step "[5/5] the python3 kernel of .venv for Jupyter"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
echo "setup ($WHAT): done ($(.venv/bin/python -c 'import torch, dpteach; print("torch", torch.__version__, "| dpteach", dpteach.__version__)'))"
