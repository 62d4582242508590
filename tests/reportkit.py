"""Hand-made records for the report tests: small runs tables whose answers are known by hand.

``run(...)`` builds one runs row (every schema column present, the rest null);
``write_records`` writes rows, steps and requests as real partitions with
``harness.records.store.write_partition``, so the reports read exactly what ``kvbench run`` writes.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from kvbench.harness.records import store
from kvbench.harness.records.schema import REQUESTS, RUNS, STEPS

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
BYTES_PER_TOKEN = 819_200  # opt-13b, fp16
SCHED = {
    "clock": "steps",
    "gpu": "A100-40GB",
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 256,
    "max_stall_steps": 10000,
    "preemption": "recompute",
}


def workload(wid: str, rate: float | None = None, prompt_len: int = 100) -> dict[str, Any]:
    return {
        "workload_id": wid,
        "rate": rate,
        "spec": {
            "source": "fixed",
            "prompt_len": prompt_len,
            "output_len": 100,
            "num_requests": 10,
            "arrival": "batch" if rate is None else "poisson",
            "rate": rate,
            "seed": 0,
        },
    }


def run(
    runner: str,
    policy: str,
    block_size: int = 16,
    wl: dict[str, Any] | None = None,
    *,
    budget_bytes: int = GIB,
    kv_dtype: str = "fp16",
    model: str = "opt-13b",
    repeat: int = 0,
    status: str = "ok",
    error: str | None = None,
    suite: str = "golden",
    **metrics: Any,
) -> dict[str, Any]:
    """One runs row; contiguous policies get block size 1 as the suite loader gives them."""
    wl = wl or workload("w1111111aaaaaaaa")
    if policy.startswith("contiguous-"):
        block_size = 1
    spec = {
        "runner": runner,
        "policy": policy,
        "block_size": block_size,
        "repeat": repeat,
        "suite": suite,
        "device": "auto",
        "page_bytes": 2097152,
        "memory": {"kv_budget_bytes": budget_bytes, "max_model_len": 2048},
        "model": {"preset": model, "config": None, "kv_dtype": kv_dtype},
        "scheduler": SCHED,
        "workload": wl["spec"],
    }
    row: dict[str, Any] = {name: None for name in RUNS.names}
    row.update(
        suite=suite,
        runner=runner,
        policy=policy,
        block_size=block_size,
        kv_dtype=kv_dtype,
        kv_bytes_per_token=BYTES_PER_TOKEN,
        budget_bytes=budget_bytes,
        budget_positions=budget_bytes // BYTES_PER_TOKEN,
        max_model_len=2048,
        model=model,
        workload_id=wl["workload_id"],
        workload_source="fixed",
        arrival=wl["spec"]["arrival"],
        rate=wl["rate"],
        num_requests=10,
        dropped_requests=0,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        clock="steps",
        repeat=repeat,
        status=status,
        error=error,
        git_sha="0123456789abcdef",
        git_dirty=False,
        host="testhost",
        python_version="3.11.7",
        kvbench_version="0.1.0",
        device="cpu",
        started_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
        spec_json=json.dumps(spec, sort_keys=True),
    )
    if status == "ok":
        row.update(
            token_states_frac=0.5,
            reservation_frac=0.1,
            internal_frag_frac=0.1,
            external_frag_frac=0.05,
            free_frac=0.25,
            preemptions=0,
            steps=3,
            wall_s=0.01,
        )
    row.update(metrics)
    row["run_id"] = (
        f"{runner}-{policy}-{block_size}-{wl['workload_id'][:4]}-{kv_dtype}-{budget_bytes}-{model}-r{repeat}"
    )
    return row


def steps_for(row: dict[str, Any], running: Iterable[int]) -> pd.DataFrame:
    """A step table: ``running`` requests each step, each holding 10 used + 6 reserved positions."""
    rs = list(running)
    n = len(rs)
    used = [10 * r for r in rs]
    reserved = [6 * r for r in rs]
    budget = int(row["budget_positions"])
    return pd.DataFrame(
        {
            "step": range(n),
            "t_s": [float(i) for i in range(n)],
            "dt_s": [1.0] * n,
            "running": rs,
            "waiting": [0] * n,
            "admitted": [0] * n,
            "finished": [0] * n,
            "preempted": [0] * n,
            "scheduled_tokens": rs,
            "allocated_blocks": rs,
            "allocated_positions": [u + v for u, v in zip(used, reserved)],
            "used_positions": used,
            "reserved_positions": reserved,
            "internal_frag_positions": [0] * n,
            "external_frag_positions": [0] * n,
            "free_positions": [budget - u - v for u, v in zip(used, reserved)],
            "evicted_blocks": [0] * n,
            "prefix_hit_tokens": [0] * n,
            "recomputed_hit_tokens": [0] * n,
            "cached_free_blocks": [0] * n,
            "kv_bytes_allocated": [None] * n,
            "step_wall_s": [None] * n,
            "scheduled_seqs": [None] * n,
            "context_tokens": [None] * n,
            "attention_pairs": [None] * n,
            # no CPU tier
            "cpu_blocks": [None] * n,
            "stored_blocks": [None] * n,
            "loaded_blocks": [None] * n,
            "load_waiting": [None] * n,
        }
    )


def requests_for(lengths: Iterable[tuple[int, int]]) -> pd.DataFrame:
    pairs = list(lengths)
    n = len(pairs)
    return pd.DataFrame(
        {
            "request_id": range(n),
            "sample": [0] * n,
            "prompt_len": [p for p, _ in pairs],
            "output_len": [o for _, o in pairs],
            "arrival_s": [0.0] * n,
            "first_scheduled_s": [0.0] * n,
            "first_token_s": [1.0] * n,
            "finished_s": [2.0] * n,
            "num_preemptions": [0] * n,
            "peak_allocated_positions": [p + o for p, o in pairs],
            "prefix_hit_tokens": [0] * n,
            "recomputed_hit_tokens": [0] * n,
            "status": ["finished"] * n,
            "kv_first_block": [None] * n,
            "kv_block_runs": [None] * n,
            "session_id": [None] * n,
            "turn": [None] * n,
            "sent_s": [None] * n,
            "token_times_s": [None] * n,
            "token_counts": [None] * n,
            "cpu_hit_tokens": [None] * n,  # no CPU tier
        }
    )


def write_records(
    out: Path,
    rows: list[dict[str, Any]],
    steps: dict[str, pd.DataFrame] | None = None,
    requests: dict[str, pd.DataFrame] | None = None,
) -> Path:
    """Write each row's partitions (steps and requests empty unless given), the runs row last."""
    steps, requests = steps or {}, requests or {}
    out.mkdir(parents=True, exist_ok=True)  # as `kvbench run` does before any partition
    for row in rows:
        rid = row["run_id"]
        st = steps.get(rid, pd.DataFrame({n: [] for n in STEPS.names}))
        rq = requests.get(rid, pd.DataFrame({n: pd.Series([], dtype=object) for n in REQUESTS.names}))
        store.write_partition(out, "steps", rid, pa.Table.from_pandas(st, schema=STEPS, preserve_index=False))
        store.write_partition(out, "requests", rid, pa.Table.from_pandas(rq, schema=REQUESTS, preserve_index=False))
        data = {k: v for k, v in row.items() if k != "run_id"}
        store.write_partition(out, "runs", rid, pa.Table.from_pylist([data], schema=RUNS))
    return out


def runs_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as ``read_table`` would return them (for the pure functions)."""
    from kvbench.reports.labels import with_keys

    return with_keys(pd.DataFrame(rows))


# -- the golden record set -------------------------------------------------------

W1 = workload("w1111111aaaaaaaa")
W2 = workload("w2222222bbbbbbbb", prompt_len=50)
SWEEP = [workload("w3333333cccccccc", rate=1.0), workload("w4444444dddddddd", rate=4.0)]


def golden_rows() -> list[dict[str, Any]]:
    """Two comparison groups by hand, plus a rate sweep at two block sizes.

    Group W1: paged doubles sim's mean running (4 vs 2) and triples peak (6 vs 2); torch/paged is
    1.5× torch/contiguous-max in wall tokens/s, vllm/paged 2× torch/paged: naive 3×.
    Group W2: paged has 8× the mean running of contiguous-max; contiguous-pow2 failed.
    Across W1 and W2, sim/paged's mean running ratio has geometric mean √(2·8) = 4.
    """
    rows = [
        run(
            "sim",
            "contiguous-max",
            wl=W1,
            mean_running=2.0,
            peak_running=2,
            tokens_per_s=10.0,
            token_states_frac=0.1,
            reservation_frac=0.05,
            internal_frag_frac=0.7,
            external_frag_frac=0.1,
            free_frac=0.05,
        ),
        run(
            "sim",
            "paged",
            16,
            wl=W1,
            mean_running=4.0,
            peak_running=6,
            tokens_per_s=20.0,
            preemptions=3,
            token_states_frac=0.8,
            reservation_frac=0.02,
            internal_frag_frac=0.01,
            external_frag_frac=0.0,
            free_frac=0.17,
        ),
        run(
            "torch",
            "contiguous-max",
            wl=W1,
            mean_running=2.0,
            peak_running=2,
            tokens_per_s=100.0,
            wall_tokens_per_s=100.0,
        ),
        run(
            "torch",
            "paged",
            16,
            wl=W1,
            mean_running=4.0,
            peak_running=6,
            tokens_per_s=150.0,
            wall_tokens_per_s=150.0,
            preemptions=3,
        ),
        run(
            "vllm",
            "paged",
            16,
            wl=W1,
            mean_running=5.0,
            peak_running=6,
            tokens_per_s=300.0,
            wall_tokens_per_s=300.0,
            preemptions=1,
        ),
        run("sim", "contiguous-max", wl=W2, mean_running=1.0, peak_running=1, tokens_per_s=5.0),
        run("sim", "contiguous-pow2", wl=W2, status="failed", error="boom: a runner bug"),
        run("sim", "paged", 16, wl=W2, mean_running=8.0, peak_running=9, tokens_per_s=40.0, preemptions=2),
    ]
    for wl, scale in zip(SWEEP, (1, 2)):
        for bs, waste in ((8, 0.01), (16, 0.02)):
            rows.append(
                run(
                    "sim",
                    "paged",
                    bs,
                    wl=wl,
                    mean_running=3.0 * scale,
                    peak_running=4 * scale,
                    tokens_per_s=30.0 * scale,
                    preemptions=scale - 1,
                    reservation_frac=waste,
                    internal_frag_frac=waste / 2,
                    external_frag_frac=0.0,
                )
            )
        rows.append(run("sim", "contiguous-max", wl=wl, mean_running=1.0, peak_running=1, tokens_per_s=10.0 * scale))
    return rows


def write_golden(out: Path) -> Path:
    rows = golden_rows()
    w1_sim = [r for r in rows if r["workload_id"] == W1["workload_id"] and r["runner"] == "sim"]
    steps = {r["run_id"]: steps_for(r, [1, 2, 3, 2] if r["policy"] == "paged" else [1, 1, 1, 1]) for r in w1_sim}
    reqs = {r["run_id"]: requests_for([(20, 15), (100, 100), (8, 8)]) for r in w1_sim}
    return write_records(out, rows, steps, reqs)
