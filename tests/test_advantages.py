"""The estimators against SPEC.md section 2, hand recursions and property tests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sppo_rl.agents.advantages import ESTIMATORS, Requirements, get_estimator
from sppo_rl.agents.algorithms import compute_advantages, get_algorithm
from sppo_rl.agents.batch import SequenceBatch, lengths_to_mask, terminal_rewards


@pytest.fixture(autouse=True)
def _float64():
    """Exact comparisons in double precision; restored after each test."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _batch(rewards, lengths, T=None):
    R = torch.tensor(rewards, dtype=torch.float64)
    mask = lengths_to_mask(torch.tensor(lengths), T).double()
    return R, mask, terminal_rewards(R, mask)


def test_registry_holds_the_seven_and_declares_needs():
    assert {"gae", "sppo", "grpo", "drgrpo", "rloo", "remax", "reinforce"} <= set(ESTIMATORS)
    needs = {name: fn.requires for name, fn in ESTIMATORS.items()}
    assert needs["gae"] == Requirements(critic="step")
    assert needs["sppo"] == Requirements(critic="sequence", critic_output="logit")
    assert needs["grpo"].groups and needs["rloo"].groups and needs["drgrpo"].groups
    assert needs["remax"].greedy_baseline and needs["remax"].critic == "none"
    assert needs["reinforce"] == Requirements()


def test_unknown_estimator_lists_valid_ones():
    with pytest.raises(KeyError, match="valid: .*grpo"):
        get_estimator("nope")


# ------------------------------------------------------------------------------------------ GAE


def _gae_reference(r, v, gamma, lam):
    """Textbook recursion on one unpadded sequence, V past the end = 0."""
    T = len(r)
    adv = [0.0] * T
    nxt_a, nxt_v = 0.0, 0.0
    for t in reversed(range(T)):
        delta = r[t] + gamma * nxt_v - v[t]
        nxt_a = delta + gamma * lam * nxt_a
        nxt_v = v[t]
        adv[t] = nxt_a
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 1.0), (1.0, 0.7)])
def test_gae_matches_hand_recursion_with_padding(gamma, lam):
    g = torch.Generator().manual_seed(0)
    lengths = [5, 1, 3, 7]
    T = 7
    rewards = torch.rand(4, T, generator=g)
    values = torch.randn(4, T, generator=g)
    mask = lengths_to_mask(torch.tensor(lengths), T).double()
    # garbage in the padding must not matter
    rewards = torch.where(mask > 0, rewards, torch.full_like(rewards, 99.0))
    values = torch.where(mask > 0, values, torch.full_like(values, -42.0))
    adv, ret = ESTIMATORS["gae"](token_rewards=rewards * mask, mask=mask, values=values, gamma=gamma, lam=lam)
    for b, n in enumerate(lengths):
        ref = _gae_reference(rewards[b, :n].tolist(), values[b, :n].tolist(), gamma, lam)
        assert adv[b, :n].tolist() == pytest.approx(ref, abs=1e-12)
        assert torch.all(adv[b, n:] == 0)
        assert ret[b, :n].tolist() == pytest.approx([a + v for a, v in zip(ref, values[b, :n].tolist())])


def test_gae_terminal_reward_gamma_lam_one_is_R_minus_V():
    R, mask, tr = _batch([1.0, 0.0, 1.0], [4, 2, 3], T=5)
    values = torch.rand(3, 5)
    adv, ret = ESTIMATORS["gae"](token_rewards=tr, mask=mask, values=values, gamma=1.0, lam=1.0)
    expected = (R[:, None] - values) * mask
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, R[:, None] * mask)


def test_gae_whiten_is_masked():
    R, mask, tr = _batch([1.0, 0.0, 1.0, 0.0], [4, 2, 3, 5], T=6)
    values = torch.rand(4, 6)
    adv, _ = ESTIMATORS["gae"](token_rewards=tr, mask=mask, values=values, whiten=True)
    valid = adv[mask > 0]
    assert abs(float(valid.mean())) < 1e-9
    assert float(valid.var()) == pytest.approx(1.0, rel=1e-6)
    assert torch.all(adv[mask == 0] == 0)


# ------------------------------------------------------------------------------------------ SPPO


def test_sppo_worked_example_and_broadcast():
    # SPEC: V(s_p) = 0.65, R = 1 -> A = 0.35; R = 0 -> A = -0.65
    logit = math.log(0.65 / 0.35)
    R, mask, tr = _batch([1.0, 0.0], [3, 2], T=4)
    adv, ret = ESTIMATORS["sppo"](token_rewards=tr, mask=mask, values=torch.tensor([logit, logit]))
    torch.testing.assert_close(adv[0], torch.tensor([0.35, 0.35, 0.35, 0.0]))
    torch.testing.assert_close(adv[1], torch.tensor([-0.65, -0.65, 0.0, 0.0]))
    torch.testing.assert_close(ret, R)


def test_sppo_rejects_per_step_values():
    _, mask, tr = _batch([1.0], [3])
    with pytest.raises(ValueError, match="one critic logit per sequence"):
        ESTIMATORS["sppo"](token_rewards=tr, mask=mask, values=torch.zeros(1, 3))


# ------------------------------------------------------------------------------------------ groups


def test_grpo_population_vs_sample_std():
    R, mask, tr = _batch([1, 1, 0, 0], [2, 3, 1, 2], T=3)
    gid = torch.zeros(4, dtype=torch.long)
    pop, _ = ESTIMATORS["grpo"](token_rewards=tr, mask=mask, group_ids=gid, std="population", eps=0.0)
    smp, _ = ESTIMATORS["grpo"](token_rewards=tr, mask=mask, group_ids=gid, std="sample", eps=0.0)
    # mean 0.5; population std sqrt(4 * 0.25 / 4) = 0.5: A = +-0.5 / 0.5 = +-1
    assert pop[:, 0].tolist() == pytest.approx([1, 1, -1, -1])
    # sample std sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.577350: A = +-0.5 / 0.577350 = +-0.866025
    assert smp[:, 0].tolist() == pytest.approx([0.866025, 0.866025, -0.866025, -0.866025], abs=1e-6)
    assert torch.all(pop[mask == 0] == 0) and torch.all(smp[mask == 0] == 0)


@pytest.mark.parametrize("G,k", [(8, 1), (8, 3), (8, 7), (5, 2), (16, 4)])
def test_grpo_implicit_bandit_form(G, k):
    """Population-std GRPO on a group with success rate p = k/G gives sqrt((1-p)/p) and -sqrt(p/(1-p))."""
    p = k / G
    R, mask, tr = _batch([1.0] * k + [0.0] * (G - k), [3] * G)
    adv, _ = ESTIMATORS["grpo"](
        token_rewards=tr, mask=mask, group_ids=torch.zeros(G, dtype=torch.long), std="population", eps=0.0
    )
    assert adv[:k, 0].tolist() == pytest.approx([math.sqrt((1 - p) / p)] * k)
    assert adv[k:, 0].tolist() == pytest.approx([-math.sqrt(p / (1 - p))] * (G - k))


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.3, 1e-9])
def test_equal_reward_group_gets_exact_zero(name, value):
    R, mask, tr = _batch([value] * 6 + [1.0, 0.0], [2] * 8)
    gid = torch.tensor([0] * 6 + [1, 1])
    adv, _ = ESTIMATORS[name](token_rewards=tr, mask=mask, group_ids=gid)
    assert torch.all(adv[:6] == 0.0)
    assert torch.all(adv[6:, :2] != 0.0)


def test_groups_are_independent_and_ids_need_not_be_contiguous():
    R, mask, tr = _batch([1, 0, 0, 1, 1, 1, 0, 0], [1] * 8)
    gid = torch.tensor([7, 3, 7, 3, 7, 3, 7, 3])
    adv, _ = ESTIMATORS["drgrpo"](token_rewards=tr, mask=mask, group_ids=gid)
    # group 7: R = [1, 0, 1, 0] mean .5; group 3: R = [0, 1, 1, 0] mean .5
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -0.5, -0.5])


def test_rloo_identity_with_centred_reward():
    """R_i - mean_g = (G - 1) / G * A_i^RLOO."""
    g = torch.Generator().manual_seed(1)
    G = 5
    R = torch.rand(3 * G, generator=g)
    mask = torch.ones(3 * G, 4)
    tr = terminal_rewards(R, mask)
    gid = torch.arange(3).repeat_interleave(G)
    a_rloo, _ = ESTIMATORS["rloo"](token_rewards=tr, mask=mask, group_ids=gid)
    a_dr, _ = ESTIMATORS["drgrpo"](token_rewards=tr, mask=mask, group_ids=gid)
    torch.testing.assert_close(a_dr, (G - 1) / G * a_rloo)
    # and the definition itself
    for i in range(3 * G):
        others = [R[j] for j in range(3 * G) if gid[j] == gid[i] and j != i]
        assert float(a_rloo[i, 0]) == pytest.approx(float(R[i] - sum(others) / len(others)))


def test_rloo_singleton_group_is_zero():
    R, mask, tr = _batch([1.0, 1.0, 0.0], [2, 2, 2])
    adv, _ = ESTIMATORS["rloo"](token_rewards=tr, mask=mask, group_ids=torch.tensor([0, 1, 1]))
    assert torch.all(adv[0] == 0)
    assert adv[1:, 0].tolist() == [1.0, -1.0]


def test_remax_and_reinforce():
    R, mask, tr = _batch([1.0, 0.0, 1.0], [2, 3, 1], T=3)
    adv, ret = ESTIMATORS["remax"](
        token_rewards=tr, mask=mask, baseline_rewards=torch.tensor([1.0, 0.0, 0.0])
    )
    assert adv[:, 0].tolist() == [0.0, 0.0, 1.0]
    torch.testing.assert_close(ret, R)
    adv, _ = ESTIMATORS["reinforce"](token_rewards=tr, mask=mask)
    torch.testing.assert_close(adv, R[:, None] * mask)
    adv, _ = ESTIMATORS["reinforce"](token_rewards=tr, mask=mask, subtract_mean=True)
    torch.testing.assert_close(adv, (R - R.mean())[:, None] * mask)
    with pytest.raises(ValueError, match="baseline_rewards"):
        ESTIMATORS["remax"](token_rewards=tr, mask=mask, baseline_rewards=None)


def test_remax_with_a_kl_reward_is_the_return_to_go_minus_the_greedy_outcome():
    """verl's ``compute_remax_outcome_advantage``: the reverse cumulative sum of the token rewards minus
    the greedy baseline. Row 0: outcome 1 with per-token penalties -0.1, -0.2, -0.3 (rewards
    ``[-0.1, -0.2, 0.7]``), greedy outcome 1: returns-to-go ``[0.4, 0.5, 0.7]``, ``A = [-0.6, -0.5, -0.3]``
    (the whole-sequence sum would put -0.6 on every token). Row 1: outcome 1 alone on its last of 2
    positions, greedy 0: ``A = [1, 1]``, padding 0."""
    mask = lengths_to_mask(torch.tensor([3, 2]), 4).double()
    tr = torch.tensor([[-0.1, -0.2, 0.7, 0.0], [0.0, 1.0, 0.0, 0.0]])
    adv, ret = ESTIMATORS["remax"](token_rewards=tr, mask=mask, baseline_rewards=torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(adv, torch.tensor([[-0.6, -0.5, -0.3, 0.0], [1.0, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([0.4, 1.0]))  # the sequence's R (no critic reads it)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(-2, 2), st.floats(-2, 2), st.integers(1, 6)), min_size=1, max_size=6))
def test_remax_without_per_token_rewards_is_bit_identical_to_r_minus_greedy(rows):
    """With the outcome alone on the last valid position (no KL in the reward) every return-to-go is
    exactly ``R``: the advantages are those of ``A_i = R_i - R_greedy`` broadcast, to the bit."""
    R = torch.tensor([r for r, _, _ in rows])
    b = torch.tensor([g for _, g, _ in rows])
    mask = lengths_to_mask(torch.tensor([n for _, _, n in rows]), 7).double()
    adv, _ = ESTIMATORS["remax"](token_rewards=terminal_rewards(R, mask), mask=mask, baseline_rewards=b)
    assert torch.equal(adv, (R - b)[:, None] * mask)


def test_a_singleton_group_gets_zero_where_verl_gives_it_its_reward():
    """A group of one (a prompt with one valid sample) has nothing to compare with. Here: 0 under GRPO,
    Dr. GRPO, RLOO and REINFORCE++-baseline's centring. verl's ``compute_grpo_outcome_advantage`` takes
    its mean as 0 and std as 1 (``A = R / (1 + 1e-6)``), its ``compute_rloo_outcome_advantage`` leaves
    the score as it is (``A = R``); GRPO's ``lone="reward"`` (Latent-GRPO's) gives ``A = R``. Group 0 is
    the singleton ``R = 0.8``; group 1 ``R = [1, 0]``."""
    R, mask, tr = _batch([0.8, 1.0, 0.0], [2, 2, 2])
    kw = dict(token_rewards=tr, mask=mask, group_ids=torch.tensor([0, 1, 1]))
    for name in ("grpo", "drgrpo", "rloo"):
        adv, _ = ESTIMATORS[name](**kw)
        assert adv[0].tolist() == [0.0, 0.0], name
        assert float(adv[1, 0]) > 0 > float(adv[2, 0]), name
    adv, _ = ESTIMATORS["grpo"](**kw, lone="reward")
    assert adv[0].tolist() == [0.8, 0.8]
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group [1, 0]: mean 0.5, sample std sqrt(0.5)
    assert adv[1:, 0].tolist() == pytest.approx([a, -a], abs=1e-12)
    # REINFORCE++-baseline: the singleton's centred outcome is 0; the 6 tokens [0, 0, .5, .5, -.5, -.5]
    # have mean 0 and unbiased variance 1 / 5, so the singleton stays at 0 after whitening (verl centres
    # it to R = 0.8 and whitens that with the others)
    adv, _ = ESTIMATORS["reinforce++-baseline"](**kw)
    assert adv[0].tolist() == [0.0, 0.0]
    assert adv[1].tolist() == pytest.approx([0.5 / math.sqrt(0.2)] * 2)


def test_the_group_std_rule_with_a_kl_penalty_in_the_reward():
    """An ALL-CORRECT group (outcome 1 for each of 4 samples) with a per-token KL penalty in the reward
    (beta = 0.05, two tokens each) is no longer equal: ``R = 1 - 0.05 * KL_sum``. GRPO zeroes a group
    only when its sample std is at most ``std_threshold`` (0.05): so

    - KL sums ``[0.5, 1, 2, 4]``: ``R = [0.975, 0.95, 0.9, 0.8]``, mean 0.90625, sample std
      ``sqrt(0.01796875 / 3) = 0.077392 > 0.05``: NOT zeroed; ``A = (R - mean) / std =
      [0.8883, 0.5653, -0.0808, -1.3729]``, unit-size advantages that rank the four correct answers by
      their KL alone (Dr. GRPO gives the same ranking at the penalty's own size, ``R - mean``);
    - KL sums ``[0.5, 0.6, 0.7, 0.8]``: std ``0.05 * 0.129099 = 0.006455 <= 0.05``: zeroed;
    - a threshold of 0.1 (``--group-std-threshold 0.1``) zeroes the first group too.
    """
    mask = torch.ones(8, 2)
    kl_sum = torch.tensor([0.5, 1.0, 2.0, 4.0, 0.5, 0.6, 0.7, 0.8])
    kl_tok = torch.stack([0.25 * kl_sum, 0.75 * kl_sum], -1)  # per token, summing to kl_sum
    tr = terminal_rewards(torch.ones(8), mask) - 0.05 * kl_tok
    kw = dict(token_rewards=tr, mask=mask, group_ids=torch.tensor([0] * 4 + [1] * 4))
    adv, R = ESTIMATORS["grpo"](**kw)
    torch.testing.assert_close(R[:4], torch.tensor([0.975, 0.95, 0.9, 0.8]))
    sd = math.sqrt(0.01796875 / 3)
    assert sd == pytest.approx(0.077392, abs=1e-6)
    expected = [(r - 0.90625) / (sd + 1e-6) for r in (0.975, 0.95, 0.9, 0.8)]
    assert expected == pytest.approx([0.8883, 0.5653, -0.0808, -1.3729], abs=1e-4)
    assert adv[:4, 0].tolist() == pytest.approx(expected, abs=1e-9)
    assert torch.equal(adv[4:], torch.zeros(4, 2))
    zeroed, _ = ESTIMATORS["grpo"](**kw, std_threshold=0.1)
    assert torch.equal(zeroed, torch.zeros(8, 2))
    dr, _ = ESTIMATORS["drgrpo"](**kw)
    assert dr[:4, 0].tolist() == pytest.approx([0.06875, 0.04375, -0.00625, -0.10625], abs=1e-12)


def test_gae_whitening_by_hand():
    """``whiten=True`` (verl's GAE always whitens): with ``V = 0`` and ``gamma = lam = 1`` the advantages
    are ``R`` on every position; rows ``R = [1, 0]`` of lengths 1 and 3: values ``[1, 0, 0, 0]``, mean
    0.25, unbiased variance ``(0.5625 + 3 * 0.0625) / 3 = 0.25``: ``A = [1.5, -0.5, -0.5, -0.5]``."""
    R, mask, tr = _batch([1.0, 0.0], [1, 3])
    adv, _ = ESTIMATORS["gae"](token_rewards=tr, mask=mask, values=torch.zeros(2, 3), whiten=True)
    torch.testing.assert_close(adv, torch.tensor([[1.5, 0.0, 0.0], [-0.5, -0.5, -0.5]]), atol=1e-7, rtol=0)
    plain, _ = ESTIMATORS["gae"](token_rewards=tr, mask=mask, values=torch.zeros(2, 3))
    torch.testing.assert_close(plain, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_compute_advantages_passes_what_is_declared():
    R, mask, tr = _batch([1.0, 0.0, 1.0, 1.0], [2, 3, 1, 2], T=3)
    batch = SequenceBatch(
        mask=mask, logp_old=torch.zeros_like(mask), rewards=R, group_ids=torch.tensor([0, 0, 1, 1])
    )
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages(batch, get_algorithm("sppo"))
    batch.values = torch.zeros(4)  # logit 0 -> p = 0.5
    compute_advantages(batch, get_algorithm("sppo"))
    assert batch.advantages[:, 0].tolist() == [0.5, -0.5, 0.5, 0.5]
    compute_advantages(batch, get_algorithm("grpo"))
    assert torch.all(batch.advantages[2:] == 0)
    # the BCE ablation feeds sigmoid(logits) to GAE
    batch.values = torch.zeros(4, 3)
    compute_advantages(batch, get_algorithm("ppo-bce"))
    torch.testing.assert_close(batch.advantages, (R[:, None] - 0.5) * mask)


# ------------------------------------------------------------------------------------------ properties


def _random_case(data, need_values_seq=False):
    B = data.draw(st.integers(1, 6))
    T = data.draw(st.integers(1, 6))
    lengths = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    R = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=B, max_size=B)))
    mask = lengths_to_mask(torch.tensor(lengths), T).double()
    R = R * (mask.sum(-1) > 0)
    gid = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=B, max_size=B)))
    vals_tok = torch.tensor(data.draw(st.lists(st.floats(-2, 2), min_size=B * T, max_size=B * T))).view(B, T)
    vals_seq = torch.tensor(data.draw(st.lists(st.floats(-3, 3), min_size=B, max_size=B)))
    base = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=B, max_size=B)))
    return R, mask, gid, vals_tok, vals_seq, base


def _call(name, R, mask, gid, vals_tok, vals_seq, base):
    values = vals_seq if name == "sppo" else vals_tok
    return ESTIMATORS[name](
        token_rewards=terminal_rewards(R, mask),
        mask=mask,
        values=values,
        group_ids=gid,
        baseline_rewards=base,
        gamma=0.97,
        lam=0.9,
    )


NAMES = ["gae", "sppo", "grpo", "drgrpo", "rloo", "remax", "reinforce", "opo", "opo-batch", "shrinkage"]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(NAMES), extra=st.integers(1, 4))
def test_appending_padding_changes_nothing(data, name, extra):
    R, mask, gid, vt, vs, base = _random_case(data)
    adv, ret = _call(name, R, mask, gid, vt, vs, base)
    pad = lambda x: torch.cat([x, torch.zeros(x.shape[0], extra)], dim=1)  # noqa: E731
    adv2, ret2 = _call(name, R, pad(mask), gid, pad(vt), vs, base)
    torch.testing.assert_close(adv2[:, : mask.shape[1]], adv)
    assert torch.all(adv2[:, mask.shape[1] :] == 0)
    torch.testing.assert_close(ret2[..., : ret.shape[-1]] if ret.dim() == 2 else ret2, ret)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(NAMES))
def test_permuting_the_batch_permutes_the_output(data, name):
    R, mask, gid, vt, vs, base = _random_case(data)
    perm = torch.tensor(data.draw(st.permutations(list(range(len(R))))), dtype=torch.long)
    adv, ret = _call(name, R, mask, gid, vt, vs, base)
    adv_p, ret_p = _call(name, R[perm], mask[perm], gid[perm], vt[perm], vs[perm], base[perm])
    torch.testing.assert_close(adv_p, adv[perm])
    torch.testing.assert_close(ret_p, ret[perm])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(NAMES))
def test_masks_are_respected(data, name):
    R, mask, gid, vt, vs, base = _random_case(data)
    adv, _ = _call(name, R, mask, gid, vt, vs, base)
    assert torch.all(adv[mask == 0] == 0)
    assert torch.isfinite(adv).all()
