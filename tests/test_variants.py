"""BPPO (arXiv 2605.28028) and LamPO (arXiv 2605.19416): hand examples, limits, properties, both worlds."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sppo_rl.agents.advantages import ESTIMATORS
from sppo_rl.agents.algorithms import check_setup, compute_advantages, get_algorithm
from sppo_rl.agents.batch import SequenceBatch, lengths_to_mask, terminal_rewards
from sppo_rl.agents.selection import SELECTORS, get_selector
from sppo_rl.agents.variants import binary_prefix, lampo, prefix_lengths, sequence_confidence

LN3 = math.log(3.0)


@pytest.fixture(autouse=True)
def _float64(request):
    """Exact comparisons in double precision; a test that runs a trainer (uses tmp_path) keeps float32."""
    if "tmp_path" in request.fixturenames:
        yield
        return
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _batch(rewards, lengths, groups, T=None, logp=None, garbage=0.0):
    """A SequenceBatch; padded positions of ``logp_old`` hold ``garbage`` (they must never be read)."""
    R = torch.tensor(rewards, dtype=torch.float64)
    mask = lengths_to_mask(torch.tensor(lengths), T).double()
    if logp is None:
        logp_old = torch.full_like(mask, -0.5)
    else:
        logp_old = torch.tensor(logp, dtype=torch.float64)[:, None].expand_as(mask).clone()
    logp_old = torch.where(mask > 0, logp_old, torch.full_like(mask, garbage))
    return SequenceBatch(mask=mask, logp_old=logp_old, rewards=R, group_ids=torch.tensor(groups))


def test_registered_by_importing_the_package_alone():
    code = (
        "import sppo_rl.agents.algorithms as a; "
        "print(a.get_algorithm('lampo').requires.logprobs, a.get_algorithm('bppo').selector); "
        "from sppo_rl.agents.selection import SELECTORS; print('binary-prefix' in SELECTORS)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "binary-prefix", "True"]
    assert "lampo" in ESTIMATORS and SELECTORS["binary-prefix"] is binary_prefix
    assert get_selector("binary-prefix") is binary_prefix
    bppo, lam = get_algorithm("bppo"), get_algorithm("lampo")
    assert (bppo.estimator, bppo.critic_loss, bppo.group_size, bppo.selector) == (
        "grpo",
        "none",
        8,
        "binary-prefix",
    )
    assert (lam.estimator, lam.critic_loss, lam.group_size, lam.selector) == ("lampo", "none", 8, None)
    assert lam.requires.groups and lam.requires.logprobs and lam.requires.critic == "none"
    for algo in (bppo, lam):
        with pytest.raises(ValueError, match="group_size >= 2"):
            check_setup(algo, 1, 8)
        check_setup(algo, 8, 64)


# ================================================================================================ BPPO


@pytest.mark.parametrize(
    "ratio,lengths,expected",
    [
        (0.4, [0, 1, 2, 3, 5, 10, 11], [0, 1, 1, 2, 2, 4, 5]),
        (0.3, [10, 20, 1, 4], [3, 6, 1, 2]),
        (0.55, [100, 180, 1, 4], [55, 99, 1, 3]),  # 0.55 * 100 is 55.00000000000001 in floating point
        (0.5, [1, 2, 3, 7], [1, 1, 2, 4]),
        (1.0, [0, 1, 9], [0, 1, 9]),
        (0.01, [5, 99, 101], [1, 1, 2]),
    ],
)
def test_prefix_lengths_round_up_with_at_least_one(ratio, lengths, expected):
    assert prefix_lengths(torch.tensor(lengths), ratio).tolist() == expected


@pytest.mark.parametrize("ratio", [0.0, -0.2, 1.01, float("nan")])
def test_prefix_ratio_outside_zero_one_is_refused(ratio):
    b = _batch([1.0, 0.0], [2, 2], [0, 0])
    with pytest.raises(ValueError, match="bppo_prefix_ratio"):
        binary_prefix(mask=b.mask, rewards=b.rewards, group_ids=b.group_ids, bppo_prefix_ratio=ratio)


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_accuracy_threshold_outside_zero_one_is_refused(threshold):
    b = _batch([1.0, 0.0], [2, 2], [0, 0])
    with pytest.raises(ValueError, match="bppo_accuracy_threshold"):
        binary_prefix(
            mask=b.mask, rewards=b.rewards, group_ids=b.group_ids, bppo_accuracy_threshold=threshold
        )


def test_bppo_worked_example_from_the_docstring():
    # one group of 6, padded to T = 12; accuracy 3/6 = 0.5 >= 0.5 selects
    b = _batch([1, 0, 1, 0, 0, 1], [7, 5, 4, 9, 5, 10], [3] * 6, T=12)
    loss_mask = binary_prefix(mask=b.mask, rewards=b.rewards, group_ids=b.group_ids)
    expected = torch.zeros(6, 12)
    expected[2, :2] = 1  # shortest correct: length 4, prefix ceil(1.6) = 2
    expected[1, :2] = 1  # shortest incorrect: length 5 (tied with row 4, lower index), prefix ceil(2.0) = 2
    assert torch.equal(loss_mask, expected)

    # the advantages are GRPO's over the full group: mu = 0.5; population sigma = 0.5 -> +-1
    compute_advantages(b, get_algorithm("bppo"), std="population")
    assert torch.equal(b.loss_mask, expected)
    adv = torch.zeros(6, 12)
    adv[2, :2], adv[1, :2] = 1.0, -1.0
    torch.testing.assert_close(b.advantages, adv, atol=1e-5, rtol=0)
    # the seed's pseudocode: (1 - mu) / sigma and (0 - mu) / sigma with sigma the population std
    mu, sigma = 0.5, 0.5
    assert b.advantages[2, 0].item() == pytest.approx((1 - mu) / sigma, abs=1e-5)
    assert b.advantages[1, 0].item() == pytest.approx((0 - mu) / sigma, abs=1e-5)
    # sample std (the trainers' default, as verl): sigma = sqrt(1.5 / 5) -> +-0.9129
    compute_advantages(b, get_algorithm("bppo"), std="sample")
    torch.testing.assert_close(b.advantages, adv * 0.5 / math.sqrt(0.3), atol=1e-5, rtol=0)


def test_bppo_several_groups_ties_missing_kinds_and_empty_rows():
    # rows interleave four groups; ids are arbitrary labels
    rewards = [1, 0, 1, 0, 1, 1, 0, 0, 1, 0, 0, 1]
    lengths = [6, 3, 6, 0, 2, 3, 4, 4, 8, 1, 3, 9]
    groups = [7, 7, 7, 7, -1, -1, 40, 40, 5, 5, 5, 5]
    #  g7: correct rows 0, 2 (both length 6 -> row 0); incorrect 1 (3) and 3 (empty, never chosen) -> row 1
    #  g-1: all correct -> row 4 (length 2) only
    #  g40: all incorrect, tied lengths -> row 6 only
    #  g5: correct 8 (8), 11 (9) -> row 8; incorrect 9 (1), 10 (3) -> row 9
    b = _batch(rewards, lengths, groups, T=10)
    loss_mask = binary_prefix(mask=b.mask, rewards=b.rewards, group_ids=b.group_ids, bppo_prefix_ratio=0.5)
    chosen = {0: 3, 1: 2, 4: 1, 6: 2, 8: 4, 9: 1}  # row -> ceil(0.5 * L)
    expected = torch.zeros(12, 10)
    for row, lp in chosen.items():
        expected[row, :lp] = 1
    assert torch.equal(loss_mask, expected)
    assert torch.all(loss_mask <= b.mask)
    # the one-class groups' rows carry GRPO's zero advantage: positions but no gradient
    compute_advantages(b, get_algorithm("bppo"), std="population", bppo_prefix_ratio=0.5)
    assert torch.all(b.advantages[4] == 0) and torch.all(b.advantages[6] == 0)
    assert torch.all(b.advantages[0, :3] > 0) and torch.all(b.advantages[1, :2] < 0)
    assert torch.all(b.advantages[b.loss_mask == 0] == 0)


def test_bppo_adaptive_switch_on_batch_accuracy():
    # accuracy 3/8 = 0.375
    b = _batch([1, 0, 0, 1, 0, 0, 1, 0], [4, 6, 2, 5, 3, 7, 2, 9], [0, 0, 0, 0, 1, 1, 1, 1], T=9)
    grpo = ESTIMATORS["grpo"](token_rewards=b.token_rewards, mask=b.mask, group_ids=b.group_ids)[0]
    # below the threshold: plain GRPO on every position of every sequence
    compute_advantages(b, get_algorithm("bppo"), bppo_accuracy_threshold=0.5)
    assert torch.equal(b.loss_mask, b.mask)
    torch.testing.assert_close(b.advantages, grpo)
    # at the threshold (>=) and above it: the binary prefix selection
    for thr in (0.375, 0.2, 0.0):
        compute_advantages(b, get_algorithm("bppo"), bppo_accuracy_threshold=thr)
        assert b.loss_mask.sum(-1).tolist() == [2, 0, 1, 0, 2, 0, 1, 0], thr
        torch.testing.assert_close(b.advantages, grpo * b.loss_mask)
    # an accurate batch under the default threshold (0.5) selects
    acc = _batch([1, 1, 1, 0], [5, 3, 4, 6], [0, 0, 0, 0])
    assert binary_prefix(mask=acc.mask, rewards=acc.rewards, group_ids=acc.group_ids).sum(-1).tolist() == [
        0,
        2,
        0,
        3,
    ]
    # 1.0: selects only when every sequence is correct, where every advantage is 0
    full = binary_prefix(
        mask=acc.mask, rewards=acc.rewards, group_ids=acc.group_ids, bppo_accuracy_threshold=1.0
    )
    assert torch.equal(full, acc.mask)


def _reference_selection(rewards, lengths, groups, ratio):
    """Loop version of BPPO's selection, straight from the definition."""
    out = {}
    for g in sorted(set(groups)):
        rows = [i for i in range(len(rewards)) if groups[i] == g and lengths[i] > 0]
        for want in (True, False):
            cand = [i for i in rows if (rewards[i] > 0.5) == want]
            if cand:
                i = min(cand, key=lambda k: (lengths[k], k))
                out[i] = max(1, math.ceil(round(ratio * lengths[i], 9)))
    return out


@st.composite
def _bppo_case(draw, distinct_lengths=False):
    B = draw(st.integers(1, 10))
    T = draw(st.integers(1, 8))
    if distinct_lengths:
        T = max(T, B)
        lengths = draw(st.permutations(list(range(1, T + 1))))[:B]
    else:
        lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    rewards = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=B, max_size=B))
    groups = draw(st.lists(st.integers(0, 3), min_size=B, max_size=B))
    ratio = draw(st.sampled_from([0.3, 0.4, 0.5, 0.77, 1.0]))
    return rewards, lengths, groups, T, ratio


@settings(max_examples=150, deadline=None)
@given(case=_bppo_case())
def test_bppo_selection_matches_the_loop_definition(case):
    rewards, lengths, groups, T, ratio = case
    b = _batch(rewards, lengths, groups, T=T)
    loss_mask = binary_prefix(
        mask=b.mask,
        rewards=b.rewards,
        group_ids=b.group_ids,
        bppo_prefix_ratio=ratio,
        bppo_accuracy_threshold=0.0,
    )
    ref = _reference_selection(rewards, lengths, groups, ratio)
    assert {i: int(n) for i, n in enumerate(loss_mask.sum(-1).tolist()) if n} == ref
    assert torch.all(loss_mask <= b.mask)
    for i, lp in ref.items():  # a prefix: the first lp positions
        assert torch.all(loss_mask[i, :lp] == 1) and torch.all(loss_mask[i, lp:] == 0)
    # at most one correct and one incorrect row per group
    for g in set(groups):
        assert sum(1 for i in ref if groups[i] == g) <= 2


@settings(max_examples=100, deadline=None)
@given(case=_bppo_case(distinct_lengths=True), data=st.data())
def test_bppo_selection_is_permutation_equivariant_and_ignores_labels(case, data):
    # with no length ties, the row order cannot matter
    rewards, lengths, groups, T, ratio = case
    b = _batch(rewards, lengths, groups, T=T)
    kw = dict(bppo_prefix_ratio=ratio, bppo_accuracy_threshold=0.0)
    lm = binary_prefix(mask=b.mask, rewards=b.rewards, group_ids=b.group_ids, **kw)
    perm = torch.tensor(data.draw(st.permutations(list(range(len(rewards))))), dtype=torch.long)
    lm_p = binary_prefix(mask=b.mask[perm], rewards=b.rewards[perm], group_ids=b.group_ids[perm], **kw)
    assert torch.equal(lm_p, lm[perm])
    relabelled = 1000 - 3 * b.group_ids
    assert torch.equal(binary_prefix(mask=b.mask, rewards=b.rewards, group_ids=relabelled, **kw), lm)


def test_bppo_with_padding_appended_and_garbage_on_padding():
    b = _batch([1, 0, 0, 1], [3, 2, 5, 4], [0, 0, 0, 0], T=5)
    lm = binary_prefix(mask=b.mask, rewards=b.rewards, group_ids=b.group_ids)
    wide = torch.cat([b.mask, torch.zeros(4, 3)], dim=1)
    lm2 = binary_prefix(mask=wide, rewards=b.rewards, group_ids=b.group_ids)
    assert torch.equal(lm2[:, :5], lm) and torch.all(lm2[:, 5:] == 0)
    assert lm.sum(-1).tolist() == [2, 1, 0, 0]


def test_bppo_on_a_collected_control_batch():
    from sppo_rl.control.networks import Actor
    from sppo_rl.control.rollout import collect
    from sppo_rl.envs.tasks import get_task, make_episode_env

    spec = get_task("short-cartpole")
    env = make_episode_env(spec.name, num_envs=32)
    torch.manual_seed(0)
    actor = Actor(spec.obs_dim, spec.action_dim, spec.discrete).float()  # the env emits float32
    seeds = np.repeat(np.array([3, 5, 8, 13]), 8)
    ep = collect(env, actor, seeds, spec.horizon, None, torch.Generator().manual_seed(1))
    env.close()
    groups = torch.arange(4).repeat_interleave(8)
    batch = SequenceBatch(mask=ep.mask, logp_old=ep.logp, rewards=ep.success, group_ids=groups)
    compute_advantages(batch, get_algorithm("bppo"), bppo_accuracy_threshold=0.0)
    kept = batch.loss_mask.sum(-1) > 0
    lengths = ep.mask.sum(-1).long()
    for g in range(4):
        rows = torch.nonzero(groups == g).squeeze(1)
        for want in (True, False):
            cls = rows[(ep.success[rows] > 0.5) == want]
            sel = cls[kept[cls]]
            assert len(sel) == (1 if len(cls) else 0)
            if len(cls):
                i = int(sel[0])
                assert lengths[i] == lengths[cls].min() and i == int(
                    cls[lengths[cls] == lengths[cls].min()][0]
                )
                assert int(batch.loss_mask[i].sum()) == max(1, math.ceil(0.4 * int(lengths[i]) - 1e-9))
    assert 0 < batch.loss_mask.sum() < 0.5 * ep.mask.sum()


# =============================================================================================== LamPO


def _lampo(b, **kw):
    return lampo(token_rewards=b.token_rewards, mask=b.mask, group_ids=b.group_ids, logp_old=b.logp_old, **kw)


def test_lampo_worked_example_from_the_docstring():
    c = [-0.5, -0.5 - LN3, -0.5 - LN3, -0.5]
    b = _batch([1, 1, 0, 0], [3, 5, 2, 4], [9, 9, 9, 9], T=6, logp=c, garbage=55.0)
    adv, ret = _lampo(b, lampo_temperature=1.0)
    expected = torch.tensor([1 / 2, 5 / 6, -1 / 2, -5 / 6])
    torch.testing.assert_close(adv, expected[:, None] * b.mask)
    torch.testing.assert_close(ret, b.rewards)
    # through the algorithm: compute_advantages hands the batch's logp_old to the estimator
    compute_advantages(b, get_algorithm("lampo"), lampo_temperature=1.0)
    torch.testing.assert_close(b.advantages, expected[:, None] * b.mask)
    assert torch.equal(b.loss_mask, b.mask)
    # RLOO for comparison: the confidence-free version
    rloo = ESTIMATORS["rloo"](token_rewards=b.token_rewards, mask=b.mask, group_ids=b.group_ids)[0]
    torch.testing.assert_close(rloo[:, 0], torch.tensor([2 / 3, 2 / 3, -2 / 3, -2 / 3]))


def test_lampo_sharp_temperature_keeps_only_misordered_pairs():
    # tau -> 0: w = 0 for a pair the policy orders right, 2 for one it orders wrong, 1 for a tie
    b = _batch([1, 0, 0, 1], [2, 2, 2, 2], [0, 0, 0, 0], logp=[-0.2, -0.4, -0.1, -0.1])
    adv, _ = _lampo(b, lampo_temperature=1e-9)
    # pairs: (0,1) right -> 0; (0,2) wrong -> 2; (3,1) right -> 0; (3,2) tie -> 1
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, 0.0, -3 / 3, 1 / 3]))


def test_lampo_confidence_is_the_mean_log_prob_over_valid_positions():
    mask = lengths_to_mask(torch.tensor([3, 1, 0]), 4).double()
    logp = torch.tensor([[-1.0, -2.0, -3.0, 7.0], [-0.5, 9.0, 9.0, 9.0], [4.0, 4.0, 4.0, 4.0]])
    torch.testing.assert_close(sequence_confidence(logp, mask), torch.tensor([-2.0, -0.5, 0.0]))


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_lampo_needs_a_positive_temperature(tau):
    b = _batch([1, 0], [2, 2], [0, 0])
    with pytest.raises(ValueError, match="lampo_temperature"):
        _lampo(b, lampo_temperature=tau)


def test_lampo_needs_logprobs():
    b = _batch([1, 0], [2, 2], [0, 0])
    with pytest.raises(ValueError, match="logp_old"):
        lampo(token_rewards=b.token_rewards, mask=b.mask, group_ids=b.group_ids, logp_old=None)


@st.composite
def _lampo_case(draw):
    B = draw(st.integers(1, 9))
    T = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    R = draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0, 2.5]), min_size=B, max_size=B))
    groups = draw(st.lists(st.integers(0, 2), min_size=B, max_size=B))
    logp = draw(st.lists(st.floats(-3.0, 0.0), min_size=B * T, max_size=B * T))
    tau = draw(st.sampled_from([0.05, 0.1, 1.0, 7.0]))
    mask = lengths_to_mask(torch.tensor(lengths), T).double()
    R = torch.tensor(R) * (mask.sum(-1) > 0)  # an empty sequence earns nothing
    b = SequenceBatch(
        mask=mask,
        logp_old=torch.tensor(logp).view(B, T) * mask,
        rewards=R,
        token_rewards=terminal_rewards(R, mask),
        group_ids=torch.tensor(groups),
    )
    return b, tau


@settings(max_examples=150, deadline=None)
@given(case=_lampo_case())
def test_lampo_is_zero_sum_per_group_bounded_and_zero_off_mask(case):
    b, tau = case
    adv, _ = _lampo(b, lampo_temperature=tau)
    a = adv.sum(-1) / b.mask.sum(-1).clamp(min=1)
    R = b.rewards
    for g in b.group_ids.unique():
        rows = b.group_ids == g
        if bool((b.mask[rows].sum(-1) > 0).all()):  # an empty row's advantage has no position to sit on
            assert abs(float(a[rows].sum())) < 1e-9
        spread = float(R[rows].max() - R[rows].min())
        assert torch.all(a[rows].abs() <= 2 * spread + 1e-12)
        if spread == 0:  # equal rewards, singletons included: exactly zero
            assert torch.all(a[rows] == 0)
    assert torch.all(adv[b.mask == 0] == 0) and torch.isfinite(adv).all()
    # each row's advantage is constant over its valid positions
    assert torch.allclose(adv, a[:, None] * b.mask)


@settings(max_examples=100, deadline=None)
@given(case=_lampo_case())
def test_lampo_matches_the_loop_definition(case):
    b, tau = case
    adv, _ = _lampo(b, lampo_temperature=tau)
    R, g = b.rewards.tolist(), b.group_ids.tolist()
    n = b.mask.sum(-1)
    c = ((b.logp_old * b.mask).sum(-1) / n.clamp(min=1)).tolist()
    for i in range(b.batch_size):
        peers = [j for j in range(b.batch_size) if j != i and g[j] == g[i]]
        total = 0.0
        for j in peers:
            s = (R[i] > R[j]) - (R[i] < R[j])
            total += (R[i] - R[j]) * 2.0 / (1.0 + math.exp(s * (c[i] - c[j]) / tau))
        if n[i] > 0:  # right padding: position 0 is valid
            assert adv[i, 0].item() == pytest.approx(total / max(len(peers), 1), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(case=_lampo_case(), data=st.data())
def test_lampo_permutation_equivariant_within_and_between_groups(case, data):
    b, tau = case
    adv, _ = _lampo(b, lampo_temperature=tau)
    perm = torch.tensor(data.draw(st.permutations(list(range(b.batch_size)))), dtype=torch.long)
    bp = b.index(perm)
    adv_p, _ = _lampo(bp, lampo_temperature=tau)
    torch.testing.assert_close(adv_p, adv[perm])
    b.group_ids = 50 - 7 * b.group_ids  # relabelled groups
    torch.testing.assert_close(_lampo(b, lampo_temperature=tau)[0], adv)


@settings(max_examples=100, deadline=None)
@given(case=_lampo_case())
def test_lampo_limits_are_rloo_and_scaled_drgrpo(case):
    b, tau = case
    kw = dict(token_rewards=b.token_rewards, mask=b.mask, group_ids=b.group_ids)
    rloo = ESTIMATORS["rloo"](**kw)[0]
    dr = ESTIMATORS["drgrpo"](**kw)[0]
    # tau -> inf: every weight is 1
    torch.testing.assert_close(_lampo(b, lampo_temperature=1e12)[0], rloo)
    # RLOO = G / (G - 1) * Dr. GRPO
    G = (b.group_ids[:, None] == b.group_ids[None, :]).sum(-1).double()
    torch.testing.assert_close(rloo, dr * (G / (G - 1).clamp(min=1))[:, None])
    # equal confidences, any temperature: the same (an empty sequence's confidence is 0, so only
    # batches without one have equal confidences throughout)
    if bool((b.mask.sum(-1) > 0).all()):
        flat = SequenceBatch(mask=b.mask, logp_old=-0.7 * b.mask, rewards=b.rewards, group_ids=b.group_ids)
        torch.testing.assert_close(_lampo(flat, lampo_temperature=tau)[0], rloo)


def test_lampo_more_confidence_in_the_best_lowers_its_advantage():
    advs = []
    for c0 in (-2.0, -1.0, -0.5, -0.1):
        b = _batch([1, 0, 0, 0.5], [3, 3, 3, 3], [0, 0, 0, 0], logp=[c0, -1.0, -0.7, -1.2])
        advs.append(float(_lampo(b, lampo_temperature=0.3)[0][0, 0]))
    assert all(x > y for x, y in zip(advs, advs[1:])), advs
    assert all(0 < a < 2 for a in advs)


def test_lampo_padding_appended_changes_nothing():
    b = _batch([1, 0, 1, 0, 0], [2, 3, 1, 4, 4], [0, 0, 0, 1, 1], T=4, logp=[-0.3, -0.9, -0.2, -1.0, -0.1])
    adv, _ = _lampo(b, lampo_temperature=0.5)
    pad = lambda x: torch.cat([x, torch.full((x.shape[0], 3), 0.0)], dim=1)  # noqa: E731
    wide = SequenceBatch(mask=pad(b.mask), logp_old=pad(b.logp_old), rewards=b.rewards, group_ids=b.group_ids)
    adv2, _ = _lampo(wide, lampo_temperature=0.5)
    torch.testing.assert_close(adv2[:, :4], adv)
    assert torch.all(adv2[:, 4:] == 0)
    assert torch.all(adv[3:] == 0)  # group 1 is all incorrect


# ====================================================================================== both worlds


@pytest.mark.parametrize("algo", ["bppo", "lampo"])
def test_each_variant_solves_the_easy_sparse_control_task(tmp_path, algo):
    from configs import control_config

    from sppo_rl.control.trainer import run_control
    from sppo_rl.runtime.logging import read_metrics

    cfg = control_config(tmp_path, algo=algo, total_episodes=1536, eval_episodes=64)
    summary = run_control(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["success_rate"] < 0.5, "the task must start hard for a random policy"
    last = float(np.mean([r["success_rate"] for r in rows[-3:]]))
    assert last >= 0.9, (algo, [round(r["success_rate"], 2) for r in rows])
    assert summary["final_eval_success_rate"] >= 0.9


@pytest.mark.parametrize("algo", ["bppo", "lampo"])
def test_each_variant_runs_in_the_llm_world(tmp_path, tiny, algo):
    from configs import llm_config

    from sppo_rl.llm.trainer import run_llm
    from sppo_rl.runtime.logging import read_metrics

    cfg = llm_config(tmp_path, tiny, algo=algo, group_size=4)
    summary = run_llm(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert summary["updates"] == 2 and [r["update"] for r in rows] == [0, 1, 2]
    assert rows[-1]["rollout_logp_diff"] < 1e-4
    assert "reward_mean" in rows[-1] and "val_accuracy" in rows[-1]
    assert (tmp_path / "run" / "final" / "actor" / "model.safetensors").exists()
