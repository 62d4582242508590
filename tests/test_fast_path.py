"""The simulator's fast path produces byte-identical steps and requests tables to the
step-by-step reference scheduler, on workloads that exercise every path."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from harness import store
from harness.suite import parse_suite
from harness.sweep import build_cells
from runners.sim import SimRunner
from tests.conftest import DATA

BASE = """
name = "fast"
[model]
preset = "{preset}"
kv_dtype = "fp16"
[memory]
kv_budget = "{budget}"
max_model_len = {max_len}
[scheduler]
max_num_seqs = {seqs}
max_num_batched_tokens = {tokens}
preemption = "{preemption}"
clock = "{clock}"
[workload]
{workload}
[grid]
policy = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix", "virtual-contiguous"]
block_size = [16, 32]
"""

CASES = {
    "roomy-sharegpt": dict(budget="12GiB", workload='source = "sharegpt"\nnum_requests = 300'),
    "tight-preempting": dict(budget="2300MiB", workload='source = "sharegpt"\nnum_requests = 200'),
    "chunked-prefill": dict(budget="2GiB", tokens=96, seqs=32,
                            workload='source = "lognormal"\nprompt_mean = 300.0\noutput_mean = 60.0\nnum_requests = 120'),
    "prefix-groups-and-samples": dict(budget="2100MiB", workload='source = "uniform"\nprompt_min = 40\nprompt_max = 400\n'
                                      'output_min = 1\noutput_max = 120\nnum_requests = 150\nprefix_groups = 4\n'
                                      'prefix_len = 64\nn = 3'),
    "poisson-roofline": dict(budget="3GiB", clock="roofline",
                             workload='source = "sharegpt"\nnum_requests = 200\narrival = "poisson"\nrate = 3.0'),
    "swap": dict(budget="2300MiB", preemption="swap", workload='source = "sharegpt"\nnum_requests = 150'),
    "azure-slice": dict(preset="llama-3-8b", budget="1200MiB", max_len=8192, tokens=4096,
                        workload=f'source = "trace"\npath = "{DATA / "azure-conv-slice.csv"}"\nlimit = 300\n'
                                 'arrival = "trace"\ntime_scale = 0.02'),
}


def _suite(**kw) -> str:
    values = dict(preset="opt-13b", max_len=2048, seqs=64, tokens=2048, preemption="recompute", clock="steps")
    values.update(kw)
    return BASE.format(**values)


def _bytes(out, table, run_id):
    return pq.read_table(store.partition_dir(out, table, run_id) / store.PART)


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_is_record_for_record_the_reference(tmp_path, case):
    suite = parse_suite(_suite(**CASES[case]), "fast.toml")
    fast, ref = tmp_path / "fast", tmp_path / "ref"
    preempted = 0
    for cell in build_cells(suite, fast, lambda m: None):
        ref_cell = cell.__class__(spec=cell.spec, workload=cell.workload, out=ref)
        a = SimRunner().run(cell)
        b = SimRunner(reference=True).run(ref_cell)
        assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
        for table in ("steps", "requests"):
            ta, tb = _bytes(fast, table, cell.run_id), _bytes(ref, table, cell.run_id)
            assert ta.equals(tb), (case, cell.spec.policy, cell.spec.block_size, table)
        preempted += b["preemptions"]
    if case in ("tight-preempting", "swap", "prefix-groups-and-samples"):
        assert preempted > 0  # the case really exercises the fallback path
