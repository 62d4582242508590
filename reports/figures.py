"""The report's figures: one function per figure, each a ``Plot``.

A figure is drawn only when the records hold what it needs; otherwise its
``Plot`` has ``figure=None`` and a ``note`` saying why. Figures are built with
``matplotlib.figure.Figure`` (Agg, no pyplot state), so they are safe in any
process. Which runs each figure shows is chosen by the pure helpers in
``reports.figdata``.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter, NullLocator

from ..harness.spec.capabilities import is_contiguous
from ..harness.spec.units import format_bytes
from . import figdata
from .cpu_tier import NO_TIER, cpu_tier_table
from .decomposition import gap_sentence
from .labels import figure_label, throughput_note, time_axis_label, workload_tag
from .prefix_reuse import LINE_KEYS

COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("token_states_frac", "token states (K/V of computed tokens)", "#3a8a3a"),
    ("reservation_frac", "reservation (reserved, filled later)", "#f0a030"),
    ("internal_frag_frac", "internal fragmentation (never filled)", "#d1495b"),
    ("external_frag_frac", "external fragmentation (free, unusable)", "#8e5ea2"),
    ("free_frac", "free", "#dddddd"),
)
STEP_PARTS: tuple[tuple[str, str, str], ...] = (
    ("used_positions", "used (token states)", "#3a8a3a"),
    ("reserved_positions", "reserved, filled later", "#f0a030"),
    ("internal_frag_positions", "internal fragmentation", "#d1495b"),
)
POLICY_COLORS = {
    "contiguous-max": "tab:red",
    "contiguous-pow2": "tab:orange",
    "contiguous-oracle": "tab:olive",
    "virtual-contiguous": "tab:purple",
    "paged": "tab:blue",
    "paged-prefix": "tab:cyan",
}
RUNNER_STYLES = {"sim": "-", "vllm-sched": "--", "torch": "-.", "vllm": ":"}
SEED_LEN, SEED_BLOCK = 35, 16  # the worked example: 3 blocks, 48 positions, 13 unused


# The figures in the order the report shows them; text names a figure by what it draws.
FIGURES: tuple[str, ...] = (
    "memory-breakdown",
    "last-block-waste",
    "allocation-over-time",
    "running-requests",
    "rate-sweep",
    "block-size-ablation",
    "decomposition",
    "swept-curves",
    "slo-latency",
    "goodput",
    "prefix-reuse",
)
# Figures drawn only where the records hold what they draw, after ``FIGURES`` (a report without it
# lists none of them, not even as not drawn).
OPTIONAL_FIGURES: tuple[str, ...] = ("cpu-tier",)


@dataclasses.dataclass(frozen=True)
class Plot:
    name: str  # what it draws (one of ``FIGURES`` or ``OPTIONAL_FIGURES``)
    title: str
    figure: Figure | None
    note: str  # a caption when drawn, the reason when not

    @property
    def number(self) -> int:
        """Its place in the report."""
        return (*FIGURES, *OPTIONAL_FIGURES).index(self.name) + 1

    @property
    def stem(self) -> str:
        """Its file stem under report/: its place, then its name (``8-swept-curves``)."""
        return f"{self.number}-{self.name}"


def _wrap(text: str, width: int = 120) -> str:
    return "\n".join(textwrap.wrap(text, width))


def _color(policy: str) -> str:
    return POLICY_COLORS.get(policy, "tab:gray")


def _label(row: dict, multi_runner: bool) -> str:
    return figure_label(row, with_runner=multi_runner)


# 1 -----------------------------------------------------------------------------
def memory_breakdown(cells: pd.DataFrame) -> Plot:
    name, title = "memory-breakdown", "KV memory breakdown per policy"
    ok = cells[(cells["ok"] > 0) & cells["token_states_frac"].notna()] if len(cells) else cells
    if ok.empty:
        return Plot(name, title, None, "no ok run has a memory breakdown")
    groups, omitted = figdata.first_groups(ok)
    multi = ok["runner"].nunique() > 1
    fig = Figure(figsize=(11, 1.2 + 3.4 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, (_, sub) in zip(axes, groups):
        x = np.arange(len(sub))
        bottom = np.zeros(len(sub))
        for col, label, color in COMPONENTS:
            vals = 100 * sub[col].fillna(0).to_numpy(dtype=float)
            bars = ax.bar(x, vals, bottom=bottom, color=color, label=label, edgecolor="white", linewidth=0.5)
            for bar, v in zip(bars, vals):
                if v >= 4 and col != "free_frac":
                    ax.text(
                        bar.get_x() + bar.get_width() / 2,
                        bar.get_y() + v / 2,
                        f"{v:.1f}%",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if col != "reservation_frac" else "black",
                    )
            bottom += vals
        ax.set_xticks(x, [_label(r, multi) for r in sub.to_dict("records")], rotation=20, ha="right", fontsize=9)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of KV budget")
        ax.set_title(_wrap(sub["group_label"].iloc[0]), fontsize=9, loc="left")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    fig.suptitle(
        "Where the KV budget goes: time-weighted mean share of the budget per policy (vLLM paper Figure 2 style)",
        fontsize=11,
    )
    note = (
        "Each bar is one run; segments are time-weighted means over the run as a share of the KV budget. "
        "Token states is useful memory; reservation, internal and external fragmentation are waste."
    )
    failed = int((cells["ok"] == 0).sum()) if len(cells) else 0
    if failed:
        note += f" {failed} cell(s) with no ok run are not drawn (see the tables)."
    if omitted:
        note += f" {omitted} more comparison group(s) are in the tables only."
    swept = figdata.swept_axes(ok)
    if swept:  # one bar group per value reads poorly across a sweep: say where the curves are
        note += (
            f" The swept {', '.join(a.label for a in swept)} "
            f"{'is' if len(swept) == 1 else 'are'} drawn as curves in the swept-curves figure."
        )
    return Plot(name, title, fig, note)


# 2 -----------------------------------------------------------------------------
def last_block_waste(runs: pd.DataFrame, requests: pd.DataFrame) -> Plot:
    name, title = "last-block-waste", "Unused share of paged allocation vs sequence length (arithmetic)"
    lengths = figdata.final_lengths(runs, requests)
    if lengths.size == 0:
        return Plot(name, title, None, "the records hold no requests, so there are no sequence lengths to use")
    sizes = figdata.waste_block_sizes(runs)
    top = max(64, int(lengths.max()))
    grid = np.arange(1, top + 1)
    fig = Figure(figsize=(11, 6.2), layout="constrained")
    ax, hist = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    for i, bs in enumerate(sizes):
        ax.plot(grid, 100 * figdata.unused_fraction(grid, bs), lw=1.2, color=f"C{i}", label=f"block size {bs}")
    seed = 100 * float(figdata.unused_fraction(np.array([SEED_LEN]), SEED_BLOCK)[0])
    ax.plot([SEED_LEN], [seed], "o", ms=9, mfc="none", mec="black", mew=2, zorder=5)
    blocks = -(-SEED_LEN // SEED_BLOCK)
    held = blocks * SEED_BLOCK
    ax.annotate(
        f"worked example: {SEED_LEN} tokens, block {SEED_BLOCK}\n"
        f"→ {blocks} blocks = {held} positions, {held - SEED_LEN} unused = {held - SEED_LEN}/{held} = {seed:.1f}%",
        (SEED_LEN, seed),
        xytext=(SEED_LEN * 1.6, 62),
        fontsize=9,
        arrowprops={"arrowstyle": "->"},
        bbox={"facecolor": "white", "edgecolor": "#999"},
    )
    ax.set_xscale("log", base=2)
    ticks = [2**k for k in range(0, int(np.log2(top)) + 1)]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.set_ylim(0, 100)
    ax.set_ylabel("unused share of allocated positions, %\n(last block only partly filled)")
    ax.legend(fontsize=9, loc="upper right")
    summary = figdata.recorded_waste(lengths, sizes)
    bins = np.unique(np.geomspace(1, top + 1, 60).astype(int))
    hist.hist(lengths, bins=bins, color="#777")
    hist.set_ylabel("requests (count)")
    hist.set_title(
        "final lengths of the recorded requests; their unused share (Σ unused / Σ allocated):\n"
        + ", ".join(f"block {bs}: {100 * w:.2f}%" for bs, w in summary),
        fontsize=9,
        loc="left",
    )
    hist.set_xlabel("sequence length at finish = prompt + output tokens (log scale)")
    fig.suptitle(
        "Paged allocation wastes only the unfilled tail of the last block — computed from lengths, not measured",
        fontsize=11,
    )
    note = (
        "Curves: (⌈L/B⌉·B − L) / (⌈L/B⌉·B) for every length L on a grid; bottom: the final lengths of the "
        f"requests in these records ({lengths.size} requests from {figdata.workload_count(runs, requests)} "
        "workload(s)). This is the waste at a request's final length; while it runs, its last block also holds "
        "positions that are filled later (reservation, in the memory-breakdown figure)."
    )
    return Plot(name, title, fig, note)


# 3 -----------------------------------------------------------------------------
def allocation_over_time(cells: pd.DataFrame, steps: pd.DataFrame) -> Plot:
    name, title = "allocation-over-time", "Allocated vs used KV positions over time"
    picked = figdata.timeline_cells(cells, steps)
    if picked.empty:
        return Plot(name, title, None, "no ok run has step records")
    multi = cells["runner"].nunique() > 1
    n = len(picked)
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig = Figure(figsize=(4.2 * ncols + 1, 2.8 * nrows + 1.2), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).ravel()
    for ax, row in zip(axes, picked.to_dict("records")):
        st = figdata.thin(steps[steps["run_id"] == row["run_id"]].sort_values("step"))
        t = st["t_s"].to_numpy(dtype=float)
        ax.stackplot(
            t,
            *[st[c].to_numpy(dtype=float) for c, _, _ in STEP_PARTS],
            colors=[c for _, _, c in STEP_PARTS],
            labels=[lab for _, lab, _ in STEP_PARTS],
            step="post",
        )
        ax.axhline(row["budget_positions"], color="black", ls="--", lw=1, label="KV budget")
        ax.set_title(_label(row, multi), fontsize=10)
        ax.set_xlabel(time_axis_label(row["clock"]), fontsize=8)
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes[::ncols]:
        ax.set_ylabel("KV positions")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=9, frameon=False)
    fig.suptitle(
        _wrap("Allocated (top of the stack) vs used KV positions over time — " + picked["group_label"].iloc[0], 130),
        fontsize=10,
    )
    return Plot(name, title, fig, figdata.selection_note(cells, picked))


# 4 -----------------------------------------------------------------------------
def running_requests(cells: pd.DataFrame, steps: pd.DataFrame) -> Plot:
    name, title = "running-requests", "Running requests over time, mean and peak per policy"
    picked = figdata.timeline_cells(cells, steps)
    if picked.empty:
        return Plot(name, title, None, "no ok run has step records")
    multi = cells["runner"].nunique() > 1
    group = cells[(cells["group"] == picked["group"].iloc[0]) & (cells["ok"] > 0)]
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax, bars = fig.subplots(1, 2, width_ratios=(3, 2))
    for row in picked.to_dict("records"):
        st = figdata.thin(steps[steps["run_id"] == row["run_id"]].sort_values("step"))
        ax.step(
            st["t_s"],
            st["running"],
            where="post",
            color=_color(row["policy"]),
            ls=RUNNER_STYLES.get(row["runner"], "-"),
            lw=1.3,
            label=_label(row, multi),
        )
    ax.set_xlabel(time_axis_label(picked["clock"].iloc[0]))
    ax.set_ylabel("running requests (in the batch)")
    ax.legend(fontsize=8)
    ax.set_title("running requests per step", fontsize=10)
    y = np.arange(len(group))
    bars.barh(y + 0.2, group["peak_running"], height=0.4, color="#bbbbbb", label="peak")
    bars.barh(
        y - 0.2,
        group["mean_running"],
        height=0.4,
        color=[_color(p) for p in group["policy"]],
        label="time-weighted mean",
    )
    for yy, m, p in zip(y, group["mean_running"], group["peak_running"]):
        bars.text(p, yy + 0.2, f" {p:.0f}", va="center", fontsize=8)
        bars.text(m, yy - 0.2, f" {m:.1f}", va="center", fontsize=8)
    bars.set_yticks(y, [_label(r, multi) for r in group.to_dict("records")], fontsize=9)
    bars.invert_yaxis()
    bars.set_xlabel("running requests (mean is time-weighted)")
    bars.set_title("mean (coloured) and peak (grey) per run", fontsize=10)
    peak = group["peak_running"].max()  # null for an attached server's runs: nothing seen inside
    bars.set_xlim(0, 1.15 * max(0.0 if pd.isna(peak) else float(peak), 1.0))
    fig.suptitle(
        _wrap("Batch capacity: how many requests run at once — " + group["group_label"].iloc[0], 130), fontsize=10
    )
    return Plot(name, title, fig, figdata.selection_note(cells, picked))


# 5 -----------------------------------------------------------------------------
def rate_sweep(cells: pd.DataFrame) -> Plot:
    name, title = "rate-sweep", "Preemptions and throughput vs request rate"
    families = figdata.rate_families(cells)
    if not families:
        return Plot(name, title, None, "no request-rate sweep: no workload was run at two or more rates")
    shown = families[:3]
    multi = cells["runner"].nunique() > 1
    fig = Figure(figsize=(max(4.6 * len(shown) + 1, 8), 7.4), layout="constrained")
    axes = fig.subplots(2, len(shown), squeeze=False)
    swept = pd.concat(shown)
    tput = throughput_note(set(swept["clock"]), set(swept["runner"]))
    for col, fam in enumerate(shown):
        for (_, _), line in fam.groupby(["runner", "policy"], sort=False):
            line = line.sort_values("rate")
            r0 = line.iloc[0].to_dict()
            kw = {
                "color": _color(r0["policy"]),
                "ls": RUNNER_STYLES.get(r0["runner"], "-"),
                "marker": "o",
                "label": _label(r0, multi),
            }
            axes[0, col].plot(line["rate"], line["preemptions"], **kw)
            axes[1, col].plot(line["rate"], line["tokens_per_s"], **kw)
        axes[0, col].set_title(_wrap(fam["family_label"].iloc[0], 55), fontsize=9)
        for ax in axes[:, col]:
            ax.set_xscale("log")
            ax.set_xticks(sorted(set(fam["rate"])), [f"{r:g}" for r in sorted(set(fam["rate"]))])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(alpha=0.3)
        axes[0, col].yaxis.set_major_locator(MaxNLocator(integer=True))
        axes[1, col].set_xlabel("request arrival rate, requests/s (log scale)")
    axes[0, 0].set_ylabel("preemptions per run (count)")
    axes[1, 0].set_ylabel(_wrap(f"throughput: {tput}", 40))
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Request-rate sweep: preemptions (top) and throughput (bottom) per policy", fontsize=11)
    note = f"One line per policy; paged policies at the block size nearest {figdata.PREFERRED_BLOCK}. "
    if len(families) > len(shown):
        note += f"{len(families) - len(shown)} more swept workload(s) are in the tables only."
    return Plot(name, title, fig, note.strip())


# 6 -----------------------------------------------------------------------------
def block_size_ablation(cells: pd.DataFrame) -> Plot:
    name, title = "block-size-ablation", "Block-size ablation: waste, running requests and preemptions"
    lines = figdata.block_size_lines(cells)
    if not lines:
        return Plot(name, title, None, "no block-size sweep: no paged policy was run at two or more block sizes")
    fig = Figure(figsize=(13, 4.8), layout="constrained")
    waste_ax, run_ax, pre_ax = fig.subplots(1, 3)
    multi = cells["runner"].nunique() > 1
    for i, line in enumerate(lines):
        r0 = line.iloc[0].to_dict()
        label = f"{_label({**r0, 'block_size': 1}, multi)}: {r0['workload']}"
        kw = {"marker": "o", "color": f"C{i % 10}", "ls": RUNNER_STYLES.get(r0["runner"], "-"), "label": label}
        waste = line["reservation_frac"] + line["internal_frag_frac"] + line["external_frag_frac"]
        waste_ax.plot(line["block_size"], 100 * waste, **kw)
        run_ax.plot(line["block_size"], line["mean_running"], **kw)
        pre_ax.plot(line["block_size"], line["preemptions"], **kw)
    pre_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    sizes = sorted({int(b) for line in lines for b in line["block_size"]})
    for ax, ylab in (
        (waste_ax, "waste, % of KV budget\n(reservation + internal + external)"),
        (run_ax, "mean running requests"),
        (pre_ax, "preemptions per run (count)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("block size, tokens per block (log scale)")
        ax.set_ylabel(ylab)
        ax.grid(alpha=0.3)
    fig.legend(*waste_ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    fig.suptitle(
        "Block-size ablation: waste, capacity and preemptions against the paged block size "
        "(everything else held fixed along a line)",
        fontsize=11,
    )
    return Plot(
        name,
        title,
        fig,
        "One line per comparison group and runner, for the paged policy (paged-prefix "
        "when only it was swept); everything but the block size is held fixed along a line.",
    )


# 7 -----------------------------------------------------------------------------
def _decomp_group(r: dict) -> str:
    block = f", paged block {int(r['block_size'])}" if r["block_size"] == r["block_size"] and r["block_size"] else ""
    return f"{workload_tag(r)}, KV {r['kv_dtype']}, budget {format_bytes(r['budget_bytes'])}{block}"


METRIC_TITLES = {
    "tokens_per_s": "throughput: generated tokens/s (run's clock)",
    "wall_tokens_per_s": "measured throughput: generated tokens per second of step time",
    "mean_running": "mean running requests",
    "peak_running": "peak running requests",
}


def _decomp_key(r: dict) -> tuple:
    return (r["workload_id"], r["kv_dtype"], r["budget_bytes"], r["block_size"])


DECOMP_FACTORS = ("naive", "allocation", "runtime", "vllm_allocation")


def _unit_label(r: dict) -> str:
    """The contiguous baselines' unit for a tick: 'positions', 'blocks' or, when they differ, each runner's."""
    units = {k: r.get(f"{k}_contiguous_unit") for k in ("torch", "vllm")}
    present = {k: u for k, u in units.items() if isinstance(u, str)}
    if not present:
        return ""
    if len(set(present.values())) == 1:
        return f"\n(in {next(iter(present.values()))}s)"
    return "\n(" + ", ".join(f"{k}: {u}s" for k, u in present.items()) + ")"


def decomposition(decomp: pd.DataFrame) -> Plot:
    name, title = "decomposition", "Decomposition: allocation effect × runtime effect"
    rows = decomp[decomp[list(DECOMP_FACTORS)].notna().any(axis=1)] if len(decomp) else decomp
    if rows.empty:
        return Plot(
            name,
            title,
            None,
            "no torch or vllm runs to decompose (needs torch/paged with torch/contiguous-*, "
            "vllm/paged for the runtime effect, or vllm/paged with vllm/contiguous-*)",
        )
    # The allocation effect inside vLLM only where some row measured it: a set of bars all n/a says nothing.
    in_vllm = bool(rows["vllm_allocation"].notna().any())
    metrics: Sequence[str] = [m for m in dict.fromkeys(rows["metric"])]
    groups = rows.drop_duplicates(["workload_id", "kv_dtype", "budget_bytes", "block_size"])
    # Several groups: a letter on each tick, spelled out once in the heading (long labels collide).
    letters = {_decomp_key(g): chr(ord("A") + i) for i, g in enumerate(groups.to_dict("records"))}
    per_metric = int(rows.groupby("metric").size().max())
    ncols = 2 if len(metrics) > 1 else 1
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(ncols * max(4.2, 1.6 * per_metric) + 1, 3.6 * nrows + 1.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).ravel()
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    parts = (
        ("naive", "naive: vllm/paged ÷ torch/contiguous", "#555555"),
        ("allocation", "allocation effect: torch/paged ÷ torch/contiguous", "tab:blue"),
        ("runtime", "runtime effect: vllm/paged ÷ torch/paged", "tab:orange"),
    ) + (
        (("vllm_allocation", "allocation effect in vLLM: vllm/paged ÷ vllm/contiguous", "tab:green"),)
        if in_vllm
        else ()
    )
    width = 0.8 / len(parts)
    shown = [col for col, _, _ in parts]
    finite = rows[[*shown, "sim_allocation"]].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    lo, hi = min(0.8, finite.min() / 1.4), max(1.25, finite.max() * 1.6)
    for ax, metric in zip(axes, metrics):
        sub = rows[rows["metric"] == metric].reset_index(drop=True)
        x = np.arange(len(sub))
        for j, (col, label, color) in enumerate(parts):
            vals = sub[col].to_numpy(dtype=float)
            xs = x + (j - (len(parts) - 1) / 2) * width
            # Bars grow from 1 (no change): up for a gain, down for a loss, on a log axis.
            ax.bar(xs, np.nan_to_num(vals, nan=1.0) - 1.0, bottom=1.0, width=width, color=color, label=label)
            for xx, v in zip(xs, vals):
                up = not v == v or v >= 1
                ax.text(
                    xx,
                    (v * (1.05 if up else 0.97)) if v == v else 1.0,
                    "n/a" if v != v else f"{v:.2f}×",
                    ha="center",
                    va="bottom" if up else "top",
                    fontsize=8 if len(parts) < 4 else 7,
                )
        sim = sub["sim_allocation"].to_numpy(dtype=float)
        if np.isfinite(sim).any():
            ax.plot(x, sim, "D", color="black", ms=6, label="sim allocation effect (no runtime at all)")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}×" if round(v, 6) in (0.5, 2, 3, 5) else ""))
        ax.set_xticks(
            x,
            [
                (f"{letters[_decomp_key(r)]}: " if len(groups) > 1 else "")
                + f"vs {r['baseline'] or '(no contiguous run)'}"
                + _unit_label(r)
                for r in sub.to_dict("records")
            ],
            fontsize=8,
        )
        ax.set_title(METRIC_TITLES.get(metric, metric), fontsize=10)
    for ax in axes[::ncols]:
        ax.set_ylabel("ratio (log scale; 1× = no change)")
    handles, labels = axes[len(metrics) - 1].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("sim"))  # bars first, the diamond last
    fig.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="outside lower center",
        ncols=2,
        fontsize=9,
        frameon=False,
    )
    heading = "What a naive vLLM-vs-contiguous comparison shows, split into allocation effect × runtime effect"
    if len(groups) == 1:
        heading += f"\nworkload {_decomp_group(groups.iloc[0].to_dict())}; models: {groups.iloc[0]['models']}"
    else:
        heading += "".join(
            f"\n{letters[_decomp_key(g)]} = workload {_decomp_group(g)}" for g in groups.to_dict("records")
        )
    fig.suptitle(heading, fontsize=11)
    missing = bool(rows[shown].isna().to_numpy().any())
    caption = (
        "Per workload, KV precision and budget: naive = allocation × runtime exactly. "
        + ("n/a: the runs for that factor are missing (never estimated). " if missing else "")
        + "On the run's clock torch and vllm take the same steps, so there the runtime factor is 1; "
        "measured throughput carries the runtime effect. Diamonds: the same allocation ratio from the "
        "simulator, where no runtime differs."
        + (
            f" Green: the allocation effect measured inside vLLM. {gap_sentence(decomp)}"
            if in_vllm
            else " The allocation effect inside vLLM is not drawn: no vllm/contiguous-* run beside vllm/paged."
        )
    )
    return Plot(name, title, fig, caption)


# 8 -----------------------------------------------------------------------------
MAX_CURVE_AXES = 3  # rows of panels; more and the figure no longer fits a window
# One per workload (or other setting) that tells lines of one policy apart.
CURVE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
TICK_CHAR_SHARE = 0.03  # of a ~2.5 in panel's width, one 8 pt character of a tick label
LATENCY_COLUMN = "normalized_latency_mean_s"
# Normalized latency (a request's latency ÷ its output tokens) in the units of the run's clock.
LATENCY_UNITS = {
    "roofline": "simulated s per output token\n(roofline clock)",
    "tables": "simulated s per output token\n(tables clock)",
    "profile": "simulated s per output token\n(profile clock)",
    "measured": "measured s per output token",
}


@dataclasses.dataclass(frozen=True)
class CurvePanel:
    """One column of the swept-curves figure: a metric of the per-cell table against the swept axis."""

    column: str
    title: str
    ylabel: str
    scale: float = 1.0  # fractions are drawn as %
    clocks: tuple[str, ...] | None = None  # only lines on these clocks (None: every line)


def _curve_panels(lines: list[pd.DataFrame]) -> list[CurvePanel]:
    """Mean running, token states and throughput always; normalized latency when some line has
    it on a clock in seconds (on the steps clock it counts steps, which would not share an axis)."""
    clocks = sorted({str(c) for line in lines for c in line["clock"]})
    timed = [c for c in clocks if c != "steps"]
    runners = {r for line in lines for r in line["runner"]}
    panels = [
        CurvePanel("mean_running", "mean running requests", "requests in the batch\n(time-weighted mean)"),
        CurvePanel(
            "token_states_frac",
            "token states, % of KV budget",
            "% of KV budget holding token states\n(time-weighted mean)",
            scale=100.0,
        ),
    ]
    if any(
        LATENCY_COLUMN in line and line.loc[line["clock"].isin(timed), LATENCY_COLUMN].notna().any() for line in lines
    ):
        unit = (
            LATENCY_UNITS.get(timed[0], "s per output token")
            if len(timed) == 1
            else "s per output token (several clocks)"
        )
        panels.append(CurvePanel(LATENCY_COLUMN, "normalized latency (mean)", unit, clocks=tuple(timed)))
    panels.append(CurvePanel("tokens_per_s", "throughput", _wrap(throughput_note(set(clocks), runners), 38)))
    return panels


def _spaced_ticks(values: list[float], log: bool, min_gap: float) -> list[float]:
    """The values to label: each at least ``min_gap`` (a share of the axis) from the last kept,
    so labels never run into each other; the first and the last always."""
    if len(values) <= 2:
        return values
    pos = np.log(values) if log else np.asarray(values, dtype=float)
    span = float(pos[-1] - pos[0]) or 1.0
    kept = [0]
    for i in range(1, len(values)):
        if (pos[i] - pos[kept[-1]]) / span >= min_gap:
            kept.append(i)
    if kept[-1] != len(values) - 1:  # the last value is labelled; its crowded neighbour is not
        if len(kept) > 1:
            kept.pop()
        kept.append(len(values) - 1)
    return [values[i] for i in kept]


def _curve_x(ax: Axes, axis: figdata.SweptAxis) -> None:
    if axis.log:
        ax.set_xscale("log")
    widest = max(len(axis.tick_label(v)) for v in axis.values)
    ticks = _spaced_ticks(axis.values, axis.log, min(0.45, TICK_CHAR_SHARE * (widest + 1)))
    ax.set_xticks(ticks, [axis.tick_label(v) for v in ticks])
    ax.xaxis.set_minor_locator(NullLocator())  # log minor ticks would sit between the measured values
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(axis.axis_title(), fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)


def _log_minor_label(value: float, _: object) -> str:
    """Label the 2s and 5s between the powers of ten; the other minor ticks stay bare."""
    lead = round(value / 10 ** np.floor(np.log10(value)), 6) if value > 0 else 0
    return f"{value:g}" if lead in (2, 5) else ""


def _curve_panel(
    ax: Axes,
    panel: CurvePanel,
    axis: figdata.SweptAxis,
    lines: list[pd.DataFrame],
    markers: list[str],
    bounds: Sequence[float] = (),
) -> None:
    drawn: list[float] = []
    for line, marker in zip(lines, markers):
        if panel.column not in line:
            continue
        sel = line[line["clock"].isin(panel.clocks)] if panel.clocks is not None else line
        ys = panel.scale * pd.to_numeric(sel[panel.column], errors="coerce").to_numpy(dtype=float)
        keep = np.isfinite(ys)
        if not keep.any():
            continue
        r0 = line.iloc[0]
        ax.plot(
            sel[axis.column].to_numpy(dtype=float)[keep],
            ys[keep],
            color=_color(str(r0["policy"])),
            ls=RUNNER_STYLES.get(str(r0["runner"]), "-"),
            marker=marker,
            ms=5,
            lw=1.5,
        )
        drawn += list(ys[keep])
    ax.set_title(panel.title, fontsize=10)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    _curve_x(ax, axis)
    if not drawn:
        ax.text(
            0.5,
            0.5,
            "no values for these runs",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="#777",
        )
        ax.set_yticks([])
        return
    positive = [v for v in drawn if v > 0]
    if panel.column == LATENCY_COLUMN and positive and max(positive) / min(positive) >= 10:
        # Past saturation latency grows by orders of magnitude: a linear axis would flatten the rest.
        ax.set_yscale("log")
        ax.set_ylabel(panel.ylabel + ", log scale", fontsize=8)
        # Plain numbers (0.2, 0.5, 1), not 2×10⁻¹: read at a glance.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_log_minor_label))
    elif panel.column == "token_states_frac":
        ax.set_ylim(0, 100)
    else:
        ax.set_ylim(bottom=0, top=1.08 * max(drawn) if max(drawn) > 0 else 1)
    if panel.column == "mean_running":
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.column == LATENCY_COLUMN:
        for bound in bounds:  # the suite's SLO: where each line's capacity is read
            ax.axhline(bound, color="#555", ls="--", lw=1)
            ax.annotate(
                f"SLO {bound:g}",
                (0.98, bound),
                xycoords=("axes fraction", "data"),
                xytext=(0, 3),
                textcoords="offset points",
                fontsize=8,
                color="#333",
                ha="right",
                va="bottom",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0},
                zorder=5,
            )


@dataclasses.dataclass(frozen=True)
class CurveRow:
    """One swept axis as the swept-curves figure draws it: its lines, and each line's legend names."""

    axis: figdata.SweptAxis
    shown: figdata.Readable
    series: list[str]  # runner/policy per line: its colour and line style
    contexts: list[str]  # what else tells the line apart ("" when nothing): its marker


def _curve_rows(cells: pd.DataFrame, axes: list[figdata.SweptAxis]) -> list[CurveRow]:
    multi = cells["runner"].nunique() > 1
    # Where a row draws block size on x, "paged b16" elsewhere would name a second paged entry
    # that looks the same; the note says which block size the other rows use instead.
    with_block = not any(a.column == "block_size" for a in axes)
    rows = []
    for axis in axes:
        shown = figdata.readable_lines(axis)
        series = [figdata.series_label(line.iloc[0].to_dict(), multi, with_block) for line in shown.lines]
        rows.append(CurveRow(axis, shown, series, figdata.context_labels(shown.lines, axis.column)))
    return rows


def _curve_legend(fig: Figure, rows: list[CurveRow], markers: dict[str, str]) -> None:
    """One legend for every row, in two parts: colour and line style name the runner and policy,
    marker names the workload (or other setting) where lines of one policy differ in it."""
    styles: dict[str, tuple[str, str]] = {}
    for row in rows:
        for line, label in zip(row.shown.lines, row.series):
            r0 = line.iloc[0]
            styles.setdefault(label, (_color(str(r0["policy"])), RUNNER_STYLES.get(str(r0["runner"]), "-")))
    contexts = [c for c in markers if c]
    plain = "o" if not contexts else "None"  # markers name contexts when there are any
    handles = [Line2D([], [], color=c, ls=ls, lw=1.8, marker=plain, ms=5) for c, ls in styles.values()]
    labels = list(styles)
    handles += [Line2D([], [], color="#444", ls="none", marker=markers[c], ms=6) for c in contexts]
    labels += contexts
    ncols = max(1, min(len(labels), 140 // (max(len(lab) for lab in labels) + 8)))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)


def _curve_note(
    rows: list[CurveRow], skipped: list[figdata.SweptAxis], panels: list[CurvePanel], bounds: Sequence[float] = ()
) -> str:
    parts = []
    for row in rows:
        axis, shown = row.axis, row.shown
        vs = axis.values
        span = f"{axis.tick_label(vs[0])}–{axis.tick_label(vs[-1])}" + ("" if axis.unit == "bytes" else f" {axis.unit}")
        left = (
            f"; {shown.left_lines} more line(s) of {shown.left_contexts} other workload(s) or setting(s) are "
            "in the tables only"
            if shown.left_lines
            else ""
        )
        parts.append(f"against {axis.label}, {len(shown.lines)} line(s) over {len(vs)} values ({span}){left}")
    marked = any(c for row in rows for c in row.contexts)
    note = (
        "Colour: policy; line style: runner"
        + ("; marker: the workload or setting that differs between lines of one policy" if marked else "")
        + ". Everything but the swept axis is held fixed along a line; markers at the measured cells (medians "
        "over repetitions). Drawn: " + "; ".join(parts) + "."
    )
    blocks = sorted(
        {
            int(b)
            for row in rows
            if row.axis.column != "block_size"
            for line in row.shown.lines
            if not is_contiguous(str(line["policy"].iloc[0]))
            for b in line["block_size"]
        }
    )
    if blocks:
        note += (
            f" Paged policies are drawn at block size {', '.join(map(str, blocks))} (the one nearest "
            f"{figdata.PREFERRED_BLOCK} of each)"
            + (" except against block size." if any(r.axis.column == "block_size" for r in rows) else ".")
        )
    if skipped:
        note += (
            f" Also swept but not drawn (at most {MAX_CURVE_AXES} axes): " + ", ".join(a.label for a in skipped) + "."
        )
    latency = any(p.column == LATENCY_COLUMN for p in panels)
    if not latency:
        note += " Normalized latency is not drawn: no cell here has it on a clock in seconds."
    elif any((line["clock"] == "steps").any() for row in rows for line in row.shown.lines):
        note += " Normalized latency leaves out the steps-clock runs, where it counts scheduler steps."
    if latency:
        note += " Normalized latency: each request's end-to-end latency ÷ its output tokens, mean over requests."
        if bounds:
            note += " Dashed: the suite's SLO bound on it, where the capacity table reads each line's capacity."
    return note


def swept_curves(cells: pd.DataFrame, slo_bounds: Sequence[float] = ()) -> Plot:
    """``slo_bounds``: normalized-latency bounds of the suites' SLOs, drawn on that panel."""
    name, title = "swept-curves", "Metrics against each swept axis"
    found = figdata.swept_axes(cells) if len(cells) else []
    if not found:
        return Plot(
            name,
            title,
            None,
            "no numeric axis swept: no request rate, KV budget, max_model_len, paged block "
            f"size or page size was run at {figdata.MIN_CURVE_POINTS} or more values with "
            "everything else fixed",
        )
    rows = _curve_rows(cells, found[:MAX_CURVE_AXES])
    panels = _curve_panels([line for row in rows for line in row.shown.lines])
    # One marker per context across the figure, so a workload keeps its marker from row to row.
    contexts = dict.fromkeys(c for row in rows for c in row.contexts)
    markers = {c: CURVE_MARKERS[i % len(CURVE_MARKERS)] for i, c in enumerate(contexts)}
    if "" in markers:
        markers[""] = "o"
    n_entries = len({s for row in rows for s in row.series}) + len(contexts)
    fig = Figure(
        figsize=(min(13.0, 3.2 * len(panels) + 0.6), 0.7 + 3.2 * len(rows) + 0.22 * -(-n_entries // 3)),
        layout="constrained",
    )
    # A sub-figure per row, so each row can say what its lines hold fixed above its panels.
    subfigs = fig.subfigures(len(rows), 1, squeeze=False)[:, 0]
    for sub, row in zip(subfigs, rows):
        held = figdata.held_fixed(row.shown.lines, row.axis.column)
        sub.suptitle(
            _wrap(f"Against {row.axis.label}" + (f" — {held}" if held else ""), 150),
            x=0.01,
            ha="left",
            fontsize=9,
            fontweight="bold",
        )
        for ax, panel in zip(sub.subplots(1, len(panels), squeeze=False)[0], panels):
            _curve_panel(ax, panel, row.axis, row.shown.lines, [markers[c] for c in row.contexts], slo_bounds)
    _curve_legend(fig, rows, markers)
    fig.suptitle(
        "Metrics against each swept axis (one row per axis; everything else held fixed along a line)", fontsize=11
    )
    return Plot(name, title, fig, _curve_note(rows, found[MAX_CURVE_AXES:], panels, slo_bounds))


# 9, 10 -------------------------------------------------------------------------
PERCENTILE_STYLES = {"p50": ":", "p90": "-.", "p95": (0, (5, 2)), "p99": "-", "mean": (0, (6, 2, 1, 2, 1, 2))}
METRIC_NAMES = {
    "ttft": "time to first token",
    "tpot": "time per output token",
    "itl": "inter-token latency",
    "latency": "end-to-end latency",
    "normalized_latency": "normalized latency (per output token)",
}


def _slo_family(
    cells: pd.DataFrame, slo: pd.DataFrame | None
) -> tuple[pd.DataFrame | None, list[tuple[str, float]], str]:
    """The first rate sweep of a suite with an SLO, its bounds, and why none when there is none."""
    from ..harness.records.goodput import suite_bounds

    bounds = suite_bounds(slo)
    if not bounds:
        return None, [], "no [slo] in the records: no latency bounds to read capacity against"
    families = [f for f in figdata.rate_families(cells) if f["suite"].iloc[0] in bounds]
    if not families:
        return None, [], "no request-rate sweep of a suite with an [slo]"
    fam = families[0]
    more = f" {len(families) - 1} more swept workload(s) are in the tables only." if len(families) > 1 else ""
    return fam, bounds[str(fam["suite"].iloc[0])][0], more


def slo_latency(cells: pd.DataFrame, slo: pd.DataFrame | None = None) -> Plot:
    """Each bounded metric against the request rate at every percentile, the bound drawn."""
    name, title = "slo-latency", "Latency percentiles vs request rate, with the SLO's bounds"
    fam, bounds, why = _slo_family(cells, slo)
    if fam is None:
        return Plot(name, title, None, why)
    more = why
    metrics = list(dict.fromkeys(col.rsplit("_", 2)[0] for col, _ in bounds))
    multi = fam["runner"].nunique() > 1
    fig = Figure(figsize=(max(4.8 * len(metrics) + 1, 8), 4.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        for (_, _), line in fam.groupby(["runner", "policy"], sort=False):
            line = line.sort_values("rate")
            r0 = line.iloc[0].to_dict()
            for stat, style in PERCENTILE_STYLES.items():
                col = f"{metric}_{stat}_s"
                if col in line and line[col].notna().any():
                    ax.plot(line["rate"], line[col], color=_color(r0["policy"]), ls=style, marker=".", lw=1.2)
        for col, bound in bounds:
            if col.rsplit("_", 2)[0] == metric:
                ax.axhline(bound, color="black", ls="-", lw=3, alpha=0.3)  # apart from every statistic's style
                ax.annotate(
                    f"SLO {col.rsplit('_', 2)[1]} ≤ {bound:g} s",
                    (0.02, bound),
                    xycoords=("axes fraction", "data"),
                    fontsize=8,
                    va="bottom",
                    color="#333",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = _spaced_ticks(sorted(set(fam["rate"])), True, 0.07)
        ax.set_xticks(ticks, [f"{r:g}" for r in ticks], fontsize=7)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(METRIC_NAMES.get(metric, metric), fontsize=9)
        ax.set_xlabel("request arrival rate, requests/s (log scale)")
        ax.set_ylabel(f"{metric}, s (log scale)")
        ax.grid(alpha=0.3)
    policies = [
        Line2D([], [], color=_color(r["policy"]), label=_label(r, multi))
        for r in fam.drop_duplicates(["runner", "policy"]).to_dict("records")
    ]
    stats = [Line2D([], [], color="#333", ls=style, label=stat) for stat, style in PERCENTILE_STYLES.items()]
    axes[0].legend(handles=policies + stats, fontsize=7)
    fig.suptitle(
        _wrap(f"{fam['family_label'].iloc[0]}: latency at each percentile; thick grey: the SLO's bounds", 110),
        fontsize=10,
    )
    note = (
        "One colour per policy, one line style per statistic (p50 to p99, and the mean) over the run's "
        "requests, medians over repetitions; the thick grey line is the bound on that metric at its percentile: "
        "capacity is the highest rate at which every bound holds." + more
    )
    return Plot(name, title, fig, note)


def goodput_curves(cells: pd.DataFrame, slo: pd.DataFrame | None = None) -> Plot:
    """Goodput (requests within every bound per second) against the offered rate, per policy."""
    name, title = "goodput", "Goodput vs request rate"
    fam, _, why = _slo_family(cells, slo)
    if fam is None:
        return Plot(name, title, None, why)
    more = why
    if "goodput_rps" not in fam or fam["goodput_rps"].isna().all():
        return Plot(name, title, None, "no goodput: the SLO bounds a metric with no per-request value in the records")
    multi = fam["runner"].nunique() > 1
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.subplots()
    rates = sorted(set(fam["rate"]))
    ax.plot(rates, rates, color="#999", ls=":", lw=1, label="offered rate")
    for (_, _), line in fam.groupby(["runner", "policy"], sort=False):
        line = line.sort_values("rate")
        r0 = line.iloc[0].to_dict()
        ax.plot(
            line["rate"],
            line["goodput_rps"],
            color=_color(r0["policy"]),
            ls=RUNNER_STYLES.get(r0["runner"], "-"),
            marker="o",
            label=_label(r0, multi),
        )
    ax.set_xscale("log")
    ticks = _spaced_ticks(rates, True, 0.07)
    ax.set_xticks(ticks, [f"{r:g}" for r in ticks], fontsize=7)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("request arrival rate, requests/s (log scale)")
    ax.set_ylabel("goodput: requests within every bound per second")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(_wrap(str(fam["family_label"].iloc[0]), 80), fontsize=9)
    note = (
        "Goodput: the requests that met every bound of the SLO per second of the run's clock (medians over "
        "repetitions); the dotted line is the offered rate (the arrival rate of the sweep)." + more
    )
    return Plot(name, title, fig, note)


# 11 ----------------------------------------------------------------------------
def prefix_reuse_curves(cells: pd.DataFrame) -> Plot:
    """Hit rate and throughput against the KV budget: paged-prefix, paged, and contiguous."""
    name, title = "prefix-reuse", "Prefix reuse vs KV budget"
    lines = prefix_budget_lines(cells)
    if not lines:
        return Plot(name, title, None, "no budget sweep with paged-prefix: it ran at fewer than two KV budgets")
    shown = lines[:3]
    multi = cells["runner"].nunique() > 1
    fig = Figure(figsize=(max(4.6 * len(shown) + 1, 8), 7.4), layout="constrained")
    axes = fig.subplots(2, len(shown), squeeze=False)
    for col, line in enumerate(shown):
        for (_, policy), sub in line.groupby(["runner", "policy"], sort=False):
            sub = sub.sort_values("budget_bytes")
            r0 = sub.iloc[0].to_dict()
            kw = {"color": _color(policy), "ls": RUNNER_STYLES.get(r0["runner"], "-"), "marker": "o"}
            budget = sub["budget_bytes"]
            if policy == "paged-prefix":
                axes[0, col].plot(budget, 100 * sub["prefix_hit_rate"], label=_label(r0, multi), **kw)
            axes[1, col].plot(budget, sub["tokens_per_s"], label=_label(r0, multi), **kw)
        axes[0, col].set_title(_wrap(str(line["workload"].iloc[0]), 55), fontsize=9)
        axes[1, col].set_xlabel("KV budget (log scale)")
        budgets = sorted(set(line["budget_bytes"]))
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets, [format_bytes(int(b)) for b in budgets])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("prefix-cache hit rate, % of prompt tokens")
    axes[1, 0].set_ylabel(_wrap(f"throughput: {throughput_note(set(cells['clock']), set(cells['runner']))}", 40))
    axes[0, 0].legend(fontsize=8)
    axes[1, 0].legend(fontsize=8)
    fig.suptitle("Prefix reuse: hit rate (top) and throughput (bottom) against the KV budget", fontsize=11)
    note = (
        "Hit rate counts first admissions only (a preempted request's hits on its own recomputation are not hits). "
        "A contiguous line reaching paged-prefix's throughput at a larger budget is the memory sharing saves."
    )
    if len(lines) > len(shown):
        note += f" {len(lines) - len(shown)} more swept workload(s) are in the table only."
    return Plot(name, title, fig, note)


def prefix_budget_lines(cells: pd.DataFrame) -> list[pd.DataFrame]:
    """The cells of each budget sweep in which paged-prefix ran at two or more budgets."""
    if cells.empty or "paged-prefix" not in set(cells["policy"]):
        return []
    ok = cells[cells["ok"] > 0]
    keys = [k for k in LINE_KEYS if k in ok]
    return [
        line
        for _, line in ok.groupby(keys, sort=False, dropna=False)
        if line.loc[line["policy"] == "paged-prefix", "budget_bytes"].nunique() >= 2
    ]


# 12 ----------------------------------------------------------------------------
GIB = 2**30


def cpu_tier_hits(table: pd.DataFrame) -> Plot:
    """GPU and CPU hit tokens against the CPU tier's size, one line per eviction policy (the run
    without a tier at 0 on each), per runner and block size of each group with a tier (up to 3)."""
    name, title = "cpu-tier", "Prefix hits by tier against the CPU tier's size"
    paged = table[table["policy"] == "paged-prefix"] if len(table) else table
    keys = ["group", "runner", "block_size"]
    lines = [line for _, line in paged.groupby(keys, sort=True)] if len(paged) else []
    lines = [line for line in lines if (line["cpu_offload_bytes"] > 0).any()]
    if not lines:
        return Plot(name, title, None, "no paged-prefix run with a CPU tier")
    shown = lines[:3]
    fig = Figure(figsize=(max(5.2 * len(shown) + 1, 8), 4.8), layout="constrained")
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple")
    for ax, line in zip(axes, shown):
        base = line[line["cpu_offload_bytes"] == 0]
        tiered = line[line["cpu_offload_bytes"] > 0]
        for i, (eviction, series) in enumerate(tiered.groupby("eviction", sort=True)):
            series = pd.concat([base.iloc[:1], series]).sort_values("cpu_offload_bytes")
            x = series["cpu_offload_bytes"].to_numpy(dtype=float) / GIB
            kw = {"color": colors[i % len(colors)], "marker": "o"}
            ax.plot(x, series["cpu_hit_tokens"], ls="-", label=f"{eviction}: CPU hit tokens", **kw)
            ax.plot(x, series["gpu_hit_tokens"], ls="--", mfc="white", label=f"{eviction}: GPU hit tokens", **kw)
        sizes = sorted(set(line["cpu_offload_bytes"]))
        ax.set_xticks([b / GIB for b in sizes], [f"{b / GIB:g}" if b else f"0 ({NO_TIER})" for b in sizes], fontsize=8)
        ax.set_xlabel("CPU tier size, GiB")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        first = line.iloc[0]
        ax.set_title(_wrap(f"Group {int(first['group']) + 1} · {first['runner']}, block {first['block_size']}", 55))
        ax.legend(fontsize=8)
    axes[0].set_ylabel("hit tokens (all requests, all admissions)")
    fig.suptitle("Tokens served from the GPU's prefix cache and from the CPU tier, by the tier's size", fontsize=11)
    note = (
        "Each point is one run (paged-prefix, first ok repetition); the point at 0 is the run without a CPU tier, "
        "shared by every eviction policy's line. CPU hit tokens: loaded from the tier instead of computed; GPU hit "
        "tokens: found in the GPU's prefix cache at any admission."
    )
    if len(lines) > len(shown):
        note += f" {len(lines) - len(shown)} more line(s) with a CPU tier are in the table only."
    return Plot(name, title, fig, note)


def all_plots(
    cells: pd.DataFrame,
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    decomp: pd.DataFrame,
    slo: pd.DataFrame | None = None,
    cpu_tier: pd.DataFrame | None = None,
) -> list[Plot]:
    """Every figure of the report, in order (drawn or with the reason it is not); the optional
    ones only where drawn. ``cpu_tier``: ``cpu_tier.cpu_tier_table``'s (computed when not given)."""
    tiers = cpu_tier if cpu_tier is not None else cpu_tier_table(cells, runs, steps, requests)
    optional = [cpu_tier_hits(tiers)] if len(tiers) else []
    return [
        memory_breakdown(cells),
        last_block_waste(runs, requests),
        allocation_over_time(cells, steps),
        running_requests(cells, steps),
        rate_sweep(cells),
        block_size_ablation(cells),
        decomposition(decomp),
        swept_curves(cells, _latency_bounds(slo)),
        slo_latency(cells, slo),
        goodput_curves(cells, slo),
        prefix_reuse_curves(cells),
        *optional,
    ]


def _latency_bounds(slo: pd.DataFrame | None) -> list[float]:
    """The SLO bounds on the normalized latency the swept-curves figure draws (other metrics are not on its axes)."""
    if slo is None or slo.empty:
        return []
    return sorted({float(b) for m, b in zip(slo["metric"], slo["bound"]) if m == LATENCY_COLUMN})
