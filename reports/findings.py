"""What a report says first: per comparison group, a few short sentences written from the records.

Each sentence states numbers of ``ReportTables`` (the per-cell table, the decomposition, the
hybrid table) and nothing else: paged against each contiguous baseline of the same runner in
concurrency (mean and peak running requests) and throughput (tokens_per_s on the run's clock);
where torch and vLLM both ran, how the naive difference splits into allocation × runtime; what
vLLM's hybrid KV cache manager changed; what a CPU tier changed (``cpu_tier``'s sentences); and
which cells did not run ok, and why. A pure function:
the renderers (html.py, markdown.py) only lay the sentences out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pandas as pd

from ..harness.records.schema import OK
from ..harness.spec.capabilities import is_contiguous
from .contents import ReportTables
from .display import amounts, failure, fmt, throughput_unit
from .figdata import preferred_block
from .labels import cell_label, group_titles
from .tables import finite, policy_rank, ratio_of

PAGED = "paged"
SIDE_KEYS: tuple[str, ...] = ("runner", "device", "hybrid_kv")  # ratios are within one of each
FAILURES_NAMED = 3  # cells not ok named one by one; beyond, counted
FINDINGS_NOTE = (
    "Per comparison group, from the records: paged against each contiguous policy of the same runner on the "
    "same work (× = paged ÷ contiguous; concurrency: requests running at once; throughput: generated tokens "
    "on the run's clock), the allocation × runtime split where torch and vLLM both ran, the hybrid KV cache "
    "manager where it was switched, and the cells that did not run ok. The tables below hold every number."
)
NO_FINDINGS = "No cells in these records: nothing to compare."
METRIC_WORDS = {"wall_tokens_per_s": "wall tokens/s", "mean_running": "mean running", "peak_running": "peak running"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One comparison group's sentences; ``group`` is its number in ``ReportTables.cells`` (0-based)."""

    group: int
    title: str
    sentences: tuple[str, ...]


def findings(tables: ReportTables) -> list[Finding]:
    """One ``Finding`` per comparison group, in the tables' order."""
    cells = tables.cells
    if cells.empty:
        return []
    titles = group_titles(cells)
    out = []
    for g, sub in cells.groupby("group", sort=True):
        sentences = [
            *paged_against_contiguous(sub),
            *decomposition_sentences(sub, tables.decomposition),
            *hybrid_sentences(sub, tables.hybrid),
            *tables.cpu_tier.answers.get(int(g), ()),  # what a CPU tier changed (the "CPU tier" section's)
            *failure_sentences(sub),
        ]
        out.append(Finding(int(g), titles[int(g)], tuple(sentences)))
    return out


# -- paged against contiguous ------------------------------------------------------------


def _joined(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _baselines(contiguous: pd.DataFrame, block: Any) -> list[dict[str, Any]]:
    """Per contiguous policy, in the tables' order, the cell reserving whole blocks of ``block``
    where one ran, else token positions (as the decomposition pairs them)."""
    out = []
    for policy in sorted(set(contiguous["policy"]), key=policy_rank):
        cells = contiguous[contiguous["policy"] == policy]
        same = cells[cells["block_size"] == block]
        positions = cells[cells["block_size"] == 1]
        out.append((same if len(same) else positions if len(positions) else cells).iloc[0].to_dict())
    return out


def _against(paged: dict[str, Any], base: dict[str, Any], unit: str, first: bool) -> str:
    """'5.04× the mean concurrency of contiguous-max (35.1 vs 7.0; peak 87 vs 7) and 5.04× its
    throughput (35.1 vs 7.0 tokens/step)'; for a later baseline, without paged's own numbers again
    (and without the policy, which the sentence names first)."""
    of = f" of {base['policy']}" if first else ""
    clauses = []
    mean = ratio_of(paged["mean_running"], base["mean_running"])
    if finite(mean):
        mine, theirs = amounts(paged["mean_running"], base["mean_running"])
        numbers = f"{mine} vs {theirs}" if first else f"vs {theirs}"
        if finite(paged["peak_running"]) and finite(base["peak_running"]):
            peak = fmt("int", base["peak_running"])
            numbers += f"; peak {fmt('int', paged['peak_running'])} vs {peak}" if first else f"; peak vs {peak}"
        clauses.append(f"{fmt('ratio', mean)} the mean concurrency{of} ({numbers})")
    rate = ratio_of(paged["tokens_per_s"], base["tokens_per_s"])
    if finite(rate):
        mine, theirs = amounts(paged["tokens_per_s"], base["tokens_per_s"])
        numbers = f"{mine} vs {theirs}" if first else f"vs {theirs}"
        what = "its throughput" if clauses and first else f"the throughput{of}"
        clauses.append(f"{fmt('ratio', rate)} {what} ({numbers} {unit})")
    return " and ".join(clauses)


def _side_sentences(side: pd.DataFrame, unit: str) -> list[str]:
    """Paged's sentences against each contiguous baseline of one runner (device, manager setting);
    later baselines with the same numbers are named together."""
    paged = side[side["policy"] == PAGED]
    contiguous = side[side["policy"].map(lambda p: is_contiguous(str(p)))]
    block = preferred_block(list(paged["block_size"]))
    if paged.empty or contiguous.empty or block is None:
        return []
    cell = paged[paged["block_size"] == block].iloc[0].to_dict()
    out: list[str] = []
    later: dict[str, list[str]] = {}
    for base in _baselines(contiguous, block):
        text = _against(cell, base, unit, first=not out)
        if text and not out:  # the first baseline with numbers, and the spread over block sizes against it
            out = [f"paged (block {block}) ran {text}.", *_block_span(paged, base)]
        elif text:
            later.setdefault(text, []).append(str(base["policy"]))
    return out + [f"Against {_joined(policies)}: {text}." for text, policies in later.items()]


def _block_span(paged: pd.DataFrame, base: dict[str, Any]) -> list[str]:
    """Where paged ran at several block sizes: the range of its mean-concurrency ratio to ``base``."""
    ratios = [
        (int(r["block_size"]), ratio_of(r["mean_running"], base["mean_running"])) for r in paged.to_dict("records")
    ]
    ratios = sorted((b, x) for b, x in ratios if finite(x))
    if len(ratios) < 2:
        return []
    lo, hi = min(x for _, x in ratios), max(x for _, x in ratios)
    span = fmt("ratio", lo) if fmt("ratio", lo) == fmt("ratio", hi) else f"{fmt('ratio', lo)}–{fmt('ratio', hi)}"
    return [f"Across paged blocks {ratios[0][0]}–{ratios[-1][0]}: {span} the mean concurrency of {base['policy']}."]


def _side_label(key: tuple[Hashable, ...], sub: pd.DataFrame) -> str:
    runner, device, hybrid = key
    label = str(runner)
    if sub.loc[sub["runner"] == runner, "device"].nunique(dropna=False) > 1:  # one runner on two devices
        label += f" on {device}"
    if hybrid is not None and not pd.isna(hybrid):
        label += f" (hybrid KV {'on' if hybrid else 'off'})"
    return label


def paged_against_contiguous(sub: pd.DataFrame) -> list[str]:
    """One group's sentences on paged against each contiguous baseline, per runner; runners whose
    sentences read the same are named together. Says so where there is no pair to compare."""
    ok = sub[sub["ok"] > 0]
    if ok.empty:
        return ["No run in this group finished ok."]
    unit = throughput_unit(set(sub["clock"]))
    keys = [k for k in SIDE_KEYS if k in ok]
    said: dict[tuple[str, ...], list[str]] = {}
    for key, side in ok.groupby(keys, sort=False, dropna=False):
        full = tuple(key) + (None,) * (len(SIDE_KEYS) - len(keys))
        texts = tuple(_side_sentences(side, unit))
        if texts:
            said.setdefault(texts, []).append(_side_label(full, sub))
    if not said:
        if not (sub["policy"] == PAGED).any():
            ran = _joined(list(dict.fromkeys(str(p) for p in ok["policy"])))
            return [f"No paged cell in this group (ran ok: {ran}): nothing to set against contiguous."]
        if not (ok["policy"] == PAGED).any():
            return ["Paged did not run ok in this group: no ratio to state."]
        if not sub["policy"].map(lambda p: is_contiguous(str(p))).any():
            return ["No contiguous policy ran in this group, so paged has no baseline here."]
        if not ok["policy"].map(lambda p: is_contiguous(str(p))).any():
            return ["No contiguous policy ran ok in this group, so paged has no baseline here."]
        return ["No runner ran both paged and a contiguous policy ok in this group: no ratio on the same runner."]
    out = []
    for texts, sides in said.items():
        out += [f"On {_joined(sides)}, {texts[0]}", *texts[1:]]
    return out


# -- the decomposition --------------------------------------------------------------------


def _words(metric: str, unit: str) -> str:
    return unit if metric == "tokens_per_s" else METRIC_WORDS.get(metric, metric)


def decomposition_sentences(sub: pd.DataFrame, decomp: pd.DataFrame) -> list[str]:
    """Where torch and vLLM both ran the group's work: naive = allocation × runtime against each
    contiguous baseline, in wall tokens/s where measured (tokens_per_s on kvbench's clock has a
    runtime factor of 1 by construction), and vLLM's own allocation factor where it ran contiguous."""
    if decomp.empty:
        return []
    first = sub.iloc[0]
    rows = decomp[
        (decomp["workload_id"] == first["workload_id"])
        & (decomp["kv_dtype"] == first["kv_dtype"])
        & (decomp["budget_bytes"] == first["budget_bytes"])
        & decomp["models"].map(lambda m: str(first["model"]) in str(m).split(", "))
    ]
    rows = rows[rows[["naive", "allocation", "runtime"]].map(finite).all(axis=1)] if len(rows) else rows
    if rows.empty:
        return []
    metric = next(m for m in ("wall_tokens_per_s", "tokens_per_s", *rows["metric"]) if (rows["metric"] == m).any())
    rows = rows[rows["metric"] == metric]
    block = preferred_block(list(rows["block_size"]))
    rows = rows[rows["block_size"] == block] if block is not None else rows
    rows = rows.assign(_o=rows["baseline"].map(policy_rank)).sort_values("_o")
    unit = throughput_unit(set(sub["clock"]))
    parts = [
        f"{r['baseline']}{' is' if i == 0 else ','} "
        + (
            f"naive {fmt('ratio', r['naive'])} = allocation {fmt('ratio', r['allocation'])} × runtime "
            f"{fmt('ratio', r['runtime'])}"
            if i == 0
            else f"{fmt('ratio', r['naive'])} = {fmt('ratio', r['allocation'])} × {fmt('ratio', r['runtime'])}"
        )
        for i, r in enumerate(rows.to_dict("records"))
    ]
    where = f" (block {block})" if block is not None else ""
    out = [f"In {_words(metric, unit)}{where}, vllm/paged over torch/{'; over torch/'.join(parts)}."]
    inside = [r for r in rows.to_dict("records") if finite(r["vllm_allocation"])]
    if inside:
        each = [f"{fmt('ratio', r['vllm_allocation'])} against {r['baseline']}" for r in inside]
        out.append(f"Inside vLLM alone (vllm/paged over vllm/contiguous), allocation gives {_joined(each)}.")
    return out


# -- the hybrid KV cache manager ----------------------------------------------------------

HYBRID_COUNTS: tuple[tuple[str, str, Callable[..., list[str]]], ...] = (
    ("mean_running", "mean running", amounts),
    ("peak_running", "peak", lambda *v: [fmt("int", x) for x in v]),
    ("preemptions", "preemptions", lambda *v: [fmt("int", x) for x in v]),
)


def hybrid_sentences(sub: pd.DataFrame, hybrid: pd.DataFrame) -> list[str]:
    """What the manager changed in this group's pairs (on against off), runners with the same
    numbers named together."""
    if hybrid.empty:
        return []
    first = sub.iloc[0]
    rows = hybrid[
        (hybrid["model"] == first["model"])
        & (hybrid["budget_bytes"] == first["budget_bytes"])
        & (hybrid["workload"] == first["workload"])
    ]
    unit = throughput_unit(set(sub["clock"]))
    said: dict[tuple[str, str], list[str]] = {}
    for r in rows.to_dict("records"):
        parts = [
            f"{what} {' vs '.join(show(r[f'{key}_on'], r[f'{key}_off']))}"
            for key, what, show in HYBRID_COUNTS
            if finite(r[f"{key}_on"]) and finite(r[f"{key}_off"])
        ]
        if finite(r["tokens_per_s_ratio"]):
            parts.append(f"{fmt('ratio', r['tokens_per_s_ratio'])} the {unit}")
        if finite(r["paging_on"]) and finite(r["paging_off"]):
            on, off = fmt("ratio", r["paging_on"]), fmt("ratio", r["paging_off"])
            parts.append(f"paged's {unit} over {r['contiguous']}'s {on} on and {off} off")
        if parts:
            said.setdefault((str(r["policy"]), ", ".join(parts)), []).append(str(r["runner"]))
    return [
        f"Hybrid KV cache manager on vs off ({policy} on {_joined(runners)}): {text}."
        for (policy, text), runners in said.items()
    ]


# -- cells that did not run ok --------------------------------------------------------------


def failure_sentences(sub: pd.DataFrame) -> list[str]:
    """Each cell with a run not ok, with its status and error (the first few; the rest counted)."""
    bad = [r for r in sub.to_dict("records") if r["status"] != OK]
    out = []
    for r in bad[:FAILURES_NAMED]:
        label = cell_label(r)
        status = "/".join(s for s in str(r["status"]).split("/") if s != OK)
        if r["ok"]:  # some repetitions ran ok: the table's numbers are theirs
            label = f"{int(r['repeats'] - r['ok'])} of {int(r['repeats'])} runs of {label}"
        row = {**r, "status": status}
        out.append((failure(row, label) if isinstance(r["error"], str) and r["error"] else f"{label} {status}") + ".")
    if len(bad) > FAILURES_NAMED:
        out.append(f"{len(bad) - FAILURES_NAMED} more cell(s) did not run ok: the group's table lists them.")
    return out
