"""LoRA (``--lora-rank``): low-rank adapters (peft) on named linear modules of the actor and of the
critic's backbone.

:func:`apply_lora` wraps the modules in place (``y = W x + b + (alpha / r) B A x``, ``B = 0`` at the
start); :func:`check_lora_targets_of` refuses bad ``--lora-targets`` from ``config.json`` alone;
:func:`merged_state_items` gives the merged weights under the base model's names (exports, rollout
engines); :func:`save_adapter` writes the adapters alone as a peft folder; :class:`BaseModelView` is the
base model (adapters off) as KL reference.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import AutoModel, AutoModelForCausalLM

from sppo_rl.llm.models.core import _unwrap

_ADAPTER = "default"  # peft's name of the one adapter each wrapped module holds here
ALL_LINEAR = "all-linear"
"""``--lora-targets all-linear``: every linear module (:func:`linear_module_names`), as peft's own value."""


def _is_linear(module: nn.Module) -> bool:
    """``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's linear layers, weight stored ``[in, out]``)."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last names of ``model``'s linear modules (``nn.Linear`` and GPT-2's ``Conv1D``: what
    ``--lora-targets`` may name), without the output head: an adapter on a head tied to the input
    embedding would untie them."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _is_linear(m) and m is not head})


def resolve_lora_targets(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """``targets`` as module names: ``("all-linear",)`` becomes every linear module of ``model``."""
    if tuple(targets) == (ALL_LINEAR,):
        return linear_module_names(model)
    return list(targets)


def check_lora_targets(model: nn.Module, targets: Sequence[str], what: str = "the model") -> None:
    """``ValueError`` in one line unless every name of ``targets`` is a linear module of ``model``
    (``all-linear``: unless it has one); the message lists the model's linear modules."""
    names = linear_module_names(model)
    if ALL_LINEAR in targets and len(targets) > 1:
        raise ValueError(f"--lora-targets {ALL_LINEAR} stands alone (it names every linear module)")
    targets = resolve_lora_targets(model, targets)
    missing = [t for t in targets if t not in names]
    if not targets or missing:
        raise ValueError(
            f"--lora-targets {','.join(missing) or '(none)'}: no linear module of {what} has that name; "
            f"its linear modules: {','.join(names) or '(none)'}"
        )


def check_lora_targets_of(targets: Sequence[str], actor: str | os.PathLike | None, critic: Any) -> None:
    """:func:`check_lora_targets` from the models' ``config.json`` alone (each model built on the meta
    device: no weight is read), so bad targets are refused before a run folder is touched. ``actor``
    None stands for the embedded tiny Qwen2; ``critic`` is the critic backbone's folder, None for the
    actor's, False for no critic."""
    from transformers import AutoConfig, Qwen2Config

    def config(folder: Any) -> Any:
        if folder is None:  # the embedded model's architecture (its sizes do not change the names)
            return Qwen2Config(
                vocab_size=8,
                hidden_size=8,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
            )
        return AutoConfig.from_pretrained(folder, local_files_only=True)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config(actor))
        check_lora_targets(model, targets, f"the actor ({actor or 'the embedded tiny Qwen2'})")
        if critic is not False:
            folder = actor if critic is None else critic
            backbone = AutoModel.from_config(config(folder))
            check_lora_targets(backbone, targets, f"the critic ({folder or 'the embedded tiny Qwen2'})")


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    targets: Sequence[str],
    dropout: float = 0.0,
    *,
    seed: int | None = None,
) -> nn.Module:
    """Wrap each linear module of ``model`` named in ``targets`` in a LoRA adapter (peft), in place::

        y = W x + b + (alpha / r) * B A dropout(x),   A [r, in] (Kaiming-uniform), B [out, r] (zeros)

    ``targets`` are module names (``nn.Linear`` or GPT-2's ``Conv1D``, whose adapters peft keeps with
    ``fan_in_fan_out``) or ``("all-linear",)`` (:func:`resolve_lora_targets`).

    so the wrapped model starts exactly as the base model (``B = 0``). Every other parameter of
    ``model`` is frozen: only the adapters' ``A`` and ``B`` get gradients (and optimizer state). A
    critic's value head is trainable because it lies outside the backbone passed here. The model
    stays the same object, with the same ``forward`` and ``generate``; its parameter names gain
    ``.base_layer.`` and ``.lora_A.default.`` / ``.lora_B.default.`` (see :func:`merged_state_items`
    for the base model's names). ``A`` is drawn from torch's global RNG, or with ``seed`` from an RNG
    seeded with it (the global state left as it was: the adapters are the same on every rank and do
    not shift any later draw).
    """
    from peft import inject_adapter_in_model

    if rank < 1:
        raise ValueError(f"--lora-rank must be >= 1 to apply LoRA, got {rank}")
    check_lora_targets(model, targets)
    config = lora_config(model, rank, alpha, targets, dropout)
    if seed is None:
        inject_adapter_in_model(config, model)
    else:
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.2x
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # reentrant checkpoints need an input that requires grad
    return model


def lora_config(
    model: nn.Module, rank: int, alpha: float, targets: Sequence[str], dropout: float = 0.0
) -> Any:
    """The peft ``LoraConfig`` of :func:`apply_lora` (``fan_in_fan_out`` where the targets are ``Conv1D``)."""
    from peft import LoraConfig
    from transformers.pytorch_utils import Conv1D

    names = resolve_lora_targets(model, targets)
    hit = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in names and _is_linear(m)]
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=names,
        bias="none",
        fan_in_fan_out=bool(hit) and all(isinstance(m, Conv1D) for m in hit),
    )


def save_adapter(
    model: nn.Module,
    folder: str | os.PathLike,
    config: Any,
    base: str | os.PathLike,
    gather: Callable[[list[nn.Parameter]], Any] | None = None,
    write: bool = True,
) -> Path | None:
    """Write the LoRA adapters of ``model`` alone as a peft adapter folder (``adapter_config.json`` with
    ``base_model_name_or_path = base``, ``adapter_model.safetensors`` with peft's key names
    ``base_model.model.<module>.lora_A.weight``): ``PeftModel.from_pretrained(base model, folder)``
    computes what ``model`` computes. ``gather`` as in :func:`merged_state_items`; ``write`` False (ranks
    other than 0) only takes part in the gathers."""
    state: dict[str, Tensor] = {}
    enter = gather or (lambda params: contextlib.nullcontext())
    for name, p in model.named_parameters():
        if ".lora_" not in name:
            continue
        with enter([p]):
            key = "base_model.model." + name.replace(f".{_ADAPTER}.", ".")
            state[key] = p.detach().to("cpu", copy=True).contiguous()
    if not write:
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config.base_model_name_or_path = str(base)
    config.save_pretrained(str(folder))
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """``{qualified name: peft LoRA layer}`` of ``model`` (empty without LoRA, and without importing
    peft when nothing imported it: then no module can hold an adapter)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _lora_parts(layer: nn.Module) -> tuple[Tensor, Tensor, Tensor, float]:
    base = layer.get_base_layer()
    return base.weight, layer.lora_A[_ADAPTER].weight, layer.lora_B[_ADAPTER].weight, layer.scaling[_ADAPTER]


def merged_weight(layer: nn.Module) -> Tensor:
    """``W + (alpha / r) * B @ A`` of a LoRA layer (its transpose added for a ``Conv1D``, whose ``W`` is
    ``[in, out]``; computed in float32, returned in ``W``'s dtype): the plain weight that computes what
    the wrapped module computes in eval mode."""
    W, A, B, scaling = _lora_parts(layer)
    delta = B.detach().float() @ A.detach().float()
    if getattr(layer, "fan_in_fan_out", False):  # GPT-2's Conv1D keeps its weight [in, out]
        delta = delta.T
    return (W.detach().float() + scaling * delta).to(W.dtype)


def merged_state_items(
    model: nn.Module,
    gather: Callable[[list[nn.Parameter]], Any] | None = None,
    only_adapted: bool = False,
) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` pairs of ``model`` under the base model's names, LoRA merged in.

    Each LoRA-wrapped module yields ``prefix.weight`` = :func:`merged_weight` and its bias as is; the
    adapters' own tensors are not yielded. With ``only_adapted`` that is all (what a rollout copy
    that started from the base weights needs after an update: nothing else changes); otherwise every
    other parameter follows, then the persistent buffers. Without LoRA: the parameters and persistent
    buffers. ``gather(params)`` is a context manager entered around each yield (ZeRO-3 gathers the
    tensors it is given); a yielded tensor may be a view of gathered memory: copy it before the next.
    """
    enter = gather or (lambda params: contextlib.nullcontext())
    layers = lora_layers(model)
    for name, p in model.named_parameters():
        if ".lora_" in name and name.rsplit(".lora_", 1)[0] in layers:
            continue  # the adapter itself: merged into its base weight
        prefix, wrapped, suffix = name.partition(".base_layer.")
        if wrapped and prefix in layers:
            if suffix == "weight":
                W, A, B, _ = _lora_parts(layers[prefix])
                with enter([W, A, B]):
                    yield f"{prefix}.weight", merged_weight(layers[prefix])
            else:
                with enter([p]):
                    yield f"{prefix}.{suffix}", p.data
        elif not only_adapted:
            with enter([p]):
                yield name, p.data
    if not only_adapted:
        persistent = set(model.state_dict().keys())
        yield from ((n, b) for n, b in model.named_buffers() if n in persistent)


def adapted_tensor_names(model: nn.Module) -> list[str]:
    """The base-model names :func:`merged_state_items` yields with ``only_adapted`` (no tensor touched)."""
    layers = lora_layers(model)
    out = []
    for name, _ in model.named_parameters():
        prefix, wrapped, suffix = name.partition(".base_layer.")
        if wrapped and prefix in layers:
            out.append(f"{prefix}.{suffix}")
    return out


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Inside, every LoRA layer of ``model`` computes its base layer alone (``y = W x + b``).

    Sets peft's per-layer switch (``_disable_adapters``) and restores it. peft's own
    ``enable_adapters(False)`` also flips ``requires_grad`` of the adapters, which would change what
    an optimizer or DeepSpeed's gradient hooks track; only the forward is switched here.
    """
    layers = list(lora_layers(_unwrap(model)).values())
    saved = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, was in zip(layers, saved):
            layer._disable_adapters = was


class BaseModelView(nn.Module):
    """The actor with its adapters off: the base model, for a KL reference without a second copy.

    ``view(...)`` calls ``model(...)`` (the actor, or its DeepSpeed wrapper) inside
    :func:`adapters_disabled`. The actor is held as ``.module`` but not registered as a submodule, so
    ``view.eval()``, ``view.requires_grad_(False)`` or ``view.parameters()`` never reach the actor's
    parameters; :func:`accepts_kwarg` still sees the actor's ``forward``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not lora_layers(_unwrap(model)):
            raise ValueError("BaseModelView needs a model with LoRA adapters (apply_lora)")
        object.__setattr__(self, "module", model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_disabled(self.module):
            return self.module(*args, **kwargs)
