"""The ``serve`` runner: a real ``vllm serve`` (vLLM's CPU build here), real HTTP, real Parquet.

- a batch replayed over HTTP gives the same step rows, in every allocation column, as the
  in-process ``vllm`` runner on the same work (the server holds its first step until the whole
  batch is in: ``runners.serve.scheduler``), and every request, the ``metrics`` table and the
  client's latencies are recorded;
- killing ``kvbench run`` with SIGINT, SIGTERM or SIGKILL leaves no process of the server and no
  listening port;
- a server that does not come up in time, a port already taken, a URL that does not answer:
  one line, a ``failed`` row, and the sweep goes on;
- attach mode against a running server (kvbench's own managed one): client timings and
  ``/metrics`` only, allocation null.

The parts that need no server (the metrics parser, request ids, the watchdog, settings) run on
every install; the rest skip, with the reason, where vLLM's engine cannot run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kvbench.app.cell import run_cell
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import store
from kvbench.runners.serve import process as serve_process
from kvbench.runners.serve import runner as serve
from kvbench.runners.serve import scheduler as serve_scheduler
from kvbench.runners.serve.metrics import num_gpu_blocks, parse_metrics

from tests.conftest import ROOT, interactive_signals, suite_toml
from tests.enginekit import needs_engine

API_SERVER = b"vllm.entrypoints.openai.api_server"

ALLOCATION = [
    "running",
    "waiting",
    "admitted",
    "finished",
    "preempted",
    "scheduled_tokens",
    "allocated_blocks",
    "used_positions",
    "reserved_positions",
    "internal_frag_positions",
    "external_frag_positions",
    "free_positions",
    "evicted_blocks",
    "prefix_hit_tokens",
    "kv_bytes_allocated",
    "scheduled_seqs",
    "context_tokens",
    "attention_pairs",
]


# llama-mini at bf16: 1,536 B of KV per token; 1 MiB = 682 positions = 21 blocks of 32: a batch of
# 24 requests preempts. Small enough that a server starts in ~30 s on two cores.
def suite_text(
    runners: str = '["serve"]', n: int = 24, arrival: str = "batch", budget: str = "1MiB", serve_settings: str = ""
) -> str:
    """The suite; ``serve_settings``: the lines of a ``[runners.serve]`` table."""
    workload: dict[str, object] = dict(
        source="uniform", prompt_min=32, prompt_max=256, output_min=16, output_max=128, num_requests=n
    )
    workload.update(arrival=arrival, rate=20.0 if arrival == "poisson" else None, seed=1)
    text = suite_toml(
        "serve-test",
        model={"preset": "llama-mini", "kv_dtype": "bf16"},
        memory={"kv_budget": budget, "max_model_len": 512},
        workload=workload,
        scheduler={"max_num_seqs": 32, "max_num_batched_tokens": 512, "clock": "measured"},
        run={"device": "cpu"},
        grid=f'runner = {runners}\npolicy = ["paged"]\nblock_size = [32]\n',
    )
    return text + (f"[runners.serve]\n{serve_settings}\n" if serve_settings else "")


def cells_of(text: str, out: Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    return build_cells(parse_suite(text, str(out / "suite.toml")), out, lambda msg: None)


def server_processes() -> list[int]:
    """Pids of live processes running kvbench's server or its engine core (this test's only)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and (b"serve.scheduler.KvbenchScheduler" in cmd or cmd.startswith(b"VLLM::EngineCore")):
            found.append(int(entry))
    return found


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_gone(seconds: float = 30.0) -> list[int]:
    end = time.monotonic() + seconds
    while (left := server_processes()) and time.monotonic() < end:
        time.sleep(0.2)
    return left


# -- without a server ------------------------------------------------------------------------


def test_metrics_parser_reads_vllm_families() -> None:
    text = "\n".join(
        [
            "# HELP vllm:kv_cache_usage_perc KV-cache usage.",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
            'vllm:num_preemptions_total{engine="0",model_name="m"} 7.0',
            'vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9',
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0',
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0',
            'vllm:cache_config_info{block_size="32",num_gpu_blocks="65"} 1.0',
        ]
    )
    got = parse_metrics(text)
    tier = ("external_prefix_cache_queries", "external_prefix_cache_hits", "kv_offload_load_bytes")
    assert got == {
        "kv_cache_usage_frac": 0.25,
        "num_requests_running": 3.0,
        "num_requests_waiting": 1.0,
        "num_preemptions": 7.0,
        "prefix_cache_queries": 100.0,
        "prefix_cache_hits": 40.0,
        **dict.fromkeys(tier, None),
        "kv_offload_store_bytes": None,
    }
    offload = "\n".join(  # a server with a CPU tier: its connector's counters, summed over label sets
        [
            'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 60.0',
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 32.0',
            'vllm:kv_offload_load_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 4096.0',
            'vllm:kv_offload_store_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 2048.0',
            'vllm:kv_offload_store_bytes_total{engine="1",model_name="m",transfer_type="GPU_to_CPU"} 1024.0',
            'vllm:kv_offload_load_size_bucket{engine="0",le="1.0"} 3.0',
        ]
    )
    assert {k: v for k, v in parse_metrics(offload).items() if v is not None} == {
        "external_prefix_cache_queries": 60.0,
        "external_prefix_cache_hits": 32.0,
        "kv_offload_load_bytes": 4096.0,
        "kv_offload_store_bytes": 3072.0,
    }
    assert num_gpu_blocks(text) == 65
    assert parse_metrics("other_metric 1\n")["kv_cache_usage_frac"] is None


def test_engine_ids_map_to_kvbench_requests() -> None:
    assert serve_scheduler.engine_id("cmpl-kvb17-0-1a2b3c4d") == (17, 0)
    assert serve_scheduler.engine_id("2_cmpl-kvb17-0-1a2b3c4d") == (17, 2)
    assert serve_scheduler.engine_id("cmpl-0f3a-0-1a2b3c4d") is None


def test_scheduler_module_imports_without_vllm() -> None:
    # kvbench's process reads its constants; only the engine core builds the class (importing vLLM).
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, kvbench.runners.serve.scheduler; print('vllm' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "False"


def test_settings_refuse_bad_values() -> None:
    with pytest.raises(KvbenchError, match="url"):
        serve.ServeSettings(url="127.0.0.1:8000")
    with pytest.raises(KvbenchError, match="startup_timeout_s"):
        serve.ServeSettings(startup_timeout_s=0)


def test_watchdog_ends_the_group_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A parent that dies by SIGKILL takes the server's whole process group with it."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from kvbench.runners.serve.process import ServerProcess\n"
        "cmd = [sys.executable, '-c', 'import subprocess, sys, time; "
        'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]); time.sleep(600)\']\n'
        f"p = ServerProcess(cmd, {{}}, Path({str(tmp_path / 'log')!r}))\n"
        "print(p.pgid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert parent.stdout is not None
    pgid = int(parent.stdout.readline())
    time.sleep(1.0)  # the server's own child is up
    assert serve_process.group_alive(pgid)
    parent.kill()
    parent.wait()
    end = time.monotonic() + 20
    while serve_process.group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.1)
    assert not serve_process.group_alive(pgid)


def test_serve_settings_come_from_the_suite(tmp_path: Path) -> None:
    """``[runners.serve]``: the URL is part of the run's identity (another server is another
    measurement), the timeouts are not; a malformed value or a serve key under another runner is
    one line."""
    (plain,) = cells_of(suite_text(n=2), tmp_path / "a")
    (timed,) = cells_of(
        suite_text(n=2, serve_settings="startup_timeout_s = 30\nmetrics_interval_s = 0.5"), tmp_path / "b"
    )
    (attached,) = cells_of(suite_text(n=2, serve_settings='url = "http://127.0.0.1:8000"'), tmp_path / "c")
    assert serve.ServeSettings.of(timed.spec) == serve.ServeSettings(startup_timeout_s=30, metrics_interval_s=0.5)
    assert serve.ServeSettings.of(attached.spec).url == "http://127.0.0.1:8000"
    assert plain.run_id == timed.run_id != attached.run_id
    with pytest.raises(KvbenchError, match="url must be"):
        cells_of(suite_text(n=2, serve_settings='url = "127.0.0.1:8000"'), tmp_path / "d")
    with pytest.raises(KvbenchError, match="unknown key 'url' in \\[runners.sim\\]"):
        text = suite_text(n=2, runners='["sim"]') + '[runners.sim]\nurl = "http://127.0.0.1:8000"\n'
        cells_of(text.replace('clock = "measured"', 'clock = "steps"'), tmp_path / "e")


def test_url_that_does_not_answer_is_a_failed_row(tmp_path: Path) -> None:
    port = serve.free_port()  # nothing listens there
    (cell,) = cells_of(suite_text(n=2, serve_settings=f'url = "http://127.0.0.1:{port}"'), tmp_path)
    row = run_cell(cell)
    assert row["status"] == "failed"
    assert f"http://127.0.0.1:{port} does not answer" in row["error"]
    assert "\n" not in row["error"]


# -- a real server ----------------------------------------------------------------------------


@needs_engine
def test_batch_steps_equal_the_in_process_engine(tmp_path: Path) -> None:
    """Every allocation column of every step, served over HTTP and in-process: equal."""
    rows = {}
    steps = {}
    for cell in cells_of(suite_text(runners='["serve", "vllm"]'), tmp_path):
        row = run_cell(cell)
        assert row["status"] == "ok", row["error"]
        rows[row["runner"]] = row
        steps[row["runner"]] = (
            store.read_table(tmp_path, "steps", {row["run_id"]}).sort_values("step").reset_index(drop=True)
        )
    served, local = steps["serve"], steps["vllm"]
    assert rows["serve"]["preemptions"] > 0  # the budget is tight enough to preempt
    assert len(served) == len(local)
    assert served[ALLOCATION].equals(local[ALLOCATION])
    assert rows["serve"]["preemptions"] == rows["vllm"]["preemptions"]
    run_id = rows["serve"]["run_id"]
    requests = store.read_table(tmp_path, "requests", {run_id})
    assert (requests["status"] == "finished").all() and len(requests) == 24
    assert (requests["first_token_s"] >= requests["first_scheduled_s"]).all()
    assert (requests["finished_s"] >= requests["first_token_s"]).all()
    local_requests = store.read_table(tmp_path, "requests", {rows["vllm"]["run_id"]}).sort_values("request_id")
    assert requests.sort_values("request_id")["num_preemptions"].tolist() == local_requests["num_preemptions"].tolist()
    metrics = store.read_table(tmp_path, "metrics", {run_id})
    assert len(metrics) >= 1 and metrics["num_preemptions"].iloc[-1] == rows["serve"]["preemptions"]
    assert rows["serve"]["ttft_p50_s"] > 0 and rows["serve"]["itl_p50_s"] is not None
    assert not wait_gone()


def _start_kvbench(tmp_path: Path) -> subprocess.Popen:
    suite = tmp_path / "s.toml"
    suite.write_text(suite_text(n=6, arrival="poisson"))
    return subprocess.Popen(
        [sys.executable, "-m", "kvbench.app.cli", "run", str(suite), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interactive_signals,
    )


def _server_port() -> int | None:
    for pid in server_processes():
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--port" in cmd:
            return int(cmd[cmd.index(b"--port") + 1])
    return None


def _server_up() -> bool:
    """The server itself (the watchdog's child), not only the watchdog, is running."""
    for pid in server_processes():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", API_SERVER]:
                return True
    return False


@needs_engine
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_killing_kvbench_ends_the_server(tmp_path: Path, sig: signal.Signals) -> None:
    """Sent as soon as the server process is there (``test_attach_mode...`` kills the parent of a
    server whose engine core is up)."""
    proc = _start_kvbench(tmp_path)
    try:
        end = time.monotonic() + 120
        port = None
        while time.monotonic() < end and proc.poll() is None:
            port = _server_port()
            if port is not None and _server_up():
                break
            time.sleep(0.1)
        assert port is not None, "the server did not start"
        proc.send_signal(sig)
        proc.wait(timeout=60)
        if sig != signal.SIGKILL:
            assert proc.returncode != 0 and "Traceback" not in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not wait_gone(), "a server process outlived kvbench"
    assert not listening(port)


@needs_engine
def test_server_that_does_not_come_up_in_time(tmp_path: Path) -> None:
    (cell,) = cells_of(suite_text(n=2, serve_settings="startup_timeout_s = 2"), tmp_path)
    row = run_cell(cell)
    assert row["status"] == "failed"
    assert "did not answer" in row["error"] and "within 2 s" in row["error"]
    assert not wait_gone()


@needs_engine
def test_port_taken_is_a_failed_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(serve, "free_port", lambda: port)
        (cell,) = cells_of(suite_text(n=2), tmp_path)
        row = run_cell(cell)
    assert row["status"] == "failed"
    assert "exited before it answered /health" in row["error"], row["error"]
    assert not wait_gone()


PARENT = """
import sys, time
from pathlib import Path
from kvbench.runners.serve import runner as serve
from kvbench.runners.vllm import engine as vllm_engine
from kvbench.runners.serve.process import ServerProcess
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
tmp = Path(sys.argv[1])
(cell,) = build_cells(parse_suite(Path(sys.argv[2]).read_text(), str(tmp / "s.toml")), tmp / "p", lambda m: None)
port = serve.free_port()
cmd = serve.server_command(cell.spec, vllm_engine.model_dir(cell.spec, tmp), port, "cpu")
server = ServerProcess(cmd, serve.server_env(cell.spec, tmp / "steps.jsonl", 0, "cpu"), tmp / "server.log")
serve.wait_healthy(server, f"http://127.0.0.1:{port}", 300)
print(port, flush=True)
time.sleep(600)
"""


@needs_engine
def test_attach_mode_records_client_side_only(tmp_path: Path) -> None:
    """Attached to a running server (started by another process the way the runner starts its
    own); then that process is killed (SIGKILL), and its server, engine core included, goes."""
    text = suite_text(n=6, arrival="poisson")
    (tmp_path / "p").mkdir()
    (tmp_path / "s.toml").write_text(text)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), str(tmp_path / "s.toml")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        port = int(parent.stdout.readline())
        (cell,) = cells_of(text, tmp_path / "a")
        runner = serve.ServeRunner(serve.ServeSettings(url=f"http://127.0.0.1:{port}"))
        result = runner.run(cell)
        assert any(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"VLLM::EngineCore") for p in server_processes())
    finally:
        parent.kill()
        parent.wait()
    assert not wait_gone(), "the server outlived the process that started it"
    assert not listening(port)
    row = result.row
    assert row["status"] == "ok", row["error"]
    assert row["steps"] is None and row["preemptions"] is None and row["token_states_frac"] is None
    assert "allocation is not visible" in row["clock_detail"]
    requests = store.read_table(tmp_path / "a", "requests", {result.run_id})
    assert (requests["status"] == "finished").all() and len(requests) == 6
    assert requests["first_scheduled_s"].isna().all() and requests["num_preemptions"].isna().all()
    assert (requests["finished_s"] > requests["first_token_s"]).all()
    assert len(store.read_table(tmp_path / "a", "metrics", {result.run_id})) >= 1
