"""Stage 4, ``advantages``: the algorithm's estimator fills ``advantages``, ``returns`` and ``loss_mask``
(:func:`~sppo_rl.agents.algorithms.compute_advantages`, with the estimator's parameters of the plan),
checked finite; then DAPO's overlong filter, when on, takes the rows cut at ``--max-new-tokens`` (no stop
token) out of the loss: ``loss_mask <- loss_mask * (1 - cut)`` per row and ``A <- A * loss_mask`` (their
group statistics still counted them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from sppo_rl.agents.algorithms import compute_advantages
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.runtime.run import check_finite

if TYPE_CHECKING:
    from sppo_rl.llm.plan import Plan


def advantages(batch: SequenceBatch, plan: Plan, finished: Tensor, update: int) -> None:
    """Fill ``batch``'s advantages for update ``update`` (1-based, named in a non-finite error);
    ``finished``: ``[B]`` bool, the response ended with a stop token."""
    compute_advantages(batch, plan.algo, **plan.estimator)
    check_finite(update, advantages=batch.advantages)
    assert batch.loss_mask is not None and batch.advantages is not None  # compute_advantages filled them
    if plan.rollout.overlong.filter:  # a truncated response teaches nothing about its (unseen) answer
        cut = ~finished.to(batch.mask.device)
        batch.loss_mask = batch.loss_mask * (~cut).to(batch.mask.dtype)[:, None]
        batch.advantages = batch.advantages * batch.loss_mask
