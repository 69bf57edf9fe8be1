"""A*-PO in the control world: ``V*`` of each start state of a fixed pool, from ``k`` reference episodes.

A control task draws a fresh start state for every episode, so a per-state table would never be read
twice; A*-PO's contexts here are the fixed pool of ``--spo-contexts`` start-state seeds that SPO uses
(:func:`~sppo_rl.control.spo.pool_seeds`, drawn once from the run seed). Each update draws
``contexts_per_update`` of them uniformly without replacement (A*-PO samples prompts as the data order
does: no prioritisation) and runs one episode from each.

- **Reference** ``pi_ref``: a frozen copy of the initial actor (after a warm start, the warm start; its
  observation statistics frozen as they were), kept beside the actor; the learner's regression reads its
  log-probs of the sampled actions (``batch.ref_logp``).
- **Stage 1** (:meth:`ReferenceValues.estimate`, at the start of the run, before update 1): ``k =
  --astar-samples`` sampled episodes of ``pi_ref`` from every pool state, ``V*(s) = beta1 log mean_i
  exp(R_i / beta1)`` (:func:`~sppo_rl.agents.rivals.optimal_value`), ``R_i`` the episode's return (its
  success on a sparse task), from its own generator (seeded from the run seed), so the training's
  randomness is the same as without it. Their env steps are counted in the run's ``env_steps`` (compute
  spent, as ReMax's greedy episodes are); they are not training episodes.

The table, the reference's weights and the stage's env steps are in the checkpoint
(:meth:`ReferenceValues.state_dict`): a resumed run never re-estimates.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.rivals import optimal_value
from sppo_rl.control.networks import Actor
from sppo_rl.control.rollout import collect
from sppo_rl.control.spo import pool_seeds


class ReferenceValues:
    """The pool, the frozen reference and the table of ``V*`` (see the module docstring)."""

    def __init__(self, pool_size: int, seed: int, actor: Actor) -> None:
        self.seeds = pool_seeds(pool_size, seed)
        self.reference = copy.deepcopy(actor).eval().requires_grad_(False)
        self.reference.norm.frozen.fill_(True)
        self.v_star: Tensor | None = None  # [pool] float64, None until stage 1 ran
        self.env_steps = 0  # stage 1's

    def draw(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` distinct pool indices, uniformly."""
        return rng.choice(len(self.seeds), size=k, replace=False)

    @torch.no_grad()
    def estimate(self, env: Any, horizon: int, samples: int, beta1: float, seed: int) -> None:
        """Stage 1: ``samples`` episodes of the reference from every pool state, in rounds of
        ``env.num_envs`` episodes (the last round filled with repeats, left out), then ``V*`` per state."""
        n = env.num_envs
        rows = np.repeat(self.seeds, samples)
        gen = torch.Generator().manual_seed(seed + 3)
        returns = torch.zeros(len(rows), dtype=torch.float64)
        steps = 0
        for start in range(0, len(rows), n):
            chunk = rows[start : start + n]
            used = len(chunk)
            if used < n:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], n - used)])
            ep = collect(env, self.reference, chunk, horizon, None, gen)
            returns[start : start + used] = (ep.rewards * ep.mask).sum(-1)[:used].double()
            steps += int(ep.lengths[:used].sum())
        self.v_star = optimal_value(returns.view(len(self.seeds), samples), beta1)
        self.env_steps = steps

    def values(self, contexts: list[int]) -> Tensor:
        """``[len(contexts)]`` float64: each pool state's ``V*``."""
        if self.v_star is None:
            raise RuntimeError("V* is estimated before update 1 (ReferenceValues.estimate)")
        return self.v_star[torch.as_tensor(contexts, dtype=torch.long)]

    def state_dict(self) -> dict[str, Any]:
        return {
            "v_star": self.v_star,
            "reference_arch": self.reference.arch(),
            "reference": self.reference.state_dict(),
            "env_steps": self.env_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.v_star = state["v_star"]
        if state["reference_arch"] != self.reference.arch():
            self.reference = Actor(**state["reference_arch"]).eval().requires_grad_(False)
        self.reference.load_state_dict(state["reference"])
        self.env_steps = int(state["env_steps"])
