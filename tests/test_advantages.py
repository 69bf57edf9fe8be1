"""The estimators against SPEC.md section 2, hand recursions and property tests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sppo_rl.agents import ESTIMATORS, compute_advantages, get_algorithm, get_estimator
from sppo_rl.agents.advantages import Requirements
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


NAMES = ["gae", "sppo", "grpo", "drgrpo", "rloo", "remax", "reinforce"]


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
