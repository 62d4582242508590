"""KVBENCH_PURE takes 1 (the simulator as Python), 0 or empty (compiled where built) or nothing at
all; any other value is refused where it is read, by ``kvbench`` in one line and by the build, not
silently read as one or the other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvbench.harness.sim import compiled

from tests.conftest import ROOT, SMALL, assert_one_line_error, kvbench

REFUSED = ["garbage", "true", "yes", "false", "2", " 1", "1 ", "on"]


@pytest.mark.parametrize(("value", "pure"), [(None, False), ("", False), ("0", False), ("1", True)])
def test_the_values_it_takes(value: str | None, pure: bool) -> None:
    env = {} if value is None else {compiled.PURE_ENV: value}
    assert compiled.pure_requested(env) is pure


@pytest.mark.parametrize("value", REFUSED)
def test_any_other_value_is_refused_naming_the_variable_and_its_values(value: str) -> None:
    with pytest.raises(compiled.PureSettingError) as info:
        compiled.pure_requested({compiled.PURE_ENV: value})
    message = str(info.value)
    assert f"KVBENCH_PURE={value!r}" in message
    assert "1 runs the simulator as Python" in message and "0 or empty (or unset)" in message
    assert "\n" not in message


@pytest.mark.parametrize("value", ["garbage", "true", "yes"])
def test_kvbench_run_refuses_it_in_one_line_and_writes_nothing(tmp_path: Path, value: str) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text(SMALL)
    out = tmp_path / "out"
    proc = kvbench("run", suite, "--out", out, "--quiet", env={compiled.PURE_ENV: value})
    assert proc.returncode == 2
    assert_one_line_error(proc, "kvbench run: error:", f"KVBENCH_PURE={value!r}", "1 runs the simulator as Python")
    assert not out.exists()


def test_kvbench_doctor_refuses_it_in_one_line() -> None:
    proc = kvbench("doctor", env={compiled.PURE_ENV: "true"})
    assert proc.returncode == 2
    assert_one_line_error(proc, "kvbench doctor: error:", "KVBENCH_PURE='true'")


@pytest.mark.parametrize("value", ["", "0", "1"])
def test_kvbench_doctor_takes_the_values_it_takes(value: str) -> None:
    proc = kvbench("doctor", env={compiled.PURE_ENV: value})
    assert proc.returncode == 0, proc.stderr
    forms = [line for line in proc.stdout.splitlines() if line.startswith("simulator")]
    assert len(forms) == 1
    if value == "1":
        assert "python (KVBENCH_PURE=1)" in forms[0]
    else:
        assert "KVBENCH_PURE" not in forms[0]


def setup_py(value: str) -> subprocess.CompletedProcess[str]:
    """``setup.py --name``: it loads compiled.py and checks the variable before building anything."""
    env = dict(os.environ, **{compiled.PURE_ENV: value})
    return subprocess.run(
        [sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_build_fails_on_a_value_it_does_not_take() -> None:
    proc = setup_py("yes")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "kvbench build: error: KVBENCH_PURE='yes' is not a setting it takes" in proc.stderr
    assert proc.stdout == ""


def test_the_build_takes_1() -> None:
    proc = setup_py("1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "kvbench"
