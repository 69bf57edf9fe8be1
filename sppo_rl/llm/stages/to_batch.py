"""Stage 3, ``to_batch``: the groups an update trains on as one padded
:class:`~sppo_rl.agents.batch.SequenceBatch`.

- :func:`pick` lays the kept groups' rows out (one round's batch as it came, or rows of several rounds
  concatenated: prompts left-padded to the widest, responses right-padded to the longest kept), with
  DAPO's filler groups and the latent policy's rule (fix (a)) made invalid.
- :func:`to_batch` runs the forward passes that need no gradient -- the actor's log-probs of the sampled
  tokens (``logp_old``, skipped when the update is *fused*: see :attr:`~sppo_rl.llm.plan.Plan.fused`; the
  sampler's own log-probs ``mu`` under ``--off-policy behaviour``),
  the reference's (KL on) and the critic's values (one logit per prompt read at the last prompt token,
  or one value per response token) -- and builds the token rewards: the outcome ``R`` on the last valid
  token, plus DAPO's soft overlong punishment there, minus ``kl_coef * KL_t`` per token when the KL goes
  in the reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sppo_rl.agents.batch import SequenceBatch, overlong_penalty, terminal_rewards
from sppo_rl.agents.learner import Reducer, RowsFn, forward_rows
from sppo_rl.agents.losses import KLEstimator, kl_penalty
from sppo_rl.llm.models.core import sequence_logprobs, shared_prompt_logprobs
from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.llm.stages.collect import Collected

if TYPE_CHECKING:
    from sppo_rl.llm.build import RowsOf
    from sppo_rl.llm.latent.plugin import LatentPolicy
    from sppo_rl.llm.plan import Plan


@dataclass
class KeptRows:
    """The rows an update trains on (this rank's): samples, outcomes, validity, ReMax's baselines, the
    number of informative groups (dynamic sampling) and of rows the latent rule calls invalid."""

    rb: RolloutBatch
    R: Tensor
    valid: Tensor
    baseline: Tensor | None
    informative: int
    latent_invalid: int | None


def cat_rows(parts: list[tuple[RolloutBatch, Tensor]], pad_id: int, prompt_index: Tensor) -> RolloutBatch:
    """Rows ``rows`` of each rollout batch, one after another, in one :class:`RolloutBatch` (on the CPU):
    prompts left-padded to the widest part, responses right-padded or cut to the longest kept response
    (the width every ``[B, T]`` tensor the learner computes from the lengths has), ``prompt_index``
    given."""
    P = max(rb.prompt_ids.shape[1] for rb, _ in parts)
    T = max([1] + [int(rb.response_mask.cpu()[rows].sum(-1).max()) for rb, rows in parts if len(rows)])

    def cat(name: str, width: int, value: float, left: bool) -> Tensor:
        out = []
        for rb, rows in parts:
            x = getattr(rb, name).cpu()[rows]
            x = x if left else x[:, :width]
            gap = width - x.shape[1]
            out.append(F.pad(x, (gap, 0) if left else (0, gap), value=value))
        return torch.cat(out)

    response_mask = cat("response_mask", T, 0, False)
    return RolloutBatch(
        prompt_ids=cat("prompt_ids", P, pad_id, True),
        prompt_mask=cat("prompt_mask", P, 0, True),
        response_ids=cat("response_ids", T, pad_id, False),
        response_mask=response_mask,
        logprobs=cat("logprobs", T, 0.0, False),
        sampling_logprobs=cat("sampling_logprobs", T, 0.0, False),
        texts=[rb.texts[i] for rb, rows in parts for i in rows.tolist()],
        prompt_index=prompt_index,
        finished=torch.cat([rb.finished.cpu()[rows] for rb, rows in parts]),
        num_generated_tokens=int(response_mask.sum()),
    )


def pick(collected: Collected, G: int, pad_id: int, dynamic: bool, latent: LatentPolicy | None) -> KeptRows:
    """The rows of ``collected.groups`` (see the module docstring); ``latent``: the latent policy or None."""
    rounds, groups = collected.rounds, collected.groups
    if groups == [(0, k) for k in range(len(rounds[0].examples))]:
        r0 = rounds[0]
        rb, R, valid, baseline = r0.rb, r0.R, r0.valid, r0.baseline
    else:
        rows = [torch.arange(k * G, (k + 1) * G) for _, k in groups]
        rb = cat_rows(
            [(rounds[i].rb, r) for (i, _), r in zip(groups, rows)],
            pad_id,
            torch.arange(len(groups)).repeat_interleave(G),
        )
        R = torch.cat([rounds[i].R[r] for (i, _), r in zip(groups, rows)])
        valid = torch.cat([rounds[i].valid[r] for (i, _), r in zip(groups, rows)])
        baseline = None
        if rounds[0].baseline is not None:
            baseline = torch.cat([cast(Tensor, rounds[i].baseline)[r] for (i, _), r in zip(groups, rows)])
    informative = sum(int(cast(Tensor, rounds[i].kinds)[k] == 0) for i, k in groups) if dynamic else 0
    if dynamic:  # filler: dropped groups standing in for missing ones, no loss
        valid = valid.clone()
        valid[informative * G :] = False
    latent_invalid = None
    if latent is not None:  # Latent-GRPO fix (a): rollouts that left the latent manifold
        valid, latent_invalid = latent.valid(rb, valid)
    return KeptRows(rb, R, valid, baseline, informative, latent_invalid)


@dataclass
class UpdateBatch:
    """The update's batch and what the later stages read beside it: the samples on the device, the
    rows' costs (prompt + response tokens), the overlong punishment, the KL penalty per token (KL in
    the reward) and the reference's log-probs."""

    batch: SequenceBatch
    rb: RolloutBatch
    lengths: Tensor
    cost: Tensor
    penalty: Tensor
    kl_tok: Tensor | None
    ref_logp: Tensor | None

    def kl_per_token(
        self, logp_old: Tensor | None, estimator: KLEstimator, clamp: float | None = None
    ) -> Tensor | None:
        """``KL_t`` to the reference on the response tokens, for the row: the reward's penalty when the KL
        went in the reward, else ``kl_penalty(logp_old, ref_logp)`` (``logp_old``: the old log-probs the
        update's policy loss used, :attr:`~sppo_rl.agents.learner.Trained.logp_old`, the training pass's
        own when the update was fused; None when the actor was left alone then, or without a reference),
        each value bounded to ``[-clamp, clamp]`` as in :func:`~sppo_rl.agents.losses.kl_penalty`."""
        if self.kl_tok is not None:
            return self.kl_tok
        logp = logp_old
        if self.ref_logp is None or logp is None:
            return None
        return kl_penalty(logp, self.ref_logp, estimator, clamp) * self.batch.mask


@torch.no_grad()
def to_batch(
    p: KeptRows,
    plan: Plan,
    actor: torch.nn.Module,
    ref: torch.nn.Module | None,
    critic: torch.nn.Module | None,
    rows: RowsOf,
    reduction: Reducer,
) -> UpdateBatch:
    """The :class:`SequenceBatch` of ``p`` (see the module docstring). ``rows(rb, model, policy)`` is the
    learner's world callable over rows; ``reduction`` the ranks' reductions on the device; ``ref`` /
    ``critic`` None when off."""
    lcfg, device, update = plan.learner, plan.device, plan.update
    max_new_tokens, overlong = plan.rollout.max_new_tokens, plan.rollout.overlong
    rb = p.rb.to(device)
    mask = rb.response_mask.float()
    lengths, cost = rb.response_lengths.cpu(), (rb.prompt_mask.sum(-1) + rb.response_lengths).cpu()
    actor.eval()
    if update.off_policy == "behaviour":  # the ratio against the sampler's own log-probs mu
        logp_old: Tensor | None = rb.logprobs * mask
    else:
        logp_old = (
            None if update.fused else forward_rows(rows(rb, actor, True), lengths, cost, lcfg, reduction)
        )
    ref_logp = forward_rows(rows(rb, ref, True), lengths, cost, lcfg, reduction) if ref is not None else None
    values = None
    if critic is not None:
        critic.eval()
        values = forward_rows(rows(rb, critic, False), lengths, cost, lcfg, reduction).float()
    R = p.R.to(device)
    token_rewards = terminal_rewards(R, mask)  # plus DAPO's soft overlong punishment, if on
    penalty = overlong_penalty(rb.response_lengths, max_new_tokens, overlong.buffer, overlong.penalty)
    penalty = penalty.to(R.device)
    token_rewards += terminal_rewards(penalty, mask)
    kl_tok = None  # a KL reward is never fused: logp_old is there with a reference
    if update.kl_reward and ref_logp is not None and logp_old is not None:
        kl_tok = kl_penalty(logp_old, ref_logp, update.kl_estimator, update.kl_clamp) * mask
    if kl_tok is not None:
        token_rewards = token_rewards - update.kl_coef * kl_tok
    batch = SequenceBatch(
        mask=mask,
        logp_old=logp_old,
        rewards=R,
        token_rewards=token_rewards,
        group_ids=rb.prompt_index,
        values=values,
        baseline_rewards=p.baseline.to(device) if p.baseline is not None else None,
        ref_logp=ref_logp if update.kl_in == "loss" or lcfg.policy_loss == "regression" else None,
        logp_rollout=rb.logprobs * mask,
        valid=None if bool(p.valid.all()) else p.valid.to(device),
    )
    return UpdateBatch(batch, rb, lengths, cost, penalty, kl_tok, ref_logp)


def rollout_rows(
    rb: RolloutBatch,
    model: nn.Module,
    policy: bool,
    temperature: float,
    device: torch.device,
    shared_prompt: bool = False,
) -> RowsFn:
    """The learner's world callable over rows of ``rb``: ``(rows, T) ->`` a policy's ``(logp, entropy)``
    (actor or reference; ``policy=True``) or a critic's values (either kind: one call signature), on
    those rows cut to their own columns: the prompt's leading all-padding columns and the response
    past ``T`` are dropped, so a micro-batch costs what its own longest row costs. ``shared_prompt``: a
    policy's rows that share a prompt run it once
    (:func:`~sppo_rl.llm.models.core.shared_prompt_logprobs`, where it pays)."""

    def forward(rows: Tensor, T: int) -> tuple[Tensor, Tensor] | Tensor:
        rows = rows.to(device)
        pm = rb.prompt_mask[rows]
        first = int(pm.any(0).float().argmax())
        if policy and shared_prompt:
            shared = shared_prompt_logprobs(
                model, rb.prompt_ids[rows, first:], pm[:, first:], rb.response_ids[rows, :T],
                rb.response_mask[rows, :T], temperature,
            )  # fmt: skip
            if shared is not None:
                return shared
        ids = torch.cat([rb.prompt_ids[rows, first:], rb.response_ids[rows, :T]], 1)
        attn = torch.cat([pm[:, first:], rb.response_mask[rows, :T]], 1)
        return sequence_logprobs(model, ids, attn, T, temperature) if policy else model(ids, attn, T)

    return cast(RowsFn, forward)  # a policy's (logp, entropy) if policy, else a critic's values
