"""The fast episode vector envs of stock Gymnasium ids (:mod:`sppo_rl.envs.stock`): CartPole's batched NumPy
dynamics and the other ids' bare envs give, step for step, the observations, rewards, ends, ``info`` and
outcomes of ``gymnasium.make`` copies (every wrapper on, each action checked) fed the same seeds and
actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from sppo_rl.envs.custom import SparseOutcome, resolve_task
from sppo_rl.envs.stock import (
    CartPoleStockVectorEnv,
    bare,
    batched_stock,
    stock_success,
    success_rule,
    survived,
)
from sppo_rl.envs.tasks import get_task, make_episode_env


def _balance(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A CartPole controller that keeps the pole up for 500 steps, on even rows; random actions on odd rows
    (they fall within ~10-60 steps): both kinds of end in one batch."""
    x, x_dot, theta, theta_dot = obs[:, 0], obs[:, 1], obs[:, 2], obs[:, 3]
    held = (10 * theta + 2 * theta_dot + 0.3 * x + 0.8 * x_dot > 0).astype(np.int64)
    rand = rng.integers(0, 2, len(obs))
    return np.where(np.arange(len(obs)) % 2 == 0, held, rand)


def _random(spec):
    def policy(obs, rng):
        if spec.discrete:
            return rng.integers(0, spec.action_dim, len(obs))
        return rng.uniform(spec.action_low, spec.action_high, (len(obs), spec.action_dim)).astype(np.float32)

    return policy


def _both(env_id: str, spec, success, seeds: list[int], policy, dense: bool):
    """Step ``make_episode_env(spec)`` and one ``SparseOutcome(gymnasium.make(env_id), success)`` per seed
    with the actions ``policy`` picks from the vector env's observations; assert every step agrees;
    return the vector env and the final ``info``."""
    n = len(seeds)
    vec = make_episode_env(spec, num_envs=n, dense=dense)
    singles = [SparseOutcome(env_id, success, spec.horizon, dense=dense) for _ in seeds]
    obs, _ = vec.reset(seed=seeds)
    ref = np.stack([e.reset(seed=s)[0] for e, s in zip(singles, seeds)])
    np.testing.assert_array_equal(obs, ref)
    rng = np.random.default_rng(1)
    live = np.ones(n, dtype=bool)
    steps = 0
    while live.any():
        a = policy(obs, rng)
        obs, rew, term, trunc, info = vec.step(a)
        steps += 1
        for i in np.flatnonzero(live):
            o, r, t, tr, inf = singles[i].step(a[i])
            np.testing.assert_array_equal(obs[i], o, err_msg=f"obs of copy {i} at step {steps}")
            assert rew[i] == r and term[i] == t and not trunc[i] and not tr, (i, steps, rew[i], r)
            assert info["length"][i] == steps
            if t:
                assert info["ended"][i]
                assert info["success"][i] == inf["success"] and info["failed"][i] == inf["failed"]
                live[i] = False
        assert not info["ended"][~live & ~term].any()
        frozen = ~live & ~info["ended"]
        assert (rew[frozen] == 0).all(), "an ended copy is frozen: reward 0"
    return vec, info


@pytest.mark.parametrize("env_id", ["CartPole-v1", "CartPole-v0"])
@pytest.mark.parametrize("dense", [False, True])
def test_batched_cartpole_is_the_gymnasium_make_episodes(env_id, dense):
    spec = get_task(env_id)
    vec, info = _both(env_id, spec, stock_success(env_id)[0], list(range(100, 116)), _balance, dense)
    assert isinstance(vec, CartPoleStockVectorEnv), "stock CartPole runs on the batched dynamics"
    assert info["success"][::2].all() and not info["success"][1::2].any(), "both kinds of end were met"


def test_batched_cartpole_with_a_named_success_rule_reads_the_same_info():
    """``--success return:X`` reads ``base_return`` from ``info``; the batched env must give the single
    env's value (the steps taken) on the last step."""
    spec = resolve_task("CartPole-v1", "return:30")
    vec, info = _both(
        "CartPole-v1", spec, success_rule("return:30")[0], list(range(8)), _balance, dense=False
    )
    assert isinstance(vec, CartPoleStockVectorEnv)
    np.testing.assert_array_equal(info["success"], info["length"] >= 30)


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCarContinuous-v0"])
def test_other_stock_ids_step_bare_envs_with_the_same_episodes(env_id):
    spec = get_task(env_id)
    vec, _ = _both(env_id, spec, stock_success(env_id)[0], list(range(4)), _random(spec), dense=True)
    assert all(not isinstance(copy.base, gym.Wrapper) for copy in vec.envs), "no per-step wrappers"


def test_bare_keeps_wrappers_that_change_an_episode():
    env = gym.make("CartPole-v1")  # TimeLimit(500) over OrderEnforcing over PassiveEnvChecker
    assert type(bare(env, 500)).__name__ == "CartPoleEnv"
    assert bare(env, 501) is env, "a time limit shorter than the horizon ends episodes: kept"
    clipped = gym.wrappers.ClipReward(gym.make("CartPole-v1"), 0.0, 0.5)
    assert bare(clipped, 500) is clipped, "an unknown wrapper: kept"


def test_batched_stock_only_for_cartpole_as_registered():
    assert batched_stock("CartPole-v1", survived, 500) is not None
    assert batched_stock("CartPole-v1", survived, 501) is None, "past the id's time limit"
    assert batched_stock("Acrobot-v1", survived, 500) is None
    assert batched_stock(lambda: gym.make("CartPole-v1"), survived, 500) is None, "a factory: unknown env"
    gym.register(
        "sppo_test/SuttonCartPole-v0",
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        kwargs={"sutton_barto_reward": True},
        max_episode_steps=500,
    )
    try:
        assert batched_stock("sppo_test/SuttonCartPole-v0", survived, 500) is None, "non-default settings"
    finally:
        del gym.registry["sppo_test/SuttonCartPole-v0"]


def test_a_stock_cartpole_run_logs_what_it_logs_on_gymnasium_make_copies(tmp_path, monkeypatch):
    """Training end to end: PPO from scratch on CartPole-v1 (dense) logs the same metrics rows, every value
    but the timings, on the batched env as on ``gymnasium.make`` copies with every wrapper on."""
    from paths import CONTROL_TIMING, strip_timing

    from sppo_rl import api
    from sppo_rl.envs import custom
    from sppo_rl.runtime.logging import read_metrics

    settings = dict(
        dense=True, init_from="none", episodes_per_update=16, total_episodes=48, eval_episodes=0, seed=3
    )
    settings.update(progress=False, tensorboard=False)
    fast = api.train_control("CartPole-v1", "ppo", out_dir=str(tmp_path / "fast"), **settings)
    made: list = []

    def plain(env, *args, **kwargs):  # gymnasium.make's copies, wrappers kept
        made.append(env)
        return None

    monkeypatch.setattr(custom, "batched_stock", plain)
    monkeypatch.setattr(custom, "bare", lambda env, horizon: env)
    slow = api.train_control("CartPole-v1", "ppo", out_dir=str(tmp_path / "plain"), **settings)
    assert made, "the plain run asked for no batched env"
    rows = [strip_timing(read_metrics(p.run_dir / "metrics.jsonl"), CONTROL_TIMING) for p in (fast, slow)]
    assert len(rows[0]) == 3 and rows[0] == rows[1]
