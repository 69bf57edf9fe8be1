"""Policy, value, KL and entropy terms on padded ``[B, T]`` batches.

Conventions: ``mask`` is 1 on valid positions; every per-position matrix is reduced to a scalar by
:func:`agg_loss`, the one place where aggregation is defined.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)
KLEstimator = Literal["k1", "k2", "k3"]
KL_CLAMP = 10.0
"""Default bound of :func:`kl_penalty`'s values: ``[-10, 10]``, verl's ``low_var_kl`` and OpenRLHF's."""
RatioLevel = Literal["token", "sequence", "sequence-token"]
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence", "sequence-token")
LossMode = Literal["ppo", "cispo", "dis", "regression"]


def agg_loss(
    loss_mat: Tensor, mask: Tensor, mode: AggMode = "token-mean", length_budget: int | None = None
) -> Tensor:
    """Reduce a ``[B, T]`` per-position loss to a scalar.

    - ``token-mean``: ``sum(l * m) / sum(m)``; every valid position weighs the same (verl's default and
      the SPPO paper's).
    - ``seq-mean-token-mean``: ``mean_b [ sum_t(l * m) / sum_t(m) ]`` over sequences with at least one
      valid position; every sequence weighs the same (the original GRPO).
    - ``seq-mean-token-sum``: ``mean_b [ sum_t(l * m) ]`` over sequences with at least one valid
      position: a sequence weighs as many times as it has positions (verl's ``seq-mean-token-sum``).
    - ``seq-mean-token-sum-norm``: ``mean_b [ sum_t(l * m) ] / L`` with a fixed length budget ``L``
      (default ``T``), so the weight of a position does not depend on its sequence's length (Dr. GRPO's
      paper and TRL's ``loss_type="dr_grpo"``; verl's mode of that name sums over the sequences instead of
      averaging, so it is ``B`` times this).

    Worked example: per-position losses ``[[1, 3, -], [2, -, -], [-, -, -]]`` (``-``: masked), ``T = 4``:
    token-mean ``6 / 3 = 2``, seq-mean-token-mean ``(2 + 2) / 2 = 2``, seq-mean-token-sum
    ``(4 + 2) / 2 = 3``, seq-mean-token-sum-norm ``(4 + 2 + 0) / 3 / 4 = 0.5``.
    """
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(-1)
        seq = (loss_mat * mask).sum(-1) / lengths.clamp(min=1)
        keep = (lengths > 0).to(seq.dtype)
        return (seq * keep).sum() / keep.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        keep = (mask.sum(-1) > 0).to(loss_mat.dtype)
        return ((loss_mat * mask).sum(-1) * keep).sum() / keep.sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        budget = loss_mat.shape[-1] if length_budget is None else length_budget
        if budget <= 0:
            raise ValueError(f"length_budget must be positive, got {budget}")
        return (loss_mat * mask).sum(-1).mean() / budget
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")


def agg_units(mask: Tensor, mode: AggMode = "token-mean") -> float:
    """How much of :func:`agg_loss`'s denominator rows ``mask`` make up: valid positions
    (``token-mean``), rows with a valid position (``seq-mean-token-mean``, ``seq-mean-token-sum``) or
    rows (``seq-mean-token-sum-norm``). A batch split into parts ``k`` has
    ``agg_loss(whole) = sum_k agg_loss(part_k) * units(part_k) / units(whole)``: the weight of a
    micro-batch, or of a data-parallel rank, in the whole batch's loss."""
    if mode == "token-mean":
        return float(mask.sum())
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return float((mask.sum(-1) > 0).sum())
    if mode == "seq-mean-token-sum-norm":
        return float(mask.shape[0])
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: AggMode = "token-mean",
    length_budget: int | None = None,
    ratio_level: RatioLevel = "token",
    mode: LossMode = "ppo",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate, CISPO's importance-weighted REINFORCE, or SAO's masked one (DIS).

    The importance ratio, by ``ratio_level``:

    - ``"token"``: ``r_t = exp(logp_t - logp_old_t)`` per position (PPO);
    - ``"sequence"`` (GSPO, arXiv 2507.18071 Sec. 4.1): ``s_b = exp(mean_t (logp - logp_old))`` over the
      sequence's positions in ``mask`` (the geometric mean of its token ratios), the same on each of
      them, so one sequence is clipped as a whole; its gradient reaches every position as
      ``s_b / |y_b|`` times the SUM of the sequence's advantages, so per-token advantages are averaged
      (``A = [1, -1]`` over one sequence's two tokens gives the gradient ``[0, 0]``);
    - ``"sequence-token"`` (GSPO-token, the paper's Sec. 4.3): ``s_t = sg[s_b] * pi_t / sg[pi_t]``, whose
      value is ``s_b`` on every position (clipped as a whole, as above) and whose gradient is
      ``s_b * grad log pi_t``: each position keeps its own advantage (``A = [1, -1]`` under
      ``seq-mean-token-mean`` gives ``d loss / d logp = [-0.5, +0.5]`` at ``s_b = 1``). With one
      advantage per sequence it equals ``"sequence"`` in value and gradient.

    ``mode="ppo"``: ``l = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``; with
    ``dual_clip = c > 1``, positions with ``A < 0`` are further bounded: ``l = min(l, -c * A)`` (verl uses
    ``c = 3``). ``mode="cispo"`` (MiniMax-M1, arXiv 2506.13585 eqs. 4-5):
    ``l = -sg(min(ratio, 1 + clip_high)) * A * logp``: the weight is bounded above only (the paper sets no
    lower bound, so ``clip_low`` is not used: a ratio of 0.5 weighs 0.5) and carries no gradient, so no
    position's gradient is ever dropped.
    ``mode="dis"`` (SAO's direct double-sided importance sampling, arXiv 2607.07508 Sec. 3.1, Eq. 3):
    ``l = -sg(f(ratio)) * A * logp`` with ``f(r) = r`` inside the open trust region
    ``1 - clip_low < r < 1 + clip_high`` and ``f(r) = 0`` outside it, whatever the sign of ``A``: a
    position outside is masked (no loss, no gradient), not clamped to the bound, and still counts in the
    aggregation's denominator. Its gradient ``f(r) A grad log pi`` equals that of ``f(r) A`` with the ratio
    differentiated. Worked example: ratios ``[0.5, 0.8, 2.0, 7.0]``, ``A = 1``, ``clip_low = 0.3``,
    ``clip_high = 5`` (the region ``(0.7, 6)``): ``f = [0, 0.8, 2, 0]``, so under ``token-mean``
    ``d loss / d logp = [0, -0.2, -0.5, 0]`` (PPO gives ``[-0.125, -0.2, -0.5, 0]``: it keeps the low
    ratio of a positive advantage; CISPO ``[-0.125, -0.2, -0.5, -1.5]``).
    ``weights`` (no gradient; e.g. truncated importance weights ``min(pi_old / mu, C)`` against the
    sampler's own log-probs ``mu``) multiply each position's loss.
    Returns ``(agg_loss(l), metrics)``; metrics: ``clipfrac`` (fraction of valid positions where the
    clipped term is the active one; for CISPO where the weight is capped), ``approx_kl`` (k1:
    ``mean(logp_old - logp)``), ``approx_kl_k3`` (``mean((r - 1) - log r)``, token ratios),
    ``ratio_min``, ``ratio_max``, ``dual_clipfrac``; for DIS ``clipfrac`` is the fraction of valid
    positions masked.
    """
    mask = mask.to(logp.dtype)
    token_log_ratio = (logp - logp_old).clamp(-20.0, 20.0)
    if ratio_level in ("sequence", "sequence-token"):
        n_b = mask.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = ((token_log_ratio * mask).sum(-1, keepdim=True) / n_b).expand_as(logp)
        if ratio_level == "sequence-token":  # value s_b, gradient s_b * d logp_t
            log_ratio = logp - logp.detach() + log_ratio.detach()
    elif ratio_level == "token":
        log_ratio = token_log_ratio
    else:
        raise ValueError(f"ratio_level must be one of {', '.join(RATIO_LEVELS)}, got {ratio_level!r}")
    ratio = torch.exp(log_ratio)
    dual_active = torch.zeros_like(ratio, dtype=torch.bool)
    if mode == "cispo":
        weight = torch.clamp(ratio, max=1.0 + clip_high).detach()
        per_pos = -weight * advantages * logp
        clip_active = ratio > 1.0 + clip_high
    elif mode == "dis":
        inside = (ratio > 1.0 - clip_low) & (ratio < 1.0 + clip_high)
        weight = torch.where(inside, ratio, torch.zeros_like(ratio)).detach()
        per_pos = -weight * advantages * logp
        clip_active = ~inside
    elif mode == "ppo":
        clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        unclipped = -advantages * ratio
        clipped = -advantages * clipped_ratio
        per_pos = torch.maximum(unclipped, clipped)
        clip_active = clipped > unclipped
        if dual_clip is not None:
            if dual_clip <= 1.0:
                raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
            bound = -advantages * dual_clip
            dual_active = (advantages < 0) & (per_pos > bound)
            per_pos = torch.where(advantages < 0, torch.minimum(per_pos, bound), per_pos)
    else:
        raise ValueError(f"policy loss mode must be ppo, cispo or dis, got {mode!r}")
    if weights is not None:
        per_pos = per_pos * weights.detach()
    loss = agg_loss(per_pos, mask, agg, length_budget)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        valid = mask > 0
        any_valid = bool(valid.any())
        tok_ratio = torch.exp(token_log_ratio)
        metrics = {
            "clipfrac": float((clip_active.to(mask.dtype) * mask).sum() / n),
            "dual_clipfrac": float((dual_active.to(mask.dtype) * mask).sum() / n),
            "approx_kl": float((-token_log_ratio * mask).sum() / n),
            "approx_kl_k3": float((((tok_ratio - 1) - token_log_ratio) * mask).sum() / n),
            "ratio_min": float(ratio[valid].min()) if any_valid else 1.0,
            "ratio_max": float(ratio[valid].max()) if any_valid else 1.0,
        }
    return loss, metrics


def regression_loss(
    logp: Tensor,
    ref_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    beta: float,
    agg: AggMode = "seq-mean-token-mean",
    length_budget: int | None = None,
    logp_old: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """A*-PO's stage-2 loss (arXiv 2505.20686; TRL's ``A2POTrainer.compute_loss``, the authors'
    ``compute_policy_loss``): a least-squares regression of the implicit reward onto the advantage,

    ``l_b = ( beta * sum_t (logp_t - ref_logp_t) - a_b )^2``,

    the log-ratio to the reference summed over the sequence's positions in ``mask`` (both sources sum
    over the response's tokens), ``a_b`` the sequence's advantage (``R - V*``: its mean over its positions
    in ``mask``, where an estimator broadcasts one value). No ratio to the old policy, no clipping.
    ``l_b`` is put on each of the sequence's positions and reduced by :func:`agg_loss`, so every
    aggregation splits over micro-batches exactly as the learner weighs them; ``seq-mean-token-mean``
    (A*-PO's default) is ``mean_b l_b``, TRL's ``.mean()`` over sequences. A sequence with no position in
    ``mask`` has no loss.
    Worked example: ``beta = 0.1``; sequence 1: ``logp - ref = [0.5, 1.5]``, ``a = 0.5``:
    ``(0.1 * 2 - 0.5)^2 = 0.09``; sequence 2: ``[-1]``, ``a = -0.2``: ``(-0.1 + 0.2)^2 = 0.01``; mean 0.05.
    Metrics: ``implicit_reward`` (mean of ``beta * sum_t log ratio``), ``regression_target`` (mean ``a_b``),
    and, with ``logp_old``, PPO's ``approx_kl`` / ``approx_kl_k3`` / ``ratio_min`` / ``ratio_max`` of the
    token ratios to it (``clipfrac`` 0: nothing is clipped).
    """
    mask = mask.to(logp.dtype)
    n = mask.sum(-1)
    has = n > 0
    implicit = beta * ((logp - ref_logp) * mask).sum(-1)
    target = (advantages.to(logp.dtype) * mask).sum(-1) / n.clamp(min=1)
    per_seq = (implicit - target.detach()) ** 2
    loss = agg_loss(per_seq[:, None] * mask, mask, agg, length_budget)
    with torch.no_grad():
        rows = has.to(logp.dtype).sum().clamp(min=1)
        metrics = {
            "implicit_reward": float((implicit * has).sum() / rows),
            "regression_target": float((target * has).sum() / rows),
            "clipfrac": 0.0,
            "dual_clipfrac": 0.0,
        }
        if logp_old is not None:
            tlr = (logp - logp_old).clamp(-20.0, 20.0)
            tot = mask.sum().clamp(min=1)
            valid = mask > 0
            ratio = torch.exp(tlr)
            metrics["approx_kl"] = float((-tlr * mask).sum() / tot)
            metrics["approx_kl_k3"] = float((((ratio - 1) - tlr) * mask).sum() / tot)
            metrics["ratio_min"] = float(ratio[valid].min()) if bool(valid.any()) else 1.0
            metrics["ratio_max"] = float(ratio[valid].max()) if bool(valid.any()) else 1.0
    return loss, metrics


def clipped_value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: AggMode = "token-mean",
) -> Tensor:
    """Clipped MSE for a per-position critic (PPO).

    ``v_clip = v_old + clip(v - v_old, -c, c)``; ``l = 0.5 * max((v - G)^2, (v_clip - G)^2)``;
    with ``clip=None`` simply ``0.5 * (v - G)^2``.
    """
    err = (values - returns) ** 2
    if clip is not None:
        v_clipped = values_old + torch.clamp(values - values_old, -clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return 0.5 * agg_loss(err, mask, agg)


def bce_value_loss(
    logits: Tensor, targets: Tensor, mask: Tensor | None = None, agg: AggMode = "token-mean"
) -> Tensor:
    """BCE-with-logits of a success critic against the outcome.

    For the sequence critic (``[B]`` logits, no mask): ``mean_b BCE(logit_b, R_b)``, no value clipping.
    For a per-position critic (``[B, T]`` logits and targets, the BCE ablation): aggregated with ``agg``.
    """
    targets = targets.to(logits.dtype)
    if mask is None:
        return F.binary_cross_entropy_with_logits(logits, targets)
    per_pos = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return agg_loss(per_pos, mask, agg)


def kl_penalty(
    logp: Tensor, logp_ref: Tensor, estimator: KLEstimator = "k3", clamp: float | None = KL_CLAMP
) -> Tensor:
    """Per-position estimate of ``KL(pi || pi_ref)`` from samples of ``pi`` (on-policy).

    With ``d = logp_ref - logp``: ``k1 = -d``; ``k2 = d^2 / 2``; ``k3 = exp(d) - d - 1`` (``d`` clamped
    to ``[-20, 20]``). As values, on samples of ``pi``: ``k1`` and ``k3`` are unbiased estimates of
    ``KL(pi || pi_ref)`` (``k3`` also non-negative, low variance); ``k2`` is biased. Off-policy (samples
    of another policy) none of them is unbiased without an importance weight.

    As a loss term (differentiated through ``logp``, samples held fixed), the expected on-policy
    gradients differ (``tests/test_methods.py`` checks them exactly on a categorical policy):

    - ``k1``: ``E_pi[grad log pi] = 0``: no expected gradient at all (it regularises only as a reward);
    - ``k2``: ``E_pi[(log pi - log ref) grad log pi] = grad KL(pi || pi_ref)``;
    - ``k3``: ``E_pi[(1 - ref / pi) grad log pi] = grad KL(pi_ref || pi)``, the reverse KL.

    ``clamp = c`` bounds every estimate to ``[-c, c]`` (default 10; None, 0 or inf: unbounded), as
    OpenRLHF's ``compute_approx_kl`` does for all three and verl's ``kl_penalty`` for ``k3``
    (``low_var_kl``). Where the bound is active the position's value is ``+-c`` and its gradient 0:
    without it ``k3`` and its gradient ``1 - e^d`` grow like ``e^d`` as the reference gets likelier than
    the policy (``k3 = 10`` at ``d = 2.611``, the reference 13.6 times likelier, and at ``d = -11.0``);
    ``k2`` reaches 10 at ``|d| = 4.472``, ``k1`` at ``|d| = 10``. Inside the bound every value is
    unchanged to the bit.
    The default, ``k3`` in the loss clamped at 10, is verl's (``low_var_kl``) and GRPO's estimator.
    """
    d = logp_ref - logp
    if estimator == "k1":
        out = -d
    elif estimator == "k2":
        out = 0.5 * d**2
    elif estimator == "k3":
        d = d.clamp(-20.0, 20.0)
        out = torch.exp(d) - d - 1.0
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: k1, k2, k3")
    if clamp is not None and 0 < clamp < math.inf:
        out = out.clamp(-clamp, clamp)
    return out


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of a categorical over the last dim: ``logsumexp(z) - sum softmax(z) * z``."""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor | None = None) -> float:
    """``1 - Var[target - pred] / Var[target]`` over valid positions (nan when the target is constant)."""
    if mask is not None:
        keep = mask > 0
        pred, target = pred[keep], target[keep]
    var_t = target.var(unbiased=False)
    if target.numel() < 2 or float(var_t) == 0.0:
        return float("nan")
    return float(1.0 - (target - pred).var(unbiased=False) / var_t)
