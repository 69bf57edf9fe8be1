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
from torch.nn import functional as F
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


_DECODERS = {"LlamaForCausalLM": "LlamaDecoderLayer", "Qwen2ForCausalLM": "Qwen2DecoderLayer"}
"""The model classes :class:`DecodeStep` runs, each with the class of its layers."""


class DecodeStep:
    """One decode step of a Llama or Qwen2 causal LM as plain tensor operations: the arithmetic of the
    model's own ``forward`` for one new token per row, without its per-call machinery (the attention mask
    built as 4-D every step, module calls and keyword plumbing through 30 layers, the cache's dispatch).
    Per layer, with ``rms(x) = w * x / sqrt(mean(x^2) + eps)`` and RoPE ``(cos, sin)`` at each row's
    position:

        ``h = rms_1(x);  q, k, v = h W_q^T + b_q, h W_k^T + b_k, h W_v^T + b_v;  q, k = rope(q), rope(k)``
        ``K, V = cache.update(k, v);  x = x + decode_attention(q, K, V, mask) W_o^T (+ b_o)``
        ``h = rms_2(x);  x = x + (silu(h W_g^T) * (h W_u^T)) W_d^T``

    then the final norm and the output layer (the model's own module: a float32 head stays one). Each
    operation is the one transformers runs, in the same order and dtype (under autocast too), so the
    logits are those of ``model(...)`` (a test holds them equal). :meth:`for_model` builds one only
    where that holds: a plain ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (no peft wrapping, no hooks
    such as DeepSpeed ZeRO-3's, plain ``nn.Linear`` projections, SiLU, full attention, no dropout); the
    cache's layers must be :class:`GrowingLayer` s (:meth:`runs`)."""

    def __init__(self, model: nn.Module) -> None:
        body = model.model
        self.embed, self.rotary, self.norm = body.embed_tokens, body.rotary_emb, body.norm
        self.head = model.lm_head
        self.layers = []
        for layer in body.layers[: model.config.num_hidden_layers]:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    attn,
                    layer.input_layernorm.weight,
                    layer.input_layernorm.variance_epsilon,
                    (attn.q_proj.weight, attn.q_proj.bias),
                    (attn.k_proj.weight, attn.k_proj.bias),
                    (attn.v_proj.weight, attn.v_proj.bias),
                    (attn.o_proj.weight, attn.o_proj.bias),
                    layer.post_attention_layernorm.weight,
                    layer.post_attention_layernorm.variance_epsilon,
                    (mlp.gate_proj.weight, mlp.gate_proj.bias),
                    (mlp.up_proj.weight, mlp.up_proj.bias),
                    (mlp.down_proj.weight, mlp.down_proj.bias),
                    attn.head_dim,
                )
            )

    @classmethod
    def for_model(cls, model: nn.Module) -> DecodeStep | None:
        """A :class:`DecodeStep` for ``model``, or None where its arithmetic is not the one written here."""
        decoder = _DECODERS.get(type(model).__name__)
        config = getattr(model, "config", None)
        if decoder is None or config is None or model.training:
            return None
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "attention_dropout", 0.0):
            return None
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
            return None
        if getattr(config, "use_sliding_window", False):
            return None
        if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
            return None
        body = getattr(model, "model", None)
        layers = getattr(body, "layers", None)
        if layers is None or len(layers) < config.num_hidden_layers:
            return None
        for module in model.modules():
            if module._forward_hooks or module._forward_pre_hooks:
                return None
        for layer in layers[: config.num_hidden_layers]:
            if type(layer).__name__ != decoder:
                return None
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
            projections += (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            if any(type(p) is not nn.Linear for p in projections):
                return None
        return cls(model)

    @staticmethod
    def runs(cache: Any) -> bool:
        """Whether a step can use ``cache``: every layer a :class:`GrowingLayer` (the decode loop's)."""
        layers = getattr(cache, "layers", None)
        return bool(layers) and all(type(layer) is GrowingLayer for layer in layers)

    def __call__(self, tokens: Tensor, attention_mask: Tensor, positions: Tensor, cache: Any) -> Tensor:
        """The logits ``[B, 1, V]`` of ``tokens`` ``[B, 1]`` at ``positions`` ``[B, 1]``, attending to the
        cache and themselves under ``attention_mask`` ``[B, L]`` (1: a real position; its last column is
        the new token's); every layer's keys and values are appended to ``cache`` in place."""
        x = self.embed(tokens)
        cos, sin = self.rotary(x, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = attention_mask.bool()[:, None, None, :]
        B = tokens.shape[0]
        for (
            attn,
            w_in,
            eps_in,
            (wq, bq),
            (wk, bk),
            (wv, bv),
            (wo, bo),
            w_post,
            eps_post,
            (wg, bg),
            (wu, bu),
            (wd, bd),
            D,
        ), layer in zip(self.layers, cache.layers):
            h = _rms(x, w_in, eps_in)
            q = F.linear(h, wq, bq).view(B, 1, -1, D).transpose(1, 2)
            k = F.linear(h, wk, bk).view(B, 1, -1, D).transpose(1, 2)
            v = F.linear(h, wv, bv).view(B, 1, -1, D).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            keys, values = layer.update(k, v)
            out, _ = decode_attention(attn, q, keys, values, mask, scaling=attn.scaling)
            x = x + F.linear(out.reshape(B, 1, -1).contiguous(), wo, bo)
            h = _rms(x, w_post, eps_post)
            x = x + F.linear(F.silu(F.linear(h, wg, bg)) * F.linear(h, wu, bu), wd, bd)
        return self.head(self.norm(x))


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Llama / Qwen2 RMSNorm: ``weight * (x / sqrt(mean(x^2) + eps))`` computed in float32,
    cast back to ``x``'s dtype before the weight."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
