"""``kvbench run`` shows kvbench's own lines only, under either build of vLLM: what torch and vLLM
print (torch's deprecation warnings and "No CUDA runtime is found" under the CUDA build, vLLM's
platform warnings under the CPU build) goes to DIR/kvbench.log. CI runs this file under both builds.

The stand-ins below need no vLLM: a library whose logging handler looks up ``sys.stderr`` each
time it writes (torch 2.14's ``_StderrHandler``), and one that prints from a submodule imported
lazily, after the package's own import."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kvbench.runners.vllm.build import unavailable as vllm_unavailable

from tests.conftest import ROOT, suite_toml

SUITE = suite_toml(
    "console",
    model={"preset": "opt-13b", "kv_dtype": "fp16"},
    memory={"kv_budget": "1GiB", "max_model_len": 256},
    workload={"source": "fixed", "prompt_len": 32, "output_len": 8, "num_requests": 8, "arrival": "batch", "seed": 0},
    scheduler={"max_num_seqs": 8, "max_num_batched_tokens": 256},
    grid={"runner": ["sim", "vllm-sched"], "policy": ["paged"], "block_size": [16]},
)
# What a library's line looks like: a glog-style prefix (torch's "W1206 18:51:27.129000 7159 ..."),
# a level name, or a word kvbench never prints.
LIBRARY_LINE = re.compile(r"^[IWEF]\d{4} |\bINFO\b|\bWARNING\b|\bERROR\b|torch|deprecated|CUDA|Traceback")
VERDICT = "2 cell(s) run, 0 skipped, 0 failed, 0 infeasible"


def _message(line: str) -> str:
    """A library line without what differs from run to run: its time and pid prefix, up to the
    source location (torch's "W1206 ... torch/_opaque_base.py:6] ", vLLM's "WARNING ... [x.py:1] ")."""
    return line.split("] ", 1)[1] if "] " in line else line.strip()


def _cli(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kvbench.app.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


@pytest.mark.skipif(vllm_unavailable() is not None, reason=f"vllm-sched does not run here: {vllm_unavailable()}")
def test_run_console_shows_kvbench_lines_only_and_the_log_gets_the_rest(tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    runners = ("--runner", "sim", "--runner", "vllm-sched")
    # The same run with --verbose (in parallel) shows what the libraries print under this build.
    quiet = _cli("run", suite, "--out", tmp_path / "quiet", "--quiet", *runners)
    verbose = _cli("run", suite, "--out", tmp_path / "verbose", "--quiet", "--verbose", *runners)
    out, err = quiet.communicate(timeout=600)
    v_out, v_err = verbose.communicate(timeout=600)
    assert quiet.returncode == 0, err
    assert verbose.returncode == 0, v_err

    assert err.splitlines() == [VERDICT], err
    assert [line for line in out.splitlines() if LIBRARY_LINE.search(line)] == [], out
    assert out.splitlines()[-1].startswith("report: "), out

    log = (tmp_path / "quiet" / "kvbench.log").read_text(encoding="utf-8")
    library = [line for line in (v_err + v_out).splitlines() if line.strip() and line != VERDICT]
    library = [line for line in library if line not in out.splitlines() and not line.startswith("report: ")]
    for line in library:
        assert _message(line) in log, f"{line!r} (printed with --verbose) is not in kvbench.log:\n{log}"


# -- stand-ins: the two ways torch's lines escaped under the CUDA build ----------------------------

NOISY = textwrap.dedent("""
    import logging, sys

    class FollowingHandler(logging.Handler):
        # as torch 2.14's _StderrHandler: the stream is whatever sys.stderr is when a record comes
        @property
        def stream(self):
            return sys.stderr

        def emit(self, record):
            self.stream.write(self.format(record) + "\\n")

    log = logging.getLogger("noisy_pkg")
    log.addHandler(FollowingHandler())
    log.propagate = False

    def __getattr__(name):  # lazy submodules, as vLLM's top-level names are
        import importlib
        return importlib.import_module(f"noisy_pkg.{name}")
""")
NOISY_LAZY = textwrap.dedent("""
    import logging, os, sys
    logging.getLogger("noisy_pkg.lazy").warning("warned while a lazy submodule imports")
    print("printed while a lazy submodule imports", file=sys.stderr)
    os.write(2, b"fd 2 while a lazy submodule imports\\n")

    def later():
        logging.getLogger("noisy_pkg.lazy").warning("warned at run time")
""")
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kvbench.app.third_party import open_results_log, to_log

    out = Path(sys.argv[1])
    earlier = open(out / "earlier", "w+b")
    with to_log(earlier) as redirect:
        import noisy_pkg  # the package only: its submodule comes later
        print("kvbench probe line", file=sys.stderr)
        with open_results_log(out, earlier) as log:
            redirect.switch(log)
            noisy_pkg.lazy.later()
            print("kvbench progress", file=sys.stderr)
            print("kvbench table")
    print("kvbench after", file=sys.stderr)
""")


def test_lazy_submodules_and_handlers_that_follow_sys_stderr_write_to_the_log(tmp_path: Path) -> None:
    lib = tmp_path / "lib" / "noisy_pkg"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(NOISY)
    (lib / "lazy.py").write_text(NOISY_LAZY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "lib"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["kvbench probe line", "kvbench progress", "kvbench after"]
    assert proc.stdout.splitlines() == ["kvbench table"]
    log = (tmp_path / "kvbench.log").read_text(encoding="utf-8")
    for line in (
        "warned while a lazy submodule imports",
        "printed while a lazy submodule imports",
        "fd 2 while a lazy submodule imports",
        "warned at run time",
    ):
        assert line in log, log
    assert "kvbench" not in log
