"""The vLLM backend's weight-sync checks, and its errors.

A sync streams ``(name, tensor)`` pairs in Hugging Face checkpoint names into ``reload_weights`` of
vLLM's worker (vLLM fuses q/k/v and gate/up itself). An exception inside vLLM's reload leaves its model
on the meta device for good, so every pair is checked here before it reaches vLLM
(:meth:`CheckpointLayout.stream`): its name and shape against the model folder's checkpoint
(:func:`checkpoint_shapes`), and that it comes once. A bad name, a wrong shape or an exception raised
by the source iterator ends the stream early instead (vLLM then finishes the layers it has), and the
engine refuses to generate until a later complete sync succeeds. Every checkpoint tensor must be sent
(a layer that gets none keeps its old weights, a fused layer that gets part of its tensors is garbage).
A tied head needs its own load (on CPU vLLM keeps a separate, repacked copy of it): the embedding is
sent to vLLM a second time as ``lm_head.weight`` (:func:`tied_embedding_name`), and a
``lm_head.weight`` coming from the source (a trainer ``state_dict`` lists tied tensors twice) is ignored.

Partial sync (LoRA). When only some modules changed since the engine loaded the model folder (LoRA
trains adapters on a few linear modules and freezes the rest), only their tensors are sent: the merged
weights ``W + (alpha / r) B A`` and biases of the adapted modules, under the checkpoint's names. vLLM's
layer-wise reload keeps the old weights of every layer that gets no tensor, but a fused layer
(``qkv_proj`` from ``q_proj``/``k_proj``/``v_proj``, ``gate_up_proj`` from ``gate_proj``/``up_proj``: the
model's ``packed_modules_mapping``) that gets part of its tensors is filled with garbage in the rest.
So each vLLM layer a partial sync touches must get all its tensors: :meth:`CheckpointLayout.check_partial`
refuses a set of names that would break that rule before anything is sent, and
:meth:`CheckpointLayout.incomplete_layers` finds a sync that broke it.

The temperature hook. The backend applies ``1 / T`` through the ``scale`` of vLLM's ``LogitsProcessor``
layers (:func:`set_logit_scale`); :func:`logit_scale_has_effect` is the start-up check that a vLLM build
does not ignore it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# Buffers an older trainer state_dict may hold that vLLM never loads.
ROTARY_BUFFERS = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
TIED_HEAD = "lm_head.weight"


class VLLMEngineError(RuntimeError):
    """The vLLM engine cannot serve the call (broken, asleep, or holding inconsistent weights)."""


class WeightSyncError(VLLMEngineError):
    """``update_weights`` failed; the engine refuses to generate until a complete sync succeeds."""


class EngineTimeoutError(VLLMEngineError, TimeoutError):
    """A generation or weight sync ran past its deadline."""


class Cancelled(Exception):
    """Raised (or recorded) inside the engine's worker thread when the caller's deadline passed."""


def checkpoint_shapes(folder: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every tensor in the Hugging Face checkpoint in ``folder``.

    Reads the safetensors headers (all shards), or memory-maps ``*.bin`` files when there are none.
    """
    folder = Path(folder)
    shapes: dict[str, tuple[int, ...]] = {}
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        return shapes
    for file in sorted(folder.glob("*.bin")):
        state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        shapes.update({name: tuple(t.shape) for name, t in state.items()})
    if not shapes:
        raise FileNotFoundError(f"no *.safetensors or *.bin weights in {folder}")
    return shapes


def tied_embedding_name(config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> str | None:
    """The checkpoint name of the input embedding when the output head is tied to it and the
    checkpoint omits ``lm_head.weight`` (transformers drops tied copies); else None."""
    text = config.get("text_config", {})
    tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    if not tied or TIED_HEAD in shapes:
        return None
    vocab = config.get("vocab_size", text.get("vocab_size"))
    hidden = config.get("hidden_size", text.get("hidden_size"))
    names = [n for n, shape in shapes.items() if "embed" in n and shape == (vocab, hidden)]
    if len(names) != 1:
        raise ValueError(f"cannot tell the tied input embedding among the checkpoint tensors: {names}")
    return names[0]


def drain(source: Iterator[Any], cancel: threading.Event) -> None:
    """Take the rest of a failed sync's pairs without loading them (until ``cancel``, or the source
    raises): each ZeRO-3 pair is a gather every rank takes part in, so a rank that stops early would
    leave the others waiting in the next one until the collective timeout."""
    while not cancel.is_set():
        try:
            next(source)
        except Exception:  # StopIteration, or the source failed: nothing more to take
            return


class CheckpointLayout:
    """What a sync into an engine built from ``model_path`` may send.

    Args:
        model_path: the model folder the engine loaded (config + weights).
        packed_modules: returns vLLM's ``packed_modules_mapping`` of each model the engine runs
            (``{fused layer: [checkpoint modules]}``); asked once, when first needed.

    Attributes:
        shapes: ``{name: shape}`` of the checkpoint.
        tied_embedding: the embedding also sent as ``lm_head.weight`` (None: no tied head to send).
    """

    def __init__(
        self, model_path: str | os.PathLike, packed_modules: Callable[[], Iterable[Mapping[str, list[str]]]]
    ) -> None:
        self.model_path = Path(model_path)
        self.shapes = checkpoint_shapes(self.model_path)
        config = json.loads((self.model_path / "config.json").read_text())
        self.tied_embedding = tied_embedding_name(config, self.shapes)
        self._packed_modules = packed_modules
        self._packed: dict[str, str] | None = None  # checkpoint module name -> vLLM's fused layer name

    def stream(
        self,
        named_tensors: Iterable[tuple[str, Tensor]],
        cancel: threading.Event,
        state: dict[str, Any],
        clone: bool,
    ) -> Iterator[tuple[str, Tensor]]:
        """The pairs vLLM may load (each detached, and copied when ``clone``); a problem ends the stream
        and is recorded in ``state["error"]``. ``state["seen"]`` collects the names sent,
        ``state["bytes"]`` their size."""
        source = iter(named_tensors)
        seen: set[str] = state["seen"]
        while True:
            if cancel.is_set():
                state["error"] = Cancelled()
                return
            try:
                name, tensor = next(source)
            except StopIteration:
                return
            except BaseException as exc:  # the source failed (e.g. a ZeRO-3 gather): stop cleanly
                state["error"] = exc
                return
            if name.endswith(ROTARY_BUFFERS) or (self.tied_embedding and name == TIED_HEAD):
                continue  # never loaded / sent along with the embedding below
            expected = self.shapes.get(name)
            problem = None
            if expected is None:
                problem = f"unknown parameter {name!r} (not in the checkpoint of {self.model_path})"
            elif not isinstance(tensor, Tensor):
                problem = f"{name!r} is a {type(tensor).__name__}, not a tensor"
            elif tuple(tensor.shape) != expected:
                problem = f"{name!r} has shape {tuple(tensor.shape)}, the checkpoint {expected}"
            elif name in seen:
                problem = f"{name!r} was sent twice"
            if problem:
                state["error"] = WeightSyncError(problem)
                drain(source, cancel)
                return
            try:
                tensor = tensor.detach()
                if clone:
                    tensor = tensor.clone()
            except BaseException as exc:  # e.g. out of memory: never raise inside vLLM's reload
                state["error"] = exc
                drain(source, cancel)
                return
            seen.add(name)
            state["bytes"] += tensor.numel() * tensor.element_size()
            yield name, tensor
            if name == self.tied_embedding:  # vLLM needs the tied head too (on CPU it keeps its own copy)
                yield TIED_HEAD, tensor

    def layer_of(self, name: str) -> str:
        """The vLLM layer that loads checkpoint tensor ``name`` (``...layers.0.self_attn.q_proj.weight``
        -> ``...layers.0.self_attn.qkv_proj``)."""
        if self._packed is None:
            maps = self._packed_modules()
            self._packed = {part: fused for m in maps for fused, parts in m.items() for part in parts}
        parent, _, module = name.rpartition(".")[0].rpartition(".")
        return f"{parent}.{self._packed.get(module, module)}"

    def incomplete_layers(self, names: Iterable[str]) -> dict[str, list[str]]:
        """``{vLLM layer: its checkpoint tensors missing from names}`` for each layer ``names`` touch."""
        names = set(names)
        touched = {self.layer_of(n) for n in names}
        missing: dict[str, list[str]] = {}
        for n in self.shapes:
            if n not in names and self.layer_of(n) in touched:
                missing.setdefault(self.layer_of(n), []).append(n)
        return missing

    def check_partial(self, names: Iterable[str]) -> None:
        """``ValueError`` in one line unless a partial sync of exactly the checkpoint tensors ``names``
        would be sound: every name is in the checkpoint, and every vLLM layer they touch gets all of
        its tensors."""
        names = list(names)
        unknown = [n for n in names if n not in self.shapes]
        if unknown:
            raise ValueError(f"not in the checkpoint of {self.model_path}: {', '.join(unknown[:3])}")
        missing = self.incomplete_layers(names)
        if missing:
            layer, parts = next(iter(missing.items()))
            raise ValueError(
                f"vLLM loads {layer} as one layer, so syncing part of it would leave the rest unset; "
                f"also send {', '.join(parts)} (with LoRA: add those modules to --lora-targets)"
            )


def set_logit_scale(model: nn.Module, factor: float) -> int:
    """Multiply the output scale of every vLLM ``LogitsProcessor`` in ``model`` by ``factor``
    (relative to the model's own scale); returns how many layers were changed."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    changed = 0
    for module in model.modules():
        if isinstance(module, LogitsProcessor):
            if not hasattr(module, "_sppo_base_scale"):
                module._sppo_base_scale = module.scale
            module.scale = module._sppo_base_scale * factor
            changed += 1
    return changed


def logit_scale_has_effect(greedy_logprobs: Callable[[float], list[float]]) -> bool:
    """Whether the temperature hook works: ``greedy_logprobs(T)`` (the log-probs of a short greedy
    decode with the scale set for ``T``) differ between ``T = 1`` and ``T = 0.5``."""
    plain, scaled = greedy_logprobs(1.0), greedy_logprobs(0.5)
    return not max(abs(a - b) for a, b in zip(plain, scaled)) < 1e-6
