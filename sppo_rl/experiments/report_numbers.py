"""The numbers of a report: per run (its score: tail success, control, or tail validation accuracy,
LLM), per group of seeds (mean, t-interval, IQM), per world (aggregates and performance profiles), the
mean curves, the comparison protocol per task, the critic's calibration and the tail effect."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.experiments import decision, protocol, stats, tail
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report_runs import Run, label_order, read_json
from sppo_rl.runtime.curves import tail_value
from sppo_rl.runtime.trace import TRACE_FILE, load_trace

WORLDS = {"control": "tail success", "llm": "tail validation accuracy"}


PROFILE_TAUS = np.linspace(0.0, 1.0, 101)


def _col(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([r.get(key, math.nan) for r in rows], dtype=float)


def run_numbers(run: Run, cfg: ReportConfig) -> dict[str, Any]:
    """Per-run numbers of a control run (see the module docstring)."""
    y = _col(run.rows, "success_rate")
    eps = _col(run.rows, "episodes")
    last = run.rows[-1]
    final = tail_value(y, cfg.tail_frac)
    return {
        **_identity(run),
        "updates": len(run.rows),
        "episodes": last.get("episodes"),
        "tail_success": final,
        "score": final,
        # the protocol's crossing: interpolated between the raw per-update success rates, not smoothed
        "episodes_to": {str(t): protocol.crossing(eps, y, t) for t in cfg.thresholds},
        "wall_time_s": last.get("wall_time_s"),
        "sps": last.get("sps"),
    }


def _identity(run: Run) -> dict[str, Any]:
    """What names a run in the report: its folder, task, algorithm, group label, world, seed, whether it finished."""
    return {
        "path": str(run.path),
        "task": run.task,
        "algo": run.algo,
        "label": run.label,
        "world": run.world,
        "seed": run.seed,
        "finished": run.finished,
    }


def llm_run_numbers(run: Run, cfg: ReportConfig) -> dict[str, Any]:
    """Per-run numbers of an LLM run: tail validation accuracy (mean over the last ``tail_frac`` of its
    evaluations, at least one), and updates, generated tokens and training seconds of its last row."""
    y = _col(run.rows, "val_accuracy")
    final = tail_value(y, cfg.tail_frac)
    return {
        **_identity(run),
        "evaluations": len(run.rows),
        "updates": run.last.get("update"),
        "start_val_accuracy": float(y[0]),
        "tail_val_accuracy": final,
        "score": final,
        "generated_tokens": run.last.get("generated_tokens"),
        "wall_time_s": run.last.get("wall_time_s"),
    }


def curve(
    runs: list[Run], xkey: str, cfg: ReportConfig, ykey: str = "success_rate", smooth: int | None = None
):
    """Mean over runs and 95% t-interval (``half``; ``lo``/``hi`` clipped to [0, 1]; NaN where fewer than
    :data:`MIN_RUNS` runs cover the point) of the ``ykey`` curves, each smoothed by a trailing mean over ``smooth`` points (default ``--smooth``), on a common grid of
    ``xkey``."""
    smooth = cfg.smooth if smooth is None else smooth
    xs = [_col(r.rows, xkey) for r in runs]
    ys = [stats.trailing_mean(_col(r.rows, ykey), smooth) for r in runs]
    grid = np.linspace(min(x[0] for x in xs), max(x[-1] for x in xs), cfg.grid_points)
    at = np.stack([stats.interpolate(x, y, grid) for x, y in zip(xs, ys)])
    mean, half = zip(*(stats.t_interval(at[:, j]) for j in range(len(grid))))
    mean, half = np.array(mean), np.array(half)
    half[(~np.isnan(at)).sum(0) < MIN_RUNS] = np.nan  # no band from fewer runs
    return {
        "x": grid.tolist(),
        "mean": mean.tolist(),
        "half": half.tolist(),
        "lo": np.clip(mean - half, 0, 1).tolist(),
        "hi": np.clip(mean + half, 0, 1).tolist(),
        "n": (~np.isnan(at)).sum(0).tolist(),
        "runs": len(runs),
    }


MIN_RUNS = 3
"""The fewest runs an interval is computed from (t-interval, bootstrap, curve band): with one or two the
interval says nothing (two runs' bootstrap can only resample two values); fewer are reported as
``n = 2: no interval`` and drawn without a band."""


def enough_runs(n: int) -> bool:
    """Whether ``n`` runs give an interval (:data:`MIN_RUNS`)."""
    return n >= MIN_RUNS


def score_numbers(scores: list[float], cfg: ReportConfig, name: str) -> dict[str, Any]:
    """Mean, 95% t-interval clipped to [0, 1] (and whether it had to be) and IQM with its bootstrap 95%
    interval of one group's scores (``name``: the score's key prefix in the report); the intervals are
    NaN with fewer than :data:`MIN_RUNS` scores."""
    mean, half = stats.t_interval(scores)
    lo, hi, clipped = stats.clip_interval(mean, half)
    iqm, iqm_lo, iqm_hi = stats.stratified_bootstrap(
        [scores], stats.pooled(stats.iqm), cfg.bootstrap_reps, seed=cfg.bootstrap_seed
    )
    if not enough_runs(len(scores)):
        half, lo, hi, clipped, iqm_lo, iqm_hi = math.nan, math.nan, math.nan, False, math.nan, math.nan
    return {
        f"{name}_mean": mean,
        f"{name}_half": half,
        f"{name}_ci": [lo, hi],
        f"{name}_clipped": clipped,
        f"{name}_per_seed": list(scores),
        "iqm": iqm,
        "iqm_ci": [iqm_lo, iqm_hi],
    }


def _nanmean(values) -> float:
    x = np.array([math.nan if v is None else v for v in values], dtype=float)
    return float(np.nanmean(x)) if (~np.isnan(x)).any() else math.nan


def _group_identity(per_run: list[dict[str, Any]], world: str) -> dict[str, Any]:
    """What names a group of seeds in the report: task, algorithm, label, world, seeds, how many finished."""
    return {
        "task": per_run[0]["task"],
        "algo": per_run[0]["algo"],
        "label": per_run[0]["label"],
        "world": world,
        "seeds": len(per_run),
        "finished": sum(r["finished"] for r in per_run),
    }


def group_numbers(per_run: list[dict[str, Any]], cfg: ReportConfig) -> dict[str, Any]:
    reach = {}
    for t in cfg.thresholds:
        hits = [r["episodes_to"][str(t)] for r in per_run if r["episodes_to"][str(t)] is not None]
        reach[str(t)] = {
            "median": statistics.median(hits) if hits else None,
            "reached": len(hits),
            "seeds": len(per_run),
        }
    return {
        **_group_identity(per_run, "control"),
        **score_numbers([r["tail_success"] for r in per_run], cfg, "tail_success"),
        "episodes_to": reach,
        "wall_time_s": _nanmean(r["wall_time_s"] for r in per_run),
        "sps": _nanmean(r["sps"] for r in per_run),
    }


def llm_group_numbers(per_run: list[dict[str, Any]], cfg: ReportConfig) -> dict[str, Any]:
    return {
        **_group_identity(per_run, "llm"),
        "evaluations": min(r["evaluations"] for r in per_run),
        "updates": _nanmean(r["updates"] for r in per_run),
        "start_val_accuracy_mean": _nanmean(r["start_val_accuracy"] for r in per_run),
        **score_numbers([r["tail_val_accuracy"] for r in per_run], cfg, "tail_val_accuracy"),
        "generated_tokens": _nanmean(r["generated_tokens"] for r in per_run),
        "wall_time_s": _nanmean(r["wall_time_s"] for r in per_run),
    }


def aggregates(per_run: list[dict[str, Any]], labels: list[str], cfg: ReportConfig) -> dict[str, Any]:
    """Per label, over all its runs on all tasks of one world: IQM, mean, median and optimality gap of the
    scores, each with its stratified-bootstrap 95% interval (runs resampled within each task), and the
    performance profile ``P(score > tau)`` on :data:`PROFILE_TAUS` with pointwise bootstrap bands."""
    table, profiles = [], []
    for label in labels:
        mine = [r for r in per_run if r["label"] == label]
        if not mine:
            continue
        tasks = sorted({r["task"] for r in mine})
        strata = [[r["score"] for r in mine if r["task"] == t] for t in tasks]
        entry = {"label": label, "algo": mine[0]["algo"], "tasks": tasks, "runs": len(mine)}
        for name, fn in stats.AGGREGATES.items():
            value, lo, hi = stats.stratified_bootstrap(
                strata, stats.pooled(fn), cfg.bootstrap_reps, seed=cfg.bootstrap_seed
            )
            entry[name] = {"value": value, "ci": [lo, hi] if enough_runs(len(mine)) else [math.nan, math.nan]}
        table.append(entry)
        p, lo, hi = stats.stratified_bootstrap(
            strata,
            lambda s: stats.performance_profile(s, PROFILE_TAUS),
            cfg.bootstrap_reps,
            seed=cfg.bootstrap_seed,
        )
        if not enough_runs(len(mine)):
            lo = hi = np.full(len(PROFILE_TAUS), np.nan)
        profiles.append(
            {
                "label": label,
                "tau": PROFILE_TAUS.tolist(),
                "fraction": np.asarray(p).tolist(),
                "lo": np.asarray(lo).tolist(),
                "hi": np.asarray(hi).tolist(),
                "runs": len(mine),
            }
        )
    return {"table": table, "profiles": profiles}


# what a control comparison reads: env steps (its compute axis, the primary's), episodes, seconds; LLM:
# protocol.llm_axes (seconds, generated tokens, and FLOPs where the runs log them)
CONTROL_AXES = ("seconds", "episodes", "env_steps")


def _protocol_curve(run: Run) -> protocol.Curve:
    """The run's raw curve for the protocol; a missing axis value is NaN (the task is then skipped)."""
    if run.world == "control":
        return protocol.Curve.of_control_rows(run.rows)
    cols = [_col(run.rows, k) for k in ("wall_time_s", "generated_tokens", "update", "val_accuracy")]
    evals = [r for r in run.rows if r.get("val_accuracy") is not None]
    logged = evals and all(r.get("flops_total") is not None for r in evals)
    return protocol.Curve(*cols, flops=_col(run.rows, "flops_total") if logged else None)


def comparisons(runs: list[Run], world: str, cfg: ReportConfig) -> list[dict[str, Any]]:
    """Per task of ``world`` with two labels or more, the comparison protocol
    (:func:`sppo_rl.experiments.protocol.protocol`) over the labels' per-seed raw curves (control:
    ``success_rate`` per update against training seconds and episodes; LLM: ``val_accuracy`` against
    training seconds and generated tokens), the target by the protocol's pooled rule, every pair ``(A,
    B)`` of labels with A before B in :func:`~sppo_rl.experiments.report_runs.label_order`, ``--bootstrap-reps`` paired resamples seeded
    with ``--bootstrap-seed``; seeds pair by their number (a second run of a label with the same seed is
    left out). A run whose axes are not finite and increasing leaves its task out, named in
    ``skipped``."""
    axes = CONTROL_AXES if world == "control" else None
    design = declared_design(cfg)
    order = label_order(runs)
    out = []
    for task in sorted({r.task for r in runs}):
        labels = [lb for lb in order if any((r.task, r.label) == (task, lb) for r in runs)]
        if len(labels) < 2:
            continue
        curves: dict[str, dict[int, protocol.Curve]] = {}
        bad = []
        for lb in labels:
            curves[lb] = {}
            for r in sorted((r for r in runs if (r.task, r.label) == (task, lb)), key=lambda r: r.seed):
                c = _protocol_curve(r)
                xs = [c.axis(a) for a in axes or protocol.AXES]
                if not all(np.isfinite(x).all() and (np.diff(x) >= 0).all() for x in xs):
                    bad.append(str(r.path))
                curves[lb].setdefault(r.seed, c)
        entry = {"world": world, "task": task, "axes": list(axes or protocol.AXES), "labels": labels}
        if bad:
            out.append(
                {
                    **entry,
                    "skipped": f"axes {', '.join(axes or protocol.AXES)} not finite and increasing in "
                    + ", ".join(bad),
                }
            )
            continue
        pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]]
        result = protocol.protocol(curves, pairs, design=design, axes=axes)
        out.append({**entry, **result})
    return out


def declared_design(cfg: ReportConfig) -> decision.Design:
    """The comparison's design, declared before its runs: ``--primary`` / ``--margin``, else what the
    first input's ``sweep.json`` declared (``sppo-rl sweep --primary --margin``), else the defaults."""
    primary, margin = cfg.primary, cfg.margin
    manifest = Path(cfg.inputs[0]) / "sweep.json"
    declared = (read_json(manifest) or {}).get("config", {}) if manifest.is_file() else {}
    primary = primary if primary is not None else declared.get("primary")
    margin = margin if margin is not None else declared.get("margin")
    return decision.Design(primary=primary, margin=decision.MARGIN if margin is None else float(margin))


def calibration_numbers(runs: list[Run], bins: int) -> dict[str, Any]:
    """Pooled calibration statistics of the runs' ``calibration.json`` (see :mod:`stats`)."""
    p = np.concatenate([r.calibration["predicted"] for r in runs])
    y = np.concatenate([r.calibration["empirical"] for r in runs])
    m = np.concatenate([r.calibration.get("samples") or [1] * len(r.calibration["predicted"]) for r in runs])
    return {
        "task": runs[0].task,
        "algo": runs[0].algo,
        "label": runs[0].label,
        "runs": len(runs),
        "start_states": len(p),
        "episodes": int(m.sum()),
        "pearson": stats.pearson(p, y),
        "spearman": stats.spearman(p, y),
        "ece": stats.ece(p, y, m, bins),
        "brier": stats.brier(p, y, m),
        "mse": stats.mse(p, y, m),
        "bins": stats.reliability_bins(p, y, m, bins),
        "points": {"predicted": p.tolist(), "empirical": y.tolist()},
    }


def tail_effect(runs: list[Run]) -> tuple[list[dict[str, Any]], list[str]]:
    """The tail-effect diagnostic of every run that left a ``critic_trace.npz``, computed per run and
    summarised over the seeds of a (task, label) (see :mod:`sppo_rl.experiments.tail`; its ``algo`` is the
    label); also the traces that could not be read, with why."""
    traced, skipped = [], []
    for r in runs:
        path = r.path / TRACE_FILE
        if not path.is_file():
            continue
        try:
            traced.append((r.task, r.label, {"seed": r.seed, "path": str(r.path)}, load_trace(path)))
        except ValueError as e:
            skipped.append(str(e))
    return tail.diagnose(traced), skipped
