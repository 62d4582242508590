"""The scheduler half of vLLM's offloading connector: ``OffloadingConnectorScheduler``
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``), for one
full-attention KV cache group, one block per chunk and prompts only (vLLM's defaults).

What it decides, step by step, as vLLM does:

- **lookup** (``matched_tokens``): at a waiting request's admission, after its GPU prefix hit, the
  run of following blocks the CPU tier holds. A block still being stored, or being loaded for
  another request, or a request with a transfer of its own in flight, delays the request (None:
  the scheduler skips it this step);
- **loads** (``after_alloc``): a hit becomes one load job into the blocks just allocated; the
  request waits for it (``WAITING_FOR_REMOTE_KVS``) holding those blocks;
- **stores** (``build_meta``): every scheduled request stores the prompt blocks its tokens
  completed this step (one job per request per step); a finished request stores what is left;
- **flushes**: a store of a preempted request, or one whose source block is allocated again in
  this step, must complete in this step (``flush``);
- **completions** (``update_output``): a finished store makes its chunks readable; a finished
  load unpins its chunks and releases the request.

Keys are the blocks' content keys (``harness.sim.block_keys``), which identify a block by its
tokens and every token before it, as vLLM's block hashes do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..sequence import Seq
from .cpu_tier import CpuTier, RequestAccess
from .eviction import Key
from .rules import OffloadRules


@dataclasses.dataclass
class Job:
    """A transfer in flight: its request, the chunks it covers and its GPU blocks."""

    seq: Seq
    keys: list[Key]
    is_store: bool
    blocks: list[int]


@dataclasses.dataclass
class StepMeta:
    """What one step hands the worker (vLLM's ``OffloadingConnectorMetadata``)."""

    loads: list[tuple[int, Seq]]  # (job id, request): loads issued this step
    stores: list[int]  # job ids of stores issued this step
    flush: set[int]  # jobs that must complete in this step
    loaded_blocks: int
    stored_blocks: int


class ReqState:
    """The connector's state of one request (vLLM's ``RequestOffloadState``)."""

    __slots__ = ("seq", "access", "next_stored", "jobs", "local_computed", "finished", "final_blocks", "known")

    def __init__(self, seq: Seq) -> None:
        self.seq = seq
        self.access = RequestAccess(seq.block_keys)
        self.next_stored = 0  # the next block index to store
        self.jobs: set[int] = set()  # in flight: one load, or stores
        self.local_computed = 0  # its GPU prefix hit at the latest lookup
        self.finished = False  # the tier was told it finished
        self.final_blocks: list[int] | None = None  # its block table when it finished
        self.known = 0  # blocks of its table the connector has been shown (vLLM's block_ids)

    def blocks(self) -> list[int]:
        return self.final_blocks if self.final_blocks is not None else self.seq.blocks


class OffloadConnector:
    """vLLM's offloading connector (scheduler half) over a ``CpuTier`` (module docstring)."""

    def __init__(self, tier: CpuTier, block_size: int, rules: OffloadRules) -> None:
        self.tier = tier
        self.rules = rules
        self.block_size = block_size
        self.states: dict[int, ReqState] = {}
        self.jobs: dict[int, Job] = {}
        self._next_job = 0
        self._batch_loads: list[tuple[int, Seq]] = []
        self._batch_flush: set[int] = set()
        self.batch_allocated: set[int] = set()  # GPU blocks handed out this step
        self._being_loaded: set[Key] = set()
        self._block_jobs: dict[int, set[int]] = {}  # GPU block -> stores of finished requests reading it
        self.loaded_blocks = 0  # blocks of the loads issued this step

    def _job_id(self) -> int:
        jid = self._next_job
        self._next_job += 1
        return jid

    def on_new_request(self, seq: Seq) -> None:
        self.states[seq.index] = ReqState(seq)

    # -- admission ----------------------------------------------------------------------
    def matched_tokens(self, seq: Seq, local_computed: int) -> int | None:
        """Tokens past ``local_computed`` (the GPU hit, whole blocks) the CPU tier can load; None
        when the request must wait (a transfer of its own in flight, or a hit chunk still being
        stored or loaded)."""
        state = self.states[seq.index]
        state.known = 0  # vLLM clears the request's block ids at every lookup
        if self.rules.restart_stores_at_lookup:
            state.next_stored = 0  # vLLM 0.33: a request restarting at token 0 offers every chunk again
        if state.jobs:
            return None
        state.local_computed = local_computed
        bs = self.block_size
        keys = seq.block_keys
        num_keys = min(len(keys), seq.num_tokens // bs)
        max_hit = min(seq.num_tokens, num_keys * bs)
        if max_hit - local_computed < bs:
            return 0
        start = local_computed // bs
        end = min(-(-max_hit // bs), num_keys)
        hits, pending = self.tier.scan(keys, start, end)
        if pending:
            return None
        if hits == 0:
            return 0
        max_hit = min(max_hit, bs * (start + hits))
        num_hit = max_hit - local_computed
        if num_hit < bs:
            return 0
        being = self._being_loaded
        if being and any(keys[i] in being for i in range(start, -(-(local_computed + num_hit) // bs))):
            return None
        return num_hit

    def after_alloc(self, seq: Seq, external: int) -> None:
        """``seq`` was allocated with ``external`` tokens to load: its load job (the blocks past its
        GPU hit)."""
        if external == 0:
            return
        self.batch_allocated.update(seq.blocks)
        state = self.states[seq.index]
        bs = self.block_size
        cached = state.local_computed + external
        first = state.local_computed // bs  # the first block past the GPU hit: freshly allocated
        end = -(-cached // bs)
        keys = seq.block_keys[first:end]
        self.tier.prepare_load(keys, state.access)
        jid = self._job_id()
        assert not state.jobs, "a load is issued only when no transfer is in flight"
        state.jobs.add(jid)
        self.jobs[jid] = Job(seq, keys, False, seq.blocks[first:end])
        self._batch_loads.append((jid, seq))
        self._being_loaded.update(keys)
        state.next_stored = end  # the hit chunks are in the tier already (vLLM's chunk-level policy)
        self.loaded_blocks += end - first

    # -- one step -----------------------------------------------------------------------
    def build_meta(self, scheduled: Iterable[Seq], preempted: Iterable[Seq], finished: Iterable[Seq]) -> StepMeta:
        """The step's transfers, after scheduling (``scheduled`` in scheduling order, their
        ``num_computed`` already counting this step's tokens; ``finished``: the requests that
        finished at the end of the step before)."""
        for seq in preempted:
            state = self.states.get(seq.index)
            if state is not None:
                state.known = 0  # resumed, it shows its whole table again
                if state.jobs:
                    self._batch_flush.update(state.jobs)
        allocated = self.batch_allocated
        scheduled = list(scheduled)
        for seq in scheduled:  # the blocks each was given since the connector last saw its table
            state = self.states[seq.index]
            allocated.update(seq.blocks[state.known :])
            state.known = len(seq.blocks)
        if self._block_jobs and not allocated.isdisjoint(self._block_jobs):
            for b in allocated:
                jobs = self._block_jobs.get(b)
                if jobs:
                    self._batch_flush.update(jobs)
        stores: list[int] = []
        stored_blocks = 0
        for seq in scheduled:
            stored_blocks += self._store(self.states[seq.index], seq.num_computed, stores)
        finished = list(finished)
        for seq in finished:
            state = self.states.get(seq.index)
            if state is not None:
                stored_blocks += self._store(state, max(seq.prompt_len, seq.num_tokens - 1), stores)
        meta = StepMeta(self._batch_loads, stores, self._batch_flush, self.loaded_blocks, stored_blocks)
        for seq in finished:
            state = self.states.get(seq.index)
            if state is None:
                continue
            state.finished = True
            self.tier.on_request_finished(state.access)
            if not state.jobs:
                del self.states[seq.index]
        self._batch_loads = []
        self._batch_flush = set()
        self.batch_allocated = set()
        self.loaded_blocks = 0
        return meta

    def _store(self, state: ReqState, tokens_after: int, stores: list[int]) -> int:
        """The store job of one request for this step, if any (appended to ``stores``); the blocks
        it stores."""
        seq = state.seq
        offloadable = min(tokens_after, seq.num_tokens, seq.prompt_len)
        blocks = state.blocks()
        storable = min(offloadable // self.block_size, len(blocks), len(seq.block_keys))
        start = state.next_stored
        if storable <= start:
            state.next_stored = max(start, storable)
            return 0
        keys = seq.block_keys[start:storable]
        to_store = self.tier.prepare_store(keys, state.access)
        if to_store is None:
            return 0  # no room in the tier now: offered again next step
        if not to_store:
            state.next_stored = storable
            return 0
        wanted = set(to_store)
        src = [blocks[start + i] for i, k in enumerate(keys) if k in wanted]
        state.next_stored = storable
        jid = self._job_id()
        state.jobs.add(jid)
        self.jobs[jid] = Job(seq, to_store, True, src)
        stores.append(jid)
        if state.final_blocks is not None:
            # A finished request's source blocks may be handed out again: fence them.
            for b in src:
                self._block_jobs.setdefault(b, set()).add(jid)
                if b in self.batch_allocated:
                    self._batch_flush.add(jid)
        return len(src)

    def request_finished(self, seq: Seq) -> None:
        """``seq`` finished (before its blocks are freed): fence the blocks its stores in flight read."""
        state = self.states.get(seq.index)
        if state is None:
            return
        state.final_blocks = list(seq.blocks)
        for jid in state.jobs:
            for b in self.jobs[jid].blocks:
                self._block_jobs.setdefault(b, set()).add(jid)

    def update_output(self, completed: Iterable[int]) -> None:
        """The worker finished these jobs (stores made readable, loads' chunks unpinned)."""
        for jid in completed:
            job = self.jobs.pop(jid)
            state = self.states[job.seq.index]
            if job.is_store:
                self.tier.complete_store(job.keys)
            else:
                self.tier.complete_load(job.keys)
                self._being_loaded.difference_update(job.keys)
            if self._block_jobs and state.final_blocks is not None:
                for b in job.blocks:
                    jobs = self._block_jobs[b]
                    jobs.discard(jid)
                    if not jobs:
                        del self._block_jobs[b]
            state.jobs.discard(jid)
            if state.finished and not state.jobs:
                del self.states[job.seq.index]
