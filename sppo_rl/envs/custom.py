"""Bring your own task: any Gymnasium environment with a binary outcome, trained like the built-in ones.

:class:`SparseOutcome` turns an environment (a Gymnasium id, or a factory returning an env) into one
sparse-outcome episode of the testbed's contract (:mod:`sppo_rl.envs.core`): at most ``H`` steps,
reward 0 on every step and ``R in {0, 1}`` on the last, every end ``terminated=True`` with
``info["success"]`` and ``info["failed"]``, and the time left ``(H - t) / H`` appended to the
observation as its last feature. The outcome is ``success(obs, info, terminated, truncated)``, called
once, on the step where the episode ends:

- it ends when the base environment terminates or truncates, or at step ``H``, whichever comes first;
- ``obs`` and ``info`` are the base environment's (without the appended time left);
  ``terminated`` is the base environment's; ``truncated`` is True when the base environment truncated
  *or* the horizon ``H`` was reached.

``info`` also carries ``base_reward`` (the base environment's reward of that step) and ``base_return``
(its sum over the episode), so a test can read a landing bonus or a return threshold.

The default test of :class:`SparseOutcome` and :func:`register_custom_task`, :func:`survived`, is **"the
episode lasted the full horizon without terminating"** (``truncated and not terminated``), and the default
horizon is the Gymnasium spec's ``max_episode_steps``. A Gymnasium id used as a task by name
(``sppo-rl control --task MountainCar-v0``, also ``module:Id``, which imports ``module`` first as
``gymnasium.make`` does) is judged by its shipped test (:data:`sppo_rl.envs.stock.STOCK`: goal reached
for MountainCar and Acrobot, landed for LunarLander, ...), or by the test the user names
(``--success``, :func:`resolve_task`); an id with neither is refused in one line. An id without
``max_episode_steps`` has no horizon and is refused (register it with an explicit ``horizon``).
``dense=True`` adds the base environment's own reward on every step (a shaping for stage 1 of the
warm-start pipeline; the outcome is unchanged).

:class:`SparseOutcomeVectorEnv` runs ``N`` copies in episode mode (autoreset disabled, ended copies
frozen until ``reset``, ``reset(seed=[...])`` one seed per copy), as :func:`sppo_rl.envs.tasks.make_episode_env`
gives for the built-in tasks (a CartPole id's task gets the batched
:class:`~sppo_rl.envs.stock.CartPoleStockVectorEnv` instead: the same episodes).
:func:`register_custom_task` adds a :class:`~sppo_rl.envs.tasks.TaskSpec` under a name, so ``sppo_rl.train_control(task=name)``, ``ControlConfig(task=name)`` and
``make_episode_env(name)`` work in this process; a stock Gymnasium id (``CartPole-v1``) is registered
with its shipped test on first use, so it also works on the command line. Observations must be a flat ``Box``
and actions ``Discrete`` or a flat ``Box`` (wrap others, e.g. ``gymnasium.wrappers.FlattenObservation``).

```python
from sppo_rl.envs.custom import register_custom_task
register_custom_task("cartpole-right", "CartPole-v1", horizon=100,
                     success=lambda obs, info, terminated, truncated: not terminated and obs[0] > 0)
```
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sppo_rl.envs.core import EpisodeSyncVectorEnv, EpisodeVectorEnv, extended_box
from sppo_rl.envs.stock import RULES, bare, batched_stock, stock_success, success_rule, survived
from sppo_rl.envs.tasks import LOOKUPS, TaskSpec

Success = Callable[[np.ndarray, dict, bool, bool], Any]
"""``success(obs, info, terminated, truncated) -> bool``: the outcome of an episode, on its last step."""
EnvSource = str | Callable[[], gym.Env]
"""A Gymnasium id (built with ``gymnasium.make``) or a function of no argument returning a new env."""

CUSTOM_TASKS: dict[str, TaskSpec] = {}
"""Tasks added by :func:`register_custom_task` (and Gymnasium ids used as tasks), by name."""
_SOURCES: dict[str, Callable[..., Any]] = {}  # entry-point name -> env / vector-env creator
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")


def _describe(source: Any) -> str:
    return source if isinstance(source, str) else getattr(source, "__qualname__", repr(source))


def _build(source: EnvSource | gym.Env, render_mode: str | None = None) -> gym.Env:
    if isinstance(source, gym.Env):
        return source
    if isinstance(source, str):
        return gym.make(source, render_mode=render_mode) if render_mode else gym.make(source)
    if callable(source):
        env = source()
        if not isinstance(env, gym.Env):
            raise TypeError(
                f"the env factory {_describe(source)} returned {type(env).__name__}, not a gymnasium.Env"
            )
        return env
    raise TypeError(f"expected a Gymnasium id or a function returning an env, got {type(source).__name__}")


def default_horizon(source: EnvSource | gym.Env, env: gym.Env | None = None) -> int:
    """The Gymnasium spec's ``max_episode_steps`` of ``source`` (an id, or the env built from a factory);
    ``ValueError`` in one line when it has none."""
    if isinstance(source, str):
        module, _, env_name = source.rpartition(":")  # gymnasium.make's "module:Id" (gym.spec lacks it)
        if module:
            importlib.import_module(module)
        spec = gym.spec(env_name)
    else:
        spec = getattr(env, "spec", None)
    steps = getattr(spec, "max_episode_steps", None)
    if not steps:
        raise ValueError(
            f"{_describe(source)} has no max_episode_steps in its Gymnasium spec, so no horizon for a binary "
            "outcome; register it with sppo_rl.register_custom_task(name, env, success=..., horizon=H)"
        )
    return int(steps)


class SparseOutcome(gym.Env[np.ndarray, Any]):
    """One episode of ``env`` with the terminal binary reward ``success(...)`` (see the module docstring).

    Args:
        env: a Gymnasium id, a function returning a new env, or an env instance (used as is).
        success: ``success(obs, info, terminated, truncated) -> bool``; default :func:`survived`.
        horizon: ``H``; default the env's ``max_episode_steps`` (refused in one line if it has none).
        dense: add the base env's own reward to every step's reward (the outcome is unchanged).
        render_mode: passed to ``gymnasium.make`` for an id.
    """

    metadata = {"render_modes": ["rgb_array", "human"]}

    def __init__(
        self,
        env: EnvSource | gym.Env,
        success: Success | None = None,
        horizon: int | None = None,
        dense: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(env, str) and horizon is None:
            horizon = default_horizon(env)  # before building anything
        self.base = _build(env, render_mode)
        if horizon is None:
            horizon = default_horizon(env, self.base)
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
        self.horizon = int(horizon)
        self.success_fn = survived if success is None else success
        if not callable(self.success_fn):
            raise TypeError(
                f"success must be a function (obs, info, terminated, truncated) -> bool, got {success!r}"
            )
        self.dense = bool(dense)
        self.render_mode = render_mode
        name = _describe(env) if not isinstance(env, gym.Env) else repr(env)
        obs_space, act_space = self.base.observation_space, self.base.action_space
        if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(
                f"{name}: observation space {obs_space} is not a flat Box; wrap the env (e.g. "
                "gymnasium.wrappers.FlattenObservation) and pass a factory"
            )
        if isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
            self.action_space = spaces.Box(
                act_space.low.astype(np.float32), act_space.high.astype(np.float32), dtype=np.float32
            )
        elif isinstance(act_space, spaces.Discrete) and int(act_space.start) == 0:
            self.action_space = act_space
        else:
            raise ValueError(f"{name}: action space {act_space} is neither Discrete(n) nor a flat Box")
        self.observation_space = extended_box(obs_space, (), ())
        self.t = 0
        self.base_return = 0.0
        self.ended = True  # until the first reset

    def _observe(self, obs: Any) -> np.ndarray:
        out = np.empty(self.observation_space.shape, dtype=np.float32)
        out[:-1] = np.asarray(obs, dtype=np.float32).reshape(-1)
        out[-1] = (self.horizon - self.t) / self.horizon
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        obs, info = self.base.reset(seed=seed, options=options)
        self.t = 0
        self.base_return = 0.0
        self.ended = False
        return self._observe(obs), info

    def step(self, action: Any):
        if self.ended:
            raise RuntimeError("the episode has ended; call reset()")
        if isinstance(self.action_space, spaces.Discrete):
            action = int(action)
            if not self.action_space.contains(action):
                raise ValueError(f"{action!r} is not a valid action of {self.action_space}")
        else:
            action = np.clip(
                np.asarray(action, dtype=np.float32), self.action_space.low, self.action_space.high
            )
        return self.advance(action)

    def advance(self, action: Any):
        """:meth:`step` with an action already valid (an ``int`` in the space, or a float32 array within
        its bounds), as :class:`SparseOutcomeVectorEnv` checks a whole batch at once."""
        obs, base_reward, terminated, truncated, info = self.base.step(action)
        self.t += 1
        terminated, truncated = bool(terminated), bool(truncated) or self.t >= self.horizon
        ended = terminated or truncated
        reward = 0.0
        self.base_return += float(base_reward)
        info = {**info, "base_reward": float(base_reward), "base_return": self.base_return}
        if ended:
            success = bool(self.success_fn(obs, info, terminated, truncated))
            reward = float(success)
            info["success"] = success
            info["failed"] = not success and self.t < self.horizon  # ended early without success
            self.ended = True
        if self.dense:
            reward += float(base_reward)
        return self._observe(obs), reward, ended, False, info

    def render(self):
        return self.base.render()

    def close(self) -> None:
        self.base.close()
        super().close()


class SparseOutcomeVectorEnv(EpisodeSyncVectorEnv):
    """``num_envs`` :class:`SparseOutcome` episodes in lock step, in episode mode (the contract of
    :func:`sppo_rl.envs.tasks.make_episode_env`: autoreset disabled, ended copies frozen, ``info`` arrays
    ``success``, ``failed``, ``ended``, ``length``). ``env`` must be an id or a factory (one new env each)."""

    def __init__(
        self,
        env: EnvSource,
        success: Success | None = None,
        horizon: int | None = None,
        num_envs: int = 1,
        dense: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:
            raise ValueError("the episode vector envs do not render; use SparseOutcome for one env")
        if isinstance(env, gym.Env):
            raise TypeError(
                "pass a Gymnasium id or a function returning a new env (one per copy), not an env"
            )
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.envs = [SparseOutcome(env, success, horizon, dense=dense) for _ in range(num_envs)]
        for copy in self.envs:  # stepped through advance(), the batch checked: no per-step wrappers
            copy.base = bare(copy.base, copy.horizon)
        first = self.envs[0]
        self.horizon = first.horizon
        self._setup(num_envs, first.observation_space, first.action_space, dense)


def _entry(key: str, kind: str, fn: Callable[..., Any]) -> str:
    name = f"{kind}_{len(_SOURCES)}"
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"The {kind.replace('_', ' ')} of custom task {key!r}."
    _SOURCES[name] = fn
    return f"{__name__}:{name}"


def __getattr__(name: str) -> Any:  # the entry points of the TaskSpecs registered here
    try:
        return _SOURCES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _check_name(name: str) -> None:
    from sppo_rl.envs.tasks import _BY_ID, TASKS

    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise ValueError(f"task name {name!r}: use letters, digits and _ . : / - (no '..')")
    if name in TASKS or name in _BY_ID:
        raise ValueError(f"{name!r} is a built-in task; choose another name")


def build_custom_task(
    name: str,
    env: EnvSource,
    success: Success | None = None,
    horizon: int | None = None,
    episodes_per_update: int = 16,
    rule: str | None = None,
) -> TaskSpec:
    """The :class:`~sppo_rl.envs.tasks.TaskSpec` of :func:`register_custom_task` without registering it
    (``rule``: the success test in words, for the spec and ``sppo-rl info``)."""
    _check_name(name)
    if isinstance(env, gym.Env):
        raise TypeError("pass a Gymnasium id or a function returning a new env (one per copy), not an env")
    if (
        isinstance(episodes_per_update, bool)
        or not isinstance(episodes_per_update, int)
        or episodes_per_update < 1
    ):
        raise ValueError(f"episodes_per_update must be an integer >= 1, got {episodes_per_update!r}")
    probe = SparseOutcome(env, success, horizon)
    try:
        act = probe.action_space
        discrete = isinstance(act, spaces.Discrete)
        low = high = None
        if not discrete:
            low, high = act.low.copy(), act.high.copy()
            low.flags.writeable = high.flags.writeable = False
        H = probe.horizon
    finally:
        probe.close()

    def single(dense: bool = False, render_mode: str | None = None) -> SparseOutcome:
        return SparseOutcome(env, success, H, dense=dense, render_mode=render_mode)

    def vector(num_envs: int = 1, dense: bool = False, render_mode: str | None = None) -> EpisodeVectorEnv:
        fast = None if render_mode else batched_stock(env, success or survived, H, num_envs, dense)
        if fast is not None:  # CartPole's NumPy dynamics: the same episodes (sppo_rl.envs.stock)
            return fast
        return SparseOutcomeVectorEnv(
            env, success, H, num_envs=num_envs, dense=dense, render_mode=render_mode
        )

    if rule is None:
        rule = (
            "survived: ran to the horizon without terminating"
            if success in (None, survived)
            else _describe(success)
        )
    return TaskSpec(
        name=name,
        env_id=env if isinstance(env, str) else name,
        horizon=H,
        episodes_per_update=episodes_per_update,
        discrete=discrete,
        obs_dim=int(probe.observation_space.shape[0]),
        action_dim=int(act.n) if discrete else int(act.shape[0]),
        action_low=low,
        action_high=high,
        success=f"{rule} (custom task, H = {H})",
        shaping="the base env's own reward (dense=True)",
        base_id=_describe(env),
        entry_point=_entry(name, "env", single),
        vector_entry_point=_entry(name, "vector_env", vector),
    )


def register_custom_task(
    name: str,
    env: EnvSource,
    success: Success | None = None,
    horizon: int | None = None,
    episodes_per_update: int = 16,
) -> TaskSpec:
    """Add task ``name``: ``env`` (a Gymnasium id or a factory of new envs) with the outcome ``success``.

    ``success(obs, info, terminated, truncated) -> bool`` defaults to :func:`survived` and ``horizon`` to
    the env's ``max_episode_steps`` (see the module docstring for when it is called and what it sees).
    One env is built here to read the spaces. Registering a name again replaces the earlier task; the
    built-in names are refused. The task lives in this process (a sweep's worker processes, or a later
    ``--resume``, must register it again; a stock Gymnasium id needs nothing).

    Returns the :class:`~sppo_rl.envs.tasks.TaskSpec` that ``get_task(name)`` now returns.
    """
    spec = build_custom_task(name, env, success, horizon, episodes_per_update)
    CUSTOM_TASKS[name] = spec
    _AUTO.discard(name)
    return spec


_AUTO: set[str] = set()  # names in CUSTOM_TASKS that are Gymnasium ids registered on first use


def gym_id(name: str) -> bool:
    """Whether ``name`` is a Gymnasium id ``gymnasium.make`` accepts: ``Id``, or ``module:Id`` (the
    module is imported first, so that it registers ``Id``; one that fails to import is a ``ValueError``)."""
    if not isinstance(name, str) or not name:
        return False
    if ":" in name:
        module, _, env_name = name.partition(":")
        if not module or not env_name:
            return False
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"task {name!r}: cannot import module {module!r} ({e})") from None
        return env_name in gym.registry
    return name in gym.registry


def _refuse_unjudged(name: str) -> None:
    """Refuse a Gymnasium id with no shipped success test (after its horizon and spaces are checked,
    whose refusals come first)."""
    SparseOutcome(name).close()
    raise ValueError(
        f"no success test is known for {name}: pass one with --success ({RULES}; from Python: "
        "success=f, f(obs, info, terminated, truncated) -> bool)"
    )


def custom_task(name: str) -> TaskSpec | None:
    """The custom task ``name``; a stock Gymnasium id (:data:`sppo_rl.envs.stock.STOCK`, also as
    ``module:Id``) is registered on first use with its shipped success test and ``max_episode_steps``;
    any other Gymnasium id is refused in one line (``ValueError``: give a success test, see
    :func:`resolve_task`). None for a name that is no task at all."""
    spec = CUSTOM_TASKS.get(name)
    if spec is None and gym_id(name):
        found = stock_success(name)
        if found is None:
            _refuse_unjudged(name)
        spec = build_custom_task(name, name, found[0], rule=found[1])
        CUSTOM_TASKS[name] = spec
        _AUTO.add(name)
    return spec


def resolve_task(task: str, success: str | None = None) -> TaskSpec:
    """The task a run trains on: :func:`~sppo_rl.envs.tasks.get_task` ``(task)``, or with ``success``
    (a :func:`~sppo_rl.envs.stock.success_rule` name) a Gymnasium id ``task`` judged by that test
    instead (an unregistered spec, so ``get_task(task)`` is unchanged). Built-in and registered tasks
    keep their own test: ``success`` with one of them is refused."""
    from sppo_rl.envs.tasks import _BY_ID, TASKS, get_task

    if success is None:
        return get_task(task)
    if task in TASKS or task in _BY_ID or (task in CUSTOM_TASKS and task not in _AUTO):
        own = get_task(task).success
        raise ValueError(f"--success is for Gymnasium ids; task {task!r} has its own success test ({own})")
    if not gym_id(task):
        get_task(task)  # the unknown-task message
    fn, rule = success_rule(success)
    return build_custom_task(task, task, fn, rule=rule)


LOOKUPS.append(custom_task)
