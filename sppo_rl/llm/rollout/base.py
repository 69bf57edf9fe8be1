"""The rollout protocol: what the LLM trainer asks of a sampler, whatever runs it.

- :class:`SamplingParams`: every sampling setting of one ``generate`` call, checked once when made.
- :class:`RolloutBatch`: what a call returns (token layout and the two log-probs, see
  :mod:`sppo_rl.llm.rollout`).
- :class:`Rollout`: the calls every backend answers (``generate``, ``update_weights``, ``sleep``,
  ``wake_up``, ``close``; a no-op where a backend has nothing to do) and ``shares_actor``.
- :func:`left_pad`, :func:`encode_prompts`, :func:`pad_and_stop_ids`: the token layout every backend
  shares.
- :func:`logprob_agreement`: how far a backend's ``logprobs`` are from the trainer's recomputation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.models.core import sequence_logprobs


@dataclass(frozen=True)
class SamplingParams:
    """The settings of one ``generate`` call; a bad value raises ``ValueError`` naming it when made.

    The sampled distribution is built from ``z = logits / temperature`` in vLLM's order: the
    repetition penalty, then ``min_p``, ``top_k``, ``top_p`` (:func:`sppo_rl.llm.rollout.hf.filter_logits`).

    Attributes:
        n: samples per prompt (adjacent rows), ``>= 1``.
        temperature: ``T > 0``; also the temperature of the reported ``logprobs`` when ``greedy``.
        top_p: nucleus mass in ``(0, 1]``: a token is kept while the mass ranked before it is below
            ``top_p`` (the most probable token always is; 1: off).
        top_k: keep the ``k`` most probable tokens, an integer ``>= 0`` (0: off).
        min_p: drop tokens with ``p < min_p * max p``, in ``[0, 1)`` (0: off).
        repetition_penalty: ``rho > 0``; a token already in the prompt or the response gets ``z / rho``
            where ``z > 0`` and ``z * rho`` otherwise (1: off; > 1 discourages repeats).
        max_new_tokens: longest response, ``>= 1``.
        greedy: argmax decoding (after the repetition penalty; the filters never remove the argmax):
            seeds, ``top_p``, ``top_k`` and ``min_p`` play no part, the ``n`` rows of a prompt agree.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 256
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be positive (use greedy=True for argmax), got {self.temperature}"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
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
    def plain(self) -> bool:
        """Whether ``top_k``, ``min_p`` and the repetition penalty are all off."""
        return not self.filters and self.repetition_penalty == 1.0

    def as_greedy(self) -> SamplingParams:
        """One greedy decode per prompt with the same length and repetition penalty, its ``logprobs`` at
        temperature 1 (the trainer's ReMax baseline and greedy evaluation)."""
        return replace(self, n=1, greedy=True, temperature=1.0, top_p=1.0)


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


Seeds = int | Sequence[int] | None
"""One seed for the call, one per prompt (a row's samples then do not depend on the other prompts of
the batch), or None (torch's global RNG)."""


@runtime_checkable
class Rollout(Protocol):
    """What the trainer needs from a sampler. Every backend implements every call.

    Attributes:
        tokenizer: encodes the prompts and decodes the responses.
        shares_actor: True when the backend samples from the trained module itself: its weights are
            always the actor's and the trainer never syncs them.
    """

    tokenizer: PreTrainedTokenizerBase
    shares_actor: bool

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None) -> RolloutBatch:
        """``params.n`` responses per prompt (adjacent rows); see :class:`RolloutBatch`."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], partial: bool = False) -> None:
        """Load the actor's ``(name, tensor)`` pairs; ``partial``: only the tensors that changed since
        the sampler was built (LoRA's merged modules) are sent, the others keep theirs."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory until :meth:`wake_up` (a no-op where the backend cannot)."""
        ...

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (a no-op where it did nothing)."""
        ...

    def close(self) -> None:
        """Release what the backend holds; no call is served afterwards where that matters."""
        ...


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


def pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that pads a run's rows (always masked out): the tokenizer's pad token, else its eos;
    ``ValueError`` when it has neither. A run resolves it once, where it loads the tokenizer
    (:attr:`sppo_rl.llm.build.Models.pad_id`), and hands it to its sampler and its stages."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer needs a pad or an eos token")
    return int(pad_id)


def pad_and_stop_ids(
    tokenizer: PreTrainedTokenizerBase, stop_token_ids: Iterable[int | None], pad_id: int | None = None
) -> tuple[int, list[int]]:
    """``(pad id, stop ids)``: ``pad_id`` (None: :func:`pad_id_of` the tokenizer) and the sorted distinct
    ``stop_token_ids`` (None entries dropped); ``ValueError`` when either is missing."""
    if pad_id is None:
        pad_id = pad_id_of(tokenizer)
    stops = sorted({int(s) for s in stop_token_ids if s is not None})
    if not stops:
        raise ValueError("no stop token: the tokenizer has no eos token and none was given")
    return int(pad_id), stops


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], add_special_tokens: bool
) -> list[list[int]]:
    """Token ids of each prompt (no padding); raises ``ValueError`` if a prompt has no token."""
    encoded = tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]
    if any(len(ids) == 0 for ids in encoded):
        raise ValueError("every prompt must have at least one token")
    return encoded


@torch.no_grad()
def logprob_agreement(
    rollout: Rollout, model: nn.Module, prompts: Sequence[str], params: SamplingParams, seed: int = 0
) -> float:
    """Largest ``|logprobs - sequence_logprobs(model)|`` over the tokens ``rollout`` samples.

    Samples with ``params``, recomputes the log-probs with the trainer's
    :func:`~sppo_rl.llm.models.core.sequence_logprobs` at ``params.temperature`` (model in eval mode,
    restored afterwards) and returns the maximum absolute difference over valid response tokens.
    After a weight sync it is float rounding (about 1e-6 in float32); a stale or partial sync shows up
    as a large value.
    """
    rb = rollout.generate(prompts, params, seeds=seed)
    device = next(model.parameters()).device
    rb = rb.to(device)
    was_training = model.training
    model.eval()
    try:
        logp, _ = sequence_logprobs(
            model, rb.input_ids, rb.attention_mask, rb.response_len, params.temperature
        )
    finally:
        model.train(was_training)
    mask = rb.response_mask.bool()
    return float((logp.float() - rb.logprobs.float()).abs()[mask].max())
