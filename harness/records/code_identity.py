"""Which code produced a run: a digest of the kvbench source that determines results.

Every run row records ``code_digest`` (through ``harness.records.provenance``), so that a
resumed sweep can re-run cells recorded by other code and reports can say when
they hold results of more than one version side by side.

What is hashed: the ``.py`` files of the packages whose code decides what a run
records — ``harness`` (specs, geometry, policies, scheduler, clocks, recorder,
schema), ``workloads`` (the requests themselves) and ``runners`` (what runs
them). Not ``reports`` nor ``app``: they read records or drive runs, and a change
there (a new table, a CLI flag) must not invalidate results that did not change.

The files are read where Python imports them from, so the digest is the same for
an editable install and for ``pip install .`` (where there is no git to ask),
and says nothing about files that are not code (caches, editor backups).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from ..errors import KvbenchError

PACKAGES: tuple[str, ...] = ("harness", "workloads", "runners")
DIGEST_HEX = 12  # as many hex digits as a row keeps: 48 bits, no collision among one project's versions


def package_dirs() -> dict[str, Path]:
    """Each hashed package's folder, found as the importer finds it (without importing it:
    the harness must not import the layers above it)."""
    # This module is <namespace>.harness.records.code_identity: the namespace is two packages up.
    namespace = __package__.rsplit(".", 2)[0] if __package__ and __package__.count(".") >= 2 else "kvbench"
    dirs: dict[str, Path] = {}
    for name in PACKAGES:
        spec = importlib.util.find_spec(f"{namespace}.{name}")
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if not locations:
            raise KvbenchError(f"code digest: cannot locate package {namespace}.{name}")
        dirs[name] = Path(locations[0])
    return dirs


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 (first ``DIGEST_HEX`` hex digits) over the hashed packages' ``.py`` files: each
    file's path inside its package and its bytes, in a fixed order. Computed once a process."""
    h = hashlib.sha256()
    for name, root in sorted(package_dirs().items()):
        for path in sorted(root.rglob("*.py")):
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise KvbenchError(f"code digest: cannot read {path} ({exc.strerror or exc})") from None
            h.update(f"{name}/{path.relative_to(root).as_posix()}".encode())
            h.update(b"\0")
            h.update(data)
            h.update(b"\0")
    return h.hexdigest()[:DIGEST_HEX]
