"""The control testbed: classic tasks recast as RLVR (SPEC.md section 4, paper section 5.3).

Fixed horizon ``H``, deterministic transitions (given the reset seed), reward 0 on every step and the
binary outcome ``R`` on the last, ``gamma = 1``. See :mod:`sppo_rl.envs.core` for the contract shared by
every task and :data:`TASKS` for the table (horizons, success tests, shapings).

- ``gymnasium.make("sppo_rl/SparseHopper-v0", dense=False)``: one episode (the base Gymnasium dynamics);
- ``sppo_rl.envs.tasks.make_episode_env("hopper", num_envs=N)``: ``N`` episodes in lock step, autoreset disabled, ended
  ones frozen; batched NumPy dynamics for the classic-control tasks. The trainers use this;
- ``gymnasium.make_vec("sppo_rl/SparseHopper-v0", num_envs=N)``: the same batched env with Gymnasium's
  standard autoreset (``AutoresetMode.NEXT_STEP``: an ended sub-env starts a new episode at the next
  step), for code written against Gymnasium's vector API; ``autoreset_mode=AutoresetMode.DISABLED``
  gives the episode mode of ``make_episode_env``.

Importing this package registers the Gymnasium ids; it loads neither MuJoCo nor Box2D.
"""

from __future__ import annotations

import sppo_rl.envs.custom  # noqa: E402, F401  (adds custom tasks and Gymnasium ids to get_task)
from sppo_rl.envs.tasks import register_tasks  # noqa: E402

register_tasks()
