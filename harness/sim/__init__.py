"""kvbench's own scheduler: the step loop (a mirror of vLLM v1's), the allocation policies, the
step clocks, and the fast path that records stretches of steps in bulk, pinned record for record
to the step-by-step reference."""

from pathlib import Path

from ..errors import KvbenchError
from .compiled import PureSettingError, select_form

# Before any of the compiled modules is imported: which form of them this process loads.
try:
    FORM = select_form(__name__, Path(__file__).parent)
except PureSettingError as exc:  # a bad KVBENCH_PURE: the CLI's one line, exit 2
    raise KvbenchError(str(exc)) from None
