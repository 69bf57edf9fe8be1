"""What one call of the vLLM backend asks the engine, and how its answer becomes a
:class:`~sppo_rl.llm.rollout.base.RolloutBatch` (:class:`~sppo_rl.llm.rollout.vllm.VLLMRollout` drives the
engine).

Log-probs. The engine reports, like the HF engine, ``logprobs = log softmax(logits / T)[token]``
(no top-p) and ``sampling_logprobs`` (the top-p nucleus renormalised; 0 for greedy). vLLM's own
``logprobs_mode`` values give either the untempered distribution (``raw_*``) or the distribution
actually sampled from (``processed_*``), never ``logits / T`` without top-p, so:

- the temperature is applied inside the model: the ``scale`` of vLLM's ``LogitsProcessor`` layer is
  set to ``1 / T`` for the call and vLLM samples at temperature 1 (greedy: temperature 0). The logits
  vLLM sees are then ``logits / T``, exactly what :func:`~sppo_rl.llm.models.core.sequence_logprobs`
  recomputes; a start-up check fails loudly if a vLLM build ignores that scale;
- the engine runs with ``logprobs_mode="processed_logprobs"`` and asks for the sampled token's
  log-prob (``logprobs=0``, :func:`sampling_requests`). That is ``log softmax(top_p(logits / T))[token]``,
  i.e. ``sampling_logprobs``; with ``top_p = 1`` it is also ``logprobs``. Greedy requests get
  ``log softmax(logits / T)[argmax]`` (``logprobs``; ``sampling_logprobs`` are 0, as in the HF
  engine: :func:`read_samples`);
- with ``top_p < 1`` (or another cut or penalty: :func:`needs_rescoring`) the untruncated ``logprobs``
  need the full distribution, so the sampled responses are scored once more, teacher-forced, with
  ``prompt_logprobs`` (one prefill over prompt + response per row, no decoding:
  :func:`rescoring_requests`, :func:`rescored_logprobs`). Sampling with ``top_p = 1`` costs nothing
  extra.

Seeds: :func:`request_seeds`; the tokens that end a response: :func:`_stop_ids`. ``vllm`` is imported inside the functions only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.rollout.base import RolloutBatch, SamplingParams, Seeds, left_pad
from sppo_rl.llm.rollout.vllm_sync import VLLMEngineError


def request_seeds(seed: Seeds, num_prompts: int) -> list[int | None]:
    """The vLLM seed of each prompt of a call: ``seed`` is one seed for the call, one per prompt, or None.

    A hash of the call seed and the prompt's index, or of the prompt's own seed: repeated prompts and
    consecutive seeds (the trainer's ``base + i``) get unrelated random streams, and with one seed per
    prompt a row's samples do not depend on the other prompts of the batch. vLLM seeds the ``k``-th
    sample of a request ``seed + k``, hence the 62-bit range.
    """
    if seed is None:
        return [None] * num_prompts
    if isinstance(seed, (int, np.integer)):
        keys = [f"{int(seed)}:{i}" for i in range(num_prompts)]
    else:
        keys = [str(int(s)) for s in seed]
        if len(keys) != num_prompts:
            raise ValueError(f"got {len(keys)} seeds for {num_prompts} prompts")
    digests = (hashlib.blake2b(k.encode(), digest_size=8).digest() for k in keys)
    return [int.from_bytes(d, "little") >> 2 for d in digests]


def _stop_ids(model_path: Path, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos plus the model's ``generation_config.eos_token_id`` (as the HF backend)."""
    stops = {tokenizer.eos_token_id}
    gen_file = model_path / "generation_config.json"
    if gen_file.is_file():
        gen_eos = json.loads(gen_file.read_text()).get("eos_token_id")
        stops |= set(gen_eos) if isinstance(gen_eos, list) else {gen_eos}
    return sorted(int(s) for s in stops if s is not None)


def needs_rescoring(params: SamplingParams) -> bool:
    """Whether the processed log-probs of a sample include a cut (top-p, top-k, min-p) or a penalty, so
    that the untruncated ``logprobs`` need a teacher-forced rescoring pass."""
    return (not params.greedy and (params.top_p < 1.0 or params.filters)) or params.repetition_penalty != 1.0


def sampling_requests(
    params: SamplingParams, request_seed: Sequence[int | None], stop_token_ids: list[int]
) -> list[Any]:
    """One ``vllm.SamplingParams`` per prompt (seeded ``request_seed[i]``): temperature 1 (it is in the
    logits) or 0 (greedy), the sampled token's log-prob, no detokenizing; ``top_k``, ``min_p`` and the
    repetition penalty only where on (vLLM's defaults otherwise)."""
    import vllm

    extra: dict[str, Any] = {}  # only the options that are on: vLLM's defaults otherwise
    if params.repetition_penalty != 1.0:
        extra["repetition_penalty"] = params.repetition_penalty

    def request(i: int) -> Any:
        common = dict(
            max_tokens=params.max_new_tokens,
            stop_token_ids=stop_token_ids,
            logprobs=0,
            flat_logprobs=True,
            detokenize=False,
        )
        if params.greedy:
            return vllm.SamplingParams(n=1, temperature=0.0, **extra, **common)
        cuts = {"top_k": params.top_k} if params.top_k else {}
        if params.min_p:
            cuts["min_p"] = params.min_p
        return vllm.SamplingParams(
            n=params.n,
            temperature=1.0,  # the temperature is in the logits (see the module docstring)
            top_p=params.top_p,
            seed=request_seed[i],
            **extra,
            **cuts,
            **common,
        )

    return [request(i) for i in range(len(request_seed))]


def read_samples(
    outs: Sequence[Any], params: SamplingParams
) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
    """``(tokens, logprobs, sampling_logprobs)`` of every sample, ``n`` per prompt in prompt order, from
    the engine's ``RequestOutput``\\ s (greedy: its one completion repeated ``n`` times, sampling
    log-probs 0)."""
    n, greedy = params.n, params.greedy
    tokens, lps, slps = [], [], []
    for out in outs:
        for c in sorted(out.outputs, key=lambda c: c.index) * (n if greedy else 1):
            toks = [int(t) for t in c.token_ids]
            vals = _sampled_logprobs(c)
            tokens.append(toks)
            lps.append(vals)
            slps.append([0.0] * len(toks) if greedy else vals)
    return tokens, lps, slps


def rescoring_requests(count: int) -> list[Any]:
    """``count`` requests that decode one token and report the log-prob of every prompt token
    (``prompt_logprobs=0``): a teacher-forced pass over prompt + response."""
    import vllm

    score = vllm.SamplingParams(
        max_tokens=1, temperature=0.0, prompt_logprobs=0, flat_logprobs=True, detokenize=False
    )
    return [score.clone() for _ in range(count)]


def rescored_logprobs(
    scored: Sequence[Any], rows: Sequence[list[int]], prompts: Sequence[list[int]], n: int
) -> list[list[float]]:
    """The response part of each rescored row ``prompts[i // n] + response_i``: its tokens' log-probs."""
    return [
        _prompt_token_logprobs(o, row, len(prompts[i // n])) for i, (o, row) in enumerate(zip(scored, rows))
    ]


def _sampled_logprobs(completion: Any) -> list[float]:
    """Log-prob of each emitted token of a vLLM ``CompletionOutput`` (``logprobs=0``)."""
    lps, tokens = completion.logprobs, list(completion.token_ids)
    if lps is None or len(lps) != len(tokens):
        raise VLLMEngineError("vLLM returned no per-token log-probs for a completion")
    if hasattr(lps, "start_indices"):  # FlatLogprobs: the sampled token comes first at each position
        out = []
        for pos, tok in enumerate(tokens):
            j = lps.start_indices[pos]
            if lps.token_ids[j] != tok:
                raise VLLMEngineError(f"log-prob entry of position {pos} is not the sampled token")
            out.append(lps.logprobs[j])
        return out
    return [pos[tok].logprob for tok, pos in zip(tokens, lps)]


def _prompt_token_logprobs(output: Any, token_ids: Sequence[int], start: int) -> list[float]:
    """``log p(token_ids[j] | token_ids[:j])`` for ``j >= start`` from a ``prompt_logprobs=0`` output."""
    lps = output.prompt_logprobs
    if hasattr(lps, "start_indices"):
        out = []
        for j in range(start, len(token_ids)):
            k = lps.start_indices[j]
            if lps.token_ids[k] != token_ids[j]:
                raise VLLMEngineError(f"prompt log-prob entry {j} is not the scored token")
            out.append(lps.logprobs[k])
        return out
    return [lps[j][token_ids[j]].logprob for j in range(start, len(token_ids))]


def rollout_batch(
    prompts: list[list[int]],
    n: int,
    samples: tuple[list[list[int]], list[list[float]], list[list[float]]],
    pad_token_id: int,
    stop_token_ids: list[int],
    tokenizer: PreTrainedTokenizerBase,
) -> RolloutBatch:
    """The :class:`RolloutBatch` of ``n`` samples ``(tokens, logprobs, sampling_logprobs)`` per prompt:
    prompts left-padded and repeated, responses right-padded (CPU tensors), a row ``finished`` when its
    last token is a stop token, texts decoded without special tokens."""
    tokens, lps, slps = samples
    prompt_index = torch.arange(len(prompts)).repeat_interleave(n)
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    prompt_ids, prompt_mask = prompt_ids[prompt_index], prompt_mask[prompt_index]
    B, T = len(tokens), max(len(t) for t in tokens)
    response_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.long)
    logprobs = torch.zeros((B, T), dtype=torch.float32)
    sampling_logprobs = torch.zeros((B, T), dtype=torch.float32)
    for b, (toks, lp, slp) in enumerate(zip(tokens, lps, slps)):
        k = len(toks)
        response_ids[b, :k] = torch.tensor(toks, dtype=torch.long)
        response_mask[b, :k] = 1
        logprobs[b, :k] = torch.tensor(lp, dtype=torch.float32)
        sampling_logprobs[b, :k] = torch.tensor(slp, dtype=torch.float32)
    stops = set(stop_token_ids)
    finished = torch.tensor([len(t) > 0 and t[-1] in stops for t in tokens], dtype=torch.bool)
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=logprobs,
        sampling_logprobs=sampling_logprobs,
        texts=texts,
        prompt_index=prompt_index,
        finished=finished,
        num_generated_tokens=int(response_mask.sum()),
    )
