"""A server process tree kvbench starts, and makes sure to end on every way out.

The server is not kvbench's child but its grandchild: kvbench starts a small watchdog (plain
Python, no imports beyond the standard library) in a session of its own, and the watchdog starts
the server in another new session, so the server and every process it forks (vLLM's engine core)
share one process group that nothing else is in. The watchdog ends that group (SIGTERM, then
SIGKILL after a grace period) when

- kvbench asks (``ServerProcess.stop``: success, failure, timeout, and the ``finally`` that
  SIGINT and SIGTERM of kvbench run through, ``app.signals``);
- kvbench dies without asking (SIGKILL, a crash): the kernel tells the watchdog
  (``PR_SET_PDEATHSIG`` = SIGTERM) and it also polls its parent's pid, in case that signal was
  set too late;
- the server exits by itself (a failed start: a port taken, a bad argument).

The group is over when no live process of it is left (``group_alive`` reads ``/proc``: a zombie
waiting for its reaper does not count).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...harness.errors import KvbenchError

GRACE_S = 10.0  # SIGTERM, then this long before SIGKILL: vLLM shuts its engine core down cleanly

# The watchdog, run as ``python -c WATCHDOG PARENT_PID GRACE_S LOG_PATH CMD...``. It prints the
# server's pid (= its process group) on stdout, then waits.
WATCHDOG = r"""
import ctypes, os, signal, subprocess, sys, time
parent, grace, log = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
cmd = sys.argv[4:]
stop = []
def on_signal(signum, frame):
    stop.append(signum)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, on_signal)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except Exception:
    pass  # not Linux: the parent poll below still ends the server
def alive(pgid):
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != b"Z" and int(stat[2]) == pgid:
            return True
    return False
with open(log, "ab") as out:
    child = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
print(child.pid, flush=True)
while not stop and child.poll() is None and os.getppid() == parent:
    time.sleep(0.2)
pgid = child.pid
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        break
    end = time.monotonic() + wait
    while time.monotonic() < end:
        child.poll()
        if not alive(pgid):
            break
        time.sleep(0.1)
    else:
        continue
    break
child.poll()
"""


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in process group ``pgid`` (Linux ``/proc``)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != b"Z" and int(stat[2]) == pgid:
            return True
    return False


class ServerProcess:
    """A server command run under the watchdog (module docstring); ``stop`` ends it, always."""

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], log: Path, grace_s: float = GRACE_S) -> None:
        self.log = log
        self.grace_s = grace_s
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(grace_s), str(log), *cmd],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in kvbench's terminal reaches kvbench, which stops it
        )
        assert self.watchdog.stdout is not None
        line = self.watchdog.stdout.readline().strip()
        if not line.isdigit():
            self.watchdog.kill()
            self.watchdog.wait()
            raise KvbenchError(f"the serve runner: could not start the server ({' '.join(cmd[:3])} ...)")
        self.pgid = int(line)  # the server's pid; its process group

    def running(self) -> bool:
        """Whether the server process itself is still there."""
        return self.watchdog.poll() is None and group_alive(self.pgid)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """End the server's whole process group and the watchdog; never raises."""
        try:
            if self.watchdog.poll() is None:
                self.watchdog.send_signal(signal.SIGTERM)
                try:
                    self.watchdog.wait(timeout=self.grace_s + 10)
                except subprocess.TimeoutExpired:
                    self.watchdog.kill()
                    self.watchdog.wait()
        except BaseException:  # an interrupt while stopping: finish the job below, then raise
            self._kill_group()
            raise
        self._kill_group()

    def _kill_group(self) -> None:
        if group_alive(self.pgid):
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            end = time.monotonic() + 5
            while group_alive(self.pgid) and time.monotonic() < end:
                time.sleep(0.05)
        if self.watchdog.stdout is not None:
            self.watchdog.stdout.close()
