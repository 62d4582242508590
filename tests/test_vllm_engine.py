"""The ``vllm`` runner (the full engine) without a GPU: everything up to the engine call.

The engine is replaced at its one boundary (``runners.vllm_engine.make_engine``)
by a fake with ``add_request``/``step``/``has_unfinished_requests``, a
scheduler view (``running``, ``kv_cache_manager.get_block_ids``,
``kv_cache_config``) and vLLM's real ``SchedulerStats``/``IterationStats``
handed to the runner's stat logger; CUDA is replaced by ``FakeCuda``. What
needs a GPU (the engine starting, its kernels, the real stats) is not
exercised here: ``harness.gpu_smoke`` and ``gpu-check.sh`` do that.
"""

from __future__ import annotations

import importlib.util
import math
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import store
from harness.errors import KvbenchError
from harness.suite import parse_suite
from harness.sweep import build_cells
from runners import get_runner, vllm_engine
from runners.vllm_engine import NO_CUDA, POLICY_ERROR, EngineHandle
from tests.conftest import kvbench

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


no_cuda_only = pytest.mark.skipif(_cuda(), reason="checks the no-CUDA path; this machine has CUDA")

SUITE = """
name = "t"
[model]
preset = "tiny"
kv_dtype = "{kv_dtype}"
[memory]
kv_budget = "{budget}"
max_model_len = {max_model_len}
[workload]
source = "uniform"
prompt_min = 8
prompt_max = 120
output_min = 1
output_max = 60
num_requests = 24
n = 2
prefix_groups = 3
prefix_len = 20
arrival = "{arrival}"
{rate}
seed = 3
[scheduler]
max_num_seqs = 8
max_num_batched_tokens = 256
preemption = "{preemption}"
clock = "{clock}"
[grid]
runner = {runners}
policy = {policies}
block_size = [16]
"""


def suite_text(**kw: object) -> str:
    settings = dict(kv_dtype="fp16", budget="64KiB", max_model_len=256, arrival="batch", rate="",
                    preemption="recompute", clock="steps", runners='["vllm"]', policies='["paged"]')
    settings.update(kw)
    return SUITE.format(**settings)


def cells_for(tmp_path: Path, **kw: object) -> list:
    suite = parse_suite(suite_text(**kw), str(tmp_path / "t.toml"))
    return build_cells(suite, tmp_path, lambda m: None)


# --- the fakes ---------------------------------------------------------------------------


class FakeCuda:
    def __init__(self, available: bool = True) -> None:
        self._available = available
        self.syncs = 0

    def available(self) -> bool:
        return self._available

    def synchronize(self) -> None:
        self.syncs += 1

    def device_name(self) -> str:
        return "Fake GPU 141GB"

    def cuda_version(self) -> str:
        return "12.9"

    def free_fraction(self) -> float:
        return 0.95

    def release(self) -> None:
        pass


class FakeRequest:
    def __init__(self, rid: str, ext: str, prompt_len: int, max_tokens: int) -> None:
        self.request_id, self.ext = rid, ext
        self.prompt_len, self.max_tokens = prompt_len, max_tokens
        self.num_computed_tokens = self.num_output = self.num_preemptions = self.blocks = 0


class FakeEngine:
    """A toy v1-like engine: FCFS, whole prefills, recompute preemption of the last running
    request, stats made with vLLM's own dataclasses and handed to the stat loggers."""

    def __init__(self, args, loggers, layers: int, block_bytes: int, fail_at_step: int | None = None) -> None:
        self.args, self.loggers = args, loggers
        self.bs = args.block_size
        self.usable = args.num_gpu_blocks_override - 1
        self.free = self.usable
        self.running: list[FakeRequest] = []
        self.waiting: deque[FakeRequest] = deque()
        self.requests: dict[str, FakeRequest] = {}
        self.added: list[tuple[str, object, object]] = []
        self.steps = 0
        self.fail_at_step = fail_at_step
        self.kv_cache_config = SimpleNamespace(num_blocks=args.num_gpu_blocks_override, kv_cache_groups=[
            SimpleNamespace(kv_cache_spec=SimpleNamespace(page_size_bytes=block_bytes // layers),
                            layer_names=[f"model.layers.{i}.self_attn.attn" for i in range(layers)])])
        self.kv_cache_manager = SimpleNamespace(get_block_ids=lambda rid: (
            [0] * self.requests[rid].blocks if rid in self.requests else [],))

    # LLMEngine's surface
    def add_request(self, request_id, prompt, params):
        self.added.append((request_id, prompt, params))
        rid = f"{request_id}-0f0f0f0f"  # vLLM appends a random suffix to external ids
        req = FakeRequest(rid, request_id, len(prompt["prompt_token_ids"]), params.max_tokens)
        self.requests[rid] = req
        self.waiting.append(req)
        return rid

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def _preempt(self, victim: FakeRequest) -> None:
        self.running.remove(victim)
        self.free += victim.blocks
        victim.blocks = victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)

    def step(self):
        from vllm.v1.engine import FinishReason
        from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats

        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        budget = self.args.max_num_batched_tokens
        scheduled: list[tuple[FakeRequest, int]] = []
        preempted = False
        for req in list(self.running):
            if req not in self.running:
                continue
            need = req.prompt_len + req.num_output - req.num_computed_tokens
            if need > budget:
                continue
            while self._blocks(req.num_computed_tokens + need) - req.blocks > self.free:
                self._preempt(self.running[-1])
                preempted = True
                if req not in self.running:
                    break
            if req not in self.running:
                continue
            self.free -= self._blocks(req.num_computed_tokens + need) - req.blocks
            req.blocks = self._blocks(req.num_computed_tokens + need)
            scheduled.append((req, need))
            budget -= need
        while not preempted and self.waiting and len(self.running) < self.args.max_num_seqs:
            req = self.waiting[0]
            need = req.prompt_len + req.num_output
            if need > budget or self._blocks(need) > self.free:
                break
            self.waiting.popleft()
            self.running.append(req)
            req.blocks = self._blocks(need)
            self.free -= req.blocks
            scheduled.append((req, need))
            budget -= need
        outputs = []
        it = IterationStats()
        for req, n in scheduled:
            req.num_computed_tokens += n
            req.num_output += 1
            done = req.num_output == req.max_tokens
            outputs.append(SimpleNamespace(request_id=req.ext, finished=done, num_cached_tokens=0,
                                           outputs=[SimpleNamespace(token_ids=[5] * req.num_output)]))
            if done:
                self.running.remove(req)
                self.free += req.blocks
                del self.requests[req.request_id]
                it.finished_requests.append(FinishedRequestStats(
                    finish_reason=FinishReason.LENGTH, request_id=req.ext, num_preemptions=req.num_preemptions,
                    num_generation_tokens=req.num_output))
        stats = SchedulerStats(num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
                               kv_cache_usage=1.0 - self.free / self.usable, prefix_cache_stats=PrefixCacheStats())
        for logger in self.loggers:
            logger.record(scheduler_stats=stats, iteration_stats=it if outputs else None)
        return outputs


@pytest.fixture
def fake(monkeypatch):
    """Installs FakeCuda and a make_engine that builds FakeEngines; yields what they saw."""
    seen = SimpleNamespace(engines=[], closed=0, cuda=FakeCuda(), fail_at_step=None)

    def make(args, stat_loggers):
        spec_layers = 2  # the tiny preset
        loggers = [factory(None, 0) for factory in stat_loggers]  # as vLLM's PerEngineStatLoggerAdapter does
        block_bytes = args.block_size * seen.kv_bytes_per_token
        engine = FakeEngine(args, loggers, spec_layers, block_bytes, seen.fail_at_step)
        seen.engines.append(engine)

        def close():
            seen.closed += 1

        return EngineHandle(engine, engine, "FAKE_ATTN", close)

    monkeypatch.setattr(vllm_engine, "CUDA", seen.cuda)
    monkeypatch.setattr(vllm_engine, "make_engine", make)
    monkeypatch.delenv(vllm_engine.EAGER_ENV, raising=False)
    return seen


def run_fake(fake, cell):
    fake.kv_bytes_per_token = cell.spec.kv_bytes_per_token
    row = get_runner("vllm").run(cell)
    steps = store.read_table(cell.out, "steps", {cell.run_id}).sort_values("step").reset_index(drop=True)
    requests = store.read_table(cell.out, "requests", {cell.run_id})
    return row, steps, requests


def check_invariants(steps, budget_positions: int, block_size: int) -> None:
    assert len(steps) > 0
    alloc, free = steps["allocated_positions"], steps["free_positions"]
    assert (alloc + free == budget_positions).all()
    assert (steps["used_positions"] <= alloc).all()
    assert (steps["used_positions"] >= 0).all()
    assert (steps["reserved_positions"] >= 0).all() and (steps["internal_frag_positions"] >= 0).all()
    assert (steps["used_positions"] + steps["reserved_positions"] + steps["internal_frag_positions"] == alloc).all()
    assert (steps["external_frag_positions"] <= free).all()
    assert (steps["allocated_blocks"] * block_size == alloc).all()


# --- availability and the spec (no vLLM, no GPU needed) ----------------------------------


def test_unavailable_names_vllm_sched_without_cuda(monkeypatch) -> None:
    monkeypatch.setattr(vllm_engine.vllm_adapter, "unavailable", lambda: None)
    monkeypatch.setattr(vllm_engine, "CUDA", FakeCuda(available=False))
    reason = vllm_engine.VllmRunner().unavailable()
    assert reason == NO_CUDA and "\n" not in reason and "vllm-sched" in reason
    monkeypatch.setattr(vllm_engine, "CUDA", FakeCuda(available=True))
    assert vllm_engine.VllmRunner().unavailable() is None
    monkeypatch.setattr(vllm_engine.vllm_adapter, "unavailable", lambda: "vLLM is not installed")
    assert vllm_engine.VllmRunner().unavailable() == "vLLM is not installed"


@pytest.mark.parametrize("changes, needle", [
    ({"policies": '["contiguous-max"]'}, POLICY_ERROR),
    ({"kv_dtype": "int8"}, "kv_dtype int8 is not supported"),
    ({"kv_dtype": "fp32"}, "kv_dtype fp32 is not supported"),
    ({"preemption": "swap"}, "recompute only"),
])
def test_refused_specs_are_one_line_errors(tmp_path: Path, changes: dict, needle: str) -> None:
    cell = cells_for(tmp_path, **changes)[0]
    with pytest.raises(KvbenchError) as err:
        vllm_engine.check_spec(cell.spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_budget_below_one_max_model_len_is_infeasible(tmp_path: Path, fake) -> None:
    # 64 KiB of fp16 tiny KV = 256 positions = 16 blocks: the workload fits (at most 180 tokens a
    # sequence), but max_model_len 512 needs 32 blocks, and vLLM would not start.
    cell = cells_for(tmp_path, max_model_len=512)[0]
    row = get_runner("vllm").run(cell)
    assert row["status"] == "infeasible"
    assert "max_model_len 512 needs 32 blocks" in row["error"], row["error"]
    assert fake.engines == []


# --- what the runner hands vLLM ------------------------------------------------------------


@needs_vllm
@pytest.mark.parametrize("policy, kv, cache_dtype, model_dtype", [
    ("paged", "fp16", "auto", "float16"),
    ("paged-prefix", "bf16", "auto", "bfloat16"),
    ("paged", "fp8", "fp8_e4m3", "float16"),
    ("paged", "fp8_e5m2", "fp8_e5m2", "float16"),
])
def test_engine_args(tmp_path: Path, policy: str, kv: str, cache_dtype: str, model_dtype: str) -> None:
    spec = cells_for(tmp_path, policies=f'["{policy}"]', kv_dtype=kv)[0].spec
    args = vllm_engine.engine_args(spec, tmp_path / "m", gpu_memory_utilization=0.5)
    assert args.num_gpu_blocks_override == spec.budget_blocks + 1
    assert args.block_size == 16
    assert args.kv_cache_dtype == cache_dtype and args.dtype == model_dtype
    assert args.enable_prefix_caching is (policy == "paged-prefix")
    assert args.max_num_seqs == 8 and args.max_num_batched_tokens == 256 and args.max_model_len == 256
    assert args.load_format == "dummy" and args.skip_tokenizer_init is True
    assert args.seed == vllm_engine.ENGINE_SEED and args.disable_log_stats is False
    assert args.async_scheduling is False and args.enable_chunked_prefill is True
    assert args.gpu_memory_utilization == 0.5 and args.enforce_eager is False


@needs_vllm
def test_engine_args_make_a_vllm_config(tmp_path: Path, monkeypatch) -> None:
    """vLLM's own config classes accept the arguments and keep them (platform checks aside:
    this machine has no CUDA, so vLLM is told the device is the CPU)."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "device_type", "cpu", raising=False)
    spec = cells_for(tmp_path, policies='["paged-prefix"]', kv_dtype="fp8")[0].spec
    model = vllm_engine.model_dir(spec, tmp_path)
    config = vllm_engine.engine_args(spec, model, gpu_memory_utilization=0.5).create_engine_config()
    cache, sched = config.cache_config, config.scheduler_config
    assert cache.num_gpu_blocks_override == spec.budget_blocks + 1 and cache.block_size == 16
    assert cache.cache_dtype == "fp8_e4m3" and cache.enable_prefix_caching is True
    assert sched.max_num_seqs == 8 and sched.max_num_batched_tokens == 256 and sched.async_scheduling is False
    assert config.model_config.max_model_len == 256 and config.model_config.seed == 0
    assert config.load_config.load_format == "dummy" and config.model_config.skip_tokenizer_init is True


def test_gpu_memory_utilization_stays_below_free_memory() -> None:
    assert vllm_engine.gpu_memory_utilization(0.99) == 0.9
    assert vllm_engine.gpu_memory_utilization(0.5) == 0.48
    with pytest.raises(KvbenchError):
        vllm_engine.gpu_memory_utilization(0.05)


# --- a run against the fake engine ---------------------------------------------------------


@needs_vllm
@pytest.mark.parametrize("policy", ["paged", "paged-prefix"])
def test_run_records_invariant_steps(tmp_path: Path, fake, policy: str) -> None:
    from runners.vllm_sched import PromptIds

    cell = cells_for(tmp_path, policies=f'["{policy}"]')[0]
    spec = cell.spec
    row, steps, requests = run_fake(fake, cell)
    assert row["status"] == "ok", row["error"]
    (engine,) = fake.engines
    assert fake.closed == 1

    # What vLLM was given.
    args = engine.args
    assert args.num_gpu_blocks_override == spec.budget_blocks + 1
    assert args.enable_prefix_caching is (policy == "paged-prefix")
    seqs = vllm_engine.expand_seqs(cell)
    assert len(engine.added) == len(seqs) == 48
    prompts = PromptIds(cell)
    for request_id, prompt, params in engine.added:
        seq = seqs[int(request_id)]
        assert prompt["prompt_token_ids"] == prompts.of(seq)
        assert len(prompt["prompt_token_ids"]) == seq.prompt_len
        assert params.max_tokens == params.min_tokens == seq.output_len
        assert params.ignore_eos is True and params.temperature == 0.0

    # What was recorded.
    check_invariants(steps, spec.budget_positions, spec.block_size)
    assert (steps["kv_bytes_allocated"] == steps["allocated_blocks"] * 16 * spec.kv_bytes_per_token).all()
    assert steps["step_wall_s"].notna().all() and (steps["dt_s"] == 1.0).all()
    assert fake.cuda.syncs == len(steps) == row["steps"]
    assert steps["preempted"].sum() == row["preemptions"] > 0  # 16 blocks for 8 sequences: vLLM preempts
    assert steps["admitted"].sum() == len(seqs) + row["preemptions"]
    assert steps["finished"].sum() == len(seqs)
    assert (requests["status"] == "finished").all()
    assert requests["num_preemptions"].sum() == row["preemptions"]
    assert (requests["first_scheduled_s"] <= requests["first_token_s"]).all()
    assert (requests["first_token_s"] <= requests["finished_s"]).all()
    assert row["generated_tokens"] == int(cell.workload.requests.eval("output_len * n").sum())
    device_s = steps["step_wall_s"].sum()
    assert math.isclose(row["tokens_per_s"], row["generated_tokens"] / device_s, rel_tol=1e-9)
    assert row["wall_tokens_per_s"] == row["tokens_per_s"]
    assert row["device"] == "Fake GPU 141GB" and row["attention_backend"] == "FAKE_ATTN"
    runs = store.read_table(cell.out, "runs", {cell.run_id})
    assert runs.loc[0, "runner"] == "vllm" and runs.loc[0, "status"] == "ok"
    # Every token computed once, plus the recomputation after each preemption.
    assert steps["scheduled_tokens"].sum() >= int((requests["prompt_len"] + requests["output_len"] - 1).sum())


@needs_vllm
def test_roofline_clock_advances_by_the_steps_work(tmp_path: Path, fake) -> None:
    cell = cells_for(tmp_path, clock="roofline", arrival="poisson", rate="rate = 2000.0")[0]
    row, steps, requests = run_fake(fake, cell)
    assert row["status"] == "ok", row["error"]
    assert (steps["dt_s"] > 0).all() and (steps["dt_s"] != 1.0).any()
    assert math.isclose(row["sim_time_s"], float(steps["t_s"].iloc[-1] + steps["dt_s"].iloc[-1]))
    assert (requests["first_scheduled_s"] >= requests["arrival_s"]).all()
    check_invariants(steps, cell.spec.budget_positions, 16)


@needs_vllm
def test_out_of_memory_is_an_oom_row(tmp_path: Path, fake) -> None:
    fake.fail_at_step = 3
    cell = cells_for(tmp_path)[0]
    row, steps, _ = run_fake(fake, cell)
    assert row["status"] == "oom" and "out of memory on Fake GPU 141GB" in row["error"]
    assert len(steps) == 0 and fake.closed == 1
    assert not list((cell.out / "steps").glob(".tmp-*"))


@needs_vllm
def test_mismatched_block_bytes_fail_the_run(tmp_path: Path, fake, monkeypatch) -> None:
    cell = cells_for(tmp_path)[0]
    fake.kv_bytes_per_token = cell.spec.kv_bytes_per_token * 2  # the engine would pad or widen the cache

    def make(args, stat_loggers):
        loggers = [f(None, 0) for f in stat_loggers]
        engine = FakeEngine(args, loggers, 2, args.block_size * fake.kv_bytes_per_token)
        return EngineHandle(engine, engine, None, lambda: None)

    monkeypatch.setattr(vllm_engine, "make_engine", make)
    with pytest.raises(KvbenchError, match="would not share one budget"):
        get_runner("vllm").run(cell)


@needs_vllm
def test_make_engine_starts_in_process_and_reads_the_scheduler(monkeypatch) -> None:
    """make_engine's glue around LLMEngine (only the engine itself is fake): in-process mode,
    the stat loggers passed through, the scheduler found, backends named, close() shuts down."""
    from vllm.v1.engine.llm_engine import LLMEngine

    calls = SimpleNamespace(from_args=None, shutdown=0)

    class Backend:
        @staticmethod
        def get_name() -> str:
            return "FLASH_ATTN"

    worker = SimpleNamespace(model_runner=SimpleNamespace(attn_groups=[[SimpleNamespace(backend=Backend)]]))
    scheduler = object()
    client = SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler),
                             shutdown=lambda: setattr(calls, "shutdown", calls.shutdown + 1))
    engine = SimpleNamespace(engine_core=client, vllm_config=SimpleNamespace(),
                             collective_rpc=lambda method: [method(worker)])

    def from_engine_args(args, stat_loggers=None, enable_multiprocessing=False):
        calls.from_args = (args, stat_loggers, enable_multiprocessing)
        return engine

    monkeypatch.setattr(LLMEngine, "from_engine_args", staticmethod(from_engine_args))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setattr("vllm.distributed.cleanup_dist_env_and_memory", lambda *a, **k: None)
    sink = vllm_engine.StatSink()
    handle = vllm_engine.make_engine("ARGS", [sink.logger_factory()])
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert calls.from_args[0] == "ARGS" and calls.from_args[2] is False
    assert handle.scheduler is scheduler and handle.attention_backend == "FLASH_ATTN"
    logger = calls.from_args[1][0](None, 0)  # vLLM calls the factory with (vllm_config, engine_index)
    logger.record(scheduler_stats="S", iteration_stats=None)
    assert sink.drain() == [("S", None)] and sink.drain() == []
    handle.close()
    assert calls.shutdown == 1


# --- the scheduler reads, against vLLM's real scheduler (CPU) ------------------------------


@needs_vllm
def test_occupancy_reads_vllms_scheduler_like_vllm_sched(tmp_path: Path) -> None:
    """The per-request reads the runner makes of the engine's scheduler (running requests,
    computed tokens, blocks via get_block_ids, bytes per block) agree with vllm-sched's."""
    from runners import vllm_adapter
    from runners.vllm_sched import PromptIds

    cell = cells_for(tmp_path, runners='["vllm-sched"]', policies='["paged-prefix"]')[0]
    vs = vllm_adapter.VllmScheduler(cell.spec, tmp_path / "model")
    seqs = vllm_engine.expand_seqs(cell)
    prompts = PromptIds(cell)
    for s in seqs[:10]:
        vs.add(s.index, prompts.of(s), s.output_len, 0.0)
    for _ in range(3):
        out = vs.schedule()
        mine = vllm_engine.occupancy(vs.sched, lambda rid: seqs[int(rid)].final_len, 16)
        theirs = vs.occupancy()
        assert mine.computed_tokens == theirs.computed_tokens
        assert mine.held_blocks == theirs.held_blocks
        assert mine.internal_positions == theirs.internal_positions
        vs.execute(out)
    assert vllm_engine.kv_bytes_per_block(vs.sched) == 16 * cell.spec.kv_bytes_per_token


# --- the real command line, no CUDA -------------------------------------------------------


@no_cuda_only
def test_kvbench_run_with_vllm_and_no_cuda_fails_that_cell_only(tmp_path: Path) -> None:
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


@no_cuda_only
def test_doctor_gpu_without_cuda_is_one_line_and_exit_2() -> None:
    proc = kvbench("doctor", "--gpu")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
    assert len(lines) == 1, lines
    assert "CUDA" in lines[0] and "Traceback" not in lines[0]
