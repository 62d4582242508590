"""One series per cell and metric across the nights: what change detection and the page read.

Cells are matched across nights by ``kvbench compare``'s identity (``compare.cell_key``: the work
and the cell, never run id, suite name or code version), so a night of another suite shares the
cells it measured alike and no others. A cell's value on a night is the median over its ok
repetitions that night, as ``compare`` takes it; a night where none was ok has a status instead
(failed, infeasible, ...). A metric is *timed* or *deterministic* as ``compare.is_timed`` says: the
wall-clock columns, and throughput and latency of a run whose clock is ``measured``, move with the
host; every other column is a function of the work and the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pandas as pd

from ...harness.records.schema import OK
from ..compare import METRICS, cell_key, cell_labels, is_timed
from ..labels import with_keys
from .nights import COLUMNS, Nights

CELL_COLUMNS: tuple[str, ...] = ("cell_id", "cell", "runner", "policy", "block_size", "clock", "nights")


@dataclass(frozen=True)
class History:
    """The nights and their series.

    ``cells``: one row per cell found in at least two read nights (in the one, where only one
    was read) (``CELL_COLUMNS``).
    ``status``: one row per (cell_id, night) the cell ran: ``status`` ("ok", or the runs'
    status where none was ok) and ``error``.
    ``points``: one row per (cell_id, metric, night) with an ok value: ``night_index`` (its place
    among the read nights), ``value`` (the median over ok repetitions) and ``timed``.
    ``notes``: what was matched and what was left out, a sentence each."""

    nights: Nights
    cells: pd.DataFrame
    status: pd.DataFrame
    points: pd.DataFrame
    notes: tuple[str, ...]

    @property
    def night_names(self) -> list[str]:
        return [n.name for n in self.nights.read]

    @cached_property
    def night_index(self) -> dict[str, int]:
        """A read night's place among the read nights (what ``points.night_index`` holds)."""
        return {name: i for i, name in enumerate(self.night_names)}


def build_history(nights: Nights) -> History:
    runs = nights.runs
    names = [n.name for n in nights.read]
    index = {name: i for i, name in enumerate(names)}
    notes: list[str] = []
    keyed = runs.assign(key=_keys(runs))
    firsts = with_keys(keyed.drop_duplicates("key"))
    per_key_nights = keyed.groupby("key")["night"].nunique()
    enough = min(2, len(names))  # the first night of a nightly job follows what it ran
    followed = per_key_nights[per_key_nights >= enough].index
    lone = int((per_key_nights < enough).sum())
    suites = sorted({str(s) for s in runs.get("suite", pd.Series(dtype=str)).dropna()})
    if len(suites) > 1:
        notes.append(
            f"the nights ran {len(suites)} suites ({', '.join(suites)}): only cells measured alike on at "
            "least two nights are followed"
        )
    if lone:
        notes.append(f"{lone} cell(s) ran on one night only and are not followed")
    firsts = firsts[firsts["key"].isin(followed)]
    labels = cell_labels(firsts.to_dict("records"))
    cell_ids = {key: i for i, key in enumerate(sorted(followed, key=lambda k: labels[k]))}
    keyed = keyed[keyed["key"].isin(cell_ids)].assign(cell_id=lambda f: f["key"].map(cell_ids))
    cells = pd.DataFrame(
        [
            {
                "cell_id": cell_ids[r["key"]],
                "cell": labels[r["key"]],
                "runner": r["runner"],
                "policy": r["policy"],
                "block_size": r["block_size"],
                "clock": r["clock"],
                "nights": int(per_key_nights[r["key"]]),
            }
            for r in firsts.to_dict("records")
        ],
        columns=list(CELL_COLUMNS),
    ).sort_values("cell_id", ignore_index=True)
    return History(nights, cells, _status(keyed), _points(keyed, cells, index), tuple(notes))


IDENTITY_SOURCES: tuple[str, ...] = tuple(
    c for c in COLUMNS if c not in (*METRICS, "status", "error", "repeat", "git_sha", "kvbench_version", "code_digest")
)


def _keys(runs: pd.DataFrame) -> list[tuple[str, ...]]:
    """Each run's ``compare.cell_key``, worked out once per distinct set of the columns it is made of
    (a year of nights repeats the same few dozen cells)."""
    if runs.empty:
        return []
    sources = runs[list(IDENTITY_SOURCES)]
    digest = pd.util.hash_pandas_object(sources.astype(str), index=False)
    firsts = ~digest.duplicated()
    distinct = with_keys(runs[firsts.to_numpy()])
    by_digest = dict(zip(digest[firsts], (cell_key(r) for r in distinct.to_dict("records"))))
    return [by_digest[d] for d in digest]


def _status(keyed: pd.DataFrame) -> pd.DataFrame:
    """A cell's status on a night: ok when any repetition was, else the most common other one."""
    columns = ["cell_id", "night", "status", "error"]
    if keyed.empty:
        return pd.DataFrame(columns=columns)
    any_ok = keyed.assign(ok=keyed["status"] == OK).groupby(["cell_id", "night"], sort=False)["ok"].any()
    out = any_ok.reset_index()[["cell_id", "night"]].assign(status=OK, error="")
    not_ok = set(any_ok.index[~any_ok.to_numpy()])
    if not_ok:  # few: the nights a cell failed or did not fit
        rows = keyed[[k in not_ok for k in zip(keyed["cell_id"], keyed["night"])]]
        for (cell_id, night), sub in rows.groupby(["cell_id", "night"], sort=False):
            at = (out["cell_id"] == cell_id) & (out["night"] == night)
            out.loc[at, "status"] = str(sub["status"].mode().iloc[0])
            out.loc[at, "error"] = next((e for e in sub["error"] if isinstance(e, str) and e), "")
    return out[columns]


def _points(keyed: pd.DataFrame, cells: pd.DataFrame, index: dict[str, int]) -> pd.DataFrame:
    columns = ["cell_id", "metric", "night", "night_index", "value", "timed"]
    ok = keyed[keyed["status"] == OK]
    metrics = [m for m in METRICS if m in ok]
    if ok.empty or not metrics:
        return pd.DataFrame(columns=columns)
    values = ok[["cell_id", "night", *metrics]].copy()
    for m in metrics:
        values[m] = pd.to_numeric(values[m], errors="coerce")
    long = values.melt(id_vars=["cell_id", "night"], var_name="metric", value_name="value").dropna(subset=["value"])
    points = long.groupby(["cell_id", "metric", "night"], sort=False)["value"].median().reset_index()
    points["night_index"] = points["night"].map(index)
    clocks = dict(zip(cells["cell_id"], cells["clock"]))
    points["timed"] = [is_timed(m, str(clocks.get(c))) for c, m in zip(points["cell_id"], points["metric"])]
    return points.sort_values(["cell_id", "metric", "night_index"], ignore_index=True)[columns]
