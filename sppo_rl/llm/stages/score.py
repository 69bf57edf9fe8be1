"""Stage 2, ``score``: responses verified against their references by the reward workers
(:class:`~sppo_rl.llm.rewards.scorer.RewardScorer`, bounded in time per item). A failed verification (raised,
timed out, no number in ``[0, 1]``) scores a 0.0 placeholder and makes its row *invalid*: masked out of
the update and counted in ``invalid_rollouts``. A preemption's grace running out cuts the scoring short;
:func:`give_up_if_cut` then abandons the update (or evaluation) on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from sppo_rl.llm.data.files import Example
from sppo_rl.runtime.run import Preempted, preemption_stop_now

if TYPE_CHECKING:
    from sppo_rl.llm.models.engines import Dist
    from sppo_rl.llm.rewards.scorer import RewardScorer


@dataclass
class Scores:
    """Scores of ``n`` items.

    Attributes:
        R: ``[n]`` float32 outcome (0.0 where invalid).
        valid: ``[n]`` bool, the verifier gave the item a score.
        errors: failed verifications.
        cut: a preemption stopped the scoring before every item was scored.
        fn: ``[k, 3]`` per reward function: the sum of its valid scores, their count, its failures.
    """

    R: Tensor
    valid: Tensor
    errors: int
    cut: bool
    fn: np.ndarray


class Scoring:
    """The run's reward workers, and the first error message of the latest failed verification
    (``last_error``, quoted when the run stops for want of valid rewards)."""

    def __init__(self, scorer: RewardScorer) -> None:
        self.scorer = scorer
        self.last_error: str | None = None

    @property
    def names(self) -> list[str]:
        return self.scorer.names

    def __call__(self, texts: list[str], truths: list[str], examples: list[Example] | None = None) -> Scores:
        """Item ``i`` is ``texts[i]`` against ``truths[i]``; ``examples[i]`` gives TRL-style reward functions
        their ``prompts`` (the data's own: text or chat messages), ``rendered_prompts`` (the text the model
        read: chat template, system prompt and instruction applied) and the data's other columns."""
        columns = None
        if examples is not None:
            columns = [{**e.meta, "prompts": e.data_prompt, "rendered_prompts": e.prompt} for e in examples]
        res = self.scorer.score(texts, truths, stop=preemption_stop_now, columns=columns)
        if res.error_samples:
            self.last_error = res.error_samples[0]
        known = ~np.isnan(res.parts)
        fn = np.stack([np.where(known, res.parts, 0.0).sum(0), known.sum(0), np.array(res.fn_errors)], 1)
        return Scores(
            torch.from_numpy(res.scores.astype(np.float32)),
            torch.from_numpy(res.valid.copy()),
            res.errors,
            res.interrupted > 0,
            fn,
        )

    def close(self) -> None:
        self.scorer.close()


def give_up_if_cut(cut: bool, dist: Dist, device: torch.device) -> None:
    """Raise :class:`Preempted` on every rank if a preemption's grace ran out during any rank's scoring
    (the scores are incomplete: the update or evaluation is redone on resume)."""
    if dist.all_max([float(cut)], device)[0]:
        raise Preempted("reward scoring was cut off by a preemption signal")
