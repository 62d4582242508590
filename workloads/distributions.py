"""Synthetic request-length distributions.

``sharegpt`` and ``alpaca`` are *not* the datasets: they are lognormal fits
whose means are the ones the vLLM paper (Kwon et al., SOSP 2023, §6.1)
publishes for them, with spreads chosen by us to look like the paper's length
histograms (long right tail for ShareGPT, short and tight for Alpaca):

    ShareGPT: input mean 161.31 (sigma 1.0), output mean 337.99 (sigma 0.8)
    Alpaca:   input mean  19.31 (sigma 0.6), output mean  58.45 (sigma 0.9)

Prompt and output lengths are drawn independently (the real data has some
correlation; these fits ignore it). Nothing here caps the tails: requests too
long for ``max_model_len`` are dropped, and counted, by ``build_workload``.
For the real ShareGPT conversations use the ``sharegpt-json`` source; for the lengths the
paper measured, ``sharegpt-quantiles`` and ``alpaca-quantiles`` (``workloads.length_tables``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..harness.errors import KvbenchError
from ..harness.spec.workload_spec import WorkloadSpec
from .length_tables import TABLES, table_lengths


class LognormalFit(NamedTuple):
    """A lognormal given by its mean and the sigma of the underlying normal."""

    mean: float
    sigma: float


# Published means (vLLM paper); sigmas are our choice — see the module docstring.
SHAREGPT_PROMPT = LognormalFit(161.31, 1.0)
SHAREGPT_OUTPUT = LognormalFit(337.99, 0.8)
ALPACA_PROMPT = LognormalFit(19.31, 0.6)
ALPACA_OUTPUT = LognormalFit(58.45, 0.9)

FITS: dict[str, tuple[LognormalFit, LognormalFit]] = {
    "sharegpt": (SHAREGPT_PROMPT, SHAREGPT_OUTPUT),
    "alpaca": (ALPACA_PROMPT, ALPACA_OUTPUT),
}


def fixed_lengths(count: int, length: int) -> np.ndarray:
    """``count`` copies of ``length`` (int64)."""
    return np.full(count, length, dtype=np.int64)


def uniform_lengths(rng: np.random.Generator, count: int, low: int, high: int) -> np.ndarray:
    """Integers uniform on ``[low, high]``, both ends included."""
    return rng.integers(low, high, size=count, endpoint=True, dtype=np.int64)


def lognormal_lengths(rng: np.random.Generator, count: int, mean: float, sigma: float) -> np.ndarray:
    """Lognormal lengths whose (continuous) mean is ``mean``, rounded to the nearest int, at least 1.

    mu = ln(mean) - sigma²/2 makes E[X] = exp(mu + sigma²/2) = mean. Rounding
    and the floor of 1 move the mean by well under 1% for means above ~10.
    """
    mu = math.log(mean) - sigma * sigma / 2.0
    values = rng.lognormal(mean=mu, sigma=sigma, size=count)
    return np.maximum(np.rint(values), 1).astype(np.int64)


def sample_lengths(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_len, output_len) for a synthetic source; prompts are drawn before outputs."""
    count = spec.request_count
    if spec.source == "fixed":
        return fixed_lengths(count, spec.prompt_len), fixed_lengths(count, spec.output_len)
    if spec.source == "uniform":
        prompts = uniform_lengths(rng, count, spec.prompt_min, spec.prompt_max)
        return prompts, uniform_lengths(rng, count, spec.output_min, spec.output_max)
    if spec.source == "lognormal":
        prompts = lognormal_lengths(rng, count, spec.prompt_mean, spec.sigma)
        return prompts, lognormal_lengths(rng, count, spec.output_mean, spec.sigma)
    if spec.source in TABLES:
        return table_lengths(rng, count, TABLES[spec.source])
    if spec.source in FITS:
        prompt_fit, output_fit = FITS[spec.source]
        prompts = lognormal_lengths(rng, count, prompt_fit.mean, prompt_fit.sigma)
        return prompts, lognormal_lengths(rng, count, output_fit.mean, output_fit.sigma)
    raise KvbenchError(f"workload: source {spec.source!r} is not a synthetic distribution")


def clamp_lengths(values: np.ndarray, maximum: int | None) -> np.ndarray:
    """``min(values, maximum)``; the caller asked for the cap, so this is not a silent change."""
    return values if maximum is None else np.minimum(values, maximum).astype(np.int64)
