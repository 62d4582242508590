"""``CrossingPlan`` against a brute-force count: the crossings at each tick, and the crossers
it names, must be those of the decoders' block-crossing progressions still in force, through
additions, preemptions (``drop``) and finishes (``forget``). The fast-path identity tests pin
the whole stretch to the reference scheduler; this pins the plan's bookkeeping on its own,
over far more interleavings than a scheduler run produces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kvbench.harness.sim.counted_stretch import CrossingPlan
from kvbench.harness.sim.decoders import FastSeq

# Per tick: decoders started after it (allocated − computed slack, output left), and which
# live decoders are preempted at it (indices into the live list, taken modulo its length).
tick_strategy = st.tuples(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 90)), max_size=4),
    st.lists(st.integers(0, 50), max_size=2),
    st.booleans(),  # name the crossers at this tick
)


def start(index: int, tick: int, slack: int, left: int) -> FastSeq:
    """A decoder registered at ``tick`` with ``slack`` free positions in its allocation and
    ``left`` tokens still to sample (the fields ``Decoders.start`` and a policy set)."""
    s = FastSeq(index, index, 0, prompt_len=20, output_len=left + 1, arrival_s=0.0)
    s.num_output = 1
    s.num_computed = 20
    s.allocated = 20 + slack
    s.dec_tick = tick
    s.run_pos = index
    return s


def progression(s: FastSeq, bs: int) -> range:
    """The ticks at which ``s`` crosses into a new block, written out."""
    c = s.allocated - s.num_computed + s.dec_tick + 1
    f = s.output_len - s.num_output + s.dec_tick
    return range(c, f + 1, bs)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.lists(tick_strategy, min_size=1, max_size=60))
def test_the_plan_counts_what_a_brute_force_count_does(bs: int, ticks) -> None:
    plan = CrossingPlan(bs)
    live: dict[FastSeq, range] = {}  # decoder → its crossings still to happen
    n = 0
    for tick, (started, preempted, name) in enumerate(ticks, start=1):
        expected = [s for s, prog in live.items() if tick in prog]
        assert plan.count(tick) == len(expected)
        if name:
            assert plan.crossers(tick) == sorted(expected, key=lambda s: s.run_pos)
        for k in preempted:  # preempted at this tick: its crossings from here on do not happen
            if live:
                s = list(live)[k % len(live)]
                plan.drop(s, tick)
                del live[s]
        assert plan.counted(tick) == sum(tick in prog for prog in live.values())
        for s in [s for s in live if s.output_len - s.num_output + s.dec_tick == tick]:
            plan.forget(s)  # it sampled its last token at this tick
            del live[s]
        for slack, left in started:
            s = start(n, tick, slack, left)
            n += 1
            plan.add(s)
            live[s] = progression(s, bs)
