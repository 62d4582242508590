"""SIGTERM handled as SIGINT is: an ``Interrupted`` exception where the program is.

CI systems and batch schedulers end a job with SIGTERM. Python's default is to
die on the spot, skipping every ``finally``: a temporary partition stays and the
user is told nothing. Raised as an exception instead, it runs the same cleanup
as Ctrl-C, and the command can say what was kept.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from ..harness.errors import Interrupted

# The signal that arrived, if any. An exception raised while Python runs a finalizer (a
# ``__del__``, say pyarrow's ParquetWriter's, or a weakref callback of the import system) is
# dropped, so the interrupt is also kept here, and ``raise_pending`` raises it again at the next
# cell boundary; ``_quiet_unraisable`` keeps Python from printing the dropped one as a traceback.
_pending: list[int] = []


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGTERM:
        # A second SIGTERM (a scheduler escalating, a user insisting) ends the process at once.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _pending.append(signum)
    raise Interrupted(signum)


def _quiet_unraisable(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            return  # kept in _pending: raised again where it can be handled
        previous(unraisable)

    return hook


def raise_pending() -> None:
    """Raise an interrupt that arrived but was swallowed on its way (see ``_pending``), once:
    a later sweep in the same process starts without it."""
    if _pending:
        signum = _pending[0]
        _pending.clear()
        raise Interrupted(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Interrupted(SIGTERM)`` in the main thread, and so does
    SIGINT (as ``Interrupted(SIGINT)``, a ``KeyboardInterrupt``) unless it is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    _pending.clear()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable(previous_hook)
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    # SIGINT ignored (a job a non-interactive shell put in the background) stays ignored.
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
