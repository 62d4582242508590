"""Bad input, one table: each row of ``CASES`` sets up its inputs in the test's folder, runs one
kvbench command there as a real subprocess, and must get one clear line on stderr naming the
input and the problem, the row's exit code, no traceback, and an unchanged tree (every entry
under the folder, links, FIFOs and file contents included, before and after): nothing written,
nothing of the user's touched; and the row's own ``check`` where it asserts more. Inputs kvbench
accepts at the same edges are in ``test_accepted_input.py``; faults of the environment, what kvbench
promises about the user's data, and everything else that is not a one-line refusal, in
``test_faults.py``."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kvbench.harness.records.lock import LOCK_NAME

from tests.conftest import (
    DATA,
    EXAMPLE,
    LLAMA_CONFIG,
    ROOT,
    SERVED_CACHE_CONFIG,
    SERVED_CHUNKS,
    SMALL,
    assert_one_line_error,
    copy_of,
    import_holding_infinity,
    kvbench,
    plant_link,
    serve_suite,
    special,
    suite_toml,
    tree,
)
from tests.faultkit import DAMAGE, damage_run

REFUSED = 2  # bad input
IO_ERROR = 74  # an output that cannot be made
Setup = Callable[[Path, pytest.FixtureRequest], dict[str, str]]
Check = Callable[[Path, subprocess.CompletedProcess[str]], None]


@dataclass(frozen=True)
class Case:
    """One bad input. ``{tmp}`` in ``argv``, ``needles``, ``cwd`` and file texts is the test's
    folder; ``{NAME}`` is what ``setup`` returned under NAME."""

    argv: tuple[str, ...]
    needles: tuple[str, ...]  # words the one line holds
    setup: Setup | None = None
    rc: int = REFUSED
    cwd: str = "{tmp}"
    absent: tuple[str, ...] = ()  # text stderr must not hold
    gone: tuple[str, ...] = ()  # paths outside the folder that must not exist afterwards
    timeout: float = 300  # a FIFO must not block, an unreachable address must fail at once
    check: Check | None = None  # the row's own assertion beyond these, given its folder and the command


def fill(text: str, names: dict[str, str]) -> str:
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text


def files(texts: dict[str, str | bytes]) -> Setup:
    """Write each file (a text's ``{tmp}`` filled in; parent folders made)."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        for name, text in texts.items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                path.write_bytes(text)
            else:
                path.write_text(fill(text, {"tmp": str(tmp)}), encoding="utf-8")
        return {}

    return setup


def both(*setups: Setup) -> Setup:
    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        names: dict[str, str] = {}
        for one in setups:
            names.update(one(tmp, request))
        return names

    return setup


def edited(old: str, new: str, text: str = EXAMPLE, name: str = "suite.toml") -> Setup:
    """``text`` with its first ``old`` made ``new``, written as ``name``."""
    assert old in text, old
    return files({name: text.replace(old, new, 1)})


def planted(kind: str, name: str) -> Setup:
    """``kind`` (see ``conftest.special``) at ``name``, where kvbench is to write or read a file."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        special(kind, tmp / name, tmp / "elsewhere")
        return {}

    return setup


def not_a_file(kind: str, name: str) -> tuple[str, Setup | None]:
    """A path that is not a regular file: a device, or a FIFO or folder made at ``name``."""
    if kind.startswith("/dev/"):
        return kind, None
    return "{tmp}/" + name, planted("fifo" if kind == "fifo" else "directory", name)


def config_folder_holding_a_fifo(name: str) -> Setup:
    """A model folder whose config.json is a FIFO (a model folder's config.json is read)."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        (tmp / name).mkdir()
        os.mkfifo(tmp / name / "config.json")
        return {}

    return setup


def fixture(name: str) -> Setup:
    """A shared fixture's path, as ``{name}``."""
    return lambda tmp, request: {name: str(request.getfixturevalue(name))}


def recorded_copy(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """The small suite and a copy of its results directory, at suite.toml and out."""
    copy_of(request.getfixturevalue("recorded"), tmp)
    return {}


def imported_copy(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """A copy of the imported results directory at R."""
    shutil.copytree(request.getfixturevalue("imported"), tmp / "R", symlinks=True)
    return {}


CASES: dict[str, Case] = {}
RUN = ("run", "{tmp}/suite.toml", "--out", "{tmp}/out", "--quiet")

# -- suites ------------------------------------------------------------------------------------

SUITE_EDITS = {
    # (old text, new text): (expected words in the error line)
    "typo_in_scheduler_key": (("max_num_seqs", "max_num_seq"), ("suite.toml", "max_num_seq")),
    "typo_in_workload_key": (("num_requests = 200", "num_request = 200"), ("suite.toml", "num_request")),
    "typo_in_grid_key": (("block_size = [16]", "blocksize = [16]"), ("suite.toml", "blocksize")),
    "unknown_top_level_key": (('name = "example"', 'name = "example"\ncolour = "red"'), ("colour",)),
    "text_for_an_integer": (("num_requests = 200", 'num_requests = "ten"'), ("num_requests", "ten")),
    "bool_for_an_integer": (("num_requests = 200", "num_requests = true"), ("num_requests",)),
    "zero_requests": (("num_requests = 200", "num_requests = 0"), ("num_requests",)),
    "negative_prompt": (("prompt_len = 100", "prompt_len = -5"), ("prompt_len",)),
    "block_size_zero": (("block_size = [16]", "block_size = [0]"), ("block_size",)),
    "block_size_absurd": (("block_size = [16]", "block_size = [1000000000]"), ("block_size",)),
    "budget_zero": (('"12GiB"', '"0B"'), ("kv_budget",)),
    "budget_petabytes": (('"12GiB"', '"5PB"'), ("kv_budget",)),
    "budget_unparsable": (('"12GiB"', '"12 parsecs"'), ("kv_budget", "parsecs")),
    "max_model_len_zero": (("max_model_len = 2048", "max_model_len = 0"), ("max_model_len",)),
    "max_num_seqs_negative": (("max_num_seqs = 256", "max_num_seqs = -1"), ("max_num_seqs",)),
    "unknown_policy": (('"paged"]', '"pagd"]'), ("pagd", "contiguous-max")),
    "unknown_runner": (('runner = ["sim"]', 'runner = ["simm"]'), ("simm", "vllm-sched")),
    "unknown_preset": (('preset = "opt-13b"', 'preset = "gpt-5"'), ("gpt-5", "llama-3-8b")),
    "unknown_dtype": (('kv_dtype = "fp16"', 'kv_dtype = "fp4"'), ("fp4", "fp8")),
    "unknown_source": (('source = "fixed"', 'source = "fixd"'), ("fixd",)),
    "unknown_arrival": (('arrival = "batch"', 'arrival = "sometimes"'), ("sometimes",)),
    "poisson_without_rate": (('arrival = "batch"', 'arrival = "poisson"'), ("rate",)),
    "every_request_too_long": (("prompt_len = 100", "prompt_len = 5000"), ("suite.toml", "max_model_len")),
    "empty_grid_list": (('runner = ["sim"]', "runner = []"), ("runner",)),
    "grid_names_missing_workload": (('runner = ["sim"]', 'runner = ["sim"]\nworkload = ["nope"]'), ("nope",)),
    "malformed_toml": (("[memory]", "[memory"), ("suite.toml", "TOML")),
    "roofline_scale_below_one": (
        ("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "roofline"\nroofline_scale = 0.5'),
        ("roofline_scale", "0.5"),
    ),
    "roofline_scale_below_one_on_tables": (
        ("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "tables"\nroofline_scale = 0.5'),
        ("roofline_scale", "0.5", "measured times"),
    ),
    "roofline_scale_text": (
        ("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "roofline"\nroofline_scale = "fast"'),
        ("roofline_scale", "finite number ≥ 1, got 'fast'"),
    ),
    "roofline_scale_without_roofline": (
        ("max_num_batched_tokens = 2048", "max_num_batched_tokens = 2048\nroofline_scale = 2.0"),
        ("roofline_scale", "roofline"),
    ),
    "reference_basis_unknown": (
        (
            "block_size = [16]",
            'block_size = [16]\n[[reference]]\nitem = "x"\npolicy = "paged"\n'
            'metric = "mean_running"\npublished = 1.0\nsource = "s"\nbasis = "guessed"',
        ),
        ("basis", "guessed"),
    ),
    "contiguous_unit_unknown": (
        ('runner = ["sim"]', 'runner = ["sim"]\ncontiguous_unit = "page"'),
        ("contiguous_unit", "page", "position, block"),
    ),
    "vllm_reserving_token_positions": (
        ('runner = ["sim"]', 'runner = ["sim", "vllm-sched"]\ncontiguous_unit = "position"'),
        ("vllm-sched", "whole blocks only"),
    ),
    "trace_file_missing": (
        ('source = "fixed"', 'source = "trace"\npath = "/nonexistent/trace.csv"'),
        ("/nonexistent/trace.csv",),
    ),
    "tp_not_dividing_heads": (
        ("[grid]", "[parallel]\ntensor_parallel_size = 3\n[grid]"),
        ("suite.toml", "tensor_parallel_size 3", "40 attention heads"),
    ),
    "tp_grid_axis_not_dividing_heads": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntensor_parallel_size = [1, 2, 3]'),
        ("suite.toml", "tensor_parallel_size 3"),
    ),
    "tp_times_pp_over_num_gpus": (
        ("[grid]", "[parallel]\ntensor_parallel_size = 4\npipeline_parallel_size = 2\nnum_gpus = 4\n[grid]"),
        ("suite.toml", "= 8 GPUs", "num_gpus = 4"),
    ),
    "tp_zero": (("[grid]", "[parallel]\ntensor_parallel_size = 0\n[grid]"), ("tensor_parallel_size", "0")),
    "pp_negative": (("[grid]", "[parallel]\npipeline_parallel_size = -2\n[grid]"), ("pipeline_parallel_size", "-2")),
    "pp_over_layers": (("[grid]", "[parallel]\npipeline_parallel_size = 41\n[grid]"), ("41", "40 layers")),
    "together_key_typo": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ presett = "opt-66b" }]'),
        ("suite.toml", "presett", "together #1"),
    ),
    "together_holding_a_list": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ tensor_parallel_size = [1, 2] }]'),
        ("together #1", "tensor_parallel_size", "one value"),
    ),
    "together_and_an_axis": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ block_size = 32 }]'),
        ("block_size", "in one place"),
    ),
    "together_not_a_table": (('runner = ["sim"]', 'runner = ["sim"]\ntogether = [4]'), ("together #1", "table")),
    "together_pairing_a_tp_that_does_not_divide": (
        ('runner = ["sim"]', 'runner = ["sim"]\ntogether = [{ preset = "opt-66b", tensor_parallel_size = 5 }]'),
        ("tensor_parallel_size 5", "72 attention heads"),
    ),
    "parallel_key_typo": (("[grid]", "[parallel]\ntensor_parallel = 2\n[grid]"), ("tensor_parallel", "[parallel]")),
    "grids_key_typo": (
        ("block_size = [16]", 'block_size = [16]\n[grids.other]\npresett = "gpt-oss-20b"'),
        ("suite.toml", "'presett'", "[grids.other]"),
    ),
    "grids_empty_table": (("block_size = [16]", "block_size = [16]\n[grids.other]"), ("[grids.other]", "empty")),
    "grids_entry_not_a_table": (
        ("block_size = [16]", "block_size = [16]\n[grids]\nother = 3"),
        ("[grids.other]", "must be a table"),
    ),
    "grids_holding_no_grid": (("block_size = [16]", "block_size = [16]\n[grids]"), ("[grids]", "no grid")),
    "grids_empty_list": (
        ("block_size = [16]", "block_size = [16]\n[grids.other]\nhybrid_kv = []"),
        ("[grids.other]", "hybrid_kv", "empty list"),
    ),
    "grids_undefined_workload": (
        ("block_size = [16]", 'block_size = [16]\n[grids.other]\nworkload = "nope"'),
        ("[grids.other]", "'nope'", "not defined"),
    ),
    "grids_unknown_runner": (
        ("block_size = [16]", 'block_size = [16]\n[grids.other]\nrunner = ["simm"]'),
        ("'simm'", "vllm-sched"),
    ),
    "grids_together_and_an_axis": (
        (
            "block_size = [16]",
            'block_size = [16]\n[grids.other]\nkv_budget = "1GiB"\ntogether = [{ kv_budget = "2GiB" }]',
        ),
        ("kv_budget", "[grids.other] together", "in one place"),
    ),
    "grids_cell_refused": (
        ("block_size = [16]", 'block_size = [16]\n[grids.other]\npreset = "gpt-5"'),
        ("suite.toml", "gpt-5", "llama-3-8b"),
    ),
    "runner_table_for_a_runner_of_grids_only": (
        (
            "block_size = [16]",
            'block_size = [16]\n[grids.other]\nrunner = "vllm-sched"\n[runners.vllm-sched]\nmax_num_seqs = 8',
        ),
        ("[runners.vllm-sched]", "[grid] does not run", "[grid]'s cells only", "[grids.NAME] states"),
    ),
}
CASES.update({f"suite-{k}": Case(RUN, needles, edited(*edit)) for k, (edit, needles) in SUITE_EDITS.items()})
CASES["suite-grids_sweeping_what_a_workload_sweeps"] = Case(
    RUN,
    ("num_requests", "[grids.*]", "in one place"),
    files(
        {
            "suite.toml": EXAMPLE.replace("num_requests = 200", "num_requests = [10, 20]")
            + "[grids.other]\nnum_requests = [30, 40]\n"
        }
    ),
)


def grid_of(key: str, count: int) -> str:
    return f"{key} = [{', '.join(str(i) for i in range(count))}]"


REFUSED_SUITES = {
    # (old text, new text[, name line]): (expected words in the error line)
    "requests_absurd": (("num_requests = 200", "num_requests = 1000000000000"), ("num_requests", "10,000,000")),
    "requests_one_over": (("num_requests = 200", "num_requests = 10000001"), ("num_requests", "10,000,000")),
    "rate_times_duration": (
        ('arrival = "batch"', 'arrival = "poisson"\nrate = 1e6\nduration_s = 1e6'),
        ("rate * duration_s", "10,000,000"),
    ),
    "rate_times_duration_overflows": (
        ('arrival = "batch"', 'arrival = "gamma"\nrate = 1e300\nduration_s = 1e300'),
        ("rate * duration_s", "inf", "10,000,000"),
    ),
    "trace_limit_absurd": (
        ('source = "fixed"', 'source = "trace"\npath = "/nonexistent/t.csv"\nlimit = 100000000000'),
        ("limit", "10,000,000"),
    ),
    "repeats_absurd": (('name = "example"', 'name = "example"\nrepeats = 100000000'), ("repeats", "1,000")),
    "repeats_one_over": (('name = "example"', 'name = "example"\nrepeats = 1001'), ("repeats", "1,000")),
    "grid_product": (
        ("block_size = [16]", f"{grid_of('block_size', 64)}\n{grid_of('seed', 500)}"),
        ("128,000 cells", "100,000"),
    ),
    "grid_product_astronomical": (
        (
            "block_size = [16]",
            "\n".join(
                grid_of(k, 100)
                for k in (
                    "block_size",
                    "seed",
                    "n",
                    "max_num_seqs",
                    "max_num_batched_tokens",
                    "output_len",
                    "prompt_len",
                    "max_model_len",
                )
            ),
        ),
        ("about 10^16 cells", "100,000"),
    ),
    "grid_times_repeats": (
        ("block_size = [16]", f"block_size = [16]\n{grid_of('seed', 100)}", 'name = "example"\nrepeats = 1000'),
        ("400,000 cells", "100,000"),
    ),
    "runner_override_product": (
        ("block_size = [16]", f"{grid_of('block_size', 100)}\n[runners.sim]\n{grid_of('seed', 1000)}"),
        ("400,000 cells",),
    ),
    "unknown_runner_table": (
        ("block_size = [16]", 'block_size = [16]\n[runners.simm]\npolicy = ["paged"]'),
        ("[runners.simm]", "'simm'", "vllm-sched"),
    ),
    "runner_table_capitalised": (
        ("block_size = [16]", "block_size = [16]\n[runners.Sim]\nmax_num_seqs = 8"),
        ("[runners.Sim]", "known: sim"),
    ),
    "runner_table_underscore": (
        ("block_size = [16]", 'block_size = [16]\n[runners.vllm_sched]\npolicy = ["paged"]'),
        ("[runners.vllm_sched]", "vllm-sched"),
    ),
    "runner_table_not_run": (
        ("block_size = [16]", 'block_size = [16]\n[runners.vllm]\npolicy = ["paged"]'),
        ("[runners.vllm]", "configures runner vllm", "does not run", "it runs: sim"),
    ),
    "runner_override_empty_list": (
        ("block_size = [16]", "block_size = [16]\n[runners.sim]\npolicy = []"),
        ("[runners.sim]", "policy", "empty list"),
    ),
    "runner_override_empty_block_sizes": (
        ("block_size = [16]", "block_size = [16]\n[runners.sim]\nblock_size = []"),
        ("[runners.sim]", "block_size", "empty list"),
    ),
    "runner_override_undefined_workload": (
        ("block_size = [16]", 'block_size = [16]\n[runners.sim]\nworkload = ["nope"]'),
        ("[runners.sim]", "'nope'", "not defined"),
    ),
    "optional_runners_a_string": (
        ('name = "example"', 'name = "example"\noptional_runners = "vllm"'),
        ("optional_runners", "list of runner names"),
    ),
    "optional_runner_typo": (
        ('name = "example"', 'name = "example"\noptional_runners = ["vlm"]'),
        ("optional_runners", "'vlm'", "vllm-sched"),
    ),
    "prefix_as_long_as_the_prompt": (
        ("seed = 0", "seed = 0\nprefix_groups = 2\nprefix_len = 100"),
        ("prefix_len (100) must be below prompt_len (100)", "a token of its own"),
    ),
    "prefix_longer_than_the_prompt": (
        ("seed = 0", "seed = 0\nprefix_groups = 2\nprefix_len = 150"),
        ("prefix_len (150) must be below prompt_len (100)",),
    ),
    "config_is_a_device": (('preset = "opt-13b"', 'config = "/dev/zero"'), ("/dev/zero", "not a regular file")),
    "hybrid_kv_off_with_state_layers": (
        (
            'policy = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]',
            'policy = ["paged"]\n[runners.sim]\npreset = "qwen3-next-80b"\nhybrid_kv = false',
        ),
        ("qwen3-next-80b", "Failed to promote local KV cache specs to one unified type"),
    ),
    "hybrid_kv_not_a_bool": (
        ('preset = "opt-13b"', 'preset = "gpt-oss-20b"\nhybrid_kv = "off"'),
        ("hybrid_kv", "'off'"),
    ),
    "a_hybrid_model_on_a_positions_unit_contiguous_policy": (
        (
            'policy = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]',
            'policy = ["contiguous-max"]\n[runners.sim]\npreset = "gpt-oss-20b"\ncontiguous_unit = "position"',
        ),
        ("KV cache groups reserves whole blocks of each group", 'contiguous_unit = "block"'),
    ),
    "profile_is_a_device": (
        (
            "max_num_batched_tokens = 2048",
            'max_num_batched_tokens = 2048\nclock = "profile"\nclock_profile = "/dev/urandom"',
        ),
        ("/dev/urandom", "not a regular file"),
    ),
    "trace_is_a_device": (
        ('source = "fixed"', 'source = "trace"\npath = "/dev/zero"'),
        ("trace /dev/zero", "not a regular file"),
    ),
    "sharegpt_json_is_a_device": (
        ('source = "fixed"', 'source = "sharegpt-json"\npath = "/dev/zero"'),
        ("/dev/zero", "not a regular file"),
    ),
}


def edited_twice(old: str, new: str, name_line: str | None = None) -> Setup:
    text = EXAMPLE.replace(old, new, 1)
    return edited('name = "example"', name_line, text) if name_line else edited(old, new)


CASES.update(
    {
        f"limit-{k}": Case((*RUN, "--no-report"), needles, edited_twice(*edit))
        for k, (edit, needles) in REFUSED_SUITES.items()
    }
)
CASES["suite-a_named_workload_error_names_its_table"] = Case(
    RUN,
    ("suite.toml", "[workloads.chat]", "num_requests"),
    files(
        {
            "suite.toml": EXAMPLE.replace("[workload]", "[workloads.chat]").replace(
                "num_requests = 200", "num_requests = 0"
            )
        }
    ),
    absent=("[workload] ",),
)
REFUSED_GRIDS = {
    "block_size_of_two_types": SMALL.replace("block_size = [16]", 'block_size = [16, "16"]'),
    "an_infinite_rate": SMALL.replace('arrival = "batch"', 'arrival = "poisson"\nrate = [1.0, inf]'),
    # The first workload builds, the second cannot.
    "a_later_workload_refused": SMALL.replace("[workload]", "[workloads.a]").replace(
        "[scheduler]",
        '[workloads.b]\nsource = "fixed"\nprompt_len = 5000\noutput_len = 10\nnum_requests = 3\n[scheduler]',
    ),
}
for _grid, _text in REFUSED_GRIDS.items():
    for _existing in (False, True):  # into a new results directory, and into an empty one
        _setup = files({"suite.toml": _text})
        if _existing:
            _setup = both(_setup, lambda tmp, request: (tmp / "out").mkdir() or {})
        CASES[f"grid-{_grid}-{'existing' if _existing else 'new'}-out"] = Case(RUN, ("suite.toml",), _setup)

# -- suite files, and what is not one -------------------------------------------------------------

NOT_FILES = ["/dev/zero", "/dev/null", "/dev/urandom", "fifo", "directory"]


def _what(kind: str) -> str:
    return "directory" if kind == "directory" else "not a regular file"


for _kind in NOT_FILES:
    _path, _setup = not_a_file(_kind, "suite.toml")
    CASES[f"suite-path-{_kind}"] = Case(
        ("run", _path, "--out", "{tmp}/out", "--quiet"), (_path, _what(_kind)), _setup, timeout=60
    )
    CASES[f"fit-roofline-suite-path-{_kind}"] = Case(
        ("fit-roofline", _path, "--target", "5"), (_path,), _setup, timeout=60
    )
CASES.update(
    {
        "suite-path-missing": Case(("run", "{tmp}/nope.toml"), ("nope.toml", "no such")),
        "suite-path-the-folder": Case(("run", "{tmp}"), ("directory",)),
        "suite-path-binary": Case(
            ("run", "{tmp}/binary.toml"), ("binary.toml",), files({"binary.toml": b"\xff\xfe\x00garbage"})
        ),
        "suite-not-utf8": Case(
            ("run", "{tmp}/suite.toml", "--quiet"),
            ("suite.toml", "not UTF-8", "0xe9"),
            files(
                {
                    "suite.toml": EXAMPLE.replace(
                        'name = "example"', 'name = "example"\ndescription = "caf\xe9"'
                    ).encode("latin-1")
                }
            ),
        ),
        "suite-oversized": Case(
            RUN,
            ("{tmp}/suite.toml", f"{2**20 + 1:,} bytes", f"{2**20:,}-byte limit"),
            lambda tmp, r: _sparse(tmp / "suite.toml", 2**20 + 1),
        ),
        "run-out-a-regular-file": Case(
            ("run", str(ROOT / "suites" / "example.toml"), "--out", "{tmp}/file"),
            ("is a regular file, not a directory",),
            files({"file": "x"}),
        ),
    }
)


def _sparse(path: Path, size: int) -> dict[str, str]:
    with path.open("wb") as fh:
        fh.truncate(size)  # no disk used
    return {}


# -- names that would become paths ----------------------------------------------------------------

ESCAPING_NAMES = {
    "parent": "../../escape",
    "absolute": "/tmp/kvbench-escape",
    "separator": "a/b",
    "backslash": "..\\..\\escape",
    "dot": ".",
    "dotdot": "..",
    "hidden": ".kvbench.lock",
    "nul": "a\x00b",
    "newline": "a\nb",
    "very_long": "x" * 300,
    "empty_after_strip": " ",
}
UNSAFE_NAMES = {
    # name: the character the error names, escaped
    "a\x85b": "'\\x85'",
    "line\u2028sep": "'\\u2028'",
    "invoice\u202eexe.toml": "'\\u202e'",
    "zero\u200bwidth": "'\\u200b'",
    "café": "'\\xe9'",
    "my suite": "' '",
    "a:b": "':'",
    "tab\tname": "'\\t'",
}


def named(name: str, folder: str = "") -> Setup:
    return files({f"{folder}suite.toml": EXAMPLE.replace('name = "example"', f"name = {json.dumps(name)}")})


for _case, _name in ESCAPING_NAMES.items():  # into the default output directory
    CASES[f"name-escaping-{_case}"] = Case(
        ("run", "{tmp}/a/b/c/suite.toml", "--quiet", "--no-report"),
        ("suite.toml", "name", "cannot name a results directory"),
        named(_name, "a/b/c/"),
        cwd="{tmp}/a/b/c",
        absent=("\x00",),
        gone=("/tmp/kvbench-escape",),
    )
for _name, _escaped in UNSAFE_NAMES.items():
    CASES[f"name-unsafe-{ascii(_name)[1:-1]}"] = Case(
        ("run", "{tmp}/suite.toml", "--quiet", "--no-report"),
        ("cannot name a results directory", _escaped, "ASCII letters, digits"),
        named(_name),
        absent=() if _name.isascii() and _name.isprintable() else (_name,),  # shown escaped, never raw
    )
for _name in ("-rf", "+x", "_private"):
    CASES[f"name-starts-{_name}"] = Case(
        ("run", "{tmp}/suite.toml", "--quiet"), ("starts with", "letter or digit"), named(_name)
    )
CASES["name-from-a-hidden-file-name"] = Case(
    ("run", "{tmp}/.hidden.toml", "--quiet"),
    ("'.hidden'", "set name"),
    files({".hidden.toml": EXAMPLE.replace('name = "example"\n', "")}),
)

# -- traces ---------------------------------------------------------------------------------------

TRACE_SUITE = EXAMPLE.replace('source = "fixed"', 'source = "trace"\npath = "{tmp}/{trace}"', 1)
TRACES = {
    # (file text, arrival): words
    "missing_columns": ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n", "batch", ("GeneratedTokens",)),
    "nan_length": ("prompt_len,output_len\n10,5\nnan,3\n", "batch", ("prompt_len",)),
    "text_length": ("prompt_len,output_len\n10,5\nabc,3\n", "batch", ("prompt_len",)),
    "zero_length": ("prompt_len,output_len\n10,0\n", "batch", ("output_len",)),
    "empty": ("prompt_len,output_len\n", "batch", ("no requests in file", "header only")),
    "unsorted_times": ("prompt_len,output_len,arrival_s\n10,5,2.0\n10,5,1.0\n", "trace", ("arrival",)),
    "duplicate_ids": ("request_id,prompt_len,output_len\n1,10,5\n1,10,5\n", "batch", ("request_id",)),
    "azure_bad_timestamp": ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", "trace", ("TIMESTAMP",)),
}
AMBIGUOUS_TRACES = {
    "csv_duplicate_column": (
        "trace.csv",
        "prompt_len,output_len,prompt_len\n10,5,20\n",
        ("'prompt_len'", "more than once"),
    ),
    "csv_duplicate_after_spaces": (
        "trace.csv",
        "prompt_len, output_len, output_len\n10,5,20\n",
        ("'output_len'", "more than once"),
    ),
    "csv_duplicate_azure_column": (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46.68,374,44,3\n",
        ("'ContextTokens'",),
    ),
    "csv_both_schemes": (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,prompt_len,output_len\n2023-11-16 18:15:46.68,374,44,10,5\n",
        ("ContextTokens", "prompt_len", "keep one scheme"),
    ),
    "csv_azure_with_arrival_s": (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,arrival_s\n2023-11-16 18:15:46.68,374,44,0.5\n",
        ("arrival_s", "keep one scheme"),
    ),
    "jsonl_duplicate_key": (
        "trace.jsonl",
        '{"prompt_len": 10, "output_len": 5, "prompt_len": 20}\n',
        ("line 1", "'prompt_len'", "more than once"),
    ),
    "jsonl_both_schemes": (
        "trace.jsonl",
        '{"ContextTokens": 10, "GeneratedTokens": 5, "TIMESTAMP": "2023-11-16", "output_len": 5}\n',
        ("output_len", "keep one scheme"),
    ),
}


def trace_suite(name: str, text: str | None, arrival: str = "batch", extra: str = "") -> Setup:
    """A suite reading the trace ``name`` (written from ``text`` unless None)."""
    suite = TRACE_SUITE.replace("{trace}", name).replace('arrival = "batch"', f'arrival = "{arrival}"')
    return files({"suite.toml": suite.replace("[scheduler]", extra + "[scheduler]"), **({name: text} if text else {})})


def parquet_trace_with_a_duplicate_column(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [pa.array([10]), pa.array([5]), pa.array([20])]
    pq.write_table(
        pa.Table.from_arrays(columns, names=["prompt_len", "output_len", "prompt_len"]), tmp / "trace.parquet"
    )
    return {}


CASES.update(
    {
        f"trace-{k}": Case(RUN, ("trace.csv", *needles), trace_suite("trace.csv", text, arrival))
        for k, (text, arrival, needles) in TRACES.items()
    }
)
CASES.update(
    {
        f"trace-ambiguous-{k}": Case(RUN, (name, *needles), trace_suite(name, text))
        for k, (name, text, needles) in AMBIGUOUS_TRACES.items()
    }
)
CASES["trace-ambiguous-parquet_duplicate_column"] = Case(
    RUN,
    ("trace.parquet", "'prompt_len'", "more than once"),
    both(trace_suite("trace.parquet", None), parquet_trace_with_a_duplicate_column),
)
CASES["trace-prompts_not_longer_than_the_prefix"] = Case(
    RUN,
    ("trace.csv", "2 of the 4 prompts", "prefix_len (20)"),
    trace_suite(
        "trace.csv", "prompt_len,output_len\n10,5\n200,5\n20,5\n21,5\n", extra="prefix_groups = 2\nprefix_len = 20\n"
    ),
)
for _kind in NOT_FILES[1:]:  # /dev/zero: limit-trace_is_a_device
    _path, _setup = not_a_file(_kind, "trace.csv")
    CASES[f"trace-path-{_kind}"] = Case(
        RUN,
        (f"trace {_path}", "not a regular file"),
        both(
            files({"suite.toml": EXAMPLE.replace('source = "fixed"', f'source = "trace"\npath = "{_path}"')}),
            *(_setup,) if _setup else (),
        ),
        timeout=60,
    )

# -- clock profiles -------------------------------------------------------------------------------

PROFILE = DATA / "profile-opt-13b-fp16-b16.json"
PROFILE_SUITE = EXAMPLE.replace("max_num_batched_tokens = 2048", 'max_num_batched_tokens = 2048\nclock = "profile"')
TERMS = ("step_s", "per_token_s", "per_seq_s", "per_context_token_s", "per_attention_pair_s")
DEGENERATE_TERMS = {
    "all_zero": ({t: 0.0 for t in TERMS}, ("costs 0 s", "1e-06 s minimum")),
    "subnormal": ({**{t: 0.0 for t in TERMS}, "step_s": 5e-324}, ("costs 4.94e-324 s", "1e-06 s minimum")),
    "just_below": ({**{t: 0.0 for t in TERMS}, "step_s": 5e-7, "per_token_s": 4e-7}, ("9e-07 s",)),
    "nan": ({"step_s": float("nan")}, ("corrupt clock profile", "step_s")),
    "infinite": ({"per_token_s": float("inf")}, ("corrupt clock profile", "per_token_s")),
}


def profile_with(terms: dict[str, float]) -> str:
    doc = json.loads(PROFILE.read_text())
    doc["terms"].update(terms)
    return json.dumps(doc)  # NaN and Infinity as Python's json writes them


CASES.update(
    {
        f"profile-{k}": Case(
            (*RUN[:2], "--clock-profile", "{tmp}/profile.json", *RUN[2:]),
            ("{tmp}/profile.json", *needles),
            files({"suite.toml": PROFILE_SUITE, "profile.json": profile_with(terms)}),
        )
        for k, (terms, needles) in DEGENERATE_TERMS.items()
    }
)
for _kind in NOT_FILES:
    _path, _setup = not_a_file(_kind, "profile.json")
    CASES[f"profile-path-{_kind}"] = Case(
        (*RUN[:2], "--clock-profile", _path, *RUN[2:]),
        (_path, _what(_kind)),
        both(files({"suite.toml": PROFILE_SUITE}), *(_setup,) if _setup else ()),
        timeout=60,
    )

# -- model configs --------------------------------------------------------------------------------

BAD_CONFIGS = {
    # changes to a valid config: words the one line must hold
    "head_size_not_integral": ({"hidden_size": 250}, ("hidden_size 250", "num_attention_heads 4", "62.5", "head_dim")),
    "kv_heads_not_dividing": ({"num_key_value_heads": 3}, ("num_attention_heads (4)", "num_kv_heads (3)")),
    "more_kv_heads_than_heads": ({"num_key_value_heads": 8}, ("num_kv_heads (8)",)),
    "zero_kv_heads": ({"num_key_value_heads": 0}, ("num_kv_heads", "positive")),
    "zero_layers": ({"num_hidden_layers": 0}, ("num_layers", "positive")),
    "zero_head_dim": ({"head_dim": 0}, ("head_dim", "positive")),
    "negative_heads": ({"num_attention_heads": -4}, ("num_attention_heads",)),
    "fractional_hidden": ({"hidden_size": 256.5}, ("hidden_size", "integer")),
    "layers_absurd": ({"num_hidden_layers": 100_000}, ("num_layers", "100000", "at most 1,024")),
    "head_dim_absurd": ({"head_dim": 65_536}, ("head_dim", "at most")),
    "vocab_absurd": ({"vocab_size": 10**10}, ("vocab_size", "at most")),
    "hidden_absurd": ({"hidden_size": 2**24, "head_dim": 64}, ("hidden_size", "at most")),
}
CALC_35 = ("calc", "--block-size", "16", "--tokens", "35")
CALC_3 = ("calc", "--block-size", "16", "--tokens", "3", "--model", "{tmp}/config.json", "--budget", "1GiB")
CASES.update(
    {
        f"config-{k}": Case(
            (*CALC_35, "--model", "{tmp}/config.json", "--budget", "1GiB"),
            ("{tmp}/config.json", *needles),
            files({"config.json": json.dumps({**LLAMA_CONFIG, **changes})}),
        )
        for k, (changes, needles) in BAD_CONFIGS.items()
    }
)
_INCONSISTENT = both(
    files({"config.json": json.dumps({**LLAMA_CONFIG, "hidden_size": 250})}),
    edited('preset = "opt-13b"', 'config = "{tmp}/config.json"'),
)
CASES.update(
    {
        "config-malformed_json": Case(
            CALC_3, ("config.json", "malformed JSON"), files({"config.json": '{"num_hidden_layers": 2'})
        ),
        "config-without_heads": Case(
            CALC_3, ("config.json", "num_attention_heads"), files({"config.json": '{"num_hidden_layers": 2}'})
        ),
        "config-oversized": Case(
            CALC_3,
            ("{tmp}/config.json", f"{16 * 2**20 + 1:,} bytes", f"{16 * 2**20:,}-byte limit"),
            lambda tmp, r: _sparse(tmp / "config.json", 16 * 2**20 + 1),
        ),
        "config-inconsistent-in-a-suite": Case(RUN, ("suite.toml", "{tmp}/config.json", "62.5"), _INCONSISTENT),
        # The default place, kvbench-results/<suite>: the parent the run made for it goes too.
        "config-inconsistent-in-a-suite-default-out": Case(
            ("run", "{tmp}/suite.toml", "--quiet"), ("suite.toml", "{tmp}/config.json", "62.5"), _INCONSISTENT
        ),
    }
)
for _kind in NOT_FILES:
    _path, _setup = not_a_file(_kind, "model.json")
    if _kind == "directory":
        _setup = config_folder_holding_a_fifo("model.json")
    CASES[f"config-path-{_kind}"] = Case(
        (*CALC_3[:6], _path, "--budget", "1GiB"), (_path, "not a regular file"), _setup, timeout=60
    )

# -- calc, fit-roofline, workload, the command line ------------------------------------------------

CALC = {
    "block_size_zero": (["--block-size", "0", "--tokens", "35"], ("block-size",)),
    "tokens_negative": (["--block-size", "16", "--tokens", "-1"], ("tokens",)),
    "tokens_text": (["--block-size", "16", "--tokens", "many"], ("tokens",)),
    "unknown_model": (["--block-size", "16", "--tokens", "35", "--model", "gpt-5", "--budget", "1GiB"], ("gpt-5",)),
    "bad_budget": (["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "lots"], ("lots",)),
    "budget_without_model": (["--block-size", "16", "--tokens", "35", "--budget", "1GiB"], ("--model",)),
    "unknown_dtype": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "1GiB", "--kv-dtype", "fp5"],
        ("fp5",),
    ),
    "tp_not_dividing_heads": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-66b", "--budget", "5GiB", "--tp", "5"],
        ("tensor_parallel_size 5", "72 attention heads"),
    ),
    "tp_zero": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-66b", "--budget", "5GiB", "--tp", "0"],
        ("--tp",),
    ),
    "pp_negative": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-66b", "--budget", "5GiB", "--pp", "-1"],
        ("--pp",),
    ),
    "tp_without_model": (["--block-size", "16", "--tokens", "35", "--tp", "2"], ("--tp", "--model")),
    "cpu_offload_unparsable": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "1GiB", "--cpu-offload", "lots"],
        ("--cpu-offload", "lots"),
    ),
    "cpu_offload_negative": (
        ["--block-size", "16", "--tokens", "35", "--model", "opt-13b", "--budget", "1GiB", "--cpu-offload=-1GiB"],
        ("--cpu-offload", "negative"),
    ),
    "cpu_offload_without_model": (
        ["--block-size", "16", "--tokens", "35", "--cpu-offload", "16GiB"],
        ("--cpu-offload", "--model"),
    ),
    "missing_workload": (
        [
            "--block-size",
            "16",
            "--tokens",
            "35",
            "--model",
            "opt-13b",
            "--budget",
            "1GiB",
            "--workload",
            "/nonexistent.parquet",
        ],
        ("/nonexistent.parquet",),
    ),
}
CASES.update({f"calc-{k}": Case(("calc", *args), needles) for k, (args, needles) in CALC.items()})
FIT_ROOFLINE = {
    # (arguments after `kvbench fit-roofline`): (expected words in the error line)
    "not_a_roofline_suite": (["example", "--target", "5"], ("roofline",)),
    "unknown_metric": (
        ["paper-batched-requests", "--workload", "sharegpt", "--metric", "speed", "--target", "5"],
        ("speed",),
    ),
    "ambiguous_workload": (["paper-batched-requests", "--target", "5"], ("--workload", "sharegpt")),
    "unknown_workload": (["paper-batched-requests", "--workload", "dolly", "--target", "5"], ("dolly", "sharegpt")),
    "no_such_policy": (
        ["paper-batched-requests", "--workload", "sharegpt", "--policy", "paged-prefix", "--target", "5"],
        ("paged-prefix",),
    ),
    # Memory-bound: no slowing of the clock takes Orca (Max) to 100 requests at once.
    "unreachable_target": (
        [
            "paper-batched-requests",
            "--workload",
            "sharegpt",
            "--policy",
            "contiguous-max",
            "--target",
            "100",
            "--max-scale",
            "2",
        ],
        ("100", "outside"),
    ),
}
CASES.update(
    {f"fit-roofline-{k}": Case(("fit-roofline", *args), needles) for k, (args, needles) in FIT_ROOFLINE.items()}
)
COMMAND_LINES = {
    "unknown_command": (("frobnicate",), ("invalid choice", "'frobnicate'")),
    "jobs_zero": (("run", "--jobs", "0"), ("--jobs", "at least 1", "0")),
    "workload_show_without_a_file": (("workload", "show"), ("required", "FILE")),
    "workload_show_a_missing_file": (
        ("workload", "show", "/nonexistent.parquet"),
        ("/nonexistent.parquet", "no such file"),
    ),
}
CASES.update({f"command-{k}": Case(args, needles) for k, (args, needles) in COMMAND_LINES.items()})
CASES["workload-show-a_corrupt_file"] = Case(
    ("workload", "show", "{tmp}/w.parquet"), ("w.parquet",), files({"w.parquet": b"PAR1 this is not parquet"})
)
CASES["workload-make-absurd_count"] = Case(
    ("workload", "make", "--out", "{tmp}/x.parquet", "--num-requests", "1000000000000"), ("num_requests", "10,000,000")
)
CASES["workload-make-absurd_rate_times_duration"] = Case(
    ("workload", "make", "--out", "{tmp}/x.parquet", "--arrival", "poisson", "--rate", "1e6", "--duration-s", "1e6"),
    ("rate * duration_s", "10,000,000"),
)
MAKE_SUITES = {
    # suite text kept literal: each is malformed or incomplete on purpose
    "malformed": ('[workload]\nsource = "fixed"\nnum_requests = \n', ("suite.toml: malformed TOML", "line 3")),
    "unknown_key": ("[workload]\nprompt_lenn = 3\n", ("suite.toml: unknown key 'prompt_lenn' in [workload]",)),
    "text_for_an_integer": (
        '[workload]\nnum_requests = "ten"\n',
        ("suite.toml: [workload] num_requests must be an integer, got 'ten'",),
    ),
    "missing_trace": ('[workload]\nsource = "trace"\npath = "no/such.csv"\n', ("trace no/such.csv: no such file",)),
    "every_request_too_long": (
        "[workload]\nprompt_len = 4000\n[memory]\nmax_model_len = 2048\n",
        ("all 100 requests exceed max_model_len 2048",),
    ),
}
CASES.update(
    {
        f"workload-make-suite-{k}": Case(
            ("workload", "make", "--suite", "{tmp}/suite.toml", "--out", "{tmp}/w.parquet"),
            needles,
            files({"suite.toml": text}),
        )
        for k, (text, needles) in MAKE_SUITES.items()
    }
)
CASES.update(
    {
        "workload-make-text_for_a_count": Case(
            ("workload", "make", "--out", "{tmp}/w.parquet", "--num-requests", "ten"), ("--num-requests", "'ten'")
        ),
        "workload-make-poisson_without_rate": Case(
            ("workload", "make", "--out", "{tmp}/w.parquet", "--arrival", "poisson"),
            ("arrival 'poisson' needs rate > 0",),
        ),
        "workload-show-missing": Case(
            ("workload", "show", "{tmp}/missing.parquet"), ("missing.parquet: no such file",)
        ),
        "workload-show-junk": Case(
            ("workload", "show", "{tmp}/junk.parquet"),
            ("junk.parquet: not a readable Parquet file",),
            files({"junk.parquet": "not parquet"}),
        ),
    }
)
for _kind in NOT_FILES:
    _name = f"{_kind.strip('/').replace('/', '-')}.json"
    _path, _setup = not_a_file(_kind, _name)
    if _kind == "directory":
        _setup = config_folder_holding_a_fifo(_name)
    CASES[f"workload-show-config-{_kind}"] = Case(
        ("workload", "show", "{workload_file}", "--config", _path),
        (_path, "not a regular file"),
        both(fixture("workload_file"), *(_setup,) if _setup else ()),
        timeout=60,
    )


@pytest.fixture(scope="module")
def workload_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    w = tmp_path_factory.mktemp("workload") / "w.parquet"
    assert kvbench("workload", "make", "--out", w, "--num-requests", "3").returncode == 0
    return w


# -- outputs kvbench will not write --------------------------------------------------------------

for _kind in ("fifo", "device", "directory", "link-to-file", "link-to-directory", "dangling-link"):
    CASES[f"out-file-workload-make-{_kind}"] = Case(
        ("workload", "make", "--out", "{tmp}/w.parquet", "--num-requests", "5"),
        ("{tmp}/w.parquet", "kvbench writes only regular files"),
        planted(_kind, "w.parquet"),
        timeout=60,
    )
for _kind in ("fifo", "device", "directory", "link-to-file"):
    CASES[f"out-file-calibrate-{_kind}"] = Case(
        ("calibrate", "{tmp}/results", "--out", "{tmp}/profile.json"),
        ("{tmp}/profile.json", "kvbench writes only regular files"),
        both(planted(_kind, "profile.json"), lambda tmp, r: (tmp / "results").mkdir() or {}),
        timeout=60,
    )
for _kind in ("fifo", "link-to-file", "link-to-directory", "dangling-link"):
    CASES[f"out-file-export-{_kind}"] = Case(
        ("export", "{imported}", "--format", "vllm-bench", "--out", "{tmp}/link.json"),
        ("{tmp}/link.json", "FIFO" if _kind == "fifo" else "symbolic link"),
        both(fixture("imported"), planted(_kind, "link.json")),
    )
for _kind in ("fifo", "device", "link-to-file"):
    CASES[f"out-dir-run-{_kind}"] = Case(
        RUN, ("{tmp}/out", "not a directory"), both(files({"suite.toml": SMALL}), planted(_kind, "out")), timeout=60
    )
EMPTY_OUTS = {
    "workload_make": ("workload", "make", "--num-requests", "5", "--out", ""),
    "run": ("run", "{tmp}/example.toml", "--quiet", "--out", ""),
    "calibrate": ("calibrate", ".", "--out", ""),
}
CASES.update(
    {
        f"out-empty-{k}": Case(args, ("--out", "empty path"), files({"example.toml": EXAMPLE}), timeout=60)
        for k, args in EMPTY_OUTS.items()
    }
)
CASES["out-dir-under-proc"] = Case(
    ("run", "{tmp}/suite.toml", "--out", "/proc/kvbench-nope", "--quiet"),
    ("/proc/kvbench-nope", "No such file or directory"),
    files({"suite.toml": SMALL}),
    rc=IO_ERROR,
)
CASES["out-dir-under-a-file"] = Case(
    ("run", "{tmp}/suite.toml", "--out", "{tmp}/suite.toml/sub", "--quiet"),
    ("{tmp}/suite.toml/sub", "Not a directory"),
    files({"suite.toml": SMALL}),
    rc=IO_ERROR,
)

# -- empty paths ----------------------------------------------------------------------------------

EMPTY_PATHS = {
    "report": ["report", ""],
    "export_dir": ["export", "", "--format", "vllm-bench", "--out", "x.json"],
    "import_file": ["import", ""],
    "import_like": ["import", str(DATA / "vllm_bench_serve_detailed.json"), "--like", ""],
    "compare": ["compare", "", "."],
    "diverge": ["diverge", "", "a", "b"],
    "calibrate": ["calibrate", "", "--out", "p.json"],
    "run_suite": ["run", ""],
    "run_clock_profile": ["run", "example", "--clock-profile", ""],
    "fit_roofline": ["fit-roofline", "", "--target", "1"],
    "workload_show": ["workload", "show", ""],
    "workload_make_suite": ["workload", "make", "--suite", "", "--out", "w.parquet"],
    "calc_model": ["calc", "--block-size", "16", "--tokens", "5", "--model", ""],
}
CASES.update(
    {
        f"empty-path-{k}": Case(tuple(args), ("an empty path names nothing",), timeout=60)
        for k, args in EMPTY_PATHS.items()
    }
)

# -- results directories kvbench did not write, or not whole --------------------------------------


def foreign_report(how: str) -> Setup:
    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        recorded_copy(tmp, request)
        report = tmp / "out" / "report"
        if how == "own-file":
            (report / "notes.txt").write_text("the user's notes")
        elif how == "changed-summary":
            (report / "summary.md").write_text("edited by hand", encoding="utf-8")
        elif how == "subfolder":
            (report / "drafts").mkdir()
        else:
            shutil.rmtree(report)
            (tmp / "mine").mkdir()
            (tmp / "mine" / "index.html").write_text("<p>mine</p>")
            report.symlink_to(tmp / "mine", target_is_directory=True)
        return {}

    return setup


for _how in ("own-file", "changed-summary", "subfolder", "link"):
    CASES[f"results-foreign-report-{_how}-run"] = Case(
        (*RUN, "--rerun"), ("{tmp}/out/report",), foreign_report(_how), timeout=120
    )
    CASES[f"results-foreign-report-{_how}-report"] = Case(
        ("report", "{tmp}/out"), ("{tmp}/out/report",), foreign_report(_how)
    )


def report_without_manifest(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    recorded_copy(tmp, request)
    (tmp / "out" / "report" / ".kvbench-report.json").unlink()  # nothing says these files are kvbench's
    return {}


CASES["results-report-without-its-manifest"] = Case(
    ("report", "{tmp}/out"), ("{tmp}/out/report",), report_without_manifest
)
CASES["results-report-with-a-foreign-file-says-how"] = Case(
    ("report", "{tmp}/R"),
    ("notes.txt", "move them away"),
    both(imported_copy, files({"R/report/notes.txt": "mine"})),
    absent=("--no-report",),  # report has no such option
)

LINKED = [
    "runs",
    "steps",
    "requests",
    "workloads",
    "steps/run_id=*",
    "requests/run_id=*",
    LOCK_NAME,
    "reference.parquet",
]


def linked_into_another(what: str) -> Setup:
    """A folder or file of out linked into another results directory (other): kvbench neither
    writes nor removes through it, so the other directory's records stay byte for byte."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        _, out = copy_of(request.getfixturevalue("recorded"), tmp)
        _, other = copy_of(request.getfixturevalue("recorded"), tmp, "other")
        if what == "reference.parquet":
            (other / what).write_bytes(b"the other directory's file")
        plant_link(out, other, what)
        if what in ("steps", "requests"):
            # an orphan in the other directory: a run into out must not clean it through the link
            shutil.rmtree(sorted((other / "runs").glob("run_id=*"))[0])
        return {}

    return setup


CASES.update(
    {
        f"results-link-{what.replace('/run_id=*', '-partition')}": Case(
            (*RUN, "--rerun"), ("symbolic link",), linked_into_another(what), timeout=120
        )
        for what in LINKED
    }
)


def incomplete(how: str) -> Setup:
    """A copy of the small suite's results at out with one run's records made incomplete
    (``faultkit.damage_run``), as ``{victim}``, and a whole copy at base. That a rerun completes
    it is ``test_faults.py``'s."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        _, out = copy_of(request.getfixturevalue("recorded"), tmp)
        copy_of(request.getfixturevalue("recorded"), tmp, "base")
        return {"victim": damage_run(out, how)}

    return setup


INCOMPLETE_READERS = {
    "report": ("report", "{tmp}/out"),
    "compare": ("compare", "{tmp}/base", "{tmp}/out"),
    "diverge": ("diverge", "{tmp}/out", "{victim}", "{victim}"),
}
for _how in DAMAGE:
    for _reader, _argv in INCOMPLETE_READERS.items():
        CASES[f"results-incomplete-{_how}-{_reader}"] = Case(_argv, ("{victim}", "incomplete"), incomplete(_how))
_PHOTOS = files({"photos/cat.jpg": b"\xff\xd8"})
CASES.update(
    {
        "results-not-one-report": Case(("report", "{tmp}/photos"), ("{tmp}/photos",), _PHOTOS),
        "results-not-one-compare": Case(("compare", "{tmp}/photos", "{tmp}/photos"), ("{tmp}/photos",), _PHOTOS),
        "results-not-one-diverge": Case(("diverge", "{tmp}/photos", "a", "b"), ("{tmp}/photos",), _PHOTOS),
    }
)


def measured_nothing(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    (tmp / "suite.toml").write_text(SMALL.replace('"12GiB"', '"1MiB"'))
    proc = kvbench("run", tmp / "suite.toml", "--out", tmp / "none", "--quiet", "--no-report")
    assert proc.returncode == 3, proc.stderr  # every cell infeasible
    return {}


CASES["compare-a-side-that-measured-nothing"] = Case(
    ("compare", "{tmp}/none", "{tmp}/none"), ("measured nothing", "4 infeasible"), measured_nothing, rc=1
)

# -- ray ------------------------------------------------------------------------------------------

CASES["ray-address-without-ray"] = Case(
    (*RUN[:4], "--address", "127.0.0.1:6379"), ("--address", "--executor ray"), files({"suite.toml": SMALL}), timeout=60
)
CASES["ray-unreachable-address-fails-at-once"] = Case(
    (*RUN[:4], "--executor", "ray", "--address", "127.0.0.1:1"),
    ("Ray is not installed",)
    if importlib.util.find_spec("ray") is None
    else ("cannot start or reach Ray at 127.0.0.1:1",),
    files({"suite.toml": SMALL}),
    timeout=60,
)

# -- export ---------------------------------------------------------------------------------------

# vLLM writes its result with json.dump, so an infinity would be `Infinity`, not JSON. (The
# pytorch-oss records write it "inf", as vLLM's InfEncoder does: test_faults.py.)
CASES["export-vllm_bench-a_run_holding_infinity"] = Case(
    ("export", "{tmp}/R", "--format", "vllm-bench", "--out", "{tmp}/x.json"),
    ("p99_ttft_ms is inf", "finite numbers"),
    lambda tmp, request: import_holding_infinity(tmp / "R") or {},
)

# -- import ---------------------------------------------------------------------------------------

DETAILED = DATA / "vllm_bench_serve_detailed.json"


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.update({key: value})


def _entry(key: str, i: int, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d[key].__setitem__(i, value)


BAD_IMPORTS: dict[str, tuple[Callable[[dict[str, Any]], None], tuple[str, ...]]] = {
    # case: (edit of the fixture, words of the one line)
    "nan_statistic": (_set("mean_ttft_ms", math.nan), ("mean_ttft_ms", "finite", "nan")),
    "infinite_statistic": (_set("p99_ttft_ms", math.inf), ("p99_ttft_ms", "finite", "inf")),
    "negative_statistic": (_set("median_ttft_ms", -5), ("median_ttft_ms", ">= 0", "-5")),
    "string_statistic": (_set("mean_itl_ms", "4.6"), ("mean_itl_ms", "must be a number", "'4.6'")),
    "negative_input_len": (_entry("input_lens", 0, -4), ("input_lens[0] (request 0)", ">= 1", "-4")),
    "bool_output_len": (_entry("output_lens", 0, True), ("output_lens[0] (request 0)", "whole number", "True")),
    "fractional_input_len": (_entry("input_lens", 3, 24.9), ("input_lens[3] (request 3)", "whole number", "24.9")),
    "string_ttft": (_entry("ttfts", 0, "0.1"), ("ttfts[0] (request 0)", "must be a number", "'0.1'")),
    "negative_ttft": (_entry("ttfts", 1, -0.2), ("ttfts[1] (request 1)", ">= 0", "-0.2")),
    "latency_below_ttft": (_entry("latencies", 2, 0.001), ("latencies[2] (request 2)", "shorter than its TTFT")),
    "latency_beyond_duration": (_entry("latencies", 2, 99.0), ("latencies[2] (request 2)", "longer than", "duration")),
    "subnormal_duration": (_set("duration", 5e-324), ("duration", "5e-324", "infinite")),
    "nan_ttft_entry": (_entry("ttfts", 0, math.nan), ("ttfts[0] (request 0)", "finite", "nan")),
    "infinite_latency_entry": (_entry("latencies", 0, math.inf), ("latencies[0] (request 0)", "finite", "inf")),
    "nan_itl_gap": (lambda d: d["itls"][4].__setitem__(2, math.nan), ("itls[4] (request 4)[2]", "finite")),
    "completed_beyond_int64": (_set("completed", 10**30), ("completed", "int64")),
    "output_tokens_beyond_int64": (_set("total_output_tokens", 2**63 + 5), ("total_output_tokens", "int64")),
    "list_lengths_differ": (lambda d: d["ttfts"].pop(), ("ttfts holds 11 entries", "input_lens 12")),
    "model_id_not_a_string": (_set("model_id", ["a"]), ("model_id", "must be a string")),
}


def edited_result(edit: Callable[[dict[str, Any]], None], source: Path = DETAILED) -> Setup:
    """vllm bench serve's result with one edit, at bad.json (Python's json writes NaN and
    Infinity as vLLM's json.dump does)."""
    doc = json.loads(source.read_text())
    edit(doc)
    return files({"bad.json": json.dumps(doc)})


IMPORT = ("import", "{tmp}/bad.json", "--out", "{tmp}/R")
CASES.update(
    {f"import-{k}": Case(IMPORT, ("bad.json", *words), edited_result(edit)) for k, (edit, words) in BAD_IMPORTS.items()}
)
CASES["import-summary-nan_latency"] = Case(
    IMPORT,
    ("latencies[1] (request 1)", "finite"),
    edited_result(_set("latencies", [0.1, math.nan]), DATA / "vllm_bench_serve_summary.json"),
)
CASES["import-like-none_input_len"] = Case(  # checked against a served run's cells
    ("import", "{tmp}/bad.json", "--like", "{served}", "--out", "{tmp}/R"),
    ("bad.json", "input_lens[0] (request 0)", "None"),
    both(edited_result(_entry("input_lens", 0, None)), fixture("served")),
)
for _kind, _words in (("fifo", "FIFO"), ("device", "character device"), ("directory", "directory")):
    _path = "/dev/zero" if _kind == "device" else "{tmp}/result.json"  # /dev/zero never ends
    CASES[f"import-path-{_kind}"] = Case(
        ("import", _path, "--out", "{tmp}/R"),
        (_path, _words),
        None if _kind == "device" else planted(_kind, "result.json"),
        timeout=60,
    )

# -- Mooncake traces ------------------------------------------------------------------------------

MOONCAKE_ROW = {"timestamp": 0, "input_length": 33, "output_length": 4, "hash_ids": [1]}
BAD_MOONCAKE = {
    "string_timestamp": ({"timestamp": "100"}, ("line 2", "timestamp", "'100'")),
    "string_input_length": ({"input_length": "33"}, ("line 2", "input_length", "'33' is not a number")),
    "string_output_length": ({"output_length": "4"}, ("line 2", "output_length", "'4' is not a number")),
    "timestamp_beyond_the_bound": ({"timestamp": 1e300}, ("line 2", "timestamp", "136 years")),
}
CASES.update(
    {
        f"mooncake-{k}": Case(
            (
                "workload",
                "make",
                "--source",
                "trace",
                "--path",
                "{tmp}/t.jsonl",
                "--hash-block-size",
                "512",
                "--out",
                "{tmp}/w.parquet",
            ),
            ("{tmp}/t.jsonl", *words),
            files(
                {
                    "t.jsonl": "".join(
                        json.dumps(r) + "\n" for r in (MOONCAKE_ROW, {**MOONCAKE_ROW, "timestamp": 10, **change})
                    )
                }
            ),
        )
        for k, (change, words) in BAD_MOONCAKE.items()
    }
)

# -- [slo], [runners.*] ---------------------------------------------------------------------------

BAD_SLO = {
    "preset_as_a_list": ('clock = "roofline"', 'preset = ["mlperf-llama2-70b-server"]', ("[slo] preset",)),
    "bound_metric_as_a_list": (
        'clock = "roofline"',
        'bounds = [{metric = ["ttft"], percentile = 99, max_s = 2.0}]',
        ("[slo] bound metric", "['ttft']"),
    ),
    "column_metric_as_a_list": ('clock = "roofline"', 'metric = ["ttft_p99_s"]\nbound = 1.0', ("[slo] metric",)),
    "on_the_steps_clock": ("", 'preset = "mlperf-llama2-70b-server"', ("[slo]", "steps clock", "count of scheduler")),
}


def slo_suite(clock: str, slo: str) -> str:
    """Four requests on the sim with ``clock`` (a [scheduler] line) and ``slo`` (the [slo] table's text)."""
    return suite_toml(
        "slo",
        model={"preset": "opt-13b"},
        memory={"kv_budget": "12GiB"},
        workload={
            "source": "fixed",
            "num_requests": 4,
            "prompt_len": 16,
            "output_len": 4,
            "arrival": "poisson",
            "rate": 1.0,
        },
        scheduler=clock,
        grid={"runner": ["sim"]},
        slo=slo,
    )


SLO_RUN = (*RUN, "--no-report")
CASES.update(
    {
        f"slo-{k}": Case(SLO_RUN, ("{tmp}/suite.toml", *words), files({"suite.toml": slo_suite(clock, slo)}))
        for k, (clock, slo, words) in BAD_SLO.items()
    }
)
CASES["serve-two_policies_against_one_attached_server"] = Case(
    SLO_RUN,
    ("{tmp}/suite.toml", "2 policies against one server", "contiguous-max", "paged"),
    files({"suite.toml": serve_suite("http://127.0.0.1:9", ["contiguous-max", "paged"])}),  # never asked
)


def attached_server(policies: list[str]) -> tuple[Setup, Check]:
    """A stand-in server (tests/streamkit.py) running paged with block size 16, up for the row's
    command, as ``{url}``, with a suite attaching to it with ``policies``; and the check that it
    was sent no request (only asked what it runs)."""
    scripts: dict[Path, Any] = {}

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        pytest.importorskip("aiohttp")
        from tests.streamkit import Script, stand_in_server  # aiohttp at import

        scripts[tmp] = script = Script(chunks=SERVED_CHUNKS, cache_config=SERVED_CACHE_CONFIG)
        server = contextlib.ExitStack()
        request.addfinalizer(server.close)
        url = server.enter_context(stand_in_server(script))
        (tmp / "suite.toml").write_text(serve_suite(url, policies), encoding="utf-8")
        return {"url": url}

    def nothing_sent(tmp: Path, proc: subprocess.CompletedProcess[str]) -> None:
        assert scripts.pop(tmp).requests == []

    return setup, nothing_sent


_setup, _check = attached_server(["contiguous-max"])
CASES["serve-a_policy_the_attached_server_does_not_run"] = Case(
    SLO_RUN, ("{url}", "runs policy paged with block size 16", "not contiguous-max"), _setup, check=_check
)
CASES["runners-prefix_caching_as_a_setting"] = Case(
    SLO_RUN,
    ("enable_prefix_caching", 'the policy "paged-prefix"'),
    files({"suite.toml": EXAMPLE + '\n[runners.sim]\npolicy = ["contiguous-max"]\nenable_prefix_caching = true\n'}),
)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, request: pytest.FixtureRequest, case: str) -> None:
    row = CASES[case]
    names = {"tmp": str(tmp_path)}
    if row.setup:
        names.update(row.setup(tmp_path, request))
    before = tree(tmp_path)
    argv = [fill(a, names) for a in row.argv]
    proc = kvbench(*argv, cwd=Path(fill(row.cwd, names)), timeout=row.timeout)
    assert_one_line_error(proc, *(fill(n, names) for n in row.needles))
    assert len(proc.stderr.splitlines()) == 1, proc.stderr  # not even a blank line around it
    assert proc.returncode == row.rc, proc.stderr
    for text in row.absent:
        assert text not in proc.stderr, proc.stderr
    assert tree(tmp_path) == before, "a refused command changed the tree"
    for path in row.gone:
        assert not Path(path).exists(), path
    if row.check:
        row.check(tmp_path, proc)
