"""One latency bound of an SLO: a metric, the statistic it is read at, and its highest value."""

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
    """``metric``'s ``stat`` ("p99", or "mean") over a run's requests is at most ``max_s``."""

    metric: str  # a key of METRICS
    stat: str
    max_s: float

    @property
    def column(self) -> str:
        """The runs-table column the bound reads."""
        return f"{METRICS[self.metric]}_{self.stat}_s"
