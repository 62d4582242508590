"""Shared test helpers: run a suite given as TOML text in-process, read its records."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells, run_cell
from kvbench.harness.records import store
from kvbench.harness.spec.capabilities import is_contiguous
from kvbench.harness.spec.specs import MemorySpec, ModelSpec, RunSpec, SchedulerSpec
from kvbench.harness.spec.workload_spec import WorkloadSpec
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

Section = Mapping[str, object] | str


def interactive_signals() -> None:
    """``preexec_fn`` of a kvbench child that a test interrupts: what a terminal's child gets, SIGINT
    at its default. A test runner started in the background of a non-interactive shell (``cmd &``)
    ignores SIGINT, an ignored disposition survives exec, and Python then installs no Ctrl-C
    handler: the Ctrl-C cases would test the launcher, not kvbench."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def toml_value(value: object) -> str:
    """A Python value as TOML: strings quoted (JSON's escapes are TOML's), lists bracketed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def _table(header: str, body: Section) -> str:
    if isinstance(body, str):
        return f"[{header}]\n{body.strip(chr(10))}\n"
    return f"[{header}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items() if v is not None)


def suite_toml(name: str | None = "t", top: Mapping[str, object] | None = None, **sections: Section | None) -> str:
    """The one place test suites are written: ``name`` (None: none) and the ``top`` keys, then a table per
    section in the order given. A section is a mapping (keys set to None are left out) or a
    TOML body as text; None leaves it out. ``workloads``, ``grids`` and ``runners`` map each name
    to its section (``[workloads.NAME]``, ``[grids.NAME]``, ``[runners.NAME]``)."""
    text = _table("", {"name": name, **(top or {})}).removeprefix("[]\n")
    for section, body in sections.items():
        if body is None:
            continue
        if section in ("workloads", "grids", "runners"):
            assert isinstance(body, Mapping), section
            text += "".join(_table(f"{section}.{key}", sub) for key, sub in body.items())  # type: ignore[arg-type]
        else:
            text += _table(section, body)
    return text


def serve_suite(
    url: str, policies: Sequence[str] = ("paged",), scheduler: Section | None = None, **serve: object
) -> str:
    """Three short requests to the server at ``url`` (the serve runner's attach mode); ``serve``
    adds to its [runners.serve] table."""
    return suite_toml(
        "served",
        model={"preset": "llama-mini", "kv_dtype": "bf16"},
        memory={"kv_budget": "6MiB", "max_model_len": 1024},
        workload={"source": "fixed", "prompt_len": 8, "output_len": 5, "num_requests": 3, "arrival": "batch"},
        scheduler=scheduler,
        grid={"runner": ["serve"], "policy": list(policies), "block_size": [16]},
        runners={"serve": {"url": url, "request_timeout_s": 20, **serve}},
    )


def one_workload_suite(**settings: object) -> str:
    """One workload, one scheduler, a grid of runners and policies: the suite the agreement tests
    (sim, vLLM's scheduler, the engine) build their cases from. ``settings`` over its defaults:
    ``policy`` (one) or ``policies`` (a TOML list); contiguous cells reserve whole blocks, as
    vLLM's runners do, unless ``contiguous_unit`` says otherwise (None: each runner's default);
    ``model_extra`` is TOML text added to [model]."""
    s: dict[str, object] = dict(
        name="t",
        kv_dtype="fp16",
        preemption="recompute",
        clock="steps",
        policy="paged",
        arena="first-fit",
        contiguous_unit="block",
        model_extra="",
    )
    s.update(settings)
    policies = s.get("policies", f'["{s["policy"]}"]')
    # a config in ``model_extra`` is the model: a preset beside it would be read by no cell
    preset = "" if "config =" in str(s["model_extra"]) else f"preset = {toml_value(s['preset'])}\n"
    model = f"{preset}kv_dtype = {toml_value(s['kv_dtype'])}\n{s['model_extra']}"
    return suite_toml(
        str(s["name"]),
        model=model,
        memory={"kv_budget": s["budget"], "max_model_len": s["max_model_len"]}
        | {k: s[k] for k in ("cpu_offload", "offload_policy") if k in s},
        workload=str(s["workload"]),
        scheduler={
            "max_num_seqs": s["max_num_seqs"],
            "max_num_batched_tokens": s["max_num_batched_tokens"],
            "preemption": s["preemption"],
            "clock": s["clock"],
        },
        grid=f"runner = {s['runners']}\npolicy = {policies}\nblock_size = [{s['block_size']}]\n"
        # a contiguous reservation's settings, where a contiguous policy reads them (kvbench refuses a
        # setting no cell reads)
        + (
            f'arena = "{s["arena"]}"\n'
            + (f'contiguous_unit = "{s["contiguous_unit"]}"\n' if s["contiguous_unit"] else "")
            if any(is_contiguous(p) for p in tomllib.loads(f"p = {policies}")["p"])
            else ""
        ),
    )


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


# -- results directories the app tests share (made once per session, copied where a test changes one)

EXAMPLE = (ROOT / "suites" / "example.toml").read_text(encoding="utf-8")
SMALL = EXAMPLE.replace("num_requests = 200", "num_requests = 20")  # 4 sim cells, well under a second each


# A valid Llama-shaped config.json, for the tests that change one field of it.
LLAMA_CONFIG = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 1000,
}


def suite_file(folder: Path, text: str = SMALL, name: str = "suite.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small suite and its results directory, with its report."""
    root = tmp_path_factory.mktemp("recorded")
    suite = suite_file(root)
    proc = kvbench("run", suite, "--out", root / "out", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return suite, root / "out"


def plant_link(out: Path, other: Path, what: str) -> None:
    """Replace ``what`` of results directory ``out`` (a folder or file, or ``TABLE/run_id=*``: its
    first partition) by a symbolic link to the same place in ``other``."""
    if what.endswith("*"):
        table = what.split("/")[0]
        victim = sorted((out / table).glob("run_id=*"))[0]
        target = other / table / victim.name
    else:
        victim, target = out / what, other / what
    if victim.is_dir() and not victim.is_symlink():
        shutil.rmtree(victim)
    elif os.path.lexists(victim):
        victim.unlink()
    victim.symlink_to(target, target_is_directory=target.is_dir())


def copy_of(recorded: tuple[Path, Path], tmp_path: Path, name: str = "out") -> tuple[Path, Path]:
    """The small suite written into ``tmp_path``, and a copy of ``recorded``'s results there."""
    dest = tmp_path / name
    shutil.copytree(recorded[1], dest, symlinks=True)
    return suite_file(tmp_path), dest


@pytest.fixture(scope="session")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory with one ok run, imported from vllm bench serve's detailed result."""
    out = tmp_path_factory.mktemp("imported") / "R"
    proc = kvbench("import", DATA / "vllm_bench_serve_detailed.json", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


def import_holding_infinity(out: Path) -> None:
    """vllm bench serve's summary-only result imported into ``out``, its run's ttft_p99_s then made
    infinite: a statistic that came in as infinity before import refused it."""
    import pyarrow.parquet as pq

    proc = kvbench("import", DATA / "vllm_bench_serve_summary.json", "--out", out)
    assert proc.returncode == 0, proc.stderr
    (rid,) = store.existing_run_ids(out)
    path = store.partition_dir(out, "runs", rid) / store.PART
    table = pq.read_table(path)
    frame = table.to_pandas()
    frame["ttft_p99_s"] = float("inf")
    pq.write_table(table.from_pandas(frame, schema=table.schema, preserve_index=False), path)


# -- a served run: the serve runner's attach mode on the stand-in server of tests/streamkit.py -----

# What the stand-in server says it runs (its /metrics' vllm:cache_config_info).
SERVED_CACHE_CONFIG = {"block_size": "16", "enable_prefix_caching": "False", "num_gpu_blocks": "512"}
# Issue #45's stream: chunks at 0.10 s (1 token), 0.15 s (2) and 0.20 s (2).
SERVED_CHUNKS = ((0.10, 1), (0.15, 2), (0.20, 2))


def run_attached(folder: Path, url: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``serve_suite(url)`` run into ``folder``/out: that path, and the finished command."""
    suite = folder / "serve.toml"
    suite.write_text(serve_suite(url))
    out = folder / "out"
    return out, kvbench("run", suite, "--out", out, "--quiet", "--no-report", timeout=300)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory with one attach-mode serve run on the stand-in server streaming
    ``SERVED_CHUNKS``."""
    pytest.importorskip("aiohttp")
    from tests.streamkit import Script, stand_in_server  # aiohttp at import

    with stand_in_server(Script(chunks=SERVED_CHUNKS, cache_config=SERVED_CACHE_CONFIG)) as url:
        out, proc = run_attached(tmp_path_factory.mktemp("served"), url)
    assert proc.returncode == 0, proc.stderr
    return out


def run_spec(**changes: object) -> RunSpec:
    """A ``RunSpec`` of sim/paged at block 16 over every default, with ``changes``."""
    base: dict[str, object] = dict(
        runner="sim",
        policy="paged",
        block_size=16,
        model=ModelSpec(),
        memory=MemorySpec(),
        workload=WorkloadSpec(),
        scheduler=SchedulerSpec(),
    )
    base.update(changes)
    return RunSpec(**base)  # type: ignore[arg-type]
