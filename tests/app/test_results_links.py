"""A symbolic link inside a results directory, into another results directory, at the folder of
every declared table (``schema.TABLES``), at ``workloads/`` and ``report/``, and at a ``run_id=``
partition of every table: ``kvbench run --rerun`` and every command that reads a results
directory refuse it in one line before anything is written or read, and the linked-to directory
stays byte for byte as it was. The guarded folders come from ``schema.TABLES``: a table added
there is guarded without an edit to ``safe_paths`` (the last test)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import schema
from kvbench.harness.records.safe_paths import OTHER_FOLDERS, check_records, check_results_layout, own_folders
from kvbench.harness.records.store import PART, read_table

from tests.conftest import EXAMPLE, assert_one_line_error, kvbench, plant_link, suite_file, tree

# gpt-oss-20b alternates sliding-window and full-attention layers: its runs write kv_groups/.
HYBRID = (
    EXAMPLE.replace('preset = "opt-13b"', 'preset = "gpt-oss-20b"')
    .replace('kv_dtype = "fp16"', 'kv_dtype = "bf16"')
    .replace('kv_budget = "12GiB"', 'kv_budget = "1GiB"')
    .replace("num_requests = 200", "num_requests = 8")
    .replace('"contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"', '"contiguous-max", "paged"')
)
FOLDERS = [*schema.TABLES, *OTHER_FOLDERS]
PARTITIONS = [f"{table}/run_id=*" for table in schema.TABLES]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded results directory holding partitions of every declared table: two sim runs of a
    hybrid model (runs, steps, requests, kv_groups) and, made by hand, a metrics partition per
    run (only the serve runner scrapes metrics; the guard does not look inside)."""
    root = tmp_path_factory.mktemp("hybrid")
    proc = kvbench("run", suite_file(root, HYBRID), "--out", root / "out", "--quiet")
    assert proc.returncode == 0, proc.stderr
    out = root / "out"
    for part in (out / "runs").glob("run_id=*"):
        folder = out / "metrics" / part.name
        folder.mkdir(parents=True)
        pq.write_table(schema.with_version(schema.METRICS).empty_table(), folder / PART)
    for table in schema.TABLES:
        assert list((out / table).glob(f"run_id=*/{PART}")), f"the fixture holds no {table} partition"
    return out


def linked_into_another(hybrid: Path, tmp: Path, what: str) -> tuple[Path, Path]:
    """Copies of ``hybrid`` at out and other, with ``what`` of out (a folder, or a partition:
    ``table/run_id=*``) replaced by a link to the same place in other. Other also holds an orphan
    partition (its first run's row removed), which a run into out must not clean through a link."""
    out, other = tmp / "out", tmp / "other"
    for dest in (out, other):
        shutil.copytree(hybrid, dest, symlinks=True)
    suite_file(tmp, HYBRID)
    plant_link(out, other, what)
    shutil.rmtree(sorted((other / "runs").glob("run_id=*"))[0])
    return out, other


def refused_and_untouched(tmp: Path, *argv: str | Path) -> None:
    before = tree(tmp)
    proc = kvbench(*argv, cwd=tmp, timeout=120)
    assert_one_line_error(proc, "symbolic link")
    assert proc.returncode == 2, proc.stderr
    assert tree(tmp) == before, "a refused command changed the tree (or the linked-to directory)"


def test_every_table_and_kvbench_folder_is_guarded() -> None:
    assert set(own_folders()) == {*schema.TABLES, "workloads", "report"}
    assert {"metrics", "kv_groups"} <= set(own_folders())


@pytest.mark.parametrize("what", FOLDERS + PARTITIONS)
def test_a_rerun_is_refused_and_writes_nothing_through_a_link(hybrid: Path, tmp_path: Path, what: str) -> None:
    out, _ = linked_into_another(hybrid, tmp_path, what)
    refused_and_untouched(tmp_path, "run", "suite.toml", "--out", out, "--rerun", "--quiet")


@pytest.mark.parametrize("what", FOLDERS + PARTITIONS)
def test_a_report_is_refused_and_reads_nothing_through_a_link(hybrid: Path, tmp_path: Path, what: str) -> None:
    out, _ = linked_into_another(hybrid, tmp_path, what)
    refused_and_untouched(tmp_path, "report", out)


@pytest.mark.parametrize("what", ["kv_groups", "metrics", "kv_groups/run_id=*", "metrics/run_id=*"])
@pytest.mark.parametrize("command", ["compare", "diverge", "export"])
def test_the_other_readers_refuse_a_link(hybrid: Path, tmp_path: Path, what: str, command: str) -> None:
    out, other = linked_into_another(hybrid, tmp_path, what)
    ids = sorted(p.name.split("=", 1)[1] for p in (out / "runs").glob("run_id=*"))
    argv = {
        "compare": ("compare", out, other),
        "diverge": ("diverge", out, *ids),
        "export": ("export", out, "--format", "vllm-bench", "--out", tmp_path / "x"),
    }[command]
    refused_and_untouched(tmp_path, *argv)


def test_without_the_link_the_same_commands_succeed(hybrid: Path, tmp_path: Path) -> None:
    # The refusals above are the links': the same directory, unlinked, reruns and reports.
    shutil.copytree(hybrid, tmp_path / "out", symlinks=True)
    suite_file(tmp_path, HYBRID)
    for argv in (("run", "suite.toml", "--out", "out", "--rerun", "--quiet", "--no-report"), ("report", "out")):
        proc = kvbench(*argv, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr


def test_a_table_added_to_the_schema_is_guarded_with_no_edit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(schema.TABLES, "added", pa.schema([("step", pa.int64())]))
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (elsewhere / "run_id=r").mkdir(parents=True)
    (out / "added").mkdir(parents=True)
    (out / "added" / "run_id=r").symlink_to(elsewhere / "run_id=r", target_is_directory=True)
    for check in (check_results_layout, check_records, lambda o: read_table(o, "added")):
        with pytest.raises(KvbenchError, match=r"added/run_id=r: is a symbolic link"):
            check(out)
    os.unlink(out / "added" / "run_id=r")
    os.rmdir(out / "added")
    (out / "added").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(KvbenchError, match=r"added: is a symbolic link"):
        check_results_layout(out)
