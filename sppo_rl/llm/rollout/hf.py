"""The Hugging Face backend: batched, KV-cached sampling from the causal LM in this process.

:class:`HFRollout` samples from a plain ``transformers`` model, either the trained module itself
(``shares_actor``: the torch training engine) or a replica refreshed by :meth:`HFRollout.update_weights`.
It follows the log-prob convention of :mod:`sppo_rl.llm.rollout`; the sampled distribution is built by
:func:`filter_logits` after :func:`repetition_penalty`, with the nucleus rule of :func:`top_p_mask`
(the same rule as transformers' ``TopPLogitsWarper``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.models.core import accepts_kwarg, cache_kwarg, cache_of, positions_from_mask
from sppo_rl.llm.rollout.base import (
    RolloutBatch,
    SamplingParams,
    Seeds,
    encode_prompts,
    left_pad,
    pad_and_stop_ids,
)
from sppo_rl.llm.rollout.decode import DecodeStep, GrowingLayer, decode_attention_on


def repetition_penalty(z: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """``z`` ``[B, V]`` with every ``seen`` (``[B, V]`` bool) entry divided by ``penalty`` where positive and
    multiplied by it otherwise."""
    return torch.where(seen, torch.where(z > 0, z / penalty, z * penalty), z)


def filter_logits(z: Tensor, params: SamplingParams) -> Tensor:
    """``z`` ``[B, V]`` with the tokens outside ``params.min_p``, then ``top_k``, then the ``top_p``
    nucleus set to ``-inf`` (the most probable token is always kept)."""
    if params.min_p > 0.0:
        log_p = torch.log_softmax(z, dim=-1)
        top = log_p.max(-1, keepdim=True).values
        z = z.masked_fill(log_p < top + float(np.log(params.min_p)), float("-inf"))
    if 0 < params.top_k < z.shape[-1]:
        kth = torch.topk(z, params.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if params.top_p < 1.0:
        z = z.masked_fill(top_p_mask(z, params.top_p), float("-inf"))
    return z


def top_p_mask(z: Tensor, top_p: float) -> Tensor:
    """``[..., V]`` bool, True on tokens OUTSIDE the nucleus of ``softmax(z)``.

    A token is kept when the probability mass of the tokens ranked before it (descending order) is
    below ``top_p``; the most probable token is always kept.
    """
    sorted_z, order = torch.sort(z, dim=-1, descending=True)
    probs = torch.softmax(sorted_z, dim=-1)
    mass_before = probs.cumsum(-1) - probs
    remove_sorted = mass_before >= top_p
    remove_sorted[..., 0] = False
    return torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)


class HFRollout:
    """Batched sampling from a Hugging Face causal LM with a KV cache (a :class:`~sppo_rl.llm.rollout.base.Rollout`).

    One prefill over the left-padded prompts (the `n` samples of a prompt share it: :meth:`_prefill`), then one token per step for all rows; a row stops at
    its first stop token (the tokenizer's eos plus the model's ``generation_config.eos_token_id``,
    or ``stop_token_ids``), and the loop ends when every row has stopped or after
    ``max_new_tokens``. Runs under ``torch.no_grad()`` in eval mode, restoring the model's previous
    mode afterwards. The sampling loop is written out (rather than ``model.generate``) so that the
    log-probs are computed on the fly without keeping ``[B, T, V]`` scores, and so that a seeded
    ``torch.Generator`` makes sampling reproducible without touching the global RNG.

    Args:
        model: any causal LM whose forward takes ``input_ids, attention_mask, position_ids`` and a
            KV cache and returns ``.logits`` (every ``AutoModelForCausalLM``).
        tokenizer: its tokenizer (see :func:`sppo_rl.llm.models.tiny.load_tokenizer`).
        add_special_tokens: passed to the tokenizer for prompts (False for prompts that already went
            through a chat template which adds BOS).
        stop_token_ids: token ids that end a response; default as described above.
        pad_id: the id that pads prompts and responses (None: :func:`~sppo_rl.llm.rollout.base.pad_id_of`
            the tokenizer; a run hands its own).
        shares_actor: ``model`` is the trained module itself (no weight sync is ever needed).
        autocast: run the model's forward passes under ``torch.autocast`` with this dtype (``--autocast``;
            None: the model's own dtype). Log-probs and sampling stay float32.
        fast_decode: decode steps write the KV cache in place and attend in float32 with
            :mod:`sppo_rl.llm.rollout.decode` (False: transformers' own cache and attention throughout; the
            tokens are the same in float32, the log-probs within rounding).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        add_special_tokens: bool = True,
        stop_token_ids: Iterable[int] | None = None,
        shares_actor: bool = False,
        autocast: torch.dtype | None = None,
        pad_id: int | None = None,
        fast_decode: bool = True,
    ) -> None:
        self.model = model
        self.fast_decode = fast_decode
        self.shares_actor = shares_actor
        self.autocast = autocast
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        if stop_token_ids is None:
            stops = {tokenizer.eos_token_id}
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            stops |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
            stop_token_ids = stops
        self.pad_token_id, self.stop_token_ids = pad_and_stop_ids(tokenizer, stop_token_ids, pad_id)
        self._cache_key = cache_kwarg(model)
        self._logits_to_keep = accepts_kwarg(model, "logits_to_keep")

    @property
    def device(self) -> torch.device:
        param = next(self.model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def update_weights(
        self, named_tensors: Iterable[tuple[str, Tensor]] | None, partial: bool = False
    ) -> None:
        """Copy ``(name, tensor)`` pairs into the model's state; the tensors not named keep their values,
        so ``partial`` needs nothing more. ``None`` is a no-op (shared model).

        Names follow ``model.state_dict()``; an unknown name raises ``KeyError``.
        """
        if named_tensors is None:
            return
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in state:
                    raise KeyError(f"unknown parameter {name!r}")
                state[name].copy_(tensor)

    def sleep(self) -> None:
        """Nothing to free: the model is the caller's."""

    def wake_up(self) -> None:
        """Nothing to undo."""

    def close(self) -> None:
        """Nothing to release: the model is the caller's."""

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None) -> RolloutBatch:
        """Tokenize ``prompts`` and sample ``params.n`` responses for each; see :class:`RolloutBatch`."""
        encoded = encode_prompts(self.tokenizer, prompts, self.add_special_tokens)
        prompt_ids, prompt_mask = left_pad(encoded, self.pad_token_id, self.device)
        return self.generate_from_ids(prompt_ids, prompt_mask, params, seeds)

    def generate_from_ids(
        self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, seeds: Seeds = None
    ) -> RolloutBatch:
        """Like :meth:`generate` on already tokenized, left-padded prompts ``[num_prompts, P]``.

        ``seeds`` seeds a private ``torch.Generator`` on the model's device: the same seed, prompts and
        weights give the same samples on the same device. ``seeds=None`` draws from torch's global RNG.
        A sequence of one seed per prompt gives every row its own generator (sample ``k`` of prompt
        ``i`` is seeded with :func:`row_seed` ``(seeds[i], k)``), so a row's sample does not depend on
        which other prompts share the batch: data-parallel ranks that split a batch draw exactly what
        one process drawing the whole batch would.
        """
        prompt_index, prompt_ids, prompt_mask, generator = self._expand(
            prompt_ids, prompt_mask, params, seeds
        )
        with self._sampling_mode():
            out = self._sample(prompt_ids, prompt_mask, params, generator)
        return self._batch(prompt_index, prompt_ids, prompt_mask, *out)

    def generate_with_greedy(
        self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None
    ) -> tuple[RolloutBatch, RolloutBatch]:
        """``(generate(prompts, params, seeds), generate(prompts, params.as_greedy()))`` in one batched
        pass (validation's mean@k and greedy accuracy): each prompt's ``params.n`` sampled rows and its
        greedy row (argmax at temperature 1, last of the prompt's ``n + 1`` rows) share the prompt's
        prefill and every decode step. The sampled rows draw exactly the noise of the first call (the
        greedy rows draw none), so both batches hold the same tokens as the two calls."""
        if params.greedy:
            raise ValueError("generate_with_greedy samples with params and adds the greedy rows itself")
        encoded = encode_prompts(self.tokenizer, prompts, self.add_special_tokens)
        prompt_ids, prompt_mask = left_pad(encoded, self.pad_token_id, self.device)
        wide = replace(params, n=params.n + 1)
        index, prompt_ids, prompt_mask, generator = self._expand(prompt_ids, prompt_mask, wide, seeds)
        greedy = torch.arange(len(index), device=index.device) % wide.n == params.n
        with self._sampling_mode():
            out = self._sample(prompt_ids, prompt_mask, wide, generator, greedy)
        parts = []
        for rows in (~greedy, greedy):
            tokens, logprobs, sampling_logprobs, mask, finished = (t[rows] for t in out)
            width = int(mask.sum(1).max())  # this part's longest response: where its own loop stops
            cut = (tokens[:, :width], logprobs[:, :width], sampling_logprobs[:, :width], mask[:, :width])
            parts.append(self._batch(index[rows], prompt_ids[rows], prompt_mask[rows], *cut, finished))
        return parts[0], parts[1]

    def _batch(
        self,
        prompt_index: Tensor,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        tokens: Tensor,
        logprobs: Tensor,
        sampling_logprobs: Tensor,
        mask: Tensor,
        finished: Tensor,
    ) -> RolloutBatch:
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=tokens,
            response_mask=mask,
            logprobs=logprobs,
            sampling_logprobs=sampling_logprobs,
            texts=self._decode(tokens, mask),
            prompt_index=prompt_index,
            finished=finished,
            num_generated_tokens=int(mask.sum()),
        )

    def _expand(
        self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, seed: Seeds
    ) -> tuple[Tensor, Tensor, Tensor, torch.Generator | list[torch.Generator] | None]:
        """``(prompt_index, prompt_ids, prompt_mask, generator)``: the left-padded prompts (checked) repeated
        ``params.n`` times on the model's device, and the sampling generator of ``seed`` (None when greedy
        or unseeded; one per row, seeded :func:`row_seed`, for a sequence of seeds)."""
        n, greedy = params.n, params.greedy
        if prompt_mask.shape[1] == 0 or not bool((prompt_mask[:, -1] != 0).all()):
            raise ValueError(
                "prompts must be left-padded and non-empty: the last column must be a real token"
            )
        device = self.device
        prompt_index = torch.arange(prompt_ids.shape[0], device=device).repeat_interleave(n)
        prompt_ids = prompt_ids.to(device)[prompt_index]
        prompt_mask = prompt_mask.to(device=device, dtype=torch.long)[prompt_index]
        generator: torch.Generator | list[torch.Generator] | None = None
        if seed is not None and not greedy:
            if isinstance(seed, (int, np.integer)):
                generator = torch.Generator(device=device).manual_seed(int(seed))
            else:
                seeds = [int(x) for x in seed]
                if len(seeds) != prompt_ids.shape[0] // n:
                    raise ValueError(f"got {len(seeds)} seeds for {prompt_ids.shape[0] // n} prompts")
                generator = [
                    torch.Generator(device=device).manual_seed(row_seed(seeds[i], k))
                    for i in range(len(seeds))
                    for k in range(n)
                ]
        return prompt_index, prompt_ids, prompt_mask, generator

    @contextmanager
    def _sampling_mode(self) -> Iterator[None]:
        """Eval mode under ``torch.no_grad()`` (and ``self.autocast``) with the one-token attention of
        :func:`~sppo_rl.llm.rollout.decode.decode_attention_on`, the model's previous mode restored afterwards."""
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                torch.no_grad(),
                autocast_to(self.autocast, self.device),
                decode_attention_on(self.model, self.fast_decode),
            ):
                yield
        finally:
            self.model.train(was_training)

    def _decode(self, tokens: Tensor, mask: Tensor) -> list[str]:
        """The texts of the ``mask``-ed tokens of each row, special tokens removed."""
        cpu_tokens, cpu_mask = tokens.cpu(), mask.cpu().bool()
        return self.tokenizer.batch_decode(
            [row[keep].tolist() for row, keep in zip(cpu_tokens, cpu_mask)], skip_special_tokens=True
        )

    def _forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: Any) -> Any:
        kwargs: dict[str, Any] = {self._cache_key: cache} if cache is not None else {}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **kwargs,
        )

    def _prefill(
        self, prompt_ids: Tensor, prompt_mask: Tensor, positions: Tensor, n: int
    ) -> tuple[Any, Tensor]:
        """The model's output over the prompts ``[P * n, L]`` (each prompt repeated ``n`` times in a row)
        and the attention mask its KV cache goes with, paying each piece of prompt once, as a prefix
        cache does:

        - the ``n`` copies of a prompt compute the same thing: one forward over the ``P`` distinct
          prompts, its last logits and cache then repeated ``n`` times (GRPO's ``n = 8``: an eighth);
        - tokens every prompt starts with (a chat template's system message: :func:`shared_prefix`, at
          least :data:`SHARED_PREFIX_MIN` of them) run once, as one row, its cache repeated ``P`` times
          and the prompts' remainders run after it; the mask then reads ``[prefix | padding | rest]``
          (positions count real tokens, so every token keeps its position).

        A cache without ``batch_repeat_interleave`` gets the plain forward over every row."""
        ids, mask = prompt_ids[::n], prompt_mask[::n]
        c = shared_prefix(ids, mask)
        if n == 1 and c == 0:
            return self._forward(prompt_ids, prompt_mask, positions, None), prompt_mask
        if c == 0:
            out = self._forward(ids, mask, positions[::n], None)
            logits, cache = out.logits[:, -1:], cache_of(out)
        else:
            P, L = ids.shape
            start = L - int(mask[0].sum())
            prefix = self._forward(
                ids[:1, start : start + c],
                mask[:1, start : start + c],
                positions[:1, start : start + c],
                None,
            )
            cache = cache_of(prefix)
            if not hasattr(cache, "batch_repeat_interleave"):
                return self._forward(prompt_ids, prompt_mask, positions, None), prompt_mask
            cache.batch_repeat_interleave(P)
            width = int((mask.sum(1) - c).max())  # the longest remainder
            columns = torch.arange(L - width, L, device=ids.device)
            first_rest = (L - mask.sum(1) + c)[:, None]  # each row's first token after the prefix
            rest_mask = (columns[None, :] >= first_rest).long()
            rest = torch.where(rest_mask.bool(), ids[:, L - width :], self.pad_token_id)
            mask = torch.cat([mask.new_ones(P, c), rest_mask], dim=1)
            out = self._forward(rest, mask, (c + rest_mask.cumsum(-1) - 1).clamp(min=0), cache)
            logits, cache = out.logits[:, -1:], cache_of(out)
        if n > 1:
            if not hasattr(cache, "batch_repeat_interleave"):
                return self._forward(prompt_ids, prompt_mask, positions, None), prompt_mask
            cache.batch_repeat_interleave(n)
            logits, mask = logits.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
        return SimpleNamespace(logits=logits, cache=cache), mask

    def _sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        params: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None,
        greedy: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        B, device, max_new_tokens = prompt_ids.shape[0], prompt_ids.device, params.max_new_tokens
        tokens = torch.full((B, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(B, max_new_tokens, dtype=torch.float32, device=device)
        sampling_logprobs = torch.zeros_like(logprobs)
        mask = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)

        positions = positions_from_mask(prompt_mask)
        out, cache_mask = self._prefill(prompt_ids, prompt_mask, positions, params.n)
        decode_step = None
        if self.fast_decode:  # decode steps write the cache in place (room for 64 more, then doubled)
            if GrowingLayer.replacing(cache_of(out), min(max_new_tokens, 64)):
                decode_step = DecodeStep.for_model(self.model)  # and skip the model's per-call machinery
        seen = None
        if params.repetition_penalty != 1.0:  # the prompt's tokens count as seen
            V = out.logits.shape[-1]
            seen = torch.zeros(B, V, device=device).scatter_add_(1, prompt_ids, prompt_mask.float()) > 0
        steps, alive = self._sample_tokens(
            out,
            cache_mask,
            positions[:, -1:] + 1,
            (tokens, logprobs, sampling_logprobs, mask),
            0,
            params,
            generator,
            seen=seen,
            greedy=greedy,
            decode_step=decode_step,
        )
        finished = ~alive
        return tokens[:, :steps], logprobs[:, :steps], sampling_logprobs[:, :steps], mask[:, :steps], finished

    def _sample_tokens(
        self,
        out: Any,
        attention_mask: Tensor,
        position: Tensor,
        buffers: tuple[Tensor, Tensor, Tensor, Tensor],
        start: int,
        params: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None,
        seen: Tensor | None = None,
        greedy: Tensor | None = None,
        decode_step: DecodeStep | None = None,
    ) -> tuple[int, Tensor]:
        """Sample tokens into columns ``start, start + 1, ...`` of ``buffers = (tokens, logprobs,
        sampling_logprobs, mask)`` ``[B, total]`` (see :mod:`sppo_rl.llm.rollout` for the two log-probs), one
        KV-cached forward per token; ``out`` is the model output over everything before column
        ``start`` (attention ``attention_mask``), ``position`` ``[B, 1]`` the position of the first token.
        A row stops at its first stop token; the loop ends when every row has stopped or the buffers
        are full. With one generator per row, once an eighth of the batch's rows have stopped they leave
        it (their cache rows too, :func:`_compactable`): the rows still going sample what they would in
        the full batch, and a long tail costs only its own rows. Returns the number of columns written (``start`` included) and ``alive`` ``[B]`` bool
        (rows that never stopped). ``seen`` ``[B, V]`` bool: the tokens the repetition penalty counts as
        already there (updated in place with every token sampled; None: only the tokens sampled here).
        ``greedy`` ``[B]`` bool: rows decoded as ``params.as_greedy()`` would (argmax at temperature 1,
        ``sampling_logprobs`` 0) among sampled ones; only the others draw noise (None: no such row).
        ``decode_step``: the model's :class:`~sppo_rl.llm.rollout.decode.DecodeStep` (the same logits, less
        overhead), used while the cache allows it (None: the model's own forward)."""
        tokens, logprobs, sampling_logprobs, mask = buffers
        B, total, device = tokens.shape[0], tokens.shape[1], tokens.device
        stops = torch.tensor(self.stop_token_ids, device=device)
        alive = torch.ones(B, dtype=torch.bool, device=device)
        steps = start
        active = torch.arange(B, device=device)  # the buffer rows the model's batch holds, in order
        noise: Tensor | None = None  # the Gumbel noise's buffer, made at the first draw
        for t in range(start, total):
            z = out.logits[:, -1].float()
            if params.temperature != 1.0:
                z = z / params.temperature
            argmax_rows = None if greedy is None else greedy[active]
            if argmax_rows is not None and params.temperature != 1.0:  # temperature 1 on the greedy rows
                z = torch.where(argmax_rows[:, None], out.logits[:, -1].float(), z)
            log_p = torch.log_softmax(z, dim=-1)
            unfiltered = z
            if params.repetition_penalty != 1.0:
                if seen is None:
                    seen = torch.zeros(B, z.shape[-1], dtype=torch.bool, device=device)
                z = repetition_penalty(z, seen[active], params.repetition_penalty)
            if params.greedy:
                token = z.argmax(-1)
                sampled_lp = torch.zeros(z.shape[0], device=device)
            else:
                # the greedy rows' argmax (the filters keep it), -1 on the rows to sample
                best = None if argmax_rows is None else z.argmax(-1).masked_fill(~argmax_rows, -1)
                z = filter_logits(z, params)
                log_q = log_p if z is unfiltered else torch.log_softmax(z, dim=-1)  # no filter: the same
                noise = torch.empty_like(log_q) if noise is None else noise
                token = (
                    _gumbel_argmax(log_q, generator, noise)
                    if best is None
                    else _draw_others(log_q, best, generator, noise)
                )
                sampled_lp = log_q.gather(-1, token[:, None]).squeeze(-1)
                if argmax_rows is not None:
                    sampled_lp = sampled_lp.masked_fill(argmax_rows, 0.0)
            now = alive[active]
            token = torch.where(now, token, self.pad_token_id)
            live = now.to(logprobs.dtype)
            tokens[active, t] = token
            if seen is not None:
                seen[active, token] = True
            mask[active, t] = now.long()
            logprobs[active, t] = log_p.gather(-1, token[:, None]).squeeze(-1) * live
            sampling_logprobs[active, t] = sampled_lp * live
            now = now & ~torch.isin(token, stops)
            alive[active] = now
            steps = t + 1
            if t + 1 == total or not bool(now.any()):
                break
            cache = cache_of(out)
            if _compactable(generator, cache) and 8 * int(now.sum()) <= 7 * len(active):
                keep = now.nonzero().squeeze(1)  # stopped rows leave the batch: per-row noise streams
                cache.batch_select_indices(keep)  # make each row's draws independent of the others
                active, token, position = active[keep], token[keep], position[keep]
                attention_mask = attention_mask[keep]
                generator = [generator[i] for i in keep.tolist()]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(active), 1)], dim=1)
            if decode_step is not None and DecodeStep.runs(cache):
                logits = decode_step(token[:, None], attention_mask, position, cache)
                out = SimpleNamespace(logits=logits, cache=cache)
            else:
                out = self._forward(token[:, None], attention_mask, position, cache)
            position = position + 1
        return steps, alive


def autocast_to(dtype: torch.dtype | None, device: torch.device) -> Any:
    """``torch.autocast`` on ``device`` to ``dtype`` (mixed precision: matmuls in ``dtype`` over the weights'
    own), or a context that changes nothing for None."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


SHARED_PREFIX_MIN = 8
"""Fewest leading tokens all prompts share for :meth:`HFRollout._prefill` to run them once."""


def shared_prefix(ids: Tensor, mask: Tensor) -> int:
    """How many leading real tokens every left-padded row of ``ids`` ``[P, L]`` shares, kept below every
    row's length (a row's last token must stay in its own part); 0 when under :data:`SHARED_PREFIX_MIN`
    or for a single row (nothing to share)."""
    lengths = mask.sum(1)
    shortest = int(lengths.min())
    if ids.shape[0] < 2 or shortest - 1 < SHARED_PREFIX_MIN:
        return 0
    L = ids.shape[1]
    columns = (L - lengths)[:, None] + torch.arange(shortest - 1, device=ids.device)[None, :]
    heads = ids.gather(1, columns)  # [P, shortest - 1]: each row's first real tokens
    same = (heads == heads[:1]).all(0)
    c = int(same.long().cumprod(0).sum())
    return c if c >= SHARED_PREFIX_MIN else 0


def _compactable(generator: torch.Generator | list[torch.Generator] | None, cache: Any) -> bool:
    """Whether the decode loop may drop stopped rows from its batch: only with one noise stream per row
    (the rows' samples are then what the full batch draws) and a cache that can select rows."""
    return isinstance(generator, list) and hasattr(cache, "batch_select_indices")


def row_seed(prompt_seed: int, k: int) -> int:
    """Seed of sample ``k`` of a prompt seeded ``prompt_seed`` (a fixed mix into 63 bits)."""
    return (int(prompt_seed) * 1_000_003 + 7_919 * int(k) + 12_345) % (2**63 - 1)


def _gumbel_argmax(
    log_q: Tensor, generator: torch.Generator | list[torch.Generator] | None, noise: Tensor | None = None
) -> Tensor:
    """A sample of ``softmax(log_q)`` per row: ``argmax(log_q + G)``, ``G`` standard Gumbel noise
    ``-log(-log(u))``, ``u`` uniform in ``[0, 1)`` clamped to ``[1e-20, 1 - 1e-7]`` (masked ``-inf``
    entries are never chosen). A list of generators gives each row its own noise stream. ``noise``: a
    buffer of at least ``log_q``'s rows to compute ``G`` in (its first rows are overwritten; None: a new
    one); the noise is built in place, one full-vocabulary pass per operation."""
    u = torch.empty_like(log_q) if noise is None else noise[: log_q.shape[0]]
    if isinstance(generator, list):
        for row, g in zip(u, generator):
            row.uniform_(generator=g)
    else:
        u.uniform_(generator=generator)
    gumbel = u.clamp_(min=1e-20, max=1.0 - 1e-7).log_().neg_().log_().neg_()
    return gumbel.add_(log_q).argmax(-1)


def _draw_others(
    log_q: Tensor,
    best: Tensor,
    generator: torch.Generator | list[torch.Generator] | None,
    noise: Tensor | None = None,
) -> Tensor:
    """``best`` ``[B]`` (the argmax, or -1 on the rows to sample) with the other rows sampled
    (:func:`_gumbel_argmax`, each row its generator of the list, in ``noise``'s first rows): only those rows
    draw noise, as a batch of them alone would."""
    drawn = (best < 0).nonzero().squeeze(1)
    if len(drawn):
        own = [generator[i] for i in drawn.tolist()] if isinstance(generator, list) else generator
        best[drawn] = _gumbel_argmax(log_q[drawn], own, noise)
    return best
