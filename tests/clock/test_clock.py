"""The calibrated clock: profile clocks, the measured clock, `kvbench calibrate`, latency columns,
and predicted-vs-measured; with their bad input.

Fits are tested on synthetic steps with known terms (a pure function: exact expectations), and
end to end on the torch runner's real measured steps (structure, never timing: a unit test must
not depend on how fast this machine is). The engine comparison runs the real vLLM engine where
the CPU build is installed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kvbench.harness.clock.clocks import ProfileClock, StepWork, make_clock
from kvbench.harness.clock.fit import fit, fit_terms, misses, nnls, predict
from kvbench.harness.clock.model import ClockTerms, RecentCounts, cache_misses
from kvbench.harness.clock.profile import load_profile
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.spec.geometry import PRESETS

from tests.conftest import DATA, Section, assert_one_line_error, kvbench, run_suite_text, suite_toml

PROFILE = DATA / "profile-opt-13b-fp16-b16.json"  # hand-written fixture terms (format version 1)
KNEE_PROFILE = DATA / "profile-opt-13b-fp16-b16-knee.json"  # the same, version 2, with an early-token cost
CACHE_PROFILE = DATA / "profile-opt-13b-fp16-b16-cache.json"  # version 3: primitive-cache terms, a cache of 4

TERMS = ClockTerms(
    step_s=3e-3,
    per_token_s=3.5e-5,
    per_seq_s=5e-5,
    per_context_token_s=3e-7,
    per_attention_pair_s=2e-8,
    per_early_token_s=1.2e-5,
)


def test_profile_step_times_are_step_time_bit_for_bit():
    clock = ProfileClock(TERMS)
    rng = np.random.default_rng(3)
    for n in (1, 7, 64, 256, 257, 1000):
        context = rng.integers(0, 10**7, 300)
        pairs = context + rng.integers(0, 10**5, 300)
        seqs = rng.integers(1, 64, 300)
        assert clock.step_times(n, context, pairs, seqs).tolist() == [
            clock.step_time(StepWork(n, int(c), int(p), int(s))) for c, p, s in zip(context, pairs, seqs)
        ]
        assert clock.step_times(n, context, pairs, n).tolist() == [
            clock.step_time(StepWork(n, int(c), int(p), n)) for c, p in zip(context, pairs)
        ]


def test_recent_counts_is_an_lru_of_distinct_counts():
    cache = RecentCounts(2)
    assert [cache.use(v) for v in (5, 5, 7, 5, 9, 7, 5)] == [True, False, True, False, True, True, True]
    # 0 is an empty step: no forward pass, so it neither misses nor evicts.
    assert cache_misses(np.array([3, 3, 0, 4, 3, 5, 4, 0, 3]), 2).tolist() == [1, 0, 0, 1, 0, 1, 1, 0, 1]


CACHE_TERMS = ClockTerms(
    step_s=3e-3,
    per_token_s=3.5e-5,
    per_seq_s=5e-5,
    per_context_token_s=3e-7,
    per_attention_pair_s=2e-8,
    per_early_token_s=1.2e-5,
    miss_s=4e-4,
    miss_per_token_s=3e-6,
    seq_miss_s=6e-4,
    primitive_cache=3,
)


def test_cache_clock_peek_and_take_many_are_take_step_by_step():
    """The fast path prices a stretch with ``peek`` and records it with ``take_many``; both must
    be ``take`` step by step, bit for bit, from any state, for any cut of the stretch."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        warm = rng.integers(0, 6, int(rng.integers(0, 8))).tolist()
        steps = int(rng.integers(1, 30))
        # One count for the whole stretch, or one per step (a stretch in which decoders finish).
        tokens = int(rng.integers(1, 6)) if rng.random() < 0.3 else rng.integers(0, 6, steps)
        seqs = (
            tokens
            if rng.random() < 0.5
            else (int(rng.integers(1, 6)) if rng.random() < 0.3 else rng.integers(1, 6, steps))
        )
        a, b = ProfileClock(CACHE_TERMS), ProfileClock(CACHE_TERMS)
        for v in warm:
            assert a.take(v, v) == b.take(v, v)
        per_step = lambda x, i: int(x[i]) if isinstance(x, np.ndarray) else int(x)  # noqa: E731
        cut = int(rng.integers(0, steps + 1))
        peeked = b.peek(tokens, seqs, steps)
        assert peeked is not None and len(peeked) == steps
        taken = [a.take(per_step(tokens, i), per_step(seqs, i)) for i in range(steps)]
        assert peeked.tolist() == taken, trial
        # Take only the first ``cut`` steps, then compare the memories on what follows.
        a2 = ProfileClock(CACHE_TERMS)
        for v in warm:
            a2.take(v, v)
        for i in range(cut):
            a2.take(per_step(tokens, i), per_step(seqs, i))
        b.take_many(tokens, seqs, cut)
        probe = rng.integers(0, 6, 12)
        assert [a2.take(int(v), int(v)) for v in probe] == [b.take(int(v), int(v)) for v in probe], trial


def test_a_clock_without_cache_terms_has_no_memory():
    clock = ProfileClock(TERMS)
    assert clock.peek(5, 5, 3) is None and clock.take(5, 5) == 0.0
    assert load_profile(KNEE_PROFILE).terms.primitive_cache == 0  # a version 2 profile reads with no cache


def _synthetic_steps(rng: np.random.Generator, n: int, noise: float) -> pd.DataFrame:
    seqs = rng.integers(1, 64, n)
    prefill = rng.random(n) < 0.2
    tokens = np.where(prefill, seqs + rng.integers(10, 1000, n), seqs)
    context = seqs * rng.integers(20, 900, n)
    pairs = np.where(prefill, context + (tokens - seqs) * rng.integers(10, 900, n), context)
    steps = pd.DataFrame(
        {
            "run_id": "r0",
            "step": np.arange(n),
            "scheduled_tokens": tokens,
            "scheduled_seqs": seqs,
            "context_tokens": context,
            "attention_pairs": pairs,
        }
    )
    exact = predict(TERMS, steps)
    steps["step_wall_s"] = exact * (1 + noise * rng.standard_normal(n))
    return steps


def test_fit_recovers_primitive_cache_terms():
    """Steps whose token counts come back after others (misses in a cache of 32) cost more; the
    fit tells that cost apart from the dense layers' and the requests'."""
    from kvbench.harness.clock.fit import TERM_NAMES

    rng = np.random.default_rng(5)
    terms = dataclasses.replace(CACHE_TERMS, primitive_cache=32)
    frames = []
    for run in range(6):  # runs of their own: each starts with an empty cache
        n = 600
        seqs = rng.integers(1, 64, n)
        prefill = rng.random(n) < 0.3
        tokens = np.where(prefill, seqs + rng.integers(10, 1000, n), seqs)
        context = seqs * rng.integers(20, 900, n)
        pairs = np.where(prefill, context + (tokens - seqs) * rng.integers(10, 900, n), context)
        frames.append(
            pd.DataFrame(
                {
                    "run_id": f"r{run}",
                    "step": np.arange(n),
                    "scheduled_tokens": tokens,
                    "scheduled_seqs": seqs,
                    "context_tokens": context,
                    "attention_pairs": pairs,
                }
            )
        )
    steps = pd.concat(frames, ignore_index=True)
    token_miss, seq_miss = misses(steps, 32)
    assert 0.1 < token_miss.mean() < 0.9 and 0.01 < seq_miss.mean() < 0.9  # hits and misses of both kinds
    steps["step_wall_s"] = predict(terms, steps)
    got = fit_terms(steps)
    assert got.primitive_cache == 32
    for name in TERM_NAMES:
        assert getattr(got, name) == pytest.approx(getattr(terms, name), rel=1e-6), name


def test_fit_recovers_known_terms_and_keeps_them_non_negative():
    rng = np.random.default_rng(0)
    exact = fit_terms(_synthetic_steps(rng, 2000, 0.0))
    for name in (
        "step_s",
        "per_token_s",
        "per_seq_s",
        "per_context_token_s",
        "per_attention_pair_s",
        "per_early_token_s",
    ):
        assert getattr(exact, name) == pytest.approx(getattr(TERMS, name), rel=1e-6), name
    assert exact.token_knee == 256
    noisy = fit(_synthetic_steps(rng, 3000, 0.05))
    assert noisy.held_out.steps == (np.arange(3000) // 32 % 5 == 4).sum()
    assert noisy.held_out.median_abs < 0.06 and abs(noisy.held_out.total) < 0.02
    assert noisy.disturbed < 0.01
    # Steps slowed by another process (a tenth of them, 10x) are flagged, and barely move the terms.
    slowed = _synthetic_steps(rng, 3000, 0.05)
    hit = rng.random(len(slowed)) < 0.1
    slowed.loc[hit, "step_wall_s"] *= 10
    disturbed = fit(slowed)
    assert 0.08 < disturbed.disturbed < 0.12
    assert disturbed.terms.step_s == pytest.approx(TERMS.step_s, rel=0.15)
    # A term the data contradict is held at zero, not fitted negative.
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    x = nnls(a, np.array([3.0, 2.0, 1.0]))
    assert (x >= 0).all() and x[1] == 0.0


SHAREGPT_40 = {"source": "sharegpt", "num_requests": 40, "arrival": "poisson", "rate": 4.0}
ONE_REQUEST = {"source": "fixed", "prompt_len": 4, "output_len": 3, "num_requests": 1}


def _profile_suite(
    profile: Path | None,
    policy: str = "paged",
    block: int = 16,
    kv: str = "fp16",
    preset: str = "opt-13b",
    workload: Section = SHAREGPT_40,
    clock: str = "profile",
) -> str:
    """One sim cell on the clock ``profile`` (None: the suite names none)."""
    return suite_toml(
        "profiled",
        model={"preset": preset, "kv_dtype": kv},
        memory={"kv_budget": "2GiB", "max_model_len": 2048},
        scheduler={"clock": clock, "clock_profile": None if profile is None else str(profile)},
        workload=workload,
        grid={"policy": [policy], "block_size": [block]},
    )


def test_sim_on_a_profile_prices_each_step_with_its_terms(out):
    rows, steps = run_suite_text(_profile_suite(PROFILE), out)
    (row,) = rows
    assert row["status"] == "ok" and row["clock"] == "profile"
    assert row["clock_detail"].startswith(f"profile {load_profile(PROFILE).digest[:8]}")
    assert json.loads(row["clock_profile"])["terms"] == json.loads(PROFILE.read_text())["terms"]
    s = steps[row["run_id"]]
    assert s["scheduled_seqs"].isna().all() and s["step_wall_s"].isna().all()  # sim measures nothing
    assert row["sim_time_s"] == pytest.approx(float(s["t_s"].iloc[-1] + s["dt_s"].iloc[-1]))


@pytest.mark.parametrize("profile", [PROFILE, KNEE_PROFILE], ids=["version-1", "version-2-knee"])
def test_profile_step_time_of_one_request_by_hand(out, profile):
    text = _profile_suite(profile, workload=ONE_REQUEST)
    (row,), steps = run_suite_text(text, out)
    t = load_profile(profile).terms
    # A version 1 profile has no early-token term: its steps are priced by the five terms alone, exactly.
    assert (t.per_early_token_s == 0.0) == (profile == PROFILE)
    # (tokens, seqs, context after the step, tokens × context): the prefill, then two decodes.
    work = [(4, 1, 4, 16), (1, 1, 5, 5), (1, 1, 6, 6)]
    expected = [
        t.step_s
        + n * t.per_token_s
        + q * t.per_seq_s
        + c * t.per_context_token_s
        + p * t.per_attention_pair_s
        + (n * t.per_early_token_s if profile == KNEE_PROFILE else 0.0)  # n < the knee of 256
        for n, q, c, p in work
    ]
    # Start times accumulate the step times left to right, exactly (dt_s is their difference).
    assert steps[row["run_id"]]["t_s"].tolist() == [0.0, expected[0], expected[0] + expected[1]]
    assert row["sim_time_s"] == expected[0] + expected[1] + expected[2]


def test_profile_cache_misses_by_hand(out):
    """One request of 4 prompt tokens and 3 outputs on a version 3 profile: the prefill misses
    both caches (4 tokens, 1 request), the first decode the token cache (1 token is new), the
    second nothing."""
    text = _profile_suite(CACHE_PROFILE, workload=ONE_REQUEST)
    (row,), steps = run_suite_text(text, out)
    t = load_profile(CACHE_PROFILE).terms
    assert t.primitive_cache == 4 and t.miss_s > 0 and t.seq_miss_s > 0
    base = [
        t.step_s
        + n * t.per_token_s
        + q * t.per_seq_s
        + c * t.per_context_token_s
        + p * t.per_attention_pair_s
        + n * t.per_early_token_s
        for n, q, c, p in [(4, 1, 4, 16), (1, 1, 5, 5), (1, 1, 6, 6)]
    ]
    extra = [(t.miss_s + 4 * t.miss_per_token_s) + t.seq_miss_s, (t.miss_s + 1 * t.miss_per_token_s) + 0.0, 0.0]
    dt = [b + e for b, e in zip(base, extra)]
    assert steps[row["run_id"]]["t_s"].tolist() == [0.0, dt[0], dt[0] + dt[1]]
    assert row["sim_time_s"] == dt[0] + dt[1] + dt[2]


def test_run_id_follows_the_profile_content_not_its_path(tmp_path):
    from kvbench.app.suite import parse_suite

    copy = tmp_path / "copy.json"
    copy.write_bytes(PROFILE.read_bytes())
    changed = tmp_path / "changed.json"
    doc = json.loads(PROFILE.read_text())
    doc["terms"]["step_s"] *= 2
    changed.write_text(json.dumps(doc))

    def run_id(path: Path) -> str:
        suite = parse_suite(_profile_suite(path), str(tmp_path / "s.toml"))
        ((spec, wl),) = list(suite.cells())
        return spec.run_id("w")

    assert run_id(PROFILE) == run_id(copy) != run_id(changed)


def test_latency_columns_on_the_steps_clock(out):
    text = suite_toml(
        "lat",
        model={"preset": "opt-13b"},
        memory={"kv_budget": "2GiB"},
        workload=ONE_REQUEST,
        grid={"policy": ["paged"]},
    )
    (row,), _ = run_suite_text(text, out)
    # Step 0 prefills and samples token 1 (t = 1); steps 1 and 2 decode tokens 2 and 3 (t = 3).
    assert row["ttft_p50_s"] == 1.0 and row["latency_p50_s"] == 3.0 and row["latency_p90_s"] == 3.0
    assert row["tpot_p50_s"] == 1.0 and row["normalized_latency_mean_s"] == 1.0


TORCH_WORKLOAD = {
    "source": "uniform",
    "prompt_min": 8,
    "prompt_max": 120,
    "output_min": 4,
    "output_max": 40,
    "num_requests": 24,
    "arrival": "poisson",
    "rate": 50.0,
}


def torch_measured(
    workload: Section | None = TORCH_WORKLOAD,
    clock: Mapping[str, object] | None = None,
    runner: tuple[str, ...] = ("torch",),
    grid: Mapping[str, object] | None = None,
    **sections: Section,
) -> str:
    """The torch runner on Llama-mini, on the measured clock unless ``clock`` says otherwise."""
    return suite_toml(
        "torch-measured",
        model={"preset": "llama-mini", "kv_dtype": "fp32"},
        memory={"kv_budget": "2MiB", "max_model_len": 256},
        scheduler={"max_num_seqs": 16, "max_num_batched_tokens": 256, **(clock or {"clock": "measured"})},
        workload=workload,
        grid={"runner": list(runner), "policy": ["paged"], "block_size": [16], **(grid or {})},
        **sections,
    )


def test_measured_clock_then_calibrate_then_sim_on_the_profile(tmp_path):
    """torch on the measured clock records its step times as dt_s and its work beside them;
    calibrate fits a profile from them; sim runs on that profile and the report sets them side by side."""
    pytest.importorskip("torch")
    suite = tmp_path / "measured.toml"
    suite.write_text(torch_measured())
    res = tmp_path / "res"
    proc = kvbench("run", str(suite), "--out", str(res), "--quiet", "--no-report", timeout=600)
    assert proc.returncode == 0, proc.stderr
    runs = store.read_table(res, "runs")
    steps = store.read_table(res, "steps").sort_values("step")
    assert list(runs["clock"]) == ["measured"]
    # Time is the measured step time (dt_s is t_s's difference: equal up to one rounding).
    np.testing.assert_allclose(steps["dt_s"], steps["step_wall_s"], rtol=1e-9)
    assert steps[["scheduled_seqs", "context_tokens", "attention_pairs"]].notna().all().all()
    assert runs["ttft_p50_s"].iloc[0] > 0

    profile = tmp_path / "p.json"
    proc = kvbench("calibrate", str(res), "--out", str(profile))
    assert proc.returncode == 0, proc.stderr
    assert "held out:" in proc.stdout and "per-step median" in proc.stdout
    doc = json.loads(profile.read_text())
    assert doc["valid_for"]["model"] == "llama-mini" and doc["valid_for"]["kv_dtype"] == "fp32"
    assert doc["valid_for"]["block_size"] == 16 and doc["measured_on"]["runner"] == "torch"
    assert doc["data"]["steps"] == len(steps) and doc["kvbench_version"] and "created_at" in doc
    assert all(v >= 0 for v in doc["terms"].values())
    # Several directories pool their runs (the same run id in two directories counts twice).
    pooled = tmp_path / "pooled.json"
    assert kvbench("calibrate", str(res), str(res), "--out", str(pooled)).returncode == 0
    assert json.loads(pooled.read_text())["data"]["steps"] == 2 * len(steps)

    # sim on the profile beside torch on the measured clock, same work: the report pairs them.
    on_profile = {"clock": "profile", "clock_profile": str(profile)}
    torch_measured_too = {"torch": {"clock": "measured"}}
    suite.write_text(torch_measured(clock=on_profile, runner=("sim", "torch"), runners=torch_measured_too))
    proc = kvbench("run", str(suite), "--out", str(res), "--quiet", timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = (res / "report" / "summary.md").read_text()
    assert "## Predicted vs measured" in summary and "## Clocks" in summary
    from kvbench.reports.loading import load
    from kvbench.reports.prediction import prediction_table

    rec = load(res)
    table = prediction_table(rec.runs, rec.steps)
    assert len(table) == 1 and table["measured_total_s"].iloc[0] > 0 and table["predicted_total_s"].iloc[0] > 0
    assert not math.isnan(table["step_median_err"].iloc[0]) and not math.isnan(table["step_sum_err"].iloc[0])
    assert 0.0 <= table["disturbed_frac"].iloc[0] <= 1.0
    assert "the machine: median step-sum error" not in summary  # one round of one workload: nothing to split

    # Two workloads in two rounds: the report splits the step-sum error into the machine's phase
    # per round and the model's offset per workload.
    b = {"source": "fixed", "prompt_len": 40, "output_len": 8, "num_requests": 16, "arrival": "batch"}
    two = torch_measured(
        None,
        clock=on_profile,
        runner=("sim", "torch"),
        grid={"repeat": [0, 1]},
        workloads={"a": TORCH_WORKLOAD, "b": b},
        runners=torch_measured_too,
    )
    res2 = tmp_path / "res2"
    suite.write_text(two)
    proc = kvbench("run", str(suite), "--out", str(res2), "--quiet", timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = (res2 / "report" / "summary.md").read_text()
    assert "the machine: median step-sum error" in summary and "the model: offset from its round" in summary
    assert "the model: offset from its round" in (res2 / "report" / "index.html").read_text()
    # sim ran in both rounds too, and is deterministic: one prediction per workload, set beside
    # each engine run once (not every sim repeat beside every engine repeat).
    rec2 = load(res2)
    table2 = prediction_table(rec2.runs, rec2.steps)
    engine_runs = rec2.runs[rec2.runs["runner"] == "torch"]
    assert len(rec2.runs[rec2.runs["runner"] == "sim"]) == 4 and len(engine_runs) == 4
    assert sorted(table2["run_id_eng"]) == sorted(engine_runs["run_id"])
    assert table2.groupby("workload")["run_id_sim"].nunique().eq(1).all()


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(preset="llama-3-8b"), "fitted on model opt-13b"),
        (dict(kv="fp8"), "fitted with KV fp16, not fp8"),
        (dict(block=32), "fitted with block size 16, not 32"),
    ],
)
def test_a_profile_from_another_setup_is_refused(tmp_path, change, needle):
    suite = tmp_path / "s.toml"
    suite.write_text(_profile_suite(PROFILE, **change))
    assert_one_line_error(kvbench("run", str(suite), "--out", str(tmp_path / "o")), needle)
    assert not (tmp_path / "o").exists()  # nothing left that could pass for a result
    (tmp_path / "mine").mkdir()  # a directory the user made stays, refused or not
    assert_one_line_error(kvbench("run", str(suite), "--out", str(tmp_path / "mine")), needle)
    assert (tmp_path / "mine").is_dir()


def test_contiguous_cells_take_the_profile_at_any_block_size(out):
    rows, _ = run_suite_text(_profile_suite(PROFILE, policy="contiguous-max", block=32), out)
    assert rows[0]["status"] == "ok"


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"{not json", "not JSON"),
        (json.dumps({"format": "kvbench.clock_profile", "version": 99}).encode(), "format version 99 is newer"),
        (json.dumps({"format": "something-else"}).encode(), "not a kvbench clock profile"),
        (PROFILE.read_bytes().replace(b'"step_s": 0.012', b'"step_s": -1'), "corrupt clock profile"),
        (
            CACHE_PROFILE.read_bytes().replace(b'"primitive_cache": 4', b'"primitive_cache": 1.5'),
            "primitive_cache must be a whole",
        ),
    ],
)
def test_a_corrupt_or_newer_profile_is_one_line(tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    suite = tmp_path / "s.toml"
    suite.write_text(_profile_suite(bad))
    assert_one_line_error(kvbench("run", str(suite), "--out", str(tmp_path / "o")), needle)
    assert not (tmp_path / "o").exists()


def test_profile_clock_settings_are_checked(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text(_profile_suite(tmp_path / "missing.json"))
    assert_one_line_error(kvbench("run", str(suite), "--out", str(tmp_path / "o")), "no such clock profile")
    suite.write_text(_profile_suite(None))
    assert_one_line_error(kvbench("run", str(suite), "--out", str(tmp_path / "o")), "needs clock_profile")
    suite.write_text(_profile_suite(PROFILE, clock="measured"))
    assert_one_line_error(
        kvbench("run", str(suite), "--out", str(tmp_path / "o")),
        'clock = "measured"',
        "only torch, vllm and serve measure steps",
    )
    with pytest.raises(KvbenchError, match="not a kvbench clock profile"):
        from kvbench.harness.clock.profile import parse_profile

        parse_profile(b"[]", "x")


def test_clock_profile_option_is_checked(tmp_path):
    example = str(Path(__file__).resolve().parents[2] / "suites" / "example.toml")
    assert_one_line_error(
        kvbench("run", example, "--clock-profile", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o")),
        "no such clock profile",
    )
    assert_one_line_error(
        kvbench("run", example, "--clock-profile", str(PROFILE), "--out", str(tmp_path / "o")),
        "no cell of suite",
        'clock = "profile"',
    )
    assert not (tmp_path / "o").exists()


def test_calibrate_needs_measured_steps(tmp_path, out):
    assert_one_line_error(
        kvbench("calibrate", str(tmp_path / "nope"), "--out", str(tmp_path / "p.json")), "no such results directory"
    )
    run_suite_text(_profile_suite(PROFILE), out)  # sim only: no measured steps
    assert_one_line_error(
        kvbench("calibrate", str(out), "--out", str(tmp_path / "p.json")), "no ok runs of a runner that measures steps"
    )
    assert not (tmp_path / "p.json").exists()
    assert_one_line_error(kvbench("calibrate", str(out), "--out", str(tmp_path / "p.txt")), "a profile is a .json")


def test_calibrate_refuses_too_few_steps(tmp_path):
    pytest.importorskip("torch")
    suite = tmp_path / "few.toml"
    suite.write_text(torch_measured({**TORCH_WORKLOAD, "num_requests": 1, "output_max": 5}))
    res = tmp_path / "res"
    assert kvbench("run", str(suite), "--out", str(res), "--quiet", "--no-report", timeout=600).returncode == 0
    assert_one_line_error(
        kvbench("calibrate", str(res), "--out", str(tmp_path / "p.json")), "measured steps; calibrate needs at least 50"
    )


def test_fit_roofline_bisects_a_monotone_metric_to_its_target() -> None:
    from kvbench.app.commands.fit_roofline import bisect
    from kvbench.harness.errors import KvbenchError

    trials: list[tuple[float, float]] = []
    scale, value = bisect(lambda s: 10.0 * s, 15.0, 1.0, 16.0, lambda s, v: trials.append((s, v)))
    assert abs(value / 15.0 - 1) <= 0.002 and scale == pytest.approx(1.5, rel=0.002)
    assert len(trials) > 3  # every trial was reported
    falling, _ = bisect(lambda s: 100.0 / s, 40.0, 1.0, 16.0, lambda s, v: None)  # decreasing works too
    assert falling == pytest.approx(2.5, rel=0.002)
    with pytest.raises(KvbenchError, match="outside"):
        bisect(lambda s: 10.0 * s, 500.0, 1.0, 16.0, lambda s, v: None)


def test_runs_too_short_for_a_held_out_block_hold_out_every_fifth_step():
    import pandas as pd
    from kvbench.harness.clock.fit import HOLDOUT_BLOCK, HOLDOUT_EVERY, held_out_mask

    short = pd.DataFrame({"step": np.arange(HOLDOUT_BLOCK * (HOLDOUT_EVERY - 1) - 1)})
    held = held_out_mask(short)
    assert held.any() and list(np.flatnonzero(held)) == list(range(HOLDOUT_EVERY - 1, len(short), HOLDOUT_EVERY))
    long = pd.DataFrame({"step": np.arange(HOLDOUT_BLOCK * HOLDOUT_EVERY)})
    assert list(np.flatnonzero(held_out_mask(long))) == list(
        range(HOLDOUT_BLOCK * (HOLDOUT_EVERY - 1), HOLDOUT_BLOCK * HOLDOUT_EVERY)
    )


def test_the_profile_clock_prices_a_step_as_the_terms_state_it():
    """ProfileClock.price (floats unpacked once, on the simulator's hot path) is the model's one
    formula, ClockTerms.step_price, to the bit, on random terms and steps."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        terms = ClockTerms(*(float(x) for x in rng.exponential(1e-4, 6)), token_knee=int(rng.integers(0, 1024)))
        clock = ProfileClock(terms)
        tokens, context, pairs, seqs = (int(x) for x in rng.integers(0, 10_000, 4))
        assert clock.price(tokens, context, pairs, seqs) == terms.step_price(tokens, context, pairs, seqs)


def test_make_clock_refuses_a_clock_it_does_not_build() -> None:
    g = PRESETS["opt-13b"]
    with pytest.raises(ValueError, match="not 'tables'"):
        make_clock("tables", g, g.kv_bytes_per_token("fp16", 1, 1), "A100-80GB")
