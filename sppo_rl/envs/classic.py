"""Classic-control tasks: CartPole (three variants), MountainCar (discrete and continuous), Pendulum, Acrobot.

Each task is a :class:`ClassicTask`: the base Gymnasium dynamics rewritten over a batch of states
``[N, d]`` (float64), plus the task's failure / decision / success tests and its shaping, all vectorised.
Two environments use one task object:

- the single environment (``gymnasium.make(id)``, :class:`ClassicEpisodeEnv`) steps the real Gymnasium
  environment and applies the task's tests to its state;
- the batched environment (``make_episode_env`` / ``make_vec(..., vectorization_mode="vector_entry_point")``,
  :class:`ClassicVectorEnv`) steps ``N`` states with the task's NumPy dynamics in one call.

The NumPy dynamics repeat the base code's arithmetic operation for operation (same constants, same
evaluation order, same float32 / float64 mix), so both paths agree bit for bit; the tests check it.
Initial states are drawn exactly like the base ``reset`` draws them, from
``gymnasium.utils.seeding.np_random(seed)``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import utils as cc_utils
from gymnasium.envs.classic_control.acrobot import AcrobotEnv
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.continuous_mountain_car import Continuous_MountainCarEnv
from gymnasium.envs.classic_control.mountain_car import MountainCarEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.utils import seeding

from sppo_rl.envs.core import EpisodeEnv, EpisodeVectorEnv, extended_box, reset_mask, seed_list

F32 = np.float32


class ClassicTask:
    """A sparse-outcome task over a classic-control base environment, on batches of states.

    Every method takes ``states`` of shape ``[N, state_dim]`` (float64 holding the base env's values);
    tests return bool ``[N]``. ``t`` counts the steps taken including the current one.
    """

    name: ClassVar[str]
    horizon: ClassVar[int]
    state_dim: ClassVar[int]
    base_class: ClassVar[type[gym.Env]]
    render_fps: ClassVar[int]

    def __init__(self) -> None:
        self.ref = self.base_class()  # holds the base constants; never stepped
        self.observation_space = extended_box(self.ref.observation_space, (), ())
        self.action_space = self.ref.action_space

    # the base environment
    def make_base(self, render_mode: str | None) -> gym.Env:
        return self.base_class(render_mode=render_mode)

    def base_state(self, env: gym.Env) -> np.ndarray:
        """The base env's current state as a ``[1, state_dim]`` float64 array."""
        return np.array(env.unwrapped.state, dtype=np.float64).reshape(1, self.state_dim)

    # dynamics
    def initial_state(self, rng: np.random.Generator, options: dict[str, Any] | None) -> np.ndarray:
        raise NotImplementedError

    def reset_obs(self, states: np.ndarray) -> np.ndarray:
        """Observations right after reset (float32 ``[N, base_obs_dim]``)."""
        return self.observe(states)

    def step(self, states: np.ndarray, actions: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The base dynamics on every row; ``t`` is the number of steps taken before this one."""
        raise NotImplementedError

    def observe(self, states: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # the task
    def failed(self, states: np.ndarray) -> np.ndarray:
        return np.zeros(len(states), dtype=bool)

    def decided(self, states: np.ndarray) -> np.ndarray:
        return np.zeros(len(states), dtype=bool)

    def success(self, states: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def shaping(
        self, before: np.ndarray, actions: np.ndarray, states: np.ndarray, t: np.ndarray, failed: np.ndarray
    ) -> np.ndarray:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# CartPole


class CartPoleTask(ClassicTask):
    """CartPole-v1 dynamics (Euler); the pole falls at ``|theta| > 12 deg`` or ``|x| > 2.4``.

    ``final_tolerance``: success needs ``|theta_H| <= final_tolerance`` (radians) besides never falling;
    ``None`` makes survival alone the success test. Shaping (``dense``), on every step the pole is up:
    ``(1 - (theta/theta_max)^2 / 2 - (x/x_max)^2 / 2) / H``, plus ``exp(-(theta_H/tol)^2)`` at ``t = H``
    when a tolerance is set (it rewards a small final angle smoothly).
    """

    state_dim = 4
    base_class = CartPoleEnv
    render_fps = 50
    final_tolerance: ClassVar[float | None] = None

    def initial_state(self, rng, options):
        low, high = cc_utils.maybe_parse_reset_bounds(options, -0.05, 0.05)
        return rng.uniform(low=low, high=high, size=(4,))

    def step(self, states, actions, t):
        p = self.ref
        x, x_dot, theta, theta_dot = states.T
        force = np.where(actions == 1, p.force_mag, -p.force_mag)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + p.polemass_length * np.square(theta_dot) * sintheta) / p.total_mass
        thetaacc = (p.gravity * sintheta - costheta * temp) / (
            p.length * (4.0 / 3.0 - p.masspole * np.square(costheta) / p.total_mass)
        )
        xacc = temp - p.polemass_length * thetaacc * costheta / p.total_mass
        x = x + p.tau * x_dot
        x_dot = x_dot + p.tau * xacc
        theta = theta + p.tau * theta_dot
        theta_dot = theta_dot + p.tau * thetaacc
        return np.stack((x, x_dot, theta, theta_dot), axis=1)

    def observe(self, states):
        return states.astype(F32)

    def failed(self, states):
        x, theta = states[:, 0], states[:, 2]
        xt, tt = self.ref.x_threshold, self.ref.theta_threshold_radians
        return (x < -xt) | (x > xt) | (theta < -tt) | (theta > tt)

    def success(self, states):
        if self.final_tolerance is None:
            return np.ones(len(states), dtype=bool)
        return np.abs(states[:, 2]) <= self.final_tolerance

    def shaping(self, before, actions, states, t, failed):
        x, theta = states[:, 0], states[:, 2]
        up = (
            1.0
            - 0.5 * np.square(theta / self.ref.theta_threshold_radians)
            - 0.5 * np.square(x / self.ref.x_threshold)
        )
        r = up / self.horizon
        if self.final_tolerance is not None:
            r = r + np.where(t >= self.horizon, np.exp(-np.square(theta / self.final_tolerance)), 0.0)
        return np.where(failed, 0.0, r)


class PrecisionCartPoleTask(CartPoleTask):
    name = "precision-cartpole"
    horizon = 200
    final_tolerance = math.radians(0.5)


class SparseCartPoleTask(CartPoleTask):
    name = "cartpole"
    horizon = 200
    final_tolerance = None


class ShortCartPoleTask(CartPoleTask):
    name = "short-cartpole"
    horizon = 30
    final_tolerance = math.radians(6.0)


# --------------------------------------------------------------------------------------------------
# MountainCar


GOAL_X = 0.45


class _MountainCarShaping:
    """What both MountainCar tasks share: the reset, success ``x >= 0.45`` (decided at once), and shaping
    ``Phi(s') - Phi(s)`` with the car's energy.

    ``Phi = (v^2 / 2 + g/3 (1 + sin 3x)) / E_goal`` with ``g = 0.0025`` (the gravity term of both
    MountainCar tasks: ``dv = ... - g cos 3x``, whose potential is ``g/3 sin 3x``) and ``E_goal`` the
    energy at rest at ``x = 0.45``, so ``Phi`` runs from 0 (at rest in the valley) to about 1 at the goal.
    """

    G = 0.0025
    E_GOAL = G / 3.0 * (1.0 + math.sin(3.0 * GOAL_X))

    def potential(self, states: np.ndarray) -> np.ndarray:
        x, v = states[:, 0], states[:, 1]
        return (0.5 * np.square(v) + self.G / 3.0 * (1.0 + np.sin(3.0 * x))) / self.E_GOAL

    def initial_state(self, rng, options):
        """Both MountainCar resets: ``x ~ U(-0.6, -0.4)`` (or the ``options`` bounds), ``v = 0``."""
        low, high = cc_utils.maybe_parse_reset_bounds(options, -0.6, -0.4)
        return np.array([rng.uniform(low=low, high=high), 0])

    def decided(self, states):
        return states[:, 0] >= GOAL_X

    def success(self, states):
        return states[:, 0] >= GOAL_X

    def shaping(self, before, actions, states, t, failed):
        return self.potential(states) - self.potential(before)


class SparseMountainCarTask(_MountainCarShaping, ClassicTask):
    """MountainCar-v0 dynamics (discrete), horizon 1000, success at ``x >= 0.45``."""

    name = "mountaincar"
    horizon = 1000
    state_dim = 2
    base_class = MountainCarEnv
    render_fps = 30

    def step(self, states, actions, t):
        p = self.ref
        position, velocity = states[:, 0], states[:, 1]
        velocity = velocity + ((actions - 1) * p.force + np.cos(3 * position) * (-p.gravity))
        velocity = np.clip(velocity, -p.max_speed, p.max_speed)
        position = position + velocity
        position = np.clip(position, p.min_position, p.max_position)
        velocity = np.where((position == p.min_position) & (velocity < 0), 0.0, velocity)
        return np.stack((position, velocity), axis=1)

    def observe(self, states):
        return states.astype(F32)


class SparseMountainCarContinuousTask(_MountainCarShaping, ClassicTask):
    """MountainCarContinuous-v0 dynamics, horizon 1000, success at ``x >= 0.45``.

    The base env keeps its state in float32 after the first step and mixes float32 actions with
    Python floats; :meth:`step` repeats that arithmetic (float64 on a row's first step, float32 after).
    """

    name = "mountaincar-continuous"
    horizon = 1000
    state_dim = 2
    base_class = Continuous_MountainCarEnv
    render_fps = 30

    def step(self, states, actions, t):
        p = self.ref
        force = actions[:, 0]  # float32, already clipped to [-1, 1]
        push = force * p.power  # float32 (a Python float meets a float32 scalar)
        # first step from reset: float64 state
        pos64, vel64 = states[:, 0], states[:, 1]
        dv = push - (0.0025 * np.cos(3 * pos64)).astype(F32)
        v_a = np.clip(vel64 + dv.astype(np.float64), -p.max_speed, p.max_speed)
        x_a = np.clip(pos64 + v_a, p.min_position, p.max_position)
        # later steps: float32 state
        pos32, vel32 = pos64.astype(F32), vel64.astype(F32)
        dv = push - (0.0025 * np.cos((3 * pos32).astype(np.float64))).astype(F32)
        v_b = np.clip(vel32 + dv, F32(-p.max_speed), F32(p.max_speed))
        x_b = np.clip(pos32 + v_b, F32(p.min_position), F32(p.max_position))
        first = t == 0
        position = np.where(first, x_a, x_b.astype(np.float64))
        velocity = np.where(first, v_a, v_b.astype(np.float64))
        at_wall = np.where(first, x_a == p.min_position, x_b == F32(p.min_position))
        velocity = np.where(at_wall & (velocity < 0), 0.0, velocity)
        return np.stack((position, velocity), axis=1).astype(F32).astype(np.float64)

    def observe(self, states):
        return states.astype(F32)


# --------------------------------------------------------------------------------------------------
# Pendulum

PENDULUM_COST_MAX = math.pi**2 + 0.1 * 8.0**2 + 0.001 * 2.0**2  # 16.2736...


class SparsePendulumTask(ClassicTask):
    """Pendulum-v1 dynamics, horizon 1000, success ``cos(theta_H) > 0.8``.

    Shaping: the base task's upright cost on the state before the step, scaled to ``[-1, 0]``:
    ``-(angle(theta)^2 + 0.1 thdot^2 + 0.001 u^2) / 16.2736``.
    """

    name = "pendulum"
    horizon = 1000
    state_dim = 2
    base_class = PendulumEnv
    render_fps = 30

    def initial_state(self, rng, options):
        if options is None:
            high = np.array([np.pi, 1.0])
        else:
            x = cc_utils.verify_number_and_cast(options.get("x_init", np.pi))
            y = cc_utils.verify_number_and_cast(options.get("y_init", 1.0))
            high = np.array([x, y])
        return rng.uniform(low=-high, high=high)

    def step(self, states, actions, t):
        p = self.ref
        th, thdot = states[:, 0], states[:, 1]
        g, m, l, dt = p.g, p.m, p.l, p.dt  # noqa: E741
        u = np.clip(actions[:, 0], -p.max_torque, p.max_torque)
        newthdot = thdot + (3 * g / (2 * l) * np.sin(th) + 3.0 / (m * l**2) * u) * dt
        newthdot = np.clip(newthdot, -p.max_speed, p.max_speed)
        newth = th + newthdot * dt
        return np.stack((newth, newthdot), axis=1)

    def observe(self, states):
        th, thdot = states[:, 0], states[:, 1]
        return np.stack((np.cos(th), np.sin(th), thdot), axis=1).astype(F32)

    def success(self, states):
        return np.cos(states[:, 0]) > 0.8

    def shaping(self, before, actions, states, t, failed):
        th, thdot = before[:, 0], before[:, 1]
        u = actions[:, 0].astype(np.float64)
        angle = (th + np.pi) % (2 * np.pi) - np.pi
        return -(np.square(angle) + 0.1 * np.square(thdot) + 0.001 * np.square(u)) / PENDULUM_COST_MAX


# --------------------------------------------------------------------------------------------------
# Acrobot


def _libm_square(x: np.ndarray) -> np.ndarray:
    """``x ** 2`` as a float64 scalar computes it (C ``pow``), which can differ from ``x * x`` by 1 ulp."""
    return np.fromiter((v**2 for v in x.tolist()), dtype=np.float64, count=len(x))


class SparseAcrobotTask(ClassicTask):
    """Acrobot-v1 dynamics ("book" equations, RK4 over 0.2 s), horizon 500.

    Success: the tip rises above the bar, ``-cos(q1) - cos(q1 + q2) > 1`` (the base goal), which ends the
    episode at once. Shaping: ``-1 / H`` on every step that does not reach it.
    """

    name = "acrobot"
    horizon = 500
    state_dim = 4
    base_class = AcrobotEnv
    render_fps = 15

    def initial_state(self, rng, options):
        low, high = cc_utils.maybe_parse_reset_bounds(options, -0.1, 0.1)
        return rng.uniform(low=low, high=high, size=(4,)).astype(F32)

    def reset_obs(self, states):
        s = states.astype(F32)  # the base env keeps its reset state in float32
        return np.stack(
            (np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]), s[:, 2], s[:, 3]), axis=1
        ).astype(F32)

    def observe(self, states):
        s = states
        return np.stack(
            (np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]), s[:, 2], s[:, 3]), axis=1
        ).astype(F32)

    def _dsdt(self, y: np.ndarray) -> np.ndarray:
        p = self.ref
        m1, m2 = p.LINK_MASS_1, p.LINK_MASS_2
        l1 = p.LINK_LENGTH_1
        lc1, lc2 = p.LINK_COM_POS_1, p.LINK_COM_POS_2
        I1 = I2 = p.LINK_MOI
        g = 9.8
        pi = np.pi
        a = y[:, 4]
        theta1, theta2, dtheta1, dtheta2 = y[:, 0], y[:, 1], y[:, 2], y[:, 3]
        cos, sin = np.cos, np.sin
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos(theta2)) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos(theta2)) + I2
        phi2 = m2 * lc2 * g * cos(theta1 + theta2 - pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * _libm_square(dtheta2) * sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * cos(theta1 - pi / 2)
            + phi2
        )
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * _libm_square(dtheta1) * sin(theta2) - phi2) / (
            m2 * lc2**2 + I2 - _libm_square(d2) / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return np.stack((dtheta1, dtheta2, ddtheta1, ddtheta2, np.zeros_like(a)), axis=1)

    def step(self, states, actions, t):
        p = self.ref
        torque = np.asarray(p.AVAIL_TORQUE, dtype=np.float64)[actions]
        y0 = np.concatenate((states, torque[:, None]), axis=1)
        dt = p.dt - 0
        dt2 = dt / 2.0
        k1 = self._dsdt(y0)
        k2 = self._dsdt(y0 + dt2 * k1)
        k3 = self._dsdt(y0 + dt2 * k2)
        k4 = self._dsdt(y0 + dt * k3)
        ns = (y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4))[:, :4]
        diff = 2 * np.pi
        for j in (0, 1):  # wrap angles into [-pi, pi] by whole turns, as the base loop does
            q = ns[:, j]
            while np.any(q > np.pi):
                q = np.where(q > np.pi, q - diff, q)
            while np.any(q < -np.pi):
                q = np.where(q < -np.pi, q + diff, q)
            ns[:, j] = q
        ns[:, 2] = np.minimum(np.maximum(ns[:, 2], -p.MAX_VEL_1), p.MAX_VEL_1)
        ns[:, 3] = np.minimum(np.maximum(ns[:, 3], -p.MAX_VEL_2), p.MAX_VEL_2)
        return ns

    def decided(self, states):
        s = states
        return -np.cos(s[:, 0]) - np.cos(s[:, 1] + s[:, 0]) > 1.0

    def success(self, states):
        return self.decided(states)

    def shaping(self, before, actions, states, t, failed):
        return np.where(self.decided(states), 0.0, -1.0 / self.horizon)


# --------------------------------------------------------------------------------------------------
# the two environments over a ClassicTask


class ClassicEpisodeEnv(EpisodeEnv):
    """The single environment of a :class:`ClassicTask`: the real Gymnasium env plus the task's tests."""

    task: ClassVar[ClassicTask]

    def __init__(self, dense: bool = False, render_mode: str | None = None) -> None:
        self.horizon = self.task.horizon
        super().__init__(dense=dense, render_mode=render_mode)
        self._state: np.ndarray | None = None

    def _make_base(self, render_mode):
        return self.task.make_base(render_mode)

    def _before_step(self):
        return self.task.base_state(self.base)

    def _judge(self, obs, base_terminated):
        s = self._state = self.task.base_state(self.base)
        return bool(self.task.failed(s)[0]), bool(self.task.decided(s)[0])

    def _success(self, obs):
        return bool(self.task.success(self._state)[0])

    def _shaping(self, before, action, obs, base_reward, failed, ended):
        a = np.asarray(action)[None]
        t = np.array([self.t])
        return float(self.task.shaping(before, a, self._state, t, np.array([failed]))[0])


class ClassicVectorEnv(EpisodeVectorEnv):
    """``N`` episodes of a :class:`ClassicTask` stepped together by its NumPy dynamics.

    Same observations, rewards, ends and outcomes as ``N`` single environments reset with the same
    seeds and fed the same actions; autoreset is disabled and ended rows are frozen (module ``core``).
    ``reset`` accepts one seed per sub-env (or an int ``s``: ``s + i``) and ``options["reset_mask"]``;
    other options (``low`` / ``high``, ``x_init`` / ``y_init``) go to the base reset distribution.
    """

    task: ClassVar[ClassicTask]

    def __init__(self, num_envs: int = 1, dense: bool = False, render_mode: str | None = None) -> None:
        if render_mode is not None:
            raise ValueError("the batched classic-control envs do not render; use gymnasium.make for one env")
        task = self.task
        self.horizon = task.horizon
        action_space = task.action_space
        if isinstance(action_space, spaces.Box):
            action_space = spaces.Box(
                action_space.low.astype(F32), action_space.high.astype(F32), dtype=np.float32
            )
        self._setup(num_envs, task.observation_space, action_space, dense)
        self._state = np.zeros((self.num_envs, task.state_dim), dtype=np.float64)
        self._rngs: list[np.random.Generator | None] = [None] * self.num_envs

    def reset(self, *, seed=None, options=None):
        seeds = seed_list(seed, self.num_envs)
        mask, rest = reset_mask(options, self.num_envs)
        rows = np.flatnonzero(mask)
        fresh = []
        for i in rows:
            if seeds[i] is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(seeds[i])
            fresh.append(self.task.initial_state(self._rngs[i], rest))
        fresh = np.stack(fresh)
        self._state[rows] = fresh
        self._obs[rows, :-1] = self.task.reset_obs(fresh)
        self._obs[rows, -1] = 1.0
        self._t[rows] = 0
        self._done[rows] = False
        self._success[rows] = False
        self._failed[rows] = False
        self._ever_reset[rows] = True
        return self._obs.copy(), {}

    def set_state(self, states: np.ndarray, t: int | np.ndarray | None = None) -> np.ndarray:
        """Put every sub-env in the given base states ``[N, state_dim]`` (and clocks ``t``), running.

        For tests and analysis (hand-made states); returns the new observations.
        """
        states = np.asarray(states, dtype=np.float64).reshape(self.num_envs, self.task.state_dim)
        self._state = states.copy()
        self._t = np.broadcast_to(np.asarray(0 if t is None else t, dtype=np.int64), (self.num_envs,)).copy()
        self._obs[:, :-1] = self.task.observe(self._state)
        self._obs[:, -1] = ((self.horizon - self._t) / self.horizon).astype(F32)
        self._done[:] = False
        self._success[:] = False
        self._failed[:] = False
        self._ever_reset[:] = True
        return self._obs.copy()

    def step(self, actions):
        self._check_stepping()
        a = self._actions(actions)
        task = self.task
        live = ~self._done
        before = self._state
        new = task.step(before, a, self._t)
        t = self._t + live
        failed = live & task.failed(new)
        ended = live & (failed | task.decided(new) | (t >= self.horizon))
        success = ended & ~failed & task.success(new)
        rewards = success.astype(np.float64)
        if self.dense:
            rewards += np.where(live, task.shaping(before, a, new, t, failed), 0.0)
        self._state = np.where(live[:, None], new, before)
        obs = task.observe(new)
        self._obs[live, :-1] = obs[live]
        self._obs[live, -1] = ((self.horizon - t[live]) / self.horizon).astype(F32)
        self._t = t
        self._done |= ended
        self._success |= success
        self._failed |= failed
        n = self.num_envs
        return self._obs.copy(), rewards, self._done.copy(), np.zeros(n, dtype=bool), self._info(ended)


# --------------------------------------------------------------------------------------------------
# the registered classes


def _pair(task_cls: type[ClassicTask], name: str) -> tuple[type[ClassicEpisodeEnv], type[ClassicVectorEnv]]:
    task = task_cls()
    single = type(f"{name}Env", (ClassicEpisodeEnv,), {"task": task, "__module__": __name__})
    single.metadata = {"render_modes": list(task.ref.metadata["render_modes"]), "render_fps": task.render_fps}
    single.__doc__ = f"Single ``{task.name}`` episode (Gymnasium dynamics). " + (task_cls.__doc__ or "")
    vector = type(f"{name}VectorEnv", (ClassicVectorEnv,), {"task": task, "__module__": __name__})
    vector.__doc__ = f"Batched ``{task.name}`` episodes (NumPy dynamics). " + (task_cls.__doc__ or "")
    return single, vector


PrecisionCartPoleEnv, PrecisionCartPoleVectorEnv = _pair(PrecisionCartPoleTask, "PrecisionCartPole")
SparseCartPoleEnv, SparseCartPoleVectorEnv = _pair(SparseCartPoleTask, "SparseCartPole")
ShortCartPoleEnv, ShortCartPoleVectorEnv = _pair(ShortCartPoleTask, "ShortCartPole")
SparseMountainCarEnv, SparseMountainCarVectorEnv = _pair(SparseMountainCarTask, "SparseMountainCar")
SparseMountainCarContinuousEnv, SparseMountainCarContinuousVectorEnv = _pair(
    SparseMountainCarContinuousTask, "SparseMountainCarContinuous"
)
SparsePendulumEnv, SparsePendulumVectorEnv = _pair(SparsePendulumTask, "SparsePendulum")
SparseAcrobotEnv, SparseAcrobotVectorEnv = _pair(SparseAcrobotTask, "SparseAcrobot")
