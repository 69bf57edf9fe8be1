"""``sppo-rl llm``: the LLM world's trainer over the shared core.

A run resolves its settings once (:func:`~sppo_rl.llm.plan.resolve`: every refusal before the run folder
is touched), builds its models (:mod:`sppo_rl.llm.build`), then repeats one update, whose stages
(:mod:`sppo_rl.llm.stages`, one module each) read in order::

    collect -> score -> to_batch -> advantages -> train -> sync -> row

The trainer reads ``algo.requires`` and ``algo.critic_loss``; it never tests the algorithm's name.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

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
from sppo_rl.llm.stages.collect import Collected, Collector, PromptOrder, Sampler
from sppo_rl.llm.stages.evaluate import Evaluator, evaluate, write_critic_trace
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
from sppo_rl.llm.stages.to_batch import KeptRows, UpdateBatch, pick, to_batch
from sppo_rl.llm.stages.train import rewards_all_equal, train
from sppo_rl.llm.stages.vstar import VStarOrder, optimal_values, stage_one
from sppo_rl.runtime.checkpoint import CheckpointManager, check_written_by, read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import NullLogger, RunLogger, check_metrics_length, start_logging
from sppo_rl.runtime.loop import Schedule, announce, progress_bar, run_loop
from sppo_rl.runtime.run import Preempted, RunError, RunFailed, check_resume, prepare_run_dir, unlock_run_dir
from sppo_rl.runtime.schedule import lr_factor, set_lr
from sppo_rl.runtime.trace import TRACE_FILE

T = TypeVar("T")


@dataclass(frozen=True)
class RunState:
    """Everything a run has done so far besides its weights: what a checkpoint saves (``state.pt``, with
    torch's random state) and a resume loads, whole. An update returns the next state; ``order`` (the
    prompts' draw, SPO's tracker) is the one part that changes in place as the update draws.

    Attributes:
        order: the training prompts' order (:class:`~sppo_rl.llm.stages.collect.PromptOrder`, or
            :class:`~sppo_rl.llm.stages.spo.SpoOrder` with its tracker).
        updates: updates done.
        elapsed: seconds of training so far (updates only, evaluations not counted).
        generated_tokens: tokens sampled so far (greedy decodes included).
        flops: cumulative FLOPs by part (:mod:`sppo_rl.llm.models.flops`).
        critic_init_p0: the first batch's success rate that ``--critic-init first-batch`` set the critic's
            head from (None: not used).
        fail_streak: updates in a row without one valid reward (``--reward-fail-limit``).
    """

    order: PromptOrder
    updates: int = 0
    elapsed: float = 0.0
    generated_tokens: int = 0
    flops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    critic_init_p0: float | None = None
    fail_streak: int = 0

    def saved(self, torch_rng: Tensor) -> dict[str, Any]:
        """The ``state.pt`` of a checkpoint (the update count under its key ``step``)."""
        return {
            **self.order.state(),
            "torch_rng": torch_rng,
            "update": self.updates,
            "elapsed": self.elapsed,
            "generated_tokens": self.generated_tokens,
            "flops": dict(self.flops),
            "critic_init_p0": self.critic_init_p0,
            "fail_streak": self.fail_streak,
        }

    @classmethod
    def load(cls, saved: dict[str, Any], order: PromptOrder) -> RunState:
        """The state of a checkpoint's ``state.pt`` (``saved``), its order loaded into ``order``; a
        checkpoint of an older version lacks the FLOPs (counted from 0), ``critic_init_p0`` and the
        fail streak (0)."""
        order.load(saved)
        return cls(
            order,
            updates=saved["update"],
            elapsed=saved["elapsed"],
            generated_tokens=saved["generated_tokens"],
            flops={**dict.fromkeys(PARTS, 0), **saved.get("flops", {})},
            critic_init_p0=saved.get("critic_init_p0"),
            fail_streak=saved.get("fail_streak", 0),
        )


@dataclass(frozen=True)
class UpdateResult:
    """What one update produced: its metrics ``row``, the run's ``state`` after it, and ``failure``: why
    the run must stop there (None: it goes on)."""

    row: dict[str, Any]
    state: RunState
    failure: str | None


class LLMRun:
    """State and loop of one LLM run. ``run()`` trains for ``cfg.updates`` updates and returns the summary.

    Under a launcher (``torchrun`` / ``deepspeed``) with ``--engine deepspeed`` every rank runs this
    class on its share of the prompts (data parallel): rollouts, scoring and the forward passes are
    local, gradients are averaged by DeepSpeed, and each rank's loss is scaled so that the average is
    the loss of the whole batch. Rank 0 writes the logs and the exports.
    """

    waits_on = "reward scoring"  # what a preemption's grace period may give up (:class:`Preemption`)

    def __init__(self, cfg: LLMConfig, validated: bool = False) -> None:
        quiet_transformers()
        self.dist = launcher_dist()
        self.plan, task = plan, task = resolve(cfg, self.dist, validated)
        self.algo, self.group_size, self.device = plan.algo, plan.rollout.group_size, plan.device
        models, loop, rewards = plan.models, plan.loop, plan.rewards
        if models.engine == "deepspeed":
            self.dist = init_process_group(models.collective_timeout, always=True)
        self.scoring = Scoring(start_scorer(rewards.fn, rewards.timeout, rewards.weights or None))
        try:
            self.out = self._main_first(self._prepare)
        except BaseException:
            self.scoring.close()
            raise
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, loop.threads))
            if (
                models.engine == "torch"
            ):  # transformers imports DeepSpeed when saving; tell it the device it would
                os.environ.setdefault("DS_ACCELERATOR", "cpu")  # find, rather than warn that it found no GPU
        torch.manual_seed(loop.seed)
        actor_path, warmstart = actor_folder(plan, task.train, self._main_first)
        tokenizer = load_tokenizer(actor_path)
        self.train_set, self.val_set = prepare_prompts(
            plan, task.train, task.val, tokenizer, actor_path, self.dist.main
        )
        self.models = m = build_models(plan, actor_path, tokenizer, warmstart, self._main_first)
        if plan.rollout.worker == "process" and not loop.resume:  # (a resume pushes the checkpoint's)
            sync(
                m.rollout, m.actor_engine, bool(models.lora.rank)
            )  # the worker's replica: the actor's weights
        self.rows = row_fn(plan)
        req = self.algo.requires
        order = (SpoOrder if req.tracker else VStarOrder if req.optimal_values else PromptOrder)(
            len(self.train_set), loop.seed
        )
        self.state = RunState(order)
        self.flops_shape = run_shape(plan, m)
        self.resumed_pending: list[dict[str, Any]] = []
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=loop.keep_checkpoints)
        ckpt = self._resume() if loop.resume else None
        self.logger: RunLogger | NullLogger = NullLogger()
        if self.dist.main:
            self.logger = start_logging(
                self.out,
                plan.given,
                config_record(plan, m, len(self.train_set), len(self.val_set), self.dist.world),
                ckpt,
                world="llm",
            )
        every, text = (plan.rollout.log_completions_every, self.logger.text) if self.dist.main else (0, None)
        self.completions = CompletionLog(self.out, every, text)
        self.sampler = Sampler(m.rollout, plan.rollout.sampling, loop.seed)
        args = (self.sampler, self.scoring, plan, self.dist, self.device, m.tokenizer)
        self.collector = Collector(self.train_set, order, *args, self.completions)
        self.collector.load({"pending": self.resumed_pending})
        if req.optimal_values and ckpt is None:  # A*-PO's stage 1: V* of every prompt, before update 1
            shape = self.flops_shape.actor
            self.state = stage_one(
                self.state, plan, self.train_set, self.sampler, self.scoring, m.tokenizer, shape
            )
        self.evaluator = Evaluator(
            self.val_set, plan, self.sampler, self.scoring, m.critic_engine, self.rows, self.dist, self.device,
            m.tokenizer, self.completions,
        )  # fmt: skip

    def _prepare(self) -> Path:
        loop = self.plan.loop
        out = prepare_run_dir(loop.out_dir, resume=loop.resume, overwrite=loop.overwrite)
        if loop.resume:
            check_resume(out, self.plan.given)
        return out

    def _main_first(self, task: Callable[[], T]) -> T:
        """Run ``task`` on rank 0, then hand its result (or its error) to every rank."""
        result, error = None, None
        if self.dist.main:
            try:
                result = task()
            except (RunError, ValueError, OSError) as e:
                error = f"{type(e).__name__}: {e}"
        result, error = self.dist.broadcast((result, error))
        if error is not None:
            raise RunError(error.split(": ", 1)[1])
        return result

    # ------------------------------------------------------------------------------------- one update

    def update(self) -> dict[str, Any]:
        """One update (:meth:`train_update`) from the run's state; the state moves on to the one it
        returns; a failure stops the run (:class:`RunFailed`, carrying the update's row)."""
        done = self.train_update(self.state)
        self.state = done.state
        if done.failure is not None:
            raise RunFailed(done.failure, row=done.row)
        return done.row

    def train_update(self, state: RunState) -> UpdateResult:
        """The update after ``state``: its metrics row, the state after it and, when the run must stop, why."""
        plan, m, reduction = self.plan, self.models, self.dist.on(self.device)
        timer = StageTimer()
        before = (self.collector.snapshot(), torch.get_rng_state())  # if given up
        try:
            collected = self.collector.collect(state.updates, timer, state.updates)  # collect + score
        except Preempted:  # nothing was trained yet: back to the state before this update
            self.collector.restore(before[0])
            torch.set_rng_state(before[1])
            raise
        m.rollout.sleep()  # frees the sampler's memory while training (vLLM with --vllm-sleep)
        with timer("train"):
            pad = m.pad_id
            dynamic = bool(plan.rollout.dynamic_sampling_rounds)
            kept = pick(collected, self.group_size, pad, dynamic, plan.latent)
            p0 = state.critic_init_p0
            if state.updates == 0 and p0 is None and plan.models.critic_init:
                p0 = init_critic_bias(m.critic_engine.module, kept.R, kept.valid, reduction)
            critic = m.critic_engine.module if m.critic_engine is not None else None
            prepared = to_batch(kept, plan, m.actor_engine.module, m.ref, critic, self.rows, reduction)
            tracked, spo = plan.algo.requires.tracker, {}  # SPO: its tracker's p_hat is the baseline
            if tracked:
                tracker_values(state.order, prepared)
            if plan.algo.requires.optimal_values:  # A*-PO: each row's V* of its prompt
                spo = optimal_values(state.order, prepared)  # type: ignore[arg-type]  # a VStarOrder
            advantages(prepared.batch, plan, prepared.rb.finished, state.updates + 1)
            if tracked:  # the outcomes enter the tracker after the estimate, before the actor trains
                spo = observe(
                    state.order, prepared, kept.valid, plan, m.actor_engine.module, self.rows, reduction, pad
                )
            lr = self._schedule_lr(state.updates)
            equal = rewards_all_equal(prepared, kept.valid, reduction)
            skip = plan.update.skip_equal_rewards and equal
            trained = train(
                prepared, plan, m.actor_engine, m.critic_engine, self.rows, state.updates, skip, reduction
            )
        with timer("sync"):
            sync(m.rollout, m.actor_engine, bool(plan.models.lora.rank))
        state = dataclasses.replace(state, updates=state.updates + 1, critic_init_p0=p0)
        stats = {**trained.stats, "rewards_all_equal": int(equal), **spo}
        return self._row(state, collected, kept, prepared, trained.logp_old, stats, lr, timer)

    def _row(
        self,
        state: RunState,
        collected: Collected,
        kept: KeptRows,
        prepared: UpdateBatch,
        logp_old: Tensor | None,
        stats: dict[str, Any],
        lr: float,
        timer: StageTimer,
    ) -> UpdateResult:
        """The metrics row of update ``state.updates`` (:mod:`sppo_rl.llm.stages.row`), the state with the
        run's generated tokens, seconds and FLOPs counted, and the failure when rewards keep failing."""
        rollout, update = self.plan.rollout, self.plan.update
        dynamic = bool(rollout.dynamic_sampling_rounds)
        kl_tok = prepared.kl_per_token(logp_old, update.kl_estimator, update.kl_clamp)
        sums = update_sums(
            collected.rounds, kept.informative, prepared.batch.mask, kl_tok, dynamic, self.dist, self.device,
            self._update_flops(state, collected, kept, stats),
        )  # fmt: skip
        dt = timer.total()
        flops = {part: state.flops[part] + round(sums[f"flops/{part}"]) for part in PARTS}
        state = dataclasses.replace(
            state,
            generated_tokens=state.generated_tokens + int(sums["generated"]),
            flops=flops,
            elapsed=state.elapsed + dt,
            fail_streak=state.fail_streak + 1 if sums["valid"] == 0 else 0,
        )
        extra = {
            "rollout_logp_diff": stats.get("rollout_mismatch_mean", float("nan")),
            "peak_memory_mb": peak_memory_mb(self.device),
            "learning_rate": lr,
            **(
                dynamic_sampling_row(sums, len(collected.rounds), rollout.prompts_per_step) if dynamic else {}
            ),
            **reward_fn_row(self.scoring.names, collected.fn, self.dist, self.device),
        }
        if rollout.max_staleness:  # the updates between the policy that sampled the batch and the trained one
            extra["staleness"] = float(state.updates - 1 - collected.rounds[0].version)
        totals = {"generated_tokens": state.generated_tokens, "wall_time_s": state.elapsed, "step_time_s": dt}
        totals.update(flops_row(state.flops))
        row = update_row(state.updates, sums, timer, totals, extra)
        failure = self._reward_failure(state, sums)
        if failure is not None:  # the row as it stands: the run stops here
            return UpdateResult(row, state, failure)
        if kept.baseline is not None:
            row["greedy_reward_mean"] = sums["greedy_reward"] / max(sums["greedy_valid"], 1.0)
        if kl_tok is not None:
            row["kl"] = sums["kl"] / max(sums["kl_tokens"], 1.0)
        row.update(stats)
        if state.critic_init_p0 is not None and state.updates == 1:
            row["critic_init_p0"] = state.critic_init_p0
        if kept.latent_invalid is not None:
            row["latent_invalid"] = self.dist.all_sum([float(kept.latent_invalid)], self.device)[0]
        if rollout.overlong.filter:
            row["overlong_filtered"] = self.dist.all_sum([float((~prepared.rb.finished).sum())], self.device)[
                0
            ]
        return UpdateResult(row, state, None)

    def _update_flops(
        self, state: RunState, collected: Collected, kept: KeptRows, stats: dict[str, Any]
    ) -> dict[str, int]:
        """This rank's FLOPs of the update just done, by part (:func:`~sppo_rl.llm.models.flops.update_flops`):
        every generation round, the rows trained on, the actor's passes only when it trained."""
        G = self.group_size
        rounds = [round_lengths(r.rb, G, r.greedy) for r in collected.rounds]
        out = update_flops(self.flops_shape, rounds, row_lengths(kept.rb), not stats["actor_skipped"])
        if self.algo.requires.tracker:  # SPO re-scores its revisited prompts' last responses (no gradient)
            out["actor"] += policy_pass(self.flops_shape.actor, state.order.rescored)
        return out

    def _reward_failure(self, state: RunState, sums: dict[str, float]) -> str | None:
        """Why the run stops after ``--reward-fail-limit`` updates in a row without one valid reward
        (``state.fail_streak`` of them); None while it goes on."""
        limit = self.plan.rewards.fail_limit
        if not (limit and state.fail_streak >= limit):
            return None
        return (
            f"no response got a valid reward in {state.fail_streak} consecutive updates (--reward-fail-limit "
            f"{limit}): {int(sums['errors'])} verifier errors in update {state.updates}, e.g. "
            f"{self.scoring.last_error or 'unknown'}; the run stopped (summary.json)"
        )

    def _schedule_lr(self, update: int) -> float:
        """Set both engines' learning rates for update ``update`` (0-based; ``--lr-schedule`` over ``--updates``:
        :mod:`sppo_rl.runtime.schedule`); returns the actor's."""
        settings, models, m = self.plan.update, self.plan.models, self.models
        f = lr_factor(settings.lr_schedule, update, self.plan.loop.updates, settings.warmup_updates)
        set_lr(m.actor_engine.optimizer, models.actor_lr * f)
        if m.critic_engine is not None:
            set_lr(m.critic_engine.optimizer, models.critic_lr * f)
        return models.actor_lr * f

    # ------------------------------------------------------------------------------------- state

    def save_checkpoint(self) -> Path:
        m, state, keep_optimizer = self.models, self.state, self.plan.models.optimizer_state
        pending = self.collector.saved()  # the rounds requested ahead (--max-staleness), waited for

        def write(folder: Path) -> None:
            m.actor_engine.save(folder / "actor", optimizer=keep_optimizer)
            if m.critic_engine is not None:
                m.critic_engine.save(folder / "critic", optimizer=keep_optimizer)
            if self.dist.main:
                torch_save({**state.saved(torch.get_rng_state()), **pending}, folder / "state.pt")

        meta = {"metrics_bytes": self.logger.position(), "algo": self.algo.name, "ranks": self.dist.world}
        return self.ckpts.save(state.updates, write, {**meta, "optimizer_state": keep_optimizer})

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
        settings, m, meta = self.plan.models, self.models, read_meta(ckpt)
        check_written_by(ckpt, meta, self.algo.name)
        if meta.get("optimizer_state", True) is False and not settings.resume_without_optimizer:
            raise RunError(
                f"--resume: {ckpt} was saved with --no-optimizer-state, so the resumed run would restart "
                "Adam's moments and differ from an uninterrupted one; pass --resume-without-optimizer to accept that"
            )
        if meta.get("ranks", 1) != self.dist.world and settings.engine == "deepspeed":
            raise RunError(f"{ckpt} was written by {meta.get('ranks')} ranks; resume with as many")
        m.actor_engine.load(ckpt / "actor")
        if m.critic_engine is not None:
            m.critic_engine.load(ckpt / "critic")
        saved = torch_load(ckpt / "state.pt")
        self.state = RunState.load(saved, self.state.order)
        self.resumed_pending = saved.get("pending", [])  # handed to the collector when it is built
        torch.set_rng_state(saved["torch_rng"])
        if "flops" not in saved:
            warnings.warn(
                f"{ckpt} was saved before FLOPs were counted: flops_* count from update {self.state.updates}",
                stacklevel=2,
            )
        sync(m.rollout, m.actor_engine, bool(settings.lora.rank))

    # ------------------------------------------------------------------------------------- loop

    @property
    def updates(self) -> int:
        return self.state.updates

    @property
    def elapsed(self) -> float:
        return self.state.elapsed

    def evaluate(self) -> dict[str, Any]:
        return evaluate(self.evaluator, self.state.updates)

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Exports (``final/``, the critic trace; all ranks) and, on rank 0, the summary from every row
        of ``metrics.jsonl``."""
        export(self.out / "final", self.models, self.plan, self.dist, self.ckpts.latest())
        write_critic_trace(self.evaluator, self.out / TRACE_FILE)
        return summary_of(self.plan, self.state, rows, self.models.warmstart, self.dist, self.out)

    def run(self, callback: Any = None) -> dict[str, Any]:
        """Train for ``cfg.updates`` updates; ``callback(row)`` after each (rank 0), ``False`` stops (:func:`run_loop`)."""
        loop = self.plan.loop

        def postfix(row: dict[str, Any]) -> dict[str, str]:
            post = {"reward": f"{row['reward_mean']:.2f}", "tok/s": f"{row['gen_tokens_per_s']:.0f}"}
            if "val_accuracy" in row:
                post["val"] = f"{row['val_accuracy']:.2f}"
            return post

        first = {"update": 0, "wall_time_s": 0.0, "generated_tokens": 0, **flops_row(dict.fromkeys(PARTS, 0))}
        schedule = Schedule(
            loop.updates, loop.eval_every, loop.checkpoint_every, loop.max_seconds, eval_first=first, eval_last=True,
            log_step=lambda r: r["update"],
        )  # fmt: skip
        try:
            summary = run_loop(
                self,
                schedule,
                resume_hint=f"sppo-rl llm --out-dir {self.out} --resume ...",
                bar=progress_bar(
                    loop.progress and self.dist.main,
                    loop.updates,
                    self.state.updates,
                    f"{self.algo.name}/{task_label(self.plan.data.task)}",
                ),
                postfix=postfix,
                agree=lambda flag: bool(self.dist.all_max([float(flag)], self.device)[0]),
                main=self.dist.main,
                callback=callback,
            )
        except RunFailed as e:
            if self.dist.main:
                if e.row:
                    self.logger.log(e.row, step=e.row["update"])
                stopped_summary(self.out, self.plan, self.state, e.row, str(e), self.scoring.last_error)
            self.close()
            raise
        return self.dist.broadcast(summary if self.dist.main else None)

    def close(self) -> None:
        self.logger.close()
        self.scoring.close()
        self.models.rollout.close()
        unlock_run_dir(self.out)


def task_label(task: str) -> str:
    """The run's task (``--task``) in a few characters (the progress label): a generated task's name, else
    its data file's stem."""
    return task if task in ("arithmetic", "scratchpad") else Path(task).stem


def headline_of(s: dict[str, Any]) -> str:
    """The run's final line: validation accuracy sampled (mean@k at the rollout temperature) and greedy,
    start -> final, then the updates, tokens and seconds."""
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    greedy = ""
    if s.get("final_greedy_accuracy") is not None:
        greedy = f"; greedy {fmt(s.get('start_greedy_accuracy'))} -> {fmt(s.get('final_greedy_accuracy'))}"
    return (
        f"{s['algo']}, seed {s['seed']}: val accuracy sampled {fmt(s.get('start_val_accuracy'))} -> "
        f"{fmt(s.get('final_val_accuracy'))} (best {fmt(s.get('best_val_accuracy'))}){greedy}; {s['updates']} "
        f"updates, {s['generated_tokens']} generated tokens in {s['wall_time_s']:.1f} s of training"
    )


def run_llm(
    cfg: LLMConfig, callback: Any = None, command: bool = False, validated: bool = False
) -> dict[str, Any]:
    """Entry point of ``sppo-rl llm``; ends with the headline numbers and where to look next.
    ``callback(row) -> False`` stops the run after that update (:func:`~sppo_rl.runtime.loop.run_loop`);
    ``command``: called by the ``sppo-rl`` command (the wall time printed is the process's:
    :func:`~sppo_rl.runtime.loop.announce`); ``validated``: the caller validated ``cfg`` already
    (:func:`~sppo_rl.llm.plan.resolve`)."""
    run = LLMRun(cfg, validated)
    started = time.monotonic()
    s = run.run(callback)
    seconds = time.monotonic() - started
    announce(run.out, headline_of(s), run.plan.loop.tensorboard, run.dist.main, command, seconds)
    return s
