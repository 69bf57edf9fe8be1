"""The latent backend: :class:`LatentRollout` samples ``L`` latent steps before the answer tokens into a
:class:`LatentRolloutBatch`, and :func:`latent_rows` recomputes its log-probs for the learner
(definitions: :mod:`sppo_rl.llm.latent`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sppo_rl.llm.latent.maths import (
    LatentSettings,
    gumbel,
    latent_logprob,
    latent_noise,
    latent_step,
    mixture,
)
from sppo_rl.llm.models.core import accepts_kwarg, cache_of, logprobs_from_logits, positions_from_mask
from sppo_rl.llm.rollout.base import RolloutBatch, SamplingParams, Seeds
from sppo_rl.llm.rollout.hf import HFRollout

SAMPLING_REFUSED = (
    "a latent policy samples with temperature and top_p only (not top_k, min_p, repetition_penalty)"
)


@dataclass
class LatentRolloutBatch(RolloutBatch):
    """A :class:`~sppo_rl.llm.rollout.base.RolloutBatch` whose first ``L`` response positions are latent steps.

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


class LatentRollout(HFRollout):
    """:class:`~sppo_rl.llm.rollout.hf.HFRollout` with ``L`` latent steps between the prompt and the
    answer (KV-cached: one forward per position). ``greedy=True`` takes noise-free latent steps and the
    argmax answer token. Seeds as the parent's: one generator per row drives both the latent noise and
    the answer's sampling. Samples with ``temperature`` and ``top_p`` only (``ValueError`` for
    ``top_k``, ``min_p`` or a repetition penalty)."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, settings: LatentSettings, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.settings = settings

    def generate_from_ids(
        self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, seeds: Seeds = None
    ) -> LatentRolloutBatch:
        """``params.n`` samples per prompt: ``L`` latent steps, then at most ``max_new_tokens`` answer
        tokens."""
        if not params.plain:
            raise ValueError(SAMPLING_REFUSED)
        index, prompt_ids, prompt_mask, generator = self._expand(prompt_ids, prompt_mask, params, seeds)
        with self._sampling_mode():
            out = self._sample_latent(prompt_ids, prompt_mask, params, generator)
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

    def generate_with_greedy(
        self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None
    ) -> tuple[RolloutBatch, RolloutBatch]:
        """The two calls one after the other: a greedy row's latent steps are noise-free."""
        return self.generate(prompts, params, seeds), self.generate(prompts, params.as_greedy())

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
        params: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None,
    ) -> tuple[Tensor, ...]:
        s = self.settings
        B, L, K, device = prompt_ids.shape[0], s.steps, s.topk, prompt_ids.device
        total = L + params.max_new_tokens
        tokens = torch.full((B, total), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(B, total, dtype=torch.float32, device=device)
        sampling_logprobs = torch.zeros_like(logprobs)
        mask = torch.zeros(B, total, dtype=torch.long, device=device)
        lat_ids = torch.zeros(B, L, K, dtype=torch.long, device=device)
        lat_scores = torch.zeros(B, L, K, dtype=torch.float32, device=device)
        embedding = self.model.get_input_embeddings()
        noisy = not params.greedy and s.noise_scale > 0

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
            out = self._step(cache_of(out), attention, position, inputs_embeds=e[:, None])
            position = position + 1
        buffers = (tokens, logprobs, sampling_logprobs, mask)
        steps, alive = self._sample_tokens(out, attention, position, buffers, L, params, generator)
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
