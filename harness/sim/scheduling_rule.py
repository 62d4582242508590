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
  ``scheduler_reserve_full_isl``); the first head that does not fit stops admission
  (``admission``: what a head asks of the policy; ``admit_waiting``: the admissions of a step,
  which the reference and the fast path's paths all call);
- ``preempt_until_fits``: a running request that cannot grow preempts the most recently
  admitted running request, again and again, until it fits or is itself preempted, which
  ends the step's scheduling pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

from .policies.base import Policy
from .sequence import RUNNING, Seq

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


def admission(policy: Policy, seq: Seq, budget: int, max_model_len: int) -> tuple[int, int, int]:
    """What admitting ``seq`` with ``budget`` tokens left asks of ``policy``: (its hit tokens,
    the positions to back, the positions that must fit). The policy remembers the hit
    (``prefix_hit``) for the ``allocate`` that follows."""
    hit = policy.prefix_hit(seq) if seq.num_computed == 0 else 0
    computed = seq.num_computed + hit
    target = computed + admission_chunk(seq.num_tokens, computed, budget)
    return hit, target, admission_must_fit(seq.num_tokens, max_model_len)


def join_running(seq: S, running: list[S], run_pos: int, now: float, hit: int) -> bool:
    """``seq``, admitted at ``now`` with ``hit`` tokens it does not compute, joins the tail of
    ``running`` at place ``run_pos``. True when it is a re-admission after a preemption: vLLM
    counts those hits apart (``recomputed_hit_tokens``), never as prefix-cache hits."""
    running.append(seq)
    seq.status = RUNNING
    seq.run_pos = run_pos
    if seq.num_preemptions:
        seq.recomputed_hit_tokens += hit
        return True
    seq.first_scheduled_s = now  # first admission
    seq.prefix_hit_tokens += hit
    return False


def admit_waiting(
    waiting: deque[S],
    running: list[S],
    policy: Policy,
    budget: int,
    max_num_seqs: int,
    max_model_len: int,
    now: float,
    scheduled: list[tuple[S, int]],
    admissions: int,
) -> tuple[int, int, int, int]:
    """Admit the head of ``waiting`` at ``now``, again and again, while the rule allows and it
    fits: each joins the tail of ``running`` (``run_pos``: ``admissions`` so far, counted on)
    and ``scheduled`` (with the tokens it computes, its ``num_computed`` its hit or what a swap
    kept). Returns (admitted, hit tokens at first admissions, hit tokens at re-admissions after
    a preemption: vLLM counts these apart, never as prefix-cache hits; the positions the
    admitted hold computed before the step)."""
    admitted = hit_tokens = recomputed = held = 0
    while waiting and admission_open(budget, len(running), max_num_seqs):
        seq = waiting[0]
        hit, target, must_fit = admission(policy, seq, budget, max_model_len)
        if not policy.allocate(seq, target, must_fit):
            break
        computed = seq.num_computed + hit
        num_new = target - computed
        waiting.popleft()
        admitted += 1
        if join_running(seq, running, admissions + admitted, now, hit):
            recomputed += hit
        else:
            hit_tokens += hit
        seq.num_computed = computed
        held += computed
        scheduled.append((seq, num_new))
        budget -= num_new
    return admitted, hit_tokens, recomputed, held
