"""The simulator's fast path produces byte-identical steps and requests tables to the
step-by-step reference scheduler, and the same run rows, on workloads that exercise every
path: counted stretches (admissions, chunked prefill, finishes and preemptions inside them,
recompute and swap) for every policy — block counts, prefix caching with and without shared
blocks (hits, evictions), contiguous reservations in both arenas and both units —, a
conversation's next turn released inside a stretch (closed-loop arrivals), hash-id traces,
prefill-heavy work, preemptions event by event and chunked prefill step by step, every clock,
Poisson, batch and trace arrivals, and runs long enough to span several Parquet row groups;
then seeded variants of each workload users run."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.clock.clocks import RooflineClock, StepWork
from kvbench.harness.clock.model import GPU_PRESETS
from kvbench.harness.records import store
from kvbench.harness.records.recorder import BATCH_ROWS, STEP_FIELDS, RunRecorder
from kvbench.harness.records.schema import StepRow
from kvbench.harness.sim import counted_stretch
from kvbench.harness.sim.fast_scheduler import FastScheduler
from kvbench.harness.sim.scheduler import Arrivals
from kvbench.harness.spec.geometry import resolve_model
from kvbench.runners.sim import SimRunner

from tests.conftest import DATA, ROOT, suite_toml
from tests.tracekit import write_jsonl
from tools.make_mooncake_traces import mooncake_reuse_rows

ALL_POLICIES = (
    '["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix", "virtual-contiguous"]'
)

AZURE = DATA / "azure-conv-slice.csv"
MOONCAKE = ROOT / "suites" / "data" / "mooncake-reuse.jsonl"
SESSIONS = (
    'source = "sessions"\nnum_sessions = {sessions}\nturns = {turns}\nthink_time_s = {think}\nlengths = "uniform"\n'
    "prompt_min = 50\nprompt_max = 600\nmessage_min = 10\nmessage_max = 150\noutput_min = 1\noutput_max = 200\n"
    'arrival = "poisson"\nrate = 2.0\nseed = {seed}'
)
PROFILE = (
    DATA / "profile-opt-13b-fp16-b16-knee.json"
)  # hand-written terms (every term > 0): a fixture, not a measurement
# The same with primitive-cache terms and a cache of 4 counts, so that misses are frequent: a clock with memory.
CACHE_PROFILE = DATA / "profile-opt-13b-fp16-b16-cache.json"

CASES = {
    "roomy-sharegpt": dict(budget="12GiB", workload='source = "sharegpt"\nnum_requests = 300'),
    "tight-preempting": dict(budget="2300MiB", workload='source = "sharegpt"\nnum_requests = 200'),
    "chunked-prefill": dict(
        budget="2GiB",
        tokens=96,
        seqs=32,
        workload='source = "lognormal"\nprompt_mean = 300.0\noutput_mean = 60.0\nnum_requests = 120',
    ),
    "prefix-groups-and-samples": dict(
        budget="2100MiB",
        workload='source = "uniform"\nprompt_min = 40\nprompt_max = 400\n'
        "output_min = 1\noutput_max = 120\nnum_requests = 150\nprefix_groups = 4\n"
        "prefix_len = 64\nn = 3",
    ),
    "poisson-roofline": dict(
        budget="3GiB",
        clock="roofline",
        workload='source = "sharegpt"\nnum_requests = 200\narrival = "poisson"\nrate = 3.0',
    ),
    # The roofline with a fitted factor (roofline_scale): counted stretches price steps with it too.
    "scaled-roofline": dict(
        budget="3GiB",
        clock="roofline",
        roofline_scale=1.534,
        workload='source = "sharegpt"\nnum_requests = 200\narrival = "poisson"\nrate = 3.0',
    ),
    "swap": dict(budget="2300MiB", preemption="swap", workload='source = "sharegpt"\nnum_requests = 150'),
    # A calibrated clock (a fixture profile): Poisson arrivals priced by fitted terms, with preemption.
    "poisson-profile-preempting": dict(
        budget="2300MiB",
        clock="profile",
        clock_profile=str(PROFILE),
        block_sizes="[16]",
        workload='source = "sharegpt"\nnum_requests = 200\narrival = "poisson"\nrate = 8.0',
    ),
    # A clock that remembers the counts it priced (primitive-cache misses): quiet and counted
    # stretches price look-ahead without taking it, then take the steps they record.
    "profile-cache-misses": dict(
        budget="2300MiB",
        clock="profile",
        clock_profile=str(CACHE_PROFILE),
        block_sizes="[16]",
        workload='source = "sharegpt"\nnum_requests = 200\narrival = "poisson"\nrate = 8.0',
    ),
    "azure-slice": dict(
        preset="llama-3-8b",
        budget="1200MiB",
        max_len=8192,
        tokens=4096,
        workload=f'source = "trace"\npath = "{AZURE}"\nlimit = 300\narrival = "trace"\ntime_scale = 0.02',
    ),
    # The benchmark's shape: real-time trace arrivals priced by the roofline clock (long quiet stretches).
    "azure-trace-roofline": dict(
        preset="llama-3-8b",
        budget="1GiB",
        max_len=4096,
        seqs=256,
        clock="roofline",
        gpu="A100-80GB",
        workload=f'source = "trace"\npath = "{AZURE}"\nlimit = 150\narrival = "trace"\ntime_scale = 0.05',
    ),
    # Admission blocked while decoders run (the head does not fit), stretches with a waiting queue.
    "blocked-admission": dict(
        preset="llama-3-8b",
        budget="700MiB",
        seqs=64,
        clock="roofline",
        workload='source = "lognormal"\nprompt_mean = 400.0\noutput_mean = 300.0\n'
        'num_requests = 120\narrival = "poisson"\nrate = 20.0\nseed = 3',
    ),
    # Prefix caching where nothing is shared (one sample, no common prefix), under memory pressure:
    # counted stretches evict cached blocks and re-admit the preempted on their own cached blocks,
    # whole or in chunks, recompute and swap (asserted below).
    "private-prefix-pressure": dict(
        preset="llama-3-8b",
        budget="600MiB",
        seqs=48,
        tokens=512,
        clock="roofline",
        policies='["paged-prefix"]',
        block_sizes="[16, 8, 32]",
        grid_extra='preemption = ["recompute", "swap"]',
        workload='source = "uniform"\nprompt_min = 10\nprompt_max = 900\n'
        "output_min = 1\noutput_max = 600\nnum_requests = 250\n"
        'arrival = "poisson"\nrate = 30.0\nseed = 8',
    ),
    # Prefix caching under memory pressure: cached blocks are evicted (asserted below).
    "prefix-evictions": dict(
        budget="600MiB",
        policies='["paged-prefix"]',
        block_sizes="[16, 8]",
        workload='source = "uniform"\nprompt_min = 64\nprompt_max = 300\noutput_min = 1\n'
        "output_max = 200\nnum_requests = 200\nprefix_groups = 6\nprefix_len = 128\n"
        'n = 2\narrival = "poisson"\nrate = 4.0',
    ),
    # More steps than a Parquet row group, mostly quiet: bulk rows cross row-group boundaries.
    "long-quiet": dict(
        budget="4GiB",
        seqs=8,
        clock="roofline",
        policies='["paged", "contiguous-oracle"]',
        block_sizes="[16]",
        workload='source = "fixed"\nprompt_len = 100\noutput_len = 1900\n'
        'num_requests = 30\narrival = "poisson"\nrate = 0.1',
    ),
    # Decoders finishing inside quiet stretches, several at one step and down to none left,
    # with nothing waiting (the stretch goes on) and with a blocked queue (it stops there).
    "finishes-in-stretches": dict(
        budget="3GiB",
        seqs=12,
        clock="roofline",
        block_sizes="[16, 8]",
        workload='source = "uniform"\nprompt_min = 20\nprompt_max = 300\n'
        "output_min = 1\noutput_max = 400\nnum_requests = 150\n"
        'arrival = "poisson"\nrate = 2.0\nseed = 5',
    ),
    # Counted stretches running on through admissions: prompts longer than the budget left (chunked),
    # max_num_seqs and memory stopping admission, preemptions, single-token outputs (they end a
    # stretch), samples arriving together, several block sizes; a contiguous policy beside them.
    "merged-admissions": dict(
        preset="llama-3-8b",
        budget="900MiB",
        seqs=12,
        tokens=640,
        clock="roofline",
        gpu="A100-80GB",
        policies='["paged", "virtual-contiguous", "contiguous-oracle"]',
        block_sizes="[16, 8, 32]",
        workload='source = "uniform"\nprompt_min = 10\nprompt_max = 700\n'
        "output_min = 1\noutput_max = 500\nnum_requests = 220\nn = 2\n"
        'arrival = "poisson"\nrate = 2.0\nseed = 11',
    ),
    # Counted stretches under memory pressure (paged and virtual-contiguous, roofline): preemptions
    # inside stretches, re-admission of the preempted (whole, or in chunks: the stretch ends), a
    # waiting queue, head-of-line blocking, arrivals released in preempting steps.
    "tight-preempting-roofline": dict(
        budget="2300MiB",
        clock="roofline",
        policies='["paged", "virtual-contiguous"]',
        block_sizes="[16, 8]",
        workload='source = "sharegpt"\nnum_requests = 200',
    ),
    "batch-pressure-roofline": dict(
        budget="1500MiB",
        clock="roofline",
        tokens=1024,
        seqs=48,
        policies='["paged", "virtual-contiguous"]',
        block_sizes="[16, 32]",
        workload='source = "sharegpt"\nnum_requests = 250\narrival = "batch"\nseed = 4',
    ),
    "arrivals-under-pressure": dict(
        preset="llama-3-8b",
        budget="600MiB",
        seqs=48,
        tokens=1024,
        clock="roofline",
        policies='["paged", "virtual-contiguous"]',
        block_sizes="[16, 32]",
        workload='source = "uniform"\nprompt_min = 10\nprompt_max = 900\n'
        "output_min = 1\noutput_max = 600\nnum_requests = 250\n"
        'arrival = "poisson"\nrate = 30.0\nseed = 7',
    ),
    # A token budget of a few tokens: every prompt prefills in chunks inside counted stretches, and
    # heads that would finish in their admission step (one output token) end them mid-chunk.
    "chunks-in-stretches": dict(
        preset="llama-3-8b",
        budget="256MiB",
        tokens=32,
        seqs=16,
        policies='["paged", "virtual-contiguous"]',
        block_sizes="[32, 16]",
        workload='source = "uniform"\nprompt_min = 100\nprompt_max = 700\n'
        "output_min = 1\noutput_max = 100\nnum_requests = 60\n"
        'arrival = "batch"\nseed = 6',
    ),
    # The buddy arena: contiguous reservations rounded to powers of two, queued admissions
    # (external fragmentation of the head), quiet stretches with a blocked queue, roofline.
    "buddy-arena": dict(
        budget="2300MiB",
        seqs=32,
        clock="roofline",
        block_sizes="[16]",
        policies='["contiguous-max", "contiguous-pow2", "contiguous-oracle"]',
        grid_extra='arena = ["buddy"]',
        workload='source = "uniform"\nprompt_min = 10\nprompt_max = 500\noutput_min = 1\n'
        'output_max = 400\nnum_requests = 150\narrival = "poisson"\nrate = 4.0\nseed = 2',
    ),
    # Contiguous reservations in whole blocks (the form the vLLM runners host), both arenas, a
    # budget whose tail is below one block and a max_model_len that is no whole number of blocks.
    "block-reservations": dict(
        budget="4000MiB",
        max_len=2000,
        seqs=32,
        tokens=512,
        clock="roofline",
        block_sizes="[16, 48]",
        policies='["contiguous-max", "contiguous-pow2", "contiguous-oracle"]',
        grid_extra='arena = ["first-fit", "buddy"]\ncontiguous_unit = "block"',
        workload='source = "uniform"\nprompt_min = 10\nprompt_max = 700\noutput_min = 1\n'
        'output_max = 400\nnum_requests = 150\narrival = "poisson"\nrate = 6.0\nseed = 3',
    ),
    # Conversations: each turn released when the previous answer ends (closed-loop arrivals, inside
    # stretches), every policy; paged-prefix hits the earlier turns' blocks.
    "conversations": dict(
        preset="llama-3-8b",
        budget="1GiB",
        max_len=4096,
        seqs=32,
        tokens=1024,
        clock="roofline",
        gpu="A100-80GB",
        block_sizes="[16]",
        grid_extra='arena = ["first-fit", "buddy"]',
        workload=SESSIONS.format(sessions=12, turns=4, think=2.0, seed=1),
    ),
    # … under memory pressure, answered at once (think 0): preemptions, evictions of earlier turns.
    "conversations-pressure": dict(
        preset="llama-3-8b",
        budget="300MiB",
        max_len=4096,
        seqs=32,
        tokens=512,
        clock="roofline",
        policies='["paged", "paged-prefix"]',
        block_sizes="[16, 32]",
        grid_extra='preemption = ["recompute", "swap"]',
        workload=SESSIONS.format(sessions=16, turns=5, think=0.0, seed=2),
    ),
    # A hash-id trace (the shipped Mooncake-form one): shared system prompts and extended prompts,
    # under memory pressure; paged-prefix shares and evicts blocks inside stretches.
    "hash-id-trace": dict(
        preset="llama-3-8b",
        budget="1200MiB",
        max_len=8192,
        seqs=64,
        tokens=2048,
        clock="roofline",
        gpu="A100-80GB",
        policies='["paged", "paged-prefix", "contiguous-oracle"]',
        block_sizes="[16]",
        workload=f'source = "trace"\npath = "{MOONCAKE}"\nhash_block_size = 512\narrival = "trace"\ntime_scale = 0.2',
    ),
    # Prefill-heavy: long prompts, short answers, every prompt in chunks of a small token budget.
    "prefill-heavy": dict(
        preset="llama-3-8b",
        budget="600MiB",
        max_len=4096,
        seqs=32,
        tokens=384,
        clock="roofline",
        policies='["paged", "paged-prefix", "contiguous-max"]',
        block_sizes="[16]",
        workload='source = "lognormal"\nprompt_mean = 1500.0\noutput_mean = 12.0\nnum_requests = 120\n'
        'arrival = "poisson"\nrate = 40.0\nseed = 9',
    ),
}


def _suite(**kw) -> str:
    values = dict(
        preset="opt-13b",
        max_len=2048,
        seqs=64,
        tokens=2048,
        preemption="recompute",
        clock="steps",
        gpu="A100-40GB",
        policies=ALL_POLICIES,
        block_sizes="[16, 32]",
        grid_extra="",
    )
    values.update(kw)
    return suite_toml(
        "fast",
        model={"preset": values["preset"], "kv_dtype": "fp16"},
        memory={"kv_budget": values["budget"], "max_model_len": values["max_len"]},
        scheduler={
            "max_num_seqs": values["seqs"],
            "max_num_batched_tokens": values["tokens"],
            "preemption": values["preemption"],
            "clock": values["clock"],
            "gpu": values["gpu"] if values["clock"] == "roofline" else None,  # read by the roofline alone
            "roofline_scale": values.get("roofline_scale"),
            "clock_profile": values.get("clock_profile"),
        },
        workload=str(values["workload"]),
        grid=f"policy = {values['policies']}\nblock_size = {values['block_sizes']}\n{values['grid_extra']}",
    )


def _path(out, table, run_id):
    return store.partition_dir(out, table, run_id) / store.PART


WALL_COLUMNS = {"wall_s", "computed_tokens_per_wall_s", "started_at", "mean_step_wall_s"}
NOT_COMPARED = WALL_COLUMNS | {"sim_path"}  # which loop ran: checked on its own


@pytest.fixture
def bulk_counter(monkeypatch):
    """Counts what the fast path's counted stretches did: steps, and inside them admissions,
    prompt chunks, finishes, preemptions, evictions, hits and conversation turns released."""
    counted = {
        "counted": 0,
        "finished": 0,
        "counted_admissions": 0,
        "preempting": 0,
        "counted_preemptions": 0,
        "counted_chunks": 0,
        "counted_evictions": 0,
        "counted_hits": 0,
        "counted_prefix_hits": 0,
        "counted_turns": 0,
    }
    inside = [False]
    real_preempting = FastScheduler._schedule_preempting

    def preempting(self, *args):
        counted["preempting"] += 1  # steps that preempted event by event, not through the reference
        return real_preempting(self, *args)

    monkeypatch.setattr(FastScheduler, "_schedule_preempting", preempting)
    real_counted = counted_stretch.run
    real_finished = Arrivals.finished

    def finished(self, seq, now):
        if inside[0] and seq.index in self.held:
            counted["counted_turns"] += 1  # a conversation's next turn released inside a stretch
        real_finished(self, seq, now)

    monkeypatch.setattr(Arrivals, "finished", finished)

    class Tap:  # the recorder, seen by the counted stretch: preemptions, evictions, hits in the rows it records
        def __init__(self, recorder):
            self.recorder = recorder

        def add_step_rows(self, rows):
            col = StepRow._fields.index
            counted["counted_preemptions"] += int(rows[:, col("preempted")].sum())
            counted["counted_evictions"] += int(rows[:, col("evicted_blocks")].sum())
            counted["counted_hits"] += int(rows[:, col("recomputed_hit_tokens")].sum())
            counted["counted_prefix_hits"] += int(rows[:, col("prefix_hit_tokens")].sum())
            counted["finished"] += int(rows[:, col("finished")].sum())
            self.recorder.add_step_rows(rows)

    def counted_run(sched, dec, recorder):
        before, chunked = dec.stretch_admissions, dec.stretch_chunked
        inside[0] = True
        try:
            k = real_counted(sched, dec, Tap(recorder))
        finally:
            inside[0] = False
        counted["counted"] += k  # steps of counted stretches (through admissions and preemptions)
        counted["counted_admissions"] += dec.stretch_admissions - before
        counted["counted_chunks"] += dec.stretch_chunked - chunked
        return k

    monkeypatch.setattr(counted_stretch, "run", counted_run)
    return counted


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_is_record_for_record_the_reference(tmp_path, case, bulk_counter):
    suite = parse_suite(_suite(**CASES[case]), "fast.toml")
    fast, ref = tmp_path / "fast", tmp_path / "ref"
    ref.mkdir()  # build_cells creates fast/; the results directory exists before a run is recorded
    preempted = evicted = steps = 0
    fewest_steps = None
    arenas: set[object] = set()
    for cell in build_cells(suite, fast, lambda m: None):
        ref_cell = cell.__class__(spec=cell.spec, workload=cell.workload, out=ref)
        a = SimRunner().run(cell).row
        b = SimRunner(reference=True).run(ref_cell).row
        assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
        assert (a["sim_path"], b["sim_path"]) == ("fast", "reference")
        for table in ("steps", "requests"):
            ta, tb = pq.read_table(_path(fast, table, cell.run_id)), pq.read_table(_path(ref, table, cell.run_id))
            assert ta.equals(tb), (case, cell.spec.policy, cell.spec.block_size, table)
        # Byte for byte, row groups included.
        assert _path(fast, "steps", cell.run_id).read_bytes() == _path(ref, "steps", cell.run_id).read_bytes()
        # The run rows: identical but for wall-clock measurements (floats compared exactly).
        for key in set(a) | set(b):
            if key not in NOT_COMPARED:
                va, vb = a.get(key), b.get(key)
                same = va == vb or (
                    isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb)
                )
                assert same, (case, cell.spec.policy, key, va, vb)
        arenas.add(b["arena"])
        preempted += b["preemptions"]
        evicted += b["evictions"]
        steps += b["steps"]
        fewest_steps = b["steps"] if fewest_steps is None else min(fewest_steps, b["steps"])
    if case in (
        "tight-preempting",
        "swap",
        "prefix-groups-and-samples",
        "prefix-evictions",
        "poisson-profile-preempting",
        "profile-cache-misses",
        "conversations-pressure",
        "hash-id-trace",
    ):
        assert preempted > 0  # the case really exercises preemption
    if case in ("prefix-groups-and-samples", "prefix-evictions", "hash-id-trace", "conversations-pressure"):
        # Prefix caching over shared blocks inside counted stretches: hits on other sequences' blocks,
        # preemptions (and re-admissions on one's own cached blocks).
        assert bulk_counter["counted_prefix_hits"] > 0 and bulk_counter["counted_preemptions"] > 0
    if case in ("prefix-evictions", "private-prefix-pressure", "hash-id-trace", "conversations-pressure"):
        assert evicted > 0 and bulk_counter["counted_evictions"] > 0
    if case == "private-prefix-pressure":
        # Prefix caching as counts: evictions and hits inside counted stretches, with preemptions and chunks.
        assert bulk_counter["counted_hits"] > 0
        assert bulk_counter["counted_preemptions"] > 0 and bulk_counter["counted_chunks"] > 0
    if case in ("conversations", "conversations-pressure"):
        assert bulk_counter["counted_turns"] > 0  # turns released by finishes inside stretches
        assert bulk_counter["counted_prefix_hits"] > 0  # … and hitting the earlier turns' blocks
    if case == "long-quiet":
        assert fewest_steps > BATCH_ROWS
    if case in ("azure-trace-roofline", "long-quiet", "blocked-admission", "roomy-sharegpt", "prefill-heavy"):
        assert bulk_counter["counted"] > steps // 2  # most steps were recorded in bulk
    if case in ("azure-trace-roofline", "long-quiet", "roomy-sharegpt", "finishes-in-stretches"):
        assert bulk_counter["finished"] > 0  # stretches really ran through finishes
    if case in (
        "azure-trace-roofline",
        "poisson-roofline",
        "finishes-in-stretches",
        "merged-admissions",
        "scaled-roofline",
        "buddy-arena",
        "block-reservations",
    ):
        # Counted stretches ran on through admissions (contiguous reservations among them).
        assert bulk_counter["counted"] > 0 and bulk_counter["counted_admissions"] > 0
    if case in (
        "merged-admissions",
        "tight-preempting-roofline",
        "batch-pressure-roofline",
        "arrivals-under-pressure",
        "tight-preempting",
        "swap",
        "chunks-in-stretches",
    ):
        assert preempted > 0 and bulk_counter["counted_preemptions"] > 0  # preemptions inside counted stretches
        assert bulk_counter["counted_chunks"] > 0  # … and prompts admitted in chunks
    if case == "prefill-heavy":
        assert bulk_counter["counted_chunks"] > 0  # long prompts in chunks inside counted stretches
    if case in ("buddy-arena", "conversations"):
        assert "buddy" in arenas


@pytest.mark.parametrize("scale", [1.0, 1.534])
def test_roofline_step_times_are_step_time_bit_for_bit(scale):
    g = resolve_model("llama-3-8b", None)
    clock = RooflineClock(g, g.kv_bytes_per_token("fp16"), GPU_PRESETS["A100-80GB"], scale=scale)
    rng = np.random.default_rng(1)
    for n in (1, 3, 250, 4096):
        context = rng.integers(0, 10**9, 500)
        pairs = context + rng.integers(0, 10**6, 500)
        assert clock.step_times(n, context, pairs, n).tolist() == [
            clock.step_time(StepWork(n, int(c), int(p), n)) for c, p in zip(context, pairs)
        ]


def _random_rows(rng, n, measured=False):
    rows = []
    t = 0.0
    for i in range(n):
        dt = float(rng.random()) * 0.03
        ints = [int(v) for v in rng.integers(0, 10**6, 17)]
        kv = int(rng.integers(0, 10**9)) if measured and i % 3 else None
        wall = float(rng.random()) if measured and i % 2 else None
        work = tuple(int(v) for v in rng.integers(0, 10**6, 3)) if wall is not None else (None,) * 3
        rows.append(StepRow(i, t, dt, *ints, kv, wall, *work))
        t += dt
    return rows


@pytest.mark.parametrize("measured", [False, True])
def test_bulk_recording_is_row_by_row_recording(tmp_path, measured):
    """add_steps / add_step_rows give the same file bytes and summary floats as add_step."""
    rng = np.random.default_rng(7)
    rows = _random_rows(rng, BATCH_ROWS + 5000, measured)
    (tmp_path / "one").mkdir()
    (tmp_path / "bulk").mkdir()
    one = RunRecorder(tmp_path / "one", "r", 10**6)
    for row in rows:
        one.add_step(row)
    bulk = RunRecorder(tmp_path / "bulk", "r", 10**6)
    i = 0
    while i < len(rows):
        k = int(rng.integers(1, 3000))
        chunk = rows[i : i + k]
        mode = int(rng.integers(0, 3))
        if mode == 0:
            for row in chunk:
                bulk.add_step(row)
        elif mode == 1:
            cols = list(zip(*chunk))
            bulk.add_steps(
                [
                    c[0]
                    if len(set(c)) == 1
                    else np.array([math.nan if v is None else v for v in c])
                    if None in c
                    else np.array(c)
                    for c in cols
                ],
                len(chunk),
            )
        else:
            bulk.add_step_rows(np.array([[math.nan if v is None else v for v in r] for r in chunk]))
        i += k
    assert vars(one.summary) == vars(bulk.summary)
    for rec in (one, bulk):
        rec.finish(_empty_requests(), {"status": "ok"})
    a, b = _path(tmp_path / "one", "steps", "r"), _path(tmp_path / "bulk", "steps", "r")
    assert a.read_bytes() == b.read_bytes()
    table = pq.read_table(a)
    assert table.num_rows == len(rows) and pq.ParquetFile(a).metadata.num_row_groups == 2
    assert table.column("step").to_pylist() == [r[0] for r in rows]
    for name in ("kv_bytes_allocated", "context_tokens"):
        assert table.column(name).to_pylist() == [r[STEP_FIELDS.index(name)] for r in rows]


def _empty_requests():
    from kvbench.harness.records.schema import REQUESTS

    return {name: [] for name in REQUESTS.names}


def _random_suite(rng: np.random.Generator) -> str:
    """A random small suite for the block-count policies: budgets from starved to roomy, token
    budgets from a few tokens (every prompt in chunks) to whole prompts, recompute and swap,
    batch and Poisson arrivals, parallel samples, every clock but a profile."""
    mml = int(rng.choice([512, 1024, 2048]))
    arrival = str(rng.choice(["batch", "poisson"]))
    workload = (
        f'source = "uniform"\nprompt_min = {int(rng.integers(1, 50))}\nprompt_max = {int(rng.integers(60, mml // 2))}\n'
        f"output_min = 1\noutput_max = {int(rng.integers(2, mml // 2))}\nnum_requests = {int(rng.integers(20, 90))}\n"
        f'arrival = "{arrival}"\nseed = {int(rng.integers(0, 100))}\nn = {int(rng.choice([1, 1, 2]))}'
    )
    if arrival == "poisson":
        workload += f"\nrate = {float(rng.choice([1.0, 10.0, 100.0]))}"
    return _suite(
        preset="llama-3-8b",
        budget=f"{int(rng.choice([150, 250, 400, 600, 1500]))}MiB",
        max_len=mml,
        seqs=int(rng.choice([4, 16, 64])),
        tokens=int(rng.choice([16, 64, 256, 2048])),
        preemption=str(rng.choice(["recompute", "recompute", "swap"])),
        clock=str(rng.choice(["steps", "roofline"])),
        policies='["paged", "paged-prefix", "virtual-contiguous"]',
        block_sizes=f"[{int(rng.choice([8, 16, 32]))}]",
        workload=workload,
    )


@pytest.mark.parametrize("seed", range(6))
def test_counted_stretches_agree_with_the_reference_on_random_settings(tmp_path, seed):
    """A differential fuzz of the counted stretch: random settings, byte-identical files."""
    rng = np.random.default_rng(seed)
    ran = 0
    for i in range(4):
        suite = parse_suite(_random_suite(rng), "fuzz.toml")
        fast, ref = tmp_path / f"fast{i}", tmp_path / f"ref{i}"
        ref.mkdir()
        for cell in build_cells(suite, fast, lambda m: None):
            a = SimRunner().run(cell).row
            b = SimRunner(reference=True).run(cell.__class__(spec=cell.spec, workload=cell.workload, out=ref)).row
            assert a["status"] == b["status"], (a["error"], b["error"])
            if b["status"] != "ok":
                continue  # infeasible: no files
            ran += 1
            for table in ("steps", "requests"):
                assert _path(fast, table, cell.run_id).read_bytes() == _path(ref, table, cell.run_id).read_bytes(), (
                    seed,
                    i,
                    cell.spec.policy,
                    table,
                )
    assert ran >= 4  # the settings are feasible often enough to test something


WORKLOAD_KINDS = ("hash-id trace", "conversations", "prefill-heavy")
VARIANT_POLICIES = (
    "paged",
    "paged-prefix",
    "virtual-contiguous",
    "contiguous-max",
    "contiguous-pow2",
    "contiguous-oracle",
)


def _variant_suite(kind: str, rng: np.random.Generator, tmp_path) -> str:
    """A seeded variant of one workload users run — a hash-id trace (a fresh Mooncake-form file),
    conversations, or prefill-heavy work —, under a budget from starved to roomy, with two or three
    policies (a contiguous one in a random arena and unit)."""
    seed = int(rng.integers(0, 1000))
    if kind == "hash-id trace":
        block = int(rng.choice([64, 128]))
        path = write_jsonl(
            tmp_path / f"trace-{seed}.jsonl", mooncake_reuse_rows(seed, int(rng.integers(40, 120)), block)
        )
        scale = float(rng.choice([0.05, 0.5, 1.0]))
        workload = (
            f'source = "trace"\npath = "{path}"\nhash_block_size = {block}\narrival = "trace"\ntime_scale = {scale}'
        )
    elif kind == "conversations":
        think = float(rng.choice([0.0, 0.5, 3.0]))
        workload = SESSIONS.format(
            sessions=int(rng.integers(4, 16)), turns=int(rng.integers(2, 6)), think=think, seed=seed
        )
    else:
        workload = (
            f'source = "lognormal"\nprompt_mean = {float(rng.choice([600, 1200, 2000]))}\n'
            f"output_mean = {float(rng.choice([4, 12, 30]))}\nnum_requests = {int(rng.integers(40, 120))}\n"
            f'arrival = "poisson"\nrate = {float(rng.choice([5.0, 40.0]))}\nseed = {seed}'
        )
    policies = rng.choice(VARIANT_POLICIES, size=int(rng.integers(2, 4)), replace=False)
    arena, unit = rng.choice(["first-fit", "buddy"]), rng.choice(["position", "block"])
    return _suite(
        preset="llama-3-8b",
        budget=f"{int(rng.choice([600, 1000, 2000]))}MiB",
        max_len=4096,
        seqs=int(rng.choice([16, 64])),
        tokens=int(rng.choice([256, 1024, 2048])),
        preemption=str(rng.choice(["recompute", "recompute", "swap"])),
        clock="roofline",
        policies="[" + ", ".join(f'"{p}"' for p in policies) + "]",
        block_sizes=f"[{int(rng.choice([16, 32]))}]",
        # (drawn whatever the policies, so each seed's draws stay as they were; given where one reads them)
        grid_extra=f'arena = ["{arena}"]\ncontiguous_unit = "{unit}"'
        if any(p.startswith("contiguous") for p in policies)
        else "",
        workload=workload,
    )


@pytest.mark.parametrize("seed", range(9))
def test_workloads_users_run_agree_with_the_reference_on_seeded_variants(tmp_path, seed):
    """A differential fuzz over the workloads users run (``WORKLOAD_KINDS``, one per seed in turn):
    byte-identical files from the fast path and the reference."""
    rng = np.random.default_rng(100 + seed)
    suite = parse_suite(_variant_suite(WORKLOAD_KINDS[seed % 3], rng, tmp_path), "variant.toml")
    fast, ref = tmp_path / "fast", tmp_path / "ref"
    ref.mkdir()
    ran = 0
    for cell in build_cells(suite, fast, lambda m: None):
        a = SimRunner().run(cell).row
        b = SimRunner(reference=True).run(cell.__class__(spec=cell.spec, workload=cell.workload, out=ref)).row
        assert a["status"] == b["status"], (a["error"], b["error"])
        if b["status"] != "ok":
            continue  # infeasible: no files
        ran += 1
        for table in ("steps", "requests"):
            assert _path(fast, table, cell.run_id).read_bytes() == _path(ref, table, cell.run_id).read_bytes(), (
                seed,
                cell.spec.policy,
                table,
            )
    assert ran >= 1
