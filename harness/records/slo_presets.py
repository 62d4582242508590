"""Service-level objectives as others state them, by name: ``[slo] preset = "NAME"``.

Each preset is a set of per-request latency bounds with the percentile its source reads them
at; its ``source`` says where the numbers come from.
"""

from __future__ import annotations

import dataclasses

from .bounds import Bound


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    bounds: tuple[Bound, ...]
    source: str


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # MLPerf Inference (datacenter), Llama-2-70B, Server scenario: TTFT 2,000 ms and TPOT 200 ms at
        # the 99th percentile (MLCommons loadgen mlperf.conf: llama2-70b.Server.ttft_latency = 2000,
        # tpot_latency = 200; *.Server.target_latency_percentile = 99).
        Preset(
            "mlperf-llama2-70b-server",
            (Bound("ttft", "p99", 2.0), Bound("tpot", "p99", 0.2)),
            "MLPerf Inference rules, Llama-2-70B Server: TTFT p99 2,000 ms, TPOT p99 200 ms",
        ),
        # MLPerf Inference, Llama-2-70B Interactive: TTFT 450 ms, TPOT 40 ms at p99 (loadgen mlperf.conf:
        # llama2-70b-interactive.Server.ttft_latency = 450, tpot_latency = 40).
        Preset(
            "mlperf-llama2-70b-interactive",
            (Bound("ttft", "p99", 0.45), Bound("tpot", "p99", 0.04)),
            "MLPerf Inference rules, Llama-2-70B Interactive: TTFT p99 450 ms, TPOT p99 40 ms",
        ),
        # MLPerf Inference, Llama-3.1-8B, Server scenario: TTFT 2,000 ms, TPOT 100 ms at p99 (loadgen
        # mlperf.conf: llama3_1-8b.Server.ttft_latency = 2000, tpot_latency = 100).
        Preset(
            "mlperf-llama3.1-8b-server",
            (Bound("ttft", "p99", 2.0), Bound("tpot", "p99", 0.1)),
            "MLPerf Inference rules, Llama-3.1-8B Server: TTFT p99 2,000 ms, TPOT p99 100 ms",
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
