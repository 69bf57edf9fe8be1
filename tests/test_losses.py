"""Losses against SPEC.md section 3's worked numbers and their definitions."""

from __future__ import annotations

import math

import pytest
import torch

from sppo_rl.agents import (
    agg_loss,
    bce_value_loss,
    clipped_value_loss,
    critic_loss,
    entropy_from_logits,
    get_algorithm,
    kl_penalty,
    policy_loss,
)
from sppo_rl.agents.batch import lengths_to_mask


def test_worked_example_token_mean():
    ratios = torch.tensor([[1.10, 1.35, 0.75]])
    logp_old = torch.zeros(1, 3)
    logp = torch.log(ratios)
    adv = torch.full((1, 3), 0.35)
    mask = torch.ones(1, 3)
    loss, m = policy_loss(logp, logp_old, adv, mask, clip_low=0.2, clip_high=0.2)
    per_token = torch.minimum(ratios * 0.35, ratios.clamp(0.8, 1.2) * 0.35)
    assert per_token[0].tolist() == pytest.approx([0.385, 0.42, 0.2625])
    assert float(loss) == pytest.approx(-0.3558, abs=1e-4)
    assert float(loss) == pytest.approx(-(0.385 + 0.42 + 0.2625) / 3)
    assert m["clipfrac"] == pytest.approx(1 / 3)
    assert m["ratio_min"] == pytest.approx(0.75) and m["ratio_max"] == pytest.approx(1.35)
    k1 = float(-torch.log(ratios).mean())
    k3 = float((ratios - 1 - torch.log(ratios)).mean())
    assert m["approx_kl"] == pytest.approx(k1) and m["approx_kl_k3"] == pytest.approx(k3)


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
    # at ratio 1, d(-ratio*A)/dlogp = -A, token-mean over 3 valid positions
    torch.testing.assert_close(logp.grad, -adv / 3)


def test_aggregation_modes():
    loss_mat = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = lengths_to_mask(torch.tensor([2, 1, 0]), 4)
    assert float(agg_loss(loss_mat, mask, "token-mean")) == pytest.approx(6 / 3)
    # seq-mean-token-mean skips the empty sequence: mean(2, 2)
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-mean")) == pytest.approx(2.0)
    # seq sums (4, 2, 0) averaged over B = 3, divided by the budget
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-sum-norm")) == pytest.approx(2 / 4)
    assert float(agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", length_budget=10)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="valid: token-mean"):
        agg_loss(loss_mat, mask, "mean")  # type: ignore[arg-type]


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
    d = ref - logp
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), logp - ref)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d**2)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(d) - d - 1)
    assert torch.all(kl_penalty(logp, ref, "k3") >= 0)
    assert torch.all(kl_penalty(logp, logp, "k3") == 0)
    # k1 and k3 are unbiased for KL(p || q): check on a categorical by exact expectation
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    kl = float((p * (p / q).log()).sum())
    for est in ("k1", "k3"):
        assert float((p * kl_penalty(p.log(), q.log(), est)).sum()) == pytest.approx(kl)
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
