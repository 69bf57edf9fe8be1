"""Resolve once: an LLM run's settings, checked and derived in one place before any file is touched.

:func:`resolve` turns the user's :class:`~sppo_rl.llm.config.LLMConfig` into a frozen :class:`Plan`, in
this order (each step may refuse the run in one line, :class:`~sppo_rl.runtime.run.RunError` or
``ValueError``; nothing has been written yet):

1. every setting's type and range (:meth:`LLMConfig.validate`: the one check per run; the ``sppo-rl``
   command leaves it to this step), ``max_new_tokens`` and ``actor_lr`` left at None becoming the task's and the model's defaults (:func:`~sppo_rl.llm.config.default_max_new_tokens`,
   :func:`~sppo_rl.llm.config.default_actor_lr`);
2. the algorithm, and the settings left unset becoming its own
   (:func:`~sppo_rl.agents.algorithms.with_algorithm_defaults`: GSPO's clip range, REINFORCE++'s KL);
3. group size ``G`` (``--group-size``, else the method's), the batch's shape (``prompts_per_step``
   prompts x ``G`` samples, ``prompts_per_step / ranks`` prompts per rank, minibatches within a rank's
   rows), the launcher's ranks against ``--engine``, DeepSpeed's config;
4. the model cache (:func:`~sppo_rl.llm.models.sources.cache_folder`, resolved here once), the model folders,
   the data and the reward function (:func:`~sppo_rl.llm.models.sources.check_model_paths`,
   :func:`~sppo_rl.llm.data.tasks.load_task`), LoRA targets against the models' ``config.json`` (the one
   place a named model's folder is resolved before the build: :attr:`ModelSettings.actor_folder`);
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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
from sppo_rl.agents.losses import KLEstimator
from sppo_rl.config import flat_dict, get_flat
from sppo_rl.llm.config import (
    SFT,
    VLLM,
    LLMConfig,
    LoRA,
    Overlong,
    default_actor_lr,
    default_max_new_tokens,
    named_model,
)
from sppo_rl.llm.data.files import Example
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.runtime.plan import AStar, LoopSettings, RunPlan
from sppo_rl.runtime.run import RunError

if TYPE_CHECKING:
    from sppo_rl.llm.data.prompts import PromptFormat


T = TypeVar("T")


@dataclass(frozen=True)
class WarmStart:
    """What the embedded tiny model's warm starts read (:func:`~sppo_rl.llm.models.sources.embedded_model`,
    and the latent ones of :mod:`sppo_rl.llm.latent.warmstart`): the generated ``task`` and its data (``level``, ``data_seed``,
    ``train_size``), ``max_new_tokens``, the fine-tuning's own settings (``sft``; ``latent_sft_steps`` per
    latent stage), the sampling ``temperature`` of its accuracy checks, the run's ``seed``, ``progress``
    bars, the model ``cache`` it is built into (resolved once, by the plan), and ``reward_timeout``, the
    limit of its accuracy checks' verifier (the task's own reward, not ``--reward-fn``:
    :func:`~sppo_rl.llm.models.sources.task_scoring`)."""

    task: str
    level: tuple[int, ...]
    data_seed: int
    train_size: int
    max_new_tokens: int | None
    sft: SFT
    latent_sft_steps: int
    temperature: float
    seed: int
    progress: bool
    cache: Path
    reward_timeout: float


def warm_start_of(cfg: LLMConfig, cache: Path) -> WarmStart:
    """The warm starts' settings of ``cfg``, built into ``cache``."""
    return WarmStart(
        task=cfg.task, level=tuple(cfg.level), data_seed=cfg.data_seed, train_size=cfg.train_size,
        max_new_tokens=cfg.max_new_tokens, sft=cfg.sft, latent_sft_steps=cfg.latent.sft_steps,
        temperature=cfg.temperature, seed=cfg.seed, progress=cfg.progress, cache=cache,
        reward_timeout=cfg.reward_timeout,
    )  # fmt: skip


@dataclass(frozen=True)
class ModelSettings:
    """What the run trains and how: its models, their training engines and their exports.

    Attributes:
        model, critic_model: ``--model`` / ``--critic-model`` as given (None: the embedded tiny model /
            the actor's backbone; 'none': no critic).
        actor_folder, critic_folder: their folders where planning resolved them, so the build does not
            resolve them again: a folder given as a path, and a named model when the LoRA check read its
            ``config.json`` (built into the cache and verified by SHA-256 then); None: the build resolves
            it, on rank 0 first (a named model, built on first use), or the embedded model / the actor's
            backbone / no critic.
        cache: the model cache (``--cache-dir``, else ``$SPPO_RL_CACHE``), resolved once.
        warmstart: the embedded model's warm-start settings (read when ``model`` is None).
        dtype: the weights' torch dtype name; precision: ``--precision`` resolved, 'fp32' or 'bf16'
            (:func:`precision_of`).
        engine, zero_stage, offload, collective_timeout: the training engine (torch or DeepSpeed).
        actor_lr, critic_lr, weight_decay, max_grad_norm: the optimizers.
        lora: the LoRA adapters' settings (rank 0: full fine-tuning).
        gradient_checkpointing: recompute activations in the backward pass.
        shared_prompt: rows sharing a prompt run it once in the policies' log-prob passes (``--shared-prompt``).
        critic_init: ``--critic-init`` resolved (:attr:`Plan.critic_init`).
        optimizer_state, resume_without_optimizer: what checkpoints keep and a resume accepts.
        export_adapter: also export the actor's LoRA adapters alone.
        threads: torch's CPU threads.
    """

    model: str | None
    critic_model: str | None
    actor_folder: Path | None
    critic_folder: Path | None
    cache: Path
    warmstart: WarmStart
    dtype: str
    precision: str
    engine: str
    zero_stage: int
    offload: str
    collective_timeout: float
    actor_lr: float
    critic_lr: float
    weight_decay: float
    max_grad_norm: float
    lora: LoRA
    gradient_checkpointing: bool
    shared_prompt: bool
    critic_init: bool
    optimizer_state: bool
    resume_without_optimizer: bool
    export_adapter: bool
    threads: int


@dataclass(frozen=True)
class RolloutSettings:
    """How an update samples: ``prompts_per_step`` prompts x ``group_size`` samples over ``ranks``
    processes (``local_prompts`` each), at ``sampling``'s settings, up to ``max_new_tokens``; DAPO's
    ``dynamic_sampling_rounds`` (0: off) and ``overlong`` shaping; ``eval_samples`` per validation prompt;
    ``log_completions_every`` (0: never); the sampler (``backend``: 'hf' or 'vllm', ``vllm``: its
    settings) and ``context_cap``, the longest prompt + response it takes whatever the model
    (:func:`~sppo_rl.llm.rollout.factory.sampler_context`; None: the model's context); asynchronous
    rollouts: ``max_staleness`` K (0: synchronous), where the sampler runs (``worker``: 'inline' or
    'process', with ``worker_threads`` torch threads)."""

    group_size: int
    prompts_per_step: int
    ranks: int
    local_prompts: int
    max_new_tokens: int
    temperature: float
    sampling: SamplingParams
    dynamic_sampling_rounds: int
    overlong: Overlong
    eval_samples: int
    log_completions_every: int
    backend: str
    vllm: VLLM
    context_cap: int | None
    max_staleness: int = 0
    worker: str = "inline"
    worker_threads: int = 1


@dataclass(frozen=True)
class UpdateSettings:
    """The update's settings beyond the learner's (:class:`~sppo_rl.agents.learner.LearnerConfig`): the KL
    to the reference (``kl_coef``, ``kl_in``: 'reward' or 'loss', ``kl_estimator``, ``kl_clamp``), the
    learning-rate schedule (``lr_schedule``, ``warmup_updates``), the critic warm-up (updates that leave
    the actor alone) and ``skip_equal_rewards``; derived: ``kl_reward`` (:attr:`Plan.kl_reward`) and
    ``fused`` (:attr:`Plan.fused`); ``off_policy``, the correction for a stale sampler ('decoupled',
    'behaviour' or 'none': :func:`off_policy_of`)."""

    kl_coef: float
    kl_in: str
    kl_estimator: KLEstimator
    kl_clamp: float | None
    lr_schedule: str
    warmup_updates: int
    critic_warmup: int
    skip_equal_rewards: bool
    kl_reward: bool
    fused: bool
    off_policy: str = "none"


@dataclass(frozen=True)
class RewardSettings:
    """The reward: ``fn`` (the function's spec, ``auto`` resolved), its workers' ``timeout`` per item,
    the ``weights`` of combined functions (empty: equal), and ``fail_limit``: updates in a row without one
    valid reward before the run stops (0: never)."""

    fn: str
    timeout: float
    weights: tuple[float, ...]
    fail_limit: int


@dataclass(frozen=True)
class DataSettings:
    """The prompts: ``task`` (a generated task's name or a data file; a generated one's ``level`` and
    ``data_seed``), ``val_data`` (None: the task's own split), ``max_prompt_tokens`` (None: the model's context minus ``max_new_tokens``) and
    ``prompt_format``: how a prompt is rendered for the model (:class:`~sppo_rl.llm.data.prompts.PromptFormat`)."""

    task: str
    level: tuple[int, ...]
    data_seed: int
    val_data: str | None
    max_prompt_tokens: int | None
    prompt_format: PromptFormat


@dataclass(frozen=True)
class Plan(RunPlan):
    """Everything an LLM run derives from its config, computed once by :func:`resolve`: the shared
    :class:`~sppo_rl.runtime.plan.RunPlan` (``given``, ``algo`` -- a latent one with its selector as
    ``--latent-first-token`` sets it --, ``learner``, ``estimator``, ``loop``: ``loop.updates`` is
    ``--updates``) and the LLM world's sections; stages and builders read these.

    Attributes:
        latent: the latent policy's settings (None: a token policy).
        device: where the models train.
        models, rollout, update, rewards, data: the sections (:class:`ModelSettings`,
            :class:`RolloutSettings`, :class:`UpdateSettings`, :class:`RewardSettings`, :class:`DataSettings`).
        unset: the settings the user left unset and what they became.
        astar: A*-PO's stage 1 (:class:`~sppo_rl.runtime.plan.AStar`; None: another method).
    """

    latent: Any
    device: torch.device
    models: ModelSettings
    rollout: RolloutSettings
    update: UpdateSettings
    rewards: RewardSettings
    data: DataSettings
    unset: dict[str, Any]
    astar: AStar | None = None

    @property
    def group_size(self) -> int:
        """``G``, samples per prompt."""
        return self.rollout.group_size

    @property
    def rows_per_step(self) -> int:
        """``prompts_per_step x G`` responses in one update, over all ranks."""
        return self.rollout.prompts_per_step * self.rollout.group_size

    @property
    def kl_reward(self) -> bool:
        """Whether a KL penalty is subtracted from the token rewards (else, with ``kl_coef > 0``, it is a
        loss term)."""
        return self.update.kl_reward

    @property
    def fused(self) -> bool:
        """One on-policy pass (1 epoch, 1 minibatch) needs no separate old-log-prob forward: the learner
        takes ``logp.detach()`` of its training pass, unless the estimator or a KL reward needs it first."""
        return self.update.fused

    @property
    def critic_init(self) -> bool:
        """``--critic-init`` resolved (:attr:`ModelSettings.critic_init`)."""
        return self.models.critic_init


def _set(value: T | None) -> T:
    """A setting that planning has filled in (an algorithm's default, or the task's / model's)."""
    assert value is not None
    return value


def critic_init_of(cfg: LLMConfig, algo: Algorithm) -> bool:
    """``--critic-init`` resolved: set a success (BCE) critic's head from the first batch on a fresh run
    ('auto': with ``--model``); not under DeepSpeed, whose fp32 partitions hold their own copy of the head."""
    mode = cfg.critic_init if cfg.critic_init != "auto" else ("first-batch" if cfg.model else "none")
    has_critic = algo.requires.critic != "none"
    return mode == "first-batch" and has_critic and algo.critic_loss == "bce" and cfg.engine == "torch"


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


def _path_folder(value: str | None) -> Path | None:
    """The folder of a ``--model`` / ``--critic-model`` given as a path; None for a named model (built
    on first use, so resolved where it may be built), for None and for 'none'."""
    from sppo_rl.llm.models import pretrained

    if value is None or value == "none" or pretrained.parse_ref(value) is not None:
        return None
    return Path(value)


PRECISION_MIN_BYTES = 64 * 2**20
"""``--precision auto``: the smallest weight files (bytes) of a model folder given as a path that bf16 serves."""


def pretrained_sized(cfg: LLMConfig, actor_folder: Path | None) -> bool:
    """Whether the actor is a pretrained model whose matmuls, not per-operation overhead, take the time: a
    named model, or a folder whose weight files (``*.safetensors``, ``*.bin``, ``*.gguf``) hold at least
    :data:`PRECISION_MIN_BYTES` (not the embedded tiny model, nor other small ones)."""
    if cfg.model is None:
        return False
    if actor_folder is None:  # a named model
        return True
    size = sum(
        f.stat().st_size for f in actor_folder.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf")
    )
    return size >= PRECISION_MIN_BYTES


def precision_of(cfg: LLMConfig, actor_folder: Path | None, device: torch.device) -> str:
    """``--precision`` resolved: 'fp32' or 'bf16'. 'auto' is bf16 with the torch engine on float32 weights,
    on a device with native bfloat16 matmuls (:func:`~sppo_rl.llm.models.core.native_bf16`), for a
    pretrained model (:func:`pretrained_sized`); otherwise fp32 (the embedded tiny model and other small
    ones, whose time is per-operation overhead, and DeepSpeed, whose precision is ``--dtype``)."""
    from sppo_rl.llm.models.core import native_bf16

    if cfg.precision != "auto":
        return cfg.precision
    if cfg.engine != "torch" or cfg.dtype != "float32" or not native_bf16(device):
        return "fp32"
    return "bf16" if pretrained_sized(cfg, actor_folder) else "fp32"


def threads_of(cfg: LLMConfig, actor_folder: Path | None) -> int:
    """``--threads`` resolved. 0 (auto): for a pretrained model (:func:`pretrained_sized`), the CPUs this
    process may use (``os.sched_getaffinity``) divided among the ranks on this machine
    (``LOCAL_WORLD_SIZE``), less ``--rollout-threads`` where a rollout worker process runs beside the learner
    (``--max-staleness`` > 0 or ``--rollout-worker process``), at least 1; 1 for the small built-in models.
    Measured for SmolLM2 on 2 cores: 2 threads ran 3 SPPO updates (with their evaluations) 1.54x faster
    than 1 (docs/llm.md)."""
    if cfg.threads:
        return cfg.threads
    if not pretrained_sized(cfg, actor_folder):
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    worker = cfg.rollout_threads if (cfg.max_staleness > 0 or cfg.rollout_worker == "process") else 0
    return max(1, cpus // ranks - worker)


def _trains_a_critic(name: str) -> bool:
    """Whether algorithm ``name`` trains a critic (False for an unknown name: ``validate`` refuses it)."""
    try:
        return get_algorithm(name).requires.critic != "none"
    except (KeyError, ValueError):
        return False


DECOUPLED_CAP = 5.0
"""``C`` of ``--off-policy decoupled`` when ``--tis-cap`` is unset: AReaL's asynchronous recipes cap the
behaviour weight at 5 (``behav_imp_weight_cap``; AReaL drops a token above it, this code truncates it)."""


def off_policy_of(cfg: LLMConfig) -> tuple[str, float | None]:
    """``(correction, tis cap)`` of ``--off-policy`` (see its help): 'auto' is 'decoupled' with
    ``--max-staleness > 0`` or ``--tis-cap``, else 'none'; 'decoupled' caps its weight at ``--tis-cap`` or
    :data:`DECOUPLED_CAP`. ``--tis-cap`` with 'behaviour' or 'none' is refused (:class:`RunError`): both
    leave the weight out."""
    mode = cfg.off_policy
    if mode == "auto":
        mode = "decoupled" if cfg.max_staleness or cfg.tis_cap is not None else "none"
    if mode == "decoupled":
        return mode, cfg.tis_cap if cfg.tis_cap is not None else DECOUPLED_CAP
    if cfg.tis_cap is not None:
        raise RunError(
            f"--tis-cap weighs each token by min(pi_old / mu, C); --off-policy {mode} leaves that weight out "
            "(use --off-policy decoupled)"
        )
    return mode, None


def resolve(cfg: LLMConfig, dist: Any, validated: bool = False) -> tuple[Plan, Task]:
    """The frozen :class:`Plan` of ``cfg`` for a run on ``dist``'s ranks (the launcher's, read from its
    environment), and the data it loaded; every refusal of the run's settings happens here, in the order
    of the module docstring. ``cfg`` itself is left unchanged. ``validated``: the caller has just run
    ``cfg.validate()`` on this config (the Python API does, before it writes its data files), so it is
    not run twice."""
    from sppo_rl.llm.data.prompts import prompt_format
    from sppo_rl.llm.data.tasks import load_task
    from sppo_rl.llm.latent.plugin import configure_latent
    from sppo_rl.llm.models.lora import check_lora_targets_of
    from sppo_rl.llm.models.sources import (
        cache_folder,
        check_cache,
        check_context,
        check_critic_tokenizer,
        check_model_paths,
        model_folder,
    )
    from sppo_rl.llm.rollout.factory import rollout_backend, sampler_context, sampling_params

    if not validated:
        cfg.validate()
    cfg = as_given(cfg)
    given = cfg
    algo = get_algorithm(cfg.algo)
    cfg = with_algorithm_defaults(cfg, algo)
    req = algo.requires
    G = cfg.group_size if cfg.group_size is not None else default_group_size(algo)
    check_setup(algo, G, cfg.prompts_per_step * G, use_critic=cfg.critic_model != "none", whiten=cfg.whiten)
    if cfg.dynamic_sampling_rounds and not req.groups:
        raise RunError(
            f"--dynamic-sampling-rounds drops groups whose outcomes are all equal; {algo.name} samples "
            "no groups (use a group method: grpo, drgrpo, rloo, gspo, cispo, bppo, lampo, reinforce++-baseline)"
        )
    if (req.tracker or req.optimal_values) and dist.world > 1:
        raise RunError(
            f"{algo.name} keeps one value of every prompt: one process only ({dist.world} launched)"
        )
    if cfg.updates < 1 or cfg.prompts_per_step < 1:
        raise RunError("--updates and --prompts-per-step must be >= 1")
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
    cache = cache_folder(cfg)
    check_model_paths(cfg, cache)  # and the data and the reward function
    no_critic = req.critic == "none" or cfg.critic_model == "none"
    actor_folder = _path_folder(cfg.model)  # a named model's: resolved below with LoRA, else by the build
    critic_folder = None if no_critic else _path_folder(cfg.critic_model)
    if cfg.lora.rank:  # LoRA targets against the models' config.json (no weights read)
        try:
            actor_folder = model_folder(cache, cfg.model)
            critic_folder = None if no_critic else model_folder(cache, cfg.critic_model)
            check_lora_targets_of(cfg.lora.targets, actor_folder, False if no_critic else critic_folder)
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
    # a cache that is a file, or read-only with a model to build:
    warmstart = warm_start_of(cfg, cache)
    check_cache(cfg, cache, warmstart, latent=latent is not None)
    check_context(cfg, cache)  # --max-new-tokens against the actor's context
    if req.critic != "none":
        check_critic_tokenizer(cfg, cache)
    sampling = sampling_params(cfg)
    if cfg.device == "auto":
        device = torch.device(f"cuda:{dist.local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    max_new_tokens, actor_lr = _set(cfg.max_new_tokens), _set(cfg.actor_lr)  # as_given filled them
    off_policy, tis_cap = off_policy_of(cfg)
    worker = (
        cfg.rollout_worker if cfg.rollout_worker != "auto" else ("process" if cfg.max_staleness else "inline")
    )
    if worker == "process" and cfg.vllm.sleep:
        raise RunError(
            "--vllm-sleep frees the sampler's memory while the learner trains; a rollout worker process "
            "(--max-staleness > 0 or --rollout-worker process) keeps its own engine and generates meanwhile"
        )
    learner = LearnerConfig.from_run(
        cfg,
        max_new_tokens,
        algo.defaults,
        kl_coef=cfg.kl_coef if cfg.kl_in == "loss" else 0.0,
        tis_cap=tis_cap,
    )
    unset = {k: get_flat(cfg, k) for k, v in flat_dict(given).items() if v is None}
    loop = dataclasses.replace(LoopSettings.of(cfg, cfg.updates), threads=threads_of(cfg, actor_folder))
    models = ModelSettings(
        model=cfg.model, critic_model=cfg.critic_model, actor_folder=actor_folder, critic_folder=critic_folder,
        cache=cache, warmstart=warmstart, dtype=cfg.dtype,
        precision=precision_of(cfg, actor_folder, device), engine=cfg.engine, zero_stage=cfg.zero_stage, offload=cfg.offload,
        collective_timeout=cfg.collective_timeout, actor_lr=actor_lr, critic_lr=cfg.critic_lr,
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, lora=cfg.lora,
        gradient_checkpointing=cfg.gradient_checkpointing, shared_prompt=cfg.shared_prompt,
        critic_init=critic_init_of(cfg, algo),
        optimizer_state=cfg.optimizer_state, resume_without_optimizer=cfg.resume_without_optimizer,
        export_adapter=cfg.export_adapter, threads=loop.threads,
    )  # fmt: skip
    backend = rollout_backend(cfg, latent=latent is not None)
    if backend == "hf" and cfg.vllm.dtype is not None:  # --rollout auto chose Hugging Face here
        raise RunError(
            "--vllm-dtype is the vLLM sampler's; --rollout auto samples with Hugging Face here (vLLM only "
            "for a named model with --engine torch and no LoRA, where the vllm package imports)"
        )
    rollout = RolloutSettings(
        group_size=G, prompts_per_step=cfg.prompts_per_step, ranks=dist.world, local_prompts=local_prompts,
        max_new_tokens=max_new_tokens, temperature=cfg.temperature, sampling=sampling,
        dynamic_sampling_rounds=cfg.dynamic_sampling_rounds, overlong=cfg.overlong,
        eval_samples=cfg.eval_samples, log_completions_every=cfg.log_completions_every,
        backend=backend, vllm=cfg.vllm, context_cap=sampler_context(cfg, backend), max_staleness=cfg.max_staleness,
        worker=worker, worker_threads=cfg.rollout_threads,
    )  # fmt: skip
    kl_reward = _set(cfg.kl_coef) > 0 and cfg.kl_in == "reward"
    fused = learner.epochs * learner.minibatches == 1 and not algo.requires.logprobs and not kl_reward
    update = UpdateSettings(
        kl_coef=_set(cfg.kl_coef), kl_in=_set(cfg.kl_in), kl_estimator=_set(cfg.kl_estimator), kl_clamp=cfg.kl_clamp,
        lr_schedule=cfg.lr_schedule, warmup_updates=cfg.warmup_updates, critic_warmup=cfg.critic_warmup,
        skip_equal_rewards=cfg.skip_equal_rewards, kl_reward=kl_reward, fused=fused, off_policy=off_policy,
    )  # fmt: skip
    rewards = RewardSettings(
        fn=reward_fn, timeout=cfg.reward_timeout, weights=tuple(cfg.reward_weights or ()),
        fail_limit=cfg.reward_fail_limit,
    )  # fmt: skip
    try:
        fmt = prompt_format(cfg)
    except ValueError as e:
        raise RunError(str(e)) from None
    data = DataSettings(
        task=cfg.task, level=tuple(cfg.level), data_seed=cfg.data_seed, val_data=cfg.val_data,
        max_prompt_tokens=cfg.max_prompt_tokens, prompt_format=fmt,
    )  # fmt: skip
    plan = Plan(
        given=given,
        algo=algo,
        learner=learner,
        estimator=estimator_params(cfg),
        loop=loop,
        latent=latent,
        device=device,
        models=models,
        rollout=rollout,
        update=update,
        rewards=rewards,
        data=data,
        unset=unset,
        astar=AStar(cfg.astar_samples, cfg.astar_beta1) if req.optimal_values else None,
    )
    return plan, Task(train, val)
