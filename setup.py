"""kvbench's build: the simulator's hot modules (``MODULES`` in harness/sim/compiled.py) compiled
with mypyc into extension modules beside their sources, and a stamp of the sources compiled.

Nothing is compiled where ``KVBENCH_PURE=1``, where mypyc is absent (a build without isolation)
or where the C compiler fails: the package then runs those modules as Python, with the same
records, more slowly (``kvbench doctor`` says which form runs and why). ``KVBENCH_PURE`` set to
anything but ``1``, ``0`` or empty fails the build, with the values it takes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = "kvbench.harness.sim"


def _load_compiled():
    spec = importlib.util.spec_from_file_location("_kvbench_compiled", ROOT / "harness" / "sim" / "compiled.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


compiled = _load_compiled()


def _say(message: str) -> None:
    print(f"kvbench build: {message}", file=sys.stderr)


# Checked before anything is built: a KVBENCH_PURE of "true" must not quietly compile.
try:
    PURE = compiled.pure_requested()
except compiled.PureSettingError as exc:
    _say(f"error: {exc}")
    sys.exit(2)


def _stage() -> Path:
    """A ``kvbench/`` folder whose ``harness`` links to the repository's: mypyc names a module by
    its folders, and the repository keeps ``harness/`` where the installed package has
    ``kvbench/harness/``."""
    stage = ROOT / "build" / "mypyc-stage"
    top = stage / "kvbench"
    top.mkdir(parents=True, exist_ok=True)
    (top / "__init__.py").touch()
    link = top / "harness"
    if link.is_symlink() and link.resolve() != (ROOT / "harness").resolve():
        link.unlink()  # a build folder copied from another clone: compile this one's sources
    if not link.is_symlink():
        link.symlink_to(ROOT / "harness", target_is_directory=True)
    return stage


def _mypyc_extensions() -> tuple[list[Extension], str]:
    """The extensions mypyc writes, and the digest of the sources it read (taken first: a source
    edited while the C compiles must not be stamped as compiled)."""
    digest = compiled.sources_digest(ROOT / "harness" / "sim")
    if PURE:
        _say(f"{compiled.PURE_ENV}=1: the simulator stays Python")
        return [], digest
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed here: the simulator stays Python")
        return [], digest
    sources = compiled.source_paths(_stage() / "kvbench" / "harness" / "sim")
    exts = mypycify([str(s) for s in sources], group_name=PACKAGE, target_dir=str(ROOT / "build" / "mypyc"))
    for ext in exts:
        ext.optional = True  # a compiler error leaves the Python form, with a warning
    return exts, digest


class BuildCompiled(build_ext):
    """Runs mypyc only when extensions are built (not for the build's metadata steps), then stamps
    the sources it compiled where every extension built."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules, self.digest = _mypyc_extensions()
        super().finalize_options()

    def run(self) -> None:
        self.built: set[str] = set()
        stamp = Path(self.get_ext_fullpath(f"{PACKAGE}.sequence")).parent / compiled.STAMP
        stamp.unlink(missing_ok=True)
        if not self.extensions:
            return
        super().run()
        if self.built != {e.name for e in self.extensions}:
            _say("compiling the simulator failed (above): it runs as Python")
            return
        stamp.write_text(self.digest + "\n")

    def build_extension(self, ext: Extension) -> None:
        super().build_extension(ext)
        self.built.add(ext.name)  # not reached where an optional extension fails


# A placeholder, so that the build runs build_ext (which puts the real extensions in its place).
setup(ext_modules=[Extension(f"{PACKAGE}.placeholder", sources=[])], cmdclass={"build_ext": BuildCompiled})
