"""kvbench's own scheduler: the step loop (a mirror of vLLM v1's), the allocation policies, the
step clocks, and the fast path that records stretches of steps in bulk, pinned record for record
to the step-by-step reference."""

from pathlib import Path

from .compiled import select_form

# Before any of the compiled modules is imported: which form of them this process loads.
FORM = select_form(__name__, Path(__file__).parent)
