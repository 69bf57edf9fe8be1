"""Resolve once, the control world's twin of :mod:`sppo_rl.llm.plan`: a control run's settings checked and
derived in one place before any file is touched.

:func:`resolve` turns a :class:`~sppo_rl.control.config.ControlConfig` into a frozen :class:`Plan`, in this
order (each step may refuse the run in one line, :class:`~sppo_rl.runtime.run.RunError` or ``ValueError``):
every setting's type and range; the algorithm (one the control world trains); the task
(:func:`~sppo_rl.envs.custom.resolve_task`: built-in, custom, or a Gymnasium id with its success test);
episodes per update ``E`` (the task's, or ``--episodes-per-update``), group size ``G`` (the largest up to
the method's that divides ``E`` and leaves two contexts), the budget (at least one update), epochs and
minibatches; the warm start (``--init-from``) against the task; the learner's settings.

The plan is a :class:`~sppo_rl.runtime.plan.RunPlan` (the shape both worlds share: ``given``, ``algo``,
``learner``, ``estimator``, ``loop``) plus the control world's sections. Everything after planning (the
trainer, evaluation, the exports) reads the plan, never the config: ``given`` is kept only to be saved to
``config.json`` and compared on ``--resume``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sppo_rl.agents.algorithms import (
    check_setup,
    default_group_size,
    estimator_params,
    get_algorithm,
)
from sppo_rl.agents.learner import LearnerConfig
from sppo_rl.control.actor_files import check_init_actor, resolve_init
from sppo_rl.control.config import ControlConfig
from sppo_rl.runtime.loop import Schedule
from sppo_rl.runtime.plan import AStar, LoopSettings, RunPlan
from sppo_rl.runtime.run import RunError

if TYPE_CHECKING:
    from sppo_rl.envs.tasks import TaskSpec


@dataclass(frozen=True)
class Resolved:
    """Settings derived from the config and the task, saved beside it (``config.json``'s ``resolved``)."""

    task: str
    env_id: str
    horizon: int
    episodes_per_update: int
    group_size: int
    contexts_per_update: int
    greedy_per_update: int
    init_from: str


@dataclass(frozen=True)
class Networks:
    """The actor's and the critic's shape (used when not initialising from a warm start: ``init_path``
    None) and how the actor normalises its observations."""

    hidden_sizes: tuple[int, ...]
    activation: str
    log_std_init: float
    normalize_obs: bool
    init_path: Path | None
    """The warm start's file (None: random initialisation)."""
    compiled: bool = False
    """``--compile`` resolved (:mod:`sppo_rl.control.compiled`)."""


@dataclass(frozen=True)
class Optimisation:
    """The optimisers' settings: learning rates, their schedule over the ``loop.updates`` updates, gradient
    clipping, and the updates the actor waits while the critic warms up."""

    actor_lr: float
    critic_lr: float
    max_grad_norm: float
    lr_schedule: str
    warmup_updates: int
    critic_warmup: int


@dataclass(frozen=True)
class Evaluation:
    """What the run measures besides its training rows: ``episodes`` fixed start states of the greedy
    evaluation (0: none), and the calibration of a per-episode critic (``contexts`` start states,
    ``samples`` episodes each)."""

    episodes: int
    calibration_contexts: int
    calibration_samples: int


@dataclass(frozen=True)
class Plan(RunPlan):
    """Everything a control run derives from its config, computed once by :func:`resolve`: the shared
    :class:`~sppo_rl.runtime.plan.RunPlan` (``loop.updates = ceil(total_episodes / E)``), the task's spec,
    the derived sizes (:class:`Resolved`), whether the run trains on the dense shaped reward, SPO's
    start-state pool size (A*-PO's too), A*-PO's stage 1, the networks, the optimisers and the evaluation."""

    spec: TaskSpec
    resolved: Resolved
    dense: bool
    spo_contexts: int
    astar: AStar
    networks: Networks
    optim: Optimisation
    evaluation: Evaluation


def resolve(cfg: ControlConfig) -> Plan:
    """The frozen :class:`Plan` of ``cfg`` (see the module docstring); ``cfg`` is left unchanged."""
    from sppo_rl.envs.custom import resolve_task

    cfg.validate()
    algo = get_algorithm(cfg.algo)
    if "control" not in algo.worlds:
        raise RunError(f"{algo.name} trains a language model only: use sppo-rl llm")
    try:
        spec = resolve_task(cfg.task, cfg.success)
    except (KeyError, ValueError) as e:
        raise RunError(str(e).strip("'\"")) from None
    E = cfg.episodes_per_update or spec.episodes_per_update
    G = cfg.group_size if cfg.group_size is not None else default_group_size(algo, E)
    check_setup(algo, G, E, whiten=cfg.whiten)
    if cfg.total_episodes < E:
        raise RunError(f"--total-episodes ({cfg.total_episodes}) is smaller than one update ({E} episodes)")
    if cfg.epochs < 1 or cfg.minibatches < 1 or cfg.minibatches > E:
        raise RunError(f"need epochs >= 1 and 1 <= minibatches <= episodes_per_update ({E})")
    if (algo.requires.tracker or algo.requires.optimal_values) and cfg.spo_contexts < E // G:
        raise RunError(f"--spo-contexts ({cfg.spo_contexts}) must hold one update's start states ({E // G})")
    if cfg.compile == "on":
        from sppo_rl.control.compiled import check_compiler

        check_compiler()
    init_path = resolve_init(cfg.init_from, spec.name)
    if init_path is not None:
        check_init_actor(init_path, spec)
    resolved = Resolved(
        task=spec.name,
        env_id=spec.env_id,
        horizon=spec.horizon,
        episodes_per_update=E,
        group_size=G,
        contexts_per_update=E // G,
        greedy_per_update=E // G if algo.requires.greedy_baseline else 0,
        init_from=str(init_path) if init_path else "none",
    )
    loop = LoopSettings.of(cfg, math.ceil(cfg.total_episodes / E))
    networks = Networks(
        cfg.hidden_sizes, cfg.activation, cfg.log_std_init, cfg.normalize_obs, init_path, cfg.compile == "on"
    )
    optim = Optimisation(
        cfg.actor_lr, cfg.critic_lr, cfg.max_grad_norm, cfg.lr_schedule, cfg.warmup_updates, cfg.critic_warmup
    )
    evaluation = Evaluation(cfg.eval_episodes, cfg.calibration_contexts, cfg.calibration_samples)
    return Plan(
        given=cfg,
        algo=algo,
        learner=LearnerConfig.from_run(cfg, spec.horizon, algo.defaults),
        estimator=estimator_params(cfg, algo.defaults),
        loop=loop,
        spec=spec,
        resolved=resolved,
        dense=cfg.dense,
        spo_contexts=cfg.spo_contexts,
        astar=AStar(cfg.astar_samples, cfg.astar_beta1),
        networks=networks,
        optim=optim,
        evaluation=evaluation,
    )


def schedule(loop: LoopSettings) -> Schedule:
    """The control loop's :class:`~sppo_rl.runtime.loop.Schedule` from the plan's ``loop`` settings: the budget,
    evaluations, checkpoints and time cap, the logs' x-axis the env steps (CleanRL's global_step)."""
    return Schedule(
        loop.updates,
        loop.eval_every,
        loop.checkpoint_every,
        loop.max_seconds,
        log_step=lambda r: r["env_steps"],
    )
