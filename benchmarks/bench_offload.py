"""Benchmark: ``sim`` against ``vllm-sched`` with a CPU tier, side by side in one process.

The cells are the offload agreement cases (``tests/runners/test_agreement_offload.py``: a tier
that evicts under LRU and ARC, a preempting budget whose requests load their blocks back,
conversations), each run on both runners, interleaved ``--repeats`` times so drift on a shared
machine hits both alike. It prints each side's step loop time (the run row's ``wall_s``, median)
and their ratio, and checks that both runs agree (steps, computed tokens, CPU-tier hit tokens).

Not a test (pytest does not collect ``benchmarks/``). Run from the repository root, with vLLM
installed (either build):

    .venv/bin/python benchmarks/bench_offload.py [--repeats 3] [--cases lru-tier-evicts,...]

docs/performance.md ("``bench_offload.py``") gives the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the agreement cases live with their test

from kvbench.app.suite import parse_suite  # noqa: E402
from kvbench.app.sweep import build_cells, run_cell  # noqa: E402
from kvbench.harness.records import store  # noqa: E402
from kvbench.harness.sim import FORM  # noqa: E402
from kvbench.harness.sim.offload.rules import mirrored_rules  # noqa: E402

from tests.conftest import one_workload_suite  # noqa: E402
from tests.runners.test_agreement_offload import CASES, CONVERSATIONS, SETTINGS  # noqa: E402


def cells(name: str, out: Path) -> dict:
    kw = dict(SETTINGS, **(CONVERSATIONS if name == "conversations" else CASES[name]))
    kw.setdefault("preset", "llama-3-8b")
    kw.setdefault("block_size", 16)
    kw.setdefault("clock", "steps")
    kw.setdefault("arena", "first-fit")
    suite = parse_suite(one_workload_suite(name="bench-offload", runners='["sim", "vllm-sched"]', **kw), "b.toml")
    return {c.spec.runner: c for c in build_cells(suite, out, lambda m: None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    names = [*sorted(CASES), "conversations"]
    ap.add_argument("--cases", default=",".join(names), help=f"comma-separated, of: {', '.join(names)}")
    args = ap.parse_args()
    chosen = [c for c in args.cases.split(",") if c]
    unknown = [c for c in chosen if c not in names]
    if unknown or args.repeats < 1:
        sys.exit(f"bench_offload: unknown case {unknown[0]!r}" if unknown else "bench_offload: --repeats must be ≥ 1")
    print(f"simulator: {FORM.name}; offloading rules mirrored: {mirrored_rules().release}; repeats {args.repeats}")
    print(f"{'case':24} {'steps':>7} {'CPU hit tok':>11} {'sim s':>8} {'vllm-sched s':>12} {'ratio':>7}")
    ratios = []
    for name in chosen:
        times: dict[str, list[float]] = {"sim": [], "vllm-sched": []}
        rows: dict[str, dict] = {}
        for _ in range(args.repeats):
            for runner in ("sim", "vllm-sched"):
                with tempfile.TemporaryDirectory() as tmp:
                    cell = cells(name, Path(tmp))[runner]
                    row = run_cell(cell)
                    if row["status"] != "ok":
                        sys.exit(f"bench_offload: {name} on {runner}: {row.get('error')}")
                    reqs = store.read_table(Path(tmp), "requests", {row["run_id"]})
                    row["cpu_hit_tokens_total"] = int(reqs["cpu_hit_tokens"].sum())
                times[runner].append(float(row["wall_s"]))
                rows[runner] = row
        a, b = rows["sim"], rows["vllm-sched"]
        for key in ("steps", "computed_tokens", "cpu_hit_tokens_total"):
            if a[key] != b[key]:
                sys.exit(f"bench_offload: {name}: sim and vllm-sched disagree on {key}: {a[key]} vs {b[key]}")
        s, v = statistics.median(times["sim"]), statistics.median(times["vllm-sched"])
        ratios.append(v / s)
        print(f"{name:24} {a['steps']:>7,} {a['cpu_hit_tokens_total']:>11,} {s:>8.3f} {v:>12.3f} {v / s:>6.1f}×")
    spread = f"{min(ratios):.1f}×–{max(ratios):.1f}×" if len(ratios) > 1 else f"{ratios[0]:.1f}×"
    print(f"sim is {statistics.median(ratios):.1f}× vllm-sched (median over cases; range {spread})")


if __name__ == "__main__":
    main()
