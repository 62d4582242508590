"""Checking a ``vllm bench serve`` result before kvbench keeps anything of it.

``checked_document`` reads every field kvbench stores or computes from, and refuses, in one line
naming the field (and for a per-request list, the request's index), any value that is not what
vLLM's ``benchmark()`` writes there:

- types: a count is an integer (a JSON ``true`` is not one; ``24.9`` is not a token count; an
  integral ``24.0`` is read as 24), a time or a statistic a number (a string is refused, never
  dropped), a name a string;
- range: no NaN or infinity (Python's ``json`` reads the tokens ``NaN`` and ``Infinity``), no
  negative time or count, counts within int64 (what the records hold), a prompt of at least one
  token, ``duration`` above 0;
- consistency: the per-request lists all one length, each ``itls`` entry a list, a completed
  request's latency at least its TTFT and at most the benchmark's duration (vLLM times both
  inside it), a failed request with no output, and throughputs over ``duration`` that are finite.

Whether the stated counts and statistics agree with the lists is ``vllm_bench``'s check,
made on the document this returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import KvbenchError

INT64_MAX = 2**63 - 1
COUNTS: tuple[str, ...] = ("completed", "failed", "total_input_tokens", "total_output_tokens")
OPTIONAL_COUNTS: tuple[str, ...] = ("num_prompts", "max_concurrent_requests", "max_concurrency")
OPTIONAL_NUMBERS: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "max_output_tokens_per_s",
    "rtfx",
)
NAMES: tuple[str, ...] = ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id")
# vLLM's statistic keys: mean_ttft_ms, median_itl_ms, std_e2el_ms, p99_tpot_ms, p99.9_ttft_ms.
STATISTIC = re.compile(r"(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms")
# A time inside the benchmark may exceed its duration by float rounding only.
ROUNDING = 1e-9


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any, where: str, least: int = 0) -> int:
    """A whole number from ``least`` to int64's largest; an integral float is read as one."""
    if not _is_number(value) or (isinstance(value, float) and not (math.isfinite(value) and value == int(value))):
        raise KvbenchError(f"{where} must be a whole number (a count), got {_show(value)}")
    n = int(value)
    if n < least:
        raise KvbenchError(f"{where} must be >= {least}, got {_show(value)}")
    if n > INT64_MAX:
        raise KvbenchError(f"{where} must be at most {INT64_MAX:,} (int64, what the records hold), got {_show(value)}")
    return n


def _number(value: Any, where: str) -> float:
    """A finite number >= 0 (a time in seconds, a statistic in ms, a rate)."""
    if not _is_number(value):
        raise KvbenchError(f"{where} must be a number, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:  # an integer beyond any float
        x = math.inf
    if not math.isfinite(x):
        raise KvbenchError(f"{where} must be a finite number, got {_show(value)}")
    if x < 0:
        raise KvbenchError(f"{where} must be >= 0, got {_show(value)}")
    return x


def _rate(value: Any, where: str) -> Any:
    """``request_rate``: a number > 0, or vLLM's "inf" (every request at once)."""
    if value is None or value == "inf":
        return value
    x = _number(value, where)
    if x == 0:
        raise KvbenchError(f'{where} must be > 0 or "inf", got {_show(value)}')
    return value


def checked_document(doc: Mapping[str, Any], name: str, detailed: bool) -> dict[str, Any]:
    """``doc`` with every field kvbench reads checked (module docstring) and its counts as ints;
    ``detailed``: it carries the per-request lists (``--save-detailed``)."""
    out = dict(doc)
    for key in COUNTS:
        out[key] = _count(doc[key], f"{name}: {key}")
    for key in OPTIONAL_COUNTS:
        if doc.get(key) is not None:
            out[key] = _count(doc[key], f"{name}: {key}")
    duration = _number(doc["duration"], f"{name}: duration (seconds)")
    if duration == 0:
        raise KvbenchError(f"{name}: duration (seconds) must be > 0, got {_show(doc['duration'])}")
    for what, amount in (
        ("request_throughput", out["completed"]),
        ("output_throughput", out["total_output_tokens"]),
        ("total_token_throughput", out["total_input_tokens"] + out["total_output_tokens"]),
    ):
        if not math.isfinite(amount / duration):
            raise KvbenchError(
                f"{name}: duration {_show(doc['duration'])} s makes {what} infinite ({amount:,} / duration)"
            )
    for key in OPTIONAL_NUMBERS:
        if doc.get(key) is not None:
            _number(doc[key], f"{name}: {key}")
    for key, value in doc.items():
        if STATISTIC.fullmatch(key) and value is not None:
            _number(value, f"{name}: {key}")
    for key in NAMES:
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise KvbenchError(f"{name}: {key} must be a string, got {_show(doc[key])}")
    _rate(doc.get("request_rate"), f"{name}: request_rate")
    if doc.get("burstiness") is not None and _number(doc["burstiness"], f"{name}: burstiness") == 0:
        raise KvbenchError(f"{name}: burstiness must be > 0, got {_show(doc['burstiness'])}")
    if detailed:
        out.update(_checked_requests(doc, name, duration))
    elif isinstance(doc.get("latencies"), list):  # a summary's latencies stand in for its e2el statistics
        out["latencies"] = [_number(v, _at(name, "latencies", i)) for i, v in enumerate(doc["latencies"])]
    return out


def _at(name: str, key: str, i: int) -> str:
    return f"{name}: {key}[{i}] (request {i})"


def _each(doc: Mapping[str, Any], key: str, name: str, check: Callable[[Any, str], Any]) -> list[Any]:
    """``check`` of every entry of the per-request list ``key`` (one per request: input_lens' length)."""
    values = doc[key]
    n = len(doc["input_lens"])
    if len(values) != n:
        raise KvbenchError(f"{name}: {key} holds {len(values)} entries, input_lens {n}: one per request in each list")
    return [check(v, _at(name, key, i)) for i, v in enumerate(values)]


def _prompt(value: Any, where: str) -> int:
    return _count(value, where, least=1)  # every request sends at least one token


def _error(value: Any, where: str) -> str:
    if value is not None and not isinstance(value, str):
        raise KvbenchError(f"{where} must be a string, got {_show(value)}")
    return value or ""


def _gaps(value: Any, where: str) -> list[float]:
    if not isinstance(value, list):
        raise KvbenchError(f"{where} must be a list of gaps in seconds, got {_show(value)}")
    return [_number(g, f"{where}[{j}]") for j, g in enumerate(value)]


def _checked_requests(doc: Mapping[str, Any], name: str, duration: float) -> dict[str, list[Any]]:
    """The per-request lists, each entry checked; ints where they hold counts."""
    lists = {
        "input_lens": _each(doc, "input_lens", name, _prompt),
        "output_lens": _each(doc, "output_lens", name, _count),
        "ttfts": _each(doc, "ttfts", name, _number),
        "latencies": _each(doc, "latencies", name, _number),
        "start_times": _each(doc, "start_times", name, _number),
    }
    errors = _each(doc, "errors", name, _error)
    itls = doc.get("itls")
    if itls is not None:
        if not isinstance(itls, list):
            raise KvbenchError(f"{name}: itls must be a list of per-request lists, got {_show(itls)}")
        lists["itls"] = _each(doc, "itls", name, _gaps)
    outputs, ttfts, latencies = lists["output_lens"], lists["ttfts"], lists["latencies"]
    for i, error in enumerate(errors):
        if error:
            if outputs[i] != 0:
                raise KvbenchError(f"{_at(name, 'output_lens', i)} is {outputs[i]} for a failed request; vLLM counts 0")
        elif latencies[i] < ttfts[i]:
            raise KvbenchError(
                f"{_at(name, 'latencies', i)} is {latencies[i]!r} s, shorter than its TTFT {ttfts[i]!r} s"
            )
        elif latencies[i] > duration * (1 + ROUNDING) + ROUNDING:
            raise KvbenchError(
                f"{_at(name, 'latencies', i)} is {latencies[i]!r} s, longer than the benchmark's duration "
                f"{duration!r} s"
            )
    return lists
