"""Algorithms = an advantage estimator + a critic loss + defaults. Shared by the control and LLM worlds.

A trainer never tests an algorithm's name: it reads :attr:`Algorithm.requires` (what the estimator
needs: a critic per step or per sequence, groups, a greedy rollout) and :attr:`Algorithm.critic_loss`,
then calls :func:`compute_advantages` and :func:`critic_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from sppo_rl.agents.advantages import Requirements, get_estimator
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.losses import AggMode, bce_value_loss, clipped_value_loss

CriticLoss = Literal["none", "mse", "bce"]


@dataclass(frozen=True)
class Algorithm:
    """A named method.

    Attributes:
        name: the CLI name.
        estimator: key in :data:`sppo_rl.agents.advantages.ESTIMATORS`.
        critic_loss: ``"mse"`` (clipped MSE, critic outputs values), ``"bce"`` (critic outputs success
            logits, fitted with BCE to the outcome or the lambda-return), ``"none"`` (no critic).
        group_size: default number of sequences per context (1 = one sample per context).
        summary: one line for ``--help`` and the README.
        selector: key in :data:`sppo_rl.agents.selection.SELECTORS` choosing which positions the
            policy loss is taken over (None: every valid position).
        defaults: the update settings the method is defined with (``agg``, ``ratio_level``,
            ``policy_loss``), used where a run leaves them unset (None).
    """

    name: str
    estimator: str
    critic_loss: CriticLoss
    group_size: int
    summary: str
    selector: str | None = None
    defaults: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def requires(self) -> Requirements:
        return get_estimator(self.estimator).requires  # type: ignore[attr-defined]


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ppo", "gae", "mse", 1, "token/step-level PPO: per-step critic, GAE, clipped MSE"),
        Algorithm(
            "sppo", "sppo", "bce", 1, "sequence-level PPO: critic on the context only, A = R - V(s_0), BCE"
        ),
        Algorithm("grpo", "grpo", "none", 8, "GRPO: group-normalised outcome, no critic"),
        Algorithm(
            "drgrpo",
            "drgrpo",
            "none",
            8,
            "Dr. GRPO: group-centred outcome, no std division, sum over tokens / a fixed length",
            defaults={"agg": "seq-mean-token-sum-norm"},
        ),
        Algorithm(
            "gspo",
            "grpo",
            "none",
            8,
            "GSPO: GRPO advantages, one importance ratio per sequence (geometric mean), clipped per sequence",
            defaults={"ratio_level": "sequence", "agg": "seq-mean-token-mean"},
        ),
        Algorithm(
            "sppo-seq",
            "sppo",
            "bce",
            1,
            "SPPO with GSPO's sequence ratio: a fully sequence-level bandit PPO",
            defaults={"ratio_level": "sequence", "agg": "seq-mean-token-mean"},
        ),
        Algorithm(
            "cispo",
            "grpo",
            "none",
            8,
            "CISPO: GRPO advantages, REINFORCE weighted by a clipped stop-gradient importance ratio",
            defaults={"policy_loss": "cispo"},
        ),
        Algorithm(
            "reinforce++", "reinforce++", "none", 1, "REINFORCE++: return-to-go standardised over the batch"
        ),
        Algorithm(
            "reinforce++-baseline",
            "reinforce++-baseline",
            "none",
            8,
            "REINFORCE++ with a group-mean baseline, standardised by the batch's std",
        ),
        Algorithm("rloo", "rloo", "none", 5, "RLOO: leave-one-out group baseline"),
        Algorithm("remax", "remax", "none", 1, "ReMax: baseline = outcome of one greedy rollout"),
        Algorithm("reinforce", "reinforce", "none", 1, "REINFORCE: A = R"),
        Algorithm(
            "ppo-bce", "gae", "bce", 1, "ablation: step-level PPO whose per-step critic is trained with BCE"
        ),
        Algorithm(
            "bppo",
            "grpo",
            "none",
            8,
            "BPPO: GRPO advantages; once accurate, train only the shortest correct and incorrect prefixes",
            selector="binary-prefix",
        ),
        Algorithm(
            "lampo", "lampo", "none", 8, "LamPO: pairwise reward gaps weighted by the policy's confidence"
        ),
    ]
}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(ALGORITHMS)}") from None


def default_group_size(algo: Algorithm, rows: int | None = None) -> int:
    """``N`` when a run does not set ``--group-size``: 1 for a method without groups, else the
    algorithm's own; when the rows per update are fixed (``rows``: the control world's episodes per
    update), the largest ``N`` up to it that divides ``rows`` and leaves at least two contexts."""
    if not algo.requires.groups:
        return 1
    if rows is None:
        return algo.group_size
    for g in range(min(algo.group_size, rows // 2), 1, -1):
        if rows % g == 0:
            return g
    return 2


def check_setup(algo: Algorithm, group_size: int, batch_size: int, use_critic: bool = True) -> None:
    """Refuse contradictory settings with one clear message.

    - a group method needs ``group_size >= 2``; a non-group method takes ``group_size = 1``
      (GRPO with N = 1 would give zero advantage to every sequence);
    - ``batch_size`` (sequences per update) must be a positive multiple of ``group_size``;
    - a method whose estimator needs a critic cannot run with the critic switched off.
    """
    req = algo.requires
    if req.groups and group_size < 2:
        raise ValueError(
            f"{algo.name} compares the {group_size} sample(s) of a context with each other and needs "
            f"group_size >= 2 (default {algo.group_size})"
        )
    if not req.groups and group_size != 1:
        raise ValueError(f"{algo.name} does not use groups; group_size must be 1, got {group_size}")
    if batch_size <= 0 or batch_size % group_size:
        raise ValueError(
            f"sequences per update ({batch_size}) must be a positive multiple of group_size ({group_size})"
        )
    if req.critic != "none" and not use_critic:
        raise ValueError(f"{algo.name} needs a {req.critic}-level critic, but the critic is disabled")
    if req.critic_output == "logit" and algo.critic_loss != "bce":
        raise ValueError(f"{algo.name}'s estimator reads critic logits; its critic must be trained with BCE")


def estimator_params(cfg: object) -> dict[str, object]:
    """Estimator and selector parameters read from a run config (both worlds' configs name them alike):
    ``gamma``, ``lam``, ``whiten``, ``std`` (from ``grpo_std``), ``bppo_prefix_ratio``,
    ``bppo_accuracy_threshold``, ``lampo_temperature``, ``lam_critic``, ``lam_alpha``, ``std_threshold``
    (from ``group_std_threshold``). Fields a config lacks are left out, so the
    functions' own defaults apply."""
    names = {
        "gamma": "gamma",
        "lam": "lam",
        "whiten": "whiten",
        "std": "grpo_std",
        "bppo_prefix_ratio": "bppo_prefix_ratio",
        "bppo_accuracy_threshold": "bppo_accuracy_threshold",
        "lampo_temperature": "lampo_temperature",
        "lam_critic": "lam_critic",
        "lam_alpha": "lam_alpha",
        "std_threshold": "group_std_threshold",
    }
    return {key: getattr(cfg, field) for key, field in names.items() if hasattr(cfg, field)}


def critic_values(algo: Algorithm, critic_out: Tensor) -> Tensor:
    """Critic output in the units the estimator wants: logits stay logits for a logit estimator;
    a BCE-trained critic's logits become values ``sigmoid(logit)`` for a value estimator."""
    if algo.requires.critic_output == "value" and algo.critic_loss == "bce":
        return torch.sigmoid(critic_out)
    return critic_out


def value_units(algo: Algorithm, critic_out: Tensor) -> Tensor:
    """Critic output in reward units: ``sigmoid(logit)`` for a BCE-trained (success) critic, the value
    itself for an MSE-trained one (diagnostics: critic traces, calibration)."""
    return torch.sigmoid(critic_out) if algo.critic_loss == "bce" else critic_out


@torch.no_grad()
def compute_advantages(batch: SequenceBatch, algo: Algorithm, **params: object) -> SequenceBatch:
    """Fill ``batch.advantages``, ``batch.returns`` and ``batch.loss_mask``.

    Passes exactly what the estimator declares: ``values`` (``batch.values``, converted by
    :func:`critic_values`), ``group_ids``, ``baseline_rewards``, ``logp_old``; ``params`` are
    estimator and selector parameters (``gamma``, ``lam``, ``whiten``, ``std``, ``eps``, ...). The
    loss mask is ``batch.mask``, or what the algorithm's selector keeps of it.
    """
    est = get_estimator(algo.estimator)
    req = algo.requires
    kwargs: dict[str, object] = {"token_rewards": batch.token_rewards, "mask": batch.mask, **params}
    if req.critic != "none":
        if batch.values is None:
            raise ValueError(f"{algo.name} needs critic values in the batch")
        kwargs["values"] = critic_values(algo, batch.values)
    if req.groups:
        if batch.group_ids is None:
            raise ValueError(f"{algo.name} needs group_ids in the batch")
        kwargs["group_ids"] = batch.group_ids
    if req.greedy_baseline:
        if batch.baseline_rewards is None:
            raise ValueError(f"{algo.name} needs baseline_rewards (greedy rollouts) in the batch")
        kwargs["baseline_rewards"] = batch.baseline_rewards
    if req.logprobs:
        kwargs["logp_old"] = batch.logp_old
    batch.advantages, batch.returns = est(**kwargs)
    if algo.critic_loss == "bce" and req.critic == "sequence":
        # the success critic's target is the outcome itself, even when a KL penalty sits in the reward
        # (R - KL is no probability: as a BCE target it makes the loss unbounded below)
        batch.returns = batch.rewards.to(batch.mask.dtype).clone()
    batch.loss_mask = batch.mask
    if algo.selector is not None:
        from sppo_rl.agents.selection import get_selector

        batch.loss_mask = get_selector(algo.selector)(
            mask=batch.mask,
            rewards=batch.rewards,
            group_ids=batch.group_ids,
            advantages=batch.advantages,
            **params,
        )
        batch.advantages = batch.advantages * batch.loss_mask
    return batch


def critic_loss(
    algo: Algorithm,
    pred: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_pred: Tensor | None = None,
    clip: float | None = 0.2,
    agg: AggMode = "token-mean",
) -> Tensor:
    """The algorithm's critic loss on fresh critic outputs ``pred`` (values or logits).

    - ``mse``: clipped MSE against ``returns`` (per position), clipped around ``old_pred``;
    - ``bce`` with a sequence critic: ``mean_b BCE(logit_b, R_b)``, no clipping;
    - ``bce`` with a step critic (the ablation): per-position BCE against the lambda-returns clamped to
      ``[0, 1]`` (with ``gamma = lam = 1`` and a binary outcome the target is exactly ``R``).
    """
    if algo.critic_loss == "mse":
        return clipped_value_loss(
            pred, old_pred if old_pred is not None else pred.detach(), returns, mask, clip, agg
        )
    if algo.critic_loss == "bce":
        if pred.dim() == 1:
            return bce_value_loss(pred, returns)
        return bce_value_loss(pred, returns.clamp(0.0, 1.0), mask, agg)
    raise ValueError(f"{algo.name} has no critic")
