"""``StepPrice``, the step loop's copy of a clock's price, against the clock itself: the same
floats, bit for bit, for every clock (the roofline's formula and one second a step computed in
the loop; any other clock called), one step at a time and a run of decoding steps at once."""

from __future__ import annotations

import numpy as np
import pytest
from kvbench.harness.clock.clocks import Clock, ParallelRooflineClock, RooflineClock
from kvbench.harness.clock.model import GPU_PRESETS
from kvbench.harness.sim import step_price
from kvbench.harness.sim.step_price import StepPrice
from kvbench.harness.spec.geometry import resolve_model


class _OwnPrice(RooflineClock):
    """A roofline subclass with a price of its own: never copied (``price_terms`` is None)."""

    def price(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        return 2.0 * super().price(scheduled_tokens, context_tokens, attention_pairs, scheduled_seqs)

    def step_times(self, *counts):  # type: ignore[no-untyped-def]
        return 2.0 * super().step_times(*counts)


def _clocks() -> list[Clock]:
    g = resolve_model("llama-3-8b", None)
    kv = g.kv_bytes_per_token("fp16")
    gpu = GPU_PRESETS["A100-80GB"]
    return [
        Clock(),
        RooflineClock(g, kv, gpu),
        RooflineClock(g, kv, gpu, scale=1.534),
        RooflineClock(resolve_model("opt-13b", None), kv, GPU_PRESETS["H100"]),
        ParallelRooflineClock(g, kv, gpu, tensor_parallel_size=2, pipeline_parallel_size=2),
        _OwnPrice(g, kv, gpu),
    ]


def test_only_the_plain_roofline_hands_over_its_terms():
    terms = [clock.price_terms() is not None for clock in _clocks()]
    assert terms == [False, True, True, True, False, False]


@pytest.mark.parametrize("clock", _clocks(), ids=lambda c: type(c).__name__)
def test_a_step_is_the_clocks_price_bit_for_bit(clock):
    rng = np.random.default_rng(7)
    price = StepPrice(clock)
    cases = [(0, 0, 0, 0), (1, 1, 1, 1), (2048, 10**6, 10**9, 256), (1, 2**53, 2**60, 1)]
    cases += [tuple(int(x) for x in rng.integers(0, 10**7, size=4)) for _ in range(2000)]
    for tokens, ctx, pairs, seqs in cases:
        want = clock.price(tokens, ctx, pairs, seqs)
        got = price.step(tokens, ctx, pairs, seqs)
        assert got.hex() == want.hex(), (tokens, ctx, pairs, seqs)


@pytest.mark.parametrize("m", [0, 1, 5, step_price.PRICED_AT_ONCE - 1, step_price.PRICED_AT_ONCE, 3000])
def test_a_decoding_run_adds_each_steps_price_in_turn(m):
    rng = np.random.default_rng(m)
    for clock in _clocks():
        price = StepPrice(clock)
        for n in (0, 1, 7, 256):
            t0, dec_sum, tick = (
                float(rng.random() * 100),
                int(rng.integers(-(10**6), 10**6)),
                int(rng.integers(0, 10**5)),
            )
            want = [t0]
            t = t0
            for T in range(tick, tick + m):
                ctx = dec_sum + T * n
                t = t + clock.price(n, ctx, ctx, n)
                want.append(t)
            assert price.decode_run(t0, n, dec_sum, tick, m) == want
