"""SIGTERM handled as SIGINT is: an ``Interrupted`` exception where the program is.

CI systems and batch schedulers end a job with SIGTERM. Python's default is to
die on the spot, skipping every ``finally``: a temporary partition stays and the
user is told nothing. Raised as an exception instead, it runs the same cleanup
as Ctrl-C, and the command can say what was kept.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator

from ..harness.errors import Interrupted


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    # A second SIGTERM (a scheduler escalating, a user insisting) ends the process at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Interrupted(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Interrupted(SIGTERM)`` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
