"""Where each cell's metrics changed across the nights, and whether tonight stands in a regression
(docs/ci.md, "History across nights", says why these methods).

- **Deterministic metrics are exact** (``series``: not ``timed``): on the same code a column of
  kvbench's own clock is the same number every night, so any difference from the night before
  is a change at that night's commit, never smoothed.
- **Timed metrics are fitted.** A timed series, in logs (a change is a ratio), is split by an
  optimal partition (dynamic programming, as asv's step fitting and PELT do) into stretches, each
  level or a line (a drift), minimising the squared residuals in units of the noise plus
  ``PENALTY`` × ln n a stretch (a line ``LINE_PENALTY`` × ln n more, and kept only where it beats
  the best single step inside it by that much: a step is one commit, the plainer account). The
  noise σ is 1.4826 × the MAD of the night-to-night differences ÷ √2, which neither a step nor a
  drift inflates. A step is where two stretches meet, a drift along a line, each reported when
  beyond the tolerance; a one-night blip does not pay for its stretches.

The gate (``Detection.regressed``) judges the latest night against the last accepted night
(``DIR/accepted``), else the first: a series regressed when its fitted value tonight (its value,
if deterministic) is worse than at the reference beyond the tolerance, so a drift counts once it
adds up and a blip does not; a cell ok at the reference and not ok tonight regressed too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...harness.records.schema import OK
from ..compare import change, worse
from .series import History

STEP = "step"
DRIFT = "drift"
EXACT = "exact"
STATUS = "status"
REGRESSION = "regression"
IMPROVEMENT = "improvement"

PENALTY = 4.0  # per stretch, times log n: above nearly every split that noise alone offers
LINE_PENALTY = 2.0  # a line's extra parameter (its slope), in the same units
MIN_LINE = 4  # nights a drift needs before it is a line rather than noise
MIN_FIT = 5  # nights a timed series needs before its noise, hence a change or the gate, can be judged
NOISE_FLOOR = 1e-4  # σ below this (0.01%) is taken as this: a series that never moves is not infinitely sure


@dataclass(frozen=True)
class Change:
    """One change of one cell's metric.

    ``kind``: ``step`` (timed, between two stretches), ``drift`` (timed, along a stretch),
    ``exact`` (deterministic, between two nights) or ``status`` (ok on one night, not the next,
    or back). ``first_night``/``commit``: the first night after the change began and its commit;
    ``previous_night``/``previous_commit``: the night before it (the commit range is
    previous_commit..commit; for a drift, its stretch's last night is ``last_night``).
    ``ratio``: after ÷ before (a drift: its fitted end ÷ its fitted start); ``noise``: the
    night-to-night σ as a fraction (timed only)."""

    cell_id: int
    cell: str
    runner: str
    policy: str
    block_size: int | None
    metric: str
    kind: str
    direction: str
    first_night: str
    commit: str
    previous_night: str | None
    previous_commit: str | None
    last_night: str
    before: float
    after: float
    ratio: float
    noise: float | None


@dataclass(frozen=True)
class Regressed:
    """A cell's metric worse tonight than at the reference night beyond the tolerance (the gate).
    ``metric`` is "status" for a cell ok at the reference and not ok tonight."""

    cell_id: int
    cell: str
    metric: str
    reference_night: str
    latest_night: str
    reference: float
    latest: float
    ratio: float
    since: str | None  # the first night of the change that began it, where one was found
    detail: str = ""  # a status regression: the status tonight and its error


@dataclass(frozen=True)
class Detection:
    """What ``detect`` found: the changes (in night order), each timed series' fit (``fits``:
    cell_id, metric, night_index, fit, in the metric's units; its noise is on each change), the
    reference night and the regressions tonight."""

    changes: tuple[Change, ...]
    fits: pd.DataFrame
    reference_night: str
    latest_night: str
    regressed: tuple[Regressed, ...]
    tolerance: float


# -- the fit of timed series ------------------------------------------------------


@dataclass(frozen=True)
class Stretch:
    """One stretch of a fitted series: points ``start`` to ``stop`` (exclusive), level or a line."""

    start: int
    stop: int
    line: bool


def noise_scale(y: np.ndarray) -> float:
    """σ of a series' night-to-night noise, robust to steps and drifts (see the module doc)."""
    if len(y) < 3:
        return NOISE_FLOOR
    d = np.diff(y)
    mad = float(np.median(np.abs(d - np.median(d))))
    return max(1.4826 * mad / math.sqrt(2.0), NOISE_FLOOR)


def segment(ys: np.ndarray, sigmas: np.ndarray) -> list[list[Stretch]]:
    """The optimal stretches of each row of ``ys`` (series of one length, in log space) with noise
    ``sigmas``: minimum of Σ residual² / σ² + a penalty per stretch, over every partition, each
    stretch level or (``MIN_LINE`` points or more) a straight line. All rows are fitted at once."""
    s, n = ys.shape
    t = np.arange(n, dtype=float) - (n - 1) / 2.0
    y = ys - ys.mean(axis=1, keepdims=True)
    w = 1.0 / np.square(sigmas)[:, None]

    def prefix(a: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((a.shape[0], 1)), np.cumsum(a, axis=1)], axis=1)

    s1, s2 = prefix(y), prefix(y * y)
    ty = prefix(y * t)
    t1 = np.concatenate([[0.0], np.cumsum(t)])
    t2 = np.concatenate([[0.0], np.cumsum(t * t)])
    level = PENALTY * math.log(max(n, 2))
    line = level + LINE_PENALTY * math.log(max(n, 2))
    best = np.zeros((s, n + 1))
    start = np.zeros((s, n + 1), dtype=np.int64)
    kind = np.zeros((s, n + 1), dtype=bool)
    for j in range(1, n + 1):
        m = (j - np.arange(j)).astype(float)  # each start's stretch length
        sy, syy = s1[:, j : j + 1] - s1[:, :j], s2[:, j : j + 1] - s2[:, :j]
        flat = np.maximum(syy - sy * sy / m, 0.0) * w + level
        cost = best[:, :j] + flat
        is_line = np.zeros_like(cost, dtype=bool)
        long = m >= MIN_LINE
        if long.any():
            mt, st, stt = m[long], (t1[j] - t1[:j])[long], (t2[j] - t2[:j])[long]
            sxx = stt - st * st / mt
            sxy = (ty[:, j : j + 1] - ty[:, :j])[:, long] - st * sy[:, long] / mt
            rss = syy[:, long] - sy[:, long] ** 2 / mt - sxy * sxy / sxx
            sloped = best[:, :j][:, long] + np.maximum(rss, 0.0) * w + line
            better = sloped < cost[:, long]
            cost[:, long] = np.where(better, sloped, cost[:, long])
            is_line[:, long] = better
        arg = np.argmin(cost, axis=1)
        rows = np.arange(s)
        best[:, j] = cost[rows, arg]
        start[:, j] = arg
        kind[:, j] = is_line[rows, arg]
    out = []
    for r in range(s):
        stretches: list[Stretch] = []
        end = n
        while end > 0:
            begin = int(start[r, end])
            stretches.extend(_step_or_line(ys[r], Stretch(begin, end, bool(kind[r, end])), float(sigmas[r]), n)[::-1])
            end = begin
        out.append(stretches[::-1])
    return out


def _step_or_line(y: np.ndarray, st: Stretch, sigma: float, n: int) -> list[Stretch]:
    """A line stretch, or the two levels of its best single split unless the line fits clearly
    better (by ``LINE_PENALTY`` × log n, in units of the noise): a step seen through noise can pass
    for a line, and a step (one commit) is the plainer account."""
    if not st.line:
        return [st]
    part = y[st.start : st.stop]
    m = len(part)
    x = np.arange(m, dtype=float)
    line_rss = float(np.sum(np.square(part - np.polyval(np.polyfit(x, part, 1), x))))
    c1, c2 = np.cumsum(part), np.cumsum(part * part)
    k = np.arange(1, m)
    left = c2[:-1] - c1[:-1] ** 2 / k
    right = (c2[-1] - c2[:-1]) - (c1[-1] - c1[:-1]) ** 2 / (m - k)
    split = int(np.argmin(left + right))
    if (float(left[split] + right[split]) - line_rss) / sigma**2 <= LINE_PENALTY * math.log(max(n, 2)):
        cut = st.start + split + 1
        return [Stretch(st.start, cut, False), Stretch(cut, st.stop, False)]
    return [st]


def fitted(y: np.ndarray, stretches: list[Stretch]) -> np.ndarray:
    """The fit of ``y`` by its stretches: each one's mean, or its least-squares line."""
    out = np.empty_like(y)
    for st in stretches:
        part = y[st.start : st.stop]
        if st.line:
            x = np.arange(len(part), dtype=float)
            slope, icept = np.polyfit(x, part, 1)
            out[st.start : st.stop] = icept + slope * x
        else:
            out[st.start : st.stop] = part.mean()
    return out


# -- detection -------------------------------------------------------------------


@dataclass(frozen=True)
class _Where:
    """What names a change: the read nights (names and commits, in order) and the cells."""

    names: list[str]
    index: dict[str, int]  # name → place in ``names``
    commits: list[str]
    cells: pd.DataFrame  # indexed by cell_id


@dataclass(frozen=True)
class _Series:
    cell_id: int
    metric: str
    nights: np.ndarray  # night indices, ascending
    values: np.ndarray
    timed: bool


def _to_fit_space(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """Logs (a change is a ratio) where every value is positive, else the values as they are."""
    if np.all(values > 0):
        return np.log(values), True
    return values.astype(float), False


def detect(history: History, tolerance: float) -> Detection:
    """The changes of every followed cell across the nights, and the gate's verdict on the latest."""
    names = history.night_names
    reference = history.nights.accepted if history.nights.accepted in names else names[0]
    ref_i, last_i = history.night_index[reference], len(names) - 1
    series = [
        _Series(
            int(c), str(m), sub["night_index"].to_numpy(int), sub["value"].to_numpy(float), bool(sub["timed"].iloc[0])
        )
        for (c, m), sub in history.points.groupby(["cell_id", "metric"], sort=True)
    ]
    fits = _fit_timed([s for s in series if s.timed and len(s.values) >= MIN_FIT])
    cells = history.cells.set_index("cell_id")
    where = _Where(names, history.night_index, [n.commit for n in history.nights.read], cells)
    found: list[Change] = []
    regressed: list[Regressed] = []
    fit_rows: list[pd.DataFrame] = []
    for s in series:
        if s.timed and (s.cell_id, s.metric) not in fits:
            continue  # too few nights to tell a change from the noise: `kvbench compare` judges pairs
        fit, stretches, sigma = fits.get((s.cell_id, s.metric), (s.values, None, None))
        own = _changes(where, s, fit, stretches, sigma, tolerance)
        found += own
        if stretches is not None:
            fit_rows.append(
                pd.DataFrame({"cell_id": s.cell_id, "metric": s.metric, "night_index": s.nights, "fit": fit})
            )
        verdict = _gate(s, fit, ref_i, last_i, tolerance)
        if verdict is not None:
            since = _since([c for c in own if where.index[c.last_night] > ref_i])  # a drift may begin before
            regressed.append(
                Regressed(
                    s.cell_id,
                    str(cells.at[s.cell_id, "cell"]),
                    s.metric,
                    reference,
                    names[last_i],
                    verdict[0],
                    verdict[1],
                    _ratio(verdict[0], verdict[1]),
                    since,
                )
            )
    status_changes, status_regressed = _status(history, where, ref_i)
    found += status_changes
    regressed += status_regressed
    return Detection(
        changes=tuple(sorted(found, key=lambda c: (where.index[c.first_night], c.cell, c.metric))),
        fits=pd.concat(fit_rows, ignore_index=True) if fit_rows else pd.DataFrame(columns=FIT_COLUMNS),
        reference_night=reference,
        latest_night=names[last_i],
        regressed=tuple(sorted(regressed, key=lambda r: (r.cell, r.metric))),
        tolerance=tolerance,
    )


FIT_COLUMNS = ["cell_id", "metric", "night_index", "fit"]


def _fit_timed(series: list[_Series]) -> dict[tuple[int, str], tuple[np.ndarray, list[Stretch], float]]:
    """Each timed series' fit (in its units), stretches and noise (as a fraction where in logs).
    Series of one length are segmented together."""
    out: dict[tuple[int, str], tuple[np.ndarray, list[Stretch], float]] = {}
    by_length: dict[int, list[tuple[_Series, np.ndarray, bool]]] = {}
    for s in series:
        y, logs = _to_fit_space(s.values)
        by_length.setdefault(len(y), []).append((s, y, logs))
    for group in by_length.values():
        ys = np.vstack([y for _, y, _ in group])
        scale = np.array([1.0 if logs else max(float(np.median(np.abs(y))), 1e-12) for _, y, logs in group])
        sigmas = np.array([noise_scale(y / k) for (_, y, _), k in zip(group, scale)])
        for (s, y, logs), sigma, stretches in zip(group, sigmas, segment(ys / scale[:, None], sigmas)):
            fit = fitted(y, stretches)
            out[(s.cell_id, s.metric)] = (np.exp(fit) if logs else fit, stretches, float(sigma))
    return out


def _ratio(before: float, after: float) -> float:
    if before == 0:
        return 1.0 if after == 0 else math.inf
    return after / before


def _direction(metric: str, before: float, after: float) -> str:
    return REGRESSION if worse(metric, change(metric, before, after)) > 0 else IMPROVEMENT


def _changes(
    where: _Where, s: _Series, fit: np.ndarray, stretches: list[Stretch] | None, sigma: float | None, tolerance: float
) -> list[Change]:
    """A series' changes: between every two nights that differ (exact), or where its fitted
    stretches meet and along its lines, beyond the tolerance (timed)."""
    # (kind, previous, first and last point of the change, value before, value after)
    found: list[tuple[str, int, int, int, float, float]] = []
    if stretches is None:
        for k in (np.flatnonzero(s.values[1:] != s.values[:-1]) + 1).tolist():
            found.append((EXACT, k - 1, k, k, float(s.values[k - 1]), float(s.values[k])))
    else:
        for n, st in enumerate(stretches):
            b = st.start
            if n > 0 and abs(change(s.metric, fit[b - 1], fit[b])) > tolerance:
                found.append((STEP, b - 1, b, b, float(fit[b - 1]), float(fit[b])))
            if st.line and abs(change(s.metric, fit[b], fit[st.stop - 1])) > tolerance:
                found.append((DRIFT, b - 1, b, st.stop - 1, float(fit[b]), float(fit[st.stop - 1])))
    return [
        _change(
            where,
            s.cell_id,
            s.metric,
            kind,
            _direction(s.metric, before, after),
            (int(s.nights[prev]) if prev >= 0 else None, int(s.nights[first]), int(s.nights[last])),
            (before, after),
            sigma,
        )
        for kind, prev, first, last, before, after in found
    ]


def _change(
    where: _Where,
    cell_id: int,
    metric: str,
    kind: str,
    direction: str,
    nights: tuple[int | None, int, int],
    values: tuple[float, float],
    noise: float | None,
) -> Change:
    """A change of one cell, named: ``nights`` are the night before it (None: it began on the first),
    its first night and its last, as places among the read nights; ``values``: before and after."""
    cell = where.cells.loc[cell_id]
    prev, first, last = nights
    before, after = values
    return Change(
        cell_id=cell_id,
        cell=str(cell["cell"]),
        runner=str(cell["runner"]),
        policy=str(cell["policy"]),
        block_size=_int_or_none(cell["block_size"]),
        metric=metric,
        kind=kind,
        direction=direction,
        first_night=where.names[first],
        commit=where.commits[first],
        previous_night=where.names[prev] if prev is not None else None,
        previous_commit=where.commits[prev] if prev is not None else None,
        last_night=where.names[last],
        before=before,
        after=after,
        ratio=_ratio(before, after),
        noise=noise,
    )


def _int_or_none(value: object) -> int | None:
    try:
        return None if value is None or value != value else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _gate(s: _Series, fit: np.ndarray, ref_i: int, last_i: int, tolerance: float) -> tuple[float, float] | None:
    """(reference, latest) where the series is worse tonight than at the reference night beyond
    the tolerance: fitted values for a timed series, the values themselves otherwise."""
    if len(s.nights) == 0 or s.nights[-1] != last_i or ref_i >= last_i:
        return None  # not measured tonight (its status says why), or nothing since the reference
    at_ref = np.flatnonzero(s.nights <= ref_i)
    base = float(fit[at_ref[-1]] if len(at_ref) else fit[0])
    latest = float(fit[-1])
    return (base, latest) if worse(s.metric, change(s.metric, base, latest)) > tolerance else None


def _since(changes: list[Change]) -> str | None:
    """The first night of the change a regression began with: its first worsening change."""
    worse_first = [c for c in changes if c.direction == REGRESSION] or changes
    return worse_first[0].first_night if worse_first else None


def _status(history: History, where: _Where, ref_i: int) -> tuple[list[Change], list[Regressed]]:
    """Each cell going from ok to not ok (or back) between two nights it ran, and the cells ok at the
    reference night (or the last night before it they ran) and not ok tonight."""
    changes: list[Change] = []
    regressed: list[Regressed] = []
    last_i = len(where.names) - 1
    status = history.status.assign(at=lambda f: f["night"].map(where.index)).sort_values(["cell_id", "at"])
    for cell_id, sub in status.groupby("cell_id", sort=True):
        ok = (sub["status"] == OK).to_numpy()
        at = sub["at"].to_numpy(int)
        statuses = sub["status"].astype(str).tolist()
        cell = where.cells.loc[cell_id]
        for k in (np.flatnonzero(ok[1:] != ok[:-1]) + 1).tolist():
            direction = IMPROVEMENT if ok[k] else REGRESSION
            nights = (int(at[k - 1]), int(at[k]), int(at[k]))
            changes.append(_change(where, int(cell_id), STATUS, STATUS, direction, nights, (math.nan, math.nan), None))
        at_ref = np.flatnonzero(at <= ref_i)
        base_ok = bool(ok[at_ref[-1]] if len(at_ref) else ok[0])
        if at[-1] == last_i and ref_i < last_i and base_ok and not ok[-1]:
            since = next(
                (where.names[at[k]] for k in range(1, len(at)) if at[k] > ref_i and not ok[k] and ok[k - 1]), None
            )
            error = str(sub["error"].iloc[-1] or "")
            regressed.append(
                Regressed(
                    int(cell_id),
                    str(cell["cell"]),
                    STATUS,
                    where.names[ref_i],
                    where.names[last_i],
                    math.nan,
                    math.nan,
                    math.nan,
                    since,
                    f"ok → {statuses[-1]}" + (f" ({error})" if error else ""),
                )
            )
    return changes, regressed
