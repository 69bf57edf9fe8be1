"""The task table: one :class:`TaskSpec` per testbed task, looked up by short name or Gymnasium id.

This module imports nothing heavier than NumPy and Gymnasium's registry, so importing ``sppo_rl.envs``
stays fast; MuJoCo and Box2D are loaded only when such an environment is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Backend = Literal["numpy", "mujoco", "box2d"]


@dataclass(frozen=True)
class TaskSpec:
    """What a trainer needs to know about one sparse-outcome task.

    Attributes:
        name: short name (``"hopper"``), used on the command line.
        env_id: registered Gymnasium id (``"sppo_rl/SparseHopper-v0"``).
        horizon: ``H``; every episode ends at step ``H`` at the latest (``terminated=True``).
        episodes_per_update: complete episodes per policy update (SPEC section 4; chosen for the friends).
        discrete: ``True`` for a ``Discrete`` action space.
        obs_dim: observation length, the base task's plus the appended features.
        action_dim: number of actions (discrete) or the action vector's length (continuous).
        action_low, action_high: bounds of a continuous action (float32 arrays), ``None`` if discrete.
        backend: ``"numpy"`` (batched NumPy dynamics), ``"mujoco"`` or ``"box2d"``.
        success: the success test, one line.
        shaping: the dense shaping added with ``dense=True``, one line.
        base_id: the Gymnasium task whose dynamics and reset distribution are used.
        appended: the observation features appended to the base task's (always ending in the time left).
        entry_point, vector_entry_point: ``module:Class`` of the single and the batched environment
            (the latter in episode mode, as ``make_episode_env`` builds it; Gymnasium's ``make_vec``
            goes through :func:`register_tasks`'s entry point, which adds the standard autoreset).
    """

    name: str
    env_id: str
    horizon: int
    episodes_per_update: int
    discrete: bool
    obs_dim: int
    action_dim: int
    action_low: np.ndarray | None = field(default=None, compare=False)
    action_high: np.ndarray | None = field(default=None, compare=False)
    backend: Backend = "numpy"
    success: str = ""
    shaping: str = ""
    base_id: str = ""
    appended: str = "(H - t) / H"
    entry_point: str = ""
    vector_entry_point: str = ""

    def load(self, vector: bool = False) -> Any:
        """The class behind :attr:`entry_point` (or :attr:`vector_entry_point`); imports it lazily."""
        module, attr = (self.vector_entry_point if vector else self.entry_point).split(":")
        return getattr(importlib.import_module(module), attr)


def _box(dim: int, bound: float) -> tuple[np.ndarray, np.ndarray]:
    low = np.full(dim, -bound, dtype=np.float32)
    high = np.full(dim, bound, dtype=np.float32)
    low.flags.writeable = False
    high.flags.writeable = False
    return low, high


_CLASSIC = "sppo_rl.envs.classic"
_TIME = "(H - t) / H"

_SPECS = [
    TaskSpec(
        name="precision-cartpole",
        env_id="sppo_rl/PrecisionCartPole-v0",
        horizon=200,
        episodes_per_update=64,
        discrete=True,
        obs_dim=5,
        action_dim=2,
        success="at t = H: |theta| <= 0.5 deg; the pole never fell (|theta| > 12 deg or |x| > 2.4 ends with 0)",
        shaping="(1 - (theta/12deg)^2/2 - (x/2.4)^2/2) / H per step, + exp(-(theta_H/0.5deg)^2) at t = H",
        base_id="CartPole-v1",
        entry_point=f"{_CLASSIC}:PrecisionCartPoleEnv",
        vector_entry_point=f"{_CLASSIC}:PrecisionCartPoleVectorEnv",
    ),
    TaskSpec(
        name="cartpole",
        env_id="sppo_rl/SparseCartPole-v0",
        horizon=200,
        episodes_per_update=64,
        discrete=True,
        obs_dim=5,
        action_dim=2,
        success="the pole never fell in H = 200 steps (|theta| > 12 deg or |x| > 2.4 ends with 0)",
        shaping="(1 - (theta/12deg)^2/2 - (x/2.4)^2/2) / H per step",
        base_id="CartPole-v1",
        entry_point=f"{_CLASSIC}:SparseCartPoleEnv",
        vector_entry_point=f"{_CLASSIC}:SparseCartPoleVectorEnv",
    ),
    TaskSpec(
        name="short-cartpole",
        env_id="sppo_rl/ShortCartPole-v0",
        horizon=30,
        episodes_per_update=64,
        discrete=True,
        obs_dim=5,
        action_dim=2,
        success="at t = H = 30: |theta| <= 6 deg; the pole never fell (|theta| > 12 deg or |x| > 2.4 ends with 0)",
        shaping="(1 - (theta/12deg)^2/2 - (x/2.4)^2/2) / H per step, + exp(-(theta_H/6deg)^2) at t = H",
        base_id="CartPole-v1",
        entry_point=f"{_CLASSIC}:ShortCartPoleEnv",
        vector_entry_point=f"{_CLASSIC}:ShortCartPoleVectorEnv",
    ),
    TaskSpec(
        name="mountaincar",
        env_id="sppo_rl/SparseMountainCar-v0",
        horizon=1000,
        episodes_per_update=8,
        discrete=True,
        obs_dim=3,
        action_dim=3,
        success="position x >= 0.45 reached (ends the episode at once with 1)",
        shaping="potential Phi(s') - Phi(s), Phi = mechanical energy (v^2/2 + g/3 (1 + sin 3x)) / its value at rest at x = 0.45",
        base_id="MountainCar-v0",
        entry_point=f"{_CLASSIC}:SparseMountainCarEnv",
        vector_entry_point=f"{_CLASSIC}:SparseMountainCarVectorEnv",
    ),
    TaskSpec(
        name="mountaincar-continuous",
        env_id="sppo_rl/SparseMountainCarContinuous-v0",
        horizon=1000,
        episodes_per_update=8,
        discrete=False,
        obs_dim=3,
        action_dim=1,
        action_low=_box(1, 1.0)[0],
        action_high=_box(1, 1.0)[1],
        success="position x >= 0.45 reached (ends the episode at once with 1)",
        shaping="potential Phi(s') - Phi(s), Phi = mechanical energy (v^2/2 + g/3 (1 + sin 3x)) / its value at rest at x = 0.45",
        base_id="MountainCarContinuous-v0",
        entry_point=f"{_CLASSIC}:SparseMountainCarContinuousEnv",
        vector_entry_point=f"{_CLASSIC}:SparseMountainCarContinuousVectorEnv",
    ),
    TaskSpec(
        name="pendulum",
        env_id="sppo_rl/SparsePendulum-v0",
        horizon=1000,
        episodes_per_update=16,
        discrete=False,
        obs_dim=4,
        action_dim=1,
        action_low=_box(1, 2.0)[0],
        action_high=_box(1, 2.0)[1],
        success="at t = H: cos(theta) > 0.8 (within ~37 deg of upright)",
        shaping="upright cost of Pendulum-v1 scaled to [-1, 0]: -(theta^2 + 0.1 thdot^2 + 0.001 u^2) / 16.2736 per step",
        base_id="Pendulum-v1",
        entry_point=f"{_CLASSIC}:SparsePendulumEnv",
        vector_entry_point=f"{_CLASSIC}:SparsePendulumVectorEnv",
    ),
    TaskSpec(
        name="acrobot",
        env_id="sppo_rl/SparseAcrobot-v0",
        horizon=500,
        episodes_per_update=16,
        discrete=True,
        obs_dim=7,
        action_dim=3,
        success="tip height -cos(q1) - cos(q1 + q2) > 1 reached (ends the episode at once with 1)",
        shaping="-1 / H per step that does not reach the goal (Acrobot-v1's step cost, scaled)",
        base_id="Acrobot-v1",
        entry_point=f"{_CLASSIC}:SparseAcrobotEnv",
        vector_entry_point=f"{_CLASSIC}:SparseAcrobotVectorEnv",
    ),
    TaskSpec(
        name="hopper",
        env_id="sppo_rl/SparseHopper-v0",
        horizon=1000,
        episodes_per_update=8,
        discrete=False,
        obs_dim=13,
        action_dim=3,
        action_low=_box(3, 1.0)[0],
        action_high=_box(3, 1.0)[1],
        backend="mujoco",
        success="healthy for all H = 1000 steps and torso x > 1.0 m at the end (unhealthy ends with 0)",
        shaping="the Hopper-v5 reward: forward velocity + 1 healthy - 1e-3 |a|^2",
        base_id="Hopper-v5",
        appended=f"torso x (qpos[0]), {_TIME}",
        entry_point="sppo_rl.envs.locomotion:SparseHopperEnv",
        vector_entry_point="sppo_rl.envs.locomotion:SparseHopperVectorEnv",
    ),
    TaskSpec(
        name="walker2d",
        env_id="sppo_rl/SparseWalker2d-v0",
        horizon=1000,
        episodes_per_update=8,
        discrete=False,
        obs_dim=19,
        action_dim=6,
        action_low=_box(6, 1.0)[0],
        action_high=_box(6, 1.0)[1],
        backend="mujoco",
        success="healthy for all H = 1000 steps and torso x > 1.0 m at the end (unhealthy ends with 0)",
        shaping="the Walker2d-v5 reward: forward velocity + 1 healthy - 1e-3 |a|^2",
        base_id="Walker2d-v5",
        appended=f"torso x (qpos[0]), {_TIME}",
        entry_point="sppo_rl.envs.locomotion:SparseWalker2dEnv",
        vector_entry_point="sppo_rl.envs.locomotion:SparseWalker2dVectorEnv",
    ),
    TaskSpec(
        name="lunarlander",
        env_id="sppo_rl/SparseLunarLander-v0",
        horizon=1000,
        episodes_per_update=16,
        discrete=True,
        obs_dim=9,
        action_dim=4,
        backend="box2d",
        success="both legs in contact and |x| < 0.4, judged when the lander comes to rest or at t = H "
        "(body contact or |x| >= 1 ends with 0)",
        shaping="the LunarLander-v3 reward: potential shaping, fuel cost, -100 crash / +100 at rest",
        base_id="LunarLander-v3",
        entry_point="sppo_rl.envs.lander:SparseLunarLanderEnv",
        vector_entry_point="sppo_rl.envs.lander:SparseLunarLanderVectorEnv",
    ),
    TaskSpec(
        name="lunarlander-continuous",
        env_id="sppo_rl/SparseLunarLanderContinuous-v0",
        horizon=1000,
        episodes_per_update=16,
        discrete=False,
        obs_dim=9,
        action_dim=2,
        action_low=_box(2, 1.0)[0],
        action_high=_box(2, 1.0)[1],
        backend="box2d",
        success="both legs in contact and |x| < 0.4, judged when the lander comes to rest or at t = H "
        "(body contact or |x| >= 1 ends with 0)",
        shaping="the LunarLander-v3 (continuous) reward: potential shaping, fuel cost, -100 crash / +100 at rest",
        base_id="LunarLander-v3 (continuous=True)",
        entry_point="sppo_rl.envs.lander:SparseLunarLanderContinuousEnv",
        vector_entry_point="sppo_rl.envs.lander:SparseLunarLanderContinuousVectorEnv",
    ),
]

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}
"""Every testbed task by short name, in a fixed order (the paper's five first within each family)."""

_BY_ID = {spec.env_id: spec for spec in _SPECS}


LOOKUPS: list[Callable[[str], TaskSpec | None]] = []
"""Where :func:`get_task` looks for a name that is no built-in task, in order: importing :mod:`sppo_rl.envs`
adds :func:`sppo_rl.envs.custom.custom_task` (the tasks of ``register_custom_task`` and Gymnasium ids)."""


def get_task(name: str | TaskSpec) -> TaskSpec:
    """The :class:`TaskSpec` of a short name (``"hopper"``) or Gymnasium id (``"sppo_rl/SparseHopper-v0"``),
    of a task added with :func:`sppo_rl.envs.custom.register_custom_task`, or of a stock Gymnasium id
    (``Id`` or ``module:Id``) judged by its shipped success test (:mod:`sppo_rl.envs.stock`).

    An unknown name raises ``ValueError`` listing the valid names; a Gymnasium id with no shipped test,
    one saying to give a success test.
    """
    if isinstance(name, TaskSpec):
        return name
    spec = TASKS.get(name) or _BY_ID.get(name)
    for lookup in LOOKUPS if spec is None else ():  # a task of register_custom_task, or a Gymnasium id
        spec = lookup(name)
        if spec is not None:
            break
    if spec is None:
        raise ValueError(
            f"unknown task {name!r}; valid: {', '.join(TASKS)} (or their ids: {', '.join(_BY_ID)}), a "
            "Gymnasium id (Id or module:Id) with a max_episode_steps, or a name added with "
            "sppo_rl.register_custom_task"
        )
    return spec


def _vector_creator(spec: TaskSpec) -> Callable[..., Any]:
    """The ``vector_entry_point`` registered for ``spec``: ``gymnasium.make_vec`` calls it."""

    def create(num_envs: int = 1, autoreset_mode: Any = None, **kwargs: Any) -> Any:
        from sppo_rl.envs.core import make_vector_env

        return make_vector_env(spec.load(vector=True), num_envs, autoreset_mode=autoreset_mode, **kwargs)

    create.__name__ = create.__qualname__ = vector_creator_name(spec)
    create.__module__ = __name__
    create.__doc__ = (
        f"``{spec.env_id}`` batched: :class:`{spec.vector_entry_point.replace(':', '.')}` with "
        "Gymnasium's next-step autoreset, or episode mode with ``autoreset_mode=AutoresetMode.DISABLED`` "
        "(:func:`sppo_rl.envs.core.make_vector_env`)."
    )
    return create


def vector_creator_name(spec: TaskSpec) -> str:
    """Name in this module of the function behind ``spec``'s registered Gymnasium vector entry point."""
    return "make_vec_" + spec.name.replace("-", "_")


# One module-level function per task, so each Gymnasium vector entry point is a plain string.
for _spec in _SPECS:
    globals()[vector_creator_name(_spec)] = _vector_creator(_spec)
del _spec


def register_tasks() -> None:
    """Register every task with Gymnasium (idempotent); called when ``sppo_rl.envs`` is imported.

    ``entry_point`` is the single episode env (``gymnasium.make``). The ``vector_entry_point`` (what
    ``gymnasium.make_vec`` uses by default) gives the batched env with Gymnasium's standard next-step
    autoreset; pass ``autoreset_mode=AutoresetMode.DISABLED`` for the episode mode of
    ``make_episode_env`` (ended sub-envs frozen), which is what :attr:`TaskSpec.vector_entry_point` names.
    No ``max_episode_steps`` is registered: the environments end themselves at ``H`` with
    ``terminated=True`` (a TimeLimit would also set ``truncated``).
    """
    import gymnasium

    for spec in _SPECS:
        if spec.env_id in gymnasium.registry:
            continue
        gymnasium.register(
            id=spec.env_id,
            entry_point=spec.entry_point,
            vector_entry_point=f"{__name__}:{vector_creator_name(spec)}",
            nondeterministic=False,
        )


def make_episode_env(name: str | TaskSpec, num_envs: int = 1, dense: bool = False) -> Any:
    """``num_envs`` episodes of task ``name`` (short name or Gymnasium id) as one vector env.

    ``reset(seed=[...])`` takes one seed per sub-env (the same seed gives the same ``s_0``) or an int
    ``s`` (sub-env ``i`` gets ``s + i``); ``step(actions)`` takes ``[N]`` int64 (discrete) or
    ``[N, action_dim]`` float32 actions, clipped to the action space. Observations are float32
    ``[N, obs_dim]``. Autoreset is disabled: an ended sub-env is frozen (last observation, reward 0,
    ``terminated=True``) until the next ``reset``. ``info["success"]`` is a bool ``[N]`` array, the
    outcome of every sub-env that has ended; ``info["ended"]`` marks those that ended at this step.
    """
    spec = get_task(name)
    env = spec.load(vector=True)(num_envs=num_envs, dense=dense)
    return env
