"""vLLM's admission and preemption rule, stated once.

Three code paths decide the same things: the reference ``Scheduler`` (one request at a
time), the fast path's preempting step (``FastScheduler``: only the requests that need
memory) and the counted stretch (``counted_stretch``: block counts). Each holds its state
its own way; the rule they apply is these functions:

- ``admission_open``: waiting requests are admitted first come first served while the
  step has tokens left and ``max_num_seqs`` allows another running request (and only in a
  step that preempted nothing);
- ``admission_chunk``, ``admission_must_fit``: the head computes what it lacks, as much as
  the budget allows, and must fit its whole current sequence (vLLM's
  ``scheduler_reserve_full_isl``); the first head that does not fit stops admission;
- ``preempt_until_fits``: a running request that cannot grow preempts the most recently
  admitted running request, again and again, until it fits or is itself preempted, which
  ends the step's scheduling pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .sequence import Seq

S = TypeVar("S", bound=Seq)


def admission_open(budget: int, running: int, max_num_seqs: int) -> bool:
    """Whether the step may admit another request: tokens left and room under ``max_num_seqs``."""
    return budget > 0 and running < max_num_seqs


def admission_chunk(tokens: int, computed: int, budget: int) -> int:
    """The tokens a head with ``tokens`` known and ``computed`` already computed (a prefix hit,
    or what a swap kept) computes in its admission step: what it lacks, as the budget allows."""
    return min(tokens - computed, budget)


def admission_must_fit(tokens: int, max_model_len: int) -> int:
    """The positions that must fit for a head with ``tokens`` known tokens to be admitted."""
    return min(tokens, max_model_len)


def preempt_until_fits(
    seq: S, fits: Callable[[], bool], pop_tail: Callable[[], S], preempt: Callable[[S], None], victims: list[S]
) -> bool:
    """``seq`` did not fit: preempt the tail of running (``pop_tail``, then ``preempt``; each
    appended to ``victims``) until ``fits()`` or ``seq`` itself is preempted. True when
    ``seq`` fits and keeps running."""
    while True:
        victim = pop_tail()
        preempt(victim)
        victims.append(victim)
        if victim is seq:
            return False
        if fits():
            return True
