"""Running a cell on ``sim`` and ``vllm-sched`` and asserting they agree step for step: the
agreement tests' helpers (``tests/runners/test_agreement*.py``, ``test_vllm_engine_hybrid.py``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.records import store
from kvbench.reports.divergence import DEFAULT_COLUMNS, first_divergence

from tests.conftest import AGREEMENT_COLUMNS, DATA, one_workload_suite


def config(name: str) -> str:
    """A ``[model]`` line loading one of ``tests/data/models``' config.json files."""
    return f'config = "{DATA / "models" / name / "config.json"}"\n'


# Models of KV cache groups: (lines for [model], KV budget) per case, each budget preempting.
HYBRID_CASES: dict[str, tuple[str, str]] = {
    "gpt-oss-20b-hybrid-on": ("hybrid_kv = true\n", "64MiB"),
    "gpt-oss-20b-hybrid-off": ("hybrid_kv = false\n", "64MiB"),
    "gemma3-like-hybrid-on": (config("tiny-gemma3") + "hybrid_kv = true\n", "1MiB"),
    "gemma3-like-hybrid-off": (config("tiny-gemma3") + "hybrid_kv = false\n", "2MiB"),
    "mla-deepseek-v2-like": (config("tiny-dsv2"), "2500KiB"),
    "state-qwen3-next-like": (config("tiny-qwen3next"), "1200KiB"),
}


def run_hybrid_case(
    tmp_path: Path, case: str, workload: str, policy: str = "paged", budget: str | None = None, arena: str = "first-fit"
) -> tuple[dict, dict]:
    """``run_pair`` on one of ``HYBRID_CASES`` (``budget``: another KV budget than the case's)."""
    extra, case_budget = HYBRID_CASES[case]
    return run_pair(
        tmp_path,
        preset="gpt-oss-20b",  # a [model] config takes its place where the case gives one
        model_extra=extra,
        kv_dtype="bf16",
        workload=workload,
        budget=budget or case_budget,
        arena=arena,
        max_model_len=1024,
        max_num_seqs=64,
        max_num_batched_tokens=256,
        policy=policy,
    )


def run_pair(tmp_path: Path, **kw: object) -> tuple[dict, dict]:
    settings: dict[str, object] = dict(
        preset="llama-3-8b", max_model_len=2048, clock="steps", policy="paged", block_size=16, arena="first-fit"
    )
    settings.update(kw)
    text = one_workload_suite(name="agreement-test", runners='["sim", "vllm-sched"]', **settings)
    suite = parse_suite(text, str(tmp_path / "agreement-test.toml"))
    cells = build_cells(suite, tmp_path, lambda m: None)
    rows = {c.spec.runner: run_cell(c) for c in cells}
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
    return rows["sim"], rows["vllm-sched"]


def assert_agree(tmp_path: Path, sim: dict, vllm: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    a, b = sim["run_id"], vllm["run_id"]
    steps = store.read_table(tmp_path, "steps", {a, b})
    sa, sb = steps[steps["run_id"] == a], steps[steps["run_id"] == b]
    assert len(sa) == len(sb) == sim["steps"] == vllm["steps"]
    d = first_divergence(sa, sb, DEFAULT_COLUMNS)  # the contract
    assert d is None, d.describe("sim", "vllm-sched")
    d = first_divergence(sa, sb, AGREEMENT_COLUMNS)  # and everything else measured
    assert d is None, d.describe("sim", "vllm-sched")
    reqs = store.read_table(tmp_path, "requests", {a, b})

    def table(run_id: str) -> pd.DataFrame:
        t = reqs[reqs["run_id"] == run_id].drop(columns=["run_id", "token_times_s"])  # sim records no token times
        return t.sort_values(["request_id", "sample"]).reset_index(drop=True)

    ra, rb = table(a), table(b)
    pd.testing.assert_series_equal(ra["num_preemptions"], rb["num_preemptions"])  # per request
    pd.testing.assert_frame_equal(ra, rb)
    for key in (
        "steps",
        "preemptions",
        "evictions",
        "generated_tokens",
        "computed_tokens",
        "sim_time_s",
        "token_states_frac",
        "reservation_frac",
        "internal_frag_frac",
        "external_frag_frac",
    ):
        assert sim[key] == vllm[key], key
    return sa, ra
