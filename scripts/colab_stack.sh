#!/usr/bin/env bash
# `make colab-stack`: the library tests and every chapter in an environment built like Google Colab's.
#
# Colab (googlecolab/backend-info, 2026-08; /work/shared/research/ecosystem.md §2) runs Python 3.13 with
# torch 2.11.0, ipywidgets 7.7.1, IPython 7.34.0, ipykernel 6.17.1, tornado 6.5.1, numpy 2.0.2,
# matplotlib 3.10.0, graphviz 0.21, tqdm 4.67. This builds .venv-colab-stack with those Python packages
# pinned (COLAB_PINS) and then:
#   1. the library's tests (no browser, no notebook runs: those need ipywidgets 8's JupyterLab),
#   2. every chapter, executed headless in that environment's kernel (copies in artifacts/colab-stack/),
#   3. on Colab's Python (3.13, when an interpreter is here): every file byte-compiles, and the set-up cell
#      runs its Colab branch against a stand-in google.colab and a stand-in pip.
# torch: Colab's 2.11.0 CPU wheel comes from download.pytorch.org; where that index cannot be reached
# (CI here), the torch spec falls back to the CPU wheel at hand (torch 2.13.0), and the Python is then the
# one that wheel is built for. The run says which it used. Times each step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=.venv-colab-stack
OUT=artifacts/colab-stack
COLAB_PINS=${COLAB_PINS:-"ipython==7.34.0 ipykernel==6.17.1 ipywidgets==7.7.1 tornado==6.5.1 numpy==2.0.2 matplotlib==3.10.0 graphviz==0.21 tqdm==4.67.1"}
TEST_DEPS="pytest pytest-timeout hypothesis nbclient nbformat pyyaml packaging ninja"
# Colab's Python: python3.13 on PATH, or pyenv's (whose shim may refuse when 3.13 is not selected)
if [ -z "${PY313:-}" ]; then
  for candidate in python3.13 "$(pyenv root 2>/dev/null)"/versions/3.13*/bin/python3.13; do
    if "$candidate" -c "" >/dev/null 2>&1; then PY313=$(command -v "$candidate"); break; fi
  done
fi
PY313=${PY313:-}
start=$(date +%s)
step() { echo "colab-stack [$(( $(date +%s) - start )) s] $*"; }

# torch 2.11 (Colab's) if its CPU wheel can be had, else the pinned CPU wheel CI uses.
# COLAB_PYTHON and COLAB_TORCH (a pip spec, options allowed) override the choice.
PYTHON=${COLAB_PYTHON:-}
TORCH_SPEC=${COLAB_TORCH:-}
if [ -z "$TORCH_SPEC" ]; then
  if [ -n "$PY313" ] && timeout 60 "$PY313" -m pip download -q --no-deps -d "$(mktemp -d)" torch==2.11.0 \
       --index-url https://download.pytorch.org/whl/cpu --only-binary=:all: >/dev/null 2>&1; then
    TORCH_SPEC="torch==2.11.0 --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple"
    PYTHON=${PYTHON:-$PY313}
  else
    step "download.pytorch.org/whl/cpu is out of reach: torch 2.11.0+cpu cannot be had; using torch==2.13.0 (CPU wheel on disk)"
    TORCH_SPEC="torch==2.13.0"
    PYTHON=${PYTHON:-$(command -v python3.11 || echo python3)}
  fi
fi
PYTHON=${PYTHON:-python3}

step "building $VENV with $("$PYTHON" --version), $TORCH_SPEC, $COLAB_PINS"
rm -rf "$VENV" "$OUT"
"$PYTHON" -m venv "$VENV"
P="$VENV/bin/python"
"$P" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
# shellcheck disable=SC2086
"$P" -m pip install -q $TORCH_SPEC 2>&1 | grep -v "is ignored: it is neither" || true
# shellcheck disable=SC2086
"$P" -m pip install -q $COLAB_PINS $TEST_DEPS 2>&1 | grep -v "is ignored: it is neither" || true
"$P" -m pip install -q --no-deps . 2>&1 | grep -v "is ignored: it is neither" || true   # not editable: as on Colab
rm -rf build dpteach.egg-info
"$P" -m ipykernel install --sys-prefix --name python3 >/dev/null
"$P" - <<'PY'
import importlib.metadata as md, sys
import IPython, ipykernel, ipywidgets, numpy, torch
assert ipywidgets.__version__ == "7.7.1" and IPython.__version__ == "7.34.0", "pip resolved something else"
print(f"colab-stack: Python {sys.version.split()[0]}, torch {torch.__version__}, ipywidgets {ipywidgets.__version__}, "
      f"IPython {IPython.__version__}, ipykernel {ipykernel.__version__}, numpy {numpy.__version__}, "
      f"matplotlib {md.version('matplotlib')}, tqdm {md.version('tqdm')}, dpteach {md.version('dpteach')}")
PY

step "library tests"
mkdir -p "$OUT"
# pytest's own entry point (not python -m pytest) keeps ./ off sys.path: the installed dpteach is tested
env -u PYTHONPATH TQDM_DISABLE=1 MPLBACKEND=Agg "$VENV/bin/pytest" tests -q -p no:cacheprovider \
  -m "not browser and not notebook and not slow and not cuda" -k "not under_ipywidgets_7 and not colab_like_kernel" \
  --ignore tests/release/test_browser.py --junitxml "$OUT/tests.xml" 2>&1 | tail -n 25
grep -q 'errors="0" failures="0"' "$OUT/tests.xml"

step "chapters in the Colab-like kernel"
env -u PYTHONPATH TQDM_DISABLE=1 "$P" "$ROOT/scripts/run_notebook.py" notebooks/*.ipynb notebooks/solutions/*.ipynb \
  --save "$OUT/notebooks"

if [ -n "$PY313" ]; then
  step "Colab's Python: $("$PY313" --version)"
  "$PY313" -m compileall -q -x '/\.' dpteach tests scripts >/dev/null && echo "colab-stack: every file byte-compiles under $("$PY313" --version)"
  "$PY313" - <<'PY'
import importlib.util, os, stat, subprocess, sys, tempfile, types
spec = importlib.util.spec_from_file_location("course", "dpteach/_course.py")
course = importlib.util.module_from_spec(spec); spec.loader.exec_module(course)
calls = []
colab = types.ModuleType("google.colab"); colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append(1))
sys.modules.update({"google": types.ModuleType("google"), "google.colab": colab})
for ok in (True, False):
    pip = os.path.join(tempfile.mkdtemp(), "python")
    with open(pip, "w") as f:
        f.write("#!/bin/sh\necho stand-in pip: $@\n" + ("exit 0\n" if ok else "echo ERROR: stand-in failure >&2; exit 1\n"))
    os.chmod(pip, 0o755); sys.executable = pip
    try:
        exec(course.SETUP_CELL, {})
        assert ok and calls == [1]
    except RuntimeError as err:
        assert not ok and "run this cell again" in str(err)
print(f"colab-stack: the set-up cell's Colab branch works under Python {sys.version.split()[0]} (pip succeeding and failing)")
PY
fi
step "done"
