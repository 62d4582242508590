"""Arrival processes: when each request reaches the server, in seconds.

Convention for the synthetic processes: the first request arrives at 0.0 and
each later one a random gap after the previous one. So N requests span N-1
gaps, the run starts working at once (no idle lead-in that would differ from
seed to seed), and ``(N-1) / span`` is the natural rate estimate.
"""

from __future__ import annotations

import numpy as np

from ..harness.errors import KvbenchError
from ..harness.spec.workload_spec import WorkloadSpec


def batch_arrivals(count: int) -> np.ndarray:
    """Everyone at t = 0: the offline/batched setting."""
    return np.zeros(count, dtype=np.float64)


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    # First arrival at 0; gap i separates request i and i+1 (the last gap is unused).
    if gaps.size == 0:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(([0.0], np.cumsum(gaps[:-1]))).astype(np.float64)


def poisson_arrivals(rng: np.random.Generator, count: int, rate: float) -> np.ndarray:
    """Poisson process at ``rate`` req/s: exponential gaps of mean 1/rate."""
    if rate <= 0:
        raise KvbenchError(f"workload: poisson rate must be > 0, got {rate!r}")
    return _from_gaps(rng.exponential(scale=1.0 / rate, size=count))


def gamma_arrivals(rng: np.random.Generator, count: int, rate: float, cv: float) -> np.ndarray:
    """Gamma-renewal process: gaps with mean 1/rate and coefficient of variation ``cv``.

    shape k = 1/cv², scale θ = cv²/rate, so mean kθ = 1/rate and CV = 1/√k = cv.
    cv = 1 is Poisson-like, cv > 1 bursty, cv < 1 more regular.
    """
    if rate <= 0 or cv <= 0:
        raise KvbenchError(f"workload: gamma needs rate > 0 and cv > 0, got rate {rate!r}, cv {cv!r}")
    shape = 1.0 / (cv * cv)
    return _from_gaps(rng.gamma(shape=shape, scale=(cv * cv) / rate, size=count))


def trace_arrivals(timestamps: np.ndarray, time_scale: float) -> np.ndarray:
    """A trace's own times (seconds) × ``time_scale`` (< 1 replays faster, > 1 slower)."""
    return np.asarray(timestamps, dtype=np.float64) * float(time_scale)


def make_arrivals(
    spec: WorkloadSpec,
    count: int,
    rng: np.random.Generator,
    trace_times: np.ndarray | None = None,
    where: str = "workload",
) -> np.ndarray:
    """Arrival times for ``count`` requests as ``spec.arrival`` says."""
    if spec.arrival == "batch":
        return batch_arrivals(count)
    if spec.arrival == "poisson":
        assert spec.rate is not None  # WorkloadSpec validation guarantees it
        return poisson_arrivals(rng, count, spec.rate)
    if spec.arrival == "gamma":
        assert spec.rate is not None
        return gamma_arrivals(rng, count, spec.rate, spec.cv)
    if spec.arrival == "trace":
        if trace_times is None:
            raise KvbenchError(f"{where}: arrival 'trace' needs a trace with timestamps (an arrival_s column)")
        if len(trace_times) != count:
            raise AssertionError("trace times and requests out of step")
        return trace_arrivals(trace_times, spec.time_scale)
    raise KvbenchError(f"workload: unknown arrival {spec.arrival!r}")
