"""The scheduler's view of one sequence (one sample of one request)."""

from __future__ import annotations

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


class Seq:
    """Mutable per-sequence state; ``__slots__`` because the simulator holds many."""

    __slots__ = (
        "index",
        "request_id",
        "sample",
        "prompt_len",
        "output_len",
        "arrival_s",
        "prefix_group",
        "prefix_len",
        "num_computed",
        "num_output",
        "num_preemptions",
        "status",
        "first_scheduled_s",
        "run_pos",
        "first_token_s",
        "finished_s",
        "peak_allocated",
        "prefix_hit_tokens",
        "recomputed_hit_tokens",
        "block_keys",
        "session_id",
        "turn",
        "after",
        "think_s",
        "sent_s",
        "token_times",
        # allocation state, owned by the policy
        "allocated",
        "blocks",
        "alloc_start",
        "pending_hits",
        "num_cached_blocks",
        "rounding",
        "first_block",
        "block_runs",
        "group_tables",
    )

    def __init__(
        self,
        index: int,
        request_id: int,
        sample: int,
        prompt_len: int,
        output_len: int,
        arrival_s: float,
        prefix_group: int = -1,
        prefix_len: int = 0,
    ) -> None:
        self.index = index
        self.request_id = request_id
        self.sample = sample
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.arrival_s = arrival_s
        self.prefix_group = prefix_group
        self.prefix_len = prefix_len
        self.num_computed = 0  # positions whose K/V is computed (or being computed this step)
        self.num_output = 0  # tokens sampled so far
        self.num_preemptions = 0
        self.status = WAITING
        self.first_scheduled_s = float("nan")
        self.run_pos = 0  # its place in the running order: the scheduler's admissions up to its latest
        self.first_token_s = float("nan")
        self.finished_s = float("nan")
        self.peak_allocated = 0
        self.prefix_hit_tokens = 0  # cache hits at its first admission
        self.recomputed_hit_tokens = 0  # … and at re-admissions after a preemption: its own recomputation
        self.block_keys: list[int] = []  # content keys of its full blocks (prefix caching: ``block_keys``)
        self.session_id = -1  # a multi-turn conversation's id (-1: none)
        self.turn = 0
        self.after = -1  # the sequence (index) whose finish releases this one: the previous turn
        self.think_s = 0.0  # … released this long after it
        self.sent_s = float("nan")  # when a client sent it (the serve runner)
        self.token_times: list[float] | None = None  # each token's time, where a runner records it
        self.allocated = 0  # positions backed by the policy (A)
        self.rounding = 0  # positions a buddy arena added to the reservation (2^k − R), kept after the free
        self.first_block = -1  # contiguous: the first arena unit of its reservation, kept after the free
        self.block_runs = 0  # contiguous: runs of consecutive blocks its reservation formed (1: one run)
        self.blocks: list[int] = []
        self.alloc_start = -1
        self.pending_hits: list[int] = []
        self.num_cached_blocks = 0
        self.group_tables: list[list[int]] = []  # KV cache groups: per group [table length, null blocks]

    @property
    def final_len(self) -> int:
        """F in the measurement definitions (docs/records.md): prompt + output."""
        return self.prompt_len + self.output_len

    @property
    def num_tokens(self) -> int:
        """Tokens known so far (prompt + sampled); what a recompute must cover."""
        return self.prompt_len + self.num_output

    def __repr__(self) -> str:
        return (
            f"Seq({self.request_id}.{self.sample} P={self.prompt_len} O={self.output_len} "
            f"computed={self.num_computed} out={self.num_output} {self.status})"
        )
