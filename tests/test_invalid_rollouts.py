"""Invalid rollouts (the verifier failed: outcome unknown) are masked, not scored 0: no advantage, no loss,
left out of group statistics, batch whitening and the critic's targets. Numbers worked by hand."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_learner import World

from sppo_rl.agents.algorithms import compute_advantages, critic_loss, get_algorithm
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.learner import LearnerConfig, group_stats_summary
from sppo_rl.llm.rewards.scorer import RewardScorer

S3 = math.sqrt(1 / 3)  # sample std of [1, 0, 1] and of [1, 0, 0, 1]


def _batch(R: list[float], groups: list[int], valid: list[bool] | None, T: int = 3) -> SequenceBatch:
    mask = torch.ones(len(R), T)
    return SequenceBatch(
        mask=mask,
        logp_old=torch.zeros(len(R), T),
        rewards=torch.tensor(R),
        group_ids=torch.tensor(groups),
        valid=None if valid is None else torch.tensor(valid),
    )


def test_grpo_group_with_an_invalid_member_is_the_group_of_its_valid_members():
    # group 0: R = [1, 0, invalid, 1] -> the 3-member group [1, 0, 1]: mean 2/3, sample std sqrt(1/3):
    #   A = (1/3) / sqrt(1/3) = 0.5774, (-2/3) / sqrt(1/3) = -1.1547; the invalid row 0
    # scored 0 instead: [1, 0, 0, 1]: mean 1/2, std sqrt(1/3): A = +-0.8660 (what the old code gave)
    # group 1 ([1, 0], all valid) is untouched: A = +-0.5 / sqrt(1/2) = +-0.7071
    R, groups = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [0, 0, 0, 0, 1, 1]
    masked = compute_advantages(
        _batch(R, groups, [True, True, False, True, True, True]), get_algorithm("grpo")
    )
    expected = torch.tensor(
        [1 / 3 / S3, -2 / 3 / S3, 0.0, 1 / 3 / S3, 0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)]
    )
    assert torch.allclose(masked.advantages[:, 0], expected, atol=1e-5)
    assert torch.allclose(masked.advantages, expected[:, None].expand(6, 3), atol=1e-5)
    assert torch.equal(masked.loss_mask[2], torch.zeros(3)) and torch.equal(
        masked.loss_mask[3], torch.ones(3)
    )
    zero_scored = compute_advantages(_batch(R, groups, None), get_algorithm("grpo"))
    assert torch.allclose(
        zero_scored.advantages[:4, 0], torch.tensor([0.866, -0.866, -0.866, 0.866]), atol=1e-3
    )
    # population std: std of [1, 0, 1] is sqrt(2/9): A = (1/3) / 0.4714 = 0.7071, -1.4142
    pop = compute_advantages(
        _batch(R, groups, [True, True, False, True, True, True]), get_algorithm("grpo"), std="population"
    )
    assert torch.allclose(pop.advantages[:4, 0], torch.tensor([0.7071, -1.4142, 0.0, 0.7071]), atol=1e-4)


def test_rloo_leaves_one_out_over_valid_members_and_a_lone_valid_member_gets_zero():
    # group 0: [1, 0, invalid, 1]: baselines over the other VALID members: row 0: (0 + 1)/2 -> A = 0.5;
    #   row 1: (1 + 1)/2 -> A = -1; row 3: 0.5. (Scored 0: 2/3, -2/3, -2/3, 2/3.)
    # group 1: [1, invalid]: one valid member, nothing to compare: 0 (scored 0 it would be +1 / -1)
    R, groups = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [0, 0, 0, 0, 1, 1]
    valid = [True, True, False, True, True, False]
    for name in ("rloo", "drgrpo", "grpo", "lampo", "reinforce++-baseline", "opo"):
        b = compute_advantages(_batch(R, groups, valid), get_algorithm(name))
        assert float(b.advantages[4].abs().sum()) == 0.0 and float(b.advantages[5].abs().sum()) == 0.0, name
        assert float(b.advantages[2].abs().sum()) == 0.0, name
    b = compute_advantages(_batch(R, groups, valid), get_algorithm("rloo"))
    assert torch.allclose(b.advantages[:, 0], torch.tensor([0.5, -1.0, 0.0, 0.5, 0.0, 0.0]), atol=1e-6)
    old = compute_advantages(_batch(R, groups, None), get_algorithm("rloo"))
    assert torch.allclose(
        old.advantages[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.0, -1.0]), atol=1e-6
    )


def test_batch_standardisation_ignores_invalid_rows():
    # reinforce++ on rows (R=1, 3 tokens), (R=0, 2 tokens) is 0.4/sqrt(0.3), -0.6/sqrt(0.3) (test_methods);
    # a third, invalid row of 2 tokens must not move the mean or the std (scored 0 it would)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 0]])
    R = torch.tensor([1.0, 0.0, 0.0])
    b = SequenceBatch(
        mask=mask, logp_old=torch.zeros(3, 3), rewards=R, valid=torch.tensor([True, True, False])
    )
    compute_advantages(b, get_algorithm("reinforce++"))
    hi, lo = 0.4 / math.sqrt(0.3), -0.6 / math.sqrt(0.3)
    assert torch.allclose(
        b.advantages, torch.tensor([[hi, hi, hi], [lo, lo, 0.0], [0.0, 0.0, 0.0]]), atol=1e-5
    )
    # GAE with whitening (ppo): whitened over the valid rows' positions only
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 0.0], [0.9, 0.9, 0.0]])
    full = SequenceBatch(
        mask=mask,
        logp_old=torch.zeros(3, 3),
        rewards=R,
        values=values,
        valid=torch.tensor([True, True, False]),
    )
    compute_advantages(full, get_algorithm("ppo"), whiten=True)
    two = SequenceBatch(mask=mask[:2], logp_old=torch.zeros(2, 3), rewards=R[:2], values=values[:2])
    compute_advantages(two, get_algorithm("ppo"), whiten=True)
    assert torch.allclose(full.advantages[:2], two.advantages, atol=1e-6)
    assert torch.equal(full.advantages[2], torch.zeros(3)) and torch.equal(full.returns[2], torch.zeros(3))


def test_sppo_critic_loss_and_targets_ignore_an_invalid_row():
    # valid rows: V = 0.65 with R = 1 (BCE -ln 0.65 = 0.43078) and R = 0 (BCE -ln 0.35 = 1.04982): mean 0.74030
    logit = math.log(0.65 / 0.35)
    algo = get_algorithm("sppo")
    b = _batch([1.0, 0.0, 0.0], [0, 1, 2], [True, True, False])
    b.group_ids = None
    b.values = torch.tensor([logit, logit, 3.0])
    compute_advantages(b, algo)
    assert torch.allclose(b.advantages[:, 0], torch.tensor([0.35, -0.65, 0.0]), atol=1e-6)
    mask = b.mask
    for other_logit, other_R in ((3.0, 0.0), (-5.0, 1.0)):  # whatever the invalid row holds
        pred = torch.tensor([logit, logit, other_logit])
        returns = torch.tensor([1.0, 0.0, other_R])
        loss = critic_loss(algo, pred, returns, mask, valid=b.valid)
        assert float(loss) == pytest.approx((-math.log(0.65) - math.log(0.35)) / 2, abs=1e-5)
    unmasked = critic_loss(algo, torch.tensor([logit, logit, 3.0]), torch.tensor([1.0, 0.0, 0.0]), mask)
    assert float(unmasked) > 1.0  # the invalid row scored 0 with logit 3 would add BCE 3.049 to the mean
    none_valid = critic_loss(
        algo, torch.tensor([logit], requires_grad=True), torch.ones(1), mask[:1], valid=torch.tensor([False])
    )
    assert float(none_valid.detach()) == 0.0 and none_valid.requires_grad
    # PPO's clipped MSE: an invalid row's value error carries no weight
    ppo = get_algorithm("ppo")
    v = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    ret = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mse = critic_loss(ppo, v, ret, mask, clip=None, valid=b.valid)
    assert float(mse) == pytest.approx(0.5 * (3 * 0.25) / 6, abs=1e-6)


@pytest.mark.parametrize("algo,critic", [("grpo", "none"), ("sppo", "sequence"), ("ppo", "step")])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_the_learner_takes_nothing_from_an_invalid_row(algo, critic, agg):
    """An update on 10 rows of which row 3 is invalid equals the update on the 9 others alone (actor and
    critic weights, losses), whatever row 3's outcome: its gradient is exactly zero."""
    bad = 3
    keep = torch.tensor([i for i in range(10) if i != bad])
    cfg = LearnerConfig(agg=agg, micro_batch_size=4)
    results = []
    for r_bad in (0.0, 1.0):
        w = World(critic=critic)
        w.rewards[bad] = r_bad
        b = w.batch(algo)  # advantages without the mask, replaced below
        b.valid = torch.ones(10, dtype=torch.bool)
        b.valid[bad] = False
        b.advantages = b.returns = b.loss_mask = None
        compute_advantages(b, get_algorithm(algo))
        assert float(b.loss_mask[bad].sum()) == 0.0 and float(b.advantages[bad].abs().sum()) == 0.0
        stats = w.update(algo, cfg, batch=b)
        results.append((w.weights(), stats))
    # the same 9 rows alone (a World cut to them, same initial weights)
    w9 = World(critic=critic)
    ref = copy.deepcopy(w9)
    for name in ("x", "actions", "lengths", "mask", "rewards"):
        setattr(w9, name, getattr(ref, name)[keep])
    b9 = w9.batch(algo)
    b9.group_ids = (torch.arange(10) // 2)[keep]  # the same groups: row 2's group is row 2 alone
    b9.advantages = b9.returns = b9.loss_mask = None
    compute_advantages(b9, get_algorithm(algo))
    s9 = w9.update(algo, cfg, batch=b9)
    for weights, stats in results:
        assert torch.allclose(weights, w9.weights(), atol=1e-6)
        for key in ("policy_loss", "critic_bce", "value_loss"):
            if key in s9:
                assert stats[key] == pytest.approx(s9[key], abs=1e-6), key
    assert not torch.equal(w9.weights(), World(critic=critic).weights()), "the update moved the weights"


def test_group_hygiene_counts_valid_members_only():
    # group 0: [1, 1, invalid]: all correct among its valid members; group 1: [1, 0, 0]: mixed
    b = _batch([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1], [True, True, False, True, True, True])
    compute_advantages(b, get_algorithm("grpo"))
    s = group_stats_summary(b)
    assert s["groups_all_correct"] == 0.5 and s["groups_mixed"] == 0.5 and s["groups_all_wrong"] == 0.0


def test_scorer_marks_verifier_failures_invalid_but_a_wrong_answer_valid(tmp_path):
    fn = tmp_path / "reward.py"
    fn.write_text(
        "def score(response, truth):\n"
        "    if response == 'boom':\n"
        "        raise RuntimeError('a bug in the verifier')\n"
        "    if response == 'big':\n"
        "        return 5.0\n"
        "    if response == 'nan':\n"
        "        return float('nan')\n"
        "    return 1.0 if response == truth else 0.0\n"
    )
    with RewardScorer(f"{fn}:score", timeout_s=5.0) as scorer:
        res = scorer.score(["7", "not a number", "boom", "big", "nan", "7"], ["7"] * 6)
    assert res.scores.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert res.valid.tolist() == [True, True, False, False, False, True]
    assert res.errors == 3 and res.valid.dtype == np.bool_


def test_llm_run_with_a_reward_that_raises_masks_and_counts_the_failures(tmp_path, tiny):
    """A reward file that raises on every odd-length response: the run trains, counts each failure in
    invalid_rollouts (= verifier_errors: no greedy rollouts) and leaves those rows out of the loss."""
    from configs import llm_config

    from sppo_rl.llm.trainer import run_llm
    from sppo_rl.runtime.logging import read_metrics

    fn = tmp_path / "odd.py"
    fn.write_text(
        "def odd(response, truth):\n"
        "    if len(response) % 2:\n"
        "        raise ValueError('cannot verify an odd-length response')\n"
        "    return float(len(response) % 4 == 0)\n"
    )
    cfg = llm_config(
        tmp_path, tiny, algo="grpo", group_size=4, train_size=32, val_size=4, eval_samples=1, eval_every=0,
        temperature=2.0, reward_fn=f"{fn}:odd",
    )  # fmt: skip
    summary = run_llm(cfg)
    rows = [
        r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if r["update"] > 0 and "loss_frac" in r
    ]
    assert summary["updates"] == 2 and len(rows) == 2
    assert all(r["invalid_rollouts"] == r["verifier_errors"] for r in rows)
    assert sum(r["invalid_rollouts"] for r in rows) > 0
    for r in rows:
        # the masked rows' tokens are out of the loss: loss_frac < 1 exactly when a row was invalid
        assert (r["loss_frac"] < 1.0) == (r["invalid_rollouts"] > 0), r
        assert 0.0 <= r["reward_mean"] <= 1.0
