"""Latent reasoning on the embedded tiny model, and the pieces of Latent-GRPO (arXiv 2604.27998).

Sources. The paper (Deng et al., "Latent-GRPO: Group Relative Policy Optimization for Latent
Reasoning", arXiv 2604.27998) could be read here only as its abstract and the opening of its
introduction, so its equation numbers are not available to this module. Every definition below is
read from the authors' public code (github.com/DJC-GO-SOLO/Latent-GRPO): the latent sampler
(``sglang_latent_reasoning_pkg/.../layers/sampler.py``), the training-side log-probability
(``verl-0.4.x/verl/utils/torch_functional.py``, ``logprobs_from_logits_topk_gumbel``), the
advantages (``verl-0.4.x/verl/trainer/ppo/core_algos.py``, ``compute_latent_grpo_outcome_advantage_*``)
and the released training scripts (top-K 10, Gumbel-softmax temperature 1, noise scale 1, one-sided
noise on). This module writes its own code from those definitions.

**The latent step** (vocabulary-space latent reasoning). At a latent position the model's next-token
logits ``l`` give ``log p = log softmax(l)`` (no temperature). Gumbel noise ``g_v`` is drawn for every
token ``v`` of the vocabulary, clipped to ``[-1.5, 3]``, and scaled by ``sigma`` (the noise scale)::

    s_v = log p(v) + sigma * g_v                    perturbed scores
    (i_1..i_K) = top-K of s,  s_k = s_{i_k}          the K candidates (by perturbed score)
    w = softmax(s_{1..K} / tau)                       mixture weights, tau = Gumbel-softmax temperature
    e = sum_k w_k E[i_k]                              the next INPUT embedding (E: token embeddings)

The latent phase ends, in the paper's sampler, when the noise-free argmax token is the latent-end
marker (``</think>``); here it lasts a fixed ``L = --latent-steps`` steps (the tiny task's reasoning has
at most ``L`` lines, see the warm start), then the answer is decoded as ordinary tokens at the run's
temperature and scored by the task's verifier.

**The log-probability of a latent step** (what makes the PPO ratio computable). Under a policy ``theta``
the shift that turns its log-probs into the stored scores is ``x_k = s_k - log p_theta(i_k)``; the step's
log-probability is the mean standard-Gumbel log-density of it over the K candidates, as the authors'
``logprobs_from_logits_topk_gumbel`` computes it::

    log pi_theta(z_t) = (1 / K) sum_k phi(x_k),   phi(x) = -x - exp(-x)

At sampling time ``x_k = sigma * g_k`` (the scaled noise drawn), so the rollout's own value is
``mean_k phi(sigma * g_k)``; recomputed later from the stored ``(i_k, s_k)`` it is a differentiable
function of the policy's log-probs of the K candidates, with ``d log pi / d log p(i_k) = (1 - exp(-x_k)) / K``.
This is the authors' rule at every ``sigma``. It is not the density of the sampled noise when
``sigma != 1`` (that would be ``mean_k phi(x_k / sigma) - log sigma``, with gradient
``(1 - exp(-x_k / sigma)) / (sigma K)``: at ``sigma = 0.5`` and ``g = 1``, 0.632 per candidate for K = 2
against the authors' 0.197); at the released scripts' ``sigma = 1`` the two agree.
Answer tokens keep the usual ``log softmax(l / T)[token]``. The rollout stores ``(i_k, s_k)`` per latent
step (:class:`LatentRolloutBatch`); the learner's ``actor(rows, T)`` rebuilds the same input
embeddings from them (the mixture weights come from the stored scores, so they are constants) and
returns the latent positions' log-probs, then the answer tokens'.

**The three fixes**, each switchable for the comparison (``latent-grpo-naive`` switches all off):

(a) *Invalid-sample advantage masking* (bottleneck: rollouts that leave the valid latent manifold).
    The authors' code masks responses that reach the length limit: they get advantage 0 and are left
    out of their group's mean and std. Here a latent rollout is *invalid* when it stopped without an
    end token (cut at ``--max-new-tokens``) or has no parseable ``\\boxed{...}`` answer: both mean the
    latent steps led the model off the format it was trained on. Invalid rows become
    ``SequenceBatch.valid = False`` (advantage 0, no loss, out of the group statistics:
    :func:`~sppo_rl.agents.algorithms.compute_advantages`). :func:`valid_rows`. A group left with ONE
    valid member gets ``A = R`` as in the authors' code (its mean taken as 0, its std as 1: the
    ``latent-grpo`` algorithm's estimator parameter ``lone="reward"``), where explicit GRPO gives 0.
(b) *One-sided noise sampling* (bottleneck: trajectory rewards giving wrong per-step updates). The
    clipped noise is shifted by ``+1.5``: ``g' = clip(g, -1.5, 3) + 1.5`` lies in ``[0, 4.5]``, so every
    candidate's ``x_k >= 0`` at sampling. Since ``d log pi / d log p(i_k) = (1 - exp(-x_k)) / K``,
    a positive advantage then raises (and a negative one lowers) the probability of every candidate
    of the step; with two-sided noise about 37 % of the candidates (``P(G < 0) = 1/e``) have
    ``x_k < 0`` and move against their advantage. :func:`latent_noise`.
(c) *Optimal correct-path first-token selection* (bottleneck: averaging several correct latent paths
    gives an invalid mixture). Among the rows of a group with a positive advantage, only the one with
    the highest length-normalised old log-prob keeps its first latent step in the loss; the first
    step of every other row of that group is dropped. The selector ``"first-token"``
    (:func:`sppo_rl.agents.variants.first_token`).

**Warm start** (:func:`latent_warmstart`). A latent policy is made, as COCONUT makes one, by a
curriculum from explicit reasoning to latent: stage 0 fine-tunes the tiny model on responses with
explicit reasoning lines (the arithmetic task's column sums, or the scratchpad task's own lines)
then the box; stage ``k = 1..L`` replaces the first
``k`` lines by ``k`` latent steps (built from the model's own noise-free top-K mixture, back-propagated
through) and trains on the rest. Both stage 0 (the explicit model, the comparable warm start of
explicit GRPO) and the last stage are cached like :mod:`sppo_rl.llm.sft`, keyed by their settings.

Construction at small scale (this project's, not the paper's): a fixed number of latent steps, no
top-p nucleus on latent steps, the authors' straight-through "flip" of negative-advantage gradients
left out, and the invalid rule above (the authors' code masks only length-capped responses).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sppo_rl.llm.models import accepts_kwarg, load_actor, logprobs_from_logits, positions_from_mask
from sppo_rl.llm.rollout import HFRolloutEngine, RolloutBatch, _cache_of, check_sampling, left_pad
from sppo_rl.llm.sft import fine_tune, holdout_split, right_pad, save_cached, supervised_warmstart
from sppo_rl.llm.verify import extract_boxed

NOISE_LOW, NOISE_HIGH = -1.5, 3.0
"""The clip range of the Gumbel noise (the authors' sampler); one-sided noise is shifted by ``-NOISE_LOW``."""
STEP_SEPARATOR = "; "
"""Between two reasoning lines (the scratchpad task's separator: the tiny tokenizer has no newline)."""
LATENT_FORMAT = 1
"""Bumped whenever the latent warm start changes what it trains; part of its cache key."""
_DONE = "LATENT_SFT_COMPLETE.json"


# --------------------------------------------------------------------------------------------------
# the latent step: pure maths


def gumbel(
    shape: tuple[int, ...], generator: torch.Generator | list[torch.Generator] | None, device: Any
) -> Tensor:
    """Standard Gumbel noise ``-log(-log u)``, ``u ~ U(0, 1)``; a list of generators gives row ``b`` of a
    ``[B, V]`` draw its own stream (as :class:`~sppo_rl.llm.rollout.HFRolloutEngine` does)."""
    if isinstance(generator, list):
        u = torch.stack([torch.rand(shape[-1], generator=g, device=device) for g in generator])
    else:
        u = torch.rand(shape, generator=generator, device=device)
    return -torch.log(-torch.log(u.clamp(min=1e-20, max=1.0 - 1e-7)))


def latent_noise(g: Tensor, one_sided: bool, scale: float = 1.0) -> Tensor:
    """The noise added to the log-probs of a latent step: ``scale * clip(g, -1.5, 3)``, shifted by
    ``+1.5`` when ``one_sided`` (then in ``[0, 4.5 * scale]``: never negative)."""
    noise = g.clamp(NOISE_LOW, NOISE_HIGH)
    if one_sided:
        noise = noise - NOISE_LOW
    return scale * noise


@dataclass
class LatentStep:
    """One latent step of a batch: ``ids`` ``[B, K]`` (candidates, by perturbed score), ``scores``
    ``[B, K]`` (their perturbed scores ``s_k``), ``weights`` ``[B, K]`` (``softmax(s / tau)``) and
    ``logp`` ``[B, V]`` (the unperturbed ``log softmax(logits)``)."""

    ids: Tensor
    scores: Tensor
    weights: Tensor
    logp: Tensor


def latent_step(logits: Tensor, noise: Tensor, topk: int, tau: float) -> LatentStep:
    """``s = log softmax(logits) + noise``; the top-``topk`` of ``s`` and their mixture weights
    ``softmax(s_topk / tau)`` (see the module docstring)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    scores, ids = (logp + noise).topk(topk, dim=-1)
    return LatentStep(ids, scores, torch.softmax(scores / tau, dim=-1), logp)


def gumbel_logpdf(x: Tensor) -> Tensor:
    """``phi(x) = -x - exp(-x)``, the standard Gumbel log-density."""
    return -x - torch.exp(-x)


def latent_logprob(scores: Tensor, logp_chosen: Tensor) -> Tensor:
    """``mean_k phi(s_k - log p(i_k))`` over the last axis (the K candidates): the log-probability of a
    latent step whose stored scores are ``scores`` under a policy giving its candidates the log-probs
    ``logp_chosen`` (the authors' rule: the noise scale sigma that made the scores is not divided out)."""
    return gumbel_logpdf(scores - logp_chosen).mean(-1)


def mixture(embedding: nn.Module, ids: Tensor, scores: Tensor, tau: float) -> Tensor:
    """``sum_k softmax(scores / tau)_k E[ids_k]`` over the last axis of ``ids`` / ``scores`` ``[..., K]``:
    the latent input embedding ``[..., H]``."""
    w = torch.softmax(scores.float() / tau, dim=-1)
    vectors = embedding(ids)
    return (w.unsqueeze(-1).to(vectors.dtype) * vectors).sum(-2)


def valid_rows(texts: Sequence[str], finished: Tensor) -> Tensor:
    """``[B]`` bool: a latent rollout stays on the manifold when it ended with a stop token and its text
    holds a parseable ``\\boxed{...}`` (read by :func:`~sppo_rl.llm.verify.extract_boxed`, a plain string
    scan: a model's output is never evaluated)."""
    boxed = torch.tensor([extract_boxed(t) is not None for t in texts], dtype=torch.bool)
    return finished.cpu().bool() & boxed


# --------------------------------------------------------------------------------------------------
# settings


@dataclass(frozen=True)
class LatentSettings:
    """The latent policy's settings (the ``--latent-*`` flags, resolved).

    Attributes:
        steps: latent steps ``L`` after the prompt.
        topk: candidates ``K`` mixed per step.
        tau: Gumbel-softmax temperature of the mixture weights.
        noise_scale: ``sigma``; 0 makes every latent step noise-free (the warm start's checks).
        one_sided: fix (b), one-sided noise.
        mask_invalid: fix (a), invalid rollouts masked out of the update.
    """

    steps: int
    topk: int = 10
    tau: float = 1.0
    noise_scale: float = 1.0
    one_sided: bool = True
    mask_invalid: bool = True


def _pick(value: bool | None, default: bool) -> bool:
    return default if value is None else bool(value)


class LatentPolicy:
    """What the LLM trainer routes through when its algorithm's policy is latent: the warm start, the
    rollout engine, the learner's ``actor(rows, T)`` and the validity of rollouts (fix a)."""

    def __init__(self, settings: LatentSettings) -> None:
        self.settings = settings

    def engine(self, model: nn.Module, tokenizer: Any, **kwargs: Any) -> LatentRolloutEngine:
        return LatentRolloutEngine(model, tokenizer, settings=self.settings, **kwargs)

    def rows(self, rb: RolloutBatch, model: nn.Module, temperature: float, device: Any) -> Any:
        return latent_rows(rb, model, temperature, self.settings, device)

    def valid(self, rb: RolloutBatch, valid: Tensor) -> tuple[Tensor, int]:
        """``valid`` (the verifier's) and, with fix (a) on, the latent rule; and the number of rows the
        latent rule calls invalid (counted whether or not the fix is on)."""
        ok = valid_rows(rb.texts, rb.finished)
        bad = int((~ok).sum())
        return (valid & ok if self.settings.mask_invalid else valid), bad

    def embedded_model(self, cfg: Any, train: list[Any], scorer: Any) -> tuple[Path, dict[str, Any]]:
        return embedded_latent_model(cfg, train, scorer, self.settings)


def configure_latent(cfg: Any, algo: Any, train: list[Any]) -> tuple[Any, LatentPolicy | None]:
    """The algorithm to run and its latent policy (None for a token policy), from the run's flags:
    ``--latent-steps`` (None: the most reasoning lines of a training example, at least 1),
    ``--latent-one-sided`` / ``--latent-mask-invalid`` / ``--latent-first-token`` (None: the algorithm's
    own; ``first-token`` off drops the selector). Refuses, in one line, what the latent policy cannot
    run with (vLLM rollouts, dynamic sampling)."""
    from sppo_rl.runtime.run import RunError

    own = getattr(algo, "latent", None)
    if own is None:
        return algo, None
    if getattr(cfg, "rollout", "hf") != "hf":
        raise RunError(f"{algo.name} rolls out latent steps with the Hugging Face engine only (--rollout hf)")
    if getattr(cfg, "dynamic_sampling_rounds", 0):
        raise RunError(f"{algo.name} does not support --dynamic-sampling-rounds yet")
    vocab = _vocab_size(cfg.model)
    if vocab is not None and cfg.latent_topk > vocab:
        raise RunError(f"--latent-topk {cfg.latent_topk} exceeds the model's vocabulary of {vocab} tokens")
    steps = cfg.latent_steps
    if steps is None:
        steps = max([len(reasoning_lines(cfg.task, e)[0]) for e in train] + [1])
    settings = LatentSettings(
        steps=steps,
        topk=cfg.latent_topk,
        tau=cfg.latent_gumbel_temperature,
        noise_scale=cfg.latent_noise_scale,
        one_sided=_pick(cfg.latent_one_sided, own.get("one_sided", True)),
        mask_invalid=_pick(cfg.latent_mask_invalid, own.get("mask_invalid", True)),
    )
    if not _pick(cfg.latent_first_token, algo.selector == "first-token") and algo.selector == "first-token":
        algo = dataclasses.replace(algo, selector=None)
    elif _pick(cfg.latent_first_token, False) and algo.selector is None:
        algo = dataclasses.replace(algo, selector="first-token")
    return algo, LatentPolicy(settings)


def _vocab_size(model: str | None) -> int | None:
    """The vocabulary of ``--model`` (its ``config.json``) or of the embedded tiny model; None if unknown."""
    if model is None:
        from sppo_rl.llm.setup import TINY_CHARSET
        from sppo_rl.llm.tiny import char_vocab

        return len(char_vocab(TINY_CHARSET))
    try:
        size = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return size if isinstance(size, int) else None


# --------------------------------------------------------------------------------------------------
# rollouts


@dataclass
class LatentRolloutBatch(RolloutBatch):
    """A :class:`~sppo_rl.llm.rollout.RolloutBatch` whose first ``L`` response positions are latent steps.

    Latent positions have ``response_mask`` 1, the top candidate ``i_1`` as their ``response_ids`` (a
    readable trace, never fed back as such) and the step's log-probability as ``logprobs``; ``texts``
    hold the answer tokens only.

    Attributes:
        latent_ids: ``[B, L, K]`` long, the candidates ``i_k`` of every latent step.
        latent_scores: ``[B, L, K]`` float32, their perturbed scores ``s_k``.
    """

    latent_ids: Tensor
    latent_scores: Tensor

    @property
    def latent_steps(self) -> int:
        return self.latent_ids.shape[1]


class LatentRolloutEngine(HFRolloutEngine):
    """:class:`~sppo_rl.llm.rollout.HFRolloutEngine` with ``L`` latent steps between the prompt and the
    answer (KV-cached: one forward per position). ``greedy=True`` takes noise-free latent steps and the
    argmax answer token. Seeds as the parent's: one generator per row drives both the latent noise and
    the answer's sampling."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, settings: LatentSettings, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.settings = settings

    def generate_from_ids(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
    ) -> LatentRolloutBatch:
        """``n`` samples per prompt: ``L`` latent steps, then at most ``max_new_tokens`` answer tokens."""
        check_sampling(n, temperature, top_p, max_new_tokens)
        index, prompt_ids, prompt_mask, generator = self._expand(prompt_ids, prompt_mask, n, greedy, seed)
        with self._sampling_mode():
            out = self._sample_latent(
                prompt_ids, prompt_mask, temperature, top_p, max_new_tokens, greedy, generator
            )
        tokens, logprobs, sampling_logprobs, mask, finished, lat_ids, lat_scores = out
        L = lat_ids.shape[1]
        return LatentRolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=tokens,
            response_mask=mask,
            logprobs=logprobs,
            sampling_logprobs=sampling_logprobs,
            texts=self._decode(tokens[:, L:], mask[:, L:]),
            prompt_index=index,
            finished=finished,
            num_generated_tokens=int(mask.sum()),
            latent_ids=lat_ids,
            latent_scores=lat_scores,
        )

    def _step(self, cache: Any, attention_mask: Tensor, position: Tensor, **inputs: Tensor) -> Any:
        kwargs: dict[str, Any] = {self._cache_key: cache}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(
            attention_mask=attention_mask, position_ids=position, use_cache=True, **inputs, **kwargs
        )

    def _sample_latent(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        greedy: bool,
        generator: torch.Generator | list[torch.Generator] | None,
    ) -> tuple[Tensor, ...]:
        s = self.settings
        B, L, K, device = prompt_ids.shape[0], s.steps, s.topk, prompt_ids.device
        total = L + max_new_tokens
        tokens = torch.full((B, total), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(B, total, dtype=torch.float32, device=device)
        sampling_logprobs = torch.zeros_like(logprobs)
        mask = torch.zeros(B, total, dtype=torch.long, device=device)
        lat_ids = torch.zeros(B, L, K, dtype=torch.long, device=device)
        lat_scores = torch.zeros(B, L, K, dtype=torch.float32, device=device)
        embedding = self.model.get_input_embeddings()
        noisy = not greedy and s.noise_scale > 0

        attention = prompt_mask
        positions = positions_from_mask(prompt_mask)
        out = self._forward(prompt_ids, attention, positions, None)
        position = positions[:, -1:] + 1
        for t in range(L):
            logits = out.logits[:, -1].float()
            noise = (
                latent_noise(gumbel(tuple(logits.shape), generator, device), s.one_sided, s.noise_scale)
                if noisy
                else torch.zeros_like(logits)
            )
            step = latent_step(logits, noise, K, s.tau)
            lat_ids[:, t], lat_scores[:, t] = step.ids, step.scores
            tokens[:, t], mask[:, t] = step.ids[:, 0], 1
            if noisy:
                lp = latent_logprob(step.scores, step.logp.gather(-1, step.ids))
                logprobs[:, t] = sampling_logprobs[:, t] = lp
            e = mixture(embedding, step.ids, step.scores, s.tau)  # = sum_k step.weights_k E[i_k]
            attention = torch.cat([attention, attention.new_ones(B, 1)], dim=1)
            out = self._step(_cache_of(out), attention, position, inputs_embeds=e[:, None])
            position = position + 1
        buffers = (tokens, logprobs, sampling_logprobs, mask)
        steps, alive = self._sample_tokens(
            out, attention, position, buffers, L, temperature, top_p, greedy, generator
        )
        return (
            tokens[:, :steps],
            logprobs[:, :steps],
            sampling_logprobs[:, :steps],
            mask[:, :steps],
            ~alive,
            lat_ids,
            lat_scores,
        )


def latent_rows(
    rb: RolloutBatch, model: nn.Module, temperature: float, settings: LatentSettings, device: Any
) -> Callable[[Tensor, int], tuple[Tensor, Tensor]]:
    """The learner's ``actor(rows, T) -> (logp, entropy)`` ``[len(rows), T]`` over a
    :class:`LatentRolloutBatch`: one forward over ``[prompt | latent mixtures | answer tokens]`` (the
    mixtures rebuilt from the stored candidates and scores); positions ``t < L`` get
    :func:`latent_logprob` and the entropy of ``softmax(logits)``, later positions the answer token's
    log-prob and entropy at ``temperature``."""
    if not isinstance(rb, LatentRolloutBatch):
        raise TypeError(
            "a latent policy's log-probs need a LatentRolloutBatch (its latent steps' candidates)"
        )

    def fn(rows: Tensor, T: int) -> tuple[Tensor, Tensor]:
        rows = rows.to(device)
        pm = rb.prompt_mask[rows]
        first = int(pm.any(0).float().argmax())
        embedding = model.get_input_embeddings()
        Lc = min(rb.latent_steps, T)
        parts = [embedding(rb.prompt_ids[rows, first:])]
        ids, scores = rb.latent_ids[rows, :Lc], rb.latent_scores[rows, :Lc]
        parts.append(mixture(embedding, ids, scores, settings.tau).to(parts[0].dtype))
        parts.append(embedding(rb.response_ids[rows, Lc:T]))
        attn = torch.cat([pm[:, first:], rb.response_mask[rows, :T]], 1)
        kwargs = {"logits_to_keep": T + 1} if accepts_kwarg(model, "logits_to_keep") else {}
        out = model(
            inputs_embeds=torch.cat(parts, 1),
            attention_mask=attn,
            position_ids=positions_from_mask(attn),
            use_cache=False,
            **kwargs,
        )
        logits = out.logits[:, -(T + 1) : -1]
        lat = torch.log_softmax(logits[:, :Lc].float(), dim=-1)
        lat_lp = latent_logprob(scores, lat.gather(-1, ids)) if Lc else lat[..., 0]
        lat_ent = -(lat.exp() * lat).sum(-1)
        tok_lp, tok_ent = logprobs_from_logits(logits[:, Lc:], rb.response_ids[rows, Lc:T], temperature)
        return torch.cat([lat_lp, tok_lp], 1), torch.cat([lat_ent, tok_ent], 1)

    return fn


# --------------------------------------------------------------------------------------------------
# reasoning lines and the curriculum


def column_sums(numbers: Sequence[int]) -> list[str]:
    """Column addition of non-negative ``numbers``, right to left: one line per column, the column's
    digits plus the carry in, written in two digits (``58 + 67``: ``15``, ``12``, and ``01`` for the carry
    left after the last column). The answer's digits are the lines' last digits read from the last line
    back, after the last line's carry (``125``)."""
    rev = [str(n)[::-1] for n in numbers]
    carry, lines = 0, []
    for k in range(max(len(r) for r in rev) + 1):
        if k == max(len(r) for r in rev) and carry == 0:
            break
        s = sum(int(r[k]) for r in rev if k < len(r)) + carry
        lines.append(f"{s:02d}")
        carry = s // 10
    return lines


def reasoning_lines(task: str, example: Any) -> tuple[list[str], str]:
    """The reasoning lines and the boxed answer of ``example``'s reference response.

    ``scratchpad``: its reference response split at :data:`STEP_SEPARATOR` (the last part is the box).
    ``arithmetic``: a sum of non-negative integers gets its :func:`column_sums` (``"58+67="`` ->
    ``15; 12; 01; \\boxed{125}``: short lines, so that the explicit stage trains fast on one CPU core);
    any other expression has no lines (its latent steps then only precede the box)."""
    box = f"\\boxed{{{example.answer}}}"
    if task == "scratchpad":
        from sppo_rl.llm.scratchpad import reference_response

        parts = reference_response(example).split(STEP_SEPARATOR)
        return parts[:-1], parts[-1]
    terms = str(example.prompt).removesuffix("=").split("+")
    if not all(t.isdigit() for t in terms):
        return [], box
    if sum(int(t) for t in terms) != int(example.answer):
        raise ValueError(f"{example.prompt!r}: the terms do not add up to the answer {example.answer}")
    return column_sums([int(t) for t in terms]), box


def stage_response(lines: Sequence[str], box: str, k: int) -> str:
    """The explicit text of curriculum stage ``k``: the lines after the first ``k`` (replaced by ``k``
    latent steps), then the box, joined by :data:`STEP_SEPARATOR`."""
    return STEP_SEPARATOR.join([*lines[min(k, len(lines)) :], box])


def curriculum_loss(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    target_ids: Tensor,
    target_mask: Tensor,
    k: int,
    settings: LatentSettings,
) -> Tensor:
    """Cross-entropy of the stage-``k`` targets after ``k`` latent steps (COCONUT's objective with
    vocabulary-space latents): step ``j`` feeds back the noise-free mixture of the top-K of the model's
    own next-token distribution, computed by a forward over everything before it; gradients flow back
    through every mixture. Token-mean over ``target_mask``."""
    embedding = model.get_input_embeddings()
    x, attn = embedding(prompt_ids), prompt_mask
    for _ in range(k):
        out = model(
            inputs_embeds=x, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=False
        )
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        scores, ids = logp.topk(settings.topk, dim=-1)
        e = mixture(embedding, ids, scores, settings.tau).to(x.dtype)
        x = torch.cat([x, e[:, None]], 1)
        attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
    T = target_ids.shape[1]
    x = torch.cat([x, embedding(target_ids)], 1)
    attn = torch.cat([attn, target_mask], 1)
    out = model(inputs_embeds=x, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=False)
    logits = out.logits[:, -(T + 1) : -1].float()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1), reduction="none"
    )
    m = target_mask.float().reshape(-1)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def _key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def latent_warmstart(
    explicit: Path,
    cache_dir: Path,
    prompts: Sequence[str],
    lines: Sequence[Sequence[str]],
    boxes: Sequence[str],
    answers: Sequence[str],
    score: Callable[[list[str], list[str]], list[float]],
    settings: LatentSettings,
    *,
    steps: int,
    lr: float,
    target: float,
    temperature: float,
    batch_size: int = 32,
    check_every: int = 25,
    holdout: int = 128,
    seed: int = 0,
    key_settings: dict[str, Any] | None = None,
    progress: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Stages ``1..L`` of the curriculum from the explicit model in ``explicit`` (stage 0), cached under
    ``cache_dir/latent-sft-<key>``. Each stage trains at most ``steps`` updates of ``batch_size`` pairs
    (a fresh AdamW, as COCONUT resets its optimizer per stage) and ends at the first check where the
    sampled accuracy of the ``holdout`` last pairs, with ``k`` noise-free latent steps, reaches ``target``.
    Returns the folder and its record (steps and accuracy history per stage)."""
    L = settings.steps
    record_settings = dict(
        key_settings or {},
        explicit=explicit.name,
        latent_steps=L,
        topk=settings.topk,
        tau=settings.tau,
        steps=steps,
        lr=lr,
        target=target,
        temperature=temperature,
        batch_size=batch_size,
        seed=seed,
        format=LATENT_FORMAT,
    )
    folder = cache_dir / f"latent-sft-{_key(record_settings)}"
    if (folder / _DONE).is_file():
        return folder, json.loads((folder / _DONE).read_text())
    from sppo_rl.llm.tiny import load_tokenizer

    tokenizer = load_tokenizer(explicit)
    n_train, batch_size = holdout_split(len(prompts), holdout, batch_size, "examples")
    quiet = dataclasses.replace(settings, noise_scale=0.0)
    p_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    stages: list[dict[str, Any]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = load_actor(explicit)
        rng = random.Random(seed)
        for k in range(1, L + 1):
            texts = [stage_response(ln, b, k) for ln, b in zip(lines, boxes)]
            r_ids = [
                tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts
            ]
            stage_cfg = dataclasses.replace(quiet, steps=k)

            def batch_loss(
                idx: list[int], r_ids: list[list[int]] = r_ids, cfg: LatentSettings = stage_cfg
            ) -> Tensor:
                pid, pmask = left_pad([p_ids[i] for i in idx], tokenizer.pad_token_id)
                tid, tmask = right_pad([r_ids[i] for i in idx], tokenizer.pad_token_id)
                return curriculum_loss(model, pid, pmask, tid, tmask, cfg.steps, cfg)

            step, acc, history = fine_tune(
                model,
                LatentRolloutEngine(model, tokenizer, settings=stage_cfg, add_special_tokens=False),
                batch_loss,
                prompts,
                answers,
                score,
                n_train=n_train,
                rng=rng,
                steps=steps,
                lr=lr,
                target=target,
                temperature=temperature,
                max_new_tokens=max(len(r) for r in r_ids) + 4,
                batch_size=batch_size,
                check_every=check_every,
                seed=seed,
                progress=progress,
                label=f"[latent warm start] stage {k}/{L}",
            )
            stages.append({"stage": k, "steps": step, "holdout_accuracy": acc, "history": history})
    record = {"explicit": str(explicit), "stages": stages, "settings": record_settings}
    return folder, save_cached(folder, _DONE, model, tokenizer, record)


def _warmstart_inputs(
    cfg: Any, train: list[Any], scorer: Any
) -> tuple[Path, list[str], list[str], dict[str, Any], Callable[[list[str], list[str]], list[float]]]:
    """What both warm starts of ``cfg`` take: the cache folder, the prompts and answers of ``train``, the
    data part of their cache keys and ``scorer`` as ``score(texts, truths) -> list[float]``."""
    from sppo_rl.llm.setup import default_cache_dir

    def score(texts: list[str], truths: list[str]) -> list[float]:
        return scorer.score(texts, truths).scores.tolist()

    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    key = {"level": list(cfg.level), "data_seed": cfg.data_seed, "train_size": cfg.train_size}
    return cache, [str(e.prompt) for e in train], [e.answer for e in train], key, score


def explicit_model(
    cfg: Any, train: list[Any], scorer: Any
) -> tuple[Path, dict[str, Any], list[list[str]], list[str]]:
    """Stage 0 of the curriculum: the embedded tiny model fine-tuned on responses with explicit reasoning
    lines (:func:`reasoning_lines`), cached by :func:`sppo_rl.llm.sft.supervised_warmstart`; also the
    lines and boxes of ``train``. For ``scratchpad`` it is the task's own embedded warm start."""
    from sppo_rl.llm.setup import TINY_CHARSET, generated_task, tiny_settings
    from sppo_rl.llm.tiny import ensure_tiny_model

    cache, prompts, answers, key, score = _warmstart_inputs(cfg, train, scorer)
    base = ensure_tiny_model(cache, TINY_CHARSET, **tiny_settings(cfg.task))
    generated_task(cfg.task)  # refuses a task without an embedded model
    lines, boxes = zip(*[reasoning_lines(cfg.task, e) for e in train]) if train else ((), ())
    responses = [stage_response(ln, b, 0) for ln, b in zip(lines, boxes)]
    if cfg.task != "arithmetic":
        key["task"] = (
            cfg.task
        )  # scratchpad: stage 0 is its own reference response; the task keeps the key apart
    else:
        key["reasoning"] = "column-sums"
    max_len = max(len(r) for r in responses) + 1 + 4
    folder, record = supervised_warmstart(
        base,
        cache,
        prompts,
        responses,
        answers,
        score,
        steps=cfg.sft_steps,
        lr=cfg.sft_lr,
        target=cfg.sft_target,
        temperature=cfg.temperature,
        max_new_tokens=max(cfg.max_new_tokens or 0, max_len) if cfg.task == "scratchpad" else max_len,
        seed=cfg.seed,
        key_settings=key,
        progress=cfg.progress,
    )
    return folder, record, [list(x) for x in lines], list(boxes)


def embedded_latent_model(
    cfg: Any, train: list[Any], scorer: Any, settings: LatentSettings
) -> tuple[Path, dict[str, Any]]:
    """The embedded tiny model made a latent reasoner: stage 0 (:func:`explicit_model`), then stages
    ``1..L`` (:func:`latent_warmstart`), each built once into the cache."""
    folder0, record0, lines, boxes = explicit_model(cfg, train, scorer)
    cache, prompts, answers, key, score = _warmstart_inputs(cfg, train, scorer)
    folder, record = latent_warmstart(
        folder0,
        cache,
        prompts,
        lines,
        boxes,
        answers,
        score,
        settings,
        steps=cfg.latent_sft_steps,
        lr=cfg.sft_lr,
        target=cfg.sft_target,
        temperature=cfg.temperature,
        seed=cfg.seed,
        key_settings={"task": cfg.task, **key},
        progress=cfg.progress,
    )
    return folder, {"explicit": {"folder": str(folder0), **record0}, "latent": record}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sppo_rl.llm.latent explicit-model|latent-model [sppo-rl llm flags]``: build (once) and
    print the folder of the explicit-reasoning warm start (stage 0: the comparable start of explicit
    GRPO, ``sppo-rl llm --algo grpo --model <folder>``) or of the latent one."""
    import tyro

    from sppo_rl.agents import get_algorithm
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.setup import load_task, start_scorer

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("explicit-model", "latent-model"):
        print(
            "usage: python -m sppo_rl.llm.latent explicit-model|latent-model [sppo-rl llm flags]",
            file=sys.stderr,
        )
        return 2
    what, rest = args[0], args[1:]
    cfg = tyro.cli(LLMConfig, default=LLMConfig(algo="latent-grpo"), args=rest, prog=f"latent {what}")
    if what == "latent-model" and getattr(get_algorithm(cfg.algo), "latent", None) is None:
        cfg = dataclasses.replace(cfg, algo="latent-grpo")
    cfg.validate()
    train, _, reward_fn = load_task(cfg)
    scorer = start_scorer(reward_fn, cfg.reward_timeout)
    try:
        if what == "explicit-model":
            folder = explicit_model(cfg, train, scorer)[0]
        else:
            _, policy = configure_latent(cfg, get_algorithm(cfg.algo), train)
            assert policy is not None
            folder = policy.embedded_model(cfg, train, scorer)[0]
    finally:
        scorer.close()
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
