#!/usr/bin/env bash
# Set up dpteach on a fresh machine: what `make lab` (scripts/setup.sh lab) and `make test`
# (scripts/setup.sh test) run first.
#  1. system packages: graphviz (the `dot` program), and for `test` chromium (browser tests), when
#     missing and this user may install them (root or sudo on Debian/Ubuntu); otherwise one line on how to.
#     Debian and Ubuntu ship venv's pip installer (ensurepip) in a package of its own, pythonX.Y-venv:
#     without it `python3 -m venv` fails, so it is installed here too, or set-up stops and says how to.
#  2. .venv: PyTorch 2.13.0 (TORCH_SPEC; on Linux without an NVIDIA GPU the CPU build, from PyTorch's
#     CPU index), then dpteach with the `lab` extra (JupyterLab, ipywidgets 8, ninja), and for `test`
#     also the `test`, `e2e` and `book` extras; for `test`, .venv-colab too (scripts/colab_like.sh:
#     ipywidgets 7, for tests/graph/test_widgets.py), when it is missing or out of date.
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
command -v "$PYTHON" >/dev/null 2>&1 || { echo "setup: $PYTHON not found: install Python 3.10+, or pass PYTHON=/path/to/python3" >&2; exit 1; }
# The release CI uses, pinned. On Linux, PyPI's torch is a CUDA build that pulls several GB of CUDA
# libraries, so a Linux machine without an NVIDIA GPU gets the CPU build from PyTorch's own index
# (PyPI stays as the extra index for torch's dependencies) when that index answers within 5 s; a machine
# that reaches only a package registry or a local mirror gets the plain pin. Elsewhere PyPI's torch
# is the one to have: CUDA with an NVIDIA GPU on Linux, CPU (and MPS) on macOS.
# Set TORCH_SPEC to choose another build, e.g. TORCH_SPEC="torch==2.13.0" for PyPI's on any machine.
CPU_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple"
has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; }
reaches_cpu_index() { "$PYTHON" -c "import urllib.request as u; u.urlopen('https://download.pytorch.org/whl/cpu/', timeout=5)" >/dev/null 2>&1; }
if [ -n "${TORCH_SPEC:-}" ]; then
  torch_why="as TORCH_SPEC says"
elif [ "$(uname -s)" = Linux ] && ! has_nvidia_gpu && reaches_cpu_index; then
  TORCH_SPEC=$CPU_TORCH; torch_why="the CPU build, as no NVIDIA GPU was found; TORCH_SPEC picks another"
elif [ "$(uname -s)" = Linux ] && ! has_nvidia_gpu; then
  TORCH_SPEC="torch==2.13.0"
  torch_why="PyPI's build, as download.pytorch.org did not answer in 5 s (on Linux that is the CUDA build, several GB, unless a mirror serves the CPU one; TORCH_SPEC picks another)"
else
  TORCH_SPEC="torch==2.13.0"; torch_why="PyPI's build; TORCH_SPEC picks another"
fi

step() { echo "setup ($WHAT) $1"; }

if [ "$WHAT" = test ]; then step "[1/5] system packages: graphviz (dot) and chromium"
else step "[1/5] system packages: graphviz (dot)"; fi
need=()
command -v dot >/dev/null 2>&1 || need+=(graphviz)
if [ "$WHAT" = test ]; then
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
fi
# A .venv without pip is what a failed `python3 -m venv` leaves behind: it is made again below.
venv_ok() { [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; }
venv_pkg=""  # Debian/Ubuntu's pythonX.Y-venv, when venv is due and this Python has no ensurepip
if ! venv_ok && ! "$PYTHON" -c "import ensurepip" >/dev/null 2>&1; then
  venv_pkg="python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
  need+=("$venv_pkg")
fi
if ((${#need[@]})); then
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
    echo "setup: installing ${need[*]} with apt-get"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  elif [ -n "$venv_pkg" ]; then
    echo "setup: $PYTHON cannot make a virtual environment: its venv installer (ensurepip) is missing." >&2
    echo "       On Debian/Ubuntu: sudo apt-get install $venv_pkg, then run this command again." >&2
    echo "       Elsewhere: install a Python 3.10+ that has it, and pass it as PYTHON=/path/to/python3." >&2
    exit 1
  else
    echo "setup: ${need[*]} not found and not installable here; graphs print as text without dot"
    echo "       (macOS: brew install graphviz; Debian/Ubuntu: sudo apt-get install ${need[*]})"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  step "[2/5] a virtual environment in .venv (with $("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv .venv
elif ! venv_ok; then
  step "[2/5] .venv has no pip (an earlier venv that failed): made again (with $("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv --clear .venv
else
  step "[2/5] the virtual environment in .venv is there"
fi
.venv/bin/python -m pip install -q --upgrade pip
step "[3/5] PyTorch, $torch_why: pip install $TORCH_SPEC (the largest download; pip shows its progress)"
# shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (--index-url ...)
.venv/bin/python -m pip install $TORCH_SPEC
step "[4/5] dpteach and its [$EXTRAS] extras (JupyterLab, ipywidgets, ...)"
.venv/bin/python -m pip install -e ".[$EXTRAS]"
step "[5/5] the python3 kernel of .venv for Jupyter"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
if [ "$WHAT" = test ]; then
  # tests/graph/test_widgets.py runs itself again under ipywidgets 7 in .venv-colab; building it here
  # keeps the build out of the test run (the test still builds it when it is missing). The same
  # command as the test's, so the environment it finds is up to date; PYTHON is the script's own choice.
  echo "setup ($WHAT) and the Colab-like .venv-colab (ipywidgets 7) for the widget tests: scripts/colab_like.sh"
  env -u PYTHON DPTEACH_TORCH_FROM=.venv/bin/python scripts/colab_like.sh ||
    echo "setup: .venv-colab could not be built (offline?): test_widgets_under_ipywidgets_7 will try again, or skip"
fi
echo "setup ($WHAT): done ($(.venv/bin/python -c 'import torch, dpteach; print("torch", torch.__version__, "| dpteach", dpteach.__version__)'))"
