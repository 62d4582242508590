"""``kvbench import FILE.json ... [--out DIR] [--name NAME] [--like RUN_DIR [--like-run RUN_ID]]``.

Reads the result JSON of ``vllm bench serve`` (with or without ``--save-detailed``) into a
results directory: one run per file (the files are repetitions of one cell: repeat 0, 1, …),
runner ``vllm-bench``, its requests from the per-request lists when the file has them, no steps,
allocation columns null. With ``--like``, each run takes the work and cell of a kvbench run of
the same work (checked against its requests), so that ``kvbench compare`` sets them side by side.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ...harness import __version__
from ...harness.errors import KvbenchError, storage_error
from ...harness.records.safe_paths import nonempty_path
from ...harness.records.statuses import OK
from .base import Command

# `--save-detailed` keeps every request's ITLs: a large benchmark's file runs to hundreds of MB.
MAX_RESULT_BYTES = 4 * 2**30
# The run-row columns an import takes from the --like run: the work and cell it stands in.
LIKE_COLUMNS: tuple[str, ...] = (
    "policy",
    "block_size",
    "arena",
    "kv_dtype",
    "kv_bytes_per_token",
    "budget_bytes",
    "budget_positions",
    "max_model_len",
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "workload_id",
    "workload_name",
    "workload_source",
    "arrival",
    "rate",
    "max_num_seqs",
    "max_num_batched_tokens",
    "clock",
    "device",
    "attention_backend",
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files",
        type=nonempty_path,
        nargs="+",
        metavar="FILE.json",
        help="`vllm bench serve` result files (repetitions)",
    )
    p.add_argument("--out", type=nonempty_path, metavar="DIR", help="results directory (default kvbench-results/NAME)")
    p.add_argument("--name", help="the suite name the runs are recorded under (default: the first file's name)")
    p.add_argument(
        "--like",
        type=nonempty_path,
        metavar="RUN_DIR",
        help="a results directory holding a kvbench run of the same work: the imported runs take its cell",
    )
    p.add_argument("--like-run", metavar="RUN_ID", help="which run of RUN_DIR (needed when it holds several cells)")


def _read(path: Path) -> tuple[dict[str, Any], str]:
    """A result file's document and digest. A regular file only, as every input file kvbench reads
    (``harness.files``): a FIFO would block, a device never end, a folder is no result."""
    from ...harness.files import read_bytes_capped
    from ...harness.formats.vllm_bench import file_digest, read_document

    try:
        data = read_bytes_capped(path, "vllm bench serve result file", MAX_RESULT_BYTES)
    except FileNotFoundError:
        raise KvbenchError(f"{path}: no such file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KvbenchError(f"{path}: not JSON (not UTF-8 text)") from None
    return read_document(text, str(path)), file_digest(data)


def like_run(like: Path, run_id: str | None) -> tuple[dict[str, Any], Any]:
    """The kvbench run the imports stand beside, and its requests."""
    from ...harness.formats.vllm_bench import IMPORTED_RUNNER
    from ...harness.records.store import check_complete, read_table
    from ...reports.labels import with_keys

    if not (like / "runs").is_dir():
        raise KvbenchError(f"--like {like}: not a kvbench results directory (no runs/)")
    check_complete(like)
    runs = read_table(like, "runs")
    runs = runs[(runs["status"] == OK) & (runs["runner"] != IMPORTED_RUNNER)]
    if run_id is not None:
        runs = runs[runs["run_id"] == run_id]
        if runs.empty:
            raise KvbenchError(f"--like {like}: no ok kvbench run {run_id}")
    if runs.empty:
        raise KvbenchError(f"--like {like}: holds no ok kvbench run")
    keyed = with_keys(runs)
    from ...reports.compare import MATCH_KEYS

    cells = {tuple(str(r.get(k)) for k in MATCH_KEYS) for r in keyed.to_dict("records")}
    if len(cells) > 1:
        raise KvbenchError(f"--like {like}: holds {len(cells)} cells; name the run with --like-run RUN_ID")
    row = runs.sort_values("run_id").iloc[0].to_dict()
    if row.get("clock") != "measured":
        raise KvbenchError(
            f"--like run {row['run_id']} is on the {row.get('clock')} clock; a `vllm bench serve` result is "
            "measured time and stands only beside a run on the measured clock"
        )
    return row, read_table(like, "requests", {str(row["run_id"])})


def same_work(doc: dict[str, Any], name: str, like: dict[str, Any], requests: Any) -> None:
    """Refuse a result that is not the work of the --like run: its request count, prompt lengths
    and (when every request completed) output lengths, as lists when the result has them, as totals when not."""
    from ...harness.formats.vllm_bench import has_requests

    rid = like["run_id"]
    n = int(doc["completed"]) + int(doc["failed"])
    if n != len(requests):
        raise KvbenchError(f"{name}: {n} requests, run {rid} of --like has {len(requests)}: not the same work")
    prompts = sorted(int(v) for v in requests["prompt_len"])
    outputs = sorted(int(v) for v in requests["output_len"])
    complete = int(doc["failed"]) == 0
    if has_requests(doc):
        if sorted(int(v) for v in doc["input_lens"]) != prompts:
            raise KvbenchError(f"{name}: its prompt lengths are not those of run {rid} of --like: not the same work")
        if complete and sorted(int(v) for v in doc["output_lens"]) != outputs:
            raise KvbenchError(f"{name}: its output lengths are not those of run {rid} of --like: not the same work")
    elif complete and (doc["total_input_tokens"], doc["total_output_tokens"]) != (sum(prompts), sum(outputs)):
        raise KvbenchError(
            f"{name}: {doc['total_input_tokens']} prompt and {doc['total_output_tokens']} output tokens, "
            f"run {rid} of --like has {sum(prompts)} and {sum(outputs)}: not the same work"
        )


def _own_work_id(doc: dict[str, Any]) -> str:
    """Without --like: the work as the result states it (the per-request lengths, or its totals)."""
    from ...harness.formats.vllm_bench import has_requests
    from ...harness.spec.identity import digest

    if has_requests(doc):
        return "vllm-bench-" + digest({"input_lens": doc["input_lens"], "output_lens": doc["output_lens"]})
    keys = ("num_prompts", "request_rate", "burstiness", "total_input_tokens", "total_output_tokens")
    return "vllm-bench-" + digest({k: doc.get(k) for k in keys})


def run_row(imported: Any, doc: dict[str, Any], like: dict[str, Any] | None, suite: str, repeat: int) -> dict:
    from ...harness.formats.vllm_bench import IMPORTED_RUNNER

    row: dict[str, Any] = {"suite": suite, "runner": IMPORTED_RUNNER, "repeat": repeat, "kvbench_version": __version__}
    block = dict(imported.block)
    if like is not None:
        row.update({k: _plain(like.get(k)) for k in LIKE_COLUMNS})
        block["like"] = {"run_id": like["run_id"], "runner": like["runner"]}
        try:
            spec = json.loads(like.get("spec_json") or "{}")
        except ValueError:
            spec = {}
    else:
        rate = doc.get("request_rate")
        numeric = isinstance(rate, (int, float)) and not isinstance(rate, bool)
        row.update(
            model=doc.get("model_id"),
            workload_id=_own_work_id(doc),
            workload_source=IMPORTED_RUNNER,  # a dataset of `vllm bench serve`'s; the result does not say which
            arrival=_arrival(rate, doc.get("burstiness")),
            rate=float(rate) if numeric and rate is not None else None,
            clock="measured",
        )
        spec = {}
    spec["imported"] = block
    row.update(imported.row)
    row["spec_json"] = json.dumps(spec, sort_keys=True, default=str)
    return row


def _arrival(rate: Any, burstiness: Any) -> str | None:
    """kvbench's name for vLLM's arrival process: every request at once at rate "inf", else gamma
    intervals of shape ``burstiness`` (1: Poisson)."""
    if rate == "inf":
        return "batch"
    if burstiness == 1:
        return "poisson"
    return "gamma" if isinstance(burstiness, (int, float)) else None


def _plain(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v.item() if hasattr(v, "item") else v


def _drop_empty_folders(out: Path, before: set[str]) -> None:
    """The table folders an aborted import made (empty once its temporary partitions are gone)."""
    from ...harness.records.safe_paths import own_folders

    for name in own_folders():
        if name not in before:
            try:
                (out / name).rmdir()
            except OSError:
                pass  # not made, or not empty: not ours to remove


def import_(args: argparse.Namespace) -> int:
    from ...harness.formats.vllm_bench import from_vllm_bench
    from ...harness.records.lock import ResultsLock
    from ...harness.records.recorder import RunRecorder
    from ...harness.records.safe_paths import check_results_layout
    from ...harness.spec.identity import digest
    from ...harness.spec.names import path_component
    from .run import RESULTS_ROOT, create_results_dir, discard_if_untouched

    name = args.name if args.name is not None else args.files[0].name.removesuffix(".json")
    name = path_component(name, "--name")
    out = args.out if args.out is not None else RESULTS_ROOT / name
    if args.like is not None and os.path.lexists(out) and out.resolve() == args.like.resolve():
        raise KvbenchError(
            f"--out {out} is the --like directory: there the imported runs would pool with the run's own "
            "repetitions; import into another directory and compare the two"
        )
    like, like_requests = like_run(args.like, args.like_run) if args.like is not None else (None, None)
    # Everything read and checked before anything is written: bad input leaves no trace.
    rows: list[tuple[str, dict[str, Any], dict[str, list]]] = []
    seen: dict[str, Path] = {}
    for i, path in enumerate(args.files):
        doc, sha = _read(path)
        if sha in seen:
            raise KvbenchError(f"{path}: the same result as {seen[sha]}; a repetition is another run of the benchmark")
        seen[sha] = path
        if like is not None:
            same_work(doc, str(path), like, like_requests)
        imported = from_vllm_bench(doc, path.name, sha)
        rid = digest({"vllm_bench_sha256": sha, "like_run": like["run_id"] if like else None})
        rows.append((rid, run_row(imported, doc, like, name, i), imported.requests))
    if os.path.lexists(out) and not out.is_dir():
        raise KvbenchError(f"--out {out}: exists and is not a directory")
    made = [d for d in (out, *out.parents) if not os.path.lexists(d)]  # what this import creates
    create_results_dir(out)
    try:
        before = {p.name for p in out.iterdir()}
    except OSError as exc:
        raise storage_error(out, exc, "cannot read") from None
    with ResultsLock(out, "import") as lock:
        check_results_layout(out)
        budget = int(like["budget_positions"]) if like is not None and like.get("budget_positions") else 0
        written = 0
        try:
            for rid, row, requests in rows:
                RunRecorder(out, rid, budget).finish(requests, row)
                written += 1
        except BaseException:
            if not written:  # nothing of this import stands: no folder, no lock, no directory it made
                _drop_empty_folders(out, before)
                discard_if_untouched(out, before, made, lock)
            raise
    n_req = sum(len(r[2]["request_id"]) for r in rows)
    print(
        f"{out}: {len(rows)} run(s) imported from vllm bench serve ({n_req} requests)"
        + (f", in the cell of run {like['run_id']} ({like['runner']}/{like['policy']})" if like else "")
    )
    return 0


COMMAND = Command(
    "import",
    help="read `vllm bench serve` result JSON into a results directory",
    description="Read the result JSON of `vllm bench serve` (with or without --save-detailed) into a kvbench "
    "results directory: one run per file (several files: repetitions of one cell), runner vllm-bench, its "
    "requests from the per-request lists, allocation columns null. --like RUN_DIR gives the runs the cell of a "
    "kvbench run of the same work (checked), so that `kvbench compare` gates one against the other.",
    configure=configure,
    run=import_,
)
