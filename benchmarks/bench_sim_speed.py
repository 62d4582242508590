"""Benchmark of the ``sim`` runner's speed: fast path vs reference vs vLLM's own scheduler.

All in ONE process, each side measured on the identical cell (same workload table,
precision, budget, scheduler settings) and, where repeated, interleaved so drift on a
shared machine hits both sides alike; medians are reported.

Parts (``--parts``, default ``abc``): (a) the Azure LLM inference trace 2023, its first 5,000
requests and all 19,366, with the trace's arrival times; speed is *simulated tokens per wall
second*: tokens the simulated engine computes (``computed_tokens``) over the step loop's wall
time (the run row's ``wall_s``; ``run()``'s end-to-end time, tables written, is shown too).
(b) scaling, 1k → 1M requests, each in a fresh child process: loop time per request and peak
RSS (``--families`` adds a hash-id trace and conversations, ``FAMILIES``). (p) under memory
pressure, every policy. (w) the workloads users run, every contiguous policy, arena and unit
(``--rows`` picks rows by a word). (h) KV cache groups: the hybrid agreement cases of
``tests/runners/test_agreement_hybrid.py`` (``paged``) and ``test_agreement_hybrid_prefix.py``
(``paged-prefix``) at 30 and 300 requests, against vllm-sched (``--rows`` too). (c) peak
RSS of runs whose step count grows 10× and 100× at the same request count. (f) the fast path
compiled against the same code as Python (``KVBENCH_PURE=1``), in fresh child processes.

docs/performance.md ("``bench_sim_speed.py``") gives each part's settings and the numbers.

Not a test (pytest does not collect ``benchmarks/``). Run from the repository root:

    .venv/bin/python benchmarks/bench_sim_speed.py [--repeats 3] [--skip-full-vllm] [--max-requests 100000]"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.sim import FORM, compiled
from kvbench.harness.spec.specs import ARENAS
from kvbench.runners.base import Cell
from kvbench.runners.sim import SimRunner

TRACE = ROOT / "suites" / "data" / "azure-llm-inference-2023-conv.csv"

SUITE = """
name = "bench-sim-speed"
[model]
preset = "llama-3-8b"
kv_dtype = "fp16"
[memory]
kv_budget = "8GiB"
max_model_len = 4096
[scheduler]
max_num_seqs = 256
max_num_batched_tokens = 2048
clock = "roofline"
gpu = "A100-80GB"
[workload]
{workload}
[grid]
runner = ["sim"]
policy = ["paged"]
block_size = [16]
"""


def cell_for(workload: str, out: Path) -> Cell:
    suite = parse_suite(SUITE.format(workload=workload), "bench.toml")
    cells = build_cells(suite, out, lambda m: None)
    assert len(cells) == 1
    return cells[0]


def trace_workload(limit: int | None) -> str:
    lines = ['source = "trace"', f'path = "{TRACE}"', 'arrival = "trace"']
    if limit is not None:
        lines.append(f"limit = {limit}")
    return "\n".join(lines)


def sharegpt_workload(n: int, rate: float = 5.0) -> str:
    return f'source = "sharegpt"\nnum_requests = {n}\narrival = "poisson"\nrate = {rate}\nseed = 1'


def run_once(cell: Cell, kind: str) -> dict:
    """Run ``cell`` with one runner into a fresh directory; the row plus end-to-end seconds."""
    out = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    if kind == "vllm-sched":
        from kvbench.runners.vllm.sched import VllmSchedRunner

        c = Cell(spec=cell.spec.replace(runner="vllm-sched"), workload=cell.workload, out=out)
        runner = VllmSchedRunner()
    else:
        c = Cell(spec=cell.spec, workload=cell.workload, out=out)
        runner = SimRunner(reference=(kind == "reference"))
    t = time.perf_counter()
    row = dict(runner.run(c).row)
    row["end_to_end_s"] = time.perf_counter() - t
    assert row["status"] == "ok", row.get("error")
    return row


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:8.2f} M" if x >= 1e6 else f"{x / 1e3:8.1f} k"


def part_a(args: argparse.Namespace) -> None:
    print("\n(a) sim (fast path) vs sim reference vs vllm-sched, Azure conv trace, trace arrivals")
    print(
        "    Llama-3-8B fp16, 8 GiB KV, max_model_len 4096, 256 seqs, 2048 batched tokens, roofline A100-80GB, paged/16"
    )
    sizes = [5000, None]
    for limit in sizes:
        label = f"{limit:,} requests" if limit else "full trace"
        cell = cell_for(trace_workload(limit), Path(tempfile.mkdtemp(prefix="bench-wl-")))
        kinds = ["fast", "reference"]
        if limit is not None or not args.skip_full_vllm:
            kinds.append("vllm-sched")
        rows: dict[str, list[dict]] = {k: [] for k in kinds}
        for rep in range(args.repeats):
            for kind in kinds:
                if kind == "vllm-sched" and rep >= args.vllm_repeats:
                    continue
                if kind == "reference" and rep >= max(1, args.repeats // 2 + 1):
                    continue
                rows[kind].append(run_once(cell, kind))
        base = rows["fast"][0]
        print(
            f"\n  {label}: {base['num_requests']:,} requests ({base['dropped_requests']} dropped), "
            f"{base['steps']:,} steps, {base['computed_tokens']:,} computed tokens, "
            f"{base['sim_time_s']:,.0f} simulated s, mean running {base['mean_running']:.1f}"
        )
        print(f"  {'runner':<12}{'runs':>5}{'loop s':>10}{'tokens/s':>13}{'µs/step':>10}{'end-to-end s':>14}")
        med: dict[str, float] = {}
        for kind, rs in rows.items():
            for r in rs:  # every runner computed the same work
                assert (r["steps"], r["computed_tokens"]) == (base["steps"], base["computed_tokens"]), kind
            wall = statistics.median(r["wall_s"] for r in rs)
            e2e = statistics.median(r["end_to_end_s"] for r in rs)
            med[kind] = wall
            print(
                f"  {kind:<12}{len(rs):>5}{wall:>10.3f}{fmt_rate(base['computed_tokens'] / wall):>13}"
                f"{wall / base['steps'] * 1e6:>10.2f}{e2e:>14.3f}"
            )
        print(f"  fast vs reference: {med['reference'] / med['fast']:.1f}x")
        if "vllm-sched" in med:
            print(f"  fast vs vllm-sched: {med['vllm-sched'] / med['fast']:.1f}x   (target: 100x)")
            print(f"  reference vs vllm-sched: {med['vllm-sched'] / med['reference']:.1f}x")


# Parts b and c run these families of workloads (``--families``), each in a fresh child process.
FAMILIES = {
    "sharegpt": "synthetic sharegpt lengths, Poisson 5 req/s, 8 GiB, max_model_len 4096",
    "hash-id": "a hash-id trace (Mooncake form, prompts <= 16k, 250 ms mean gaps), 3 GiB, max_model_len 16384",
    "conversations": "conversations of 6 turns (suites/multi-turn.toml's), 0.5 sessions/s, 3 GiB, max_model_len 8192",
}


def family_cell(family: str, n: int, spread: float, where: Path) -> Cell:
    """``family``'s cell of about ``n`` requests, its arrivals ``spread`` times slower, ``paged``."""
    if family == "sharegpt":
        return Row(family, sharegpt_workload(n, 5.0 / spread), "paged", "8GiB", 4096).cell()
    if family == "hash-id":
        trace = hash_id_trace(where / "hash-ids.jsonl", n)
        return Row(family, hash_ids_workload(trace, spread), "paged").cell()
    return Row(family, sessions_workload(n // 6, 0.5 / spread), "paged", max_len=8192).cell()


def _child(family: str, n: int, spread: float, queue: multiprocessing.Queue) -> None:
    cell = family_cell(family, n, spread, Path(tempfile.mkdtemp(prefix="bench-wl-")))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_once(cell, "fast")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put((r["steps"], r["num_requests"], r["computed_tokens"], r["wall_s"], r["end_to_end_s"], before, after))


def in_child(family: str, n: int, spread: float) -> tuple[int, int, int, float, float, int, int]:
    """Run ``family_cell(family, n, spread)`` in a fresh interpreter (its peak RSS is its own)."""
    queue = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(target=_child, args=(family, n, spread, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def part_b(args: argparse.Namespace) -> None:
    for family in args.families.split(","):
        print(f"\n(b) scaling of the fast path: {FAMILIES[family]}; paged, same model/clock")
        print("    each size in a fresh child process: its peak RSS is its own (workload table, requests, loop)")
        print(
            f"  {'requests':>9}{'steps':>12}{'loop s':>9}{'e2e s':>8}{'tokens/s':>12}{'µs/request':>12}"
            f"{'peak RSS MiB':>14}{'KiB/request':>13}"
        )
        for n in (x for x in (1_000, 10_000, 100_000, 1_000_000) if x <= args.max_requests):
            steps, reqs, tokens, wall, e2e, before, after = in_child(family, n, 1.0)
            print(
                f"  {reqs:>9,}{steps:>12,}{wall:>9.2f}{e2e:>8.1f}{fmt_rate(tokens / wall):>12}"
                f"{wall / reqs * 1e6:>12.1f}{after / 1024:>14.0f}{(after - before) / reqs:>13.2f}",
                flush=True,
            )


def part_c(args: argparse.Namespace) -> None:
    for family in args.families.split(","):
        print(f"\n(c) memory: about 2,000 requests, {FAMILIES[family]},")
        print("    steps grown by spreading the arrivals 0.25x, 2.5x and 25x (a fresh child process each)")
        print(f"  {'spread':>7}{'steps':>11}{'requests':>10}{'RSS before MiB':>16}{'peak RSS MiB':>14}{'wall s':>8}")
        for spread in (0.25, 2.5, 25.0):
            steps, reqs, _, wall, _, before, after = in_child(family, 2000, spread)
            print(f"  {spread:>7}{steps:>11,}{reqs:>10,}{before / 1024:>16.0f}{after / 1024:>14.0f}{wall:>8.2f}")
    print("  (a steps table in memory would take steps x 25 columns x 8 bytes; the recorder holds one row group)")


PRESSURE = {
    # Two workloads under memory pressure (preemptions on every policy vLLM hosts).
    "Azure conv trace, 5,000 req, Llama-3-8B fp16, 4 GiB, block 16": (
        lambda text: text.replace('kv_budget = "8GiB"', 'kv_budget = "4GiB"'),
        lambda: trace_workload(5000),
    ),
    "ShareGPT-like, 1,000 at once, OPT-13B fp16, 12 GiB (the default suite's)": (
        lambda text: (
            text.replace('preset = "llama-3-8b"', 'preset = "opt-13b"')
            .replace('kv_budget = "8GiB"', 'kv_budget = "12GiB"')
            .replace("max_model_len = 4096", "max_model_len = 2048")
        ),
        lambda: 'source = "sharegpt"\nnum_requests = 1000\narrival = "batch"\nseed = 0',
    ),
}
_SHARED_PREFIXES = (
    'source = "sharegpt"\nnum_requests = 1000\narrival = "batch"\nseed = 0\nprefix_groups = 8\nprefix_len = 256'
)
SHARED = {
    # paged-prefix where requests share blocks (SharedPrefixPolicy in counted stretches).
    "ShareGPT-like, 1,000 at once, 8 shared 256-token prefixes": (
        PRESSURE[list(PRESSURE)[1]][0],
        lambda: _SHARED_PREFIXES,
    ),
    "ShareGPT-like, 1,000 at once, 8 shared prefixes, 2 samples": (
        PRESSURE[list(PRESSURE)[1]][0],
        lambda: _SHARED_PREFIXES + "\nn = 2",
    ),
}
HOSTED = ("paged", "paged-prefix")  # policies vLLM's own scheduler runs: compared with vllm-sched
OWN = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "virtual-contiguous")  # vs the reference


def pressure_cell(edit, workload: str, policy: str) -> Cell:
    text = edit(SUITE.format(workload=workload)).replace('policy = ["paged"]', f'policy = ["{policy}"]')
    cells = build_cells(parse_suite(text, "bench.toml"), Path(tempfile.mkdtemp(prefix="bench-wl-")), lambda m: None)
    assert len(cells) == 1
    return cells[0]


def part_p(args: argparse.Namespace) -> None:
    print("\n(p) under memory pressure: the fast path vs vllm-sched (policies vLLM hosts) or vs the reference")
    print(f"  {'workload':<66}{'policy':<20}{'preempt':>8}{'fast s':>9}{'other s':>9}{'ratio':>9}  vs")
    runs = [
        (label, edit, workload, policy) for label, (edit, workload) in PRESSURE.items() for policy in (*HOSTED, *OWN)
    ]
    runs += [(label, edit, workload, "paged-prefix") for label, (edit, workload) in SHARED.items()]
    for label, edit, workload, policy in runs:
        cell = pressure_cell(edit, workload(), policy)
        other = "vllm-sched" if policy in HOSTED else "reference"
        fast_s, other_s, rows = [], [], []
        for _ in range(args.repeats):  # interleaved: drift hits both sides alike
            a = run_once(cell, "fast")
            b = (
                run_once(cell, other)
                if len(other_s) < (args.vllm_repeats if other == "vllm-sched" else args.repeats)
                else None
            )
            fast_s.append(a["wall_s"])
            rows.append(a)
            if b is not None:
                other_s.append(b["wall_s"])
                # Identical allocation work on both sides (the tests check every column; this the totals).
                assert (a["steps"], a["preemptions"]) == (b["steps"], b["preemptions"]), (label, policy)
        f, o = statistics.median(fast_s), statistics.median(other_s)
        print(
            f"  {label[:65]:<66}{policy:<20}{rows[0]['preemptions']:>8,}{f:>9.3f}{o:>9.3f}{o / f:>8.1f}x  {other}",
            flush=True,
        )
    print(
        "  (goal: >= 100x vllm-sched for paged, >= 50x for paged-prefix, on both workloads;\n"
        "   >= 20x the reference for the policies vLLM does not host)"
    )


# (w) The workloads users run: a hash-id trace, conversations, a prefill-heavy trace; contiguous policies.
WORKLOAD_SUITE = (
    SUITE.replace('kv_budget = "8GiB"', 'kv_budget = "{budget}"')
    .replace("max_model_len = 4096", "max_model_len = {max_len}")
    .replace('policy = ["paged"]', 'policy = ["{policy}"]')
    .replace("block_size = [16]", "block_size = [{block}]\n{grid_extra}")
)


def hash_id_trace(path: Path, requests: int, seed: int = 0, block: int = 512) -> Path:
    """A synthetic trace in the Mooncake JSONL form (timestamp ms, input_length, output_length,
    hash_ids), prompts up to 32 hash blocks (16,384 tokens): six shared system prompts of 1-4
    blocks (Zipf-like popularity), and half the requests extending an earlier request's ids by
    1-2 blocks, as a conversation's next turn would; 250 ms mean gaps. Written row by row, so a
    million rows stay small in memory (an earlier prompt is drawn from the last 4,096)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 5, size=6)
    starts = np.concatenate(([0], np.cumsum(lens)))
    systems = [list(range(int(a), int(b))) for a, b in zip(starts, starts[1:])]
    fresh = int(starts[-1])
    pick = rng.choice(6, size=requests, p=(w := 1.0 / np.arange(1, 7)) / w.sum())
    extend = rng.random(requests) < 0.5
    new_blocks = rng.integers(1, 4, size=requests)
    tails = rng.integers(1, block + 1, size=requests)
    outputs = rng.integers(16, 513, size=requests)
    gaps = rng.exponential(250.0, size=requests)
    recent: list[list[int]] = []
    t = 0.0
    with path.open("w") as f:
        for i in range(requests):
            if recent and extend[i]:
                ids = recent[int(rng.integers(len(recent)))] + list(range(fresh, fresh + int(new_blocks[i]) % 2 + 1))
            else:
                ids = systems[int(pick[i])] + list(range(fresh, fresh + int(new_blocks[i])))
            fresh = max(fresh, ids[-1] + 1)
            ids = ids[:32]
            recent.append(ids)
            if len(recent) > 4096:
                recent.pop(0)
            length = (len(ids) - 1) * block + int(tails[i])
            row = {"timestamp": round(t), "input_length": length, "output_length": int(outputs[i]), "hash_ids": ids}
            f.write(json.dumps(row) + "\n")
            t += float(gaps[i])
    return path


def sessions_workload(sessions: int, rate: float = 0.5) -> str:
    """The multi-turn suite's conversations (suites/multi-turn.toml), ``sessions`` of 6 turns."""
    return (
        f'source = "sessions"\nnum_sessions = {sessions}\nturns = 6\nthink_time_s = 4.0\nlengths = "uniform"\n'
        "prompt_min = 200\nprompt_max = 1000\nmessage_min = 20\nmessage_max = 200\noutput_min = 50\n"
        f'output_max = 400\narrival = "poisson"\nrate = {rate}\nseed = 0'
    )


def hash_ids_workload(trace: Path, time_scale: float = 1.0) -> str:
    return f'source = "trace"\npath = "{trace}"\nhash_block_size = 512\narrival = "trace"\ntime_scale = {time_scale}'


PREFILL_HEAVY = (
    'source = "lognormal"\nprompt_mean = 2048.0\noutput_mean = 28.0\nnum_requests = 600\n'
    'arrival = "poisson"\nrate = 20.0\nseed = 0'
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of part w: a workload, a cell's settings and what the fast path is compared with."""

    label: str
    workload: str
    policy: str
    budget: str = "3GiB"
    max_len: int = 16384
    block: int = 16
    grid_extra: str = ""
    other: str = "vllm-sched"

    def cell(self) -> Cell:
        text = WORKLOAD_SUITE.format(
            workload=self.workload,
            budget=self.budget,
            max_len=self.max_len,
            policy=self.policy,
            block=self.block,
            grid_extra=self.grid_extra,
        )
        cells = build_cells(parse_suite(text, "bench.toml"), Path(tempfile.mkdtemp(prefix="bench-wl-")), lambda m: None)
        assert len(cells) == 1
        return cells[0]


def workload_rows(trace: Path) -> list[Row]:
    hash_ids = hash_ids_workload(trace)
    hashed = "hash-id trace, 600 requests <= 16k, trace arrivals, 3 GiB"
    talks = "64 conversations x 6 turns, 3 GiB"
    rows = [
        Row(hashed, hash_ids, "paged"),
        Row(hashed, hash_ids, "paged-prefix"),
        Row(talks, sessions_workload(64), "paged", max_len=8192),
        Row(talks, sessions_workload(64), "paged-prefix", max_len=8192),
        Row("prefill-heavy, 600 requests, prompt ~2k, output ~28, 1 GiB", PREFILL_HEAVY, "paged", "1GiB", 8192),
    ]
    for policy in ("contiguous-max", "contiguous-pow2", "contiguous-oracle"):
        for arena in ARENAS:
            for unit, other in (("position", "reference"), ("block", "vllm-sched")):
                extra = f'arena = ["{arena}"]\ncontiguous_unit = "{unit}"'
                label = f"Azure trace, 5,000 requests, 4 GiB ({arena}, {unit}s)"
                rows.append(Row(label, trace_workload(5000), policy, "4GiB", 4096, 16, extra, other))
    return rows


def no_rows(args: argparse.Namespace, part: str) -> NoReturn:
    """A ``--rows`` that names nothing of a part: one line and exit 2, as argparse refuses."""
    print(f"bench_sim_speed.py: --rows {args.rows!r} names nothing in part {part}", file=sys.stderr)
    sys.exit(2)


def part_w(args: argparse.Namespace) -> None:
    trace = hash_id_trace(Path(tempfile.mkdtemp(prefix="bench-trace-")) / "hash-ids.jsonl", 600)
    rows = [
        row
        for row in workload_rows(trace)
        if not args.rows or any(part in f"{row.label} {row.policy} {row.grid_extra}" for part in args.rows.split(","))
    ]
    if not rows:
        no_rows(args, "w")
    print("\n(w) the workloads users run: the fast path vs vllm-sched (or the reference where vLLM hosts no such cell)")
    print(
        "    Llama-3-8B fp16, block 16, 256 seqs, 2048 batched tokens, roofline A100-80GB; medians of interleaved runs"
    )
    print(f"  {'workload':<62}{'policy':<19}{'steps':>8}{'fast s':>16}{'other s':>16}{'ratio':>8}  vs")
    for row in rows:
        cell = row.cell()
        fast_s, other_s = [], []
        others = args.vllm_repeats if row.other == "vllm-sched" else args.repeats
        steps = 0
        for rep in range(args.repeats):  # interleaved: drift hits both sides alike
            a = run_once(cell, "fast")
            fast_s.append(a["wall_s"])
            steps = a["steps"]
            if rep < others:
                b = run_once(cell, row.other)
                other_s.append(b["wall_s"])
                assert (a["steps"], a["preemptions"]) == (b["steps"], b["preemptions"]), (row.label, row.policy)
        f, o = statistics.median(fast_s), statistics.median(other_s)
        print(
            f"  {row.label[:61]:<62}{row.policy:<19}{steps:>8,}{f:>8.3f} ±{spread(fast_s):>5.0%}"
            f"{o:>8.3f} ±{spread(other_s):>5.0%}{o / f:>7.1f}x  {row.other}",
            flush=True,
        )
    print("  (goal: >= 100x vllm-sched, >= 20x the reference where vLLM hosts no such cell; wall_s, the step loop)")


def spread(values: list[float]) -> float:
    """Half the range of ``values`` over their median: how far one run may sit from the median."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


# The hybrid agreement cases (tests/runners/test_agreement_hybrid.py): vLLM's KV cache groups, which sim
# runs on its fast path (CountingGroupedPolicy, harness/sim/grouped_stretch.py).
HYBRID_MODELS = ROOT / "tests" / "data" / "models"
HYBRID_SUITE = """
name = "bench-hybrid"
[model]
preset = "gpt-oss-20b"
kv_dtype = "bf16"
{model}
[memory]
kv_budget = "{budget}"
max_model_len = 1024
[workload]
source = "uniform"
prompt_min = 100
prompt_max = 400
output_min = 200
output_max = 600
num_requests = {n}
arrival = "batch"
seed = 3{workload}
[scheduler]
max_num_seqs = 64
max_num_batched_tokens = 256
[grid]
runner = ["sim"]
policy = ["{policy}"]
block_size = [16]
"""
# Prefix caching over the groups (tests/runners/test_agreement_hybrid_prefix.py's workload: two
# samples a request, four shared 192-token prefixes), for every case but state layers (refused).
HYBRID_PREFIX = "\nn = 2\nprefix_groups = 4\nprefix_len = 192"


def _config(name: str) -> str:
    return f'config = "{HYBRID_MODELS / name / "config.json"}"'


HYBRID_CASES: dict[str, tuple[str, str]] = {
    "gpt-oss-20b, hybrid on": ("hybrid_kv = true", "64MiB"),
    "gpt-oss-20b, hybrid off": ("hybrid_kv = false", "64MiB"),
    "Gemma-3-like, hybrid on": (_config("tiny-gemma3") + "\nhybrid_kv = true", "1MiB"),
    "Gemma-3-like, hybrid off": (_config("tiny-gemma3") + "\nhybrid_kv = false", "2MiB"),
    "MLA (DeepSeek-V2-like)": (_config("tiny-dsv2"), "2500KiB"),
    "state layers (Qwen3-Next-like)": (_config("tiny-qwen3next"), "1200KiB"),
}


def hybrid_rows() -> list[tuple[str, str, str, str]]:
    """Part h's cases: (label, [model] lines, KV budget, policy), ``paged`` then ``paged-prefix``."""
    rows = [(label, model, budget, "paged") for label, (model, budget) in HYBRID_CASES.items()]
    rows += [
        (f"{label}, paged-prefix", model, budget, "paged-prefix")
        for label, (model, budget) in HYBRID_CASES.items()
        if not label.startswith("state")
    ]
    return rows


def hybrid_suite(model: str, budget: str, n: int, policy: str) -> str:
    return HYBRID_SUITE.format(
        model=model, budget=budget, n=n, policy=policy, workload=HYBRID_PREFIX if policy == "paged-prefix" else ""
    )


def part_h(args: argparse.Namespace) -> None:
    cases = [r for r in hybrid_rows() if not args.rows or any(part in r[0] for part in args.rows.split(","))]
    if not cases:
        no_rows(args, "h")
    print("\n(h) KV cache groups: sim (fast path) vs vllm-sched, the hybrid agreement cases")
    print(f"  {'case':<48}{'requests':>9}{'steps':>8}{'preempt':>8}{'sim s':>9}{'vllm s':>9}{'ratio':>9}")
    for label, model, budget, policy in cases:
        for n in (30, 300):
            text = hybrid_suite(model, budget, n, policy)
            cells = build_cells(
                parse_suite(text, "bench.toml"), Path(tempfile.mkdtemp(prefix="bench-h-")), lambda m: None
            )
            (cell,) = cells
            sim_s, vllm_s, rows = [], [], []
            for rep in range(args.repeats):  # interleaved: drift hits both sides alike
                a = run_once(cell, "fast")
                sim_s.append(a["wall_s"])
                rows.append(a)
                if rep < args.vllm_repeats:
                    b = run_once(cell, "vllm-sched")
                    vllm_s.append(b["wall_s"])
                    assert (a["steps"], a["preemptions"]) == (b["steps"], b["preemptions"]), label
            f, o = statistics.median(sim_s), statistics.median(vllm_s)
            first = rows[0]
            print(
                f"  {label:<48}{n:>9,}{first['steps']:>8,}{first['preemptions']:>8,}{f:>9.3f}{o:>9.3f}{o / f:>8.1f}x",
                flush=True,
            )
    print("  (goal: >= 50x vllm-sched; wall_s is the step loop, vLLM's start-up excluded on both sides)")


def _form_child(cell: Cell, repeats: int, queue: multiprocessing.Queue) -> None:
    from kvbench.harness.sim import FORM

    queue.put((FORM.name, [run_once(cell, "fast")["wall_s"] for _ in range(repeats)]))


def in_form(cell: Cell, pure: bool, repeats: int) -> tuple[str, list[float]]:
    """``repeats`` fast-path runs of ``cell`` in a fresh interpreter, which loads the simulator
    compiled or, ``pure``, as Python (the form is fixed when a process imports it)."""
    saved = os.environ.pop(compiled.PURE_ENV, None)
    if pure:
        os.environ[compiled.PURE_ENV] = "1"
    try:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_form_child, args=(cell, repeats, queue))
        proc.start()
    finally:
        os.environ.pop(compiled.PURE_ENV, None)
        if saved is not None:
            os.environ[compiled.PURE_ENV] = saved
    out = queue.get()
    proc.join()
    return out


def part_f(args: argparse.Namespace) -> None:
    print("\n(f) the fast path compiled against the same code as Python (KVBENCH_PURE=1)")
    if FORM.name != "compiled":
        print(f"  skipped: the simulator is not compiled in this install ({FORM.reason})")
        return
    print(f"    each form in fresh child processes, {args.repeats} rounds interleaved, {args.repeats} runs a round")
    print(f"  {'case':<62}{'policy':<16}{'compiled s':>11}{'python s':>10}{'python / compiled':>19}")
    trace = hash_id_trace(Path(tempfile.mkdtemp(prefix="bench-trace-")) / "hash-ids.jsonl", 600)
    # Part w's slowest relative to its goal, one of each kind, and part h's worst case.
    wanted = {("prefill-heavy", "paged"), ("hash-id trace", "paged-prefix"), ("Azure trace", "contiguous-max")}
    rows = [
        (r.label, r.policy, r.cell())
        for r in workload_rows(trace)
        if (r.label.split(",")[0], r.policy) in wanted and "blocks" not in r.label and "buddy" not in r.label
    ]
    label, policy = "gpt-oss-20b, hybrid on, 300 requests", "paged-prefix"
    model, budget = HYBRID_CASES["gpt-oss-20b, hybrid on"]
    (cell,) = build_cells(
        parse_suite(hybrid_suite(model, budget, 300, policy), "bench.toml"),
        Path(tempfile.mkdtemp(prefix="bench-f-")),
        lambda m: None,
    )
    rows.append((label, policy, cell))
    for label, policy, cell in rows:
        times: dict[str, list[float]] = {"compiled": [], "python": []}
        for _ in range(args.repeats):
            for pure in (False, True):
                form, walls = in_form(cell, pure, args.repeats)
                times[form] += walls
        c, p = statistics.median(times["compiled"]), statistics.median(times["python"])
        print(f"  {label:<62}{policy:<16}{c:>11.3f}{p:>10.3f}{p / c:>18.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="fast-path repeats (median); the reference runs fewer")
    ap.add_argument("--vllm-repeats", type=int, default=1, help="vllm-sched repeats (slow)")
    ap.add_argument("--skip-full-vllm", action="store_true", help="skip vllm-sched on the full trace (minutes)")
    ap.add_argument("--max-requests", type=int, default=1_000_000, help="largest size in the scaling table")
    ap.add_argument(
        "--families", default="sharegpt", help=f"parts b and c: workload families, from {', '.join(FAMILIES)} (a,b)"
    )
    ap.add_argument(
        "--parts",
        default="abc",
        help="which parts to run (a, b, c; p: under memory pressure; w: workloads users run; h: KV cache groups; "
        "f: compiled against Python)",
    )
    ap.add_argument(
        "--rows",
        default="",
        help="parts w and h: only the rows whose workload, policy, arena, unit or case contain one of these (a,b)",
    )
    args = ap.parse_args()
    if not args.parts or set(args.parts) - set("abcpwhf"):
        ap.error(f"--parts takes letters from a, b, c, p, w, h and f, got {args.parts!r}")
    if set(args.families.split(",")) - set(FAMILIES):
        ap.error(f"--families takes names from {', '.join(FAMILIES)}, got {args.families!r}")
    print(f"simulator: {FORM.describe()}", flush=True)  # compiled or Python: the fast path's times differ
    if "h" in args.parts:
        part_h(args)
    if "w" in args.parts:
        part_w(args)
    if "p" in args.parts:
        part_p(args)
    if "a" in args.parts:
        part_a(args)
    if "b" in args.parts:
        part_b(args)
    if "c" in args.parts:
        part_c(args)
    if "f" in args.parts:
        part_f(args)


if __name__ == "__main__":
    main()
