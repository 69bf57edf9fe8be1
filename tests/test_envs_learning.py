"""Learnability of the testbed with an off-the-shelf PPO (Stable-Baselines3).

- ShortCartPole is the fast task for the learning algorithms' tests: plain PPO on the sparse outcome
  alone goes from no success to most episodes in 15,000 steps (a few seconds, in the default suite)
  and reaches a success rate >= 0.9 in a few tens of thousands (slow, run by ``-m slow``).
- The dense shaping makes a success-producing expert learnable (paper pipeline stage 1; slow).
"""

from __future__ import annotations

import numpy as np
import pytest

from sppo_rl.envs.tasks import TASKS, make_episode_env

sb3 = pytest.importorskip("stable_baselines3")


def success_rate(model, name: str, episodes: int = 64, seed: int = 10_000, obs_filter=None) -> float:
    env = make_episode_env(name, num_envs=episodes)
    obs, _ = env.reset(seed=seed)
    while True:
        action, _ = model.predict(obs if obs_filter is None else obs_filter(obs), deterministic=True)
        obs, _, term, _, info = env.step(action)
        if term.all():
            return float(info["success"].mean())


def _ppo(name: str, dense: bool, normalize: bool, n_envs: int, **kwargs):
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    venv = make_vec_env(TASKS[name].env_id, n_envs=n_envs, seed=0, env_kwargs={"dense": dense})
    if normalize:
        venv = VecNormalize(venv, gamma=kwargs.get("gamma", 0.99))
    return sb3.PPO("MlpPolicy", venv, device="cpu", seed=0, **kwargs), venv


CARTPOLE_PPO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3)


def test_ppo_learns_short_cartpole_quickly():
    """Cheap evidence that SB3 learns on the testbed (test_envs.py only checks that it runs on each
    task): the deterministic policy, which fails every episode untrained, succeeds in most of 64
    held-out episodes after 15,000 steps (about 500 episodes; 64 of 64 on this seed)."""
    model, _ = _ppo("short-cartpole", dense=False, normalize=False, n_envs=8, **CARTPOLE_PPO)
    before = success_rate(model, "short-cartpole")
    model.learn(15_000)
    after = success_rate(model, "short-cartpole")
    assert before <= 0.2
    assert after >= 0.7 and after >= before + 0.5


@pytest.mark.slow
def test_ppo_solves_short_cartpole_from_the_outcome_alone():
    assert success_rate(_RandomPolicy(2), "short-cartpole", episodes=2048) > 0.05  # random: ~10 %
    model, _ = _ppo("short-cartpole", dense=False, normalize=False, n_envs=8, **CARTPOLE_PPO)
    model.learn(30_000)  # ~1000 episodes
    assert success_rate(model, "short-cartpole") >= 0.9


@pytest.mark.slow
def test_dense_mountaincar_trains_an_expert():
    model, venv = _ppo(
        "mountaincar",
        dense=True,
        normalize=True,
        n_envs=16,
        n_steps=16,
        batch_size=64,
        gae_lambda=0.98,
        n_epochs=4,
    )
    assert success_rate(model, "mountaincar", obs_filter=venv.normalize_obs) <= 0.1  # untrained
    model.learn(40_000)
    assert success_rate(model, "mountaincar", obs_filter=venv.normalize_obs) >= 0.9


class _RandomPolicy:
    def __init__(self, n: int) -> None:
        self.n = n
        self.rng = np.random.default_rng(0)

    def predict(self, obs, deterministic=True):
        return self.rng.integers(0, self.n, size=len(obs)), None
