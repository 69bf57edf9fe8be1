"""Stage 5, ``ppo_update``: PPO epochs over minibatches of rows update actor and critic
(:func:`~sppo_rl.agents.learner.ppo_update`, the learner shared with the control world).

The actor is left alone (``actor_skipped`` 1; the critic still trains) during the critic warm-up
(``--critic-warmup`` updates) and, with ``--skip-equal-rewards`` (the default), in an update whose valid
outcomes -- the greedy baselines' included -- are all equal on every rank: they rank no response above
another. Minibatches are drawn with a generator seeded by ``seed * 7919 + update``."""

from __future__ import annotations

from typing import Any

import torch

from sppo_rl.agents.learner import outcomes_equal
from sppo_rl.agents.learner import ppo_update as learner_update
from sppo_rl.runtime.run import check_finite


def rewards_all_equal(built: Any, valid: Any, red: Any) -> bool:
    """Whether every valid outcome of the update (``R`` plus the overlong punishment, and the greedy
    baselines' rewards) is equal over all ranks."""
    batch = built.batch
    outcomes, outcome_valid = (batch.rewards + built.penalty).float(), valid.to(batch.rewards.device)
    if batch.baseline_rewards is not None:  # ReMax: the greedy rollouts' rewards are outcomes too
        outcomes = torch.cat([outcomes, batch.baseline_rewards.float()])
        outcome_valid = torch.cat([outcome_valid, outcome_valid])  # valid rows have a valid baseline
    return outcomes_equal(outcomes, outcome_valid, red)


def ppo_update(
    built: Any, plan: Any, actor_engine: Any, critic_engine: Any, rows: Any, update: int, skip: bool, red: Any
) -> dict[str, Any]:
    """One update's optimisation (0-based ``update``); ``rows(rb, model, policy)`` the learner's world
    callable; ``skip``: leave the actor alone. Returns the learner's statistics."""
    cfg = plan.cfg
    actor = actor_engine.module
    critic = critic_engine.module if critic_engine is not None else None
    actor.train()
    if critic is not None:
        critic.train()
    out = learner_update(
        built.batch,
        plan.algo,
        plan.learner,
        rows(built.rb, actor, True),
        actor_engine,
        rows(built.rb, critic, False) if critic is not None else None,
        critic_engine,
        train_actor=update >= cfg.critic_warmup and not skip,
        generator=torch.Generator().manual_seed(cfg.seed * 7919 + update),
        cost=built.cost,
        dist=red,
        guard=lambda **q: check_finite(update + 1, **q),
    )
    actor.eval()
    if critic is not None:
        critic.eval()
    out["actor_skipped"] = int(out["actor_skipped"])
    return out
