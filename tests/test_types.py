"""The type checker over kvbench's packages, as installed (``kvbench.harness`` …).

In a clone the packages are folders at the top (harness/, runners/ …) that install under the
``kvbench`` namespace; an editable install maps them with an import hook mypy cannot follow, so
the check builds the same tree from links and runs mypy on it, with the settings in
pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.plain

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "workloads", "runners", "reports", "app", "suites")

pytest.importorskip("mypy", reason='mypy comes with the test extra: pip install -e ".[test]"')


def test_mypy_is_clean(tmp_path: Path) -> None:
    tree = tmp_path / "kvbench"
    tree.mkdir()
    for pkg in PACKAGES:
        (tree / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    targets = [arg for pkg in PACKAGES[:-1] for arg in ("-p", f"kvbench.{pkg}")]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            *targets,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
