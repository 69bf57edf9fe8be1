"""Resolve once, the control world's twin of :mod:`sppo_rl.llm.plan`: a control run's settings checked and
derived in one place before any file is touched.

:func:`resolve` turns a :class:`~sppo_rl.control.config.ControlConfig` into a frozen :class:`Plan`, in this
order (each step may refuse the run in one line, :class:`~sppo_rl.runtime.run.RunError` or ``ValueError``):
every setting's type and range; the algorithm (one the control world trains); the task
(:func:`~sppo_rl.envs.custom.resolve_task`: built-in, custom, or a Gymnasium id with its success test);
episodes per update ``E`` (the task's, or ``--episodes-per-update``), group size ``G`` (the largest up to
the method's that divides ``E`` and leaves two contexts), the budget (at least one update), epochs and
minibatches; the warm start (``--init-from``) against the task; the learner's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sppo_rl.agents.algorithms import (
    Algorithm,
    check_setup,
    default_group_size,
    estimator_params,
    get_algorithm,
)
from sppo_rl.agents.learner import LearnerConfig
from sppo_rl.control.actor_files import check_init_actor, resolve_init
from sppo_rl.control.config import ControlConfig
from sppo_rl.runtime.run import RunError


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
class Plan:
    """Everything a control run derives from its config, computed once by :func:`resolve`: the config, the
    algorithm, the task's spec, the derived sizes (:class:`Resolved`), the warm start's file (None: random
    initialisation), the learner's settings and the estimator's parameters."""

    cfg: ControlConfig
    algo: Algorithm
    spec: Any
    resolved: Resolved
    init_path: Path | None
    learner: LearnerConfig
    estimator: dict[str, Any]


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
    check_setup(algo, G, E)
    if cfg.total_episodes < E:
        raise RunError(f"--total-episodes ({cfg.total_episodes}) is smaller than one update ({E} episodes)")
    if cfg.epochs < 1 or cfg.minibatches < 1 or cfg.minibatches > E:
        raise RunError(f"need epochs >= 1 and 1 <= minibatches <= episodes_per_update ({E})")
    if algo.requires.tracker and cfg.spo_contexts < E // G:
        raise RunError(f"--spo-contexts ({cfg.spo_contexts}) must hold one update's start states ({E // G})")
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
    learner = LearnerConfig.from_run(cfg, spec.horizon, algo.defaults)
    return Plan(cfg, algo, spec, resolved, init_path, learner, estimator_params(cfg))
