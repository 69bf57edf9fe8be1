"""Configs of ``sppo-rl sweep`` and ``sppo-rl report``.

Import-light on purpose (no torch / Gymnasium / matplotlib), so ``sppo-rl --help`` stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro
from tyro.constructors import PrimitiveConstructorSpec


def parse_pairs(tokens: list[str]) -> dict[str, str]:
    """``["a=1", "b=x y"]`` -> ``{"a": "1", "b": "x y"}`` (split at the first ``=``)."""
    out = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {token!r}")
        out[key] = value
    return out


def _pairs_spec(metavar: str, cast: type) -> PrimitiveConstructorSpec:
    return PrimitiveConstructorSpec(
        nargs="*",
        metavar=metavar,
        instance_from_str=lambda tokens: {k: cast(v) for k, v in parse_pairs(tokens).items()},
        is_instance=lambda x: isinstance(x, dict),
        str_from_instance=lambda d: [f"{k}={v}" for k, v in d.items()],
    )


Budgets = Annotated[dict[str, int], _pairs_spec("TASK=EPISODES", int)]
Overrides = Annotated[dict[str, str], _pairs_spec("FIELD=VALUE", str)]
Runs = Annotated[dict[str, str], _pairs_spec("NAME=FLAGS", str)]


@dataclass
class SweepConfig:
    """Algorithms x tasks x seeds of control runs (or named runs x seeds of LLM runs, --world llm), each
    its own sppo-rl control (llm) subprocess; resumable."""

    world: Literal["control", "llm"] = "control"
    """control: sppo-rl control runs, --algos x --tasks x --seeds, in <out_dir>/<task>/<algo>/seed<k>;
    llm: sppo-rl llm runs, --runs (or --algos) x --seeds, in <out_dir>/<name>/seed<k>."""
    algos: tuple[str, ...] = ("ppo", "sppo")
    """Algorithms (see ``sppo-rl info``)."""
    tasks: tuple[str, ...] = ("precision-cartpole",)
    """Task short names (see sppo_rl.envs.tasks.TASKS)."""
    seeds: tuple[int, ...] = tuple(range(10))
    """Seeds; each (task, algo, seed) is one run. Ten by default: a paired t-test on five seeds detects a
    difference of one seed standard deviation about a quarter of the time, on ten about half (on
    correlated seeds, all but always); ``scripts/power.py`` gives the count for a stated effect."""
    out_dir: str = "runs/sweep"
    """Sweep folder: sweep.json and one run folder per job, <out_dir>/<task>/<algo>/seed<k>."""
    total_episodes: int | None = None
    """Budget of every run in episodes (default: the control default)."""
    budgets: Budgets = field(default_factory=dict)
    """Per-task budgets that take precedence over --total-episodes, e.g. precision-cartpole=40000 hopper=20000."""
    overrides: Overrides = field(default_factory=dict)
    """Extra control settings for every run (ControlConfig fields), e.g. epochs=2 hidden-sizes=32,32
    tensorboard=false; tuple values are separated by commas or spaces, booleans are true or false."""
    runs: Runs = field(default_factory=dict)
    """LLM world: named runs, each NAME=FLAGS (its own sppo-rl llm flags), e.g. sppo="--algo sppo"
    grpo="--algo grpo --group-size 8"; none: one run per --algos, named after it (--algo NAME)."""
    llm_args: str = ""
    """LLM world: sppo-rl llm flags of every run, one string after each run's own, given with '=', e.g.
    --llm-args="--task scratchpad --updates 100" (not --seed, --out-dir, --resume, --overwrite, --progress)."""
    batch_seeds: bool = True
    """Control: all seeds of a (task, algorithm) in one process (sppo-rl control --seeds; seed k's run in
    <out_dir>/<task>/<algo>/seed<k>, bit for bit its run alone; the seeds share the process's seconds, so
    a seed's wall_time_s is its set's); a folder left by a per-seed sweep keeps one process per seed.
    --no-batch-seeds: one process per seed."""
    workers: int | None = None
    """Processes at a time (default: the number of CPU cores)."""
    backend: Literal["local", "ray"] = "local"
    """local: subprocesses of this process; ray: each run's subprocess is started by a Ray task."""
    ray_address: str | None = None
    """Ray cluster to use with --backend ray: an address, 'local' (start a fresh local instance with
    --workers CPUs), or None (ray.init()'s default: RAY_ADDRESS or a running cluster, else a local one)."""
    progress: bool = True
    """Print a line as each run ends."""
    primary: str | None = None
    """The comparison's primary statistic, declared before the runs and kept in sweep.json for
    ``sppo-rl report`` (e.g. acc_at_env_steps; default: accuracy at equal compute, i.e. env steps for
    control runs, FLOPs for LLM runs that log them, else generated tokens); every other is secondary."""
    margin: float = 0.05  # sppo_rl.experiments.decision.MARGIN (this module stays import-light)
    """Equivalence margin of an accuracy (success) difference, declared before the runs: 'equivalent
    within +-margin' is printed only when a TOST shows it."""


@dataclass
class ReportConfig:
    """Plots and tables from run folders (a sweep folder, or any folders with metrics.jsonl + config.json)."""

    inputs: tyro.conf.Positional[tuple[str, ...]]
    """Folders searched recursively for runs."""
    out: str | None = None
    """Output folder (default: <first input>/report)."""
    smooth: int = 5
    """Trailing moving-average window, in updates, applied to each run's success-rate curve."""
    tail_frac: float = 0.1  # sppo_rl.runtime.curves.TAIL_FRAC (this module stays import-light)
    """'Tail' of a run (the protocol's, shared with sweep and compare_llm): mean success_rate (LLM:
    val_accuracy) over this last fraction of its updates (evaluations), at least one."""
    thresholds: tuple[float, ...] = (0.5, 0.9)
    """Success levels for 'episodes to reach' (first episode count where the smoothed curve is >= it)."""
    calibration_bins: int = 10
    """Equal-width bins on [0, 1] for the expected calibration error and the reliability diagram."""
    grid_points: int = 200
    """Points of the common x grid onto which each run is interpolated before averaging over seeds."""
    bootstrap_reps: int = 2000
    """Stratified-bootstrap resamples behind every IQM / aggregate interval and performance-profile band."""
    bootstrap_seed: int = 0
    """Seed of the bootstrap (the same seed gives the same intervals)."""
    primary: str | None = None
    """The primary statistic of the comparisons (default: what the sweep.json of the first input declared,
    else accuracy at equal compute: env steps for control runs, FLOPs for LLM runs that log them, else
    generated tokens); every other statistic is printed as secondary."""
    margin: float | None = None
    """Equivalence margin of an accuracy difference (default: the sweep.json's, else 0.05)."""
    max_overlay: int = 4
    """Up to this many algorithms (settings) share a panel; with more, each gets its own panel, the
    others drawn in grey behind it."""
