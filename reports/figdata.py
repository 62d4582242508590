"""Pure helpers that pick what each figure shows, and the arithmetic figure 2 draws.

``cells`` is the per-cell table of ``reports.tables.summary``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MAX_GROUP_PANELS = 6
MAX_TIMELINES = 9
PREFERRED_BLOCK = 16  # paged cells at several block sizes: timelines and sweeps show the one nearest this
WASTE_BLOCKS = (8, 16, 32)
MAX_PLOT_POINTS = 4000


def first_groups(cells: pd.DataFrame) -> tuple[list[tuple[int, pd.DataFrame]], int]:
    """The first ``MAX_GROUP_PANELS`` comparison groups (in table order) and how many are left out."""
    groups = list(cells.groupby("group", sort=True))
    return groups[:MAX_GROUP_PANELS], max(0, len(groups) - MAX_GROUP_PANELS)


def one_block_size(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (group, runner, policy), only the block size nearest ``PREFERRED_BLOCK`` (the smaller on a tie)."""
    if cells.empty:
        return cells
    dist = (np.log2(cells["block_size"].clip(lower=1).astype(float)) - np.log2(PREFERRED_BLOCK)).abs()
    ranked = cells.assign(_d=dist).sort_values(["_d", "block_size"], kind="stable")
    keep = ranked.drop_duplicates(["group", "runner", "policy"]).index
    return cells.loc[cells.index.isin(keep)]


def primary_group(cells: pd.DataFrame, steps: pd.DataFrame) -> int | None:
    """The comparison group with the most ok cells that have step records; on a tie, the one under
    the most memory pressure (least free budget on average), then the first."""
    if cells.empty or steps.empty:
        return None
    have = set(steps["run_id"].unique())
    ok = cells[(cells["ok"] > 0) & cells["run_id"].isin(have)]
    if ok.empty:
        return None
    stats = ok.groupby("group").agg(n=("run_id", "size"), free=("free_frac", "mean")).reset_index()
    stats = stats.sort_values(["n", "free", "group"], ascending=[False, True, True], na_position="last")
    return int(stats["group"].iloc[0])


def timeline_cells(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The cells whose step records figures 3 and 4 draw: the primary group, one block size per policy."""
    group = primary_group(cells, steps)
    if group is None:
        return cells.iloc[0:0]
    have = set(steps["run_id"].unique())
    sub = cells[(cells["group"] == group) & (cells["ok"] > 0) & cells["run_id"].isin(have)]
    return one_block_size(sub).head(MAX_TIMELINES)


def selection_note(cells: pd.DataFrame, picked: pd.DataFrame) -> str:
    """Which runs a per-group figure shows, and what it leaves out."""
    group = picked["group"].iloc[0]
    in_group = cells[(cells["group"] == group) & (cells["ok"] > 0)]
    notes = [f"Comparison group: {picked['group_label'].iloc[0]}."]
    if len(in_group) > len(picked):
        notes.append(f"Shown: {len(picked)} of its {len(in_group)} ok runs (paged policies at the block size "
                     f"nearest {PREFERRED_BLOCK}; figure 6 covers the others).")
    others = cells["group"].nunique() - 1
    if others:
        notes.append(f"{others} other comparison group(s) are in the tables only.")
    notes.append("Time series from the first ok repetition of each cell.")
    return " ".join(notes)


def thin(steps: pd.DataFrame, max_points: int = MAX_PLOT_POINTS) -> pd.DataFrame:
    """Every k-th step (and the last), so a long run plots quickly; the shape is kept."""
    if len(steps) <= max_points:
        return steps
    k = -(-len(steps) // max_points)
    return pd.concat([steps.iloc[::k], steps.iloc[[-1]]])


def rate_families(cells: pd.DataFrame) -> list[pd.DataFrame]:
    """Ok cells grouped by everything but the workload's rate; only groups run at two or more rates."""
    ok = cells[(cells["ok"] > 0) & cells["rate"].notna()]
    keys = ["family", "model", "kv_dtype", "budget_bytes", "max_model_len", "scheduler"]
    out = []
    for _, fam in ok.groupby(keys, sort=False):
        if fam["rate"].nunique() >= 2:
            out.append(one_block_size(fam))
    return out


def block_size_lines(cells: pd.DataFrame) -> list[pd.DataFrame]:
    """Per (group, runner, paged policy): its cells when run at two or more block sizes, by block size.
    ``paged`` only when it has such lines (``paged-prefix`` and others otherwise), to keep the figure legible."""
    ok = cells[(cells["ok"] > 0) & cells["policy"].isin(("paged", "paged-prefix"))]
    lines = [sub.sort_values("block_size") for _, sub in ok.groupby(["group", "runner", "policy"], sort=True)
             if sub["block_size"].nunique() >= 2]
    plain = [line for line in lines if line["policy"].iloc[0] == "paged"]
    return (plain or lines)[:10]


# -- figure 2: arithmetic over lengths ------------------------------------------

def unused_fraction(lengths: np.ndarray, block_size: int) -> np.ndarray:
    """Unused share of the positions paged allocation holds for a sequence of each length:
    (⌈L/B⌉·B − L) / (⌈L/B⌉·B). 35 tokens at block 16: (48 − 35) / 48 = 13/48."""
    lengths = np.asarray(lengths, dtype=np.int64)
    allocated = -(-lengths // block_size) * block_size
    return (allocated - lengths) / allocated


def recorded_waste(lengths: np.ndarray, sizes: list[int]) -> list[tuple[int, float]]:
    """Per block size: Σ unused / Σ allocated positions over the given final lengths."""
    out = []
    for bs in sizes:
        allocated = -(-lengths // bs) * bs
        out.append((bs, float((allocated - lengths).sum() / allocated.sum())))
    return out


def final_lengths(runs: pd.DataFrame, requests: pd.DataFrame) -> np.ndarray:
    """prompt + output of every request of each distinct workload (one run's requests per workload)."""
    if requests.empty or runs.empty:
        return np.array([], dtype=np.int64)
    have = set(requests["run_id"].unique())
    firsts = runs[runs["run_id"].isin(have)].drop_duplicates("workload_id")["run_id"]
    req = requests[requests["run_id"].isin(set(firsts))]
    return (req["prompt_len"] + req["output_len"]).to_numpy(dtype=np.int64)


def workload_count(runs: pd.DataFrame, requests: pd.DataFrame) -> int:
    if requests.empty:
        return 0
    return int(runs[runs["run_id"].isin(set(requests["run_id"]))]["workload_id"].nunique())


def waste_block_sizes(runs: pd.DataFrame) -> list[int]:
    """8, 16, 32 and every paged block size in the records (up to 256)."""
    paged = runs.loc[runs["policy"].isin(("paged", "paged-prefix")), "block_size"] if len(runs) else []
    return sorted(set(WASTE_BLOCKS) | {int(b) for b in paged if 1 < int(b) <= 256})
