"""Benchmark of whole steps of the paper's OPT models on A100-80GB, against measurements no clock saw.

DistServe profiled its engine's steps of OPT-13B and OPT-66B on A100-80GB by batch size, prompt
length and tensor-parallel degree, and published least-squares fits of them
(``benchmarks/data/distserve-a100``, README there). Vidur never profiled OPT, so the tables clock
prices these models' dense layers with the fitted operation model; nothing here was fitted on
these steps. For each point of DistServe's own profiling grid this prints
|priced ÷ measured − 1| of the tables clock and of the roofline, median and p90, for
decode steps (``batch_size`` requests of ``input_len`` context, one token each) and prefill steps
(the whole batch's prompts in one step), and how much a decode step grows from 32 to 128
requests at 256 tokens of context each, the growth a serving curve's capacity turns on.

Both clocks are priced at scale 1: each suite's ``roofline_scale`` is fitted to vLLM's engine
(docs/clock.md), which is not DistServe's. The measured times are whole engine steps; the tables
clock carries the CPU work of Vidur's A100 host (vLLM), the roofline none.

Not a test (pytest does not collect ``benchmarks/``). From the repository root:

    .venv/bin/python benchmarks/bench_opt_steps.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from kvbench.harness.clock.clocks import Clock, make_clock
from kvbench.harness.clock.model import GPU_PRESETS
from kvbench.harness.clock.tables_clock import TablesClock
from kvbench.harness.spec.geometry import PRESETS

MEASURED = Path(__file__).resolve().parent / "data" / "distserve-a100" / "distserve.json"
GPU = "A100-80GB"
# DistServe's profiling grid (evaluation/0-test-single-forward-performance/main.py): every
# (batch, input length) whose batch × input length, rounded up to 16, is within the limit.
BATCHES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192)
INPUT_LENS = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 284, 512, 768, 1024, 1536, 2020)
TOKEN_LIMITS = {
    ("opt-13b", 1): 49152,
    ("opt-13b", 2): 98304,
    ("opt-13b", 4): 250000,
    ("opt-66b", 2): 8192,
    ("opt-66b", 3): 36864,
    ("opt-66b", 4): 65000,
}
OUTPUT_LEN = 16  # each decode time is the median of a request's 15 decode steps: context + 8
GROWTH = (32, 128, 256)  # decode growth: from 32 to 128 requests, 256 tokens of context each


@dataclasses.dataclass(frozen=True)
class StepFit:
    """DistServe's fit of one model at one degree, in ms (README beside the data)."""

    prefill: tuple[float, float, float]
    decode_small: tuple[float, float, float]
    decode_large: tuple[float, float, float]
    small_up_to: int  # decode_small up to and including this batch size

    def prefill_s(self, batch: int, input_len: int) -> float:
        a, b, c = self.prefill
        return (a + b * batch * input_len + c * batch * input_len**2) / 1e3

    def decode_s(self, batch: int, input_len: int) -> float:
        a, b, c = self.decode_small if batch <= self.small_up_to else self.decode_large
        return (a + b * batch * input_len + c * batch) / 1e3


def read_fits(path: Path = MEASURED) -> dict[tuple[str, int], StepFit]:
    """(kvbench preset, TP degree) → DistServe's fit."""
    out = {}
    for model, by_tp in json.loads(path.read_text()).items():
        for tp, f in by_tp.items():
            out[(model.split("/")[-1], int(tp))] = StepFit(
                tuple(f["prefill"]),
                tuple(f["decoding_smallbs"]),
                tuple(f["decoding_largebs"]),
                int(f["decoding_large_small_bs_threshold"]),
            )
    return out


def grid(model: str, tp: int) -> list[tuple[int, int]]:
    """The (batch, input length) pairs DistServe profiled for this model and degree."""
    limit = TOKEN_LIMITS[(model, tp)]
    return [(b, n) for b in BATCHES for n in INPUT_LENS if b * -(-n // 16) * 16 <= limit]


def clocks(model: str, tp: int) -> dict[str, Clock]:
    """The tables clock and the roofline for this model and degree on A100-80GB, at scale 1."""
    geometry = PRESETS[model]
    kv = geometry.kv_bytes_per_token("fp16", tp, 1)
    roofline = make_clock("roofline", geometry, kv, GPU, None, 1.0, tp, 1)
    assert roofline is not None
    return {"tables": TablesClock(geometry, kv, GPU_PRESETS[GPU], 1.0, tp, 1), "roofline": roofline}


def decode_price(clock: Clock, batch: int, input_len: int) -> float:
    context = batch * (input_len + OUTPUT_LEN // 2)
    return clock.price(batch, context, context, batch)


def prefill_price(clock: Clock, batch: int, input_len: int) -> float:
    tokens = batch * input_len
    return clock.price(tokens, tokens, batch * input_len * (input_len + 1) // 2, batch)


def errors(clock: Clock, fit: StepFit, points: list[tuple[int, int]], kind: str) -> np.ndarray:
    """|priced ÷ measured − 1| at each point, for decode or prefill steps."""
    price, measured = (decode_price, fit.decode_s) if kind == "decode" else (prefill_price, fit.prefill_s)
    return np.array([abs(price(clock, b, n) / measured(b, n) - 1) for b, n in points])


def growth_cells(fit: StepFit, priced: dict[str, Clock], points: list[tuple[int, int]]) -> str:
    """The decode step's growth from 32 to 128 requests: measured, tables clock, roofline."""
    low, high, context = GROWTH
    if (high, context) not in points:
        return f"{'(not in the grid)':>29}"
    grown = [fit.decode_s(high, context) / fit.decode_s(low, context)]
    grown += [decode_price(c, high, context) / decode_price(c, low, context) for c in priced.values()]
    return f"{grown[0]:10.2f} {grown[1]:8.2f} {grown[2]:9.2f}"


def stats(e: np.ndarray) -> str:
    return f"{np.median(e):5.1%} {np.quantile(e, 0.9):6.1%}"


def main() -> int:
    try:
        fits = read_fits()
    except OSError as e:
        print(f"bench_opt_steps: cannot read {MEASURED}: {e.strerror or e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or not DistServe's layout
        print(f"bench_opt_steps: {MEASURED} is not DistServe's fits: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(f"measured: {MEASURED} (DistServe's engine, A100-80GB; {len(fits)} model × TP fits)")
    print("|priced ÷ measured − 1|, median and p90 over DistServe's profiling grid; both clocks at scale 1\n")
    heads = [f"{'tables':>12} {'roofline':>12}"] * 2 + [f"{'measured':>10} {'tables':>8} {'roofline':>9}"]
    print(f"{'':16}{'decode steps':^25}  {'prefill steps':^25}  decode growth, 32 → 128 requests")
    print(f"{'':16}{'  '.join(heads)}")
    every: dict[tuple[str, str], list[np.ndarray]] = {}
    for (model, tp), fit in sorted(fits.items()):
        points, priced = grid(model, tp), clocks(model, tp)
        cells = []
        for kind in ("decode", "prefill"):
            for name, clock in priced.items():
                e = errors(clock, fit, points, kind)
                every.setdefault((kind, name), []).append(e)
                cells.append(stats(e))
        row = f"{cells[0]} {cells[1]}  {cells[2]} {cells[3]}  {growth_cells(fit, priced, points)}"
        print(f"  {f'{model} TP {tp}':12}  {row}")
    total = [stats(np.concatenate(e)) for e in every.values()]
    print(f"  {'all fits':12}  {total[0]} {total[1]}  {total[2]} {total[3]}")
    print(f"\nOPT-66B at TP 4 on the tables clock: {clocks('opt-66b', 4)['tables'].describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
