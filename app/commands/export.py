"""``kvbench export DIR --format vllm-bench|pytorch-oss --out PATH``: runs in vLLM's benchmark formats.

One run (the directory's only run, or ``--run RUN_ID``) goes to ``--out`` as a file, or into
``--out`` when it is an existing directory; several runs go into ``--out`` as a directory, one
``<run_id>.json`` (``<run_id>.pytorch.json``) each. Every selected run must be ``ok`` and timed in
seconds; anything else is refused before a file is written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from ...harness.errors import KvbenchError, storage_error
from ...harness.records.safe_paths import nonempty_path, output_file
from ...harness.records.statuses import OK
from .base import Command

FORMATS: tuple[str, ...] = ("vllm-bench", "pytorch-oss")
SUFFIX: dict[str, str] = {"vllm-bench": ".json", "pytorch-oss": ".pytorch.json"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=nonempty_path, metavar="DIR", help="a results directory")
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="vllm-bench: the result JSON of `vllm bench serve`; pytorch-oss: the PyTorch benchmark database records",
    )
    p.add_argument(
        "--out",
        required=True,
        type=nonempty_path,
        metavar="PATH",
        help="the file to write; a directory (one <run_id>.json per run) when DIR holds several runs",
    )
    p.add_argument("--run", metavar="RUN_ID", help="export this run only")


def _select(out: Path, run: str | None) -> list[dict[str, Any]]:
    from ...harness.records.store import check_complete, read_table

    if not out.is_dir():
        raise KvbenchError(f"{out}: no such results directory")
    if not (out / "runs").is_dir():
        raise KvbenchError(f"{out}: no runs/ directory; not a kvbench results directory")
    check_complete(out)
    runs = read_table(out, "runs")
    if runs.empty:
        raise KvbenchError(f"{out}: holds no runs")
    if run is not None:
        runs = runs[runs["run_id"] == run]
        if runs.empty:
            raise KvbenchError(f"{out}: no run {run}")
    rows = runs.sort_values("run_id").to_dict("records")
    bad = [r for r in rows if r["status"] != OK]
    if bad:
        names = ", ".join(f"{r['run_id']} ({r['status']})" for r in bad[:3]) + (" …" if len(bad) > 3 else "")
        raise KvbenchError(f"{out}: only ok runs can be exported, not {names}; choose one with --run")
    steps = [r for r in rows if r.get("clock") == "steps"]
    if steps:
        raise KvbenchError(
            f"{out}: run {steps[0]['run_id']} is on the steps clock, its times are scheduler steps, "
            "not the seconds vLLM's fields hold"
        )
    return rows


def _targets(out: Path, run_ids: list[str], fmt: str) -> list[Path]:
    """The files to write: ``--out`` itself, or one per run inside ``--out`` when it is a real
    folder (never through a symbolic link: a link at ``--out`` is refused, whatever it points to)."""
    folder = os.path.isdir(out) and not os.path.islink(out)
    if len(run_ids) == 1 and not folder:
        return [out]
    if os.path.lexists(out) and not folder:
        output_file(out, "--out")  # a link or a device: named as what it is
        raise KvbenchError(f"--out {out}: exists and is not a directory, and {len(run_ids)} runs are to be exported")
    return [out / f"{rid}{SUFFIX[fmt]}" for rid in run_ids]


def non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The first infinite or NaN number in a JSON document and where it is (``p99_ttft_ms``,
    ``itls[3][0]``); None when every number is finite."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, dict):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, v in items:
        found = non_finite(v, path)
        if found is not None:
            return found
    return None


def encode(doc: Any, fmt: str, run_id: str) -> bytes:
    """A document as JSON text, the way vLLM writes non-finite numbers where JSON can hold them:
    ``pytorch-oss`` writes an infinity as the string "inf" (vLLM's ``InfEncoder`` in
    ``vllm/benchmarks/lib/utils.py``); ``vllm-bench``, which vLLM writes with plain ``json.dump``
    (``Infinity``, not JSON), refuses one, and so does either format a NaN."""
    found = non_finite(doc)
    if found is not None:
        where, value = found
        if fmt == "vllm-bench" or math.isnan(value):
            raise KvbenchError(
                f"run {run_id}: {where} is {value}, which JSON cannot hold; kvbench writes only finite "
                f"numbers in {fmt} files"
            )
        doc = _infinities_as_text(doc)
    return json.dumps(doc, allow_nan=False, default=str).encode("utf-8")


def _infinities_as_text(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"  # InfEncoder writes "inf" for either sign
    if isinstance(value, dict):
        return {k: _infinities_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_infinities_as_text(v) for v in value]
    return value


def export(args: argparse.Namespace) -> int:
    from ...harness.formats.pytorch_oss import settings_of, to_pytorch_oss
    from ...harness.formats.vllm_bench import to_vllm_bench
    from ...harness.records.atomic import write_bytes
    from ...harness.records.store import read_table

    rows = _select(args.dir, args.run)
    targets = _targets(args.out, [str(r["run_id"]) for r in rows], args.format)
    for path in targets:  # before any document is made: a link, a FIFO or a folder there is refused
        output_file(path, "--out")
    texts = []
    for row in rows:  # every document made before any is written: a refusal writes nothing
        requests = read_table(args.dir, "requests", {str(row["run_id"])})
        result = to_vllm_bench(row, requests)
        doc = result if args.format == "vllm-bench" else to_pytorch_oss(result, settings_of(row))
        texts.append(encode(doc, args.format, str(row["run_id"])))
    folder = targets[0].parent  # --out itself when the files go into it
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(folder, exc) from None
    for path, text in zip(targets, texts):
        write_bytes(path, text, "--out")
        print(path)
    return 0


COMMAND = Command(
    "export",
    help="write runs as `vllm bench serve` result JSON or PyTorch benchmark database records",
    description="Write each ok run of DIR in a format of vLLM's benchmarks: vllm-bench, the result JSON "
    "`vllm bench serve --save-result --save-detailed` writes (its field names, units and statistics), or "
    "pytorch-oss, the records it writes for the PyTorch OSS benchmark database. Fields kvbench's records "
    "cannot give are null and named in the JSON's kvbench.notes (docs/formats.md).",
    configure=configure,
    run=export,
)
