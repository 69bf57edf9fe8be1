"""Seeds as a batch dimension (sppo_rl.control.stack): seed k of a stack computes what its own networks
compute alone, bit for bit, whatever the other seeds and the stack's size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sppo_rl.control.networks import Actor, StartStateCritic, StepCritic
from sppo_rl.control.rollout import collect_seeds
from sppo_rl.control.stack import StackedActor, StackedCritic, stacked_linear
from sppo_rl.envs.tasks import get_task, make_episode_env


def actors(
    n: int, discrete: bool = True, obs_dim: int = 4, action_dim: int = 2, seed0: int = 0
) -> list[Actor]:
    out = []
    for k in range(n):
        torch.manual_seed(seed0 + k)
        a = Actor(obs_dim, action_dim, discrete, log_std_init=-0.5 + 0.1 * k)
        with torch.no_grad():  # distinct observation statistics per seed
            a.norm.mean.copy_(torch.randn(obs_dim, dtype=torch.float64))
            a.norm.var.copy_(torch.rand(obs_dim, dtype=torch.float64) + 0.5)
            for p in a.body.parameters():  # larger outputs than the 0.01-gain head gives
                p.add_(0.3 * torch.randn_like(p))
        out.append(a)
    return out


@pytest.mark.parametrize("out", [1, 2, 4, 64])
@pytest.mark.parametrize("d_in", [4, 64])
@pytest.mark.parametrize("rows", [1, 2, 5, 64, 3000])
def test_stacked_linear_slices_do_not_depend_on_the_stack(out, d_in, rows):
    """The kernel facts the stack rests on: slice k of the stacked layer's output and of its gradients is
    the same, to the bit, in a stack of 16 and alone; and, from 64 rows on, with zero-gradient rows
    padded after its own (with 2 or 5 rows padding changed the numbers: another kernel for tiny products)."""
    g = torch.Generator().manual_seed(0)
    S = 16
    w, b = torch.randn(S, out, d_in, generator=g), torch.randn(S, out, generator=g)
    x, dy = torch.randn(S, rows, d_in, generator=g), torch.randn(S, rows, out, generator=g)

    def run(x, w, b, dy):
        x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
        y = stacked_linear(x, w, b)
        y.backward(dy)
        return y.detach(), x.grad, w.grad, b.grad

    full = run(x, w, b, dy)
    for k in (0, 5, 15):
        alone = run(x[k : k + 1], w[k : k + 1], b[k : k + 1], dy[k : k + 1])
        assert all(torch.equal(f[k], a[0]) for f, a in zip(full, alone))
    if rows >= 64:  # seed k's rows padded with 7 more, whose gradient is zero (a few rows: kernels change)
        xp = torch.cat([x, torch.randn(S, 7, d_in, generator=g)], 1)
        padded = run(xp, w, b, torch.cat([dy, torch.zeros(S, 7, out)], 1))
        assert torch.equal(padded[0][:, :rows], full[0]) and torch.equal(padded[1][:, :rows], full[1])
        assert torch.equal(padded[2], full[2]) and torch.equal(padded[3], full[3])


@pytest.mark.parametrize("discrete,obs_dim,action_dim", [(True, 4, 2), (False, 8, 3), (False, 3, 1)])
def test_stacked_actor_forward_and_logits_equal_each_actor(discrete, obs_dim, action_dim):
    acts = actors(5, discrete, obs_dim, action_dim)
    stack = StackedActor(acts)
    obs = torch.randn(5, 37, obs_dim)
    out = stack(obs)
    for k, a in enumerate(acts):
        assert torch.equal(out[k], StackedActor([a])(obs[k : k + 1])[0])
        torch.testing.assert_close(out[k], a(obs[k]), rtol=1e-5, atol=1e-6)  # nn.Linear: float rounding
        back = stack.actor(k)  # taken apart: the single run's module and state dict
        assert back.arch() == a.arch()
        sd, sd_a = back.state_dict(), a.state_dict()
        assert sd.keys() == sd_a.keys() and all(torch.equal(sd[n], sd_a[n]) for n in sd)


@pytest.mark.parametrize("discrete,obs_dim,action_dim", [(True, 4, 2), (False, 8, 3), (False, 3, 1)])
def test_stacked_actor_samples_each_seed_from_its_own_generator(discrete, obs_dim, action_dim):
    acts = actors(4, discrete, obs_dim, action_dim)
    stack = StackedActor(acts)
    obs = torch.randn(4, 16, obs_dim)
    greedy = torch.zeros(16, dtype=torch.bool)
    greedy[12:] = True
    gens = [torch.Generator().manual_seed(100 + k) for k in range(4)]
    active = [True, False, True, True]
    a, logp = stack.act(obs, greedy, gens, active)
    for k in (0, 2, 3):
        a1, logp1 = StackedActor([acts[k]]).act(
            obs[k : k + 1], greedy, [torch.Generator().manual_seed(100 + k)], [True]
        )
        assert torch.equal(a[k], a1[0]) and torch.equal(logp[k], logp1[0])
    assert torch.equal(gens[1].get_state(), torch.Generator().manual_seed(101).get_state())  # untouched


@pytest.mark.parametrize("kind", [StepCritic, StartStateCritic])
def test_stacked_critic_equals_each_critic(kind):
    acts = actors(3)
    critics = []
    for k, a in enumerate(acts):
        torch.manual_seed(50 + k)
        critics.append(kind(4, norm=a.norm))
    stack = StackedActor(acts)
    sc = StackedCritic(critics, norm=stack.norm)
    obs = torch.randn(3, 6, 11, 4)
    v = sc(obs)
    for k, c in enumerate(critics):
        assert torch.equal(v[k], StackedCritic([c])(obs[k : k + 1])[0])
        torch.testing.assert_close(v[k], c(obs[k]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("discrete,obs_dim,action_dim", [(True, 4, 2), (False, 3, 1)])
def test_stacked_gradients_do_not_depend_on_the_other_seeds(discrete, obs_dim, action_dim):
    """Backward through the stack: seed k's gradients in a stack of 6 equal those of a stack of seed k
    alone (bit for bit), and those of its own Actor to float rounding (the weight gradient of a narrow
    input layer is reduced in another order)."""
    acts = actors(6, discrete, obs_dim, action_dim)
    obs = torch.randn(6, 200, obs_dim)

    def grads(modules_obs):
        stack, o = modules_obs
        stack.zero_grad()
        (stack(o) ** 2).sum().backward()
        return [p.grad for p in stack.parameters() if p.grad is not None]

    full = grads((StackedActor(acts), obs))
    for k in (1, 4):
        alone = grads((StackedActor([acts[k]]), obs[k : k + 1]))
        assert all(torch.equal(f[k], g[0]) for f, g in zip(full, alone))
        a = acts[k]
        a.zero_grad()
        (a(obs[k]) ** 2).sum().backward()
        own = [p.grad for p in a.body.parameters()]
        body = [g for g in full[: len(own)]]
        # the stack's parameter order: weights then biases; the Sequential's: w0 b0 w1 b1 ...
        n = len(own) // 2
        pairs = [(body[i], own[2 * i]) for i in range(n)] + [(body[n + i], own[2 * i + 1]) for i in range(n)]
        for f, o in pairs:
            torch.testing.assert_close(f[k], o, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("task", ["precision-cartpole", "pendulum"])
def test_collect_seeds_gives_each_seed_its_episodes_alone(task):
    """Seed k's episodes from a 4-seed collection (its start states, its generator) equal those it
    collects alone (a stack of one): same observations, actions, log-probs, rewards, lengths, outcomes."""
    spec = make_episode_env(task, num_envs=1)
    obs_dim = spec.observation_space.shape[-1]
    space = spec.single_action_space if hasattr(spec, "single_action_space") else spec.action_space
    discrete = hasattr(space, "n")
    action_dim = int(space.n) if discrete else int(space.shape[-1])
    spec.close()
    S, n = 4, 6
    acts = actors(S, discrete, obs_dim, action_dim)
    for a in acts:
        a.norm.mean.zero_()
        a.norm.var.fill_(1.0)
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, 2**31 - 1, size=(S, n))
    greedy = np.zeros(n, dtype=bool)
    greedy[-1] = True
    env = make_episode_env(task, num_envs=S * n)
    horizon = get_task(task).horizon
    gens = [torch.Generator().manual_seed(7 + k) for k in range(S)]
    many = collect_seeds(env, StackedActor(acts), seeds, horizon, greedy, gens)
    lengths = set()
    for k in range(S):
        gen = torch.Generator().manual_seed(7 + k)
        (alone,) = collect_seeds(
            make_episode_env(task, num_envs=n),
            StackedActor([acts[k]]),
            seeds[k : k + 1],
            horizon,
            greedy,
            [gen],
        )
        # the next update draws on from the same place
        assert torch.equal(gens[k].get_state(), gen.get_state())
        for f in ("obs", "actions", "logp", "rewards", "lengths", "success", "greedy"):
            assert torch.equal(getattr(many[k], f), getattr(alone, f)), (k, f)
        assert np.array_equal(many[k].seeds, alone.seeds)
        lengths.add(int(alone.lengths.max()))
    assert len(lengths) > 1 or task == "pendulum"  # the seeds' episodes end at different steps
