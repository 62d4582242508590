"""Service-level objectives as others state them, by name: ``[slo] preset = "NAME"``.

Each preset is a set of per-request latency bounds with the percentile its source reads them
at and the method it takes that percentile by (MLPerf's: ``harness.records.percentiles``); its
``source`` says where the numbers come from.
"""

from __future__ import annotations

import dataclasses

from .bounds import Bound


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    bounds: tuple[Bound, ...]
    source: str


def _mlperf(ttft_s: float, tpot_s: float) -> tuple[Bound, ...]:
    """MLPerf's LLM Server bounds: TTFT and TPOT at the 99th percentile
    (``*.Server.target_latency_percentile = 99`` in mlperf.conf), by LoadGen's percentile."""
    return (Bound("ttft", "p99", ttft_s, "mlperf"), Bound("tpot", "p99", tpot_s, "mlperf"))


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # MLPerf Inference (datacenter), Server scenario, from MLCommons mlcommons/inference
        # loadgen/mlperf.conf: <model>.Server.ttft_latency and tpot_latency, in ms.
        # llama2-70b.Server: ttft_latency = 2000, tpot_latency = 200.
        Preset(
            "mlperf-llama2-70b-server",
            _mlperf(2.0, 0.2),
            "MLPerf Inference rules, Llama-2-70B Server: TTFT p99 2,000 ms, TPOT p99 200 ms",
        ),
        # llama2-70b-interactive.Server: ttft_latency = 450, tpot_latency = 40.
        Preset(
            "mlperf-llama2-70b-interactive",
            _mlperf(0.45, 0.04),
            "MLPerf Inference rules, Llama-2-70B Interactive: TTFT p99 450 ms, TPOT p99 40 ms",
        ),
        # llama3_1-8b.Server: ttft_latency = 2000, tpot_latency = 100.
        Preset(
            "mlperf-llama3.1-8b-server",
            _mlperf(2.0, 0.1),
            "MLPerf Inference rules, Llama-3.1-8B Server: TTFT p99 2,000 ms, TPOT p99 100 ms",
        ),
        # llama3_1-8b-interactive.Server: ttft_latency = 500, tpot_latency = 30.
        Preset(
            "mlperf-llama3.1-8b-interactive",
            _mlperf(0.5, 0.03),
            "MLPerf Inference rules, Llama-3.1-8B Interactive: TTFT p99 500 ms, TPOT p99 30 ms",
        ),
        # llama3_1-405b.Server: ttft_latency = 6000, tpot_latency = 175.
        Preset(
            "mlperf-llama3.1-405b-server",
            _mlperf(6.0, 0.175),
            "MLPerf Inference rules, Llama-3.1-405B Server: TTFT p99 6,000 ms, TPOT p99 175 ms",
        ),
        # The PagedAttention paper (Kwon et al., SOSP 2023, §6.2, Figure 12) reads each system's
        # sustainable rate where its mean normalized latency (end-to-end latency ÷ output tokens)
        # explodes, without stating a number; 0.5 s per output token is the level
        # suites/paper-serving-curves.toml reads it at: far above every system's unloaded
        # ~0.04 s, below an exploding queue.
        Preset(
            "vllm-paper-normalized-latency",
            (Bound("normalized", "mean", 0.5),),
            "Kwon et al. 2023 (PagedAttention), §6.2 Fig. 12: mean normalized latency, read at 0.5 s/token",
        ),
    )
}
