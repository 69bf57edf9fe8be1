"""The methods beside SPPO, each pinned by numbers worked by hand from its paper's formula."""

from __future__ import annotations

import math

import pytest
import torch
from paths import reward_file

from sppo_rl.agents.advantages import get_estimator
from sppo_rl.agents.algorithms import compute_advantages, get_algorithm, with_algorithm_defaults
from sppo_rl.agents.batch import SequenceBatch, terminal_rewards
from sppo_rl.agents.learner import LearnerConfig, group_stats_summary, rollout_mismatch
from sppo_rl.agents.losses import kl_penalty, policy_loss


def test_gspo_sequence_ratio_is_the_geometric_mean_clipped_per_sequence():
    # sequence 1: log ratios (0.1, 0.3, -0.1) -> mean 0.1 -> s = e^0.1 = 1.105171 (inside 1 +- 0.2)
    # sequence 2: log ratios (0.5, 0.5)       -> s = e^0.5 = 1.648721 -> clipped to 1.2 (A = 1 > 0)
    logp_old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, -0.1], [0.5, 0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    adv = mask.clone()
    loss, m = policy_loss(logp, logp_old, adv, mask, agg="seq-mean-token-mean", ratio_level="sequence")
    # seq-mean of per-sequence objectives: (-1.105171 + -1.2) / 2 = -1.1525855
    assert float(loss.detach()) == pytest.approx(-1.1525855, abs=1e-6)
    assert m["ratio_max"] == pytest.approx(1.648721, abs=1e-5) and m["clipfrac"] == pytest.approx(2 / 5)
    loss.backward()
    # d/dlogp_t of -(1/2) * e^{mean} over sequence 1: -(1/2) * 1.105171 / 3 = -0.1841952; sequence 2 is clipped: 0
    expected = torch.tensor([[-0.1841952] * 3, [0.0, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    # token level on the same numbers differs: 0.3 and 0.5 exceed log(1.2) = 0.182 and are clipped one by one
    _, mt = policy_loss(logp.detach(), logp_old, adv, mask, agg="seq-mean-token-mean")
    assert mt["clipfrac"] == pytest.approx(3 / 5)


def test_gspo_token_keeps_each_tokens_advantage_where_the_sequence_ratio_averages_them():
    """One sequence of two tokens, A = [1, -1], logp = logp_old (s = 1), seq-mean-token-mean:
    GSPO-token's ``s_t = sg[s] * pi_t / sg[pi_t]`` gives ``l = -(A_1 s_1 + A_2 s_2) / 2`` with
    ``d s_t / d logp_t = s = 1``: ``d loss / d logp = [-1/2, +1/2]``. The sequence ratio gives every
    token ``d s / d logp_t = s / 2``, times the summed advantage 0: ``[0, 0]``."""
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    grads = {}
    for level in ("sequence-token", "sequence"):
        logp = torch.zeros(1, 2, requires_grad=True)
        loss, _ = policy_loss(
            logp, torch.zeros(1, 2), adv, mask, agg="seq-mean-token-mean", ratio_level=level
        )
        loss.backward()
        grads[level] = logp.grad[0].tolist()
    assert grads["sequence-token"] == pytest.approx([-0.5, 0.5], abs=1e-7)
    assert grads["sequence"] == pytest.approx([0.0, 0.0], abs=1e-7)
    # with one advantage per sequence GSPO-token is GSPO: the numbers of the test above, clipping included
    logp_old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, -0.1], [0.5, 0.5, 0.0]], requires_grad=True)
    m2 = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    loss, m = policy_loss(
        logp, logp_old, m2.clone(), m2, agg="seq-mean-token-mean", ratio_level="sequence-token"
    )
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.1525855, abs=1e-6) and m["clipfrac"] == pytest.approx(
        2 / 5
    )
    assert torch.allclose(logp.grad, torch.tensor([[-0.1841952] * 3, [0.0, 0.0, 0.0]]), atol=1e-6)


def test_cispo_weight_is_bounded_above_only_and_keeps_the_gradient_of_clipped_tokens():
    """MiniMax-M1 sets no lower bound on the IS weight. r = e^0.5 = 1.6487 with A = +1: weight
    min(r, 1.2) = 1.2, d loss / d logp = -1.2 * 1 / 2 (token mean) = -0.6; r = 0.5 with A = -1: weight 0.5
    (a floor at 1 - eps would make it 0.8), d loss / d logp = -0.5 * -1 / 2 = +0.25."""
    logp = torch.tensor([[0.5, math.log(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, m = policy_loss(logp, torch.zeros(1, 2), adv, mask, clip_low=0.2, clip_high=0.2, mode="cispo")
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.6, 0.25]]), atol=1e-6)
    assert m["clipfrac"] == 0.5  # only the first token's weight is capped
    # PPO drops both: A > 0 above 1 + eps, A < 0 below 1 - eps
    logp2 = logp.detach().clone().requires_grad_(True)
    ppo, _ = policy_loss(logp2, torch.zeros(1, 2), adv, mask)
    ppo.backward()
    assert torch.equal(logp2.grad, torch.zeros(1, 2))


def test_truncated_importance_weights_scale_each_token_and_the_mismatch_is_logged():
    # pi_old / mu = 3 on the first token (capped at 2), 0.5 on the second
    logp = torch.zeros(1, 2, requires_grad=True)
    weights = torch.tensor([[3.0, 0.5]]).clamp(max=2.0)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), weights=weights)
    assert float(loss.detach()) == pytest.approx(-(2.0 + 0.5) / 2)
    b = SequenceBatch(mask=torch.ones(1, 2), logp_old=torch.zeros(1, 2), rewards=torch.ones(1))
    b.logp_rollout = torch.tensor([[-math.log(3.0), math.log(2.0)]])
    stats = rollout_mismatch(b)
    assert stats["rollout_mismatch_mean"] == pytest.approx((math.log(3) + math.log(2)) / 2)
    assert stats["rollout_mismatch_max"] == pytest.approx(math.log(3))


def test_reinforce_plus_plus_standardises_returns_over_the_batch():
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    R = torch.tensor([1.0, 0.0])
    adv, ret = get_estimator("reinforce++")(token_rewards=terminal_rewards(R, mask), mask=mask)
    # returns-to-go (1, 1, 1) and (0, 0): mean 0.6, unbiased var (3 * 0.16 + 2 * 0.36) / 4 = 0.3
    hi, lo = 0.4 / math.sqrt(0.3), -0.6 / math.sqrt(0.3)
    assert torch.allclose(adv, torch.tensor([[hi, hi, hi], [lo, lo, 0.0]]), atol=1e-5)
    assert torch.equal(ret, R)


def test_reinforce_plus_plus_baseline_centres_per_group_and_whitens_over_the_batch():
    mask = torch.ones(4, 2)
    R = torch.tensor([1.0, 1.0, 0.0, 0.0])
    adv, _ = get_estimator("reinforce++-baseline")(
        token_rewards=terminal_rewards(R, mask), mask=mask, group_ids=torch.zeros(4, dtype=torch.long)
    )
    # centred +-0.5 on 8 positions, mean 0: unbiased std sqrt(8 * 0.25 / 7) = 0.534522 -> +-0.935414
    assert torch.allclose(adv[:, 0], torch.tensor([0.935414, 0.935414, -0.935414, -0.935414]), atol=1e-5)


def test_reinforce_plus_plus_baseline_subtracts_the_batch_mean_over_tokens():
    """verl / OpenRLHF whiten the centred outcomes over the batch's valid TOKENS. One group R = [1, 0] of
    lengths 10 and 30: c = [0.5, -0.5]; token mean (10 * 0.5 - 30 * 0.5) / 40 = -0.25; unbiased variance
    (10 * 0.75^2 + 30 * 0.25^2) / 39 = 7.5 / 39, std 0.43853: A = 0.75 / 0.43853 = +1.7103 and
    -0.25 / 0.43853 = -0.5701 (dividing by the std alone gives +-0.5 / 0.43853 = +-1.1402)."""
    mask = torch.zeros(2, 30)
    mask[0, :10] = 1
    mask[1] = 1
    R = torch.tensor([1.0, 0.0])
    adv, _ = get_estimator("reinforce++-baseline")(
        token_rewards=terminal_rewards(R, mask), mask=mask, group_ids=torch.zeros(2, dtype=torch.long)
    )
    sd = math.sqrt(7.5 / 39)
    assert float(adv[0, 0]) == pytest.approx(0.75 / sd, abs=1e-4) and float(adv[0, 0]) == pytest.approx(
        1.7103, abs=1e-4
    )
    assert float(adv[1, 0]) == pytest.approx(-0.25 / sd, abs=1e-4) and float(adv[1, 0]) == pytest.approx(
        -0.5701, abs=1e-4
    )
    assert float(adv[0, 10:].abs().sum()) == 0.0


def test_reinforce_plus_plus_baseline_adds_a_kl_reward_per_token_before_the_return_to_go():
    """OpenRLHF: the group baseline is over the outcome; the KL penalty stays on its token and enters the
    return-to-go. One group R = [1, 0], two tokens each, KL reward -0.2 on each token of row 0:
    per-token rewards row 0 = [-0.2, 0.5 - 0.2], row 1 = [0, -0.5]; returns-to-go [0.1, 0.3] and
    [-0.5, -0.5]; mean -0.15; deviations [0.25, 0.45, -0.35, -0.35], unbiased variance 0.51 / 3 = 0.17:
    A = [0.6063, 1.0914, -0.8489, -0.8489]. Summing the KL into R (R = [0.6, 0], centred +-0.3) would give
    one advantage per row, +-0.866."""
    mask = torch.ones(2, 2)
    R = torch.tensor([1.0, 0.0])
    kl_reward = torch.tensor([[-0.2, -0.2], [0.0, 0.0]])
    adv, _ = get_estimator("reinforce++-baseline")(
        token_rewards=terminal_rewards(R, mask) + kl_reward,
        mask=mask,
        group_ids=torch.zeros(2, dtype=torch.long),
        rewards=R,
    )
    sd = math.sqrt(0.17)
    expected = torch.tensor([[0.25, 0.45], [-0.35, -0.35]]) / sd
    assert torch.allclose(adv, expected, atol=1e-5)
    assert adv[0].tolist() == pytest.approx([0.6063, 1.0914], abs=1e-4)
    # through compute_advantages: the batch's outcome is the baseline's R, the KL stays per token
    b = SequenceBatch(
        mask=mask,
        logp_old=torch.zeros(2, 2),
        rewards=R,
        token_rewards=terminal_rewards(R, mask) + kl_reward,
        group_ids=torch.zeros(2, dtype=torch.long),
    )
    compute_advantages(b, get_algorithm("reinforce++-baseline"))
    assert torch.allclose(b.advantages, expected, atol=1e-5)


def test_gae_with_a_critic_lambda_and_a_length_adaptive_actor_lambda():
    mask = torch.ones(1, 2)
    values = torch.full((1, 2), 0.5)
    tr = terminal_rewards(torch.ones(1), mask)
    gae = get_estimator("gae")
    # lam 0.5: delta = (0, 0.5); A_1 = 0.5, A_0 = 0 + 0.5 * 0.5 = 0.25; returns A + V = (0.75, 1.0)
    adv, ret = gae(token_rewards=tr, mask=mask, values=values, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.5]])) and torch.allclose(
        ret, torch.tensor([[0.75, 1.0]])
    )
    # the critic's targets with lam_critic = 1: A_0 = 0.5 -> returns (1.0, 1.0); the actor keeps 0.5's
    adv, ret = gae(token_rewards=tr, mask=mask, values=values, lam=0.5, lam_critic=1.0)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.5]])) and torch.allclose(
        ret, torch.tensor([[1.0, 1.0]])
    )
    # lam_alpha = 1 on a sequence of 2 positions: lam = 1 - 1 / 2 = 0.5, the same as above
    adv, _ = gae(token_rewards=tr, mask=mask, values=values, lam=0.99, lam_alpha=1.0)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.5]]))


def test_grpo_leaves_near_equal_groups_alone():
    mask = torch.ones(4, 1)
    R = torch.tensor([1.0, 0.99, 0.995, 0.998])  # an all-correct group with a KL penalty in the reward
    kw = dict(token_rewards=terminal_rewards(R, mask), mask=mask, group_ids=torch.zeros(4, dtype=torch.long))
    adv, _ = get_estimator("grpo")(**kw)
    assert torch.equal(adv, torch.zeros(4, 1))
    noisy, _ = get_estimator("grpo")(**kw, std_threshold=0.0)
    assert float(noisy.abs().max()) > 0.5, "without the threshold the noise is blown up to unit scale"


def test_group_hygiene_statistics():
    b = SequenceBatch(
        mask=torch.tensor([[1.0, 1], [1, 1], [1, 0], [1, 0], [1, 1], [1, 0]]),
        logp_old=torch.zeros(6, 2),
        rewards=torch.tensor([1.0, 1, 0, 0, 1, 0]),
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
    )
    b.advantages = torch.tensor([[0.0], [0.0], [0.0], [0.0], [0.7071], [-0.7071]]).expand(6, 2).clone()
    s = group_stats_summary(b)
    assert (s["groups_all_correct"], s["groups_all_wrong"], s["groups_mixed"]) == pytest.approx((1 / 3,) * 3)
    assert s["groups_zero_variance"] == pytest.approx(2 / 3)
    assert s["adv_norm_raw"] == pytest.approx(math.sqrt(0.5)) and s["adv_norm"] == pytest.approx(
        1.0, abs=1e-4
    )
    assert (s["length_adv_pos"], s["length_adv_neg"]) == (2.0, 1.0)


def test_algorithms_bring_their_own_defaults_and_a_run_setting_wins():
    from sppo_rl.control.config import ControlConfig

    def resolved(**kw):
        cfg = ControlConfig(**kw)
        return LearnerConfig.from_run(cfg, 30, get_algorithm(cfg.algo).defaults)

    assert resolved(algo="drgrpo").agg == "seq-mean-token-sum-norm"
    assert resolved(algo="drgrpo", agg="token-mean").agg == "token-mean"
    assert resolved(algo="grpo").agg == "token-mean"
    g = resolved(algo="gspo")
    assert (g.ratio_level, g.agg) == ("sequence", "seq-mean-token-mean")
    assert (
        resolved(algo="sppo-seq").ratio_level == "sequence" and resolved(algo="cispo").policy_loss == "cispo"
    )
    assert resolved(algo="gspo", ratio_level="sequence-token").ratio_level == "sequence-token"  # GSPO-token


def test_gspo_runs_at_its_papers_clip_range_unless_the_user_sets_one():
    """GSPO Sec. 5.1: 3e-4 left, 4e-4 right on the sequence ratio. A user's --clip sets both sides (the
    algorithm's right side does not sneak in); a user's --clip-high alone keeps GSPO's left side."""
    from sppo_rl.control.config import ControlConfig

    def clips(**kw):
        cfg = ControlConfig(**kw)
        lc = LearnerConfig.from_run(cfg, 30, get_algorithm(cfg.algo).defaults)
        return lc.clip, lc.clip if lc.clip_high is None else lc.clip_high

    assert clips(algo="gspo") == (3e-4, 4e-4) and clips(algo="gspo", ratio_level="sequence-token") == (
        3e-4,
        4e-4,
    )
    assert clips(algo="gspo", clip=0.1) == (0.1, 0.1)
    assert clips(algo="gspo", clip_high=1e-3) == (3e-4, 1e-3)
    assert clips(algo="grpo") == (0.2, 0.2) and clips(algo="grpo", clip=0.1, clip_high=0.28) == (0.1, 0.28)
    # the resolved run config (what the trainers save) states the same
    cfg = with_algorithm_defaults(ControlConfig(algo="gspo"), get_algorithm("gspo"))
    assert (cfg.clip, cfg.clip_high, cfg.ratio_level) == (3e-4, 4e-4, "sequence")


def test_reinforce_plus_plus_puts_a_k1_kl_in_the_reward_by_default():
    """REINFORCE++ (arXiv 2501.03262) has a token-level KL penalty in the reward; coefficient 0.01 as
    OpenRLHF's REINFORCE++ example. Other methods keep KL off; a user's --kl-coef 0 wins."""
    from sppo_rl.llm.config import LLMConfig

    def kl(**kw):
        cfg = with_algorithm_defaults(LLMConfig(**kw), get_algorithm(kw["algo"]))
        return cfg.kl_coef, cfg.kl_in, cfg.kl_estimator

    assert kl(algo="reinforce++") == (0.01, "reward", "k1")
    assert kl(algo="reinforce++", kl_coef=0.0) == (0.0, "reward", "k1")
    assert kl(algo="reinforce++", kl_in="loss", kl_estimator="k3") == (0.01, "loss", "k3")
    assert kl(algo="grpo") == (0.0, "loss", "k3") and kl(algo="reinforce++-baseline") == (0.0, "loss", "k3")


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_the_loss_has_the_stated_on_policy_gradient(estimator):
    """Exact expectation over a categorical policy: E_{y~pi}[grad_theta k(y)] with y held fixed."""
    theta = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.4, -0.3]), 0)
    logp = torch.log_softmax(theta, 0)
    k = kl_penalty(logp, ref, estimator)
    expected_grad = torch.autograd.grad((logp.exp().detach() * k).sum(), theta)[0]
    pi = torch.softmax(theta, 0)
    kl_fwd = (pi * (torch.log(pi) - ref)).sum()  # KL(pi || ref)
    kl_rev = (ref.exp() * (ref - torch.log(pi))).sum()  # KL(ref || pi)
    target = {
        "k1": torch.zeros(3),
        "k2": torch.autograd.grad(kl_fwd, theta, retain_graph=True)[0],
        "k3": torch.autograd.grad(kl_rev, theta)[0],
    }[estimator]
    assert torch.allclose(expected_grad, target, atol=1e-6)
    assert float(target.abs().max()) > 1e-3 or estimator == "k1"


def test_critic_warmup_holds_the_actor_in_the_control_world(tmp_path):
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import run_control
    from sppo_rl.runtime.logging import read_metrics

    cfg = ControlConfig(
        algo="ppo", task="short-cartpole", total_episodes=256, critic_warmup=2, init_from="none",
        out_dir=str(tmp_path / "run"), progress=False, tensorboard=False, eval_episodes=0,
    )  # fmt: skip
    run_control(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["actor_skipped"] for r in rows] == [1, 1, 0, 0]
    assert "policy_loss" not in rows[0] and "value_loss" in rows[0] and "policy_loss" in rows[2]


def test_dapo_soft_overlong_punishment_worked_numbers():
    from sppo_rl.agents.batch import overlong_penalty

    # L = 16, C = 4: free up to 12 tokens, then (12 - l) / 4: 14 -> -0.5, 16 -> -1; past L -> -1
    pen = overlong_penalty(torch.tensor([5, 12, 13, 14, 16, 20]), max_len=16, buffer=4, factor=0.5)
    assert torch.allclose(pen, 0.5 * torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    assert torch.equal(overlong_penalty(torch.tensor([16]), 16, 0), torch.zeros(1))


def test_overlong_filtering_leaves_truncated_responses_out_of_the_loss(tmp_path, tiny):
    """An untrained tiny model never stops within 8 tokens: with the filter every response is cut, so
    nothing is left to train the actor on, and every one is counted."""
    from sppo_rl.config import from_flat
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.trainer import run_llm
    from sppo_rl.runtime.logging import read_metrics

    common = dict(
        task="arithmetic", model=str(tiny), updates=1, prompts_per_step=4, train_size=32, val_size=4,
        eval_samples=1, eval_every=0, max_new_tokens=8, algo="grpo", group_size=4, temperature=2.0,
        reward_fn=reward_file(tmp_path / "parity.py"), progress=False, tensorboard=False,
    )  # fmt: skip
    rows = {}
    for name, extra in {"plain": {}, "filtered": {"overlong_filter": True}}.items():
        cfg = from_flat(LLMConfig, {**common, **extra, "out_dir": str(tmp_path / name)})
        run_llm(cfg)
        rows[name] = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["update"] == 1][0]
    cut = rows["filtered"]["response_clip_frac"] * 16
    assert cut > 0, "the tiny model must be cut off for the test to mean anything"
    assert rows["filtered"]["overlong_filtered"] == cut
    assert rows["filtered"]["loss_frac"] < rows["plain"]["loss_frac"] == 1.0
