"""Per-request latency on a run's clock, summarised for the runs table.

Definitions (as vLLM's benchmarks and the vLLM paper use them), over the
requests that finished:

- TTFT: first token time − arrival;
- TPOT: (finish − first token) ÷ (generated tokens − 1), for requests that
  generated more than one token;
- ITL: every gap between successive arrivals of tokens of one request, pooled
  over the requests, as ``vllm bench serve`` measures it: a streamed chunk is one
  arrival however many tokens it carries (serve), a token is one where each is
  its own step (vllm-sched, vllm, torch); only where the runner recorded those
  times (``token_times``), else null: TPOT is a request's mean gap, not its gaps;
- latency: finish − arrival (end to end, queueing included);
- normalized latency: latency ÷ generated tokens (the paper's Fig. 12 axis).

Each is summarised at every statistic of ``LATENCY_STATS`` (percentiles by
the linear method, numpy's default, as vLLM's benchmark: ``harness.records.percentiles``;
std with ddof 0).
Times are on the run's clock: simulated for sim and vllm-sched, measured for
an engine on the ``measured`` clock (and in steps on the ``steps`` clock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..records.percentiles import percentile
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
    return percentile(values, float(stat[1:]))


def _finished(seqs: list[Seq]) -> list[Seq]:
    return [s for s in seqs if s.status == FINISHED and s.num_output > 0]


def _gaps(done: list[Seq], token_times: Mapping[int, Sequence[float]]) -> np.ndarray | None:
    """Every gap between successive tokens of the finished sequences; None without token times."""
    gaps = [np.diff(np.asarray(token_times[s.index], dtype=np.float64)) for s in done if s.index in token_times]
    return np.concatenate(gaps) if gaps else None


def _stats(prefix: str, values: np.ndarray | None) -> dict[str, float | None]:
    return {f"{prefix}_{stat}_s": None if values is None else summarise(values, stat) for stat in LATENCY_STATS}


def itl_summary(seqs: list[Seq], token_times: Mapping[int, Sequence[float]]) -> dict[str, float | None]:
    """The runs table's ``itl_*`` columns from each sequence's token times."""
    return _stats("itl", _gaps(_finished(seqs), token_times))


def latency_summary(
    seqs: list[Seq], token_times: Mapping[int, Sequence[float]] | None = None
) -> dict[str, float | None]:
    """The runs table's latency columns; ``token_times``: each finished sequence's token times
    by ``Seq.index`` (the first token's included), where the runner records them."""
    done = _finished(seqs)
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
        "itl": None if token_times is None else _gaps(done, token_times),
    }
    return {k: v for prefix in LATENCY_PREFIXES for k, v in _stats(prefix, values[prefix]).items()}
