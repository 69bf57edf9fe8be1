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
from dataclasses import asdict
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
from sppo_rl.agents.algorithms import critic_values
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data import Example, load_examples, render_prompt
from sppo_rl.llm.engines import TorchEngine
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
    save_config,
)
from sppo_rl.runtime.checkpoint import atomic_write_text, read_meta, torch_load, torch_save
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


class LLMRun:
    """State and loop of one LLM run. ``run()`` trains for ``steps`` updates and returns the summary."""

    def __init__(self, cfg: LLMConfig) -> None:
        self.cfg = cfg
        self.algo = get_algorithm(cfg.algo)
        req = self.algo.requires
        G = cfg.group_size if cfg.group_size is not None else (self.algo.group_size if req.groups else 1)
        check_setup(self.algo, G, cfg.prompts_per_step * G)
        self.group_size = G
        if cfg.steps < 1 or cfg.prompts_per_step < 1:
            raise RunError("--steps and --prompts-per-step must be >= 1")
        if cfg.minibatches < 1 or cfg.minibatches > cfg.prompts_per_step * G:
            raise RunError(f"--minibatches must be in [1, {cfg.prompts_per_step * G}]")
        if cfg.engine != "torch":
            raise RunError("--engine deepspeed is started through the distributed launcher; see the README")
        self.out = prepare_run_dir(cfg.out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
        if cfg.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
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
            actor_path, self.warmstart = embedded_model(cfg, self.train_set, self.scorer)
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
        self.actor_engine = TorchEngine(self.actor, cfg.actor_lr, cfg.weight_decay, cfg.max_grad_norm)
        self.critic_engine = (
            TorchEngine(self.critic, cfg.critic_lr, cfg.weight_decay, cfg.max_grad_norm)
            if self.critic
            else None
        )
        self.rollout = HFRolloutEngine(self.actor, self.tokenizer, add_special_tokens=False)

        self.data_rng = random.Random(cfg.seed)
        self.order: list[int] = []
        self.step_idx = 0
        self.elapsed = 0.0
        self.generated_tokens = 0
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=cfg.keep_checkpoints)
        resume_pos = resume_step = None
        if cfg.resume:
            ckpt = self.ckpts.latest()
            assert ckpt is not None
            self.load_checkpoint(ckpt)
            meta = read_meta(ckpt)
            resume_pos, resume_step = meta["metrics_bytes"], meta["step"]
        resolved = {
            "group_size": G,
            "rows_per_step": cfg.prompts_per_step * G,
            "actor": str(actor_path),
            "critic": str(cfg.critic_model or (actor_path if self.critic else "none")),
            "warmstart": self.warmstart,
            "train_examples": len(self.train_set),
            "val_examples": len(self.val_set),
            "reward_fn": reward_fn,
            "device": str(self.device),
        }
        self.resolved = resolved
        save_config(self.out, {**asdict(cfg), "resolved": resolved})
        self.logger = RunLogger(
            self.out,
            {**asdict(cfg), "resolved": resolved},
            tensorboard=cfg.tensorboard,
            wandb=cfg.wandb,
            wandb_project=cfg.wandb_project,
            wandb_mode=cfg.wandb_mode,
            resume_position=resume_pos,
            resume_step=resume_step,
        )

    # ------------------------------------------------------------------------------------- state

    def _next_prompts(self) -> list[Example]:
        out = []
        while len(out) < self.cfg.prompts_per_step:
            if not self.order:
                self.order = list(range(len(self.train_set)))
                self.data_rng.shuffle(self.order)
            out.append(self.train_set[self.order.pop()])
        return out

    def save_checkpoint(self) -> Path:
        def write(folder: Path) -> None:
            self.actor_engine.save_pretrained(folder / "actor")
            self.tokenizer.save_pretrained(folder / "actor")
            if self.critic is not None:
                self.critic.save_pretrained(folder / "critic")
            torch_save(
                {
                    "actor_opt": self.actor_engine.optimizer_state(),
                    "critic_opt": self.critic_engine.optimizer_state() if self.critic_engine else None,
                    "data_rng": self.data_rng.getstate(),
                    "order": self.order,
                    "torch_rng": torch.get_rng_state(),
                    "step": self.step_idx,
                    "elapsed": self.elapsed,
                    "generated_tokens": self.generated_tokens,
                },
                folder / "state.pt",
            )

        meta = {"metrics_bytes": self.logger.position(), "algo": self.algo.name}
        return self.ckpts.save(self.step_idx, write, meta)

    def load_checkpoint(self, ckpt: Path) -> None:
        dtype = getattr(torch, self.cfg.dtype)
        fresh = load_actor(ckpt / "actor", dtype=dtype, device=self.device)
        self.actor.load_state_dict(fresh.state_dict())
        if self.critic is not None:
            cls = type(self.critic)
            self.critic.load_state_dict(
                cls.from_pretrained(ckpt / "critic", dtype=dtype, device=self.device).state_dict()
            )
        s = torch_load(ckpt / "state.pt")
        self.actor_engine.load_optimizer_state(s["actor_opt"])
        if self.critic_engine is not None:
            self.critic_engine.load_optimizer_state(s["critic_opt"])
        self.data_rng.setstate(s["data_rng"])
        self.order = list(s["order"])
        torch.set_rng_state(s["torch_rng"])
        self.step_idx, self.elapsed, self.generated_tokens = s["step"], s["elapsed"], s["generated_tokens"]

    # ------------------------------------------------------------------------------------- one update

    def _score(self, texts: list[str], truths: list[str]) -> tuple[Tensor, int]:
        res = self.scorer.score(texts, truths)
        return torch.from_numpy(res.scores.astype(np.float32)), res.errors

    def update(self) -> dict[str, Any]:
        cfg, algo, G = self.cfg, self.algo, self.group_size
        req = algo.requires
        t0 = time.perf_counter()
        examples = self._next_prompts()
        prompts = [render_prompt(e, self.tokenizer) for e in examples]
        step_seed = cfg.seed * 1_000_003 + self.step_idx
        rb = self.rollout.generate(
            prompts,
            n=G,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=step_seed,
        )
        greedy_rb = None
        if req.greedy_baseline:
            greedy_rb = self.rollout.generate(prompts, n=1, greedy=True, max_new_tokens=cfg.max_new_tokens)
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
        with torch.no_grad():
            logp_old, _ = sequence_logprobs(self.actor, ids, attn, T, cfg.temperature)
            logp_old = logp_old * mask
            ref_logp = (
                sequence_logprobs(self.ref, ids, attn, T, cfg.temperature)[0] * mask if self.ref else None
            )
            values = None
            if self.critic is not None:
                if req.critic == "sequence":
                    values = self.critic(rb.prompt_ids, rb.prompt_mask).float()
                else:
                    values = self.critic(ids, attn, T).float() * mask
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
        compute_advantages(batch, algo, gamma=cfg.gamma, lam=cfg.lam, std=cfg.grpo_std)
        check_finite(self.step_idx + 1, advantages=batch.advantages)
        stats = self._optimise(rb, batch, ref_logp)
        t_train = time.perf_counter() - t0 - t_gen - t_score

        self.step_idx += 1
        n_tok = int(rb.response_mask.sum()) + (
            int(greedy_rb.response_mask.sum()) if greedy_rb is not None else 0
        )
        self.generated_tokens += n_tok
        dt = time.perf_counter() - t0
        self.elapsed += dt
        lengths = rb.response_mask.sum(-1).float()
        row: dict[str, Any] = {
            "step": self.step_idx,
            "reward_mean": float(R.mean()),
            "response_length": float(lengths.mean()),
            "response_clip_frac": float((~rb.finished).float().mean()),
            "verifier_errors": errors,
            "generated_tokens": self.generated_tokens,
            "gen_tokens_per_s": n_tok / max(t_gen, 1e-9),
            "time_gen_s": t_gen,
            "time_score_s": t_score,
            "time_train_s": t_train,
            "step_time_s": dt,
            "wall_time_s": self.elapsed,
            "rollout_logp_diff": float(
                ((rb.logprobs - logp_old).abs() * mask).sum() / mask.sum().clamp(min=1)
            ),
            "peak_memory_mb": peak_memory_mb(self.device),
        }
        if baseline is not None:
            row["greedy_reward_mean"] = float(baseline.mean())
        if kl_tok is not None:
            row["kl"] = float(kl_tok.sum() / mask.sum().clamp(min=1))
        row.update(stats)
        return row

    def _optimise(self, rb: RolloutBatch, batch: SequenceBatch, ref_logp: Tensor | None) -> dict[str, Any]:
        cfg, algo = self.cfg, self.algo
        req = algo.requires
        ids, attn, T = rb.input_ids, rb.attention_mask, rb.response_len
        mask = batch.mask
        out: dict[str, Any] = {}
        if self.critic is not None:
            if req.critic == "sequence":
                p = torch.sigmoid(batch.values)
                out["v0_mean"] = float(p.mean())
                out["v0_brier"] = float(((p - batch.rewards) ** 2).mean())
                out["v0_gap"] = float(p.mean() - batch.rewards.mean())
            else:
                out["explained_variance"] = explained_variance(
                    critic_values(algo, batch.values), batch.returns, mask
                )
        train_actor = self.step_idx >= cfg.critic_warmup and not bool((batch.advantages == 0).all())
        out["actor_skipped"] = int(not train_actor)
        stats: dict[str, list[float]] = {}
        B = batch.batch_size
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_idx)
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        for _epoch in range(cfg.epochs):
            perm = torch.randperm(B, generator=gen)
            for rows in torch.tensor_split(perm, cfg.minibatches):
                rows = rows.to(self.device)
                m = mask[rows]
                if train_actor:
                    logp, ent = sequence_logprobs(self.actor, ids[rows], attn[rows], T, cfg.temperature)
                    pl, pm = policy_loss(
                        logp,
                        batch.logp_old[rows],
                        batch.advantages[rows],
                        batch.loss_mask[rows],
                        clip_low=cfg.clip,
                        clip_high=cfg.clip if cfg.clip_high is None else cfg.clip_high,
                        dual_clip=cfg.dual_clip,
                        agg=cfg.agg,
                        length_budget=cfg.max_new_tokens,
                    )
                    entropy = agg_loss(ent, batch.loss_mask[rows], cfg.agg, cfg.max_new_tokens)
                    loss = pl - cfg.ent_coef * entropy
                    if ref_logp is not None and cfg.kl_in == "loss":
                        kl = agg_loss(
                            kl_penalty(logp, ref_logp[rows], cfg.kl_estimator), batch.loss_mask[rows], cfg.agg, cfg.max_new_tokens
                        )
                        loss = loss + cfg.kl_coef * kl
                        stats.setdefault("kl_loss", []).append(float(kl.detach()))
                    check_finite(self.step_idx + 1, policy_loss=loss)
                    self.actor_engine.backward(loss)
                    gn = self.actor_engine.step()
                    check_finite(self.step_idx + 1, actor_grad_norm=gn)
                    for k, v in pm.items():
                        stats.setdefault(k, []).append(v)
                    stats.setdefault("policy_loss", []).append(float(pl.detach()))
                    stats.setdefault("entropy", []).append(float(entropy.detach()))
                    stats.setdefault("grad_norm", []).append(gn)
                if self.critic is not None:
                    if req.critic == "sequence":
                        pred = self.critic(rb.prompt_ids[rows], rb.prompt_mask[rows]).float()
                    else:
                        pred = self.critic(ids[rows], attn[rows], T).float() * m
                    vl = critic_loss(
                        algo, pred, batch.returns[rows], m, old_pred=batch.values[rows], clip=None
                    )
                    check_finite(self.step_idx + 1, critic_loss=vl)
                    self.critic_engine.backward(vl)
                    cgn = self.critic_engine.step()
                    check_finite(self.step_idx + 1, critic_grad_norm=cgn)
                    stats.setdefault("critic_bce" if algo.critic_loss == "bce" else "value_loss", []).append(
                        float(vl.detach())
                    )
                    stats.setdefault("critic_grad_norm", []).append(cgn)
        self.actor.eval()
        if self.critic is not None:
            self.critic.eval()
        for k, vals in stats.items():
            out[k] = (
                min(vals) if k == "ratio_min" else max(vals) if k == "ratio_max" else float(np.mean(vals))
            )
        return out

    # ------------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """mean@k accuracy and pass@k on the validation split (k = ``eval_samples``, at the rollout
        temperature), greedy accuracy, and for SPPO the critic's calibration against per-prompt mean@k."""
        cfg = self.cfg
        if not self.val_set:
            return {}
        k = cfg.eval_samples
        prompts = [render_prompt(e, self.tokenizer) for e in self.val_set]
        truths = [e.answer for e in self.val_set]
        rb = self.rollout.generate(
            prompts,
            n=k,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=99991,
        )
        scores, err = self._score(rb.texts, [truths[int(i)] for i in rb.prompt_index])
        per_prompt = scores.view(len(prompts), k)
        greedy = self.rollout.generate(prompts, greedy=True, max_new_tokens=cfg.max_new_tokens)
        g_scores, g_err = self._score(greedy.texts, truths)
        out: dict[str, Any] = {
            "val_accuracy": float(per_prompt.mean()),
            "pass_at_k": float((per_prompt.max(1).values > 0).float().mean()),
            "val_greedy_accuracy": float(g_scores.mean()),
            "val_k": k,
            "val_verifier_errors": err + g_err,
        }
        if isinstance(self.critic, SequenceCritic):
            from scipy.stats import pearsonr, spearmanr

            enc = rb.prompt_ids[::k].to(self.device), rb.prompt_mask[::k].to(self.device)
            pred = torch.sigmoid(self.critic(*enc).float()).cpu().numpy()
            emp = per_prompt.mean(1).numpy()
            out["val_critic_brier"] = float(np.mean((pred - emp) ** 2))
            if np.std(emp) > 0 and np.std(pred) > 0:
                out["val_critic_pearson"] = float(pearsonr(pred, emp)[0])
                out["val_critic_spearman"] = float(spearmanr(pred, emp)[0])
        return out

    # ------------------------------------------------------------------------------------- loop

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=cfg.steps,
                initial=self.step_idx,
                unit="step",
                desc=f"{self.algo.name}/llm",
                dynamic_ncols=True,
            )
        first_eval = None
        try:
            with Preemption() as pre:
                if self.step_idx == 0:
                    first_eval = self.evaluate()
                    self.logger.log(
                        {"step": 0, "wall_time_s": 0.0, "generated_tokens": 0, **first_eval}, step=0
                    )
                while self.step_idx < cfg.steps:
                    row = self.update()
                    if cfg.eval_every and (self.step_idx % cfg.eval_every == 0 or self.step_idx == cfg.steps):
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
                    if pre.requested:
                        self.save_checkpoint()
                        self.close()
                        exit_preempted(
                            self.out, pre.requested, f"sppo-rl llm --out-dir {self.out} --resume ..."
                        )
                    if self.step_idx % cfg.checkpoint_every == 0 or self.step_idx == cfg.steps:
                        self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
        final = self.out / "final"
        self.actor.save_pretrained(final / "actor")
        self.tokenizer.save_pretrained(final / "actor")
        if self.critic is not None:
            self.critic.save_pretrained(final / "critic", tokenizer=self.tokenizer)
        from sppo_rl.runtime.logging import read_metrics

        rows = read_metrics(self.out / "metrics.jsonl")
        evals = [r for r in rows if r.get("val_accuracy") is not None]
        summary = {
            "algo": self.algo.name,
            "seed": cfg.seed,
            "steps": self.step_idx,
            "group_size": self.group_size,
            "wall_time_s": self.elapsed,
            "generated_tokens": self.generated_tokens,
            "start_val_accuracy": evals[0]["val_accuracy"] if evals else None,
            "final_val_accuracy": evals[-1]["val_accuracy"] if evals else None,
            "best_val_accuracy": max(r["val_accuracy"] for r in evals) if evals else None,
            "peak_memory_mb": peak_memory_mb(self.device),
            "warmstart": self.warmstart,
        }
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        self.close()
        return summary

    def close(self) -> None:
        self.logger.close()
        self.scorer.close()


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
