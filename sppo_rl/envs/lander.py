"""Box2D LunarLander tasks (discrete and continuous engines), horizon 1000.

Success (:func:`landed`): both legs touch the ground and ``|x| < 0.4`` (the observation's normalised
horizontal position; the pad spans ``|x| <= 0.2``). It is judged at two moments:

- when the lander comes to rest (Box2D puts its body to sleep; LunarLander-v3 ends there too): the
  episode ends and ``R = landed``;
- at ``t = H`` if it never came to rest (still firing, sliding): ``R = landed`` on the final state.

Early failure: the lander's body touches the ground (``game_over``) or ``|x| >= 1`` (out of the
screen), exactly the base env's crash test. Shaping (``dense=True``): the LunarLander-v3 reward itself
(potential shaping on position, speed, angle and leg contacts; fuel cost; -100 on a crash, +100 at rest).

The base env draws its engine dispersion from its own generator, seeded by ``reset``: an episode is a
deterministic function of the reset seed and the actions. Box2D is imported only when an environment
is built.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym

from sppo_rl.envs.core import EpisodeEnv, EpisodeSyncVectorEnv

PAD_X = 0.4


def landed(x: float, left_contact: bool, right_contact: bool) -> bool:
    """The success test: both legs on the ground and ``|x| < 0.4``."""
    return bool(left_contact and right_contact and abs(x) < PAD_X)


class SparseLunarLanderEnv(EpisodeEnv):
    """LunarLander-v3 with discrete engines, ``H = 1000``; see the module docstring."""

    horizon = 1000
    continuous: ClassVar[bool] = False
    metadata: ClassVar[dict] = {"render_modes": ["human", "rgb_array"], "render_fps": 50}

    def _make_base(self, render_mode: str | None) -> gym.Env:
        from gymnasium.envs.box2d.lunar_lander import LunarLander

        return LunarLander(render_mode=render_mode, continuous=self.continuous)

    def lander_x(self) -> float:
        """The normalised horizontal position, computed as the base env computes its observation."""
        from gymnasium.envs.box2d.lunar_lander import SCALE, VIEWPORT_W

        half = VIEWPORT_W / SCALE / 2
        return (self.base.lander.position.x - half) / half

    def _judge(self, obs, base_terminated):
        base = self.base
        failed = bool(base.game_over or abs(self.lander_x()) >= 1.0)
        return failed, not base.lander.awake

    def _success(self, obs):
        legs = self.base.legs
        return landed(self.lander_x(), legs[0].ground_contact, legs[1].ground_contact)

    def _shaping(self, before, action, obs, base_reward, failed, ended):
        return base_reward


class SparseLunarLanderContinuousEnv(SparseLunarLanderEnv):
    """LunarLander-v3 with continuous engines (``continuous=True``), ``H = 1000``."""

    continuous = True


class SparseLunarLanderVectorEnv(EpisodeSyncVectorEnv):
    """``N`` :class:`SparseLunarLanderEnv` episodes in lock step; ended ones are not simulated."""

    env_class = SparseLunarLanderEnv


class SparseLunarLanderContinuousVectorEnv(EpisodeSyncVectorEnv):
    """``N`` :class:`SparseLunarLanderContinuousEnv` episodes in lock step; ended ones are not simulated."""

    env_class = SparseLunarLanderContinuousEnv
