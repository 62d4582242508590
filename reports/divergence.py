"""Where two runs' step records first part ways, and why.

``first_divergence(a, b)`` compares two ``steps`` tables (DataFrames as read by
``harness.records.store.read_table``) step by step on the compared columns
(``allocated_blocks``, ``running``, ``waiting``, ``preempted`` by default)
and on their length, and returns the first difference with the context
needed to explain it, or ``None`` when they agree on every step. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas loads on first use, so `kvbench --help` stays quick
    import pandas as pd

DEFAULT_COLUMNS: tuple[str, ...] = ("allocated_blocks", "running", "waiting", "preempted")
# Shown beside the compared columns to explain a divergence.
CONTEXT_COLUMNS: tuple[str, ...] = (
    "t_s",
    "running",
    "waiting",
    "admitted",
    "finished",
    "preempted",
    "scheduled_tokens",
    "allocated_blocks",
    "used_positions",
    "prefix_hit_tokens",
    "evicted_blocks",
)


@dataclasses.dataclass(frozen=True)
class Divergence:
    step: int  # first step that differs (for a length difference: the first step only one run has)
    columns: tuple[str, ...]  # compared columns that differ there (empty for a length difference)
    a: dict[str, object]  # run A's values at that step (empty when A has no such step)
    b: dict[str, object]
    previous_a: dict[str, object]  # the step before (empty at step 0)
    previous_b: dict[str, object]
    steps_a: int
    steps_b: int
    reason: str

    def describe(self, name_a: str = "A", name_b: str = "B") -> str:
        lines = [f"first divergence at step {self.step}: {self.reason}"]
        keys = [c for c in CONTEXT_COLUMNS if c in self.a or c in self.b]
        keys += [c for c in self.columns if c not in keys]
        if keys:
            width = max(len(k) for k in keys)
            lines.append(
                f"  {'':{width}}  {name_a:>14}  {name_b:>14}" + ("   (previous step)" if self.previous_a else "")
            )
            for k in keys:
                mark = "*" if k in self.columns else " "
                prev = (
                    f"   {_fmt(self.previous_a.get(k)):>8} {_fmt(self.previous_b.get(k)):>8}" if self.previous_a else ""
                )
                lines.append(f"{mark} {k:{width}}  {_fmt(self.a.get(k)):>14}  {_fmt(self.b.get(k)):>14}{prev}")
        lines.append(f"  steps: {self.steps_a} vs {self.steps_b}")
        return "\n".join(lines)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("step", kind="stable").reset_index(drop=True)


def _row(df: pd.DataFrame, i: int) -> dict[str, Any]:
    if i < 0 or i >= len(df):
        return {}
    rec = df.iloc[i]
    return {c: _py(rec[c]) for c in CONTEXT_COLUMNS + tuple(df.columns) if c in df.columns and c != "run_id"}


def _py(v: object) -> object:
    if hasattr(v, "item"):
        v = v.item()  # numpy scalar -> Python
    if isinstance(v, float) and v != v:
        return None
    return v


def explain(columns: Sequence[str], a: dict[str, object], b: dict[str, object]) -> str:
    """A one-line reading of why the first differing step differs."""
    parts = [f"{c} {_fmt(a.get(c))} vs {_fmt(b.get(c))}" for c in columns]
    why = ""
    if a.get("preempted") != b.get("preempted"):
        why = "one run preempted where the other did not: a running request could not get a block in one of them"
    elif a.get("admitted") != b.get("admitted"):
        why = (
            "they admitted different numbers of waiting requests (admission gate: token budget, "
            "max_num_seqs, or whether the head of the queue fits)"
        )
    elif a.get("finished") != b.get("finished") and "running" in columns:
        why = "different requests finished in the previous step"
    elif a.get("prefix_hit_tokens") != b.get("prefix_hit_tokens"):
        why = "prefix-cache hits differ at admission"
    elif a.get("scheduled_tokens") != b.get("scheduled_tokens"):
        why = "the same batch was given different token counts (chunking / token budget)"
    elif a.get("evicted_blocks") != b.get("evicted_blocks"):
        why = "cached blocks were evicted differently"
    elif "allocated_blocks" in columns:
        why = (
            "same admissions and token counts but different block counts: allocation granularity, "
            "prefix sharing or free order differ"
        )
    return "; ".join(parts) + (f" ({why})" if why else "")


def first_divergence(a: pd.DataFrame, b: pd.DataFrame, columns: Sequence[str] = DEFAULT_COLUMNS) -> Divergence | None:
    """The first step where ``a`` and ``b`` differ on ``columns`` or in length; None if identical."""
    columns = tuple(columns)
    for name, df in (("A", a), ("B", b)):
        missing = [c for c in ("step",) + columns if c not in df.columns]
        if missing:
            raise ValueError(f"steps table {name} lacks column(s): {', '.join(missing)}")
    a, b = _ordered(a), _ordered(b)
    n = min(len(a), len(b))
    if n:
        import pandas as pd

        eq = pd.Series(True, index=range(n))
        for c in columns:
            va = a[c].iloc[:n].reset_index(drop=True)
            vb = b[c].iloc[:n].reset_index(drop=True)
            eq &= (va == vb) | (va.isna() & vb.isna())
        bad = (~eq).to_numpy().nonzero()[0]
        if len(bad):
            i = int(bad[0])
            ra, rb = _row(a, i), _row(b, i)
            differing = tuple(c for c in columns if ra.get(c) != rb.get(c))
            return Divergence(
                step=int(ra.get("step", i)),
                columns=differing,
                a=ra,
                b=rb,
                previous_a=_row(a, i - 1),
                previous_b=_row(b, i - 1),
                steps_a=len(a),
                steps_b=len(b),
                reason=explain(differing, ra, rb),
            )
    if len(a) != len(b):
        longer = "A" if len(a) > len(b) else "B"
        ra, rb = _row(a, n), _row(b, n)
        return Divergence(
            step=n,
            columns=(),
            a=ra,
            b=rb,
            previous_a=_row(a, n - 1),
            previous_b=_row(b, n - 1),
            steps_a=len(a),
            steps_b=len(b),
            reason=(f"identical for {n} steps, then only {longer} continues ({len(a)} vs {len(b)} steps)"),
        )
    return None
