"""The control testbed: classic tasks recast as RLVR (SPEC.md section 4, paper section 5.3).

Fixed horizon ``H``, deterministic transitions (given the reset seed), reward 0 on every step and the
binary outcome ``R`` on the last, ``gamma = 1``. See :mod:`sppo_rl.envs.core` for the contract shared by
every task and :data:`TASKS` for the table (horizons, success tests, shapings).

- ``gymnasium.make("sppo_rl/SparseHopper-v0", dense=False)``: one episode (the base Gymnasium dynamics);
- ``make_episode_env("hopper", num_envs=N)``: ``N`` episodes in lock step, autoreset disabled, ended
  ones frozen; batched NumPy dynamics for the classic-control tasks. The trainers use this;
- ``gymnasium.make_vec("sppo_rl/SparseHopper-v0", num_envs=N)``: the same batched env with Gymnasium's
  standard autoreset (``AutoresetMode.NEXT_STEP``: an ended sub-env starts a new episode at the next
  step), for code written against Gymnasium's vector API; ``autoreset_mode=AutoresetMode.DISABLED``
  gives the episode mode of ``make_episode_env``.

Importing this package registers the Gymnasium ids; it loads neither MuJoCo nor Box2D.
"""

from __future__ import annotations

from gymnasium.vector import VectorEnv

import sppo_rl.envs.custom  # noqa: E402, F401  (adds custom tasks and Gymnasium ids to get_task)
from sppo_rl.envs.tasks import TASKS, TaskSpec, get_task, register_tasks

__all__ = ["TASKS", "TaskSpec", "get_task", "make_episode_env", "register_tasks"]


def make_episode_env(name: str | TaskSpec, num_envs: int = 1, dense: bool = False) -> VectorEnv:
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


register_tasks()
