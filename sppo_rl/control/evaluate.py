"""What a control run measures besides its training rows, on start states training never draws (reset
seeds from :data:`EVAL_SEED_BASE` on; training draws them below ``2^31 - 1``):

- :func:`success_rate`: the greedy (or sampled) policy's success on fixed start states
  ``EVAL_SEED_BASE + i``, the periodic evaluation and the summary's ``final_eval_success_rate``;
- :func:`calibration`: a per-episode critic's ``sigmoid V(s_0)`` against the empirical success from the
  same start state (``calibration.json``);
- :func:`critic_trace`: what the critic says along sampled episodes (``critic_trace.npz``,
  :mod:`sppo_rl.runtime.trace`).

Each draws its actions from its own seeded generator, so measuring leaves the training's randomness alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from sppo_rl.agents.algorithms import value_units
from sppo_rl.control.networks import Actor, Critic
from sppo_rl.control.plan import Plan
from sppo_rl.control.rollout import collect
from sppo_rl.runtime.trace import write_trace

EVAL_SEED_BASE = 2_000_000_000  # evaluation start states: seeds EVAL_SEED_BASE + i, never drawn for training


@torch.no_grad()
def success_rate(actor: Actor, env: Any, horizon: int, greedy: bool = True) -> float:
    """Success rate over ``env.num_envs`` fixed start states (seeds ``EVAL_SEED_BASE + i``), greedy by
    default."""
    episodes = env.num_envs
    seeds = EVAL_SEED_BASE + np.arange(episodes)
    gen = torch.Generator().manual_seed(12345)
    flags = np.full(episodes, greedy)
    ep = collect(env, actor, seeds, horizon, flags, gen)
    return float(ep.success.mean())


@torch.no_grad()
def calibration(actor: Actor, critic: Critic | None, plan: Plan) -> dict[str, list[float]] | None:
    """A per-episode critic's ``sigmoid V(s_0)`` against the empirical success of ``samples`` episodes
    from each of ``contexts`` fixed start states (``plan.evaluation``); None without one."""
    from sppo_rl.envs.tasks import make_episode_env

    if critic is None:
        return None
    contexts, samples = plan.evaluation.calibration_contexts, plan.evaluation.calibration_samples
    env = make_episode_env(plan.spec, num_envs=contexts * samples, dense=plan.dense)
    seeds = np.repeat(EVAL_SEED_BASE + 10_000 + np.arange(contexts), samples)
    ep = collect(env, actor, seeds, plan.resolved.horizon, None, torch.Generator().manual_seed(54321))
    env.close()
    pred = value_units(plan.algo, critic.values(ep.obs[::samples]))
    if pred.dim() != 1:
        return None
    emp = ep.success.view(contexts, samples).mean(1)
    return {"predicted": pred.tolist(), "empirical": emp.tolist(), "samples": [samples] * contexts}


@torch.no_grad()
def critic_trace(actor: Actor, critic: Critic | None, plan: Plan, path: Path, episodes: int = 64) -> None:
    """Write what the critic says along ``episodes`` sampled episodes from fixed start states
    (:mod:`sppo_rl.runtime.trace`; nothing without a critic)."""
    from sppo_rl.envs.tasks import make_episode_env

    if critic is None:
        return
    env = make_episode_env(plan.spec, num_envs=episodes, dense=plan.dense)
    seeds = EVAL_SEED_BASE + 20_000 + np.arange(episodes)
    ep = collect(env, actor, seeds, plan.resolved.horizon, None, torch.Generator().manual_seed(4242))
    env.close()
    v = value_units(plan.algo, critic.values(ep.obs))
    write_trace(path, v.numpy(), ep.lengths.numpy(), ep.success.numpy(), plan.resolved.horizon)
