"""Per-request latency on a run's clock, summarised for the runs table.

Definitions (as vLLM's benchmarks and the vLLM paper use them), over the
requests that finished:

- TTFT: first token time − arrival;
- TPOT: (finish − first token) ÷ (generated tokens − 1), for requests that
  generated more than one token;
- latency: finish − arrival (end to end, queueing included);
- normalized latency: latency ÷ generated tokens (the paper's Fig. 12 axis).

Times are on the run's clock: simulated for sim and vllm-sched, measured for
an engine on the ``measured`` clock (and in steps on the ``steps`` clock).
"""

from __future__ import annotations

import numpy as np

from .sequence import FINISHED, Seq


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def latency_summary(seqs: list[Seq]) -> dict[str, float | None]:
    done = [s for s in seqs if s.status == FINISHED and s.num_output > 0]
    arrival = np.array([s.arrival_s for s in done], dtype=np.float64)
    first = np.array([s.first_token_s for s in done], dtype=np.float64)
    finish = np.array([s.finished_s for s in done], dtype=np.float64)
    generated = np.array([s.num_output for s in done], dtype=np.float64)
    ttft = first - arrival
    latency = finish - arrival
    many = generated > 1
    tpot = (finish[many] - first[many]) / (generated[many] - 1)
    normalized = latency / generated
    return {
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p90_s": _pct(tpot, 90),
        "latency_p50_s": _pct(latency, 50),
        "latency_p90_s": _pct(latency, 90),
        "normalized_latency_mean_s": float(normalized.mean()) if len(normalized) else None,
        "normalized_latency_p50_s": _pct(normalized, 50),
        "normalized_latency_p90_s": _pct(normalized, 90),
    }
