"""``sppo-rl llm``: the LLM world's trainer over the shared core.

One update, in the order it runs:

1. take ``prompts_per_step`` prompts (a seeded shuffle of the training set, epoch after epoch);
2. the rollout engine samples ``group_size`` responses per prompt (adjacent rows); ReMax also decodes
   each prompt greedily once;
3. the reward worker scores every response against its reference answer (bounded in time; failures
   score 0 and are counted in ``verifier_errors``);
4. the actor recomputes the log-probs of the sampled tokens (``logp_old``), the reference model its
   own if a KL term is on, and the critic the estimator asks for gives ``values``: one logit per prompt
   read at the last prompt token (SPPO), or one value per response token (PPO);
5. the responses become a :class:`~sppo_rl.agents.batch.SequenceBatch` (outcome ``R`` on the last
   valid token, minus the KL penalty per token if it goes in the reward), the algorithm's estimator
   fills the advantages, and PPO epochs over minibatches of rows update actor and critic.

The trainer reads ``algo.requires`` and ``algo.critic_loss``; it never tests the algorithm's name.
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents import (
    SequenceBatch,
    agg_loss,
    check_setup,
    compute_advantages,
    critic_loss,
    explained_variance,
    get_algorithm,
    kl_penalty,
    policy_loss,
    terminal_rewards,
)
from sppo_rl.agents.algorithms import critic_values, estimator_params
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data import Example, load_examples, render_prompt
from sppo_rl.llm.engines import init_process_group, launcher_dist, make_engine
from sppo_rl.llm.models import (
    SequenceCritic,
    TokenCritic,
    check_same_tokenizer,
    load_actor,
    sequence_logprobs,
)
from sppo_rl.llm.reward import RewardScorer
from sppo_rl.llm.rollout import HFRolloutEngine, RolloutBatch
from sppo_rl.llm.tiny import load_tokenizer
from sppo_rl.runtime import (
    CheckpointManager,
    Preemption,
    RunLogger,
    check_finite,
    prepare_run_dir,
)
from sppo_rl.runtime.checkpoint import atomic_write_text, read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import start_logging
from sppo_rl.runtime.run import RunError, exit_preempted

TINY_CHARSET = "".join(
    chr(c) for c in range(32, 127)
)  # printable ASCII: every character a tiny-task text uses
TINY_SETTINGS = dict(hidden_size=128, layers=4, heads=4, kv_heads=2, seed=0, max_position_embeddings=256)


def default_cache_dir() -> Path:
    return Path(os.environ.get("SPPO_RL_CACHE", Path.home() / ".cache" / "sppo_rl"))


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory (CUDA) or peak resident set size of this process (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_task(cfg: LLMConfig) -> tuple[list[Example], list[Example], str]:
    """Training and validation examples, and the reward function that scores them."""
    if cfg.task == "arithmetic":
        from sppo_rl.llm.tasks import REWARD_FN, make_arithmetic

        train, val = make_arithmetic(cfg.data_seed, cfg.train_size, cfg.val_size, tuple(cfg.level))
        return train, val, (REWARD_FN if cfg.reward_fn == "auto" else cfg.reward_fn)
    path = Path(cfg.task)
    if not path.suffix:
        raise RunError(f"unknown task {cfg.task!r}; valid: 'arithmetic' or a .jsonl/.json/.parquet file")
    train = load_examples(path, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key)
    val = (
        load_examples(cfg.val_data, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key, limit=cfg.val_size)
        if cfg.val_data
        else []
    )
    return train, val, ("math" if cfg.reward_fn == "auto" else cfg.reward_fn)


def embedded_model(cfg: LLMConfig, train: list[Example], scorer: RewardScorer) -> tuple[Path, dict[str, Any]]:
    """The tiny Qwen2 model, built once into the cache, then warm-started on the task (also cached)."""
    from sppo_rl.llm.sft import supervised_warmstart
    from sppo_rl.llm.tasks import reference_response
    from sppo_rl.llm.tiny import ensure_tiny_model

    if cfg.task != "arithmetic":
        raise RunError("the embedded tiny model is for --task arithmetic; give --model for other data")
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    base = ensure_tiny_model(cache, TINY_CHARSET, **TINY_SETTINGS)
    prompts = [str(e.prompt) for e in train]
    answers = [e.answer for e in train]

    def score(texts: list[str], truths: list[str]) -> list[float]:
        return scorer.score(texts, truths).scores.tolist()

    return supervised_warmstart(
        base,
        cache,
        prompts,
        [reference_response(e) for e in train],
        answers,
        score,
        steps=cfg.sft_steps,
        lr=cfg.sft_lr,
        target=cfg.sft_target,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        key_settings={"level": list(cfg.level), "data_seed": cfg.data_seed, "train_size": cfg.train_size},
        progress=cfg.progress,
    )


class _NullLogger:
    """Stands in for the metrics log on ranks other than 0."""

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def position(self) -> int:
        return 0

    def close(self) -> None:
        pass


class LLMRun:
    """State and loop of one LLM run. ``run()`` trains for ``steps`` updates and returns the summary.

    Under a launcher (``torchrun`` / ``deepspeed``) with ``--engine deepspeed`` every rank runs this
    class on its share of the prompts (data parallel): rollouts, scoring and the forward passes are
    local, gradients are averaged by DeepSpeed, and each rank's loss is scaled so that the average is
    the loss of the whole batch. Rank 0 writes the logs and the exports.
    """

    def __init__(self, cfg: LLMConfig) -> None:
        self.cfg = cfg
        self.algo = get_algorithm(cfg.algo)
        req = self.algo.requires
        G = cfg.group_size if cfg.group_size is not None else (self.algo.group_size if req.groups else 1)
        check_setup(self.algo, G, cfg.prompts_per_step * G, use_critic=cfg.critic_model != "none")
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
            self.dist = init_process_group(cfg.collective_timeout)
            if not torch.distributed.is_initialized():  # one process: a process group of one
                _single_process_group(cfg.collective_timeout)
        self.out = self._main_first(
            lambda: prepare_run_dir(cfg.out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
        )
        if cfg.device == "auto":
            self.device = torch.device(f"cuda:{self.dist.local_rank}" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, cfg.threads))
        torch.manual_seed(cfg.seed)

        self.train_set, self.val_set, reward_fn = load_task(cfg)
        if not self.train_set:
            raise RunError(f"{cfg.task}: no training examples")
        self.scorer = RewardScorer(reward_fn, timeout_s=cfg.reward_timeout)
        self.warmstart: dict[str, Any] = {}
        if cfg.model is None:
            actor_path, self.warmstart = self._main_first(
                lambda: embedded_model(cfg, self.train_set, self.scorer)
            )
        else:
            actor_path = Path(cfg.model)
            if not (actor_path / "config.json").is_file():
                raise RunError(f"--model {actor_path}: not a Hugging Face model folder (no config.json)")
        self.actor_path = actor_path
        self.tokenizer = load_tokenizer(actor_path)
        dtype = getattr(torch, cfg.dtype)
        self.actor = load_actor(actor_path, dtype=dtype, device=self.device)
        if cfg.gradient_checkpointing:
            self.actor.gradient_checkpointing_enable()
        self.ref = None
        if cfg.kl_coef > 0:
            self.ref = load_actor(actor_path, dtype=dtype, device=self.device).eval().requires_grad_(False)
        self.critic: SequenceCritic | TokenCritic | None = None
        if req.critic != "none":
            critic_path = Path(cfg.critic_model) if cfg.critic_model else actor_path
            if cfg.critic_model:
                check_same_tokenizer(self.tokenizer, load_tokenizer(critic_path))
            cls = SequenceCritic if req.critic == "sequence" else TokenCritic
            self.critic = cls.from_backbone(critic_path, dtype=dtype, device=self.device)
            if cfg.gradient_checkpointing:
                self.critic.gradient_checkpointing_enable()
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
        self.rollout = self._make_rollout(actor_path, dtype)

        self.data_rng = random.Random(cfg.seed)
        self.order: list[int] = []
        self.step_idx = 0
        self.elapsed = 0.0
        self.generated_tokens = 0
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=cfg.keep_checkpoints)
        ckpt = self.ckpts.latest() if cfg.resume else None
        if ckpt is not None:
            self.load_checkpoint(ckpt)
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
        }
        self.logger: RunLogger | _NullLogger = _NullLogger()
        if self.dist.main:
            self.logger = start_logging(self.out, cfg, self.resolved, ckpt)

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

    def _make_rollout(self, actor_path: Path, dtype: torch.dtype) -> Any:
        """The sampler. With the plain torch engine and HF generation it shares the actor's weights;
        otherwise it holds its own copy, refreshed by :meth:`sync_rollout` after every update."""
        cfg = self.cfg
        if cfg.rollout == "vllm":
            from sppo_rl.llm.vllm_engine import VLLMRolloutEngine

            # the engine restores the RNG states, thread count and signal handlers it changes when it starts
            engine = VLLMRolloutEngine(
                actor_path,
                self.tokenizer,
                dtype=cfg.dtype,
                seed=cfg.seed,
                add_special_tokens=False,
                max_model_len=cfg.vllm_max_model_len,
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                enable_sleep_mode=cfg.vllm_sleep,
                sync_timeout_s=cfg.collective_timeout,
            )
            self._separate_rollout = True
            return engine
        if cfg.engine == "torch":
            self._separate_rollout = False
            return HFRolloutEngine(self.actor, self.tokenizer, add_special_tokens=False)
        self._separate_rollout = True
        replica = load_actor(actor_path, dtype=dtype, device=self.device).eval().requires_grad_(False)
        return HFRolloutEngine(replica, self.tokenizer, add_special_tokens=False)

    def sync_rollout(self) -> float:
        """Push the actor's current weights into the rollout engine (seconds taken; 0 if shared)."""
        if not self._separate_rollout:
            return 0.0
        t0 = time.perf_counter()
        if self.cfg.vllm_sleep and hasattr(self.rollout, "wake_up"):
            self.rollout.wake_up()
        self.rollout.update_weights(self.actor_engine.full_state_items())
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
            self.actor_engine.save(folder / "actor")
            if self.critic_engine is not None:
                self.critic_engine.save(folder / "critic")
            if self.dist.main:
                torch_save(
                    {
                        "data_rng": self.data_rng.getstate(),
                        "order": self.order,
                        "torch_rng": torch.get_rng_state(),
                        "step": self.step_idx,
                        "elapsed": self.elapsed,
                        "generated_tokens": self.generated_tokens,
                    },
                    folder / "state.pt",
                )

        meta = {"metrics_bytes": self.logger.position(), "algo": self.algo.name, "ranks": self.dist.world}
        return self.ckpts.save(self.step_idx, write, meta)

    def load_checkpoint(self, ckpt: Path) -> None:
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
        self.sync_rollout()

    # ------------------------------------------------------------------------------------- one update

    def _score(self, texts: list[str], truths: list[str]) -> tuple[Tensor, int]:
        res = self.scorer.score(texts, truths)
        return torch.from_numpy(res.scores.astype(np.float32)), res.errors

    def _seeds(self, base: int, positions: list[int]) -> list[int]:
        """One sampling seed per prompt, a function of the run seed, ``base`` and the prompt's position
        in the whole batch (not of the rank that samples it)."""
        return [(self.cfg.seed * 1_000_003 + base) * 65_537 + i for i in positions]

    def update(self) -> dict[str, Any]:
        cfg, algo, G = self.cfg, self.algo, self.group_size
        req = algo.requires
        t0 = time.perf_counter()
        examples, positions = self._next_prompts()
        prompts = [render_prompt(e, self.tokenizer) for e in examples]
        rb = self.rollout.generate(
            prompts,
            n=G,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=self._seeds(self.step_idx, positions),
        )
        greedy_rb = None
        if req.greedy_baseline:
            greedy_rb = self.rollout.generate(prompts, n=1, greedy=True, max_new_tokens=cfg.max_new_tokens)
        if cfg.vllm_sleep and hasattr(self.rollout, "sleep"):
            self.rollout.sleep(1)  # free the rollout engine's KV cache while training
        t_gen = time.perf_counter() - t0
        truths = [examples[int(i)].answer for i in rb.prompt_index]
        R, errors = self._score(rb.texts, truths)
        baseline = None
        if greedy_rb is not None:
            g_scores, g_err = self._score(greedy_rb.texts, [e.answer for e in examples])
            errors += g_err
            baseline = g_scores[rb.prompt_index.cpu()]
        t_score = time.perf_counter() - t0 - t_gen

        rb = rb.to(self.device)
        ids, attn, T = rb.input_ids, rb.attention_mask, rb.response_len
        mask = rb.response_mask.float()
        actor = self.actor_engine.module
        critic = self.critic_engine.module if self.critic_engine is not None else None
        with torch.no_grad():
            actor.eval()
            logp_old, _ = sequence_logprobs(actor, ids, attn, T, cfg.temperature)
            logp_old = logp_old * mask
            ref_logp = (
                sequence_logprobs(self.ref, ids, attn, T, cfg.temperature)[0] * mask if self.ref else None
            )
            values = None
            if critic is not None:
                critic.eval()
                if req.critic == "sequence":
                    values = critic(rb.prompt_ids, rb.prompt_mask).float()
                else:
                    values = critic(ids, attn, T).float() * mask
        R = R.to(self.device)
        token_rewards = terminal_rewards(R, mask)
        kl_tok = kl_penalty(logp_old, ref_logp, cfg.kl_estimator) * mask if ref_logp is not None else None
        if kl_tok is not None and cfg.kl_in == "reward":
            token_rewards = token_rewards - cfg.kl_coef * kl_tok
        batch = SequenceBatch(
            mask=mask,
            logp_old=logp_old,
            rewards=R,
            token_rewards=token_rewards,
            group_ids=rb.prompt_index,
            values=values,
            baseline_rewards=baseline.to(self.device) if baseline is not None else None,
        )
        compute_advantages(batch, algo, **estimator_params(cfg))
        check_finite(self.step_idx + 1, advantages=batch.advantages)
        stats = self._optimise(rb, batch, ref_logp)
        t_sync = self.sync_rollout()
        t_train = time.perf_counter() - t0 - t_gen - t_score

        self.step_idx += 1
        n_tok = int(rb.response_mask.sum()) + (
            int(greedy_rb.response_mask.sum()) if greedy_rb is not None else 0
        )
        lengths = rb.response_mask.sum(-1).float()
        # sums over ranks: reward, rows, response tokens, generated tokens, unfinished rows, errors, greedy reward
        tot = self.dist.all_sum(
            [
                float(R.sum()),
                float(R.numel()),
                float(lengths.sum()),
                float(n_tok),
                float((~rb.finished).sum()),
                float(errors),
                float(baseline.sum()) if baseline is not None else 0.0,
                float(((rb.logprobs - logp_old).abs() * mask).sum()),
                float(kl_tok.sum()) if kl_tok is not None else 0.0,
            ],
            self.device,
        )
        self.generated_tokens += int(tot[3])
        dt = time.perf_counter() - t0
        self.elapsed += dt
        row: dict[str, Any] = {
            "step": self.step_idx,
            "reward_mean": tot[0] / tot[1],
            "response_length": tot[2] / tot[1],
            "response_clip_frac": tot[4] / tot[1],
            "verifier_errors": int(tot[5]),
            "generated_tokens": self.generated_tokens,
            "gen_tokens_per_s": tot[3] / max(t_gen, 1e-9),
            "time_gen_s": t_gen,
            "time_score_s": t_score,
            "time_train_s": t_train,
            "time_sync_s": t_sync,
            "step_time_s": dt,
            "wall_time_s": self.elapsed,
            "rollout_logp_diff": tot[7] / max(tot[2], 1.0),
            "peak_memory_mb": peak_memory_mb(self.device),
        }
        if baseline is not None:
            row["greedy_reward_mean"] = tot[6] / tot[1]
        if kl_tok is not None:
            row["kl"] = tot[8] / max(tot[2], 1.0)
        row.update(stats)
        return row

    def _scale(self, m: Tensor) -> float:
        """Factor on this rank's minibatch loss so that DeepSpeed's average over ranks equals the loss of
        the union of the ranks' minibatches: ``local_units * world / global_units``, the units being
        valid tokens (token-mean) or sequences (the per-sequence aggregations). 1 in one process."""
        if self.dist.world == 1:
            return 1.0
        local = float(m.sum()) if self.cfg.agg == "token-mean" else float((m.sum(-1) > 0).sum())
        (total,) = self.dist.all_sum([local], self.device)
        return local * self.dist.world / max(total, 1.0)

    def _optimise(self, rb: RolloutBatch, batch: SequenceBatch, ref_logp: Tensor | None) -> dict[str, Any]:
        cfg, algo = self.cfg, self.algo
        req = algo.requires
        ids, attn, T = rb.input_ids, rb.attention_mask, rb.response_len
        mask = batch.mask
        actor = self.actor_engine.module
        critic = self.critic_engine.module if self.critic_engine is not None else None
        out: dict[str, Any] = {}
        if critic is not None:
            if req.critic == "sequence":
                p = torch.sigmoid(batch.values)
                n, sp, sb, sr = self.dist.all_sum(
                    [
                        float(p.numel()),
                        float(p.sum()),
                        float(((p - batch.rewards) ** 2).sum()),
                        float(batch.rewards.sum()),
                    ],
                    self.device,
                )
                out["v0_mean"] = sp / n
                out["v0_brier"] = sb / n
                out["v0_gap"] = (sp - sr) / n
            else:
                out["explained_variance"] = explained_variance(
                    critic_values(algo, batch.values), batch.returns, mask
                )
        nonzero, kept, valid = self.dist.all_sum(
            [float((batch.advantages != 0).sum()), float(batch.loss_mask.sum()), float(mask.sum())],
            self.device,
        )
        out["loss_frac"] = kept / max(valid, 1.0)
        train_actor = self.step_idx >= cfg.critic_warmup and nonzero > 0
        out["actor_skipped"] = int(not train_actor)
        stats: dict[str, list[float]] = {}
        B = batch.batch_size
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_idx)
        actor.train()
        if critic is not None:
            critic.train()
        for _epoch in range(cfg.epochs):
            perm = torch.randperm(B, generator=gen)
            for rows in torch.tensor_split(perm, cfg.minibatches):
                rows = rows.to(self.device)
                m = mask[rows]
                lm = batch.loss_mask[rows]
                if train_actor:
                    logp, ent = sequence_logprobs(actor, ids[rows], attn[rows], T, cfg.temperature)
                    pl, pm = policy_loss(
                        logp,
                        batch.logp_old[rows],
                        batch.advantages[rows],
                        lm,
                        clip_low=cfg.clip,
                        clip_high=cfg.clip if cfg.clip_high is None else cfg.clip_high,
                        dual_clip=cfg.dual_clip,
                        agg=cfg.agg,
                        length_budget=cfg.max_new_tokens,
                    )
                    entropy = agg_loss(ent, lm, cfg.agg, cfg.max_new_tokens)
                    loss = pl - cfg.ent_coef * entropy
                    if ref_logp is not None and cfg.kl_in == "loss":
                        kl = agg_loss(
                            kl_penalty(logp, ref_logp[rows], cfg.kl_estimator),
                            lm,
                            cfg.agg,
                            cfg.max_new_tokens,
                        )
                        loss = loss + cfg.kl_coef * kl
                        stats.setdefault("kl_loss", []).append(float(kl.detach()))
                    check_finite(self.step_idx + 1, policy_loss=loss)
                    scale = self._scale(lm)
                    self.actor_engine.backward(loss * scale)
                    gn = self.actor_engine.step()
                    check_finite(self.step_idx + 1, actor_grad_norm=gn)
                    for k, v in pm.items():
                        stats.setdefault(k, []).append(v)
                    stats.setdefault("policy_loss", []).append(float(pl.detach()) * scale)
                    stats.setdefault("entropy", []).append(float(entropy.detach()) * scale)
                    stats.setdefault("grad_norm", []).append(gn)
                if critic is not None:
                    if req.critic == "sequence":
                        pred = critic(rb.prompt_ids[rows], rb.prompt_mask[rows]).float()
                    else:
                        pred = critic(ids[rows], attn[rows], T).float() * m
                    vl = critic_loss(
                        algo, pred, batch.returns[rows], m, old_pred=batch.values[rows], clip=None
                    )
                    check_finite(self.step_idx + 1, critic_loss=vl)
                    scale = self._scale(m) if pred.dim() == 2 else self._scale(torch.ones(len(rows), 1))
                    self.critic_engine.backward(vl * scale)
                    cgn = self.critic_engine.step()
                    check_finite(self.step_idx + 1, critic_grad_norm=cgn)
                    stats.setdefault("critic_bce" if algo.critic_loss == "bce" else "value_loss", []).append(
                        float(vl.detach()) * scale
                    )
                    stats.setdefault("critic_grad_norm", []).append(cgn)
        actor.eval()
        if critic is not None:
            critic.eval()
        # losses were scaled per rank so that their mean over ranks is the whole batch's; other
        # statistics are averaged over ranks; the ratio extremes are this rank's
        keys = sorted(k for k in stats if k not in ("ratio_min", "ratio_max"))
        means = self.dist.all_sum([float(np.mean(stats[k])) for k in keys], self.device)
        out.update({k: v / self.dist.world for k, v in zip(keys, means)})
        if "ratio_min" in stats:
            out["ratio_min"], out["ratio_max"] = min(stats["ratio_min"]), max(stats["ratio_max"])
        return out

    # ------------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """mean@k accuracy and pass@k on the validation split (k = ``eval_samples``, at the rollout
        temperature), greedy accuracy, and for SPPO the critic's calibration against per-prompt mean@k.
        Ranks split the prompts (every ``world``-th) and their sums are added up."""
        cfg = self.cfg
        if not self.val_set:
            return {}
        k = cfg.eval_samples
        mine = list(range(self.dist.rank, len(self.val_set), self.dist.world))
        if mine:
            prompts = [render_prompt(self.val_set[i], self.tokenizer) for i in mine]
            truths = [self.val_set[i].answer for i in mine]
            rb = self.rollout.generate(
                prompts,
                n=k,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_new_tokens=cfg.max_new_tokens,
                seed=self._seeds(-1, mine),
            )
            scores, err = self._score(rb.texts, [truths[int(i)] for i in rb.prompt_index])
            per_prompt = scores.view(len(prompts), k)
            greedy = self.rollout.generate(prompts, greedy=True, max_new_tokens=cfg.max_new_tokens)
            g_scores, g_err = self._score(greedy.texts, truths)
            sums = [
                float(per_prompt.sum()),
                float((per_prompt.max(1).values > 0).sum()),
                float(g_scores.sum()),
                float(err + g_err),
            ]
        else:
            sums = [0.0, 0.0, 0.0, 0.0]
        tot = self.dist.all_sum(sums, self.device)
        n = len(self.val_set)
        out: dict[str, Any] = {
            "val_accuracy": tot[0] / (n * k),
            "pass_at_k": tot[1] / n,
            "val_greedy_accuracy": tot[2] / n,
            "val_k": k,
            "val_verifier_errors": int(tot[3]),
        }
        if self.algo.requires.critic == "sequence" and mine:
            pred = torch.sigmoid(self.critic_engine.module(rb.prompt_ids[::k], rb.prompt_mask[::k]).float())
            pairs = list(zip(pred.cpu().tolist(), per_prompt.mean(1).tolist()))
        else:
            pairs = []
        if self.algo.requires.critic == "sequence":
            pairs = self.dist.gather_lists(pairs)
            pred_all = np.array([p for p, _ in pairs])
            emp = np.array([e for _, e in pairs])
            out["val_critic_brier"] = float(np.mean((pred_all - emp) ** 2))
            if np.std(emp) > 0 and np.std(pred_all) > 0:
                from scipy.stats import pearsonr, spearmanr

                out["val_critic_pearson"] = float(pearsonr(pred_all, emp)[0])
                out["val_critic_spearman"] = float(spearmanr(pred_all, emp)[0])
        return out

    @torch.no_grad()
    def critic_trace(self) -> dict[str, np.ndarray] | None:
        """What the critic says on sampled validation responses (tail-effect diagnostic): a token
        critic's ``V(s_t)`` for every response token (``[N, T]``, with lengths), or a sequence critic's
        ``V(s_p)`` per response, with each response's outcome. All ranks call this (ZeRO-3)."""
        if self.critic_engine is None or not self.val_set:
            return None
        cfg, critic = self.cfg, self.critic_engine.module
        mine = list(range(self.dist.rank, len(self.val_set), self.dist.world))
        rows: list[tuple[list[float], float]] = []
        if mine:
            prompts = [render_prompt(self.val_set[i], self.tokenizer) for i in mine]
            rb = self.rollout.generate(
                prompts,
                n=cfg.eval_samples,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_new_tokens=cfg.max_new_tokens,
                seed=self._seeds(-2, mine),
            ).to(self.device)
            R, _ = self._score(rb.texts, [self.val_set[mine[int(i)]].answer for i in rb.prompt_index])
            if self.algo.requires.critic == "sequence":
                v = torch.sigmoid(critic(rb.prompt_ids, rb.prompt_mask).float())[:, None]
                lengths = torch.ones(len(R), dtype=torch.long)
            else:
                v = critic_values(self.algo, critic(rb.input_ids, rb.attention_mask, rb.response_len).float())
                lengths = rb.response_mask.sum(-1).cpu()
            rows = [(v[b, : int(lengths[b])].cpu().tolist(), float(R[b])) for b in range(len(R))]
        rows = self.dist.gather_lists(rows)
        T = max(len(v) for v, _ in rows)
        values = np.zeros((len(rows), T), dtype=np.float32)
        for b, (v, _) in enumerate(rows):
            values[b, : len(v)] = v
        out = {
            "lengths": np.array([len(v) for v, _ in rows]),
            "success": np.array([r for _, r in rows], dtype=np.float32),
            "horizon": np.array(cfg.max_new_tokens),
        }
        if self.algo.requires.critic == "sequence":
            out["kind"], out["v0"] = np.array("sequence"), values[:, 0]
        else:
            out["kind"], out["values"] = np.array("step"), values
        return out

    # ------------------------------------------------------------------------------------- loop

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        bar = None
        if cfg.progress and self.dist.main:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=cfg.steps,
                initial=self.step_idx,
                unit="step",
                desc=f"{self.algo.name}/llm",
                dynamic_ncols=True,
            )
        try:
            with Preemption() as pre:
                if self.step_idx == 0:
                    first = self.evaluate()
                    self.logger.log({"step": 0, "wall_time_s": 0.0, "generated_tokens": 0, **first}, step=0)
                last = self.step_idx >= cfg.steps
                while not last:
                    row = self.update()
                    # the last update: the step budget, or the time budget (rank 0's clock decides)
                    out_of_time = cfg.max_seconds is not None and self.elapsed >= cfg.max_seconds
                    last = self.step_idx >= cfg.steps or bool(self.dist.broadcast(out_of_time))
                    if cfg.eval_every and (self.step_idx % cfg.eval_every == 0 or last):
                        row.update(self.evaluate())
                    self.logger.log(row, step=self.step_idx)
                    if bar is not None:
                        bar.update(1)
                        post = {
                            "reward": f"{row['reward_mean']:.2f}",
                            "tok/s": f"{row['gen_tokens_per_s']:.0f}",
                        }
                        if "val_accuracy" in row:
                            post["val"] = f"{row['val_accuracy']:.2f}"
                        bar.set_postfix(post)
                    (stop,) = self.dist.all_sum([1.0 if pre.requested else 0.0], self.device)
                    if stop:
                        self.save_checkpoint()
                        self.close()
                        exit_preempted(
                            self.out,
                            pre.requested or "SIGTERM",
                            f"sppo-rl llm --out-dir {self.out} --resume ...",
                        )
                    if self.step_idx % cfg.checkpoint_every == 0 or last:
                        self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
        self.export(self.out / "final")
        trace = self.critic_trace()
        if trace is not None and self.dist.main:
            np.savez_compressed(self.out / "critic_trace.npz", **trace)
        summary = None
        if self.dist.main:
            from sppo_rl.runtime.logging import read_metrics

            rows = read_metrics(self.out / "metrics.jsonl")
            evals = [r for r in rows if r.get("val_accuracy") is not None]
            summary = {
                "algo": self.algo.name,
                "seed": cfg.seed,
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
            atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        summary = self.dist.broadcast(summary)
        self.close()
        return summary

    def export(self, folder: Path) -> None:
        """``folder/actor`` (a transformers folder with its tokenizer) and ``folder/critic``; all ranks
        call this (ZeRO-3 gathers the weights), rank 0 writes."""
        self.actor_engine.save_pretrained(folder / "actor")
        if self.dist.main:
            self.tokenizer.save_pretrained(folder / "actor")
        if self.critic_engine is not None:
            state = {n: t.detach().to("cpu", copy=True) for n, t in self.critic_engine.full_state_items()}
            if self.dist.main:
                self.critic.save_pretrained(folder / "critic", tokenizer=self.tokenizer, state_dict=state)
        self.dist.barrier()

    def close(self) -> None:
        self.logger.close()
        self.scorer.close()


def _single_process_group(timeout_s: float) -> None:
    """A process group of one (DeepSpeed needs one even without a launcher)."""
    import datetime
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def run_llm(cfg: LLMConfig) -> dict[str, Any]:
    """Entry point of ``sppo-rl llm``."""
    summary = LLMRun(cfg).run()
    if summary.get("final_val_accuracy") is not None:
        print(
            f"[sppo-rl] {summary['algo']}: val accuracy {summary['start_val_accuracy']:.3f} -> "
            f"{summary['final_val_accuracy']:.3f} in {summary['steps']} steps, {summary['wall_time_s']:.0f} s",
            file=sys.stderr,
        )
    return summary
