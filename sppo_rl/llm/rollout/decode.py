"""Decode steps without per-step copies: a KV cache that grows in place, and attention for one query token.

:class:`~sppo_rl.llm.rollout.hf.HFRollout` decodes one token per forward. With transformers' own parts every
such step concatenates each layer's keys and values onto the cache (a full copy of the cache, 2 x layers
times a step), and under ``torch.autocast`` the CPU's fused attention kernel casts the whole cache to
bfloat16 and runs its blocked kernel for a single query row (measured at 6x the time of the three small
matmuls below). Two replacements, both used through transformers' own extension points:

- :class:`GrowingLayer`: a cache layer whose keys and values live in buffers with room to spare, written
  in place and doubled when full (a copy every doubling, not every step); the model sees the filled part
  as a view.
- :func:`decode_attention`: for one query token, ``softmax(q k^T * scale + mask) v`` in float32 on the
  key/value heads directly (grouped-query heads packed, no ``repeat_kv``); every other call goes to
  transformers' ``sdpa`` attention. Registered as the attention implementation :data:`DECODE_ATTENTION`,
  with sdpa's mask builder, and switched on for the decode loop only (:func:`decode_attention_on`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

DECODE_ATTENTION = "sppo_decode"
"""The attention implementation :func:`decode_attention_on` sets on a model's config."""


class GrowingLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` whose keys and values are views of preallocated
    float32-or-wider buffers ``[B, H, capacity, D]``; :meth:`update` writes the new positions in place
    (an exact copy: a bfloat16 value is widened, never rounded) and returns the views, so a decode step
    copies only its own token's keys and values. Past ``capacity`` (or for a new dtype or batch) the
    buffers are rebuilt twice as long."""

    def __init__(self, keys: Tensor, values: Tensor, capacity: int) -> None:
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._length = keys.shape[-2]
        self._k = _buffer(keys, capacity)
        self._v = _buffer(values, capacity)
        self._views()

    @classmethod
    def replacing(cls, cache: Any, extra: int) -> bool:
        """Swap every plain :class:`DynamicLayer` of ``cache`` (a transformers ``Cache``) for a
        :class:`GrowingLayer` holding its keys and values with room for ``extra`` more positions; other
        layers (sliding windows, quantized) stay as they are. Whether every layer was swapped."""
        layers = getattr(cache, "layers", None)
        if not layers:
            return False
        swapped = 0
        for i, layer in enumerate(layers):
            if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
                layers[i] = cls(layer.keys, layer.values, layer.keys.shape[-2] + extra)
                swapped += 1
        return swapped == len(layers)

    def _views(self) -> None:
        self.keys = self._k[:, :, : self._length]
        self.values = self._v[:, :, : self._length]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        start, end = self._length, self._length + key_states.shape[-2]
        if (
            end > self._k.shape[-2]
            or key_states.shape[0] != self._k.shape[0]
            or torch.promote_types(key_states.dtype, self._k.dtype) != self._k.dtype
            or torch.promote_types(value_states.dtype, self._v.dtype) != self._v.dtype
        ):
            capacity = max(end, 2 * self._k.shape[-2])
            self._k = _buffer(torch.cat([self.keys, key_states], dim=-2), capacity)
            self._v = _buffer(torch.cat([self.values, value_states], dim=-2), capacity)
        else:
            self._k[:, :, start:end] = key_states
            self._v[:, :, start:end] = value_states
        self._length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._length = 0
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the (negative) number of positions to remove")
        self._length = max(0, self._length + tokens_to_remove)
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._views()

    def batch_select_indices(self, indices: Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def _buffer(states: Tensor, capacity: int) -> Tensor:
    """``[B, H, capacity, D]`` holding ``states`` ``[B, H, L, D]`` in its first ``L`` positions, in
    ``states``' dtype widened to at least float32."""
    dtype = torch.promote_types(states.dtype, torch.float32)
    buffer = states.new_empty(*states.shape[:2], capacity, states.shape[-1], dtype=dtype)
    buffer[:, :, : states.shape[-2]] = states
    return buffer


def decode_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention of one query token per row: with ``g = H_q / H_kv`` query heads per key/value head,

        ``out[b, h] = softmax(q[b, h] . K[b, h // g]^T * scale + mask[b]) V[b, h // g]``

    over the key positions, in float32 (autocast off; the cache's keys and values are float32 or wider,
    :class:`GrowingLayer`). ``attention_mask``: None, boolean (True: attend) or additive, broadcast as
    ``[B, 1, 1, L]``. Returns ``([B, 1, H_q, D], None)`` as transformers' attention functions do. Prompts
    (several query tokens), dropout, soft-capping and attention sinks go to transformers' ``sdpa``."""
    B, Hq, q_len, D = query.shape
    Hkv = key.shape[1]
    if q_len != 1 or dropout or Hq % Hkv or kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = D**-0.5 if scaling is None else scaling
    with torch.autocast(query.device.type, enabled=False):
        q = query.float().reshape(B, Hkv, Hq // Hkv, D)  # query head h = kv head h // g, member h % g
        scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scale)  # [B, Hkv, g, L]
        if attention_mask is not None:
            mask = attention_mask[..., -key.shape[-2] :]
            if mask.dtype == torch.bool:
                scores.masked_fill_(~mask, float("-inf"))
            else:
                scores.add_(mask)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, value.float())  # [B, Hkv, g, Dv]
    out = out.to(query.dtype if query.dtype != torch.float32 else value.dtype)
    return out.reshape(B, Hq, 1, -1).transpose(1, 2).contiguous(), None


def _register() -> None:
    if DECODE_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextmanager
def decode_attention_on(model: nn.Module, enabled: bool = True) -> Iterator[bool]:
    """Within: ``model``'s config names :data:`DECODE_ATTENTION` as its attention implementation, when it
    named ``sdpa`` and ``enabled`` (yields True; otherwise nothing changes and it yields False); the
    config's own restored on exit."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa" or not enabled:
        yield False
        return
    _register()
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = before
