#!/usr/bin/env bash
# The GPU check: one command, under 8 minutes on one H200, that runs the CUDA tests, the benchmark
# and chapter 08, and leaves every output in one folder.
#
#   scripts/gpu_check.sh [OUT]        (default: $OUT if set, else artifacts/gpu)
#
# It uses .venv's Python when there is one, else python3 (a GPU image's own PyTorch). Where nbclient
# is missing (a bare GPU image) and a folder .whl/ of wheels travelled with the tree, it installs them
# into /tmp/site first (see the device tool's README). Files written: env.txt, pytest.log, bench.json,
# bench.png, bench.log, 08_real_gpus.ipynb (executed), ch08.log.
#
# The wheels for a Python 3.12 GPU image without Jupyter (about 15 MB, kept out of git):
#   echo /.whl/ >> .git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl nbclient nbformat jupyter_client jupyter_core traitlets \
#     fastjsonschema jsonschema jsonschema-specifications referencing rpds-py platformdirs pyzmq tornado \
#     ipykernel comm debugpy ipython ipython-pygments-lexers jedi parso matplotlib-inline nest_asyncio \
#     pexpect ptyprocess prompt_toolkit wcwidth stack_data executing asttokens pure_eval decorator graphviz
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-artifacts/gpu}}
mkdir -p "$OUT"
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
unset MPLBACKEND  # the chapter's kernel draws its figures inline; the benchmark picks Agg itself
if ! $PY -c "import nbclient, ipykernel" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
start=$SECONDS
stamp() { echo "[gpu_check] $1 at +$((SECONDS - start)) s"; }

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: not found"
  $PY - <<'PY'
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| gpus", torch.cuda.device_count())
import dpteach
print("dpteach", dpteach.__version__, "| default_devices", dpteach.default_devices())
PY
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
stamp "env"

status=0
$PY -m pytest -q -p no:cacheprovider -o addopts="" --timeout=300 -rs \
  tests/test_cuda.py tests/test_comm.py tests/test_functions.py tests/test_replicate.py \
  tests/test_data_parallel.py tests/test_parity.py tests/test_scatter_gather.py tests/test_parallel_apply.py \
  tests/test_bench.py tests/test_story.py tests/test_ch04_python_way.py tests/test_ch05_buffers.py \
  tests/test_ch06_costs.py tests/test_ch07_double_backward.py tests/test_graph_model.py >"$OUT/pytest.log" 2>&1 || status=1
tail -n 15 "$OUT/pytest.log"
stamp "tests"

$PY -m dpteach.bench --out "$OUT" >"$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log"
stamp "bench"

$PY scripts/run_notebook.py notebooks/08_real_gpus.ipynb --save "$OUT" >"$OUT/ch08.log" 2>&1 || status=1
grep -v WARNING "$OUT/ch08.log"
$PY scripts/cell_times.py "$OUT/08_real_gpus.ipynb" 2>/dev/null | tail -n 12
stamp "chapter 08"
exit $status
