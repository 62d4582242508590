"""``compare``: two results directories, cell by cell — the nightly gate (docs/ci.md, "The gate").

Cells are matched by what they measure, ``harness.spec.identity``'s work and cell, never by run
id, suite name, provenance, code version or repetition index. Each metric's change gets a
verdict: capacity and throughput down, or waste, preemptions and latency up, beyond
``tolerance`` is a regression; waste changes are absolute (a share of the budget), preemptions
relative to max(base, 1); timed metrics must also move beyond the spread (every candidate
repetition worse than every base one), and need ``MIN_REPEATS`` per side. A metric on one side
only is not compared but named; a cell on one side only is listed; a cell ok in base and not in
the candidate is a regression.

``compare`` returns a DataFrame; ``to_markdown`` and ``to_json`` render it, with ``code_notes``
saying when a directory's runs come from several versions of the code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..harness.formats.vllm_bench import IMPORTED_RUNNER, imported_block
from ..harness.records.schema import OK
from ..harness.spec import identity
from ..harness.spec.units import format_bytes
from .labels import cell_label, code_versions, describe_versions, with_keys

MATCH_KEYS: tuple[str, ...] = (*identity.CELL_COLUMNS, *identity.WORK_COLUMNS)
NAMED_KEYS: tuple[str, ...] = ("runner", "policy", "block_size")  # what cell_label already says
HIGHER_BETTER: tuple[str, ...] = ("mean_running", "peak_running", "tokens_per_s", "wall_tokens_per_s")
LATENCY: tuple[str, ...] = tuple(
    f"{metric}_{pct}_s" for metric in ("ttft", "tpot", "itl", "latency") for pct in ("p50", "p90", "p95", "p99")
)
LOWER_BETTER: tuple[str, ...] = (
    "reservation_frac",
    "internal_frag_frac",
    "external_frag_frac",
    "preemptions",
    "mean_step_wall_s",
    *LATENCY,
)
METRICS: tuple[str, ...] = HIGHER_BETTER + LOWER_BETTER
SHARES: tuple[str, ...] = ("reservation_frac", "internal_frag_frac", "external_frag_frac")
COUNTS: tuple[str, ...] = ("preemptions",)
TIMED: tuple[str, ...] = ("wall_tokens_per_s", "mean_step_wall_s")
ON_RUN_CLOCK: tuple[str, ...] = ("tokens_per_s", *LATENCY)  # timed where the run's clock is "measured"
MIN_REPEATS = 3

REGRESSION = "regression"
IMPROVEMENT = "improvement"
SAME = "same"
WITHIN = "within tolerance"
NOISE = "within noise"
TOO_FEW = "too few repetitions to judge"
BASE_ONLY = "only in base"
CAND_ONLY = "only in candidate"
ONE_SIDE_MEASURED = "measured on one side only"
NOT_COMPARABLE = "not ok on either side"

COLUMNS: tuple[str, ...] = (
    "cell",
    *MATCH_KEYS,
    "metric",
    "base",
    "cand",
    "change",
    "n_base",
    "n_cand",
    "verdict",
    "detail",
)


def standing_runner(row: dict[str, Any]) -> Any:
    """The runner a run is matched as: its own, except for a run imported from ``vllm bench serve``
    with ``kvbench import --like``, which stands in the cell of the kvbench run it was imported like."""
    if row.get("runner") == IMPORTED_RUNNER:
        like = (imported_block(row) or {}).get("like")
        if isinstance(like, dict) and like.get("runner"):
            return like["runner"]
    return row.get("runner")


def cell_key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(standing_runner(row) if k == "runner" else row.get(k)) for k in MATCH_KEYS)


def _cells(runs: pd.DataFrame) -> dict[tuple[str, ...], pd.DataFrame]:
    """The runs grouped by cell key (repetitions of a cell together)."""
    runs = with_keys(runs)
    groups: dict[tuple[str, ...], list[Any]] = {}
    for idx, row in zip(runs.index, runs.to_dict("records")):
        groups.setdefault(cell_key(row), []).append(idx)
    return {k: runs.loc[idx] for k, idx in groups.items()}


def is_timed(metric: str, clock: str) -> bool:
    """Measured (noisy) rather than derived from kvbench's deterministic clock: the wall-clock
    columns always; throughput and latency where the run's clock is ``measured`` (an engine
    timing its own steps), else they are on kvbench's clock, the same for the same work."""
    return metric in TIMED or (metric in ON_RUN_CLOCK and clock == "measured")


def change(metric: str, base: float, cand: float) -> float:
    """Signed change: absolute for budget shares, relative otherwise (to max(base, 1) for counts)."""
    if metric in SHARES:
        return cand - base
    denom = max(abs(base), 1.0) if metric in COUNTS else abs(base)
    if denom == 0:
        return 0.0 if cand == base else math.copysign(math.inf, cand - base)
    return (cand - base) / denom


def worse(metric: str, delta: float) -> float:
    """How much worse (positive) or better (negative) a change is."""
    return -delta if metric in HIGHER_BETTER else delta


def judge(metric: str, clock: str, base: list[float], cand: list[float], tolerance: float) -> tuple[str, float, str]:
    """(verdict, change, detail) for one metric of one matched cell on ``clock``."""
    b, c = float(pd.Series(base).median()), float(pd.Series(cand).median())
    delta = change(metric, b, c)
    worse_by = worse(metric, delta)
    if is_timed(metric, clock):
        if min(len(base), len(cand)) < MIN_REPEATS:
            return TOO_FEW, delta, f"{len(base)} vs {len(cand)} repetitions; needs {MIN_REPEATS} per side"
        if abs(worse_by) <= tolerance:
            return WITHIN, delta, ""
        # Beyond the spread: every candidate repetition on the far side of every base one.
        apart = min(cand) > max(base) if delta > 0 else max(cand) < min(base)
        if not apart:
            return (
                NOISE,
                delta,
                (f"base {min(base):.4g}..{max(base):.4g}, candidate {min(cand):.4g}..{max(cand):.4g} overlap"),
            )
        return (REGRESSION if worse_by > 0 else IMPROVEMENT), delta, "beyond tolerance and spread"
    if worse_by > tolerance:
        return REGRESSION, delta, ""
    if worse_by < -tolerance:
        return IMPROVEMENT, delta, ""
    return (SAME if delta == 0 else WITHIN), delta, ""


def compare(base_runs: pd.DataFrame, cand_runs: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """One row per (matched cell, metric), plus one per cell found on one side only."""
    b_by, c_by = _cells(base_runs), _cells(cand_runs)
    labels = cell_labels([g.iloc[0].to_dict() for g in (*b_by.values(), *c_by.values())])
    rows: list[dict[str, Any]] = []
    for key in sorted(set(b_by) | set(c_by)):
        b, c = b_by.get(key), c_by.get(key)
        side = b if b is not None else c  # base's runs, or the candidate's where base lacks the cell
        assert side is not None
        first = side.iloc[0].to_dict()
        ident = {"cell": labels[key], **{k: first.get(k) for k in MATCH_KEYS}, "runner": standing_runner(first)}
        if b is None or c is None:
            rows.append(
                {
                    **ident,
                    "metric": None,
                    "n_base": 0 if b is None else len(b),
                    "n_cand": 0 if c is None else len(c),
                    "verdict": CAND_ONLY if b is None else BASE_ONLY,
                    "detail": f"status {'/'.join(sorted(set(side['status'])))}",
                }
            )
            continue
        rows.extend(_cell_rows(ident, b, c, tolerance))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    # The cells holding a run imported from `vllm bench serve` (see unjudged_imported_cells).
    frame.attrs["imported_cells"] = [
        labels[key]
        for key, runs in (*b_by.items(), *c_by.items())
        if (runs["runner"] == IMPORTED_RUNNER).any() and key in b_by and key in c_by
    ]
    return frame


def _cell_rows(ident: dict[str, Any], b: pd.DataFrame, c: pd.DataFrame, tolerance: float) -> list[dict[str, Any]]:
    b_ok, c_ok = b[b["status"] == OK], c[c["status"] == OK]
    counts = {"n_base": len(b_ok), "n_cand": len(c_ok)}
    if b_ok.empty or c_ok.empty:
        b_st, c_st = "/".join(sorted(set(b["status"]))), "/".join(sorted(set(c["status"])))
        err = next((e for e in c["error"] if isinstance(e, str) and e), "")
        if b_ok.empty and c_ok.empty:
            verdict = SAME if b_st == c_st else NOT_COMPARABLE
        else:
            verdict = REGRESSION if c_ok.empty else IMPROVEMENT
        detail = f"status {b_st} → {c_st}" + (f" ({err})" if c_ok.empty and err else "")
        return [{**ident, "metric": "status", **counts, "verdict": verdict, "detail": detail}]
    out = []
    clock = str(b_ok["clock"].iloc[0]) if "clock" in b_ok else ""  # the same both sides: part of the cell
    for metric in METRICS:
        bv = pd.to_numeric(b_ok[metric], errors="coerce").dropna().tolist() if metric in b_ok else []
        cv = pd.to_numeric(c_ok[metric], errors="coerce").dropna().tolist() if metric in c_ok else []
        if not bv and not cv:
            continue  # not measured by this runner (mean_step_wall_s of sim)
        row = {
            **ident,
            "metric": metric,
            "n_base": len(bv),
            "n_cand": len(cv),
            "base": float(pd.Series(bv).median()) if bv else math.nan,
            "cand": float(pd.Series(cv).median()) if cv else math.nan,
        }
        if not bv or not cv:
            out.append({**row, "verdict": ONE_SIDE_MEASURED, "detail": ""})
            continue
        verdict, delta, detail = judge(metric, clock, bv, cv, tolerance)
        out.append({**row, "change": delta, "verdict": verdict, "detail": detail})
    return out


def cell_labels(firsts: list[dict[str, Any]]) -> dict[tuple[str, ...], str]:
    """'sim/paged b16', plus whichever group keys vary among the compared cells."""
    varying = [k for k in MATCH_KEYS if k not in NAMED_KEYS and len({str(r.get(k)) for r in firsts}) > 1]
    out = {}
    for r in firsts:
        parts = [cell_label(r)]
        for k in varying:
            v = r.get(k)
            if k != "page_bytes" and (v is None or (isinstance(v, float) and math.isnan(v))):
                parts.append(f"{k.removesuffix('_bytes')} not recorded")  # an imported run has no such column
            elif k == "budget_bytes":
                parts.append(f"budget {format_bytes(float(str(v)))}")
            elif k == "page_bytes":
                parts.append(f"page {format_bytes(float(str(v)))}" if v is not None and v == v else "page -")
            elif k == "workload_id":
                parts.append(f"workload {str(v)[:8]}")
            elif k == "scheduler":
                parts.append(
                    "scheduler "
                    + ",".join(
                        f"{a}={str(b)[:8]}"
                        for a, b in json.loads(str(v)).items()
                        if a
                        in ("max_num_seqs", "max_num_batched_tokens", "clock", "preemption", "clock_profile_content")
                    )
                )
            else:
                parts.append(f"{k} {v}")
        out[cell_key(r)] = " · ".join(parts)
    return out


def code_notes(base_runs: pd.DataFrame, cand_runs: pd.DataFrame) -> list[str]:
    """Notes on the code behind the two sides: each side that mixes runs of several versions
    of kvbench's code (``code_digest``), and whether the two sides ran different code."""
    sides = {"base": code_versions(_digests(base_runs)), "candidate": code_versions(_digests(cand_runs))}
    notes = [
        f"{side} mixes runs of {len(counts)} versions of kvbench's code ({describe_versions(counts)}): "
        "its repetitions of one cell may disagree because the code changed between them"
        for side, counts in sides.items()
        if len(counts) > 1
    ]
    if set(sides["base"]) != set(sides["candidate"]):
        notes.append(
            f"base and candidate ran different code (base {', '.join(sides['base'])}; "
            f"candidate {', '.join(sides['candidate'])}): changes below may come from the code"
        )
    return notes


def _digests(runs: pd.DataFrame) -> list[object]:
    return runs["code_digest"].tolist() if "code_digest" in runs else [None] * len(runs)


JUDGED: tuple[str, ...] = (REGRESSION, IMPROVEMENT, SAME, WITHIN, NOISE)


def unjudged_imported_cells(result: pd.DataFrame) -> list[str]:
    """The matched cells holding a run imported from ``vllm bench serve`` in which no metric was
    judged: the import lacks the allocation columns and each timed metric needs ``MIN_REPEATS``
    runs per side, so such a cell may compare nothing, and a gate must not pass on it."""
    out = []
    for cell in dict.fromkeys(result.attrs.get("imported_cells", [])):
        verdicts = result.loc[result["cell"] == cell, "verdict"]
        if not verdicts.isin(JUDGED).any():
            out.append(cell)
    return out


def import_notes(base_runs: pd.DataFrame, cand_runs: pd.DataFrame) -> list[str]:
    """A note for each side holding runs imported from ``vllm bench serve``: they measure
    throughput and latency only (no steps, no allocation)."""
    notes = []
    for side, runs in (("base", base_runs), ("candidate", cand_runs)):
        n = int((runs["runner"] == IMPORTED_RUNNER).sum()) if "runner" in runs else 0
        if n:
            notes.append(
                f"{side} holds {n} run(s) imported from `vllm bench serve` (runner {IMPORTED_RUNNER}): they measure "
                "throughput and latency only, so their allocation, capacity and preemption columns are not compared"
            )
    return notes


def uncompared_columns(result: pd.DataFrame) -> dict[str, int]:
    """Each metric measured on one side only, with how many matched cells it could not be compared in."""
    one = result[result["verdict"] == ONE_SIDE_MEASURED]
    return {str(m): int(n) for m, n in one.groupby("metric", sort=False)["cell"].nunique().items()}


def regressions(result: pd.DataFrame) -> pd.DataFrame:
    return result[result["verdict"] == REGRESSION]


# -- renderers -------------------------------------------------------------------


def _fmt_change(metric: Any, delta: Any) -> str:
    if delta is None or (isinstance(delta, float) and math.isnan(delta)):
        return "-"
    if metric in SHARES:
        return f"{100 * delta:+.2f} pts"
    return "+inf" if delta == math.inf else f"{100 * delta:+.1f}%"


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.4g}"


def to_markdown(result: pd.DataFrame, tolerance: float, notes: Sequence[str] = ()) -> str:
    reg = regressions(result)
    matched = result[~result["verdict"].isin((BASE_ONLY, CAND_ONLY))]["cell"].nunique()
    lines = ["## kvbench compare", ""]
    if notes:
        lines += [f"Note: {n}." for n in notes] + [""]
    if matched == 0:
        lines.append("**No cell matched**: the two directories measure different cells, so nothing was compared.")
    elif len(reg):
        cells = ", ".join(f"`{c}`" for c in dict.fromkeys(reg["cell"]))
        lines.append(
            f"**{reg['cell'].nunique()} of {matched} matched cell(s) regressed** beyond tolerance "
            f"{tolerance:g}: {cells}"
        )
    else:
        lines.append(f"No regression beyond tolerance {tolerance:g} in {matched} matched cell(s).")
    lines.append("")
    judged = result[result["verdict"].isin((REGRESSION, IMPROVEMENT, NOISE))]
    if len(judged):
        lines += ["| cell | metric | base | candidate | change | verdict | detail |", "|---|---|---|---|---|---|---|"]
        order = judged.assign(_o=judged["verdict"].map({REGRESSION: 0, NOISE: 1, IMPROVEMENT: 2}))
        for r in order.sort_values("_o").to_dict("records"):
            lines.append(
                f"| {r['cell']} | {r['metric']} | {_fmt(r['base'])} | {_fmt(r['cand'])} | "
                f"{_fmt_change(r['metric'], r['change'])} | {r['verdict']} | {r['detail'] or ''} |"
            )
        lines.append("")
    one_side = result[result["verdict"].isin((BASE_ONLY, CAND_ONLY))]
    if len(one_side):
        lines.append("Cells on one side only (not compared):")
        lines += [f"- {r['verdict']}: `{r['cell']}` ({r['detail']})" for r in one_side.to_dict("records")]
        lines.append("")
    few = result[result["verdict"] == TOO_FEW]
    if len(few):
        lines.append(f"Timed metrics not judged — {TOO_FEW} (fewer than {MIN_REPEATS} per side):")
        for metric, sub in few.groupby("metric", sort=False):
            lines.append(
                f"- {metric}: {sub['cell'].nunique()} cell(s), changes "
                + ", ".join(f"{_fmt_change(metric, d)}" for d in sub["change"].head(6))
                + (" …" if len(sub) > 6 else "")
            )
        lines.append("")
    uncompared = uncompared_columns(result)
    if uncompared:
        lines.append(
            "Columns not compared, measured on one side only (null on the other: recorded before kvbench had "
            "them, or not produced by that runner): "
            + ", ".join(f"{m} ({n} cell{'s' if n > 1 else ''})" for m, n in uncompared.items())
        )
        lines.append("")
    other = result[result["verdict"] == NOT_COMPARABLE]
    lines += [
        f"- `{r['cell']}` {r['metric']}: {r['verdict']} {r['detail'] or ''}".rstrip() for r in other.to_dict("records")
    ]
    return "\n".join(lines).rstrip() + "\n"


def json_value(v: Any) -> Any:
    """A value as JSON holds it: NaN as null, infinities as "inf"/"-inf", numpy scalars as Python's."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v.item() if hasattr(v, "item") else v


def to_json(result: pd.DataFrame, tolerance: float, notes: Sequence[str] = ()) -> str:
    rows = [{k: json_value(v) for k, v in r.items()} for r in result.to_dict("records")]
    reg = regressions(result)
    return json.dumps(
        {
            "tolerance": tolerance,
            "regressed_cells": list(dict.fromkeys(reg["cell"])),
            "matched_cells": int(result.loc[~result["verdict"].isin((BASE_ONLY, CAND_ONLY)), "cell"].nunique()),
            "notes": list(notes),
            "uncompared_columns": uncompared_columns(result),
            "rows": rows,
        },
        indent=2,
        default=str,
        ensure_ascii=False,
    )
