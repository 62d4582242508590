"""Which of the simulator's modules a build compiles (mypyc), and whether this process runs them
compiled or as the Python they are compiled from.

An install compiles ``MODULES`` (``setup.py``) into extension modules beside their sources and
writes ``STAMP`` beside them: a digest of the sources it compiled. Python's importer prefers an
extension module to its ``.py``, so a source edited after the build would silently run the old
code. ``select_form``, run once by the package's ``__init__`` before any of them is imported,
therefore loads them compiled only when every one was built and the stamp still matches the
sources; otherwise it loads all of them from their ``.py`` files (compiled modules call each other
natively, so the two forms never mix in one process) and says why in ``FORM.reason``.
``KVBENCH_PURE=1`` asks for the Python form: at install (nothing is compiled) and at run time;
unset, empty or ``0`` leaves the compiled form where it was built. Any other value (``true``,
``yes``) is refused (``PureSettingError``), at install and at run time, rather than read as either.

The records are the same in both forms (the test suite runs on both); only the time differs.
Stdlib only: ``setup.py`` loads this file by path, before kvbench is installed.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# The step loop's hot modules, relative to this package. What calls into them per step or per
# event; the rest of the simulator (the reference scheduler, the drivers) stays Python.
MODULES: tuple[str, ...] = (
    "sequence",
    "scheduling_rule",
    "decoders",
    "bulk_rows",
    "step_price",
    "counted_stretch",
    "grouped_stretch",
    "policies.arena",
    "policies.contiguous",
    "policies.grouped_contiguous",
    "policies.paged",
    "policies.counting_prefix",
    "policies.shared_prefix",
    "policies.grouped",
    "policies.counting_grouped",
    "policies.grouped_prefix",
    "policies.counting_grouped_prefix",
    "offload.eviction",
    "offload.cpu_tier",
    "offload.connector",
    "offload.transfers",
    "offload.quiet",
)
STAMP = "compiled-sources.sha256"  # beside the modules: the digest of the sources a build compiled
PURE_ENV = "KVBENCH_PURE"
# What PURE_ENV may be set to, and whether it asks for the Python form.
PURE_VALUES: dict[str, bool] = {"": False, "0": False, "1": True}


class PureSettingError(ValueError):
    """``PURE_ENV`` set to a value it does not take (stdlib only: the package turns it into its
    one-line error, ``setup.py`` into a failed build)."""


def pure_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``PURE_ENV`` asks for the Python form: ``1`` does; unset, empty and ``0`` do not;
    anything else raises ``PureSettingError``, naming the variable and the values it takes."""
    value = (os.environ if environ is None else environ).get(PURE_ENV)
    if value is None:
        return False
    if value not in PURE_VALUES:
        shown = repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
        raise PureSettingError(
            f"{PURE_ENV}={shown} is not a setting it takes: 1 runs the simulator as Python, "
            "0 or empty (or unset) runs it compiled where the install compiled it"
        )
    return PURE_VALUES[value]


@dataclass(frozen=True)
class Form:
    """How this process runs ``MODULES``: ``compiled`` or ``python``, and why."""

    name: str
    reason: str

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


def source_paths(package_dir: Path) -> list[Path]:
    return [package_dir.joinpath(*m.split(".")).with_suffix(".py") for m in MODULES]


def sources_digest(package_dir: Path) -> str:
    """sha256 over the modules' names and sources, in ``MODULES``' order."""
    h = hashlib.sha256()
    for name, path in zip(MODULES, source_paths(package_dir), strict=True):
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _extension(source: Path) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules as their ``.py`` files, ahead of the extension modules beside them."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        where = self.paths.get(fullname)
        return None if where is None else importlib.util.spec_from_file_location(fullname, where)


def select_form(package: str, package_dir: Path) -> Form:
    """Decide the form for ``package`` (this package's dotted name) and, for the Python form where
    extension modules are present, put a finder ahead of them. ``PureSettingError`` where
    ``PURE_ENV`` holds a value it does not take."""
    sources = source_paths(package_dir)
    built = [_extension(s) for s in sources]
    stamp = package_dir / STAMP
    if pure_requested():
        form = Form("python", f"{PURE_ENV}=1")
    elif not all(built) or not stamp.exists():
        form = Form("python", "not compiled by this install")
    elif stamp.read_text().strip() != sources_digest(package_dir):
        form = Form("python", "its sources changed after the build: `pip install -e .` compiles them again")
        print(f"kvbench: the simulator runs as Python (slower): {form.reason}", file=sys.stderr)
    else:
        return Form("compiled", "mypyc")
    if any(built):
        names = {f"{package}.{m}": s for m, s in zip(MODULES, sources, strict=True)}
        sys.meta_path.insert(0, _SourceFinder(names))
    return form
