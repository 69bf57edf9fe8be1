"""A*-PO's stage 1 in the LLM world: ``V*`` of every training prompt, from ``k`` samples of the reference.

- **Reference** ``pi_ref``: the actor at its initial weights (the run's start: the warm start, or the
  model as loaded), which is also the frozen KL reference the build keeps (:mod:`sppo_rl.llm.build`) and
  whose log-probs the learner's regression reads (``batch.ref_logp``).
- **Stage 1** (:func:`estimate`, once, before update 1; never on resume): ``k = --astar-samples``
  responses to every training prompt from the run's rollout at the initial weights and its sampling
  settings, ``--prompts-per-step`` prompts per generation call, prompt ``i``'s samples seeded by its
  training-set index (base -3; updates use their index, validation -1, the critic trace -2); scored with
  the run's :class:`~sppo_rl.llm.stages.score.Scoring`; ``V*_i = beta1 log mean_j exp(r_ij / beta1)``
  (:func:`~sppo_rl.agents.rivals.optimal_value`) over the prompt's *valid* scores (a failed verification is
  left out, as everywhere); a prompt with no valid score gets ``V* = 0``.
- **Table** (:class:`VStarOrder`, in place of :class:`~sppo_rl.llm.stages.collect.PromptOrder`: the data
  order is the same): ``V*`` per training-set index, kept with the order's state, so it is in every
  checkpoint (:meth:`VStarOrder.state`) and a resumed run reads it back instead of sampling again.
- **Advantage** (:func:`optimal_values`): each row's ``V*`` of its prompt as ``batch.optimal_values`` for
  the ``astar-po`` estimator (``A = R - V*``).
- **Cost** (:func:`begin`): stage 1's generated tokens, its rollout FLOPs
  (:func:`~sppo_rl.llm.models.flops.rollout`: each prompt's prefill and every sample's decode) and its
  seconds are counted in the run's totals from update 1 on (``generated_tokens``, ``flops_rollout``,
  ``wall_time_s``).

One process only (the table is estimated on one rank).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sppo_rl.agents.rivals import optimal_value
from sppo_rl.llm.data.files import Example, render_prompt
from sppo_rl.llm.models import flops as F
from sppo_rl.llm.stages.collect import PromptOrder, Sampler
from sppo_rl.llm.stages.score import Scoring

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from sppo_rl.llm.plan import Plan
    from sppo_rl.llm.stages.to_batch import UpdateBatch
    from sppo_rl.llm.trainer import RunState

STAGE1_BASE = -3
"""The sampling seeds' base of stage 1 (:func:`~sppo_rl.llm.stages.collect.prompt_seeds`)."""


class VStarOrder(PromptOrder):
    """The plain data order, the prompts it drew last, and the table of ``V*`` by training-set index."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n, seed)
        self.v_star: list[float] | None = None
        self.drawn: list[int] = []

    def draw(self, k: int) -> list[int]:
        self.drawn = super().draw(k)
        return list(self.drawn)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "astar": {"v_star": self.v_star, "drawn": list(self.drawn)}}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.v_star = list(state["astar"]["v_star"])
        self.drawn = list(state["astar"]["drawn"])


@dataclass(frozen=True)
class Estimate:
    """Stage 1's result: ``v_star`` per training-set index and its cost (tokens, rollout FLOPs, seconds)."""

    v_star: list[float]
    generated_tokens: int
    flops: int
    seconds: float


@torch.no_grad()
def estimate(
    train: list[Example],
    sampler: Sampler,
    scoring: Scoring,
    tokenizer: PreTrainedTokenizerBase,
    samples: int,
    beta1: float,
    per_call: int,
    shape: F.Shape,
) -> Estimate:
    """Stage 1 (see the module docstring): ``samples`` responses to each of ``train``'s prompts,
    ``per_call`` prompts per generation call, scored; ``V*`` per prompt at ``beta1``."""
    t0 = time.perf_counter()
    v_star: list[float] = []
    tokens = flops = 0
    for lo in range(0, len(train), per_call):
        examples = train[lo : lo + per_call]
        prompts = [render_prompt(e, tokenizer) for e in examples]
        rb = sampler.sample(prompts, samples, STAGE1_BASE, list(range(lo, lo + len(examples))))
        rows = [examples[int(i)] for i in rb.prompt_index]
        s = scoring(rb.texts, [e.answer for e in rows], rows)
        R, valid = s.R.double().view(len(examples), samples), s.valid.view(len(examples), samples)
        for r, ok in zip(R, valid, strict=True):
            v_star.append(float(optimal_value(r[ok], beta1)) if bool(ok.any()) else 0.0)
        tokens += int(rb.num_generated_tokens)
        prompt_lengths, response_lengths, n, _ = F.round_lengths(rb, samples)
        flops += F.rollout(shape, prompt_lengths, response_lengths, n)
    return Estimate(v_star, tokens, flops, time.perf_counter() - t0)


def begin(state: RunState, est: Estimate) -> RunState:
    """The run's state before update 1 with stage 1 in it: the table in its order, the cost in its totals
    (``state``: over a :class:`VStarOrder`)."""
    if not isinstance(state.order, VStarOrder):
        raise TypeError("A*-PO's run state draws its prompts with a VStarOrder")
    state.order.v_star = list(est.v_star)
    flops = {**state.flops, "rollout": state.flops["rollout"] + est.flops}
    return dataclasses.replace(
        state,
        generated_tokens=state.generated_tokens + est.generated_tokens,
        flops=flops,
        elapsed=state.elapsed + est.seconds,
    )


def stage_one(
    state: RunState,
    plan: Plan,
    train: list[Example],
    sampler: Sampler,
    scoring: Scoring,
    tokenizer: PreTrainedTokenizerBase,
    shape: F.Shape,
) -> RunState:
    """Stage 1 of a fresh run (:func:`estimate` at ``plan``'s settings, ``--prompts-per-step`` prompts per
    call; ``shape``: the actor's, for the FLOPs), then :func:`begin`: the trainer's state before update 1."""
    a = plan.astar
    if a is None:
        raise RuntimeError(f"{plan.algo.name} has no A*-PO stage 1")
    per_call = plan.rollout.prompts_per_step
    return begin(state, estimate(train, sampler, scoring, tokenizer, a.samples, a.beta1, per_call, shape))


def optimal_values(order: VStarOrder, prepared: UpdateBatch) -> dict[str, float]:
    """Put each row's ``V*`` (its prompt's) into the update's batch; returns the metric ``astar_v_star``
    (the batch's mean ``V*``)."""
    if order.v_star is None:
        raise RuntimeError("A*-PO's V* is estimated before update 1 (sppo_rl.llm.stages.vstar.estimate)")
    batch = prepared.batch
    table = order.v_star
    v = [table[order.drawn[int(i)]] for i in prepared.rb.prompt_index.tolist()]
    batch.optimal_values = torch.tensor(v, dtype=torch.float64).to(batch.mask.device, batch.mask.dtype)
    return {"astar_v_star": sum(v) / max(len(v), 1)}
