"""The tables clock (``clock = "tables"``): a step's time as the sum of its operations' measured
times, the roofline kept for what the tables lack, and every term labelled with where it came from.

    step = scale × ( layers × Σ layer operations(tokens) + embedding(tokens)   dense: tables
                     + 2 × layers × all-reduce(tokens × hidden × 2 B)          TP > 1
                     + max(KV bytes ÷ bandwidth, attention FLOPs ÷ peak)        attention: roofline
                     + max(lm-head bytes ÷ bandwidth, its FLOPs ÷ peak)         logits: roofline
                     + CPU work per step + per request × requests )             CPU overheads: tables

Dense operations are *measured* where the GPU's own table profiled the model at its
tensor-parallel degree (interpolated in tokens; beyond the table's last count, in proportion),
else *fitted*: ``op_model`` fitted on the A100 and A40 tables (its terms read from
``OP_TERMS_FILE``), at this GPU's datasheet rates.
The all-reduce is measured where the GPU has a table for that many GPUs, else rooflined. The CPU
work is a line in requests fitted to the host's table (``OverheadTable``), or absent on a GPU
whose host was not profiled. Prices are computed once per token and request count and kept, so
``price`` and ``step_times`` read the same floats.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import numpy as np

from .clocks import Clock, Counts, RooflineClock, _floats
from .gpu_tables import (
    ALL_REDUCE_OF_PRESET,
    FIT_GPUS,
    LAYER_OPS,
    OVERHEADS_OF_PRESET,
    TABLES_DIR,
    TABLES_OF_PRESET,
    GpuTables,
    LayerShape,
    OpTable,
    shipped_tables,
)
from .model import GPU_PRESETS, GpuPreset, ModelShape
from .op_model import OpTerms, fit_op_terms, predict_op, read_op_terms


class DenseModel(ModelShape, Protocol):
    """What the tables clock reads of a model beyond ``ModelShape``."""

    @property
    def num_kv_heads(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def is_uniform_full(self) -> bool: ...


# The operation model's terms fitted on the shipped A100 and A40 tables, kept beside them: the fit
# takes about a second, which every process pricing on this clock would pay again.
OP_TERMS_FILE = TABLES_DIR / "op_terms.json"


@functools.lru_cache(maxsize=1)
def fitted_op_terms() -> dict[str, OpTerms]:
    """The operation model's terms as fitted on the shipped A100 and A40 tables (``OP_TERMS_FILE``,
    written by ``tools/fit_op_terms.py``; a test holds them to ``fit_shipped_op_terms``)."""
    return read_op_terms(OP_TERMS_FILE)


def fit_shipped_op_terms() -> dict[str, OpTerms]:
    """The operation model fitted afresh on the shipped A100 and A40 tables."""
    return fit_op_terms([(t, GPU_PRESETS[FIT_GPUS[f]]) for f in FIT_GPUS for t in shipped_tables(f).ops])


def layer_shape(model: DenseModel) -> LayerShape | None:
    """The layer's shape, gated or not as its parameter count says; None where a layer is not
    one attention block and one dense MLP (MLA, sliding or state layers, experts)."""
    if not model.is_uniform_full or model.head_dim * model.num_attention_heads != model.hidden_size:
        return None
    h, i = model.hidden_size, model.intermediate_size
    attention = h * (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim + h * h
    mlp = (model.num_params - 2 * model.vocab_size * h) / model.num_layers - attention
    matrices = mlp / (h * i)
    if not 1.5 <= matrices <= 3.5:  # neither 2 (up, down) nor 3 (gate, up, down): experts or else
        return None
    return LayerShape(model.num_attention_heads, model.num_kv_heads, h, i, matrices > 2.5)


def _own_table(tables: GpuTables | None, shape: LayerShape, tp: int) -> OpTable | None:
    for t in tables.ops if tables is not None else ():
        if t.shape == shape and t.tensor_parallel == tp:
            return t
    return None


def _interpolate(x: np.ndarray, grid: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` at ``x``: linear between the grid's points; beyond its last, in proportion."""
    x, g = x.astype(np.float64), grid.astype(np.float64)
    return np.where(x > g[-1], values[-1] * x / g[-1], np.interp(x, g, values))


@dataclasses.dataclass(frozen=True)
class Overheads:
    step_s: float
    per_request_s: float
    source: str


def fit_overheads(tables: GpuTables, model: str | None, tp: int) -> Overheads | None:
    """The host's CPU work as step_s + per_request_s × requests: least squares over the table's
    rows of this model and degree, else of every model at this degree, else of every model at the
    profiled degree nearest this one (the larger of two as near): the work per step grows with
    the degree (0.8, 1.5 and 2.0 ms at TP 1, 2 and 4 on the A100 host), so rows of every degree
    would price TP 8 below TP 4."""
    if tables.overheads is None:
        return None
    rows = tables.overheads.rows
    at_tp = rows["tensor_parallel"] == tp
    nearest = max(set(rows["tensor_parallel"]), key=lambda d: (-abs(int(d) - tp), int(d)), default=tp)
    for chosen, said in (
        (rows[at_tp & (rows["model"] == model)], f"{model}, TP {tp}"),
        (rows[at_tp], f"every model at TP {tp}"),
        (rows[rows["tensor_parallel"] == nearest], f"every model at TP {nearest}, the nearest profiled to TP {tp}"),
    ):
        if chosen["batch_size"].nunique() >= 2:
            design = np.column_stack([np.ones(len(chosen)), chosen["batch_size"].to_numpy(np.float64)])
            (step_s, per_request_s), *_ = np.linalg.lstsq(design, chosen["seconds"].to_numpy(), rcond=None)
            where = f"{tables.gpu}/cpu_overheads.csv, {said}"
            return Overheads(max(float(step_s), 0.0), max(float(per_request_s), 0.0), where)
    return None


class TablesClock(Clock):
    name = "tables"

    def __init__(
        self,
        model: DenseModel,
        kv_bytes_per_token: int,
        gpu: GpuPreset,
        scale: float = 1.0,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
    ) -> None:
        self.scale = float(scale)
        self.gpu = gpu
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        self.tp = tp
        self.layers = model.layers_per_stage(pp)
        self.shape = layer_shape(model)
        own = TABLES_OF_PRESET.get(gpu.name)
        own_tables = shipped_tables(own) if own else None
        self.table = _own_table(own_tables, self.shape, tp) if self.shape else None
        self.terms = fitted_op_terms() if self.shape and self.table is None else None
        host = OVERHEADS_OF_PRESET.get(gpu.name)
        vidur_name = self.table.model if self.table else None
        self.overheads = fit_overheads(shipped_tables(host), vidur_name, tp) if host else None
        # All-reduce: the GPU's table for this many GPUs, else the roofline's ring.
        fabric = ALL_REDUCE_OF_PRESET.get(gpu.name)
        ar = shipped_tables(fabric).all_reduce if fabric else None
        self.all_reduce = ar.by_gpus.get(tp) if ar is not None and tp > 1 else None
        self.hidden_bytes = float(model.hidden_size * 2)
        # What no table holds is the roofline's, read from one (its terms for one rank of the
        # largest stage): attention, the lm head, pipeline sends, an all-reduce without a table,
        # and, for a layout the operation model does not cover, every dense weight.
        self.roof = roof = RooflineClock(
            model, kv_bytes_per_token, gpu, tensor_parallel_size=tp, pipeline_parallel_size=pp
        ).parts
        # The lm head: its weights read once a step, its FLOPs for each request's last token.
        head_weights = float(model.vocab_size * model.hidden_size) / tp
        self._head_memory_s = head_weights * 2.0 / roof.bandwidth_bytes_s
        self._head_flops_per_seq = 2.0 * head_weights
        self._dense = np.zeros(0)
        self._cpu = np.zeros(0)

    # ---- per-count prices, computed once for every count up to the largest asked
    def _dense_of(self, tokens: np.ndarray) -> np.ndarray:
        """One stage's dense work (and its all-reduces) at each token count; 0 tokens cost 0."""
        table, roof = self.table, self.roof
        if table is not None:
            layer = sum(_interpolate(tokens, table.tokens, table.times[op]) for op in LAYER_OPS if op in table.times)
            emb = _interpolate(tokens, table.tokens, table.times["emb"]) if "emb" in table.times else 0.0
            dense = layer * self.layers + emb
        elif self.terms is not None and self.shape is not None:
            layer = sum(predict_op(op, self.terms[op], self.shape, self.tp, tokens, self.gpu) for op in LAYER_OPS)
            dense = layer * self.layers + predict_op("emb", self.terms["emb"], self.shape, self.tp, tokens, self.gpu)
        else:  # the roofline of every weight
            dense = np.maximum(
                roof.weight_bytes / roof.bandwidth_bytes_s, tokens * roof.flops_per_token / roof.peak_flops_s
            )
        return np.where(tokens > 0, dense + self.all_reduces(tokens), 0.0)

    def all_reduces(self, tokens: np.ndarray) -> np.ndarray | float:
        """A stage's two all-reduces a layer: the table's time at the activations' bytes, else
        the roofline's ring (0 at TP 1)."""
        if self.all_reduce is None:
            return tokens * self.roof.comm_s_per_token + self.roof.calls_s  # both 0 at TP 1
        size = tokens * self.hidden_bytes
        return 2 * self.layers * _interpolate(size, *self.all_reduce)

    def _grow(self, tokens: int, seqs: int) -> None:
        if tokens >= len(self._dense):
            n = max(tokens + 1, 2 * len(self._dense), 4096)
            self._dense = self._dense_of(np.arange(n, dtype=np.int64))
            self._dense_list = self._dense.tolist()
        if seqs >= len(self._cpu):
            n = max(seqs + 1, 2 * len(self._cpu), 1024)
            s = np.arange(n, dtype=np.float64)
            o = self.overheads
            self._cpu = (o.step_s + o.per_request_s * s) if o is not None else np.zeros(n)
            self._cpu_list = self._cpu.tolist()

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        if scheduled_tokens >= len(self._dense) or scheduled_seqs >= len(self._cpu):
            self._grow(scheduled_tokens, scheduled_seqs)
        roof = self.roof
        memory = context_tokens * roof.kv_bytes_per_token / roof.bandwidth_bytes_s
        compute = attention_pairs * roof.attn_flops_per_pair / roof.peak_flops_s
        head_memory = self._head_memory_s
        head_compute = scheduled_seqs * self._head_flops_per_seq / roof.peak_flops_s
        stage = (
            self._dense_list[scheduled_tokens]
            + (memory if memory >= compute else compute)
            + (head_memory if head_memory >= head_compute else head_compute)
        )
        step = stage * roof.stages + scheduled_tokens * roof.send_s_per_token + roof.sends_s
        return (step + self._cpu_list[scheduled_seqs]) * self.scale

    def step_times(
        self, scheduled_tokens: Counts, context_tokens: np.ndarray, attention_pairs: np.ndarray, scheduled_seqs: Counts
    ) -> np.ndarray:
        # ``price``'s operations, in its order, on arrays.
        tokens = np.asarray(scheduled_tokens, dtype=np.int64)
        seqs = np.asarray(scheduled_seqs, dtype=np.int64)
        self._grow(int(tokens.max(initial=0)), int(seqs.max(initial=0)))
        roof = self.roof
        memory = context_tokens * roof.kv_bytes_per_token / roof.bandwidth_bytes_s
        compute = attention_pairs * roof.attn_flops_per_pair / roof.peak_flops_s
        head_compute = _floats(seqs) * self._head_flops_per_seq / roof.peak_flops_s
        stage = self._dense[tokens] + np.maximum(memory, compute) + np.maximum(self._head_memory_s, head_compute)
        step = stage * roof.stages + _floats(tokens) * roof.send_s_per_token + roof.sends_s
        return (step + self._cpu[seqs]) * self.scale

    # ---- what priced each term
    def sources(self) -> dict[str, str]:
        """Each term and where its times come from: measured, fitted, rooflined or none."""
        if self.table is not None:
            dense = f"measured ({self.table.gpu}/mlp {self.table.model}, TP {self.tp})"
        elif self.terms is not None:
            dense = f"fitted (operation model fitted on {', '.join(FIT_GPUS)} tables; {self.gpu.name} datasheet rates)"
        else:
            dense = "rooflined (a layout the operation model does not cover)"
        out = {"dense layers": dense, "attention": "rooflined", "logits": "rooflined"}
        if self.tp > 1:
            fabric = ALL_REDUCE_OF_PRESET.get(self.gpu.name)
            table = f"{fabric}/all_reduce.csv, {self.tp} GPUs"
            out["all-reduce"] = f"measured ({table})" if self.all_reduce is not None else "rooflined"
        o = self.overheads
        out["CPU overheads"] = (
            f"measured ({o.source}: {o.step_s * 1e3:.3g} ms/step + {o.per_request_s * 1e6:.3g} µs/request)"
            if o is not None
            else f"none (no host profiled with {self.gpu.name})"
        )
        return out

    def describe(self) -> str:
        scaled = f" × {self.scale:g} (roofline_scale, fitted)" if self.scale != 1.0 else ""
        terms = "; ".join(f"{k}: {v}" for k, v in self.sources().items())
        return f"tables on {self.gpu.name}{scaled}: {terms}"

    def fallbacks(self) -> list[str]:
        """One line for each term the tables lack here and the roofline (or nothing) takes."""
        lines = []
        if self.shape is None:
            lines.append(
                f"tables clock: this model's layers are not one attention block and one dense MLP; "
                f"its dense layers fall back to the roofline on {self.gpu.name}"
            )
        if self.overheads is None:
            lines.append(
                f"tables clock: no CPU-overhead table for {self.gpu.name}'s host; its steps carry none, "
                f"as on the roofline"
            )
        return lines
