"""The fast path's implicit decoders: the state that lets a step touch only what changes.

Most of a serving step is decoding: every running request whose prompt is done computes
one token and samples one. Nothing about such a *decoder* needs touching in a step unless
it crosses into a new block, finishes, or is preempted. So decoders are kept implicit: a
decoder registered at tick ``t0`` with ``c0`` computed positions has ``c0 + (D − t0)`` after
``D`` ticks, and the ticks at which it will need a block or finish are known in advance
and kept in per-tick event lists. An event names its sequence and the sequence's
``epoch`` when it was filed; any change of state (preempted, finished, made explicit)
bumps the epoch, so stale events are recognised and dropped where they are read.

``Decoders`` is that state, shared by the step-by-step fast path
(``harness.sim.fast_scheduler``) and the stretches that record many steps at once
(``harness.sim.counted_stretch``).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable

from .sequence import Seq


class FastSeq(Seq):
    """A sequence as the fast path schedules it: ``Seq`` and the fast path's own state."""

    __slots__ = ("dec_tick", "epoch")

    # ``Seq``'s arguments, spelled out: compiled (mypyc), forwarding ``*args`` to a compiled
    # base's ``__init__`` fails at run time. tests/sim/test_compiled.py keeps the two lists equal.
    def __init__(
        self,
        index: int,
        request_id: int,
        sample: int,
        prompt_len: int,
        output_len: int,
        arrival_s: float,
        prefix_group: int = -1,
        prefix_len: int = 0,
    ) -> None:
        super().__init__(index, request_id, sample, prompt_len, output_len, arrival_s, prefix_group, prefix_len)
        self.dec_tick = -1  # ≥ 0: decoding implicitly since this tick
        self.epoch = 0  # bumped at every change of state: events filed before it are stale


Events = list[tuple[FastSeq, int]]  # (sequence, its epoch when the event was filed)


class Decoders:
    """The implicit decoders and their pending events."""

    def __init__(self) -> None:
        self.tick = 0  # D: ticks (steps taken by the fast path's decode clock) so far
        self.count = 0  # decoders
        self.dec_sum = 0  # Σ (computed − dec_tick) over decoders: Σ computed = dec_sum + D × count
        self.crossing: defaultdict[int, Events] = defaultdict(list)  # tick → decoders needing a block then
        self.finishing: dict[int, Events] = {}  # tick → decoders sampling their last token then
        self.finish_ticks: list[int] = []  # heap of the keys of ``finishing``
        self.explicit: list[FastSeq] = []  # running requests still prefilling, in running order
        self.stretch_admissions = 0  # requests admitted inside counted stretches
        self.stretch_chunked = 0  # … of them, admitted in chunks
        # The last position a decoder computes before it next needs ``allocate`` (None: its allocation).
        self.reach: Callable[[FastSeq], int] | None = None

    def register(self, seq: FastSeq, at: int | None = None) -> None:
        """Make a decoding sequence implicit from tick ``at`` on (the current tick by default),
        its next crossing and its finish filed."""
        d = self.tick if at is None else at
        self.start(seq, d)
        # Tick T computes position num_computed + (T − 1 − d): a block is needed when that
        # reaches the allocation.
        reach = seq.allocated if self.reach is None else self.reach(seq)
        c = reach - seq.num_computed + d + 1
        if c <= seq.output_len - seq.num_output + d:
            self.crossing[c].append((seq, seq.epoch))

    def start(self, seq: FastSeq, d: int) -> None:
        """Make a decoding sequence implicit from tick ``d`` on, its finish filed: ``register``
        less the crossing, for a counted stretch, whose crossing plan files crossings itself."""
        seq.dec_tick = d
        seq.epoch += 1
        self.count += 1
        self.dec_sum += seq.num_computed - d
        t = seq.output_len - seq.num_output + d  # the last token is sampled at tick T_f
        lst = self.finishing.get(t)
        if lst is None:
            self.finishing[t] = [(seq, seq.epoch)]
            heapq.heappush(self.finish_ticks, t)
        else:
            lst.append((seq, seq.epoch))

    def materialize(self, seq: FastSeq, at: int | None = None) -> None:
        """Bring a decoder's counts up to tick ``at`` (the current tick by default); it stays implicit."""
        t = self.tick if at is None else at
        k = t - seq.dec_tick
        seq.num_computed += k
        seq.num_output += k
        seq.dec_tick = t

    def unregister(self, seq: FastSeq, at: int | None = None) -> None:
        """Make a decoder explicit again, its counts brought up to tick ``at`` (its events go stale)."""
        t = self.tick if at is None else at
        d = seq.dec_tick
        self.count -= 1
        self.dec_sum -= seq.num_computed - d
        k = t - d  # ``materialize``, inlined: a stretch's preemptions call this
        seq.num_computed += k
        seq.num_output += k
        seq.dec_tick = -1
        seq.epoch += 1

    @staticmethod
    def live(events: Events) -> list[FastSeq]:
        """The sequences of ``events`` still in the state the events were filed for."""
        return [s for s, e in events if s.epoch == e and s.dec_tick >= 0]

    def clear(self) -> None:
        """Forget every pending event (every decoder has just been made explicit)."""
        self.crossing.clear()
        self.finishing.clear()
        self.finish_ticks.clear()
        self.explicit = []
