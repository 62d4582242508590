"""Nights for ``kvbench history``, made from one real run's records.

``record`` runs a small suite for real (sim and the torch runner, contiguous-max and paged at two
block sizes: torch's wall-clock columns are timed, everything else is deterministic). ``make_nights``
copies its results directory into one folder a night, named as ``.ci/nightly`` names them, each
night's run rows rewritten from the real ones: its commit, and seeded changes — noise on every
timed column, a step, a drift, a code change of sim's deterministic columns — as ``Edit``s say.
The steps and requests partitions are the real ones (linked, not copied: no night changes them).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import kvbench, suite_toml

TIMED = ("wall_tokens_per_s", "mean_step_wall_s")  # torch's wall-clock columns (compare.is_timed)
START = datetime(2026, 11, 1, 2, 15, tzinfo=UTC)

SUITE = suite_toml(
    "history",
    model={"preset": "tiny", "kv_dtype": "fp32"},
    memory={"kv_budget": "64KiB", "max_model_len": 128},
    workload={
        "source": "uniform",
        "num_requests": 16,
        "prompt_min": 8,
        "prompt_max": 40,
        "output_min": 4,
        "output_max": 20,
        "arrival": "batch",
        "seed": 3,
    },
    grid={"runner": ["sim", "torch"], "policy": ["contiguous-max", "paged"], "block_size": [16, 32]},
)


def record(root: Path) -> Path:
    """One real run of ``SUITE``: its results directory."""
    suite = root / "history.toml"
    suite.write_text(SUITE, encoding="utf-8")
    done = kvbench("run", suite, "--out", root / "records", "--quiet")
    assert done.returncode == 0, done.stderr
    return root / "records"


Row = dict[str, object]


@dataclass(frozen=True)
class Edit:
    """Multiply ``metric`` of the rows ``where`` selects by ``factor(night)``."""

    where: Callable[[Row], bool]
    metric: str
    factor: Callable[[int], float]


def cell(runner: str, policy: str, block_size: int) -> Callable[[Row], bool]:
    return lambda r: r["runner"] == runner and r["policy"] == policy and r["block_size"] == block_size


def step(where: Callable[[Row], bool], metric: str, at: int, by: float) -> Edit:
    return Edit(where, metric, lambda night: by if night >= at else 1.0)


def blip(where: Callable[[Row], bool], metric: str, at: int, by: float) -> Edit:
    return Edit(where, metric, lambda night: by if night == at else 1.0)


def drift(where: Callable[[Row], bool], metric: str, per_night: float) -> Edit:
    return Edit(where, metric, lambda night: per_night**night)


@dataclass(frozen=True)
class Plan:
    nights: int = 30
    noise: float = 0.03  # each timed value times 1 + U(-noise, noise), drawn per night and run
    edits: Sequence[Edit] = field(default_factory=tuple)
    seed: int = 0


def night_names(plan: Plan) -> list[str]:
    rng = random.Random(plan.seed)
    return [
        f"{(START + timedelta(days=k)).strftime('%Y%m%dT%H%M%SZ')}-{rng.getrandbits(28):07x}"
        for k in range(plan.nights)
    ]


def make_nights(records: Path, root: Path, plan: Plan) -> list[Path]:
    """``plan.nights`` nights under ``root`` made from ``records``; their folders, oldest first."""
    rng = random.Random(plan.seed + 1)
    root.mkdir(parents=True, exist_ok=True)
    runs = sorted((records / "runs").glob("run_id=*/part-0.parquet"))
    tables = [pq.read_table(p) for p in runs]
    out = []
    for k, name in enumerate(night_names(plan)):
        night = root / name
        for table in ("steps", "requests"):
            shutil.copytree(records / table, night / table, copy_function=os.link)
        for path, table in zip(runs, tables):
            rows = table.to_pylist()
            for row in rows:
                row["git_sha"] = name.rsplit("-", 1)[1]
                row["started_at"] = START + timedelta(days=k)
                for metric in TIMED:
                    if row.get(metric) is not None:
                        row[metric] *= 1 + rng.uniform(-plan.noise, plan.noise)
                for edit in plan.edits:
                    if edit.where(row) and row.get(edit.metric) is not None:
                        row[edit.metric] *= edit.factor(k)
            dest = night / "runs" / path.parent.name / path.name
            dest.parent.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), dest)
        out.append(night)
    return out
