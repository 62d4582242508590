"""The ``serve`` runner: a served engine measured from outside, as a serving benchmark measures it,
with the allocation read from inside (docs/runners.md, "A served engine").

Managed mode starts vLLM's OpenAI-compatible server per cell (``runners.serve.process``) with the
``vllm`` runner's engine settings made explicit and ``--scheduler-cls`` set to
``runners.serve.scheduler.KvbenchScheduler``, which writes the in-process runners' step readings
from inside the engine core; it waits for ``/health``, replays the workload open-loop
(``runners.serve.client``), scrapes ``/metrics`` (``runners.serve.metrics``) and records steps,
requests, metrics and the run row. Attach mode (``url``) replays against a running server and
records only the client's timings and the scrape (``check_server``: the server's own policy and
block size). Every serve cell runs on the measured clock: a served engine is timed for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ...harness.errors import KvbenchError, one_line
from ...harness.records.recorder import RunRecorder
from ...harness.records.schema import FAILED, INFEASIBLE, METRICS, OK, REQUESTS
from ...harness.sim.latency import itl_summary
from ...harness.sim.policies import make_policy
from ...harness.sim.scheduler import Arrivals
from ...harness.sim.sequence import FINISHED, Seq
from ...harness.spec.feasibility import explain
from ..base import Cell, RunResult
from ..common import (
    base_row,
    complete_row,
    expand_seqs,
    host_available_bytes,
    requests_columns,
    shortfall,
    write_status_only,
)
from ..prompts import PromptIds
from ..vllm import build as vllm_build
from ..vllm import engine as vllm_engine
from ..vllm import offload
from ..vllm.readings import Occupancy, StepOut, VllmStep
from ..vllm.steps import VllmStepEngine
from . import scheduler as serve_scheduler
from .process import ServerProcess

if TYPE_CHECKING:  # the HTTP modules import aiohttp: only once a cell runs (``unavailable`` says why not)
    from .client import ClientRequest, SampleResult
    from .metrics import Scraper

CLIENT_FINISHED = "finished"  # client.FINISHED
SITE_DIR = Path(__file__).resolve().parent / "site"
SCHEDULER_CLS = f"{serve_scheduler.__name__}.KvbenchScheduler"
SERVED_MODEL = "kvbench"
ATTACH_DETAIL = (
    "attached to a running server: client-side timings and its /metrics only; allocation is "
    "not visible from outside the server, so every allocation column is null, and the policy is "
    "the server's own (checked against its /metrics where it says)"
)
MANAGED_DETAIL = (
    "measured: the served engine's wall time (a served engine is timed for real, so serve cells "
    'take clock = "measured" without being told)'
)
ALLOCATION_RUN_COLUMNS = (
    "steps",
    "computed_tokens",
    "computed_tokens_per_wall_s",
    "preemptions",
    "evictions",
    "prefix_hit_rate",
    "recomputed_hit_tokens",
    "peak_running",
    "mean_running",
    "token_states_frac",
    "reservation_frac",
    "internal_frag_frac",
    "external_frag_frac",
    "free_frac",
    "rounding_frac",
    "peak_kv_bytes_allocated",
    "mean_step_wall_s",
    "wall_tokens_per_s",
)
ALLOCATION_REQUEST_COLUMNS = (
    "first_scheduled_s",
    "num_preemptions",
    "peak_allocated_positions",
    "prefix_hit_tokens",
    "recomputed_hit_tokens",
    "kv_first_block",
    "kv_block_runs",
)


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """``[runners.serve]``: a running server to attach to instead of starting one, how long a
    started server may take to answer ``/health``, how often ``/metrics`` is scraped, and how
    long one request may take."""

    url: str | None = None
    startup_timeout_s: float = 600.0
    metrics_interval_s: float = 1.0
    request_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.url is not None and not (isinstance(self.url, str) and self.url.startswith(("http://", "https://"))):
            raise KvbenchError(f'[runners.serve] url must be "http://host:port", got {self.url!r}')
        for name in ("startup_timeout_s", "metrics_interval_s", "request_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise KvbenchError(f"[runners.serve] {name} must be a positive number of seconds, got {value!r}")

    @staticmethod
    def of(spec: Any) -> ServeSettings:
        """The settings a spec carries (``serve_*`` fields), the defaults where it has none."""
        values = {f.name: getattr(spec, f"serve_{f.name}", None) for f in dataclasses.fields(ServeSettings)}
        return ServeSettings(**{k: v for k, v in values.items() if v is not None})


def free_port() -> int:
    """A TCP port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_requests(cell: Cell, seqs: list[Seq]) -> list[ClientRequest]:
    """One HTTP request per workload request (its samples are its ``n``), in arrival order."""
    from .client import ClientRequest

    prompts = PromptIds(cell)
    first: dict[int, Seq] = {}
    n: dict[int, int] = {}
    for s in seqs:
        first.setdefault(s.request_id, s)
        n[s.request_id] = n.get(s.request_id, 0) + 1
    out = [ClientRequest(rid, tuple(prompts.of(s)), s.output_len, n[rid], s.arrival_s) for rid, s in first.items()]
    return sorted(out, key=lambda r: (r.arrival_s, r.request_id))


def server_command(spec: Any, model: Path, port: int, device: str) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` with every setting of the cell."""
    cache_dtype, model_dtype = vllm_engine.kv_settings(spec, device)
    sched = spec.scheduler
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--dtype",
        model_dtype,
        "--kv-cache-dtype",
        cache_dtype,
        "--block-size",
        str(spec.block_size),
        "--num-gpu-blocks-override",
        str(vllm_engine.num_gpu_blocks(spec)),
        "--max-num-seqs",
        str(sched.max_num_seqs),
        "--max-num-batched-tokens",
        str(sched.max_num_batched_tokens),
        "--max-model-len",
        str(spec.memory.max_model_len),
        "--enable-chunked-prefill",
        "--enable-prefix-caching" if spec.policy == "paged-prefix" else "--no-enable-prefix-caching",
        "--scheduling-policy",
        "fcfs",
        "--no-async-scheduling",
        "--seed",
        str(vllm_engine.ENGINE_SEED),
        "--tensor-parallel-size",
        str(sched.tensor_parallel_size),
        "--scheduler-cls",
        SCHEDULER_CLS,
    ]
    cmd += offload.server_flags(spec)  # a CPU tier: vLLM's native offloading (a GPU only)
    if device == "cpu":
        kv_bytes = vllm_engine.num_gpu_blocks(spec) * spec.block_size * spec.kv_bytes_per_token
        cmd += ["--kv-cache-memory-bytes", str(kv_bytes), "--enforce-eager"]
    else:
        cmd += ["--gpu-memory-utilization", str(vllm_engine.gpu_memory_utilization(vllm_engine.CUDA.free_fraction()))]
        if vllm_engine.enforce_eager_default():
            cmd.append("--enforce-eager")
    return cmd


def server_env(spec: Any, steps_path: Path, hold_for: int, device: str) -> dict[str, str]:
    env = dict(os.environ)
    env[serve_scheduler.STEPS_ENV] = str(steps_path)
    env[serve_scheduler.HOLD_ENV] = str(hold_for)
    env[serve_scheduler.POLICY_ENV] = spec.policy
    env[serve_scheduler.ARENA_ENV] = spec.arena
    env[serve_scheduler.MAX_MODEL_LEN_ENV] = str(spec.memory.max_model_len)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the in-process runner's setting: not the server's
    if device == "cpu":
        env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *filter(None, [env.get("PYTHONPATH")])])
    return env


def wait_healthy(server: ServerProcess, url: str, timeout_s: float) -> None:
    """Until ``/health`` answers 200; a one-line error when the server exits or the time is up."""
    import aiohttp

    from .client import get_text

    deadline = time.monotonic() + timeout_s
    while True:
        if not server.running():
            raise KvbenchError(f"the serve runner: the server exited before it answered /health: {_log_cause(server)}")
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
            status, _ = asyncio.run(get_text(f"{url}/health", 2.0))
            if status == 200:
                return
        if time.monotonic() >= deadline:
            raise KvbenchError(
                f"the serve runner: the server did not answer {url}/health within {timeout_s:g} s "
                f"(startup_timeout_s in [runners.serve]); its log: {server.log}"
            )
        time.sleep(0.5)


def _log_cause(server: ServerProcess) -> str:
    """The line of the server's log that says why it stopped (its last error line)."""
    lines = [ln.strip() for ln in server.log_tail(200).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return one_line(ln)[:300]
    return one_line(lines[-1])[:300] if lines else f"no output (log {server.log})"


def server_allocator(url: str, timeout_s: float = 10.0) -> tuple[str, int] | None:
    """What the server at ``url`` allocates with, by its ``/metrics``: (policy, block size) for a
    vLLM server (paged; ``paged-prefix`` with prefix caching on); None when it does not say (another
    engine, or no ``vllm:cache_config_info``). A one-line ``KvbenchError`` when nothing answers."""
    import aiohttp

    from .client import get_text
    from .metrics import cache_config

    try:
        status, text = asyncio.run(get_text(f"{url}/metrics", timeout_s))
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        why = one_line(str(exc))[:200] or type(exc).__name__
        raise KvbenchError(f"the serve runner: {url}/metrics does not answer: {why}") from None
    labels = cache_config(text) if status == 200 else None
    if labels is None:
        return None
    try:
        block = int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return ("paged-prefix" if labels.get("enable_prefix_caching") == "True" else "paged"), block


def check_server(url: str, policy: str, block_size: int) -> None:
    """Refuse an attached cell whose policy or block size is not what the server at ``url`` runs
    (where its ``/metrics`` says): kvbench cannot apply either to a server it did not start."""
    runs = server_allocator(url)
    if runs is not None and runs != (policy, block_size):
        raise KvbenchError(
            f"the serve runner: the server at {url} runs policy {runs[0]} with block size {runs[1]} (its "
            f"/metrics' vllm:cache_config_info), not {policy} with block size {block_size}: kvbench cannot "
            f"choose the allocator of a server it did not start; name policy = {runs[0]!r} and block_size = "
            f"{runs[1]} for it in [runners.serve]"
        )


def check_attached_servers(cells: Iterable[Cell]) -> None:
    """``check_server`` once per attached server of ``cells`` (before ``kvbench run`` writes anything)."""
    seen: set[tuple[str, str, int]] = set()
    for cell in cells:
        url = getattr(cell.spec, "serve_url", None)
        if cell.spec.runner == "serve" and url:
            key = (str(url).rstrip("/"), cell.spec.policy, cell.spec.block_size)
            if key not in seen:
                seen.add(key)
                check_server(*key)


class _ReplayCache:
    """What ``VllmStepEngine`` reads of a prefix cache watcher, from the server's step file."""

    def __init__(self) -> None:
        self.now: tuple[int, float] = (0, 0.0)
        self.count = 0
        self.steps: list[int] = []
        self.seconds: list[float] = []


class ServerSteps:
    """The server's step file as a ``steps.StepSource`` (one record per ``step()``)."""

    def __init__(self, records: list[dict[str, Any]], seqs: list[Seq], usable_blocks: int, block_bytes: int) -> None:
        self.records = records
        self.usable_blocks = usable_blocks
        self.block_bytes = block_bytes
        # Read as a vllm_build.CacheWatcher is (now, count, steps, seconds), from the step file.
        self.cache: Any = _ReplayCache()
        self._by_key = {(s.request_id, s.sample): s.index for s in seqs}
        self._index: dict[str, int] = {}
        self._preemptions: dict[int, int] = {}
        self._placement: dict[int, tuple[int, int]] = {}
        self.next = 0

    def index(self, rid: str) -> int:
        idx = self._index.get(rid)
        if idx is None:
            key = serve_scheduler.engine_id(rid)
            if key is None or key not in self._by_key:
                raise KvbenchError(
                    f"the serve runner: the server scheduled a request kvbench did not send ({rid!r}); "
                    "another client is using it"
                )
            idx = self._index[rid] = self._by_key[key]
        return idx

    def add(
        self, seq_index: int, prompt_ids: list[int], output_len: int, arrival_s: float, answer: list[int] | None = None
    ) -> None:
        pass  # the client sent it

    def has_unfinished(self) -> bool:
        return self.next < len(self.records)

    def num_preemptions(self, seq_index: int) -> int | None:
        return self._preemptions.get(seq_index)

    def placement(self, seq_index: int) -> tuple[int, int] | None:
        return self._placement.get(seq_index)

    def step(self) -> VllmStep | None:
        rec = self.records[self.next]
        self.next += 1
        ix = self.index
        out = StepOut(
            scheduled=[(ix(r), n, c, b) for r, n, c, b in rec["sched"]],
            admitted=[(ix(r), hit) for r, hit in rec["admitted"]],
            preempted=[ix(r) for r in rec["preempted"]],
            scheduled_tokens=int(rec["tokens"]),
            handle=None,
        )
        occ = Occupancy(**rec["occ"])
        for rid, count in rec["npre"].items():
            self._preemptions[ix(rid)] = int(count)
        for rid, (first, runs) in rec["placed"].items():
            self._placement[ix(rid)] = (int(first), int(runs))
        if self.cache is not None:
            self.cache.count = int(rec["evicted"])
            for steps, seconds in rec["reuse"]:
                self.cache.steps.append(int(steps))
                self.cache.seconds.append(float(seconds))
        wall = float(rec["t1"]) - float(rec["t0"])
        got = [ix(r) for r in rec["got"]]
        fin = [ix(r) for r in rec["fin"]]
        return VllmStep(out, occ, got, fin, wall, occ.allocated_blocks * self.block_bytes)


def _flush_only(rec: dict[str, Any]) -> bool:
    """A step that schedules nothing with nothing running or waiting: the engine core only tells
    its workers which requests finished (the in-process engine folds that into its next step)."""
    occ = rec["occ"]
    return not rec["tokens"] and not occ["running"] and not occ["waiting"] and not rec["got"] and not rec["fin"]


def read_steps(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The server's step file: (header, step records); a torn last line (a killed server) is dropped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise KvbenchError(f"the serve runner: the server wrote no step file ({exc.strerror}): {path}") from None
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    if not records or "pool" not in records[0]:
        raise KvbenchError(
            f"the serve runner: the server's step file has no header: was it started with --scheduler-cls "
            f"{SCHEDULER_CLS}? ({path})"
        )
    return records[0], records[1:]


def metrics_table(rows: list[dict[str, float | None]]) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in METRICS.names}
    return pa.Table.from_pydict(cols, schema=METRICS)


def _apply_client(seqs: list[Seq], results: list[SampleResult]) -> dict[int, list[float]]:
    """Client times onto the sequences; each sequence's chunk times (``itl_*``: one gap per chunk,
    as ``vllm bench serve`` measures ITL)."""
    by_key = {(r.request_id, r.sample): r for r in results}
    times: dict[int, list[float]] = {}
    for s in seqs:
        r = by_key[(s.request_id, s.sample)]
        s.num_output = r.tokens
        s.sent_s = r.sent_s
        s.token_times = list(r.chunk_times)
        s.first_token_s = r.chunk_times[0] if r.chunk_times else math.nan
        if r.status == CLIENT_FINISHED:
            s.status, s.finished_s = FINISHED, r.end_s
        else:
            s.status, s.finished_s = "unfinished", math.nan
        times[s.index] = r.chunk_times
    return times


def client_columns(seqs: list[Seq], results: list[SampleResult]) -> dict[str, list]:
    """The requests table of a replay: what the sequences hold, with the client's status and each
    chunk's token count."""
    cols = requests_columns(seqs)
    mine = _by_seq(seqs, results)
    cols["status"] = [r.status for r in mine]
    cols["token_counts"] = [list(r.chunk_tokens) for r in mine]
    return cols


def _outcome(results: list[SampleResult]) -> tuple[str, str | None]:
    bad = [r for r in results if r.status != CLIENT_FINISHED]
    if not bad:
        return OK, None
    why = one_line(f"{len(bad)} of {len(results)} requests did not finish ({bad[0].status}: {bad[0].error})")
    return FAILED, why[:500]


class ServeRunner:
    name = "serve"

    def __init__(self, settings: ServeSettings | None = None) -> None:
        self.settings = settings  # None: each cell's own ([runners.serve])

    def unavailable(self) -> str | None:
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            return 'the serve runner needs aiohttp: pip install -e ".[serve]"'
        return None

    def run(self, cell: Cell) -> RunResult:
        settings = self.settings or ServeSettings.of(cell.spec)
        seqs = expand_seqs(cell)
        if any(s.after >= 0 for s in seqs):
            raise KvbenchError(
                "the serve runner replays a workload open-loop; a multi-turn workload's turns wait on "
                "each other (run it on sim or vllm)"
            )
        if settings.url is not None:
            return self._attach(cell, seqs, settings)
        return self._managed(cell, seqs, settings)

    # -- a server of kvbench's own --------------------------------------------------------
    def _managed(self, cell: Cell, seqs: list[Seq], settings: ServeSettings) -> RunResult:
        spec = cell.spec
        reason = vllm_build.unavailable()
        if reason is not None:
            raise KvbenchError(reason)
        build = vllm_build.installed_build()
        assert build is not None
        device = build.device
        if spec.memory.cpu_offload_bytes and device == "cpu":
            raise KvbenchError(f"the serve runner with a CPU tier: {offload.NEEDS_GPU}")
        vllm_engine.check_spec(spec, device)
        self._check_clock(spec)
        row = base_row(cell, self.name)
        row["clock_detail"] = MANAGED_DETAIL
        short = shortfall(cell, seqs, make_policy(spec))
        if short is not None:
            return write_status_only(cell, row, INFEASIBLE, explain(short, spec.geometry, spec.model.kv_dtype))
        refused = vllm_engine.check_max_model_len(cell)
        if refused is None and device == "cpu":
            refused = vllm_engine.check_host_memory(spec, host_available_bytes())
        if refused is not None:
            return write_status_only(cell, row, INFEASIBLE, refused)
        if device == "cuda" and not vllm_engine.CUDA.available():
            raise KvbenchError(vllm_engine.NO_CUDA)
        dev = vllm_engine.CPU if device == "cpu" else vllm_engine.CUDA
        row["device"] = dev.device_name()
        row["cuda_version"] = dev.cuda_version()
        requests = client_requests(cell, seqs)
        batch = all(s.arrival_s == 0 for s in seqs)
        with tempfile.TemporaryDirectory(prefix="kvbench-serve-") as tmp:
            scratch = Path(tmp)
            model = vllm_engine.model_dir(spec, scratch)
            steps_path = scratch / "steps.jsonl"
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = server_command(spec, model, port, device)
            env = server_env(spec, steps_path, len(seqs) if batch else 0, device)
            with _server(cmd, env, scratch / "server.log") as server:
                t_start = time.perf_counter()
                wait_healthy(server, url, settings.startup_timeout_s)
                if cell.progress:
                    sys.stderr.write(f"  vllm server up on {url} in {time.perf_counter() - t_start:.1f} s\n")
                results, scraper, t0_wall, replay_s = self._replay(url, SERVED_MODEL, requests, settings)
                if not server.running():
                    raise KvbenchError(f"the serve runner: the server died during the replay: {_log_cause(server)}")
            header, records = read_steps(steps_path)
            return self._record(cell, seqs, row, header, records, results, scraper, t0_wall, replay_s)

    @staticmethod
    def _check_clock(spec: Any) -> None:
        if spec.scheduler.clock != "measured":
            raise KvbenchError(
                f'the serve runner times a real server: it runs on clock = "measured" only (clock is '
                f'{spec.scheduler.clock!r}; set clock = "measured" in [runners.serve])'
            )

    def _replay(
        self, url: str, model: str, requests: list[ClientRequest], settings: ServeSettings
    ) -> tuple[list[SampleResult], Scraper, float, float]:
        from .client import replay
        from .metrics import Scraper

        t0 = time.perf_counter()
        t0_wall = time.time()
        scraper = Scraper(url, settings.metrics_interval_s, t0)
        results = asyncio.run(replay(url, model, requests, settings.request_timeout_s, t0, scraper.run))
        replay_s = time.perf_counter() - t0
        scraper.final()()
        return results, scraper, t0_wall, replay_s

    def _record(
        self,
        cell: Cell,
        seqs: list[Seq],
        row: dict[str, object],
        header: dict[str, Any],
        records: list[dict[str, Any]],
        results: list[SampleResult],
        scraper: Scraper,
        t0_wall: float,
        replay_s: float,
    ) -> RunResult:
        spec = cell.spec
        usable = spec.budget_blocks
        if header["pool"] != usable + 1:
            raise KvbenchError(
                f"the server made a pool of {header['pool']} blocks, expected {usable + 1} "
                f"(the budget's {usable} + its null block)"
            )
        block_bytes = int(header["block_bytes"])
        if block_bytes != spec.block_size * spec.kv_bytes_per_token:
            raise KvbenchError(
                f"the server's KV cache holds {block_bytes:,} B per block of {spec.block_size}, kvbench's "
                f"geometry {spec.block_size * spec.kv_bytes_per_token:,} B: the runs would not share one budget"
            )
        records = [r for r in records if not _flush_only(r)]
        source = ServerSteps(records, seqs, usable, block_bytes)
        if spec.policy != "paged-prefix":
            source.cache = None
        engine = VllmStepEngine(cell, seqs, source, Arrivals(seqs))
        recorder = RunRecorder(cell.out, cell.run_id, spec.budget_positions)
        try:
            for rec in records:
                engine.now = float(rec["t0"]) - t0_wall
                step = engine.step()
                if step is not None:
                    recorder.add_step(step)
            engine_columns = engine.finish()
        except BaseException:
            recorder.abort()
            raise
        token_times = _apply_client(seqs, results)
        row = complete_row(row, recorder, seqs, replay_s, replay_s)
        row.update(engine_columns)
        row.update(itl_summary(seqs, token_times))
        status, error = _outcome(results)
        row.update(status=status, error=error)
        cols = client_columns(seqs, results)
        return RunResult(cell.run_id, recorder.finish(cols, row, metrics_table(scraper.rows)))

    # -- a running server ---------------------------------------------------------------
    def _attach(self, cell: Cell, seqs: list[Seq], settings: ServeSettings) -> RunResult:
        spec = cell.spec
        self._check_clock(spec)
        from .client import model_name

        url = str(settings.url).rstrip("/")
        try:
            model = model_name(url)
        except Exception as exc:  # no answer, not JSON, not OpenAI-compatible
            why = one_line(str(exc))[:200] or type(exc).__name__
            raise KvbenchError(
                f"the serve runner: {url} does not answer as an OpenAI-compatible server: {why}"
            ) from None
        check_server(url, spec.policy, spec.block_size)
        row = base_row(cell, self.name)
        row.update(device=f"server at {url}", clock_detail=ATTACH_DETAIL)
        results, scraper, _, replay_s = self._replay(url, model, client_requests(cell, seqs), settings)
        token_times = _apply_client(seqs, results)
        recorder = RunRecorder(cell.out, cell.run_id, spec.budget_positions)
        row = complete_row(row, recorder, seqs, replay_s, replay_s)
        row.update(itl_summary(seqs, token_times))
        row.update(dict.fromkeys(ALLOCATION_RUN_COLUMNS))
        status, error = _outcome(results)
        row.update(status=status, error=error)
        cols = client_columns(seqs, results)
        for name in ALLOCATION_REQUEST_COLUMNS:
            if name in cols:
                cols[name] = [None] * len(seqs)
        return RunResult(cell.run_id, recorder.finish(cols, row, metrics_table(scraper.rows)))


def _by_seq(seqs: list[Seq], results: list[SampleResult]) -> list[SampleResult]:
    by_key = {(r.request_id, r.sample): r for r in results}
    return [by_key[(s.request_id, s.sample)] for s in seqs]


@contextlib.contextmanager
def _server(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[ServerProcess]:
    """The server for the block's duration; ended on every way out of it."""
    server = ServerProcess(cmd, env, log)
    try:
        yield server
    finally:
        server.stop()


assert set(ALLOCATION_REQUEST_COLUMNS) <= set(REQUESTS.names) | {"recomputed_hit_tokens"}
