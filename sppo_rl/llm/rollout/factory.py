"""The one place that picks a rollout backend (and its sampling settings) from a run's settings.

======================================  ==========================================================
run settings                            backend
======================================  ==========================================================
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


def sampler_context(cfg: Any) -> int | None:
    """The longest prompt + response the run's sampler takes whatever the model: ``--vllm-max-model-len``
    with vLLM rollouts (None: the model's context, or no cap)."""
    return cfg.vllm.max_model_len if cfg.rollout == "vllm" and cfg.vllm.max_model_len else None


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
    models, vllm, latent = plan.models, plan.rollout.vllm, plan.latent
    if plan.rollout.worker == "process":
        return worker_rollout(plan, actor, tokenizer, actor_path, dtype=dtype, device=device, pad_id=pad_id)
    if plan.rollout.backend == "vllm":
        from sppo_rl.llm.rollout.vllm import VLLMRollout

        # the engine restores the RNG states, thread count and signal handlers it changes when it starts
        engine = VLLMRollout(
            actor_path,
            tokenizer,
            dtype=vllm.dtype or models.dtype,
            seed=plan.loop.seed,
            add_special_tokens=False,
            max_model_len=vllm.max_model_len,
            gpu_memory_utilization=vllm.gpu_memory_utilization,
            enable_sleep_mode=vllm.sleep,
            sync_timeout_s=models.collective_timeout,
            pad_id=pad_id,
        )
        if models.lora.rank:  # each vLLM layer a sync touches must get all its parts
            from sppo_rl.llm.models.lora import adapted_tensor_names

            engine.check_partial_sync(adapted_tensor_names(actor))
        return engine
    backend = latent.rollout if latent is not None else HFRollout
    if models.engine == "torch":
        autocast = torch.bfloat16 if models.autocast == "bfloat16" else None
        return backend(
            actor, tokenizer, add_special_tokens=False, shares_actor=True, autocast=autocast, pad_id=pad_id
        )
    from sppo_rl.llm.models.core import load_actor

    replica = load_actor(actor_path, dtype=dtype, device=device).eval().requires_grad_(False)
    return backend(replica, tokenizer, add_special_tokens=False, pad_id=pad_id)


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
    from functools import partial

    from sppo_rl.llm.rollout.worker import RolloutWorker

    models, vllm, latent = plan.models, plan.rollout.vllm, plan.latent
    if plan.rollout.backend == "vllm":
        names = None
        if models.lora.rank:
            from sppo_rl.llm.models.lora import adapted_tensor_names

            names = list(adapted_tensor_names(actor))
        kwargs = {
            "dtype": vllm.dtype or models.dtype, "seed": plan.loop.seed, "add_special_tokens": False,
            "max_model_len": vllm.max_model_len, "gpu_memory_utilization": vllm.gpu_memory_utilization,
            "enable_sleep_mode": False, "sync_timeout_s": models.collective_timeout, "pad_id": pad_id,
        }  # fmt: skip
        build = partial(_vllm_in_worker, str(actor_path), kwargs, names)
    else:
        backend = latent.rollout if latent is not None else HFRollout
        autocast = "bfloat16" if models.engine == "torch" and models.autocast == "bfloat16" else None
        dtype_name = str(dtype).removeprefix("torch.")
        build = partial(_hf_in_worker, str(actor_path), dtype_name, str(device), pad_id, autocast, backend)
    return RolloutWorker(build, tokenizer, threads=plan.rollout.worker_threads)


def _hf_in_worker(
    actor_path: str, dtype: str, device: str, pad_id: int, autocast: str | None, backend: Any
) -> Rollout:
    """In the worker: ``backend`` (:class:`HFRollout` or the latent one) on a replica of ``actor_path``."""
    from sppo_rl.llm.models.core import load_actor, quiet_transformers
    from sppo_rl.llm.models.tiny import load_tokenizer

    tokenizer = load_tokenizer(actor_path)
    quiet_transformers()
    # parameters left requiring grad, as the trained actor's: torch's CPU kernels under no_grad round the
    # log-probs differently (~5e-7) for weights that require grad, and the replica must match the actor
    replica = load_actor(Path(actor_path), dtype=getattr(torch, dtype), device=torch.device(device)).eval()
    cast = getattr(torch, autocast) if autocast else None
    return backend(replica, tokenizer, add_special_tokens=False, pad_id=pad_id, autocast=cast)


def _vllm_in_worker(actor_path: str, kwargs: dict[str, Any], adapted: list[str] | None) -> Rollout:
    """In the worker: a one-rank vLLM engine on ``actor_path`` (LoRA: its partial sync checked)."""
    from sppo_rl.llm.models.tiny import load_tokenizer
    from sppo_rl.llm.rollout.vllm import VLLMRollout

    engine = VLLMRollout(Path(actor_path), load_tokenizer(actor_path), **kwargs)
    if adapted is not None:
        engine.check_partial_sync(adapted)
    return engine
