"""The report's text: ``report.md``'s tables, comparison lines, definitions and figure captions from
the numbers the report computed."""

from __future__ import annotations

import math
from typing import Any

from sppo_rl.experiments import decision, tail
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report_numbers import MIN_RUNS, WORLDS, enough_runs


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ci(value: float, ci: list[float], fmt: str = ".3f", n: int | None = None) -> str:
    """``value [lo, hi]``; the value alone where there is no interval, with ``(n = 2: no interval)``
    where ``n`` runs are too few for one (:data:`~sppo_rl.experiments.report_numbers.MIN_RUNS`)."""
    lo, hi = ci
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        few = n is not None and not enough_runs(n)
        return _num(value, fmt) + (f" (n = {n}: no interval)" if few else "")
    return f"{_num(value, fmt)} [{lo:{fmt}}, {hi:{fmt}}]"


def _seeds(g: dict[str, Any]) -> str:
    return str(g["seeds"]) + (
        f" ({g['seeds'] - g['finished']} unfinished)" if g["finished"] < g["seeds"] else ""
    )


def _clipped_note(groups: list[dict[str, Any]], name: str) -> list[str]:
    clipped = [f"{g['task']} / {g['label']}" for g in groups if g[f"{name}_clipped"]]
    if not clipped:
        return []
    return [
        "",
        f"t-intervals clipped to [0, 1] (the unclipped mean ± t·s/√n leaves it; few seeds): {', '.join(clipped)}.",
    ]


def _aggregate_lines(agg: dict[str, Any], world: str, cfg: ReportConfig) -> list[str]:
    tasks = sorted({t for e in agg["table"] for t in e["tasks"]})
    lines = [
        "",
        f"### Aggregates over tasks ({world}: {WORLDS[world]}; {len(tasks)} task(s): {', '.join(tasks)})",
        "",
        f"Each algorithm's runs on all tasks together; 95% stratified-bootstrap intervals "
        f"({cfg.bootstrap_reps} resamples of the runs within each task, seed {cfg.bootstrap_seed}).",
        "",
        "| algo | tasks | runs | IQM [95% CI] | mean [95% CI] | median [95% CI] | optimality gap [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in agg["table"]:
        cells = [
            _ci(e[k]["value"], e[k]["ci"], n=e["runs"]) for k in ("iqm", "mean", "median", "optimality_gap")
        ]
        lines.append(f"| {e['label']} | {len(e['tasks'])} | {e['runs']} | " + " | ".join(cells) + " |")
    return lines


AXIS_WORDS = {
    "seconds": "wall-clock",
    "episodes": "episodes",
    "env_steps": "env steps",
    "tokens": "generated tokens",
    "flops": "FLOPs",
}


UNITS = {
    "seconds": "training seconds",
    "episodes": "episodes",
    "env_steps": "env steps",
    "tokens": "generated tokens",
    "flops": "FLOPs",
}


WINDOW_FMT = {"seconds": ".1f", "episodes": ",.0f", "env_steps": ",.0f", "tokens": ",.0f", "flops": ".3g"}


def _stat_label(name: str, world: str) -> str:
    """``acc_at_episodes`` -> ``success at equal episodes``; ``seconds_to_target`` -> ``seconds below
    target``; ``auc_seconds`` -> ``area under success-vs-seconds`` (LLM: accuracy)."""
    what = "success" if world == "control" else "accuracy"
    if name == "auc_seconds":
        return f"area under {what}-vs-seconds"
    if name.startswith("acc_at_"):
        return f"{what} at equal {AXIS_WORDS[name.removeprefix('acc_at_')]}"
    return f"{AXIS_WORDS[name.removesuffix('_to_target')].replace('wall-clock', 'seconds')} below target"


def _comparison_lines(comparisons: list[dict[str, Any]], world: str) -> list[str]:
    mine = [c for c in comparisons if c["world"] == world]
    if not mine:
        return []
    lines = [
        "",
        f"### Comparisons over seeds ({world}; the comparison protocol)",
        "",
        "Each run read as straight lines between its raw (unsmoothed) "
        + ("per-update success rates" if world == "control" else "evaluations")
        + " on the window every run of the task covers; A vs B over the seeds both have, by the decision "
        "rule (sppo_rl.experiments.decision).",
    ]
    for c in mine:
        lines += ["", f"**{c['task']}**: " + ", ".join(c["labels"])]
        if "skipped" in c:
            lines += [f"no comparison: {c['skipped']}."]
            continue
        w, t = c["windows"], c["target"]
        lines += [
            "",
            "Window: "
            + ", ".join(
                f"{_num(w[a][0], WINDOW_FMT[a])}-{_num(w[a][1], WINDOW_FMT[a])} {UNITS[a]}" for a in c["axes"]
            )
            + f"; target {_num(t['value'], '.3f')} ({t['rule']}, s0 = the mean start value).",
            "",
            *decision.table_lines(c, lambda name: _stat_label(name, world)),
        ]
    done = [c["collapse"] for c in mine if "collapse" in c]
    if len(done) > 1:
        pooled = decision.pooled_collapse(done)
        counts = ", ".join(f"{m} {v['n']}/{v['of']}" for m, v in pooled["counts"].items())
        tests = ", ".join(f"{k.replace('_vs_', ' vs ')} p = {p:.2g}" for k, p in pooled["fisher_p"].items())
        lines += [
            "",
            f"Collapsed runs pooled over the {len(done)} tasks: {counts}; Fisher's exact test: {tests}.",
        ]
    return lines


def _ci_only(ci: list[float], fmt: str) -> str:
    lo, hi = ci
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return "—"
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def markdown(report: dict[str, Any], cfg: ReportConfig) -> str:
    ts = [str(t) for t in cfg.thresholds]
    runs = report["runs"]
    unfinished = sum(not r["finished"] for r in runs)
    lines = [
        "# Report",
        "",
        f"{len(runs)} runs ({unfinished} unfinished) from {', '.join(cfg.inputs)}.",
    ]
    groups, llm = report["groups"], report["llm_groups"]
    if groups:
        lines += [
            "",
            "| task | algo | seeds | tail success [95% t-CI] | IQM [95% bootstrap CI] | "
            + " | ".join(f"episodes to {t}" for t in ts)
            + " | wall s | steps/s |",
            "|---|---|---:|---:|---:|" + "---:|" * len(ts) + "---:|---:|",
        ]
    elif not llm:
        lines += ["", "No run with success_rate or val_accuracy rows: no curves and no table."]
    for g in groups:
        reach = [
            f"{_num(g['episodes_to'][t]['median'], '.0f')} ({g['episodes_to'][t]['reached']}/{g['seeds']})"
            for t in ts
        ]
        lines.append(
            f"| {g['task']} | {g['label']} | {_seeds(g)} | {_ci(g['tail_success_mean'], g['tail_success_ci'], n=g['seeds'])} | "
            f"{_ci(g['iqm'], g['iqm_ci'], n=g['seeds'])} | "
            + " | ".join(reach)
            + f" | {_num(g['wall_time_s'], '.1f')} | {_num(g['sps'], '.0f')} |"
        )
    if groups:
        lines += _clipped_note(groups, "tail_success")
        lines += _comparison_lines(report["comparisons"], "control")
        if "control" in report["aggregates"]:
            lines += _aggregate_lines(report["aggregates"]["control"], "control", cfg)
        lines += [
            "",
            "![success vs episodes](success_vs_episodes.png)",
            "",
            "![success vs wall-clock](success_vs_wall_time.png)",
        ]
    if llm:
        lines += [
            "",
            "## LLM runs: validation accuracy",
            "",
            "| task | algo | seeds | evaluations | updates | start val accuracy | tail val accuracy [95% t-CI] "
            "| IQM [95% bootstrap CI] | generated tokens | wall s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for g in llm:
            lines.append(
                f"| {g['task']} | {g['label']} | {_seeds(g)} | {g['evaluations']} | {_num(g['updates'], '.0f')} | "
                f"{_num(g['start_val_accuracy_mean'], '.3f')} | "
                f"{_ci(g['tail_val_accuracy_mean'], g['tail_val_accuracy_ci'], n=g['seeds'])} | "
                f"{_ci(g['iqm'], g['iqm_ci'], n=g['seeds'])} | "
                f"{_num(g['generated_tokens'], '.0f')} | {_num(g['wall_time_s'], '.1f')} |"
            )
        lines += _clipped_note(llm, "tail_val_accuracy")
        lines += _comparison_lines(report["comparisons"], "llm")
        if "llm" in report["aggregates"]:
            lines += _aggregate_lines(report["aggregates"]["llm"], "llm", cfg)
        lines += ["", "![validation accuracy](llm_val_accuracy.png)"]
    if report["aggregates"]:
        lines += ["", "![performance profiles](performance_profile.png)", "", "![aggregates](aggregates.png)"]
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
                f"| {c['task']} | {c['label']} | {c['runs']} | {c['start_states']} | {_num(c['pearson'], '.3f')} | "
                f"{_num(c['spearman'], '.3f')} | {c['ece']:.4f} | {c['brier']:.4f} | {c['mse']:.4f} |"
            )
        lines += ["", "![reliability diagram](calibration.png)"]
    if report.get("tail_effect") or report.get("tail_effect_skipped"):
        lines += [""] + tail.markdown(report["tail_effect"], report.get("tail_effect_skipped", []))
    lines += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in report["definitions"].items()]
    return "\n".join(with_captions(lines, report.get("captions", {}))) + "\n"


def definitions(cfg: ReportConfig, control: bool, llm: bool) -> dict[str, str]:
    d = {
        "groups": "runs of one task and algorithm are the seeds of one group only if their configs agree on "
        "every setting but the seed and bookkeeping (run folder, logging, threads, checkpoints, "
        "evaluation sizes, device); a setting that differs within a task names the group "
        "(e.g. 'sppo actor_lr=0.001') on every task of that algorithm",
        "t-interval": "mean ± t_0.975,n-1 · s / √n over seeds (s with n - 1), clipped to [0, 1] since "
        "scores are success rates / accuracies (with 2-3 seeds it often leaves [0, 1]; clipped ones are "
        "listed under their table); no interval for one seed",
        "IQM": "interquartile mean: the mean of the scores left after dropping floor(n/4) from each end of "
        "the sorted n scores (scipy.stats.trim_mean(x, 0.25), as rliable; with n < 4 the mean)",
        "bootstrap CI": f"stratified bootstrap (Agarwal et al. 2021): {cfg.bootstrap_reps} resamples, each "
        "drawing every task's runs with replacement (as many as it has), the statistic recomputed on each; "
        f"95% percentile interval (2.5% and 97.5% quantiles); numpy generator seeded with {cfg.bootstrap_seed}, "
        f"so the same runs give the same intervals; none from fewer than {MIN_RUNS} runs (every interval of "
        f"the report: 'n = 2: no interval'). With {MIN_RUNS}-5 seeds per task the bootstrap interval is "
        "narrow and optimistic: read it beside the t-interval",
        "aggregates": "per algorithm (label), all its runs on all tasks of a world pooled: IQM, mean, "
        "median, and optimality gap = mean over runs of max(1 - score, 0) (lower is better), each with "
        "its stratified-bootstrap interval",
        "performance profile": "P(tau) = (1/M) sum_tasks (fraction of the task's runs with score > tau), "
        "for tau in [0, 1] (101 points); band: pointwise 95% stratified-bootstrap interval",
    }
    if control:
        d |= {
            "smoothing": f"each run's success_rate is a trailing mean over the last {cfg.smooth} updates",
            "curves": f"each smoothed run is interpolated linearly onto {cfg.grid_points} common x points (no "
            "extrapolation); line = mean over the runs covering x (dotted, marked n=k, where fewer than all "
            f"runs do), band = 95% Student-t interval over them, clipped to [0, 1], only where at least "
            f"{MIN_RUNS} runs cover x",
            "tail success": f"per run, the mean raw success_rate over its last {cfg.tail_frac:.0%} of updates "
            "(at least one); the control score; table: mean [t-interval] and IQM [bootstrap CI] over seeds",
            "episodes to x": "per run, the first episode count where the raw (unsmoothed) success_rate reaches "
            "x, interpolated linearly between the two updates around it (protocol.crossing); table: median "
            "over the seeds that reach it (reached/seeds); — if none",
            "wall s, steps/s": "training time (wall_time_s) and env steps per second (sps) of each run's last "
            "metrics row, mean over seeds",
        }
    if llm:
        d |= {
            "tail val accuracy": f"per LLM run, the mean val_accuracy over its last {cfg.tail_frac:.0%} of "
            "evaluations (at least one); the LLM score",
            "LLM curves": f"val_accuracy (not smoothed) against updates, generated tokens and training seconds, "
            f"interpolated onto {cfg.grid_points} common x points; mean over seeds, band = 95% t-interval "
            "clipped to [0, 1]",
        }
    d["comparisons"] = (
        "per task with two labels or more, the comparison protocol (sppo_rl.experiments.protocol, "
        "docs/results.md): each run's raw curve read as straight lines between its values (control: "
        "success_rate per update; LLM: val_accuracy per evaluation) on the window from the latest first to "
        "the earliest last value over the task's runs, in training seconds, episodes and env steps (LLM: "
        "generated tokens, and FLOPs where the runs log flops_total); target = s0 + 0.5 (median of the "
        "pooled finals - s0), s0 the mean first value; per run: the value at the window's end, the mean "
        "over the seconds window (area), and the time spent below the target plus the window's start; "
        "A vs B over their common seeds by the decision rule (sppo_rl.experiments.decision): ONE primary "
        "statistic declared before the runs (--primary or the sweep's; default the value at equal compute: "
        "env steps, FLOPs, else generated tokens), a paired t-test per statistic (ratios on ln(a/b)), its "
        "95% interval, Holm's correction over the primary table and over the secondary table, 'difference' "
        "when Holm's p < 0.05, 'equivalent within ±margin' only when a TOST shows it, else 'inconclusive' "
        "with the minimum detectable effect at 80% power; the means with their IQM and the probability of "
        "improvement; collapsed runs (final at 0 or below the start) with Fisher's exact test"
    )
    d["calibration"] = (
        "sigmoid V(s_0) vs the empirical success of each calibration start state, pooled over "
        f"seeds; ECE over {cfg.calibration_bins} equal-width bins weighted by episodes; Brier score against the "
        "episode outcomes, sum m(p - y)^2 + m y(1 - y) over sum m; MSE = sum m(p - y)^2 / sum m"
    )
    return d


def captions(
    cfg: ReportConfig, figures: list[str], control_note: str = "", llm_note: str = ""
) -> dict[str, str]:
    """Each figure's caption (what a figure's title leaves out: how its lines and bands are computed),
    written under it in ``report.md``."""
    boot = (
        f"95% stratified-bootstrap intervals ({cfg.bootstrap_reps} resamples of the runs within each task), "
        f"only for algorithms with at least {MIN_RUNS} runs"
    )
    text = {
        "performance_profile.png": "The fraction of runs whose score exceeds tau, each task weighing "
        f"equally; bands: pointwise {boot}.",
        "aggregates.png": f"IQM, median, mean and optimality gap of each algorithm's scores over all its runs "
        f"and tasks; bars: {boot} (a dot alone: fewer runs, no interval).",
        "calibration.png": f"The critic's predicted success sigmoid V(s_0) against the empirical success; dots: "
        f"start states; circles: {cfg.calibration_bins} equal-width bins (area ~ episodes).",
        "llm_val_accuracy.png": llm_note,
    }
    for f in figures:
        if f.startswith("success_vs_"):
            text[f] = control_note
    return {f: text[f] for f in figures if text.get(f)}


def with_captions(lines: list[str], caps: dict[str, str]) -> list[str]:
    """``lines`` with each figure's caption (``*...*``) after its image line."""
    out = []
    for line in lines:
        out.append(line)
        target = line.rpartition("](")[2].rstrip(")") if line.startswith("![") else ""
        if target in caps:
            out += ["", f"*{caps[target]}*"]
    return out
