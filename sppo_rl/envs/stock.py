"""Success tests of stock Gymnasium ids, and the ``--success`` rules a user can name.

A stock id trained as a task (``sppo-rl control --task MountainCar-v0``) is judged by the rule of
:data:`STOCK`, which follows what the env itself calls a success; an id this table does not know is
refused unless the user names a test (``--success`` / ``success=``): the project never guesses.

Every test has the signature of :data:`sppo_rl.envs.custom.Success`, ``success(obs, info, terminated,
truncated) -> bool``, called once on the episode's last step with the base env's final observation and
``info`` plus two keys :class:`~sppo_rl.envs.custom.SparseOutcome` adds: ``base_reward`` (the base env's
reward of that step) and ``base_return`` (its sum over the episode). ``truncated`` is True at the time
limit (the horizon is the id's ``max_episode_steps``).

The rules (the reasons, from each env's source, in ``docs/control.md``):

======================================================  =============================================
id                                                      success
======================================================  =============================================
CartPole-v0, CartPole-v1                                 survived: reached the time limit, pole up
MountainCar-v0, MountainCarContinuous-v0, Acrobot-v1     goal reached: ``terminated`` (the env ends
                                                         only there), at or before the time limit
Pendulum-v1                                              balanced at the end: ``cos(theta) > 0.95``
                                                         and ``abs(theta_dot) < 1`` rad/s
LunarLander-v3, LunarLanderContinuous-v3                 landed: terminated with the +100 of coming to
                                                         rest (a crash or leaving the screen is -100)
BipedalWalker-v3, BipedalWalkerHardcore-v3               reached the end of the terrain: terminated
                                                         without the -100 of falling
InvertedPendulum-v5, InvertedDoublePendulum-v5           survived (they terminate when the pole falls)
Hopper-v5, Walker2d-v5, Ant-v5, Humanoid-v5              survived (healthy to the time limit) with the
                                                         torso beyond ``x_position > 1`` m
HalfCheetah-v5, Swimmer-v5                               return >= the spec's ``reward_threshold``
                                                         (4800, 360); they never terminate
======================================================  =============================================

Speed. The episode vector env of a Gymnasium id (:func:`sppo_rl.envs.tasks.make_episode_env`) checks a
whole batch of actions at once and steps each copy's env under ``gymnasium.make``'s per-step wrappers
(:func:`bare`: the passive checker, order enforcing and a time limit the horizon already applies add
nothing a run reads). CartPole-v0 / -v1 go further: :func:`batched_stock` gives
:class:`CartPoleStockVectorEnv`, the project's NumPy CartPole dynamics over all copies in one call (bit
for bit ``CartPoleEnv``'s arithmetic, start states from each copy's seed as ``reset(seed=s)`` draws
them), with the same observations, rewards, ends, ``info`` and outcomes as the copies of
``gymnasium.make`` (a test steps both). Gymnasium's own ``CartPoleVectorEnv`` is not used: it draws
every copy's start state from one generator, so ``reset(seed=[...])`` cannot give each copy the start
state of its own seed, and it steps ended copies (autoreset).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from sppo_rl.envs.classic import CartPoleTask, ClassicVectorEnv

Success = Callable[[np.ndarray, dict, bool, bool], Any]

PENDULUM_COS = 0.95
PENDULUM_SPEED = 1.0
GOAL_X = 1.0


def survived(obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
    """Ran to the horizon (the time limit) without terminating: ``truncated and not terminated``."""
    return bool(truncated) and not bool(terminated)


def goal_reached(obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
    """The env terminated (for an env that terminates only at its goal), at or before the time limit."""
    return bool(terminated)


def pendulum_balanced(obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
    """Pendulum-v1's final ``obs = (cos theta, sin theta, theta_dot)``: ``cos theta > 0.95`` (within
    18 deg of upright) and ``abs(theta_dot) < 1`` rad/s (held there, not swinging through)."""
    return bool(obs[0] > PENDULUM_COS and abs(obs[2]) < PENDULUM_SPEED)


def came_to_rest(obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
    """LunarLander-v3: terminated with the step reward set to +100, which the env gives exactly when
    the lander comes to rest (a crash or ``abs(x) >= 1`` sets -100; hovering to the limit is neither)."""
    return bool(terminated) and info.get("base_reward") == 100


def reached_the_end(obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
    """BipedalWalker-v3: terminated without the -100 the env sets when the hull touches the ground or
    the walker leaves at the left; its only other termination is passing the end of the terrain."""
    return bool(terminated) and info.get("base_reward") != -100


def survived_beyond(obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
    """MuJoCo locomotion: healthy to the time limit (:func:`survived`) and ``info["x_position"] > 1``
    m at the end (the torso moved forward, not just stood)."""
    return survived(obs, info, terminated, truncated) and float(info.get("x_position", -math.inf)) > GOAL_X


class ReturnAtLeast:
    """``base_return >= threshold``: the episode's return of the base env's own reward."""

    def __init__(self, threshold: float) -> None:
        if not math.isfinite(threshold):
            raise ValueError(f"return threshold must be a finite number, got {threshold!r}")
        self.threshold = float(threshold)

    def __call__(self, obs: np.ndarray, info: dict, terminated: bool, truncated: bool) -> bool:
        return float(info.get("base_return", -math.inf)) >= self.threshold

    def __repr__(self) -> str:
        return f"return:{self.threshold:g}"


_GOAL = "goal reached: terminated (the env ends only at its goal), at or before the time limit"
_SURVIVED = "survived: reached the time limit without terminating"
_LANDED = "landed: terminated with the +100 for coming to rest (crash / off-screen: -100)"
_END = "reached the end of the terrain: terminated without the -100 of a fall"
_WALK = "survived (healthy to the time limit) and torso x_position > 1 m at the end"
_CHEETAH_RET, _SWIMMER_RET = 4800.0, 360.0  # the ids' spec reward_threshold (a test checks them)

STOCK: dict[str, tuple[Success, str]] = {
    "CartPole-v0": (survived, _SURVIVED),
    "CartPole-v1": (survived, _SURVIVED),
    "MountainCar-v0": (goal_reached, _GOAL),
    "MountainCarContinuous-v0": (goal_reached, _GOAL),
    "Acrobot-v1": (goal_reached, _GOAL),
    "Pendulum-v1": (pendulum_balanced, "balanced at the end: cos(theta) > 0.95 and |theta_dot| < 1 rad/s"),
    "LunarLander-v3": (came_to_rest, _LANDED),
    "LunarLanderContinuous-v3": (came_to_rest, _LANDED),
    "BipedalWalker-v3": (reached_the_end, _END),
    "BipedalWalkerHardcore-v3": (reached_the_end, _END),
    "InvertedPendulum-v5": (survived, _SURVIVED),
    "InvertedDoublePendulum-v5": (survived, _SURVIVED),
    "Hopper-v5": (survived_beyond, _WALK),
    "Walker2d-v5": (survived_beyond, _WALK),
    "Ant-v5": (survived_beyond, _WALK),
    "Humanoid-v5": (survived_beyond, _WALK),
    "HalfCheetah-v5": (ReturnAtLeast(_CHEETAH_RET), "return >= 4800 (the spec's reward_threshold)"),
    "Swimmer-v5": (ReturnAtLeast(_SWIMMER_RET), "return >= 360 (the spec's reward_threshold)"),
}
"""Stock Gymnasium id -> (success test, the rule in one line)."""

RULES = (
    "survived, terminated, return:X (the base env's return >= X), module:function or path/to/file.py:function"
)

PREDICATES: dict[str, Success] = {}
"""Success tests handed to the Python API as functions, by the name :func:`predicate_name` gave them
(this process only; ``success_rule`` looks here first)."""


def stock_success(env_id: str) -> tuple[Success, str] | None:
    """The shipped test of a stock id (``module:Id`` is looked up by its ``Id``), or None."""
    return STOCK.get(env_id.rsplit(":", 1)[-1]) if isinstance(env_id, str) else None


def predicate_name(fn: Callable[..., Any]) -> str:
    """``"module:qualname"`` of a success function, recorded in ``config.json``; the function itself is
    kept in :data:`PREDICATES` for this process (a module-level one also imports by that name later)."""
    if not callable(fn):
        raise TypeError(f"success must be a function (obs, info, terminated, truncated) -> bool, got {fn!r}")
    if isinstance(fn, ReturnAtLeast):
        return repr(fn)  # "return:X", which success_rule parses anywhere
    name = f"{getattr(fn, '__module__', None) or 'python'}:{getattr(fn, '__qualname__', type(fn).__name__)}"
    PREDICATES[name] = fn
    return name


def _import(spec: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"--success {spec!r}: no file {path}")
        mod_name = f"_sppo_success_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
            sys.modules[mod_name] = module
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"--success {spec!r}: cannot import {target} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--success {spec!r}: {target} has no function {attr!r}")
    return fn


def success_rule(spec: str) -> tuple[Success, str]:
    """The test named by ``spec`` and its one-line rule: ``survived``, ``terminated`` (goal reached),
    ``return:X``, a name of :data:`PREDICATES`, or ``module:function`` / ``path/to/file.py:function``
    (imported). Anything else: ``ValueError`` in one line."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--success must be one of {RULES}; got {spec!r}")
    if spec in PREDICATES:
        return PREDICATES[spec], spec
    if spec == "survived":
        return survived, _SURVIVED
    if spec == "terminated":
        return goal_reached, _GOAL
    if spec.startswith("return:"):
        try:
            rule = ReturnAtLeast(float(spec[len("return:") :]))
        except ValueError:
            raise ValueError(f"--success {spec!r}: return:X needs a finite number X") from None
        return rule, f"return >= {rule.threshold:g}"
    if ":" in spec:
        return _import(spec), spec
    raise ValueError(f"--success {spec!r}: expected one of {RULES}")


# ----------------------------------------------------------------------------------------- speed

_PER_STEP_WRAPPERS = (
    gym.wrappers.PassiveEnvChecker,
    gym.wrappers.OrderEnforcing,
    gym.wrappers.TimeLimit,
)


def bare(env: gym.Env, horizon: int) -> gym.Env:
    """``env`` without ``gymnasium.make``'s per-step wrappers when they change nothing an episode of at
    most ``horizon`` steps, stepped by a vector env that checks its actions, reads: the passive checker
    (checks once), order enforcing (reset before step, which the vector env enforces) and a
    ``TimeLimit`` of at least ``horizon`` steps (the episode's own limit ends it first or on the same
    step, with the same ``truncated``). Any other wrapper in the stack, or a shorter time limit, keeps
    ``env`` as it is."""
    inner = env
    while isinstance(inner, gym.Wrapper):
        if type(inner) not in _PER_STEP_WRAPPERS:
            return env
        if isinstance(inner, gym.wrappers.TimeLimit) and inner._max_episode_steps < horizon:
            return env
        inner = inner.env
    return inner


_CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"


def batched_stock(
    env: Any, success: Success, horizon: int, num_envs: int = 1, dense: bool = False
) -> CartPoleStockVectorEnv | None:
    """The batched episode env of a Gymnasium id that has one (CartPole-v0 / -v1, or any id registered
    with ``CartPoleEnv``'s entry point and no kwargs, whose time limit is not shorter than ``horizon``),
    else None (an id of another env, a factory, or non-default settings)."""
    if not isinstance(env, str):
        return None
    module, _, name = env.rpartition(":")
    if module:
        importlib.import_module(module)
    spec = gym.registry.get(name)
    if (
        spec is None
        or spec.entry_point != _CARTPOLE
        or spec.kwargs
        or spec.additional_wrappers
        or (spec.max_episode_steps is not None and spec.max_episode_steps < horizon)
    ):
        return None
    return CartPoleStockVectorEnv(success, horizon, num_envs=num_envs, dense=dense)


class CartPoleStock(CartPoleTask):
    """``CartPoleEnv``'s dynamics, reset distribution and termination (``failed``), with horizon ``H``."""

    name = "CartPole (stock)"

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon = int(horizon)


class CartPoleStockVectorEnv(ClassicVectorEnv):
    """``N`` episodes of stock CartPole judged by ``success``, stepped by the batched NumPy dynamics.

    What :class:`sppo_rl.envs.custom.SparseOutcomeVectorEnv` gives over ``N`` copies of
    ``gymnasium.make("CartPole-v1")``, step for step: observation ``(x, x_dot, theta, theta_dot)`` as
    float32, then the time left; the base env terminates when the pole falls and truncates at ``H``; the
    reward is ``success(obs, info, terminated, truncated)`` on the episode's last step (``info``:
    ``base_reward`` 1.0, ``base_return`` = the steps taken), plus ``CartPoleEnv``'s reward 1.0 on every
    step with ``dense``; ``info["failed"]`` = ended before ``H`` without success. Ended copies are frozen.
    """

    def __init__(self, success: Success, horizon: int, num_envs: int = 1, dense: bool = False) -> None:
        self.task = CartPoleStock(horizon)  # per instance: H is the run's
        self.success_fn = success
        super().__init__(num_envs=num_envs, dense=dense)

    def step(self, actions: Any):
        self._check_stepping()
        a = self._actions(actions)
        task, H = self.task, self.horizon
        live = ~self._done
        new = task.step(self._state, a, self._t)
        t = self._t + live
        terminated = live & task.failed(new)
        truncated = live & (t >= H)
        ended = terminated | truncated
        obs = task.observe(new)
        success = np.zeros(self.num_envs, dtype=bool)
        for i in np.flatnonzero(ended):  # the test, once per episode, as the single env calls it
            info = {"base_reward": 1.0, "base_return": float(t[i])}
            success[i] = bool(self.success_fn(obs[i].copy(), info, bool(terminated[i]), bool(truncated[i])))
        rewards = success.astype(np.float64)
        if self.dense:
            rewards += live  # CartPoleEnv's reward: 1.0 on every step, the last one included
        self._state = np.where(live[:, None], new, self._state)
        self._obs[live, :-1] = obs[live]
        self._obs[live, -1] = ((H - t[live]) / H).astype(np.float32)
        self._t = t
        self._done |= ended
        self._success |= success
        self._failed |= ended & ~success & (t < H)
        n = self.num_envs
        return self._obs.copy(), rewards, self._done.copy(), np.zeros(n, dtype=bool), self._info(ended)
