"""Learning peer: Stable-Baselines3's PPO trained from the same warm start as this project's runs, with
the episodes and wall-clock seconds each needs to reach a success rate of 0.5 and 0.9.

For each task of ``--tasks`` and seed of ``--seeds``, SB3's PPO trains on the task's sparse terminal
reward (1 for a success at the episode's end, else 0) for the same episode budget as ours
(``--budgets TASK=EPISODES``):

- same networks: 64-64 tanh actor and critic; the actor starts from the task's shipped warm start, our
  observation normalisation folded exactly into its first layer (``W' = W / sd``,
  ``b' = b - W mu / sd``; ``load_warmstart_into_sb3`` of ``scripts/bench_throughput.py``); the critic
  starts from SB3's own initialisation, as ours starts from its own;
- same rollout and update shape: ``E`` envs (our episodes per update: 64 PrecisionCartPole, 8
  SparseHopper) x ``n_steps``, where ``E x n_steps`` is the env steps of one update of ours at the warm
  start (one batch of ``E`` warm-start episodes, measured; ``--n-steps`` overrides it); 4 epochs of 4
  minibatches (``batch_size = E x n_steps / 4``); ``gamma = 1`` and GAE ``lambda = 0.95`` as our PPO;
- everything else is SB3's default: one Adam with learning rate 3e-4 for both networks, clip 0.2, value
  coefficient 0.5, no entropy bonus, gradient norm 0.5, advantages normalised per minibatch.

Success is read per episode from the environment itself: the task's ``success`` flag in the ``info`` of the
step that ends the episode (a done env without that flag is an error, never counted as a success). SB3
finishes episodes in a stream, ours in batches of ``E``; so SB3's episodes, in the order they end, are cut
into consecutive blocks of ``E`` (a trailing partial block is dropped), and each block is one row of
``metrics.jsonl`` as ours logs per update: ``episodes`` (the count so far), ``success_rate`` (the
block's mean), ``wall_time_s`` (training seconds when its last episode ended), ``env_steps``, ``sps``.
From there both are measured with the same functions as ``sppo-rl report``
(:func:`sppo_rl.experiments.report_numbers.run_numbers` and ``group_numbers``), crossings included: "episodes to x"
is :func:`sppo_rl.experiments.protocol.crossing` of the raw (unsmoothed) per-row success rate against
``episodes``: ``e_0`` if ``y_0 >= x``, else ``e_{j-1} + (x - y_{j-1}) / (y_j - y_{j-1}) (e_j - e_{j-1})`` for
the first row ``j`` with ``y_j >= x``, None if no row reaches x; "wall s to x" is the same crossing read on
``wall_time_s``; "tail success" the mean raw success over the last ``--tail-frac`` of the rows (at least
one). (Until this version the script read the first row of a trailing mean over ``--smooth`` rows, which
lags the raw curve by about half the window; ``--smooth`` is now refused.)

Ours: every run of ``--algos`` (default ppo, sppo) for these tasks and seeds under the ``--ours``
folders (a sweep's ``<dir>/<task>/<algo>/seed<k>``, any folder with ``metrics.jsonl`` and
``config.json``), and/or, with ``--run-ours``, ``sppo-rl sweep`` runs with the same budgets (resumable:
finished runs are kept), one at a time on one thread, one process per seed (``--no-batch-seeds``: the
seeds of a batched sweep share their process's seconds, and the wall-clock columns set each run against
one SB3 process), in ``<out>/ours``; ``--overrides FIELD=VALUE``
passes control settings to them (e.g. the smaller after-training evaluations of the study's Hopper runs).

    python scripts/peer_sb3.py --tasks precision-cartpole hopper --seeds 0 1 2 \\
        --budgets precision-cartpole=6400 hopper=800 --run-ours --out runs/peer_sb3 \\
        --overrides calibration-contexts=32 calibration-samples=8 eval-episodes=32
    python scripts/peer_sb3.py --tasks hopper --seeds 0 --budgets hopper=800 --ours runs/study/c --out runs/peer

Written to ``--out``: ``sb3/<task>/seed<k>/`` per SB3 run (``config.json``, ``metrics.jsonl``,
``episodes.json``, ``summary.json``; ``sppo-rl report`` reads these folders too, as algorithm
``sb3-ppo``; a finished run with the same settings is reused, ``--fresh`` retrains it), ``peer_sb3.md``
(the table, also printed) and ``peer_sb3.json`` (every number; its compact form is the last line printed).
Table columns: per task and algorithm, episodes to 0.5 and 0.9 (median over the seeds that reach it,
[min-max], reached/seeds), wall-clock seconds to 0.9 (the same), tail success (mean +- 95% t half-width
over seeds) and training seconds per 1,000 episodes (mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

SB3_ALGO = "sb3-ppo"
EPOCHS, MINIBATCHES = 4, 4  # ours' control defaults (ControlConfig.epochs / minibatches)
GAMMA, GAE_LAMBDA = 1.0, 0.95  # ours' PPO defaults (RunConfig.gamma, ControlConfig.lam)


class UsageError(ValueError):
    """Bad command-line input: reported in one line, exit status 2, before any file is touched."""


# ------------------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="peer_sb3.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["precision-cartpole", "hopper"], help="task short names")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument(
        "--budgets", nargs="+", default=[], metavar="TASK=EPISODES", help="episode budget of every task"
    )
    ap.add_argument("--algos", nargs="+", default=["ppo", "sppo"], help="our algorithms to put beside SB3")
    ap.add_argument("--ours", nargs="*", default=[], metavar="DIR", help="folders holding our runs")
    ap.add_argument("--run-ours", action="store_true", help="train ours too (sppo-rl sweep into <out>/ours)")
    ap.add_argument(
        "--overrides",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="with --run-ours: control settings for our runs (as sppo-rl sweep --overrides)",
    )
    ap.add_argument("--skip-sb3", action="store_true", help="only our runs (e.g. to time them)")
    ap.add_argument(
        "--n-steps", type=int, default=None, help="SB3 steps per env per rollout (default: measured)"
    )
    ap.add_argument(
        "--smooth", type=int, default=None, help=argparse.SUPPRESS
    )  # removed: refused in validate
    ap.add_argument("--tail-frac", type=float, default=0.1, help="tail success: last fraction of the rows")
    ap.add_argument("--fresh", action="store_true", help="retrain SB3 runs that finished before")
    ap.add_argument("--out", default="runs/peer_sb3", help="output folder")
    return ap.parse_args(argv)


def parse_budgets(tokens: list[str]) -> dict[str, int]:
    """``["hopper=800"]`` -> ``{"hopper": 800}``; anything else raises :class:`UsageError`."""
    out: dict[str, int] = {}
    for token in tokens:
        task, sep, value = token.partition("=")
        try:
            episodes = int(value)
        except ValueError:
            episodes = None
        if not sep or not task or episodes is None:
            raise UsageError(f"--budgets: expected TASK=EPISODES (an integer), got {token!r}")
        out[task] = episodes
    return out


def validate(args: argparse.Namespace) -> dict[str, int]:
    """Every input checked before any file is touched; returns the budget of each task (short names)."""
    from sppo_rl.agents.algorithms import get_algorithm
    from sppo_rl.control.actor_files import WARMSTART_DIR
    from sppo_rl.envs.tasks import get_task

    budgets_in = parse_budgets(args.budgets)
    names = []
    for task in args.tasks:
        try:
            spec = get_task(task)
        except ValueError as e:
            raise UsageError(f"--tasks: {e}") from None
        if not (WARMSTART_DIR / f"{spec.name}.pt").is_file():
            raise UsageError(f"--tasks: {spec.name} has no shipped warm start ({WARMSTART_DIR})")
        names.append((task, spec))
    if len({s.name for _, s in names}) != len(names):
        raise UsageError("--tasks: a task is given twice")
    if len(set(args.seeds)) != len(args.seeds) or any(s < 0 for s in args.seeds):
        raise UsageError(f"--seeds: distinct integers >= 0, got {args.seeds}")
    budgets = {}
    for task, spec in names:
        given = [budgets_in[k] for k in (task, spec.name, spec.env_id) if k in budgets_in]
        if not given:
            raise UsageError(f"--budgets: no budget for {spec.name} (give {spec.name}=EPISODES)")
        if given[0] < spec.episodes_per_update:
            raise UsageError(
                f"--budgets: {spec.name}={given[0]} is less than one update ({spec.episodes_per_update} episodes)"
            )
        budgets[spec.name] = given[0]
    known = {k for task, spec in names for k in (task, spec.name, spec.env_id)}
    stray = sorted(set(budgets_in) - known)
    if stray:
        raise UsageError(f"--budgets: {', '.join(stray)} not in --tasks")
    for algo in args.algos:
        try:
            get_algorithm(algo)
        except ValueError as e:
            raise UsageError(f"--algos: {e}") from None
    for d in args.ours:
        if not Path(d).is_dir():
            raise UsageError(f"--ours: {d}: no such folder")
    if args.overrides:
        from sppo_rl.experiments.config import parse_pairs
        from sppo_rl.experiments.sweep import control_flags, parse_control

        if not args.run_ours:
            raise UsageError("--overrides applies to --run-ours only")
        try:
            parse_control(control_flags(parse_pairs(args.overrides)))
        except ValueError as e:
            raise UsageError(str(e).splitlines()[0]) from None
    if args.skip_sb3 and not (args.ours or args.run_ours):
        raise UsageError("--skip-sb3 leaves nothing to compare: give --ours DIR or --run-ours")
    if args.n_steps is not None and args.n_steps < 1:
        raise UsageError(f"--n-steps must be >= 1, got {args.n_steps}")
    if args.smooth is not None:
        raise UsageError(
            "--smooth was removed: crossings are the report's, interpolated between raw rows (protocol.crossing)"
        )
    if not 0 < args.tail_frac <= 1:
        raise UsageError(f"--tail-frac must be in (0, 1], got {args.tail_frac}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out: {args.out} is a file")
    return budgets


# ------------------------------------------------------------------------------------- success per episode


def episode_outcomes(dones, infos) -> list[float]:
    """Success (1.0 / 0.0) of every episode that ended at this vector step, in env order: the task's
    ``success`` flag in the info of each env whose ``done`` is set. A done env whose info lacks a boolean
    ``success`` raises ``ValueError`` (the env broke its contract; nothing is guessed or paid)."""
    out = []
    for i in np.flatnonzero(np.asarray(dones, dtype=bool)):
        flag = infos[i].get("success")
        if not isinstance(flag, bool | np.bool_):
            raise ValueError(f"env {i} ended an episode without a boolean 'success' in its info: {flag!r}")
        out.append(1.0 if flag else 0.0)
    return out


def update_rows(
    success: list[float], wall_time_s: list[float], env_steps: list[int], per_update: int
) -> list[dict[str, Any]]:
    """Episodes in the order they ended, cut into consecutive blocks of ``per_update`` (a trailing partial
    block is dropped), one row per block as ours logs per update: ``update`` k (from 1), ``episodes``
    ``k * per_update``, ``success_rate`` the block's mean, ``wall_time_s`` and ``env_steps`` when its last
    episode ended, ``sps = env_steps / wall_time_s``."""
    rows = []
    for k in range(len(success) // per_update):
        lo, hi = k * per_update, (k + 1) * per_update
        wall, steps = float(wall_time_s[hi - 1]), int(env_steps[hi - 1])
        rows.append(
            {
                "update": k + 1,
                "episodes": hi,
                "env_steps": steps,
                "success_rate": float(np.mean(success[lo:hi])),
                "wall_time_s": wall,
                "sps": steps / max(wall, 1e-9),
            }
        )
    return rows


# ------------------------------------------------------------------------------------- SB3


def steps_per_update(task: str, batches: int = 4) -> int:
    """Mean env steps of one batch of ``E`` warm-start episodes (one update's rollout of ours at the start),
    over ``batches`` batches with sampled actions and fixed start states (seeds 0, 1, ...), so that every
    seed of a task gets the same SB3 rollout size."""
    import torch

    from sppo_rl.control.actor_files import WARMSTART_DIR, load_actor_file
    from sppo_rl.control.rollout import collect
    from sppo_rl.envs.tasks import get_task, make_episode_env

    spec = get_task(task)
    E = spec.episodes_per_update
    actor = load_actor_file(WARMSTART_DIR / f"{spec.name}.pt")
    env = make_episode_env(spec.name, num_envs=E)
    gen = torch.Generator().manual_seed(0)
    total = 0
    for b in range(batches):
        ep = collect(env, actor, np.arange(b * E, (b + 1) * E), spec.horizon, generator=gen)
        total += int(ep.lengths.sum())
    env.close()
    return round(total / batches)


def sb3_settings(task: str, seed: int, budget: int, n_steps: int) -> dict[str, Any]:
    """The SB3 run's config (saved as ``config.json``; a finished run with the same one is reused)."""
    import stable_baselines3

    from sppo_rl.envs.tasks import get_task

    spec = get_task(task)
    E = spec.episodes_per_update
    rollout = E * n_steps
    return {
        "algo": SB3_ALGO,
        "task": spec.name,
        "seed": seed,
        "total_episodes": math.ceil(budget / E) * E,  # whole updates, as ours
        "episodes_per_update": E,
        "init_from": "warmstart",
        "n_envs": E,
        "n_steps": n_steps,
        "batch_size": max(1, rollout // MINIBATCHES),
        "n_epochs": EPOCHS,
        "gamma": GAMMA,
        "gae_lambda": GAE_LAMBDA,
        "learning_rate": 3e-4,
        "clip_range": 0.2,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "normalize_advantage": True,
        "net_arch": [64, 64],
        "activation": "tanh",
        "threads": 1,
        "sb3_version": stable_baselines3.__version__,
    }


def make_sb3(settings: dict[str, Any]):
    """SB3's PPO on ``n_envs`` copies of the task with ``settings``, its actor loaded from the warm start."""
    import gymnasium as gym
    import torch
    from bench_throughput import load_warmstart_into_sb3
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from sppo_rl.envs.tasks import get_task

    spec = get_task(settings["task"])
    env = make_vec_env(lambda: gym.make(spec.env_id), n_envs=settings["n_envs"])
    keys = ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "learning_rate", "clip_range")
    keys += ("ent_coef", "vf_coef", "max_grad_norm", "normalize_advantage")
    width = list(settings["net_arch"])
    model = PPO(
        "MlpPolicy",
        env,
        **{k: settings[k] for k in keys},
        policy_kwargs=dict(net_arch=dict(pi=width, vf=width), activation_fn=torch.nn.Tanh),
        device="cpu",
        seed=settings["seed"],
        verbose=0,
    )
    load_warmstart_into_sb3(model, spec.name)
    return model


def train_sb3(settings: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    """Train until ``total_episodes`` episodes have ended; write the run folder; return its rows."""
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    budget = settings["total_episodes"]
    success: list[float] = []
    wall: list[float] = []
    steps: list[int] = []

    class Recorder(BaseCallback):
        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            ended = episode_outcomes(self.locals["dones"], self.locals["infos"])
            now = time.perf_counter() - self.t0
            success.extend(ended)
            wall.extend([now] * len(ended))
            steps.extend([self.num_timesteps] * len(ended))
            return len(success) < budget

    model = make_sb3(settings)
    model.learn(total_timesteps=10**12, callback=Recorder())
    model.get_env().close()
    success, wall, steps = success[:budget], wall[:budget], steps[:budget]
    rows = update_rows(success, wall, steps, settings["episodes_per_update"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(settings, indent=1) + "\n")
    (folder / "episodes.json").write_text(
        json.dumps({"success": success, "wall_time_s": wall, "env_steps": steps}) + "\n"
    )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "algo": SB3_ALGO,
        "task": settings["task"],
        "seed": settings["seed"],
        "episodes": len(success),
        "env_steps": steps[-1] if steps else 0,
        "wall_time_s": wall[-1] if wall else 0.0,
        "sb3_version": stable_baselines3.__version__,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return rows


def sb3_run(task: str, seed: int, budget: int, n_steps: int, out: Path, fresh: bool):
    """One SB3 run as a report :class:`~sppo_rl.experiments.report_runs.Run` (reused when finished with the same
    settings and not ``fresh``)."""
    from sppo_rl.envs.tasks import get_task
    from sppo_rl.experiments.report_runs import Run
    from sppo_rl.runtime.logging import read_metrics

    spec = get_task(task)
    settings = sb3_settings(spec.name, seed, budget, n_steps)
    folder = out / "sb3" / spec.name / f"seed{seed}"
    saved = folder / "config.json"
    reuse = (
        not fresh
        and (folder / "summary.json").is_file()
        and saved.is_file()
        and json.loads(saved.read_text()) == settings
    )
    if reuse:
        rows = read_metrics(folder / "metrics.jsonl")
        print(f"{spec.name} {SB3_ALGO} seed {seed}: reusing {folder}", file=sys.stderr)
    else:
        print(
            f"{spec.name} {SB3_ALGO} seed {seed}: training ({settings['n_envs']} envs x {n_steps} steps)",
            file=sys.stderr,
        )
        rows = train_sb3(settings, folder)
    return Run(
        path=folder,
        task=spec.name,
        algo=SB3_ALGO,
        seed=seed,
        finished=True,
        config=settings,
        rows=rows,
        calibration=None,
        label=SB3_ALGO,
    )


# ------------------------------------------------------------------------------------- ours


def run_ours(args: argparse.Namespace, budgets: dict[str, int], out: Path) -> Path:
    """``sppo-rl sweep`` of ``--algos`` x tasks x seeds with the same budgets, one run at a time, a process
    per seed (its wall-clock seconds its own, as an SB3 run's are)."""
    folder = out / "ours"
    cmd = [sys.executable, "-m", "sppo_rl", "sweep", "--algos", *args.algos, "--tasks", *budgets]
    cmd += ["--seeds", *map(str, args.seeds), "--budgets", *(f"{t}={b}" for t, b in budgets.items())]
    cmd += ["--out-dir", str(folder), "--workers", "1", "--no-progress", "--no-batch-seeds"]
    cmd += ["--overrides", *args.overrides] if args.overrides else []
    print("ours: " + " ".join(cmd[1:]), file=sys.stderr)
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"peer_sb3.py: sppo-rl sweep failed ({proc.returncode}); see {folder}")
    return folder


def find_ours(dirs: list[str], tasks: list[str], seeds: list[int], algos: list[str]) -> list:
    """Our runs of these tasks, seeds and algorithms under ``dirs``, labelled as ``sppo-rl report`` does."""
    from sppo_rl.experiments.report_runs import find_runs

    return [
        r
        for r in find_runs(tuple(dirs))
        if r.world == "control" and r.rows and r.task in tasks and r.seed in seeds and r.algo in algos
    ]


# ------------------------------------------------------------------------------------- numbers


def run_summary(run, cfg) -> dict[str, Any]:
    """The report's per-run numbers (:func:`~sppo_rl.experiments.report_numbers.run_numbers`: ``episodes_to`` is
    :func:`~sppo_rl.experiments.protocol.crossing` of the raw success rate against ``episodes``) plus
    ``wall_to``, the same crossing against ``wall_time_s``, and ``s_per_1k_episodes`` =
    ``1000 * wall_time_s / episodes`` of the last row."""
    from sppo_rl.experiments import protocol
    from sppo_rl.experiments.report_numbers import run_numbers

    numbers = run_numbers(run, cfg)
    y = [r["success_rate"] for r in run.rows]
    wall = [r.get("wall_time_s", math.nan) for r in run.rows]
    numbers["wall_to"] = {str(t): protocol.crossing(wall, y, t) for t in cfg.thresholds}
    last = run.rows[-1]
    numbers["s_per_1k_episodes"] = 1000 * last["wall_time_s"] / last["episodes"]
    return numbers


def _spread(values: list[float | None], seeds: int) -> dict[str, Any]:
    hits = [v for v in values if v is not None]
    return {
        "median": statistics.median(hits) if hits else None,
        "min": min(hits) if hits else None,
        "max": max(hits) if hits else None,
        "reached": len(hits),
        "seeds": seeds,
    }


def group_summary(per_run: list[dict[str, Any]], cfg) -> dict[str, Any]:
    """The report's group numbers (:func:`~sppo_rl.experiments.report_numbers.group_numbers`: tail success mean,
    t half-width and IQM; episodes to each threshold, median over the seeds that reach it) plus min-max of
    episodes and wall-clock to each threshold, and seconds per 1,000 episodes (mean over seeds)."""
    from sppo_rl.experiments.report_numbers import group_numbers

    g = group_numbers(per_run, cfg)
    n = len(per_run)
    ts = [str(t) for t in cfg.thresholds]
    g["episodes_to"] = {t: _spread([r["episodes_to"][t] for r in per_run], n) for t in ts}
    g["wall_to"] = {t: _spread([r["wall_to"][t] for r in per_run], n) for t in ts}
    g["episodes"] = statistics.median(r["episodes"] for r in per_run)
    g["s_per_1k_episodes"] = float(np.mean([r["s_per_1k_episodes"] for r in per_run]))
    return g


def _reach(s: dict[str, Any], fmt: str) -> str:
    if s["median"] is None:
        return f"— (0/{s['seeds']})"
    span = f" [{s['min']:{fmt}}-{s['max']:{fmt}}]" if s["reached"] > 1 else ""
    return f"{s['median']:{fmt}}{span} ({s['reached']}/{s['seeds']})"


def markdown(groups: list[dict[str, Any]], cfg) -> str:
    ts = [str(t) for t in cfg.thresholds]
    head = (
        "| task | algo | seeds | episodes | "
        + " | ".join(f"episodes to {t}" for t in ts)
        + f" | wall s to {ts[-1]} | tail success | s / 1k episodes |"
    )
    lines = [head, "|---|---|---:|---:|" + "---:|" * len(ts) + "---:|---:|---:|"]
    for g in groups:
        half = g["tail_success_half"]
        final = f"{g['tail_success_mean']:.2f}" + (
            "" if half is None or math.isnan(half) else f" ± {half:.2f}"
        )
        lines.append(
            f"| {g['task']} | {g['label']} | {g['seeds']} | {g['episodes']:,.0f} | "
            + " | ".join(_reach(g["episodes_to"][t], ".0f") for t in ts)
            + f" | {_reach(g['wall_to'][ts[-1]], '.1f')} | {final} | {g['s_per_1k_episodes']:.1f} |"
        )
    lines += [
        "",
        "episodes / wall s to x: where the raw success rate (blocks of one update's episodes), read as "
        "straight lines between rows, first reaches x (the report's crossing); median [min-max] over the "
        "seeds that reach it "
        f"(reached/seeds). tail success: mean raw success over the last {cfg.tail_frac:.0%} of the rows, "
        "mean ± 95% t half-width over seeds. s / 1k episodes: training seconds per 1,000 episodes, mean "
        "over seeds.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    try:
        budgets = validate(args)
    except UsageError as e:
        print(f"peer_sb3.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    from sppo_rl.envs.tasks import get_task
    from sppo_rl.experiments.config import ReportConfig
    from sppo_rl.runtime.logging import json_safe

    cfg = ReportConfig(inputs=(args.out,), tail_frac=args.tail_frac)
    found = find_ours(args.ours, list(budgets), args.seeds, args.algos) if args.ours else []
    if args.skip_sb3 and not args.run_ours and not found:
        print(
            f"peer_sb3.py: error: no run of {', '.join(args.algos)} on these tasks and seeds under --ours",
            file=sys.stderr,
        )
        sys.exit(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    if not args.skip_sb3:
        for task, budget in budgets.items():
            n_steps = args.n_steps or max(
                2, math.ceil(steps_per_update(task) / get_task(task).episodes_per_update)
            )
            runs += [sb3_run(task, s, budget, n_steps, out, args.fresh) for s in args.seeds]
    if args.ours or args.run_ours:
        ours = found
        if args.run_ours:
            ours += find_ours([str(run_ours(args, budgets, out))], list(budgets), args.seeds, args.algos)
        for t in budgets:
            for a in args.algos:
                have = sorted(r.seed for r in ours if (r.task, r.algo) == (t, a))
                if have != sorted(args.seeds):
                    print(f"note: ours {t} {a}: seeds {have} of {sorted(args.seeds)} found", file=sys.stderr)
        runs += ours
    per_run = [run_summary(r, cfg) for r in runs]
    groups = []
    order = [SB3_ALGO, *args.algos]
    for task in budgets:
        labels = sorted(
            {r["label"] for r in per_run if r["task"] == task},
            key=lambda lb: (order.index(lb.split()[0]), lb),
        )
        for label in labels:
            mine = sorted(
                (r for r in per_run if (r["task"], r["label"]) == (task, label)), key=lambda r: r["seed"]
            )
            groups.append(group_summary(mine, cfg))
    table = markdown(groups, cfg)
    result = {
        "budgets": budgets,
        "crossing": "protocol.crossing: interpolated between raw rows",
        "tail_frac": cfg.tail_frac,
        "groups": groups,
        "runs": per_run,
    }
    (out / "peer_sb3.md").write_text(table)
    (out / "peer_sb3.json").write_text(json.dumps(json_safe(result), indent=1) + "\n")
    print(table)
    print(json.dumps(json_safe(result)))
    return result


if __name__ == "__main__":
    main()
