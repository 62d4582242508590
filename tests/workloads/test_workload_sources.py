"""Workload sources with prefix reuse: hash-id (Mooncake) traces, multi-turn conversations,
and the token content every runner sends for them (``workloads.content``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kvbench.harness.errors import KvbenchError
from kvbench.harness.spec.workload_spec import LATER_FIELDS, WorkloadSpec
from kvbench.workloads.build import build_workload
from kvbench.workloads.content import Content
from kvbench.workloads.table import Workload, compute_workload_id, read_workload, write_workload
from kvbench.workloads.traces import read_trace

from tests.conftest import DATA, ROOT, assert_one_line_error, kvbench, tree
from tests.tracekit import write_jsonl
from tools.make_mooncake_traces import BLOCK, mooncake_reuse_rows

FIXTURE = DATA / "mooncake-20.jsonl"
SHIPPED = ROOT / "suites" / "data" / "mooncake-reuse.jsonl"
VOCAB = 50_272


def trace_workload(path: Path, **kw: object) -> Workload:
    return build_workload(WorkloadSpec(source="trace", path=str(path), arrival="trace", **kw))


# --- the shipped data ---------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "seed", "rows"), [(SHIPPED, 0, 240), (FIXTURE, 7, 20)])
def test_shipped_traces_are_the_generators_output(path: Path, seed: int, rows: int) -> None:
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == mooncake_reuse_rows(seed, rows)


def test_reuse_suite_trace_reuses_heavily() -> None:
    w = trace_workload(SHIPPED)
    every = np.concatenate(w.hash_ids)
    assert w.num_requests == 240 and every.size == 1618 and np.unique(every).size == 441


# --- hash-id traces -----------------------------------------------------------------------------


def test_mooncake_rows_read_as_requests(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [5, 6]},
        {"timestamp": 1500, "input_length": 512, "output_length": 3, "hash_ids": [5]},
        {"timestamp": 2500, "input_length": 513, "output_length": 7, "hash_ids": [5, 9]},
    ]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    data = read_trace(path)
    assert data.kind == "mooncake"
    assert data.arrival_s.tolist() == [0.0, 1.5, 2.5]  # ms -> s
    w = trace_workload(path, time_scale=2.0)
    r = w.requests
    assert r["arrival_s"].tolist() == [0.0, 3.0, 5.0]
    assert r["prompt_len"].tolist() == [1000, 512, 513] and r["output_len"].tolist() == [10, 3, 7]
    assert r["prefix_group"].tolist() == [-1, -1, -1] and r["prefix_len"].tolist() == [0, 0, 0]
    assert [ids.tolist() for ids in w.hash_ids] == [[5, 6], [5], [5, 9]]
    assert w.sessions is None
    # a smaller block: the same prompts need more ids
    with pytest.raises(KvbenchError, match=r"line 1: hash_ids has 2 ids, but input_length 1000 needs"):
        trace_workload(path, hash_block_size=256)
    # dropped rows take their ids with them; a clamp keeps the ids of the blocks still covered
    short = build_workload(WorkloadSpec(source="trace", path=str(path), max_prompt_len=512), max_model_len=520)
    assert short.dropped == 1 and [ids.tolist() for ids in short.hash_ids] == [[5], [5]]


def test_hash_ids_are_hashed_and_round_trip(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    w = trace_workload(FIXTURE)
    out = write_workload(w, tmp_path / "w.parquet")
    assert str(pq.read_schema(out).field("hash_ids").type) == "list<element: int64>"
    back = read_workload(out)
    assert back.workload_id == w.workload_id
    assert [a.tolist() for a in back.hash_ids] == [a.tolist() for a in w.hash_ids]
    plain = w.requests.drop(columns=["hash_ids"])
    assert compute_workload_id(plain) != w.workload_id  # the ids are part of the content
    changed = w.requests.copy()
    changed["hash_ids"] = [np.where(ids == ids[-1], ids + 10_000, ids) for ids in changed["hash_ids"]]
    assert compute_workload_id(changed) != w.workload_id


def test_hash_expansion_is_deterministic_and_shared() -> None:
    w = trace_workload(FIXTURE)
    content = Content(w, seed=3, vocab_size=VOCAB, hash_block_size=BLOCK)
    ids, lengths = w.hash_ids, w.requests["prompt_len"].tolist()

    def block(h: int) -> list[int]:
        return np.random.default_rng([3, 3, h]).integers(1, VOCAB, BLOCK).tolist()

    for i, (row, length) in enumerate(zip(ids, lengths, strict=True)):
        expected = [t for h in row.tolist() for t in block(h)][:length]
        prompt = content.prompt_ids(i)
        assert prompt == expected and len(prompt) == length  # the last block cut to length
        assert min(prompt) >= 1 and max(prompt) < VOCAB
        assert content.answer_ids(i) is None
    # rows 1 and 2 share their first 7 ids; 2 has one more: they share exactly 7 blocks
    assert ids[1].tolist() == ids[2].tolist()[:7] and lengths[1] % BLOCK != 0
    a, b = content.prompt_ids(1), content.prompt_ids(2)
    assert a[: 6 * BLOCK] == b[: 6 * BLOCK]
    assert a == b[: len(a)]  # a partial last block is the start of the same block elsewhere
    # rows 0 and 1 share no id: no token run in common at a block start
    assert set(ids[0].tolist()).isdisjoint(ids[1].tolist())
    assert content.prompt_ids(0)[:BLOCK] != content.prompt_ids(1)[:BLOCK]
    # a fresh instance draws the same; another seed draws other tokens
    assert Content(w, 3, VOCAB, BLOCK).prompt_ids(2) == b
    assert Content(w, 4, VOCAB, BLOCK).prompt_ids(2)[:BLOCK] != b[:BLOCK]
    with pytest.raises(KvbenchError, match="hash_block_size 256 needs"):
        Content(w, 3, VOCAB, 256)


# --- the old prompt ids -------------------------------------------------------------------------


def old_prompt_ids(w: Workload, seed: int, vocab: int) -> list[list[int]]:
    """``runners.prompts.PromptIds`` as it was before ``Content``: the reference it must match."""

    def draw(key: list[int], size: int) -> list[int]:
        return np.random.default_rng(key).integers(1, vocab, size=size).tolist() if size > 0 else []

    df = w.requests
    grouped = df[df["prefix_group"] >= 0]
    groups = {
        int(g): draw([seed, 1, int(g)], int(n)) for g, n in grouped.groupby("prefix_group")["prefix_len"].max().items()
    }
    out = []
    for rid, p, g, pl in zip(df["request_id"], df["prompt_len"], df["prefix_group"], df["prefix_len"], strict=True):
        shared = min(int(pl), int(p)) if g >= 0 else 0
        ids = groups[int(g)][:shared] if shared else []
        out.append(ids + draw([seed, 2, int(rid)], int(p) - shared))
    return out


def test_content_matches_the_old_prompt_ids() -> None:
    w = build_workload(
        WorkloadSpec(
            source="uniform",
            num_requests=40,
            prompt_min=4,
            prompt_max=90,
            prefix_groups=3,
            prefix_len=20,
            n=2,
            seed=5,
        )
    )
    content = Content(w, seed=5, vocab_size=VOCAB, hash_block_size=BLOCK)
    assert [content.prompt_ids(i) for i in range(w.num_requests)] == old_prompt_ids(w, 5, VOCAB)
    plain = build_workload(WorkloadSpec(source="fixed", num_requests=3, prompt_len=7))
    assert [Content(plain, 0, 100, BLOCK).prompt_ids(i) for i in range(3)] == old_prompt_ids(plain, 0, 100)


# --- conversations ------------------------------------------------------------------------------


def sessions_spec(**kw: object) -> WorkloadSpec:
    settings: dict[str, object] = {
        "source": "sessions",
        "num_sessions": 5,
        "turns": 4,
        "think_time_s": 1.5,
        "lengths": "uniform",
        "prompt_min": 20,
        "prompt_max": 60,
        "message_min": 5,
        "message_max": 15,
        "output_min": 3,
        "output_max": 30,
        "arrival": "poisson",
        "rate": 2.0,
        "seed": 1,
    }
    settings.update(kw)
    return WorkloadSpec(**settings)  # type: ignore[arg-type]


def test_sessions_table() -> None:
    w = build_workload(sessions_spec())
    r, s = w.requests, w.sessions
    assert s is not None and w.hash_ids is None and w.num_requests == 20 and w.dropped == 0
    assert s.session_id.tolist() == [k for k in range(5) for _ in range(4)]
    assert s.turn.tolist() == [0, 1, 2, 3] * 5
    assert s.think_s.tolist() == [0.0, 1.5, 1.5, 1.5] * 5
    assert s.previous.tolist() == [-1 if t == 0 else i - 1 for i, t in enumerate(s.turn.tolist())]
    starts = r["arrival_s"].to_numpy()[s.turn == 0]
    assert np.all(np.diff(starts) > 0) and starts[0] == 0.0  # poisson over sessions
    assert (r["arrival_s"].to_numpy() == np.repeat(starts, 4)).all()  # later turns: the start, a bound
    assert (r["prefix_group"] == -1).all() and (r["n"] == 1).all()
    p, o = r["prompt_len"].to_numpy(), r["output_len"].to_numpy()
    later = s.turn > 0
    message = p[later] - (p[s.previous[later]] + o[s.previous[later]])
    assert message.min() >= 5 and message.max() <= 15
    assert p[~later].min() >= 20 and p[~later].max() <= 60
    # the same seed builds the same table; the lengths do not depend on the arrival process
    assert build_workload(sessions_spec()).workload_id == w.workload_id
    batch = build_workload(sessions_spec(arrival="batch"))
    assert batch.requests["prompt_len"].tolist() == p.tolist() and (batch.requests["arrival_s"] == 0).all()


def test_sessions_prompts_grow_by_the_answer_and_a_message(tmp_path: Path) -> None:
    w = read_workload(write_workload(build_workload(sessions_spec()), tmp_path / "s.parquet"))
    s = w.sessions
    assert s is not None
    content = Content(w, seed=9, vocab_size=VOCAB, hash_block_size=BLOCK)
    r = w.requests
    for i in range(w.num_requests):
        prompt, answer = content.prompt_ids(i), content.answer_ids(i)
        assert answer is not None and len(answer) == r["output_len"][i] and min(answer) >= 3
        assert len(prompt) == r["prompt_len"][i] and min(prompt) >= 1 and max(prompt + answer) < VOCAB
        if s.turn[i] == 0:
            expected = np.random.default_rng([9, 4, int(s.session_id[i]), 0]).integers(1, VOCAB, len(prompt))
            assert prompt == expected.tolist()
        else:
            before = content.prompt_ids(int(s.previous[i])) + content.answer_ids(int(s.previous[i]))
            assert prompt[: len(before)] == before
            key = [9, 5, int(s.session_id[i]), int(s.turn[i])]
            message = np.random.default_rng(key).integers(1, VOCAB, len(prompt) - len(before))
            assert prompt[len(before) :] == message.tolist()
        key = [9, 6, int(s.session_id[i]), int(s.turn[i])]
        assert answer == np.random.default_rng(key).integers(3, VOCAB, len(answer)).tolist()
    # asked in any order, the same tokens
    backwards = Content(w, seed=9, vocab_size=VOCAB, hash_block_size=BLOCK)
    last = w.num_requests - 1
    assert backwards.answer_ids(last) == content.answer_ids(last)
    assert [backwards.prompt_ids(i) for i in reversed(range(last + 1))][::-1] == [
        content.prompt_ids(i) for i in range(last + 1)
    ]


def test_sessions_drop_a_turn_over_max_model_len_and_the_rest() -> None:
    fixed = sessions_spec(lengths="fixed", prompt_len=100, message_len=30, output_len=50, turns=5, num_sessions=3)
    w = build_workload(fixed, max_model_len=300)  # turn k: 100 + 80k prompt + 50 output
    assert w.dropped == 9 and w.num_requests == 6
    assert w.sessions.turn.tolist() == [0, 1] * 3
    assert w.requests["prompt_len"].tolist() == [100, 180] * 3
    assert build_workload(fixed, max_model_len=310).num_requests == 9  # 310 fits: turn 2 stays
    spec = sessions_spec(num_sessions=40, turns=6)
    full = build_workload(spec)
    cut = build_workload(spec, max_model_len=200)
    assert cut.dropped > 0 and cut.num_requests + cut.dropped == full.num_requests
    total = (full.requests["prompt_len"] + full.requests["output_len"]).to_numpy().reshape(40, 6)
    kept_turns = [int(np.argmax(row > 200)) if (row > 200).any() else 6 for row in total]
    alive = [k for k in kept_turns if k]
    assert np.bincount(cut.sessions.session_id).tolist() == alive  # each a whole run of turns 0..k-1
    assert cut.requests["prompt_len"].tolist() == [
        p
        for row, k in zip(full.requests["prompt_len"].to_numpy().reshape(40, 6), kept_turns, strict=True)
        for p in row[:k]
    ]
    with pytest.raises(KvbenchError, match="every conversation's first turn exceeds max_model_len 10"):
        build_workload(spec, max_model_len=10)


def test_session_tables_are_checked() -> None:
    w = build_workload(sessions_spec(num_sessions=2, turns=3))
    broken = w.requests.copy()
    broken.loc[2, "prompt_len"] = broken.loc[1, "prompt_len"]  # turn 2 loses its history
    with pytest.raises(KvbenchError, match="request 2: prompt_len must exceed the previous turn"):
        Workload.create(broken, w.spec_json)
    with pytest.raises(KvbenchError, match="come together"):
        Workload.create(w.requests.drop(columns=["think_s"]), w.spec_json)
    assert compute_workload_id(w.requests[w.requests.columns[:7]]) != w.workload_id


def test_spec_json_of_earlier_specs_is_unchanged() -> None:
    plain = WorkloadSpec(source="uniform", num_requests=7)
    assert not set(json.loads(plain.to_json())) & set(LATER_FIELDS)
    spec = sessions_spec(lengths="lognormal", message_mean=40.0, hash_block_size=64)
    assert WorkloadSpec.from_json(spec.to_json(), "here") == spec
    with pytest.raises(KvbenchError, match="n = 1"):
        sessions_spec(n=2)
    with pytest.raises(KvbenchError, match="unknown lengths 'zipf'"):
        sessions_spec(lengths="zipf")


@pytest.mark.parametrize("family", ["fixed", "lognormal", "sharegpt", "alpaca-quantiles"])
def test_sessions_draw_from_every_length_family(family: str) -> None:
    w = build_workload(sessions_spec(lengths=family, num_sessions=20, turns=3), max_model_len=4096)
    assert w.num_requests + w.dropped == 60 and (w.requests["output_len"] >= 1).all()


def test_multi_turn_suite_builds() -> None:
    import tomllib

    table = tomllib.loads((ROOT / "suites" / "multi-turn.toml").read_text())
    w = build_workload(WorkloadSpec.from_mapping(table["workload"], "multi-turn"), table["memory"]["max_model_len"])
    assert w.sessions is not None and int(w.sessions.turn.max()) == 7


# --- bad input through the CLI: one line, exit 2, nothing written ---------------------------------


BAD_TRACES = {
    "hash_ids_too_few": (
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]},
        ("line 2", "hash_ids has 2 ids", "needs ceil(1100 / 512) = 3"),
    ),
    "negative_timestamp": (
        {"timestamp": -5, "input_length": 100, "output_length": 5, "hash_ids": [1]},
        ("line 2", "timestamp", "milliseconds >= 0", "-5"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_TRACES))
def test_bad_hash_trace_writes_nothing(tmp_path: Path, case: str) -> None:
    row, needles = BAD_TRACES[case]
    good = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}
    path = write_jsonl(tmp_path / "t.jsonl", [good, row])
    before = tree(tmp_path)
    proc = kvbench("workload", "make", "--source", "trace", "--path", str(path), "--out", str(tmp_path / "w.parquet"))
    assert_one_line_error(proc, "t.jsonl", *needles)
    assert proc.returncode == 2 and tree(tmp_path) == before


def test_bad_sessions_write_nothing(tmp_path: Path) -> None:
    before = tree(tmp_path)
    proc = kvbench("workload", "make", "--source", "sessions", "--turns", "0", "--out", str(tmp_path / "w.parquet"))
    assert_one_line_error(proc, "turns must be >= 1, got 0")
    proc = kvbench("workload", "make", "--source", "sessions", "--n", "2", "--out", str(tmp_path / "w.parquet"))
    assert_one_line_error(proc, "n = 1")
    assert tree(tmp_path) == before
    # through `kvbench run`: a suite whose conversations have no turns
    suite = tmp_path / "suite.toml"
    suite.write_text((ROOT / "suites" / "multi-turn.toml").read_text().replace("turns = 8", "turns = 0"))
    before = tree(tmp_path)
    proc = kvbench("run", str(suite), "--out", str(tmp_path / "out"), "--quiet", "--no-report")
    assert_one_line_error(proc, "suite.toml", "turns must be >= 1, got 0")
    assert proc.returncode == 2 and tree(tmp_path) == before


def test_workload_show_says_conversations_and_hash_ids(tmp_path: Path) -> None:
    out = write_workload(trace_workload(FIXTURE), tmp_path / "t.parquet")
    shown = kvbench("workload", "show", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    every = np.concatenate(trace_workload(FIXTURE).hash_ids)
    assert summary["hash_ids"] == {"total": int(every.size), "distinct": int(np.unique(every).size)}
    assert "sessions" not in summary
    frame = pd.read_parquet(out)
    assert list(frame.columns)[-1] == "hash_ids"
