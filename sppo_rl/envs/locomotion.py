"""MuJoCo locomotion tasks: Hopper and Walker2d (Gymnasium v5 models), horizon 1000.

Success: the robot stays healthy (as the v5 task defines it: torso height and angle in range, state
finite and bounded) for all ``H`` steps and its torso ends beyond ``x > 1.0`` m. Becoming unhealthy is
an early failure. The torso's ``x`` (``qpos[0]``, excluded from the v5 observation) is appended before
the time left so the success test is a function of the observation. Shaping (``dense=True``): the v5
reward with its forward-velocity term capped at ``SPEED_CAP`` = 1 m/s (healthy bonus + min(v, 1) -
control cost). The success test needs survival for the whole horizon and only 1 m of progress, and the
uncapped v5 reward teaches experts that run fast and fall before step 1000; with the cap, speed beyond
a walking pace earns nothing and staying healthy dominates.

MuJoCo is imported only when an environment is built.
"""

from __future__ import annotations

import math
from typing import ClassVar

import gymnasium as gym

from sppo_rl.envs.core import EpisodeEnv, EpisodeSyncVectorEnv

GOAL_X = 1.0
SPEED_CAP = 1.0


class LocomotionEpisodeEnv(EpisodeEnv):
    """A sparse-outcome episode over a Gymnasium v5 MuJoCo locomotion task (see the module docstring)."""

    horizon = 1000
    extra_low = (-math.inf,)
    extra_high = (math.inf,)
    goal_x: ClassVar[float] = GOAL_X
    metadata: ClassVar[dict] = {"render_modes": ["human", "rgb_array", "depth_array"], "render_fps": 125}

    def _judge(self, obs, base_terminated):
        # the v5 env terminates exactly when it becomes unhealthy (terminate_when_unhealthy=True)
        return base_terminated, False

    def _success(self, obs):
        return bool(self.base.data.qpos[0] > self.goal_x)

    def _before_step(self):
        return float(self.base.data.qpos[0])

    def _shaping(self, before, action, obs, base_reward, failed, ended):
        velocity = (float(self.base.data.qpos[0]) - before) / self.base.dt
        weight = getattr(self.base, "_forward_reward_weight", 1.0)
        return base_reward - weight * velocity + min(velocity, SPEED_CAP)

    def _extra_features(self, obs):
        return (self.base.data.qpos[0],)


class SparseHopperEnv(LocomotionEpisodeEnv):
    """Hopper-v5, ``H = 1000``: healthy throughout and torso ``x > 1.0`` m at the end."""

    def _make_base(self, render_mode: str | None) -> gym.Env:
        from gymnasium.envs.mujoco.hopper_v5 import HopperEnv

        return HopperEnv(render_mode=render_mode)


class SparseWalker2dEnv(LocomotionEpisodeEnv):
    """Walker2d-v5, ``H = 1000``: healthy throughout and torso ``x > 1.0`` m at the end."""

    def _make_base(self, render_mode: str | None) -> gym.Env:
        from gymnasium.envs.mujoco.walker2d_v5 import Walker2dEnv

        return Walker2dEnv(render_mode=render_mode)


class SparseHopperVectorEnv(EpisodeSyncVectorEnv):
    """``N`` :class:`SparseHopperEnv` episodes in lock step; ended ones are not simulated."""

    env_class = SparseHopperEnv


class SparseWalker2dVectorEnv(EpisodeSyncVectorEnv):
    """``N`` :class:`SparseWalker2dEnv` episodes in lock step; ended ones are not simulated."""

    env_class = SparseWalker2dEnv
