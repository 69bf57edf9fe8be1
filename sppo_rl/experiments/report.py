"""``sppo-rl report``: curves, tables, rliable-style statistics and SPPO's calibration from run folders.

A run is any folder holding ``metrics.jsonl`` and ``config.json`` (found recursively); finished or not,
its rows so far are used. Control runs log ``success_rate`` per update; LLM runs log ``val_accuracy`` at
their evaluation steps. A run's **score** is its final success (control) or final validation accuracy
(LLM), both in [0, 1].

- Groups: runs are grouped by task, algorithm and every setting that tells them apart: a config field
  (other than the seed and the fields in :data:`IGNORED`, which change no result) whose value differs
  between two runs of the same task and algorithm. Such a field becomes part of the group's label for
  every task of that algorithm (``sppo actor_lr=0.001``); runs that differ in a setting are never pooled
  as seeds. The seeds of a group are its samples.
- Curves: each control run's ``success_rate`` is smoothed by a trailing mean over ``--smooth`` updates,
  then interpolated linearly onto a common grid of ``--grid-points`` x values (episodes, or wall-clock
  seconds); at each x the mean over the runs that reach that x is drawn with a 95% Student-t interval
  over them (where at least two do), clipped to [0, 1]. LLM runs: ``val_accuracy`` (not smoothed)
  against updates, generated tokens and training seconds, the same way. Up to ``--max-overlay``
  algorithms share a panel; with more, each has its own panel with the others in grey behind it.
- Table: final success (mean of the raw ``success_rate`` over the last ``--final-frac`` of a run's updates;
  mean and 95% t-interval over seeds, clipped to [0, 1]), its interquartile mean over seeds with a 95%
  bootstrap interval, episodes to reach each threshold (the first crossing of the raw, unsmoothed
  ``success_rate``, interpolated between the two updates around it, :func:`protocol.crossing`; median
  over the seeds that reach it, with how many did), training wall time (``wall_time_s`` of
  the last row) and steps per second (``sps`` of the last row), both means over seeds. LLM runs: final
  validation accuracy (mean over the last ``--final-frac`` of the evaluations) the same way.
- Comparisons (:func:`comparisons`): per task with two labels or more, every pair of labels through
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
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.experiments import decision, protocol, stats, tail
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.figures import PRINT_WIDTH, save_figure
from sppo_rl.experiments.scaling import scaling_section
from sppo_rl.experiments.sweep import BOOKKEEPING
from sppo_rl.runtime.logging import json_safe, read_metrics
from sppo_rl.runtime.run import RunError
from sppo_rl.runtime.trace import TRACE_FILE, load_trace

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
    "gspo": "#005a32",
    "sppo-seq": "#fb6a4a",
    "cispo": "#3f007d",
    "reinforce++": "#ae017e",
    "reinforce++-baseline": "#e6ab02",
    "latent-grpo": "#e7298a",
    "latent-grpo-naive": "#66a61e",
    "opo": "#fdae6b",
    "opo-batch": "#a6761d",
    "spo": "#08519c",
    "shrinkage": "#a50f15",
}
EXTRA = ["#393b79", "#637939", "#8c6d31", "#843c39"]
LINESTYLES = ["-", "--", ":", "-."]
GREY = "0.75"  # the other algorithms behind the one a small-multiples panel is about  # the settings of one algorithm, in label order
X_AXES = {"episodes": "episodes", "wall_time_s": "wall-clock seconds (training)"}
LLM_X_AXES = {
    "step": "updates",
    "generated_tokens": "generated tokens (training rollouts)",
    "wall_time_s": "wall-clock seconds (training)",
}
WORLDS = {"control": "final success", "llm": "final validation accuracy"}
PROFILE_TAUS = np.linspace(0.0, 1.0, 101)
# config fields that change no result (or that a run derives from the others): never a reason to split a
# group. The sweep's bookkeeping, the seed, free-form tags, the resolved values (they follow from the
# config), and where / on what / how verbosely a run computes.
IGNORED = BOOKKEEPING | {
    "seed",
    "extra",
    "resolved",
    "cache_dir",
    "device",
    "collective_timeout",
    "gradient_checkpointing",
    "vllm_gpu_memory_utilization",
    "vllm_sleep",
    "eval_samples",
}


@dataclass
class Run:
    path: Path
    task: str
    algo: str
    seed: int
    finished: bool
    config: dict[str, Any]
    rows: list[dict[str, Any]]  # the score rows: success_rate (control) or val_accuracy (LLM)
    calibration: dict[str, list[float]] | None
    world: str = "control"  # "control" or "llm"
    last: dict[str, Any] = field(default_factory=dict)  # the last metrics row of any kind
    label: str = ""  # algo and the settings that tell its groups apart (see label_runs)
    settings: dict[str, Any] = field(default_factory=dict)
    content: tuple[str, str] | None = (
        None  # LLM data files' hashes (training, validation): the task's identity
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


NUMBER_KEYS = (
    "update",
    "step",
    "episodes",
    "success_rate",
    "val_accuracy",
    "wall_time_s",
    "sps",
    "generated_tokens",
)
"""The metrics the report reads as numbers: in every row that has one, a finite number (or null)."""


def _bad_value(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> str | None:
    """Why a run cannot be reported (a value of :data:`NUMBER_KEYS` that is no finite number, as NaN
    or a list; a row that is no object; a seed that is no integer), naming the row; None if it can."""
    seed = cfg.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        return f"config.json: seed is {seed!r:.40}, not an integer"
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            return f"row {i} is {type(row).__name__}, not an object"
        for key in NUMBER_KEYS:
            value = row.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"row {i}: {key} is {value!r:.40}, not a finite number"
    return None


def find_runs(inputs: tuple[str, ...], skip: Path | None = None) -> list[Run]:
    """Every folder under ``inputs`` with ``metrics.jsonl`` and a readable ``config.json``, labelled
    (:func:`label_runs`). A run whose metrics hold a value the report cannot read as a number
    (:func:`_bad_value`: NaN, a list) is skipped, with one line on stderr naming its file and row."""
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
            rows = read_metrics(metrics)
            bad = _bad_value(rows, cfg)
            if bad is not None:
                print(f"report: skipped {metrics}: {bad}", file=sys.stderr)
                continue
            success = [r for r in rows if r.get("success_rate") is not None]
            evals = [r for r in rows if r.get("val_accuracy") is not None]
            if success or evals:
                world = "control" if success else "llm"
            else:  # nothing logged yet: the config says which world
                world = "llm" if "prompts_per_step" in cfg else "control"
            cal = _read_json(folder / "calibration.json")
            runs.append(
                Run(
                    path=folder,
                    task=(cfg.get("resolved") or {}).get("task", cfg.get("task", "?")),
                    algo=cfg["algo"],
                    seed=int(cfg.get("seed", 0)),
                    finished=(folder / "summary.json").is_file(),
                    config=cfg,
                    rows=success if world == "control" else evals,
                    calibration=cal if isinstance(cal, dict) and cal.get("predicted") else None,
                    world=world,
                    last=rows[-1] if rows else {},
                )
            )
    name_tasks_by_content(runs)
    label_runs(runs)
    return runs


def data_hash(path: str | Path, prompt_key: str | None = None, answer_key: str | None = None) -> str | None:
    """The first 12 hex digits of the SHA-256 of a data file's examples, read as the LLM trainer reads
    them (prompt, answer; every record in file order): the same data as ``.parquet``, ``.jsonl`` or
    ``.json`` has one hash. None when the file cannot be read (moved, or not data)."""
    import hashlib

    from sppo_rl.llm.data.files import load_examples

    try:
        examples = load_examples(path, prompt_key=prompt_key, answer_key=answer_key, max_chars=None)
    except (OSError, ValueError):
        return None
    text = json.dumps([[e.prompt, e.answer] for e in examples], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _content_key(run: Run, hashes: dict[tuple, str | None]) -> tuple[str | None, str] | None:
    """``(training data hash, validation data hash or '')`` of an LLM run whose ``--task`` is a data
    file (None for a generated task, or a file that cannot be read)."""
    cfg = run.config

    def of(path: Any) -> str | None:
        if not path:
            return ""
        key = (str(path), cfg.get("prompt_key"), cfg.get("answer_key"))
        if key not in hashes:
            hashes[key] = data_hash(*key) if Path(path).is_file() else None
        return hashes[key]

    train = of(cfg.get("task"))
    val = of(cfg.get("val_data"))
    return None if not train or val is None else (train, val)


def name_tasks_by_content(runs: list[Run]) -> None:
    """LLM runs on the same data are one task whatever its file's name or format: each run whose
    ``--task`` (and ``--val-data``) is a readable data file gets as ``task`` the stem of the first such
    file (by path) with that content, with ``#<hash>`` appended where two contents share a stem."""
    hashes: dict[tuple, str | None] = {}
    keys = {id(r): _content_key(r, hashes) for r in runs if r.world == "llm"}
    firsts: dict[tuple, str] = {}
    for r in sorted((r for r in runs if keys.get(id(r))), key=lambda r: str(r.config.get("task"))):
        firsts.setdefault(keys[id(r)], Path(str(r.config["task"])).stem)
    stems = defaultdict(set)
    for key, stem in firsts.items():
        stems[stem].add(key)
    for r in runs:
        key = keys.get(id(r))
        if key:
            r.content = key
            stem = firsts[key]
            r.task = stem if len(stems[stem]) == 1 else f"{stem}#{key[0][:8]}"


def _same(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def effective(run: Run, key: str) -> Any:
    """A setting's value as the run used it: a field left at None ("the default") counts as the value the
    run resolved it to (``config.json``'s ``resolved``, e.g. ``group_size``), so that leaving a default
    and spelling it out are the same setting."""
    if run.content is not None and key in ("task", "val_data"):  # the data's content, not its file's name
        return run.content[0 if key == "task" else 1]
    value = run.config.get(key)
    resolved = run.config.get("resolved")
    if value is None and isinstance(resolved, dict) and key in resolved:
        return resolved[key]
    return value


def setting_keys(runs: list[Run]) -> list[str]:
    """The config keys that tell these runs (one algorithm of one world) apart: keys that every run's config
    has (a setting added by a later version is left out), other than :data:`IGNORED`, whose value
    (:func:`effective`) differs between two runs of the same task. A key that only differs between tasks
    (e.g. the budget of each task) is not one."""
    if not runs:
        return []
    keys = set.intersection(*(set(r.config) for r in runs)) - IGNORED
    by_task: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_task[r.task].append(r)
    return sorted(
        k for k in keys if any(len({_same(effective(r, k)) for r in rs}) > 1 for rs in by_task.values())
    )


def _setting(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def label_runs(runs: list[Run]) -> None:
    """Set each run's ``settings`` (its values of :func:`setting_keys` over the runs with rows of its world
    and algorithm) and ``label`` (``"sppo actor_lr=0.001"``; the bare algorithm where nothing differs)."""
    by_algo: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        by_algo[r.world, r.algo].append(r)
    for members in by_algo.values():
        keys = setting_keys([r for r in members if r.rows])
        for r in members:
            r.settings = {k: effective(r, k) for k in keys}
            r.label = " ".join([r.algo] + [f"{k}={_setting(v)}" for k, v in r.settings.items()])


def algo_order(algos) -> list[str]:
    known = [a for a in PALETTE if a in algos]
    return known + sorted(set(algos) - set(known))


def _sortable(value: Any) -> tuple:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, 0.0, _same(value))
    return (0, float(value), "")


def label_order(runs: list[Run]) -> list[str]:
    """Labels by algorithm (:func:`algo_order`), then by their settings' values (numbers by value)."""
    rank = {a: i for i, a in enumerate(algo_order({r.algo for r in runs}))}
    first = {}
    for r in runs:
        first.setdefault(r.label, r)
    return sorted(
        first, key=lambda lb: (rank[first[lb].algo], [_sortable(v) for v in first[lb].settings.values()])
    )


def colours(algos) -> dict[str, str]:
    others = sorted(set(algos) - set(PALETTE))
    return {**PALETTE, **{a: EXTRA[i % len(EXTRA)] for i, a in enumerate(others)}}


def _shade(colour: str, i: int) -> str:
    """The i-th variant of an algorithm's colour (0: itself; then darker, lighter, ...)."""
    from matplotlib.colors import to_hex, to_rgb

    if i == 0:
        return colour
    rgb = np.array(to_rgb(colour))
    f = 0.55 ** ((i + 1) // 2)
    return to_hex(rgb * f if i % 2 else 1 - (1 - rgb) * f)


def styles(runs: list[Run], labels: list[str]) -> dict[str, tuple[str, str]]:
    """(colour, line style) of each label: its algorithm's colour; the algorithm's further settings in
    other shades and line styles."""
    algo = {r.label: r.algo for r in runs}
    colour = colours(set(algo.values()))
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for label in labels:
        i = seen[algo[label]]
        seen[algo[label]] += 1
        out[label] = (_shade(colour[algo[label]], i), LINESTYLES[i % len(LINESTYLES)])
    return out


def _col(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([r.get(key, math.nan) for r in rows], dtype=float)


def run_numbers(run: Run, cfg: ReportConfig) -> dict[str, Any]:
    """Per-run numbers of a control run (see the module docstring)."""
    y = _col(run.rows, "success_rate")
    eps = _col(run.rows, "episodes")
    last = run.rows[-1]
    final = protocol.final_value(y, cfg.final_frac)
    return {
        **_identity(run),
        "updates": len(run.rows),
        "episodes": last.get("episodes"),
        "final_success": final,
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
    """Per-run numbers of an LLM run: final validation accuracy (mean over the last ``final_frac`` of its
    evaluations, at least one), and updates, generated tokens and training seconds of its last row."""
    y = _col(run.rows, "val_accuracy")
    final = protocol.final_value(y, cfg.final_frac)
    return {
        **_identity(run),
        "evaluations": len(run.rows),
        "updates": run.last.get("step"),
        "start_val_accuracy": float(y[0]),
        "final_val_accuracy": final,
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
        "task": per_run[0]["task"],
        "algo": per_run[0]["algo"],
        "label": per_run[0]["label"],
        "world": "control",
        "seeds": len(per_run),
        "finished": sum(r["finished"] for r in per_run),
        **score_numbers([r["final_success"] for r in per_run], cfg, "final_success"),
        "episodes_to": reach,
        "wall_time_s": _nanmean(r["wall_time_s"] for r in per_run),
        "sps": _nanmean(r["sps"] for r in per_run),
    }


def llm_group_numbers(per_run: list[dict[str, Any]], cfg: ReportConfig) -> dict[str, Any]:
    return {
        "task": per_run[0]["task"],
        "algo": per_run[0]["algo"],
        "label": per_run[0]["label"],
        "world": "llm",
        "seeds": len(per_run),
        "finished": sum(r["finished"] for r in per_run),
        "evaluations": min(r["evaluations"] for r in per_run),
        "updates": _nanmean(r["updates"] for r in per_run),
        "start_val_accuracy_mean": _nanmean(r["start_val_accuracy"] for r in per_run),
        **score_numbers([r["final_val_accuracy"] for r in per_run], cfg, "final_val_accuracy"),
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
    cols = [_col(run.rows, k) for k in ("wall_time_s", "generated_tokens", "step", "val_accuracy")]
    evals = [r for r in run.rows if r.get("val_accuracy") is not None]
    logged = evals and all(r.get("flops_total") is not None for r in evals)
    return protocol.Curve(*cols, flops=_col(run.rows, "flops_total") if logged else None)


def comparisons(runs: list[Run], world: str, cfg: ReportConfig) -> list[dict[str, Any]]:
    """Per task of ``world`` with two labels or more, the comparison protocol
    (:func:`sppo_rl.experiments.protocol.protocol`) over the labels' per-seed raw curves (control:
    ``success_rate`` per update against training seconds and episodes; LLM: ``val_accuracy`` against
    training seconds and generated tokens), the target by the protocol's pooled rule, every pair ``(A,
    B)`` of labels with A before B in :func:`label_order`, ``--bootstrap-reps`` paired resamples seeded
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
    declared = (_read_json(manifest) or {}).get("config", {}) if manifest.is_file() else {}
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


# ------------------------------------------------------------------------------------- figures


INTEGER_X = {"episodes", "step", "generated_tokens"}
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
    """A figure :data:`PRINT_WIDTH` wide of ``rows x cols`` panels, each ``aspect`` times as high as wide
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
    with too few runs for one (:data:`MIN_RUNS`) is a dot marked ``n=k``."""
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


# ------------------------------------------------------------------------------------- text


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ci(value: float, ci: list[float], fmt: str = ".3f", n: int | None = None) -> str:
    """``value [lo, hi]``; the value alone where there is no interval, with ``(n = 2: no interval)``
    where ``n`` runs are too few for one (:data:`MIN_RUNS`)."""
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
            "| task | algo | seeds | final success [95% t-CI] | IQM [95% bootstrap CI] | "
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
            f"| {g['task']} | {g['label']} | {_seeds(g)} | {_ci(g['final_success_mean'], g['final_success_ci'], n=g['seeds'])} | "
            f"{_ci(g['iqm'], g['iqm_ci'], n=g['seeds'])} | "
            + " | ".join(reach)
            + f" | {_num(g['wall_time_s'], '.1f')} | {_num(g['sps'], '.0f')} |"
        )
    if groups:
        lines += _clipped_note(groups, "final_success")
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
            "| task | algo | seeds | evaluations | updates | start val accuracy | final val accuracy [95% t-CI] "
            "| IQM [95% bootstrap CI] | generated tokens | wall s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for g in llm:
            lines.append(
                f"| {g['task']} | {g['label']} | {_seeds(g)} | {g['evaluations']} | {_num(g['updates'], '.0f')} | "
                f"{_num(g['start_val_accuracy_mean'], '.3f')} | "
                f"{_ci(g['final_val_accuracy_mean'], g['final_val_accuracy_ci'], n=g['seeds'])} | "
                f"{_ci(g['iqm'], g['iqm_ci'], n=g['seeds'])} | "
                f"{_num(g['generated_tokens'], '.0f')} | {_num(g['wall_time_s'], '.1f')} |"
            )
        lines += _clipped_note(llm, "final_val_accuracy")
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
    return "\n".join(_with_captions(lines, report.get("captions", {}))) + "\n"


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
            "final success": f"per run, the mean raw success_rate over its last {cfg.final_frac:.0%} of updates "
            "(at least one); the control score; table: mean [t-interval] and IQM [bootstrap CI] over seeds",
            "episodes to x": "per run, the first episode count where the raw (unsmoothed) success_rate reaches "
            "x, interpolated linearly between the two updates around it (protocol.crossing); table: median "
            "over the seeds that reach it (reached/seeds); — if none",
            "wall s, steps/s": "training time (wall_time_s) and env steps per second (sps) of each run's last "
            "metrics row, mean over seeds",
        }
    if llm:
        d |= {
            "final val accuracy": f"per LLM run, the mean val_accuracy over its last {cfg.final_frac:.0%} of "
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


def _groups(runs: list[Run]) -> list[tuple[str, str, list[Run]]]:
    """(task, label, seeds sorted) in task order, then label order."""
    order = label_order(runs)
    out = []
    for task in sorted({r.task for r in runs}):
        for label in order:
            members = sorted((r for r in runs if (r.task, r.label) == (task, label)), key=lambda r: r.seed)
            if members:
                out.append((task, label, members))
    return out


def run_report(cfg: ReportConfig) -> dict[str, Any]:
    """Entry point of ``sppo-rl report``: writes the figures, ``report.md`` and ``report.json``."""
    if not cfg.inputs:
        raise RunError("give at least one folder to read runs from")
    if (
        cfg.smooth < 1
        or not 0 < cfg.final_frac <= 1
        or cfg.calibration_bins < 1
        or cfg.grid_points < 2
        or cfg.bootstrap_reps < 1
        or cfg.max_overlay < 1
        or (cfg.margin is not None and not 0 < cfg.margin < 1)
    ):
        raise ValueError(
            "need --smooth >= 1, 0 < --final-frac <= 1, --calibration-bins >= 1, --grid-points >= 2, "
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
    per_run, groups, curves, cal = [], [], {}, {}
    for task, label, members in _groups(control):
        numbers = [run_numbers(r, cfg) for r in members]
        per_run += numbers
        groups.append({**group_numbers(numbers, cfg), "settings": members[0].settings})
        curves[task, label] = {x: curve(members, x, cfg) for x in X_AXES}
        calibrated = [r for r in members if r.calibration]
        if calibrated:
            cal[task, label] = calibration_numbers(calibrated, cfg.calibration_bins)
    llm_per_run, llm_groups, llm_curves = [], [], {}
    for task, label, members in _groups(llm):
        numbers = [llm_run_numbers(r, cfg) for r in members]
        llm_per_run += numbers
        llm_groups.append({**llm_group_numbers(numbers, cfg), "settings": members[0].settings})
        llm_curves[task, label] = {x: curve(members, x, cfg, "val_accuracy", smooth=1) for x in LLM_X_AXES}
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
        by_group = {lb if len(tasks) == 1 else f"{t}: {lb}": [r.rows for r in m] for t, lb, m in _groups(llm)}
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
        "curves": [
            {"task": t, "label": lb, "algo": _algo_of(runs, lb), **{x: c[x] for x in X_AXES}}
            for (t, lb), c in curves.items()
        ],
        "llm_curves": [
            {"task": t, "label": lb, "algo": _algo_of(runs, lb), **{x: c[x] for x in LLM_X_AXES}}
            for (t, lb), c in llm_curves.items()
        ],
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


def _with_captions(lines: list[str], caps: dict[str, str]) -> list[str]:
    """``lines`` with each figure's caption (``*...*``) after its image line."""
    out = []
    for line in lines:
        out.append(line)
        target = line.rpartition("](")[2].rstrip(")") if line.startswith("![") else ""
        if target in caps:
            out += ["", f"*{caps[target]}*"]
    return out


def _algo_of(runs: list[Run], label: str) -> str:
    return next(r.algo for r in runs if r.label == label)
