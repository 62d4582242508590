"""The scheduler half of vLLM's offloading connector (``OffloadingConnectorScheduler``,
``…/kv_connector/v1/offloading/scheduler.py``) over a model's KV cache groups (full attention, MLA,
sliding window), at vLLM's defaults: one block a chunk, prompts only, retention interval 0.

- **lookup** (``matched_tokens``): after a waiting request's GPU prefix hit, the tokens every group
  can load: a full group's run of held blocks, then each sliding group's last run of
  ``cdiv(window, block)`` held blocks ending at or before that (widest window first), until the
  groups agree; at most ``num_tokens − 1`` with sliding windows. A chunk still being stored or
  loaded, or a transfer of the request's own in flight, delays it (None: skipped this step);
- **loads** (``after_alloc``): one job into the blocks just allocated (a sliding group's window
  only); the request waits for it holding them (``WAITING_FOR_REMOTE_KVS``);
- **stores** (``build_meta``): each scheduled request stores the prompt blocks completed so far
  (one job a step); a sliding group only the ``cdiv(window − 1, block)`` blocks ending where a
  later lookup can end (the prompt's last whole block before its final token, the shared-prefix
  boundary: ``reachable_block_mask``); a finished request stores what is left;
- **flushes**: a preempted request's stores, and a store whose source block is handed out again
  (a finished request's, or a sliding group's at any time), complete in this step; a sliding
  group's kept block id handed out again before it was stored is dropped (0);
- **completions** (``update_output``): stores become readable; loads unpin and release.

Keys are the blocks' content keys (``harness.sim.block_keys``: a block's tokens and every token
before it, as vLLM's block hashes), one per group (``eviction.Key``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from ...spec.kv_layout import cdiv
from ..sequence import Seq
from .cpu_tier import CpuTier, RequestAccess
from .eviction import Key
from .rules import OffloadRules


@dataclasses.dataclass
class Job:
    """A transfer in flight: its request, the chunks it covers, its GPU blocks, and which of them
    the flush rule watches from the start (a sliding group's store sources) or once the request
    finished (a full group's)."""

    seq: Seq
    keys: list[Key]
    is_store: bool
    blocks: list[int]
    fenced: list[int]
    deferred: list[int]


@dataclasses.dataclass
class StepMeta:
    """What one step hands the worker (vLLM's ``OffloadingConnectorMetadata``)."""

    loads: list[tuple[int, Seq]]  # (job id, request): loads issued this step
    stores: list[int]  # job ids of stores issued this step
    flush: set[int]  # jobs that must complete in this step
    loaded_blocks: int
    stored_blocks: int


class ReqState:
    """The connector's state of one request (vLLM's ``RequestOffloadState``): per group its keys,
    the next block index to store and the block ids it was shown (vLLM's ``block_ids``)."""

    __slots__ = (
        "seq",
        "access",
        "keys",
        "next_stored",
        "block_ids",
        "jobs",
        "local_computed",
        "finished",
        "done",
        "refused",
    )

    def __init__(self, seq: Seq, groups: int) -> None:
        self.seq = seq
        self.access = RequestAccess(seq.block_keys, groups)
        base = seq.block_keys
        self.keys: list[list[Key]] = [base] if groups == 1 else [[k * groups + g for k in base] for g in range(groups)]
        self.next_stored = [0] * groups
        self.block_ids: list[list[int]] = [[] for _ in range(groups)]
        self.jobs: set[int] = set()  # in flight: one load, or stores
        self.local_computed = 0  # its GPU prefix hit at the latest lookup
        self.finished = False  # the tier was told it finished
        self.done = False  # it finished (its blocks may be handed out again)
        # Its last store refused (the tier full): (tier version, next block, blocks storable) then.
        self.refused: tuple[int, int, int] | None = None


def as_vllm_iterates(finished: list[Seq]) -> list[Seq]:
    """The requests that finished in a step (in the order they finished) in the order vLLM visits
    them: it keeps their ids in a new set each step (``finished_req_ids``, request id
    ``str(index)`` as ``vllm-sched`` names them) and iterates that, so their last stores and the
    tier's recency follow Python's set order, which rests on this process's string hashes
    (``PYTHONHASHSEED``). The same ids added in the same order to a new set iterate alike, so sim
    and vLLM agree in one process; across processes this order may differ, in vLLM as here,
    where it matters: a full tier that cannot take every store."""
    if len(finished) < 2:
        return finished
    by_id = {str(seq.index): seq for seq in finished}
    ids: set[str] = set()
    for seq in finished:
        ids.add(str(seq.index))
    return [by_id[i] for i in ids]


TablesOf = Callable[[Seq], list[list[int]]]  # a request's block ids now, per group
BoundaryOf = Callable[[Seq], int]  # its shared-prefix boundary at its last lookup (0: none)


class OffloadConnector:
    """vLLM's offloading connector (scheduler half) over a ``CpuTier`` (module docstring).
    ``windows``: per KV cache group its sliding window in tokens, 0 for full attention;
    ``null``: the null block's id in the policy's tables (-1: tables hold none)."""

    def __init__(
        self,
        tier: CpuTier,
        block_size: int,
        rules: OffloadRules,
        tables_of: TablesOf,
        windows: Sequence[int] = (0,),
        boundary_of: BoundaryOf | None = None,
        null: int = -1,
    ) -> None:
        self.tier = tier
        self.rules = rules
        self.block_size = block_size
        self.tables_of = tables_of
        self.boundary_of = boundary_of
        self.null = null
        bs = block_size
        self.windows = list(windows)
        self.groups = len(self.windows)
        # Per group: its window in blocks for a lookup (vLLM's ``sliding_window_size_in_chunks``) and
        # the blocks a GPU hit needs (``_contiguous_blocks_for_hit``, which the store mask keeps); 0: full.
        self.window_chunks = [cdiv(w, bs) if w else 0 for w in self.windows]
        self.need = [cdiv(w - 1, bs) if w else 0 for w in self.windows]
        full = [g for g, w in enumerate(self.windows) if not w]
        sliding = sorted((g for g, w in enumerate(self.windows) if w), key=lambda g: -self.window_chunks[g])
        self.sliding = tuple(sliding)
        self.lookup_order = tuple(full + sliding)
        assert not self.sliding or boundary_of is not None, "a sliding group's stores read the shared boundary"
        self.states: dict[int, ReqState] = {}
        self.jobs: dict[int, Job] = {}
        self._next_job = 0
        self._batch_loads: list[tuple[int, Seq]] = []
        self._batch_flush: set[int] = set()
        self.batch_allocated: set[int] = set()  # GPU blocks handed out this step
        self._being_loaded: set[Key] = set()
        self._block_jobs: dict[int, set[int]] = {}  # GPU block -> stores watching it (the flush rule)
        self.loaded_blocks = 0  # blocks of the loads issued this step

    def _job_id(self) -> int:
        jid = self._next_job
        self._next_job += 1
        return jid

    def on_new_request(self, seq: Seq) -> None:
        self.states[seq.index] = ReqState(seq, self.groups)

    # -- admission ----------------------------------------------------------------------
    def _load_window(self, g: int, num_tokens: int) -> int:
        """A sliding group's blocks a load ending at ``num_tokens`` restores (vLLM's
        ``load_window_size_in_chunks``: the window ending at the hit, which may start a block earlier)."""
        bs = self.block_size
        return max(self.window_chunks[g], cdiv(self.windows[g] - 1 + (-num_tokens % bs), bs))

    def _window_run(self, keys: list[Key], start: int, end: int, required: int, first: int) -> int | None:
        """vLLM's ``_sliding_window_lookup`` over ``keys[start:end]``: the end (from ``start``) of the
        last run of ``required`` held keys scanning from the right, the first run ``first`` long;
        0 on a miss, None while a key of the run is still being stored."""
        get = self.tier.order.get
        pending = False
        run = 0
        want = first
        for idx in range(end - 1, start - 1, -1):
            chunk = get(keys[idx])
            if chunk is None:
                run = 0
                pending = False
                want = required
            else:
                run += 1
                if chunk.ref < 0:
                    pending = True
            if run == want:
                return None if pending else idx - start + want
        return None if pending else run

    def matched_tokens(self, seq: Seq, local_computed: int) -> int | None:
        """Tokens past ``local_computed`` (the GPU hit, whole blocks) the CPU tier can load into every
        group; None when the request must wait (a transfer of its own in flight, or a hit chunk
        still being stored or loaded)."""
        state = self.states[seq.index]
        for ids in state.block_ids:
            ids.clear()  # vLLM clears the request's block ids at every lookup
        if self.rules.restart_stores_at_lookup:
            state.next_stored = [0] * self.groups  # vLLM 0.33: a request restarting at 0 offers every chunk again
        if state.jobs:
            return None
        state.local_computed = local_computed
        bs = self.block_size
        num_keys = min(len(seq.block_keys), seq.num_tokens // bs)
        max_hit = seq.num_tokens - 1 if self.sliding else seq.num_tokens
        start = local_computed // bs
        hit_tokens = 0
        defer = False
        order = self.lookup_order
        while order:
            looked_sliding = False
            groups, order = order, ()
            for g in groups:
                max_hit = min(max_hit, num_keys * bs)
                if max_hit - local_computed < bs:
                    return 0
                num_chunks = min(cdiv(max_hit, bs), num_keys)
                keys = state.keys[g]
                found: int | None
                if self.window_chunks[g]:
                    first = self._load_window(g, min(max_hit, num_chunks * bs))
                    found = self._window_run(keys, start, num_chunks, self.window_chunks[g], first)
                else:
                    hits, pending = self.tier.scan(keys, start, num_chunks)
                    found = None if pending else hits
                if found == 0:
                    return 0
                if found is None:
                    defer = True
                else:
                    max_hit = min(max_hit, bs * (start + found))
                new = max_hit - local_computed
                if new < bs:
                    return 0
                if new < hit_tokens:
                    if defer:
                        defer = False  # another pass over every group: does any still wait?
                        order = self.lookup_order
                    elif looked_sliding and not order:
                        order = self.sliding  # confirm the sliding groups at the shorter hit
                looked_sliding |= self.window_chunks[g] > 0
                hit_tokens = new
        if defer:
            return None
        being = self._being_loaded
        if being:
            end = local_computed + hit_tokens
            for g in range(self.groups):
                keys = state.keys[g][start : cdiv(end, bs)]
                if self.window_chunks[g]:
                    keys = keys[-self._load_window(g, end) :]
                if any(k in being for k in keys):
                    return None
        return hit_tokens

    def after_alloc(self, seq: Seq, external: int) -> None:
        """``seq`` was allocated with ``external`` tokens to load: its load job (per group, the
        blocks from its first fresh one past the GPU hit)."""
        if external == 0:
            return
        state = self.states[seq.index]
        bs, null = self.block_size, self.null
        local = state.local_computed
        cached = local + external
        num_blocks = cdiv(cached, bs)
        first_fresh = cdiv(local, bs)
        keys: list[Key] = []
        dst: list[int] = []
        for g, table in enumerate(self.tables_of(seq)):
            self.batch_allocated.update(b for b in table if b != null)
            start = num_blocks
            for i in range(first_fresh, num_blocks):
                if table[i] != null:
                    start = i
                    break
            if start < num_blocks:
                keys.extend(state.keys[g][start:num_blocks])
            dst.extend(table[start:num_blocks])
            state.next_stored[g] = num_blocks  # the hit chunks are in the tier already (vLLM's chunk-level policy)
        self.tier.prepare_load(keys, state.access)
        jid = self._job_id()
        assert not state.jobs, "a load is issued only when no transfer is in flight"
        state.jobs.add(jid)
        self.jobs[jid] = Job(seq, keys, False, dst, [], [])
        self._batch_loads.append((jid, seq))
        self._being_loaded.update(keys)
        self.loaded_blocks += len(dst)

    # -- one step -----------------------------------------------------------------------
    def build_meta(self, scheduled: Iterable[Seq], preempted: Iterable[Seq], finished: Iterable[Seq]) -> StepMeta:
        """The step's transfers, after scheduling (``scheduled`` in scheduling order, their
        ``num_computed`` already counting this step's tokens; ``finished``: the requests that
        finished at the end of the step before)."""
        for seq in preempted:
            state = self.states.get(seq.index)
            if state is not None:
                for ids in state.block_ids:
                    ids.clear()  # resumed, it shows its whole table again
                if state.jobs:
                    self._batch_flush.update(state.jobs)
        allocated = self.batch_allocated
        null = self.null
        scheduled = list(scheduled)
        shown: dict[int, list[int]] = {}  # by request: its sliding groups' block ids before this step's
        for seq in scheduled:  # the blocks each was given since the connector last saw its table
            state = self.states[seq.index]
            if self.sliding:
                shown[seq.index] = [len(state.block_ids[g]) for g in self.sliding]
            for ids, table in zip(state.block_ids, self.tables_of(seq)):
                new = table[len(ids) :]
                if new:
                    allocated.update(b for b in new if b != null)
                    ids.extend(new)
        if self.sliding and allocated:
            self._drop_reused(allocated, shown)
        if self._block_jobs and not allocated.isdisjoint(self._block_jobs):
            for b in allocated:
                jobs = self._block_jobs.get(b)
                if jobs:
                    self._batch_flush.update(jobs)
        stores: list[int] = []
        stored_blocks = 0
        for seq in scheduled:
            stored_blocks += self._store(self.states[seq.index], seq.num_computed, stores)
        finished = as_vllm_iterates(list(finished))
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

    def _drop_reused(self, allocated: set[int], shown: dict[int, list[int]]) -> None:
        """A sliding group's block id kept for a store not made yet, handed out again this step
        (a window freed it), is dropped: 0, never stored (vLLM's ``_update_req_states``)."""
        for idx, state in self.states.items():
            ends = shown.get(idx)
            for i, g in enumerate(self.sliding):
                ids = state.block_ids[g]
                end = ends[i] if ends is not None else len(ids)
                for j in range(state.next_stored[g], end):
                    if ids[j] in allocated:
                        ids[j] = 0

    def _reachable(self, seq: Seq, g: int, i: int) -> bool:
        """Whether a sliding group's block ``i`` can serve a later lookup (vLLM's
        ``reachable_block_mask`` at retention interval 0): one of the ``need`` blocks ending at the
        prompt's last whole block before its final token, or at the shared-prefix boundary."""
        bs, need = self.block_size, self.need[g]
        end = (seq.prompt_len - 1) // bs
        if end - need <= i < end:
            return True
        assert self.boundary_of is not None
        boundary = self.boundary_of(seq) // bs
        return boundary > 0 and boundary - need <= i < boundary

    def _storable(self, seq: Seq, ids: list[int], tokens_after: int) -> int:
        """The blocks of a group's table a store at ``tokens_after`` computed tokens may reach: whole
        prompt blocks, shown and keyed."""
        offloadable = min(tokens_after, seq.num_tokens, seq.prompt_len)
        return min(offloadable // self.block_size, len(ids), len(seq.block_keys))

    def _refused_again(self, state: ReqState, tokens_after: int) -> bool:
        """Whether the store offered now is the one the tier refused at its present version (one
        group): refused again, changing nothing."""
        nxt = state.next_stored[0]
        storable = self._storable(state.seq, state.block_ids[0], tokens_after)
        return state.refused == (self.tier.version, nxt, storable)

    def offers_store(self, state: ReqState) -> bool:
        """Whether the request's store this step (one group, at its computed tokens) offers the tier
        blocks: prompt blocks past the last stored, unless that same offer was refused at the
        tier's present version (``quiet``)."""
        storable = self._storable(state.seq, state.block_ids[0], state.seq.num_computed)
        return state.next_stored[0] < storable and not self._refused_again(state, state.seq.num_computed)

    def _store(self, state: ReqState, tokens_after: int, stores: list[int]) -> int:
        """The store job of one request for this step, if any (appended to ``stores``); the blocks
        it stores."""
        seq = state.seq
        null = self.null
        if state.refused is not None and self.groups == 1 and self._refused_again(state, tokens_after):
            return 0
        ends: list[int] = []
        offered: list[Key] = []
        for g, ids in enumerate(state.block_ids):
            storable = self._storable(seq, ids, tokens_after)
            ends.append(storable)
            keys = state.keys[g]
            sliding = self.window_chunks[g] > 0
            for i in range(state.next_stored[g], storable):
                if ids[i] != null and (not sliding or self._reachable(seq, g, i)):
                    offered.append(keys[i])
        if not offered:
            self._advance(state, ends)
            return 0
        to_store = self.tier.prepare_store(offered, state.access)
        if to_store is None:
            state.refused = (self.tier.version, state.next_stored[0], ends[0])
            return 0  # no room in the tier now: offered again next step
        if not to_store:
            self._advance(state, ends)
            return 0
        wanted = set(to_store)
        src: list[int] = []
        fenced: list[int] = []
        deferred: list[int] = []
        for g, ids in enumerate(state.block_ids):
            keys = state.keys[g]
            watch = fenced if self.window_chunks[g] else deferred
            for i in range(state.next_stored[g], ends[g]):
                if keys[i] in wanted and ids[i] != null:
                    src.append(ids[i])
                    watch.append(ids[i])
        self._advance(state, ends)
        jid = self._job_id()
        state.jobs.add(jid)
        self.jobs[jid] = Job(seq, to_store, True, src, fenced, deferred)
        stores.append(jid)
        for b in fenced:  # a window may free a sliding group's source while the request runs
            self._block_jobs.setdefault(b, set()).add(jid)
        if state.done:
            # A finished request's source blocks may be handed out again: fence them.
            for b in deferred:
                self._block_jobs.setdefault(b, set()).add(jid)
                if b in self.batch_allocated:
                    self._batch_flush.add(jid)
        return len(src)

    @staticmethod
    def _advance(state: ReqState, ends: list[int]) -> None:
        nxt = state.next_stored
        for g, end in enumerate(ends):
            if end > nxt[g]:
                nxt[g] = end

    def request_finished(self, seq: Seq) -> None:
        """``seq`` finished (before its blocks are freed): fence the blocks its stores in flight read."""
        state = self.states.get(seq.index)
        if state is None:
            return
        state.done = True
        for jid in state.jobs:
            for b in self.jobs[jid].deferred:
                self._block_jobs.setdefault(b, set()).add(jid)

    def _unwatch(self, jid: int, blocks: list[int]) -> None:
        for b in blocks:
            jobs = self._block_jobs.get(b)
            if jobs is not None:
                jobs.discard(jid)
                if not jobs:
                    del self._block_jobs[b]

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
            if self._block_jobs:
                self._unwatch(jid, job.fenced)
                if state.done:
                    self._unwatch(jid, job.deferred)
            state.jobs.discard(jid)
            if state.finished and not state.jobs:
                del self.states[job.seq.index]
