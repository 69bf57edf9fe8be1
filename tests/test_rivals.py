"""The single-sample rivals in the core (sppo_rl/agents/rivals.py): numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from sppo_rl.agents.advantages import ESTIMATORS, Requirements
from sppo_rl.agents.algorithms import check_setup, compute_advantages, get_algorithm
from sppo_rl.agents.batch import SequenceBatch, lengths_to_mask, terminal_rewards
from sppo_rl.agents.rivals import ValueTracker, optimal_value, spo_discount


def _batch(rewards, lengths):
    R = torch.tensor(rewards, dtype=torch.float64)
    mask = lengths_to_mask(torch.tensor(lengths)).double()
    return R, mask, terminal_rewards(R, mask)


def test_the_rivals_declare_what_they_need():
    assert ESTIMATORS["opo"].requires == Requirements(groups=True)
    assert ESTIMATORS["opo-batch"].requires == Requirements()
    assert ESTIMATORS["shrinkage"].requires == Requirements(groups=True)
    assert ESTIMATORS["spo"].requires == Requirements(tracker=True)
    assert ESTIMATORS["astar-po"].requires == Requirements(optimal_values=True)


# ---------------------------------------------------------------------------------------------- OPO


def test_opo_is_the_length_weighted_group_mean():
    """``R = [1, 0]`` of lengths ``[1, 3]``: ``b = (1*1 + 3*0) / 4 = 0.25``; the plain mean (0.5) fails."""
    R, mask, tr = _batch([1, 0, 1, 1, 0, 0], [1, 3, 2, 2, 1, 1])
    adv, ret = ESTIMATORS["opo"](token_rewards=tr, mask=mask, group_ids=torch.tensor([0, 0, 1, 1, 2, 2]))
    assert adv[0, 0].item() == pytest.approx(0.75)
    assert adv[1, :3].tolist() == pytest.approx([-0.25] * 3)
    assert torch.all(adv[2:] == 0.0)  # equal-reward groups: exactly 0
    assert torch.all(adv[mask == 0] == 0.0)
    assert ret.tolist() == R.tolist()


def test_opo_with_equal_lengths_is_drgrpo():
    R, mask, tr = _batch([1, 0, 0, 1, 1, 0], [4] * 6)
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    a, _ = ESTIMATORS["opo"](token_rewards=tr, mask=mask, group_ids=gid)
    b, _ = ESTIMATORS["drgrpo"](token_rewards=tr, mask=mask, group_ids=gid)
    torch.testing.assert_close(a, b)


def test_opo_batch_pools_over_the_batch():
    """``R = [1, 0, 0]``, lengths ``[2, 1, 1]``: ``b = 2/4``, ``A = [0.5, -0.5, -0.5]``."""
    R, mask, tr = _batch([1, 0, 0], [2, 1, 1])
    adv, _ = ESTIMATORS["opo-batch"](token_rewards=tr, mask=mask)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, -0.5])
    assert adv[0, 1].item() == pytest.approx(0.5) and adv[1, 1].item() == 0.0
    R, mask, tr = _batch([1, 1], [2, 3])
    assert torch.all(ESTIMATORS["opo-batch"](token_rewards=tr, mask=mask)[0] == 0.0)


def test_reinforce_batch_subtracts_the_batch_mean_and_reinforce_nothing():
    """``R = [1, 0, 0, 1, 1]`` of lengths ``[2, 1, 3, 1, 2]``: the batch mean is 0.6, so reinforce-batch
    gives ``[0.4, -0.6, -0.6, 0.4, 0.4]`` on every valid token (OPO's length weights would give
    ``b = 5/9``), and plain reinforce gives ``A = R``; the invalid row (``R = 1``, left out) moves
    neither the mean nor its own advantage off 0."""
    R, mask, _ = _batch([1, 0, 0, 1, 1, 1], [2, 1, 3, 1, 2, 2])
    logp = torch.zeros_like(mask)
    batch = SequenceBatch(mask=mask, logp_old=logp, rewards=R, valid=torch.tensor([True] * 5 + [False]))
    compute_advantages(batch, get_algorithm("reinforce-batch"))
    assert batch.advantages[:, 0].tolist() == pytest.approx([0.4, -0.6, -0.6, 0.4, 0.4, 0.0])
    assert batch.advantages[2].tolist() == pytest.approx([-0.6] * 3)
    assert batch.advantages[1, 1:].tolist() == [0.0, 0.0] and torch.all(batch.advantages[5] == 0.0)
    compute_advantages(batch, get_algorithm("reinforce"))
    assert batch.advantages[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    same, mask, _ = _batch([1, 1], [2, 3])
    equal = SequenceBatch(mask=mask, logp_old=torch.zeros_like(mask), rewards=same)
    assert torch.all(compute_advantages(equal, get_algorithm("reinforce-batch")).advantages == 0.0)


def test_whiten_is_refused_where_the_estimator_ignores_it():
    """``--whiten`` changes GAE's advantages only; given to any other method it would be silently ignored
    (a comparison once ran plain REINFORCE under the name of a whitened batch baseline), so it is refused."""
    for name in ("reinforce", "reinforce-batch", "sppo", "grpo", "spo"):
        with pytest.raises(ValueError, match=f"--whiten standardises GAE advantages; {name}'s estimator"):
            check_setup(get_algorithm(name), get_algorithm(name).group_size, 64, whiten=True)
    for name in ("ppo", "ppo-bce", "sao"):
        check_setup(get_algorithm(name), 1, 64, whiten=True)
    R, mask, tr = _batch([1, 0, 1, 1], [2, 1, 3, 2])
    values = torch.zeros_like(mask)
    plain, _ = ESTIMATORS["gae"](token_rewards=tr, mask=mask, values=values)
    whitened, _ = ESTIMATORS["gae"](token_rewards=tr, mask=mask, values=values, whiten=True)
    assert not torch.allclose(plain, whitened)  # where it is accepted, it does something


# --------------------------------------------------------------------------------------- shrinkage


def test_shrinkage_worked_example():
    """Contexts ``[1, 1]``, ``[1, 0]``, ``[0, 0]`` (see the docstring for the first context's numbers).

    Second context: others' means ``1, 0`` (mean 0.5, ``s^2 = 0.25``), ``v^2 = 0``: ``lambda = 0``,
    plain leave-one-out: ``A = [1 - 0, 0 - 1] = [1, -1]``. Third: mirror image of the first:
    ``A = [-0.5, -0.5]``."""
    R, mask, tr = _batch([1, 1, 1, 0, 0, 0], [2] * 6)
    adv, _ = ESTIMATORS["shrinkage"](token_rewards=tr, mask=mask, group_ids=torch.tensor([0, 0, 1, 1, 2, 2]))
    assert adv[:, 0].tolist() == pytest.approx([0.5, 0.5, 1.0, -1.0, -0.5, -0.5], abs=1e-5)
    # a wrong implementation that shrinks with its own context in the statistics gives other numbers
    lam_with_own = (0.125 * 2 / 3) / (0.125 * 2 / 3 + 1 / 6 + 1e-6)
    assert adv[0, 0].item() != pytest.approx(1 - ((1 - lam_with_own) * 1 + lam_with_own * 0.5), abs=1e-3)


def test_shrinkage_with_no_noise_is_rloo_and_one_context_is_rloo():
    R, mask, tr = _batch([1, 0, 0, 0, 1, 1], [3] * 6)
    gid = torch.tensor([0, 0, 1, 1, 2, 2])
    # contexts 1 and 2 have no within-context noise; context 0 has some: for contexts 1 and 2, v^2 > 0
    a, _ = ESTIMATORS["shrinkage"](token_rewards=tr, mask=mask, group_ids=gid)
    r, _ = ESTIMATORS["rloo"](token_rewards=tr, mask=mask, group_ids=gid)
    assert a[0, 0].item() == pytest.approx(r[0, 0].item(), abs=1e-5)  # others noiseless: lambda = 0
    assert a[2, 0].item() != pytest.approx(0.0)  # an equal-reward group is not zeroed
    one, _ = ESTIMATORS["shrinkage"](token_rewards=tr[:2], mask=mask[:2], group_ids=gid[:2])
    torch.testing.assert_close(one, r[:2])


# --------------------------------------------------------------------------------------------- SPO


def test_spo_advantage_worked_example():
    R, mask, tr = _batch([1, 0, 1], [2, 2, 1])
    adv, ret = ESTIMATORS["spo"](token_rewards=tr, mask=mask, tracker_values=torch.tensor([0.5, 0.5, 0.9]))
    a = torch.tensor([0.5, -0.5, 0.1])
    expected = (a - a.mean()) / (a.std() + 1e-8)
    assert expected.tolist() == pytest.approx([0.927, -1.060, 0.132], abs=1e-3)
    assert adv[:, 0].tolist() == pytest.approx(expected.tolist())
    assert adv[2, 1].item() == 0.0
    same, _ = ESTIMATORS["spo"](token_rewards=tr, mask=mask, tracker_values=R - 0.5)
    assert torch.all(same == 0.0)


def test_spo_runs_through_compute_advantages_with_invalid_rows():
    R = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.ones(4, 2)
    batch = SequenceBatch(
        mask=mask,
        logp_old=torch.zeros(4, 2),
        rewards=R,
        tracker_values=torch.tensor([0.5, 0.5, 0.9, 0.2]),
        valid=torch.tensor([True, True, True, False]),
    )
    compute_advantages(batch, get_algorithm("spo"))
    a = torch.tensor([0.5, -0.5, 0.1])
    assert batch.advantages[:3, 0].tolist() == pytest.approx(((a - a.mean()) / (a.std() + 1e-8)).tolist())
    assert torch.all(batch.advantages[3] == 0.0)
    with pytest.raises(ValueError, match="tracker_values"):
        compute_advantages(SequenceBatch(mask=mask, logp_old=None, rewards=R), get_algorithm("spo"))


def test_value_tracker_update_by_hand():
    """Unseen: ``(0.5, 0.5)``, ``p = 0.5``. Outcome 1 at ``rho = 0.96``: ``alpha = 0.48 + 1 = 1.48``,
    ``beta = 0.48``, ``p = 1.48 / 1.96 = 0.7551``; then 0 at ``rho = 0.875``: ``alpha = 1.295``,
    ``beta = 0.42 + 1 = 1.42``, ``p = 0.4770``."""
    t = ValueTracker()
    assert t.p_hat([3]).tolist() == [0.5]
    t.update([3], [1.0], [0.96])
    assert (t.alpha[3], t.beta[3]) == pytest.approx((1.48, 0.48))
    assert t.p_hat([3, 4]).tolist() == pytest.approx([1.48 / 1.96, 0.5])
    t.update([3], [0.0], [0.875])
    assert (t.alpha[3], t.beta[3]) == pytest.approx((1.295, 1.42))
    assert t.p_hat([3]).item() == pytest.approx(0.47698, abs=1e-5)
    # sampling weight sqrt(p (1 - p)) + 0.05: 0.55 for an unseen context
    assert t.sampling_weights([9]).item() == pytest.approx(0.55)
    s = ValueTracker()
    s.load_state_dict(t.state_dict())
    assert s == t


def test_spo_discount_by_hand():
    assert spo_discount(0.0) == 0.96  # unmoved policy: clipped at 0.96
    assert spo_discount(0.06 * math.log2(1 / 0.9)) == pytest.approx(0.9)  # 2^(-D / 0.06) = 0.9
    assert spo_discount(1.0) == 0.875  # far moved: clipped at 0.875


def test_shrinkage_over_valid_rows_and_a_lone_valid_member():
    """Group 0 ``[1, 0, invalid, 1]``, group 1 ``[1, invalid]``. Group 1's lone valid member has no
    leave-one-out mean: ``b = m`` = group 0's valid mean 2/3, ``A = 1/3``. Group 0's only other context
    has one member (no noise, ``v^2 = 0``): ``lambda = 0``, plain leave-one-out ``[0.5, -1, 0.5]``."""
    R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    b = SequenceBatch(
        mask=torch.ones(6, 2),
        logp_old=torch.zeros(6, 2),
        rewards=R,
        group_ids=torch.tensor([0, 0, 0, 0, 1, 1]),
        valid=torch.tensor([True, True, False, True, True, False]),
    )
    compute_advantages(b, get_algorithm("shrinkage"))
    assert b.advantages[:, 0].tolist() == pytest.approx([0.5, -1.0, 0.0, 0.5, 1 / 3, 0.0], abs=1e-5)


# ------------------------------------------------------------------------------------------- A*-PO


def test_optimal_value_by_hand():
    """``V* = beta1 log mean_i exp(r_i / beta1)``: ``r = [1, 0, 0, 0]``, ``beta1 = 0.5``:
    ``0.5 * log((e^2 + 3) / 4)``; the plain mean (0.25) and the max (1) both fail."""
    by_hand = 0.5 * math.log((math.exp(2.0) + 3.0) / 4.0)
    assert by_hand == pytest.approx(0.47723, abs=1e-5)
    v = optimal_value(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), 0.5)
    assert v.dtype == torch.float64
    assert v.tolist() == pytest.approx([by_hand, 0.0, 1.0], abs=1e-12)
    # beta1 = 1, r = [1, 0]: log((e + 1) / 2); small beta1 -> the best reward, large -> the mean
    assert optimal_value(torch.tensor([1.0, 0.0]), 1.0).item() == pytest.approx(math.log((math.e + 1) / 2))
    assert optimal_value(torch.tensor([1.0, 0.0]), 1e-3).item() == pytest.approx(1.0 - 1e-3 * math.log(2))
    assert optimal_value(torch.tensor([1.0, 0.0]), 1e4).item() == pytest.approx(0.5, abs=1e-4)
    # stable where exp(r / beta1) overflows in float32 (r / beta1 = 1000)
    assert optimal_value(torch.tensor([1.0, 1.0]), 1e-3).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="beta1"):
        optimal_value(torch.tensor([1.0]), 0.0)


def test_astar_advantage_is_the_outcome_minus_v_star():
    """``A = R - V*``, not normalised: ``R = [1, 0]``, ``V* = 0.4772``: ``[0.5228, -0.4772]``."""
    v = 0.5 * math.log((math.exp(2.0) + 3.0) / 4.0)
    R, mask, tr = _batch([1, 0, 1], [2, 3, 1])
    adv, ret = ESTIMATORS["astar-po"](
        token_rewards=tr, mask=mask, optimal_values=torch.tensor([v, v, 1.0], dtype=torch.float64)
    )
    assert adv[0, :2].tolist() == pytest.approx([1 - v] * 2)
    assert adv[1, :3].tolist() == pytest.approx([-v] * 3)
    assert adv[2, 0].item() == 0.0 and torch.all(adv[mask == 0] == 0.0)
    assert ret.tolist() == R.tolist()


def test_astar_runs_through_compute_advantages_with_invalid_rows():
    R = torch.tensor([1.0, 0.0, 1.0])
    batch = SequenceBatch(
        mask=torch.ones(3, 2),
        logp_old=torch.zeros(3, 2),
        rewards=R,
        optimal_values=torch.tensor([0.25, 0.5, 0.75]),
        valid=torch.tensor([True, True, False]),
    )
    compute_advantages(batch, get_algorithm("astar-po"))
    assert batch.advantages[:, 0].tolist() == pytest.approx([0.75, -0.5, 0.0])
    with pytest.raises(ValueError, match="optimal_values"):
        compute_advantages(
            SequenceBatch(mask=torch.ones(3, 2), logp_old=None, rewards=R), get_algorithm("astar-po")
        )


def test_astar_po_is_a_one_sample_regression_algorithm():
    algo = get_algorithm("astar-po")
    assert algo.group_size == 1 and algo.critic_loss == "none"
    assert algo.defaults == {"policy_loss": "regression", "agg": "seq-mean-token-mean"}


# ---------------------------------------------------------------------------------------------- SAO


def _dis_grad(ratios, advantages, mode="dis", agg="token-mean"):
    from sppo_rl.agents.losses import policy_loss

    r = torch.tensor([ratios], dtype=torch.float64)
    logp = torch.log(r).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=torch.float64)
    loss, m = policy_loss(logp, torch.zeros_like(r), adv, torch.ones_like(r), 0.3, 5.0, agg=agg, mode=mode)
    loss.backward()
    assert logp.grad is not None
    return loss.item(), logp.grad[0].tolist(), m


def test_dis_masks_the_ratios_outside_the_trust_region_by_hand():
    """SAO's Eq. 3 with its math setting ``eps_l = 0.3, eps_h = 5`` (the region ``(0.7, 6)``), ``A = 1``:
    ratios ``[0.5, 0.8, 2, 7]`` weigh ``f = [0, 0.8, 2, 0]``; ``l = -f A log pi`` over 4 tokens, so the
    gradient is ``-f / 4 = [0, -0.2, -0.5, 0]`` and the loss ``-(0.8 ln 0.8 + 2 ln 2) / 4 = -0.30194``.
    Clamping to the bounds would give ``[-0.175, ...]`` and ``-1.5``; PPO keeps the 0.5 of a positive
    advantage (``-0.125``); CISPO weighs the 7 by 6; a mean over the kept tokens would double everything."""
    loss, grad, m = _dis_grad([0.5, 0.8, 2.0, 7.0], [1.0] * 4)
    assert grad == pytest.approx([0.0, -0.2, -0.5, 0.0])
    assert loss == pytest.approx(-(0.8 * math.log(0.8) + 2 * math.log(2)) / 4)
    assert m["clipfrac"] == pytest.approx(0.5)  # the masked fraction
    assert _dis_grad([0.5, 0.8, 2.0, 7.0], [1.0] * 4, mode="ppo")[1] == pytest.approx([-0.125, -0.2, -0.5, 0])
    assert _dis_grad([0.5, 0.8, 2.0, 7.0], [1.0] * 4, mode="cispo")[1][3] == pytest.approx(-1.5)


def test_dis_masks_both_sides_whatever_the_advantage_sign():
    """``A = [-1, -1, 2, -2]``, ratios ``[0.5, 1.2, 6.5, 3]``: PPO would keep the 6.5 of a negative
    advantage, and clip the 0.5 of a negative one to a constant; DIS masks by the ratio alone:
    ``f = [0, 1.2, 0, 3]``, gradient ``-f A / 4 = [0, 0.3, 0, 1.5]``."""
    _, grad, m = _dis_grad([0.5, 1.2, 6.5, 3.0], [-1.0, -1.0, 2.0, -2.0])
    assert grad == pytest.approx([0.0, 0.3, 0.0, 1.5])
    assert m["clipfrac"] == pytest.approx(0.5)


def test_dis_with_ratio_one_is_reinforce():
    """On-policy (every ratio 1) DIS's gradient is REINFORCE's, ``-A / n`` per token under token-mean."""
    assert _dis_grad([1.0, 1.0, 1.0], [0.5, -1.0, 2.0])[1] == pytest.approx([-0.5 / 3, 1 / 3, -2 / 3])


def test_sao_is_one_sample_gae_with_the_dis_loss_and_its_lambdas():
    from types import SimpleNamespace

    from sppo_rl.agents.algorithms import estimator_params, resolve_defaults

    algo = get_algorithm("sao")
    assert (algo.estimator, algo.critic_loss, algo.group_size) == ("gae", "mse", 1)
    assert algo.requires.critic == "step"
    settings = {"policy_loss": None, "clip": None, "clip_high": None}
    assert resolve_defaults(settings, algo.defaults) == {"policy_loss": "dis", "clip": 0.3, "clip_high": 5.0}
    cfg = SimpleNamespace(lam=0.95, gamma=1.0, lam_critic=None, lam_alpha=None)
    assert estimator_params(cfg, algo.defaults) == {
        "gamma": 1.0,
        "lam": 0.95,
        "lam_critic": 1.0,
        "lam_alpha": 1.5,
    }
    given = SimpleNamespace(lam=0.95, gamma=1.0, lam_critic=0.9, lam_alpha=None)
    assert estimator_params(given, algo.defaults)["lam_critic"] == 0.9  # the run's own value wins
    assert estimator_params(cfg) == {"gamma": 1.0, "lam": 0.95, "lam_critic": None, "lam_alpha": None}


def test_dis_masks_a_ratio_on_either_bound():
    """The region is open: with ``eps_l = 0.5, eps_h = 1`` the ratios 0.5 and 2 (exact in floating point)
    are masked, 1.5 is kept: ``f = [0, 0, 1.5]``, gradient ``-f / 3`` for ``A = 1``."""
    from sppo_rl.agents.losses import policy_loss

    r = torch.tensor([[0.5, 2.0, 1.5]], dtype=torch.float64)
    logp = torch.log(r).requires_grad_(True)
    ones = torch.ones_like(r)
    loss, m = policy_loss(logp, torch.zeros_like(r), ones, ones, clip_low=0.5, clip_high=1.0, mode="dis")
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -0.5])
    assert m["clipfrac"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------- C-RF + negative-token filter


def _close(actual, expected):
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64))


def test_crf_ntf_worked_example():
    """``R = [1, 0, 0]`` of lengths ``[2, 4, 3]``: one success, two failures, each side half the weight:
    ``+3/2`` on the success's tokens, ``-3/4`` on each failure's least likely token (``ceil(0.1 l) = 1``),
    0 elsewhere; the mask is left whole (the zeros stay in the denominator)."""
    R, mask, tr = _batch([1, 0, 0], [2, 4, 3])
    logp = torch.tensor(
        [[-1.0, -2.0, 0, 0], [-0.5, -3.0, -0.1, -2.0], [-0.2, -0.3, -0.3, 0]], dtype=torch.float64
    )
    adv, ret = ESTIMATORS["crf-ntf"](token_rewards=tr, mask=mask, logp_old=logp * mask)
    # row 2: the tie -0.3 / -0.3 keeps the earlier
    _close(adv, [[1.5, 1.5, 0, 0], [0, -0.75, 0, 0], [0, -0.75, 0, 0]])
    assert ret.tolist() == [1.0, 0.0, 0.0]
    half, _ = ESTIMATORS["crf-ntf"](token_rewards=tr, mask=mask, logp_old=logp * mask, ntf_keep=0.5)
    assert half[1].tolist() == pytest.approx([0, -0.75, 0, -0.75])  # ceil(2) = 2: -3.0 and -2.0
    assert half[2].tolist() == pytest.approx([0, -0.75, -0.75, 0])  # ceil(1.5) = 2


def test_crf_ntf_one_sided_batches_and_the_balanced_loss():
    """A batch of failures only: ``-1`` on each one's least likely token. With PPO's surrogate at ratio 1
    and ``seq-mean-token-mean`` the loss is ``-(1/2)(mean_pos l_pos - mean_neg l_neg)``: one success of 2
    tokens and two failures of 4 and 3 tokens: ``l_pos = 1``, ``l_neg = [1/4, 1/3]`` (one kept token over
    the whole length), loss ``-(1/2)(1 - 7/24) = -17/48``."""
    from sppo_rl.agents.losses import policy_loss

    R, mask, tr = _batch([0, 0], [3, 2])
    logp = torch.tensor([[-1.0, -4.0, -2.0], [-0.1, -0.2, 0.0]], dtype=torch.float64) * mask
    adv, _ = ESTIMATORS["crf-ntf"](token_rewards=tr, mask=mask, logp_old=logp)
    _close(adv, [[0, -1, 0], [0, -1, 0]])
    R, mask, tr = _batch([1, 0, 0], [2, 4, 3])
    logp = -torch.arange(12, dtype=torch.float64).view(3, 4) * mask
    adv, _ = ESTIMATORS["crf-ntf"](token_rewards=tr, mask=mask, logp_old=logp)
    loss, _ = policy_loss(logp, logp, adv, mask, 0.2, 10.0, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-17 / 48)


def test_crf_ntf_algorithm_runs_through_compute_advantages():
    algo = get_algorithm("crf-ntf")
    assert (
        algo.group_size == 1 and algo.critic_loss == "none" and algo.requires == Requirements(logprobs=True)
    )
    assert algo.defaults == {"clip": 0.2, "clip_high": 10.0, "agg": "seq-mean-token-mean"}
    R = torch.tensor([1.0, 0.0, 0.0, 0.0])
    mask = torch.ones(4, 2)
    logp = torch.tensor([[-1.0, -2.0], [-2.0, -1.0], [-1.0, -1.5], [-3.0, -0.5]])
    batch = SequenceBatch(mask=mask, logp_old=logp, rewards=R, valid=torch.tensor([True, True, False, True]))
    compute_advantages(batch, algo)
    # valid rows [1, 0, 0]: +3/2 on the success, -3/4 on each failure's least likely token
    _close(batch.advantages, [[1.5, 1.5], [-0.75, 0], [0, 0], [-0.75, 0]])
    with pytest.raises(ValueError, match="ntf_keep"):
        ESTIMATORS["crf-ntf"](
            token_rewards=torch.zeros(1, 1), mask=torch.ones(1, 1), logp_old=torch.zeros(1, 1), ntf_keep=0.0
        )


# ----------------------------------------------------------------------------------------------- V0.5


def test_v05_fusion_worked_example():
    """``k = 4``, ``R = [1, 0, 0, 0]`` (``v_g = 1/4``, ``s^2 = 1/16``). Prior 0.5: ``(1/4)^2 <= 1/16``, the
    prior holds: ``b = 0.5``. Prior 0.9: ``D^2 = 0.4225 - 0.0625 = 0.36``, ``w = 0.36 / 0.4225``,
    ``b = 0.34615``. A group mean alone (GRPO's centring) would give ``b = 0.25``; the prior alone 0.9."""
    R, mask, tr = _batch([1, 0, 0, 0, 1, 0, 0, 0], [1, 2, 1, 1, 1, 1, 1, 1])
    V = torch.tensor([0.5] * 4 + [0.9] * 4, dtype=torch.float64)
    adv, ret = ESTIMATORS["v05"](
        token_rewards=tr, mask=mask, group_ids=torch.tensor([0] * 4 + [1] * 4), values=V
    )
    b = 0.36 / 0.4225 * 0.25 + (1 - 0.36 / 0.4225) * 0.9
    _close(adv[:, 0], [0.5, -0.5, -0.5, -0.5, 1 - b, -b, -b, -b])
    _close(adv[1], [-0.5, -0.5])  # broadcast over the sequence
    assert ret.tolist() == R.tolist()


def test_v05_all_wrong_group_keeps_a_signal_and_goes_through_the_critic_logits():
    """An all-wrong group of 4 under a prior of 0.3: ``D^2 = 0.09 - 0.0625 = 0.0275``, ``w = 0.0275 / 0.09``,
    ``b = (1 - w) 0.3 = 0.20833``: every member gets ``-0.20833`` (GRPO would give 0). Through
    ``compute_advantages`` the critic's logits become values by ``sigmoid``."""
    algo = get_algorithm("v05")
    assert (algo.group_size, algo.critic_loss, algo.requires.critic, algo.requires.groups) == (
        4,
        "bce",
        "sequence",
        True,
    )
    R = torch.zeros(4)
    batch = SequenceBatch(
        mask=torch.ones(4, 1),
        logp_old=None,
        rewards=R,
        group_ids=torch.zeros(4, dtype=torch.long),
        values=torch.full((4,), math.log(0.3 / 0.7)),
    )
    compute_advantages(batch, algo)
    w = 0.0275 / 0.09
    _close(batch.advantages[:, 0], [-(1 - w) * 0.3] * 4)
    assert batch.returns.tolist() == [0.0] * 4  # the critic's BCE target: the outcome
