"""Seeds as a batch dimension (sppo_rl.control.stack): seed k of a stack computes what its own networks
compute alone, bit for bit, whatever the other seeds and the stack's size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sppo_rl.control.networks import Actor
from sppo_rl.control.rollout import collect_seeds
from sppo_rl.control.stack import StackedActor, stacked_linear
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
    """The kernel fact the stack rests on: slice k of the stacked layer is the same, to the bit, in a
    stack of 16 and alone (the single run is the stack of one)."""
    g = torch.Generator().manual_seed(0)
    S = 16
    w, b = torch.randn(S, out, d_in, generator=g), torch.randn(S, out, generator=g)
    x = torch.randn(S, rows, d_in, generator=g)
    y = stacked_linear(x, w, b)
    for k in (0, 5, 15):
        assert torch.equal(y[k], stacked_linear(x[k : k + 1], w[k : k + 1], b[k : k + 1])[0])


@pytest.mark.parametrize("discrete,obs_dim,action_dim", [(True, 4, 2), (False, 8, 3), (False, 3, 1)])
def test_stacked_actor_forward_equals_each_actor(discrete, obs_dim, action_dim):
    acts = actors(5, discrete, obs_dim, action_dim)
    obs = torch.randn(5, 37, obs_dim)
    out = StackedActor(acts)(obs)
    for k, a in enumerate(acts):
        assert torch.equal(out[k], StackedActor([a])(obs[k : k + 1])[0])
        torch.testing.assert_close(out[k], a(obs[k]), rtol=1e-5, atol=1e-6)  # nn.Linear: float rounding


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
        one = StackedActor([acts[k]])
        a1, logp1 = one.act(obs[k : k + 1], greedy, [torch.Generator().manual_seed(100 + k)], [True])
        assert torch.equal(a[k], a1[0]) and torch.equal(logp[k], logp1[0])
    assert torch.equal(gens[1].get_state(), torch.Generator().manual_seed(101).get_state())  # untouched


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
