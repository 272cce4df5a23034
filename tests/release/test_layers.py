"""The layers hold: the library at the top of dpteach/ imports no wing, and the wings sit in folders."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import parse_source

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dpteach"
WINGS = ("graph", "widgets", "exercises", "course", "measure", "distributed", "cpp")
CORE = sorted(
    [p for p in PACKAGE.glob("*.py") if p.name != "__main__.py"]  # the tour at `python -m dpteach` is course
    + list((PACKAGE / "replicate").glob("*.py"))
)


def _imports(path: Path) -> list[str]:
    """Every module a file's import statements name, made absolute (``from .. import x`` -> ``dpteach.x``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]  # the package a relative import starts from (for __init__ too: its folder)
    names = []
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.append(module)
            names += [f"{module}.{a.name}" for a in node.names]
    return names


def test_the_top_holds_the_library_and_the_wings_are_folders():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {
        "__init__",
        "__main__",
        "_course",
        "_devices",
        "_lazy",
        "_reset",
        "comm",
        "functions",
        "scatter_gather",
        "parallel_apply",
        "data_parallel",
    }, top
    for wing in (*WINGS, "replicate"):
        assert (PACKAGE / wing / "__init__.py").exists(), wing


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_imports_no_wing(path):
    wings = tuple(f"dpteach.{w}" for w in WINGS)
    found = [m for m in _imports(path) if m.startswith(wings)]
    if path.name == "__init__.py" and path.parent == PACKAGE:
        # the package's __init__ loads wings lazily, on first attribute access; check it statically too
        assert found == ["dpteach.graph"], found  # `from . import graph` inside __getattr__, nothing else
        return
    assert found == [], f"{path.name} imports {found}"


def test_importing_the_library_loads_no_wing():
    code = "import sys, dpteach; print(sorted(m for m in sys.modules if m.startswith('dpteach.')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    out = done.stdout
    loaded = eval(out)  # a printed list of module names
    assert loaded, "dpteach loaded no submodule at all: the check would pass vacuously"
    assert not [m for m in loaded if m.split(".")[1] in WINGS], loaded


# Code a learner copies into a notebook cell starts as a learner's does, with `import dpteach`.
LEARNER_TEMPLATES = {"exercises/stubs.py", "exercises/solutions.py"}
INSIDE = sorted(
    p
    for p in PACKAGE.rglob("*.py")
    if p != PACKAGE / "__init__.py" and str(p.relative_to(PACKAGE)) not in LEARNER_TEMPLATES
)


def _is_submodule(name: str) -> bool:
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()


def _from_the_package(path: Path) -> list[str]:
    """The imports in ``path`` that go through ``dpteach`` itself (its __init__'s names), not a module."""
    depth = len(path.relative_to(PACKAGE).parts)  # dpteach/x.py: 1, so `from . import` names the package
    found = []
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "dpteach"]
        elif isinstance(node, ast.ImportFrom):
            absolute = not node.level and node.module == "dpteach"
            relative = node.level == depth and not node.module
            if absolute or relative:
                where = "." * node.level if relative else "dpteach"
                found += [f"from {where} import {a.name}" for a in node.names if not _is_submodule(a.name)]
    return found


@pytest.mark.parametrize("path", INSIDE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_inside_imports_from_the_package_itself(path):
    """``from dpteach import X`` (or ``from .. import X``) for a name the package re-exports hides which module
    defines X and runs dpteach/__init__ first; a submodule (``from .. import comm``) is a module, and fine."""
    found = _from_the_package(path)
    assert found == [], f"{path.relative_to(PACKAGE)}: {found}; import from the module that defines the name"
