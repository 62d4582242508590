"""Benchmark of the torch runner: the paged indirection's cost and the allocation effect.

Measured side by side in one process, each measurement repeated and
interleaved (contiguous, paged, contiguous, paged, …) so drift on a shared
machine hits both sides alike:

1. **Indirection** — decode step time of the paged cache over the contiguous
   cache at equal batch: B requests with the same prompt and output lengths
   and a budget that holds them all, so both policies run the identical
   schedule (one prefill step, then decode steps of exactly B tokens) and only
   the cache differs. Shown for the runner's batched decode (one padded read
   per layer: a block-table gather vs a range gather) and for per-sequence
   attention (a block-table gather vs a plain slice of the arena).
2. **Allocation effect** — tokens per second of every policy at the same KV
   budget on a suite's workload (default ``suites/torch-cpu.toml``): paged
   admits more requests at once; whether that buys wall-clock throughput
   depends on what a step costs per running request on this device.

Not a test (pytest does not collect ``benchmarks/``). Run from the repository root:

    .venv/bin/python benchmarks/bench_torch.py [--repeats 3] [--batch 32] [--context 192]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from kvbench.app.suite import load_suite, parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.records import store
from kvbench.harness.spec.geometry import preset
from kvbench.runners.base import Cell
from kvbench.runners.torch.runner import cpu_threads, resolve_device, run_torch

EQUAL_BATCH_SUITE = """
name = "bench-equal-batch"
[model]
preset = "{model}"
kv_dtype = "fp32"
[memory]
kv_budget = {budget}
max_model_len = {max_len}
[workload]
source = "fixed"
num_requests = {batch}
prompt_len = {context}
output_len = {output}
seed = 0
[scheduler]
max_num_seqs = {batch}
max_num_batched_tokens = {prefill}
[run]
device = "{device}"
[grid]
runner = ["torch"]
policy = ["contiguous-oracle", "paged"]
block_size = [16]
"""


@dataclasses.dataclass(frozen=True)
class Spread:
    """Median of repeated measurements and their range."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def __str__(self) -> str:
        return f"{self.median:.4g} [{min(self.values):.4g}–{max(self.values):.4g}]"


def equal_batch_cells(out: Path, model: str, batch: int, context: int, decode_steps: int, device: str) -> list[Cell]:
    output = decode_steps + 1
    max_len = context + output + 16
    kv_bytes_per_token = preset(model).kv_bytes_per_token("fp32")
    blocks = -(-(context + output) // 16) + 1
    budget = batch * blocks * 16 * kv_bytes_per_token
    text = EQUAL_BATCH_SUITE.format(
        model=model,
        budget=budget,
        max_len=max_len,
        batch=batch,
        context=context,
        output=output,
        prefill=batch * context,
        device=device,
    )
    return build_cells(parse_suite(text, str(out / "bench.toml")), out, lambda m: None)


def decode_step_times(out: Path, cell: Cell, batch: int, batch_decode: bool) -> float:
    """Median wall time of the run's decode steps with exactly ``batch`` requests decoding."""
    row = run_torch(cell, batch_decode=batch_decode)[0].row
    assert row["status"] == "ok", row["error"]
    steps = store.read_table(out, "steps", {cell.run_id})
    decode = steps[(steps["scheduled_tokens"] == batch) & (steps["running"] == batch) & (steps["admitted"] == 0)]
    assert len(decode) > 0, "no decode step at full batch"
    return float(decode["step_wall_s"].median())


def indirection(
    out: Path, model: str, batch: int, context: int, decode_steps: int, repeats: int, device: str
) -> dict[str, dict[str, Spread]]:
    cells = {c.spec.policy: c for c in equal_batch_cells(out, model, batch, context, decode_steps, device)}
    result: dict[str, dict[str, Spread]] = {}
    for mode, batched in (("batched decode", True), ("per-sequence", False)):
        times: dict[str, list[float]] = {"contiguous-oracle": [], "paged": []}
        for _ in range(repeats + 1):  # the first round warms up and is dropped
            for policy in times:
                times[policy].append(decode_step_times(out, cells[policy], batch, batched))
        times = {p: t[1:] for p, t in times.items()}
        ratios = tuple(p / c for p, c in zip(times["paged"], times["contiguous-oracle"]))
        result[mode] = {
            "contiguous_s": Spread(tuple(times["contiguous-oracle"])),
            "paged_s": Spread(tuple(times["paged"])),
            "ratio": Spread(ratios),
        }
    return result


def allocation_effect(out: Path, suite_path: Path, repeats: int, device: str | None) -> list[dict[str, object]]:
    suite = load_suite(suite_path)
    cells = [c for c in build_cells(suite, out, lambda m: None) if c.spec.runner == "torch"]
    if device is not None:
        cells = [dataclasses.replace(c, spec=c.spec.replace(device=device)) for c in cells]
    rows: dict[str, list[dict[str, object]]] = {c.spec.policy: [] for c in cells}
    for _ in range(repeats + 1):
        for cell in cells:
            row = dict(run_torch(cell)[0].row)
            assert row["status"] == "ok", (cell.spec.policy, row["error"])
            rows[cell.spec.policy].append(row)
    table = []
    for cell in cells:
        runs = rows[cell.spec.policy][1:]  # drop the warm-up round
        first = runs[0]
        table.append(
            {
                "policy": cell.spec.policy,
                "block_size": cell.spec.block_size,
                "peak_running": first["peak_running"],
                "mean_running": first["mean_running"],
                "preemptions": first["preemptions"],
                "steps": first["steps"],
                "tokens_per_step": first["tokens_per_s"],  # steps clock: one simulated second a step
                "wall_tokens_per_s": Spread(tuple(float(r["wall_tokens_per_s"]) for r in runs)),
                "mean_step_wall_s": Spread(tuple(float(r["mean_step_wall_s"]) for r in runs)),
            }
        )
    return table


def print_report(
    env: dict[str, object], ind: dict[str, dict[str, Spread]], alloc: list[dict[str, object]], args: argparse.Namespace
) -> None:
    print("torch runner benchmark — " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print(
        f"\n1. paged indirection at equal batch: {args.batch} requests decoding, contexts "
        f"{args.context}–{args.context + args.decode_steps}, fp32 {args.model}, block size 16 "
        f"(median decode step over {args.repeats} repeats [range])"
    )
    for mode, r in ind.items():
        print(
            f"   {mode:15} contiguous {r['contiguous_s'].median * 1e3:7.3f} ms   "
            f"paged {r['paged_s'].median * 1e3:7.3f} ms"
            f"   paged/contiguous = {r['ratio']}"
        )
    print(
        f"\n2. allocation effect at the same KV budget ({args.suite}; wall tokens/s = generated tokens / "
        f"Σ step wall time, median [range] of {args.repeats})"
    )
    base = next(r for r in alloc if r["policy"] == "contiguous-max")
    print(
        f"   {'policy':18} {'bs':>3} {'peak':>5} {'mean run':>8} {'preempt':>7} {'steps':>6} {'tok/step':>8} "
        f"{'x max':>6} {'wall tok/s':>26} {'x max':>6} {'ms/step':>7}"
    )
    for r in alloc:
        wall: Spread = r["wall_tokens_per_s"]  # type: ignore[assignment]
        base_wall: Spread = base["wall_tokens_per_s"]  # type: ignore[assignment]
        print(
            f"   {r['policy']:18} {r['block_size']:>3} {r['peak_running']:>5} {r['mean_running']:>8.2f} "
            f"{r['preemptions']:>7} {r['steps']:>6} {r['tokens_per_step']:>8.2f} "
            f"{r['tokens_per_step'] / base['tokens_per_step']:>6.2f} {str(wall):>26} "
            f"{wall.median / base_wall.median:>6.2f} {r['mean_step_wall_s'].median * 1e3:>7.3f}"
        )  # type: ignore[union-attr]
    paged = next(r for r in alloc if r["policy"] == "paged")
    print(
        f"\n   paged / contiguous-max: tokens per step {paged['tokens_per_step'] / base['tokens_per_step']:.2f}x, "
        f"wall tokens/s {paged['wall_tokens_per_s'].median / base['wall_tokens_per_s'].median:.2f}x"
    )  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=32, help="requests decoding together (part 1)")
    p.add_argument("--context", type=int, default=192, help="prompt length (part 1)")
    p.add_argument("--decode-steps", type=int, default=48, help="decode steps measured per run (part 1)")
    p.add_argument("--model", default="tiny", help="preset for part 1")
    p.add_argument("--suite", type=Path, default=ROOT / "suites" / "torch-cpu.toml", help="workload for part 2")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default=None,
        help="override the device (part 1 defaults to cpu, part 2 to the suite's)",
    )
    args = p.parse_args(argv)
    device = args.device or "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        ind = indirection(
            Path(tmp) / "equal", args.model, args.batch, args.context, args.decode_steps, args.repeats, device
        )
        alloc = allocation_effect(Path(tmp) / "alloc", args.suite, args.repeats, args.device)
    dev = resolve_device(device)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    if dev.type == "cpu":
        env["threads"] = cpu_threads(preset(args.model))
    print_report(env, ind, alloc, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
