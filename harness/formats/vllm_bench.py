"""kvbench records ↔ the result JSON of ``vllm bench serve`` (``vllm/benchmarks/serve.py``).

Pure functions: a run row and its requests in, vLLM's result dict out (``to_vllm_bench``), and
vLLM's result dict in, a run row and requests columns out (``from_vllm_bench``). Field names,
units and arithmetic are vLLM's (``calculate_metrics`` and the dict ``benchmark()`` assembles):

- a request *completed* when it finished (vLLM: ``success``); the others count as ``failed``
  and, as vLLM records a failed request, carry ttft 0, latency 0, no ITLs, output length 0 and a
  non-empty ``errors`` entry;
- TTFT = first token − send; E2EL (``latencies``) = finish − send; TPOT per request =
  (E2EL − TTFT) ÷ (output length − 1) for output length > 1; ITL = every gap between successive
  entries of ``token_times_s``, pooled: one per streamed chunk, however many tokens it carried, as
  vLLM's client times it (the in-process runners' entries are single tokens); each summarised as
  mean, median, std (numpy, ddof 0) and percentiles (numpy's default, linear), in milliseconds; a
  metric with no values is 0, as numpy gives vLLM; ``max_output_tokens_per_s`` counts those
  entries per second, as vLLM counts its chunks;
- throughputs divide by ``duration``, the benchmark's duration: from the start of the arrival
  schedule to the last completion. kvbench's ``sim_time_s`` is that span on the run's clock
  (clock 0 is the schedule's start, the run ends with its last step), so it is the duration both ways.

What kvbench's records do not hold is null in the export and named in ``kvbench.notes``: where a
runner keeps no token times (sim), ``itls`` (per request) and ``max_output_tokens_per_s`` are null
and the ITL statistics come from the run's ``itl_*`` columns; kvbench sends token ids, not text
(``generated_texts``), and queues nothing on the client (``queue_times``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import KvbenchError
from ..records.percentiles import percentile
from ..records.schema import REQUESTS
from .vllm_bench_checks import checked_document

IMPORTED_RUNNER = "vllm-bench"  # the runner column of a run imported from `vllm bench serve`
FORMAT = "vllm-bench"
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
# The percentiles exported: those the runs table keeps (p50, p90, p95, p99), so that every one of
# them exists for every metric, ITL included.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
# The runs-table column prefix holding each vLLM metric's statistics.
RUN_PREFIX: dict[str, str] = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "latency"}
# vLLM's result fields with nothing in them but what kvbench's records hold (the setup
# fields of `vllm bench serve`'s main, ahead of the measured ones).
SETUP_FIELDS: tuple[str, ...] = (
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
)
REQUIRED_FIELDS: tuple[str, ...] = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens")
# The per-request lists `--save-detailed` keeps; all of them, or none, make a requests table. ``itls``
# may be null (kvbench's own export: its requests table keeps no per-token times).
DETAILED_LISTS: tuple[str, ...] = ("input_lens", "output_lens", "ttfts", "latencies", "start_times", "errors")
# Measured by vLLM, with no runs-table column: kept in the imported run's spec_json and written back.
CARRIED_FIELDS: tuple[str, ...] = ("request_goodput", "max_output_tokens_per_s", "rtfx")
# An imported summary (no per-request lists) has no requests table to count from.
SUMMARY_COUNTS: tuple[str, ...] = ("completed", "failed", "total_input_tokens")
CHECK_RTOL = 1e-6  # a result whose statistics disagree with its own lists by more is refused


@dataclass(frozen=True)
class Outcome:
    """One request as vLLM's ``RequestFuncOutput`` reports it (times in seconds)."""

    prompt_len: int
    output_len: int  # generated tokens (vLLM's actual output length; 0 for a failed request)
    start_s: float  # when it was sent
    ttft_s: float
    latency_s: float
    itl_s: tuple[float, ...] | None  # each gap between its tokens; None: not recorded
    error: str  # "" when it completed

    @property
    def success(self) -> bool:
        return not self.error


# -- vLLM's arithmetic -------------------------------------------------------------


def statistics(values: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """mean, median, std and each percentile of ``values`` in ms, as ``calculate_metrics`` does
    (``np.mean(values or 0)``: an empty list gives 0)."""
    arr: Any = list(values) or 0
    out = {
        "mean": float(np.mean(arr)) * 1000,
        "median": float(np.median(arr)) * 1000,
        "std": float(np.std(arr)) * 1000,
    }
    for p in percentiles:
        out[p_word(p)] = percentile(arr, p) * 1000
    return out


def p_word(p: float) -> str:
    """vLLM's key for a percentile: 'p99', 'p99.9'."""
    return "p" + (str(int(p)) if int(p) == p else str(p))


def per_request_values(outcomes: Sequence[Outcome]) -> dict[str, list[float]]:
    """TTFT, TPOT, ITL and E2EL values over the completed requests, as ``calculate_metrics`` pools them."""
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    for o in outcomes:
        if not o.success:
            continue
        if o.output_len > 1:
            values["tpot"].append((o.latency_s - o.ttft_s) / (o.output_len - 1))
        values["itl"] += list(o.itl_s or ())
        values["ttft"].append(o.ttft_s)
        values["e2el"].append(o.latency_s)
    return values


def max_concurrent_requests(outcomes: Sequence[Outcome]) -> int:
    """The most completed requests in flight in one second of the benchmark, as vLLM buckets them."""
    done = [o for o in outcomes if o.success]
    if not done:
        return 0
    start = min(o.start_s for o in done)
    end = max(o.start_s + o.latency_s for o in done)
    buckets = np.zeros(int(np.ceil(end - start)) + 1)
    for o in done:
        for second in range(int(o.start_s - start), int((o.start_s + o.latency_s) - start) + 1):
            buckets[second] += 1
    return int(np.max(buckets))


def max_output_tokens_per_s(outcomes: Sequence[Outcome]) -> float | None:
    """The most tokens generated in one second, as vLLM buckets them; None without every ITL list."""
    done = [o for o in outcomes if o.success]
    if not done:
        return 0.0
    if any(o.itl_s is None for o in done):
        return None
    start = min(o.start_s for o in done)
    end = max(o.start_s + o.latency_s for o in done)
    buckets = np.zeros(int(np.ceil(end - start)) + 1)
    for o in done:
        t = o.start_s + o.ttft_s
        times = [t]
        for gap in o.itl_s or ():
            t += gap
            times.append(t)
        for token_time in times:
            b = int(token_time - start)
            if 0 <= b < len(buckets):
                buckets[b] += 1
    return float(np.max(buckets))


def totals(outcomes: Sequence[Outcome], duration: float) -> dict[str, Any]:
    """The counts and throughputs of ``calculate_metrics``."""
    done = [o for o in outcomes if o.success]
    total_input = sum(o.prompt_len for o in done)
    total_output = sum(o.output_len for o in done)
    return {
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        **throughputs(len(done), total_input, total_output, duration),
    }


def throughputs(completed: int, total_input: int, total_output: int, duration: float) -> dict[str, float]:
    return {
        "request_throughput": completed / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
    }


def metric_fields(metric: str, stats: Mapping[str, float | None]) -> dict[str, float | None]:
    """``mean_ttft_ms``, ``median_ttft_ms``, ``std_ttft_ms``, ``p99_ttft_ms`` … from ``statistics``.
    A metric with no statistics at all is written null; otherwise a percentile not recorded (an
    imported result that had only some) is left out, as vLLM leaves out those it was not asked for."""
    if all(v is None for v in stats.values()):
        return {f"{stat}_{metric}_ms": None for stat in stats}
    return {f"{stat}_{metric}_ms": value for stat, value in stats.items() if value is not None}


# -- kvbench records → vLLM ------------------------------------------------------------


def outcomes_from_requests(requests: pd.DataFrame) -> list[Outcome]:
    """The requests table as vLLM's request outputs, in sending order (each sample is a request).
    A request starts when it was sent: ``sent_s`` where a client recorded it (``serve``, as vLLM's
    client times from its own send), else its arrival (the in-process runners hand a request over
    at its arrival). Token gaps come from ``token_times_s`` where the runner recorded each token's
    time; ``itl_s`` is None where it did not."""
    rows = requests.sort_values(["arrival_s", "request_id", "sample"], kind="stable").to_dict("records")
    out = []
    for r in rows:
        finished = r.get("status") == "finished" and _num(r.get("first_token_s")) and _num(r.get("finished_s"))
        sent = r.get("sent_s")
        arrival = float(sent) if _num(sent) else float(r["arrival_s"])
        if finished:
            out.append(
                Outcome(
                    int(r["prompt_len"]),
                    int(r["output_len"]),
                    arrival,
                    float(r["first_token_s"]) - arrival,
                    float(r["finished_s"]) - arrival,
                    _gaps(r.get("token_times_s")),
                    "",
                )
            )
        else:
            out.append(
                Outcome(int(r["prompt_len"]), 0, arrival, 0.0, 0.0, None, f"did not finish (status {r.get('status')})")
            )
    return out


def _token_times(first: float, gaps: Sequence[float]) -> list[float]:
    """Each token's time from the first token's and the gaps after it (``_gaps``' inverse)."""
    times = [first]
    for g in gaps:
        times.append(times[-1] + g)
    return times


def _gaps(times: Any) -> tuple[float, ...] | None:
    """The gaps between successive token times (None: the times were not recorded)."""
    if times is None or (isinstance(times, float) and math.isnan(times)):
        return None
    t = [float(x) for x in times]
    return tuple(b - a for a, b in zip(t, t[1:]))


def _num(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _value(v: Any) -> Any:
    """A record's value as JSON holds it: None for a null or NaN, Python numbers for numpy ones."""
    if not _num(v):
        return None
    return v.item() if hasattr(v, "item") else v


def _run_stats(run: Mapping[str, Any], metric: str) -> dict[str, float | None]:
    """A metric's statistics from the runs table's columns (seconds → ms); None where null."""
    prefix = RUN_PREFIX[metric]
    cols = {"mean": "mean", "median": "p50", "std": "std", **{p_word(p): p_word(p) for p in PERCENTILES}}
    out: dict[str, float | None] = {}
    for key, stat in cols.items():
        v = _value(run.get(f"{prefix}_{stat}_s"))
        out[key] = None if v is None else float(v) * 1000
    return out


def imported_block(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``imported`` block of a run's spec_json (a run made by ``kvbench import``), or None."""
    try:
        spec = json.loads(run.get("spec_json") or "{}")
    except (TypeError, ValueError):
        return None
    block = spec.get("imported") if isinstance(spec, dict) else None
    return block if isinstance(block, dict) else None


def to_vllm_bench(run: Mapping[str, Any], requests: pd.DataFrame) -> dict[str, Any]:
    """A run as the result JSON ``vllm bench serve --save-result --save-detailed`` writes.

    ``run``: one row of the runs table (``run_id`` included); ``requests``: its requests. An ``ok``
    run on a clock of seconds only: the caller refuses the others."""
    duration = _value(run.get("sim_time_s"))
    if duration is None or not duration > 0:
        raise KvbenchError(f"run {run.get('run_id')}: no duration (sim_time_s is {duration}); cannot export it")
    imported = imported_block(run)
    notes: list[str] = []
    have_requests = len(requests) > 0
    outcomes = outcomes_from_requests(requests) if have_requests else []
    result: dict[str, Any] = setup_fields(run, imported)
    result["duration"] = float(duration)
    if have_requests:
        result.update(totals(outcomes, float(duration)))
    else:
        counts = dict((imported or {}).get("summary_counts") or {})
        if not all(k in counts for k in SUMMARY_COUNTS):
            raise KvbenchError(f"run {run.get('run_id')}: no requests recorded; nothing to export")
        out_tokens = int(_value(run.get("generated_tokens")) or 0)
        result.update({k: counts[k] for k in ("completed", "failed", "total_input_tokens")})
        result["total_output_tokens"] = out_tokens
        result.update(throughputs(int(counts["completed"]), int(counts["total_input_tokens"]), out_tokens, duration))
        notes.append(
            "the run was imported without per-request lists: completed, failed and total_input_tokens "
            "are the imported result's, the statistics come from the runs table, and its latencies and "
            "queue_times lists (without send times) were not kept"
        )
    carried = dict((imported or {}).get("carried") or {})
    result["request_goodput"] = carried.get("request_goodput")
    if imported is None:
        notes.append("request_goodput: null, as vLLM writes it without --goodput (kvbench's goodput is in its report)")
    timed = have_requests and all(o.itl_s is not None for o in outcomes if o.success)
    if have_requests:
        done = [o for o in outcomes if o.success]
        result.update(
            {
                "input_lens": [o.prompt_len for o in outcomes],
                "output_lens": [o.output_len if o.success else 0 for o in outcomes],
                "ttfts": [o.ttft_s for o in outcomes],
                "itls": [list(o.itl_s or ()) for o in outcomes] if timed else None,
                "latencies": [o.latency_s for o in outcomes],
                "start_times": [o.start_s for o in outcomes],
                "queue_times": None,
                "generated_texts": None,
                "errors": [o.error for o in outcomes],
            }
        )
        result["max_concurrent_requests"] = max_concurrent_requests(done)
        origin = "the first request's send" if imported is not None else "the start of the arrival schedule"
        notes += [
            f"start_times: seconds on the run's clock (0 = {origin}), not time.perf_counter() readings",
            "queue_times: null, since kvbench sends each request at its arrival and queues none on the client",
            "generated_texts: null, since kvbench sends and receives token ids, not text",
        ]
    else:
        result["max_concurrent_requests"] = carried.get("max_concurrent_requests")
    if have_requests and not timed:
        notes.append(
            "itls: null per request, since the runner recorded no per-token times (token_times_s); the ITL "
            "statistics are the run's itl_* columns where it has them"
        )
    result["max_output_tokens_per_s"] = carried.get("max_output_tokens_per_s")
    if "max_output_tokens_per_s" not in carried:
        if timed:
            result["max_output_tokens_per_s"] = max_output_tokens_per_s(outcomes)
        else:
            notes.append("max_output_tokens_per_s: null, since it needs each token's time")
    result["rtfx"] = carried.get("rtfx", 0.0)  # input audio seconds per second: kvbench sends no audio
    values = per_request_values(outcomes) if have_requests else None
    for metric in METRICS:
        if values is not None and metric != "itl":
            stats: Mapping[str, float | None] = statistics(values[metric])
        else:
            stats = _run_stats(run, metric)
            if all(v is None for v in stats.values()):
                notes.append(f"{metric}: null, since the run recorded no {metric} statistics")
        result.update(metric_fields(metric, stats))
    clock = run.get("clock")
    if clock not in ("measured", None):
        notes.append(f"every time is simulated, in seconds of the run's {clock} clock, not measured")
    result["kvbench"] = {
        "run_id": _value(run.get("run_id")),
        "runner": _value(run.get("runner")),
        "policy": _value(run.get("policy")),
        "block_size": _value(run.get("block_size")),
        "clock": _value(run.get("clock")),
        "notes": notes,
    }
    return result


def setup_fields(run: Mapping[str, Any], imported: Mapping[str, Any] | None) -> dict[str, Any]:
    """The setup fields ``vllm bench serve`` writes first: an imported run's as it had them, a
    kvbench run's from its row."""
    if imported is not None and isinstance(imported.get("setup"), dict):
        return {k: imported["setup"].get(k) for k in SETUP_FIELDS}
    started = run.get("started_at")
    date = started.strftime("%Y%m%d-%H%M%S") if isinstance(started, (_dt.datetime, pd.Timestamp)) else None
    arrival, rate = run.get("arrival"), _value(run.get("rate"))
    request_rate: Any = "inf" if arrival == "batch" else rate  # vLLM's "inf": every request at once
    bs = _value(run.get("block_size"))
    return {
        "date": date,
        "endpoint_type": "kvbench",  # what sent the requests: kvbench's runner, not an HTTP backend of vLLM's
        "backend": "kvbench",
        "label": f"kvbench {run.get('runner')}/{run.get('policy')}" + (f" b{bs}" if bs else ""),
        "model_id": _value(run.get("model")),
        "tokenizer_id": None,
        "num_prompts": _value(run.get("num_requests")),
        "request_rate": request_rate,
        "burstiness": 1.0 if arrival == "poisson" else None,  # vLLM's gamma shape; 1 is Poisson
        "max_concurrency": None,  # open loop: kvbench sends each request at its arrival
    }


# -- vLLM → kvbench records ------------------------------------------------------------


@dataclass(frozen=True)
class Imported:
    """A ``vllm bench serve`` result as kvbench records: the run row's measured columns, the
    requests columns (empty without per-request lists), and what the run's spec_json keeps."""

    row: dict[str, Any]
    requests: dict[str, list]
    block: dict[str, Any]  # spec_json's "imported": setup, carried fields, source


def read_document(text: str, name: str) -> dict[str, Any]:
    """Parse and check a result JSON; a one-line KvbenchError naming what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise KvbenchError(f"{name}: not JSON ({exc})") from None
    if isinstance(doc, list) and doc and all(isinstance(r, dict) and "metric" in r for r in doc):
        raise KvbenchError(
            f"{name}: a PyTorch benchmark database file (.pytorch.json), not the result JSON of `vllm bench serve`"
        )
    if not isinstance(doc, dict):
        raise KvbenchError(f"{name}: not a `vllm bench serve` result (a JSON {type(doc).__name__}, not an object)")
    missing = [k for k in REQUIRED_FIELDS if k not in doc]
    if missing:
        raise KvbenchError(f"{name}: not a `vllm bench serve` result: no {', '.join(missing)}")
    present = [k for k in DETAILED_LISTS if isinstance(doc.get(k), list)]
    if present and len(present) != len(DETAILED_LISTS) and "input_lens" in present:
        lacking = [k for k in DETAILED_LISTS if k not in present]
        raise KvbenchError(f"{name}: has per-request lists but not {', '.join(lacking)}")
    return checked_document(doc, name, has_requests(doc))


def has_requests(doc: Mapping[str, Any]) -> bool:
    return all(isinstance(doc.get(k), list) for k in DETAILED_LISTS)


def outcomes_from_document(doc: Mapping[str, Any]) -> list[Outcome]:
    """A checked document's requests (``read_document``: every entry is of its type and range)."""
    itls = doc.get("itls")
    return [
        Outcome(
            doc["input_lens"][i],
            doc["output_lens"][i],
            doc["start_times"][i],
            doc["ttfts"][i],
            doc["latencies"][i],
            None if itls is None else tuple(float(g) for g in itls[i]),
            str(doc["errors"][i] or ""),
        )
        for i in range(len(doc["input_lens"]))
    ]


def _check(name: str, field: str, stated: Any, computed: float) -> None:
    """Refuse a result whose stated number disagrees with the one its own lists give."""
    if stated is None:
        return
    if not isinstance(stated, (int, float)) or not math.isclose(
        float(stated), computed, rel_tol=CHECK_RTOL, abs_tol=1e-9
    ):
        raise KvbenchError(f"{name}: {field} is {stated}, but its per-request lists give {computed:.9g}")


def from_vllm_bench(doc: Mapping[str, Any], name: str, digest: str) -> Imported:
    """A checked result JSON (``read_document``) as kvbench records. The requests' times are
    seconds since the first request was sent (the result does not say when its schedule started)."""
    duration = float(doc["duration"])
    row: dict[str, Any] = {"wall_s": duration, "sim_time_s": duration}
    requests: dict[str, list] = {c: [] for c in REQUESTS.names}
    stats: dict[str, Mapping[str, float | None]] = {}
    block: dict[str, Any] = {
        "format": FORMAT,
        "file": name,
        "sha256": digest,
        "setup": {k: doc.get(k) for k in SETUP_FIELDS},
        "carried": {k: doc[k] for k in CARRIED_FIELDS if k in doc},
    }
    if has_requests(doc):
        outcomes = outcomes_from_document(doc)
        counted = totals(outcomes, duration)
        for k in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
            if counted[k] != doc[k]:
                raise KvbenchError(f"{name}: {k} is {doc[k]}, but its per-request lists give {counted[k]}")
        values = per_request_values(outcomes)
        for metric in METRICS:
            if metric == "itl" and doc.get("itls") is None:
                stats["itl"] = stated_statistics(doc, "itl")  # no gaps to compute them from: as stated
                continue
            computed = statistics(values[metric])
            for stat, v in computed.items():
                _check(name, f"{stat}_{metric}_ms", doc.get(f"{stat}_{metric}_ms"), v)
            stats[metric] = dict(computed)
        _check(name, "max_concurrent_requests", doc.get("max_concurrent_requests"), max_concurrent_requests(outcomes))
        peak = max_output_tokens_per_s(outcomes)
        if peak is not None:
            _check(name, "max_output_tokens_per_s", doc.get("max_output_tokens_per_s"), peak)
        origin = min((o.start_s for o in outcomes), default=0.0)
        for i, o in enumerate(outcomes):
            arrival = o.start_s - origin
            _append_request(requests, i, o, arrival)
        done = [o for o in outcomes if o.success]
        normalized = [o.latency_s / o.output_len for o in done if o.output_len > 0]
        row.update(_seconds("normalized_latency", statistics(normalized) if normalized else None))
    else:
        block["summary_counts"] = {k: doc[k] for k in SUMMARY_COUNTS}
        if "max_concurrent_requests" in doc:  # computed from per-request times this result no longer has
            block["carried"]["max_concurrent_requests"] = doc["max_concurrent_requests"]
        for metric in METRICS:
            stats[metric] = stated_statistics(doc, metric)
        latencies = doc.get("latencies")
        if not stats["e2el"] and isinstance(latencies, list) and doc["failed"] == 0 and latencies:
            stats["e2el"] = statistics([float(v) for v in latencies])  # every request completed: all valid
    for metric in METRICS:
        row.update(_seconds(RUN_PREFIX[metric], stats.get(metric) or None))
    completed = int(doc["completed"])
    row.update(
        {
            "num_requests": completed + int(doc["failed"]),
            "generated_tokens": int(doc["total_output_tokens"]),
            "tokens_per_s": int(doc["total_output_tokens"]) / duration,
            "status": "ok" if completed > 0 else "failed",
            "error": None if completed > 0 else "every request failed",
        }
    )
    return Imported(row, requests, block)


def stated_statistics(doc: Mapping[str, Any], metric: str) -> dict[str, float]:
    """A metric's statistics as the result states them (ms), those it has."""
    return {
        stat: float(doc[f"{stat}_{metric}_ms"])
        for stat in ("mean", "median", "std", *(p_word(p) for p in PERCENTILES))
        if isinstance(doc.get(f"{stat}_{metric}_ms"), (int, float)) and not isinstance(doc[f"{stat}_{metric}_ms"], bool)
    }


def _append_request(cols: dict[str, list], index: int, o: Outcome, arrival: float) -> None:
    values: dict[str, Any] = {c: None for c in REQUESTS.names}
    values.update(
        request_id=index,
        sample=0,
        prompt_len=o.prompt_len,
        output_len=o.output_len,
        arrival_s=arrival,
        first_token_s=arrival + o.ttft_s if o.success else None,
        finished_s=arrival + o.latency_s if o.success else None,
        status="finished" if o.success else "failed",
        sent_s=arrival,  # vLLM's start time is its send
        token_times_s=_token_times(arrival + o.ttft_s, o.itl_s) if o.success and o.itl_s is not None else None,
    )
    for c in REQUESTS.names:
        cols[c].append(values[c])


def _seconds(prefix: str, stats: Mapping[str, float | None] | None) -> dict[str, float | None]:
    """A metric's statistics in ms as the runs table's columns in seconds (median is p50)."""
    names = {"mean": "mean", "median": "p50", "std": "std", **{p_word(p): p_word(p) for p in PERCENTILES}}
    out: dict[str, float | None] = {}
    for stat, col in names.items():
        v = None if stats is None else stats.get(stat)
        if v is not None or f"{prefix}_{col}_s" not in out:  # a stated median is the p50
            out[f"{prefix}_{col}_s"] = None if v is None else v / 1000
    return out


def file_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
