"""The simulator's two forms (harness/sim/compiled.py): mypyc-compiled modules where an install
compiled them and their sources have not changed since, the Python they are compiled from
otherwise. Both write the same records; a stale or partial build is never loaded."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvbench.harness.sim import FORM, compiled

from tests.conftest import ROOT, suite_toml

# [grid] as text: its `together` is a list of inline tables, which a section's mapping does not write.
GRID = """
runner = ["sim"]
policy = ["paged", "paged-prefix", "contiguous-max", "contiguous-pow2", "contiguous-oracle"]
arena = ["first-fit", "buddy"]
block_size = [16]
together = [
    { preset = "llama-3-8b", kv_budget = "1GiB" },
    { preset = "gpt-oss-20b", kv_budget = "256MiB", hybrid_kv = true },
    { preset = "gpt-oss-20b", kv_budget = "256MiB", hybrid_kv = false },
    { preset = "deepseek-v3", kv_budget = "384MiB" },
]
"""
# Every compiled module at work: paged and prefix caching under preemption, every contiguous policy
# on both arenas, and KV cache groups (hybrid on and off, MLA).
SUITE = suite_toml(
    "forms",
    model={"kv_dtype": "bf16"},
    memory={"max_model_len": 4096},
    workload={
        "source": "uniform",
        "prompt_min": 100,
        "prompt_max": 1500,
        "output_min": 40,
        "output_max": 300,
        "num_requests": 60,
        "n": 2,
        "prefix_groups": 4,
        "prefix_len": 192,
        "arrival": "poisson",
        "rate": 20.0,
        "seed": 3,
    },
    scheduler={"max_num_seqs": 32, "max_num_batched_tokens": 1024, "clock": "roofline", "gpu": "A100-80GB"},
    grid=GRID,
)
# Runs the CLI after saying which form the process loaded.
CLI = "import sys\nfrom kvbench.harness.sim import FORM\nprint('form:', FORM.name, file=sys.stderr)\n" + (
    "from kvbench.app.cli import entry\nentry()"
)


def _records(suite: Path, out: Path, pure: bool) -> dict[str, bytes]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    args = [sys.executable, "-c", CLI, "run", str(suite), "--out", str(out), "--no-report", "--quiet"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert f"form: {'python' if pure else 'compiled'}" in proc.stderr
    files = {
        str(p.relative_to(out)): p.read_bytes() for t in ("steps", "requests") for p in (out / t).rglob("*.parquet")
    }
    assert len(files) == 2 * 32
    return files


@pytest.mark.skipif(FORM.name != "compiled", reason=f"the simulator is not compiled here: {FORM.reason}")
def test_both_forms_write_the_same_records(tmp_path: Path) -> None:
    suite = tmp_path / "forms.toml"
    suite.write_text(SUITE)
    assert _records(suite, tmp_path / "compiled", pure=False) == _records(suite, tmp_path / "python", pure=True)


def _package(tmp_path: Path, name: str, extensions: int) -> Path:
    """A package holding ``MODULES`` as sources that set ``FORM = "python"``, the first
    ``extensions`` of them beside an extension module that cannot load (so loading one fails)."""
    top = tmp_path / name
    for i, path in enumerate(compiled.source_paths(top)):
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text('FORM = "python"\n')
        if i < extensions:
            path.with_suffix(importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"not a library")
    return top


@pytest.fixture
def finders():
    """sys.meta_path and sys.path restored after the test (select_form adds a finder)."""
    meta, path = list(sys.meta_path), list(sys.path)
    yield
    sys.meta_path[:], sys.path[:] = meta, path


def _import_all(tmp_path: Path, name: str) -> None:
    sys.path.insert(0, str(tmp_path))
    try:
        for m in compiled.MODULES:
            assert __import__(f"{name}.{m}", fromlist=["FORM"]).FORM == "python"
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_a_build_whose_stamp_matches_its_sources_runs_compiled(tmp_path, finders, monkeypatch) -> None:
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    top = _package(tmp_path, "stamped", len(compiled.MODULES))
    (top / compiled.STAMP).write_text(compiled.sources_digest(top) + "\n")
    before = list(sys.meta_path)
    assert compiled.select_form("stamped", top) == compiled.Form("compiled", "mypyc")
    assert sys.meta_path == before  # nothing added: the importer loads the extensions
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert compiled.select_form("stamped", top).describe() == f"python ({compiled.PURE_ENV}=1)"
    _import_all(tmp_path, "stamped")  # the unloadable extensions are passed over


def test_a_source_changed_after_the_build_runs_as_python_and_says_so(tmp_path, finders, monkeypatch, capsys) -> None:
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    top = _package(tmp_path, "stale", len(compiled.MODULES))
    (top / compiled.STAMP).write_text(compiled.sources_digest(top) + "\n")
    changed = compiled.source_paths(top)[-1]
    changed.write_text(changed.read_text() + "# edited\n")
    form = compiled.select_form("stale", top)
    assert form.name == "python" and "`pip install -e .` compiles them again" in form.reason
    assert capsys.readouterr().err == f"kvbench: the simulator runs as Python (slower): {form.reason}\n"
    _import_all(tmp_path, "stale")


@pytest.mark.parametrize("extensions", [0, len(compiled.MODULES) - 1])
def test_a_partial_or_unstamped_build_runs_as_python(tmp_path, finders, monkeypatch, extensions) -> None:
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    top = _package(tmp_path, f"partial{extensions}", extensions)
    (top / compiled.STAMP).write_text(compiled.sources_digest(top) + "\n")
    assert compiled.select_form(f"partial{extensions}", top) == compiled.Form("python", "not compiled by this install")
    _import_all(tmp_path, f"partial{extensions}")
    full = _package(tmp_path, "unstamped", len(compiled.MODULES))
    assert compiled.select_form("unstamped", full).name == "python"
    _import_all(tmp_path, "unstamped")


def _init_arguments(path: Path, cls: str) -> list[tuple[str, str | None]]:
    """``cls.__init__``'s arguments in ``path``'s source, with their defaults (read from the
    source: a compiled class's signature is opaque)."""
    tree = ast.parse(path.read_text())
    (init,) = (
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    args = init.args.args
    defaults = [None] * (len(args) - len(init.args.defaults)) + [ast.unparse(d) for d in init.args.defaults]
    return [(a.arg, d) for a, d in zip(args, defaults, strict=True)]


def test_fast_seq_takes_seq_s_arguments() -> None:
    sim = ROOT / "harness" / "sim"
    assert _init_arguments(sim / "decoders.py", "FastSeq") == _init_arguments(sim / "sequence.py", "Seq")
