"""Config of ``sppo-rl control``: one dataclass drives the CLI, the saved ``config.json`` and the tests.

Import-light on purpose (no torch / Gymnasium), so ``sppo-rl --help`` is quick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from sppo_rl.config import Check, RunConfig, ge, gt, optional


@dataclass
class ControlConfig(RunConfig):
    """Stage 3 of the pipeline: RL on a sparse terminal-reward control task, from a warm start."""

    task: str = "precision-cartpole"
    """Task short name (precision-cartpole, mountaincar, hopper, lunarlander, pendulum, ...) or a Gymnasium id
    (Id, or module:Id to import module first) with a max_episode_steps. Stock ids are judged by the env's own
    success (CartPole survived, MountainCar/Acrobot goal reached, LunarLander landed, ...: docs/control.md);
    any other id needs --success."""
    success: str | None = None
    """Success test of a Gymnasium id task (None: the id's shipped test): survived, terminated (goal reached),
    return:X (the env's return >= X), or module:function / path/to/file.py:function, called as
    f(obs, info, terminated, truncated) -> bool on the last step. Built-in tasks keep their own."""
    total_episodes: int = 4096
    """Training budget in episodes (sampled episodes; ReMax's greedy episodes are counted in env_steps only)."""
    episodes_per_update: int | None = None
    """Episodes per update; default: the task's (64 CartPole, 16 LunarLander and Pendulum, 8 MountainCar and Hopper,
    as the SPPO paper's control study)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and the critic (used when not initialising from a checkpoint)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation of both networks."""
    actor_lr: float = 3e-4
    """Adam learning rate of the policy."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic (step critic for ppo, start-state critic for sppo)."""
    epochs: int = 4
    """PPO epochs over each batch."""
    minibatches: int = 4
    """Minibatches per epoch (episodes are split evenly; a minibatch never splits an episode)."""
    lam: float = 0.95
    """GAE lambda (ppo)."""
    lampo_temperature: float = 0.1
    """LamPO: temperature of the confidence weighting of pairwise reward differences."""
    spo_contexts: int = 256
    """SPO: the fixed pool of start states its value tracker follows (a fresh start state never recurs);
    each update draws its episodes' start states from the pool, prioritised by the tracker's uncertainty.
    A*-PO: the pool whose V* it estimates before update 1 (--astar-samples reference episodes each), drawn uniformly."""
    max_grad_norm: float = 0.5
    """Gradient clipping (global norm) for the actor and the critic separately."""
    dense: bool = False
    """Train on the dense shaped reward instead of the terminal binary one (stage 1: the expert)."""
    init_from: str = "auto"
    """Actor initialisation: 'auto' = the shipped warm start of the task if there is one, else random;
    'none' = random; or a path to a warm-start file or a run folder's checkpoint."""
    compile: Literal["off", "on"] = "off"
    """on: acting and the training pass through torch.compile, tanh as a rational function, fused Adam (docs/control.md):
    1.12-1.29x the steps/s measured on CartPole after ~10 CPU-s of compiling, numbers equal to eager's to float rounding;
    off: eager torch, the reference every documented result ran on."""
    normalize_obs: bool = True
    """Normalise observations with running statistics (frozen at the warm start's when initialising from one)."""
    log_std_init: float = -0.5
    """Initial log-std of the Gaussian policy (continuous actions, random init only)."""
    out_dir: str = "runs/control"
    """Run folder: config.json, metrics.jsonl, tb/, checkpoints/, final.pt."""
    seeds: str | None = None
    """Train these seeds in one process (e.g. 0-15, or 0,2,5): seed K's run, in <out_dir>/seed<K> with a single
    run's files (sppo-rl sweep's layout), is exactly the run --seed K --out-dir <out_dir>/seed<K>; <out_dir> holds
    the seeds' mean per update (None: the one run of --seed)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many updates (and always at the end and on SIGTERM / Ctrl-C)."""
    keep_checkpoints: int = 3
    """How many checkpoints to keep."""
    eval_every: int = 0
    """Every this many updates, measure the greedy policy's success on --eval-episodes fixed start states (0: off)."""
    eval_episodes: int = 64
    """Start states of the greedy evaluation."""
    calibration_contexts: int = 64
    """SPPO's calibration.json: fixed start states whose V(s_0) is compared with their empirical success."""
    calibration_samples: int = 16
    """SPPO's calibration.json: episodes per start state for the empirical success."""

    def checks(self) -> list[Check]:
        return super().checks() + [
            ("total_episodes", ge(1), ">= 1"),
            ("episodes_per_update", optional(ge(1)), ">= 1, or None for the task's default"),
            ("hidden_sizes", lambda v: all(ge(1)(w) for w in v), "layer widths >= 1"),
            ("log_std_init", gt(-math.inf), "a finite number"),
            ("eval_episodes", ge(0), ">= 0"),
            ("eval_episodes", lambda v: v >= 1 or self.eval_every == 0, ">= 1 when --eval-every is on"),
            ("calibration_contexts", ge(1), ">= 1"),
            ("calibration_samples", ge(1), ">= 1"),
            ("spo_contexts", ge(1), ">= 1"),
            ("seeds", optional(lambda v: bool(parse_seeds(v, strict=False))), "seeds such as 0-15 or 0,2,5"),
            # the LLM world's settings the shared config carries (hidden from `sppo-rl control --help`)
            (
                "tis_cap",
                lambda v: v is None,
                "unset in the control world (it corrects a rollout engine's "
                "log-probs: an sppo-rl llm setting)",
            ),
        ]


def parse_seeds(text: str, strict: bool = True) -> list[int]:
    """The seeds of ``--seeds``: comma-separated integers and ranges ``a-b`` (both ends included), in the
    order given, each once: ``"0-3,7"`` -> ``[0, 1, 2, 3, 7]``. Anything else: ``ValueError`` (``strict``)
    or ``[]``."""
    seeds: list[int] = []
    try:
        for part in str(text).split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi) if hi else int(lo)
            if a < 0 or b < a:
                raise ValueError(part)
            seeds += [k for k in range(a, b + 1) if k not in seeds]
    except ValueError:
        if strict:
            raise ValueError(f"--seeds {text!r}: give seeds such as 0-15 or 0,2,5") from None
        return []
    return seeds


@dataclass
class WarmstartConfig:
    """Stages 1-2: train a dense-reward expert, keep its successful episodes, behaviour-clone them."""

    task: str = "precision-cartpole"
    """Task short name or Gymnasium id."""
    seed: int = 0
    """Seed of the expert, the demonstrations and the clone."""
    out_dir: str = "runs/warmstart"
    """Folder for the expert run (<out_dir>/<task>/expert) and the warm-start file (<out_dir>/<task>/warmstart.pt)."""
    expert_episodes: int | None = None
    """Expert budget in episodes (default: per task, see EXPERTS in warmstart.py)."""
    expert_episodes_per_update: int | None = None
    """Expert episodes per PPO update (default: per task)."""
    expert_lr: float | None = None
    """Expert actor learning rate (default: per task)."""
    expert_hidden_sizes: tuple[int, ...] = (64, 64)
    """Expert network widths."""
    expert_from: str | None = None
    """Skip stage 1 and clone this actor file (e.g. a previous <out_dir>/<task>/expert/final.pt)."""
    demo_episodes: int = 256
    """Expert episodes collected (sampled actions) for cloning; only successful ones are kept."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the cloned policy (the one stage 3 trains)."""
    bc_lr: float = 3e-4
    """Adam learning rate of behaviour cloning."""
    bc_batch: int = 256
    """Minibatch size (states) of behaviour cloning."""
    bc_max_steps: int = 5000
    """Upper bound on cloning gradient steps."""
    check_every: int = 5
    """Measure the clone's success every this many gradient steps at first (later every 25 % more steps)."""
    check_growth: float = 1.25
    """Later checks come when the step count has grown by this factor (1.0: every --check-every steps)."""
    check_episodes: int = 64
    """Episodes (fixed start states) per success check during cloning."""
    target_success: float = 0.3
    """Stop cloning once the clone's sampled success rate reaches this (non-zero but imperfect)."""
    eval_episodes: int = 128
    """Episodes (fixed start states) per success measurement."""
    install: bool = False
    """Also copy the result into the package (sppo_rl/assets/warmstart/<task>.pt) for --init-from auto."""
    threads: int = 1
    """torch threads."""
    progress: bool = True
    """Show progress bars."""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form tags stored in the file's metadata."""
