"""Stage 5, ``train``: PPO epochs over minibatches of rows update actor and critic
(:func:`~sppo_rl.agents.learner.ppo_update`, the learner shared with the control world).

The actor is left alone (``actor_skipped`` 1; the critic still trains) during the critic warm-up
(``--critic-warmup`` updates) and, with ``--skip-equal-rewards`` (the default), in an update whose valid
outcomes -- the greedy baselines' included -- are all equal on every rank: they rank no response above
another. Minibatches are drawn with a generator seeded by ``seed * 7919 + update``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from sppo_rl.agents.learner import ActorFn, CriticFn, Reducer, Trained, outcomes_equal, ppo_update
from sppo_rl.runtime.run import check_finite

if TYPE_CHECKING:
    from sppo_rl.llm.build import RowsOf, TrainingEngine
    from sppo_rl.llm.plan import Plan
    from sppo_rl.llm.stages.to_batch import UpdateBatch


def rewards_all_equal(prepared: UpdateBatch, valid: Tensor, reduction: Reducer) -> bool:
    """Whether every valid outcome of the update (``R`` plus the overlong punishment, and the greedy
    baselines' rewards) is equal over all ranks."""
    batch = prepared.batch
    outcomes, outcome_valid = (batch.rewards + prepared.penalty).float(), valid.to(batch.rewards.device)
    if batch.baseline_rewards is not None:  # ReMax: the greedy rollouts' rewards are outcomes too
        outcomes = torch.cat([outcomes, batch.baseline_rewards.float()])
        outcome_valid = torch.cat([outcome_valid, outcome_valid])  # valid rows have a valid baseline
    return outcomes_equal(outcomes, outcome_valid, reduction)


def train(
    prepared: UpdateBatch,
    plan: Plan,
    actor_engine: TrainingEngine,
    critic_engine: TrainingEngine | None,
    rows: RowsOf,
    update: int,
    skip: bool,
    reduction: Reducer,
) -> Trained:
    """One update's optimisation (0-based ``update``); ``rows(rb, model, policy)`` the learner's world
    callable; ``skip``: leave the actor alone. Returns the learner's statistics (``actor_skipped`` an
    int) and the old log-probs its policy loss used (:class:`~sppo_rl.agents.learner.Trained`)."""
    actor = actor_engine.module
    critic = critic_engine.module if critic_engine is not None else None
    actor.train()
    if critic is not None:
        critic.train()
    trained = ppo_update(
        prepared.batch,
        plan.algo,
        plan.learner,
        cast(ActorFn, rows(prepared.rb, actor, True)),
        actor_engine,
        cast(CriticFn, rows(prepared.rb, critic, False)) if critic is not None else None,
        critic_engine,
        train_actor=update >= plan.update.critic_warmup and not skip,
        generator=torch.Generator().manual_seed(plan.loop.seed * 7919 + update),
        cost=prepared.cost,
        dist=reduction,
        guard=lambda **q: check_finite(update + 1, **q),
    )
    actor.eval()
    if critic is not None:
        critic.eval()
    stats: dict[str, Any] = {**trained.stats, "actor_skipped": int(trained.stats["actor_skipped"])}
    return Trained(stats, trained.logp_old)
