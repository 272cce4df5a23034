"""The suite's own rule: every check in tests/*.py can fail.

Two shapes are refused, by reading each test file with ``ast`` (nothing is imported or run):

* ``assert_x(...) and assert_y(...)`` as a statement. ``assert_close`` and friends return ``None``,
  so ``and`` stops after the first one and the second check never runs. Write two statements.
* a test function that asserts nothing. A test function counts as asserting when its body (nested
  functions and classes included, since the test calls them) holds at least one of:

  - an ``assert`` statement;
  - a call to ``pytest.raises``, ``pytest.warns``, ``pytest.deprecated_call`` or ``pytest.fail``;
  - a call to a function whose name starts with ``assert`` (``assert_close``, ``assert_allclose``,
    ``torch.testing.assert_close``, ``np.testing.assert_array_equal``, ...);
  - a call to a function of the same file, or of ``conftest.py``, that counts as asserting by
    this same rule (a helper such as ``check_chapter(...)``), followed through any depth.

  A test that means to assert "this runs without raising" still says so with an ``assert`` on
  what it ran (a result, a type, a length), so a reader sees what was checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import parse_source

TESTS = Path(__file__).resolve().parents[1]
FILES = sorted(TESTS.rglob("*.py"))
PYTEST_CHECKS = {"raises", "warns", "deprecated_call", "fail"}


def _name(func: ast.expr) -> str:
    """The called name's last part: ``assert_close`` for ``torch.testing.assert_close``."""
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_pytest_check(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "pytest"
        and func.attr in PYTEST_CHECKS
    )


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level functions and methods of module-level classes, by name."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.setdefault(item.name, item)
    return found


def asserts(fn: ast.AST, helpers: dict[str, ast.AST], seen: frozenset[str] = frozenset()) -> bool:
    """True when ``fn`` holds an assertion by the module docstring's rule."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if _is_pytest_check(node.func) or name.startswith("assert"):
                return True
            if name in helpers and name not in seen and asserts(helpers[name], helpers, seen | {name}):
                return True
    return False


def dead_conjunctions(tree: ast.Module) -> list[int]:
    """Lines of statements ``a(...) and b(...)`` / ``or`` whose operands call an ``assert*`` function."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.BoolOp):
            calls = [c for v in node.value.values for c in ast.walk(v) if isinstance(c, ast.Call)]
            if any(_name(c.func).startswith("assert") for c in calls):
                lines.append(node.lineno)
    return lines


def silent_tests(tree: ast.Module, helpers: dict[str, ast.AST]) -> list[str]:
    """Names of test functions (module level or in a Test* class) that assert nothing."""
    tests = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        tests += [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [t.name for t in tests if t.name.startswith("test") and not asserts(t, helpers)]


def _parse(path: Path) -> ast.Module:
    return parse_source(path.read_text(), filename=str(path))


CONFTEST = _functions(_parse(TESTS / "conftest.py"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_no_assertion_is_joined_by_and(path):
    lines = dead_conjunctions(_parse(path))
    assert not lines, (
        f"{path.name}:{lines}: `assert_x(...) and assert_y(...)` never runs the second check; split it"
    )


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if p.name.startswith("test_")],
    ids=[p.name for p in FILES if p.name.startswith("test_")],
)
def test_every_test_function_asserts_something(path):
    tree = _parse(path)
    silent = silent_tests(tree, {**CONFTEST, **_functions(tree)})
    assert not silent, (
        f"{path.name}: these tests assert nothing (see this file's docstring for the rule): {silent}"
    )


def test_the_rule_catches_what_it_is_meant_to():
    # the checker itself, on snippets: each bad shape is caught, each good one passes
    bad = parse_source("def test_a():\n    assert_close(a, b) and assert_close(c, d)\n")
    assert dead_conjunctions(bad) == [2]
    assert dead_conjunctions(parse_source("def test_a():\n    x = f() and g()\n    assert x\n")) == []
    silent = parse_source(
        "def test_a():\n    f()\n\ndef test_b():\n    check()\n\ndef check():\n    assert 1\n"
    )
    assert silent_tests(silent, _functions(silent)) == ["test_a"]  # test_b asserts through its helper
    ok = parse_source(
        "import pytest\ndef test_c():\n    with pytest.raises(ValueError):\n        f()\n"
        "def test_d():\n    torch.testing.assert_close(a, b)\n"
    )
    assert silent_tests(ok, _functions(ok)) == []
    loop = parse_source("def test_e():\n    h()\n\ndef h():\n    h()\n")
    assert silent_tests(loop, _functions(loop)) == ["test_e"]  # a recursive helper that never asserts


def test_a_false_recursion_depth_mismatch_is_parsed_again(monkeypatch):
    real, calls = ast.parse, []

    def flaky(source, filename="<unknown>"):
        calls.append(filename)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=141, after=192)")
        return real(source, filename=filename)

    monkeypatch.setattr(ast, "parse", flaky)
    assert isinstance(parse_source("x = 1\n"), ast.Module)
    assert len(calls) == 2
    monkeypatch.setattr(ast, "parse", lambda *a, **k: (_ for _ in ()).throw(SystemError("other")))
    with pytest.raises(SystemError, match="other"):
        parse_source("x = 1\n")
