"""What an LLM run trains, built from its :class:`~sppo_rl.llm.plan.Plan`, in this order (the order fixes the
random draws of LoRA's initialisation and of the value heads): the actor's folder (the embedded tiny
model warm-started on the task once, or ``--model``), its tokenizer, every prompt rendered for it
(chat template, system prompt, instruction) and fitted to its context, the actor (LoRA adapters if
on), the KL reference (a frozen copy; with LoRA the actor with its adapters off; also A*-PO's pi_ref),
the critic (a value head on the actor's or ``--critic-model``'s backbone), their training engines, the
rollout."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from sppo_rl.agents.learner import Reducer, RowsFn
from sppo_rl.llm.data.files import Example, fit_prompts
from sppo_rl.llm.data.prompts import render_examples
from sppo_rl.llm.models.checks import check_same_tokenizer
from sppo_rl.llm.models.core import float32_head, load_actor
from sppo_rl.llm.models.critic import CRITICS, SequenceCritic, StepCritic
from sppo_rl.llm.models.engines import DeepSpeedEngine, HFTorchEngine, make_engine
from sppo_rl.llm.models.lora import BaseModelView, apply_lora, lora_config
from sppo_rl.llm.models.sources import embedded_model, model_context, model_folder
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.base import Rollout, RolloutBatch, pad_id_of
from sppo_rl.llm.rollout.factory import context_limit, make_rollout
from sppo_rl.llm.rollout.hf import autocast_to
from sppo_rl.llm.stages.to_batch import rollout_rows
from sppo_rl.runtime.run import RunError

if TYPE_CHECKING:
    from sppo_rl.llm.plan import Plan

RowsOf = Callable[[RolloutBatch, Any, bool], RowsFn]
TrainingEngine = HFTorchEngine | DeepSpeedEngine
"""A model's training engine (:func:`~sppo_rl.llm.models.engines.make_engine`)."""
MainFirst = Callable[[Callable[[], Any]], Any]
"""Runs a task on rank 0 first, then hands its result (or error) to every rank (``LLMRun._main_first``)."""
"""The learner's world callable over rows, ``rows(rb, model, policy)`` (:func:`row_fn`): the
:data:`~sppo_rl.agents.learner.RowsFn` of ``model`` on the rows of ``rb``."""


@dataclass
class Models:
    """The run's models: the actor's folder, its tokenizer, the actor, the KL reference (None: off), the
    critic (None: none), their training engines, the rollout (:mod:`sppo_rl.llm.rollout`), the LoRA adapter
    config (None: full fine-tuning), what the embedded model's warm start reported, the critic's
    backbone folder (None: no critic), and ``pad_id``: the one id that pads the run's rows, in its sampler
    and its stages (:func:`~sppo_rl.llm.rollout.base.pad_id_of` its tokenizer)."""

    actor_path: Path
    tokenizer: Any  # transformers' tokenizer
    actor: nn.Module
    ref: nn.Module | None
    critic: SequenceCritic | StepCritic | None
    actor_engine: TrainingEngine
    critic_engine: TrainingEngine | None
    rollout: Rollout
    adapter_config: Any  # peft's LoraConfig
    warmstart: dict[str, Any]
    critic_path: Path | None
    pad_id: int


def actor_folder(plan: Plan, train: list[Example], main_first: MainFirst) -> tuple[Path, dict[str, Any]]:
    """The actor's folder (built on rank 0 first) and the warm start's report (empty for ``--model``): the
    plan's folder where planning resolved it (:attr:`~sppo_rl.llm.plan.ModelSettings.actor_folder`), else
    resolved here once."""
    latent, models = plan.latent, plan.models
    if models.model is None:
        build = latent.embedded_model if latent else embedded_model
        return main_first(lambda: build(models.warmstart, train))
    path = models.actor_folder
    if path is None:  # a named model: built once
        path = main_first(lambda: model_folder(models.cache, models.model))
    if not (path / "config.json").is_file():
        raise RunError(f"--model {path}: not a Hugging Face model folder (no config.json)")
    return path, {}


def prepare_prompts(
    plan: Plan, train: list[Example], val: list[Example], tokenizer: Any, actor_path: Path, warn: bool
) -> tuple[list[Example], list[Example]]:
    """Every prompt rendered once (the text the model reads), then the training and validation prompts
    longer than ``--max-prompt-tokens`` (at most the model's context minus ``--max-new-tokens``) dropped,
    counted in a warning; a set left empty is refused."""
    data, max_new_tokens = plan.data, plan.rollout.max_new_tokens
    try:
        train, val = (render_examples(s, tokenizer, data.prompt_format) for s in (train, val))
    except ValueError as e:
        raise RunError(str(e)) from None
    ctx = context_limit(plan.rollout.context_cap, model_context(actor_path))
    limit, why = data.max_prompt_tokens, "--max-prompt-tokens"
    if ctx is not None:
        room = ctx - max_new_tokens
        if room < 1:
            raise RunError(
                f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's "
                f"context of {ctx} tokens"
            )
        if limit is None or limit > room:
            limit = room
            why = f"the model's context of {ctx} tokens minus --max-new-tokens {max_new_tokens}"
    elif limit is None:
        limit, why = 1024, "the default --max-prompt-tokens: the model's config gives no context length"
    out = []
    for examples, where in ((train, data.task), (val, data.val_data or f"{data.task} (validation)")):
        kept = fit_prompts(examples, tokenizer, limit, where=where, why=why, warn=warn)
        if examples and not kept:
            raise RunError(
                f"{where}: none of its {len(examples)} prompts fits in {limit} tokens ({why}); shorten "
                "them, or raise --max-prompt-tokens with a model of a longer context"
            )
        out.append(kept)
    return out[0], out[1]


def build_models(
    plan: Plan, actor_path: Path, tokenizer: Any, warmstart: dict[str, Any], main_first: MainFirst
) -> Models:
    """The actor, reference, critic, engines and rollout of ``plan`` (see the module docstring)."""
    settings, device, seed, kl_coef = plan.models, plan.device, plan.loop.seed, plan.update.kl_coef
    needs_ref = kl_coef > 0 or plan.algo.requires.optimal_values  # the KL's reference, or A*-PO's pi_ref
    dtype, lora = getattr(torch, settings.dtype), settings.lora
    actor = load_actor(actor_path, dtype=dtype, device=device)
    if settings.gradient_checkpointing:
        actor.gradient_checkpointing_enable()
    adapter_config = None
    if lora.rank:
        adapter_config = lora_config(actor, lora.rank, lora.alpha, lora.targets, lora.dropout)
        apply_lora(actor, lora.rank, seed=seed, alpha=lora.alpha, targets=lora.targets, dropout=lora.dropout)
    ref = None
    if needs_ref and not lora.rank:  # with LoRA: the actor with its adapters off (below)
        ref = load_actor(actor_path, dtype=dtype, device=device).eval().requires_grad_(False)
    critic, critic_path = None, None
    kind = plan.algo.requires.critic
    if kind != "none":
        critic_model = settings.critic_model
        critic_path = settings.critic_folder  # where planning resolved it, else here once
        if critic_path is None:
            critic_path = (
                main_first(lambda: model_folder(settings.cache, critic_model)) if critic_model else actor_path
            )
        if critic_model:
            check_same_tokenizer(tokenizer, load_tokenizer(critic_path))
        critic = CRITICS[kind].from_backbone(critic_path, dtype=dtype, device=device)
        if settings.gradient_checkpointing:
            critic.gradient_checkpointing_enable()
        if lora.rank:  # the value head stays fully trainable
            apply_lora(
                critic.backbone,
                lora.rank,
                seed=seed + 1,
                alpha=lora.alpha,
                targets=lora.targets,
                dropout=lora.dropout,
            )
    if settings.precision == "bf16":  # the LM heads' logits and the value head stay float32
        for model in (actor, ref, critic):
            if model is not None:
                float32_head(model)
    kw = dict(
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.max_grad_norm,
        zero_stage=settings.zero_stage,
        offload=settings.offload,
        dtype=dtype,
    )
    actor_engine = make_engine(settings.engine, actor, settings.actor_lr, **kw)
    critic_engine = make_engine(settings.engine, critic, settings.critic_lr, **kw) if critic else None
    if needs_ref and lora.rank:
        ref = BaseModelView(actor_engine.module)
    pad_id = pad_id_of(tokenizer)  # resolved once: the sampler's and the stages'
    rollout = make_rollout(plan, actor, tokenizer, actor_path, dtype=dtype, device=device, pad_id=pad_id)
    return Models(
        actor_path,
        tokenizer,
        actor,
        ref,
        critic,
        actor_engine,
        critic_engine,
        rollout,
        adapter_config,
        warmstart,
        critic_path,
        pad_id,
    )


def row_fn(plan: Plan) -> RowsOf:
    """The learner's world callable over rows, ``rows(rb, model, policy)``: the latent policy's for its
    actor, else :func:`~sppo_rl.llm.stages.to_batch.rollout_rows` at the rollout temperature."""
    latent, device, temperature = plan.latent, plan.device, plan.rollout.temperature
    shared = plan.models.shared_prompt
    autocast = torch.bfloat16 if plan.models.precision == "bf16" else None

    def rows(rb: RolloutBatch, model: Any, policy: bool) -> RowsFn:
        if policy and latent is not None:
            of_rows = latent.rows(rb, model, temperature, device)
        else:
            of_rows = rollout_rows(rb, model, policy, temperature, device, shared)
        if autocast is None:
            return of_rows

        def mixed(*args: Any) -> Any:  # --precision bf16: bfloat16 matmuls; backward follows
            with autocast_to(autocast, device):
                return of_rows(*args)

        return mixed

    return rows


def config_record(plan: Plan, m: Models, n_train: int, n_val: int, ranks: int) -> dict[str, Any]:
    """What ``config.json`` records beside the settings as given (its ``resolved``)."""
    import dataclasses

    return {
        "group_size": plan.rollout.group_size,
        "rows_per_step": plan.rows_per_step,
        "ranks": ranks,
        "actor": str(m.actor_path),
        "critic": str(m.critic_path or "none"),  # a folder, as the actor's (a named model resolved)
        "warmstart": m.warmstart,
        "precision": plan.models.precision,  # --precision resolved
        "threads": plan.loop.threads,  # --threads resolved
        "train_examples": n_train,
        "val_examples": n_val,
        "reward_fn": plan.rewards.fn,
        "device": str(plan.device),
        "learner": dataclasses.asdict(plan.learner),  # the update's settings in force
        "unset": plan.unset,
        "latent": dataclasses.asdict(plan.latent.settings) if plan.latent else None,
    }


CRITIC_INIT_CLIP = 0.01
"""``--critic-init first-batch`` clips the first batch's success rate to ``[0.01, 0.99]`` (a batch of
all 0 or all 1 would otherwise ask for an infinite logit)."""


def init_critic_bias(critic: Any, rewards: Tensor, valid: Tensor, dist: Reducer) -> float:
    """Set the value head's bias of a success critic to ``logit(clip(p0, c, 1 - c))``, ``p0`` the mean
    reward over the valid rows of every rank, ``c`` :data:`CRITIC_INIT_CLIP`; returns ``p0``. The head's
    weights (``N(0, 1e-3^2)``) are kept, so ``sigmoid(V)`` starts within about 1e-3 of ``p0`` on every
    prompt. E.g. ``p0 = 0.06``: bias ``log(0.06 / 0.94) = -2.7515``."""
    total, n = dist.all_sum([float((rewards * valid).sum()), float(valid.sum())])
    p0 = total / max(n, 1.0)
    p = min(max(p0, CRITIC_INIT_CLIP), 1.0 - CRITIC_INIT_CLIP)
    with torch.no_grad():
        critic.head.bias.fill_(math.log(p / (1.0 - p)))
    return p0
