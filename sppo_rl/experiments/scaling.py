"""Compute-scaling fits: ScaleRL's sigmoid of held-out accuracy against training compute.

ScaleRL ("The Art of Scaling RL Compute", arXiv 2510.13786) fits, per method::

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

to validation accuracy ``R`` against cumulative training FLOPs ``C`` (``flops_total`` of the metrics rows,
:mod:`sppo_rl.llm.models.flops`). ``R0`` is the accuracy at ``C = 0`` (the start, fixed, not fitted); ``A`` the
ceiling the curve tends to; ``C_mid`` the compute at which half of the gain ``A - R0`` is reached and ``B``
the steepness: the efficiency. A method with the higher ``A`` ends higher given enough compute; one with
the smaller ``C_mid`` (or larger ``B``) gets there sooner. They are reported apart.

- **Mean curve** (:func:`mean_curve`): each seed's accuracy read as straight lines between its
  evaluations, on an even grid of the compute every seed reached; the fit is to the mean over seeds.
- **Fit** (:func:`fit_sigmoid`): least squares (``scipy.optimize.curve_fit``, ``log10 C_mid`` fitted,
  nine starts, bounds ``0 <= A <= 1``, ``0.05 <= B <= 20``, ``C_mid`` from a decade below the first
  evaluation to two above the last). A fit that fails, ends on a bound (``A`` may end at 0 or 1 when
  ``C_mid`` lies within the data), has fewer than 4 points above ``C = 0``, no gain to explain
  (``|A - R0| < 0.01``: ``C_mid`` and ``B`` undetermined) or ``C_mid`` before the first evaluation above
  ``C = 0`` (a step the evaluations do not resolve) says so in ``problem``; its numbers are None.
- **Intervals** (:func:`fit_method`): seeds resampled with replacement, the mean curve refitted; 2.5 and
  97.5 percentiles of ``A``, ``C_mid``, ``B`` over the resamples whose fit, started from the full data's,
  converged (how many did is kept).
- **Extrapolation check** (:func:`extrapolation`): fitted on the points with ``C <= C_max / 2`` only, the
  curve predicts the rest; the error is the mean ``|predicted - observed|`` there (and its maximum). Above
  ``tolerance`` (0.05) the fit "does not extrapolate".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MIN_POINTS = 4
"""Points above ``C = 0`` a fit needs (three parameters and one to spare)."""
TOLERANCE = 0.05
"""The mean absolute extrapolation error above which a fit is said not to extrapolate."""
B_BOUNDS = (0.05, 20.0)


def sigmoid(C: Any, A: float, C_mid: float, B: float, R0: float) -> np.ndarray:
    """``R0 + (A - R0) / (1 + (C_mid / C)^B)``; ``R0`` at ``C = 0``."""
    C = np.asarray(C, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        frac = 1.0 / (1.0 + np.power(C_mid / np.where(C > 0, C, np.nan), B))
    return R0 + (A - R0) * np.where(C > 0, frac, 0.0)


@dataclass
class Fit:
    """One sigmoid fit: ``A``, ``C_mid``, ``B`` (None when ``problem`` says why there is none), ``R0``, the
    root-mean-square residual and the points fitted."""

    R0: float
    A: float | None = None
    C_mid: float | None = None
    B: float | None = None
    rmse: float | None = None
    points: int = 0
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def predict(self, C: Any) -> np.ndarray:
        if not self.ok:
            raise ValueError(f"no fit to predict with: {self.problem}")
        return sigmoid(C, self.A, self.C_mid, self.B, self.R0)  # type: ignore[arg-type]


def fit_sigmoid(C: Any, R: Any, R0: float, start: Fit | None = None) -> Fit:
    """The sigmoid through ``(C, R)`` with ``R0`` fixed (see the module docstring); points at ``C <= 0``
    are not fitted (``R0`` stands for them). ``start``: a fit to start from alone (the bootstrap's
    resamples start from the full data's fit); else nine starts, the best kept."""
    C, R = np.asarray(C, dtype=float), np.asarray(R, dtype=float)
    keep = (C > 0) & np.isfinite(R) & np.isfinite(C)
    C, R = C[keep], R[keep]
    if len(C) < MIN_POINTS:
        problem = f"did not converge: {len(C)} points above C = 0, a fit needs {MIN_POINTS}"
        return Fit(R0=float(R0), points=len(C), problem=problem)
    if start is not None and start.ok:
        return _fit(C, R, R0, [[start.A, math.log10(start.C_mid), start.B]])  # type: ignore[arg-type]
    span = math.log10(C.max() / C.min()) if C.max() > C.min() else 1.0
    A0 = min(max(float(R.max()), 0.0), 1.0)
    return _fit(
        C, R, R0, [[A0, math.log10(C.min()) + q * span, B0] for q in (0.25, 0.5, 0.75) for B0 in (0.5, 1, 3)]
    )


def _fit(C: np.ndarray, R: np.ndarray, R0: float, starts: list[list[float]]) -> Fit:
    """The best of the least-squares fits from ``starts`` (``[A, log10 C_mid, B]``), judged."""
    from scipy.optimize import curve_fit

    fit = Fit(R0=float(R0), points=len(C))
    lo, hi = math.log10(C.min()) - 1, math.log10(C.max()) + 2
    bounds = ([0.0, lo, B_BOUNDS[0]], [1.0, hi, B_BOUNDS[1]])
    f = lambda c, A, logc, B: sigmoid(c, A, 10.0**logc, B, R0)  # noqa: E731
    best, best_sse, errors = None, math.inf, []
    for p0 in starts:
        p0 = [float(np.clip(v, a, b)) for v, a, b in zip(p0, *bounds)]
        try:
            p, _ = curve_fit(f, C, R, p0=p0, bounds=bounds, maxfev=1000)
        except (RuntimeError, ValueError) as e:
            errors.append(str(e).splitlines()[0])
            continue
        sse = float(((f(C, *p) - R) ** 2).sum())
        if sse < best_sse:
            best, best_sse = p, sse
    if best is None:
        fit.problem = f"did not converge: {errors[0] if errors else 'no start converged'}"
        return fit
    A, logc, B = (float(v) for v in best)
    at = [
        name
        for name, v, a, b in (("A", A, 0, 1), ("C_mid", logc, lo, hi), ("B", B, *B_BOUNDS))
        if _at(v, a, b)
    ]
    if abs(A - R0) < 0.01:
        fit.problem = f"did not converge: no gain over R0 (A - R0 = {A - R0:+.3f}), C_mid and B undetermined"
    elif 10.0**logc < C.min():
        fit.problem = "did not converge: C_mid before the first evaluation (the rise is not resolved)"
    elif (at and at != ["A"]) or (at and 10.0**logc > C.max()):
        # A at 0 or 1 is a value the data may support, unless half the gain still lies past the data
        fit.problem = (
            f"did not converge: {' and '.join(at)} ended on its bound (the data do not determine it)"
        )
    else:
        fit.A, fit.C_mid, fit.B = A, 10.0**logc, B
        fit.rmse = math.sqrt(best_sse / len(C))
    return fit


def _at(v: float, lo: float, hi: float) -> bool:
    return min(abs(v - lo), abs(v - hi)) <= 1e-6 * max(1.0, abs(hi - lo))


@dataclass
class Extrapolation:
    """The first half's fit on the second half: split at ``C_half = C_max / 2``; ``error`` the mean and
    ``max_error`` the largest ``|predicted - observed|`` over the points above it (None with
    ``problem``)."""

    C_half: float
    error: float | None = None
    max_error: float | None = None
    points: int = 0
    problem: str | None = None
    tolerance: float = TOLERANCE

    @property
    def ok(self) -> bool:
        return self.problem is None and self.error is not None and self.error <= self.tolerance

    def verdict(self) -> str:
        if self.problem is not None:
            return self.problem
        return "extrapolates" if self.ok else f"does not extrapolate (error > {self.tolerance:g})"


def extrapolation(C: Any, R: Any, R0: float, tolerance: float = TOLERANCE) -> Extrapolation:
    """Fit on ``C <= max(C) / 2``, predict ``C > max(C) / 2`` (see the module docstring)."""
    C, R = np.asarray(C, dtype=float), np.asarray(R, dtype=float)
    half = float(C.max()) / 2 if len(C) else 0.0
    out = Extrapolation(C_half=half, tolerance=tolerance)
    later = C > half
    out.points = int(later.sum())
    if out.points == 0:
        out.problem = "no points in the second half"
        return out
    first = fit_sigmoid(C[~later], R[~later], R0)
    if not first.ok:
        out.problem = f"the first half's fit {first.problem}"
        return out
    err = np.abs(first.predict(C[later]) - R[later])
    out.error, out.max_error = float(err.mean()), float(err.max())
    return out


def seed_points(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """``(flops_total, val_accuracy)`` of a run's evaluated rows, in order of compute."""
    pts = sorted(
        (float(r["flops_total"]), float(r["val_accuracy"]))
        for r in rows
        if r.get("val_accuracy") is not None and r.get("flops_total") is not None
    )
    return np.array([c for c, _ in pts]), np.array([a for _, a in pts])


def mean_curve(
    seeds: list[tuple[np.ndarray, np.ndarray]], points: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The mean over seeds of each seed's accuracy (straight lines between its evaluations) on ``points``
    even steps of ``[0, C_end]``, ``C_end`` the least final compute of the seeds (default: as many points
    as the seed with the most evaluations)."""
    end = min(float(c.max()) for c, _ in seeds)
    n = points or max(len(c) for c, _ in seeds)
    grid = np.linspace(0.0, end, max(n, 2))
    return grid, np.mean([np.interp(grid, c, a) for c, a in seeds], axis=0)


@dataclass
class MethodFit:
    """A method's fit to its mean curve, the bootstrap intervals over seeds (``[lo, hi]`` or None), how
    many resamples converged, and the extrapolation check."""

    name: str
    seeds: int
    fit: Fit
    extrapolation: Extrapolation
    grid: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    A_ci: list[float] | None = None
    C_mid_ci: list[float] | None = None
    B_ci: list[float] | None = None
    converged: int = 0
    reps: int = 0


def fit_method(
    name: str,
    seeds: list[tuple[np.ndarray, np.ndarray]],
    reps: int = 200,
    seed: int = 0,
    tolerance: float = TOLERANCE,
) -> MethodFit:
    """:func:`fit_sigmoid` and :func:`extrapolation` on the mean curve of ``seeds`` (``(C, R)`` each, ``C``
    starting at 0), and a bootstrap over seeds for the intervals (none with one seed)."""
    grid, mean = mean_curve(seeds)
    R0 = float(mean[0])  # the grid starts at C = 0
    out = MethodFit(
        name,
        len(seeds),
        fit_sigmoid(grid, mean, R0),
        extrapolation(grid, mean, R0, tolerance),
        list(grid),
        list(mean),
    )
    if len(seeds) < 2 or not out.fit.ok:
        return out
    rng = np.random.default_rng(seed)
    got = []
    for _ in range(reps):
        pick = [seeds[i] for i in rng.integers(0, len(seeds), len(seeds))]
        g, m = mean_curve(pick, len(grid))
        f = fit_sigmoid(g, m, float(m[0]), start=out.fit)
        if f.ok:
            got.append((f.A, math.log10(f.C_mid), f.B))  # type: ignore[arg-type]
    out.reps, out.converged = reps, len(got)
    if got:
        q = np.percentile(np.array(got), [2.5, 97.5], axis=0)
        out.A_ci, out.B_ci = [float(q[0, 0]), float(q[1, 0])], [float(q[0, 2]), float(q[1, 2])]
        out.C_mid_ci = [float(10 ** q[0, 1]), float(10 ** q[1, 1])]
    return out


# ------------------------------------------------------------------------------------- the report's part


def _g(v: float | None, ci: list[float] | None = None, fmt: str = ".3f") -> str:
    if v is None:
        return "n/a"
    s = format(v, fmt)
    return s + (f" [{format(ci[0], fmt)}, {format(ci[1], fmt)}]" if ci else "")


def table(fits: list[MethodFit]) -> list[str]:
    """The fits as a markdown table (see :func:`scaling_section`)."""
    lines = [
        "| method | seeds | R0 | A, ceiling [95% CI] | C_mid, FLOPs [95% CI] | B [95% CI] | extrapolation error "
        "(fit on C <= C_max/2, mean abs on the rest) | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in fits:
        f, x = m.fit, m.extrapolation
        err = "n/a" if x.error is None else f"{x.error:.3f} (max {x.max_error:.3f}, {x.points} pts)"
        note = f.problem or x.verdict()
        if f.ok and m.reps:
            note += f"; {m.converged}/{m.reps} resamples converged"
        lines.append(
            f"| {m.name} | {m.seeds} | {f.R0:.3f} | {_g(f.A, m.A_ci)} | {_g(f.C_mid, m.C_mid_ci, '.3g')} | "
            f"{_g(f.B, m.B_ci, '.2f')} | {err} | {note} |"
        )
    return lines


def method_colour(i: int, n: int) -> Any:
    """Method ``i``'s colour of ``n``: matplotlib's ten-colour cycle (``C0``..``C9``), or tab20's colours when
    there are more than ten methods, so no two methods of a figure share one."""
    if n <= 10:
        return f"C{i}"
    from matplotlib import colormaps

    return colormaps["tab20"](i % 20)


def plot(fits: list[MethodFit], path: Path, title: str) -> None:
    """Accuracy against FLOPs (log scale): each method's mean curve (points) and its fitted sigmoid (line),
    the first half's fit extended over the second (dotted). Saved at 200 dpi."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.subplots()
    for i, m in enumerate(fits):
        colour = method_colour(i, len(fits))
        g, y = np.array(m.grid), np.array(m.mean)
        ax.plot(g[g > 0], y[g > 0], "o", ms=3, color=colour, label=f"{m.name} (n={m.seeds})")
        if g.max() <= 0:
            continue
        c = np.geomspace(g[g > 0].min(), g.max(), 200)
        if m.fit.ok:
            ax.plot(c, m.fit.predict(c), "-", lw=1.5, color=colour)
        first = fit_sigmoid(g[g <= m.extrapolation.C_half], y[g <= m.extrapolation.C_half], m.fit.R0)
        if first.ok:
            ax.plot(c, first.predict(c), ":", lw=1.0, color=colour)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (flops_total)", fontsize=8)
    ax.set_ylabel("validation accuracy", fontsize=8)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=200)


def scaling_section(
    methods: dict[str, list[list[dict[str, Any]]]],
    path: Path,
    title: str = "accuracy vs FLOPs",
    reps: int = 200,
) -> tuple[list[str], list[dict[str, Any]]]:
    """The compute-scaling part of a report: ``methods`` maps a name to its seeds' metrics rows; fits each
    (:func:`fit_method`), saves the figure to ``path`` and returns markdown lines and the fits as dicts.
    Runs whose rows have no ``flops_total`` are left out, and said so."""
    fits, left_out = [], []
    for name, runs in methods.items():
        seeds = [seed_points(rows) for rows in runs]
        seeds = [(c, a) for c, a in seeds if len(c) >= 2]
        if len(seeds) < len(runs):
            left_out.append(f"{name} ({len(runs) - len(seeds)} of {len(runs)} runs)")
        if seeds:
            fits.append(fit_method(name, seeds, reps))
    lines = ["", "### Accuracy against compute (ScaleRL sigmoid)", ""]
    if left_out:
        lines.append("Left out, no FLOPs logged with two evaluations or more: " + ", ".join(left_out) + ".")
    if not fits:
        return lines + ["No run logged FLOPs (flops_total): nothing to fit."], []
    lines += [
        "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) fitted to the mean over seeds of validation accuracy against "
        "training FLOPs; A is the ceiling, C_mid and B the efficiency; intervals: bootstrap over seeds. "
        "Extrapolation: the fit on the first half of the compute, scored on the second.",
        "",
        *table(fits),
        "",
        f"![accuracy against FLOPs]({path.name})",
    ]
    plot(fits, path, title)
    return lines, [_as_dict(m) for m in fits]


def _as_dict(m: MethodFit) -> dict[str, Any]:
    d = asdict(m)
    d["extrapolation"]["verdict"] = m.extrapolation.verdict()
    return d
