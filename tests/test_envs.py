"""The control testbed (SPEC.md section 4): registration, the episode contract, success tests on
hand-made states, batched == single for the NumPy tasks, frozen-after-done vector semantics."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

from sppo_rl.envs.lander import landed
from sppo_rl.envs.tasks import TASKS, TaskSpec, get_task, make_episode_env

ALL = list(TASKS)
NUMPY = [n for n, s in TASKS.items() if s.backend == "numpy"]
PAPER = {
    "precision-cartpole": ("sppo_rl/PrecisionCartPole-v0", 200),
    "mountaincar": ("sppo_rl/SparseMountainCar-v0", 1000),
    "hopper": ("sppo_rl/SparseHopper-v0", 1000),
    "lunarlander": ("sppo_rl/SparseLunarLander-v0", 1000),
    "pendulum": ("sppo_rl/SparsePendulum-v0", 1000),
}
# the Gymnasium task each one starts from (same reset distribution)
BASE = {
    "precision-cartpole": ("CartPole-v1", {}),
    "cartpole": ("CartPole-v1", {}),
    "short-cartpole": ("CartPole-v1", {}),
    "mountaincar": ("MountainCar-v0", {}),
    "mountaincar-continuous": ("MountainCarContinuous-v0", {}),
    "pendulum": ("Pendulum-v1", {}),
    "acrobot": ("Acrobot-v1", {}),
    "hopper": ("Hopper-v5", {}),
    "walker2d": ("Walker2d-v5", {}),
    "lunarlander": ("LunarLander-v3", {}),
    "lunarlander-continuous": ("LunarLander-v3", {"continuous": True}),
}
BASE_OBS = {"hopper": 11, "walker2d": 17}


def random_actions(spec: TaskSpec, n: int, rng: np.random.Generator, batch: int | None = None) -> np.ndarray:
    shape = (n,) if batch is None else (n, batch)
    if spec.discrete:
        return rng.integers(0, spec.action_dim, size=shape)
    return rng.uniform(spec.action_low * 1.2, spec.action_high * 1.2, size=(*shape, spec.action_dim)).astype(
        np.float32
    )


def unwrapped(env: gym.Env):
    return env.unwrapped


# --------------------------------------------------------------------------------------------------
# registry and specs


def test_paper_tasks_registered_with_their_horizons():
    for name, (env_id, horizon) in PAPER.items():
        spec = get_task(name)
        assert spec.env_id == env_id and spec.horizon == horizon
        assert get_task(env_id) is spec
        assert env_id in gym.registry
    assert {
        "acrobot",
        "mountaincar-continuous",
        "walker2d",
        "lunarlander-continuous",
        "short-cartpole",
    } <= set(TASKS)
    assert get_task("lunarlander-continuous").env_id == "sppo_rl/SparseLunarLanderContinuous-v0"
    per_update = {n: TASKS[n].episodes_per_update for n in PAPER}
    assert per_update == {
        "precision-cartpole": 64,
        "mountaincar": 8,
        "hopper": 8,
        "lunarlander": 16,
        "pendulum": 16,
    }


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match="precision-cartpole.*hopper"):
        get_task("cartpol")


@pytest.mark.parametrize("name", ALL)
def test_spec_matches_env_spaces(name):
    spec = TASKS[name]
    env = gym.make(spec.env_id)
    assert env.observation_space.shape == (spec.obs_dim,)
    assert env.observation_space.dtype == np.float32
    if spec.discrete:
        assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == spec.action_dim
        assert spec.action_low is None and spec.action_high is None
    else:
        assert env.action_space.shape == (spec.action_dim,)
        np.testing.assert_array_equal(env.action_space.low, spec.action_low)
        np.testing.assert_array_equal(env.action_space.high, spec.action_high)
    assert spec.success and spec.shaping and spec.appended.endswith("(H - t) / H")
    assert spec.backend in ("numpy", "mujoco", "box2d")
    env.close()


def test_import_is_light():
    code = "import sys, sppo_rl.envs; assert not {'mujoco', 'Box2D', 'torch'} & set(sys.modules), sys.modules.keys()"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------
# the episode contract, one environment


KNOWN_BASE_WARNINGS = ("infinity", "symmetric and normalized")  # the base tasks' own spaces


@pytest.mark.parametrize("name", ALL)
def test_env_checker(name):
    env = gym.make(TASKS[name].env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped, skip_render_check=True)
    unexpected = [str(w.message) for w in caught if not any(k in str(w.message) for k in KNOWN_BASE_WARNINGS)]
    assert not unexpected
    env.close()


def run_episode(env: gym.Env, seed: int, actions: np.ndarray):
    obs, _ = env.reset(seed=seed)
    traj = [obs]
    rewards, infos = [], []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        assert trunc is False
        traj.append(obs)
        rewards.append(r)
        infos.append(info)
        if term:
            return np.stack(traj), np.array(rewards), infos
    raise AssertionError("the episode did not end within the horizon")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dense", [False, True])
def test_episode_contract_and_determinism(name, dense):
    spec = TASKS[name]
    env = gym.make(spec.env_id, dense=dense)
    actions = random_actions(spec, spec.horizon, np.random.default_rng(3))
    traj, rewards, infos = run_episode(env, 11, actions)
    T = len(rewards)
    assert 1 <= T <= spec.horizon
    last = infos[-1]
    assert isinstance(last["success"], bool) and isinstance(last["failed"], bool)
    assert not (last["success"] and last["failed"])
    assert all("success" not in info for info in infos[:-1])
    if T < spec.horizon:
        assert last["failed"] or name in (
            "mountaincar",
            "mountaincar-continuous",
            "acrobot",
            "lunarlander",
            "lunarlander-continuous",
        )
    if not dense:
        assert np.all(rewards[:-1] == 0.0) and rewards[-1] == float(last["success"])
    # time left is the last feature; everything is float32
    assert traj.dtype == np.float32
    np.testing.assert_allclose(
        traj[:, -1], (spec.horizon - np.arange(T + 1)) / spec.horizon, rtol=0, atol=1e-7
    )
    # the same seed and actions give the same trajectory
    traj2, rewards2, infos2 = run_episode(env, 11, actions)
    np.testing.assert_array_equal(traj, traj2)
    np.testing.assert_array_equal(rewards, rewards2)
    assert infos2[-1]["success"] == last["success"]
    # stepping past the end is an error
    with pytest.raises(RuntimeError):
        env.step(actions[0])
    env.close()


@pytest.mark.parametrize("name", ALL)
def test_reset_distribution_is_the_base_tasks(name):
    spec = TASKS[name]
    base_id, kwargs = BASE[name]
    env, base = gym.make(spec.env_id), gym.make(base_id, **kwargs)
    k = BASE_OBS.get(name, spec.obs_dim - 1)
    for seed in (0, 1, 12345):
        obs, _ = env.reset(seed=seed)
        ref, _ = base.reset(seed=seed)
        np.testing.assert_array_equal(obs[:k], np.asarray(ref, dtype=np.float32))
        assert obs[-1] == 1.0
    first, _ = env.reset(seed=5)
    assert not np.array_equal(first, env.reset(seed=6)[0])
    np.testing.assert_array_equal(first, env.reset(seed=5)[0])
    env.close()
    base.close()


@pytest.mark.parametrize(
    "name", ["precision-cartpole", "mountaincar", "pendulum", "hopper", "lunarlander-continuous"]
)
def test_dense_has_the_same_dynamics_and_outcome(name):
    spec = TASKS[name]
    actions = random_actions(spec, spec.horizon, np.random.default_rng(8))
    sparse = run_episode(gym.make(spec.env_id), 4, actions)
    dense = run_episode(gym.make(spec.env_id, dense=True), 4, actions)
    np.testing.assert_array_equal(sparse[0], dense[0])
    for key in ("success", "failed"):
        assert sparse[2][-1][key] == dense[2][-1][key]
    assert np.any(dense[1][:-1] != 0.0)  # shaping is dense


def test_continuous_actions_are_clipped():
    spec = TASKS["pendulum"]
    a, b = gym.make(spec.env_id), gym.make(spec.env_id)
    a.reset(seed=2)
    b.reset(seed=2)
    for _ in range(5):
        oa = a.step(np.array([7.5], dtype=np.float32))[0]
        ob = b.step(np.array([2.0], dtype=np.float32))[0]
        np.testing.assert_array_equal(oa, ob)


# --------------------------------------------------------------------------------------------------
# success tests on hand-made states (single env: set the base state, put the clock where needed)


def single(name: str) -> gym.Env:
    env = gym.make(TASKS[name].env_id)
    env.reset(seed=0)
    return env


def step_from(env: gym.Env, state, t: int, action):
    """Put the base env in ``state`` with ``t`` steps taken, then take one step."""
    u = env.unwrapped
    u.base.state = np.array(state, dtype=np.float64)
    u.t = t
    return env.step(action)


CARTPOLE_CASES = [
    # name, theta at the end, success?
    ("precision-cartpole", 0.004, True),  # 0.23 deg
    ("precision-cartpole", -0.0087, True),  # just inside 0.5 deg = 0.008727 rad
    ("precision-cartpole", 0.0095, False),  # 0.54 deg: near miss
    ("short-cartpole", -0.10, True),  # 5.7 deg
    ("short-cartpole", 0.11, False),  # 6.3 deg: near miss
    ("cartpole", 0.2, True),  # still up: survival is success
]


@pytest.mark.parametrize("name,theta,ok", CARTPOLE_CASES)
def test_cartpole_final_angle(name, theta, ok):
    env = single(name)
    H = TASKS[name].horizon
    # theta_dot = 0, so one Euler step leaves theta unchanged
    obs, r, term, _, info = step_from(env, [0.0, 0.0, theta, 0.0], H - 1, 1)
    assert term and info["success"] is ok and not info["failed"] and r == float(ok)
    assert obs[2] == np.float32(theta) and obs[-1] == 0.0
    # one step earlier the episode goes on, reward 0
    obs, r, term, _, info = step_from(single(name), [0.0, 0.0, theta, 0.0], H - 2, 1)
    assert not term and r == 0.0 and "success" not in info


@pytest.mark.parametrize("name", ["precision-cartpole", "cartpole", "short-cartpole"])
@pytest.mark.parametrize("state", [[0.0, 0.0, 0.21, 0.0], [0.0, 0.0, -0.21, 0.0], [2.39, 1.0, 0.0, 0.0]])
def test_cartpole_fall_is_an_early_failure(name, state):
    env = single(name)
    obs, r, term, _, info = step_from(env, state, 5, 0)
    assert term and info["failed"] and not info["success"] and r == 0.0
    assert obs[-1] == np.float32((TASKS[name].horizon - 6) / TASKS[name].horizon)


@pytest.mark.parametrize(
    "name,action", [("mountaincar", 2), ("mountaincar-continuous", np.array([1.0], np.float32))]
)
def test_mountaincar_goal(name, action):
    env = single(name)
    # reaching x >= 0.45 ends the episode at once with 1
    obs, r, term, _, info = step_from(env, [0.44, 0.02], 10, action)
    assert term and info["success"] and r == 1.0 and obs[0] >= 0.45
    # near miss: at the horizon, short of the goal
    obs, r, term, _, info = step_from(single(name), [0.40, 0.0], 999, action)
    assert term and not info["success"] and not info["failed"] and r == 0.0 and obs[0] < 0.45
    # before the horizon, short of the goal: goes on
    obs, r, term, _, info = step_from(single(name), [0.40, 0.0], 500, action)
    assert not term and r == 0.0


@pytest.mark.parametrize("theta,ok", [(0.1, True), (-0.6, True), (0.7, False), (math.pi, False)])
def test_pendulum_final_angle(theta, ok):
    obs, r, term, _, info = step_from(single("pendulum"), [theta, 0.0], 999, np.array([0.0], np.float32))
    assert term and info["success"] is ok and r == float(ok)
    assert bool(obs[0] > 0.8) is ok  # obs[0] = cos(theta_H)


def test_acrobot_goal():
    # tip above the bar: -cos(q1) - cos(q1 + q2) = 2 > 1
    obs, r, term, _, info = step_from(single("acrobot"), [3.0, 0.0, 0.0, 0.0], 3, 1)
    assert term and info["success"] and r == 1.0
    # hanging at the horizon: near miss
    obs, r, term, _, info = step_from(single("acrobot"), [0.0, 0.0, 0.0, 0.0], 499, 1)
    assert term and not info["success"] and r == 0.0


@pytest.mark.parametrize("name", ["hopper", "walker2d"])
def test_locomotion_success_near_miss_and_fall(name):
    def at(x: float, z: float | None, t: int):
        env = single(name)
        base = env.unwrapped.base
        qpos, qvel = base.init_qpos.copy(), np.zeros_like(base.init_qvel)
        qpos[0] = x
        if z is not None:
            qpos[1] = z
        base.set_state(qpos, qvel)
        env.unwrapped.t = t
        return env.step(np.zeros(TASKS[name].action_dim, np.float32))

    obs, r, term, _, info = at(1.2, None, 999)
    assert term and info["success"] and r == 1.0 and obs[-2] > 1.0 and obs[-1] == 0.0
    obs, r, term, _, info = at(0.8, None, 999)  # survived but did not get far enough
    assert term and not info["success"] and not info["failed"] and r == 0.0 and obs[-2] < 1.0
    obs, r, term, _, info = at(1.2, None, 500)  # healthy, not at the end yet
    assert not term and r == 0.0
    obs, r, term, _, info = at(5.0, 0.5, 500)  # torso too low: unhealthy
    assert term and info["failed"] and not info["success"] and r == 0.0


def test_lander_predicate():
    assert landed(0.0, True, True) and landed(-0.39, True, True)
    assert not landed(0.41, True, True)  # off the pad: near miss
    assert not landed(0.0, True, False) and not landed(0.0, False, True)


def _heuristic_episode(env: gym.Env, seed: int, x_bias: float = 0.0, stop=None):
    from gymnasium.envs.box2d.lunar_lander import heuristic

    obs, _ = env.reset(seed=seed)
    u = env.unwrapped
    while True:
        s = obs[:8].astype(np.float64).copy()
        s[0] -= x_bias
        a = heuristic(u.base, s)
        if stop is not None and stop(obs):
            return obs, None, False, {}
        obs, r, term, _, info = env.step(a)
        if term:
            return obs, r, term, info


def test_lander_heuristic_lands_and_idle_crashes():
    env = gym.make("sppo_rl/SparseLunarLander-v0")
    episodes = [_heuristic_episode(env, seed) for seed in range(3)]
    landed_ok = [(obs, info) for obs, _, _, info in episodes if info["success"]]
    assert len(landed_ok) >= 2
    # judged when the lander came to rest, long before the horizon
    assert all(obs[-1] > 0.5 and not info["failed"] for obs, info in landed_ok)
    # doing nothing: the lander falls and its body hits the ground
    obs, _ = env.reset(seed=0)
    for _ in range(1000):
        obs, r, term, _, info = env.step(0)
        if term:
            break
    assert term and info["failed"] and not info["success"] and r == 0.0


def test_lander_judged_at_the_horizon():
    env = gym.make("sppo_rl/SparseLunarLanderContinuous-v0")
    # the heuristic brings the lander down; stop once both legs touch (it is not at rest yet)
    obs, *_ = _heuristic_episode(env, 0, stop=lambda o: o[6] > 0.5 and o[7] > 0.5)
    assert obs[6] > 0.5 and obs[7] > 0.5 and abs(obs[0]) < 0.4
    env.unwrapped.t = env.unwrapped.horizon - 1
    obs, r, term, _, info = env.step(np.zeros(2, np.float32))
    assert term and info["success"] and r == 1.0
    # still in the air at the horizon: 0
    env.reset(seed=0)
    env.unwrapped.t = env.unwrapped.horizon - 1
    obs, r, term, _, info = env.step(np.zeros(2, np.float32))
    assert term and not info["success"] and not info["failed"] and r == 0.0


# --------------------------------------------------------------------------------------------------
# batched NumPy dynamics == the Gymnasium env, step for step


def heuristic(name: str, obs: np.ndarray) -> np.ndarray:
    """A policy that reaches the goal or keeps the pole up, so the comparison covers successes."""
    if "cartpole" in name:
        return (obs[:, 2] + 0.3 * obs[:, 3] + 0.03 * obs[:, 0] + 0.1 * obs[:, 1] > 0).astype(np.int64)
    if name == "mountaincar":
        return np.where(obs[:, 1] > 0, 2, 0)
    if name == "mountaincar-continuous":
        return np.where(obs[:, 1:2] > 0, 1.3, -1.3).astype(np.float32)
    if name == "pendulum":
        return np.clip(-3 * obs[:, 2:3] * np.sign(obs[:, 0:1]), -2.5, 2.5).astype(np.float32)
    if name == "acrobot":
        return np.where(obs[:, 5] > 0, 2, 0)
    raise KeyError(name)


def compare_batched_with_single(name: str, dense: bool, seeds: list[int], eps: np.ndarray, action_seed: int):
    spec = TASKS[name]
    n = len(seeds)
    venv = make_episode_env(name, num_envs=n, dense=dense)
    envs = [gym.make(spec.env_id, dense=dense) for _ in range(n)]
    rng = np.random.default_rng(action_seed)
    vobs, _ = venv.reset(seed=seeds)
    np.testing.assert_array_equal(vobs, np.stack([e.reset(seed=s)[0] for e, s in zip(envs, seeds)]))
    live = np.ones(n, dtype=bool)
    outcomes = np.zeros(n, dtype=bool)
    for _ in range(spec.horizon):
        explore = rng.random(n) < eps
        a = heuristic(name, vobs)
        r_a = random_actions(spec, n, rng)
        a = np.where(explore if spec.discrete else explore[:, None], r_a, a)
        vobs, vrew, vterm, vtrunc, vinfo = venv.step(a)
        assert not vtrunc.any()
        for i in np.flatnonzero(live):
            obs, r, term, _, info = envs[i].step(a[i])
            np.testing.assert_array_equal(obs, vobs[i])
            assert r == vrew[i] and term == vterm[i] and bool(vinfo["ended"][i]) == term
            if term:
                assert info["success"] == vinfo["success"][i] and info["failed"] == vinfo["failed"][i]
                outcomes[i] = info["success"]
                live[i] = False
        if not live.any():
            break
    assert not live.any()
    return outcomes


@pytest.mark.parametrize("name", NUMPY)
@pytest.mark.parametrize("dense", [False, True])
def test_batched_matches_single(name, dense):
    rng = np.random.default_rng(NUMPY.index(name))
    seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=8)]
    seeds = seeds + seeds[:4]  # groups: repeated seeds
    eps = np.linspace(0.0, 0.7, len(seeds))
    outcomes = compare_batched_with_single(name, dense, seeds, eps, action_seed=len(name))
    assert outcomes.any()  # the comparison covers successes
    if "cartpole" in name or name == "pendulum":
        assert not outcomes.all()  # and failures


@pytest.mark.parametrize("name", NUMPY)
def test_batched_reset_streams_match_single(name):
    # after a seeded reset, unseeded resets continue each sub-env's generator, as the base env does
    spec = TASKS[name]
    venv = make_episode_env(name, num_envs=3)
    envs = [gym.make(spec.env_id) for _ in range(3)]
    vobs, _ = venv.reset(seed=[9, 9, 10])
    sobs = [e.reset(seed=s)[0] for e, s in zip(envs, [9, 9, 10])]
    for _ in range(3):
        np.testing.assert_array_equal(vobs, np.stack(sobs))
        vobs, _ = venv.reset()
        sobs = [e.reset()[0] for e in envs]
    np.testing.assert_array_equal(vobs[0], vobs[1])
    assert not np.array_equal(vobs[0], vobs[2])


@pytest.mark.parametrize(
    "name", ["precision-cartpole", "pendulum", "acrobot", "mountaincar", "mountaincar-continuous"]
)
def test_batched_matches_single_random_actions(name):
    seeds = list(range(50, 58))
    compare_batched_with_single(name, False, seeds, np.ones(len(seeds)), action_seed=1)


@pytest.mark.parametrize(
    "name,state,action",
    [
        ("mountaincar", [-1.15, -0.06], 0),  # hits the left wall: velocity zeroed
        ("mountaincar", [-0.8, 0.0699], 2),  # speed limit
        ("mountaincar-continuous", [-1.15, -0.06], np.array([-1.0], np.float32)),
        ("mountaincar-continuous", [-0.8, 0.0699], np.array([1.0], np.float32)),
        ("pendulum", [0.0, 7.99], np.array([2.0], np.float32)),  # speed limit
        ("acrobot", [-0.1, 3.1, -12.0, 28.0], 2),  # angle wrap and speed limits
    ],
)
def test_batched_matches_single_at_the_limits(name, state, action):
    venv = make_episode_env(name, num_envs=1)
    venv.reset(seed=0)
    venv.set_state(np.array([state]), t=7)
    env = single(name)
    u = env.unwrapped
    u.base.state = np.array(state, dtype=np.float64)
    u.t = 7
    for _ in range(3):
        obs, r, term, *_ = env.step(action)
        vobs, vr, vterm, *_ = venv.step(np.asarray(action)[None])
        np.testing.assert_array_equal(obs, vobs[0])
        assert r == vr[0] and term == vterm[0]


# --------------------------------------------------------------------------------------------------
# the episode vector env: seeds, frozen-after-done, reset revives


@pytest.mark.parametrize("name", ["short-cartpole", "acrobot", "hopper", "lunarlander"])
def test_episode_env_seeds_and_freezing(name):
    spec = TASKS[name]
    n = 6
    env = make_episode_env(name, num_envs=n)
    assert env.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    obs, _ = env.reset(seed=[3, 3, 4, 4, 5, 5])
    assert obs.shape == (n, spec.obs_dim) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs[0], obs[1])
    assert not np.array_equal(obs[0], obs[2])
    # an int seed s gives s + i, like a list
    np.testing.assert_array_equal(env.reset(seed=7)[0], env.reset(seed=list(range(7, 7 + n)))[0])
    # the single env with the same seed starts in the same state
    np.testing.assert_array_equal(obs[2], gym.make(spec.env_id).reset(seed=4)[0])
    env.reset(seed=[3, 3, 4, 4, 5, 5])

    rng = np.random.default_rng(0)
    ended_at = np.full(n, -1)
    last_obs = np.zeros_like(obs)
    outcome = np.zeros(n, dtype=bool)
    sims = {}
    for k in range(spec.horizon + 5):
        a = random_actions(spec, n, rng)
        obs, rew, term, trunc, info = env.step(a)
        assert obs.dtype == np.float32 and rew.shape == (n,) and not trunc.any()
        for i in range(n):
            if ended_at[i] >= 0:  # frozen
                np.testing.assert_array_equal(obs[i], last_obs[i])
                assert rew[i] == 0.0 and term[i] and not info["ended"][i]
                assert info["success"][i] == outcome[i] and info["length"][i] == ended_at[i] + 1
                if spec.backend != "numpy":  # not simulated any more
                    assert sim_clock(env, i) == sims[i]
            elif term[i]:
                assert info["ended"][i] and info["length"][i] == k + 1
                ended_at[i], outcome[i], last_obs[i] = k, info["success"][i], obs[i]
                assert rew[i] == float(outcome[i])
                if spec.backend != "numpy":
                    sims[i] = sim_clock(env, i)
        if term.all() and k > ended_at.max() + 2:
            break
    assert term.all()
    # reset revives only the masked sub-envs
    mask = np.array([True, False, True, False, False, False])
    obs2, _ = env.reset(seed=[3, 0, 4, 0, 0, 0], options={"reset_mask": mask})
    np.testing.assert_array_equal(obs2[~mask], last_obs[~mask])
    obs3, _, term3, _, info3 = env.step(random_actions(spec, n, rng))
    assert term3[~mask].all() and (info3["length"][mask] == 1).all()
    env.close()


def sim_clock(env, i: int):
    base = env.envs[i].base
    if hasattr(base, "data"):
        return float(base.data.time)
    return tuple(base.lander.position) + (base.lander.angle,)


def test_episode_env_rejects_bad_calls():
    env = make_episode_env("short-cartpole", num_envs=3)
    with pytest.raises(RuntimeError):
        env.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError):
        env.reset(seed=[1, 2])
    env.reset(seed=0)
    with pytest.raises(ValueError):
        env.step(np.array([0, 1, 2]))
    with pytest.raises(ValueError):
        env.step(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError):
        make_episode_env("pendulum", 2).reset(seed=0, options={"reset_mask": np.array([1, 0])})


def test_episode_env_clips_continuous_actions():
    env = make_episode_env("mountaincar-continuous", num_envs=2)
    env.reset(seed=[1, 1])
    for _ in range(20):
        obs, *_ = env.step(np.array([[5.0], [1.0]], dtype=np.float32))
        np.testing.assert_array_equal(obs[0], obs[1])


@pytest.mark.parametrize("name", NUMPY)
def test_make_vec_vector_entry_point(name):
    spec = TASKS[name]
    env = gym.make_vec(spec.env_id, num_envs=4, vectorization_mode="vector_entry_point", dense=True)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP and env.num_envs == 4 and env.dense
    assert isinstance(env, spec.load(vector=True)) and env.spec.id == spec.env_id
    obs, _ = env.reset(seed=[0, 0, 1, 1])
    assert obs.shape == (4, spec.obs_dim)
    obs, rew, term, trunc, info = env.step(env.action_space.sample())
    assert obs.shape == (4, spec.obs_dim) and rew.shape == (4,) and "success" in info
    env.close()
    # the episode mode of make_episode_env, on request
    episode = gym.make_vec(spec.env_id, num_envs=2, autoreset_mode=AutoresetMode.DISABLED)
    assert type(episode) is type(make_episode_env(name)) is spec.load(vector=True)
    assert episode.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    with pytest.raises(ValueError, match="autoreset_mode"):
        gym.make_vec(spec.env_id, num_envs=2, autoreset_mode=AutoresetMode.SAME_STEP)


def test_make_episode_env_keeps_episode_mode():
    """The trainers' env: autoreset disabled, ended sub-envs frozen (not the make_vec default)."""
    for name in ("short-cartpole", "hopper"):
        env = make_episode_env(name, num_envs=2)
        assert type(env) is TASKS[name].load(vector=True)
        assert env.metadata["autoreset_mode"] == AutoresetMode.DISABLED


def _run_make_vec(spec: TaskSpec, mode: str | None, actions: np.ndarray):
    kwargs = {} if mode is None else {"vectorization_mode": mode}
    env = gym.make_vec(spec.env_id, num_envs=2, dense=True, **kwargs)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs, _ = env.reset(seed=[5, 6])
    steps = [(obs, np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), None)]
    for a in actions:
        obs, rew, term, trunc, info = env.step(a)
        assert obs.shape == (2, spec.obs_dim) and not trunc.any()
        steps.append((obs, rew, term, trunc, info))
    env.close()
    return steps


@pytest.mark.parametrize("name,steps", [("short-cartpole", 100), ("hopper", 300), ("lunarlander", 400)])
def test_make_vec_autoresets_like_gymnasium(name, steps):
    """``gym.make_vec`` on a project id: Gymnasium's default next-step autoreset, the same trajectories
    as ``SyncVectorEnv`` over the single envs, and no frozen sub-env after an episode ends."""
    spec = TASKS[name]
    actions = random_actions(spec, steps, np.random.default_rng(1), batch=2)
    reference = _run_make_vec(spec, "sync", actions)  # Gymnasium's own autoreset over gym.make envs
    for mode in (None, "vector_entry_point"):  # None: make_vec's default for an id with a vector entry point
        run = _run_make_vec(spec, mode, actions)
        for (obs, rew, term, trunc, _), (r_obs, r_rew, r_term, r_trunc, _) in zip(run, reference):
            np.testing.assert_array_equal(obs, r_obs)
            np.testing.assert_array_equal(rew, r_rew)
            np.testing.assert_array_equal(term, r_term)
            np.testing.assert_array_equal(trunc, r_trunc)
        resets = np.zeros(2, dtype=int)
        for k in range(1, len(run) - 2):
            obs, rew, term, _, info = run[k]
            for i in np.flatnonzero(term):
                # the step after an end starts a new episode: fresh clock, reward 0, not terminated
                nxt, nxt_rew, nxt_term, _, nxt_info = run[k + 1]
                assert not nxt_term[i] and nxt_rew[i] == 0.0 and nxt[i, -1] == 1.0
                assert nxt_info["length"][i] == 0 and not nxt_info["success"][i] and not nxt_info["ended"][i]
                assert not np.array_equal(nxt[i], obs[i])
                # and it runs: the next observation moves on, the (dense) reward is back
                after, after_rew, _, _, after_info = run[k + 2]
                assert after_info["length"][i] == 1 and after[i, -1] < 1.0
                assert not np.array_equal(after[i], nxt[i]) and after_rew[i] != 0.0
                resets[i] += 1
        assert (resets >= 1).all(), f"every sub-env should end and restart within {steps} steps: {resets}"


@pytest.mark.parametrize("name", ALL)
def test_stable_baselines3_ppo_runs(name):
    sb3 = pytest.importorskip("stable_baselines3")
    import torch

    torch.set_num_threads(1)
    env = gym.make(TASKS[name].env_id)
    model = sb3.PPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, device="cpu", seed=0)
    model.learn(total_timesteps=128)
    env.close()


def test_hopper_dense_shaping_caps_the_speed_bonus():
    """Dense Hopper: healthy bonus + min(forward velocity, 1 m/s) - control cost, whatever the speed."""
    env = gym.make("sppo_rl/SparseHopper-v0", dense=True)
    env.reset(seed=0)
    base = env.unwrapped.base
    qpos, qvel = base.data.qpos.copy(), base.data.qvel.copy()
    qvel[0] = 6.0  # shoot the torso forward
    base.set_state(qpos, qvel)
    x0 = float(base.data.qpos[0])
    _, reward, _, _, _ = env.step(np.zeros(3, dtype=np.float32))
    velocity = (float(base.data.qpos[0]) - x0) / base.dt
    assert velocity > 2.0
    assert reward == pytest.approx(1.0 + 1.0, abs=1e-6)  # healthy + capped velocity, zero control cost
