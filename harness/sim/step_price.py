"""A step's price for the compiled step loop: the roofline's formula computed in the loop itself.

The fast path prices every step it takes (``Clock.price``). Compiled, the stretches would spend
more on calling back into the clock's Python per step than on their own work, so ``StepPrice``
holds the clock's formula where it is a known one: the roofline (``RooflineClock.price_terms``,
its constants) and one second a step (``Clock`` itself). It computes them with the same IEEE
operations in the same order as the clock, so the floats are the clock's bit for bit (pinned by
``tests/sim/test_step_price.py``); any other clock (parallel roofline, a fitted profile) is
called as before.
"""

from __future__ import annotations

import numpy as np

from ..clock.clocks import Clock

# Runs at least this long are priced as arrays (``StepPrice.decode_run``, a clock priced through
# its own Python): below it, numpy's fixed cost per call is more than a loop's per step.
PRICED_AT_ONCE = 48


class StepPrice:
    """``clock``'s price of a step (``step``) and of a run of decoding steps (``decode_run``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        terms = clock.price_terms()
        self.roofline = terms is not None
        # One second a step: the base clock, its price not overridden.
        self.second = type(clock).price is Clock.price
        weights, kv, per_token, per_pair, bw, peak, scale = terms if terms is not None else (0.0,) * 7
        self.weights, self.kv, self.per_token, self.per_pair = weights, kv, per_token, per_pair
        self.bw, self.peak, self.scale = bw, peak, scale

    def step(self, scheduled_tokens: int, context_tokens: int, attention_pairs: int, scheduled_seqs: int) -> float:
        """``clock.price(...)``, the same float."""
        if self.roofline:  # RooflineClock.price, operation for operation
            memory = (self.weights + context_tokens * self.kv) / self.bw
            compute = (scheduled_tokens * self.per_token + attention_pairs * self.per_pair) / self.peak
            return (memory if memory >= compute else compute) * self.scale
        if self.second:
            return 1.0
        return self.clock.price(scheduled_tokens, context_tokens, attention_pairs, scheduled_seqs)

    def decode_run(self, t: float, n: int, dec_sum: int, tick: int, m: int) -> list[float]:
        """The start times of ``m`` steps from ``tick`` in which only ``n`` decoders run (the
        first starting at ``t``; ``dec_sum + T × n`` their context at tick ``T``), then the last
        one's end: each step's price added in turn, as a step-by-step loop adds them. For a clock
        without memory. A clock priced through its Python gives long runs to ``Clock.step_times``
        (its floats bit for bit; ``np.add.accumulate`` adds in turn)."""
        out = [t] * (m + 1)
        if self.roofline or self.second or m < PRICED_AT_ONCE:
            for i in range(1, m + 1):
                ctx = dec_sum + (tick + i - 1) * n
                t += self.step(n, ctx, ctx, n)
                out[i] = t
            return out
        contexts = np.arange(tick, tick + m, dtype=np.int64)
        contexts *= n
        contexts += dec_sum
        acc = np.empty(m + 1)
        acc[0] = t
        acc[1:] = self.clock.step_times(n, contexts, contexts, n)
        times: list[float] = np.add.accumulate(acc, out=acc).tolist()
        return times
