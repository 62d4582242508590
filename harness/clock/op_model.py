"""A layer's operations priced from what they move and compute, with terms fitted on measured
GPU tables: the model that carries Vidur's A100 and A40 profiles to GPUs and models they lack.

Each operation of a layer (``gpu_tables.OPS``) moves bytes and does FLOPs that follow from the
layer's shape, its tensor-parallel degree and the step's tokens (``op_work``). Its time is

    GEMM:         t = ((c + bytes / (bandwidth × e_b))^k + (tiled FLOPs / (peak × e_f))^k)^(1/k)
    elementwise:  t =   c + bytes / (bandwidth × e_b)

with bandwidth and peak a GPU's datasheet rates. A GEMM computes whole tiles of
``GEMM_TILE_TOKENS`` tokens, so its FLOPs are those of the token count rounded up to a tile
(65 tokens cost what 128 do). ``c`` (a kernel's fixed latency), the achieved
fractions ``e_b`` and ``e_f``, and ``k`` (how sharply a GEMM turns from memory-bound to
compute-bound) are fitted per operation on the A100 and A40 tables at once, minimising the
squared log error (``fit_op_terms``): a plain Levenberg–Marquardt in numpy, within bounds.
This form, the tile among 1, 16, 32, 64 and 128 tokens included, was chosen over others (no
latency; a latency in bytes; a latency as a floor) by fitting on one of A100 and A40 and checking
on the other (``benchmarks/bench_gpu_tables.py`` prints that check). docs/clock.md has its errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import KvbenchError
from ..files import MIB, check_regular_input
from .gpu_tables import GEMM_OPS, OPS, LayerShape, OpTable
from .model import GpuPreset

DTYPE_BYTES = 2  # the tables were profiled in fp16
# Tokens per GEMM tile: a large model's layer time in the A100 tables is flat from 1 to 64 tokens
# and rises in steps beyond (up 16% at 128 tokens, 77% at 192 for Llama-2-70B), as GEMM kernels
# start new tiles of tokens; 64 is the size the A100 <-> A40 check picks.
GEMM_TILE_TOKENS = 64


@dataclasses.dataclass(frozen=True)
class OpTerms:
    """One operation's fitted terms (``latency_s`` is ``c``; GEMMs also use the last three)."""

    latency_s: float
    bandwidth_efficiency: float
    flops_efficiency: float = 1.0
    sharpness: float = 1.0
    tile_tokens: int = 1


def op_work(
    op: str, shape: LayerShape, tensor_parallel: int, tokens: np.ndarray, tile: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, FLOPs) of one operation at each token count, on one tensor-parallel rank; a GEMM's
    FLOPs are those of the count rounded up to ``tile`` tokens (1: the FLOPs the math needs)."""
    t = tokens.astype(np.float64)
    tp = float(tensor_parallel)
    h, d = float(shape.hidden), float(shape.head_dim)
    q, kv = float(shape.heads), float(shape.kv_heads)
    inter = float(shape.intermediate) / tp
    if op in GEMM_OPS:
        width_in, width_out = {
            "attn_pre_proj": (h, (q + 2 * kv) * d / tp),
            "attn_post_proj": (q * d / tp, h),
            "mlp_up_proj": (h, inter * (2 if shape.gated else 1)),
            "mlp_down_proj": (inter, h),
        }[op]
        weights = width_in * width_out
        tiled = np.ceil(t / tile) * tile
        return DTYPE_BYTES * (weights + t * (width_in + width_out)), 2.0 * tiled * weights
    elements = {
        "emb": 2 * h,
        "input_layernorm": 2 * h,
        "post_attention_layernorm": 2 * h,
        "attn_rope": 2 * (q + kv) * d / tp,
        "mlp_act": inter * (3 if shape.gated else 2),
        "add": 3 * h,
    }[op]
    return DTYPE_BYTES * t * elements, np.zeros_like(t)


def op_time(
    terms: OpTerms,
    gemm: bool,
    bytes_moved: np.ndarray,
    flops: np.ndarray,
    bandwidth: np.ndarray | float,
    peak: np.ndarray | float,
) -> np.ndarray:
    """Seconds, under ``terms``, at the datasheet rates given (one per row, or one for all)."""
    memory = terms.latency_s + bytes_moved / (bandwidth * terms.bandwidth_efficiency)
    if not gemm:
        return memory
    k = terms.sharpness
    compute = flops / (peak * terms.flops_efficiency)
    return (memory**k + compute**k) ** (1.0 / k)


def predict_op(op: str, terms: OpTerms, shape: LayerShape, tp: int, tokens: np.ndarray, gpu: GpuPreset) -> np.ndarray:
    bytes_moved, flops = op_work(op, shape, tp, tokens, terms.tile_tokens)
    return op_time(
        terms, op in GEMM_OPS, bytes_moved, flops, np.float64(gpu.bandwidth_bytes_s), np.float64(gpu.peak_flops)
    )


# Parameters in the fit's units (µs for the latency), their start and their bounds.
_START = {True: (5.0, 0.8, 0.7, 4.0), False: (3.0, 0.7)}
_LOW = (0.0, 0.05, 0.05, 1.0)
_HIGH = (100.0, 1.0, 1.0, 20.0)


def _terms(x: np.ndarray, tile: int = 1) -> OpTerms:
    latency_s, bandwidth = float(x[0]) * 1e-6, float(x[1])
    if len(x) == 2:  # elementwise
        return OpTerms(latency_s, bandwidth)
    return OpTerms(latency_s, bandwidth, float(x[2]), float(x[3]), tile)


def _levenberg_marquardt(residuals, x0: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Least squares of ``residuals(x)`` within [low, high] (steps clipped to the bounds)."""
    x = x0.copy()
    r = residuals(x)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(200):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            step = 1e-6 * max(1.0, abs(x[j]))
            probe = x.copy()
            probe[j] += step
            jac[:, j] = (residuals(probe) - r) / step
        a = jac.T @ jac
        g = jac.T @ r
        improved = False
        while damping < 1e12:
            try:
                dx = np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -g)
            except np.linalg.LinAlgError:
                damping *= 10
                continue
            trial = np.clip(x + dx, low, high)
            r_trial = residuals(trial)
            cost_trial = float(r_trial @ r_trial)
            if cost_trial < cost:
                improved = cost - cost_trial > 1e-12 * cost
                x, r, cost = trial, r_trial, cost_trial
                damping = max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved:
            break
    return x


def fit_op_terms(tables: Sequence[tuple[OpTable, GpuPreset]], tile: int = GEMM_TILE_TOKENS) -> dict[str, OpTerms]:
    """Each operation's terms, fitted on every row of ``tables`` (each with the preset of the GPU
    it was measured on) where the operation took a time above 0; GEMMs in tiles of ``tile``."""
    fitted = {}
    for op in OPS:
        gemm = op in GEMM_OPS
        parts = [
            (*op_work(op, t.shape, t.tensor_parallel, t.tokens, tile if gemm else 1), t.times[op], gpu)
            for t, gpu in tables
            if op in t.times
        ]
        b = np.concatenate([p[0] for p in parts])
        f = np.concatenate([p[1] for p in parts])
        y = np.concatenate([p[2] for p in parts])
        bw = np.concatenate([np.full(len(p[2]), p[3].bandwidth_bytes_s) for p in parts])
        pk = np.concatenate([np.full(len(p[2]), p[3].peak_flops) for p in parts])
        keep = y > 0
        b, f, y, bw, pk = b[keep], f[keep], y[keep], bw[keep], pk[keep]
        log_y = np.log(y)
        n = len(_START[gemm])

        def residuals(x: np.ndarray, b=b, f=f, bw=bw, pk=pk, log_y=log_y, gemm=gemm) -> np.ndarray:  # type: ignore[no-untyped-def]
            return np.log(op_time(_terms(x), gemm, b, f, bw, pk)) - log_y

        x = _levenberg_marquardt(residuals, np.array(_START[gemm]), np.array(_LOW[:n]), np.array(_HIGH[:n]))
        fitted[op] = _terms(x, tile)
    return fitted


# What the fitted terms file says of itself (``write_op_terms``); its ``terms`` are read back.
_TERMS_FILE_WHAT = (
    "The operation model's terms (harness/clock/op_model.py), fitted on the A100 and A40 tables "
    "beside this file; written by tools/fit_op_terms.py, checked against a fresh fit by "
    "tests/clock/test_gpu_tables.py"
)


def write_op_terms(terms: dict[str, OpTerms], path: Path) -> None:
    """``terms`` as JSON (floats as Python writes them, so they read back bit for bit)."""
    body = {"what": _TERMS_FILE_WHAT, "terms": {op: dataclasses.asdict(t) for op, t in terms.items()}}
    path.write_text(json.dumps(body, indent=1) + "\n")


def read_op_terms(path: Path) -> dict[str, OpTerms]:
    """The terms ``write_op_terms`` wrote: every operation of ``OPS``, each term a finite number
    (the tile a whole one ≥ 1); anything else is one line naming the file."""
    try:
        check_regular_input(path, "fitted operation terms", MIB)
        body = json.loads(path.read_bytes())
    except OSError as exc:
        raise KvbenchError(f"{path}: cannot read fitted operation terms ({exc.strerror or exc})") from None
    except ValueError as exc:  # not UTF-8, or not JSON
        raise _corrupt_terms(path, f"not JSON: {exc}") from None
    terms = body.get("terms") if isinstance(body, dict) else None
    if not isinstance(terms, dict):
        raise _corrupt_terms(path, "no 'terms' object")
    fields = [f.name for f in dataclasses.fields(OpTerms)]
    out = {}
    for op in OPS:
        given = terms.get(op)
        if not isinstance(given, dict) or sorted(given) != sorted(fields):
            raise _corrupt_terms(path, f"{op}: expected the terms {', '.join(fields)}")
        values = [given[f] for f in fields]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        if not numbers or not isinstance(given["tile_tokens"], int) or given["tile_tokens"] < 1:
            raise _corrupt_terms(path, f"{op}: {', '.join(f'{f} = {v!r}' for f, v in zip(fields, values))}")
        out[op] = OpTerms(**given)
    return out


def _corrupt_terms(path: Path, why: str) -> KvbenchError:
    return KvbenchError(f"{path}: corrupt fitted operation terms ({why})")
