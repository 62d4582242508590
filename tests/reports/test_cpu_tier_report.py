"""The report's "CPU tier" section: a small version of suites/offload.toml (60 requests of the
hash-id trace, tiers of 0, 1 and 4 GiB in LRU and ARC order, and contiguous-max) run through the
real CLI, its table checked against the Parquet files read directly, its sentence, its figure;
and the section absent from a report of records without a tier."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from kvbench.harness.spec.units import format_bytes
from kvbench.reports.contents import report_tables
from kvbench.reports.cpu_tier import answer, cpu_tier
from kvbench.reports.loading import load

from tests.conftest import ROOT, kvbench

PNG = b"\x89PNG\r\n\x1a\n"
TRACE = ROOT / "suites" / "data" / "mooncake-reuse.jsonl"


def small_offload_suite(tiers: list[str] | None) -> str:
    """suites/offload.toml on the trace's first 60 requests; ``tiers`` the CPU tiers swept (None:
    no tier at all, the suite as it was before tiers)."""
    text = (ROOT / "suites" / "offload.toml").read_text()
    text = text.replace('path = "data/mooncake-reuse.jsonl"', f'path = "{TRACE}"\nlimit = 60')
    swept = 'cpu_offload = ["0", "4GiB", "16GiB"]\noffload_policy = ["lru", "arc"]\n'
    assert swept in text
    tier = f"cpu_offload = {tiers!r}\noffload_policy = ['lru', 'arc']\n".replace("'", '"') if tiers else ""
    return text.replace(swept, tier)


def run_and_report(tmp: Path, tiers: list[str] | None) -> Path:
    suite, out = tmp / "suite.toml", tmp / "out"
    suite.write_text(small_offload_suite(tiers))
    env = {"KVBENCH_PURE": "1"}
    ran = kvbench("run", suite, "--out", out, "--no-report", env=env)
    assert ran.returncode == 0, ran.stderr
    reported = kvbench("report", out, env=env)
    assert reported.returncode == 0, reported.stderr
    return out


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_and_report(tmp_path_factory.mktemp("tiered"), ["0", "1GiB", "4GiB"])


def parquet(out: Path, table: str) -> pd.DataFrame:
    frame = pd.read_parquet(out / table)
    return frame.assign(run_id=frame["run_id"].astype(str))


def expected_rows(out: Path) -> pd.DataFrame:
    """Each run's numbers computed straight from the Parquet files, by run id."""
    runs = parquet(out, "runs").set_index("run_id")
    steps, reqs = parquet(out, "steps"), parquet(out, "requests")
    cpu = reqs["cpu_hit_tokens"].fillna(0)
    reqs = reqs.assign(
        gpu=reqs["prefix_hit_tokens"] + reqs["recomputed_hit_tokens"] - cpu,
        cpu=cpu,
        once=reqs["prompt_len"] - reqs["prefix_hit_tokens"] + reqs["output_len"] - 1,
    )
    per_req = reqs.groupby("run_id")[["gpu", "cpu", "once"]].sum()
    per_step = steps.groupby("run_id")[["stored_blocks", "loaded_blocks"]].sum(min_count=1)
    block = runs["block_size"] * runs["kv_bytes_per_token"]
    out_rows = pd.DataFrame(
        {
            "tier": runs["cpu_offload_bytes"].fillna(0),
            "policy": runs["policy"],
            "preemptions": runs["preemptions"],
            "recomputed_tokens": runs["computed_tokens"] - per_req["once"],
            "gpu_hit_tokens": per_req["gpu"],
            "cpu_hit_tokens": per_req["cpu"],
            "computed_tokens": runs["computed_tokens"],
            "stored_bytes": per_step["stored_blocks"] * block,
            "loaded_bytes": per_step["loaded_blocks"] * block,
            "tokens_per_s": runs["tokens_per_s"],
            "ttft_p50_s": runs["ttft_p50_s"],
        }
    )
    base = out_rows[(out_rows["policy"] == "paged-prefix") & (out_rows["tier"] == 0)]["computed_tokens"].iloc[0]
    tiered = (out_rows["policy"] == "paged-prefix") & (out_rows["tier"] > 0)
    out_rows["computed_change"] = (out_rows["computed_tokens"] / base - 1).where(tiered)
    return out_rows


def test_the_table_is_the_parquet_files_numbers(tiered: Path) -> None:
    records = load(tiered)
    tables = report_tables(records.runs, steps=records.steps, requests=records.requests)
    table = tables.cpu_tier.table.set_index("run_id")
    want = expected_rows(tiered)
    assert set(table.index) == set(want.index)  # every run: 5 paged-prefix (tier and none), contiguous-max
    assert len(table) == 6 and (want.loc[table.index, "tier"] > 0).sum() == 4
    for col in [c for c in want.columns if c not in ("tier", "policy")]:
        got, exp = table[col], want.loc[table.index, col]
        assert got.isna().equals(exp.isna()), col
        assert got.dropna().to_numpy() == pytest.approx(exp.dropna().to_numpy(), rel=1e-12), col
    # The tier carries what the runs say: sizes, policies, capacity in blocks.
    runs = parquet(tiered, "runs").set_index("run_id")
    for rid, row in table.iterrows():
        size = runs.at[rid, "cpu_offload_bytes"]
        assert row["cpu_offload_bytes"] == (0 if pd.isna(size) else size)
        assert row["tier"] == {0: "none", 2**30: "1.0 GiB", 4 * 2**30: "4.0 GiB"}[row["cpu_offload_bytes"]]
        policy = runs.at[rid, "offload_policy"]
        assert row["eviction"] == ("—" if pd.isna(policy) else {"lru": "LRU", "arc": "ARC"}[policy])
        assert row["cpu_blocks"] == runs.at[rid, "cpu_blocks"]
    # A tier loaded something, and a run without one moved nothing.
    assert (table.loc[table["cpu_offload_bytes"] > 0, "cpu_hit_tokens"] > 0).all()
    assert table.loc[table["cpu_offload_bytes"] == 0, "stored_bytes"].isna().all()
    # The rendered table prints those numbers: the 4 GiB LRU row of summary.md.
    md = (tiered / "report" / "summary.md").read_text()
    row = table[(table["tier"] == "4.0 GiB") & (table["eviction"] == "LRU")].iloc[0]
    line = next(x for x in md.splitlines() if x.startswith("| paged-prefix | 16 | 4.0 GiB | LRU |"))
    assert f"| {row['cpu_hit_tokens']:,.0f} | {row['computed_tokens']:,.0f} | {row['computed_change']:+.1%} |" in line


def test_the_sentence_names_the_largest_tier_and_its_cut(tiered: Path) -> None:
    want = expected_rows(tiered)
    runs = parquet(tiered, "runs").set_index("run_id")
    largest = want[want["tier"] == want["tier"].max()]
    best = largest.loc[largest["computed_tokens"].idxmin()]
    policy = runs.at[best.name, "offload_policy"].upper()
    base = want[(want["policy"] == "paged-prefix") & (want["tier"] == 0)].iloc[0]
    cut = 1 - best["computed_tokens"] / base["computed_tokens"]
    md = (tiered / "report" / "summary.md").read_text()
    section = md[md.index("## CPU tier") : md.index("## Clocks")]
    sentence = f"A 4.0 GiB CPU tier ({policy}) served {best['cpu_hit_tokens']:,.0f} tokens from CPU"
    assert sentence in section
    assert f"cut computed tokens by {cut:.1%} against no tier" in section
    assert f"({base['computed_tokens']:,.0f} → {best['computed_tokens']:,.0f};" in section
    html = (tiered / "report" / "index.html").read_text()
    assert '<h2 id="cpu-tier">CPU tier</h2>' in html and sentence in html
    assert sentence in md[md.index("## Findings") : md.index("## Figures")]  # the report leads with it


def test_the_figure_is_a_png_of_hits_by_tier(tiered: Path) -> None:
    png = tiered / "report" / "12-cpu-tier.png"
    assert png.read_bytes()[:8] == PNG
    md = (tiered / "report" / "summary.md").read_text()
    assert "- `12-cpu-tier.png` — Prefix hits by tier against the CPU tier's size" in md
    assert 'id="12-cpu-tier"' in (tiered / "report" / "index.html").read_text()


def test_no_section_and_no_figure_without_a_tier(tmp_path: Path) -> None:
    out = run_and_report(tmp_path, None)
    records = load(out)
    tables = report_tables(records.runs, steps=records.steps, requests=records.requests)
    assert len(tables.cpu_tier) == 0 and not tables.cpu_tier.answers
    report = out / "report"
    assert not list(report.glob("*cpu-tier*"))
    md, html = (report / "summary.md").read_text(), (report / "index.html").read_text()
    assert "CPU tier" not in md and "cpu-tier" not in html and "CPU tier" not in html


def hand_row(tier_gib: float, eviction: str, cpu_hits: float, computed: float, blocks: int) -> dict:
    tier = int(tier_gib * 2**30)
    return {
        "group": 0,
        "runner": "sim",
        "block_size": 16,
        "device": None,
        "page_bytes": None,
        "arena": None,
        "serve_url": None,
        "hybrid_kv": None,
        "policy": "paged-prefix",
        "clock": "steps",
        "cpu_offload_bytes": tier,
        "tier": format_bytes(tier) if tier else "none",
        "eviction": eviction,
        "cpu_blocks": blocks,
        "block_bytes": 2.0 * 2**20,
        "cpu_hit_tokens": cpu_hits,
        "computed_tokens": computed,
        "ttft_p50_s": 10.0,
        "computed_change": computed / 1000 - 1 if tier else math.nan,
    }


def test_cpu_hits_that_do_not_rise_with_the_tier_are_said_plainly() -> None:
    rows = [
        hand_row(0, "—", 0, 1000, 0),
        hand_row(1, "LRU", 300, 800, 512),
        hand_row(4, "LRU", 200, 900, 2048),  # a larger tier served fewer
        hand_row(1, "ARC", 100, 950, 512),
        hand_row(4, "ARC", 400, 700, 2048),  # rises: nothing said
        hand_row(1 / 1024, "FIFO", 0, 1000, 0),  # 1 MiB: holds no block of 2 MiB
    ]
    said = answer(pd.DataFrame(rows))
    assert said[0].startswith("A 4.0 GiB CPU tier (ARC) served 400 tokens from CPU and cut computed tokens by 30.0%")
    assert "LRU at 4.0 GiB: 200 tokens from CPU, computed tokens -10.0%" in said[0]
    assert said[1] == (
        "Under FIFO, CPU hit tokens do not rise with the tier's size: 0 at none, 0 at 1.0 MiB; a 1.0 MiB tier "
        "holds no block (one block is 2.0 MiB), so it can serve nothing."
    )
    assert (
        said[2]
        == "Under LRU, CPU hit tokens do not rise with the tier's size: 0 at none, 300 at 1.0 GiB, 200 at 4.0 GiB."
    )
    assert len(said) == 3


def test_the_section_of_the_pure_function_is_empty_without_records() -> None:
    empty = cpu_tier(pd.DataFrame(), pd.DataFrame(), None, None)
    assert len(empty) == 0 and empty.answers == {}
