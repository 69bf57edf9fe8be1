"""Rollout engines: sample responses to prompts and report the sampler's log-probs.

:class:`RolloutEngine` is the interface the trainer talks to; :class:`HFRolloutEngine` implements it
with a plain Hugging Face causal LM (batched, KV-cached sampling loop). A vLLM engine can sit behind
the same interface later; :meth:`RolloutEngine.update_weights` is where it would receive the actor's
new weights after each update.

Log-prob convention. At each step the engine computes ``z = logits / temperature`` and reports two
log-probs of the token it emitted:

- ``logprobs``: ``log softmax(z)[token]``, the temperature-scaled distribution **without** top-p
  truncation. This is exactly what :func:`sppo_rl.llm.models.sequence_logprobs` recomputes at the
  same temperature, so it is what the trainer compares against (``logp_old`` of the PPO ratio, and
  the check that sampler and trainer agree).
- ``sampling_logprobs``: the log-prob under the distribution actually sampled from, i.e. the top-p
  nucleus renormalised: ``log softmax(z masked to the nucleus)[token]
  = logprobs - log(nucleus mass)``. It equals ``logprobs`` when ``top_p = 1`` and is larger
  otherwise; use it for off-policy corrections or to measure the truncation, not as ``logp_old``.
  Greedy decoding is deterministic, so its ``sampling_logprobs`` are 0 (``logprobs`` still use
  ``temperature``).

The nucleus keeps the most probable tokens while the probability mass ranked before them is below
``top_p`` (the top token is always kept), the same rule as transformers' ``TopPLogitsWarper``.

:class:`SamplingOptions` (``top_k``, ``min_p``, ``repetition_penalty``; fixed for an engine's life, given
to both engines at construction) changes the distribution sampled from, in vLLM's order: the repetition
penalty on ``z`` (a token already in the prompt or the response has ``z / penalty`` if ``z > 0``, else
``z * penalty``: transformers' rule on the raw logits, the same after division by ``T > 0``), then
``min_p`` (drop tokens whose probability is below ``min_p`` times the top token's), ``top_k``, ``top_p``.
``sampling_logprobs`` are under that distribution; ``logprobs`` stay ``log softmax(z)[token]`` without
any of it (what the trainer recomputes), so with these options the sampler is off-policy by exactly
``sampling_logprobs - logprobs`` per token. Greedy decoding takes the argmax after the repetition
penalty (the filters never remove the argmax).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.models import accepts_kwarg, positions_from_mask


@dataclass
class RolloutBatch:
    """``B = len(prompts) * n`` sampled responses; the ``n`` samples of a prompt are adjacent rows.

    Attributes:
        prompt_ids: ``[B, P]`` long, left-padded with the pad id.
        prompt_mask: ``[B, P]`` long, 1 on real prompt tokens.
        response_ids: ``[B, T]`` long, right-padded with the pad id (``T`` = longest response).
        response_mask: ``[B, T]`` long, 1 up to and including the stop (EOS) token, 0 after it.
        logprobs: ``[B, T]`` float32, ``log softmax(logits / temperature)`` of each sampled token
            (no top-p truncation; what ``sequence_logprobs`` recomputes). 0 on padding.
        sampling_logprobs: ``[B, T]`` float32, log-prob under the top-p-renormalised distribution the
            token was drawn from (0 for greedy decoding). 0 on padding.
        texts: the ``B`` decoded responses, special tokens (EOS) removed.
        prompt_index: ``[B]`` long, index into the ``prompts`` list of each row's prompt.
        finished: ``[B]`` bool, whether the response ended with a stop token (else it was truncated
            at ``max_new_tokens``).
        num_generated_tokens: number of tokens generated, ``response_mask.sum()``.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    logprobs: Tensor
    sampling_logprobs: Tensor
    texts: list[str]
    prompt_index: Tensor
    finished: Tensor
    num_generated_tokens: int

    @property
    def batch_size(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def response_len(self) -> int:
        """``T``, the number of response columns."""
        return self.response_ids.shape[1]

    @property
    def input_ids(self) -> Tensor:
        """``[B, P + T]``: ``[left-padded prompt | right-padded response]``."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """``[B, P + T]``: ``[prompt_mask | response_mask]``."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def response_lengths(self) -> Tensor:
        """``[B]`` long: valid response tokens per row (EOS included)."""
        return self.response_mask.sum(-1)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device) if isinstance(v, Tensor) else v for k, v in moved.items()})


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a sampler (Hugging Face now, vLLM later)."""

    tokenizer: PreTrainedTokenizerBase

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
    ) -> RolloutBatch:
        """Sample ``n`` responses per prompt (adjacent rows); see :class:`RolloutBatch`."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]] | None = None) -> None:
        """Make the sampler use the actor's current weights (a no-op when it shares the actor object)."""
        ...


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling settings beyond ``temperature`` and ``top_p`` (see the module docstring for their order).

    Attributes:
        top_k: keep the ``k`` most probable tokens (0: all).
        min_p: drop tokens with ``p < min_p * max p`` (0: none).
        repetition_penalty: ``rho > 0``; a token already in the prompt or the response gets ``z / rho``
            where ``z > 0`` and ``z * rho`` otherwise (1: off; > 1 discourages repeats).
    """

    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1) (0: off), got {self.min_p!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty!r}")

    @property
    def filters(self) -> bool:
        """Whether ``min_p`` or ``top_k`` removes tokens."""
        return self.top_k > 0 or self.min_p > 0.0

    @property
    def default(self) -> bool:
        """Whether every option is off (the sampled distribution is ``softmax(z)`` cut by ``top_p`` only)."""
        return not self.filters and self.repetition_penalty == 1.0


def repetition_penalty(z: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """``z`` ``[B, V]`` with every ``seen`` (``[B, V]`` bool) entry divided by ``penalty`` where positive and
    multiplied by it otherwise."""
    return torch.where(seen, torch.where(z > 0, z / penalty, z * penalty), z)


def filter_logits(z: Tensor, top_p: float, options: SamplingOptions) -> Tensor:
    """``z`` ``[B, V]`` with the tokens outside ``min_p``, then ``top_k``, then the ``top_p`` nucleus set to
    ``-inf`` (the most probable token is always kept)."""
    if options.min_p > 0.0:
        log_p = torch.log_softmax(z, dim=-1)
        top = log_p.max(-1, keepdim=True).values
        z = z.masked_fill(log_p < top + float(np.log(options.min_p)), float("-inf"))
    if 0 < options.top_k < z.shape[-1]:
        kth = torch.topk(z, options.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        z = z.masked_fill(top_p_mask(z, top_p), float("-inf"))
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


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """``(ids, mask)`` ``[B, L]`` long with each sequence right-aligned (left padding)."""
    L = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), L), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, L - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, L - len(s) :] = 1
    return ids.to(device), mask.to(device)


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], add_special_tokens: bool
) -> list[list[int]]:
    """Token ids of each prompt (no padding); raises ``ValueError`` if a prompt has no token."""
    encoded = tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]
    if any(len(ids) == 0 for ids in encoded):
        raise ValueError("every prompt must have at least one token")
    return encoded


def check_sampling(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    """The arguments every engine's ``generate`` shares: ``n, max_new_tokens >= 1``,
    ``temperature > 0`` and ``0 < top_p <= 1``; ``ValueError`` naming the bad one otherwise."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"n and max_new_tokens must be >= 1, got n={n}, max_new_tokens={max_new_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive (use greedy=True for argmax), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


class HFRolloutEngine:
    """Batched sampling from a Hugging Face causal LM with a KV cache.

    One prefill over the left-padded prompts, then one token per step for all rows; a row stops at
    its first stop token (the tokenizer's eos plus the model's ``generation_config.eos_token_id``,
    or ``stop_token_ids``), and the loop ends when every row has stopped or after
    ``max_new_tokens``. Runs under ``torch.no_grad()`` in eval mode, restoring the model's previous
    mode afterwards. The sampling loop is written out (rather than ``model.generate``) so that the
    log-probs are computed on the fly without keeping ``[B, T, V]`` scores, and so that a seeded
    ``torch.Generator`` makes sampling reproducible without touching the global RNG.

    Args:
        model: any causal LM whose forward takes ``input_ids, attention_mask, position_ids`` and a
            KV cache and returns ``.logits`` (every ``AutoModelForCausalLM``).
        tokenizer: its tokenizer (see :func:`sppo_rl.llm.tiny.load_tokenizer`).
        add_special_tokens: passed to the tokenizer for prompts (False for prompts that already went
            through a chat template which adds BOS).
        stop_token_ids: token ids that end a response; default as described above.
        sampling: ``top_k``, ``min_p`` and the repetition penalty of every call (default: off).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        add_special_tokens: bool = True,
        stop_token_ids: Iterable[int] | None = None,
        sampling: SamplingOptions | None = None,
    ) -> None:
        self.model = model
        self.sampling = sampling or SamplingOptions()
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError("the tokenizer needs a pad or an eos token")
        self.pad_token_id = int(pad_id)
        if stop_token_ids is None:
            stops = {tokenizer.eos_token_id}
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            stops |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
            stop_token_ids = (s for s in stops if s is not None)
        self.stop_token_ids = sorted({int(s) for s in stop_token_ids})
        if not self.stop_token_ids:
            raise ValueError("no stop token: the tokenizer has no eos token and none was given")
        self._cache_key = "cache" if accepts_kwarg(model, "cache") else "past_key_values"
        self._logits_to_keep = accepts_kwarg(model, "logits_to_keep")

    @property
    def device(self) -> torch.device:
        param = next(self.model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]] | None = None) -> None:
        """Copy ``(name, tensor)`` pairs into the model's state; ``None`` is a no-op (shared model).

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

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
    ) -> RolloutBatch:
        """Tokenize ``prompts`` and sample ``n`` responses for each; see :class:`RolloutBatch`."""
        encoded = encode_prompts(self.tokenizer, prompts, self.add_special_tokens)
        prompt_ids, prompt_mask = left_pad(encoded, self.pad_token_id, self.device)
        return self.generate_from_ids(
            prompt_ids,
            prompt_mask,
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            greedy=greedy,
            seed=seed,
        )

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
    ) -> RolloutBatch:
        """Like :meth:`generate` on already tokenized, left-padded prompts ``[num_prompts, P]``.

        ``seed`` seeds a private ``torch.Generator`` on the model's device: the same seed, prompts and
        weights give the same samples on the same device. ``seed=None`` draws from torch's global RNG.
        A sequence of one seed per prompt gives every row its own generator (sample ``k`` of prompt
        ``i`` is seeded with :func:`row_seed` ``(seed[i], k)``), so a row's sample does not depend on
        which other prompts share the batch: data-parallel ranks that split a batch draw exactly what
        one process drawing the whole batch would.
        """
        check_sampling(n, temperature, top_p, max_new_tokens)
        prompt_index, prompt_ids, prompt_mask, generator = self._expand(
            prompt_ids, prompt_mask, n, greedy, seed
        )
        with self._sampling_mode():
            tokens, logprobs, sampling_logprobs, mask, finished = self._sample(
                prompt_ids, prompt_mask, temperature, top_p, max_new_tokens, greedy, generator
            )
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
        self, prompt_ids: Tensor, prompt_mask: Tensor, n: int, greedy: bool, seed: int | Sequence[int] | None
    ) -> tuple[Tensor, Tensor, Tensor, torch.Generator | list[torch.Generator] | None]:
        """``(prompt_index, prompt_ids, prompt_mask, generator)``: the left-padded prompts (checked) repeated
        ``n`` times on the model's device, and the sampling generator of ``seed`` (None when greedy or
        unseeded; one per row, seeded :func:`row_seed`, for a sequence of seeds)."""
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
        """Eval mode under ``torch.no_grad()``, the model's previous mode restored afterwards."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
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

    def _sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        greedy: bool,
        generator: torch.Generator | list[torch.Generator] | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        B, device = prompt_ids.shape[0], prompt_ids.device
        tokens = torch.full((B, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(B, max_new_tokens, dtype=torch.float32, device=device)
        sampling_logprobs = torch.zeros_like(logprobs)
        mask = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)

        positions = positions_from_mask(prompt_mask)
        out = self._forward(prompt_ids, prompt_mask, positions, None)
        seen = None
        if self.sampling.repetition_penalty != 1.0:  # the prompt's tokens count as seen
            V = out.logits.shape[-1]
            seen = torch.zeros(B, V, device=device).scatter_add_(1, prompt_ids, prompt_mask.float()) > 0
        steps, alive = self._sample_tokens(
            out,
            prompt_mask,
            positions[:, -1:] + 1,
            (tokens, logprobs, sampling_logprobs, mask),
            0,
            temperature,
            top_p,
            greedy,
            generator,
            seen=seen,
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
        temperature: float,
        top_p: float,
        greedy: bool,
        generator: torch.Generator | list[torch.Generator] | None,
        seen: Tensor | None = None,
    ) -> tuple[int, Tensor]:
        """Sample tokens into columns ``start, start + 1, ...`` of ``buffers = (tokens, logprobs,
        sampling_logprobs, mask)`` ``[B, total]`` (see the module docstring for the two log-probs), one
        KV-cached forward per token; ``out`` is the model output over everything before column
        ``start`` (attention ``attention_mask``), ``position`` ``[B, 1]`` the position of the first token.
        A row stops at its first stop token; the loop ends when every row has stopped or the buffers
        are full. Returns the number of columns written (``start`` included) and ``alive`` ``[B]`` bool
        (rows that never stopped). ``seen`` ``[B, V]`` bool: the tokens the repetition penalty counts as
        already there (updated in place with every token sampled; None: only the tokens sampled here)."""
        tokens, logprobs, sampling_logprobs, mask = buffers
        B, total, device = tokens.shape[0], tokens.shape[1], tokens.device
        stops = torch.tensor(self.stop_token_ids, device=device)
        alive = torch.ones(B, dtype=torch.bool, device=device)
        steps = start
        opts, rows = self.sampling, torch.arange(B, device=device)
        for t in range(start, total):
            z = out.logits[:, -1].float() / temperature
            log_p = torch.log_softmax(z, dim=-1)
            if opts.repetition_penalty != 1.0:
                if seen is None:
                    seen = torch.zeros(z.shape, dtype=torch.bool, device=device)
                z = repetition_penalty(z, seen, opts.repetition_penalty)
            if greedy:
                token = z.argmax(-1)
                sampled_lp = torch.zeros(B, device=device)
            else:
                z = filter_logits(z, top_p, opts)
                log_q = torch.log_softmax(z, dim=-1)
                token = _gumbel_argmax(log_q, generator)
                sampled_lp = log_q.gather(-1, token[:, None]).squeeze(-1)
            token = torch.where(alive, token, self.pad_token_id)
            live = alive.to(logprobs.dtype)
            tokens[:, t] = token
            if seen is not None:
                seen[rows, token] = True
            mask[:, t] = alive.long()
            logprobs[:, t] = log_p.gather(-1, token[:, None]).squeeze(-1) * live
            sampling_logprobs[:, t] = sampled_lp * live
            alive = alive & ~torch.isin(token, stops)
            steps = t + 1
            if t + 1 == total or not bool(alive.any()):
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, 1)], dim=1)
            out = self._forward(token[:, None], attention_mask, position, _cache_of(out))
            position = position + 1
        return steps, alive


def row_seed(prompt_seed: int, k: int) -> int:
    """Seed of sample ``k`` of a prompt seeded ``prompt_seed`` (a fixed mix into 63 bits)."""
    return (int(prompt_seed) * 1_000_003 + 7_919 * int(k) + 12_345) % (2**63 - 1)


def _gumbel_argmax(log_q: Tensor, generator: torch.Generator | list[torch.Generator] | None) -> Tensor:
    """A sample of ``softmax(log_q)`` per row: ``argmax(log_q + G)``, ``G`` standard Gumbel noise
    ``-log(-log(u))`` (masked ``-inf`` entries are never chosen). A list of generators gives each row
    its own noise stream."""
    if isinstance(generator, list):
        u = torch.stack([torch.rand(log_q.shape[-1], generator=g, device=log_q.device) for g in generator])
    else:
        u = torch.rand(log_q.shape, generator=generator, device=log_q.device)
    gumbel = -torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7)))
    return (log_q + gumbel).argmax(-1)


def _cache_of(output: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers 5, ``past_key_values`` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
