"""Percentiles, by the method of the tool a number is compared with: the one function every
latency percentile of kvbench goes through.

- ``linear`` (the runs table's columns, the export to vLLM's formats): numpy's default,
  ``np.percentile``, interpolating linearly between the two nearest ranks. It is what
  ``vllm bench serve`` reports (``calculate_metrics`` in ``vllm/benchmarks/serve.py`` calls
  ``np.percentile`` with no method).
- ``mlperf``: MLPerf LoadGen's rule, the sorted sample at index ⌊n × q⌋ (q as a fraction), no
  interpolation (``PerformanceSummary::ProcessLatencies`` and ``ProcessTokenLatencies`` in
  mlcommons/inference ``loadgen/results.cc``: ``sample_latencies[sample_count * percentile]``,
  the ``size_t`` conversion truncating). It is never below the linear percentile: with 60
  requests, p99 is the largest, where linear interpolation stops 41% of the way to it from the
  second largest. An ``[slo]`` preset from MLPerf is judged by it (``harness.records.bounds``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

METHODS: tuple[str, ...] = ("linear", "mlperf")


def percentile(values: np.ndarray | Sequence[float] | Any, q: float, method: str = "linear") -> float:
    """The ``q``-th percentile (0 ≤ q < 100 for ``mlperf``) of ``values`` by ``method``. ``linear``
    takes whatever ``np.percentile`` takes (vLLM hands it 0 for no values); ``mlperf`` needs at
    least one value."""
    if method == "linear":
        return float(np.percentile(values, q))
    if method == "mlperf":
        ordered = np.sort(np.asarray(values, dtype=np.float64), kind="stable")
        if not 0 <= q < 100 or not len(ordered):
            raise ValueError(f"mlperf percentile: q must be in [0, 100) over at least one value (q {q})")
        return float(ordered[int(len(ordered) * (q / 100.0))])
    raise ValueError(f"unknown percentile method {method!r} (known: {', '.join(METHODS)})")
