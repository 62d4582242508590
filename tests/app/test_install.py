"""What a plain install needs: every package folder mapped into the wheel, the suites shipped
as package data and found by name from any directory, the tables clock's files beside it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from kvbench.app.suite import default_suite_path, load_suite, shipped_suites
from kvbench.harness.errors import KvbenchError

pytestmark = pytest.mark.plain

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheel() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {folder: name for name, folder in tool["package-dir"].items()}
    assert set(tool["packages"]) == set(tool["package-dir"])
    folders = {
        str(p.parent.relative_to(ROOT))
        for top in ("harness", "workloads", "runners", "reports", "app", "suites")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert folders == set(mapped), "a package folder is missing from [tool.setuptools] (or mapped but gone)"
    for folder in folders:  # typed packages say so (PEP 561), the suites ship their TOML
        name = mapped[folder]
        data = tool["package-data"].get(name, [])
        if folder == "suites":
            assert "*.toml" in data
        elif "/" not in folder:
            assert "py.typed" in data and (ROOT / folder / "py.typed").exists()


def test_shipped_suites_load_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an empty directory: nothing to find but the package data
    assert default_suite_path().is_file()
    assert {"default", "paper-block-size", "paper-memory-waste"} <= set(shipped_suites())
    assert load_suite("default").name == "default"
    with pytest.raises(KvbenchError, match="no such suite file .*shipped suites: .*default"):
        load_suite("no-such-suite")


def test_the_tables_clocks_files_are_package_data() -> None:
    """Every file under the clock's tables folder is matched by its package data (the fitted
    operation terms among them), and the installed package reads them."""
    from kvbench.harness.clock.gpu_tables import FIT_GPUS, shipped_tables
    from kvbench.harness.clock.tables_clock import OP_TERMS_FILE, fitted_op_terms

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    clock = ROOT / "harness" / "clock"
    shipped = [p for p in (clock / "tables").rglob("*") if p.is_file()]
    assert shipped and all(
        any(p.relative_to(clock).match(g) for g in patterns["kvbench.harness.clock"]) for p in shipped
    )
    assert OP_TERMS_FILE.is_file() and fitted_op_terms()
    assert all(shipped_tables(folder).ops for folder in FIT_GPUS)
