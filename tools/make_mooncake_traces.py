"""Makes the synthetic Mooncake-form traces kvbench ships: ``suites/data/mooncake-reuse.jsonl``
(seed 0, 240 rows) and ``tests/data/mooncake-20.jsonl`` (seed 7, 20 rows).

    python tools/make_mooncake_traces.py

``tests/workloads/test_workload_sources.py`` checks that the shipped files are this script's output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 512  # the traces' hash_block_size
OUTPUTS = (
    (ROOT / "suites" / "data" / "mooncake-reuse.jsonl", 0, 240),
    (ROOT / "tests" / "data" / "mooncake-20.jsonl", 7, 20),
)


def mooncake_reuse_rows(seed: int = 0, rows: int = 240, block: int = BLOCK) -> list[dict]:
    """The synthetic Mooncake-form trace shipped as ``suites/data/mooncake-reuse.jsonl`` (seed 0,
    240 rows) and ``tests/data/mooncake-20.jsonl`` (seed 7, 20 rows): six shared system prompts
    of 1-4 blocks (Zipf-like popularity), and half of the requests extending an earlier
    request's hash ids by 1-2 blocks, as a conversation's next turn would; 250 ms mean gaps."""
    rng = np.random.default_rng(seed)
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    systems = [fresh(int(k)) for k in rng.integers(1, 5, size=6)]
    weights = 1.0 / np.arange(1, 7)
    weights /= weights.sum()
    history: list[list[int]] = []
    out: list[dict] = []
    t = 0.0
    for _ in range(rows):
        if history and rng.random() < 0.5:
            ids = history[int(rng.integers(len(history)))] + fresh(int(rng.integers(1, 3)))
        else:
            ids = systems[int(rng.choice(6, p=weights))] + fresh(int(rng.integers(1, 4)))
        ids = ids[:16]
        history.append(ids)
        length = (len(ids) - 1) * block + int(rng.integers(1, block + 1))
        out.append(
            {
                "timestamp": int(round(t)),
                "input_length": length,
                "output_length": int(rng.integers(16, 513)),
                "hash_ids": ids,
            }
        )
        t += rng.exponential(250.0)
    return out


def main() -> None:
    for path, seed, rows in OUTPUTS:
        path.write_text("".join(json.dumps(r) + "\n" for r in mooncake_reuse_rows(seed, rows)))
        print(f"{path.relative_to(ROOT)}: {rows} rows (seed {seed})")


if __name__ == "__main__":
    main()
