"""Benchmark of the tables clock's dense layers on H100 tables it never saw.

The operation model (``harness.clock.op_model``) is fitted on the shipped A100 and A40 tables
only; this prints its error against Vidur's H100 tables (``benchmarks/data/vidur-h100``, held out:
nothing reads them but this and its test) beside the roofline's error on the same rows, both at
the H100 preset's rates. Per operation, and per step: a step's dense work is the sum of a layer's
operations (what the tables hold of a step; attention kernels and CPU work are not in the H100
tables), split into decode-heavy steps (≤ 256 tokens) and prefill-heavy ones (≥ 1,024 tokens).
Errors are |predicted ÷ measured − 1|; median and p90 over the tables' rows (every model, every
tensor-parallel degree). Goal: median per-step error ≤ 10% for both kinds, every model.

Not a test (pytest does not collect ``benchmarks/``). From the repository root:

    .venv/bin/python benchmarks/bench_gpu_tables.py

The roofline's H100 factors (``GPU_PRESETS["H100"]``) were derived from these same H100 tables
(docs/clock-presets.md), so its column is not a held-out error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from kvbench.harness.clock.clocks import LINK_CALL_LATENCY_S
from kvbench.harness.clock.gpu_tables import LAYER_OPS, OPS, GpuTables, OpTable, load_gpu_tables
from kvbench.harness.clock.model import GPU_PRESETS
from kvbench.harness.clock.op_model import op_work, predict_op
from kvbench.harness.clock.tables_clock import fitted_op_terms

HELD_OUT = Path(__file__).resolve().parent / "data" / "vidur-h100"
GOAL = 0.10
KINDS = {"decode-heavy (≤ 256 tokens)": (1, 256), "prefill-heavy (≥ 1024 tokens)": (1024, 1 << 30)}


def roofline_op(op: str, table: OpTable) -> np.ndarray:
    """Today's roofline of one operation: max(bytes ÷ achieved bandwidth, FLOPs ÷ achieved peak)."""
    gpu = GPU_PRESETS["H100"]
    moved, flops = op_work(op, table.shape, table.tensor_parallel, table.tokens)
    return np.maximum(
        moved / (gpu.bandwidth_bytes_s * gpu.bandwidth_efficiency), flops / (gpu.peak_flops * gpu.flops_efficiency)
    )


def ring_vs_table(h100: GpuTables) -> None:
    """The all-reduce the tables clock prices on H100 (the roofline's ring: no H100 table ships)
    against the held-out H100 table, at the sizes of 1 to 4,096 tokens of a 4,096-wide model."""
    if h100.all_reduce is None:
        return
    gpu = GPU_PRESETS["H100"]
    print("\nall-reduce on H100 (rooflined ring vs the held-out table), 1–4,096 tokens × 4,096 × 2 B")
    for n, (size, seconds) in sorted(h100.all_reduce.by_gpus.items()):
        pick = (size >= 4096 * 2) & (size <= 4096 * 4096 * 2)
        ring = 2.0 * (n - 1) / n * size[pick] / gpu.link_bytes_s + LINK_CALL_LATENCY_S
        errors = np.abs(ring / seconds[pick] - 1)
        table_us = np.median(seconds[pick]) * 1e6
        print(f"  {n} GPUs: ring error median, p90 {stats(errors)}; the table's median {table_us:.0f} µs")


def stats(errors: np.ndarray) -> str:
    return f"{np.median(errors):6.1%} {np.quantile(errors, 0.9):6.1%}"


def main() -> int:
    terms = fitted_op_terms()
    h100 = load_gpu_tables(HELD_OUT)
    gpu = GPU_PRESETS["H100"]
    print(f"held-out tables: {HELD_OUT} ({len(h100.ops)} model × TP tables)")
    heads = f"{'median    p90':>14} {'median    p90':>14}"
    print(f"\nper operation, all rows     {'tables':>13}  {'roofline':>13}\n{'':28}{heads}")
    for op in OPS:
        mine, roof = [], []
        for t in h100.ops:
            if op in t.times and (t.times[op] > 0).all():
                measured = t.times[op]
                mine.append(np.abs(predict_op(op, terms[op], t.shape, t.tensor_parallel, t.tokens, gpu) / measured - 1))
                roof.append(np.abs(roofline_op(op, t) / measured - 1))
        print(f"  {op:26s}{stats(np.concatenate(mine))}  {stats(np.concatenate(roof))}")
    met = True
    print("\nper step (a layer's operations summed), by model")
    for kind, (low, high) in KINDS.items():
        print(f"  {kind}")
        by_model: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for t in h100.ops:
            pick = (t.tokens >= low) & (t.tokens <= high)
            ops = [op for op in LAYER_OPS if op in t.times]
            measured = sum(t.times[op] for op in ops)[pick]
            mine = sum(predict_op(op, terms[op], t.shape, t.tensor_parallel, t.tokens, gpu) for op in ops)[pick]
            roof = sum(roofline_op(op, t) for op in ops)[pick]
            entry = by_model.setdefault(t.model, ([], []))
            entry[0].append(np.abs(mine / measured - 1))
            entry[1].append(np.abs(roof / measured - 1))
        for model, (mine, roof) in sorted(by_model.items()):
            m = np.concatenate(mine)
            ok = np.median(m) <= GOAL
            met &= ok
            verdict = "met" if ok else "MISSED"
            print(f"    {model:38s} tables {stats(m)}  roofline {stats(np.concatenate(roof))}  {verdict}")
        every = np.concatenate([np.concatenate(v[0]) for v in by_model.values()])
        every_roof = np.concatenate([np.concatenate(v[1]) for v in by_model.values()])
        print(f"    {'all models':38s} tables {stats(every)}  roofline {stats(every_roof)}")
    ring_vs_table(h100)
    print(f"\ngoal (median per-step error ≤ {GOAL:.0%}, each kind, each model): {'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
