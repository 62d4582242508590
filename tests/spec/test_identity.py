"""One identity: what "the same work" and "the same cell" mean, for run ids, compare, the
report and diverge; which code produced each run, and what resume and the reports do with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kvbench.app.cli import main
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import code_identity, store
from kvbench.harness.records.schema import RUNS
from kvbench.harness.spec import identity
from kvbench.harness.spec.specs import ModelSpec, SchedulerSpec
from kvbench.reports.compare import BASE_ONLY, CAND_ONLY, SAME, code_notes, compare, to_json, to_markdown
from kvbench.reports.labels import GROUP_KEYS, code_note, work_differences
from kvbench.reports.tables import mismatches, summary
from reportkit import SCHED, run, runs_frame, write_records

from tests.conftest import DATA, run_spec, run_suite_text, suite_toml

PROFILE = DATA / "profile-opt-13b-fp16-b16.json"
TOL = 0.02


spec = run_spec


# -- run ids -----------------------------------------------------------------------------------


def test_run_ids_of_existing_specs_did_not_change() -> None:
    # Computed by the code before harness.spec.identity existed: a changed run id would make every
    # results directory run all its cells again.
    wid = "w0123456789abcdef"
    assert spec().run_id(wid) == "a57e87f0cad95ffd"
    assert (
        spec(runner="torch", device="cuda", model=ModelSpec(preset="llama-mini", kv_dtype="fp32")).run_id(wid)
        == "ef7f3d79eb18d7dd"
    )
    assert spec(policy="virtual-contiguous", page_bytes=2**20, repeat=2).run_id(wid) == "ea89075f6496de83"
    assert spec(scheduler=SchedulerSpec(clock="profile", clock_profile=str(PROFILE))).run_id(wid) == "5d6c72843b1c5e46"


def test_run_id_hashes_every_identity_key_and_only_where_it_applies() -> None:
    canon = spec(runner="torch", policy="virtual-contiguous").canonical("w")
    # Every key but the arena (contiguous policies only, and only when not first-fit), the
    # server URL (the serve runner only, and only when it attaches), the hybrid KV cache
    # manager (models whose layers are not all full attention only) and the CPU tier (only
    # with one).
    assert set(canon) == {identity.RUN_ID_NAMES.get(k.column, k.column) for k in identity.RUN} - {
        "arena",
        "serve_url",
        "hybrid_kv",
        "cpu_offload_bytes",
        "offload_policy",
    }
    assert "device" not in spec().canonical("w") and "page_bytes" not in spec().canonical("w")
    # The device counts for torch, not for sim; the page size for virtual-contiguous only.
    assert spec(runner="torch", device="cpu").run_id("w") != spec(runner="torch", device="cuda").run_id("w")
    assert spec(device="cpu").run_id("w") == spec(device="cuda").run_id("w")
    assert spec(page_bytes=2**20).run_id("w") == spec(page_bytes=2**21).run_id("w")
    assert spec(repeat=1).run_id("w") != spec().run_id("w")  # each repetition is a run of its own


def test_the_hybrid_manager_counts_only_for_a_model_of_other_layer_kinds() -> None:
    """Off or on changes nothing for full attention (run ids of such cells stay what they were);
    for a sliding-window hybrid both settings count."""
    assert "hybrid_kv" not in spec().canonical("w")
    assert spec(hybrid_kv=False).run_id("w") == spec().run_id("w")
    gpt_oss = ModelSpec(preset="gpt-oss-20b", kv_dtype="bf16")
    on, off = spec(model=gpt_oss), spec(model=gpt_oss, hybrid_kv=False)
    assert on.canonical("w")["hybrid_kv"] is True and off.canonical("w")["hybrid_kv"] is False
    assert on.run_id("w") != off.run_id("w")


def test_the_arena_counts_for_contiguous_policies_only_and_only_when_not_first_fit() -> None:
    ff = spec(policy="contiguous-oracle", block_size=1)
    buddy = ff.replace(arena="buddy")
    assert "arena" not in ff.canonical("w")  # the default: run ids from before the arena existed stay
    assert buddy.canonical("w")["arena"] == "buddy" and buddy.run_id("w") != ff.run_id("w")
    assert spec(arena="buddy").run_id("w") == spec().run_id("w")  # paged: the arena means nothing
    assert identity.key_value("arena", "sim", "contiguous-max", None) is None  # a row from before the column
    assert identity.key_value("arena", "sim", "contiguous-max", "first-fit") is None
    assert identity.key_value("arena", "sim", "contiguous-max", "buddy") == "buddy"
    assert identity.key_value("arena", "sim", "paged", "buddy") is None


def test_the_server_url_counts_for_an_attached_serve_run_only() -> None:
    started = spec(runner="serve", device="cpu", scheduler=SchedulerSpec(clock="measured"))
    attached = started.replace(serve_url="http://10.0.0.1:8000")
    assert "serve_url" not in started.canonical("w")  # run ids of managed servers are unchanged
    assert attached.canonical("w")["serve_url"] == "http://10.0.0.1:8000" and attached.run_id("w") != started.run_id(
        "w"
    )
    assert started.replace(serve_startup_timeout_s=5.0).run_id("w") == started.run_id("w")  # a timeout is not the work
    with pytest.raises(KvbenchError, match="serve runner"):
        spec(serve_url="http://10.0.0.1:8000")


def test_the_roofline_scale_counts_only_when_not_1() -> None:
    roof = spec(scheduler=SchedulerSpec(clock="roofline"))
    same = spec(scheduler=SchedulerSpec(clock="roofline", roofline_scale=1.0))
    scaled = spec(scheduler=SchedulerSpec(clock="roofline", roofline_scale=1.5))
    assert "roofline_scale" not in roof.canonical("w")["scheduler"]  # run ids from before the factor stay
    assert same.run_id("w") == roof.run_id("w") and scaled.run_id("w") != roof.run_id("w")
    # A timing setting: runs on another scale are the same scheduling, on another clock.
    assert identity.scheduling_part(scaled.canonical("w")["scheduler"]) == identity.scheduling_part(
        roof.canonical("w")["scheduler"]
    )


def test_compare_pairs_first_fit_runs_with_rows_from_before_the_arena_column() -> None:
    old = run("sim", "contiguous-oracle", mean_running=2.0)  # arena null, as in older files
    new = dict(old, arena="first-fit")
    buddy = dict(old, arena="buddy", run_id=old["run_id"] + "b")
    assert set(compare(pd.DataFrame([old]), pd.DataFrame([new]), TOL)["verdict"]) == {SAME}
    sided = compare(pd.DataFrame([old]), pd.DataFrame([buddy]), TOL)
    assert set(sided["verdict"]) == {BASE_ONLY, CAND_ONLY}
    cells = summary(runs_frame([new, buddy]))  # two cells of one comparison group
    assert len(cells) == 2 and cells["group"].nunique() == 1
    assert sorted(cells["arena"].map(lambda a: a if isinstance(a, str) else "-")) == ["-", "buddy"]


def test_a_copied_profile_is_the_same_run_id_its_path_is_not_identity(tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere.json"
    shutil.copy(PROFILE, copy)
    on = {p: spec(scheduler=SchedulerSpec(clock="profile", clock_profile=str(p))) for p in (PROFILE, copy)}
    assert on[PROFILE].run_id("w") == on[copy].run_id("w")
    assert "clock_profile" not in on[copy].canonical("w")["scheduler"]


# -- compare and the report: the same identity from the rows ------------------------------------


def torch_on(device: str, **metrics: object) -> dict:
    row = run("torch", "paged", 16, **{"mean_running": 4.0, "tokens_per_s": 100.0, **metrics})
    return dict(row, device=device, run_id=row["run_id"] + device)


def test_compare_never_pairs_a_cpu_run_with_a_cuda_run() -> None:
    result = compare(pd.DataFrame([torch_on("cpu")]), pd.DataFrame([torch_on("cuda")]), TOL)
    sided = dict(zip(result["cell"], result["verdict"]))
    assert sided == {"torch/paged b16 · device cpu": BASE_ONLY, "torch/paged b16 · device cuda": CAND_ONLY}
    same = compare(pd.DataFrame([torch_on("cuda")]), pd.DataFrame([torch_on("cuda", tokens_per_s=50.0)]), TOL)
    assert "tokens_per_s" in set(same["metric"])  # the same device pairs, and is judged


def test_the_report_keeps_cpu_and_cuda_repetitions_apart() -> None:
    cells = summary(runs_frame([torch_on("cpu", tokens_per_s=10.0), torch_on("cuda", tokens_per_s=1000.0)]))
    assert dict(zip(cells["device"], cells["tokens_per_s"])) == {"cpu": 10.0, "cuda": 1000.0}
    assert cells["group"].nunique() == 1  # one comparison group: the same work on two devices


def on_profile(path: str, document: dict, suffix: str, **metrics: object) -> dict:
    row = run("sim", "paged", 16, mean_running=4.0, **metrics)
    spec_doc = json.loads(row["spec_json"])
    spec_doc["scheduler"] = {**SCHED, "clock": "profile", "clock_profile": path}
    return dict(
        row,
        clock="profile",
        clock_profile=json.dumps(document, sort_keys=True),
        spec_json=json.dumps(spec_doc, sort_keys=True),
        run_id=row["run_id"] + suffix,
    )


def test_compare_pairs_a_profile_by_its_content_not_its_path() -> None:
    doc = json.loads(PROFILE.read_text())
    moved = compare(
        pd.DataFrame([on_profile("/a/p.json", doc, "a")]), pd.DataFrame([on_profile("/b/copy.json", doc, "b")]), TOL
    )
    assert set(moved["verdict"]) == {SAME}
    refit = dict(doc, terms={k: v * 2 for k, v in doc["terms"].items()})
    recalibrated = compare(
        pd.DataFrame([on_profile("/a/p.json", doc, "a")]), pd.DataFrame([on_profile("/a/p.json", refit, "b")]), TOL
    )
    assert set(recalibrated["verdict"]) == {BASE_ONLY, CAND_ONLY}
    # and the report: the copy is one cell (two repetitions), the refit another group
    cells = summary(
        runs_frame(
            [on_profile("/a/p.json", doc, "a"), on_profile("/b/c.json", doc, "b"), on_profile("/a/p.json", refit, "c")]
        )
    )
    assert sorted(cells["repeats"]) == [1, 2] and cells["group"].nunique() == 2


def ident_suite(budget: str, repeats: int | None = 2) -> str:
    return suite_toml(
        "ident",
        {"repeats": repeats},
        model={"preset": "opt-13b"},
        memory={"kv_budget": budget, "max_model_len": 512},
        workload={"source": "fixed", "prompt_len": 16, "output_len": 8, "num_requests": 6, "arrival": "batch"},
        grid={"runner": ["sim"], "policy": ["contiguous-max", "paged"], "block_size": [16]},
    )


def test_run_ids_compare_and_report_agree_on_real_records(tmp_path: Path) -> None:
    for budget in ("1GiB", "2GiB"):
        run_suite_text(ident_suite(budget), tmp_path / "out")
    runs = runs_frame(store.read_table(tmp_path / "out", "runs").to_dict("records"))
    assert runs["run_id"].nunique() == len(runs) == 8  # 2 budgets × 2 policies × 2 repetitions
    # Compare pairs the two repetitions of each cell, and nothing else ...
    result = compare(runs, runs, TOL)
    assert result["cell"].nunique() == 4 and set(result["n_base"]) == {2}
    # ... the report puts each budget in a group of its own, the repetitions in one cell ...
    cells = summary(runs)
    assert cells["group"].nunique() == 2 and set(cells["repeats"]) == {2}
    # ... and the work keys a group holds fixed are exactly the ones run ids and compare hold fixed.
    assert set(GROUP_KEYS) <= set(result.columns) and "repeat" not in result.columns
    a, b = runs[runs["budget_bytes"] == 2**30].iloc[0], runs[runs["budget_bytes"] == 2**31].iloc[0]
    assert work_differences(a, b) == [f"budget_bytes {2**30} vs {2**31}"]


def test_mismatches_name_scheduling_settings_but_not_the_clock() -> None:
    base = run("sim", "paged", 16)
    fewer = json.loads(base["spec_json"])
    fewer["scheduler"] = {**SCHED, "max_num_seqs": 8}
    other_clock = json.loads(base["spec_json"])
    other_clock["scheduler"] = {**SCHED, "clock": "roofline"}
    text = " | ".join(mismatches(runs_frame([base, dict(base, spec_json=json.dumps(fewer))])))
    assert "scheduler settings (max_num_seqs: 256, 8)" in text
    assert mismatches(runs_frame([base, dict(base, spec_json=json.dumps(other_clock))])) == []


def test_diverge_names_a_scheduler_setting_that_differs() -> None:
    base = run("sim", "paged", 16)
    other = json.loads(base["spec_json"])
    other["scheduler"] = {**SCHED, "max_num_batched_tokens": 512}
    frame = runs_frame([base, dict(base, spec_json=json.dumps(other))])
    a, b = frame.iloc[0], frame.iloc[1]
    assert work_differences(a, b, ("block_size",)) == ["max_num_batched_tokens 2048 vs 512"]


# -- code identity ---------------------------------------------------------------------------


def test_code_digest_covers_the_result_packages_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = code_identity.package_dirs()
    compute = code_identity.code_digest.__wrapped__  # uncached
    here = compute()
    copies = {}
    for name, path in real.items():
        copies[name] = tmp_path / name
        shutil.copytree(path, copies[name], ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code_identity, "package_dirs", lambda: dict(copies))
    digest = compute()
    assert digest == here  # the same code elsewhere: the same digest
    assert len(digest) == code_identity.DIGEST_HEX and int(digest, 16) >= 0
    (copies["runners"] / "sim.py").write_text((copies["runners"] / "sim.py").read_text() + "\n# changed\n")
    assert compute() != digest
    (copies["runners"] / "sim.py").write_text((real["runners"] / "sim.py").read_text())
    assert compute() == digest
    (copies["harness"] / "notes.txt").write_text("not code")
    assert compute() == digest
    assert set(real) == {"harness", "workloads", "runners"}  # reports and app never change records


def test_every_run_row_records_the_code_digest(tmp_path: Path) -> None:
    run_suite_text(ident_suite("1GiB"), tmp_path / "out")
    runs = store.read_table(tmp_path / "out", "runs")
    assert set(runs["code_digest"]) == {code_identity.code_digest()}


# -- resume: cells recorded by other code run again ----------------------------------------------


def set_code_digest(out: Path, run_id: str, value: str | None) -> None:
    path = store.partition_dir(out, "runs", run_id) / store.PART
    rows = pq.read_table(path, columns=list(RUNS.names)).to_pylist()
    rows[0]["code_digest"] = value
    store.write_partition(out, "runs", run_id, pa.Table.from_pylist(rows, schema=RUNS))


@pytest.fixture
def recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, list[str]]:
    suite = tmp_path / "s.toml"
    suite.write_text(ident_suite("1GiB", repeats=None))
    out = tmp_path / "out"
    assert main(["run", str(suite), "--out", str(out), "--no-report", "--quiet"]) == 0
    capsys.readouterr()
    ids = sorted(store.existing_run_ids(out))
    assert len(ids) == 2
    return suite, out, ids


def started(out: Path) -> dict[str, object]:
    runs = store.read_table(out, "runs")
    return dict(zip(runs["run_id"], runs["started_at"]))


def test_resume_runs_again_a_cell_recorded_by_other_code(recorded, capsys: pytest.CaptureFixture[str]) -> None:
    suite, out, (stale, fresh) = recorded
    set_code_digest(out, stale, "feedfacecafe")
    before = started(out)
    assert main(["run", str(suite), "--out", str(out), "--no-report", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "1 cell(s) in" in err and "recorded by other kvbench code; running them again" in err
    after = started(out)
    assert after[fresh] == before[fresh]  # recorded by this code: skipped
    assert after[stale] != before[stale]  # replaced, as --rerun replaces it
    runs = store.read_table(out, "runs")
    assert set(runs["code_digest"]) == {code_identity.code_digest()} and len(runs) == 2
    assert len(store.read_table(out, "steps", {stale})) > 0


def test_resume_runs_again_a_cell_recorded_before_code_digests(recorded, capsys) -> None:
    suite, out, (old, _) = recorded
    set_code_digest(out, old, None)
    assert main(["run", str(suite), "--out", str(out), "--no-report", "--quiet"]) == 0
    assert "1 cell(s) in" in capsys.readouterr().err
    assert set(store.read_table(out, "runs")["code_digest"]) == {code_identity.code_digest()}


def test_keep_stale_keeps_the_cell_and_says_so(recorded, capsys: pytest.CaptureFixture[str]) -> None:
    suite, out, (stale, _) = recorded
    set_code_digest(out, stale, "feedfacecafe")
    before = started(out)
    assert main(["run", str(suite), "--out", str(out), "--no-report", "--quiet", "--keep-stale"]) == 0
    captured = capsys.readouterr()
    assert "keeping 1 cell(s)" in captured.err and "(--keep-stale)" in captured.err
    assert started(out) == before
    runs = store.read_table(out, "runs")
    assert dict(zip(runs["run_id"], runs["code_digest"]))[stale] == "feedfacecafe"
    # the table printed after the run says it holds two versions of the code
    assert "note: these runs come from 2 versions of kvbench's code" in captured.out
    assert "feedfacecafe: 1 run" in captured.out


def test_keep_stale_with_rerun_is_a_one_line_error(recorded, capsys) -> None:
    suite, out, _ = recorded
    assert main(["run", str(suite), "--out", str(out), "--rerun", "--keep-stale"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--keep-stale" in err[0]


# -- reports and compare say when code differs -----------------------------------------------


def coded(rows: list[dict], digests: list[str | None]) -> list[dict]:
    return [dict(r, code_digest=d) for r, d in zip(rows, digests)]


def test_report_notes_runs_of_mixed_code(tmp_path: Path) -> None:
    from kvbench.reports.html import write_report

    rows = [
        run("sim", "contiguous-max", mean_running=2.0),
        run("sim", "paged", 16, mean_running=4.0),
        run("sim", "paged", 16, repeat=1, mean_running=4.0),
    ]
    mixed = write_records(tmp_path / "mixed", coded(rows, ["aaaaaaaaaaaa", "aaaaaaaaaaaa", "bbbbbbbbbbbb"]))
    page = write_report(mixed).read_text()
    md = (mixed / "report" / "summary.md").read_text()
    for text in (page, md):
        assert "2 versions of kvbench&#x27;s code" in text or "2 versions of kvbench's code" in text
        assert "aaaaaaaaaaaa: 2 runs, bbbbbbbbbbbb: 1 run" in text
    assert '<p class="warning">⚠ Warning: these runs come from 2 versions' in page
    one = write_records(tmp_path / "one", coded(rows, ["aaaaaaaaaaaa"] * 3))
    write_report(one)
    md_one = (one / "report" / "summary.md").read_text()
    assert "versions of kvbench" not in md_one and "code aaaaaaaaaaaa" in md_one


def test_code_note_counts_unrecorded_runs_as_a_version() -> None:
    assert code_note(["a", "a"]) is None and code_note([None, None]) is None
    assert "a: 1 run, not recorded: 1 run" in (code_note(["a", None]) or "")


def test_compare_notes_code_differences_without_failing(tmp_path: Path, capsys) -> None:
    rows = [run("sim", "contiguous-max", mean_running=2.0), run("sim", "paged", 16, mean_running=4.0)]
    assert code_notes(pd.DataFrame(coded(rows, ["a1", "a1"])), pd.DataFrame(coded(rows, ["a1", "a1"]))) == []
    across = code_notes(pd.DataFrame(coded(rows, ["a1", "a1"])), pd.DataFrame(coded(rows, ["b2", "b2"])))
    assert len(across) == 1 and "base and candidate ran different code (base a1; candidate b2)" in across[0]
    within = code_notes(pd.DataFrame(coded(rows, ["a1", "a1"])), pd.DataFrame(coded(rows, ["a1", "b2"])))
    assert any(n.startswith("candidate mixes runs of 2 versions") for n in within)
    result = compare(pd.DataFrame(rows), pd.DataFrame(rows), TOL)
    assert "Note: candidate mixes runs of 2 versions" in to_markdown(result, TOL, within)
    assert json.loads(to_json(result, TOL, within))["notes"] == within
    # the command: a note in its output, and the gate still passes on unchanged numbers
    base = write_records(tmp_path / "base", coded(rows, ["a1", "a1"]))
    cand = write_records(tmp_path / "cand", coded(rows, ["b2", "c3"]))
    assert main(["compare", str(base), str(cand)]) == 0
    out = capsys.readouterr().out
    assert "Note: candidate mixes runs of 2 versions of kvbench's code (b2: 1 run, c3: 1 run)" in out
    assert "Note: base and candidate ran different code" in out
