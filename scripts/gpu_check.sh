#!/usr/bin/env bash
# The GPU check: one command, 9 minutes at the very worst, that runs the CUDA tests (and the
# fake-CUDA dispatch tests), the benchmark and EVERY chapter, and leaves its outputs in 8 files.
#
#   scripts/gpu_check.sh [OUT]        (default: $OUT if set, else artifacts/gpu)
#
# Python: $GPU_CHECK_PYTHON if set, else .venv/bin/python where there is one, else python3 (a GPU
# image's own, which holds PyTorch). A bare GPU image has no Jupyter: where nbclient, nbformat,
# ipykernel, graphviz or ipywidgets is missing, the wheels in .whl/ ($GPU_CHECK_WHEELS) are installed
# into /tmp/site ($GPU_CHECK_SITE), no network needed, and put on PYTHONPATH (which the notebooks'
# kernels inherit).
#
# Preparing the wheels, here, once (17 MB for Python 3.12; .whl/ is git-ignored):
#   scripts/gpu_wheels.sh                  # into .whl/, for the GPU image's Python 3.12
# then on the device tool: carry [".whl"], command "scripts/gpu_check.sh" (it writes to $OUT).
# To try the whole script on a CPU machine: scripts/gpu_wheels.sh /tmp/whl 3.11 (this machine's
# Python), then GPU_CHECK_WHEELS=/tmp/whl GPU_CHECK_PYTHON=<a Python without Jupyter> scripts/gpu_check.sh
#
# Bounded, 9 minutes at the very worst (about 5 here on 2 CPU cores): each test 60 s (pytest-timeout),
# the tests 120 s, the benchmark 100 s, each notebook cell 90 s, no chapter starts after 200 s of
# chapters and no cell runs after 260 s, all chapters 280 s. Files in OUT: check.log (all
# output), env.txt, pytest.log, bench.json, bench.png, scaling.png, notebooks.log, notebooks.tar.gz
# (every executed chapter, also the ones that failed, with their outputs up to the failure).
# To ship a machine's scaling with the course (chapter 08 sets it beside the cost model, as ours), copy
# its bench.json unchanged to dpteach/measure/data/ours/<machine>.json: dpteach.measure.published.load reads it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-artifacts/gpu}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/check.log") 2>&1
PY=${GPU_CHECK_PYTHON:-python3}
[ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
WHEELS=${GPU_CHECK_WHEELS:-.whl}
SITE=${GPU_CHECK_SITE:-/tmp/site}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
export JUPYTER_PLATFORM_DIRS=1 JUPYTER_RUNTIME_DIR=/tmp/gpu-check-jupyter MPLCONFIGDIR=/tmp/gpu-check-mpl
unset MPLBACKEND  # the chapters' kernels draw their figures inline; the benchmark picks Agg itself
start=$SECONDS
stamp() { echo "[gpu_check] $1 at +$((SECONDS - start)) s"; }

NEEDED="nbclient, nbformat, ipykernel, graphviz, ipywidgets"
if ! $PY -c "import $NEEDED" 2>/dev/null; then
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
      && export PYTHONPATH="$PYTHONPATH:$SITE"
  else
    echo "[gpu_check] $NEEDED missing and no wheels in $WHEELS: run scripts/gpu_wheels.sh first and carry .whl"
  fi
fi
$PY -c "import $NEEDED" || echo "[gpu_check] still missing some of: $NEEDED (the chapters will fail)"
stamp "wheels"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: not found"
  command -v dot >/dev/null && dot -V 2>&1 || echo "dot (Graphviz): not found; the chapters draw graphs as text"
  $PY - <<'PY'
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| gpus", torch.cuda.device_count())
import dpteach
print("dpteach", dpteach.__version__, "from", dpteach.__file__, "| default_devices", dpteach.default_devices())
PY
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
stamp "env"

status=0
timeout -k 10 120 $PY -m pytest -q -p no:cacheprovider -o addopts="" --timeout=60 -rs \
  tests/core/test_cuda.py tests/core/test_fake_cuda.py tests/core/test_comm.py tests/core/test_functions.py tests/core/test_replicate.py \
  tests/core/test_data_parallel.py tests/core/test_parity.py tests/core/test_scatter_gather.py tests/core/test_parallel_apply.py \
  tests/core/test_bench.py tests/core/test_scaling.py tests/course/test_ch08_exercise_checks.py tests/course/test_ch08_slots.py tests/core/test_timer.py tests/course/test_story.py tests/course/test_ch04_python_way.py tests/course/test_ch05_buffers.py \
  tests/course/test_ch06_costs.py tests/course/test_ch07_double_backward.py tests/graph/test_graph_model.py >"$OUT/pytest.log" 2>&1 || status=1
tail -n 15 "$OUT/pytest.log"
stamp "tests"

timeout -k 10 100 $PY -m dpteach.measure.bench --out "$OUT" || status=1
stamp "bench"

EXECUTED=$(mktemp -d /tmp/gpu-check-notebooks.XXXX)
timeout -k 10 280 $PY scripts/gpu_notebooks.py "$EXECUTED" --cell-timeout 90 --budget 200 --deadline 260 >"$OUT/notebooks.log" 2>&1 || status=1
grep -v -e "WARNING | Kernel is running over TCP" "$OUT/notebooks.log" | cut -c1-400 | head -n 80
tar -czf "$OUT/notebooks.tar.gz" -C "$EXECUTED" . && rm -rf "$EXECUTED"  # saved even when a chapter failed
stamp "chapters"
ls -l "$OUT"
stamp "done (status $status)"
exit $status
