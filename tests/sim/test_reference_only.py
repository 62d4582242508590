"""A policy with no fast twin runs exact on the reference loop, because its registry entry says
so, and its records say which loop ran (``sim_path``).

The toy policy here is declared the way harness/sim/README.md's "Adding a policy" lists: the
policy, its facts (``capabilities.POLICY_FACTS`` and the runners that host it) and its registry
entry (``harness.sim.policies.POLICIES``), ``fast=False``. Its growth breaks what the fast path
assumes (a decoder's next allocation always fits when the pool's free blocks cover it): driven
by the fast scheduler anyway, its records differ from the reference's, which is why the entry
keeps it off the fast path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kvbench.app.commands import doctor
from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.records import store
from kvbench.harness.sim import policies
from kvbench.harness.sim.fast_scheduler import FastScheduler
from kvbench.harness.sim.policies import PolicyEntry
from kvbench.harness.sim.policies.base import internal_of
from kvbench.harness.sim.sequence import Seq
from kvbench.harness.spec import capabilities, specs
from kvbench.runners.base import Cell
from kvbench.runners.sim import SimRunner, run_scheduler

from tests.conftest import suite_toml

TOY = "toy-doubling"


class DoublingPolicy:
    """Blocks from one pool; a sequence that outgrows its blocks doubles them (1, 2, 4, … blocks),
    as a growable array does. No block ids, no prefix caching."""

    name = TOY

    def __init__(self, budget_positions: int, block_size: int) -> None:
        self.budget_positions = budget_positions
        self.block_size = block_size
        self.num_blocks = budget_positions // block_size
        self.free_count = self.num_blocks
        self.internal_positions = 0
        self.shared_excess_positions = 0
        self.evictions = 0

    def _blocks_for(self, positions: int) -> int:
        blocks = -(-positions // self.block_size)
        return 1 << (blocks - 1).bit_length() if blocks > 0 else 0

    @property
    def allocated_positions(self) -> int:
        return (self.num_blocks - self.free_count) * self.block_size

    def prefix_hit(self, seq: Seq) -> int:
        return 0

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        return max(0, self._blocks_for(num_tokens) - seq.allocated // self.block_size)

    def can_allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        return self.blocks_needed(seq, max(num_tokens, must_fit)) <= self.free_count

    def allocate(self, seq: Seq, num_tokens: int, must_fit: int = 0) -> bool:
        if not self.can_allocate(seq, num_tokens, must_fit):
            return False
        new = self.blocks_needed(seq, num_tokens)
        if new:
            old = seq.allocated
            self.free_count -= new
            seq.allocated = old + new * self.block_size
            seq.peak_allocated = max(seq.peak_allocated, seq.allocated)
            self.internal_positions += internal_of(seq.allocated, seq.final_len) - internal_of(old, seq.final_len)
        return True

    def free(self, seq: Seq) -> None:
        self.free_count += seq.allocated // self.block_size
        self.internal_positions -= internal_of(seq.allocated, seq.final_len)
        seq.allocated = 0

    def allocated_blocks(self) -> int:
        return self.num_blocks - self.free_count

    def cached_free_blocks(self) -> int:
        return 0

    def external_frag(self, head_of_line: Seq | None) -> int:
        return 0 if head_of_line is None else self.budget_positions - self.num_blocks * self.block_size

    def needs_positions(self, seq: Seq) -> int:
        return self._blocks_for(seq.final_len - 1) * self.block_size


def toy_entry(fast: bool) -> PolicyEntry:
    return PolicyEntry(lambda s: DoublingPolicy(s.budget_positions, s.block_size), fast=fast)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy declared as a new policy is: its facts, the sim runner hosting it, its entry."""
    facts = dataclasses.replace(capabilities.POLICY_FACTS["paged"], name=TOY, summary="doubling blocks (a test's toy)")
    monkeypatch.setitem(capabilities.POLICY_FACTS, TOY, facts)
    monkeypatch.setattr(specs, "POLICIES", (*capabilities.POLICIES, TOY))
    sim = capabilities.RUNNER_FACTS["sim"]
    monkeypatch.setitem(capabilities.RUNNER_FACTS, "sim", dataclasses.replace(sim, policies=(*sim.policies, TOY)))
    monkeypatch.setitem(policies.POLICIES, TOY, toy_entry(fast=False))


def toy_cells(out: Path) -> list[Cell]:
    """Requests that outgrow their blocks under a budget that preempts."""
    text = suite_toml(
        model={"preset": "opt-13b", "kv_dtype": "fp16"},
        memory={"kv_budget": "1200MiB", "max_model_len": 2048},
        scheduler={"max_num_seqs": 64, "max_num_batched_tokens": 2048},
        workload={
            "source": "uniform",
            "prompt_min": 20,
            "prompt_max": 200,
            "output_min": 50,
            "output_max": 400,
            "num_requests": 60,
            "seed": 3,
        },
        grid={"runner": ["sim"], "policy": [TOY], "block_size": [16]},
    )
    return build_cells(parse_suite(text, str(out / "toy.toml")), out, lambda msg: None)


def records(out: Path, run_id: str) -> dict[str, object]:
    return {table: store.read_table(out, table, {run_id}) for table in ("steps", "requests")}


def test_a_policy_off_the_fast_path_runs_exact_on_the_reference_loop(toy: None, tmp_path: Path) -> None:
    (cell,) = toy_cells(tmp_path / "fast")
    ref = tmp_path / "ref"
    ref.mkdir()
    ref_cell = dataclasses.replace(cell, out=ref)
    a = SimRunner().run(cell).row  # the sim runner as a suite runs it: the fast path asked for
    b = SimRunner(reference=True).run(ref_cell).row
    assert a["status"] == b["status"] == "ok"
    assert b["preemptions"] > 0  # the budget binds: growth fails and requests are preempted
    # The records say which loop ran, and the run row on disk says it too.
    assert a["sim_path"] == b["sim_path"] == "reference"
    assert store.read_table(tmp_path / "fast", "runs")["sim_path"].tolist() == ["reference"]
    for table in ("steps", "requests"):
        on_disk = [pq.read_table(next((d / table).glob(f"run_id={cell.run_id}/*.parquet"))) for d in (cell.out, ref)]
        assert on_disk[0].equals(on_disk[1]), table


def test_the_fast_path_would_not_keep_its_records(toy: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Declared fast, the toy is driven by the fast scheduler, which assumes a crossing decoder's
    # new block fits whenever the step's token budget does: the records drift from the reference.
    monkeypatch.setitem(policies.POLICIES, TOY, toy_entry(fast=True))
    (cell,) = toy_cells(tmp_path / "fast")
    ref = tmp_path / "ref"
    ref.mkdir()
    fast_row = run_scheduler(cell, "sim", scheduler_cls=FastScheduler).row
    ref_row = SimRunner(reference=True).run(dataclasses.replace(cell, out=ref)).row
    assert fast_row["sim_path"] == "fast" and ref_row["sim_path"] == "reference"
    fast_steps = store.read_table(cell.out, "steps", {cell.run_id})
    ref_steps = store.read_table(ref, "steps", {cell.run_id})
    assert not fast_steps.equals(ref_steps)


def test_doctor_names_the_loop_each_policy_runs_on(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.run(doctor.argparse.Namespace(gpu=False)) == 0
    full = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("full attention"))
    assert f"reference: {TOY}" in full and "fast: contiguous-max" in full


def test_the_registry_holds_every_policy_with_its_loop() -> None:
    assert tuple(policies.POLICIES) == capabilities.POLICIES
    assert sorted(policies.GROUPED) == sorted(capabilities.LAYOUT_POLICIES)
    # Over KV cache groups the contiguous policies run on the reference loop only.
    assert {n for n, e in policies.GROUPED.items() if not e.fast} == {
        p for p in capabilities.LAYOUT_POLICIES if capabilities.is_contiguous(p)
    }
    with pytest.raises(ValueError, match="no fast twin"):
        PolicyEntry(lambda s: DoublingPolicy(1, 1), fast=False, counting=lambda s: DoublingPolicy(1, 1))
