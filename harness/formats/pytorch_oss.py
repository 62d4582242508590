"""A ``vllm bench serve`` result as PyTorch OSS benchmark database records.

The layout is vLLM's (``save_to_pytorch_benchmark_format`` in ``vllm/benchmarks/serve.py`` and
``convert_to_pytorch_benchmark_format`` in ``vllm/benchmarks/lib/utils.py``): one record per
metric, ``{"benchmark": {"name", "extra_info": {"args", "compilation_config.mode",
"optimization_level", "use_compile"}}, "model": {"name"}, "metric": {"name",
"benchmark_values": [value], "extra_info": the other result fields}}``, for the twelve TTFT,
TPOT and ITL statistics vLLM selects, leaving out the per-request lists vLLM leaves out.

``args`` is vLLM's command line there; a kvbench run has none, so it holds the run's settings
(``settings_of``). The two fields vLLM reads from its arguments are taken by vLLM's own rule:
``compilation_config.mode`` is "" (not given), so ``use_compile`` is true, as vLLM writes it
for a command line that does not set the mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BENCHMARK_NAME = "vLLM benchmark"
# save_to_pytorch_benchmark_format's metrics, in its order, and the fields it leaves out.
METRICS: tuple[str, ...] = (
    "median_ttft_ms",
    "mean_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "mean_itl_ms",
    "std_itl_ms",
    "p99_itl_ms",
)
IGNORED: tuple[str, ...] = ("ttfts", "itls", "generated_texts", "errors")


def settings_of(run: Mapping[str, Any]) -> dict[str, Any]:
    """What stands for vLLM's command line in ``benchmark.extra_info.args``: the run's cell."""
    keys = (
        "model",
        "runner",
        "policy",
        "block_size",
        "kv_dtype",
        "budget_bytes",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "clock",
        "device",
        "num_requests",
        "arrival",
        "rate",
    )
    out = {k: _plain(run.get(k)) for k in keys}
    out["run_id"] = run.get("run_id")
    return out


def _plain(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v.item() if hasattr(v, "item") else v


def use_compile(args: Mapping[str, Any], extra_info: Mapping[str, Any]) -> bool:
    """vLLM's ``use_compile``: not when the compilation mode is "0" or a result name says eager."""
    mode = extra_info.get("compilation_config.mode", "")
    return not (
        mode == "0"
        or "eager" in str(args.get("output_json") or "")
        or "eager" in str(args.get("result_filename") or "")
    )


def to_pytorch_oss(result: Mapping[str, Any], args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per selected metric present in ``result`` (a ``vllm bench serve`` result dict)."""
    extra_info = {k: v for k, v in result.items() if k not in METRICS and k not in IGNORED}
    records = []
    for name in METRICS:
        if name not in result:
            continue
        record: dict[str, Any] = {
            "benchmark": {
                "name": BENCHMARK_NAME,
                "extra_info": {
                    "args": dict(args),
                    "compilation_config.mode": extra_info.get("compilation_config.mode", ""),
                    "optimization_level": extra_info.get("optimization_level", ""),
                    "use_compile": use_compile(args, extra_info),
                },
            },
            "model": {"name": args.get("model")},
            "metric": {"name": name, "benchmark_values": [result[name]], "extra_info": extra_info},
        }
        tp = record["benchmark"]["extra_info"]["args"].get("tensor_parallel_size")
        if not tp and "tensor_parallel_size" in extra_info:  # as vLLM: keep TP where the args lack it
            record["benchmark"]["extra_info"]["args"]["tensor_parallel_size"] = extra_info["tensor_parallel_size"]
        records.append(record)
    return records
