"""The check of whole OPT steps against DistServe's measured A100-80GB steps
(``benchmarks/bench_opt_steps.py``): what it reads, the grid it prices, and the accuracy
docs/clock.md states for it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from kvbench.harness.clock.tables_clock import TablesClock
from kvbench.harness.spec.geometry import PRESETS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_opt_steps", ROOT / "benchmarks" / "bench_opt_steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_the_measured_fits_ship_with_their_licence_and_only_the_profiled_degrees(bench: ModuleType) -> None:
    fits = bench.read_fits()
    assert sorted(fits) == sorted(bench.TOKEN_LIMITS)
    assert all(model in PRESETS for model, _ in fits)
    data = bench.MEASURED.parent
    assert "Apache License" in (data / "DISTSERVE-LICENSE.txt").read_text()
    assert sorted(p.name for p in data.iterdir()) == ["DISTSERVE-LICENSE.txt", "README.md", "distserve.json"]


def test_the_grid_is_distserves_under_its_token_limit(bench: ModuleType) -> None:
    points = bench.grid("opt-66b", 2)  # the tightest limit: 8,192 tokens
    assert (1, 2020) in points and (4, 2020) in points and (8, 1024) in points
    assert (5, 2020) not in points and (8, 2020) not in points and (192, 48) not in points
    assert all(b * -(-n // 16) * 16 <= 8192 for b, n in points)


def test_a_fit_switches_to_its_large_batch_terms_above_95_requests(bench: ModuleType) -> None:
    fit = bench.StepFit((1.0, 0.0, 0.0), (10.0, 0.001, 0.1), (20.0, 0.002, 0.2), 95)
    assert fit.decode_s(95, 100) == pytest.approx((10.0 + 0.001 * 9500 + 0.1 * 95) / 1e3)
    assert fit.decode_s(96, 100) == pytest.approx((20.0 + 0.002 * 9600 + 0.2 * 96) / 1e3)
    assert fit.prefill_s(2, 10) == pytest.approx(1.0 / 1e3)


def test_the_tables_clock_prices_opt_decode_steps_it_never_saw_within_docs_figures(bench: ModuleType) -> None:
    # docs/clock.md: decode-step median error 7.3% for the tables clock against 31.1% for the
    # roofline over all six fits; each fit's median within 15%, each below the roofline's.
    every: dict[str, list[np.ndarray]] = {"tables": [], "roofline": []}
    for (model, tp), fit in bench.read_fits().items():
        points = bench.grid(model, tp)
        clocks = bench.clocks(model, tp)
        assert isinstance(clocks["tables"], TablesClock)
        mine = bench.errors(clocks["tables"], fit, points, "decode")
        roof = bench.errors(clocks["roofline"], fit, points, "decode")
        assert np.median(mine) <= 0.15 and np.median(mine) < np.median(roof), (model, tp)
        every["tables"].append(mine)
        every["roofline"].append(roof)
    assert np.median(np.concatenate(every["tables"])) <= 0.10 < np.median(np.concatenate(every["roofline"]))
