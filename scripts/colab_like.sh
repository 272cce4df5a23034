#!/usr/bin/env bash
# Build .venv-colab: a Colab-like Python environment for testing dpteach's widgets under ipywidgets 7.
#
# Google Colab pins ipywidgets 7.7.1, IPython 7.34.0, ipykernel 6.17.1 and tornado 6.5.1
# (googlecolab/colabtools setup.py; see /work/shared/research/ecosystem.md §2). The widgets must work
# there as well as under ipywidgets 8 in JupyterLab 4, so tests/graph/test_widgets.py runs itself again
# inside this environment (test_widgets_under_ipywidgets_7).
#
# Idempotent: when .venv-colab exists and was built with the same pins, it does nothing.
#   scripts/colab_like.sh            build if needed; prints the environment's python
#   PYTHON=python3.13 scripts/...    another interpreter (Colab runs 3.13; CI has 3.11)
#   DPTEACH_TORCH_FROM=.venv/bin/python scripts/...   link that python's torch instead of pip's (the tests)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv-colab
# torch first, pinned: the CPU wheel on this machine's disk; a bare `torch` pulls a multi-GB CUDA build
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PINS="ipython==7.34.0 ipykernel==6.17.1 ipywidgets==7.7.1 tornado==6.5.1"
REST="graphviz matplotlib tqdm numpy pytest pytest-timeout"
STAMP="$VENV/.dpteach-colab-pins"
WANT="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') $TORCH_SPEC $PINS $REST"

LOCK="${TMPDIR:-/tmp}/dpteach-colab-$(printf '%s' "$PWD" | cksum | cut -d' ' -f1).lock"
exec 9>"$LOCK"  # two test runs at once build it once
flock 9

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "colab_like: $VENV is up to date ($(cat "$STAMP"))"
  echo "$PWD/$VENV/bin/python"
  exit 0
fi

# --no-compile: pip would byte-compile all of torch's 2,000-odd .py files, which costs more than
# unpacking it; Python compiles a module when it is first imported.
echo "colab_like: building $VENV with $PYTHON"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-compile --upgrade pip
if [ -n "${DPTEACH_TORCH_FROM:-}" ]; then  # the tests: that python's torch, linked (scripts/link_torch.py)
  "$DPTEACH_TORCH_FROM" scripts/link_torch.py "$VENV/bin/python"
else
  # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (--index-url ...), as in CI
  "$VENV/bin/python" -m pip install -q --no-compile $TORCH_SPEC
fi
# shellcheck disable=SC2086  # the pins are separate words on purpose
"$VENV/bin/python" -m pip install -q --no-compile $PINS $REST
"$VENV/bin/python" -m pip install -q --no-compile --no-deps -e .
"$VENV/bin/python" - <<'EOF'
import IPython, ipykernel, ipywidgets, torch
assert ipywidgets.__version__ == "7.7.1", ipywidgets.__version__  # pip resolved something else: stop here
print(f"colab_like: ipywidgets {ipywidgets.__version__}, IPython {IPython.__version__}, "
      f"ipykernel {ipykernel.__version__}, torch {torch.__version__}")
EOF
echo "$WANT" > "$STAMP"
echo "$PWD/$VENV/bin/python"
