"""The one place that picks a rollout backend (and its sampling settings) from a run's settings.

======================================  ==========================================================
run settings                            backend
======================================  ==========================================================
``--rollout auto`` (the default)        ``vllm`` where :func:`rollout_backend` finds it usable (a
                                        named model, ``vllm`` importable), else ``hf``
``--rollout vllm``                      :class:`~sppo_rl.llm.rollout.vllm.VLLMRollout`, its own copy
                                        of the weights (synced after every update; with LoRA only
                                        the adapted modules, checked at start)
``--rollout hf --engine torch``         :class:`~sppo_rl.llm.rollout.hf.HFRollout` on the actor
                                        itself (``shares_actor``: never synced)
``--rollout hf --engine deepspeed``     :class:`~sppo_rl.llm.rollout.hf.HFRollout` on a replica
                                        (the engine owns the actor's parameters), synced
a latent algorithm                      the latent plug-in's backend in place of ``HFRollout``
                                        (:mod:`sppo_rl.llm.latent.rollout`), on the actor or a replica
======================================  ==========================================================
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.rollout.base import Rollout, SamplingParams
from sppo_rl.llm.rollout.hf import HFRollout

if TYPE_CHECKING:
    from sppo_rl.llm.plan import Plan


def sampling_params(cfg: Any) -> SamplingParams:
    """The run's sampling settings (``--temperature``, ``--top-p``, ``--top-k``, ``--min-p``,
    ``--repetition-penalty``, ``--max-new-tokens``), one sample per prompt."""
    return SamplingParams(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        repetition_penalty=cfg.repetition_penalty,
        max_new_tokens=cfg.max_new_tokens,
    )


def rollout_backend(
    cfg: Any, latent: bool = False, find_spec: Callable[[str], Any] = importlib.util.find_spec
) -> str:
    """The sampler ``--rollout`` names: 'hf' or 'vllm' as given; 'auto' is 'vllm' for a named model (e.g.
    ``smollm2-135m``) with ``--engine torch``, no LoRA and a token policy (``latent`` False) when the
    ``vllm`` package is installed and imports (``find_spec`` finds it), else 'hf'."""
    if cfg.rollout != "auto":
        return cfg.rollout
    from sppo_rl.llm.models.pretrained import parse_ref

    if latent or cfg.engine != "torch" or cfg.lora.rank or parse_ref(cfg.model) is None:
        return "hf"
    return "vllm" if _imports("vllm", find_spec) else "hf"


def _imports(module: str, find_spec: Callable[[str], Any]) -> bool:
    """Whether ``module`` is installed and imports without an error."""
    if find_spec(module) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # a broken install counts as none
        return False
    return True


def sampler_context(cfg: Any, backend: str | None = None) -> int | None:
    """The longest prompt + response the run's sampler takes whatever the model: ``--vllm-max-model-len``
    with vLLM rollouts (``backend``, None: :func:`rollout_backend` of ``cfg``; None: the model's context,
    or no cap)."""
    if not cfg.vllm.max_model_len:
        return None
    return cfg.vllm.max_model_len if (backend or rollout_backend(cfg)) == "vllm" else None


def context_limit(sampler_cap: int | None, model_context: int | None) -> int | None:
    """The longest prompt + response the run's sampler takes: the model's context (None: unknown),
    capped by ``sampler_cap`` (:func:`sampler_context`; None: no cap)."""
    if sampler_cap:
        return min(model_context or sampler_cap, sampler_cap)
    return model_context


def make_rollout(
    plan: Plan,
    actor: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    actor_path: Path,
    *,
    dtype: torch.dtype,
    device: torch.device,
    pad_id: int,
) -> Rollout:
    """The sampler of ``plan`` (see the module's table). ``actor`` is the trained module (the LoRA-wrapped
    one with ``--lora-rank``), ``actor_path`` its model folder, ``pad_id`` the run's
    (:func:`~sppo_rl.llm.rollout.base.pad_id_of`); the plan's latent plug-in
    (:class:`sppo_rl.llm.latent.plugin.LatentPolicy`; None for a token policy) gives its backend. Prompts
    are taken as rendered (``add_special_tokens=False``). With vLLM and LoRA, refuses (``ValueError``)
    adapted modules that would leave one of vLLM's fused layers part-synced."""
    models, latent = plan.models, plan.latent
    if plan.rollout.worker == "process":
        return worker_rollout(plan, actor, tokenizer, actor_path, dtype=dtype, device=device, pad_id=pad_id)
    if plan.rollout.backend == "vllm":
        from sppo_rl.llm.rollout.vllm import VLLMRollout

        # the engine restores the RNG states, thread count and signal handlers it changes when it starts
        engine = VLLMRollout(actor_path, tokenizer, **vllm_settings(plan, pad_id))
        adapted = lora_adapted(plan, actor)
        if adapted is not None:  # each vLLM layer a sync touches must get all its parts
            engine.check_partial_sync(adapted)
        return engine
    backend = latent.rollout if latent is not None else HFRollout
    if models.engine == "torch":
        autocast = torch.bfloat16 if models.precision == "bf16" else None
        return backend(
            actor, tokenizer, add_special_tokens=False, shares_actor=True, autocast=autocast, pad_id=pad_id
        )
    from sppo_rl.llm.models.core import load_actor

    replica = load_actor(actor_path, dtype=dtype, device=device).eval().requires_grad_(False)
    return backend(replica, tokenizer, add_special_tokens=False, pad_id=pad_id)


def vllm_settings(plan: Plan, pad_id: int) -> dict[str, Any]:
    """The keywords of :class:`~sppo_rl.llm.rollout.vllm.VLLMRollout` besides its model and tokenizer, from
    ``plan`` (in the trainer's process or a worker's: a worker never sleeps, ``--vllm-sleep`` is refused
    beside one)."""
    models, vllm = plan.models, plan.rollout.vllm
    return {
        "dtype": vllm.dtype or models.dtype, "seed": plan.loop.seed, "add_special_tokens": False,
        "max_model_len": vllm.max_model_len, "gpu_memory_utilization": vllm.gpu_memory_utilization,
        "enable_sleep_mode": vllm.sleep, "sync_timeout_s": models.collective_timeout, "pad_id": pad_id,
    }  # fmt: skip


def lora_adapted(plan: Plan, actor: nn.Module) -> list[str] | None:
    """The names of the tensors a LoRA sync sends (the adapted modules, merged); None without LoRA."""
    if not plan.models.lora.rank:
        return None
    from sppo_rl.llm.models.lora import adapted_tensor_names

    return list(adapted_tensor_names(actor))


def worker_rollout(
    plan: Plan,
    actor: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    actor_path: Path,
    *,
    dtype: torch.dtype,
    device: torch.device,
    pad_id: int,
) -> Rollout:
    """The sampler of ``plan`` in a worker process (``--rollout-worker process``:
    :class:`~sppo_rl.llm.rollout.worker.RolloutWorker`): the backend the table names, on the worker's own
    replica of ``actor_path`` on ``device`` (vLLM: its own engine, one rank); the trainer pushes the actor's
    weights to it before it samples (:func:`~sppo_rl.llm.stages.sync.sync`)."""
    from sppo_rl.llm.rollout.worker import RolloutWorker, replica_builder

    models, latent = plan.models, plan.latent
    dtype_name = str(dtype).removeprefix("torch.")
    if plan.rollout.backend == "vllm":
        kwargs, adapted = vllm_settings(plan, pad_id), lora_adapted(plan, actor)
        build = replica_builder(
            str(actor_path), dtype_name, pad_id, backend="vllm", vllm_kwargs=kwargs, adapted=adapted
        )
    else:
        autocast = "bfloat16" if models.precision == "bf16" else None
        sampler = latent.rollout if latent is not None else None
        build = replica_builder(
            str(actor_path), dtype_name, pad_id, autocast, device=str(device), sampler=sampler
        )
    return RolloutWorker(build, tokenizer, threads=plan.rollout.worker_threads)
