"""Quiet steps of a run with a CPU tier, taken at once: the steps in which every running request
decodes one token and nothing else can happen, with the reference's own calls and none of its
no-ops.

After a *settled* step (``OffloadScheduler.settled``: its admission attempt admitted and skipped
nothing, and nothing it read changed after it: no finish, preemption, transfer issued or done),
the next steps repeat that attempt on the same state and fail alike, so they skip it, and skip
the connector's step (no transfer in flight, no store to offer: every prompt block of a decoder is
stored or taken; a request whose load landed may wait behind the head, untouched by an attempt
that stops at the head) while each of them:

- allocates each decoder's next position through the policy, in running order (a block crossed
  is taken, evicting a cached one if need be, and a block filled is cached, as the reference's
  step does), its new blocks shown to the connector;
- is priced by the clock, advances every decoder by one token and samples it.

A step whose allocations change what the waiting head looks up (a cached block of its prefix
evicted, or one filled and cached) repeats the attempt through the scheduler's own check
(``OffloadScheduler.attempt_fails``, the head's lookups and the fit) and stays quiet where it
fails; where it would not, the engine takes that step (its allocations, done, are no-ops to it).
The run stops before a step in which anything else could change: a decoder finishing, an arrival
released, a crossing that finds no free block. Equality with the step-by-step loop is tested
record for record (``tests/sim/test_offload_quiet.py``).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from ...clock.clocks import Clock
from ...records.schema import StepRow
from .. import bulk_rows as R
from ..policies.paged import PagedPolicy, internal_of
from ..sequence import Seq
from ..step_price import StepPrice
from .scheduler import OffloadScheduler

if TYPE_CHECKING:
    from ...records.recorder import RunRecorder

MAX_STEPS = 4096  # steps per run taken at once (its rows are built at once)
_TIER = [StepRow._fields.index(c) for c in ("cpu_blocks", "stored_blocks", "loaded_blocks", "load_waiting")]


class _Rows:
    """The columns of the quiet steps taken, step by step, that vary (the rest are the run's)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.blocks: list[int] = []
        self.used: list[int] = []
        self.internal: list[int] = []
        self.evicted: list[int] = []
        self.cached: list[int] = []

    def add(self, start: float, blocks: int, used: int, internal: int, evicted: int, cached: int) -> None:
        self.starts.append(start)
        self.blocks.append(blocks)
        self.used.append(used)
        self.internal.append(internal)
        self.evicted.append(evicted)
        self.cached.append(cached)

    def add_plain(self, starts: list[float], blocks: int, used_before: int, n: int, internal: int, cached: int) -> None:
        """Steps in which ``n`` decoders each compute a token and nothing is allocated."""
        m = len(starts)
        self.starts.extend(starts)
        self.blocks.extend([blocks] * m)
        self.used.extend(range(used_before + n, used_before + n * (m + 1), n))
        self.internal.extend([internal] * m)
        self.evicted.extend([0] * m)
        self.cached.extend([cached] * m)


def _window(sched: OffloadScheduler) -> int:
    """How many quiet steps may follow now (0: the next goes step by step): the bound before a
    decoder's finish, where the state allows any."""
    if not sched.settled or sched.clock is None or len(sched.transfers):
        return 0
    if not sched.loading <= sched.received:
        return 0  # a load not landed yet (one landed waits, untouched, behind the head)
    if sched.head() is not sched.settled_head:
        return 0  # an arrival released since the attempt is the head now
    running = sched.running
    if not running or len(running) > sched.config.max_num_batched_tokens:
        return 0
    mml = sched.max_model_len
    connector = sched.connector
    steps = MAX_STEPS
    for seq in running:
        if seq.num_computed != seq.num_tokens - 1 or seq.num_output < 1:
            return 0  # a prefill, or a request with no token sampled yet
        if connector.offers_store(connector.states[seq.index]):
            return 0  # a prompt store to offer
        left = min(seq.output_len - seq.num_output, mml - seq.num_tokens) - 1
        if left < steps:
            steps = left
    return max(steps, 0)


def run(sched: OffloadScheduler, recorder: RunRecorder) -> int:
    """Take and record the quiet steps that follow now (module docstring); how many."""
    policy = sched.paged
    if not isinstance(policy, PagedPolicy) or sched.connector.groups != 1:
        return 0
    limit = _window(sched)
    if limit <= 0:
        return 0
    clock = sched.clock
    assert clock is not None
    if sched.price is None:
        sched.price = StepPrice(clock)
    price = sched.price
    takes = type(clock).take is not Clock.take  # a clock with memory (else it adds 0.0)
    running = sched.running
    n = len(running)
    bs = policy.block_size
    head = sched.settled_head
    budget = sched.config.max_num_batched_tokens - n  # what the admission attempt has left
    # A head with nothing computed looks its prefix up, if the attempt gets that far (a token left,
    # a seat free); one holding blocks (a load landed) asks only for free blocks, of which a quiet
    # step leaves fewer.
    looks = head is not None and head.num_computed == 0 and budget > 0 and n < sched.config.max_num_seqs
    head_keys = set(head.block_keys) if looks and head is not None else set()
    pending = sched.pending
    ids = [sched.connector.states[seq.index].block_ids[0] for seq in running]
    computed = held = internal = 0
    for seq in running:
        computed += seq.num_computed
        held += len(seq.blocks)
        internal += internal_of(len(seq.blocks) * bs, seq.final_len)
    step0 = step = sched.step_index
    now = sched.now
    rows = _Rows()
    evictions = policy.evictions
    cached = policy.cached_free_blocks()
    ledger = sched.ledger
    k = 0
    while k < limit:
        if pending and pending[0].arrival_s <= now:
            break  # the driver would release it before this step
        gap = 0 if takes else _plain_steps(running, bs, limit - k)
        if gap:
            # Steps in which no decoder's ``allocate`` does anything: priced and logged at once.
            times = price.decode_run(now, n, computed, 1, gap)
            if pending and pending[0].arrival_s <= times[gap - 1]:
                gap = bisect.bisect_left(times, pending[0].arrival_s, 1, gap)  # the first step it precedes
            blocks = policy.allocated_blocks()
            rows.add_plain(times[:gap], blocks, computed - max(0, held - blocks) * bs, n, internal, cached)
            computed += n * gap
            now = times[gap]
            for seq in running:
                seq.num_computed += gap
                seq.num_output += gap
            step += gap
            k += gap
            continue
        crossing = 0
        touches = False  # the step changes what the head looks up
        for seq in running:
            target = seq.num_computed + 1
            if target > len(seq.blocks) * bs:
                crossing += 1
            elif target % bs == 0 and head_keys:
                keys = seq.block_keys
                if target // bs <= len(keys) and keys[target // bs - 1] in head_keys:
                    touches = True  # a block the head looks up becomes cached
        spare = _pops_spare(policy, crossing, head_keys)
        if spare is None:
            break
        touches = touches or spare
        if ledger is not None:
            ledger.now = (step, now)
        # ``allocate`` does something only where a block is crossed or filled (then cached).
        grew: list[tuple[int, int]] = []
        for i, seq in enumerate(running):
            target = seq.num_computed + 1
            had = len(seq.blocks)
            if target > had * bs or target % bs == 0:
                ok = policy.allocate(seq, target)
                assert ok, "a quiet step's crossings fit (``_pops_spare``)"
                if len(seq.blocks) != had:
                    grew.append((i, had))
        if touches and not sched.attempt_fails(budget):
            # The attempt does something: the engine takes this step, whose allocations are done
            # (``allocate`` again to the same position takes nothing, evicts and caches nothing).
            sched.settled = False  # the next call takes no quiet step before it
            break
        for i, had in grew:
            seq = running[i]
            ids[i].extend(seq.blocks[len(ids[i]) :])
            held += len(seq.blocks) - had
            internal += internal_of(len(seq.blocks) * bs, seq.final_len) - internal_of(had * bs, seq.final_len)
        for seq in running:
            seq.num_computed += 1
        computed += n
        blocks = policy.allocated_blocks()
        evicted = 0
        if policy.evictions != evictions:  # a crossing took a cached block
            evictions = policy.evictions
            evicted = sched.take_evictions()
            cached = policy.cached_free_blocks()
        rows.add(now, blocks, computed - max(0, held - blocks) * bs, internal, evicted, cached)
        now += price.step(n, computed, computed, n)
        if takes:
            now += clock.take(n, n)
        for seq in running:
            seq.num_output += 1
        step += 1
        k += 1
    sched.now = now
    sched.step_index = step
    sched.used_positions += n * k
    if k:
        _record(sched, policy, recorder, step0, rows)
    return k


def _plain_steps(running: list[Seq], bs: int, most: int) -> int:
    """How many of the next steps (at most ``most``) come before the first in which a decoder
    crosses into a new block or fills one: a decoder at ``c`` computed positions holding ``L``
    blocks does either at its next position past ``c`` that is a multiple of ``bs``, or at ``c + 1``
    if ``c == L × bs``."""
    gap = most
    for seq in running:
        c = seq.num_computed
        d = 0 if c >= len(seq.blocks) * bs else bs - 1 - c % bs
        if d < gap:
            gap = d
    return gap


def _pops_spare(policy: PagedPolicy, n: int, head_keys: set[int]) -> bool | None:
    """Whether ``n`` blocks taken from the free queue now evict a cached block whose content the
    head looks up; None when there are not ``n`` (a crossing does not fit: a preemption)."""
    spare = len(policy.front) + policy.num_blocks - policy.next_fresh
    if n <= spare:
        return False
    queue = policy.free_queue
    if n > spare + len(queue):
        return None
    if not head_keys:
        return False
    block_key = policy.block_key
    for i, b in enumerate(queue):
        if i >= n - spare:
            break
        if block_key.get(b) in head_keys:
            return True
    return False


def _record(sched: OffloadScheduler, policy: PagedPolicy, recorder: RunRecorder, step0: int, rows: _Rows) -> None:
    """The rows ``SimEngine.step`` would have written for the steps taken."""
    bs = policy.block_size
    times = np.array([*rows.starts, sched.now])
    blocks = np.array(rows.blocks, dtype=np.float64)
    alloc = blocks * bs
    used = np.array(rows.used, dtype=np.float64)
    internal = np.array(rows.internal, dtype=np.float64)
    head = sched.head()
    columns: dict[int, np.ndarray | float] = {
        R.RUNNING: float(len(sched.running)),
        R.WAITING: float(len(sched.waiting) + len(sched.holding)),
        R.SCHEDULED: float(len(sched.running)),
        R.BLOCKS: blocks,
        R.ALLOCATED: alloc,
        R.USED: used,
        R.RESERVED: alloc - used - internal,
        R.INTERNAL: internal,
        R.EXTERNAL: float(policy.external_frag(head)),
        R.FREE: policy.budget_positions - alloc,
        R.CACHED_FREE: np.array(rows.cached, dtype=np.float64),
        R.EVICTED: np.array(rows.evicted, dtype=np.float64),
    }
    for col, value in zip(_TIER, (len(sched.connector.tier), 0, 0, len(sched.loading))):
        columns[col] = float(value)
    recorder.add_step_rows(R.step_rows(step0, times, len(rows.starts), columns))
