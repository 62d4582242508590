"""Multi-turn conversations: each turn's prompt is the conversation so far plus a new message.

A ``sessions`` workload holds ``turns`` requests per conversation. Turn 0 sends a first
prompt; turn k sends turn k−1's prompt, turn k−1's answer and a new user message, so every
later prompt starts with every token of the earlier turns (the reuse a prefix cache finds).
Turn k is sent ``think_time_s`` after turn k−1's answer ends: a runner releases it then
(closed loop), never before the conversation's start, which every turn carries as its
``arrival_s``.

Order of work (part of the determinism contract): from the lengths stream, every
conversation's (first prompt, first answer), then every later turn's (message, answer),
conversation by conversation; the ``max_prompt_len``/``max_output_len`` clamps on each
message and answer; dropping a turn that would exceed ``max_model_len`` together with every
later turn of its conversation; then, from the arrivals stream, one start per surviving
conversation; ids in order of (start, conversation, turn).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..harness.errors import KvbenchError
from ..harness.spec.workload_spec import WorkloadSpec
from .arrivals import make_arrivals
from .distributions import FITS, clamp_lengths, fixed_lengths, lognormal_lengths, uniform_lengths
from .length_tables import TABLES, table_lengths
from .table import Workload


def turn_lengths(
    spec: WorkloadSpec, rng: np.random.Generator, count: int, first: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(user text, answer) lengths of ``count`` turns from ``spec.lengths``: a first prompt
    (``first``) takes the prompt settings, a later message the ``message_*`` ones (the fits
    and tables have no separate message lengths: their prompt lengths serve)."""
    family = spec.lengths
    if family == "fixed":
        user = fixed_lengths(count, spec.prompt_len if first else spec.message_len)
        return user, fixed_lengths(count, spec.output_len)
    if family == "uniform":
        low, high = (spec.prompt_min, spec.prompt_max) if first else (spec.message_min, spec.message_max)
        user = uniform_lengths(rng, count, low, high)
        return user, uniform_lengths(rng, count, spec.output_min, spec.output_max)
    if family == "lognormal":
        user = lognormal_lengths(rng, count, spec.prompt_mean if first else spec.message_mean, spec.sigma)
        return user, lognormal_lengths(rng, count, spec.output_mean, spec.sigma)
    if family in TABLES:
        return table_lengths(rng, count, TABLES[family])
    if family in FITS:
        prompt_fit, output_fit = FITS[family]
        user = lognormal_lengths(rng, count, prompt_fit.mean, prompt_fit.sigma)
        return user, lognormal_lengths(rng, count, output_fit.mean, output_fit.sigma)
    raise KvbenchError(f"workload: unknown lengths {family!r}")


def build_sessions(
    spec: WorkloadSpec,
    max_model_len: int | None,
    length_rng: np.random.Generator,
    arrival_rng: np.random.Generator,
) -> Workload:
    """The requests of ``spec``'s conversations (see the module docstring)."""
    sessions, turns = spec.session_count, spec.turns
    first_user, first_answer = turn_lengths(spec, length_rng, sessions, first=True)
    later_user, later_answer = turn_lengths(spec, length_rng, sessions * (turns - 1), first=False)
    user = np.concatenate([first_user[:, None], later_user.reshape(sessions, turns - 1)], axis=1)
    answer = np.concatenate([first_answer[:, None], later_answer.reshape(sessions, turns - 1)], axis=1)
    user = clamp_lengths(user, spec.max_prompt_len)
    answer = clamp_lengths(answer, spec.max_output_len)

    # prompt_k = prompt_{k-1} + answer_{k-1} + message_k: the whole conversation before the answer.
    history = np.concatenate([np.zeros((sessions, 1), dtype=np.int64), np.cumsum(user + answer, axis=1)[:, :-1]], 1)
    prompt = (history + user).astype(np.int64)
    if max_model_len is None:
        kept_turns = np.full(sessions, turns, dtype=np.int64)
    else:
        over = (prompt + answer) > max_model_len
        kept_turns = np.where(over.any(axis=1), over.argmax(axis=1), turns).astype(np.int64)
    total = sessions * turns
    kept = int(kept_turns.sum())
    if kept == 0:
        raise KvbenchError(
            f"workload: every conversation's first turn exceeds max_model_len {max_model_len} (prompt_len + output_len)"
        )
    alive = np.flatnonzero(kept_turns > 0)
    starts = make_arrivals(spec, int(alive.size), arrival_rng)

    session = np.repeat(np.arange(alive.size, dtype=np.int64), kept_turns[alive])
    turn = np.concatenate([np.arange(k, dtype=np.int64) for k in kept_turns[alive]])
    source_row = alive[session]
    order = np.lexsort((turn, session, starts[session]))  # (start, conversation, turn)
    session, turn, source_row = session[order], turn[order], source_row[order]
    table = pd.DataFrame(
        {
            "request_id": np.arange(kept, dtype=np.int64),
            "arrival_s": starts[session].astype(np.float64),
            "prompt_len": prompt[source_row, turn],
            "output_len": answer[source_row, turn],
            "prefix_group": np.full(kept, -1, dtype=np.int64),
            "prefix_len": np.zeros(kept, dtype=np.int64),
            "n": np.ones(kept, dtype=np.int64),
            "session_id": session,
            "turn": turn,
            "think_s": np.where(turn == 0, 0.0, spec.think_time_s).astype(np.float64),
        }
    )
    return Workload.create(table, spec.to_json(), total - kept)
