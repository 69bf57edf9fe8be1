"""What an LLM run trains, built from its :class:`~sppo_rl.llm.plan.Plan`, in this order (the order fixes the
random draws of LoRA's initialisation and of the value heads): the actor's folder (the embedded tiny
model warm-started on the task once, or ``--model``), its tokenizer, every prompt rendered for it
(chat template, system prompt, instruction) and fitted to its context, the actor (LoRA adapters if
on), the KL reference (a frozen copy; with LoRA the actor with its adapters off), the critic (a value
head on the actor's or ``--critic-model``'s backbone), their training engines, the rollout."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sppo_rl.llm.data.files import Example, fit_prompts
from sppo_rl.llm.data.prompts import prompt_format, render_examples
from sppo_rl.llm.models.checks import check_same_tokenizer
from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.critic import CRITICS
from sppo_rl.llm.models.engines import make_engine
from sppo_rl.llm.models.lora import BaseModelView, apply_lora, lora_config
from sppo_rl.llm.models.sources import embedded_model, model_context, model_folder
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.factory import context_limit, make_rollout
from sppo_rl.llm.rollout.hf import autocast_to
from sppo_rl.llm.stages.to_batch import rollout_rows
from sppo_rl.runtime.run import RunError


@dataclass
class Models:
    """The run's models: the actor's folder, its tokenizer, the actor, the KL reference (None: off), the
    critic (None: none), their training engines, the rollout (:mod:`sppo_rl.llm.rollout`), the LoRA adapter
    config (None: full fine-tuning), what the embedded model's warm start reported, and the critic's
    backbone folder (None: no critic)."""

    actor_path: Path
    tokenizer: Any
    actor: Any
    ref: Any
    critic: Any
    actor_engine: Any
    critic_engine: Any
    rollout: Any
    adapter_config: Any
    warmstart: dict[str, Any]
    critic_path: Path | None = None


def actor_folder(
    plan: Any, train: list[Example], scorer: Any, main_first: Any
) -> tuple[Path, dict[str, Any]]:
    """The actor's folder (built on rank 0 first) and the warm start's report (empty for ``--model``)."""
    cfg, latent = plan.cfg, plan.latent
    if cfg.model is None:
        build = latent.embedded_model if latent else embedded_model
        return main_first(lambda: build(cfg, train, scorer))
    path = main_first(lambda: model_folder(cfg, cfg.model))  # a named model: built once
    if not (path / "config.json").is_file():
        raise RunError(f"--model {path}: not a Hugging Face model folder (no config.json)")
    return path, {}


def prepare_prompts(
    plan: Any, train: list[Example], val: list[Example], tokenizer: Any, actor_path: Path, warn: bool
) -> tuple[list[Example], list[Example]]:
    """Every prompt rendered once (the text the model reads), then the training and validation prompts
    longer than ``--max-prompt-tokens`` (at most the model's context minus ``--max-new-tokens``) dropped,
    counted in a warning; a set left empty is refused."""
    cfg = plan.cfg
    try:
        fmt = prompt_format(cfg)
        train, val = (render_examples(s, tokenizer, fmt) for s in (train, val))
    except ValueError as e:
        raise RunError(str(e)) from None
    ctx = context_limit(cfg, model_context(actor_path))
    limit, why = cfg.max_prompt_tokens, "--max-prompt-tokens"
    if ctx is not None:
        room = ctx - cfg.max_new_tokens
        if room < 1:
            raise RunError(
                f"--max-new-tokens {cfg.max_new_tokens} leaves no room for a prompt in the model's "
                f"context of {ctx} tokens"
            )
        if limit is None or limit > room:
            limit = room
            why = f"the model's context of {ctx} tokens minus --max-new-tokens {cfg.max_new_tokens}"
    elif limit is None:
        limit, why = 1024, "the default --max-prompt-tokens: the model's config gives no context length"
    out = []
    for examples, where in ((train, cfg.task), (val, cfg.val_data or f"{cfg.task} (validation)")):
        kept = fit_prompts(examples, tokenizer, limit, where=where, why=why, warn=warn)
        if examples and not kept:
            raise RunError(
                f"{where}: none of its {len(examples)} prompts fits in {limit} tokens ({why}); shorten "
                "them, or raise --max-prompt-tokens with a model of a longer context"
            )
        out.append(kept)
    return out[0], out[1]


def build_models(
    plan: Any, actor_path: Path, tokenizer: Any, warmstart: dict[str, Any], main_first: Any
) -> Models:
    """The actor, reference, critic, engines and rollout of ``plan`` (see the module docstring)."""
    cfg, device = plan.cfg, plan.device
    dtype = getattr(torch, cfg.dtype)
    actor = load_actor(actor_path, dtype=dtype, device=device)
    if cfg.gradient_checkpointing:
        actor.gradient_checkpointing_enable()
    lora = dict(alpha=cfg.lora.alpha, targets=cfg.lora.targets, dropout=cfg.lora.dropout)
    adapter_config = None
    if cfg.lora.rank:
        adapter_config = lora_config(actor, cfg.lora.rank, cfg.lora.alpha, cfg.lora.targets, cfg.lora.dropout)
        apply_lora(actor, cfg.lora.rank, seed=cfg.seed, **lora)
    ref = None
    if cfg.kl_coef > 0 and not cfg.lora.rank:  # with LoRA: the actor with its adapters off (below)
        ref = load_actor(actor_path, dtype=dtype, device=device).eval().requires_grad_(False)
    critic, critic_path = None, None
    kind = plan.algo.requires.critic
    if kind != "none":
        critic_path = (
            main_first(lambda: model_folder(cfg, cfg.critic_model)) if cfg.critic_model else actor_path
        )
        if cfg.critic_model:
            check_same_tokenizer(tokenizer, load_tokenizer(critic_path))
        critic = CRITICS[kind].from_backbone(critic_path, dtype=dtype, device=device)
        if cfg.gradient_checkpointing:
            critic.gradient_checkpointing_enable()
        if cfg.lora.rank:  # the value head stays fully trainable
            apply_lora(critic.backbone, cfg.lora.rank, seed=cfg.seed + 1, **lora)
    kw = dict(
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        zero_stage=cfg.zero_stage,
        offload=cfg.offload,
        dtype=dtype,
    )
    actor_engine = make_engine(cfg.engine, actor, cfg.actor_lr, **kw)
    critic_engine = make_engine(cfg.engine, critic, cfg.critic_lr, **kw) if critic else None
    if cfg.kl_coef > 0 and cfg.lora.rank:
        ref = BaseModelView(actor_engine.module)
    rollout = make_rollout(cfg, actor, tokenizer, actor_path, dtype=dtype, device=device, latent=plan.latent)
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
    )


def row_fn(plan: Any) -> Any:
    """The learner's world callable over rows, ``rows(rb, model, policy)``: the latent policy's for its
    actor, else :func:`~sppo_rl.llm.stages.to_batch.rollout_rows` at the rollout temperature."""
    cfg, latent, device = plan.cfg, plan.latent, plan.device
    autocast = torch.bfloat16 if cfg.autocast == "bfloat16" else None

    def rows(rb: Any, model: Any, policy: bool) -> Any:
        if policy and latent is not None:
            fn = latent.rows(rb, model, cfg.temperature, device)
        else:
            fn = rollout_rows(rb, model, policy, cfg.temperature, device)
        if autocast is None:
            return fn

        def mixed(*args: Any) -> Any:  # --autocast: the forward in bfloat16 matmuls; backward follows it
            with autocast_to(autocast, device):
                return fn(*args)

        return mixed

    return rows


def config_record(plan: Any, m: Models, n_train: int, n_val: int, ranks: int) -> dict[str, Any]:
    """What ``config.json`` records beside the settings as given (its ``resolved``)."""
    import dataclasses

    return {
        "group_size": plan.group_size,
        "rows_per_step": plan.rows_per_step,
        "ranks": ranks,
        "actor": str(m.actor_path),
        "critic": str(m.critic_path or "none"),  # a folder, as the actor's (a named model resolved)
        "warmstart": m.warmstart,
        "train_examples": n_train,
        "val_examples": n_val,
        "reward_fn": plan.reward_fn,
        "device": str(plan.device),
        "learner": dataclasses.asdict(plan.learner),  # the update's settings in force
        "unset": plan.unset,
        "latent": dataclasses.asdict(plan.latent.settings) if plan.latent else None,
    }


CRITIC_INIT_CLIP = 0.01
"""``--critic-init first-batch`` clips the first batch's success rate to ``[0.01, 0.99]`` (a batch of
all 0 or all 1 would otherwise ask for an infinite logit)."""


def init_critic_bias(critic: Any, rewards: Tensor, valid: Tensor, dist: Any) -> float:
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
