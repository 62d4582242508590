"""Fitting a step-time model to measured steps: pure functions from step rows to ``ClockTerms``.

The model is linear in what a step computes (``harness.clock.model.ClockTerms``; docs/clock.md
says what each term is and why it is there):

    step time = step_s + per_token_s × scheduled_tokens + per_seq_s × scheduled_seqs
              + per_context_token_s × context_tokens + per_attention_pair_s × attention_pairs
              + per_early_token_s × min(scheduled_tokens, token_knee)
              + token_miss × (miss_s + miss_per_token_s × scheduled_tokens) + seq_miss × seq_miss_s

The fit minimises relative error with every coefficient ≥ 0 (Lawson–Hanson non-negative least
squares: a negative cost has no physical meaning), under Huber's loss by iteratively reweighted
least squares (steps another process slowed are not the engine's cost). Quality is reported on
held-out steps: every fifth block of 32 consecutive steps of every run, or every fifth step when
no run is that long.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from .model import TOKEN_KNEE, VLLM_CPU_PRIMITIVE_CACHE, ClockTerms, cache_misses

FEATURES: tuple[str, ...] = ("scheduled_tokens", "scheduled_seqs", "context_tokens", "attention_pairs")
TERM_NAMES: tuple[str, ...] = (
    "step_s",
    "per_token_s",
    "per_seq_s",
    "per_context_token_s",
    "per_attention_pair_s",
    "per_early_token_s",
    "miss_s",
    "miss_per_token_s",
    "seq_miss_s",
)
HOLDOUT_BLOCK = 32  # steps per block
HOLDOUT_EVERY = 5  # every fifth block is held out
MIN_STEPS = 50  # below this, six terms are not identifiable from noisy timings


@dataclasses.dataclass(frozen=True)
class ErrorStats:
    """Prediction error over a set of steps: per-step |predicted − measured| ÷ measured, and the
    total's signed error Σ predicted ÷ Σ measured − 1."""

    steps: int
    median_abs: float
    p90_abs: float
    total: float

    def line(self) -> str:
        return (
            f"{self.steps:,} steps: per-step median {self.median_abs:.1%}, p90 {self.p90_abs:.1%}; "
            f"total {self.total:+.1%}"
        )


DISTURBED_RATIO = 3.0  # a step this many times its fitted time was slowed by something else
DISTURBED_WARN = 0.01  # measured here: ≤ 0.2% of steps on an idle machine, 20% beside another job


def disturbed_share(predicted: np.ndarray, measured: np.ndarray) -> float:
    """The share of steps that took over ``DISTURBED_RATIO`` × their price: slowed by something
    other than their own work (0 when there are none)."""
    return float(np.mean(measured > DISTURBED_RATIO * predicted)) if len(measured) else 0.0


@dataclasses.dataclass(frozen=True)
class Fit:
    terms: ClockTerms
    train: ErrorStats
    held_out: ErrorStats
    disturbed: float = 0.0  # share of training steps over DISTURBED_RATIO × their fitted time


def misses(steps: pd.DataFrame, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step row, whether its token count and its request count miss the run's primitive
    caches (``harness.clock.model.RecentCounts``), each run's steps taken in order from an empty
    cache, as sim's profile clock does. All zeros when ``capacity`` is 0."""
    token_miss, seq_miss = np.zeros(len(steps)), np.zeros(len(steps))
    if capacity <= 0 or steps.empty:
        return token_miss, seq_miss
    order = steps.reset_index(drop=True).sort_values(["run_id", "step"], kind="stable")
    for _, idx in order.groupby("run_id", sort=False).indices.items():
        rows = order.index.to_numpy()[idx]
        tokens = order["scheduled_tokens"].to_numpy(dtype=np.int64)[idx]
        token_miss[rows] = cache_misses(tokens, capacity)
        seq_miss[rows] = cache_misses(
            np.where(tokens > 0, order["scheduled_seqs"].to_numpy(dtype=np.int64)[idx], 0), capacity
        )
    return token_miss, seq_miss


def design(steps: pd.DataFrame, knee: int = TOKEN_KNEE, capacity: int = VLLM_CPU_PRIMITIVE_CACHE) -> np.ndarray:
    """The design matrix, one column per term of ``TERM_NAMES``: ones, ``FEATURES``, a step's
    tokens up to the knee, then its cache misses (token count; the same × tokens; request
    count) over whole runs (so ``steps`` holds every step of the runs it holds)."""
    tokens = steps["scheduled_tokens"].to_numpy(dtype=np.float64)
    cols = [np.ones(len(steps))] + [steps[f].to_numpy(dtype=np.float64) for f in FEATURES]
    cols.append(np.minimum(tokens, float(knee)))
    token_miss, seq_miss = misses(steps, capacity)
    cols += [token_miss, token_miss * tokens, seq_miss]
    return np.column_stack(cols)


def coefficients(terms: ClockTerms) -> np.ndarray:
    """The terms in ``design``'s column order."""
    return np.array([getattr(terms, n) for n in TERM_NAMES], dtype=np.float64)


def predict(terms: ClockTerms, steps: pd.DataFrame) -> np.ndarray:
    """The profile's price of each step row (``steps``: whole runs, for the cache misses)."""
    return design(steps, terms.token_knee, terms.primitive_cache) @ coefficients(terms)


def error_stats(predicted: np.ndarray, measured: np.ndarray) -> ErrorStats:
    rel = np.abs(predicted - measured) / measured
    return ErrorStats(
        steps=len(measured),
        median_abs=float(np.median(rel)),
        p90_abs=float(np.percentile(rel, 90)),
        total=float(predicted.sum() / measured.sum() - 1.0),
    )


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min ‖a x − b‖ subject to x ≥ 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        candidates = ~passive & (w > 1e-12 * max(1.0, float(np.abs(w).max())))
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, w, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


def held_out_mask(steps: pd.DataFrame) -> np.ndarray:
    """Every ``HOLDOUT_EVERY``-th block of ``HOLDOUT_BLOCK`` steps of every run; when no run is
    long enough to have such a block, every ``HOLDOUT_EVERY``-th step (an error measured on no
    step would say nothing)."""
    step = steps["step"].to_numpy()
    held = ((step // HOLDOUT_BLOCK) % HOLDOUT_EVERY) == HOLDOUT_EVERY - 1
    return held if held.any() else (step % HOLDOUT_EVERY) == HOLDOUT_EVERY - 1


HUBER_K = 1.345  # the usual tuning: 95% efficiency when the residuals are in fact normal
IRLS_ROUNDS = 8


def fit_terms(steps: pd.DataFrame, x: np.ndarray | None = None) -> ClockTerms:
    """Non-negative, relative, Huber-robust least squares over ``steps`` (``step_wall_s`` > 0);
    ``x``: their design matrix, when built over more steps than these (the held-out split)."""
    x = design(steps) if x is None else x
    y = steps["step_wall_s"].to_numpy(dtype=np.float64)
    # Relative error: divide each row by its measured time. Columns are scaled to unit norm
    # for conditioning (attention pairs run to millions, the intercept is 1) and back after.
    a = x / y[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    b = np.ones(len(y))
    weights = np.ones(len(y))
    coef = np.zeros(a.shape[1])
    for _ in range(IRLS_ROUNDS):
        root = np.sqrt(weights)
        coef = nnls(a * root[:, None], b * root)
        resid = a @ coef - b  # relative residual: predicted ÷ measured − 1
        sigma = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
        if sigma <= 0:
            break
        cut = HUBER_K * sigma
        new = np.minimum(1.0, cut / np.maximum(np.abs(resid), 1e-300))
        if np.allclose(new, weights, rtol=1e-6, atol=1e-9):
            break
        weights = new
    coef = coef / scale
    return ClockTerms(
        **{n: float(c) for n, c in zip(TERM_NAMES, coef)},
        token_knee=TOKEN_KNEE,
        primitive_cache=VLLM_CPU_PRIMITIVE_CACHE,
    )


def fit(steps: pd.DataFrame) -> Fit:
    """Fit on all but the held-out blocks; the profile's terms and its error on both parts."""
    held = held_out_mask(steps)
    train, test = steps[~held], steps[held]
    x = design(steps)  # over whole runs: a step's cache misses depend on the steps before it
    terms = fit_terms(train, x[~held])
    coef = coefficients(terms)
    y_train = train["step_wall_s"].to_numpy(dtype=np.float64)
    y_test = test["step_wall_s"].to_numpy(dtype=np.float64)
    p_train = x[~held] @ coef
    return Fit(
        terms, error_stats(p_train, y_train), error_stats(x[held] @ coef, y_test), disturbed_share(p_train, y_train)
    )
