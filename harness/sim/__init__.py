"""kvbench's own scheduler: the step loop (a mirror of vLLM v1's), the allocation policies, the
step clocks, and the fast path that records stretches of steps in bulk, pinned record for record
to the step-by-step reference."""
