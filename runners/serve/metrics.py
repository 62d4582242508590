"""The server's Prometheus ``/metrics``, scraped at a fixed interval into the ``metrics`` table.

Read (``harness.records.schema.METRICS``): ``vllm:kv_cache_usage_perc`` (a fraction of the
pool's usable blocks, despite its name), ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, and the counters ``vllm:num_preemptions``,
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (cumulative; Prometheus client
libraries add ``_total``), and with a CPU tier ``vllm:external_prefix_cache_queries``,
``vllm:external_prefix_cache_hits``, ``vllm:kv_offload_load_bytes`` and
``vllm:kv_offload_store_bytes`` (counters too). Values of several label sets (engines) are summed; a family the server
does not export is a null (another engine behind an attached URL).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import aiohttp

from ...harness.records.schema import METRICS

# Column -> the metric family it reads (its ``_total`` sample for counters).
FAMILIES: dict[str, str] = {
    "kv_cache_usage_frac": "vllm:kv_cache_usage_perc",
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "num_preemptions": "vllm:num_preemptions",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    # A CPU tier: vLLM's connector prefix-cache counters and its offloading worker's bytes.
    "external_prefix_cache_queries": "vllm:external_prefix_cache_queries",
    "external_prefix_cache_hits": "vllm:external_prefix_cache_hits",
    "kv_offload_load_bytes": "vllm:kv_offload_load_bytes",
    "kv_offload_store_bytes": "vllm:kv_offload_store_bytes",
}

assert set(FAMILIES) <= set(METRICS.names)


def parse_metrics(text: str) -> dict[str, float | None]:
    """The ``FAMILIES`` values in one Prometheus text exposition (None where absent)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        name = name_part.split("{", 1)[0]
        if "}" in line and "{" in name_part and not name_part.endswith("}"):
            # labels with spaces: the value follows the closing brace
            name = line.split("{", 1)[0]
            rest = line.rsplit("}", 1)[1]
        if name.endswith("_total"):
            name = name[: -len("_total")]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + value
    return {col: sums.get(family) for col, family in FAMILIES.items()}


def cache_config(text: str) -> dict[str, str] | None:
    """The labels of ``vllm:cache_config_info`` (vLLM's ``CacheConfig`` as strings: ``block_size``,
    ``enable_prefix_caching``, ``num_gpu_blocks``, …); None where the server exports none."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = {}
            for item in line.split("{", 1)[1].rsplit("}", 1)[0].split(","):
                key, _, value = item.partition("=")
                labels[key.strip()] = value.strip().strip('"')
            return labels
    return None


def num_gpu_blocks(text: str) -> int | None:
    """The pool size ``vllm:cache_config_info`` labels carry (None where absent)."""
    try:
        return int((cache_config(text) or {})["num_gpu_blocks"])
    except (KeyError, ValueError):
        return None


class Scraper:
    """GET ``/metrics`` every ``interval_s``; rows of ``t_s`` (from the replay start) + values."""

    def __init__(self, url: str, interval_s: float, t0: float) -> None:
        self.url = f"{url}/metrics"
        self.interval_s = interval_s
        self.t0 = t0
        self.rows: list[dict[str, float | None]] = []
        self.errors = 0
        self.last_text = ""

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        t = time.perf_counter() - self.t0
        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=max(self.interval_s, 2.0))) as r:
                if r.status != 200:
                    self.errors += 1
                    return
                text = await r.text()
        except (TimeoutError, aiohttp.ClientError):
            self.errors += 1
            return
        self.last_text = text
        self.rows.append({"t_s": t, **parse_metrics(text)})

    async def run(self) -> None:
        """Scrape until cancelled, at fixed times (t0 + k × interval), not interval after each reply."""
        async with aiohttp.ClientSession() as session:
            k = 0
            while True:
                await self.scrape_once(session)
                k += 1
                delay = self.t0 + k * self.interval_s - time.perf_counter()
                if delay < 0:  # a slow reply: skip the missed ticks
                    k += math.ceil(-delay / self.interval_s)
                    delay = self.t0 + k * self.interval_s - time.perf_counter()
                await asyncio.sleep(max(delay, 0.0))

    def final(self) -> Callable[[], None]:
        """One last scrape after the replay (the counters' end values), run to completion."""

        def scrape() -> None:
            async def go() -> None:
                async with aiohttp.ClientSession() as session:
                    await self.scrape_once(session)

            asyncio.run(go())

        return scrape
