"""What an LLM run measures besides training: validation (mean@k, pass@k, greedy accuracy, a
per-prompt critic's calibration) and the critic trace for the tail-effect diagnostic. Both take the run's
parts they read (:class:`Evaluator`), so that the trainer keeps only the update."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.algorithms import value_units
from sppo_rl.agents.learner import forward_rows
from sppo_rl.llm.data.files import render_prompt
from sppo_rl.llm.rewards.answers import answer_format
from sppo_rl.llm.stages.score import give_up_if_cut
from sppo_rl.runtime.trace import write_trace

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from sppo_rl.agents.algorithms import Algorithm
    from sppo_rl.llm.build import RowsOf, TrainingEngine
    from sppo_rl.llm.data.files import Example
    from sppo_rl.llm.models.engines import Dist
    from sppo_rl.llm.outputs.completions import CompletionLog
    from sppo_rl.llm.plan import Plan
    from sppo_rl.llm.rollout.base import RolloutBatch
    from sppo_rl.llm.stages.collect import Sampler
    from sppo_rl.llm.stages.score import Scoring


@dataclass
class Evaluator:
    """The parts of a run that validation reads.

    Attributes:
        val_set: the validation examples (rendered); plan: the run's :class:`~sppo_rl.llm.plan.Plan`.
        sampler: :class:`~sppo_rl.llm.stages.collect.Sampler`; scoring: :class:`~sppo_rl.llm.stages.score.Scoring`.
        critic_engine: the critic's training engine (None without a critic); rows: the learner's world
            callable ``rows(rb, model, policy)``.
        dist, device, tokenizer: the ranks, the device, the tokenizer; completions: the run's
            :class:`~sppo_rl.llm.outputs.completions.CompletionLog`.
    """

    val_set: list[Example]
    plan: Plan
    sampler: Sampler
    scoring: Scoring
    critic_engine: TrainingEngine | None
    rows: RowsOf
    dist: Dist
    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    completions: CompletionLog

    @property
    def algo(self) -> Algorithm:
        return self.plan.algo


@torch.no_grad()
def evaluate(self: Evaluator, step: int) -> dict[str, Any]:
    """mean@k accuracy and pass@k on the validation split (k = ``eval_samples``, at the rollout
    temperature), greedy accuracy, the format-learning rates of the sampled responses (``val_boxed_rate``,
    ``val_number_rate``: the shares that :func:`~sppo_rl.llm.rewards.answers.answer_format` calls ``"boxed"`` and
    ``"number"``, right or wrong), and for SPPO the critic's calibration against per-prompt mean@k.
    Ranks split the prompts (every ``world``-th) and their sums are added up."""
    if not self.val_set:
        return {}
    k = self.plan.rollout.eval_samples
    mine = list(range(self.dist.rank, len(self.val_set), self.dist.world))
    rb: RolloutBatch | None = None
    per_prompt: Tensor | None = None
    if mine:
        prompts = [render_prompt(self.val_set[i], self.tokenizer) for i in mine]
        truths = [self.val_set[i].answer for i in mine]
        rb, greedy = self.sampler.sample_and_greedy(prompts, k, -1, mine)  # one batched pass
        rows = [self.val_set[mine[int(i)]] for i in rb.prompt_index]
        s = self.scoring(rb.texts, [e.answer for e in rows], rows)
        scores, err, cut = s.R, s.errors, s.cut
        self.completions.write_batch(step, "val", prompts, rb, truths, scores)
        per_prompt = scores.view(len(prompts), k)
        g = self.scoring(greedy.texts, truths, [self.val_set[i] for i in mine])
        g_scores, g_err, cut = g.R, g.errors, cut or g.cut
        formats = [answer_format(t) for t in rb.texts]
        sums = [
            float(per_prompt.sum()),
            float((per_prompt.max(1).values > 0).sum()),
            float(g_scores.sum()),
            float(err + g_err),
            float(formats.count("boxed")),
            float(formats.count("number")),
        ]
    else:
        sums, cut = [0.0] * 6, False
    give_up_if_cut(cut, self.dist, self.device)
    total = self.dist.all_sum(sums, self.device)
    n = len(self.val_set)
    out: dict[str, Any] = {
        "val_accuracy": total[0] / (n * k),
        "pass_at_k": total[1] / n,
        "val_greedy_accuracy": total[2] / n,
        "val_k": k,
        "val_verifier_errors": int(total[3]),
        "val_boxed_rate": total[4] / (n * k),
        "val_number_rate": total[5] / (n * k),
    }
    pairs: list[tuple[float, float]] = []
    if self.critic_engine is not None and mine:
        assert rb is not None and per_prompt is not None  # sampled above: this rank has prompts
        # a per-prompt critic's P(R = 1 | prompt) against the prompt's mean@k (calibration)
        first = torch.arange(0, len(rb.texts), k)
        v = cast(
            Tensor, self.rows(rb.to(self.device), self.critic_engine.module, False)(first, rb.response_len)
        )
        if v.dim() == 1:
            pred = value_units(self.algo, v.float())
            pairs = list(zip(pred.cpu().tolist(), per_prompt.mean(1).tolist()))
    pairs = self.dist.gather_lists(pairs) if self.critic_engine is not None else []
    if pairs:
        pred_all = np.array([p for p, _ in pairs])
        emp = np.array([e for _, e in pairs])
        out["val_critic_brier"] = float(np.mean((pred_all - emp) ** 2))
        if np.std(emp) > 0 and np.std(pred_all) > 0:
            from scipy.stats import pearsonr, spearmanr  # type: ignore[import-untyped]  # scipy ships no types

            out["val_critic_pearson"] = float(pearsonr(pred_all, emp)[0])
            out["val_critic_spearman"] = float(spearmanr(pred_all, emp)[0])
    return out


@torch.no_grad()
def write_critic_trace(self: Evaluator, path: Path) -> None:
    """Write what the critic says on sampled validation responses (:mod:`sppo_rl.runtime.trace`),
    with each response's length and outcome (nothing without a critic). All ranks call this
    (ZeRO-3); rank 0 writes."""
    if self.critic_engine is None or not self.val_set:
        return
    settings, critic = self.plan.rollout, self.critic_engine.module
    mine = list(range(self.dist.rank, len(self.val_set), self.dist.world))
    rows: list[tuple[list[float], int, float]] = []
    seq = False
    if mine:
        prompts = [render_prompt(self.val_set[i], self.tokenizer) for i in mine]
        rb = self.sampler.sample(prompts, settings.eval_samples, -2, mine).to(self.device)
        items = [self.val_set[mine[int(i)]] for i in rb.prompt_index]
        R = self.scoring(rb.texts, [e.answer for e in items], items).R
        lengths = rb.response_lengths.cpu()
        cost = (rb.prompt_mask.sum(-1) + rb.response_lengths).cpu()
        reduction = self.dist.on(self.device)
        out = forward_rows(self.rows(rb, critic, False), lengths, cost, self.plan.learner, reduction)
        v = value_units(self.algo, out.float()).cpu()  # [n] per response, or [n, T] per token
        for b in range(len(R)):
            n = int(lengths[b])
            rows.append((v[b : b + 1].tolist() if v.dim() == 1 else v[b, :n].tolist(), n, float(R[b])))
        seq = v.dim() == 1
    (per_response,) = self.dist.all_max([float(seq) if mine else 0.0], self.device)
    rows = self.dist.gather_lists(rows)
    if not self.dist.main:
        return
    width = max(len(row) for row, _, _ in rows)
    values = np.zeros((len(rows), width), dtype=np.float32)
    for b, (row, _, _) in enumerate(rows):
        values[b, : len(row)] = row
    lengths_all = np.array([n for _, n, _ in rows])
    success = np.array([r for _, _, r in rows], dtype=np.float32)
    write_trace(path, values[:, 0] if per_response else values, lengths_all, success, settings.max_new_tokens)
