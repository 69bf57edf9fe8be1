"""What CleanRL / SB3 users bring to the control world: stock Gymnasium ids
judged by each env's own success, ids it cannot judge refused, ``module:Id`` tasks, ``--success``;
``Policy.predict`` on the env's own observation, ``evaluate_policy``, on-update callbacks that stop a run,
and learning-rate schedules (hand numbers, in both worlds, and an exact resume)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from paths import CONTROL_TIMING

from sppo_rl import api
from sppo_rl.cli import main
from sppo_rl.control.config import ControlConfig
from sppo_rl.control.trainer import run_control
from sppo_rl.envs.custom import SparseOutcome
from sppo_rl.envs.tasks import get_task, make_episode_env
from sppo_rl.runtime.checkpoint import torch_load
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
    assert always.summary["final_success_rate"] == 1.0  # CartPole pays +1 per step: return >= 0 always


# ------------------------------------------------------------------------------- SB3 habits


def _policy(H: int = 5):
    """A continuous policy: its greedy action (the Gaussian mean) moves with every input, the time left too."""
    from sppo_rl.control.networks import Actor

    torch.manual_seed(0)
    meta = {"config": {"task": "Pendulum-v1"}, "observation": {"horizon": H, "appended": "(H - t) / H"}}
    return api.Policy(Actor(5, 1, False), meta=meta)


def test_predict_on_the_env_observation_counts_the_steps_itself():
    policy = _policy(H=5)

    def mean(x, time_left):  # the actor on the task's observation, built by hand
        with torch.no_grad():
            return policy.actor(torch.from_numpy(np.r_[x, time_left][None].astype(np.float32))).numpy()[0]

    xs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    ref = [mean(x, (5 - t) / 5) for t, x in enumerate(xs)]
    assert not np.array_equal(mean(xs[0], 1.0), mean(xs[0], 0.8)), "the time left moves the action"
    act = lambda x, **kw: policy.predict(x, deterministic=True, **kw)[0]  # noqa: E731
    own = [act(x, episode_start=t == 0) for t, x in enumerate(xs)]  # the env's own 4 features
    assert all(np.array_equal(a, b) for a, b in zip(own, ref))  # the time left computed inside
    with pytest.raises(ValueError, match="step 6 of an episode of horizon 5.*episode_start"):
        act(xs[0], episode_start=False)
    assert np.array_equal(act(xs[0], episode_start=True), ref[0])  # a new episode: t = 0
    assert np.array_equal(act(np.r_[xs[3], 0.4]), ref[3])  # the task's observation: as is
    # a batch keeps one counter per row; episode_start per row restarts only those rows
    policy.reset()
    batch = np.stack([xs[1], xs[1]])
    act(batch, episode_start=True)
    second = act(batch, episode_start=[True, False])
    # (a batch of two rounds differently from one row: equal to float32 precision)
    assert np.allclose(second[0], mean(xs[1], 1.0), rtol=1e-6, atol=1e-7)
    assert np.allclose(second[1], mean(xs[1], 0.8), rtol=1e-6, atol=1e-7)
    assert not np.allclose(second[0], second[1], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="the env's own 4"):
        policy.predict(np.zeros(3))


SB3_LOOP = """
obs, info = env.reset(seed=0)
for _ in range(60):
    action, _states = model.predict(obs, deterministic=True)
    obs, reward, terminated, truncated, info = env.step(action)
    if terminated or truncated:
        obs, info = env.reset()
"""
"""Stable-Baselines3's basic-usage loop (its README and "Getting Started" page, the Gymnasium form)."""


def _cartpole_policy(H: int):
    """A random discrete policy for CartPole's 4 features plus the time left, with horizon ``H``."""
    from sppo_rl.control.networks import Actor

    torch.manual_seed(1)
    meta = {"config": {"task": "CartPole-v1"}, "observation": {"horizon": H, "appended": "(H - t) / H"}}
    return api.Policy(Actor(5, 2, True), meta=meta)


def test_sb3s_usage_loop_runs_unchanged_on_a_wrapped_env_and_is_refused_unwrapped():
    """SB3's loop: ``action, _states = model.predict(obs, deterministic=True)`` with Gymnasium's
    reset/step. On ``policy.wrap(env)`` it runs as written, the time left restarting at each reset and
    the episode cut at ``H`` (its actions equal ``predict`` with ``episode_start`` marked by hand on the
    plain env, across episode ends); on the plain env it is refused at the first call, naming the fix."""
    import gymnasium as gym

    H = 9
    policy = _cartpole_policy(H)
    seen: list = []

    class Recording(gym.Wrapper):
        def step(self, action):
            seen.append(int(action))
            return super().step(action)

    env = policy.wrap(Recording(gym.make("CartPole-v1")))
    assert env.observation_space.shape == (5,)
    exec(SB3_LOOP, {"env": env, "model": policy})
    plain = gym.make("CartPole-v1")
    obs, _ = plain.reset(seed=0)
    want, t, ends = [], 0, 0
    for _ in range(60):
        action, state = policy.predict(obs, episode_start=t == 0, deterministic=True)
        assert state is None
        want.append(int(action))
        obs, _, terminated, _, _ = plain.step(action)
        t += 1
        if terminated or t == H:
            obs, _ = plain.reset()
            t, ends = 0, ends + 1
    assert seen == want and ends >= 6
    with pytest.raises(ValueError, match="without episode_start.*policy.wrap"):
        exec(SB3_LOOP, {"env": gym.make("CartPole-v1"), "model": policy})


def test_sb3s_own_evaluate_policy_runs_our_policy_on_the_plain_env():
    """``stable_baselines3.common.evaluation.evaluate_policy`` (a VecEnv, ``predict(obs, state=...,
    episode_start=..., deterministic=...)``) on the plain env gives the returns of this project's
    ``evaluate_policy`` (same seeds, deterministic), both calling ``predict`` SB3's way."""
    import gymnasium as gym
    from stable_baselines3.common.evaluation import evaluate_policy as sb3_evaluate
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    policy = _cartpole_policy(500)
    vec = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1"))])
    vec.seed(3)
    returns, lengths = sb3_evaluate(
        policy, vec, n_eval_episodes=1, deterministic=True, return_episode_rewards=True
    )
    ours = api.evaluate_policy(policy, "CartPole-v1", n_eval_episodes=1, deterministic=True, seed=3)
    assert lengths == list(ours.lengths) and returns == list(ours.returns) and 5 < lengths[0] < 500


def test_a_trained_policy_predicts_and_evaluates_on_plain_cartpole(tmp_path):
    policy = api.train_control(
        "CartPole-v1", algo="grpo", total_episodes=16, init_from="none", eval_episodes=4,
        out_dir=str(tmp_path / "run"), **QUIET,
    )  # fmt: skip
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)  # 4 features: raised "takes 5 features" before
    assert policy.predict(obs, episode_start=True)[0] in (0, 1)
    assert Path(api.Policy.load(tmp_path / "run").run_dir) == tmp_path / "run"
    ev = api.evaluate_policy(policy, env, n_eval_episodes=3, seed=10)
    assert ev.returns == tuple(float(n) for n in ev.lengths), "CartPole pays +1 per step"
    assert ev.success_rate == 0.0 and ev.successes == (False, False, False)  # never 500 steps
    mean, std = ev  # unpacks like SB3's (mean, std)
    assert mean == pytest.approx(np.mean(ev.lengths)) and std == pytest.approx(np.std(ev.lengths))
    # the same seeds on the task env give the same episodes (success from its info)
    task_env = get_task("CartPole-v1").load()()
    ev2 = api.evaluate_policy(policy, task_env, n_eval_episodes=3, seed=10)
    assert ev2.lengths == ev.lengths and ev2.success_rate == 0.0 and ev2.returns == (0.0, 0.0, 0.0)


def test_evaluate_policy_on_mountaincar_hand_numbers():
    from sppo_rl.control.networks import Actor

    torch.manual_seed(0)
    meta = {"config": {"task": "MountainCar-v0"}, "observation": {"horizon": 200, "appended": "(H - t) / H"}}
    policy = api.Policy(Actor(3, 3, True), meta=meta)  # untrained: never reaches the flag
    ev = api.evaluate_policy(policy, "MountainCar-v0", n_eval_episodes=2, seed=0)
    assert ev.returns == (-200.0, -200.0) and ev.std_return == 0.0 and ev.lengths == (200, 200)
    assert ev.success_rate == 0.0, "judged by the stock rule (goal reached), not by surviving"
    with pytest.raises(ValueError, match="n_eval_episodes"):
        api.evaluate_policy(policy, "MountainCar-v0", n_eval_episodes=0)


# ------------------------------------------------------------------------------- schedules, callbacks


def test_lr_factor_hand_numbers():
    from sppo_rl.runtime.schedule import lr_factor

    assert [lr_factor("linear", k, 4) for k in range(4)] == [1.0, 0.75, 0.5, 0.25]  # CleanRL's 1 - k/K
    cos = [lr_factor("cosine", k, 6, warmup_updates=2) for k in range(6)]
    assert cos == pytest.approx(
        [0.5, 1.0, 1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 - math.cos(math.pi / 4)) / 2]
    )
    assert [lr_factor("constant", k, 5, warmup_updates=3) for k in range(5)] == pytest.approx(
        [1 / 3, 2 / 3, 1, 1, 1]
    )
    assert [lr_factor("linear", k, 5, warmup_updates=1) for k in range(5)] == [1.0, 1.0, 0.75, 0.5, 0.25]
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_factor("step", 0, 4)


def _cfg(tmp_path: Path, **kw) -> ControlConfig:
    base = dict(task="short-cartpole", algo="sppo", total_episodes=64, episodes_per_update=16, init_from="none",
                out_dir=str(tmp_path / "run"), eval_episodes=0, checkpoint_every=1, **QUIET)  # fmt: skip
    base.update(kw)
    return ControlConfig(**base)


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in CONTROL_TIMING} for r in rows]


def test_control_schedule_callback_stop_and_exact_resume(tmp_path):
    full = _cfg(tmp_path / "full", lr_schedule="linear")
    run_control(full)
    rows = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    assert [r["learning_rate"] for r in rows] == pytest.approx([3e-4 * f for f in (1.0, 0.75, 0.5, 0.25)])
    ckpt = sorted((tmp_path / "full" / "run" / "checkpoints").iterdir())[-1]
    state = torch_load(ckpt / "state.pt")  # the optimizers ran at the scheduled rates
    assert state["actor_opt"]["param_groups"][0]["lr"] == pytest.approx(3e-4 * 0.25)
    assert state["critic_opt"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.25)

    seen = []

    def stop_after_two(row):
        seen.append(row["update"])
        return row["update"] < 2  # False at update 2

    part = _cfg(tmp_path / "part", lr_schedule="linear")
    summary = run_control(part, callback=stop_after_two)
    assert seen == [1, 2] and summary["stopped_by_callback"] == 2 and summary["updates"] == 2
    assert len(read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")) == 2
    run_control(replace(part, resume=True))  # continues at update 3 with the schedule's lr, not 1.0
    resumed = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    assert _strip(resumed) == _strip(rows)
    a = torch_load(tmp_path / "full" / "run" / "final.pt")["actor"]
    b = torch_load(tmp_path / "part" / "run" / "final.pt")["actor"]
    assert all(torch.equal(a[k], b[k]) for k in a), "bit-identical weights"


def test_train_control_callback_none_or_true_does_not_stop(tmp_path):
    calls = []
    policy = api.train_control(
        "short-cartpole", algo="grpo", total_episodes=32, episodes_per_update=16, init_from="none",
        eval_episodes=0, out_dir=str(tmp_path / "r"), callback=lambda row: calls.append(row["episodes"]), **QUIET,
    )  # fmt: skip
    assert calls == [16, 32] and "stopped_by_callback" not in policy.summary
    with pytest.raises(TypeError, match="callback must be a function"):
        api.train_control("short-cartpole", callback=3, out_dir=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_llm_schedule_and_callback(tmp_path, tiny):
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.trainer import run_llm

    cfg = LLMConfig(task="arithmetic", model=str(tiny), steps=4, prompts_per_step=2, group_size=2, train_size=16,
                    val_size=4, eval_samples=1, eval_every=0, max_new_tokens=4, algo="grpo", out_dir=str(tmp_path / "run"),
                    threads=1, cache_dir=str(tmp_path / "cache"), lr_schedule="cosine", warmup_updates=2,
                    actor_lr=1e-4, **QUIET)  # fmt: skip
    rows_seen = []

    def stop_at_three(row):
        rows_seen.append(row["step"])
        return False if row["step"] == 3 else None

    summary = run_llm(cfg, callback=stop_at_three)
    assert rows_seen == [1, 2, 3] and summary["stopped_by_callback"] == 3 and summary["steps"] == 3
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "learning_rate" in r]
    # warm-up 1/2, 2/2, then cosine over K - W = 2 updates: p = 0 -> 1.0
    assert [r["learning_rate"] for r in rows] == pytest.approx([0.5e-4, 1e-4, 1e-4])
    assert (tmp_path / "run" / "final" / "actor").is_dir()


def test_api_docstring_sb3_example_runs_as_written(tmp_path, monkeypatch):
    import contextlib
    import io
    import re

    monkeypatch.chdir(tmp_path)
    code = re.findall(r"^```python\n(.*?)^```", api.__doc__, re.S | re.M)[3]
    assert "evaluate_policy" in code
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "sppo_rl.api docstring, example 4", "exec"), ns)
    policy = ns["policy"]
    assert policy.summary["episodes"] == 32 and "stopped_by_callback" not in policy.summary
    rows = read_metrics(policy.run_dir / "metrics.jsonl")
    assert [r["learning_rate"] for r in rows] == pytest.approx([3e-4, 1.5e-4])  # linear over 2 updates
    action, mean = out.getvalue().split()
    assert int(action) in (0, 1) and float(mean) == round(ns["mean"], 1)
    assert api.evaluate_policy(policy, ns["env"], 5, seed=0).mean_return == ns["mean"]  # seeded: repeatable
