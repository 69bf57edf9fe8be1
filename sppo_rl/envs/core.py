"""The sparse-outcome episode contract every testbed task follows, and its two vector forms.

An episode runs at most ``H`` steps. Every step's reward is 0 except the last one's, which is the
outcome ``R`` in ``{0, 1}``:

- an *early failure* (the pole fell, the robot became unhealthy, the lander crashed) ends the episode
  at once with ``R = 0``;
- a task may *decide early* (MountainCar reached the flag, the lander came to rest): the episode ends
  there and ``R`` is the success test on that state;
- otherwise the episode ends at ``t = H`` and ``R`` is the success test on the final state.

Every end is ``terminated=True`` (never ``truncated``: the outcome is decided) and carries
``info["success"]`` (bool) and ``info["failed"]`` (bool, early failure). With ``dense=True`` the reward
is ``R`` on the last step plus a per-task shaping term on every step; dynamics, termination and
``info["success"]`` are unchanged. Observations are the base task's, cast to float32, followed by
per-task features the success test needs and, last, the normalised time left ``(H - t) / H``.

Vector forms (``make_episode_env``) run ``N`` such episodes in lock step with autoreset disabled: an
ended sub-environment is frozen (not simulated any more; it returns its last observation, reward 0
and ``terminated=True``) until ``reset`` revives it. Their ``info`` holds ``[N]`` arrays: ``success``
and ``failed`` (the outcome of every ended sub-env, False while running), ``ended`` (True only on the
step where the sub-env ended) and ``length`` (steps taken so far). ``gymnasium.make_vec(id)`` gives the
same batched dynamics with Gymnasium's default autoreset instead (:class:`NextStepAutoreset`: an ended
sub-env starts a new episode at the next step), or this episode mode with
``autoreset_mode=AutoresetMode.DISABLED`` (see :func:`make_vector_env`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space


def time_left(t: int | np.ndarray, horizon: int) -> np.ndarray:
    """``(H - t) / H`` as float32: 1 at reset, 0 at the horizon."""
    return np.asarray((horizon - np.asarray(t)) / horizon, dtype=np.float32)


class TimeLeftObservation(gym.ObservationWrapper):
    """A Gymnasium env's own observation with the time left ``(H - t) / H`` appended as float32, ``t``
    counted from its ``reset`` (which sets it to 0), the episode truncated at ``t = H``: what a policy
    trained on a task that appends only the time left reads (``Policy.wrap``)."""

    def __init__(self, env: gym.Env, horizon: int) -> None:
        super().__init__(env)
        if not isinstance(env.observation_space, spaces.Box) or len(env.observation_space.shape) != 1:
            raise ValueError(f"TimeLeftObservation needs a flat Box observation, got {env.observation_space}")
        if int(horizon) < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.horizon = int(horizon)
        self.t = 0
        self.observation_space = extended_box(env.observation_space, [], [])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        self.t += 1
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated or self.t >= self.horizon, info

    def observation(self, observation: Any) -> np.ndarray:
        own = np.asarray(observation, dtype=np.float32).reshape(-1)
        return np.concatenate([own, time_left(self.t, self.horizon).reshape(1)])


def extended_box(base: spaces.Box, extra_low: Sequence[float], extra_high: Sequence[float]) -> spaces.Box:
    """``base`` as float32, with the extra features' bounds and then the time left's ``[0, 1]`` appended."""
    low = np.concatenate([base.low.astype(np.float32), np.asarray(extra_low, np.float32), [0.0]])
    high = np.concatenate([base.high.astype(np.float32), np.asarray(extra_high, np.float32), [1.0]])
    return spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)


def seed_list(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    """One seed per sub-env: a list is taken as given, an int ``s`` gives ``s + i``, None gives Nones."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(n)]
    seeds = [None if s is None else int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"expected {n} seeds (one per sub-env), got {len(seeds)}")
    return seeds


def reset_mask(options: dict[str, Any] | None, n: int) -> tuple[np.ndarray, dict[str, Any] | None]:
    """Split ``options`` into the ``reset_mask`` (all True when absent) and the rest."""
    if not options or "reset_mask" not in options:
        return np.ones(n, dtype=bool), options
    rest = dict(options)
    mask = np.asarray(rest.pop("reset_mask"))
    if mask.shape != (n,) or mask.dtype != np.bool_ or not mask.any():
        raise ValueError(f"options['reset_mask'] must be a bool array of shape ({n},) with a True entry")
    return mask, rest or None


class EpisodeEnv(gym.Env[np.ndarray, Any]):
    """One sparse-outcome episode over a base Gymnasium environment (see the module docstring).

    The base environment (``self.base``, built directly, without wrappers) supplies the dynamics and
    the reset distribution: ``reset(seed=s)`` seeds it, so the same seed gives the same ``s_0`` as the
    base task. Subclasses say how to build it and define the task through four hooks:
    :meth:`_judge` (early failure / early decision), :meth:`_success`, :meth:`_shaping` and
    :meth:`_extra_features`. Stepping an ended episode raises ``RuntimeError``.
    """

    horizon: ClassVar[int] = 0
    extra_low: ClassVar[tuple[float, ...]] = ()
    extra_high: ClassVar[tuple[float, ...]] = ()
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, dense: bool = False, render_mode: str | None = None) -> None:
        self.dense = bool(dense)
        self.render_mode = render_mode
        self.base = self._make_base(render_mode)
        if isinstance(self.base.action_space, spaces.Box):
            b = self.base.action_space
            self.action_space = spaces.Box(
                b.low.astype(np.float32), b.high.astype(np.float32), dtype=np.float32
            )
        else:
            self.action_space = self.base.action_space
        self.observation_space = extended_box(self.base.observation_space, self.extra_low, self.extra_high)
        self._n_base = int(self.base.observation_space.shape[0])
        self.t = 0
        self.ended = True  # until the first reset

    # ------------------------------------------------------------------ hooks

    def _make_base(self, render_mode: str | None) -> gym.Env:
        raise NotImplementedError

    def _judge(self, obs: np.ndarray, base_terminated: bool) -> tuple[bool, bool]:
        """``(failed, decided)`` after a step: an early failure, or an early decision point."""
        raise NotImplementedError

    def _success(self, obs: np.ndarray) -> bool:
        """The success test, evaluated when the episode ends without an early failure."""
        raise NotImplementedError

    def _before_step(self) -> Any:
        """Whatever :meth:`_shaping` needs from before the step (called only when ``dense``)."""
        return None

    def _shaping(
        self, before: Any, action: Any, obs: np.ndarray, base_reward: float, failed: bool, ended: bool
    ) -> float:
        """The dense shaping term of this step (``dense=True`` only)."""
        raise NotImplementedError

    def _extra_features(self, obs: np.ndarray) -> Sequence[float]:
        """Features appended after the base observation, before the time left."""
        return ()

    def _on_reset(self) -> None:
        """Called after the base environment was reset."""

    # ------------------------------------------------------------------ API

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        out = np.empty(self.observation_space.shape, dtype=np.float32)
        out[: self._n_base] = obs
        extra = self._extra_features(obs)
        if len(extra):
            out[self._n_base : -1] = extra
        out[-1] = (self.horizon - self.t) / self.horizon
        return out

    def _action(self, action: Any) -> Any:
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            if not space.contains(action):
                raise ValueError(f"{action!r} is not a valid action of {space}")
            return int(action)
        a = np.asarray(action, dtype=np.float32)
        if a.shape != space.shape:
            raise ValueError(f"action of shape {a.shape}, expected {space.shape}")
        return np.clip(a, space.low, space.high)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        obs, info = self.base.reset(seed=seed, options=options)
        self.t = 0
        self.ended = False
        self._on_reset()
        return self._observe(obs), info

    def step(self, action: Any):
        if self.ended:
            raise RuntimeError("the episode has ended; call reset()")
        return self.advance(self._action(action))

    def advance(self, action: Any):
        """:meth:`step` with an action already valid (an ``int`` in the space, or a float32 array within
        its bounds), as the vector forms check a whole batch at once; the episode must be running."""
        before = self._before_step() if self.dense else None
        obs, base_reward, base_terminated, _, info = self.base.step(action)
        self.t += 1
        failed, decided = self._judge(obs, bool(base_terminated))
        ended = failed or decided or self.t >= self.horizon
        success = ended and not failed and self._success(obs)
        reward = float(success)
        if self.dense:
            reward += self._shaping(before, action, obs, float(base_reward), failed, ended)
        if ended:
            info["success"] = bool(success)
            info["failed"] = bool(failed)
            self.ended = True
        return self._observe(obs), reward, ended, False, info

    def render(self):
        return self.base.render()

    def close(self) -> None:
        self.base.close()
        super().close()


class EpisodeVectorEnv(VectorEnv):
    """Common state of the vector forms: spaces, per-sub-env clocks, outcomes and frozen flags.

    Subclasses implement :meth:`reset` and :meth:`step` with the semantics of the module docstring.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.DISABLED, "render_modes": []}
    horizon: ClassVar[int] = 0

    def _setup(self, num_envs: int, obs_space: spaces.Box, action_space: spaces.Space, dense: bool) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.dense = bool(dense)
        self.single_observation_space = obs_space
        self.single_action_space = action_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)
        self._discrete = isinstance(action_space, spaces.Discrete)
        n = self.num_envs
        self._obs = np.zeros((n, obs_space.shape[0]), dtype=np.float32)
        self._t = np.zeros(n, dtype=np.int64)
        self._done = np.ones(n, dtype=bool)
        self._success = np.zeros(n, dtype=bool)
        self._failed = np.zeros(n, dtype=bool)
        self._ever_reset = np.zeros(n, dtype=bool)

    def _actions(self, actions: Any) -> np.ndarray:
        """Validate a batch of actions: ``[N]`` integers (discrete) or ``[N, k]`` clipped float32."""
        n = self.num_envs
        space = self.single_action_space
        if self._discrete:
            a = np.asarray(actions)
            if a.shape != (n,):
                a = a.reshape(-1) if a.size == n else a
            if a.shape != (n,) or not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
                raise ValueError(f"expected an integer action array of shape ({n},), got {a.dtype} {a.shape}")
            live = ~self._done
            a = np.where(live, a, 0).astype(np.int64)  # frozen rows' actions are ignored
            if np.any((a < 0) | (a >= space.n)):
                raise ValueError(f"actions must lie in [0, {space.n}), got {a[live]}")
            return a
        a = np.asarray(actions, dtype=np.float32)
        if a.shape != (n, *space.shape):
            if a.size == n * int(np.prod(space.shape)):
                a = a.reshape(n, *space.shape)
            else:
                raise ValueError(f"expected actions of shape ({n}, {space.shape[0]}), got {a.shape}")
        a = np.where(self._done[:, None], np.float32(0.0), a)  # frozen rows' actions are ignored
        return np.clip(a, space.low, space.high)

    def _check_stepping(self) -> None:
        if not self._ever_reset.all():
            raise RuntimeError("call reset() before step(): some sub-envs were never reset")

    def _info(self, ended: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "success": self._success.copy(),
            "failed": self._failed.copy(),
            "ended": ended,
            "length": self._t.copy(),
        }

    def __repr__(self) -> str:
        name = self.spec.id if self.spec is not None else type(self).__name__
        return f"{type(self).__name__}({name}, num_envs={self.num_envs})"


class EpisodeSyncVectorEnv(EpisodeVectorEnv):
    """``N`` single :class:`EpisodeEnv` instances stepped in turn; ended ones are not simulated.

    Used for the MuJoCo and Box2D tasks, whose physics has no batched form. Subclasses set
    :attr:`env_class`.
    """

    env_class: ClassVar[type[EpisodeEnv]]

    def __init__(self, num_envs: int = 1, dense: bool = False, render_mode: str | None = None) -> None:
        if render_mode is not None:
            raise ValueError("the episode vector envs do not render; use gymnasium.make for one env")
        self.envs = [self.env_class(dense=dense) for _ in range(num_envs)]
        first = self.envs[0]
        self.horizon = first.horizon
        self._setup(num_envs, first.observation_space, first.action_space, dense)

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        seeds = seed_list(seed, self.num_envs)
        mask, rest = reset_mask(options, self.num_envs)
        for i in np.flatnonzero(mask):
            self._obs[i], _ = self.envs[i].reset(seed=seeds[i], options=rest)
        self._t[mask] = 0
        self._done[mask] = False
        self._success[mask] = False
        self._failed[mask] = False
        self._ever_reset |= mask
        return self._obs.copy(), {}

    def step(self, actions: Any):
        self._check_stepping()
        a = self._actions(actions)
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        ended = np.zeros(n, dtype=bool)
        for i in np.flatnonzero(~self._done):  # the batch was checked: no per-env check
            obs, r, term, _, info = self.envs[i].advance(int(a[i]) if self._discrete else a[i])
            self._obs[i] = obs
            rewards[i] = r
            self._t[i] += 1
            if term:
                ended[i] = True
                self._done[i] = True
                self._success[i] = info["success"]
                self._failed[i] = info["failed"]
        return self._obs.copy(), rewards, self._done.copy(), np.zeros(n, dtype=bool), self._info(ended)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


class NextStepAutoreset:
    """Gymnasium's default autoreset (``AutoresetMode.NEXT_STEP``) over an episode vector env.

    Mixed in before an :class:`EpisodeVectorEnv` class by :func:`autoreset_class`; what
    ``gymnasium.make_vec(id, num_envs=N)`` builds by default. A sub-env that ends at one ``step`` (its
    outcome in ``rewards`` and ``info["success"]``, ``terminated=True``, as in episode mode) is reset by
    the next ``step``, which ignores its action and returns the first observation of its new episode
    with reward 0 and ``terminated = truncated = False``; ``info`` then reads ``length`` 0 and
    ``success`` / ``failed`` False for it. A new episode continues the sub-env's random stream (a
    ``reset`` without seed), as ``SyncVectorEnv`` does over the single envs, so both give the same
    trajectories. ``reset`` is the episode env's (seeds, ``options["reset_mask"]``).

    The sub-envs that ended at the previous step are exactly those the episode env holds frozen, so
    the mixin keeps no state of its own; the episode env's ``step`` and ``reset`` run unchanged.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}
    autoreset_mode: ClassVar[AutoresetMode] = AutoresetMode.NEXT_STEP

    def step(self, actions: Any):
        pending = self._done.copy()  # ended at the previous step (frozen): reset now, not stepped
        obs, rewards, terminated, truncated, info = super().step(actions)
        if pending.any():
            obs, _ = super().reset(options={"reset_mask": pending})  # no seed: the stream continues
            rewards[pending] = 0.0
            terminated[pending] = False
            truncated[pending] = False
            info = self._info(info["ended"])
        return obs, rewards, terminated, truncated, info


@functools.cache
def autoreset_class(cls: type[EpisodeVectorEnv]) -> type[EpisodeVectorEnv]:
    """``cls`` with :class:`NextStepAutoreset` mixed in (one class per ``cls``, made on first use)."""
    if not (isinstance(cls, type) and issubclass(cls, EpisodeVectorEnv)):
        raise TypeError(f"expected an EpisodeVectorEnv subclass, got {cls!r}")
    return type(
        f"Autoreset{cls.__name__}",
        (NextStepAutoreset, cls),
        {
            "__module__": __name__,
            "__doc__": f"{cls.__name__} with Gymnasium's next-step autoreset.\n\n"
            + (NextStepAutoreset.__doc__ or ""),
        },
    )


def make_vector_env(
    cls: type[EpisodeVectorEnv],
    num_envs: int = 1,
    *,
    autoreset_mode: AutoresetMode | str | None = None,
    **kwargs: Any,
) -> VectorEnv:
    """``num_envs`` sub-envs of the episode vector env class ``cls`` under ``autoreset_mode``.

    ``None`` or ``NEXT_STEP`` (Gymnasium's default): :func:`autoreset_class` of ``cls``.
    ``DISABLED``: ``cls`` itself, the episode mode of ``make_episode_env`` (ended sub-envs frozen until
    ``reset``). ``SAME_STEP`` is not offered here; ``gymnasium.make_vec(id, vectorization_mode="sync",
    vector_kwargs={"autoreset_mode": ...})`` gives it over the single envs. ``kwargs`` go to ``cls``.
    """
    mode = AutoresetMode.NEXT_STEP if autoreset_mode is None else AutoresetMode(autoreset_mode)
    if mode == AutoresetMode.DISABLED:
        return cls(num_envs=num_envs, **kwargs)
    if mode == AutoresetMode.NEXT_STEP:
        return autoreset_class(cls)(num_envs=num_envs, **kwargs)
    raise ValueError(
        f"autoreset_mode {mode} is not supported by the batched envs (NextStep or Disabled); use "
        'gymnasium.make_vec(id, vectorization_mode="sync", vector_kwargs={"autoreset_mode": ...})'
    )
