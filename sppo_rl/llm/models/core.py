"""The actor and the trainer's log-probs over Hugging Face causal LMs: loading (offline, dtype),
the token layout and its position ids, and the per-token log-prob and entropy of a response.

Token layout shared by the rollout engine, the trainer and the critics (``P`` prompt columns, ``T``
response columns)::

    input_ids      = [ <pad> ... <pad> p_1 ... p_k | r_1 ... r_m <pad> ... <pad> ]   # [B, P + T]
    attention_mask = [   0   ...   0    1  ...  1  |  1  ...  1    0   ...   0   ]

Prompts are LEFT-padded (the last prompt token sits in column ``P - 1`` of every row) and responses
RIGHT-padded. Position ids count real tokens only (:func:`positions_from_mask`), exactly as during
generation, so a row's numbers do not depend on how much padding its batch needed.

- The actor is any ``AutoModelForCausalLM`` folder (:func:`load_actor`); :func:`sequence_logprobs` gives
  its log-probs of the response tokens.
- The critics (:mod:`sppo_rl.llm.models.critic`), LoRA (:mod:`sppo_rl.llm.models.lora`) and the checks
  of a model folder before it is built (:mod:`sppo_rl.llm.models.checks`) live beside this module.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, PreTrainedModel

from sppo_rl.llm.models.checks import check_weight_files

_DEFAULT_CHUNK_ELEMENTS = 1 << 27  # logits elements per log-softmax chunk (512 MiB in float32)


# ------------------------------------------------------------------------------------ helpers


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that count real tokens: ``pos[b, i] = max(sum_{j <= i} mask[b, j] - 1, 0)``.

    Left padding gets position 0 (it is masked out anyway), the first real token position 0, and a
    token's position is the same whatever padding precedes it.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str:
    """``None`` or ``"auto"`` -> ``"auto"`` (the checkpoint's own dtype); ``"bfloat16"`` -> ``torch.bfloat16``."""
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP / DeepSpeed wrappers (their ``.module``)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def accepts_kwarg(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` (unwrapped) declares a parameter called ``name``."""
    return name in inspect.signature(_unwrap(model).forward).parameters


def cache_kwarg(model: nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache under: ``cache`` (transformers 5), else
    ``past_key_values``."""
    return "cache" if accepts_kwarg(model, "cache") else "past_key_values"


def cache_of(output: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers 5, ``past_key_values`` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _from_pretrained(auto_cls: Any, path: str | os.PathLike, dtype: torch.dtype | str | None, **kwargs: Any):
    """``auto_cls.from_pretrained`` offline, passing the dtype under the name this transformers uses. A
    pickled weights file that holds more than tensors (transformers reads it with ``weights_only=True``:
    nothing in it runs) is one ``ValueError`` line naming the file (:func:`check_weight_files`)."""
    import pickle

    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    kwargs.setdefault(dtype_key, resolve_dtype(dtype))
    try:
        return auto_cls.from_pretrained(path, local_files_only=True, **kwargs)
    except pickle.UnpicklingError:
        check_weight_files(
            path, "model folder"
        )  # names the file; the error's own text advises weights_only=False
        raise


def load_actor(
    path: str | os.PathLike,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """The causal LM in the local folder ``path`` (``AutoModelForCausalLM``, never downloads).

    ``dtype=None`` keeps the checkpoint's dtype; ``device`` moves the model after loading. Extra
    keywords go to ``from_pretrained`` (e.g. ``attn_implementation="flash_attention_2"``).
    """
    model = _from_pretrained(AutoModelForCausalLM, path, dtype, **kwargs)
    return model.to(device) if device is not None else model


# ------------------------------------------------------------------------------------ precision


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware: a CUDA device that supports bfloat16
    (``torch.cuda.is_bf16_supported``); a CPU whose flags name AVX512-BF16 or AMX-BF16 (x86) or BF16 (Arm),
    read from ``/proc/cpuinfo``, or ``hw.optional.arm.FEAT_BF16`` on macOS. Elsewhere bfloat16 matmuls are
    emulated, slower than float32."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return out.stdout.strip() == "1"
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {f for line in text.splitlines() if line.startswith(("flags", "Features")) for f in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


class Float32Head(nn.Linear):
    """A linear output layer computed in float32 whatever autocast is in force:
    ``logits = x.float() @ W.float()^T (+ b)`` with autocast off. Mixed precision (``--precision bf16``)
    runs the body's matmuls in bfloat16 but keeps the LM head's logits, and so the log-softmax and the
    sampling and training log-probs read from them, in float32 (ScaleRL, arXiv 2510.13786, found a float32
    head matters for RL), and the critic's value head likewise. Same weights and state dict as the
    ``nn.Linear`` it replaces (:func:`float32_head` swaps the class in place; tied weights stay tied)."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.weight.float(), bias)


def float32_head(model: nn.Module) -> nn.Module:
    """Make ``model``'s output layer a :class:`Float32Head` in place and return ``model``: a causal LM's
    output embeddings (``get_output_embeddings()``), or a critic's value ``head``. Raises ``TypeError``
    for an output layer that is not a plain ``nn.Linear`` (its float32 arithmetic would be unknown)."""
    head = model.head if hasattr(model, "head") else model.get_output_embeddings()
    if type(head) is nn.Linear:
        head.__class__ = Float32Head
    elif not isinstance(head, Float32Head):
        raise TypeError(f"a float32 head needs an nn.Linear output layer, got {type(head).__name__}")
    return model


# ------------------------------------------------------------------------------------ log-probs


def _logprob_entropy_chunk(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def logprobs_from_logits(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Per-position ``log softmax(logits / tau)[target]`` and entropy of ``softmax(logits / tau)``.

    ``logits`` ``[..., V]`` (any float dtype; computed in float32), ``targets`` ``[...]`` long.
    Rows are processed in chunks of about ``chunk_elements`` logits so the float32 copy never spans
    the whole ``[..., V]`` tensor; when gradients are on, each chunk is checkpointed so only the input
    logits are kept for the backward pass.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    shape, vocab = targets.shape, logits.shape[-1]
    flat_logits, flat_targets = logits.reshape(-1, vocab), targets.reshape(-1)
    rows = max(1, chunk_elements // vocab)
    grad = torch.is_grad_enabled() and logits.requires_grad
    logps, entropies = [], []
    for start in range(0, flat_targets.shape[0], rows):
        args = (flat_logits[start : start + rows], flat_targets[start : start + rows], temperature)
        if grad:
            lp, ent = checkpoint(_logprob_entropy_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _logprob_entropy_chunk(*args)
        logps.append(lp)
        entropies.append(ent)
    if not logps:
        empty = flat_logits.new_zeros(0, dtype=torch.float32)
        return empty.reshape(shape), empty.reshape(shape)
    return torch.cat(logps).reshape(shape), torch.cat(entropies).reshape(shape)


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_len: int,
    temperature: float = 1.0,
    chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Log-prob and entropy of every response token under ``model`` at ``temperature``.

    ``input_ids`` / ``attention_mask`` ``[B, P + T]`` in the module's layout (``T = response_len``).
    Returns ``(logp, entropy)``, both ``[B, T]`` float32, where for response position ``t``::

        logp[b, t]    = log softmax(logits[b, P + t - 1] / temperature)[input_ids[b, P + t]]
        entropy[b, t] = H(softmax(logits[b, P + t - 1] / temperature))

    i.e. the plain temperature-scaled distribution with no top-p / top-k truncation, the same one
    :class:`~sppo_rl.llm.rollout.hf.HFRollout` reports as ``logprobs``. Values at padded response
    positions are finite but meaningless; mask them. Only the last ``T + 1`` positions go through the
    LM head when the model supports ``logits_to_keep``; see :func:`logprobs_from_logits` for memory.
    """
    T = int(response_len)
    if T <= 0 or T >= input_ids.shape[1]:
        raise ValueError(f"response_len must be in [1, {input_ids.shape[1] - 1}], got {T}")
    kwargs: dict[str, Any] = {}
    if accepts_kwarg(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = T + 1
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        use_cache=False,
        **kwargs,
    )
    logits = out.logits[:, -(T + 1) : -1]
    return logprobs_from_logits(logits, input_ids[:, -T:], temperature, chunk_elements)


def _recomputes(model: nn.Module) -> bool:
    """Whether ``model`` has activation (gradient) checkpointing on: transformers' property under its
    newer name where it has it (the older one warns)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def shared_prompt_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    temperature: float = 1.0,
    chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor] | None:
    """:func:`sequence_logprobs` of rows many of which share a prompt (a group method's samples), each
    distinct prompt run once: one forward over the ``U`` distinct prompt rows (ids and mask equal) with the
    KV cache, its keys and values then picked for every row (``index_select``: the backward adds each
    row's gradient into its prompt's), and one forward over the responses attending to them. Position
    ids, masks and the logits each response token is read from are those of :func:`sequence_logprobs`,
    so the numbers are the same up to the rounding of other matmul shapes, while a prompt of ``k`` rows
    costs one row's forward and backward instead of ``k``.

    ``prompt_ids`` / ``prompt_mask`` ``[B, P]`` (left-padded), ``response_ids`` / ``response_mask``
    ``[B, T]``. Returns ``(logp, entropy)`` ``[B, T]``, or None where it does not pay or cannot run: more
    than ``B / 2`` distinct prompts, a model without a KV cache (or one recomputing activations:
    gradient checkpointing turns the cache off)."""
    B, P = prompt_ids.shape
    T = response_ids.shape[1]
    if T < 1 or _recomputes(_unwrap(model)):
        return None
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    if 2 * distinct.shape[0] > B:
        return None
    ids, mask = distinct[:, :P], distinct[:, P:].to(prompt_mask.dtype)
    keep = {"logits_to_keep": 1} if accepts_kwarg(model, "logits_to_keep") else {}
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=True, **keep
    )
    cache = cache_of(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    logits = out.logits[:, -1:][inverse]  # [B, 1, V]: the first response token's
    if T > 1:
        cache.batch_select_indices(inverse)
        full = torch.cat([mask[inverse], response_mask[:, : T - 1]], 1)
        rest = model(
            input_ids=response_ids[:, : T - 1],
            attention_mask=full,
            position_ids=positions_from_mask(full)[:, P:],
            use_cache=True,
            **{cache_kwarg(model): cache},
        )
        logits = torch.cat([logits, rest.logits], 1)
    return logprobs_from_logits(logits, response_ids, temperature, chunk_elements)


def quiet_transformers() -> None:
    """No weight-loading or shard-writing bars from transformers (the run has its own progress bar);
    its warnings and errors still show."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
