#!/usr/bin/env bash
# Set up dpteach on a fresh machine: what `make lab` and `make test` run first.
#  1. system packages: graphviz (the `dot` program) and chromium (browser tests), when missing and
#     this user may install them (root or sudo on Debian/Ubuntu); otherwise one line on how to.
#  2. .venv: PyTorch (TORCH_SPEC, CPU build 2.13.0 by default), then dpteach with its lab and test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# A bare `torch` or an open range can pull a multi-GB CUDA build; pin the release CI uses.
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

need=()
command -v dot >/dev/null 2>&1 || need+=(graphviz)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
if ((${#need[@]})); then
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
    echo "setup: installing ${need[*]} with apt-get"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: ${need[*]} not found and not installable here; graphs print as text without dot"
    echo "       (macOS: brew install graphviz; Debian/Ubuntu: sudo apt-get install graphviz chromium)"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[lab,test,e2e]"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
echo "setup: done ($(.venv/bin/python -c 'import torch, dpteach; print("torch", torch.__version__, "| dpteach", dpteach.__version__)'))"
