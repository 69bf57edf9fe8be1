"""Statistics of ``sppo-rl report``: intervals over seeds, curve smoothing and alignment, calibration.

Plain NumPy functions on 1-D arrays; each docstring gives the definition, ``tests/test_report.py`` checks
each against numbers worked out by hand.
"""

from __future__ import annotations

import math

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


def tail_mean(y, frac: float = 0.1) -> float:
    """Mean of the last ``k = max(1, ceil(frac * n))`` of ``n`` values (NaN if n = 0); the ceiling ignores
    float noise (0.1 * 30 gives k = 3)."""
    y = np.asarray(y, dtype=float)
    if len(y) == 0:
        return math.nan
    k = max(1, math.ceil(frac * len(y) - 1e-9))
    return float(y[-k:].mean())


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
