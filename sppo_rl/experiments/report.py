"""``sppo-rl report``: curves, tables, rliable-style statistics and SPPO's calibration from run folders.

A run is any folder holding ``metrics.jsonl`` and ``config.json`` (found recursively); finished or not,
its rows so far are used. Control runs log ``success_rate`` per update; LLM runs log ``val_accuracy`` at
their evaluation steps. A run's **score** is its tail success (control) or tail validation accuracy
(LLM), both in [0, 1].

- Groups: runs are grouped by task, algorithm and every setting that tells them apart: a config field
  (other than the seed and the fields in :data:`~sppo_rl.experiments.report_runs.IGNORED`, which change no result) whose value differs
  between two runs of the same task and algorithm. Such a field becomes part of the group's label for
  every task of that algorithm (``sppo actor_lr=0.001``); runs that differ in a setting are never pooled
  as seeds. The seeds of a group are its samples.
- Curves: each control run's ``success_rate`` is smoothed by a trailing mean over ``--smooth`` updates,
  then interpolated linearly onto a common grid of ``--grid-points`` x values (episodes, or wall-clock
  seconds); at each x the mean over the runs that reach that x is drawn with a 95% Student-t interval
  over them (where at least two do), clipped to [0, 1]. LLM runs: ``val_accuracy`` (not smoothed)
  against updates, generated tokens and training seconds, the same way. Up to ``--max-overlay``
  algorithms share a panel; with more, each has its own panel with the others in grey behind it.
- Table: tail success (mean of the raw ``success_rate`` over the last ``--tail-frac`` of a run's updates;
  mean and 95% t-interval over seeds, clipped to [0, 1]), its interquartile mean over seeds with a 95%
  bootstrap interval, episodes to reach each threshold (the first crossing of the raw, unsmoothed
  ``success_rate``, interpolated between the two updates around it, :func:`protocol.crossing`; median
  over the seeds that reach it, with how many did), training wall time (``wall_time_s`` of
  the last row) and steps per second (``sps`` of the last row), both means over seeds. LLM runs: final
  validation accuracy (mean over the last ``--tail-frac`` of the evaluations) the same way.
- Comparisons (:func:`~sppo_rl.experiments.report_numbers.comparisons`): per task with two labels or more, every pair of labels through
  :mod:`sppo_rl.experiments.protocol` (raw curves, common window, pooled-finals target, value at equal
  seconds and at equal episodes / generated tokens, area under the curve, time below the target; the
  paired t-test, Holm's correction, minimum detectable effect, TOST and collapse counts of
  :mod:`sppo_rl.experiments.decision`).
- Aggregates (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"): per label, over
  all its runs on all tasks of a world (control, LLM): IQM, mean, median and optimality gap of the
  scores with stratified-bootstrap 95% intervals (runs resampled within each task), and the performance
  profile ``P(score > tau)`` for tau in [0, 1] with pointwise bootstrap bands (see :mod:`stats`).
- Calibration: sppo runs' ``calibration.json`` (predicted ``sigmoid V(s_0)`` against the empirical success
  of ``samples`` episodes per start state), pooled over the seeds of a group: Pearson, Spearman, ECE
  (``--calibration-bins`` equal-width bins, weighted by episodes), Brier score against the episode outcomes.
- Tail effect: every run folder with a ``critic_trace.npz`` (control or LLM runs, grouped by task and
  label): critic values against the relative position t/(T-1) for successful and failed sequences, their
  gap and ROC-AUC, and the sequence critic's V(s_0) by outcome, each computed within one run (seed) and
  summarised over seeds (mean, min-max, per-seed values, inverted seeds; see :mod:`tail`).
- Compute (LLM runs): validation accuracy against training FLOPs (``flops_total``) with ScaleRL's sigmoid
  fitted per group, its ceiling, efficiency and extrapolation error (:mod:`scaling`).

Outputs in ``--out``: ``success_vs_episodes.png``, ``success_vs_wall_time.png``, ``llm_val_accuracy.png``,
``llm_accuracy_vs_flops.png``,
``performance_profile.png``, ``aggregates.png``, ``calibration.png``, ``tail_effect.png`` (those that
have data), ``report.md`` (also printed) and ``report.json`` (every number).

One job a module: :mod:`~sppo_rl.experiments.report_runs` finds, names and labels the runs,
:mod:`~sppo_rl.experiments.report_numbers` computes every number, :mod:`~sppo_rl.experiments.report_plots`
draws the figures, :mod:`~sppo_rl.experiments.report_text` writes ``report.md``; :func:`run_report`
runs them in that order for each world present.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sppo_rl.experiments import protocol, tail
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report_numbers import (
    CONTROL_AXES,
    MIN_RUNS,
    aggregates,
    calibration_numbers,
    comparisons,
    curve,
    group_numbers,
    llm_group_numbers,
    llm_run_numbers,
    run_numbers,
    tail_effect,
)
from sppo_rl.experiments.report_plots import (
    LLM_X_AXES,
    X_AXES,
    plot_aggregates,
    plot_curves,
    plot_llm_curves,
    plot_profiles,
    plot_reliability,
)
from sppo_rl.experiments.report_runs import Run, algo_of, find_runs, groups_by_label, label_order, styles
from sppo_rl.experiments.report_text import captions, definitions, markdown
from sppo_rl.experiments.scaling import scaling_section
from sppo_rl.runtime.logging import json_safe
from sppo_rl.runtime.run import RunError
from sppo_rl.runtime.trace import TRACE_FILE


def world_numbers(
    runs: list[Run],
    cfg: ReportConfig,
    numbers: Callable[[Run, ReportConfig], dict[str, Any]],
    group: Callable[[list[dict[str, Any]], ReportConfig], dict[str, Any]],
    x_axes: dict[str, str],
    score: str = "success_rate",
    smooth: int | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    """One world's numbers, the same steps in both worlds: per run (``numbers``: :func:`run_numbers` or
    :func:`llm_run_numbers`), per (task, label) group of seeds (``group``, with the group's settings) and
    the group's mean curve of ``score`` against each of ``x_axes`` (:func:`curve`, smoothed over
    ``smooth`` points, default ``--smooth``)."""
    per_run, groups, curves = [], [], {}
    for task, label, members in groups_by_label(runs):
        rows = [numbers(r, cfg) for r in members]
        per_run += rows
        groups.append({**group(rows, cfg), "settings": members[0].settings})
        curves[task, label] = {x: curve(members, x, cfg, score, smooth=smooth) for x in x_axes}
    return per_run, groups, curves


def curve_entries(
    curves: dict[tuple[str, str], dict[str, Any]], runs: list[Run], x_axes: dict[str, str]
) -> list:
    """``report.json``'s curves: one entry per (task, label) with its algorithm and a curve per x axis."""
    return [
        {"task": t, "label": lb, "algo": algo_of(runs, lb), **{x: c[x] for x in x_axes}}
        for (t, lb), c in curves.items()
    ]


def run_report(cfg: ReportConfig) -> dict[str, Any]:
    """Entry point of ``sppo-rl report``: writes the figures, ``report.md`` and ``report.json``."""
    if not cfg.inputs:
        raise RunError("give at least one folder to read runs from")
    if (
        cfg.smooth < 1
        or not 0 < cfg.tail_frac <= 1
        or cfg.calibration_bins < 1
        or cfg.grid_points < 2
        or cfg.bootstrap_reps < 1
        or cfg.max_overlay < 1
        or (cfg.margin is not None and not 0 < cfg.margin < 1)
    ):
        raise ValueError(
            "need --smooth >= 1, 0 < --tail-frac <= 1, --calibration-bins >= 1, --grid-points >= 2, "
            "--bootstrap-reps >= 1, --max-overlay >= 1, 0 < --margin < 1"
        )
    known = {
        n
        for axes in (CONTROL_AXES, (*protocol.AXES, "flops"))
        for names in protocol.statistic_names(axes)
        for n in names
    }
    if cfg.primary is not None and cfg.primary not in known:
        raise ValueError(
            f"--primary {cfg.primary}: not a statistic of the comparisons; valid: {', '.join(sorted(known))}"
        )
    out = Path(cfg.out) if cfg.out else Path(cfg.inputs[0]) / "report"
    runs = find_runs(cfg.inputs, skip=out.resolve())
    unscored = [r for r in runs if not r.rows and r.last]
    if (
        unscored
    ):  # updates logged, but nothing the report scores: listed in report.json, in no figure or table
        print(
            f"report: left out of the figures and tables, {len(unscored)} run(s) that logged updates but no "
            f"{' or '.join(sorted({'val_accuracy (no validation: --eval-every 0?)' if r.world == 'llm' else 'success_rate' for r in unscored}))}: "
            + ", ".join(str(r.path) for r in unscored),
            file=sys.stderr,
        )
    control = [r for r in runs if r.rows and r.world == "control"]
    llm = [r for r in runs if r.rows and r.world == "llm"]
    tails, tails_skipped = tail_effect(runs)
    if not control and not llm and not tails:
        raise RunError(
            f"no run with metrics (metrics.jsonl + config.json with success_rate or val_accuracy rows) or a "
            f"{TRACE_FILE} under {', '.join(cfg.inputs)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    style = styles(runs, label_order(runs))
    per_run, groups, curves = world_numbers(control, cfg, run_numbers, group_numbers, X_AXES)
    llm_per_run, llm_groups, llm_curves = world_numbers(
        llm, cfg, llm_run_numbers, llm_group_numbers, LLM_X_AXES, "val_accuracy", smooth=1
    )
    cal = {}
    for task, label, members in groups_by_label(control):
        calibrated = [r for r in members if r.calibration]
        if calibrated:
            cal[task, label] = calibration_numbers(calibrated, cfg.calibration_bins)
    aggs = {}
    if control:
        aggs["control"] = aggregates(per_run, label_order(control), cfg)
    if llm:
        aggs["llm"] = aggregates(llm_per_run, label_order(llm), cfg)

    figures, control_note, llm_note = [], "", ""
    if control:
        tasks, labels = sorted({r.task for r in control}), label_order(control)
        control_note = (
            f"Lines: the mean over seeds; bands: 95% t-intervals (clipped to [0, 1]), only where at least "
            f"{MIN_RUNS} seeds cover the point; dotted pieces, marked n=k where they begin: the mean of the "
            f"seeds that go on after another has ended. Each run smoothed by a trailing mean over "
            f"{cfg.smooth} updates."
        )
        for xkey in X_AXES:
            name = f"success_vs_{xkey.removesuffix('_s')}.png"
            plot_curves(curves, tasks, labels, xkey, out / name, control_note, style, cfg.max_overlay)
            figures.append(name)
    if llm:
        llm_note = (
            f"Validation accuracy (mean@k). Lines: the mean over seeds; bands: 95% t-intervals (clipped to "
            f"[0, 1]), only where at least {MIN_RUNS} seeds cover the point; dotted pieces, marked n=k: the "
            "mean of the seeds that go on after another has ended."
        )
        plot_llm_curves(
            llm_curves,
            sorted({r.task for r in llm}),
            label_order(llm),
            out / "llm_val_accuracy.png",
            llm_note,
            style,
            cfg.max_overlay,
        )
        figures.append("llm_val_accuracy.png")
        tasks = {r.task for r in llm}  # accuracy against FLOPs, ScaleRL's sigmoid fitted per group
        by_group = {
            lb if len(tasks) == 1 else f"{t}: {lb}": [r.rows for r in m] for t, lb, m in groups_by_label(llm)
        }
        scaling_lines, scaling_fits = scaling_section(by_group, out / "llm_accuracy_vs_flops.png")
        figures += ["llm_accuracy_vs_flops.png"] if scaling_fits else []
    if aggs:
        plot_profiles(aggs, out / "performance_profile.png", style, cfg.max_overlay)
        plot_aggregates(aggs, out / "aggregates.png", style)
        figures += ["performance_profile.png", "aggregates.png"]
    if cal:
        plot_reliability(
            cal,
            sorted({t for t, _ in cal}),
            label_order(control),
            out / "calibration.png",
            cfg.calibration_bins,
            style,
        )
        figures.append("calibration.png")
    if tails:
        tail.plot(tails, out / tail.FIGURE, {lb: c for lb, (c, _) in style.items()})
        figures.append(tail.FIGURE)
    report = {
        "captions": captions(cfg, figures, control_note, llm_note),
        "config": asdict(cfg),
        "definitions": {
            **(definitions(cfg, bool(control), bool(llm)) if control or llm else {}),
            **(tail.definitions() if tails else {}),
        },
        "runs": per_run
        + llm_per_run
        + [
            {
                "path": str(r.path),
                "task": r.task,
                "algo": r.algo,
                "label": r.label,
                "world": r.world,
                "seed": r.seed,
                "finished": r.finished,
                "updates": 0,
            }
            for r in runs
            if not r.rows
        ],
        "groups": groups,
        "llm_groups": llm_groups,
        "aggregates": aggs,
        "comparisons": comparisons(control, "control", cfg) + comparisons(llm, "llm", cfg),
        "calibration": list(cal.values()),
        "curves": curve_entries(curves, runs, X_AXES),
        "llm_curves": curve_entries(llm_curves, runs, LLM_X_AXES),
        "tail_effect": tails,
        "tail_effect_skipped": tails_skipped,
        "figures": figures,
    }
    if llm:
        report["scaling"] = scaling_fits
    text = markdown(report, cfg) + ("\n".join(scaling_lines) + "\n" if llm else "")
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(json_safe(report), indent=1) + "\n")
    print(text)
    print(f"report: {out / 'report.md'}, {out / 'report.json'}, " + ", ".join(str(out / f) for f in figures))
    return report
