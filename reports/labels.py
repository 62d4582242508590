"""The keys and labels every report shares: the group and cell keys of ``harness.spec.identity``,
the columns derived from ``spec_json`` (``with_keys``), and how workloads, cells, clocks and code
versions are named. Pure functions of run rows and DataFrames."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from ..harness.records.reference import PAPER_SPLIT
from ..harness.spec import identity
from ..harness.spec.units import format_bytes

# What a comparison holds fixed, and what varies inside it: harness.spec.identity says it once
# for run ids, compare, the report and diverge. Runs that share the group keys may be put
# side by side; runs that also share the cell keys are repetitions of one cell.
GROUP_KEYS: tuple[str, ...] = identity.WORK_COLUMNS
CELL_KEYS: tuple[str, ...] = identity.CELL_COLUMNS


# -- keys ------------------------------------------------------------------------


def parse_spec(spec_json: Any) -> dict[str, Any]:
    if not isinstance(spec_json, str) or not spec_json:
        return {}
    try:
        spec = json.loads(spec_json)
    except ValueError:
        return {}
    return spec if isinstance(spec, dict) else {}


def scheduler_key(row: Mapping[str, Any]) -> str:
    """Canonical JSON of the scheduler identity (``harness.spec.identity.scheduler_identity``): the
    settings from ``spec_json`` (the run columns as a fallback), a profile clock identified by
    the content of the profile the run recorded, never by the file's path."""
    sched = parse_spec(row.get("spec_json")).get("scheduler")
    if not isinstance(sched, dict):
        sched = {k: _plain(row.get(k)) for k in ("max_num_seqs", "max_num_batched_tokens", "clock")}
    document = row.get("clock_profile")
    if isinstance(document, str) and document:
        profile = {"clock_profile_content": identity.content_digest(document)}
    else:  # not recorded: the path is all there is to tell profiles apart
        profile = {"clock_profile_path": str(sched.get("clock_profile"))}
    return identity.canonical_json(identity.scheduler_identity(sched, profile))


def page_bytes_key(row: Mapping[str, Any]) -> int | None:
    """The page size of a ``virtual-contiguous`` run (from ``spec_json``); None for the other policies."""
    if not identity.applies("page_bytes", str(row.get("runner")), str(row.get("policy"))):
        return None
    value = parse_spec(row.get("spec_json")).get("page_bytes")
    return int(value) if isinstance(value, (int, float)) and value == value else None


def work_differences(a: Mapping[str, Any], b: Mapping[str, Any], extra: tuple[str, ...] = ()) -> list[str]:
    """'column a vs b' for each work key (and each of ``extra``) on which two rows of
    ``with_keys`` differ; the scheduler by the settings that differ."""
    out = []
    for col in (*identity.WORK_COLUMNS, *extra):
        va, vb = a.get(col), b.get(col)
        if col == "scheduler":
            sa, sb = scheduler_settings(va), scheduler_settings(vb)
            out += [f"{k} {sa.get(k)} vs {sb.get(k)}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
        elif str(_plain(va)) != str(_plain(vb)):
            out.append(f"{col} {va} vs {vb}")
    return out


def scheduler_settings(scheduler: Any) -> dict[str, Any]:
    """The ``scheduler`` key's settings (canonical JSON) as a dict; {} when it is not one."""
    try:
        value = json.loads(scheduler) if isinstance(scheduler, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def workload_family(row: Mapping[str, Any]) -> str:
    """The workload's spec without its arrival rate: runs of one rate sweep share it."""
    wl = parse_spec(row.get("spec_json")).get("workload")
    if not isinstance(wl, dict):
        return f"{row.get('workload_source')}/{row.get('arrival')}"
    return json.dumps({k: v for k, v in wl.items() if k != "rate"}, sort_keys=True)


def with_keys(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs plus the derived columns reports group by: ``scheduler``, ``page_bytes``, ``arena``, the CPU
    tier's ``cpu_offload_bytes`` and ``offload_policy`` (as identity sees them), ``family`` (the
    workload spec without its rate), and the labels ``workload`` and ``family_label``."""
    runs = runs.copy()
    rows = runs.to_dict("records")
    runs["scheduler"] = [scheduler_key(r) for r in rows]
    # object dtype: ints and None as they are (a float column would spell 2097152 as 2097152.0)
    runs["page_bytes"] = pd.Series([page_bytes_key(r) for r in rows], index=runs.index, dtype=object)
    for col in ("device", "code_digest"):  # frames from before these columns: the keys still exist
        if col not in runs:
            runs[col] = None
    # The arena as identity sees it: "buddy" for a buddy-placed contiguous run, None for first-fit
    # (the default, and what rows from before the column mean) and for the other policies.
    runs["arena"] = pd.Series(
        [identity.key_value("arena", str(r.get("runner")), str(r.get("policy")), r.get("arena")) for r in rows],
        index=runs.index,
        dtype=object,
    )
    # The CPU tier as identity sees it: its bytes and eviction policy where the run had one, None
    # where it had none (0 bytes, and what rows from before the columns mean).
    for col in ("cpu_offload_bytes", "offload_policy"):
        runs[col] = pd.Series([cpu_tier_key(r, col) for r in rows], index=runs.index, dtype=object)
    runs["family"] = [workload_family(r) for r in rows]
    runs["workload"] = [workload_label(r) for r in rows]
    runs["family_label"] = [workload_label(r, rate=False) for r in rows]
    for col, values in paper_split(runs).items():
        runs[col] = values
    return runs


def tier_bytes(value: Any) -> int:
    """A run's ``cpu_offload_bytes`` as an int: 0 without a CPU tier (0, null, or a row from
    before the column)."""
    tier = _plain(value)
    return 0 if tier is None or bool(pd.isna(tier)) or not tier else int(tier)


def cpu_tier_key(row: Mapping[str, Any], column: str) -> Any:
    """A run's CPU tier ``column`` (``cpu_offload_bytes`` or ``offload_policy``) as identity sees
    it: None without a tier (``tier_bytes`` 0), the bytes as an int."""
    tier = tier_bytes(row.get("cpu_offload_bytes"))
    if not tier:
        return None
    if column == "cpu_offload_bytes":
        return tier
    value = _plain(row.get(column))
    return None if value is None or bool(pd.isna(value)) else value


def paper_split(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """The columns of ``harness.records.reference.PAPER_SPLIT`` for ``runs`` (none when the fractions
    are not there)."""
    if "internal_frag_frac" not in runs or "external_frag_frac" not in runs:
        return {}
    rounding = pd.to_numeric(runs["rounding_frac"], errors="coerce").fillna(0.0) if "rounding_frac" in runs else 0.0
    return {
        name: pd.to_numeric(runs[base], errors="coerce") + sign * rounding for name, (base, sign) in PAPER_SPLIT.items()
    }


def _plain(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


# -- which code -------------------------------------------------------------------

UNRECORDED_CODE = "not recorded"  # rows written before kvbench recorded code_digest


def code_versions(digests: Iterable[Any]) -> dict[str, int]:
    """Runs per ``code_digest`` (most runs first; ``UNRECORDED_CODE`` for rows without one)."""
    counts: dict[str, int] = {}
    for d in digests:
        key = str(d) if isinstance(d, str) and d else UNRECORDED_CODE
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def describe_versions(counts: Mapping[str, int]) -> str:
    """'3c4abd0c8771: 6 runs, not recorded: 1 run'."""
    return ", ".join(f"{d}: {n} run{'s' if n != 1 else ''}" for d, n in counts.items())


def code_note(digests: Iterable[Any]) -> str | None:
    """One sentence when runs come from more than one version of kvbench's code, naming how
    many runs each holds; None when one version (or none recorded) made them all."""
    counts = code_versions(digests)
    if len(counts) <= 1:
        return None
    return (
        f"these runs come from {len(counts)} versions of kvbench's code ({describe_versions(counts)}); "
        "numbers set side by side may differ because the code did (`kvbench run` re-runs such cells "
        "unless --keep-stale)"
    )


# -- labels ----------------------------------------------------------------------


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


def workload_tag(row: Mapping[str, Any]) -> str:
    """A workload as the suite names it, with the start of its content id: 'sharegpt (14df3e48)';
    the id alone for a suite's one unnamed [workload] (or records without names)."""
    wid = str(row.get("workload_id") or "")[:8]
    name = row.get("workload_name")
    return f"{name} ({wid})" if isinstance(name, str) and name else wid


def workload_label(row: Mapping[str, Any], rate: bool = True) -> str:
    """'uniform prompt 16–400 / output 16–400, 120 req, poisson 4 req/s [d660dae1]';
    without ``rate``, the rate and the id are left out (a rate sweep's common part)."""
    wl = parse_spec(row.get("spec_json")).get("workload") or {}
    source = wl.get("source", row.get("workload_source")) or "?"
    if source == "fixed":
        lengths = f"prompt {wl.get('prompt_len')} / output {wl.get('output_len')}"
    elif source == "uniform":
        lengths = (
            f"prompt {wl.get('prompt_min')}–{wl.get('prompt_max')} / "
            f"output {wl.get('output_min')}–{wl.get('output_max')}"
        )
    elif source == "lognormal":
        lengths = f"mean prompt {_num(wl.get('prompt_mean'))} / output {_num(wl.get('output_mean'))}"
    else:
        lengths = ""
    arrival = wl.get("arrival", row.get("arrival")) or "?"
    value = wl.get("rate", row.get("rate"))
    if rate and isinstance(value, (int, float)) and value == value:
        arrival = f"{arrival} {value:g} req/s"
    n = row.get("num_requests")
    span = wl.get("duration_s")
    if isinstance(span, (int, float)) and not isinstance(span, bool) and (not rate or not isinstance(n, (int, float))):
        count = f"{span:g} s of arrivals"  # a rate sweep's common part: the span, not the rate-dependent count
    else:
        count = f"{int(n)} req" if isinstance(n, (int, float)) and n == n else ""
    parts = [source + (f" {lengths}" if lengths else ""), count, arrival]
    text = ", ".join(p for p in parts if p)
    return text + f" [{workload_tag(row)}]" if rate else text


def cell_label(row: Mapping[str, Any], with_runner: bool = True) -> str:
    """'sim/paged b16', 'torch/contiguous-max', 'vllm/contiguous-max b32' (reserved in whole blocks)."""
    policy = row.get("policy")
    policy = policy if isinstance(policy, str) and policy else "-"  # an import states none
    name = f"{row['runner']}/{policy}" if with_runner else policy
    bs = row.get("block_size")
    if bs is not None and bs == bs and int(bs) > 1:
        name += f" b{int(bs)}"
    return name


def figure_label(row: Mapping[str, Any], with_runner: bool = True) -> str:
    """``cell_label`` with the hybrid KV cache manager's setting where the run has one ('sim/paged
    b16 hybrid off'): a figure draws a model's cells with the manager on and off side by side."""
    hybrid = row.get("hybrid_kv")
    if hybrid is None or bool(pd.isna(hybrid)):  # a model of full attention only
        return cell_label(row, with_runner)
    return cell_label(row, with_runner) + f" hybrid {'on' if hybrid else 'off'}"


def group_label(row: Mapping[str, Any]) -> str:
    """One line naming what a comparison group holds fixed."""
    budget = row.get("budget_bytes")
    positions = row.get("budget_positions")
    sched = json.loads(row["scheduler"]) if isinstance(row.get("scheduler"), str) else {}
    clock = sched.get("clock") or row.get("clock")
    shown = format_bytes(budget) if budget is not None and budget == budget else "-"  # an import states none
    text = (
        f"{row.get('model')}, KV {row.get('kv_dtype')}, budget {shown}"
        + (f" ({int(positions):,} positions)" if positions == positions and positions is not None else "")
        + f", max_model_len {row.get('max_model_len')}, workload {row.get('workload')}"
    )
    extras = [
        f"max_num_seqs {sched['max_num_seqs']}" if "max_num_seqs" in sched else "",
        f"max_num_batched_tokens {sched['max_num_batched_tokens']}" if "max_num_batched_tokens" in sched else "",
        f"clock {clock}" if clock else "",
    ]
    return text + "; " + ", ".join(e for e in extras if e)


def group_title(row: Mapping[str, Any]) -> str:
    """A comparison group in a few words: 'opt-13b / sharegpt (ee9db82e) at 12.0 GiB' (', 4 req/s' where
    its requests arrive at a rate: the groups of a rate sweep differ by it)."""
    budget = row.get("budget_bytes")
    shown = format_bytes(budget) if budget is not None and budget == budget else "-"
    rate = row.get("rate")
    at = f", {rate:g} req/s" if isinstance(rate, (int, float)) and rate == rate else ""
    return f"{row.get('model')} / {workload_tag(row)} at {shown}{at}"


def group_titles(cells: pd.DataFrame) -> dict[int, str]:
    """``group_title`` per group number of a ``tables.summary`` frame, with the KV precision,
    max_model_len or scheduler settings added where two groups would otherwise read the same."""
    firsts = cells.drop_duplicates("group").to_dict("records") if len(cells) else []
    titles = {int(r["group"]): group_title(r) for r in firsts}
    for title in {t for t in titles.values() if list(titles.values()).count(t) > 1}:
        same = [r for r in firsts if titles[int(r["group"])] == title]
        settings = {int(r["group"]): scheduler_settings(r.get("scheduler")) for r in same}
        for r in same:
            extra = [
                f"{label} {r.get(col)}"
                for col, label in (("kv_dtype", "KV"), ("max_model_len", "max_model_len"))
                if len({str(s.get(col)) for s in same}) > 1
            ]
            mine = settings[int(r["group"])]
            extra += [
                f"{k} {mine.get(k)}"
                for k in sorted({k for s in settings.values() for k in s})
                if len({str(s.get(k)) for s in settings.values()}) > 1
            ]
            titles[int(r["group"])] = title + (f", {', '.join(extra)}" if extra else "")
    return titles


def time_axis_label(clock: Any) -> str:
    if clock == "steps":
        return "scheduler step (steps clock: 1 step = 1 s)"
    if clock == "roofline":
        return "simulated time, s (roofline clock)"
    if clock == "tables":
        return "simulated time, s (tables clock: measured GPU tables)"
    if clock == "profile":
        return "simulated time, s (profile clock: fitted to an engine's steps)"
    if clock == "measured":
        return "measured time, s (the engine's own step times)"
    return "time, s"


def throughput_note(clocks: set[Any], runners: set[Any]) -> str:
    """What ``tokens_per_s`` means for these runs."""
    if clocks == {"steps"}:
        return "generated tokens per scheduler step (steps clock)"
    if clocks == {"roofline"}:
        return "generated tokens per simulated second (roofline clock)"
    if clocks == {"tables"}:
        return "generated tokens per simulated second (tables clock)"
    if clocks == {"profile"}:
        return "generated tokens per simulated second (profile clock, fitted to an engine)"
    if clocks == {"measured"}:
        return "generated tokens per measured second of the engine"
    return "generated tokens per second of kvbench's clock"
