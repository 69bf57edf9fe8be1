"""Losses against SPEC.md section 3's worked numbers and their definitions."""

from __future__ import annotations

import math

import pytest
import torch

from sppo_rl.agents.algorithms import critic_loss, get_algorithm
from sppo_rl.agents.batch import lengths_to_mask
from sppo_rl.agents.losses import (
    agg_loss,
    agg_units,
    bce_value_loss,
    clipped_value_loss,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
)


def _per_token_objectives(ratios: torch.Tensor, adv: float) -> list[float]:
    """Each position's objective ``-l_t`` as the library computes it (clip range 0.8..1.2): the
    token-mean loss over a mask that keeps that position alone."""
    logp, logp_old = torch.log(ratios), torch.zeros_like(ratios)
    A = torch.full_like(ratios, adv)
    out = []
    for t in range(ratios.shape[1]):
        only_t = torch.zeros_like(ratios)
        only_t[0, t] = 1.0
        loss, _ = policy_loss(logp, logp_old, A, only_t, clip_low=0.2, clip_high=0.2)
        out.append(-float(loss))
    return out


def test_worked_example_token_mean():
    ratios = torch.tensor([[1.10, 1.35, 0.75]])
    logp_old = torch.zeros(1, 3)
    logp = torch.log(ratios)
    adv = torch.full((1, 3), 0.35)
    mask = torch.ones(1, 3)
    loss, m = policy_loss(logp, logp_old, adv, mask, clip_low=0.2, clip_high=0.2)
    # objective min(r * A, clip(r, 0.8, 1.2) * A) with A = 0.35:
    #   r = 1.10 (inside the range): min(1.10 * 0.35 = 0.385,  0.385)            = 0.385
    #   r = 1.35 (above it):         min(1.35 * 0.35 = 0.4725, 1.2 * 0.35 = 0.42) = 0.42   (clipped)
    #   r = 0.75 (below it):         min(0.75 * 0.35 = 0.2625, 0.8 * 0.35 = 0.28) = 0.2625 (A > 0: unclipped)
    assert _per_token_objectives(ratios, 0.35) == pytest.approx([0.385, 0.42, 0.2625])
    # loss = -(0.385 + 0.42 + 0.2625) / 3 = -1.0675 / 3 = -0.355833
    assert float(loss) == pytest.approx(-0.355833, abs=1e-6)
    assert m["clipfrac"] == pytest.approx(1 / 3)
    assert m["ratio_min"] == pytest.approx(0.75) and m["ratio_max"] == pytest.approx(1.35)
    # ln 1.10 = 0.095310, ln 1.35 = 0.300105, ln 0.75 = -0.287682
    # k1 = mean(-ln r) = -(0.095310 + 0.300105 - 0.287682) / 3 = -0.107733 / 3 = -0.035911
    # k3 = mean(r - 1 - ln r) = (0.004690 + 0.049895 + 0.037682) / 3 = 0.092267 / 3 = 0.030756
    assert m["approx_kl"] == pytest.approx(-0.035911, abs=1e-6)
    assert m["approx_kl_k3"] == pytest.approx(0.030756, abs=1e-6)


def test_worked_example_negative_advantage():
    ratios = torch.tensor([[1.10, 1.35, 0.75]])
    # A = -0.65: min(r * A, clip(r, 0.8, 1.2) * A)
    #   r = 1.10: min(1.10 * -0.65 = -0.715,  -0.715)              = -0.715
    #   r = 1.35: min(1.35 * -0.65 = -0.8775, 1.2 * -0.65 = -0.78) = -0.8775 (A < 0: not clipped)
    #   r = 0.75: min(0.75 * -0.65 = -0.4875, 0.8 * -0.65 = -0.52) = -0.52   (clipped)
    assert _per_token_objectives(ratios, -0.65) == pytest.approx([-0.715, -0.8775, -0.52])
    loss, m = policy_loss(torch.log(ratios), torch.zeros(1, 3), torch.full((1, 3), -0.65), torch.ones(1, 3))
    # loss = (0.715 + 0.8775 + 0.52) / 3 = 2.1125 / 3 = 0.704167
    assert float(loss) == pytest.approx(0.704167, abs=1e-6)
    assert m["clipfrac"] == pytest.approx(1 / 3)


def test_critic_bce_worked_example():
    logit = torch.tensor([math.log(0.65 / 0.35)])
    assert float(bce_value_loss(logit, torch.tensor([1.0]))) == pytest.approx(-math.log(0.65), abs=1e-6)
    assert float(bce_value_loss(logit, torch.tensor([1.0]))) == pytest.approx(0.4308, abs=1e-4)
    assert float(bce_value_loss(logit, torch.tensor([0.0]))) == pytest.approx(-math.log(0.35), abs=1e-6)


def test_asymmetric_and_dual_clip():
    logp_old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 5.0]]))
    mask = torch.ones(1, 2)
    # positive advantage: clip_high binds
    loss, _ = policy_loss(logp, logp_old, torch.ones(1, 2), mask, clip_low=0.2, clip_high=0.28)
    assert float(loss) == pytest.approx(-1.28)
    # negative advantage, huge ratio: plain PPO loss = ratio * |A| unbounded; dual clip caps at c * |A|
    adv = -torch.ones(1, 2)
    plain, _ = policy_loss(logp, logp_old, adv, mask)
    assert float(plain) == pytest.approx((1.5 + 5.0) / 2)
    dual, m = policy_loss(logp, logp_old, adv, mask, dual_clip=3.0)
    assert float(dual) == pytest.approx((1.5 + 3.0) / 2)
    assert m["dual_clipfrac"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        policy_loss(logp, logp_old, adv, mask, dual_clip=1.0)


def test_loss_ignores_padding_and_gradient_matches():
    mask = lengths_to_mask(torch.tensor([2, 1]), 3)
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]]) * mask
    loss, _ = policy_loss(logp, torch.zeros(2, 3), adv, mask)
    loss.backward()
    # at ratio 1, d(-ratio*A)/dlogp = -A, token-mean over the 3 valid positions: -A / 3; padding: 0
    expected = torch.tensor([[-1 / 3, -2 / 3, 0.0], [-3 / 3, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)


def test_aggregation_modes():
    loss_mat = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = lengths_to_mask(torch.tensor([2, 1, 0]), 4)
    assert float(agg_loss(loss_mat, mask, "token-mean")) == pytest.approx(6 / 3)
    # seq-mean-token-mean skips the empty sequence: mean(2, 2)
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-mean")) == pytest.approx(2.0)
    # seq sums (4, 2, 0) averaged over B = 3, divided by the budget
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-sum-norm")) == pytest.approx(2 / 4)
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", length_budget=10)) == pytest.approx(0.2)
    # seq-mean-token-sum (verl's): sums (4, 2) over the 2 non-empty sequences
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-sum")) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="valid: token-mean"):
        agg_loss(loss_mat, mask, "mean")  # type: ignore[arg-type]


def test_seq_mean_token_sum_weighs_each_position_one_over_the_sequences():
    """``seq-mean-token-sum`` = ``mean_b sum_t l * m`` over non-empty sequences: every valid position's
    gradient is ``1 / B'`` (B' = 2 here), whatever its sequence's length, where ``token-mean`` gives
    ``1 / 4`` and ``seq-mean-token-mean`` ``1 / (2 * length)``. verl's ``seq-mean-token-sum-norm`` is
    ``sum_b sum_t l * m / L``: ``B`` times this project's (and TRL's ``dr_grpo``) ``mean_b ... / L``."""
    mask = lengths_to_mask(torch.tensor([3, 1, 0]), 4)
    for mode, expected in [
        ("seq-mean-token-sum", [[0.5, 0.5, 0.5, 0.0], [0.5, 0.0, 0.0, 0.0]]),
        ("token-mean", [[0.25, 0.25, 0.25, 0.0], [0.25, 0.0, 0.0, 0.0]]),
        ("seq-mean-token-mean", [[1 / 6, 1 / 6, 1 / 6, 0.0], [0.5, 0.0, 0.0, 0.0]]),
    ]:
        x = torch.zeros(3, 4, requires_grad=True)
        agg_loss(x, mask, mode).backward()  # type: ignore[arg-type]
        torch.testing.assert_close(x.grad[:2], torch.tensor(expected))
        assert torch.all(x.grad[2] == 0)
    loss_mat = torch.rand(3, 4)
    verl_norm = (loss_mat * mask).sum() / 4  # verl: the sequences' sums added, then / L
    ours = agg_loss(loss_mat, mask, "seq-mean-token-sum-norm")
    torch.testing.assert_close(verl_norm, 3 * ours)
    assert agg_units(mask, "seq-mean-token-sum") == 2.0


def test_every_aggregation_is_a_choice_of_the_agg_flag():
    from typing import get_args

    from sppo_rl.agents.losses import AGG_MODES
    from sppo_rl.config import AggName

    assert get_args(AggName) == AGG_MODES and "seq-mean-token-sum" in AGG_MODES


def test_verls_dual_clip_c3_by_hand():
    """verl's ``compute_policy_loss_vanilla`` applies ``clip_ratio_c = 3`` to every ``A < 0`` position:
    ``l = min(max(-A r, -A clip(r, 0.8, 1.2)), -3 A)``. ``A = -1``, ``r = [0.5, 1, 2, 5]``:
    PPO ``[0.8, 1, 2, 5]`` -> dual ``[0.8, 1, 2, 3]`` (mean 1.7 against 2.2); ``A = +1``: PPO
    ``-min(r, clip(r))`` = ``[-0.5, -1, -1.2, -1.2]`` with or without the dual clip."""
    r = torch.tensor([[0.5, 1.0, 2.0, 5.0]])
    logp, logp_old, mask = torch.log(r), torch.zeros(1, 4), torch.ones(1, 4)
    neg, pos = -torch.ones(1, 4), torch.ones(1, 4)
    assert float(policy_loss(logp, logp_old, neg, mask)[0]) == pytest.approx((0.8 + 1 + 2 + 5) / 4)
    dual, m = policy_loss(logp, logp_old, neg, mask, dual_clip=3.0)
    assert float(dual) == pytest.approx((0.8 + 1 + 2 + 3) / 4)
    assert m["dual_clipfrac"] == pytest.approx(0.25)
    for c in (None, 3.0):
        assert float(policy_loss(logp, logp_old, pos, mask, dual_clip=c)[0]) == pytest.approx(-3.9 / 4)


def test_kl_clamp_bounds_every_estimator_at_ten_by_default():
    """``k3`` at ``d = ref - logp = 15``: ``e^15 - 16 = 3,269,001.4`` and gradient ``1 - e^15`` w.r.t.
    ``logp``; clamped (default 10, verl's ``low_var_kl`` and OpenRLHF's bound): 10, gradient 0.
    ``k1`` at ``d = -12``: 12 -> 10; ``k2`` at ``d = 5``: 12.5 -> 10. Inside the bound (``d = 2``: k3 =
    ``e^2 - 3 = 4.389``) the value is bit-identical with the clamp off; ``clamp`` None, 0 or inf: off."""
    ref = torch.tensor([15.0, 2.0, -12.0, 5.0], dtype=torch.float64)
    logp = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    k3 = kl_penalty(logp, ref, "k3")
    assert k3.tolist()[:2] == pytest.approx([10.0, math.exp(2) - 3], abs=1e-12)
    k3.sum().backward()
    assert logp.grad.tolist()[:2] == pytest.approx([0.0, 1 - math.exp(2)], abs=1e-12)
    for off in (None, 0.0, math.inf):
        raw = kl_penalty(logp.detach(), ref, "k3", clamp=off)
        assert float(raw[0]) == pytest.approx(math.exp(15) - 16, rel=1e-12)
        assert float(raw[1]) == float(k3[1].detach())
    g = logp.detach().clone().requires_grad_(True)
    kl_penalty(g, ref, "k3", clamp=None).sum().backward()
    assert float(g.grad[0]) == pytest.approx(1 - math.exp(15), rel=1e-12)
    assert kl_penalty(logp.detach(), ref, "k1").tolist() == pytest.approx([-10.0, -2.0, 10.0, -5.0])
    assert kl_penalty(logp.detach(), ref, "k2").tolist() == pytest.approx([10.0, 2.0, 10.0, 10.0])
    assert kl_penalty(logp.detach(), ref, "k2", clamp=100).tolist() == pytest.approx([100.0, 2.0, 72.0, 12.5])
    assert kl_penalty(logp.detach(), ref, "k1", clamp=5).tolist() == pytest.approx([-5.0, -2.0, 5.0, -5.0])


def test_kl_clamp_is_a_flag_that_reaches_the_learner():
    from sppo_rl.agents.learner import LearnerConfig
    from sppo_rl.llm.config import LLMConfig

    assert LLMConfig().kl_clamp == 10.0 and LearnerConfig().kl_clamp == 10.0
    assert LearnerConfig.from_run(LLMConfig(kl_clamp=0.0), 16).kl_clamp == 0.0
    assert LearnerConfig.from_run(LLMConfig(kl_clamp=3.5), 16).kl_clamp == 3.5
    for ok in (0.0, 3.5, math.inf):
        assert not [p for p in LLMConfig(kl_clamp=ok).problems() if "--kl-clamp" in p]
    assert [p for p in LLMConfig(kl_clamp=-1.0).problems() if "--kl-clamp" in p]


def test_clipped_value_loss():
    v_old = torch.tensor([[0.0, 0.0]])
    v = torch.tensor([[0.5, -0.1]])
    G = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    # pos 0: unclipped (0.5-1)^2 = .25, clipped v=.2 -> .64 -> max .64; pos 1: 1.21 vs 1.21
    assert float(clipped_value_loss(v, v_old, G, mask, clip=0.2)) == pytest.approx(0.5 * (0.64 + 1.21) / 2)
    assert float(clipped_value_loss(v, v_old, G, mask, clip=None)) == pytest.approx(0.5 * (0.25 + 1.21) / 2)


def test_kl_estimators():
    logp = torch.log(torch.tensor([0.5, 0.2]))
    ref = torch.log(torch.tensor([0.25, 0.4]))
    # log-ratio logp - ref: ln(0.5 / 0.25) = ln 2 = 0.693147, ln(0.2 / 0.4) = -ln 2; d = ref - logp
    # k1 = logp - ref                         = [0.693147, -0.693147]
    # k2 = 0.5 d^2 = 0.5 * 0.480453           = [0.240227, 0.240227]
    # k3 = e^d - d - 1: 0.5 + 0.693147 - 1   = 0.193147;  2 - 0.693147 - 1 = 0.306853
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([0.693147, -0.693147], abs=1e-6)
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.240227, 0.240227], abs=1e-6)
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx([0.193147, 0.306853], abs=1e-6)
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)
    assert torch.all(kl_penalty(logp, logp, "k3") == 0)
    # k1 and k3 are unbiased for KL(p || q): check on a categorical by exact expectation
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    # KL(p || q) = 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3) = 0.458145 - 0.153248 - 0.081093 = 0.223805
    kl = 0.223805
    for est in ("k1", "k3"):
        assert float((p * kl_penalty(p.log(), q.log(), est)).sum()) == pytest.approx(kl, abs=1e-6)
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, -10.0, -10.0, -10.0]])
    H = entropy_from_logits(logits)
    assert float(H[0]) == pytest.approx(math.log(4))
    assert float(H[1]) == pytest.approx(0.0, abs=1e-6)


def test_critic_loss_dispatch():
    mask = torch.ones(2, 3)
    R = torch.tensor([1.0, 0.0])
    seq_logits = torch.zeros(2)
    assert float(critic_loss(get_algorithm("sppo"), seq_logits, R, mask)) == pytest.approx(math.log(2))
    step_logits = torch.zeros(2, 3)
    ret = R[:, None].expand(2, 3)
    assert float(critic_loss(get_algorithm("ppo-bce"), step_logits, ret, mask)) == pytest.approx(math.log(2))
    vals = torch.full((2, 3), 0.5)
    assert float(critic_loss(get_algorithm("ppo"), vals, ret, mask, old_pred=vals)) == pytest.approx(
        0.5 * 0.25
    )
    with pytest.raises(ValueError, match="no critic"):
        critic_loss(get_algorithm("grpo"), vals, ret, mask)


def test_regression_loss_by_hand():
    """A*-PO's ``(beta sum_t (logp - ref) - a)^2``, mean over sequences: ``beta = 0.1``; sequence 1:
    ``logp - ref = [0.5, 1.5]``, ``a = 0.5``: ``(0.2 - 0.5)^2 = 0.09``; sequence 2: ``[-1]``, ``a = -0.2``:
    ``(-0.1 + 0.2)^2 = 0.01``; mean 0.05. A token *mean* of the log-ratio would give
    ``((0.1 - 0.5)^2 + 0.01) / 2 = 0.085``; a clipped surrogate something else again."""
    from sppo_rl.agents.losses import regression_loss

    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ref = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    logp = (ref + torch.tensor([[0.5, 1.5], [-1.0, 7.0]])).requires_grad_(True)  # 7.0: padding, ignored
    adv = torch.tensor([[0.5, 0.5], [-0.2, 0.0]])
    loss, m = regression_loss(logp, ref, adv, mask, beta=0.1)
    assert loss.item() == pytest.approx(0.05)
    assert m["implicit_reward"] == pytest.approx((0.2 - 0.1) / 2)
    assert m["regression_target"] == pytest.approx((0.5 - 0.2) / 2)
    loss.backward()
    # d/dlogp_t = 2 (beta S_b - a_b) beta / B on every valid position of b: -0.03 and +0.01, 0 on padding
    assert logp.grad.flatten().tolist() == pytest.approx([-0.03, -0.03, 0.01, 0.0])
    # token-mean weighs each sequence by its length: (2 * 0.09 + 1 * 0.01) / 3
    tm, _ = regression_loss(logp.detach(), ref, adv, mask, beta=0.1, agg="token-mean")
    assert tm.item() == pytest.approx(0.19 / 3)
