"""Statistics of ``sppo-rl report``: intervals over seeds, curve smoothing and alignment, calibration, and
the rliable-style aggregates (interquartile mean, optimality gap, stratified bootstrap intervals,
performance profiles; Agarwal et al. 2021), implemented here with NumPy (no ``rliable`` dependency).

Plain NumPy functions; each docstring gives the definition, ``tests/test_report.py`` checks each against
numbers worked out by hand.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as sps


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t interval over independent values (NaNs dropped):

    ``mean = (1/n) sum x_i``, ``s = sqrt(sum (x_i - mean)^2 / (n - 1))``,
    ``half = t_{(1 + confidence)/2, n - 1} * s / sqrt(n)``.
    The half-width is NaN for n < 2; both are NaN for n = 0.
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan
    s = float(x.std(ddof=1))
    return mean, float(sps.t.ppf((1 + confidence) / 2, n - 1)) * s / math.sqrt(n)


def trailing_mean(y, window: int) -> np.ndarray:
    """Trailing moving average: ``y~_i = mean(y_j for max(0, i - window + 1) <= j <= i)``.

    Causal (a point only sees the past), and the first ``window - 1`` points average what exists.
    """
    y = np.asarray(y, dtype=float)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    c = np.concatenate([[0.0], np.cumsum(y)])
    i = np.arange(1, len(y) + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


def interpolate(x, y, grid) -> np.ndarray:
    """Linear interpolation of the curve ``(x, y)`` (x increasing) at ``grid``; NaN outside ``[x_0, x_last]``
    (no extrapolation)."""
    x, y, grid = (np.asarray(a, dtype=float) for a in (x, y, grid))
    if len(x) == 0:
        return np.full(len(grid), np.nan)
    return np.interp(grid, x, y, left=np.nan, right=np.nan)


def first_crossing(x, y, level: float) -> float | None:
    """The first ``x_i`` with ``y_i >= level``; None if the curve never gets there."""
    hit = np.flatnonzero(np.asarray(y, dtype=float) >= level)
    return float(np.asarray(x, dtype=float)[hit[0]]) if len(hit) else None


def pearson(x, y) -> float:
    """Pearson correlation ``r = sum (x_i - mx)(y_i - my) / sqrt(sum (x_i - mx)^2 * sum (y_i - my)^2)``;
    NaN if n < 2 or either variable is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return math.nan
    dx, dy = x - x.mean(), y - y.mean()
    den = math.sqrt(float((dx**2).sum() * (dy**2).sum()))
    return float((dx * dy).sum()) / den if den > 0 else math.nan


def spearman(x, y) -> float:
    """Spearman correlation: :func:`pearson` of the ranks (ties get their average rank)."""
    return pearson(sps.rankdata(x), sps.rankdata(y))


def reliability_bins(pred, emp, weights=None, bins: int = 10) -> list[dict[str, float]]:
    """Equal-width bins ``[b/B, (b+1)/B)`` of the predicted probability (1.0 goes to the last bin).

    For each non-empty bin: ``weight = sum w_i``, ``pred = sum w_i p_i / weight``,
    ``emp = sum w_i y_i / weight`` (``w_i`` = 1 unless given, e.g. the episodes behind ``y_i``).
    """
    p, y = np.asarray(pred, dtype=float), np.asarray(emp, dtype=float)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=float)
    idx = np.clip(np.floor(p * bins).astype(int), 0, bins - 1)
    out = []
    for b in range(bins):
        sel = idx == b
        if not sel.any():
            continue
        wb = float(w[sel].sum())
        out.append(
            {
                "lo": b / bins,
                "hi": (b + 1) / bins,
                "weight": wb,
                "pred": float((w[sel] * p[sel]).sum() / wb),
                "emp": float((w[sel] * y[sel]).sum() / wb),
            }
        )
    return out


def ece(pred, emp, weights=None, bins: int = 10) -> float:
    """Expected calibration error over :func:`reliability_bins`:
    ``ECE = sum_b (weight_b / sum_b weight_b) * |pred_b - emp_b|``."""
    rows = reliability_bins(pred, emp, weights, bins)
    total = sum(r["weight"] for r in rows)
    return sum(r["weight"] / total * abs(r["pred"] - r["emp"]) for r in rows) if total > 0 else math.nan


def brier(pred, emp, samples=None) -> float:
    """Brier score of ``p_i`` against the binary outcomes of the ``m_i`` episodes from start state ``i``,
    of which a fraction ``y_i`` succeeded: ``sum_i sum_j (p_i - r_ij)^2 / sum_i m_i``
    ``= sum_i m_i [(p_i - y_i)^2 + y_i (1 - y_i)] / sum_i m_i`` (``m_i`` = 1 unless given)."""
    p, y = np.asarray(pred, dtype=float), np.asarray(emp, dtype=float)
    m = np.ones_like(p) if samples is None else np.asarray(samples, dtype=float)
    return float((m * ((p - y) ** 2 + y * (1 - y))).sum() / m.sum())


def mse(pred, emp, samples=None) -> float:
    """Squared error against the empirical rates: ``sum_i m_i (p_i - y_i)^2 / sum_i m_i`` (the Brier score
    without the outcome noise ``y_i (1 - y_i)``)."""
    p, y = np.asarray(pred, dtype=float), np.asarray(emp, dtype=float)
    m = np.ones_like(p) if samples is None else np.asarray(samples, dtype=float)
    return float((m * (p - y) ** 2).sum() / m.sum())


# ------------------------------------------------------------------- rliable-style aggregates
# Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS):
# scores are pooled over runs (and tasks), point estimates are robust (IQM), and their uncertainty comes
# from a stratified bootstrap over runs. The functions below take the runs on the last axis, so that one
# call computes the statistic of every bootstrap resample at once.


def iqm(values, axis: int = -1):
    """Interquartile mean: sort the ``n`` values, drop ``k = floor(n / 4)`` from each end and average the
    ``n - 2k`` left: ``IQM = (1 / (n - 2k)) sum_{i=k+1}^{n-k} x_(i)`` (``x_(i)`` the i-th smallest).

    This is ``scipy.stats.trim_mean(x, 0.25)``, the definition rliable uses; for ``n < 4`` nothing is
    dropped (the IQM is the mean). E.g. ``IQM([0, 1, ..., 7]) = mean(2, 3, 4, 5) = 3.5``. NaN for
    ``n = 0``. Along ``axis`` of an array (one IQM per row of a matrix of bootstrap resamples).
    """
    x = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = x.shape[axis]
    if n == 0:
        return np.full(np.delete(x.shape, axis % x.ndim), np.nan)[()]
    k = n // 4
    return np.take(x, np.arange(k, n - k), axis=axis).mean(axis=axis)[()]


def optimality_gap(values, gamma: float = 1.0, axis: int = -1):
    """Optimality gap: how far the runs fall short of the target ``gamma`` on average, overshoot not
    counting: ``gap = (1/n) sum_i max(gamma - x_i, 0)`` (lower is better; 0 when every run reaches
    ``gamma``). E.g. ``gap([0.5, 1.0, 0.8]) = (0.5 + 0 + 0.2) / 3 = 0.2333``."""
    x = np.asarray(values, dtype=float)
    return np.maximum(gamma - x, 0.0).mean(axis=axis)[()]


# name -> statistic of the pooled runs (runs on the last axis)
AGGREGATES = {
    "iqm": iqm,
    "mean": lambda x, axis=-1: np.mean(x, axis=axis)[()],
    "median": lambda x, axis=-1: np.median(x, axis=axis)[()],
    "optimality_gap": optimality_gap,
}


def pooled(statistic):
    """``statistic`` (one of :data:`AGGREGATES`) of the runs of all tasks together, as a function of the
    per-task arrays that :func:`stratified_bootstrap` passes (runs on the last axis)."""
    return lambda strata: statistic(np.concatenate(strata, axis=-1), axis=-1)


def _strata(strata) -> list[np.ndarray]:
    """The per-task arrays as floats, NaNs dropped, tasks left without a run dropped."""
    out = [np.asarray(s, dtype=float).ravel() for s in strata]
    out = [s[~np.isnan(s)] for s in out]
    return [s for s in out if len(s)]


def stratified_bootstrap(
    strata, statistic, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[Any, Any, Any]:
    """Point estimate and percentile bootstrap interval of ``statistic``, resampling runs within each task.

    ``strata`` are the scores of each task's runs, ``x_m = (x_{m,1}, ..., x_{m,n_m})`` for tasks
    ``m = 1..M``. Resample ``b = 1..B`` (``B = reps``) draws, for every task independently, ``n_m`` indices
    uniformly with replacement from ``1..n_m``, giving ``x*_b = (x*_{b,1}, ..., x*_{b,M})``;
    ``theta*_b = statistic(x*_b)``. Returns ``(statistic(x), q_{alpha/2}, q_{1 - alpha/2})`` with
    ``alpha = 1 - confidence`` and ``q_p`` the p-quantile of ``theta*_1..B`` (numpy's linear quantile).

    ``statistic`` takes the list of per-task arrays with the runs on the last axis (``(n_m,)`` for the
    point estimate, ``(B, n_m)`` for the resamples) and returns a scalar per leading index, or an array
    (e.g. a performance profile: ``(T,)`` and ``(B, T)``; the interval is then pointwise).

    The generator is ``numpy.random.default_rng(seed)``, made afresh in every call, so a result never
    depends on what was computed before it. NaN scores are dropped; if no task has two or more runs the
    resamples are all the data itself and the interval is NaN (no interval from single runs). If every
    run of every task has the same score, the interval collapses to that value.
    """
    xs = _strata(strata)
    if not xs:
        return math.nan, math.nan, math.nan
    if reps < 1 or not 0 < confidence < 1:
        raise ValueError(f"need reps >= 1 and 0 < confidence < 1, got {reps} and {confidence}")
    point = np.asarray(statistic(xs), dtype=float)
    if max(len(x) for x in xs) < 2:
        nan = np.full(point.shape, np.nan)
        return _plain(point), _plain(nan), _plain(nan)
    rng = np.random.default_rng(seed)
    samples = [x[rng.integers(0, len(x), size=(reps, len(x)))] for x in xs]
    boot = np.asarray(statistic(samples), dtype=float)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2], axis=0)
    return _plain(point), _plain(lo), _plain(hi)


def _plain(a: np.ndarray) -> Any:
    """A 0-d array as a Python float; other arrays as they are."""
    return float(a) if a.ndim == 0 else a


def performance_profile(strata, taus):
    """Score distribution (performance profile): for each threshold ``tau``, the fraction of runs whose
    score exceeds it, averaged over tasks so that each task weighs the same:
    ``P(tau) = (1/M) sum_m (1/n_m) sum_i 1[x_{m,i} > tau]``.

    ``strata`` as in :func:`stratified_bootstrap` (runs on the last axis); returns ``(..., T)`` for ``T``
    thresholds. E.g. one task with scores ``[0.2, 0.5, 0.9, 1.0]`` at ``tau = 0, 0.5, 1``:
    ``[1, 0.5, 0]`` (strict: a score equal to tau does not count).
    """
    t = np.asarray(taus, dtype=float)
    per_task = [(np.asarray(x, dtype=float)[..., :, None] > t).mean(axis=-2) for x in strata]
    return np.mean(per_task, axis=0)


def clip_interval(mean: float, half: float, lo: float = 0.0, hi: float = 1.0) -> tuple[float, float, bool]:
    """The interval ``[mean - half, mean + half]`` clipped to ``[lo, hi]`` (a success rate cannot leave
    [0, 1], a t-interval over 2-3 seeds often does); also whether it was clipped. NaNs stay NaN."""
    if math.isnan(mean) or math.isnan(half):
        return math.nan, math.nan, False
    a, b = mean - half, mean + half
    return max(a, lo), min(b, hi), bool(a < lo or b > hi)
