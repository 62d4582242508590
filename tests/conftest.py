"""Shared test helpers: run a suite given as TOML text in-process, read its records."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.records import store
from kvbench.reports.divergence import DEFAULT_COLUMNS

ROOT = Path(__file__).resolve().parents[1]

# Every step column that sim, vLLM's scheduler and the engine record alike (the engine adds
# step_wall_s and kv_bytes_allocated): what the agreement tests compare step by step.
AGREEMENT_COLUMNS = DEFAULT_COLUMNS + (
    "t_s",
    "dt_s",
    "admitted",
    "finished",
    "scheduled_tokens",
    "allocated_positions",
    "used_positions",
    "reserved_positions",
    "internal_frag_positions",
    "external_frag_positions",
    "free_positions",
    "evicted_blocks",
    "prefix_hit_tokens",
    "recomputed_hit_tokens",
    "cached_free_blocks",
)
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")
DATA = ROOT / "tests" / "data"

# One workload, one scheduler, a grid of runners and policies: the suite the agreement tests
# (sim, vLLM's scheduler, the engine) build their cases from. ``one_workload_suite`` fills it.
ONE_WORKLOAD_SUITE = """
name = "{name}"
[model]
preset = "{preset}"
kv_dtype = "{kv_dtype}"
{model_extra}[memory]
kv_budget = "{budget}"
max_model_len = {max_model_len}
[workload]
{workload}
[scheduler]
max_num_seqs = {max_num_seqs}
max_num_batched_tokens = {max_num_batched_tokens}
preemption = "{preemption}"
clock = "{clock}"
[grid]
runner = {runners}
policy = {policies}
block_size = [{block_size}]
arena = "{arena}"
{unit}"""


def one_workload_suite(**settings: object) -> str:
    """``ONE_WORKLOAD_SUITE`` with ``settings`` over its defaults: ``policy`` (one) or
    ``policies`` (a TOML list); contiguous cells reserve whole blocks, as vLLM's runners do,
    unless ``contiguous_unit`` says otherwise (None: each runner's default)."""
    filled: dict[str, object] = dict(
        name="t",
        kv_dtype="fp16",
        preemption="recompute",
        clock="steps",
        policy="paged",
        arena="first-fit",
        contiguous_unit="block",
        model_extra="",
    )
    filled.update(settings)
    filled.setdefault("policies", f'["{filled["policy"]}"]')
    unit = filled["contiguous_unit"]
    filled["unit"] = f'contiguous_unit = "{unit}"\n' if unit else ""
    return ONE_WORKLOAD_SUITE.format(**filled)


def run_suite_text(text: str, out: Path) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    """Run every cell of a suite; return its run rows and each run's steps, keyed by run id."""
    suite = parse_suite(text, str(out / "suite.toml"))
    cells = build_cells(suite, out, lambda msg: None)
    rows = [run_cell(c) for c in cells]
    steps = {
        r["run_id"]: store.read_table(out, "steps", {r["run_id"]}).sort_values("step").reset_index(drop=True)
        for r in rows
    }
    return rows, steps


def kvbench(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (``cwd`` defaults to the repository; ``env`` adds to the environment)."""
    return subprocess.run(
        [sys.executable, "-m", "kvbench.app.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=dict(os.environ, **(env or {})),
        timeout=timeout,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (never following links): its type, and for a regular file its
    size and content digest, for a link its target."""
    listing: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                listing[rel] = ("file", st.st_size, hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode & 0o777)
            elif stat.S_ISLNK(st.st_mode):
                listing[rel] = ("link", os.readlink(path))
            else:
                listing[rel] = (stat.S_IFMT(st.st_mode),)
    return listing


def device_node(path: Path) -> bool:
    """A character device like /dev/null, made in the test's own folder (root only)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return True
    except (PermissionError, OSError):
        return False


# -- --out FILE: only a new file or a regular file --------------------------------------------


def special(kind: str, path: Path, elsewhere: Path) -> None:
    """Put ``kind`` at ``path`` (a FIFO, a device node, a folder, a link; ``elsewhere``: what a link
    points at), where kvbench is to write or read a file."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if not device_node(path):
            pytest.skip("cannot make a device node here (needs root)")
    elif kind == "directory":
        path.mkdir()
        (path / "keep.txt").write_text("mine")
    elif kind == "link-to-file":
        elsewhere.write_text("the user's file")
        path.symlink_to(elsewhere)
    elif kind == "link-to-directory":
        elsewhere.mkdir()
        path.symlink_to(elsewhere, target_is_directory=True)
    elif kind == "dangling-link":
        path.symlink_to(elsewhere)
    else:
        raise AssertionError(kind)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "results"
