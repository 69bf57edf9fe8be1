"""Collect complete episodes from an episode vector env and pad them into ``[B, T]`` tensors, from the
start states an update draws (:func:`start_states`).

All sub-envs are reset together with one seed each (a group shares a seed, hence its start state),
then stepped together, one batched policy call per step, until every episode has ended. The env does
not auto-reset (a finished sub-env stays frozen), so no row after an episode's end is ever a
transition; rows past an episode's length are padding and masked out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from sppo_rl.control.networks import Actor
from sppo_rl.control.stack import StackedActor

if TYPE_CHECKING:
    from sppo_rl.control.astar import ReferenceValues
    from sppo_rl.control.plan import Resolved
    from sppo_rl.control.spo import StartStates


@dataclass
class Episodes:
    """A batch of complete episodes, right-padded to ``T`` = the longest.

    ``obs[b, t]`` is the observation at which action ``actions[b, t]`` was taken; ``obs[b, 0]`` is the
    start state ``s_0``. ``rewards`` are the env's per-step rewards (terminal-only for sparse tasks).
    """

    obs: Tensor  # [B, T, obs_dim] float32
    actions: Tensor  # [B, T] long or [B, T, A] float32
    logp: Tensor  # [B, T]
    rewards: Tensor  # [B, T]
    lengths: Tensor  # [B] long
    success: Tensor  # [B] float32 (0/1)
    seeds: np.ndarray  # [B] reset seeds
    greedy: Tensor  # [B] bool

    @property
    def mask(self) -> Tensor:
        T = self.obs.shape[1]
        return (torch.arange(T)[None, :] < self.lengths[:, None]).float()

    @property
    def env_steps(self) -> int:
        return int(self.lengths.sum())

    def rows(self, idx: Tensor | np.ndarray) -> Episodes:
        idx = torch.as_tensor(idx)
        T = int(self.lengths[idx].max()) if len(idx) else 0
        return Episodes(
            obs=self.obs[idx, :T],
            actions=self.actions[idx, :T],
            logp=self.logp[idx, :T],
            rewards=self.rewards[idx, :T],
            lengths=self.lengths[idx],
            success=self.success[idx],
            seeds=self.seeds[idx.numpy()],
            greedy=self.greedy[idx],
        )


@torch.no_grad()
def collect(
    env,
    actor: Actor,
    seeds: np.ndarray,
    horizon: int,
    greedy: np.ndarray | None = None,
    generator: torch.Generator | None = None,
) -> Episodes:
    """Run one episode per sub-env of ``env`` (``env.num_envs == len(seeds)``) to its end.

    Rows with ``greedy[i]`` take the argmax / the mean action (ReMax's baseline rollouts, evaluation).
    One seed's :func:`collect_seeds`, acting with ``actor`` itself.
    """
    return collect_seeds(env, _OneSeed(actor), np.asarray(seeds)[None], horizon, greedy, [generator])[0]


class _OneSeed:
    """An :class:`~sppo_rl.control.networks.Actor` acting as a stack of one seed (:func:`collect_seeds`)."""

    def __init__(self, actor: Actor) -> None:
        self.a, self.discrete, self.action_dim = actor, actor.discrete, actor.action_dim

    def act(
        self, obs: Tensor, greedy: Tensor | None, generators: list, active: list[bool]
    ) -> tuple[Tensor, Tensor]:
        a, logp = self.a.act(obs[0], greedy, generators[0])
        return a[None], logp[None]


@torch.no_grad()
def collect_seeds(
    env,
    actor: StackedActor | _OneSeed,
    seeds: np.ndarray,
    horizon: int,
    greedy: np.ndarray | None = None,
    generators: list[torch.Generator | None] | None = None,
) -> list[Episodes]:
    """:func:`collect` for ``S`` seeds at once: ``seeds [S, n]`` are seed ``k``'s reset seeds in row ``k``,
    run in sub-envs ``k n .. (k + 1) n - 1`` of ``env`` (``S n`` sub-envs), acted on by ``actor`` (a
    :class:`~sppo_rl.control.stack.StackedActor`) with ``generators[k]``; ``greedy [n]`` marks the same
    rows in every seed. A seed acts, drawing from its generator, only while one of its episodes runs, so
    seed ``k``'s :class:`Episodes` (item ``k``) and its generator's state afterwards are those it gets
    collecting alone (a stack of one)."""
    S, n = seeds.shape
    if env.num_envs != S * n:
        raise ValueError(f"env has {env.num_envs} sub-envs but {S * n} seeds were given")
    gens = list(generators) if generators is not None else [None] * S
    greedy_np = np.zeros(n, dtype=bool) if greedy is None else np.asarray(greedy, dtype=bool)
    greedy_t = torch.from_numpy(greedy_np)
    any_greedy = bool(greedy_np.any())
    obs_np, _ = env.reset(seed=[int(s) for s in seeds.reshape(-1)])
    obs_dim = obs_np.shape[1]
    obs_buf = torch.zeros(horizon, S, n, obs_dim)
    act_buf = (
        torch.zeros(horizon, S, n, dtype=torch.long)
        if actor.discrete
        else torch.zeros(horizon, S, n, actor.action_dim)
    )
    logp_buf = torch.zeros(horizon, S, n)
    rew_buf = torch.zeros(horizon, S, n)
    active = np.ones(S * n, dtype=bool)
    lengths = np.zeros(S * n, dtype=np.int64)
    success = np.zeros(S * n, dtype=np.float32)
    for t in range(horizon):
        obs_t = torch.from_numpy(np.asarray(obs_np, dtype=np.float32)).view(S, n, obs_dim)
        obs_buf[t] = obs_t
        running = active.reshape(S, n).any(1).tolist()
        a, logp = actor.act(obs_t, greedy_t if any_greedy else None, gens, running)
        act_buf[t] = a
        logp_buf[t] = logp
        obs_np, rew, term, trunc, info = env.step(a.reshape(S * n, *a.shape[2:]).numpy())
        rew_buf[t] = torch.from_numpy(np.where(active, rew, 0.0).astype(np.float32)).view(S, n)
        lengths += active
        ended = active & (np.asarray(term) | np.asarray(trunc))
        if ended.any():
            success[ended] = np.asarray(info["success"], dtype=np.float32)[ended]
            active &= ~ended
            if not active.any():
                break
    if active.any():
        raise RuntimeError(f"{int(active.sum())} episode(s) did not end within the horizon {horizon}")
    lengths_t = torch.from_numpy(lengths).view(S, n)
    success_t = torch.from_numpy(success).view(S, n)
    out = []
    for k in range(S):
        T = int(lengths_t[k].max())
        valid = (torch.arange(T)[None, :] < lengths_t[k][:, None]).float()  # [n, T]; padding is zeroed below
        actions = act_buf[:T, k].transpose(0, 1)
        out.append(
            Episodes(
                obs=obs_buf[:T, k].transpose(0, 1) * valid[..., None],
                actions=actions * (valid if actor.discrete else valid[..., None]).to(actions.dtype),
                logp=logp_buf[:T, k].transpose(0, 1) * valid,
                rewards=rew_buf[:T, k].transpose(0, 1) * valid,
                lengths=lengths_t[k].clone(),
                success=success_t[k].clone(),
                seeds=np.asarray(seeds[k]),
                greedy=greedy_t,
            )
        )
    return out


@dataclass(frozen=True)
class Rollout:
    """What one update collected: the ``E`` sampled episodes, their group ids, the greedy episodes'
    success per group (ReMax's baseline; None without), SPO's start states (pool indices; empty without
    SPO) and the env steps of every episode, greedy ones included."""

    episodes: Episodes
    groups: np.ndarray
    greedy_success: Tensor | None
    contexts: list[int]
    env_steps: int


def start_states(
    r: Resolved, rng: np.random.Generator, spo: StartStates | ReferenceValues | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """One update's per-row reset seeds, group ids and greedy flags, and SPO's pool indices (empty
    without SPO or A*-PO): ``r.contexts_per_update`` start states drawn from ``rng`` (SPO: from its pool,
    prioritised by its tracker; A*-PO: from the same pool, uniformly), each used ``r.group_size`` times, plus one greedy row each when the
    method asks for ``r.greedy_per_update``."""
    contexts: list[int] = []
    if spo is not None:
        drawn = spo.draw(r.contexts_per_update, rng)
        contexts = [int(c) for c in drawn]
        ctx = spo.seeds[drawn]
    else:
        ctx = rng.integers(0, 2**31 - 1, size=r.contexts_per_update)
    seeds = np.repeat(ctx, r.group_size)
    groups = np.repeat(np.arange(r.contexts_per_update), r.group_size)
    greedy = np.zeros(len(seeds), dtype=bool)
    if r.greedy_per_update:
        seeds = np.concatenate([seeds, ctx])
        groups = np.concatenate([groups, np.arange(r.contexts_per_update)])
        greedy = np.concatenate([greedy, np.ones(r.contexts_per_update, dtype=bool)])
    return seeds, groups, greedy, contexts
