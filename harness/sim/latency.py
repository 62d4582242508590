"""Per-request latency on a run's clock, summarised for the runs table.

Definitions (as vLLM's benchmarks and the vLLM paper use them), over the
requests that finished:

- TTFT: first token time − arrival;
- TPOT: (finish − first token) ÷ (generated tokens − 1), for requests that
  generated more than one token;
- ITL: every gap between successive tokens of one request, pooled over the
  requests; only where the runner recorded each token's time (``token_times``),
  else null: TPOT is a request's mean gap, not its gaps;
- latency: finish − arrival (end to end, queueing included);
- normalized latency: latency ÷ generated tokens (the paper's Fig. 12 axis).

Each is summarised at every statistic of ``LATENCY_STATS`` (percentiles by
numpy's default, linear, method; std with ddof 0, as vLLM's benchmark).
Times are on the run's clock: simulated for sim and vllm-sched, measured for
an engine on the ``measured`` clock (and in steps on the ``steps`` clock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..records.schema import LATENCY_PREFIXES, LATENCY_STATS
from .sequence import FINISHED, Seq


def summarise(values: np.ndarray, stat: str) -> float | None:
    """One statistic of ``LATENCY_STATS`` of ``values``; None when there are none."""
    if not len(values):
        return None
    if stat == "mean":
        return float(values.mean())
    if stat == "std":
        return float(values.std())
    return float(np.percentile(values, float(stat[1:])))


def itl_summary(seqs: list[Seq], token_times: Mapping[int, Sequence[float]]) -> dict[str, float | None]:
    """The runs table's ``itl_*`` columns from each sequence's token times (``latency_summary``'s)."""
    summary = latency_summary(seqs, token_times)
    return {k: v for k, v in summary.items() if k.startswith("itl_")}


def latency_summary(
    seqs: list[Seq], token_times: Mapping[int, Sequence[float]] | None = None
) -> dict[str, float | None]:
    """The runs table's latency columns; ``token_times``: each finished sequence's token times
    by ``Seq.index`` (the first token's included), where the runner records them."""
    done = [s for s in seqs if s.status == FINISHED and s.num_output > 0]
    arrival = np.array([s.arrival_s for s in done], dtype=np.float64)
    first = np.array([s.first_token_s for s in done], dtype=np.float64)
    finish = np.array([s.finished_s for s in done], dtype=np.float64)
    generated = np.array([s.num_output for s in done], dtype=np.float64)
    latency = finish - arrival
    many = generated > 1
    values = {
        "ttft": first - arrival,
        "tpot": (finish[many] - first[many]) / (generated[many] - 1),
        "latency": latency,
        "normalized_latency": latency / generated,
    }
    gaps = (
        [np.diff(np.asarray(token_times[s.index], dtype=np.float64)) for s in done if s.index in token_times]
        if token_times is not None
        else []
    )
    if gaps:
        values["itl"] = np.concatenate(gaps)
    return {
        f"{prefix}_{stat}_s": summarise(values[prefix], stat) if prefix in values else None
        for prefix in LATENCY_PREFIXES
        for stat in LATENCY_STATS
    }
