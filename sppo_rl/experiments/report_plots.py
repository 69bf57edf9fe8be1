"""The report's figures: mean curves with their bands, performance profiles, aggregates and
reliability diagrams, each :data:`~sppo_rl.experiments.figures.PRINT_WIDTH` wide; one panel per task with
every label, or small multiples with the other labels in grey where there are too many to overlay."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.experiments.figures import PRINT_WIDTH, save_figure
from sppo_rl.experiments.report_numbers import WORLDS, enough_runs

GREY = "0.75"  # the other algorithms behind the one a small-multiples panel is about  # the settings of one algorithm, in label order


X_AXES = {"episodes": "episodes", "wall_time_s": "wall-clock seconds (training)"}


LLM_X_AXES = {
    "update": "updates",
    "generated_tokens": "generated tokens (training rollouts)",
    "wall_time_s": "wall-clock seconds (training)",
}


INTEGER_X = {"episodes", "update", "generated_tokens"}
"""x-axes that count things: their ticks are whole numbers (no update 1.5)."""


def _panels(n: int):
    from matplotlib.figure import Figure

    cols = min(2, n)
    rows = math.ceil(n / cols)
    aspect = 0.75 if cols > 1 else 0.5  # one panel the page wide: lower
    fig = Figure(
        figsize=(PRINT_WIDTH, (PRINT_WIDTH / cols * aspect + 0.3) * rows + 0.3), layout="constrained"
    )
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes


def _grid(rows: int, cols: int, aspect: float = 0.75):
    """A figure :data:`~sppo_rl.experiments.figures.PRINT_WIDTH` wide of ``rows x cols`` panels, each ``aspect`` times as high as wide
    (plus room for its labels)."""
    from matplotlib.figure import Figure

    height = (PRINT_WIDTH / cols * aspect + 0.35) * rows + 0.3
    fig = Figure(figsize=(PRINT_WIDTH, height), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def _draw(
    ax,
    series: dict[str, dict],
    focus: str | None,
    style: dict[str, tuple[str, str]],
    title: str,
    tag: str = "n",
):
    """Lines (``x``, ``mean``) with bands (``lo``, ``hi``) of ``series``: all in colour with a legend, or only
    ``focus`` in colour (named in the title) and the others as thin grey lines behind it."""
    x_of = lambda s: np.asarray(s.get("x", s.get("tau")), dtype=float)  # noqa: E731
    y_of = lambda s: np.asarray(s.get("mean", s.get("fraction")), dtype=float)  # noqa: E731
    if focus is not None:
        for label, s in series.items():
            if label != focus:
                ax.plot(x_of(s), y_of(s), color=GREY, lw=0.9, zorder=1)
    for label in series if focus is None else [focus]:
        s = series.get(label)
        if s is None:
            continue
        colour, ls = style[label]
        x, y = x_of(s), y_of(s)
        lo, hi = np.asarray(s["lo"], dtype=float), np.asarray(s["hi"], dtype=float)
        # where a seed has ended the mean is over fewer seeds: thin dotted pieces without a band
        full = np.asarray(s["n"]) == s["runs"] if "n" in s else np.ones(len(x), dtype=bool)
        partial = not full.all()
        name = f"{label} ({tag}={s['runs']}" + ("; dotted: fewer seeds)" if partial else ")")
        ax.plot(x, np.where(full, y, np.nan), color=colour, ls=ls, lw=1.6, label=name, zorder=3)
        if partial:
            _draw_fewer(ax, x, y, np.asarray(s["n"]), s["runs"], colour)
        ax.fill_between(x, lo, hi, where=full & ~np.isnan(lo), color=colour, alpha=0.2, lw=0, zorder=2)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if focus is None:
        ax.set_title(title, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    else:
        s = series.get(focus)
        ax.set_title(
            f"{title}\n{focus} ({tag}={s['runs']})" if s else f"{title}\n{focus} (no runs)", fontsize=8
        )


def _draw_fewer(ax, x: np.ndarray, y: np.ndarray, n: np.ndarray, runs: int, colour: str) -> None:
    """The mean where fewer than ``runs`` seeds cover ``x``: one dotted piece per seed count, never joined
    to its neighbours (a seed's end changes the mean's members, which a joining line would draw as a
    drop), each marked ``n=k`` where it begins."""
    start = 0
    for i in range(1, len(x) + 1):
        if i < len(x) and n[i] == n[start]:
            continue
        if 0 < n[start] < runs:
            piece = slice(start, i)
            ax.plot(x[piece], y[piece], color=colour, ls=":", lw=1.0, zorder=3)
            if not np.isnan(y[start]):
                ax.plot([x[start]], [y[start]], "|", color=colour, ms=6, zorder=3)
                ax.annotate(f"n={int(n[start])}", (x[start], y[start]), xytext=(2, 3),
                            textcoords="offset points", fontsize=6, color=colour)  # fmt: skip
        start = i


def _axes_labels(ax, xlabel: str, ylabel: str, integer: bool = False):
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(5, integer=integer))


def _small_multiples(blocks: list[tuple[str, list[str]]]):
    """One panel per (block, label), each block (a task, a world) on rows of its own, at most 4 panels a
    row, as few empty ones as can be: a figure and ``(ax, block, label)`` for every panel."""
    most = max(len(labels) for _, labels in blocks)
    cols = math.ceil(most / math.ceil(most / 4))
    first = np.cumsum([0] + [math.ceil(len(labels) / cols) for _, labels in blocks])
    fig, grid = _grid(int(first[-1]), cols)
    cells, used = [], set()
    for b, (block, labels) in enumerate(blocks):
        for k, label in enumerate(labels):
            r, c = divmod(k, cols)
            cells.append((grid[first[b] + r, c], block, label))
            used.add((first[b] + r, c))
    for r in range(grid.shape[0]):
        for c in range(cols):
            if (r, c) not in used:
                grid[r, c].set_visible(False)
    return fig, cells


def plot_curves(
    curves: dict,
    tasks: list[str],
    labels: list[str],
    xkey: str,
    path: Path,
    note: str,
    style,
    max_overlay: int = 4,
):
    """One panel per task with every label in it; with more than ``max_overlay`` labels, one panel per
    (task, label), the others in grey (rows of at most 4 per task); a short title (``note``, the method,
    is the caption ``report.md`` writes under it). Returns the figure."""
    if len(labels) <= max_overlay:
        fig, axes = _panels(len(tasks))
        cells = [(ax, task, None) for ax, task in zip(axes, tasks)]
    else:
        fig, cells = _small_multiples([(task, labels) for task in tasks])
    for ax, task, focus in cells:
        series = {lb: curves[task, lb][xkey] for lb in labels if (task, lb) in curves}
        _draw(ax, series, focus, style, task)
        _axes_labels(ax, X_AXES[xkey], "success rate", integer=xkey in INTEGER_X)
    save_figure(fig, path, f"success rate vs {X_AXES[xkey]}")
    return fig


def plot_llm_curves(
    curves: dict, tasks: list[str], labels: list[str], path: Path, note: str, style, max_overlay: int = 4
):
    """``llm_val_accuracy.png``: validation accuracy against updates, generated tokens and seconds (columns),
    one row per task (every label in it), or with more than ``max_overlay`` labels one row per (task,
    label) with the others in grey. Returns the figure."""
    if len(labels) <= max_overlay:
        rows = [(task, None) for task in tasks]
    else:
        rows = [(task, lb) for task in tasks for lb in labels if (task, lb) in curves]
    fig, grid = _grid(len(rows), len(LLM_X_AXES))
    for i, (task, focus) in enumerate(rows):
        for j, xkey in enumerate(LLM_X_AXES):
            ax = grid[i, j]
            series = {lb: curves[task, lb][xkey] for lb in labels if (task, lb) in curves}
            _draw(ax, series, focus, style, task)
            _axes_labels(ax, LLM_X_AXES[xkey], "validation accuracy", integer=xkey in INTEGER_X)
    save_figure(fig, path, "validation accuracy")
    return fig


def plot_profiles(worlds: dict[str, dict[str, Any]], path: Path, style, max_overlay: int = 4):
    """``performance_profile.png``: per world, the fraction of runs with score > tau against tau, with
    bootstrap bands; one panel with every label, or with more than ``max_overlay`` labels one panel per
    label with the others in grey. Returns the figure."""
    series = {world: {p["label"]: p for p in agg["profiles"]} for world, agg in worlds.items()}
    if max(len(s) for s in series.values()) <= max_overlay:
        fig, grid = _grid(1, len(worlds), aspect=0.7 if len(worlds) > 1 else 0.55)
        cells = [(grid[0, j], world, None) for j, world in enumerate(worlds)]
    else:
        fig, cells = _small_multiples([(world, list(s)) for world, s in series.items()])
    for ax, world, focus in cells:
        tasks = {t for e in worlds[world]["table"] for t in e["tasks"]}
        _draw(ax, series[world], focus, style, f"{world}: {len(tasks)} task(s)", tag="runs")
        ax.set_xlim(0, 1)
        _axes_labels(ax, f"tau ({WORLDS[world]})", "fraction of runs > tau")
    save_figure(fig, path, "performance profiles")
    return fig


def plot_aggregates(worlds: dict[str, dict[str, Any]], path: Path, style):
    """``aggregates.png``: per world (two rows of two panels), IQM, median, mean and optimality gap of
    every label's scores over all its runs and tasks, with 95% stratified-bootstrap intervals; a label
    with too few runs for one (:data:`~sppo_rl.experiments.report_numbers.MIN_RUNS`) is a dot marked ``n=k``."""
    from matplotlib.figure import Figure

    names = {"iqm": "IQM", "median": "median", "mean": "mean", "optimality_gap": "optimality gap"}
    sizes = [len(agg["table"]) for agg in worlds.values()]
    ratios = [n for n in sizes for _ in range(2)]
    fig = Figure(figsize=(PRINT_WIDTH, sum(2 * (0.22 * n + 0.9) for n in sizes) + 0.3), layout="constrained")
    grid = fig.subplots(2 * len(worlds), 2, squeeze=False, gridspec_kw={"height_ratios": ratios})
    for i, (world, agg) in enumerate(worlds.items()):
        table = agg["table"]
        for j, (key, title) in enumerate(names.items()):
            ax = grid[2 * i + j // 2, j % 2]
            for k, e in enumerate(table):
                v, (lo, hi) = e[key]["value"], e[key]["ci"]
                colour = style[e["label"]][0]
                if not (math.isnan(lo) or math.isnan(hi)):
                    ax.plot([lo, hi], [k, k], color=colour, lw=5, alpha=0.45, solid_capstyle="butt")
                elif not enough_runs(e["runs"]):
                    ax.annotate(
                        f"n={e['runs']}", (v, k), xytext=(5, -2), textcoords="offset points", fontsize=6
                    )
                ax.plot([v], [k], "o", color=colour, ms=4)
            ax.set_yticks(range(len(table)))
            ax.set_yticklabels([e["label"] for e in table] if j % 2 == 0 else [], fontsize=7)
            ax.set_ylim(len(table) - 0.5, -0.5)
            ends = [x for e in table for x in (e[key]["value"], *e[key]["ci"]) if not math.isnan(x)] or [0, 1]
            pad = max(0.02, 0.08 * (max(ends) - min(ends)))
            ax.set_xlim(max(-0.02, min(ends) - pad), min(1.02, max(ends) + pad))
            ax.grid(axis="x", alpha=0.3)
            ax.tick_params(labelsize=7)
            ax.set_title(
                f"{world}: {title}" + (" (lower is better)" if key == "optimality_gap" else ""), fontsize=8
            )
            ax.set_xlabel("mean shortfall below 1" if key == "optimality_gap" else WORLDS[world], fontsize=7)
    save_figure(fig, path, "aggregate scores")
    return fig


def plot_reliability(cal: dict, tasks: list[str], labels: list[str], path: Path, bins: int, style):
    fig, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks):
        ax.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1)
        for label in labels:
            c = cal.get((task, label))
            if c is None:
                continue
            colour = style[label][0]
            ax.scatter(c["points"]["predicted"], c["points"]["empirical"], s=6, alpha=0.25, color=colour)
            bx = [b["pred"] for b in c["bins"]]
            by = [b["emp"] for b in c["bins"]]
            size = [20 + 200 * b["weight"] / c["episodes"] for b in c["bins"]]
            ax.plot(bx, by, color=colour, lw=1.2)
            ax.scatter(bx, by, s=size, color=colour, zorder=3)
            # the legend's marker: one of ordinary size (a bin's area says how many episodes it holds)
            ax.plot([], [], "o-", color=colour, ms=5, lw=1.2, label=f"{label} (ECE {c['ece']:.3f})")
        ax.set_title(task)
        ax.set_xlabel("predicted sigmoid V(s_0)")
        ax.set_ylabel("empirical success")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, "critic calibration")
    return fig
