"""The shape every run's plan shares, in both worlds.

A world's ``resolve(cfg)`` (:func:`sppo_rl.llm.plan.resolve`, :func:`sppo_rl.control.plan.resolve`) checks
the user's config once and returns a frozen plan: a :class:`RunPlan` (the fields below) plus the world's
own sections. Everything after planning (builders, stages, the loop, exports) reads the plan, never the
config: ``given`` is kept only to be saved to ``config.json`` and compared on ``--resume``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sppo_rl.agents.algorithms import Algorithm
from sppo_rl.agents.learner import LearnerConfig


class LoopConfig(Protocol):
    """The settings of a world's config that drive the run loop (both worlds' configs have them)."""

    out_dir: str
    seed: int
    eval_every: int
    checkpoint_every: int
    keep_checkpoints: int
    max_seconds: float | None
    resume: bool
    overwrite: bool
    progress: bool
    tensorboard: bool
    threads: int


@dataclass(frozen=True)
class LoopSettings:
    """How the run loop (:func:`sppo_rl.runtime.loop.run_loop`) drives a run, the same in both worlds.

    Attributes:
        out_dir: the run folder (as given; prepared by :func:`sppo_rl.runtime.run.prepare_run_dir`).
        seed: the run's seed.
        updates: how many updates the run trains for.
        eval_every: evaluate every this many updates (0: never, besides the first and last).
        checkpoint_every: save a checkpoint every this many updates (0: at the end only).
        keep_checkpoints: how many checkpoints stay on disk.
        max_seconds: stop (with a checkpoint) after this many seconds of training; None: no limit.
        resume, overwrite: how an existing run folder is treated.
        progress, tensorboard: the terminal's progress bar, TensorBoard event files.
        threads: torch's CPU threads.
    """

    out_dir: Path
    seed: int
    updates: int
    eval_every: int
    checkpoint_every: int
    keep_checkpoints: int
    max_seconds: float | None
    resume: bool
    overwrite: bool
    progress: bool
    tensorboard: bool
    threads: int

    @classmethod
    def of(cls, cfg: LoopConfig, updates: int) -> LoopSettings:
        """The loop's settings of a world's config, which knows ``updates`` its own way (the LLM world's
        ``--updates``; the control world's episode budget over its episodes per update)."""
        return cls(
            out_dir=Path(cfg.out_dir), seed=cfg.seed, updates=updates, eval_every=cfg.eval_every,
            checkpoint_every=cfg.checkpoint_every, keep_checkpoints=cfg.keep_checkpoints,
            max_seconds=cfg.max_seconds, resume=cfg.resume, overwrite=cfg.overwrite, progress=cfg.progress,
            tensorboard=cfg.tensorboard, threads=cfg.threads,
        )  # fmt: skip


@dataclass(frozen=True)
class AStar:
    """A*-PO's stage 1 in either world: ``samples`` reference samples per context (``--astar-samples``)
    and ``V*``'s ``beta1`` (``--astar-beta1``); the regression's ``beta2`` is the learner's."""

    samples: int
    beta1: float


@dataclass(frozen=True)
class RunPlan:
    """The part of a plan both worlds share.

    Attributes:
        given: the config as the user gave it (defaults the world derives filled in): saved to
            ``config.json`` and compared on ``--resume``; nothing else reads it.
        algo: the algorithm.
        learner: the update's settings (:class:`~sppo_rl.agents.learner.LearnerConfig`).
        estimator: the estimator's keyword parameters (:func:`~sppo_rl.agents.algorithms.estimator_params`).
        loop: the run loop's settings (:class:`LoopSettings`).
    """

    given: Any
    algo: Algorithm
    learner: LearnerConfig
    estimator: dict[str, Any]
    loop: LoopSettings
