"""The linter and the formatter over all the code (settings in pyproject.toml, ``[tool.ruff]``).

Run by the README's test command, so CI holds them: ``ruff check`` finds nothing and
``ruff format --check`` would change nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason='ruff comes with the test extra: pip install -e ".[test]"'
)


@pytest.mark.parametrize("command", [["check", "--no-cache"], ["format", "--check", "--no-cache"]])
def test_ruff(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
