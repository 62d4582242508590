"""The nights of a nightly results directory, read together (docs/ci.md, "History across nights").

``.ci/nightly`` writes one results directory a night, ``DIR/<UTC time>-<git sha>/`` (the time as
``20261207T021500Z``), and ``DIR/accepted`` lists, one per line, the nights a person accepted
(``.ci/nightly --accept``). ``read_nights`` finds the nights, reads every night's ``runs`` table as
one Parquet dataset with the declared schema (only the columns history uses), and returns them
in time order. A night that cannot be read whole (no ``runs/``, a corrupt or unreadable Parquet
file, a run whose steps or requests partition is missing, a file of a newer kvbench) is kept in
the list with the reason and left out of the rows: the rest are still read.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ...harness.errors import KvbenchError
from ...harness.records.schema import RUNS
from ...harness.records.store import PART, check_file
from ..compare import METRICS

NIGHT_NAME = re.compile(r"^(\d{8}T\d{6}Z)-([0-9A-Za-z._-]+)$")
ACCEPTED_FILE = "accepted"
# Tables a night's run must have beside its run row (``store.incomplete_runs`` checks counts too;
# here presence only: listing folders is cheap, opening every partition of a year is not).
BESIDE_RUNS: tuple[str, ...] = ("steps", "requests")
# The run-row columns history reads: the cell identity (``compare.MATCH_KEYS``, with what
# ``labels.with_keys`` derives them from), what a night says of itself, and the metrics.
COLUMNS: tuple[str, ...] = (
    "suite",
    "runner",
    "policy",
    "block_size",
    "arena",
    "serve_url",
    "kv_dtype",
    "budget_bytes",
    "max_model_len",
    "model",
    "workload_id",
    "workload_name",
    "workload_source",
    "arrival",
    "rate",
    "num_requests",
    "max_num_seqs",
    "max_num_batched_tokens",
    "clock",
    "repeat",
    "status",
    "error",
    "device",
    "hybrid_kv",
    "cpu_offload_bytes",
    "offload_policy",
    "git_sha",
    "kvbench_version",
    "code_digest",
    "spec_json",
    "clock_profile",
    *METRICS,
)
# Run files read per dataset scan (whole nights): a scan's memory grows with the files it has open
# (64 nights of 50 runs took 1.6 GB, 8 nights 0.66 GB), so a year is read a few hundred files at a time.
BATCH_FILES = 400


@dataclass(frozen=True)
class Night:
    """One night's results directory: its name, when and at which commit it ran, and why it was
    not read (None: read)."""

    name: str
    time: datetime
    commit: str  # the short sha in the name; the runs' git_sha where the name says "nogit"
    version: str  # kvbench's version its runs record ("" when unread)
    runs: int  # run rows read
    skipped: str | None = None


@dataclass(frozen=True)
class Nights:
    """Every night found under ``root`` in time order (skipped ones too), the run rows of those
    read (with a ``night`` column), and the last night a person accepted (None: none)."""

    root: Path
    nights: tuple[Night, ...]
    runs: pd.DataFrame
    accepted: str | None
    # Each read night's signature (``night_signature``): its rows may be read back from the
    # history's cache (``cache``) while the signature is the same.
    signatures: Mapping[str, str] = field(default_factory=dict)

    @property
    def read(self) -> tuple[Night, ...]:
        return tuple(n for n in self.nights if n.skipped is None)

    @property
    def skipped(self) -> tuple[Night, ...]:
        return tuple(n for n in self.nights if n.skipped is not None)


def night_dirs(root: Path) -> list[tuple[str, datetime, str]]:
    """(name, time, sha) of each folder of ``root`` named as ``.ci/nightly`` names a night, oldest
    first. Links are not nights (``latest`` points at one)."""
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        raise KvbenchError(f"{root}: cannot list ({exc.strerror or exc})") from None
    found = []
    for entry in entries:
        m = NIGHT_NAME.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False):
            when = datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            found.append((entry.name, when, m.group(2)))
    return sorted(found, key=lambda t: (t[1], t[0]))


def accepted_night(root: Path, names: Iterable[str]) -> str | None:
    """The latest night listed in ``root/accepted`` that is one of ``names``; None without one."""
    path = root / ACCEPTED_FILE
    if not path.is_file():
        return None
    try:
        listed = {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    except (OSError, UnicodeDecodeError) as exc:
        raise KvbenchError(f"{path}: cannot read ({exc})") from None
    known = [n for n in names if n in listed]
    return known[-1] if known else None


def _partitions(folder: Path) -> dict[str, tuple[Path, int, int]]:
    """run id → (its partition file, size, mtime in ns), for each ``run_id=`` folder under ``folder``
    holding one."""
    out: dict[str, tuple[Path, int, int]] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return out
    for entry in entries:
        if entry.name.startswith("run_id=") and entry.is_dir(follow_symlinks=False):
            path = Path(entry.path) / PART
            try:
                st = os.stat(path, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(st.st_mode):
                out[entry.name.split("=", 1)[1]] = (path, st.st_size, st.st_mtime_ns)
    return out


def _night_files(night: Path) -> tuple[list[Path], str, str | None]:
    """A night's run-row files and its signature (its run files' names, sizes and times: a night
    rewritten since is read again), or why the night cannot be read whole."""
    if not (night / "runs").is_dir():
        return [], "", "no runs/ table (the night's run did not complete)"
    try:
        runs = _partitions(night / "runs")
        beside = {table: _partitions(night / table) for table in BESIDE_RUNS}
    except OSError as exc:
        return [], "", f"cannot list its tables ({exc.strerror or exc})"
    if not runs:
        return [], "", "its runs/ table holds no run"
    for table, parts in beside.items():
        missing = sorted(set(runs) - set(parts))
        if missing:
            return [], "", f"run {missing[0]} has no {table} partition ({table}/run_id={missing[0]}/{PART} is missing)"
    ids = sorted(runs)
    signature = hashlib.sha256("\n".join(f"{k} {runs[k][1]} {runs[k][2]}" for k in ids).encode()).hexdigest()[:32]
    return [runs[k][0] for k in ids], signature, None


def _unreadable(path: Path) -> str | None:
    """Why ``path`` is not a run file this kvbench reads (``store.check_file``), or None."""
    try:
        check_file(path)
    except KvbenchError as exc:
        return str(exc)
    return None


SCHEMA = pa.schema([RUNS.field(c) for c in COLUMNS])


def _scan(files: Sequence[Path]) -> pa.Table:
    """The run rows of ``files`` (one dataset, the declared schema), with each row's file."""
    dataset = ds.dataset([str(f) for f in files], schema=SCHEMA, format="parquet")
    return dataset.to_table(columns=[*COLUMNS, "__filename"])


def _read_batch(batch: list[tuple[Path, list[Path]]]) -> tuple[pa.Table | None, dict[Path, str]]:
    """The rows of a batch of nights; a batch that fails is read night by night to name the bad file."""
    files = [f for _, fs in batch for f in fs]
    try:
        return _scan(files), {}
    except (pa.ArrowInvalid, OSError):
        pass
    tables, bad = [], {}
    for night, fs in batch:
        try:
            tables.append(_scan(fs))
        except (pa.ArrowInvalid, OSError):
            bad[night] = next((w for f in fs if (w := _unreadable(f) or _unscannable(f))), "a file cannot be read")
    return (pa.concat_tables(tables) if tables else None), bad


def _unscannable(path: Path) -> str | None:
    try:
        pq.read_table(path, schema=SCHEMA, columns=list(COLUMNS))
    except (pa.ArrowInvalid, OSError) as exc:
        return f"{path}: cannot read ({str(exc).splitlines()[0]})"
    return None


def read_nights(
    root: Path,
    progress: Callable[[str], None] = lambda _: None,
    cached: pd.DataFrame | None = None,
) -> Nights:
    """Every night under ``root``: refused in one line when ``root`` is not a folder or holds none.
    ``cached``: rows read before, with each night's signature (``cache.load_cache``); a night whose
    signature is unchanged is taken from them instead of its files."""
    root = Path(root)
    if not root.exists():
        raise KvbenchError(f"{root}: no such directory")
    if not root.is_dir():
        raise KvbenchError(f"{root}: not a directory")
    found = night_dirs(root)
    if not found and (root / "runs").is_dir():
        raise KvbenchError(
            f"{root}: is one results directory, not a folder of nights: `kvbench report {root}` reads it; "
            "history reads the folder .ci/nightly --results fills, one results directory a night"
        )
    if not found:
        raise KvbenchError(
            f"{root}: holds no nights (folders named <UTC time>-<sha>, as .ci/nightly writes them, "
            "e.g. 20261207T021500Z-1a2b3c4)"
        )
    why: dict[str, str] = {}
    signatures: dict[str, str] = {}
    readable: list[tuple[Path, list[Path]]] = []
    known = _cached_signatures(cached)
    frames = []
    for name, _, _ in found:
        files, signature, reason = _night_files(root / name)
        if reason:
            why[name] = reason
            continue
        signatures[name] = signature
        if known.get(name) != signature:
            # A night is written by one kvbench: its first file says which schema (a newer one is refused).
            reason = _unreadable(files[0])
            if reason:
                why[name] = reason
            else:
                readable.append((root / name, files))
    if known:
        reused = [n for n in signatures if n not in why and known.get(n) == signatures[n]]
        assert cached is not None
        frames.append(cached[cached["night"].isin(reused)].drop(columns=[SIGNATURE]))
        progress(f"{len(reused)} night(s) as read before (DIR/history's cache), {len(readable)} to read")
    done = 0
    for batch in _batches(readable):
        progress(f"reading nights {done + 1}-{done + len(batch)} of {len(readable)}")
        done += len(batch)
        table, bad = _read_batch(batch)
        why.update({p.name: w for p, w in bad.items()})
        if table is not None:
            frame = table.to_pandas()
            # __filename is DIR/<night>/runs/run_id=<id>/part-0.parquet: the night is 3 folders up
            frame["night"] = [Path(f).parents[2].name for f in frame.pop("__filename")]
            frames.append(frame[~frame["night"].isin(why)])
    frames = [f for f in frames if len(f)]
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*COLUMNS, "night"])
    counts = runs["night"].value_counts().to_dict()
    versions = runs.groupby("night")["kvbench_version"].agg(_mode).to_dict() if len(runs) else {}
    shas = runs.groupby("night")["git_sha"].agg(_mode).to_dict() if len(runs) else {}
    nights = tuple(
        Night(
            name=name,
            time=when,
            commit=(str(shas.get(name) or "")[:12] or sha) if sha == "nogit" else sha,
            version=str(versions.get(name) or ""),
            runs=int(counts.get(name, 0)),
            skipped=why.get(name),
        )
        for name, when, sha in found
    )
    if not any(n.skipped is None for n in nights):
        first = nights[0]
        raise KvbenchError(f"{root}: none of its {len(nights)} night(s) could be read ({first.name}: {first.skipped})")
    read = [n.name for n in nights if n.skipped is None]
    return Nights(root, nights, runs, accepted_night(root, read), {n: signatures[n] for n in read})


def _batches(readable: list[tuple[Path, list[Path]]]) -> list[list[tuple[Path, list[Path]]]]:
    """Whole nights, about ``BATCH_FILES`` run files a batch."""
    batches: list[list[tuple[Path, list[Path]]]] = [[]]
    files = 0
    for night in readable:
        if files >= BATCH_FILES:
            batches.append([])
            files = 0
        batches[-1].append(night)
        files += len(night[1])
    return [b for b in batches if b]


SIGNATURE = "night_signature"  # the cache's column holding each row's night's signature


def _cached_signatures(cached: pd.DataFrame | None) -> dict[str, str]:
    if cached is None or cached.empty:
        return {}
    firsts = cached.drop_duplicates("night")
    return dict(zip(firsts["night"].astype(str), firsts[SIGNATURE].astype(str)))


def _mode(values: pd.Series) -> str:
    values = values.dropna()
    return str(values.mode().iloc[0]) if len(values) else ""
