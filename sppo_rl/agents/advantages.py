"""Advantage estimators on padded ``[B, T]`` sequence batches.

Every estimator is a plain function registered in :data:`ESTIMATORS` under its name, with one shared
keyword contract::

    advantages, returns = ESTIMATORS[name](token_rewards=..., mask=..., **what_it_needs, **params)

- ``token_rewards`` ``[B, T]``: reward per position (the outcome sits on the last valid position).
  A sequence's outcome is ``R_b = sum_t token_rewards[b, t] * mask[b, t]``.
- ``mask`` ``[B, T]``: 1 on valid positions, 0 on right padding.
- ``rewards`` ``[B]``: the outcome alone (``SequenceBatch.rewards``), when ``token_rewards`` also holds
  per-position terms (a KL penalty, DAPO's overlong punishment); an estimator that does not read it
  uses ``R_b`` above.
- ``values``: ``[B, T]`` per-position values (``gae``) or ``[B]`` per-sequence logits (``sppo``).
- ``group_ids`` ``[B]``: sequences from the same context share an id (group methods).
- ``baseline_rewards`` ``[B]``: the greedy rollout's outcome for each sequence's context (``remax``).
- ``tracker_values`` ``[B]``: a per-context value tracker's estimate (``spo``).
- ``optimal_values`` ``[B]``: a per-context optimal value ``V*`` estimated once before training
  (``astar-po``).

``advantages`` is ``[B, T]`` and exactly 0 where ``mask`` is 0. ``returns`` holds the critic's
targets: ``[B, T]`` for ``gae``, the outcome ``R`` ``[B]`` for every sequence-level estimator.

Each function carries a :class:`Requirements` (``fn.requires``) saying what the trainer must supply,
so a trainer asks the estimator instead of testing its name. All estimators run under ``no_grad``.
Extra keywords are ignored, so a trainer may pass one dictionary to any estimator.

An estimator sees valid rows only: :func:`~sppo_rl.agents.algorithms.compute_advantages` takes the
rows whose outcome is unknown (``SequenceBatch.valid`` False) out before calling it and gives them
advantage 0, so every group, leave-one-out and batch statistic here is over valid rows by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import torch
from torch import Tensor

from sppo_rl.agents.batch import terminal_rewards

CriticKind = Literal["none", "step", "sequence"]


@dataclass(frozen=True)
class Requirements:
    """What an estimator needs from the trainer.

    Attributes:
        critic: ``"none"``; ``"step"``: a value per position ``V(s_t)``; ``"sequence"``: one value per
            sequence read from its context only, ``V(s_p)``.
        critic_output: what ``values`` must hold: ``"value"`` (in reward units) or ``"logit"``
            (a success logit; ``sigmoid(logit)`` is the value).
        groups: needs N > 1 sequences per context, tied by ``group_ids``.
        greedy_baseline: needs one extra greedy (argmax / mean-action) rollout per context, whose
            outcome arrives as ``baseline_rewards``.
        logprobs: needs the sampling policy's log-probs ``logp_old`` ``[B, T]`` (e.g. to weigh
            sequences by the policy's confidence).
        tracker: needs a per-context value tracker's estimate for each sequence, read before the batch's
            outcomes update it, as ``tracker_values`` ``[B]`` (SPO: :class:`~sppo_rl.agents.rivals.ValueTracker`);
            the trainer keeps the tracker, updates it after the estimate and checkpoints it.
        optimal_values: needs each sequence's context's ``V*``, estimated once before training from
            samples of the reference policy, as ``optimal_values`` ``[B]`` (A*-PO:
            :func:`~sppo_rl.agents.rivals.optimal_value`); the trainer keeps the reference policy and the
            table of ``V*`` and checkpoints the table.
    """

    critic: CriticKind = "none"
    critic_output: Literal["value", "logit"] = "value"
    groups: bool = False
    greedy_baseline: bool = False
    logprobs: bool = False
    tracker: bool = False
    optimal_values: bool = False


EstimatorFn = Callable[..., tuple[Tensor, Tensor]]
"""An estimator's function: keywords (``token_rewards``, ``mask``, ...) -> ``(advantages, returns)``."""


class Estimator(Protocol):
    """A registered estimator: its function, carrying what it was registered with."""

    requires: Requirements
    estimator_name: str

    def __call__(self, *args: object, **kwargs: object) -> tuple[Tensor, Tensor]: ...


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, requires: Requirements) -> Callable[[EstimatorFn], Estimator]:
    """Decorator: add ``fn`` to :data:`ESTIMATORS` under ``name`` and attach ``fn.requires``."""

    def deco(fn: EstimatorFn) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"estimator {name!r} is already registered")
        fn.requires = requires  # type: ignore[attr-defined]  # a function's own attribute
        fn.estimator_name = name  # type: ignore[attr-defined]  # likewise
        ESTIMATORS[name] = cast(Estimator, fn)
        return ESTIMATORS[name]

    return deco


def get_estimator(name: str) -> Estimator:
    """The estimator called ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; valid: {', '.join(sorted(ESTIMATORS))}"
        ) from None


# --------------------------------------------------------------------------------------------------
# helpers


def sequence_scores(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """``R_b = sum_t r_{b,t} * m_{b,t}``, shape ``[B]``."""
    return (token_rewards * mask).sum(-1)


def broadcast(seq_adv: Tensor, mask: Tensor) -> Tensor:
    """``A[b, t] = a_b * m[b, t]``: one advantage per sequence on every valid position."""
    return seq_adv[:, None].to(mask.dtype) * mask


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mu) / sqrt(var + eps)`` with masked mean and unbiased masked variance; 0 off the mask."""
    n = mask.sum()
    mu = (x * mask).sum() / n.clamp(min=1)
    var = (((x - mu) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (x - mu) * torch.rsqrt(var + eps) * mask


@dataclass(frozen=True)
class GroupStats:
    """Per-sequence statistics of each sequence's group (all ``[B]``, float64)."""

    count: Tensor
    total: Tensor
    mean: Tensor
    centered_sq: Tensor  # sum over the group of (R_j - mean)^2
    degenerate: Tensor  # bool: every reward in the group is equal (this includes singletons)


def group_stats(scores: Tensor, group_ids: Tensor) -> GroupStats:
    """Group means, sums and spreads gathered back to each sequence, computed in float64."""
    if group_ids is None:
        raise ValueError("this estimator needs group_ids [B]")
    if group_ids.shape != scores.shape:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} must match scores {tuple(scores.shape)}")
    r = scores.double()
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max().item()) + 1 if inv.numel() else 0
    count = torch.zeros(G, dtype=r.dtype, device=r.device).scatter_add_(0, inv, torch.ones_like(r))
    total = torch.zeros(G, dtype=r.dtype, device=r.device).scatter_add_(0, inv, r)
    mean = total / count
    csq = torch.zeros(G, dtype=r.dtype, device=r.device).scatter_add_(0, inv, (r - mean[inv]) ** 2)
    hi = torch.full((G,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, inv, r, "amax")
    lo = torch.full((G,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, inv, r, "amin")
    return GroupStats(count[inv], total[inv], mean[inv], csq[inv], (hi == lo)[inv])


# --------------------------------------------------------------------------------------------------
# estimators


def _gae_recursion(token_rewards: Tensor, mask: Tensor, values: Tensor, gamma: float, lam: Tensor) -> Tensor:
    """``A_t = delta_t + gamma lam_b A_{t+1}`` backwards over each row (``lam`` ``[B]``), 0 past the end."""
    B, T = mask.shape
    adv = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        next_adv = m * a + (1 - m) * next_adv
        next_value = m * values[:, t] + (1 - m) * next_value
        adv[:, t] = next_adv
    return adv * mask


@register_estimator("gae", Requirements(critic="step"))
@torch.no_grad()
def gae(
    *,
    token_rewards: Tensor,
    mask: Tensor,
    values: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
    lam_critic: float | None = None,
    lam_alpha: float | None = None,
    **_: object,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over each sequence, computed backwards.

    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)``, ``A_t = delta_t + gamma * lam * A_{t+1}``, with
    ``V`` and ``A`` past the last valid position taken as 0 (the sequence is finished: its outcome is
    decided, so nothing is bootstrapped). Padding positions carry the running values through unchanged,
    so right padding never breaks the recursion. ``returns = A + V`` (before whitening).
    With a terminal-only reward and ``gamma = lam = 1``: ``A_t = R - V(s_t)``.
    ``whiten`` standardises ``A`` over valid positions (masked mean, unbiased masked variance).

    VC-PPO / VAPO's decoupling: ``lam`` is the actor's; the critic's targets use ``lam_critic``
    (``returns = A(lam_critic) + V``; VC-PPO: 1.0, unbiased for a terminal reward). ``lam_alpha = a``
    makes the actor's lambda length-adaptive (VAPO): ``lam_b = 1 - 1 / (a * l_b)`` for a sequence of
    ``l_b`` positions (clamped to ``[0, 1]``), so the bias-variance trade-off is the same per sequence
    whatever its length.
    """
    if values is None or values.shape != mask.shape:
        raise ValueError(f"gae needs per-position values of shape {tuple(mask.shape)}")
    mask = mask.to(values.dtype)
    lengths = mask.sum(-1)
    if lam_alpha is not None:
        if lam_alpha <= 0:
            raise ValueError(f"lam_alpha must be positive, got {lam_alpha}")
        lam_actor = (1.0 - 1.0 / (lam_alpha * lengths.clamp(min=1))).clamp(0.0, 1.0)
    else:
        lam_actor = torch.full_like(lengths, lam)
    adv = _gae_recursion(token_rewards, mask, values, gamma, lam_actor)
    adv_critic = (
        adv
        if lam_critic is None
        else _gae_recursion(token_rewards, mask, values, gamma, torch.full_like(lengths, lam_critic))
    )
    returns = (adv_critic + values) * mask
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, returns


@register_estimator("sppo", Requirements(critic="sequence", critic_output="logit"))
@torch.no_grad()
def sppo(*, token_rewards: Tensor, mask: Tensor, values: Tensor, **_: object) -> tuple[Tensor, Tensor]:
    """Sequence-level PPO: the whole sequence is one action of a contextual bandit.

    ``values`` are ``[B]`` critic logits read from the context alone; ``p = sigmoid(logit)`` estimates
    ``P(R = 1 | s_p)``. ``A = R - p`` on every valid position; the critic's target is ``R`` (``[B]``),
    fitted with BCE. No whitening, no normalisation.
    """
    if values is None or values.shape != mask.shape[:1]:
        raise ValueError(f"sppo needs one critic logit per sequence, shape ({mask.shape[0]},)")
    R = sequence_scores(token_rewards, mask)
    return broadcast(R - torch.sigmoid(values.to(R.dtype)), mask), R


@register_estimator("grpo", Requirements(groups=True))
@torch.no_grad()
def grpo(
    *,
    token_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    std: Literal["population", "sample"] = "sample",
    eps: float = 1e-6,
    std_threshold: float = 0.05,
    lone: Literal["zero", "reward"] = "zero",
    **_: object,
) -> tuple[Tensor, Tensor]:
    """Group-relative advantage ``A_i = (R_i - mean_g) / (std_g + eps)``, broadcast to the sequence.

    ``std="sample"`` divides the squared deviations by ``G - 1`` (``torch.std``, what verl does);
    ``std="population"`` by ``G``. A group whose rewards are all equal (a singleton included), or whose
    std is at most ``std_threshold``, gets exactly 0: there is nothing to compare, and dividing noise
    (rounding, or a KL penalty in the reward of an all-correct group) by a tiny std would amplify it.
    With binary outcomes a mixed group of ``G`` has a sample std of at least ``1/sqrt(G)`` (0.125 for
    ``G = 64``), so the default 0.05 only ever zeroes groups whose outcomes are all equal.
    Example ``R = [1, 1, 0, 0]``: population -> ``[1, 1, -1, -1]``, sample -> ``~[.866, .866, -.866, -.866]``.
    ``lone="reward"`` gives a group of ONE (e.g. the only valid member of its group) ``A = R`` instead of
    0: Latent-GRPO's code (and verl's GRPO) take a singleton's mean as 0 and its std as 1.
    """
    if std not in ("population", "sample"):
        raise ValueError(f"std must be 'population' or 'sample', got {std!r}")
    if lone not in ("zero", "reward"):
        raise ValueError(f"lone must be 'zero' or 'reward', got {lone!r}")
    R = sequence_scores(token_rewards, mask)
    g = group_stats(R, group_ids)
    denom = g.count if std == "population" else (g.count - 1).clamp(min=1)
    sd = torch.sqrt(g.centered_sq / denom)
    flat = g.degenerate | (sd <= std_threshold)
    a = torch.where(flat, torch.zeros_like(sd), (R.double() - g.mean) / (sd + eps))
    if lone == "reward":
        a = torch.where(g.count == 1, R.double(), a)
    return broadcast(a.to(R.dtype), mask), R


@register_estimator("drgrpo", Requirements(groups=True))
@torch.no_grad()
def drgrpo(*, token_rewards: Tensor, mask: Tensor, group_ids: Tensor, **_: object) -> tuple[Tensor, Tensor]:
    """Dr. GRPO: ``A_i = R_i - mean_g`` (no division by the group's std); 0 for equal-reward groups."""
    R = sequence_scores(token_rewards, mask)
    g = group_stats(R, group_ids)
    a = torch.where(g.degenerate, torch.zeros_like(g.mean), R.double() - g.mean)
    return broadcast(a.to(R.dtype), mask), R


@register_estimator("rloo", Requirements(groups=True))
@torch.no_grad()
def rloo(*, token_rewards: Tensor, mask: Tensor, group_ids: Tensor, **_: object) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out: ``A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g)``.

    A singleton group has no other member to compare with and gets 0, as does an equal-reward group.
    """
    R = sequence_scores(token_rewards, mask)
    g = group_stats(R, group_ids)
    loo = (g.total - R.double()) / (g.count - 1).clamp(min=1)
    a = torch.where(g.degenerate, torch.zeros_like(loo), R.double() - loo)
    return broadcast(a.to(R.dtype), mask), R


@register_estimator("remax", Requirements(greedy_baseline=True))
@torch.no_grad()
def remax(
    *, token_rewards: Tensor, mask: Tensor, baseline_rewards: Tensor, **_: object
) -> tuple[Tensor, Tensor]:
    """ReMax: ``A_{i,t} = G_{i,t} - R_greedy(context_i)``, the baseline being one greedy rollout of the
    same context and ``G_{i,t} = sum_{s >= t} r_{i,s}`` the return-to-go of the token rewards (verl's
    ``compute_remax_outcome_advantage``). With the outcome alone on the last position ``G_{i,t} = R_i``
    on every position, so ``A_i = R_i - R_greedy``; with a per-token KL penalty in the reward each
    position carries only the penalties from itself on (worked example: rewards ``[-0.1, -0.2, 1 - 0.3]``,
    greedy outcome 1: ``A = [-0.6, -0.5, -0.3]``, where the whole sum would put -0.6 everywhere).
    ``returns`` is the sequence's ``R_i`` (no critic reads it)."""
    if baseline_rewards is None or baseline_rewards.shape != mask.shape[:1]:
        raise ValueError(f"remax needs baseline_rewards of shape ({mask.shape[0]},)")
    R = sequence_scores(token_rewards, mask)
    to_go = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    return (to_go - baseline_rewards.to(R.dtype)[:, None]).to(mask.dtype) * mask, R


@register_estimator("reinforce", Requirements())
@torch.no_grad()
def reinforce(
    *, token_rewards: Tensor, mask: Tensor, subtract_mean: bool = False, **_: object
) -> tuple[Tensor, Tensor]:
    """REINFORCE: ``A_i = R_i``, or ``R_i - mean_batch(R)`` with ``subtract_mean``."""
    R = sequence_scores(token_rewards, mask)
    a = R - R.mean() if subtract_mean else R
    if subtract_mean and bool((R == R[0]).all()):
        a = torch.zeros_like(R)
    return broadcast(a, mask), R


@register_estimator("reinforce++", Requirements())
@torch.no_grad()
def reinforce_pp(
    *, token_rewards: Tensor, mask: Tensor, gamma: float = 1.0, **_: object
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu et al., arXiv 2501.03262): the return-to-go ``G_t = sum_{s >= t} gamma^(s-t) r_s``
    (the outcome plus any per-token KL penalty in ``token_rewards``), whitened over the whole batch's
    valid positions: ``A = (G - mean) / sqrt(var + 1e-8)``, masked mean and unbiased masked variance
    (verl's ``compute_reinforce_plus_plus_outcome_advantage``). No critic, no groups: the batch is the
    baseline. A batch whose returns are all equal gets 0."""
    mask = mask.to(token_rewards.dtype)
    G = _gae_recursion(token_rewards, mask, torch.zeros_like(token_rewards), gamma, torch.ones(mask.shape[0]))
    return _whiten_or_zero(G, mask), sequence_scores(token_rewards, mask)


@register_estimator("reinforce++-baseline", Requirements(groups=True))
@torch.no_grad()
def reinforce_pp_baseline(
    *,
    token_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    rewards: Tensor | None = None,
    gamma: float = 1.0,
    **_: object,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a baseline (arXiv 2501.03262), as OpenRLHF (the paper's code) computes it:

    1. the outcome minus its group's mean, ``c_i = R_i - mean_g R`` (a group of one: 0);
    2. per-position rewards ``c_i`` on the last valid position plus every other term of
       ``token_rewards`` (``token_rewards - R`` at the end: a per-token KL penalty stays on its token);
    3. the return-to-go of those, whitened over the batch's valid positions (masked mean, unbiased
       masked variance, as verl's ``masked_whiten``): ``A = (G - mean) / sqrt(var + 1e-8)``.

    ``rewards`` is the outcome ``R`` (None: ``R_b = sum_t token_rewards``, no per-token terms). Worked
    example: one group ``R = [1, 0]`` of lengths 10 and 30: ``c = [0.5, -0.5]``, token mean -0.25,
    unbiased variance ``(10 * 0.75^2 + 30 * 0.25^2) / 39 = 0.1923``: ``A = [+1.710, -0.570]``. A batch
    whose returns are all equal gets 0."""
    mask = mask.to(token_rewards.dtype)
    score = sequence_scores(token_rewards, mask)
    R = score if rewards is None else rewards.to(token_rewards.dtype)
    g = group_stats(R, group_ids)
    centred = (R.double() - g.mean).to(token_rewards.dtype)
    per_pos = token_rewards - terminal_rewards(R, mask) + terminal_rewards(centred, mask)
    G = _gae_recursion(per_pos, mask, torch.zeros_like(per_pos), gamma, torch.ones(mask.shape[0]))
    return _whiten_or_zero(G, mask), R


def _whiten_or_zero(x: Tensor, mask: Tensor) -> Tensor:
    """:func:`masked_whiten`, or 0 where the valid values are all equal (nothing to compare: whitening
    would blow rounding up by ``1 / sqrt(1e-8)``)."""
    valid = x[mask > 0]
    if valid.numel() < 2 or bool((valid == valid[0]).all()):
        return torch.zeros_like(x)
    return masked_whiten(x, mask)
