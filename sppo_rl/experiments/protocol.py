"""The comparison protocol: how two methods' evaluation curves are compared so that the answer does not
depend on how often each was evaluated, which one set the target, or how lucky its seeds were.

A run's curve is its raw (unsmoothed) evaluations ``(x_i, y_i)``, ``x`` the training seconds (or
generated tokens) at evaluation ``i``, read as the piecewise-linear function ``y(x)`` through them
(no extrapolation). Every statistic below reads that function on a window common to all runs, so a
method evaluated every 33 s and one evaluated every 6 s are read at the same seconds. A control run
(``sppo-rl report``) is read the same way with its per-update ``success_rate`` as the evaluations, on
the axes ``("seconds", "episodes")`` instead of ``("seconds", "tokens")`` (:func:`statistic_names`).

- **Window** ``[lo, hi]`` on an axis: ``lo`` = the latest first evaluation, ``hi`` = the earliest last
  evaluation over all runs of the comparison (:func:`window`); :func:`on_grid` puts every curve on
  ``points`` equally spaced x in it.
- **Tail** (:func:`~sppo_rl.runtime.curves.tail_value`, the one definition used by ``sppo-rl sweep``, ``sppo-rl report``,
  ``scripts/compare_llm.py`` and a control run's own ``summary.json``): the mean of a run's last ``k = max(1, ceil(TAIL_FRAC * n))`` of its ``n``
  logged values, in log order (control: the per-update ``success_rate``; LLM: the validation
  evaluations, the start one counted in ``n``). With ``TAIL_FRAC = 0.1``: the last 2 of 20, the last 1
  of 10.
- **Target** (:func:`target_of`), one value for every method, fixed by a rule that no method's own
  maximum can move: ``target = s0 + gain * (median(finals) - s0)``, ``s0`` the mean start evaluation
  over all runs (one warm start), ``finals`` every run's final, pooled over methods and seeds,
  ``gain = TARGET_GAIN = 0.5`` (half of the typical improvement); or a value given before the runs.
- Per run (:func:`run_statistics`): ``acc_at_seconds = y(hi_s)`` and ``acc_at_tokens = y(hi_tok)``, the
  accuracy at equal wall-clock and at equal generated tokens; ``auc_seconds = (1 / (hi - lo)) *
  integral_lo^hi y(t) dt``, the normalised area under accuracy against time (the mean accuracy over the
  window); ``seconds_to_target = lo + |{t in [lo, hi]: y(t) < target}|``, the time spent below the target
  (for a rising curve that crosses once it is the interpolated crossing time; a noisy curve's
  excursions above the target before its crossing and below it after cancel, where the first crossing
  would reward the method evaluated more often with more chances to cross early; a run that never
  reaches the target counts the whole window, a lower bound); ``tokens_to_target`` the same on tokens;
  and :func:`crossing`, the first crossing interpolated between raw evaluations, reported beside it.
- Between two methods A and B (:func:`compare_pair`), over the seeds both have, each statistic by the
  decision rule of :mod:`sppo_rl.experiments.decision`: a paired t-test on the per-seed differences
  (accuracies) or log-ratios (AUC, time and tokens to target), its 95 % interval, the minimum detectable
  effect and the TOST equivalence test against the declared margin. The A/A null interval
  (:func:`aa_null`: the same statistic between two halves of ONE method's seeds, over every split) is
  kept beside it for reference; the verdict no longer reads it.
- **Primary and secondary** (:func:`protocol`): one statistic, named before the runs
  (:class:`~sppo_rl.experiments.decision.Design`; default the accuracy at equal compute at the window's
  end: FLOPs where the runs log ``flops_total``, else generated tokens with a note; control runs: env
  steps), is primary; Holm's correction runs over the primary rows of all pairs as one family and over
  every other row as a second, exploratory family. The time below the target stays secondary: it is
  biased by evaluation density on fast-rising curves and degenerate when the target sits within noise of
  the start (``scripts/decision_sim.py`` measures the first).
- **Verdict**: ``difference (Holm p = ...)``, ``equivalent within +-margin (TOST p = ...)``, or
  ``inconclusive: could not detect differences below MDE``; collapse counts per method (a run ending at 0 or below
  its start) with Fisher's exact test per pair.

Pure NumPy; ``tests/test_protocol.py`` checks each function on hand-made numbers and the whole protocol
on simulated A/A runs (identical learning curves at 6.6 s and 1.2 s per update); the decision rule's
error rates are in ``tests/test_decision.py``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sppo_rl.experiments import decision
from sppo_rl.experiments.decision import Design
from sppo_rl.runtime.curves import tail_value

TARGET_GAIN = 0.5  # the target: half of the median improvement from the warm start
CONFIDENCE = 0.95
BOOTSTRAP_REPS = 4000
MAX_SPLITS = 2000  # A/A splits enumerated per method; beyond this a seeded sample of them

AXES = ("seconds", "tokens")  # the LLM world's; the control world reads ("seconds", "episodes")


def statistic_names(axes: tuple[str, ...] = AXES) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The compared statistics on ``axes``: the differences ``acc_at_<axis>`` (compared as ``mean_k (a_k -
    b_k)``) and the ratios ``auc_seconds``, ``<axis>_to_target`` (compared as ``mean_k a_k / mean_k b_k``)."""
    return tuple(f"acc_at_{a}" for a in axes), ("auc_seconds", *(f"{a}_to_target" for a in axes))


DIFFERENCES, RATIOS = statistic_names(AXES)


@dataclass(frozen=True)
class Curve:
    """One run's raw evaluations: ``accuracy[i]`` at ``seconds[i]`` training seconds, ``tokens[i]``
    generated tokens (control: env steps), ``updates[i]`` updates, for a control run ``episodes[i]``
    episodes, and for an LLM run that logs them ``flops[i]`` FLOPs spent so far (all increasing in i)."""

    seconds: np.ndarray
    tokens: np.ndarray
    updates: np.ndarray
    accuracy: np.ndarray
    episodes: np.ndarray | None = None
    flops: np.ndarray | None = None

    @staticmethod
    def of_rows(rows: list[dict], key: str = "val_accuracy") -> Curve:
        """The rows of a ``metrics.jsonl`` that carry ``key`` (``update``, ``wall_time_s``,
        ``generated_tokens``, and ``flops_total`` where every one of them has it)."""
        ev = [r for r in rows if r.get(key) is not None]
        col = lambda k: np.array([float(r[k]) for r in ev], dtype=float)  # noqa: E731
        flops = col("flops_total") if ev and all(r.get("flops_total") is not None for r in ev) else None
        return Curve(col("wall_time_s"), col("generated_tokens"), col("update"), col(key), flops=flops)

    @staticmethod
    def of_control_rows(rows: list[dict]) -> Curve:
        """The rows of a control run's ``metrics.jsonl`` that carry ``success_rate`` (``update``,
        ``episodes``, ``env_steps``, ``wall_time_s``): one raw evaluation per update."""
        ev = [r for r in rows if r.get("success_rate") is not None]
        col = lambda k: np.array([float(r.get(k, math.nan)) for r in ev], dtype=float)  # noqa: E731
        return Curve(
            col("wall_time_s"), col("env_steps"), col("update"), col("success_rate"), col("episodes")
        )

    def axis(self, name: str) -> np.ndarray:
        """The x values on axis ``name``: ``seconds``, ``tokens``, ``updates``; ``episodes`` and
        ``env_steps`` (the ``tokens`` column) of a control run; ``flops`` of a run that logs them."""
        axes = {"seconds": self.seconds, "tokens": self.tokens, "updates": self.updates}
        if self.episodes is not None:
            axes |= {"episodes": self.episodes, "env_steps": self.tokens}
        if self.flops is not None:
            axes["flops"] = self.flops
        if name not in axes:
            raise KeyError(f"axis {name!r} not logged by this run (it has {', '.join(axes)})")
        return axes[name]


def llm_axes(curves) -> tuple[str, ...]:
    """The axes of an LLM comparison: :data:`AXES` and, where every run logs ``flops_total``, ``flops``."""
    return (*AXES, "flops") if all(c.flops is not None for c in curves) else AXES


def value_at(x, y, at: float) -> float:
    """``y(at)`` of the piecewise-linear curve through ``(x_i, y_i)``; NaN outside ``[x_0, x_last]``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) == 0 or at < x[0] - 1e-12 or at > x[-1] + 1e-12:
        return math.nan
    return float(np.interp(at, x, y))


def _clip(x, y, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The curve's vertices inside ``[lo, hi]`` with ``y(lo)`` and ``y(hi)`` added at the ends."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    inner = (x > lo) & (x < hi)
    xs = np.concatenate([[lo], x[inner], [hi]])
    return xs, np.interp(xs, x, y)


def window(curves: list[Curve], axis: str) -> tuple[float, float]:
    """``(max_r x_r[0], min_r x_r[-1])`` over the runs ``r``: the part of the axis every run covers."""
    return max(float(c.axis(axis)[0]) for c in curves), min(float(c.axis(axis)[-1]) for c in curves)


def on_grid(curves: list[Curve], axis: str, points: int = 101) -> tuple[np.ndarray, np.ndarray]:
    """The grid ``lo + (hi - lo) * j / (points - 1)``, ``j = 0..points-1``, over :func:`window`, and every
    curve's accuracy on it, ``[runs, points]`` (linear interpolation between raw evaluations)."""
    lo, hi = window(curves, axis)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    return grid, np.array([np.interp(grid, c.axis(axis), c.accuracy) for c in curves]).reshape(
        len(curves), len(grid)
    )


def area(x, y, lo: float, hi: float) -> float:
    """Normalised area ``(1 / (hi - lo)) * integral_lo^hi y(t) dt`` of the piecewise-linear curve (exact:
    the trapezoid rule on its vertices); ``y(lo)`` if ``hi == lo``; NaN if the curve does not cover
    ``[lo, hi]``."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0 or lo < x[0] - 1e-12 or hi > x[-1] + 1e-12 or hi < lo:
        return math.nan
    if hi == lo:
        return value_at(x, y, lo)
    xs, ys = _clip(x, y, lo, hi)
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2) / (hi - lo))


def crossing(x, y, level: float) -> float | None:
    """The first x where the piecewise-linear curve reaches ``level``: ``x_0`` if ``y_0 >= level``, else
    ``x_{j-1} + (level - y_{j-1}) / (y_j - y_{j-1}) * (x_j - x_{j-1})`` for the first ``y_j >= level``;
    None if no evaluation reaches it."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hit = np.flatnonzero(y >= level)
    if not len(hit):
        return None
    j = int(hit[0])
    if j == 0:
        return float(x[0])
    return float(x[j - 1] + (level - y[j - 1]) / (y[j] - y[j - 1]) * (x[j] - x[j - 1]))


def time_below(x, y, level: float, lo: float, hi: float) -> float:
    """``|{t in [lo, hi]: y(t) < level}|`` for the piecewise-linear curve (exact: on each segment the part
    below ``level`` ends or starts where the segment crosses it); NaN if the curve does not cover
    ``[lo, hi]``."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0 or lo < x[0] - 1e-12 or hi > x[-1] + 1e-12 or hi < lo:
        return math.nan
    xs, ys = _clip(x, y, lo, hi)
    total = 0.0
    for xa, xb, ya, yb in zip(xs[:-1], xs[1:], ys[:-1], ys[1:]):
        if ya < level and yb < level:
            total += xb - xa
        elif ya < level or yb < level:  # one end below: the crossing splits the segment
            xc = xa + (level - ya) / (yb - ya) * (xb - xa)
            total += (xc - xa) if ya < level else (xb - xc)
    return float(total)


def target_of(starts, finals, gain: float = TARGET_GAIN) -> float:
    """``s0 + gain * (median(finals) - s0)`` with ``s0 = mean(starts)``: the start evaluations and the
    :func:`tail_value` of every run of every method, pooled."""
    s0 = float(np.mean(np.asarray(starts, dtype=float)))
    return s0 + gain * (float(np.median(np.asarray(finals, dtype=float))) - s0)


def run_statistics(
    curve: Curve, windows: dict[str, tuple[float, float]], target: float, axes: tuple[str, ...] = AXES
) -> dict[str, Any]:
    """One run's statistics on the comparison's ``windows`` (``{"seconds": (lo, hi), "tokens": ...}``,
    one per axis of ``axes``), see the module docstring."""
    out: dict[str, Any] = {}
    for axis in axes:
        x, (lo, hi) = curve.axis(axis), windows[axis]
        out[f"acc_at_{axis}"] = value_at(x, curve.accuracy, hi)
        below = time_below(x, curve.accuracy, target, lo, hi)
        out[f"{axis}_to_target"] = lo + below
        out[f"{axis}_first_crossing"] = crossing(x, curve.accuracy, target)
        first = out[f"{axis}_first_crossing"]
        out[f"reached_{axis}"] = first is not None and first <= hi
    lo, hi = windows["seconds"]
    out["auc_seconds"] = area(curve.seconds, curve.accuracy, lo, hi)
    out["start"] = float(curve.accuracy[0])
    out["final"] = tail_value(curve.accuracy)
    return out


def _stat(kind: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``mean(a - b)`` (paired, same shape) for ``difference``; ``mean(a) / mean(b)`` for ``ratio``
    (NaN where ``mean(b)`` is 0); along the last axis."""
    if kind == "difference":
        return (a - b).mean(axis=-1)
    den = b.mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, a.mean(axis=-1) / np.where(den != 0, den, 1.0), np.nan)


def paired_bootstrap(
    a, b, kind: str, reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float, float]:
    """Point estimate of :func:`_stat` over seed pairs ``(a_k, b_k)`` and its percentile interval: ``reps``
    resamples each draw ``n`` seed indices ``k*_1..n`` uniformly with replacement, the same for ``a`` and
    ``b``; the interval is the ``(1 -+ confidence) / 2`` quantiles of the resampled statistic (numpy's
    linear quantile, NaN resamples dropped). The generator is ``numpy.random.default_rng(seed)``, made
    afresh per call. NaN interval under two pairs. The old protocol's interval (it covers ~80 % at 5
    seeds, docs/results.md); the decision rule uses the paired t-interval instead."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    point = float(_stat(kind, a, b)) if len(a) else math.nan
    if len(a) < 2:
        return point, math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, len(a), size=(reps, len(a)))
    boot = _stat(kind, a[idx], b[idx])
    boot = boot[~np.isnan(boot)]
    if not len(boot):
        return point, math.nan, math.nan
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return point, float(lo), float(hi)


def splits(n: int, seed: int = 0) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every split of ``n`` seeds into two disjoint halves of ``floor(n/2)`` and ``n - floor(n/2)``, in both
    orders (``(S1, S2)`` and ``(S2, S1)``; for even n each unordered split twice); more than
    :data:`MAX_SPLITS` combinations: a sample of them drawn with ``default_rng(seed)``."""
    if n < 2:
        return []
    half = n // 2
    combos = list(itertools.combinations(range(n), half)) if math.comb(n, half) <= MAX_SPLITS else None
    if combos is None:
        rng = np.random.default_rng(seed)
        combos = [tuple(sorted(rng.choice(n, half, replace=False))) for _ in range(MAX_SPLITS)]
    out = []
    for s1 in combos:
        s2 = tuple(k for k in range(n) if k not in s1)
        out += [(tuple(s1), s2), (s2, tuple(s1))]
    return out


def aa_null(per_method, kind: str, confidence: float = CONFIDENCE) -> tuple[float, float, int]:
    """The A/A null interval of :func:`_stat`: for each method's seed values ``v`` (one array per
    method), the statistic between its two halves ``v[S1]`` and ``v[S2]`` for every split of
    :func:`splits` (unpaired: the halves hold different seeds, so a difference is ``mean(v[S1]) -
    mean(v[S2])``); the ``(1 -+ confidence) / 2`` quantiles of all of them pooled over the methods, and
    how many there were. NaN when no method has two seeds."""
    values = []
    for v in per_method:
        v = np.asarray(v, dtype=float)
        for s1, s2 in splits(len(v)):
            a, b = v[list(s1)], v[list(s2)]
            values.append(float(a.mean() - b.mean()) if kind == "difference" else float(_stat("ratio", a, b)))
    values = [x for x in values if not math.isnan(x)]
    if not values:
        return math.nan, math.nan, 0
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi), len(values)


def compare_pair(
    stats_a: dict[int, dict],
    stats_b: dict[int, dict],
    design: Design | None = None,
    axes: tuple[str, ...] = AXES,
) -> dict[str, dict]:
    """Every statistic of :func:`statistic_names` on ``axes`` between methods A and B from their
    per-seed :func:`run_statistics`: over the seeds both have, the paired test of
    :func:`sppo_rl.experiments.decision.compare` (``point`` its estimate: the mean difference, or the
    geometric mean of the per-seed ratios) and, for reference, the A/A null interval (from all of A's
    seeds and all of B's). The verdicts come from :func:`protocol`, which corrects each table at once."""
    design = design or Design()
    common = sorted(set(stats_a) & set(stats_b))
    differences, ratios = statistic_names(axes)
    out = {}
    for name in (*differences, *ratios):
        kind = "difference" if name in differences else "ratio"
        a = np.array([stats_a[k][name] for k in common], dtype=float)
        b = np.array([stats_b[k][name] for k in common], dtype=float)
        own = [[s[k][name] for k in sorted(s)] for s in (stats_a, stats_b)]
        null_lo, null_hi, n_null = aa_null(own, kind, CONFIDENCE)
        per_seed = (a - b) if kind == "difference" else np.where(b != 0, a / np.where(b != 0, b, 1), np.nan)
        margin = design.margin if kind == "difference" else design.ratio_margin
        test = decision.compare(a, b, kind, margin, design.alpha)
        out[name] = {
            **test,
            "seeds": common,
            "per_seed": [float(v) for v in per_seed],
            "point": test["estimate"],
            "null": [null_lo, null_hi],
            "null_splits": n_null,
        }
    return out


def collapses(per_run: dict[str, dict[int, dict]], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Per method the runs that collapsed (:func:`sppo_rl.experiments.decision.collapsed`: ending at 0 or
    below their own start, from :func:`run_statistics`' ``start`` and ``final``) and, per pair, Fisher's
    exact test of the two counts."""
    counts = {
        name: {"n": sum(decision.collapsed(r["start"], r["final"]) for r in seeds.values()), "of": len(seeds)}
        for name, seeds in per_run.items()
    }
    tests = {
        f"{a}_vs_{b}": decision.fisher_exact(counts[a]["n"], counts[a]["of"], counts[b]["n"], counts[b]["of"])
        for a, b in pairs
        if a in counts and b in counts
    }
    return {"counts": counts, "fisher_p": tests}


def protocol(
    curves: dict[str, dict[int, Curve]],
    pairs: list[tuple[str, str]],
    target: float | None = None,
    gain: float = TARGET_GAIN,
    design: Design | None = None,
    axes: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The whole protocol on every method's per-seed curves, read on ``axes`` (None: :func:`llm_axes`;
    ``("seconds", "episodes", "env_steps")`` for control runs): the windows, the target (given, or
    :func:`target_of` over all runs), every run's :func:`run_statistics`, for each ``(A, B)`` of ``pairs``
    :func:`compare_pair`, and the decision (:mod:`sppo_rl.experiments.decision`): the primary statistic
    of ``design`` (its default: :func:`~sppo_rl.experiments.decision.default_primary`; a declared one the
    runs cannot give falls back to it, with a note), one row per pair and statistic in ``table`` (role
    ``primary`` or ``secondary``), Holm's correction over the primary rows as one family and over the
    secondary rows as another, each row's verdict (also in ``pairs``), and the collapse counts."""
    empty = [
        f"{name} seed {k}" for name, seeds in curves.items() for k, c in seeds.items() if not len(c.accuracy)
    ]
    if empty:
        raise ValueError(f"no evaluation in {', '.join(empty)}: nothing to compare")
    design = design or Design()
    runs = [c for seeds in curves.values() for c in seeds.values()]
    axes = llm_axes(runs) if axes is None else axes
    notes = []
    if "flops" not in axes and "episodes" not in axes:
        notes.append("FLOPs: not available (these runs log no flops_total)")
    windows = {axis: window(runs, axis) for axis in axes}
    rule = "given"
    if target is None:
        target = target_of([c.accuracy[0] for c in runs], [tail_value(c.accuracy) for c in runs], gain)
        rule = f"s0 + {gain:g} * (median of pooled finals - s0)"
    per_run = {
        name: {k: run_statistics(c, windows, target, axes) for k, c in sorted(seeds.items())}
        for name, seeds in curves.items()
    }
    primary, note = decision.default_primary(axes)
    differences, ratios = statistic_names(axes)
    if design.primary is not None and design.primary in (*differences, *ratios):
        primary, note = design.primary, None
    elif design.primary is not None:
        note = f"the declared primary {design.primary} is not among these runs' statistics: {primary} instead"
    notes += [note] if note else []
    done = [(a, b) for a, b in pairs if a in per_run and b in per_run]
    compared = {
        f"{a}_vs_{b}": {"a": a, "b": b, **compare_pair(per_run[a], per_run[b], design, axes)} for a, b in done
    }
    table = []
    for role in ("primary", "secondary"):
        family = [
            {"pair": key, "a": pair["a"], "b": pair["b"], "statistic": name, "role": role, **pair[name]}
            for key, pair in compared.items()
            for name in (*differences, *ratios)
            if (name == primary) == (role == "primary")
        ]
        decision.decide(family, design.alpha)
        for row in family:
            compared[row["pair"]][row["statistic"]] |= {
                "role": role,
                "holm_p": row["holm_p"],
                "verdict": row["verdict"],
            }
        table += family
    return {
        "windows": {axis: list(w) for axis, w in windows.items()},
        "target": {"value": target, "rule": rule},
        "axes": list(axes),
        "primary": primary,
        "design": {"margin": design.margin, "ratio_margin": design.ratio_margin, "alpha": design.alpha},
        "notes": notes,
        "runs": per_run,
        "pairs": compared,
        "table": table,
        "collapse": collapses(per_run, done),
    }
