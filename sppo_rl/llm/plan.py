"""Resolve once: an LLM run's settings, checked and derived in one place before any file is touched.

:func:`resolve` turns the user's :class:`~sppo_rl.llm.config.LLMConfig` into a frozen :class:`Plan`, in
this order (each step may refuse the run in one line, :class:`~sppo_rl.runtime.run.RunError` or
``ValueError``; nothing has been written yet):

1. every setting's type and range (:meth:`LLMConfig.validate`), ``max_new_tokens`` and ``actor_lr`` left
   at None becoming the task's and the model's defaults (:func:`~sppo_rl.llm.config.default_max_new_tokens`,
   :func:`~sppo_rl.llm.config.default_actor_lr`);
2. the algorithm, and the settings left unset becoming its own
   (:func:`~sppo_rl.agents.algorithms.with_algorithm_defaults`: GSPO's clip range, REINFORCE++'s KL);
3. group size ``G`` (``--group-size``, else the method's), the batch's shape (``prompts_per_step``
   prompts x ``G`` samples, ``prompts_per_step / ranks`` prompts per rank, minibatches within a rank's
   rows), the launcher's ranks against ``--engine``, DeepSpeed's config;
4. the model folders, the data and the reward function (:func:`~sppo_rl.llm.models.sources.check_model_paths`,
   :func:`~sppo_rl.llm.data.tasks.load_task`), LoRA targets against the models' ``config.json``;
5. the latent policy's settings for a latent algorithm (:func:`~sppo_rl.llm.latent.plugin.configure_latent`);
   the model cache (:func:`~sppo_rl.llm.models.sources.check_cache`), ``--max-new-tokens`` against the actor's
   context (:func:`~sppo_rl.llm.models.sources.check_context`), the critic's tokenizer against the actor's
   (:func:`~sppo_rl.llm.models.sources.check_critic_tokenizer`);
6. the device, the rollout's sampling settings, the learner's :class:`~sppo_rl.agents.learner.LearnerConfig`
   and the estimator's parameters.

The trainer builds its models and its stages from the plan and never re-derives a setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from sppo_rl.agents.algorithms import (
    Algorithm,
    check_setup,
    default_group_size,
    estimator_params,
    get_algorithm,
    with_algorithm_defaults,
)
from sppo_rl.agents.learner import LearnerConfig
from sppo_rl.config import flat_dict, get_flat
from sppo_rl.llm.config import LLMConfig, default_actor_lr, default_max_new_tokens, named_model
from sppo_rl.llm.data.files import Example
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.runtime.run import RunError


@dataclass(frozen=True)
class Plan:
    """Everything an LLM run derives from its config, computed once by :func:`resolve`.

    Attributes:
        given: the config as the user gave it (``max_new_tokens`` resolved): saved to ``config.json`` and
            compared on ``--resume``.
        cfg: ``given`` with the settings left unset (None) replaced by the algorithm's own; the run
            reads its settings here.
        algo: the algorithm (a latent one with its selector as ``--latent-first-token`` sets it).
        latent: the latent policy's settings (None: a token policy).
        group_size: ``G``, samples per prompt.
        ranks: data-parallel processes; ``local_prompts = prompts_per_step / ranks`` prompts each.
        device: where the models train.
        reward_fn: the reward function's spec, ``auto`` resolved.
        sampling: the rollout's sampling settings, one sample per prompt (each call sets ``n``).
        learner: the update's settings (:class:`~sppo_rl.agents.learner.LearnerConfig`).
        estimator: the estimator's keyword parameters (:func:`~sppo_rl.agents.algorithms.estimator_params`).
        unset: the settings the user left unset and what they became.
    """

    given: LLMConfig
    cfg: LLMConfig
    algo: Algorithm
    latent: Any
    group_size: int
    ranks: int
    local_prompts: int
    device: torch.device
    reward_fn: str
    sampling: SamplingParams
    learner: LearnerConfig
    estimator: dict[str, Any]
    unset: dict[str, Any]

    @property
    def rows_per_step(self) -> int:
        """``prompts_per_step x G`` responses in one update, over all ranks."""
        return self.cfg.prompts_per_step * self.group_size

    @property
    def kl_reward(self) -> bool:
        """Whether a KL penalty is subtracted from the token rewards (else, with ``kl_coef > 0``, it is a
        loss term)."""
        return self.cfg.kl_coef > 0 and self.cfg.kl_in == "reward"

    @property
    def fused(self) -> bool:
        """One on-policy pass (1 epoch, 1 minibatch) needs no separate old-log-prob forward: the learner
        takes ``logp.detach()`` of its training pass, unless the estimator or a KL reward needs it first."""
        cfg = self.cfg
        return cfg.epochs * cfg.minibatches == 1 and not self.algo.requires.logprobs and not self.kl_reward

    @property
    def critic_init(self) -> bool:
        """``--critic-init`` resolved: set a success (BCE) critic's head from the first batch on a fresh run
        ('auto': with ``--model``); not under DeepSpeed, whose fp32 partitions hold their own copy of the head."""
        cfg = self.cfg
        mode = cfg.critic_init if cfg.critic_init != "auto" else ("first-batch" if cfg.model else "none")
        has_critic = self.algo.requires.critic != "none"
        return (
            mode == "first-batch" and has_critic and self.algo.critic_loss == "bce" and cfg.engine == "torch"
        )


@dataclass(frozen=True)
class Task:
    """The run's data as :func:`resolve` loaded it (prompts not yet rendered for the model)."""

    train: list[Example]
    val: list[Example]


def as_given(cfg: LLMConfig) -> LLMConfig:
    """``cfg`` as the run records it in ``config.json`` (:attr:`Plan.given`): ``max_new_tokens`` and
    ``actor_lr`` left at None filled with the task's and the model's defaults, and for a named model
    (:class:`~sppo_rl.llm.models.pretrained.Pretrained`) its token budget per training pass when no
    micro-batch setting is given, its small critic (``NAME:layers=L``, :attr:`Pretrained.critic_layers`)
    when the algorithm trains one and ``--critic-model`` is unset, and, on the generated arithmetic task,
    its prompt wording (``--arithmetic-prompt``; 'equation' without a named model), instruction (when
    ``--instruction`` is unset) and reward (for ``--reward-fn auto``); the rest unchanged."""
    if cfg.max_new_tokens is None:
        cfg = dataclasses.replace(cfg, max_new_tokens=default_max_new_tokens(cfg.task, cfg.level, cfg.model))
    if cfg.actor_lr is None:
        cfg = dataclasses.replace(cfg, actor_lr=default_actor_lr(cfg.model))
    named = named_model(cfg.model)
    if cfg.task == "arithmetic" and cfg.arithmetic_prompt is None:
        cfg = dataclasses.replace(cfg, arithmetic_prompt=named.arithmetic_prompt if named else "equation")
    if named is None:
        return cfg
    if cfg.micro_batch_size is None and cfg.max_tokens_per_micro_batch is None:
        cfg = dataclasses.replace(cfg, max_tokens_per_micro_batch=named.max_tokens_per_micro_batch)
    if cfg.critic_model is None and _trains_a_critic(cfg.algo):
        cfg = dataclasses.replace(cfg, critic_model=f"{named.name}:layers={named.critic_layers}")
    if cfg.task == "arithmetic" and cfg.instruction is None:
        cfg = dataclasses.replace(cfg, instruction=named.arithmetic_instruction)
    if cfg.task == "arithmetic" and cfg.reward_fn == "auto":
        cfg = dataclasses.replace(cfg, reward_fn=named.arithmetic_reward)
    return cfg


def _trains_a_critic(name: str) -> bool:
    """Whether algorithm ``name`` trains a critic (False for an unknown name: ``validate`` refuses it)."""
    try:
        return get_algorithm(name).requires.critic != "none"
    except (KeyError, ValueError):
        return False


def resolve(cfg: LLMConfig, dist: Any) -> tuple[Plan, Task]:
    """The frozen :class:`Plan` of ``cfg`` for a run on ``dist``'s ranks (the launcher's, read from its
    environment), and the data it loaded; every refusal of the run's settings happens here, in the order
    of the module docstring. ``cfg`` itself is left unchanged."""
    from sppo_rl.llm.data.tasks import load_task
    from sppo_rl.llm.latent.plugin import configure_latent
    from sppo_rl.llm.models.lora import check_lora_targets_of
    from sppo_rl.llm.models.sources import (
        check_cache,
        check_context,
        check_critic_tokenizer,
        check_model_paths,
        model_folder,
    )
    from sppo_rl.llm.rollout.factory import sampling_params

    cfg = as_given(cfg)
    cfg.validate()
    given = cfg
    algo = get_algorithm(cfg.algo)
    cfg = with_algorithm_defaults(cfg, algo)
    req = algo.requires
    G = cfg.group_size if cfg.group_size is not None else default_group_size(algo)
    check_setup(algo, G, cfg.prompts_per_step * G, use_critic=cfg.critic_model != "none")
    if cfg.dynamic_sampling_rounds and not req.groups:
        raise RunError(
            f"--dynamic-sampling-rounds drops groups whose outcomes are all equal; {algo.name} samples "
            "no groups (use a group method: grpo, drgrpo, rloo, gspo, cispo, bppo, lampo, reinforce++-baseline)"
        )
    if req.tracker and dist.world > 1:
        raise RunError(
            f"{algo.name} keeps one value tracker of every prompt: one process only ({dist.world} launched)"
        )
    if cfg.steps < 1 or cfg.prompts_per_step < 1:
        raise RunError("--steps and --prompts-per-step must be >= 1")
    if dist.world > 1 and cfg.engine != "deepspeed":
        raise RunError(
            f"{dist.world} processes were launched; multi-process training needs --engine deepspeed"
        )
    if cfg.prompts_per_step % dist.world:
        raise RunError(
            f"--prompts-per-step ({cfg.prompts_per_step}) must be a multiple of the {dist.world} ranks"
        )
    local_prompts = cfg.prompts_per_step // dist.world
    rows = local_prompts * G
    if cfg.minibatches < 1 or cfg.minibatches > rows:
        raise RunError(f"--minibatches must be in [1, {rows}] (rows per rank and step)")
    if cfg.engine == "deepspeed":
        from sppo_rl.llm.models.engines import deepspeed_config

        deepspeed_config(
            cfg.zero_stage, cfg.max_grad_norm, cfg.offload, getattr(torch, cfg.dtype)
        )  # validates
        if not cfg.optimizer_state:
            raise RunError("--no-optimizer-state: not with --engine deepspeed (its shards hold them)")
    check_model_paths(cfg)  # and the data and the reward function
    if cfg.lora.rank:  # LoRA targets against the models' config.json (no weights read)
        try:
            no_critic = req.critic == "none" or cfg.critic_model == "none"
            critic_folder = False if no_critic else model_folder(cfg, cfg.critic_model)
            check_lora_targets_of(cfg.lora.targets, model_folder(cfg, cfg.model), critic_folder)
        except ValueError as e:
            raise RunError(str(e)) from None
    train, val, reward_fn = load_task(cfg)
    if not train:
        raise RunError(f"{cfg.task}: no training examples")
    if req.tracker and cfg.prompts_per_step > len(train):
        raise RunError(
            f"{algo.name} draws --prompts-per-step ({cfg.prompts_per_step}) distinct prompts per update; "
            f"the task has {len(train)}"
        )
    algo, latent = configure_latent(cfg, algo, train)  # None: a token policy
    check_cache(cfg, latent=latent is not None)  # a cache that is a file, or read-only with a model to build
    check_context(cfg)  # --max-new-tokens against the actor's context
    if req.critic != "none":
        check_critic_tokenizer(cfg)
    sampling = sampling_params(cfg)
    if cfg.device == "auto":
        device = torch.device(f"cuda:{dist.local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    learner = LearnerConfig.from_run(
        cfg, cfg.max_new_tokens, algo.defaults, kl_coef=cfg.kl_coef if cfg.kl_in == "loss" else 0.0
    )
    unset = {k: get_flat(cfg, k) for k, v in flat_dict(given).items() if v is None}
    plan = Plan(
        given=given,
        cfg=cfg,
        algo=algo,
        latent=latent,
        group_size=G,
        ranks=dist.world,
        local_prompts=local_prompts,
        device=device,
        reward_fn=reward_fn,
        sampling=sampling,
        learner=learner,
        estimator=estimator_params(cfg),
        unset=unset,
    )
    return plan, Task(train, val)
