"""Stock Gymnasium ids in the control world (:mod:`sppo_rl.envs.custom`): each judged by the env's own
success (reaching the goal, not surviving), ids it cannot judge refused in one line unless a test is
named, ``module:Id`` tasks like ``gym.make``, ``--success`` from Python beside a stock id."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from sppo_rl import api
from sppo_rl.cli import main
from sppo_rl.envs.custom import SparseOutcome
from sppo_rl.envs.tasks import get_task, make_episode_env
from sppo_rl.runtime.logging import read_metrics

QUIET = dict(progress=False, tensorboard=False)


def _episodes(spec, n: int, policy) -> np.ndarray:
    """``info["success"]`` of ``n`` episodes (seeds 0..n-1) of task ``spec`` under ``policy(obs, rng)``."""
    env = make_episode_env(spec, num_envs=n)
    obs, _ = env.reset(seed=list(range(n)))
    rng = np.random.default_rng(0)
    done = np.zeros(n, dtype=bool)
    while not done.all():
        obs, _, term, _, info = env.step(policy(obs, rng))
        done |= term
    env.close()
    return info["success"]


def _random(spec):
    if spec.discrete:
        return lambda obs, rng: rng.integers(0, spec.action_dim, len(obs))
    return lambda obs, rng: rng.uniform(
        spec.action_low, spec.action_high, (len(obs), spec.action_dim)
    ).astype(np.float32)


# ------------------------------------------------------------------------------- stock ids


def test_goal_tasks_count_reaching_the_goal_not_surviving():
    """MountainCar-v0 and Acrobot-v1 end (terminate) only at their goal: the old default ("survived") paid a
    random policy 1.0 and a goal-reaching one 0.0; the shipped rule is the reverse."""
    car = get_task("MountainCar-v0")
    assert car.horizon == 200
    assert _episodes(car, 16, _random(car)).mean() == 0.0
    # push in the direction of the velocity (obs[1]): pumps energy and reaches x >= 0.5 within 200 steps
    pump = lambda obs, rng: np.where(obs[:, 1] >= 0, 2, 0)  # noqa: E731
    assert _episodes(car, 16, pump).mean() == 1.0
    acro = get_task("Acrobot-v1")
    assert _episodes(acro, 16, _random(acro)).mean() <= 0.125  # a random acrobot rarely gets up in 500 steps
    # torque along the second joint's velocity (obs[5]) swings the tip over the bar
    swing = lambda obs, rng: np.where(obs[:, 5] >= 0, 2, 0)  # noqa: E731
    assert _episodes(acro, 16, swing).mean() == 1.0
    cont = get_task("MountainCarContinuous-v0")
    assert cont.horizon == 999 and _episodes(cont, 4, _random(cont)).mean() == 0.0


def test_pendulum_and_cartpole_rules():
    from sppo_rl.envs.stock import pendulum_balanced

    pend = get_task("Pendulum-v1")
    assert _episodes(pend, 16, _random(pend)).mean() == 0.0, "the old default paid Pendulum 1.0 always"
    assert pendulum_balanced(np.array([1.0, 0.0, 0.5]), {}, False, True)
    assert not pendulum_balanced(np.array([1.0, 0.0, 1.5]), {}, False, True), "swinging through upright"
    assert not pendulum_balanced(np.array([0.94, 0.34, 0.0]), {}, False, True), "20 deg off"
    cart = get_task("CartPole-v1")  # unchanged: survived the 500 steps
    assert cart.horizon == 500 and _episodes(cart, 8, _random(cart)).mean() == 0.0


def test_box2d_and_mujoco_rules_read_the_env_reward_and_position():
    from sppo_rl.envs.stock import STOCK, came_to_rest, reached_the_end, survived_beyond

    o = np.zeros(8)
    assert came_to_rest(o, {"base_reward": 100.0}, True, False)
    assert not came_to_rest(o, {"base_reward": -100.0}, True, False), "crashed"
    assert not came_to_rest(o, {"base_reward": 1.3}, False, True), "hovered to the time limit"
    assert reached_the_end(o, {"base_reward": 0.2}, True, False)
    assert not reached_the_end(o, {"base_reward": -100.0}, True, False), "fell"
    assert not reached_the_end(o, {"base_reward": 0.2}, False, True), "time limit before the end"
    assert survived_beyond(o, {"x_position": 1.2}, False, True)
    assert not survived_beyond(o, {"x_position": 0.4}, False, True), "stood still"
    assert not survived_beyond(o, {"x_position": 1.2}, True, False), "fell"
    for env_id in STOCK:
        assert env_id in gym.registry, env_id
    for env_id in ("HalfCheetah-v5", "Swimmer-v5"):  # the return rules are the spec's own thresholds
        assert STOCK[env_id][0].threshold == gym.spec(env_id).reward_threshold
    from sppo_rl.envs.stock import predicate_name, success_rule

    rule = success_rule(predicate_name(STOCK["Swimmer-v5"][0]))[0]  # recorded as "return:360"
    assert rule(o, {"base_return": 360.0}, False, True) and not rule(o, {"base_return": 359.9}, False, True)
    # a random lander crashes: the env's -100 reaches the test, which says failure
    lander = SparseOutcome("LunarLander-v3", success=STOCK["LunarLander-v3"][0])
    lander.reset(seed=0)
    rng = np.random.default_rng(0)
    while True:
        _, r, term, _, info = lander.step(int(rng.integers(4)))
        if term:
            break
    assert info["base_reward"] == -100.0 and info["success"] is False and r == 0.0
    assert info["base_return"] < 0


def test_an_id_it_cannot_judge_is_refused_in_one_line_unless_a_test_is_named(tmp_path, capsys):
    gym.register("UsersTest/Plain-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                 max_episode_steps=20)  # fmt: skip
    out = tmp_path / "plain"
    with pytest.raises(SystemExit) as e:
        main(
            [
                "control",
                "--task",
                "UsersTest/Plain-v0",
                "--init-from",
                "none",
                "--no-progress",
                "--out-dir",
                str(out),
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "no success test is known for UsersTest/Plain-v0" in err[0]
    assert "--success" in err[0] and not out.exists()
    with pytest.raises(ValueError, match="no success test is known"):
        get_task("UsersTest/Plain-v0")
    # a named rule makes it trainable
    main(["control", "--task", "UsersTest/Plain-v0", "--success", "survived", "--algo", "grpo", "--init-from",
          "none", "--total-episodes", "16", "--no-progress", "--no-tensorboard", "--eval-episodes", "4",
          "--out-dir", str(out)])  # fmt: skip
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 1 and 0.0 <= rows[0]["success_rate"] <= 1.0
    assert json.loads((out / "config.json").read_text())["success"] == "survived"
    capsys.readouterr()
    # --success is for Gymnasium ids; a bad rule is one line too
    for task, rule, match in (
        ("short-cartpole", "survived", "has its own success test"),
        ("UsersTest/Plain-v0", "return:abc", "needs a finite number"),
        ("UsersTest/Plain-v0", "fast", "expected one of"),
        ("UsersTest/Plain-v0", "no_such_module_xyz:f", "cannot import"),
    ):
        bad = tmp_path / "bad"
        with pytest.raises(SystemExit) as e:
            main(["control", "--task", task, "--success", rule, "--no-progress", "--out-dir", str(bad)])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and match in err[0], (rule, err)
        assert not bad.exists()


def test_module_colon_id_works_like_gym_make(tmp_path, monkeypatch, capsys):
    (tmp_path / "users_envmod.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('UsersMod-v0', entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv',"
        " max_episode_steps=15)\n"
        "def upright(obs, info, terminated, truncated):\n"
        "    return not terminated and abs(obs[2]) < 0.1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    main(["control", "--task", "users_envmod:UsersMod-v0", "--success", "users_envmod:upright", "--algo", "grpo",
          "--init-from", "none", "--total-episodes", "16", "--no-progress", "--no-tensorboard",
          "--eval-episodes", "4", "--out-dir", str(out)])  # fmt: skip
    assert "done: grpo on users_envmod:UsersMod-v0" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["resolved"]["horizon"] == 15
    with pytest.raises(ValueError, match="cannot import module 'users_nomod'"):
        get_task("users_nomod:X-v0")


def test_success_function_from_python_and_a_stock_id(tmp_path):
    def never(obs, info, terminated, truncated):
        return False

    kw = dict(algo="grpo", total_episodes=16, init_from="none", eval_episodes=4, **QUIET)
    policy = api.train_control("CartPole-v0", success=never, out_dir=str(tmp_path / "a"), **kw)
    rows = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert rows[0]["success_rate"] == 0.0 and policy.summary["task"] == "CartPole-v0"
    assert json.loads((tmp_path / "a" / "config.json").read_text())["success"].endswith("never")
    assert get_task("CartPole-v0").success.startswith("survived"), "the override is not registered globally"
    always = api.train_control("CartPole-v0", success="return:0", out_dir=str(tmp_path / "b"), **kw)
    assert always.summary["tail_success_rate"] == 1.0  # CartPole pays +1 per step: return >= 0 always
