"""A contiguous policy's plain steps taken a run at once (``Stretch._glide``, priced by
``StepPrice.decode_run``) against the same steps counted one by one (``Stretch._count_crossings``,
which every policy can take): byte-identical steps and requests files, whichever way a run is
priced (the clock's formula in the loop; a clock priced through its Python: a loop of its
``price`` below ``PRICED_AT_ONCE`` steps, its ``step_times`` from it on). The fast-path identity
tests pin both to the reference; this pins the glide to the loop it stands for."""

from __future__ import annotations

import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.clock.clocks import Clock
from kvbench.harness.sim import step_price
from kvbench.runners import sim as sim_runner
from kvbench.runners.sim import SimRunner

from tests.sim.test_fast_path import AZURE, SESSIONS, _path, _suite

CONTIGUOUS = '["contiguous-max", "contiguous-pow2", "contiguous-oracle"]'
BOTH = 'arena = ["first-fit", "buddy"]\ncontiguous_unit = "{unit}"'

TRACE = 'source = "trace"\npath = "{path}"\nlimit = {limit}\narrival = "trace"\ntime_scale = {scale}'
LLAMA = dict(preset="llama-3-8b", max_len=4096, clock="roofline", gpu="A100-80GB")
# Queued requests (arrivals only join the queue), an idle engine (an arrival is admitted at its
# step), conversations (turns released by finishes), and stretches cut at MAX_STEPS.
CASES = {
    "queued-trace": dict(LLAMA, budget="900MiB", seqs=64, workload=TRACE.format(path=AZURE, limit=200, scale=0.05)),
    "idle-trace": dict(LLAMA, budget="4GiB", seqs=64, workload=TRACE.format(path=AZURE, limit=120, scale=2.0)),
    "conversations": dict(
        LLAMA, budget="1GiB", seqs=32, tokens=1024, workload=SESSIONS.format(sessions=10, turns=4, think=1.0, seed=4)
    ),
    "long-runs-steps-clock": dict(
        budget="4GiB",
        seqs=8,
        clock="steps",
        workload='source = "fixed"\nprompt_len = 100\noutput_len = 1900\nnum_requests = 30\n'
        'arrival = "poisson"\nrate = 0.1',
    ),
}


def _counting(clock: Clock, how: str, calls: list[int]) -> Clock:
    """``clock`` as a subclass of its class that counts the glide's array pricing; for "loop",
    one that also has a memory adding nothing (a clock with memory is never glided); for
    "python" and "arrays", one whose ``price`` is its own (so ``StepPrice`` calls it: a subclass
    may price otherwise). Subclassed, not patched: compiled, the stretch calls its own methods
    natively, but a clock's through it."""
    base = type(clock)

    def step_times(self, *args):
        calls[0] += 1
        return base.step_times(self, *args)

    def take(self, scheduled_tokens: int, scheduled_seqs: int) -> float:
        return base.take(self, scheduled_tokens, scheduled_seqs)

    def price(self, *args) -> float:
        return base.price(self, *args)

    methods = {"__slots__": (), "step_times": step_times}
    if how == "loop":
        methods["take"] = take
    if how in ("python", "arrays"):
        methods["price"] = price
    clock.__class__ = type(f"Counting{base.__name__}", (base,), methods)
    return clock


def _runs(tmp_path, monkeypatch, case: str, unit: str, how: str) -> dict[str, tuple[bytes, bytes]]:
    """Each cell's steps and requests files, with plain steps taken ``how``: "loop" (one by one),
    "inline" (a glide, the clock's formula in the loop), "python" or "arrays" (a glide, the
    clock's own ``price`` in a loop, or its ``step_times``)."""
    calls = [0]
    real_clock_for = sim_runner.clock_for
    monkeypatch.setattr(sim_runner, "clock_for", lambda *args: _counting(real_clock_for(*args), how, calls))
    monkeypatch.setattr(step_price, "PRICED_AT_ONCE", 10**9 if how == "python" else 1)
    text = _suite(**CASES[case], policies=CONTIGUOUS, block_sizes="[16]", grid_extra=BOTH.format(unit=unit))
    out = tmp_path / how
    files = {}
    for cell in build_cells(parse_suite(text, "glide.toml"), out, lambda m: None):
        row = SimRunner().run(cell).row
        assert row["status"] == "ok", row["error"]
        files[cell.run_id] = tuple(_path(out, table, cell.run_id).read_bytes() for table in ("steps", "requests"))
    assert (calls[0] > 0) == (how == "arrays")  # only a glide prices steps as arrays here
    monkeypatch.undo()
    return files


@pytest.mark.parametrize("unit", ["position", "block"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_glide_is_the_counted_loop_record_for_record(tmp_path, monkeypatch, case, unit):
    loop = _runs(tmp_path, monkeypatch, case, unit, "loop")
    assert _runs(tmp_path, monkeypatch, case, unit, "inline") == loop
    assert _runs(tmp_path, monkeypatch, case, unit, "python") == loop
    assert _runs(tmp_path, monkeypatch, case, unit, "arrays") == loop
