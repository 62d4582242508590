"""Other libraries' output goes to the run's log; kvbench's own lines reach the console."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = textwrap.dedent("""
    import logging, os, sys, warnings
    from pathlib import Path
    from kvbench.app.third_party import open_results_log, to_log

    out = Path(sys.argv[1])
    earlier = open(out / "earlier", "w+b")
    with to_log(earlier):
        os.write(2, b"probe chatter on fd 2\\n")
    with open_results_log(out, earlier) as log, to_log(log):
        os.write(2, b"C++ notice on fd 2\\n")
        os.write(1, b"C++ notice on fd 1\\n")
        warnings.warn("a FutureWarning from a library", FutureWarning)
        logging.getLogger("vllm.platforms").warning("a library's log line")
        print("kvbench progress", file=sys.stderr)
        print("kvbench table")
    print("kvbench after", file=sys.stderr)
""")


def test_third_party_output_goes_to_the_log_and_kvbench_lines_to_the_console(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["kvbench progress", "kvbench after"]
    assert proc.stdout.splitlines() == ["kvbench table"]
    log = (tmp_path / "kvbench.log").read_text(encoding="utf-8")
    for line in (
        "probe chatter on fd 2",
        "C++ notice on fd 2",
        "C++ notice on fd 1",
        "a FutureWarning from a library",
        "a library's log line",
    ):
        assert line in log, log
    assert log.index("probe chatter") < log.index("C++ notice on fd 2")  # what came first stays first
    assert "kvbench" not in log
