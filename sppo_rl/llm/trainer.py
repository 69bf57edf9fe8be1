"""``sppo-rl llm``: the LLM world's trainer over the shared core.

A run resolves its settings once (:func:`~sppo_rl.llm.plan.resolve`: every refusal before the run folder
is touched), builds its models (:mod:`sppo_rl.llm.build`), then repeats one update, whose stages
(:mod:`sppo_rl.llm.stages`, one module each) read in order::

    collect -> score -> to_batch -> advantages -> ppo_update -> sync -> row

The trainer reads ``algo.requires`` and ``algo.critic_loss``; it never tests the algorithm's name.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from sppo_rl.llm.build import (
    actor_folder,
    build_models,
    config_record,
    init_critic_bias,
    prepare_prompts,
    row_fn,
)
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.models.core import quiet_transformers
from sppo_rl.llm.models.engines import init_process_group, launcher_dist
from sppo_rl.llm.models.flops import PARTS, policy_pass, round_lengths, row_lengths, run_shape, update_flops
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.outputs.completions import CompletionLog
from sppo_rl.llm.outputs.export import export, stopped_summary, summary_of
from sppo_rl.llm.plan import resolve
from sppo_rl.llm.rewards.scorer import start_scorer
from sppo_rl.llm.stages.advantages import advantages
from sppo_rl.llm.stages.collect import Collector, PromptOrder, Sampler
from sppo_rl.llm.stages.evaluate import Evaluator, evaluate, write_critic_trace
from sppo_rl.llm.stages.ppo_update import ppo_update, rewards_all_equal
from sppo_rl.llm.stages.row import (
    StageTimer,
    dynamic_sampling_row,
    flops_row,
    peak_memory_mb,
    reward_fn_row,
    update_row,
    update_sums,
)
from sppo_rl.llm.stages.score import Scoring
from sppo_rl.llm.stages.spo import SpoOrder, observe, tracker_values
from sppo_rl.llm.stages.sync import sync
from sppo_rl.llm.stages.to_batch import pick, to_batch
from sppo_rl.runtime.checkpoint import CheckpointManager, check_written_by, read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import NullLogger, RunLogger, check_metrics_length, start_logging
from sppo_rl.runtime.loop import Schedule, announce, progress_bar, run_loop
from sppo_rl.runtime.run import Preempted, RunError, RunFailed, check_resume, prepare_run_dir, unlock_run_dir
from sppo_rl.runtime.schedule import lr_factor, set_lr
from sppo_rl.runtime.trace import TRACE_FILE


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
        self.dist = launcher_dist()
        self.plan, task = plan, task = resolve(cfg, self.dist)
        self.cfg, self.algo, self.group_size, self.device = plan.cfg, plan.algo, plan.group_size, plan.device
        cfg = plan.cfg
        if cfg.engine == "deepspeed":
            self.dist = init_process_group(cfg.collective_timeout, always=True)
        self.scoring = Scoring(start_scorer(plan.reward_fn, cfg.reward_timeout, cfg.reward_weights or None))
        try:
            self.out = self._main_first(self._prepare)
        except BaseException:
            self.scoring.close()
            raise
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, cfg.threads))
            if (
                cfg.engine == "torch"
            ):  # transformers imports DeepSpeed when saving; tell it the device it would
                os.environ.setdefault("DS_ACCELERATOR", "cpu")  # find, rather than warn that it found no GPU
        torch.manual_seed(cfg.seed)
        actor_path, warmstart = actor_folder(plan, task.train, self.scoring.scorer, self._main_first)
        tokenizer = load_tokenizer(actor_path)
        self.train_set, self.val_set = prepare_prompts(
            plan, task.train, task.val, tokenizer, actor_path, self.dist.main
        )
        self.models = m = build_models(plan, actor_path, tokenizer, warmstart, self._main_first)
        self.rows = row_fn(plan)
        self.order = (SpoOrder if self.algo.requires.tracker else PromptOrder)(len(self.train_set), cfg.seed)
        self.update_idx, self.elapsed, self.generated_tokens = 0, 0.0, 0
        self.flops_shape = run_shape(plan, m)
        self.flops = dict.fromkeys(PARTS, 0)  # cumulative FLOPs by part (:mod:`sppo_rl.llm.models.flops`)
        self.critic_init_p0: float | None = None  # --critic-init first-batch: the p0 it used
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=cfg.keep_checkpoints)
        ckpt = self._resume() if cfg.resume else None
        self.logger: RunLogger | NullLogger = NullLogger()
        if self.dist.main:
            self.logger = start_logging(
                self.out,
                plan.given,
                config_record(plan, m, len(self.train_set), len(self.val_set), self.dist.world),
                ckpt,
                world="llm",
            )
        every, text = (cfg.log_completions_every, self.logger.text) if self.dist.main else (0, None)
        self.completions = CompletionLog(self.out, every, text)
        self.sampler = Sampler(m.rollout, plan.sampling, cfg.seed)
        args = (self.sampler, self.scoring, plan, self.dist, self.device, m.tokenizer)
        self.collector = Collector(self.train_set, self.order, *args, self.completions)
        self.evaluator = Evaluator(
            self.val_set, plan, self.sampler, self.scoring, m.critic_engine, self.rows, self.dist, self.device,
            m.tokenizer, self.completions,
        )  # fmt: skip
        self._fail_streak = 0  # consecutive updates without one valid reward (--reward-fail-limit)
        self._failed_row: dict[str, Any] = {}

    def _prepare(self) -> Path:
        out = prepare_run_dir(self.cfg.out_dir, resume=self.cfg.resume, overwrite=self.cfg.overwrite)
        if self.cfg.resume:
            check_resume(out, self.plan.given)
        return out

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

    # ------------------------------------------------------------------------------------- one update

    def update(self) -> dict[str, Any]:
        plan, cfg, m, red = self.plan, self.cfg, self.models, self.dist.on(self.device)
        timer = StageTimer()
        before = (self.order.state(), torch.get_rng_state())  # if given up
        try:
            got = self.collector.collect(self.update_idx, timer)  # collect + score
        except Preempted:  # nothing was trained yet: back to the state before this update
            self.order.load(before[0])
            torch.set_rng_state(before[1])
            raise
        m.rollout.sleep()  # frees the sampler's memory while training (vLLM with --vllm-sleep)
        with timer("train"):
            pad = m.tokenizer.pad_token_id if m.tokenizer.pad_token_id is not None else 0
            picked = pick(got, self.group_size, pad, bool(cfg.dynamic_sampling_rounds), plan.latent)
            if self.update_idx == 0 and self.critic_init_p0 is None and plan.critic_init:
                self.critic_init_p0 = init_critic_bias(m.critic_engine.module, picked.R, picked.valid, red)
            critic = m.critic_engine.module if m.critic_engine is not None else None
            built = to_batch(picked, plan, m.actor_engine.module, m.ref, critic, self.rows, red)
            tracked, spo = plan.algo.requires.tracker, {}  # SPO: its tracker's p_hat is the baseline
            if tracked:
                tracker_values(self.order, built)
            advantages(built.batch, plan, built.rb.finished, self.update_idx + 1)
            if tracked:  # the outcomes enter the tracker after the estimate, before the actor trains
                spo = observe(
                    self.order, built, picked.valid, plan, m.actor_engine.module, self.rows, red, pad
                )
            lr = self._schedule_lr()
            equal = rewards_all_equal(built, picked.valid, red)
            skip = cfg.skip_equal_rewards and equal
            stats = ppo_update(
                built, plan, m.actor_engine, m.critic_engine, self.rows, self.update_idx, skip, red
            )
        with timer("sync"):
            sync(m.rollout, m.actor_engine, bool(cfg.lora.rank))
        self.update_idx += 1
        return self._row(got, picked, built, {**stats, "rewards_all_equal": int(equal), **spo}, lr, timer)

    def _row(
        self, got: Any, picked: Any, built: Any, stats: dict[str, Any], lr: float, timer: Any
    ) -> dict[str, Any]:
        """The metrics row of the update just done (:mod:`sppo_rl.llm.stages.row`); counts the run's
        generated tokens and seconds, and stops the run when rewards keep failing."""
        cfg, dynamic = self.cfg, bool(self.cfg.dynamic_sampling_rounds)
        kl_tok = built.kl_per_token(cfg.kl_estimator, cfg.kl_clamp)
        tot = update_sums(
            got.rounds, picked.informative, built.batch.mask, kl_tok, dynamic, self.dist, self.device,
            self._update_flops(got, picked, stats),
        )  # fmt: skip
        self.generated_tokens += int(tot["generated"])
        for part in PARTS:
            self.flops[part] += round(tot[f"flops/{part}"])
        dt = timer.total()
        self.elapsed += dt
        extra = {
            "rollout_logp_diff": stats.get("rollout_mismatch_mean", float("nan")),
            "peak_memory_mb": peak_memory_mb(self.device),
            "learning_rate": lr,
            **(dynamic_sampling_row(tot, len(got.rounds), cfg.prompts_per_step) if dynamic else {}),
            **reward_fn_row(self.scoring.names, got.fn, self.dist, self.device),
        }
        totals = {"generated_tokens": self.generated_tokens, "wall_time_s": self.elapsed, "step_time_s": dt}
        totals.update(flops_row(self.flops))
        row = update_row(self.update_idx, tot, timer, totals, extra)
        self._check_rewards(row, tot)
        if picked.baseline is not None:
            row["greedy_reward_mean"] = tot["greedy_reward"] / max(tot["greedy_valid"], 1.0)
        if kl_tok is not None:
            row["kl"] = tot["kl"] / max(tot["kl_tokens"], 1.0)
        row.update(stats)
        if self.critic_init_p0 is not None and self.update_idx == 1:
            row["critic_init_p0"] = self.critic_init_p0
        if picked.latent_invalid is not None:
            row["latent_invalid"] = self.dist.all_sum([float(picked.latent_invalid)], self.device)[0]
        if cfg.overlong.filter:
            row["overlong_filtered"] = self.dist.all_sum([float((~built.rb.finished).sum())], self.device)[0]
        return row

    def _update_flops(self, got: Any, picked: Any, stats: dict[str, Any]) -> dict[str, int]:
        """This rank's FLOPs of the update just done, by part (:func:`~sppo_rl.llm.models.flops.update_flops`):
        every generation round, the rows trained on, the actor's passes only when it trained."""
        G = self.group_size
        rounds = [round_lengths(r.rb, G, r.greedy) for r in got.rounds]
        out = update_flops(self.flops_shape, rounds, row_lengths(picked.rb), not stats["actor_skipped"])
        if self.algo.requires.tracker:  # SPO re-scores its revisited prompts' last responses (no gradient)
            out["actor"] += policy_pass(self.flops_shape.actor, self.order.rescored)
        return out

    def _check_rewards(self, row: dict[str, Any], tot: dict[str, float]) -> None:
        """Stop the run (:class:`RunFailed`) after ``--reward-fail-limit`` updates in a row without one
        valid reward."""
        limit = self.cfg.reward_fail_limit
        self._fail_streak = self._fail_streak + 1 if tot["valid"] == 0 else 0
        if limit and self._fail_streak >= limit:
            self._failed_row = row
            raise RunFailed(
                f"no response got a valid reward in {self._fail_streak} consecutive updates (--reward-fail-limit "
                f"{limit}): {int(tot['errors'])} verifier errors in update {self.update_idx}, e.g. "
                f"{self.scoring.last_error or 'unknown'}; the run stopped (summary.json)"
            )

    def _schedule_lr(self) -> float:
        """Set both engines' learning rates for the update about to run (``--lr-schedule`` over ``--steps``,
        from the update index: :mod:`sppo_rl.runtime.schedule`); returns the actor's."""
        cfg, m = self.cfg, self.models
        f = lr_factor(cfg.lr_schedule, self.update_idx, cfg.steps, cfg.warmup_updates)
        set_lr(m.actor_engine.optimizer, cfg.actor_lr * f)
        if m.critic_engine is not None:
            set_lr(m.critic_engine.optimizer, cfg.critic_lr * f)
        return cfg.actor_lr * f

    # ------------------------------------------------------------------------------------- state

    def save_checkpoint(self) -> Path:
        m = self.models

        def write(folder: Path) -> None:
            m.actor_engine.save(folder / "actor", optimizer=self.cfg.optimizer_state)
            if m.critic_engine is not None:
                m.critic_engine.save(folder / "critic", optimizer=self.cfg.optimizer_state)
            if self.dist.main:
                state = {**self.order.state(), "torch_rng": torch.get_rng_state(), "step": self.update_idx}
                state.update(
                    elapsed=self.elapsed, generated_tokens=self.generated_tokens, flops=dict(self.flops)
                )
                torch_save({**state, "critic_init_p0": self.critic_init_p0}, folder / "state.pt")

        meta = {"metrics_bytes": self.logger.position(), "algo": self.algo.name, "ranks": self.dist.world}
        return self.ckpts.save(self.update_idx, write, {**meta, "optimizer_state": self.cfg.optimizer_state})

    def _resume(self) -> Path:
        """The newest intact checkpoint, loaded (damaged ones skipped with a warning; none: refused)."""
        if self.dist.world == 1:
            return self.ckpts.resume(self.load_checkpoint)
        ckpt = self._main_first(self.ckpts.resume)  # rank 0 verifies and picks it; every rank loads it
        self.load_checkpoint(ckpt)
        metrics_bytes = read_meta(ckpt)["metrics_bytes"]
        self._main_first(lambda: check_metrics_length(self.out / "metrics.jsonl", metrics_bytes))
        return ckpt

    def load_checkpoint(self, ckpt: Path) -> None:
        cfg, m, meta = self.cfg, self.models, read_meta(ckpt)
        check_written_by(ckpt, meta, self.algo.name)
        if meta.get("optimizer_state", True) is False and not cfg.resume_without_optimizer:
            raise RunError(
                f"--resume: {ckpt} was saved with --no-optimizer-state, so the resumed run would restart "
                "Adam's moments and differ from an uninterrupted one; pass --resume-without-optimizer to accept that"
            )
        if meta.get("ranks", 1) != self.dist.world and cfg.engine == "deepspeed":
            raise RunError(f"{ckpt} was written by {meta.get('ranks')} ranks; resume with as many")
        m.actor_engine.load(ckpt / "actor")
        if m.critic_engine is not None:
            m.critic_engine.load(ckpt / "critic")
        s = torch_load(ckpt / "state.pt")
        self.order.load(s)
        torch.set_rng_state(s["torch_rng"])
        self.update_idx, self.elapsed, self.generated_tokens = s["step"], s["elapsed"], s["generated_tokens"]
        self.critic_init_p0 = s.get("critic_init_p0")
        if "flops" not in s:
            warnings.warn(
                f"{ckpt} was saved before FLOPs were counted: flops_* count from update {self.update_idx}",
                stacklevel=2,
            )
        self.flops = {**dict.fromkeys(PARTS, 0), **s.get("flops", {})}
        sync(m.rollout, m.actor_engine, bool(cfg.lora.rank))

    # ------------------------------------------------------------------------------------- loop

    @property
    def updates(self) -> int:
        return self.update_idx

    def evaluate(self) -> dict[str, Any]:
        return evaluate(self.evaluator, self.update_idx)

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Exports (``final/``, the critic trace; all ranks) and, on rank 0, the summary from every row
        of ``metrics.jsonl``."""
        export(self.out / "final", self.models, self.cfg, self.dist)
        write_critic_trace(self.evaluator, self.out / TRACE_FILE)
        return summary_of(self, rows)

    def run(self, callback: Any = None) -> dict[str, Any]:
        """Train for ``steps`` updates; ``callback(row)`` after each (rank 0), ``False`` stops (:func:`run_loop`)."""
        cfg = self.cfg

        def postfix(row: dict[str, Any]) -> dict[str, str]:
            post = {"reward": f"{row['reward_mean']:.2f}", "tok/s": f"{row['gen_tokens_per_s']:.0f}"}
            if "val_accuracy" in row:
                post["val"] = f"{row['val_accuracy']:.2f}"
            return post

        first = {"step": 0, "wall_time_s": 0.0, "generated_tokens": 0, **flops_row(dict.fromkeys(PARTS, 0))}
        schedule = Schedule(
            cfg.steps, cfg.eval_every, cfg.checkpoint_every, cfg.max_seconds, eval_first=first, eval_last=True,
            log_step=lambda r: r["step"],
        )  # fmt: skip
        try:
            summary = run_loop(
                self,
                schedule,
                resume_hint=f"sppo-rl llm --out-dir {self.out} --resume ...",
                bar=progress_bar(
                    cfg.progress and self.dist.main,
                    cfg.steps,
                    self.update_idx,
                    f"{self.algo.name}/{task_label(cfg)}",
                ),
                postfix=postfix,
                agree=lambda flag: bool(self.dist.all_max([float(flag)], self.device)[0]),
                main=self.dist.main,
                callback=callback,
            )
        except RunFailed as e:
            if self.dist.main:
                if self._failed_row:
                    self.logger.log(self._failed_row, step=self._failed_row["step"])
                stopped_summary(self.out, self, str(e))
            self.close()
            raise
        return self.dist.broadcast(summary if self.dist.main else None)

    def close(self) -> None:
        self.logger.close()
        self.scoring.close()
        self.models.rollout.close()
        unlock_run_dir(self.out)


def task_label(cfg: LLMConfig) -> str:
    """The run's task in a few characters (the progress label): a generated task's name, else its data
    file's stem."""
    return cfg.task if cfg.task in ("arithmetic", "scratchpad") else Path(cfg.task).stem


def headline_of(s: dict[str, Any]) -> str:
    """The run's final line: validation accuracy sampled (mean@k at the rollout temperature) and greedy,
    start -> final, then the updates, tokens and seconds."""
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    greedy = ""
    if s.get("final_greedy_accuracy") is not None:
        greedy = f"; greedy {fmt(s.get('start_greedy_accuracy'))} -> {fmt(s.get('final_greedy_accuracy'))}"
    return (
        f"{s['algo']}, seed {s['seed']}: val accuracy sampled {fmt(s.get('start_val_accuracy'))} -> "
        f"{fmt(s.get('final_val_accuracy'))} (best {fmt(s.get('best_val_accuracy'))}){greedy}; {s['steps']} "
        f"updates, {s['generated_tokens']} generated tokens in {s['wall_time_s']:.1f} s of training"
    )


def run_llm(cfg: LLMConfig, callback: Any = None) -> dict[str, Any]:
    """Entry point of ``sppo-rl llm``; ends with the headline numbers and where to look next.
    ``callback(row) -> False`` stops the run after that update (:func:`~sppo_rl.runtime.loop.run_loop`)."""
    run = LLMRun(cfg)
    s = run.run(callback)
    announce(run.out, headline_of(s), cfg.tensorboard, main=run.dist.main)
    return s
