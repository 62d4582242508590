"""``kvbench doctor --gpu``: a couple of minutes on a GPU that exercise every timed runner.

One in-process suite (``app.sweep.build_cells``/``run_cells``): ``vllm``, ``torch`` on CUDA
and ``sim`` on a 2-layer Llama-3-8B shape written locally, printing each cell and the
allocation × runtime decomposition. docs/ci.md ("The GPU check") gives the suite and
the exit codes (0 ok, 1 a cell failed, 2 no CUDA device).

    python -m kvbench.app.gpu_smoke [--out DIR]      # keep the records in DIR
    KVBENCH_SMOKE_OUT=DIR kvbench doctor --gpu   # the same
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import types
from pathlib import Path

from ..harness.records.statuses import OK
from ..harness.spec.capabilities import MEASURING_RUNNERS

NO_CUDA_LINE = "kvbench doctor --gpu: no CUDA device (torch.cuda.is_available() is False); the GPU smoke test needs one"
OUT_ENV = "KVBENCH_SMOKE_OUT"  # where `kvbench doctor --gpu` keeps its records (default: a temporary directory)
LAYERS = 2
VOCAB = 32000
MODEL_NAME = f"llama-3-8b-{LAYERS}l-32k"
MAX_MODEL_LEN = 1024

SUITE = """\
name = "gpu-smoke"

[model]
config = {config}
kv_dtype = "fp16"

[memory]
kv_budget = "128MiB"
max_model_len = {max_model_len}

[workload]
source = "uniform"
num_requests = 96
prompt_min = 32
prompt_max = 512
output_min = 16
output_max = 192
arrival = "batch"
seed = 0

[scheduler]
max_num_seqs = 128
max_num_batched_tokens = 2048

[run]
device = "cuda"

[grid]
runner = {runners}
policy = ["contiguous-max", "contiguous-oracle", "paged"]
block_size = [16]
# Contiguous reservations in whole blocks everywhere: the form vLLM hosts, so torch's and vLLM's
# allocation factors measure the same allocation.
contiguous_unit = "block"
"""

CELL_COLUMNS = (
    ("runner", "runner"),
    ("policy", "policy"),
    ("status", "status"),
    ("steps", "steps"),
    ("mean_running", "mean_run"),
    ("peak_running", "peak_run"),
    ("preemptions", "preempt"),
    ("token_states_frac", "states%"),
    ("tokens_per_s", "tokens/s"),
    ("wall_tokens_per_s", "wall tok/s"),
    ("mean_step_wall_s", "step ms"),
    ("wall_s", "wall s"),
)
DECOMP_COLUMNS = (
    ("metric", "metric"),
    ("baseline", "contiguous baseline"),
    ("torch_contiguous", "torch/contig"),
    ("torch_paged", "torch/paged"),
    ("vllm_paged", "vllm/paged"),
    ("naive", "naive ×"),
    ("allocation", "allocation ×"),
    ("vllm_contiguous", "vllm/contig"),
    ("vllm_allocation", "vllm alloc ×"),
    ("allocation_gap", "vllm ÷ torch alloc"),
    ("runtime", "runtime ×"),
    ("sim_allocation", "sim alloc ×"),
)


def say(msg: str) -> None:
    print(f"[gpu-smoke] {msg}", flush=True)


def _fmt(key: str, value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key.endswith("_frac"):
        return f"{100 * value:.1f}"  # type: ignore[operator]
    if key == "mean_step_wall_s":
        return f"{1000 * value:.2f}"  # type: ignore[operator]
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def table(rows: list[dict[str, object]], columns: tuple[tuple[str, str], ...]) -> str:
    cells = [[h for _, h in columns]] + [[_fmt(k, r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  " + "  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
        for row in cells
    )


def write_model(directory: Path) -> Path:
    """Llama-3-8B's layers, ``LAYERS`` of them, a 32k vocabulary (fewer random weights to draw):
    vLLM's config.json, from ``runners.vllm.build.write_model_dir``."""
    from ..harness.spec.geometry import preset
    from ..runners.torch.model import param_count
    from ..runners.vllm.build import write_model_dir

    g = preset("llama-3-8b").replace(num_layers=LAYERS, vocab_size=VOCAB)
    g = g.replace(name=MODEL_NAME, num_params=param_count(g))  # the decoder torch and vLLM build
    spec = types.SimpleNamespace(
        geometry=g,
        model=types.SimpleNamespace(kv_dtype="fp16"),
        memory=types.SimpleNamespace(max_model_len=MAX_MODEL_LEN),
    )
    return write_model_dir(spec, directory)  # type: ignore[arg-type]


def suite_text(model: Path, runners: list[str]) -> str:
    return SUITE.format(config=json.dumps(str(model)), max_model_len=MAX_MODEL_LEN, runners=json.dumps(runners))


def run_smoke(out: Path | None = None) -> int:
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except Exception:  # no torch, or a broken one: no device either way
        cuda = False
    if not cuda:
        print(NO_CUDA_LINE, file=sys.stderr)
        return 2
    if out is None and os.environ.get(OUT_ENV):
        out = Path(os.environ[OUT_ENV])
    if out is None:
        with tempfile.TemporaryDirectory(prefix="kvbench-gpu-smoke-") as tmp:
            return _smoke(Path(tmp))
    out.mkdir(parents=True, exist_ok=True)
    return _smoke(out)


def _smoke(out: Path) -> int:
    import torch

    from ..harness.records import store
    from ..harness.records.provenance import provenance
    from ..runners.vllm.engine import EAGER_ENV, VllmRunner
    from .suite import parse_suite
    from .sweep import build_cells, run_cells

    t0 = time.monotonic()
    prov = provenance()
    say(
        f"device {torch.cuda.get_device_name()}  torch {prov.get('torch_version')}  CUDA {torch.version.cuda}  "
        f"vllm {prov.get('vllm_version')}  kvbench {prov.get('kvbench_version')}"
    )
    runners = ["vllm", "torch", "sim"]
    problems: list[str] = []
    reason = VllmRunner().unavailable()
    if reason is not None:
        runners.remove("vllm")
        problems.append(f"vllm skipped: {reason}")
        say(f"vllm skipped: {reason}")
    os.environ.setdefault(EAGER_ENV, "1")
    model = write_model(out / MODEL_NAME)
    text = suite_text(model, runners)
    suite_path = out / "gpu-smoke.toml"
    suite_path.write_text(text, encoding="utf-8")
    suite = parse_suite(text, str(suite_path))
    cells = build_cells(suite, out, say)
    say(
        f"{len(cells)} cells into {out}: "
        + ", ".join(f"{c.spec.runner}/{c.spec.policy}" for c in cells)
        + f"  (vLLM eager: {os.environ.get(EAGER_ENV)})"
    )
    run_cells(cells, quiet=False)
    ids = {c.run_id for c in cells}
    order = {c.run_id: i for i, c in enumerate(cells)}
    runs = store.read_table(out, "runs", ids)
    runs = runs.assign(_order=runs["run_id"].map(order)).sort_values("_order")
    records = runs.to_dict("records")
    first = records[0] if records else {}
    print(
        f"\nmodel {first.get('model')}  workload {first.get('workload_id')}  kv {first.get('kv_dtype')}  "
        f"budget {first.get('budget_bytes') or 0:,} B ({first.get('budget_positions') or 0:,} positions)"
    )
    print(table(records, CELL_COLUMNS))
    for r in records:
        if r.get("runner") in MEASURING_RUNNERS and r.get("status") == OK:
            peak = r.get("peak_kv_bytes_allocated")
            peak_text = "-" if peak is None or peak != peak else f"{int(peak):,} B"
            print(
                f"  {r['runner']}/{r['policy']}: device {r.get('device')}, attention {r.get('attention_backend')}, "
                f"peak KV allocated {peak_text}"
            )
        if r.get("status") != OK:
            problems.append(f"{r.get('runner')}/{r.get('policy')} {r.get('status')}: {r.get('error')}")
            print(f"  ! {r.get('runner')}/{r.get('policy')}: {r.get('status')}: {r.get('error')}")
    from ..reports.decomposition import decompose, gap_sentence

    decomp = decompose(runs.drop(columns="_order"))
    # tokens_per_s is on kvbench's clock in both (same steps: runtime factor 1 by construction);
    # wall_tokens_per_s is per device-synchronised second in both: the measured decomposition.
    decomp = decomp[decomp["metric"] != "tokens_per_s"]
    print(
        "\ndecomposition: vllm/paged vs torch/contiguous = allocation (torch/paged vs torch/contiguous) "
        "× runtime (vllm/paged vs torch/paged); throughput as wall_tokens_per_s (generated tokens per "
        "device-synchronised step second; tokens_per_s rows left out: kvbench's clock, where both take the same steps)"
    )
    if len(decomp):
        print(table(decomp.to_dict("records"), DECOMP_COLUMNS))
        print(gap_sentence(decomp))
        warnings = {w for w in decomp["warning"].dropna()}
        for w in sorted(warnings):
            print(f"  ! {w}")
    else:
        print("  (no rows: no torch or vllm run)")
    say(
        f"done in {time.monotonic() - t0:.0f}s: "
        + ("all cells ok" if not problems else f"{len(problems)} problem(s), see above")
    )
    return 0 if not problems else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.app.gpu_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the records here (default: a temporary directory)")
    args = parser.parse_args(argv)
    return run_smoke(args.out)


if __name__ == "__main__":
    sys.exit(main())
