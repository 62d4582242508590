"""Makes the GPU tables kvbench ships from Vidur's published profiles (microsoft/vidur, MIT):
``harness/clock/tables/{a100,a40}/`` (what the tables clock reads and fits on) and
``benchmarks/data/vidur-h100/`` (the H100 tables: held out, read only by the check).

    python tools/make_vidur_tables.py PATH-TO-A-VIDUR-GIT-CHECKOUT

From each table it keeps the shape columns and the median of each operation's time (ms), drops
the min/max/mean/std columns, takes the median of a token count profiled twice, and writes
the rows sorted. Sources, at the commits named below:

- ``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``: a layer's operations (the dense
  layers, norms, rotary embedding, activation, residual add, and the embedding), by tokens and
  tensor-parallel degree;
- ``data/profiling/network/<gpu>_dgx/all_reduce.csv``: all-reduce time by bytes and GPUs,
  kept within one node (``devices_per_node == num_workers``; none for A40);
- ``data/profiling/<gpu>/cpu_overheads.csv`` (only A100 and A40 were published): the engine's
  per-step CPU work by batch size, model and tensor-parallel degree.

``tests/clock/test_gpu_tables.py`` checks the shipped files' form; the README beside them
says where each came from.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
COMPUTE_COMMIT = "7d47513"  # the newest compute and network tables
OVERHEADS_COMMIT = "6d98aa8"  # the last commit with cpu_overheads.csv (A100, A40)
SHAPE = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
OPS = [
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
]
OVERHEADS = ["schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs"]
TARGETS = {"a100": ROOT / "harness" / "clock" / "tables" / "a100", "a40": ROOT / "harness" / "clock" / "tables" / "a40"}
HELD_OUT = {"h100": ROOT / "benchmarks" / "data" / "vidur-h100"}


def _show(repo: Path, commit: str, path: str) -> pd.DataFrame:
    text = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    return pd.read_csv(io.StringIO(text))


def _ls(repo: Path, commit: str, under: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit, under],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def mlp_table(raw: pd.DataFrame) -> pd.DataFrame:
    keep = {f"time_stats.{op}.median": op for op in OPS if f"time_stats.{op}.median" in raw.columns}
    out = raw[SHAPE + ["num_tensor_parallel_workers", "num_tokens", *keep]].rename(columns=keep)
    out = out.rename(columns={"num_tensor_parallel_workers": "tensor_parallel"})
    # A few token counts were profiled twice: their medians, one row each.
    keys = [*SHAPE, "tensor_parallel", "num_tokens"]
    return out.groupby(keys, as_index=False, sort=True).median().reset_index(drop=True)


def all_reduce_table(raw: pd.DataFrame) -> pd.DataFrame:
    within = raw[raw["devices_per_node"] == raw["num_workers"]]
    out = within.groupby(["num_workers", "size"], as_index=False)["time_stats.all_reduce.median"].median()
    return out.rename(columns={"size": "bytes", "time_stats.all_reduce.median": "all_reduce"})


def overheads_table(raw: pd.DataFrame) -> pd.DataFrame:
    cols = {f"{name}_median": name for name in OVERHEADS}
    out = raw[["model_name", "tensor_parallel_degree", "batch_size", *cols]].rename(columns=cols)
    out = out.rename(columns={"model_name": "model", "tensor_parallel_degree": "tensor_parallel"})
    return out.sort_values(["model", "tensor_parallel", "batch_size"]).reset_index(drop=True)


def write(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format="%.6g", lineterminator="\n")


def main(repo: Path) -> None:
    for gpu, target in {**TARGETS, **HELD_OUT}.items():
        for path in _ls(repo, COMPUTE_COMMIT, f"data/profiling/compute/{gpu}"):
            if path.endswith("/mlp.csv"):
                org, model = path.split("/")[-3:-1]
                write(mlp_table(_show(repo, COMPUTE_COMMIT, path)), target / "mlp" / f"{org}__{model}.csv")
        if gpu != "a40":  # Vidur published no all-reduce table of A40s (a pair over NVLink only)
            raw = _show(repo, COMPUTE_COMMIT, f"data/profiling/network/{gpu}_dgx/all_reduce.csv")
            write(all_reduce_table(raw), target / "all_reduce.csv")
        if gpu in TARGETS:
            raw = _show(repo, OVERHEADS_COMMIT, f"data/profiling/{gpu}/cpu_overheads.csv")
            write(overheads_table(raw), target / "cpu_overheads.csv")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/make_vidur_tables.py PATH-TO-A-VIDUR-GIT-CHECKOUT")
    main(Path(sys.argv[1]))
