#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh needs on a bare GPU image with no network, into .whl/
# (git-ignored; it travels with the tree when the device tool is told `carry: [".whl"]`).
#
#   scripts/gpu_wheels.sh [DIR] [PYTHON_VERSION]     (defaults: .whl and 3.12, the GPU image's Python)
#
# The GPU image ('cuda', see the device tool's KINDS.md) already has torch, numpy, matplotlib, tqdm,
# pytest, pytest-timeout, hypothesis, pyyaml, psutil, packaging, python-dateutil, pygments, attrs and
# typing-extensions. It lacks what runs a notebook headless (nbclient, nbformat, ipykernel and their
# needs) and two of dpteach's own dependencies (graphviz, ipywidgets). The versions are those of the
# course's own environment, known to work with it. --no-deps: every need is named here, one version of
# each (two would stop the install); the check at the end lists any need left unmet.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PYVER=${2:-3.12}
PYTHON=python3
[ -x .venv/bin/python ] && PYTHON=.venv/bin/python  # any Python with pip and packaging; it only downloads
WHEELS=(
  nbclient==0.11.0 nbformat==5.11.1 jupyter_client==8.10.0 jupyter_core==5.9.1 traitlets==5.16.1
  fastjsonschema==2.22.3 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
  rpds-py==2026.9.1 platformdirs==4.14.9 pyzmq==27.3.0 tornado==6.6.1
  ipykernel==6.31.0 comm==0.2.3 debugpy==1.8.22 ipython==9.18.1 ipython-pygments-lexers==1.1.1
  jedi==0.20.1 parso==0.8.7 matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0
  prompt_toolkit==3.0.53 wcwidth==0.9.4 stack_data==0.6.3 executing==2.3.0 asttokens==3.0.2
  pure_eval==0.2.4 nest-asyncio==1.6.0
  graphviz==0.21 ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17
)
mkdir -p "$DIR"
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$p"); done
$PYTHON -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$DIR" "${WHEELS[@]}"
du -sh "$DIR"
# Every need of every wheel (for this Python on Linux) must be a wheel here or on the GPU image.
$PYTHON - "$DIR" "$PYVER" <<'PY'
import sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

folder, pyver = Path(sys.argv[1]), sys.argv[2]
image = {canonicalize_name(n) for n in """torch numpy matplotlib tqdm pytest pytest-timeout hypothesis pyyaml
psutil packaging python-dateutil pygments attrs typing-extensions six jinja2 markupsafe""".split()}
env = {"python_version": pyver, "python_full_version": pyver + ".0", "sys_platform": "linux",
       "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "platform_machine": "x86_64", "extra": ""}
have, needs = set(), {}
for wheel in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    name = canonicalize_name(wheel.name.split("-")[0])
    have.add(name)
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                needs.setdefault(canonicalize_name(req.name), set()).add(name)
missing = {n: by for n, by in needs.items() if n not in have | image}
print(f"{len(have)} wheels; needs left unmet: {missing or 'none'}")
sys.exit(1 if missing else 0)
PY
