"""Single-sample rivals of SPPO as parts of the shared core: OPO's optimal baseline, the James-Stein
shrinkage baseline, SPO's per-context value tracker and A*-PO's optimal value.

- **OPO** (On-Policy RL with Optimal reward baseline, arXiv 2505.23585): the variance-minimising baseline
  ``b* = E[|g|^2 R] / E[|g|^2]`` with the squared gradient norm taken proportional to the sequence's
  length ``l``, so ``b = sum_i l_i R_i / sum_i l_i``. ``"opo"`` pools over each group (the paper and
  verl's ``compute_opo_outcome_advantage``); ``"opo-batch"`` pools over the whole batch, the form that
  runs with one sample per context.
- **Shrinkage** (arXiv 2511.03710, the authors' code ``compute_jspo_outcome_advantage``): each sequence's
  leave-one-out group mean shrunk toward the mean of the *other* contexts' rewards, James-Stein style,
  by a factor computed from the other contexts only: ``"shrinkage"``.
- **SPO** (Single-stream Policy Optimization, arXiv 2509.13232, the authors' verl recipe
  ``spo/spo_ray_trainer.py``): a Beta tracker of each context's success probability whose memory is
  discounted by how far the policy moved since the context was last seen (:class:`ValueTracker`); its
  estimate is the baseline (``A = R - p_hat``), the advantages are normalised over the batch
  (``"spo"``), and contexts are drawn in proportion to ``sqrt(p_hat (1 - p_hat)) + 0.05``
  (:meth:`ValueTracker.sampling_weights`).
- **A*-PO** (Optimal Advantage Regression, arXiv 2505.20686; TRL's ``A2POTrainer``, the authors' verl
  code ``verl/trainer/apo/core_algos.py``): each context's optimal value
  ``V* = beta1 log mean_i exp(r_i / beta1)`` estimated once, before training, from ``k`` samples of the
  reference policy (:func:`optimal_value`); the advantage ``A = R - V*`` (``"astar-po"``) is the target
  of a least-squares regression (:func:`~sppo_rl.agents.losses.regression_loss`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sppo_rl.agents.advantages import (
    Requirements,
    broadcast,
    group_stats,
    register_estimator,
    sequence_scores,
)

SHRINKAGE_EPS = 1e-6
"""``eps`` of the shrinkage factor ``lambda = v^2 / (v^2 + s^2 + eps)`` (the authors' code)."""


@register_estimator("opo", Requirements(groups=True))
@torch.no_grad()
def opo(*, token_rewards: Tensor, mask: Tensor, group_ids: Tensor, **_: object) -> tuple[Tensor, Tensor]:
    """OPO's optimal baseline over each group: ``A_i = R_i - sum_{j in g} l_j R_j / sum_{j in g} l_j``,
    ``l_j`` the number of valid positions of sequence ``j``.

    A group whose rewards are all equal, or of one member, gets exactly 0 (verl gives a group of one
    the baseline 0, i.e. ``A = R``; this project's group estimators give it 0, as ``rloo`` does).
    Worked example: one group ``R = [1, 0]`` of lengths ``[1, 3]``: ``b = 1/4``, ``A = [0.75, -0.25]``
    (the plain group mean would give ``[0.5, -0.5]``).
    """
    R = sequence_scores(token_rewards, mask)
    lengths = mask.sum(-1).double()
    g = group_stats(R, group_ids)
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max().item()) + 1 if inv.numel() else 0
    num = torch.zeros(G, dtype=torch.float64, device=R.device).scatter_add_(0, inv, lengths * R.double())
    den = torch.zeros(G, dtype=torch.float64, device=R.device).scatter_add_(0, inv, lengths)
    b = (num / den.clamp(min=1))[inv]
    a = torch.where(g.degenerate, torch.zeros_like(b), R.double() - b)
    return broadcast(a.to(R.dtype), mask), R


@register_estimator("opo-batch", Requirements())
@torch.no_grad()
def opo_batch(*, token_rewards: Tensor, mask: Tensor, **_: object) -> tuple[Tensor, Tensor]:
    """OPO's optimal baseline pooled over the whole batch (one sample per context):
    ``A_b = R_b - sum_c l_c R_c / sum_c l_c``. A batch whose rewards are all equal gets exactly 0.
    Worked example: ``R = [1, 0, 0]`` of lengths ``[2, 1, 1]``: ``b = 2/4``, ``A = [0.5, -0.5, -0.5]``
    (the plain batch mean ``1/3`` would give ``[0.667, -0.333, -0.333]``)."""
    R = sequence_scores(token_rewards, mask)
    if R.numel() == 0 or bool((R == R[0]).all()):
        return torch.zeros_like(token_rewards * mask), R
    lengths = mask.sum(-1).double()
    b = (lengths * R.double()).sum() / lengths.sum().clamp(min=1)
    return broadcast((R.double() - b).to(R.dtype), mask), R


@register_estimator("shrinkage", Requirements(groups=True))
@torch.no_grad()
def shrinkage(
    *, token_rewards: Tensor, mask: Tensor, group_ids: Tensor, eps: float = SHRINKAGE_EPS, **_: object
) -> tuple[Tensor, Tensor]:
    """James-Stein shrinkage baseline (arXiv 2511.03710, as the authors' ``compute_jspo_outcome_advantage``):

    For sequence ``i`` of context ``g`` (``n_g`` members, mean ``mu_g``), with every statistic taken over
    the *other* contexts ``k != g`` only (``K - 1`` of them):

    - ``v^2 = mean_k var_k / n_k`` (``var_k`` the unbiased variance of context ``k``'s rewards; 0 for a
      context of one), the noise of a context's mean;
    - ``s^2 = mean_k (mu_k - mean_k mu_k)^2``, the spread of the true means;
    - ``lambda_g = v^2 / (v^2 + s^2 + eps)``;
    - ``m_g`` = the mean of every reward of the other contexts;
    - baseline ``b_i = (1 - lambda_g) * loo_i + lambda_g * m_g``, ``loo_i = mean_{j in g, j != i} R_j``;
      ``A_i = R_i - b_i``.

    Choices where the code leaves a case open (it asserts equal groups of at least two and more than one
    context): groups may differ in size (each uses its own ``n_k``); a context of one member has no
    leave-one-out mean and takes ``b = m_g`` (``lambda = 1``); with a single context in the batch there is
    nothing to shrink toward: ``lambda = 0``, plain RLOO. Unlike ``rloo`` an equal-reward group does
    *not* get 0: shrinking its baseline toward the other contexts is the point.
    Worked example: contexts ``[1, 1]``, ``[1, 0]``, ``[0, 0]``; for the first, the others have means
    ``0.5, 0`` (mean 0.25, ``s^2 = 0.0625``), ``v^2 = (0.5 / 2 + 0) / 2 = 0.125``,
    ``lambda = 0.125 / 0.1875 = 2/3``, ``m = 0.25``: ``b = 1/3 + 1/6 = 0.5``, ``A = [0.5, 0.5]``.
    """
    R = sequence_scores(token_rewards, mask)
    r = R.double()
    _, inv = torch.unique(group_ids, return_inverse=True)
    K = int(inv.max().item()) + 1 if inv.numel() else 0
    g = group_stats(R, group_ids)
    count = torch.zeros(K, dtype=torch.float64, device=r.device).scatter_add_(0, inv, torch.ones_like(r))
    total = torch.zeros(K, dtype=torch.float64, device=r.device).scatter_add_(0, inv, r)
    mu = total / count
    csq = torch.zeros(K, dtype=torch.float64, device=r.device).scatter_add_(0, inv, (r - mu[inv]) ** 2)
    noise = torch.where(count > 1, csq / (count - 1).clamp(min=1) / count, torch.zeros_like(count))
    loo = (g.total - r) / (g.count - 1).clamp(min=1)
    if K < 2:
        a = torch.where(g.count > 1, r - loo, torch.zeros_like(r))
        return broadcast(a.to(R.dtype), mask), R
    others = 1.0 - torch.eye(K, dtype=torch.float64, device=r.device)  # row g: the contexts k != g
    mu_bar = others @ mu / (K - 1)
    v2 = others @ noise / (K - 1)
    s2 = (others * (mu[None, :] - mu_bar[:, None]) ** 2).sum(1) / (K - 1)
    lam = v2 / (v2 + s2 + eps)
    m_other = (others @ total) / (others @ count)
    lam_i = torch.where(g.count > 1, lam[inv], torch.ones_like(r))
    b = (1.0 - lam_i) * torch.where(g.count > 1, loo, torch.zeros_like(r)) + lam_i * m_other[inv]
    return broadcast((r - b).to(R.dtype), mask), R


# --------------------------------------------------------------------------------------------------
# SPO


SPO_PRIOR = 0.5
"""``alpha = beta = 0.5`` for a context never seen (the recipe without offline values: Jeffreys' prior)."""
SPO_D_HALF = 0.06
"""The policy distance at which the tracker's memory halves: ``rho = 2^(-D / D_half)`` (the recipe)."""
SPO_RHO_MIN = 0.875
"""Lower clip of ``rho``: the most a single visit can forget (the recipe's ``rho.clip_lower``)."""
SPO_RHO_MAX = 0.96
"""Upper clip of ``rho``: even an unmoved policy forgets a little (the recipe's constant 0.96)."""
SPO_EXPLORATION = 0.05
"""Added to every context's sampling weight, so that a context the tracker is sure of is still drawn."""


@register_estimator("spo", Requirements(tracker=True))
@torch.no_grad()
def spo(
    *, token_rewards: Tensor, mask: Tensor, tracker_values: Tensor, spo_eps: float = 1e-8, **_: object
) -> tuple[Tensor, Tensor]:
    """SPO's advantage: ``A_b = R_b - p_hat(context_b)``, the tracker's estimate read *before* this
    batch's outcomes enter it, then normalised over the batch: ``(A - mean) / (std + 1e-8)``, the
    unbiased std (the recipe's ``advantages.std()``). No groups, no critic network.
    Worked example: ``R = [1, 0, 1]``, ``p_hat = [0.5, 0.5, 0.9]``: ``A = [0.5, -0.5, 0.1]``, mean
    ``0.0333``, std ``0.5033``: ``[0.927, -1.060, 0.132]``. A batch of one row, or whose ``R - p_hat`` are
    all equal, gets exactly 0 (no spread to normalise by)."""
    if tracker_values is None or tracker_values.shape != mask.shape[:1]:
        raise ValueError(f"spo needs one tracker value per sequence, shape ({mask.shape[0]},)")
    R = sequence_scores(token_rewards, mask)
    a = R.double() - tracker_values.double()
    if a.numel() < 2 or bool((a == a[0]).all()):
        return torch.zeros_like(token_rewards * mask), R
    a = (a - a.mean()) / (a.std() + spo_eps)
    return broadcast(a.to(R.dtype), mask), R


def spo_discount(distance: float, d_half: float = SPO_D_HALF) -> float:
    """``rho = clip(2^(-D / D_half), rho_min, rho_max)``: how much of a context's Beta counts survive
    a policy that moved by ``D`` (the mean absolute log-prob change of the context's last response,
    per position, between when it was sampled and now)."""
    rho: float = 2.0 ** (-distance / d_half)
    return min(max(rho, SPO_RHO_MIN), SPO_RHO_MAX)


@dataclass
class ValueTracker:
    """SPO's per-context Beta estimate of the success probability.

    Each context ``c`` (a prompt's index in the data, or a control start state) holds ``(alpha_c,
    beta_c)``, ``p_hat_c = alpha_c / (alpha_c + beta_c)``; unseen: ``(0.5, 0.5)``. After a visit with
    outcome ``R`` in ``[0, 1]`` and discount ``rho``: ``alpha <- rho alpha + R``,
    ``beta <- rho beta + (1 - R)`` (the recipe, its lines ``alpha = rho * alpha + r``). Its state is
    plain floats keyed by context id, so it goes into a checkpoint as it is (:meth:`state_dict`).
    """

    alpha: dict[int, float] = field(default_factory=dict)
    beta: dict[int, float] = field(default_factory=dict)

    def p_hat(self, contexts: list[int]) -> Tensor:
        """``[len(contexts)]`` float64: each context's current estimate (0.5 if never seen)."""
        return torch.tensor(
            [
                self.alpha.get(c, SPO_PRIOR) / (self.alpha.get(c, SPO_PRIOR) + self.beta.get(c, SPO_PRIOR))
                for c in contexts
            ],
            dtype=torch.float64,
        )

    def update(self, contexts: list[int], rewards: list[float], rhos: list[float]) -> None:
        """Fold one outcome per row in, in row order (a context drawn twice in a batch is folded twice)."""
        for c, r, rho in zip(contexts, rewards, rhos, strict=True):
            r = min(max(float(r), 0.0), 1.0)
            self.alpha[c] = rho * self.alpha.get(c, SPO_PRIOR) + r
            self.beta[c] = rho * self.beta.get(c, SPO_PRIOR) + (1.0 - r)

    def sampling_weights(self, contexts: list[int]) -> Tensor:
        """``w_c = sqrt(p_hat_c (1 - p_hat_c)) + 0.05``: contexts near 50 % success are drawn most."""
        p = self.p_hat(contexts)
        return torch.sqrt(p * (1.0 - p)) + SPO_EXPLORATION

    def state_dict(self) -> dict[str, dict[int, float]]:
        return {
            "alpha": {int(k): float(v) for k, v in self.alpha.items()},
            "beta": {int(k): float(v) for k, v in self.beta.items()},
        }

    def load_state_dict(self, state: dict[str, dict[Any, Any]]) -> None:  # keys: ints, or their JSON strings
        self.alpha = {int(k): float(v) for k, v in state["alpha"].items()}
        self.beta = {int(k): float(v) for k, v in state["beta"].items()}


# --------------------------------------------------------------------------------------------------
# A*-PO


ASTAR_SAMPLES = 8
"""``k``: reference samples per context for ``V*`` (TRL's ``num_value_samples``; the authors' scripts'
``num_gen_to_use=8``)."""
ASTAR_BETA1 = 0.5
"""``beta1`` of ``V*`` (TRL's ``A2POConfig.beta1``; the authors' scripts' ``beta1=0.5``)."""
ASTAR_BETA2 = 1e-3
"""``beta2`` of the stage-2 regression (TRL's ``A2POConfig.beta2``; the authors' scripts' ``beta2=1e-3``)."""


def optimal_value(rewards: Tensor, beta1: float = ASTAR_BETA1) -> Tensor:
    """A*-PO's stage 1: ``V*(x) = beta1 * log( (1/k) sum_i exp(r(x, y_i) / beta1) )`` over the last dim
    of ``rewards`` (``[..., k]``: the rewards of ``k`` samples of the reference policy for one context),
    computed stably as ``beta1 * (logsumexp(r / beta1) - log k)`` (TRL's ``_estimate_optimal_values``).

    ``V*`` lies between the mean reward (``beta1 -> inf``) and the best one (``beta1 -> 0``).
    Worked example: ``r = [1, 0, 0, 0]``, ``beta1 = 0.5``: ``0.5 * log((e^2 + 3) / 4) = 0.4772``;
    all ``k`` rewards 0: ``V* = 0``; all 1: ``V* = 1``. Float64 result."""
    if beta1 <= 0:
        raise ValueError(f"beta1 must be > 0, got {beta1}")
    r = rewards.double()
    if r.shape[-1] == 0:
        raise ValueError("V* needs at least one reference sample per context")
    return beta1 * (torch.logsumexp(r / beta1, dim=-1) - math.log(r.shape[-1]))


@register_estimator("astar-po", Requirements(optimal_values=True))
@torch.no_grad()
def astar_po(
    *, token_rewards: Tensor, mask: Tensor, optimal_values: Tensor, **_: object
) -> tuple[Tensor, Tensor]:
    """A*-PO's optimal-advantage estimate: ``A_b = R_b - V*(context_b)``, ``V*`` read from the table
    estimated before training (:func:`optimal_value`). No normalisation, no groups, no critic: it is the
    regression target of :func:`~sppo_rl.agents.losses.regression_loss`, in reward units.
    Worked example: ``R = [1, 0]``, ``V* = [0.4772, 0.4772]``: ``A = [0.5228, -0.4772]``."""
    if optimal_values is None or optimal_values.shape != mask.shape[:1]:
        raise ValueError(f"astar-po needs one V* per sequence, shape ({mask.shape[0]},)")
    R = sequence_scores(token_rewards, mask)
    a = R.double() - optimal_values.double()
    return broadcast(a.to(R.dtype), mask), R


# --------------------------------------------------------------------------------------------------
# C-RF with negative-token filtering ("Rethinking Groups")


NTF_KEEP = 0.1
"""The fraction of a failed response's tokens that keep its penalty: its least likely ones."""


@register_estimator("crf-ntf", Requirements(logprobs=True))
@torch.no_grad()
def crf_ntf(
    *, token_rewards: Tensor, mask: Tensor, logp_old: Tensor, ntf_keep: float = NTF_KEEP, **_: object
) -> tuple[Tensor, Tensor]:
    """Contrastive REINFORCE with negative-token filtering, one sample per context (arXiv 2606.17250,
    as a third-party reproduction reads it: docs/algorithms.md "C-RF with negative-token filtering").

    The batch is split by outcome, no groups: a response is positive when ``R > 0``. The objective
    ``-(1/2) (mean_pos l_pos - mean_neg l_neg)`` gives each side half the weight whatever its size, so
    with ``n_pos`` positive and ``n_neg`` negative rows among ``B``: ``A = +B / (2 n_pos)`` on every
    position of a positive row and ``-B / (2 n_neg)`` on the kept positions of a negative row; a batch
    of one side gets ``+-1`` (its side alone). Negative-token filtering keeps a negative row's penalty
    on its ``k = max(1, ceil(ntf_keep * l))`` least likely positions (lowest ``logp_old``; ties: the
    earlier) and gives the others 0, which stay in the loss's denominator (the positions' mask is not
    changed). With PPO's clipped surrogate (``A > 0``: ``min(r, 1 + eps_high)``; ``A < 0``:
    ``max(r, 1 - eps_low)``) and ``seq-mean-token-mean`` this is the source's loss.
    Worked example: ``R = [1, 0, 0]`` of lengths ``[2, 4, 3]``: ``A = +3/2`` on row 0, ``-3/4`` on the
    least likely position of rows 1 and 2 (``ceil(0.4) = ceil(0.3) = 1``), 0 elsewhere."""
    if not 0.0 < ntf_keep <= 1.0:
        raise ValueError(f"ntf_keep must be in (0, 1], got {ntf_keep}")
    if logp_old is None or logp_old.shape != mask.shape:
        raise ValueError(f"crf-ntf needs logp_old of the batch's shape {tuple(mask.shape)}")
    R = sequence_scores(token_rewards, mask)
    pos = R > 0
    n, n_pos = R.numel(), int(pos.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        w_pos = w_neg = 1.0
    else:
        w_pos, w_neg = n / (2 * n_pos), n / (2 * n_neg)
    valid = mask > 0
    lengths = valid.sum(-1)
    k = torch.clamp(torch.ceil(ntf_keep * lengths.double()), min=1).to(lengths.dtype)
    scores = torch.where(valid, logp_old.double(), torch.full_like(logp_old, math.inf, dtype=torch.float64))
    order = torch.argsort(scores, dim=-1, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    kept = valid & ((rank < k[:, None]) | pos[:, None])
    a = torch.where(pos, torch.full_like(R, w_pos), torch.full_like(R, -w_neg))
    return a[:, None].to(mask.dtype) * kept.to(mask.dtype), R


# --------------------------------------------------------------------------------------------------
# V0.5's fusion of a value prior with a sparse group


@register_estimator("v05", Requirements(groups=True, critic="sequence"))
@torch.no_grad()
def v05(
    *, token_rewards: Tensor, mask: Tensor, group_ids: Tensor, values: Tensor, **_: object
) -> tuple[Tensor, Tensor]:
    """V0.5's baseline (arXiv 2603.10848, as read in a summary that gives its equations: docs/algorithms.md
    "V0.5"): a value prior ``V`` fused with the mean ``v_g`` of the context's ``k`` samples,

    ``b = w v_g + (1 - w) V``, ``w = D^2 / (D^2 + s^2)``, ``D^2 = max(0, (v_g - V)^2 - s^2)``,

    the weight that minimises the baseline's MSE ``w^2 s^2 + (1 - w)^2 D^2``, with the prior's squared
    bias ``D^2`` estimated and truncated at 0 (the positive part acts as the test "is the prior off by
    more than the sampling noise?": if not, ``b = V``). ``s^2`` bounds the variance of a mean of ``k``
    rewards in ``[0, 1]``: ``1 / (4 k)`` (the source's ``1 / k`` for rewards in ``{-1, 1}``). ``A = R - b``,
    no division by a std. Here the prior is the run's own context critic (``sigmoid`` of SPPO's logit,
    trained on the outcome), not the paper's frozen generalist value model.
    Worked example: a group of ``k = 4`` with ``R = [1, 0, 0, 0]`` (``v_g = 0.25``, ``s^2 = 1/16``) and
    ``V = 0.5``: ``(0.25)^2 = 0.0625 <= 1/16``: the prior holds, ``b = 0.5``, ``A = [0.5, -0.5, -0.5,
    -0.5]``; with ``V = 0.9``: ``D^2 = 0.4225 - 0.0625 = 0.36``, ``w = 0.36 / 0.4225 = 0.852``,
    ``b = 0.852 * 0.25 + 0.148 * 0.9 = 0.346``."""
    if values is None or values.shape != mask.shape[:1]:
        raise ValueError(f"v05 needs one prior value per sequence, shape ({mask.shape[0]},)")
    R = sequence_scores(token_rewards, mask)
    g = group_stats(R, group_ids)
    v = values.double()
    s2 = 1.0 / (4.0 * g.count)
    d2 = torch.clamp((g.mean - v) ** 2 - s2, min=0.0)
    w = d2 / (d2 + s2)
    b = w * g.mean + (1.0 - w) * v
    return broadcast((R.double() - b).to(R.dtype), mask), R
