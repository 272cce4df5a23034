#!/usr/bin/env bash
# A learner's install, end to end: build the wheel from a clean copy of this checkout, install it into
# a fresh virtual environment that already has torch, then `import dpteach` and `python -m dpteach`
# there, from a folder with no dpteach source in it. `make wheel-check` runs it; so does a slow test.
#   scripts/check_wheel.sh [WORKDIR]     (default: a new temporary folder, removed afterwards)
#   DPTEACH_TORCH_FROM=.venv/bin/python scripts/check_wheel.sh   link that python's torch, not pip's
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && BUILD_PY=${BUILD_PY:-.venv/bin/python} || BUILD_PY=${BUILD_PY:-$PYTHON}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
WORK=${1:-$(mktemp -d)}
[ $# -ge 1 ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"

echo "check_wheel: clean copy of the checkout (tracked and new files, nothing git ignores)"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue   # deleted in the working tree, or a link (.venv)
  mkdir -p "$WORK/src/$(dirname "$f")"; cp -p "$f" "$WORK/src/$f"
done
echo "check_wheel: python -m build"
"$BUILD_PY" -m build --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
if "$BUILD_PY" -m twine --version >/dev/null 2>&1; then "$BUILD_PY" -m twine check --strict "$WORK"/dist/*; fi
WHEEL=$(ls "$WORK"/dist/dpteach-*.whl)
# --no-compile: pip would byte-compile all of torch's 2,000-odd .py files, which costs more than
# unpacking it; Python compiles a module when it is first imported.
echo "check_wheel: fresh venv with ${DPTEACH_TORCH_FROM:+the torch of }${DPTEACH_TORCH_FROM:-$TORCH_SPEC}, then $(basename "$WHEEL")"
"$PYTHON" -m venv "$WORK/venv"
if [ -n "${DPTEACH_TORCH_FROM:-}" ]; then  # the tests: that python's torch, linked (scripts/link_torch.py)
  "$DPTEACH_TORCH_FROM" scripts/link_torch.py "$WORK/venv/bin/python"
else
  # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (--index-url ...), as in CI
  "$WORK/venv/bin/python" -m pip install -q --no-compile $TORCH_SPEC
fi
"$WORK/venv/bin/python" -m pip install -q --no-compile "$WHEEL"
cd "$WORK"   # no dpteach/ source folder here: only the installed wheel can be imported
env -u PYTHONPATH "$WORK/venv/bin/python" -c "import dpteach, pathlib; p = pathlib.Path(dpteach.__file__); \
assert 'site-packages' in p.parts, p; assert (p.parent / 'py.typed').exists(); print('import dpteach', dpteach.__version__, 'from', p.parent)"
env -u PYTHONPATH "$WORK/venv/bin/python" -m dpteach > "$WORK/tour.txt"
grep -q "PR #20910" "$WORK/tour.txt" && tail -n 12 "$WORK/tour.txt"
echo "check_wheel: OK ($ROOT)"
