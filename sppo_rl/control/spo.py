"""SPO's value tracker in the control world: one context per start state of a fixed pool.

A control task draws a fresh start state for every episode (a reset seed out of 2^31), so no start state
recurs and a per-state tracker would never see one twice. SPO's contexts here are a fixed pool of
``--spo-contexts`` start-state seeds, drawn once from the run seed; each update draws
``contexts_per_update`` of them without replacement, with probability proportional to the tracker's
``sqrt(p_hat (1 - p_hat)) + 0.05`` (:meth:`~sppo_rl.agents.rivals.ValueTracker.sampling_weights`), and
runs one episode from each.

The discount of a revisited start state is SPO's KL-adaptive one: ``D`` = the mean over the steps of the
state's last episode of ``|log pi_then(a_t | s_t) - log pi_now(a_t | s_t)|`` (its log-probs when it was
sampled against the policy that samples this update), ``rho = clip(2^(-D / 0.06), 0.875, 0.96)``; a state
never seen has ``D = 0`` (``rho = 0.96``, as the recipe's first visit). The pool's seeds follow from the run
seed; the tracker and every state's last episode are in the checkpoint (:meth:`StartStates.state_dict`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.rivals import ValueTracker, spo_discount


def pool_seeds(pool_size: int, seed: int) -> np.ndarray:
    """The fixed pool's ``pool_size`` reset seeds, drawn once from the run seed (SPO's and A*-PO's pool)."""
    return np.random.default_rng([seed, 0x5B0]).integers(0, 2**31 - 1, size=pool_size)


class StartStates:
    """The pool, the tracker and each start state's last episode (see the module docstring)."""

    def __init__(self, pool_size: int, seed: int) -> None:
        self.seeds = pool_seeds(pool_size, seed)
        self.tracker = ValueTracker()
        self.last: dict[
            int, tuple[Tensor, Tensor, Tensor]
        ] = {}  # context -> (obs, actions, logp) of valid steps

    def draw(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` distinct pool indices, drawn with probability proportional to the sampling weights."""
        w = self.tracker.sampling_weights(list(range(len(self.seeds)))).numpy()
        return rng.choice(len(self.seeds), size=k, replace=False, p=w / w.sum())

    @torch.no_grad()
    def distances(self, actor: Any, contexts: list[int]) -> list[float]:
        """``D`` of each context: how far ``actor`` moved on the context's last episode (0: never seen)."""
        out = []
        for c in contexts:
            if c not in self.last:
                out.append(0.0)
                continue
            obs, actions, logp = self.last[c]
            now, _ = actor.logp_entropy(obs, actions)
            out.append(float((logp - now).abs().mean()))
        return out

    def observe(self, contexts: list[int], ep: Any, distances: list[float]) -> list[float]:
        """Fold this update's outcomes in (each with its discount) and keep each context's episode;
        returns the discounts ``rho``."""
        rhos = [spo_discount(d) for d in distances]
        self.tracker.update(contexts, ep.success.tolist(), rhos)
        for row, c in enumerate(contexts):
            valid = ep.mask[row] > 0
            self.last[c] = (
                ep.obs[row][valid].clone(),
                ep.actions[row][valid].clone(),
                ep.logp[row][valid].clone(),
            )
        return rhos

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict(), "last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.last = {int(k): v for k, v in state["last"].items()}
