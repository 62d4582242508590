"""The linter and the formatter over all the code (settings in pyproject.toml, ``[tool.ruff]``),
and docstrings that say what and why (the docs hold the rest).

Run by the README's test command, so CI holds them: ``ruff check`` finds nothing,
``ruff format --check`` would change nothing, and no docstring is over 25 lines."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAX_DOCSTRING_LINES = 25
SOURCES = ("harness", "workloads", "runners", "reports", "app", "suites", "benchmarks", "tools", "tests")


def long_docstrings() -> dict[str, int]:
    """``path:name`` → line count of every module, class and function docstring over the limit."""
    found = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc is not None and len(doc.splitlines()) > MAX_DOCSTRING_LINES:
                        name = getattr(node, "name", "<module>")
                        found[f"{path.relative_to(ROOT).as_posix()}:{name}"] = len(doc.splitlines())
    return found


def test_no_docstring_is_over_25_lines() -> None:
    found = long_docstrings()
    assert found == {}, "cut these to what and why; docs/ hold the rest"


@pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason='ruff comes with the test extra: pip install -e ".[test]"'
)
@pytest.mark.parametrize("command", [["check", "--no-cache"], ["format", "--check", "--no-cache"]])
def test_ruff(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
