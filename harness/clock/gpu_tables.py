"""The measured GPU tables kvbench ships (Vidur's published profiles, ``tables/README.md``), read
through one loader into frozen tables: per-operation times of one layer by tokens
(``OpTable``), all-reduce times by bytes and GPUs (``AllReduceTable``), and the engine's CPU
work per step by batch size (``OverheadTable``). A table that does not parse, lacks a column,
or holds a value that is not a finite time ≥ 0 is one line naming its file.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import KvbenchError
from ..files import MIB, check_regular_input

TABLES_DIR = Path(__file__).resolve().parent / "tables"
# A layer's operations as Vidur names them (times in ms in the files, seconds once read).
# ``emb`` runs once a step, the others once a layer.
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
LAYER_OPS = GEMM_OPS + ELEMENTWISE_OPS
OPS = ("emb", *LAYER_OPS)
OVERHEADS = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
MAX_TABLE_BYTES = 16 * MIB


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """What a layer's operations cost depends on: heads, hidden and MLP widths, gated or not."""

    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    gated: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclasses.dataclass(frozen=True, eq=False)
class OpTable:
    """One model's layer on one GPU at one tensor-parallel degree: each operation's median time
    (seconds) at each token count. An operation the model lacks (phi-2's parallel block has no
    second norm) is absent from ``times``."""

    gpu: str
    model: str  # Vidur's name, e.g. meta-llama/Llama-2-7b-hf
    shape: LayerShape
    tensor_parallel: int
    tokens: np.ndarray  # int64, increasing
    times: dict[str, np.ndarray]
    path: str


@dataclasses.dataclass(frozen=True, eq=False)
class AllReduceTable:
    """All-reduce within one node: median seconds by bytes, for each number of GPUs."""

    gpu: str
    by_gpus: dict[int, tuple[np.ndarray, np.ndarray]]  # GPUs → (bytes increasing, seconds)
    path: str


@dataclasses.dataclass(frozen=True, eq=False)
class OverheadTable:
    """The engine's CPU work per step (the sum of ``OVERHEADS``, seconds) by batch size, for each
    (model, tensor-parallel degree) profiled."""

    gpu: str
    rows: pd.DataFrame  # model, tensor_parallel, batch_size, seconds
    path: str


@dataclasses.dataclass(frozen=True, eq=False)
class GpuTables:
    gpu: str  # the tables' folder name: a100, a40, h100
    ops: tuple[OpTable, ...]
    all_reduce: AllReduceTable | None
    overheads: OverheadTable | None


def _corrupt(path: Path, why: str) -> KvbenchError:
    return KvbenchError(f"{path}: corrupt GPU table ({why})")


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    check_regular_input(path, "GPU table", MAX_TABLE_BYTES)
    try:
        frame = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise _corrupt(path, f"not CSV: {str(exc).splitlines()[0][:80]}") from None
    except OSError as exc:
        raise KvbenchError(f"{path}: cannot read GPU table ({exc.__class__.__name__})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise _corrupt(path, f"no column {missing[0]!r}")
    if frame.empty:
        raise _corrupt(path, "no rows")
    return frame


def _numbers(frame: pd.DataFrame, column: str, path: Path, allow_missing: bool = False) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) & ~(allow_missing & frame[column].isna().to_numpy())
    bad |= values < 0
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raw = frame[column].iloc[row]
        shown = repr(raw) if isinstance(raw, str) else str(float(raw))
        raise _corrupt(path, f"{column} on line {row + 2} is {shown}, not a number ≥ 0")
    return values


def _counts(frame: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = _numbers(frame, column, path)
    if (values < 1).any() or (values != np.round(values)).any():
        raise _corrupt(path, f"{column} holds a value that is not a whole number ≥ 1")
    return values.astype(np.int64)


def _op_tables(path: Path, gpu: str) -> list[OpTable]:
    frame = _read(path, (*SHAPE_COLUMNS, "tensor_parallel", "num_tokens", *GEMM_OPS))
    org, _, name = path.stem.partition("__")
    shape_values = {c: _counts(frame, c, path) for c in SHAPE_COLUMNS if c != "use_gated_mlp"}
    if any(len(set(v.tolist())) != 1 for v in shape_values.values()):
        raise _corrupt(path, "more than one model shape in one table")
    gated = frame["use_gated_mlp"].astype(str).str.lower().unique().tolist()
    if gated not in (["true"], ["false"]):
        raise _corrupt(path, f"use_gated_mlp is {gated!r}, not one of True, False")
    shape = LayerShape(
        heads=int(shape_values["n_head"][0]),
        kv_heads=int(shape_values["n_kv_head"][0]),
        hidden=int(shape_values["n_embd"][0]),
        intermediate=int(shape_values["n_expanded_embd"][0]),
        gated=gated == ["true"],
    )
    tps = _counts(frame, "tensor_parallel", path)
    tokens = _counts(frame, "num_tokens", path)
    present = [op for op in OPS if op in frame.columns]
    times = {op: _numbers(frame, op, path, allow_missing=op not in GEMM_OPS) / 1e3 for op in present}
    tables = []
    for tp in sorted(set(tps.tolist())):
        rows = np.flatnonzero(tps == tp)
        order = rows[np.argsort(tokens[rows], kind="stable")]
        grid = tokens[order]
        if len(grid) < 2 or (np.diff(grid) <= 0).any():
            raise _corrupt(path, f"tensor parallel {tp}: token counts not distinct, or fewer than two")
        kept = {op: t[order] for op, t in times.items() if not np.isnan(t[order]).all()}
        if any(np.isnan(t).any() for t in kept.values()):
            raise _corrupt(path, f"tensor parallel {tp}: an operation timed at some token counts only")
        tables.append(OpTable(gpu, f"{org}/{name}", shape, tp, grid, kept, str(path)))
    return tables


def _all_reduce(path: Path, gpu: str) -> AllReduceTable:
    frame = _read(path, ("num_workers", "bytes", "all_reduce"))
    workers = _counts(frame, "num_workers", path)
    size = _counts(frame, "bytes", path)
    seconds = _numbers(frame, "all_reduce", path) / 1e3
    by_gpus = {}
    for n in sorted(set(workers.tolist())):
        rows = np.flatnonzero(workers == n)
        order = rows[np.argsort(size[rows], kind="stable")]
        if (np.diff(size[order]) <= 0).any():
            raise _corrupt(path, f"{n} GPUs: a size given twice")
        by_gpus[n] = (size[order], seconds[order])
    return AllReduceTable(gpu, by_gpus, str(path))


def _overheads(path: Path, gpu: str) -> OverheadTable:
    frame = _read(path, ("model", "tensor_parallel", "batch_size", *OVERHEADS))
    seconds = sum(_numbers(frame, c, path) for c in OVERHEADS) / 1e3
    rows = pd.DataFrame(
        {
            "model": frame["model"].astype(str),
            "tensor_parallel": _counts(frame, "tensor_parallel", path),
            "batch_size": _counts(frame, "batch_size", path),
            "seconds": seconds,
        }
    )
    return OverheadTable(gpu, rows, str(path))


@functools.lru_cache(maxsize=8)
def load_gpu_tables(directory: str | Path) -> GpuTables:
    """The tables of one GPU's folder (``mlp/*.csv``, ``all_reduce.csv``, ``cpu_overheads.csv``;
    the last two optional), read once per process."""
    root = Path(directory)
    if not root.is_dir():
        raise KvbenchError(f"{root}: no such folder of GPU tables")
    ops = [t for path in sorted((root / "mlp").glob("*.csv")) for t in _op_tables(path, root.name)]
    all_reduce = _all_reduce(root / "all_reduce.csv", root.name) if (root / "all_reduce.csv").exists() else None
    overheads = _overheads(root / "cpu_overheads.csv", root.name) if (root / "cpu_overheads.csv").exists() else None
    return GpuTables(root.name, tuple(ops), all_reduce, overheads)


# The GPU presets (``harness.clock.model.GPU_PRESETS``) whose own measured tables kvbench ships.
# Vidur profiled A100s of 80 GB (DGX A100); an A100-40GB has 24% less bandwidth, so its dense
# layers are priced by the fitted operation model, not by the 80 GB tables.
TABLES_OF_PRESET = {"A100-80GB": "a100", "A40": "a40"}
# The folders the operation model is fitted on, with the preset whose datasheet each ran on.
FIT_GPUS = {"a100": "A100-80GB", "a40": "A40"}
# Whose all-reduce table a preset's tensor-parallel steps read: both A100s sit on NVSwitch (DGX A100).
ALL_REDUCE_OF_PRESET = {"A100-40GB": "a100", "A100-80GB": "a100"}
# Whose host's CPU work a preset's steps carry: the A100s' (the same DGX A100 host for both sizes).
OVERHEADS_OF_PRESET = {"A100-40GB": "a100", "A100-80GB": "a100", "A40": "a40"}


def shipped_tables(folder: str) -> GpuTables:
    return load_gpu_tables(TABLES_DIR / folder)
