"""``sppo-rl report``: curves, a table and SPPO's calibration from control run folders.

A run is any folder holding ``metrics.jsonl`` and ``config.json`` (found recursively); finished or not,
its rows so far are used. Runs are grouped by (task, algorithm); the seeds of a group are its samples.

- Curves: each run's ``success_rate`` is smoothed by a trailing mean over ``--smooth`` updates, then
  interpolated linearly onto a common grid of ``--grid-points`` x values (episodes, or wall-clock seconds);
  at each x the mean over the runs that reach that x is drawn with a 95% Student-t interval over them
  (where at least two do).
- Table: final success (mean of the raw ``success_rate`` over the last ``--final-frac`` of a run's updates;
  mean +- 95% t half-width over seeds), episodes to reach each threshold (first episode count where the
  smoothed curve is >= it; median over the seeds that reach it, with how many did), training wall time
  (``wall_time_s`` of the last row) and steps per second (``sps`` of the last row), both means over seeds.
- Calibration: sppo runs' ``calibration.json`` (predicted ``sigmoid V(s_0)`` against the empirical success
  of ``samples`` episodes per start state), pooled over the seeds of a group: Pearson, Spearman, ECE
  (``--calibration-bins`` equal-width bins, weighted by episodes), Brier score against the episode outcomes.
- Tail effect: every run folder with a ``critic_trace.npz`` (control or LLM runs, grouped by the task and
  algorithm of their ``config.json``): critic values against the relative position t/(T-1) for successful and
  failed sequences, their gap, and the sequence critic's V(s_0) by outcome (see :mod:`tail`). A folder of
  LLM runs only (no ``success_rate`` rows) gets this section alone.

Outputs in ``--out``: ``success_vs_episodes.png``, ``success_vs_wall_time.png``, ``calibration.png``,
``tail_effect.png``, ``report.md`` (also printed) and ``report.json`` (every number).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.experiments import stats, tail
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.sweep import BOOKKEEPING
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import RunError

# one colour per algorithm, the same in every figure; other names get EXTRA colours in sorted order
PALETTE = {
    "ppo": "#1f77b4",
    "sppo": "#d62728",
    "grpo": "#2ca02c",
    "drgrpo": "#bcbd22",
    "rloo": "#9467bd",
    "remax": "#8c564b",
    "reinforce": "#e377c2",
    "ppo-bce": "#ff7f0e",
    "bppo": "#17becf",
    "lampo": "#7f7f7f",
}
EXTRA = ["#393b79", "#637939", "#8c6d31", "#843c39"]
X_AXES = {"episodes": "episodes", "wall_time_s": "wall-clock seconds (training)"}


@dataclass
class Run:
    path: Path
    task: str
    algo: str
    seed: int
    finished: bool
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    calibration: dict[str, list[float]] | None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def find_runs(inputs: tuple[str, ...], skip: Path | None = None) -> list[Run]:
    """Every folder under ``inputs`` with ``metrics.jsonl`` and a readable ``config.json``."""
    seen, runs = set(), []
    for top in inputs:
        if not Path(top).is_dir():
            raise RunError(f"{top}: no such folder")
        for metrics in sorted(Path(top).resolve().rglob("metrics.jsonl")):
            folder = metrics.parent
            if folder in seen or (skip is not None and folder.is_relative_to(skip)):
                continue
            cfg = _read_json(folder / "config.json")
            if not isinstance(cfg, dict) or "algo" not in cfg:
                continue
            seen.add(folder)
            rows = [r for r in read_metrics(metrics) if r.get("success_rate") is not None]
            cal = _read_json(folder / "calibration.json")
            runs.append(
                Run(
                    path=folder,
                    task=(cfg.get("resolved") or {}).get("task", cfg.get("task", "?")),
                    algo=cfg["algo"],
                    seed=int(cfg.get("seed", 0)),
                    finished=(folder / "summary.json").is_file(),
                    config=cfg,
                    rows=rows,
                    calibration=cal if isinstance(cal, dict) and cal.get("predicted") else None,
                )
            )
    return runs


def algo_order(algos) -> list[str]:
    known = [a for a in PALETTE if a in algos]
    return known + sorted(set(algos) - set(known))


def colours(algos) -> dict[str, str]:
    others = sorted(set(algos) - set(PALETTE))
    return {**PALETTE, **{a: EXTRA[i % len(EXTRA)] for i, a in enumerate(others)}}


def _col(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([r.get(key, math.nan) for r in rows], dtype=float)


def run_numbers(run: Run, cfg: ReportConfig) -> dict[str, Any]:
    """Per-run numbers (see the module docstring)."""
    y = _col(run.rows, "success_rate")
    smooth = stats.trailing_mean(y, cfg.smooth)
    eps = _col(run.rows, "episodes")
    last = run.rows[-1]
    return {
        "path": str(run.path),
        "task": run.task,
        "algo": run.algo,
        "seed": run.seed,
        "finished": run.finished,
        "updates": len(run.rows),
        "episodes": last.get("episodes"),
        "final_success": stats.tail_mean(y, cfg.final_frac),
        "episodes_to": {str(t): stats.first_crossing(eps, smooth, t) for t in cfg.thresholds},
        "wall_time_s": last.get("wall_time_s"),
        "sps": last.get("sps"),
    }


def curve(runs: list[Run], xkey: str, cfg: ReportConfig) -> dict[str, list[float]]:
    """Mean over runs and 95% t-interval of the smoothed success, on a common grid of ``xkey``."""
    xs = [_col(r.rows, xkey) for r in runs]
    ys = [stats.trailing_mean(_col(r.rows, "success_rate"), cfg.smooth) for r in runs]
    grid = np.linspace(min(x[0] for x in xs), max(x[-1] for x in xs), cfg.grid_points)
    at = np.stack([stats.interpolate(x, y, grid) for x, y in zip(xs, ys)])
    mean, half = zip(*(stats.t_interval(at[:, j]) for j in range(len(grid))))
    return {
        "x": grid.tolist(),
        "mean": list(mean),
        "half": list(half),
        "n": (~np.isnan(at)).sum(0).tolist(),
        "runs": len(runs),
    }


def differing_settings(runs: list[Run]) -> list[str]:
    """Config keys (seeds and bookkeeping aside) whose values differ between the runs of one group; a key
    that only some runs' configs have (a setting added by a later version) is left out."""
    keys = set.intersection(*(set(r.config) for r in runs)) - BOOKKEEPING - {"seed", "extra"}
    return sorted(k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1)


def group_numbers(per_run: list[dict[str, Any]], cfg: ReportConfig) -> dict[str, Any]:
    final_mean, final_half = stats.t_interval([r["final_success"] for r in per_run])
    reach = {}
    for t in cfg.thresholds:
        hits = [r["episodes_to"][str(t)] for r in per_run if r["episodes_to"][str(t)] is not None]
        reach[str(t)] = {
            "median": statistics.median(hits) if hits else None,
            "reached": len(hits),
            "seeds": len(per_run),
        }
    return {
        "task": per_run[0]["task"],
        "algo": per_run[0]["algo"],
        "seeds": len(per_run),
        "finished": sum(r["finished"] for r in per_run),
        "final_success_mean": final_mean,
        "final_success_half": final_half,
        "final_success_per_seed": [r["final_success"] for r in per_run],
        "episodes_to": reach,
        "wall_time_s": float(
            np.nanmean([math.nan if r["wall_time_s"] is None else r["wall_time_s"] for r in per_run])
        ),
        "sps": float(np.nanmean([math.nan if r["sps"] is None else r["sps"] for r in per_run])),
    }


def calibration_numbers(runs: list[Run], bins: int) -> dict[str, Any]:
    """Pooled calibration statistics of the runs' ``calibration.json`` (see :mod:`stats`)."""
    p = np.concatenate([r.calibration["predicted"] for r in runs])
    y = np.concatenate([r.calibration["empirical"] for r in runs])
    m = np.concatenate([r.calibration.get("samples") or [1] * len(r.calibration["predicted"]) for r in runs])
    return {
        "task": runs[0].task,
        "algo": runs[0].algo,
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
    """The tail-effect diagnostic of every run that left a ``critic_trace.npz``, seeds of a (task, algo)
    pooled (see :mod:`sppo_rl.experiments.tail`); also the traces that could not be read, with why."""
    traced, skipped = [], []
    for r in runs:
        path = r.path / tail.TRACE_FILE
        if not path.is_file():
            continue
        try:
            traced.append((r.task, r.algo, tail.load_trace(path)))
        except ValueError as e:
            skipped.append(str(e))
    return tail.diagnose(traced), skipped


# ------------------------------------------------------------------------------------- figures


def _panels(n: int):
    from matplotlib.figure import Figure

    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes


def plot_curves(curves: dict, tasks: list[str], algos: list[str], xkey: str, path: Path, note: str) -> None:
    from matplotlib.ticker import MaxNLocator

    fig, axes = _panels(len(tasks))
    colour = colours(algos)
    for ax, task in zip(axes, tasks):
        for algo in algos:
            c = curves.get((task, algo), {}).get(xkey)
            if c is None:
                continue
            x, mean, half = (np.array(c[k], dtype=float) for k in ("x", "mean", "half"))
            ax.plot(x, mean, color=colour[algo], label=f"{algo} (n={c['runs']})", lw=1.6)
            ax.fill_between(x, mean - half, mean + half, color=colour[algo], alpha=0.2, lw=0)
        ax.set_title(task)
        ax.set_xlabel(X_AXES[xkey])
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(note, fontsize=9)
    fig.savefig(path, dpi=120)


def plot_reliability(cal: dict, tasks: list[str], algos: list[str], path: Path, bins: int) -> None:
    fig, axes = _panels(len(tasks))
    colour = colours(algos)
    for ax, task in zip(axes, tasks):
        ax.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1)
        for algo in algos:
            c = cal.get((task, algo))
            if c is None:
                continue
            ax.scatter(
                c["points"]["predicted"], c["points"]["empirical"], s=6, alpha=0.25, color=colour[algo]
            )
            bx = [b["pred"] for b in c["bins"]]
            by = [b["emp"] for b in c["bins"]]
            size = [20 + 200 * b["weight"] / c["episodes"] for b in c["bins"]]
            ax.plot(bx, by, color=colour[algo], lw=1.2)
            ax.scatter(bx, by, s=size, color=colour[algo], label=f"{algo} (ECE {c['ece']:.3f})", zorder=3)
        ax.set_title(task)
        ax.set_xlabel("predicted sigmoid V(s_0)")
        ax.set_ylabel("empirical success")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"dots: start states; circles: {bins} equal-width bins\n(area ~ episodes)", fontsize=9)
    fig.savefig(path, dpi=120)


# ------------------------------------------------------------------------------------- text


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(report: dict[str, Any], cfg: ReportConfig) -> str:
    ts = [str(t) for t in cfg.thresholds]
    runs = report["runs"]
    unfinished = sum(not r["finished"] for r in runs)
    lines = [
        "# Report",
        "",
        f"{len(runs)} runs ({unfinished} unfinished) from {', '.join(cfg.inputs)}.",
    ]
    if report["groups"]:
        lines += [
            "",
            "| task | algo | seeds | final success | "
            + " | ".join(f"episodes to {t}" for t in ts)
            + " | wall s | steps/s |",
            "|---|---|---:|---:|" + "---:|" * len(ts) + "---:|---:|",
        ]
    else:
        lines += ["", "No run with success_rate rows (e.g. LLM runs only): no curves and no table."]
    for g in report["groups"]:
        seeds = str(g["seeds"]) + (
            f" ({g['seeds'] - g['finished']} unfinished)" if g["finished"] < g["seeds"] else ""
        )
        final = _num(g["final_success_mean"], ".3f")
        if not math.isnan(g["final_success_half"]):
            final += f" ± {g['final_success_half']:.3f}"
        reach = [
            f"{_num(g['episodes_to'][t]['median'], '.0f')} ({g['episodes_to'][t]['reached']}/{g['seeds']})"
            for t in ts
        ]
        lines.append(
            f"| {g['task']} | {g['algo']} | {seeds} | {final} | "
            + " | ".join(reach)
            + f" | {_num(g['wall_time_s'], '.1f')} | {_num(g['sps'], '.0f')} |"
        )
    for g in report["groups"]:
        if g["differs_in"]:
            lines.append(
                f"\nNote: the {g['task']} / {g['algo']} runs differ in {', '.join(g['differs_in'])}."
            )
    if report["groups"]:
        lines += [
            "",
            "![success vs episodes](success_vs_episodes.png)",
            "",
            "![success vs wall-clock](success_vs_wall_time.png)",
        ]
    if report["calibration"]:
        lines += [
            "",
            "## Calibration of V(s_0)",
            "",
            f"| task | algo | runs | start states | Pearson r | Spearman rho | ECE ({cfg.calibration_bins} bins) | Brier | MSE |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in report["calibration"]:
            lines.append(
                f"| {c['task']} | {c['algo']} | {c['runs']} | {c['start_states']} | {_num(c['pearson'], '.3f')} | "
                f"{_num(c['spearman'], '.3f')} | {c['ece']:.4f} | {c['brier']:.4f} | {c['mse']:.4f} |"
            )
        lines += ["", "![reliability diagram](calibration.png)"]
    if report.get("tail_effect") or report.get("tail_effect_skipped"):
        lines += [""] + tail.markdown(report["tail_effect"], report.get("tail_effect_skipped", []))
    lines += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in report["definitions"].items()]
    return "\n".join(lines) + "\n"


def definitions(cfg: ReportConfig) -> dict[str, str]:
    return {
        "smoothing": f"each run's success_rate is a trailing mean over the last {cfg.smooth} updates",
        "curves": f"each smoothed run is interpolated linearly onto {cfg.grid_points} common x points (no "
        "extrapolation); line = mean over the runs covering x, band = 95% Student-t interval over them",
        "final success": f"per run, the mean raw success_rate over its last {cfg.final_frac:.0%} of updates "
        "(at least one); table: mean ± 95% t half-width (t_0.975,n-1 * s / sqrt(n)) over seeds",
        "episodes to x": "per run, the first episode count where the smoothed curve is >= x; table: median over "
        "the seeds that reach it (reached/seeds); — if none",
        "wall s, steps/s": "training time (wall_time_s) and env steps per second (sps) of each run's last "
        "metrics row, mean over seeds",
        "calibration": "sigmoid V(s_0) vs the empirical success of each calibration start state, pooled over "
        f"seeds; ECE over {cfg.calibration_bins} equal-width bins weighted by episodes; Brier score against the "
        "episode outcomes, sum m(p - y)^2 + m y(1 - y) over sum m; MSE = sum m(p - y)^2 / sum m",
    }


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def run_report(cfg: ReportConfig) -> dict[str, Any]:
    """Entry point of ``sppo-rl report``: writes the figures, ``report.md`` and ``report.json``."""
    if not cfg.inputs:
        raise RunError("give at least one folder to read runs from")
    if cfg.smooth < 1 or not 0 < cfg.final_frac <= 1 or cfg.calibration_bins < 1 or cfg.grid_points < 2:
        raise ValueError(
            "need --smooth >= 1, 0 < --final-frac <= 1, --calibration-bins >= 1, --grid-points >= 2"
        )
    out = Path(cfg.out) if cfg.out else Path(cfg.inputs[0]) / "report"
    runs = find_runs(cfg.inputs, skip=out.resolve())
    with_rows = [r for r in runs if r.rows]
    tails, tails_skipped = tail_effect(runs)
    if not with_rows and not tails:
        raise RunError(
            f"no run with metrics (metrics.jsonl + config.json with success_rate rows) or a "
            f"{tail.TRACE_FILE} under {', '.join(cfg.inputs)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    tasks = sorted({r.task for r in with_rows})
    algos = algo_order({r.algo for r in with_rows})
    per_run, groups, curves, cal = [], [], {}, {}
    for task in tasks:
        for algo in algos:
            members = sorted((r for r in with_rows if (r.task, r.algo) == (task, algo)), key=lambda r: r.seed)
            if not members:
                continue
            numbers = [run_numbers(r, cfg) for r in members]
            per_run += numbers
            groups.append({**group_numbers(numbers, cfg), "differs_in": differing_settings(members)})
            curves[task, algo] = {x: curve(members, x, cfg) for x in X_AXES}
            calibrated = [r for r in members if r.calibration]
            if calibrated:
                cal[task, algo] = calibration_numbers(calibrated, cfg.calibration_bins)
    note = f"mean over seeds, 95% t-interval\neach run smoothed: trailing mean over {cfg.smooth} updates"
    figures = []
    for xkey in X_AXES if with_rows else ():
        name = f"success_vs_{xkey.removesuffix('_s')}.png"
        plot_curves(curves, tasks, algos, xkey, out / name, note)
        figures.append(name)
    if cal:
        plot_reliability(
            cal, sorted({t for t, _ in cal}), algos, out / "calibration.png", cfg.calibration_bins
        )
        figures.append("calibration.png")
    if tails:
        tail.plot(tails, out / tail.FIGURE, colours({e["algo"] for e in tails}))
        figures.append(tail.FIGURE)
    report = {
        "config": asdict(cfg),
        "definitions": {**(definitions(cfg) if with_rows else {}), **(tail.definitions() if tails else {})},
        "runs": per_run
        + [
            {
                "path": str(r.path),
                "task": r.task,
                "algo": r.algo,
                "seed": r.seed,
                "finished": r.finished,
                "updates": 0,
            }
            for r in runs
            if not r.rows
        ],
        "groups": groups,
        "calibration": list(cal.values()),
        "curves": [{"task": t, "algo": a, **{x: c[x] for x in X_AXES}} for (t, a), c in curves.items()],
        "tail_effect": tails,
        "tail_effect_skipped": tails_skipped,
        "figures": figures,
    }
    text = markdown(report, cfg)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(_clean(report), indent=1) + "\n")
    print(text)
    print(f"report: {out / 'report.md'}, {out / 'report.json'}, " + ", ".join(str(out / f) for f in figures))
    return report
