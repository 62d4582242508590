"""From a ``WorkloadSpec`` to a ``Workload``: the only place randomness starts.

Order of work (part of the determinism contract: changing it changes ids):

1. one ``np.random.default_rng(spec.seed)``, split with ``spawn`` into a
   lengths stream and an arrivals stream, so the same seed gives the same
   lengths whatever the arrival process or rate (a rate sweep varies one
   thing), and the same arrivals whatever the length source;
2. lengths (prompts, then outputs) from the distribution or file;
3. the optional ``max_prompt_len``/``max_output_len`` clamps;
4. sampled prompts raised to ``prefix_len + 1`` when prefixes are shared (a file's
   prompts must already be longer; a fixed ``prompt_len`` is checked by the spec);
5. requests with prompt + output > ``max_model_len`` dropped (and counted);
6. arrival times for the survivors (so a synthetic rate is the rate asked
   for; trace times stay with their rows);
7. prefix groups round-robin over the survivors, ids 0..N-1.

A hash-id trace keeps each row's hash ids with it through the clamp (a clamped prompt
keeps the ids of the blocks it still covers) and the drop. Conversations (``sessions``)
follow their own order of work, ``workloads.sessions``, on the same two streams.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..harness.errors import KvbenchError
from ..harness.spec.workload_spec import FILE_SOURCES, WorkloadSpec
from .arrivals import make_arrivals
from .distributions import clamp_lengths, sample_lengths
from .prefix import assign_prefix_groups, check_prompts_exceed_prefix, raise_prompts_for_prefix
from .sessions import build_sessions
from .table import Workload
from .traces import read_sharegpt_json, read_trace


def build_workload(spec: WorkloadSpec, max_model_len: int | None = None) -> Workload:
    """Generate (or read) the requests ``spec`` describes; drop those longer than ``max_model_len``."""
    if max_model_len is not None and (
        isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1
    ):
        raise KvbenchError(f"max_model_len must be an integer >= 1, got {max_model_len!r}")
    rng = np.random.default_rng(spec.seed)
    length_rng, arrival_rng = rng.spawn(2)
    if spec.source == "sessions":
        return build_sessions(spec, max_model_len, length_rng, arrival_rng)

    trace_times: np.ndarray | None = None
    hash_ids: list[np.ndarray] | None = None
    if spec.source == "trace":
        assert spec.path is not None
        data = read_trace(spec.path, spec.limit, spec.hash_block_size)
        if spec.arrival == "trace" and data.arrival_s is None:
            raise KvbenchError(f"trace {spec.path}: arrival 'trace' needs times, but the file has no arrival_s column")
        prompts, outputs, trace_times, hash_ids = data.prompt_len, data.output_len, data.arrival_s, data.hash_ids
        if hash_ids is not None and spec.prefix_groups > 0:
            raise KvbenchError(
                f"trace {spec.path}: its hash_ids say which prompts share tokens; set prefix_groups = 0 "
                f"(got {spec.prefix_groups})"
            )
    elif spec.source == "sharegpt-json":
        assert spec.path is not None
        data = read_sharegpt_json(spec.path, spec.limit)
        prompts, outputs = data.prompt_len, data.output_len
    else:
        prompts, outputs = sample_lengths(spec, length_rng)

    prompts = clamp_lengths(prompts, spec.max_prompt_len)
    outputs = clamp_lengths(outputs, spec.max_output_len)
    if hash_ids is not None and spec.max_prompt_len is not None:
        blocks = -(-prompts // spec.hash_block_size)
        hash_ids = [ids[:count] for ids, count in zip(hash_ids, blocks.tolist(), strict=True)]
    if spec.source in FILE_SOURCES:
        check_prompts_exceed_prefix(prompts, spec.prefix_len, f"{spec.source} {spec.path}")
    raised = int(np.count_nonzero(prompts <= spec.prefix_len)) if spec.prefix_len > 0 else 0
    prompts = raise_prompts_for_prefix(prompts, spec.prefix_len)

    total = int(prompts.size)
    keep = np.ones(total, dtype=bool) if max_model_len is None else (prompts + outputs) <= max_model_len
    kept = int(keep.sum())
    if kept == 0:
        raise KvbenchError(
            f"workload: all {total} requests exceed max_model_len {max_model_len} (prompt_len + output_len)"
        )
    prompts, outputs = prompts[keep], outputs[keep]
    times = trace_times[keep] if trace_times is not None else None
    # (the file is named only where there is one: a build reads only what its source uses)
    arrivals = make_arrivals(
        spec, kept, arrival_rng, times, where=f"trace {spec.path}" if times is not None else "workload"
    )
    groups, prefix_lens = assign_prefix_groups(kept, spec.prefix_groups, spec.prefix_len)

    table = pd.DataFrame(
        {
            "request_id": np.arange(kept, dtype=np.int64),
            "arrival_s": arrivals.astype(np.float64),
            "prompt_len": prompts.astype(np.int64),
            "output_len": outputs.astype(np.int64),
            "prefix_group": groups,
            "prefix_len": prefix_lens,
            "n": np.full(kept, spec.n, dtype=np.int64),
        }
    )
    if hash_ids is not None:
        table["hash_ids"] = pd.Series([ids for ids, k in zip(hash_ids, keep.tolist(), strict=True) if k], dtype=object)
    return Workload.create(table, spec.to_json(), total - kept, raised=raised)
