"""The pure parts of scripts/bench_throughput.py (no peer runs; the peers run in the benchmark): the A/A and
ratio intervals, the floor's arithmetic, every implementation handed the same settings (SB3's model built
for real and read back), and CleanRL's ``SPS:`` line read by scripts/peer_cleanrl.py."""

from __future__ import annotations

import math

import pytest
from paths import script_module


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_throughput") as module:
        yield module


def test_aa_and_ratio_intervals(bench):
    a, b, peer = [100.0, 110.0, 90.0], [100.0, 100.0, 100.0], [50.0, 55.0, 30.0]
    assert bench.aa_interval(a, b) == (0.9, 1.1)
    med, lo, hi = bench.ratio_interval(a, b, peer)
    rounds = [2.0, math.sqrt(11000) / 55, math.sqrt(9000) / 30]  # sqrt(A B) / peer per round
    assert (med, lo, hi) == pytest.approx((2.0, rounds[1], rounds[2]))  # median, min, max
    with pytest.raises(ValueError):
        bench.aa_interval([1.0, 2.0], [1.0])  # one B per A


def test_floor_per_step(bench):
    pieces = {"env": 64e-6, "actor": 96e-6, "critic": 32e-6, "update": 0.32}
    # (64 + 96 + 32) us / 64 envs = 3 us, + 0.32 s / 32,000 rows = 10 us
    assert bench.floor_seconds_per_step(pieces, 64, 32_000) == pytest.approx(13e-6)


def _flags(args: list[str]) -> dict[str, list[str]]:
    out, key = {}, None
    for x in args:
        if x.startswith("--"):
            key = x[2:]
            out[key] = []
        else:
            out[key].append(x)
    return out


@pytest.mark.parametrize("name", ["stock", "batched"])
def test_every_implementation_gets_the_same_settings(bench, name, tmp_path):
    from sppo_rl.control.config import ControlConfig

    s = bench.SETTINGS[name]
    assert (s.num_envs, s.epochs, s.minibatches, s.hidden, s.activation) == (64, 4, 4, (64, 64), "tanh")
    ours = ControlConfig(**bench.ours_config(s, str(tmp_path)))
    assert (ours.episodes_per_update, ours.epochs, ours.minibatches) == (64, 4, 4)
    assert (tuple(ours.hidden_sizes), ours.activation, ours.threads) == ((64, 64), "tanh", 1)
    crl = _flags(bench.cleanrl_args(s, 128_000))
    assert crl["env-id"] == [s.env_id] and crl["num-envs"] == ["64"] and crl["num-steps"] == [str(s.n_steps)]
    assert crl["update-epochs"] == ["4"] and crl["num-minibatches"] == ["4"] and "no-cuda" in crl
    rj = _flags(bench.rejax_args(s, 3, 16))
    assert rj["env"] == [s.env_id] and rj["num-envs"] == ["64"] and rj["num-steps"] == [str(s.n_steps)]
    assert rj["epochs"] == ["4"] and rj["minibatches"] == ["4"] and rj["hidden"] == ["64", "64"]
    assert rj["activation"] == ["tanh"] and rj["seeds"] == ["16"] and rj["iterations"] == ["3"]


def test_sb3_model_is_the_setting(bench):
    """SB3's PPO built from ``sb3_kwargs``: separate 2 x 64 tanh actor and critic, 64 envs x n_steps, 4 epochs
    of 4 minibatches (batch_size = rollout / 4)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    s = bench.SETTINGS["stock"]
    env = make_vec_env(lambda: gym.make(s.env_id), n_envs=s.num_envs)
    model = PPO("MlpPolicy", env, **bench.sb3_kwargs(s))
    assert (model.n_envs, model.n_steps, model.n_epochs) == (64, 500, 4)
    assert model.batch_size * 4 == 64 * 500
    ext = model.policy.mlp_extractor
    for net in (ext.policy_net, ext.value_net):  # two networks, no shared layer
        kinds = [type(m) for m in net]
        assert kinds == [torch.nn.Linear, torch.nn.Tanh, torch.nn.Linear, torch.nn.Tanh]
        assert [m.out_features for m in net if isinstance(m, torch.nn.Linear)] == [64, 64]
    assert not set(map(id, ext.policy_net.parameters())) & set(map(id, ext.value_net.parameters()))
    env.close()


def test_cleanrl_sps_line():
    with script_module("peer_cleanrl") as crl:
        text = "global_step=64, episodic_return=[12.]\nSPS: 3100\nSPS: 2950\nnot SPS: 1\n"
        assert crl.last_sps(text) == (2950.0, 2)
        assert crl.last_sps("no such line") == (None, 0)


def test_plain_env_is_the_same_episodes(bench):
    """``ours-plain`` (gymnasium.make copies, every wrapper and check) runs the episodes of the fast path."""
    import numpy as np

    from sppo_rl.envs.tasks import make_episode_env

    fast, plain = (
        make_episode_env("CartPole-v1", num_envs=8, dense=True),
        bench.plain_episode_env("CartPole-v1", 8, True),
    )
    assert type(fast).__name__ == "CartPoleStockVectorEnv" and type(plain).__name__ == "Plain"
    rng = np.random.default_rng(0)
    for seed in (0, 8):
        np.testing.assert_array_equal(fast.reset(seed=seed)[0], plain.reset(seed=seed)[0])
        done = np.zeros(8, dtype=bool)
        while not done.all():
            a = rng.integers(0, 2, 8)
            f, p = fast.step(a), plain.step(a)
            for x, y in zip(f[:4], p[:4]):
                np.testing.assert_array_equal(x, y)
            for k in ("success", "failed", "ended", "length"):
                np.testing.assert_array_equal(f[4][k], p[4][k])
            done = f[2]
