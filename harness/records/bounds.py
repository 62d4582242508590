"""One latency bound of an SLO: a metric, the statistic it is read at, its highest value, and the
percentile method it is judged by (``harness.records.percentiles``)."""

from __future__ import annotations

import dataclasses

# A bound's metric, by its short name, and the runs columns' prefix for it.
METRICS: dict[str, str] = {
    "ttft": "ttft",
    "tpot": "tpot",
    "itl": "itl",
    "e2e": "latency",
    "normalized": "normalized_latency",
}
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


@dataclasses.dataclass(frozen=True)
class Bound:
    """``metric``'s ``stat`` ("p99", or "mean") over a run's requests is at most ``max_s``, the
    percentile taken by ``method`` (``linear``: the runs table's own; ``mlperf``: LoadGen's)."""

    metric: str  # a key of METRICS
    stat: str
    max_s: float
    method: str = "linear"

    @property
    def column(self) -> str:
        """The runs-table column of the statistic (its linear percentile, or the mean)."""
        return f"{METRICS[self.metric]}_{self.stat}_s"

    @property
    def judged_column(self) -> str:
        """The column a judgement reads: ``column`` itself, or for a percentile by another method
        ``column@method``, which ``harness.records.goodput.with_goodput`` adds from the requests."""
        return judged_column(self.column, self.method)


def judged_column(column: str, method: str | None) -> str:
    """``ttft_p99_s`` judged by ``method``: itself when linear (or a mean), else ``ttft_p99_s@mlperf``."""
    if not method or method == "linear" or not column.rsplit("_", 2)[1].startswith("p"):
        return column
    return f"{column}@{method}"


def split_judged(column: str) -> tuple[str, str]:
    """``ttft_p99_s@mlperf`` → (``ttft_p99_s``, ``mlperf``); a plain column → (column, ``linear``)."""
    base, _, method = column.partition("@")
    return base, method or "linear"
