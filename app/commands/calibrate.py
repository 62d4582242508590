"""``kvbench calibrate DIR [DIR ...] --out FILE.json``: fit a step-time profile to an engine's measured steps.

Reads the measured steps (``step_wall_s`` and the step's work) of the ``vllm``
or ``torch`` runs in the DIRs (pooled), fits ``harness.clock.fit``'s model, prints its
error on held-out steps and writes a profile (``harness.clock.profile``) that
suites use with ``clock = "profile"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...harness.clock.model import TOKEN_KNEE
from ...harness.errors import KvbenchError
from ...harness.records.safe_paths import nonempty_path, output_file
from ...harness.records.statuses import OK
from ...harness.spec.capabilities import MEASURING_RUNNERS
from .base import Command

if TYPE_CHECKING:  # pandas loads when the command runs, not while the CLI builds its parser
    import pandas as pd

    from ...harness.spec.geometry import ModelGeometry

KIND_KEYS = ("runner", "model", "kv_dtype", "block_size", "device", "engine")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dirs",
        type=nonempty_path,
        nargs="+",
        metavar="DIR",
        help="results directories holding engine runs (several: their runs are pooled)",
    )
    p.add_argument("--out", type=nonempty_path, required=True, metavar="FILE.json", help="profile to write")
    p.add_argument(
        "--runner",
        choices=MEASURING_RUNNERS,
        default=None,
        help="whose steps to fit (default: vllm when DIR has vllm runs, else torch)",
    )
    p.add_argument("--policy", default="paged", help="which policy's runs (default: paged)")


def _engine(row: dict[str, Any]) -> str:
    if row["runner"] == "vllm":
        return f"vllm {row.get('vllm_version') or '?'}"
    return f"torch {row.get('torch_version') or '?'}"


def select_runs(runs: pd.DataFrame, runner: str | None, policy: str, where: str) -> pd.DataFrame:
    ok = runs[(runs["status"] == OK) & runs["runner"].isin(MEASURING_RUNNERS)]
    if ok.empty:
        raise KvbenchError(
            f"{where}: no ok runs of a runner that measures steps ({', '.join(MEASURING_RUNNERS)}); "
            "run a suite with the vllm runner first"
        )
    if runner is None:
        runner = "vllm" if (ok["runner"] == "vllm").any() else "torch"
    chosen = ok[(ok["runner"] == runner) & (ok["policy"] == policy)].copy()
    if chosen.empty:
        have = sorted({f"{r}/{p}" for r, p in zip(ok["runner"], ok["policy"])})
        raise KvbenchError(
            f"{where}: no ok {runner}/{policy} runs (has {', '.join(have)}); choose with --runner and --policy"
        )
    chosen["engine"] = [_engine(r) for r in chosen.to_dict("records")]
    kinds = chosen.drop_duplicates(list(KIND_KEYS))
    if len(kinds) > 1:
        listed = "; ".join(", ".join(f"{k} {r[k]}" for k in KIND_KEYS) for r in kinds.to_dict("records")[:3])
        raise KvbenchError(
            f"{where}: its {runner}/{policy} runs were measured on {len(kinds)} different setups "
            f"({listed}); a profile holds one: calibrate on a directory with one"
        )
    return chosen


def read_runs(dirs: list[Path]) -> pd.DataFrame:
    """The runs of every directory; with several, each run id is prefixed with its directory's
    index (the same cell run in two directories has the same id)."""
    import pandas as pd

    from ...harness.records import store

    frames = []
    for i, out in enumerate(dirs):
        if not out.is_dir():
            raise KvbenchError(f"{out}: no such results directory")
        store.check_complete(out)
        runs = store.read_table(out, "runs")
        runs["dir"] = str(out)
        runs["run_key"] = runs["run_id"] if len(dirs) == 1 else f"{i}/" + runs["run_id"]
        frames.append(runs)
    runs = pd.concat(frames, ignore_index=True)
    if runs.empty:
        raise KvbenchError(f"{', '.join(map(str, dirs))}: holds no runs")
    return runs


def measured_steps(where: str, runs: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    from ...harness.clock.fit import FEATURES, MIN_STEPS
    from ...harness.records import store

    frames = []
    for out, group in runs.groupby("dir", sort=False):
        steps = store.read_table(Path(out), "steps", set(group["run_id"]))
        steps = steps.merge(group[["run_id", "run_key", "workload_id"]], on="run_id", how="left")
        frames.append(steps)
    steps = pd.concat(frames, ignore_index=True)
    steps["run_id"] = steps.pop("run_key")
    usable = steps.dropna(subset=["step_wall_s", *FEATURES])
    usable = usable[usable["step_wall_s"] > 0]
    if usable.empty:
        raise KvbenchError(
            f"{where}: its runs hold no measured steps with their work (step_wall_s and "
            f"{', '.join(FEATURES)}); rerun them with this kvbench"
        )
    if len(usable) < MIN_STEPS:
        raise KvbenchError(
            f"{where}: only {len(usable)} measured steps; calibrate needs at least {MIN_STEPS} (run more requests)"
        )
    return usable.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)


def _geometry(run: dict[str, Any], where: str) -> ModelGeometry:
    from ...harness.spec.geometry import resolve_model
    from ...reports.labels import parse_spec

    model = parse_spec(run.get("spec_json")).get("model") or {}
    try:
        return resolve_model(model.get("preset"), model.get("config"))
    except KvbenchError as exc:
        raise KvbenchError(f"{where}: cannot resolve the runs' model ({exc})") from None


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Whole or not at all (``harness.records.atomic``): a failed write never leaves a half profile."""
    from ...harness.records.atomic import write_bytes

    write_bytes(path, (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode("utf-8"), "--out")


def run(args: argparse.Namespace) -> int:
    from ...harness.clock.fit import DISTURBED_RATIO, DISTURBED_WARN, fit
    from ...harness.clock.profile import profile_document
    from ...harness.records.provenance import provenance
    from ...reports.labels import workload_label

    dirs: list[Path] = args.dirs
    where = ", ".join(map(str, dirs))
    if args.out.suffix != ".json":
        raise KvbenchError(f"--out {args.out}: a profile is a .json file")
    output_file(args.out, "--out")  # a link, a device or a folder there is not replaced
    runs = read_runs(dirs)
    chosen = select_runs(runs, args.runner, args.policy, where)
    steps = measured_steps(where, chosen)
    result = fit(steps)
    first = chosen.iloc[0].to_dict()
    geometry = _geometry(first, where)
    counts = steps.groupby("run_id").size()
    data = {
        "results_dirs": [str(d.resolve()) for d in dirs],
        "steps": int(len(steps)),
        "held_out_steps": int(result.held_out.steps),
        "train_steps": int(result.train.steps),
        "runs": [
            {
                "run_id": r["run_id"],
                "dir": r["dir"],
                "workload_id": r["workload_id"],
                "workload": workload_label(r),
                "steps": int(counts.get(r["run_key"], 0)),
            }
            for r in chosen.to_dict("records")
        ],
    }
    measured_on = {
        "runner": first["runner"],
        "engine": first["engine"],
        "device": first.get("device"),
        "attention_backend": first.get("attention_backend"),
    }
    fit_doc = {
        "model": "step_s + per_token_s·scheduled_tokens + per_seq_s·scheduled_seqs + "
        "per_context_token_s·context_tokens + per_attention_pair_s·attention_pairs + "
        "per_early_token_s·min(scheduled_tokens, token_knee)",
        "method": "non-negative least squares on relative error, Huber-robust (IRLS)",
        "disturbed_steps_frac": result.disturbed,
        "held_out": "every 5th block of 32 consecutive steps of every run",
        "train_error": dataclasses.asdict(result.train),
        "held_out_error": dataclasses.asdict(result.held_out),
    }
    prov = provenance()
    doc = profile_document(
        result.terms,
        geometry,
        str(first["kv_dtype"]),
        int(first["block_size"]),
        measured_on,
        fit_doc,
        data,
        {
            "kvbench_version": prov["kvbench_version"],
            "git_sha": prov["git_sha"],
            "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        },
    )
    write_json(args.out, doc)
    print(
        f"fitted on {result.train.steps:,} steps of {len(chosen)} {first['runner']} run(s) "
        f"({first['engine']}, {first.get('device')}; {geometry.name}, KV {first['kv_dtype']}, "
        f"block {int(first['block_size'])})"
    )
    print(f"  terms:    {result.terms.describe()}")
    print(f"  fit:      {result.train.line()}")
    print(f"  held out: {result.held_out.line()}")
    if result.disturbed > DISTURBED_WARN:
        print(
            f"kvbench calibrate: warning: {result.disturbed:.1%} of the measured steps took over "
            f"{DISTURBED_RATIO:g}x their fitted time (an idle machine gives under 0.2%): another process was "
            "probably using the cores; this profile is unreliable, recalibrate on an idle machine",
            file=sys.stderr,
        )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


COMMAND = Command(
    "calibrate",
    help="fit sim's step clock to an engine's measured steps",
    description="Fit a step-time model (fixed + per token + per request + per KV position + per attention "
    f"pair + per token of a step's first {TOKEN_KNEE}, all ≥ 0) to the measured steps of the vllm "
    "(or torch) runs in DIR; print its error on steps held out from the fit; write a profile for "
    '[scheduler] clock = "profile".',
    configure=configure,
    run=run,
)
