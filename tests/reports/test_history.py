"""``kvbench history``: thirty seeded nights made from one real run's records (``historykit``).

The nights carry ±3% noise (uniform) on every timed column (torch's wall-clock throughput and step
time), a +5% step at night 20 in one torch cell's throughput, a drift of -0.5% a night in
another's, and one code change of sim's deterministic columns at night 25 (paged's mean running,
+3%). History must find the step (night 20 ± 1) with its commit, the drift, sim's change exactly at
night 25, and nothing else; ``--gate`` must fail on the drift and pass on the same nights without
the step and the drift.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from browserkit import CHROMIUM, WINDOW, page_facts
from conftest import assert_one_line_error, kvbench
from historykit import Plan, blip, cell, drift, make_nights, night_names, record, step

THROUGHPUT = "wall_tokens_per_s"
STEP_CELL, DRIFT_CELL = "torch/paged b16", "torch/contiguous-max"
SIM_CHANGE = step(lambda r: r["runner"] == "sim" and r["policy"] == "paged", "mean_running", 25, 1.03)
FULL = Plan(
    edits=(
        step(cell("torch", "paged", 16), THROUGHPUT, 20, 1.05),
        drift(cell("torch", "contiguous-max", 1), THROUGHPUT, 0.995),
        SIM_CHANGE,
    )
)
QUIET = Plan(edits=(SIM_CHANGE,))  # the same nights (same seed) without the step and the drift


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("history"))


def history(root: Path, *args: str | Path) -> tuple[int, list[dict], str, str]:
    """``kvbench history root --json`` and its changes."""
    out = root.parent / "changes.json"
    done = kvbench("history", root, "--json", out, *args)
    changes = json.loads(out.read_text()) if out.exists() else []
    return done.returncode, changes, done.stdout, done.stderr


def test_history_finds_the_step_the_drift_and_the_code_change(records: Path, tmp_path: Path) -> None:
    nights = make_nights(records, tmp_path / "nights", FULL)
    names = night_names(FULL)
    rc, changes, stdout, stderr = history(tmp_path / "nights", "--gate")
    assert rc == 1, stderr  # the drift is a regression tonight against the first night
    by = {(c["cell"], c["metric"]): c for c in changes}
    assert set(by) == {
        (STEP_CELL, THROUGHPUT),
        (DRIFT_CELL, THROUGHPUT),
        ("sim/paged b16", "mean_running"),
        ("sim/paged b32", "mean_running"),
    }, "a change in a noise-only series, or one missed"
    found = by[(STEP_CELL, THROUGHPUT)]
    at = names.index(found["first_night"])
    assert found["kind"] == "step" and abs(at - 20) <= 1, found
    assert found["commit"] == names[at].rsplit("-", 1)[1] and found["commit_range"].endswith(found["commit"])
    assert found["direction"] == "improvement" and found["ratio"] == pytest.approx(1.05, abs=0.02)
    assert 0.005 < found["noise"] < 0.03  # the band it stands out of: uniform ±3% is σ 1.7%
    assert {"runner", "policy", "block_size", "metric", "first_night", "commit", "ratio"} <= set(found)
    assert (found["runner"], found["policy"], found["block_size"]) == ("torch", "paged", 16)

    slide = by[(DRIFT_CELL, THROUGHPUT)]
    assert slide["kind"] == "drift" and slide["direction"] == "regression" and slide["regressed_tonight"]
    assert slide["ratio"] == pytest.approx(0.995**29, abs=0.03)  # over the 30 nights

    for block in (16, 32):
        exact = by[(f"sim/paged b{block}", "mean_running")]
        assert exact["kind"] == "exact" and exact["noise"] is None
        assert exact["first_night"] == names[25] and exact["commit"] == names[25].rsplit("-", 1)[1]
        assert exact["ratio"] == pytest.approx(1.03, rel=1e-12)  # exact: the code change itself

    assert f"regressed against {names[0]}" in stderr and DRIFT_CELL in stderr
    page = (tmp_path / "nights" / "history" / "index.html").read_text()
    assert "drift" in page and names[25] in page
    assert (tmp_path / "nights" / "history" / f"{THROUGHPUT}.png").is_file()
    assert len(nights) == 30 and str(tmp_path / "nights" / "history" / "index.html") in stdout
    if CHROMIUM is not None:  # the page as a reader opens it: every graph loads, the changes listed
        facts = page_facts(tmp_path / "profile", tmp_path / "nights" / "history" / "index.html")
        graphs = len(list((tmp_path / "nights" / "history").glob("*.png")))
        assert facts["images-loaded"] == "yes" and int(facts["image-count"]) == graphs > 10, facts
        assert int(facts["change-rows"]) == len(changes) == 4, facts
        assert int(facts["scroll-width"]) <= int(facts["viewport-width"]) <= WINDOW[0], facts


def test_the_gate_passes_on_the_same_nights_without_the_step_and_the_drift(records: Path, tmp_path: Path) -> None:
    make_nights(records, tmp_path / "nights", QUIET)
    rc, changes, _, stderr = history(tmp_path / "nights", "--gate")
    assert rc == 0, stderr
    assert "gate passed" in stderr
    assert {(c["cell"], c["kind"]) for c in changes} == {("sim/paged b16", "exact"), ("sim/paged b32", "exact")}


def test_a_code_change_for_the_worse_fails_the_gate_until_a_later_night_is_accepted(
    records: Path, tmp_path: Path
) -> None:
    worse = Plan(edits=(step(lambda r: r["runner"] == "sim" and r["policy"] == "paged", "mean_running", 25, 0.9),))
    root = tmp_path / "nights"
    make_nights(records, root, worse)
    names = night_names(worse)
    rc, changes, _, stderr = history(root, "--gate")
    assert rc == 1 and f"since {names[25]}" in stderr, stderr
    assert all(c["direction"] == "regression" and c["regressed_tonight"] for c in changes)
    (root / "accepted").write_text(f"{names[3]}\n{names[26]}\n")  # a person accepted night 26
    rc, changes, _, stderr = history(root, "--gate")
    assert rc == 0, stderr
    assert changes and not any(c["regressed_tonight"] for c in changes)  # still found, no longer gating


def test_a_one_night_blip_is_not_a_change(records: Path, tmp_path: Path) -> None:
    once = Plan(edits=(blip(cell("torch", "paged", 32), THROUGHPUT, 12, 0.92),))
    make_nights(records, tmp_path / "nights", once)
    rc, changes, _, stderr = history(tmp_path / "nights", "--gate")
    assert rc == 0, stderr
    assert not [c for c in changes if c["metric"] == THROUGHPUT], changes


# -- bad input: one line, a non-zero exit, nothing written --------------------------------------


def test_an_empty_path_or_a_folder_without_nights_is_refused(tmp_path: Path) -> None:
    assert_one_line_error(kvbench("history", ""), "empty path")
    assert_one_line_error(kvbench("history", tmp_path / "absent"), "no such directory")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "not-a-night").mkdir()
    done = kvbench("history", tmp_path / "empty")
    assert_one_line_error(done, "holds no nights")
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["not-a-night"]
    (tmp_path / "empty" / "runs").mkdir()  # one results directory, not nights
    assert_one_line_error(kvbench("history", tmp_path / "empty"), "one results directory, not a folder of nights")


def test_a_night_with_a_corrupt_or_missing_table_is_named_and_skipped(records: Path, tmp_path: Path) -> None:
    root = tmp_path / "nights"
    nights = make_nights(records, root, Plan(nights=8))
    corrupt = sorted((nights[3] / "runs").glob("run_id=*/part-0.parquet"))[0]
    corrupt.write_bytes(b"PAR1 this is not parquet")
    shutil.rmtree(sorted((nights[5] / "steps").glob("run_id=*"))[0])
    rc, _, stdout, stderr = history(root)
    assert rc == 0, stderr
    assert f"skipped {nights[3].name}: {corrupt}" in stdout and "not a readable Parquet file" in stdout
    assert f"skipped {nights[5].name}: run " in stdout and "has no steps partition" in stdout
    assert "6 night(s) read" in stdout
    page = (root / "history" / "index.html").read_text()
    assert nights[3].name in page and nights[5].name in page and "has no steps partition" in page


def test_every_night_unreadable_writes_nothing(records: Path, tmp_path: Path) -> None:
    root = tmp_path / "nights"
    for night in make_nights(records, root, Plan(nights=3)):
        shutil.rmtree(night / "runs")
    assert_one_line_error(kvbench("history", root), "none of its 3 night(s) could be read", "no runs/ table")
    assert not (root / "history").exists()


def test_nights_of_different_suites_follow_only_the_matched_cells(records: Path, tmp_path: Path) -> None:
    root = tmp_path / "nights"
    nights = make_nights(records, root, Plan(nights=8))
    import pyarrow as pa
    import pyarrow.parquet as pq

    for night in nights[5:]:  # the last three nights ran another suite: sim only
        for path in (night / "runs").glob("run_id=*/part-0.parquet"):
            table = pq.read_table(path)
            if table.column("runner")[0].as_py() != "sim":
                shutil.rmtree(path.parent)
                continue
            rows = [dict(r, suite="other") for r in table.to_pylist()]
            pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    rc, _, stdout, stderr = history(root)
    assert rc == 0, stderr
    notes = [line for line in stdout.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: the nights ran 2 suites (history, other): only cells measured alike on at least two nights are followed"
    ], stdout


def test_bad_options_are_refused_before_anything_is_written(records: Path, tmp_path: Path) -> None:
    root = tmp_path / "nights"
    make_nights(records, root, Plan(nights=3))
    (tmp_path / "a-folder").mkdir()
    assert_one_line_error(kvbench("history", root, "--json", tmp_path / "a-folder"), "--json")
    assert_one_line_error(kvbench("history", root, "--tolerance", "nan"), "--tolerance")
    assert_one_line_error(kvbench("history", root, "--json", ""), "empty path")
    assert not (root / "history").exists()
    assert kvbench("history", root).returncode == 0
    (root / "history" / "mine.txt").write_text("a file of the user's")
    before = sorted(p.name for p in (root / "history").iterdir())
    assert_one_line_error(kvbench("history", root), "did not write", "mine.txt")
    assert sorted(p.name for p in (root / "history").iterdir()) == before


def test_nights_read_before_come_from_the_cache_and_a_night_rewritten_since_is_read_again(
    records: Path, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "nights"
    nights = make_nights(records, root, QUIET)
    rc, first, _, stderr = history(root)
    assert rc == 0 and "reading nights 1-30 of 30" in stderr and (root / "history" / "nights.parquet").is_file()
    rc, again, _, stderr = history(root)
    assert rc == 0 and "30 night(s) as read before" in stderr and "0 to read" in stderr, stderr
    assert again == first
    # Night 10 rewritten (its sim paged cells hold 10% fewer running): read from its files again.
    for path in (nights[10] / "runs").glob("run_id=*/part-0.parquet"):
        table = pq.read_table(path)
        rows = [
            dict(r, mean_running=r["mean_running"] * 0.9) if r["policy"] == "paged" else r for r in table.to_pylist()
        ]
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    rc, changed, _, stderr = history(root)
    assert rc == 0 and "29 night(s) as read before" in stderr and "1 to read" in stderr, stderr
    assert {(c["first_night"], c["kind"]) for c in changed} - {(c["first_night"], c["kind"]) for c in first} == {
        (nights[10].name, "exact"),
        (nights[11].name, "exact"),
    }
