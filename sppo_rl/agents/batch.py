"""The one object every algorithm sees: a padded batch of sequences.

A control episode and an LLM response are the same thing here: a sequence of positions (steps or
tokens) that starts from a context (the initial observation or the prompt) and earns one outcome
reward at its end. Sequences are right-padded to ``[B, T]``; ``mask`` is 1 on real positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass
class SequenceBatch:
    """A padded batch of ``B`` sequences of at most ``T`` positions.

    Attributes:
        mask: ``[B, T]`` float, 1.0 on valid positions, 0.0 on padding (right padding).
        logp_old: ``[B, T]`` log-probability of each taken action under the policy before the update,
            or None: the learner's single on-policy pass fills it (see
            :func:`~sppo_rl.agents.learner.ppo_update`).
        rewards: ``[B]`` outcome reward of each sequence (``R``; binary in RLVR).
        group_ids: ``[B]`` long; sequences sharing a context (same prompt / same reset seed) share an id.
        values: ``[B, T]`` per-position critic outputs, or ``[B]`` per-sequence critic outputs, or None.
        baseline_rewards: ``[B]`` reward of the greedy rollout of the same context (ReMax), or None.
        token_rewards: ``[B, T]`` reward per position; by default the outcome sits on the last valid
            position. KL-in-reward penalties are added here.
        ref_logp: ``[B, T]`` log-probs under the reference policy, for a KL term in the loss, or None.
        logp_rollout: ``[B, T]`` the sampler's own log-probs ``mu`` (e.g. vLLM's), for truncated
            importance sampling and the mismatch statistics, or None.
        advantages: ``[B, T]``, filled by an estimator.
        returns: critic targets, ``[B, T]`` or ``[B]``, filled by an estimator.
        loss_mask: ``[B, T]`` positions the policy loss is taken over: ``mask`` itself, or the subset
            an algorithm's selector keeps (e.g. BPPO's prefixes); filled with the advantages.
        valid: ``[B]`` bool, False for a sequence whose outcome is unknown (its verification failed:
            the verifier raised, timed out, crashed or returned no score in ``[0, 1]``), or None: every
            sequence is valid (the control world always). An invalid sequence is neither a success nor a
            failure: it gets advantage 0 and no loss (its ``loss_mask`` row is 0), and it is left out of
            every statistic an estimator computes (group mean / std / leave-one-out baselines, batch
            whitening) and of the critic's targets (see
            :func:`~sppo_rl.agents.algorithms.compute_advantages` and ``critic_loss``).
        tracker_values: ``[B]`` a per-context value tracker's estimate for each sequence's context,
            read before this batch's outcomes enter it (SPO's ``p_hat``), or None.
        optimal_values: ``[B]`` the optimal value ``V*`` of each sequence's context, estimated before
            training from the reference policy (A*-PO), or None.
    """

    mask: Tensor
    logp_old: Tensor | None
    rewards: Tensor
    group_ids: Tensor | None = None
    values: Tensor | None = None
    baseline_rewards: Tensor | None = None
    token_rewards: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    loss_mask: Tensor | None = None
    ref_logp: Tensor | None = None
    logp_rollout: Tensor | None = None
    valid: Tensor | None = None
    tracker_values: Tensor | None = None
    optimal_values: Tensor | None = None

    def __post_init__(self) -> None:
        if self.mask.dim() != 2:
            raise ValueError(f"mask must be [B, T], got shape {tuple(self.mask.shape)}")
        self.mask = self.mask.to(self.logp_old.dtype if self.logp_old is not None else torch.float32)
        if self.logp_old is not None and self.logp_old.shape != self.mask.shape:
            raise ValueError(f"logp_old {tuple(self.logp_old.shape)} != mask {tuple(self.mask.shape)}")
        if self.rewards.shape != (self.mask.shape[0],):
            raise ValueError(f"rewards must be [B]={self.mask.shape[0]}, got {tuple(self.rewards.shape)}")
        if self.token_rewards is None:
            self.token_rewards = terminal_rewards(self.rewards, self.mask)
        if self.valid is not None:
            if self.valid.shape != (self.mask.shape[0],):
                raise ValueError(f"valid must be [B]={self.mask.shape[0]}, got {tuple(self.valid.shape)}")
            self.valid = self.valid.to(device=self.mask.device, dtype=torch.bool)

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def valid_rows(self) -> Tensor:
        """``[B]`` bool: ``valid``, or all True when it is None."""
        if self.valid is None:
            return torch.ones(self.mask.shape[0], dtype=torch.bool, device=self.mask.device)
        return self.valid

    @property
    def lengths(self) -> Tensor:
        """``[B]`` long: number of valid positions per sequence."""
        return self.mask.sum(-1).long()

    def index(self, idx: Tensor) -> SequenceBatch:
        """The sub-batch of rows ``idx`` (every ``[B, ...]`` field is indexed alike)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value[idx] if isinstance(value, Tensor) else value
        return replace(self, **out)


def terminal_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's outcome on its last valid position: ``r_t = R * [t == len - 1]``.

    Sequences of length 0 get no reward anywhere.
    """
    mask = mask.to(rewards.dtype) if rewards.is_floating_point() else mask.float()
    token_rewards = torch.zeros_like(mask)
    lengths = mask.sum(-1).long()
    rows = torch.nonzero(lengths > 0, as_tuple=True)[0]
    token_rewards[rows, lengths[rows] - 1] = rewards[rows].to(token_rewards.dtype)
    return token_rewards


def pad_sequences(seqs: Sequence[Tensor], pad_value: float = 0.0, length: int | None = None) -> Tensor:
    """Right-pad 1-D or N-D tensors (first dim = time) into ``[B, T, ...]``."""
    T = max((s.shape[0] for s in seqs), default=0) if length is None else length
    if not seqs:
        return torch.zeros(0, T)
    first = seqs[0]
    out = torch.full((len(seqs), T, *first.shape[1:]), pad_value, dtype=first.dtype, device=first.device)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
    return out


def lengths_to_mask(lengths: Tensor, T: int | None = None) -> Tensor:
    """``mask[b, t] = 1.0 if t < lengths[b]``."""
    T = int(lengths.max().item()) if T is None else T
    return (torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]).float()


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, ``[B]``, added to the outcome in the reward:
    ``0`` for ``l <= L - C``; ``factor * ((L - C) - l) / C`` for ``L - C < l <= L``; ``-factor`` past
    ``L`` (``L = max_len``, ``C = buffer``, ``l`` = a response's length in tokens). ``buffer = 0`` is off."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)
    if buffer > max_len:
        raise ValueError(f"the overlong buffer ({buffer}) cannot exceed the length limit ({max_len})")
    soft = max_len - buffer
    n = lengths.to(torch.float32)
    pen = torch.where(n <= soft, torch.zeros_like(n), (soft - n) / buffer)
    return factor * pen.clamp(min=-1.0)
