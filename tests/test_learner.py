"""The shared PPO learner on tiny fake policies: micro-batches, data parallel, skip rule, fixes."""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch
from paths import GradRecorder

from sppo_rl.agents.algorithms import compute_advantages, get_algorithm
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.learner import (
    LearnerConfig,
    TorchEngine,
    Trained,
    forward_rows,
    micro_batches,
    ppo_update,
)
from sppo_rl.agents.losses import AGG_MODES, bce_value_loss

D, K = 5, 4  # feature size, actions


class World:
    """Fixed random features per position, a linear softmax policy and a linear critic."""

    def __init__(self, B: int = 10, T: int = 7, seed: int = 0, critic: str = "none"):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(B, T, D, generator=g)
        self.lengths = torch.randint(1, T + 1, (B,), generator=g)
        self.lengths[0] = T
        self.mask = (torch.arange(T)[None] < self.lengths[:, None]).float()
        self.actions = torch.randint(0, K, (B, T), generator=g)
        self.rewards = (torch.rand(B, generator=g) < 0.5).float()
        torch.manual_seed(seed)
        self.policy = torch.nn.Linear(D, K)
        self.kind = critic
        self.critic = torch.nn.Linear(D, 1) if critic != "none" else None

    def actor(self, rows: torch.Tensor, T: int):
        z = self.policy(self.x[rows, :T])
        logp_all = torch.log_softmax(z, -1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        return logp_all.gather(-1, self.actions[rows, :T, None])[..., 0], ent

    def values(self, rows: torch.Tensor, T: int):
        v = self.critic(self.x[rows, :T])[..., 0]
        return v[:, 0] if self.kind == "sequence" else v

    def batch(self, algo_name: str, **params) -> SequenceBatch:
        algo = get_algorithm(algo_name)
        with torch.no_grad():
            logp, _ = self.actor(torch.arange(len(self.lengths)), self.x.shape[1])
        b = SequenceBatch(
            mask=self.mask,
            logp_old=(logp - 0.05) * self.mask,  # a little off-policy, so that clipping can act
            rewards=self.rewards,
            group_ids=torch.arange(len(self.lengths)) // 2,
        )
        if self.critic is not None:
            cost = self.lengths
            b.values = forward_rows(self.values, self.lengths, cost, LearnerConfig())
        return compute_advantages(b, algo, **params)

    def update(self, algo_name: str, cfg: LearnerConfig, batch: SequenceBatch | None = None, **kw):
        return self.train(algo_name, cfg, batch, **kw).stats

    def train(self, algo_name: str, cfg: LearnerConfig, batch: SequenceBatch | None = None, **kw) -> Trained:
        batch = batch if batch is not None else self.batch(algo_name)
        actor_engine = TorchEngine(self.policy, torch.optim.SGD(self.policy.parameters(), lr=0.5), 1.0)
        critic_engine = (
            TorchEngine(self.critic, torch.optim.SGD(self.critic.parameters(), lr=0.5), 1.0)
            if self.critic is not None
            else None
        )
        return ppo_update(
            batch,
            get_algorithm(algo_name),
            cfg,
            self.actor,
            actor_engine,
            self.values if self.critic is not None else None,
            critic_engine,
            generator=torch.Generator().manual_seed(1),
            **kw,
        )

    def weights(self) -> torch.Tensor:
        mods = [self.policy] + ([self.critic] if self.critic is not None else [])
        return torch.cat([p.detach().flatten() for m in mods for p in m.parameters()])


def test_micro_batches_pack_longest_first_within_the_budget():
    cost = torch.tensor([5, 3, 8, 2])
    rows = torch.arange(4)
    # longest first: 8 alone (2 x 8 > 10); 5 and 3 (2 x 5 = 10); 2 would make 3 x 5 = 15 > 10
    assert [m.tolist() for m in micro_batches(rows, cost, None, 10)] == [[2], [0, 1], [3]]
    assert [m.tolist() for m in micro_batches(rows, cost, 2, None)] == [[2, 0], [1, 3]]
    assert [m.tolist() for m in micro_batches(rows, cost, None, None)] == [[2, 0, 1, 3]]
    # a row longer than the budget still gets a micro-batch of its own
    assert [m.tolist() for m in micro_batches(rows, cost, None, 1)] == [[2], [0], [1], [3]]
    # a larger count (another rank needs more passes) splits the largest micro-batch
    assert [m.tolist() for m in micro_batches(rows, cost, None, None, count=3)] == [[2], [0], [1, 3]]


SPLITS = [
    dict(micro_batch_size=1),
    dict(micro_batch_size=3),
    dict(max_tokens_per_micro_batch=9),
]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("split", SPLITS, ids=["mbs1", "mbs3", "tokens9"])
@pytest.mark.parametrize("algo,critic", [("grpo", "none"), ("ppo", "step"), ("sppo", "sequence")])
def test_micro_batches_equal_the_unsplit_update(agg, split, algo, critic):
    base = LearnerConfig(
        epochs=2, minibatches=2, agg=agg, length_budget=7, ent_coef=0.01, dual_clip=3.0, value_clip=0.05
    )
    whole, parts = World(critic=critic), World(critic=critic)
    sa = whole.update(algo, base)
    sb = parts.update(algo, LearnerConfig(**{**base.__dict__, **split}))
    moved = (whole.weights() - World(critic=critic).weights()).abs().max()
    assert moved > 1e-3, "the update must move the weights for the comparison to mean anything"
    assert torch.allclose(whole.weights(), parts.weights(), atol=1e-5, rtol=0)
    for key in ("policy_loss", "entropy", "grad_norm", "clipfrac", "approx_kl", "critic_grad_norm"):
        if key in sa:
            assert sb[key] == pytest.approx(sa[key], abs=1e-5), key
    critic_key = {"step": "value_loss", "sequence": "critic_bce"}.get(critic)
    if critic_key:
        assert sb[critic_key] == pytest.approx(sa[critic_key], abs=1e-5)


class ThreadRanks:
    """Two data-parallel 'ranks' as threads: sums and maxima are exchanged, and each engine averages
    its gradients over the ranks before clipping and stepping (as DeepSpeed does)."""

    def __init__(self, world: int = 2):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[object] = [None] * world

    def exchange(self, rank: int, value: object) -> list[object]:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def rank(self, r: int):
        ranks = self

        class Rank:
            world = ranks.world

            def all_sum(self, values):
                got = ranks.exchange(r, list(values))
                return [sum(v[i] for v in got) for i in range(len(values))]

            def all_max(self, values):
                got = ranks.exchange(r, list(values))
                return [max(v[i] for v in got) for i in range(len(values))]

        class Engine(TorchEngine):
            def step(self):
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
                got = ranks.exchange(r, [g.clone() for g in grads])
                for p, *gs in zip(self.params, *got):
                    p.grad = sum(gs) / ranks.world
                return super().step()

        return Rank(), Engine


@pytest.mark.parametrize("agg", AGG_MODES)
def test_two_data_parallel_ranks_equal_one_process(agg):
    """Each rank holds half the rows; some rows have an empty loss mask (as BPPO's selection leaves):
    the ranks' weighted losses must still average to the whole batch's loss."""
    cfg = LearnerConfig(agg=agg, length_budget=7, micro_batch_size=2)
    ref = World(B=8, critic="none")
    full = ref.batch("grpo")
    full.loss_mask[[1, 2, 3]] = 0.0  # rank 0 keeps one row with a loss, rank 1 all four
    full.advantages = full.advantages * full.loss_mask
    stats_ref = ref.update("grpo", cfg, batch=copy.deepcopy(full))

    ranks = ThreadRanks(2)
    worlds = [World(B=8, critic="none") for _ in range(2)]
    results: list[dict] = [{}, {}]

    def run(r: int) -> None:
        red, Engine = ranks.rank(r)
        w = worlds[r]
        rows = torch.arange(4) + 4 * r
        part = full.index(rows)
        w.x, w.actions, w.lengths = w.x[rows], w.actions[rows], w.lengths[rows]
        eng = Engine(w.policy, torch.optim.SGD(w.policy.parameters(), lr=0.5), 1.0)
        results[r] = ppo_update(
            part,
            get_algorithm("grpo"),
            cfg,
            w.actor,
            eng,
            dist=red,
            generator=torch.Generator().manual_seed(1),
        ).stats

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[0] and results[1], "a rank failed"
    assert torch.allclose(worlds[0].weights(), ref.weights(), atol=1e-6)
    assert torch.allclose(worlds[1].weights(), ref.weights(), atol=1e-6)
    assert results[0]["policy_loss"] == pytest.approx(stats_ref["policy_loss"], abs=1e-6)


def test_one_on_policy_pass_takes_its_own_log_probs():
    cfg = LearnerConfig(agg="token-mean")
    a, b = World(), World()
    separate = a.batch("grpo")
    with torch.no_grad():
        separate.logp_old = a.actor(torch.arange(10), 7)[0] * a.mask
    fused = b.batch("grpo")
    fused.logp_old = None
    sa = a.update("grpo", cfg, batch=separate)
    trained = b.train("grpo", cfg, batch=fused)
    sb = trained.stats
    assert sb["approx_kl"] == 0.0 and sb["clipfrac"] == 0.0 and sb["ratio_max"] == 1.0
    assert torch.allclose(a.weights(), b.weights(), atol=1e-7)
    assert sa["policy_loss"] == pytest.approx(sb["policy_loss"], abs=1e-7)
    assert torch.allclose(trained.logp_old, separate.logp_old, atol=1e-6), "the pass returns its log-probs"
    assert fused.logp_old is None, "the batch is left as given: a later stage reads the returned value"
    with pytest.raises(ValueError, match="one epoch"):
        World().update("grpo", LearnerConfig(epochs=2), batch=fused.index(torch.arange(10)).__class__(
            mask=fused.mask, logp_old=None, rewards=fused.rewards, advantages=fused.advantages,
            loss_mask=fused.mask))  # fmt: skip


def test_all_zero_advantages_leave_the_actor_alone_but_train_the_critic():
    w = World(critic="sequence")
    w.rewards[:] = 1.0
    batch = w.batch("sppo")
    batch.advantages.zero_()
    before_actor = [p.detach().clone() for p in w.policy.parameters()]
    before_critic = [p.detach().clone() for p in w.critic.parameters()]
    stats = w.update("sppo", LearnerConfig(), batch=batch)
    assert stats["actor_skipped"] == 1.0 and "policy_loss" not in stats
    assert all(torch.equal(p, q) for p, q in zip(before_actor, w.policy.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(before_critic, w.critic.parameters()))


def test_sppo_critic_target_stays_the_outcome_with_kl_in_the_reward():
    w = World(critic="sequence")
    b = SequenceBatch(mask=w.mask, logp_old=torch.zeros_like(w.mask), rewards=w.rewards)
    b.token_rewards = b.token_rewards - 0.008 * w.mask  # a KL penalty on every token
    b.values = torch.zeros(len(w.rewards))
    compute_advantages(b, get_algorithm("sppo"))
    assert torch.equal(b.returns, w.rewards), "the BCE target is R, not R - KL"
    # the advantage still carries the penalty: A = (R - sum KL) - sigmoid(0)
    expected = w.rewards - 0.008 * w.lengths - 0.5
    assert torch.allclose(b.advantages[:, 0], expected, atol=1e-6)
    # a target below 0 would make BCE unbounded below; the outcome keeps it >= 0
    assert float(bce_value_loss(torch.tensor([-30.0]), torch.tensor([-0.008]))) < 0
    assert float(bce_value_loss(torch.tensor([-30.0]), b.returns[:1] * 0)) >= 0


def test_a_non_finite_loss_reaches_the_guard_before_any_step():
    w = World()
    w.x[0, 0, 0] = float("nan")
    before = w.weights().clone()
    seen: list[str] = []

    def guard(**q):
        for k, v in q.items():
            if not torch.isfinite(torch.as_tensor(v)).all():
                seen.append(k)
                raise FloatingPointError(k)

    with pytest.raises(FloatingPointError):
        w.update("grpo", LearnerConfig(), guard=guard)
    assert seen == ["policy_loss"]
    assert torch.equal(w.weights().nan_to_num(), before.nan_to_num())


def test_truncated_importance_weight_is_pi_old_over_mu_capped_in_the_learner():
    """``ppo_update`` with ``tis_cap = C = 2`` weighs each token's loss by ``min(pi_old / mu, C)``, ``mu``
    the sampler's log-probs. Two tokens, logp = logp_old = 0 (ratio 1), A = 1, token-mean:
    ``d loss / d logp_t = -w_t / 2``. pi_old / mu = e^(0 - (-ln 3)) = 3 -> capped 2, and e^(0 - ln 2) = 0.5:
    gradient [-1, -0.25]. The flipped ratio mu / pi_old (1/3 and 2) would give [-1/6, -1]; no weight
    [-0.5, -0.5]."""
    theta = torch.zeros(1, 2, requires_grad=True)

    def actor(rows: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return theta[rows, :T], torch.zeros(len(rows), T)

    def grad(tis_cap: float | None) -> list[float]:
        batch = SequenceBatch(mask=torch.ones(1, 2), logp_old=torch.zeros(1, 2), rewards=torch.ones(1))
        batch.logp_rollout = torch.tensor([[-math.log(3.0), math.log(2.0)]])
        batch.advantages, batch.loss_mask = torch.ones(1, 2), torch.ones(1, 2)
        batch.returns = torch.ones(1)
        engine = GradRecorder(theta)
        ppo_update(batch, get_algorithm("grpo"), LearnerConfig(tis_cap=tis_cap), actor, engine)
        return engine.grads[0][0].tolist()

    assert grad(2.0) == pytest.approx([-1.0, -0.25], abs=1e-6)
    assert grad(None) == pytest.approx([-0.5, -0.5], abs=1e-6)


@pytest.mark.parametrize("split", SPLITS, ids=["mbs1", "mbs3", "tokens9"])
def test_the_regression_loss_is_what_the_learner_runs_for_astar_po(split):
    """``policy_loss="regression"`` (A*-PO's default) makes the learner fit ``beta2 sum_t log(pi / pi_ref)``
    to ``R - V*``: with the reference equal to the policy the first loss is ``mean_b (R_b - V*_b)^2``
    exactly (a clipped surrogate starts at ``-mean A``); micro-batches change nothing; a batch without
    the reference's log-probs is refused."""
    cfg = LearnerConfig(
        epochs=1, minibatches=1, agg="seq-mean-token-mean", policy_loss="regression", astar_beta2=0.1
    )
    whole, parts = World(), World()
    v_star = torch.linspace(0.1, 0.9, len(whole.lengths))
    batches = []
    for w in (whole, parts):
        with torch.no_grad():
            ref, _ = w.actor(torch.arange(len(w.lengths)), w.x.shape[1])
        b = SequenceBatch(
            mask=w.mask, logp_old=None, rewards=w.rewards, optimal_values=v_star, ref_logp=ref * w.mask
        )
        batches.append(compute_advantages(b, get_algorithm("astar-po")))
    stats = whole.update("astar-po", cfg, batches[0])
    assert stats["policy_loss"] == pytest.approx(float(((whole.rewards - v_star) ** 2).mean()), rel=1e-6)
    assert stats["implicit_reward"] == pytest.approx(0.0, abs=1e-7)
    sb = parts.update("astar-po", LearnerConfig(**{**cfg.__dict__, **split}), batches[1])
    assert (whole.weights() - World().weights()).abs().max() > 1e-3
    assert torch.allclose(whole.weights(), parts.weights(), atol=1e-6, rtol=0)
    assert sb["policy_loss"] == pytest.approx(stats["policy_loss"], abs=1e-6)
    b = World().batch("grpo")
    with pytest.raises(ValueError, match="ref_logp"):
        World().update("grpo", LearnerConfig(policy_loss="regression"), b)
