"""``sppo-rl llm``: the LLM world's trainer over the shared core.

One update, in the order it runs:

1. take ``prompts_per_step`` prompts (a seeded shuffle of the training set, epoch after epoch);
2. the rollout engine samples ``group_size`` responses per prompt (adjacent rows); ReMax also decodes
   each prompt greedily once;
3. the reward worker scores every response against its reference answer (bounded in time; a failed
   verification is counted in ``verifier_errors`` and its rollout is *invalid*: masked out of the update,
   counted in ``invalid_rollouts``); with ``--dynamic-sampling-rounds K`` (DAPO), groups whose valid
   outcomes are all equal are dropped and steps 1-3 repeat, up to ``K`` extra rounds, until
   ``prompts_per_step`` informative groups are in hand;
4. the actor recomputes the log-probs of the sampled tokens (``logp_old``), the reference model its
   own if a KL term is on, and the critic the estimator asks for gives ``values``: one logit per prompt
   read at the last prompt token (SPPO), or one value per response token (PPO);
5. the responses become a :class:`~sppo_rl.agents.batch.SequenceBatch` (outcome ``R`` on the last
   valid token, minus the KL penalty per token if it goes in the reward), the algorithm's estimator
   fills the advantages, and PPO epochs over minibatches of rows update actor and critic.

The trainer reads ``algo.requires`` and ``algo.critic_loss``; it never tests the algorithm's name.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents import (
    LearnerConfig,
    SequenceBatch,
    check_setup,
    compute_advantages,
    forward_rows,
    get_algorithm,
    kl_penalty,
    ppo_update,
    terminal_rewards,
)
from sppo_rl.agents.algorithms import (
    GROUP_KINDS,
    default_group_size,
    estimator_params,
    group_signal,
    with_algorithm_defaults,
)
from sppo_rl.agents.batch import overlong_penalty
from sppo_rl.agents.learner import outcomes_equal
from sppo_rl.llm.completions import CompletionLog
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data import Example, fit_prompts, render_prompt
from sppo_rl.llm.engines import init_process_group, launcher_dist, make_engine
from sppo_rl.llm.evaluation import evaluate, write_critic_trace
from sppo_rl.llm.latent.plugin import configure_latent
from sppo_rl.llm.models import (
    CRITICS,
    BaseModelView,
    SequenceCritic,
    TokenCritic,
    apply_lora,
    check_lora_targets_of,
    check_same_tokenizer,
    load_actor,
    lora_config,
    save_adapter,
)
from sppo_rl.llm.prompts import render_examples
from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.llm.rollout.factory import context_limit, make_rollout, sampling_params
from sppo_rl.llm.setup import (  # noqa: F401  (TINY_CHARSET, default_cache_dir, rollout_rows: imported from here too)
    TINY_CHARSET,
    TINY_SETTINGS,
    NullLogger,
    check_model_paths,
    default_cache_dir,
    embedded_model,
    load_task,
    model_context,
    model_folder,
    peak_memory_mb,
    prompt_format,
    quiet_transformers,
    rollout_rows,
    start_scorer,
)
from sppo_rl.llm.tiny import load_tokenizer
from sppo_rl.runtime import (
    CheckpointManager,
    RunLogger,
    check_finite,
    prepare_run_dir,
)
from sppo_rl.runtime.checkpoint import read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import check_metrics_length, start_logging
from sppo_rl.runtime.loop import Schedule, announce, progress_bar, run_loop
from sppo_rl.runtime.run import (
    Preempted,
    RunError,
    RunFailed,
    check_resume,
    preemption_stop_now,
    unlock_run_dir,
)
from sppo_rl.runtime.schedule import lr_factor, set_lr
from sppo_rl.runtime.trace import TRACE_FILE


@dataclasses.dataclass
class _Round:
    """One generation round of an update, this rank's share: prompts, samples and their scores."""

    examples: list[Example]
    rb: RolloutBatch
    greedy: RolloutBatch | None
    R: Tensor  # [rows] float32 outcome (a 0.0 placeholder where invalid)
    valid: Tensor  # [rows] bool: the verifier gave the row (and its greedy baseline, if any) a score
    baseline: Tensor | None  # [rows] the greedy outcome of the row's prompt (ReMax)
    baseline_valid: Tensor | None  # [rows] bool
    errors: int
    kinds: Tensor | None = None  # [prompts] index into GROUP_KINDS (dynamic sampling only)


CRITIC_INIT_CLIP = 0.01
"""``--critic-init first-batch`` clips the first batch's success rate to ``[0.01, 0.99]`` (a batch of
all 0 or all 1 would otherwise ask for an infinite logit)."""


def init_critic_bias(critic: Any, rewards: Tensor, valid: Tensor, dist: Any) -> float:
    """Set the value head's bias of a success critic to ``logit(clip(p0, c, 1 - c))``, ``p0`` the mean
    reward over the valid rows of every rank, ``c`` :data:`CRITIC_INIT_CLIP`; returns ``p0``. The head's
    weights (``N(0, 1e-3^2)``) are kept, so ``sigmoid(V)`` starts within about 1e-3 of ``p0`` on every
    prompt. E.g. ``p0 = 0.06``: bias ``log(0.06 / 0.94) = -2.7515``."""
    import math

    total, n = dist.all_sum([float((rewards * valid).sum()), float(valid.sum())])
    p0 = total / max(n, 1.0)
    p = min(max(p0, CRITIC_INIT_CLIP), 1.0 - CRITIC_INIT_CLIP)
    with torch.no_grad():
        critic.head.bias.fill_(math.log(p / (1.0 - p)))
    return p0


def _cat_rows(parts: list[tuple[RolloutBatch, Tensor]], pad_id: int, prompt_index: Tensor) -> RolloutBatch:
    """Rows ``rows`` of each rollout batch, one after another, in one :class:`RolloutBatch` (on the CPU):
    prompts left-padded to the widest part, responses right-padded or cut to the longest kept response
    (the width every ``[B, T]`` tensor the learner computes from the lengths has), ``prompt_index``
    given."""
    import torch.nn.functional as F

    P = max(rb.prompt_ids.shape[1] for rb, _ in parts)
    T = max([1] + [int(rb.response_mask.cpu()[rows].sum(-1).max()) for rb, rows in parts if len(rows)])

    def cat(name: str, width: int, value: float, left: bool) -> Tensor:
        out = []
        for rb, rows in parts:
            x = getattr(rb, name).cpu()[rows]
            x = x if left else x[:, :width]
            gap = width - x.shape[1]
            out.append(F.pad(x, (gap, 0) if left else (0, gap), value=value))
        return torch.cat(out)

    response_mask = cat("response_mask", T, 0, False)
    return RolloutBatch(
        prompt_ids=cat("prompt_ids", P, pad_id, True),
        prompt_mask=cat("prompt_mask", P, 0, True),
        response_ids=cat("response_ids", T, pad_id, False),
        response_mask=response_mask,
        logprobs=cat("logprobs", T, 0.0, False),
        sampling_logprobs=cat("sampling_logprobs", T, 0.0, False),
        texts=[rb.texts[i] for rb, rows in parts for i in rows.tolist()],
        prompt_index=prompt_index,
        finished=torch.cat([rb.finished.cpu()[rows] for rb, rows in parts]),
        num_generated_tokens=int(response_mask.sum()),
    )


class LLMRun:
    """State and loop of one LLM run. ``run()`` trains for ``steps`` updates and returns the summary.

    Under a launcher (``torchrun`` / ``deepspeed``) with ``--engine deepspeed`` every rank runs this
    class on its share of the prompts (data parallel): rollouts, scoring and the forward passes are
    local, gradients are averaged by DeepSpeed, and each rank's loss is scaled so that the average is
    the loss of the whole batch. Rank 0 writes the logs and the exports.
    """

    waits_on = "reward scoring"  # what a preemption's grace period may give up (:class:`Preemption`)

    def __init__(self, cfg: LLMConfig) -> None:
        quiet_transformers()
        cfg.validate()
        self.algo = get_algorithm(cfg.algo)
        given = cfg  # saved and compared on --resume as the user gave it
        self.cfg = cfg = with_algorithm_defaults(cfg, self.algo)  # unset settings: the method's own
        req = self.algo.requires
        G = cfg.group_size if cfg.group_size is not None else default_group_size(self.algo)
        check_setup(self.algo, G, cfg.prompts_per_step * G, use_critic=cfg.critic_model != "none")
        if cfg.dynamic_sampling_rounds and not req.groups:
            raise RunError(
                f"--dynamic-sampling-rounds drops groups whose outcomes are all equal; {self.algo.name} samples "
                "no groups (use a group method: grpo, drgrpo, rloo, gspo, cispo, bppo, lampo, reinforce++-baseline)"
            )
        self.group_size = G
        if cfg.steps < 1 or cfg.prompts_per_step < 1:
            raise RunError("--steps and --prompts-per-step must be >= 1")
        self.dist = launcher_dist()
        if self.dist.world > 1 and cfg.engine != "deepspeed":
            raise RunError(
                f"{self.dist.world} processes were launched; multi-process training needs --engine deepspeed"
            )
        if cfg.prompts_per_step % self.dist.world:
            raise RunError(
                f"--prompts-per-step ({cfg.prompts_per_step}) must be a multiple of the {self.dist.world} ranks"
            )
        self.local_prompts = cfg.prompts_per_step // self.dist.world
        rows = self.local_prompts * G
        if cfg.minibatches < 1 or cfg.minibatches > rows:
            raise RunError(f"--minibatches must be in [1, {rows}] (rows per rank and step)")
        if cfg.engine == "deepspeed":
            from sppo_rl.llm.engines import deepspeed_config

            deepspeed_config(
                cfg.zero_stage, cfg.max_grad_norm, cfg.offload, getattr(torch, cfg.dtype)
            )  # validates
            self.dist = init_process_group(cfg.collective_timeout, always=True)
            if not cfg.optimizer_state:
                raise RunError("--no-optimizer-state: not with --engine deepspeed (its shards hold them)")
        check_model_paths(cfg)  # and the data and the reward function: all before the run folder
        if cfg.lora_rank:  # LoRA targets against the models' config.json (no weights read)
            try:
                no_critic = req.critic == "none" or cfg.critic_model == "none"
                critic_folder = False if no_critic else model_folder(cfg, cfg.critic_model)
                check_lora_targets_of(cfg.lora_targets, model_folder(cfg, cfg.model), critic_folder)
            except ValueError as e:
                raise RunError(str(e)) from None
        self.train_set, self.val_set, reward_fn = load_task(cfg)
        if not self.train_set:
            raise RunError(f"{cfg.task}: no training examples")
        self.algo, self.latent = configure_latent(cfg, self.algo, self.train_set)  # None: a token policy
        self.sampling = sampling_params(cfg)  # one sample per prompt; sample() sets n
        self.scorer = start_scorer(reward_fn, cfg.reward_timeout, cfg.reward_weights or None)

        def prepare() -> Path:
            out = prepare_run_dir(cfg.out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
            if cfg.resume:
                check_resume(out, given)
            return out

        try:
            self.out = self._main_first(prepare)
        except BaseException:
            self.scorer.close()
            raise
        if cfg.device == "auto":
            self.device = torch.device(f"cuda:{self.dist.local_rank}" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, cfg.threads))
            if (
                cfg.engine == "torch"
            ):  # transformers imports DeepSpeed when saving; tell it the device it would
                os.environ.setdefault("DS_ACCELERATOR", "cpu")  # find, rather than warn that it found no GPU
        torch.manual_seed(cfg.seed)

        self._scoring_cut = False
        self.warmstart: dict[str, Any] = {}
        if cfg.model is None:
            actor_path, self.warmstart = self._main_first(
                lambda: (self.latent.embedded_model if self.latent else embedded_model)(
                    cfg, self.train_set, self.scorer
                )
            )
        else:
            actor_path = self._main_first(lambda: model_folder(cfg, cfg.model))  # a named model: built once
            if not (actor_path / "config.json").is_file():
                raise RunError(f"--model {actor_path}: not a Hugging Face model folder (no config.json)")
        self.actor_path = actor_path
        self.tokenizer = load_tokenizer(actor_path)
        try:  # every prompt rendered once (chat template, system prompt, instruction): the text the model reads
            fmt = prompt_format(cfg)
            self.train_set, self.val_set = (
                render_examples(s, self.tokenizer, fmt) for s in (self.train_set, self.val_set)
            )
        except ValueError as e:
            raise RunError(str(e)) from None
        self._fit_prompts(actor_path)
        dtype = getattr(torch, cfg.dtype)
        self.actor = load_actor(actor_path, dtype=dtype, device=self.device)
        if cfg.gradient_checkpointing:
            self.actor.gradient_checkpointing_enable()
        lora = dict(alpha=cfg.lora_alpha, targets=cfg.lora_targets, dropout=cfg.lora_dropout)
        self._adapter_config = None
        if cfg.lora_rank:
            self._adapter_config = lora_config(
                self.actor, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, cfg.lora_dropout
            )
            apply_lora(self.actor, cfg.lora_rank, seed=cfg.seed, **lora)
        self.ref = None
        if cfg.kl_coef > 0 and not cfg.lora_rank:  # with LoRA: the actor with its adapters off (below)
            self.ref = load_actor(actor_path, dtype=dtype, device=self.device).eval().requires_grad_(False)
        self.critic: SequenceCritic | TokenCritic | None = None
        if req.critic != "none":
            critic_path = (
                self._main_first(lambda: model_folder(cfg, cfg.critic_model))
                if cfg.critic_model
                else actor_path
            )
            if cfg.critic_model:
                check_same_tokenizer(self.tokenizer, load_tokenizer(critic_path))
            cls = CRITICS[req.critic]
            self.critic = cls.from_backbone(critic_path, dtype=dtype, device=self.device)
            if cfg.gradient_checkpointing:
                self.critic.gradient_checkpointing_enable()
            if cfg.lora_rank:  # the value head stays fully trainable
                apply_lora(self.critic.backbone, cfg.lora_rank, seed=cfg.seed + 1, **lora)
        engine_kw = dict(
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            zero_stage=cfg.zero_stage,
            offload=cfg.offload,
            dtype=dtype,
        )
        self.actor_engine = make_engine(cfg.engine, self.actor, cfg.actor_lr, **engine_kw)
        self.critic_engine = (
            make_engine(cfg.engine, self.critic, cfg.critic_lr, **engine_kw) if self.critic else None
        )
        if cfg.kl_coef > 0 and cfg.lora_rank:
            self.ref = BaseModelView(self.actor_engine.module)
        self.rollout = make_rollout(
            cfg, self.actor, self.tokenizer, actor_path, dtype=dtype, device=self.device, latent=self.latent
        )

        self.data_rng = random.Random(cfg.seed)
        self.order: list[int] = []
        self.step_idx = 0
        self.elapsed = 0.0
        self.generated_tokens = 0
        self.critic_init_p0: float | None = None  # --critic-init first-batch: the p0 it used
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=cfg.keep_checkpoints)
        ckpt = None
        if cfg.resume:  # the newest intact checkpoint (damaged ones skipped with a warning; none: refused)
            if self.dist.world == 1:
                ckpt = self.ckpts.resume(self.load_checkpoint)
            else:  # rank 0 verifies and picks it; every rank loads it
                ckpt = self._main_first(self.ckpts.resume)
                self.load_checkpoint(ckpt)
                metrics_bytes = read_meta(ckpt)["metrics_bytes"]
                self._main_first(lambda: check_metrics_length(self.out / "metrics.jsonl", metrics_bytes))
        self.resolved = {
            "group_size": G,
            "rows_per_step": cfg.prompts_per_step * G,
            "ranks": self.dist.world,
            "actor": str(actor_path),
            "critic": str(cfg.critic_model or (actor_path if self.critic else "none")),
            "warmstart": self.warmstart,
            "train_examples": len(self.train_set),
            "val_examples": len(self.val_set),
            "reward_fn": reward_fn,
            "device": str(self.device),
            "learner": dataclasses.asdict(self.learner_cfg),  # the update's settings in force
            "unset": {k: getattr(cfg, k) for k, v in dataclasses.asdict(given).items() if v is None},
            "latent": dataclasses.asdict(self.latent.settings) if self.latent else None,
        }
        self.logger: RunLogger | NullLogger = NullLogger()
        if self.dist.main:
            self.logger = start_logging(self.out, given, self.resolved, ckpt, world="llm")
        every = cfg.log_completions_every if self.dist.main else 0
        self.completions = CompletionLog(self.out, every, getattr(self.logger, "text", None))
        self._fail_streak = 0  # consecutive updates without one valid reward (--reward-fail-limit)
        self._last_error: str | None = None
        self._failed_row: dict[str, Any] = {}
        self._fn_stats = np.zeros((len(self.scorer.names), 3))  # per reward function: sum, valid, errors

    def _fit_prompts(self, actor_path: Path) -> None:
        """Drop the training and validation prompts longer than ``--max-prompt-tokens`` (at most the
        model's context minus ``--max-new-tokens``), counted in a warning; refuse a set left empty."""
        cfg = self.cfg
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
        for name, where in (("train_set", cfg.task), ("val_set", cfg.val_data or f"{cfg.task} (validation)")):
            examples = getattr(self, name)
            kept = fit_prompts(examples, self.tokenizer, limit, where=where, why=why, warn=self.dist.main)
            if examples and not kept:
                raise RunError(
                    f"{where}: none of its {len(examples)} prompts fits in {limit} tokens ({why}); shorten "
                    "them, or raise --max-prompt-tokens with a model of a longer context"
                )
            setattr(self, name, kept)

    def _main_first(self, fn: Any) -> Any:
        """Run ``fn`` on rank 0, then hand its result (or its error) to every rank."""
        result, error = None, None
        if self.dist.main:
            try:
                result = fn()
            except (RunError, ValueError, OSError) as e:
                error = f"{type(e).__name__}: {e}"
        result, error = self.dist.broadcast((result, error))
        if error is not None:
            raise RunError(error.split(": ", 1)[1])
        return result

    def sync_rollout(self) -> float:
        """Push the actor's current weights into the rollout (seconds taken; 0 if it samples from the actor)."""
        if self.rollout.shares_actor:
            return 0.0
        t0 = time.perf_counter()
        self.rollout.wake_up()
        items = self.actor_engine.sync_state_items()  # with LoRA: the adapted modules, merged
        self.rollout.update_weights(items, partial=bool(self.cfg.lora_rank))
        return time.perf_counter() - t0

    # ------------------------------------------------------------------------------------- state

    def _next_prompts(self) -> tuple[list[Example], list[int]]:
        """This rank's prompts of the next update and their positions in the whole step's batch.

        Every rank draws the same global list (same seeded shuffle) and keeps its contiguous share.
        """
        out = []
        while len(out) < self.cfg.prompts_per_step:
            if not self.order:
                self.order = list(range(len(self.train_set)))
                self.data_rng.shuffle(self.order)
            out.append(self.train_set[self.order.pop()])
        lo = self.dist.rank * self.local_prompts
        return out[lo : lo + self.local_prompts], list(range(lo, lo + self.local_prompts))

    def save_checkpoint(self) -> Path:
        def write(folder: Path) -> None:
            self.actor_engine.save(folder / "actor", optimizer=self.cfg.optimizer_state)
            if self.critic_engine is not None:
                self.critic_engine.save(folder / "critic", optimizer=self.cfg.optimizer_state)
            if self.dist.main:
                torch_save(
                    {
                        "data_rng": self.data_rng.getstate(),
                        "order": self.order,
                        "torch_rng": torch.get_rng_state(),
                        "step": self.step_idx,
                        "elapsed": self.elapsed,
                        "generated_tokens": self.generated_tokens,
                        "critic_init_p0": self.critic_init_p0,
                    },
                    folder / "state.pt",
                )

        meta = {
            "metrics_bytes": self.logger.position(),
            "algo": self.algo.name,
            "ranks": self.dist.world,
            "optimizer_state": self.cfg.optimizer_state,
        }
        return self.ckpts.save(self.step_idx, write, meta)

    def load_checkpoint(self, ckpt: Path) -> None:
        if read_meta(ckpt).get("optimizer_state", True) is False and not self.cfg.resume_without_optimizer:
            raise RunError(
                f"--resume: {ckpt} was saved with --no-optimizer-state, so the resumed run would restart "
                "Adam's moments and differ from an uninterrupted one; pass --resume-without-optimizer to accept that"
            )
        if read_meta(ckpt).get("ranks", 1) != self.dist.world and self.cfg.engine == "deepspeed":
            raise RunError(f"{ckpt} was written by {read_meta(ckpt).get('ranks')} ranks; resume with as many")
        self.actor_engine.load(ckpt / "actor")
        if self.critic_engine is not None:
            self.critic_engine.load(ckpt / "critic")
        s = torch_load(ckpt / "state.pt")
        self.data_rng.setstate(s["data_rng"])
        self.order = list(s["order"])
        torch.set_rng_state(s["torch_rng"])
        self.step_idx, self.elapsed, self.generated_tokens = s["step"], s["elapsed"], s["generated_tokens"]
        self.critic_init_p0 = s.get("critic_init_p0")
        self.sync_rollout()

    # ------------------------------------------------------------------------------------- one update

    def _score_items(
        self, texts: list[str], truths: list[str], examples: list[Example] | None = None, train: bool = False
    ) -> tuple[Tensor, int, Tensor]:
        """``(scores [n], verifier errors, valid [n] bool)``; an invalid item's score is a 0.0 placeholder.
        ``examples[i]`` (item ``i``'s) gives TRL-style reward functions their ``prompts`` and the data's
        other columns; ``train``: the items count in the update's per-function reward metrics."""
        columns = [{"prompts": e.prompt, **e.meta} for e in examples] if examples is not None else None
        res = self.scorer.score(texts, truths, stop=preemption_stop_now, columns=columns)
        self._scoring_cut = self._scoring_cut or res.interrupted > 0
        if res.error_samples:
            self._last_error = res.error_samples[0]
        if train:
            known = ~np.isnan(res.parts)
            self._fn_stats += np.stack(
                [np.where(known, res.parts, 0.0).sum(0), known.sum(0), np.array(res.fn_errors)], 1
            )
        return torch.from_numpy(res.scores.astype(np.float32)), res.errors, torch.from_numpy(res.valid.copy())

    def _score(
        self, texts: list[str], truths: list[str], examples: list[Example] | None = None
    ) -> tuple[Tensor, int]:
        R, errors, _ = self._score_items(texts, truths, examples)
        return R, errors

    def log_completions(
        self,
        split: str,
        prompts: list[str],
        rb: RolloutBatch,
        truths: list[str],
        R: Tensor,
        valid: Any = None,
        step: int | None = None,
    ) -> None:
        """The first rows of ``rb`` (prompt ``prompts[prompt_index]``, reference ``truths[prompt_index]``)
        with their rewards to ``completions.jsonl`` (:class:`~sppo_rl.llm.completions.CompletionLog`), at
        ``step`` (default: the updates done)."""
        k = min(len(rb.texts), self.completions.max_rows)
        index = [int(i) for i in rb.prompt_index[:k]]
        self.completions.write(
            self.step_idx if step is None else step,
            split,
            [prompts[i] for i in index],
            rb.texts[:k],
            [truths[i] for i in index],
            R[:k].tolist(),
            None if valid is None else valid[:k].tolist(),
        )

    def _give_up_if_scoring_was_cut(self) -> None:
        """Raise :class:`Preempted` on every rank if a preemption's grace ran out during any rank's
        scoring (the scores are incomplete: the update or evaluation is redone on resume)."""
        cut, self._scoring_cut = self._scoring_cut, False
        if self.dist.all_max([float(cut)], self.device)[0]:
            raise Preempted("reward scoring was cut off by a preemption signal")

    def _seeds(self, base: int, positions: list[int]) -> list[int]:
        """One sampling seed per prompt, a function of the run seed, ``base`` and the prompt's position
        in the whole batch (not of the rank that samples it)."""
        return [(self.cfg.seed * 1_000_003 + base) * 65_537 + i for i in positions]

    def sample(self, prompts: list[str], n: int, base: int, positions: list[int]) -> RolloutBatch:
        """``n`` responses per prompt at the run's temperature, top-p and length, seeded per prompt
        (:meth:`_seeds`): the training batches (``base`` = the update), validation and critic traces."""
        return self.rollout.generate(
            prompts, dataclasses.replace(self.sampling, n=n), seeds=self._seeds(base, positions)
        )

    def _round(self, index: int) -> _Round:
        """Generation round ``index`` of this update: the next ``prompts_per_step`` prompts of the data
        order (this rank's share), ``G`` samples each (ReMax: and a greedy decode), scored. Round ``r``'s
        sampling seeds are those of positions ``r * prompts_per_step + i``, so no two rounds share one.
        A preemption that cut the scoring gives the whole update up (:meth:`update` rolls back)."""
        cfg, G = self.cfg, self.group_size
        t0 = time.perf_counter()
        examples, positions = self._next_prompts()
        prompts = [render_prompt(e, self.tokenizer) for e in examples]
        rb = self.sample(prompts, G, self.step_idx, [p + index * cfg.prompts_per_step for p in positions])
        greedy_rb = None
        if self.algo.requires.greedy_baseline:
            greedy_rb = self.rollout.generate(prompts, self.sampling.as_greedy())
        t1 = time.perf_counter()
        rows = [examples[int(i)] for i in rb.prompt_index]
        R, errors, valid = self._score_items(rb.texts, [e.answer for e in rows], rows, train=True)
        if index == 0 and self.completions.due(self.step_idx + 1):
            self.log_completions(
                "train", prompts, rb, [e.answer for e in examples], R, valid, self.step_idx + 1
            )
        baseline = baseline_valid = None
        if greedy_rb is not None:
            g_scores, g_err, g_valid = self._score_items(
                greedy_rb.texts, [e.answer for e in examples], examples
            )
            errors += g_err
            baseline, baseline_valid = g_scores[rb.prompt_index.cpu()], g_valid[rb.prompt_index.cpu()]
            valid = valid & baseline_valid  # no baseline, no advantage
        self._t_gen += t1 - t0
        self._t_score += time.perf_counter() - t1
        self._give_up_if_scoring_was_cut()
        return _Round(examples, rb, greedy_rb, R, valid, baseline, baseline_valid, errors)

    def _collect(self) -> tuple[list[_Round], list[tuple[int, int]]]:
        """The update's rounds and the ``(round, prompt)`` groups to train on, this rank's share.

        Without dynamic sampling: one round, all of its groups. With ``K = --dynamic-sampling-rounds``
        (DAPO): each group is classified by :func:`~sppo_rl.agents.algorithms.group_signal`; only mixed
        ones (two valid outcomes that differ) are kept, the first ``prompts_per_step / ranks`` in order.
        Another round is drawn while any rank is short, at most ``K`` extra ones: the shortfall is summed
        over ranks, so every rank draws the same number of rounds. At the cap, the groups found are
        trained on; the rest of the batch is filled with dropped groups made invalid (no loss), so every
        rank trains on the same number of rows."""
        K, n = self.cfg.dynamic_sampling_rounds, self.local_prompts
        rounds = [self._round(0)]
        if K == 0:
            return rounds, [(0, k) for k in range(n)]
        keep: list[tuple[int, int]] = []
        while True:
            r = rounds[-1]
            r.kinds = group_signal(r.R.view(-1, self.group_size), r.valid.view(-1, self.group_size))
            keep += [(len(rounds) - 1, int(k)) for k in torch.nonzero(r.kinds == 0).flatten()]
            short = self.dist.all_sum([float(max(0, n - len(keep)))], self.device)[0]
            if short == 0 or len(rounds) > K:
                break
            rounds.append(self._round(len(rounds)))
        keep = keep[:n]
        filler = [(i, int(k)) for i, r in enumerate(rounds) for k in torch.nonzero(r.kinds != 0).flatten()]
        return rounds, keep + filler[: n - len(keep)]

    def update(self) -> dict[str, Any]:
        cfg, algo, G = self.cfg, self.algo, self.group_size
        req = algo.requires
        t0 = time.perf_counter()
        before = (list(self.order), self.data_rng.getstate(), torch.get_rng_state())  # if given up
        self._t_gen = self._t_score = 0.0
        self._fn_stats[:] = 0.0
        try:
            rounds, groups = self._collect()
        except Preempted:  # nothing was trained yet: back to the state before this update
            self.order = before[0]
            self.data_rng.setstate(before[1])
            torch.set_rng_state(before[2])
            raise
        self.rollout.sleep()  # frees the sampler's memory while training (vLLM with --vllm-sleep)
        t_gen, t_score = self._t_gen, self._t_score
        if groups == [(0, k) for k in range(len(rounds[0].examples))]:
            r0 = rounds[0]
            rb, R, valid, baseline = r0.rb, r0.R, r0.valid, r0.baseline
        else:
            rows = [torch.arange(k * G, (k + 1) * G) for _, k in groups]
            rb = _cat_rows(
                [(rounds[i].rb, r) for (i, _), r in zip(groups, rows)],
                self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0,
                torch.arange(len(groups)).repeat_interleave(G),
            )
            R = torch.cat([rounds[i].R[r] for (i, _), r in zip(groups, rows)])
            valid = torch.cat([rounds[i].valid[r] for (i, _), r in zip(groups, rows)])
            baseline = None
            if rounds[0].baseline is not None:
                baseline = torch.cat([rounds[i].baseline[r] for (i, _), r in zip(groups, rows)])
        informative = (
            sum(int(rounds[i].kinds[k] == 0) for i, k in groups) if cfg.dynamic_sampling_rounds else 0
        )
        if cfg.dynamic_sampling_rounds:  # filler: dropped groups standing in for missing ones, no loss
            valid = valid.clone()
            valid[informative * G :] = False
        latent_invalid = None
        if self.latent is not None:  # Latent-GRPO fix (a): rollouts that left the latent manifold
            valid, latent_invalid = self.latent.valid(rb, valid)

        rb = rb.to(self.device)
        mask = rb.response_mask.float()
        lengths, cost = rb.response_lengths.cpu(), (rb.prompt_mask.sum(-1) + rb.response_lengths).cpu()
        lcfg, red = self.learner_cfg, self.dist.on(self.device)
        # one on-policy pass (1 epoch, 1 minibatch) needs no separate old-log-prob forward: the learner
        # takes logp.detach() of its training pass, unless the estimator or a KL reward needs it first
        kl_reward = self.ref is not None and cfg.kl_in == "reward"
        fused = cfg.epochs * cfg.minibatches == 1 and not req.logprobs and not kl_reward
        if self.step_idx == 0 and self.critic_init_p0 is None and self._critic_init_wanted():
            self.critic_init_p0 = init_critic_bias(
                self.critic_engine.module, R, valid, self.dist.on(self.device)
            )
        with torch.no_grad():
            self.actor_engine.module.eval()
            logp_old = (
                None
                if fused
                else forward_rows(self._rows(rb, self.actor_engine.module, True), lengths, cost, lcfg, red)
            )
            ref_logp = (
                forward_rows(self._rows(rb, self.ref, True), lengths, cost, lcfg, red) if self.ref else None
            )
            values = None
            if self.critic_engine is not None:
                self.critic_engine.module.eval()
                values = forward_rows(
                    self._rows(rb, self.critic_engine.module, False), lengths, cost, lcfg, red
                ).float()
        R = R.to(self.device)
        token_rewards = terminal_rewards(R, mask)  # plus DAPO's soft overlong punishment, if on
        penalty = overlong_penalty(
            rb.response_lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        ).to(R.device)
        token_rewards += terminal_rewards(penalty, mask)
        kl_tok = kl_penalty(logp_old, ref_logp, cfg.kl_estimator) * mask if kl_reward else None
        if kl_tok is not None:
            token_rewards = token_rewards - cfg.kl_coef * kl_tok
        batch = SequenceBatch(
            mask=mask,
            logp_old=logp_old,
            rewards=R,
            token_rewards=token_rewards,
            group_ids=rb.prompt_index,
            values=values,
            baseline_rewards=baseline.to(self.device) if baseline is not None else None,
            ref_logp=ref_logp if cfg.kl_in == "loss" else None,
            logp_rollout=rb.logprobs * mask,
            valid=None if bool(valid.all()) else valid.to(self.device),
        )
        compute_advantages(batch, algo, **estimator_params(cfg))
        check_finite(self.step_idx + 1, advantages=batch.advantages)
        cut = ~rb.finished.to(self.device)
        if cfg.overlong_filter:  # DAPO: a truncated response teaches nothing about its (unseen) answer
            batch.loss_mask = batch.loss_mask * (~cut).to(batch.mask.dtype)[:, None]
            batch.advantages = batch.advantages * batch.loss_mask
        lr = self._schedule_lr()
        outcomes, outcome_valid = (R + penalty).float(), valid.to(self.device)
        if baseline is not None:  # ReMax: the greedy rollouts' rewards are outcomes too
            outcomes = torch.cat([outcomes, baseline.to(self.device).float()])
            outcome_valid = torch.cat([outcome_valid, outcome_valid])  # valid rows have a valid baseline
        equal = outcomes_equal(outcomes, outcome_valid, self.dist.on(self.device))
        stats = self._optimise(rb, batch, cost, skip=cfg.skip_equal_rewards and equal)
        stats["rewards_all_equal"] = int(equal)
        if self.critic_init_p0 is not None and self.step_idx == 0:
            stats["critic_init_p0"] = self.critic_init_p0
        if latent_invalid is not None:
            stats["latent_invalid"] = self.dist.all_sum([float(latent_invalid)], self.device)[0]
        if cfg.overlong_filter:
            stats["overlong_filtered"] = self.dist.all_sum([float(cut.sum())], self.device)[0]
        logp_old = batch.logp_old  # filled by the training pass when fused (None if the actor was skipped)
        if kl_tok is None and ref_logp is not None and logp_old is not None:
            kl_tok = kl_penalty(logp_old, ref_logp, cfg.kl_estimator) * mask
        t_sync = self.sync_rollout()
        t_train = time.perf_counter() - t0 - t_gen - t_score

        self.step_idx += 1
        sampled = [r.rb for r in rounds] + [r.greedy for r in rounds if r.greedy is not None]
        n_tok = sum(int(b.response_mask.sum()) for b in sampled)  # dropped groups' tokens included
        kinds = torch.cat([r.kinds for r in rounds]) if cfg.dynamic_sampling_rounds else torch.zeros(0)
        all_R = torch.cat([r.R for r in rounds])
        all_valid = torch.cat([r.valid for r in rounds])
        all_rows = [r.rb for r in rounds]
        g_valid = [
            (r.baseline * r.baseline_valid, r.baseline_valid) for r in rounds if r.baseline is not None
        ]
        # sums over ranks, over every sampled row of every round (the trained ones for the KL)
        tot = self.dist.all_sum(
            [
                float((all_R * all_valid).sum()),
                float(all_valid.sum()),
                float(all_R.numel()),
                float(sum(int(b.response_mask.sum()) for b in all_rows)),
                float(n_tok),
                float(sum(int((~b.finished).sum()) for b in all_rows)),
                float(sum(r.errors for r in rounds)),
                float(sum(float(s.sum()) for s, _ in g_valid)),
                float(sum(int(v.sum()) for _, v in g_valid)),
                float(kl_tok.sum()) if kl_tok is not None else 0.0,
                float(mask.sum()),
                float((~all_valid).sum()),
                float(informative),
                *[float((kinds == k).sum()) for k in range(len(GROUP_KINDS))],
            ],
            self.device,
        )
        self.generated_tokens += int(tot[4])
        dt = time.perf_counter() - t0
        self.elapsed += dt
        row: dict[str, Any] = {
            "step": self.step_idx,
            "reward_mean": tot[0] / max(tot[1], 1.0),
            "response_length": tot[3] / tot[2],
            "response_clip_frac": tot[5] / tot[2],
            "verifier_errors": int(tot[6]),
            "invalid_rollouts": int(tot[11]),
            "generated_tokens": self.generated_tokens,
            "gen_tokens_per_s": tot[4] / max(t_gen, 1e-9),
            "time_gen_s": t_gen,
            "time_score_s": t_score,
            "time_train_s": t_train,
            "time_sync_s": t_sync,
            "step_time_s": dt,
            "wall_time_s": self.elapsed,
            "rollout_logp_diff": stats.get("rollout_mismatch_mean", float("nan")),
            "peak_memory_mb": peak_memory_mb(self.device),
            "learning_rate": lr,
        }
        if cfg.dynamic_sampling_rounds:
            mixed, correct, wrong, few = tot[13:17]
            row.update(
                {
                    "dynamic_sampling/groups_sampled": int(mixed + correct + wrong + few),
                    "dynamic_sampling/groups_kept": int(tot[12]),
                    "dynamic_sampling/dropped_all_correct": int(correct),
                    "dynamic_sampling/dropped_all_wrong": int(wrong),
                    "dynamic_sampling/dropped_too_few_valid": int(few),
                    "dynamic_sampling/surplus": int(mixed - tot[12]),
                    "dynamic_sampling/extra_rounds": len(rounds) - 1,
                    "dynamic_sampling/short": int(cfg.prompts_per_step - tot[12]),
                }
            )
        if len(self.scorer.names) > 1:  # each reward function on its own: mean over its valid scores
            fn = self.dist.all_sum(self._fn_stats.flatten().tolist(), self.device)
            for j, name in enumerate(self.scorer.names):
                row[f"rewards/{name}"] = fn[3 * j] / max(fn[3 * j + 1], 1.0)
                row[f"reward_errors/{name}"] = int(fn[3 * j + 2])
        self._fail_streak = self._fail_streak + 1 if tot[1] == 0 else 0
        if cfg.reward_fail_limit and self._fail_streak >= cfg.reward_fail_limit:
            self._failed_row = row
            raise RunFailed(
                f"no response got a valid reward in {self._fail_streak} consecutive updates (--reward-fail-limit "
                f"{cfg.reward_fail_limit}): {int(tot[6])} verifier errors in update {self.step_idx}, e.g. "
                f"{self._last_error or 'unknown'}; the run stopped (summary.json)"
            )
        if baseline is not None:
            row["greedy_reward_mean"] = tot[7] / max(tot[8], 1.0)
        if kl_tok is not None:
            row["kl"] = tot[9] / max(tot[10], 1.0)
        row.update(stats)
        return row

    @property
    def learner_cfg(self) -> LearnerConfig:
        cfg = self.cfg
        return LearnerConfig.from_run(
            cfg, cfg.max_new_tokens, self.algo.defaults, kl_coef=cfg.kl_coef if cfg.kl_in == "loss" else 0.0
        )

    def _rows(self, rb: RolloutBatch, model: Any, policy: bool) -> Any:
        if policy and self.latent is not None:
            return self.latent.rows(rb, model, self.cfg.temperature, self.device)
        return rollout_rows(rb, model, policy, self.cfg.temperature, self.device)

    def _schedule_lr(self) -> float:
        """Set both engines' learning rates for the update about to run (``--lr-schedule`` over ``--steps``,
        from the update index: :mod:`sppo_rl.runtime.schedule`); returns the actor's."""
        cfg = self.cfg
        f = lr_factor(cfg.lr_schedule, self.step_idx, cfg.steps, cfg.warmup_updates)
        set_lr(self.actor_engine.optimizer, cfg.actor_lr * f)
        if self.critic_engine is not None:
            set_lr(self.critic_engine.optimizer, cfg.critic_lr * f)
        return cfg.actor_lr * f

    def _critic_init_wanted(self) -> bool:
        """``--critic-init`` resolved: a success (BCE) critic's head, on a fresh run (see LLMConfig)."""
        cfg = self.cfg
        mode = cfg.critic_init if cfg.critic_init != "auto" else ("first-batch" if cfg.model else "none")
        return (  # DeepSpeed holds its own copy (ZeRO's fp32 partitions) of the head it would overwrite
            mode == "first-batch"
            and self.critic_engine is not None
            and self.algo.critic_loss == "bce"
            and cfg.engine == "torch"
        )

    def _optimise(
        self, rb: RolloutBatch, batch: SequenceBatch, cost: Tensor, skip: bool = False
    ) -> dict[str, Any]:
        cfg = self.cfg
        actor = self.actor_engine.module
        critic = self.critic_engine.module if self.critic_engine is not None else None
        actor.train()
        if critic is not None:
            critic.train()
        out = ppo_update(
            batch,
            self.algo,
            self.learner_cfg,
            self._rows(rb, actor, True),
            self.actor_engine,
            self._rows(rb, critic, False) if critic is not None else None,
            self.critic_engine,
            train_actor=self.step_idx >= cfg.critic_warmup and not skip,
            generator=torch.Generator().manual_seed(cfg.seed * 7919 + self.step_idx),
            cost=cost,
            dist=self.dist.on(self.device),
            guard=lambda **q: check_finite(self.step_idx + 1, **q),
        )
        actor.eval()
        if critic is not None:
            critic.eval()
        out["actor_skipped"] = int(out["actor_skipped"])
        return out

    # ------------------------------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, Any]:
        return evaluate(self)

    def critic_trace(self, path: Path) -> None:
        write_critic_trace(self, path)

    # ------------------------------------------------------------------------------------- loop

    @property
    def updates(self) -> int:
        return self.step_idx

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Exports (``final/``, the critic trace; all ranks) and, on rank 0, the summary from every row
        of ``metrics.jsonl``."""
        self.export(self.out / "final")
        self.critic_trace(self.out / TRACE_FILE)
        evals = [r for r in rows if r.get("val_accuracy") is not None]
        summary = {
            "algo": self.algo.name,
            "seed": self.cfg.seed,
            "steps": self.step_idx,
            "group_size": self.group_size,
            "ranks": self.dist.world,
            "wall_time_s": self.elapsed,
            "generated_tokens": self.generated_tokens,
            "start_val_accuracy": evals[0]["val_accuracy"] if evals else None,
            "final_val_accuracy": evals[-1]["val_accuracy"] if evals else None,
            "best_val_accuracy": max(r["val_accuracy"] for r in evals) if evals else None,
            "peak_memory_mb": peak_memory_mb(self.device),
            "warmstart": self.warmstart,
        }
        if self.dist.main:  # the exported folder says what it is, and is readable as the umask allows
            from sppo_rl.llm.card import write_model_card
            from sppo_rl.runtime.checkpoint import follow_umask
            from sppo_rl.runtime.watch import not_learning

            warnings = [w["message"] for w in not_learning(rows)]
            write_model_card(self.out / "final" / "actor", self.cfg, summary, rows, warnings)
            follow_umask(self.out / "final")
        return summary

    def run(self, callback: Any = None) -> dict[str, Any]:
        """Train for ``steps`` updates; ``callback(row)`` after each (rank 0), ``False`` stops (:func:`run_loop`)."""
        cfg = self.cfg

        def postfix(row: dict[str, Any]) -> dict[str, str]:
            post = {"reward": f"{row['reward_mean']:.2f}", "tok/s": f"{row['gen_tokens_per_s']:.0f}"}
            if "val_accuracy" in row:
                post["val"] = f"{row['val_accuracy']:.2f}"
            return post

        schedule = Schedule(
            cfg.steps,
            cfg.eval_every,
            cfg.checkpoint_every,
            cfg.max_seconds,
            eval_first={"step": 0, "wall_time_s": 0.0, "generated_tokens": 0},
            eval_last=True,
            log_step=lambda r: r["step"],
        )
        try:
            summary = run_loop(
                self,
                schedule,
                resume_hint=f"sppo-rl llm --out-dir {self.out} --resume ...",
                bar=progress_bar(
                    cfg.progress and self.dist.main, cfg.steps, self.step_idx, f"{self.algo.name}/llm"
                ),
                postfix=postfix,
                agree=lambda flag: bool(self.dist.all_max([float(flag)], self.device)[0]),
                main=self.dist.main,
                callback=callback,
            )
        except RunFailed as e:
            self._stopped(str(e))
            raise
        return self.dist.broadcast(summary if self.dist.main else None)

    def _stopped(self, reason: str) -> None:
        """A run stopped by :class:`RunFailed`: its last update's row to ``metrics.jsonl``, and a
        ``summary.json`` with ``stopped`` (the reason) and the update's counts; then the run is closed."""
        import json

        from sppo_rl.runtime.checkpoint import atomic_write_text
        from sppo_rl.runtime.logging import json_safe

        if self.dist.main:
            if self._failed_row:
                self.logger.log(self._failed_row, step=self._failed_row["step"])
            summary = {
                "algo": self.algo.name,
                "seed": self.cfg.seed,
                "steps": self.step_idx,
                "stopped": reason,
                "reward_failed_updates": self._fail_streak,
                "verifier_errors": self._failed_row.get("verifier_errors"),
                "last_error": self._last_error,
            }
            text = json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False)
            atomic_write_text(self.out / "summary.json", text + "\n")
        self.close()

    def export(self, folder: Path) -> None:
        """``folder/actor`` (a transformers folder with its tokenizer), ``folder/critic`` and with
        ``--export-adapter`` ``folder/actor-adapter`` (the actor's LoRA adapters alone, a peft folder);
        all ranks call this (ZeRO-3 gathers the weights), rank 0 writes."""
        self.actor_engine.save_pretrained(folder / "actor")
        if self.dist.main:
            self.tokenizer.save_pretrained(folder / "actor")
        if self.cfg.export_adapter and self._adapter_config is not None:  # the adapters alone, for peft
            engine = self.actor_engine
            save_adapter(
                getattr(engine, "inner", engine.module),
                folder / "actor-adapter",
                self._adapter_config,
                self.actor_path,
                getattr(engine, "_gather", None),
                write=self.dist.main,
            )
        if self.critic_engine is not None:
            state = {n: t.detach().to("cpu", copy=True) for n, t in self.critic_engine.full_state_items()}
            if self.dist.main:
                self.critic.save_pretrained(folder / "critic", tokenizer=self.tokenizer, state_dict=state)
        self.dist.barrier()

    def close(self) -> None:
        self.logger.close()
        self.scorer.close()
        unlock_run_dir(self.out)


def run_llm(cfg: LLMConfig, callback: Any = None) -> dict[str, Any]:
    """Entry point of ``sppo-rl llm``; ends with the headline numbers and where to look next.
    ``callback(row) -> False`` stops the run after that update (:func:`~sppo_rl.runtime.loop.run_loop`)."""
    run = LLMRun(cfg)
    s = run.run(callback)
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    headline = (
        f"{s['algo']}, seed {s['seed']}: val accuracy {fmt(s.get('start_val_accuracy'))} -> "
        f"{fmt(s.get('final_val_accuracy'))} (best {fmt(s.get('best_val_accuracy'))}); {s['steps']} updates, "
        f"{s['generated_tokens']} generated tokens in {s['wall_time_s']:.1f} s of training"
    )
    announce(run.out, headline, cfg.tensorboard, main=run.dist.main)
    return s
