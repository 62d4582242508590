"""The report's findings: sentences whose every number is the records' (reports/findings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from kvbench.reports.contents import report_tables
from kvbench.reports.figdata import preferred_block
from kvbench.reports.findings import Finding, findings
from kvbench.reports.labels import group_titles
from reportkit import W1, W2, golden_rows, run, runs_frame, workload, write_golden


def found(rows: list[dict[str, Any]], steps: pd.DataFrame | None = None) -> list[Finding]:
    return findings(report_tables(runs_frame(rows), steps=steps))


def text_of(items: list[Finding], workload_id: str) -> str:
    (item,) = [f for f in items if workload_id[:8] in f.title]
    return " ".join(item.sentences)


def with_metric(rows: list[dict[str, Any]], runner: str, policy: str, wid: str, **metrics: Any) -> list[dict]:
    return [
        dict(r, **metrics) if (r["runner"], r["policy"], r["workload_id"]) == (runner, policy, wid) else r for r in rows
    ]


def test_one_finding_per_group_in_the_tables_order_titled_by_model_workload_and_budget() -> None:
    items = found(golden_rows())
    assert [f.group for f in items] == [0, 1, 2, 3]
    assert [f.title for f in items] == [
        "opt-13b / w1111111 at 1.0 GiB",
        "opt-13b / w3333333 at 1.0 GiB, 1 req/s",  # a rate sweep's groups: by their rates
        "opt-13b / w4444444 at 1.0 GiB, 4 req/s",
        "opt-13b / w2222222 at 1.0 GiB",
    ]


def test_paged_against_contiguous_states_the_records_ratios_and_numbers() -> None:
    text = text_of(found(golden_rows()), W1["workload_id"])
    # sim: mean running 4 vs 2, peak 6 vs 2, tokens per step 20 vs 10 (golden_rows' docstring)
    assert (
        "On sim, paged (block 16) ran 2.00× the mean concurrency of contiguous-max (4.0 vs 2.0; peak 6 vs 2) "
        "and 2.00× its throughput (20.0 vs 10.0 tokens/step)." in text
    )
    # torch: the same concurrency, 1.5× the tokens: its own sentence, not merged with sim's
    assert "On torch, paged (block 16) ran 2.00× the mean concurrency" in text
    assert "1.50× its throughput (150.0 vs 100.0 tokens/step)" in text


def test_a_changed_record_changes_the_sentence() -> None:
    rows = with_metric(golden_rows(), "sim", "paged", W1["workload_id"], mean_running=7.0, tokens_per_s=33.0)
    text = text_of(found(rows), W1["workload_id"])
    assert "3.50× the mean concurrency of contiguous-max (7.0 vs 2.0; peak 6 vs 2)" in text
    assert "3.30× its throughput (33.0 vs 10.0 tokens/step)" in text
    assert "(4.0 vs 2.0" in text  # torch's own numbers, unchanged
    base = with_metric(golden_rows(), "sim", "contiguous-max", W2["workload_id"], mean_running=4.0)
    assert "2.00× the mean concurrency of contiguous-max (8.0 vs 4.0; peak 9 vs 1)" in text_of(
        found(base), W2["workload_id"]
    )


def test_runners_with_the_same_numbers_are_named_together() -> None:
    rows = [
        run(r, p, 16, mean_running=m, peak_running=int(m), tokens_per_s=m)
        for r in ("sim", "vllm-sched")
        for p, m in (("contiguous-max", 2.0), ("paged", 5.0))
    ]
    (item,) = found(rows)
    assert item.sentences[0].startswith("On sim and vllm-sched, paged (block 16) ran 2.50× the mean concurrency")
    assert len(item.sentences) == 1


def test_each_contiguous_baseline_and_the_spread_over_block_sizes() -> None:
    rows = [
        run("sim", "contiguous-max", mean_running=2.0, peak_running=2, tokens_per_s=2.0),
        run("sim", "contiguous-oracle", mean_running=4.0, peak_running=5, tokens_per_s=4.0),
        run("sim", "paged", 8, mean_running=9.0, peak_running=10, tokens_per_s=9.0),
        run("sim", "paged", 16, mean_running=8.0, peak_running=10, tokens_per_s=8.0),
        run("sim", "paged", 32, mean_running=6.0, peak_running=8, tokens_per_s=6.0),
    ]
    (item,) = found(rows)
    assert item.sentences == (
        "On sim, paged (block 16) ran 4.00× the mean concurrency of contiguous-max (8.0 vs 2.0; peak 10 vs 2) "
        "and 4.00× its throughput (8.0 vs 2.0 tokens/step).",
        "Across paged blocks 8–32: 3.00×–4.50× the mean concurrency of contiguous-max.",
        "Against contiguous-oracle: 2.00× the mean concurrency (vs 4.0; peak vs 5) "
        "and 2.00× the throughput (vs 4.0 tokens/step).",
    )


def test_preferred_block_is_16_else_the_nearest_by_factors_of_two() -> None:
    # the figures' rule: the timelines and the sentences speak of the same paged cell
    assert preferred_block([8, 16, 32]) == 16
    assert preferred_block([8, 32]) == 8 and preferred_block([32, 64]) == 32
    assert preferred_block([4, 32]) == 32  # 2 halvings against 1 doubling
    assert preferred_block([]) is None


def test_a_failed_cell_is_named_with_its_reason() -> None:
    text = text_of(found(golden_rows()), W2["workload_id"])
    assert "sim/contiguous-pow2 failed: boom: a runner bug." in text


def test_an_infeasible_cell_and_a_partly_failed_one_are_named_with_their_reasons() -> None:
    why = "infeasible: contiguous-max needs 2,048 positions = 1.6 GiB of KV, the budget holds 1,310"
    rows = [
        run("sim", "contiguous-max", status="infeasible", error=why),
        run("sim", "contiguous-pow2", mean_running=2.0, peak_running=2, tokens_per_s=2.0),
        run("sim", "paged", 16, mean_running=6.0, peak_running=7, tokens_per_s=6.0),
        run("sim", "paged", 16, repeat=1, status="oom", error="oom: CUDA out of memory"),
    ]
    (item,) = found(rows)
    assert f"sim/contiguous-max {why}." in item.sentences
    assert "1 of 2 runs of sim/paged b16 oom: CUDA out of memory." in item.sentences
    # the infeasible baseline is not a baseline: paged is set against the one that ran
    assert item.sentences[0].startswith("On sim, paged (block 16) ran 3.00× the mean concurrency of contiguous-pow2")


def test_failures_beyond_the_first_few_are_counted() -> None:
    rows = [run("sim", "paged", b, status="failed", error=f"bug {b}") for b in (8, 16, 32, 64, 128)]
    (item,) = found(rows)
    assert item.sentences[0] == "No run in this group finished ok."
    assert "sim/paged b8 failed: bug 8." in item.sentences and "sim/paged b128 failed: bug 128." not in item.sentences
    assert item.sentences[-1] == "2 more cell(s) did not run ok: the group's table lists them."


def test_a_group_without_a_contiguous_baseline_says_so() -> None:
    (only_paged,) = found([run("sim", "paged", 16, mean_running=3.0)])
    assert only_paged.sentences == ("No contiguous policy ran in this group, so paged has no baseline here.",)
    failed_baseline = [
        run("sim", "contiguous-max", status="failed", error="boom"),
        run("sim", "paged", 16, mean_running=3.0),
    ]
    (item,) = found(failed_baseline)
    assert item.sentences == (
        "No contiguous policy ran ok in this group, so paged has no baseline here.",
        "sim/contiguous-max failed: boom.",
    )
    (no_paged,) = found([run("sim", "contiguous-max", mean_running=3.0)])
    assert no_paged.sentences == (
        "No paged cell in this group (ran ok: contiguous-max): nothing to set against contiguous.",
    )
    paged_failed = [run("sim", "contiguous-max", mean_running=3.0), run("sim", "paged", 16, status="failed", error="x")]
    assert found(paged_failed)[0].sentences == (
        "Paged did not run ok in this group: no ratio to state.",
        "sim/paged b16 failed: x.",
    )
    apart = [run("sim", "contiguous-max", mean_running=1.0), run("vllm-sched", "paged", 16, mean_running=3.0)]
    assert "no ratio on the same runner" in found(apart)[0].sentences[0]


def test_the_decomposition_sentence_only_where_torch_and_vllm_ran() -> None:
    items = found(golden_rows())
    w1 = text_of(items, W1["workload_id"])
    # wall tokens/s: torch 100 → 150 (allocation 1.5×), vllm/paged 300 (runtime 2×), naive 3×
    assert (
        "In wall tokens/s (block 16), vllm/paged over torch/contiguous-max is naive 3.00× = allocation 1.50× "
        "× runtime 2.00×." in w1
    )
    assert "Inside vLLM alone" not in w1  # no vllm/contiguous run
    assert all("naive" not in " ".join(f.sentences) for f in items if W1["workload_id"][:8] not in f.title)
    rows = with_metric(golden_rows(), "torch", "paged", W1["workload_id"], wall_tokens_per_s=200.0)
    assert "naive 3.00× = allocation 2.00× × runtime 1.50×" in text_of(found(rows), W1["workload_id"])
    sim_only = [r for r in golden_rows() if r["runner"] == "sim"]
    assert all("naive" not in " ".join(f.sentences) for f in found(sim_only))


def test_vllms_own_allocation_factor_where_it_ran_contiguous() -> None:
    rows = [
        run("torch", "contiguous-max", tokens_per_s=1.0, wall_tokens_per_s=80.0, mean_running=2.0),
        run("torch", "paged", 16, tokens_per_s=2.0, wall_tokens_per_s=120.0, mean_running=4.0),
        run("vllm", "contiguous-max", tokens_per_s=1.0, wall_tokens_per_s=120.0, mean_running=2.0),
        run("vllm", "paged", 16, tokens_per_s=2.0, wall_tokens_per_s=360.0, mean_running=4.0),
    ]
    (item,) = found(rows)
    assert "naive 4.50× = allocation 1.50× × runtime 3.00×" in " ".join(item.sentences)
    assert "Inside vLLM alone (vllm/paged over vllm/contiguous), allocation gives 3.00× against contiguous-max." in (
        item.sentences
    )


def hybrid_rows(policy: str = "paged", scale: float = 1.0) -> list[dict[str, Any]]:
    """sim with vLLM's hybrid KV cache manager on and off (blocks of 16); on runs more at once."""
    rows = []
    for on, mean, peak, preempt, tps in ((True, 6.0, 8, 1, 30.0), (False, 4.0, 5, 3, 20.0)):
        r = run("sim", policy, model="gpt-oss-20b", hybrid_kv=on, kv_groups="g")
        r.update(mean_running=mean * scale, peak_running=peak, preemptions=preempt, tokens_per_s=tps * scale)
        rows.append(dict(r, block_size=16, run_id=r["run_id"] + f"-b16-h{int(on)}"))
    return rows


def test_the_hybrid_sentence_only_where_the_hybrid_table_has_the_groups_pair() -> None:
    other = workload("w5555555eeeeeeee")
    rows = hybrid_rows() + [run("sim", "paged", 16, wl=other, mean_running=2.0)]
    items = found(rows)
    mine = text_of(items, W1["workload_id"])
    assert (
        "Hybrid KV cache manager on vs off (paged on sim): mean running 6.0 vs 4.0, peak 8 vs 5, "
        "preemptions 1 vs 3, 1.50× the tokens/step." in mine
    )
    assert "Hybrid" not in text_of(items, other["workload_id"])
    assert all("Hybrid" not in " ".join(f.sentences) for f in found(golden_rows()))


def test_titles_say_what_else_tells_two_groups_apart() -> None:
    rows = [run("sim", "paged", 16, mean_running=1.0), run("sim", "paged", 16, kv_dtype="fp8", mean_running=2.0)]
    titles = group_titles(report_tables(runs_frame(rows)).cells)
    assert sorted(titles.values()) == [
        "opt-13b / w1111111 at 1.0 GiB, KV fp16",
        "opt-13b / w1111111 at 1.0 GiB, KV fp8",
    ]


def test_no_cells_no_findings() -> None:
    assert findings(report_tables(runs_frame([run("sim", "paged", 16)]).iloc[0:0])) == []


def test_both_renderers_lead_with_the_findings_then_figures_then_tables(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    page = write_report(write_golden(tmp_path / "r")).read_text()
    md = (tmp_path / "r" / "report" / "summary.md").read_text()
    sentence = "On sim, paged (block 16) ran 8.00× the mean concurrency of contiguous-max (8.0 vs 1.0; peak 9 vs 1)"
    assert sentence in md and sentence.replace("8.00×", "<strong>8.00×</strong>") in page
    assert md.index("## Findings") < md.index("## Figures") < md.index("## Group 1") < md.index("## Decomposition")
    assert page.index('id="findings"') < page.index('id="figures"') < page.index('id="group-1"')
    assert page.index('id="group-1"') < page.index("<h2>Decomposition")
    assert '<a href="#group-4">Group 4</a> · opt-13b / w2222222 at 1.0 GiB.' in page


def test_the_hybrid_sentence_sets_paging_against_contiguous_with_the_manager_on_and_off() -> None:
    rows = hybrid_rows() + hybrid_rows("contiguous-max", scale=0.5)  # contiguous in blocks: half of everything
    (item,) = found(rows)
    text = " ".join(item.sentences)
    assert (
        "On sim (hybrid KV on), paged (block 16) ran 2.00× the mean concurrency of contiguous-max (6.0 vs 3.0" in text
    )
    assert (
        "On sim (hybrid KV off), paged (block 16) ran 2.00× the mean concurrency of contiguous-max (4.0 vs 2.0" in text
    )
    assert (
        "Hybrid KV cache manager on vs off (paged on sim): mean running 6.0 vs 4.0, peak 8 vs 5, preemptions 1 vs 3, "
        "1.50× the tokens/step, paged's tokens/step over contiguous-max's 2.00× on and 2.00× off." in text
    )
    assert "Hybrid KV cache manager on vs off (contiguous-max on sim): mean running 3.0 vs 2.0" in text
