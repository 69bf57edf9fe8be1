"""``sppo-rl control``: the control world's trainer over the shared core.

One update, in the order it runs:

1. draw ``episodes_per_update / group_size`` start-state seeds; each is used ``group_size`` times
   (a group shares ``s_0``); ReMax adds one greedy episode per seed;
2. :func:`~sppo_rl.control.rollout.collect` runs all episodes to their end in one vector env;
3. the episodes become a :class:`~sppo_rl.agents.batch.SequenceBatch` (outcome ``R`` = success);
   the critic the estimator asks for fills ``values`` (``V(s_t)`` per step, or one logit ``V(s_0)``);
4. :func:`~sppo_rl.agents.algorithms.compute_advantages`, then PPO epochs over minibatches of whole
   episodes with the clipped loss and the algorithm's critic loss.

The trainer never tests the algorithm's name: it reads ``algo.requires`` and ``algo.critic_loss``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.algorithms import compute_advantages, value_units
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.learner import TorchEngine, forward_rows, ppo_update
from sppo_rl.config import flat_dict
from sppo_rl.control.actor_files import (
    load_actor_file,
    save_actor_file,
)
from sppo_rl.control.config import ControlConfig
from sppo_rl.control.networks import CRITICS, Actor
from sppo_rl.control.plan import resolve
from sppo_rl.control.rollout import Episodes, collect
from sppo_rl.control.spo import StartStates
from sppo_rl.experiments.protocol import final_value
from sppo_rl.runtime.checkpoint import CheckpointManager, check_written_by, read_meta, torch_load, torch_save
from sppo_rl.runtime.files import atomic_write_text
from sppo_rl.runtime.logging import start_logging
from sppo_rl.runtime.loop import Schedule, announce, progress_bar, run_loop
from sppo_rl.runtime.run import check_finite, check_resume, prepare_run_dir, set_threads, unlock_run_dir
from sppo_rl.runtime.schedule import lr_factor, set_lr
from sppo_rl.runtime.trace import TRACE_FILE, write_trace

EVAL_SEED_BASE = 2_000_000_000  # evaluation start states: seeds EVAL_SEED_BASE + i, never drawn for training


class ControlRun:
    """State and loop of one control run. ``run()`` trains to the budget and returns the summary."""

    @property
    def signal(self) -> str:
        """The update row's key of what the run trains on, for the not-learning warnings
        (:func:`~sppo_rl.runtime.watch.not_learning`): the shaped ``return`` with ``--dense``, else the
        binary outcome's ``success_rate``."""
        return "return" if self.cfg.dense else "success_rate"

    def __init__(self, cfg: ControlConfig) -> None:
        from sppo_rl.envs.tasks import make_episode_env

        self.plan = plan = resolve(cfg)
        self.cfg, self.algo, self.spec = cfg, plan.algo, plan.spec
        req = self.algo.requires
        E, n_greedy, init_path = (
            plan.resolved.episodes_per_update,
            plan.resolved.greedy_per_update,
            plan.init_path,
        )
        self.out = prepare_run_dir(cfg.out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
        if cfg.resume:
            check_resume(self.out, cfg)
        set_threads(cfg.threads)
        torch.manual_seed(cfg.seed)

        # networks (a warm start fixes the actor's architecture and freezes its observation statistics)
        if init_path is not None:
            self.actor = load_actor_file(init_path)
            self.actor.norm.frozen.fill_(True)
        else:
            self.actor = Actor(
                self.spec.obs_dim,
                self.spec.action_dim,
                self.spec.discrete,
                cfg.hidden_sizes,
                cfg.activation,
                cfg.log_std_init,
            )
            if not cfg.normalize_obs:
                self.actor.norm.frozen.fill_(True)
        self.critic = None
        if req.critic != "none":
            self.critic = CRITICS[req.critic](
                self.spec.obs_dim, cfg.hidden_sizes, cfg.activation, norm=self.actor.norm
            )
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr, eps=1e-5)
        self.critic_opt = (
            torch.optim.Adam(
                [p for n, p in self.critic.named_parameters() if not n.startswith("norm.")],
                lr=cfg.critic_lr,
                eps=1e-5,
            )
            if self.critic is not None
            else None
        )
        self.env = make_episode_env(self.spec, num_envs=E + n_greedy, dense=cfg.dense)
        self._eval_env = None

        # randomness: start states, action sampling, minibatch order
        self.seed_rng = np.random.default_rng(cfg.seed)
        self.sample_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.perm_gen = torch.Generator().manual_seed(cfg.seed + 2)
        # SPO's value tracker over a fixed pool of start states (sppo_rl.control.spo)
        self.spo = StartStates(cfg.spo_contexts, cfg.seed) if req.tracker else None
        self._contexts: list[int] = []
        self.update_idx = 0
        self.episodes = 0
        self.env_steps = 0
        self.elapsed = 0.0
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=cfg.keep_checkpoints)

        def load(ckpt: Path) -> None:
            check_written_by(ckpt, read_meta(ckpt), self.algo.name)
            self.load_state(torch_load(ckpt / "state.pt"))

        # the newest intact checkpoint (damaged ones are skipped with a warning; none intact: refused)
        ckpt = self.ckpts.resume(load) if cfg.resume else None
        resolved = {
            **asdict(plan.resolved),
            "learner": asdict(plan.learner),
        }  # the update's settings in force
        self.logger = start_logging(self.out, cfg, resolved, ckpt, world="control")

    @property
    def actor_engine(self) -> TorchEngine:
        return TorchEngine(self.actor, self.actor_opt, self.cfg.max_grad_norm)

    @property
    def critic_engine(self) -> TorchEngine | None:
        return TorchEngine(self.critic, self.critic_opt, self.cfg.max_grad_norm) if self.critic else None

    # ------------------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor_arch": self.actor.arch(),
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict() if self.critic_opt is not None else None,
            "seed_rng": self.seed_rng.bit_generator.state,
            "sample_gen": self.sample_gen.get_state(),
            "perm_gen": self.perm_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "update": self.update_idx,
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "elapsed": self.elapsed,
            **({"spo": self.spo.state_dict()} if self.spo is not None else {}),
        }

    def load_state(self, s: dict[str, Any]) -> None:
        if s["actor_arch"] != self.actor.arch():
            self.actor = Actor(**s["actor_arch"])
            self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=self.cfg.actor_lr, eps=1e-5)
            if self.critic is not None:
                self.critic.norm = self.actor.norm
        self.actor.load_state_dict(s["actor"])
        self.actor_opt.load_state_dict(s["actor_opt"])
        if self.critic is not None:
            self.critic.load_state_dict(s["critic"])
            self.critic_opt.load_state_dict(s["critic_opt"])
        self.seed_rng.bit_generator.state = s["seed_rng"]
        self.sample_gen.set_state(s["sample_gen"])
        self.perm_gen.set_state(s["perm_gen"])
        torch.set_rng_state(s["torch_rng"])
        self.update_idx, self.episodes = s["update"], s["episodes"]
        self.env_steps, self.elapsed = s["env_steps"], s["elapsed"]
        if self.spo is not None:
            self.spo.load_state_dict(s["spo"])

    def save_checkpoint(self) -> Path:
        state = self.state_dict()
        meta = {"metrics_bytes": self.logger.position(), "episodes": self.episodes, "algo": self.algo.name}
        meta["log_step"] = self.env_steps  # the x-axis of the logs (global_step = env steps)
        return self.ckpts.save(self.update_idx, lambda d: torch_save(state, d / "state.pt"), meta)

    # ------------------------------------------------------------------------------------- one update

    def _seeds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row reset seeds, group ids and greedy flags for one update."""
        r = self.plan.resolved
        if self.spo is not None:  # SPO: start states of the pool, prioritised by its tracker
            picked = self.spo.draw(r.contexts_per_update, self.seed_rng)
            self._contexts = [int(c) for c in picked]
            ctx = self.spo.seeds[picked]
        else:
            ctx = self.seed_rng.integers(0, 2**31 - 1, size=r.contexts_per_update)
        seeds = np.repeat(ctx, r.group_size)
        groups = np.repeat(np.arange(r.contexts_per_update), r.group_size)
        greedy = np.zeros(len(seeds), dtype=bool)
        if r.greedy_per_update:
            seeds = np.concatenate([seeds, ctx])
            groups = np.concatenate([groups, np.arange(r.contexts_per_update)])
            greedy = np.concatenate([greedy, np.ones(r.contexts_per_update, dtype=bool)])
        return seeds, groups, greedy

    def _batch(self, ep: Episodes, groups: np.ndarray, greedy_success: Tensor | None) -> SequenceBatch:
        mask = ep.mask
        batch = SequenceBatch(
            mask=mask,
            logp_old=ep.logp,
            rewards=ep.success,
            token_rewards=ep.rewards * mask,
            group_ids=torch.from_numpy(groups),
            baseline_rewards=greedy_success[torch.from_numpy(groups)] if greedy_success is not None else None,
        )
        if self.critic is not None:
            batch.values = forward_rows(self._critic_fn(ep), batch.lengths, batch.lengths, self.plan.learner)
        return batch

    def _actor_fn(self, ep: Episodes):
        """``(rows, T) -> (logp, entropy)`` of the taken actions, computed on valid steps only."""

        def fn(rows: Tensor, T: int) -> tuple[Tensor, Tensor]:
            valid = ep.mask[rows, :T] > 0
            logp_v, ent_v = self.actor.logp_entropy(ep.obs[rows, :T][valid], ep.actions[rows, :T][valid])
            zeros = torch.zeros(valid.shape, dtype=logp_v.dtype)
            return zeros.masked_scatter(valid, logp_v), zeros.masked_scatter(valid, ent_v)

        return fn

    def _critic_fn(self, ep: Episodes):
        """``(rows, T) -> values``: the critic on the episodes' observations (its own kind decides which)."""
        return lambda rows, T: self.critic.values(ep.obs[rows, :T])

    def update(self) -> dict[str, Any]:
        algo, r = self.algo, self.plan.resolved
        t0 = time.perf_counter()
        seeds, groups, greedy = self._seeds()
        self.actor.eval()
        ep_all = collect(self.env, self.actor, seeds, r.horizon, greedy, self.sample_gen)
        t_collect = time.perf_counter() - t0
        n = r.episodes_per_update
        ep = ep_all.rows(torch.arange(n))
        greedy_success = ep_all.success[n:] if r.greedy_per_update else None
        batch = self._batch(ep, groups[:n], greedy_success)
        spo_row: dict[str, float] = {}
        if self.spo is not None:
            batch.tracker_values = self.spo.tracker.p_hat(self._contexts).to(batch.mask.dtype)
        compute_advantages(batch, algo, **self.plan.estimator)
        check_finite(self.update_idx + 1, advantages=batch.advantages)
        if self.spo is not None:  # the outcomes enter the tracker after the estimate, before the update
            distances = self.spo.distances(self.actor, self._contexts)
            rhos = self.spo.observe(self._contexts, ep, distances)
            spo_row = {
                "spo_p_hat": float(batch.tracker_values.mean()),
                "spo_distance": float(np.mean(distances)),
                "spo_rho": float(np.mean(rhos)),
            }
        lr = self._schedule_lr()
        stats = self._optimise(ep, batch)
        # observation statistics move only after the update, so that within it the log-probs are
        # recomputed on exactly the inputs they were sampled on (the first ratio is exactly 1)
        self.actor.norm.update(ep.obs[ep.mask > 0])
        self.update_idx += 1
        self.episodes += n
        self.env_steps += ep_all.env_steps
        dt = time.perf_counter() - t0
        self.elapsed += dt
        row: dict[str, Any] = {
            "update": self.update_idx,
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "success_rate": float(ep.success.mean()),
            "episode_length": float(ep.lengths.float().mean()),
            "return": float((ep.rewards * ep.mask).sum(-1).mean()),
            "wall_time_s": self.elapsed,
            "sps": self.env_steps / max(self.elapsed, 1e-9),
            "update_sps": ep_all.env_steps / dt,
            "collect_frac": t_collect / dt,
            "learning_rate": lr,
        }
        if greedy_success is not None:
            row["greedy_success_rate"] = float(greedy_success.mean())
        row.update(spo_row)
        row.update(stats)
        return row

    def _schedule_lr(self) -> float:
        """Set both optimizers' learning rates for the update about to run (``--lr-schedule``, from the
        update index: :mod:`sppo_rl.runtime.schedule`); returns the actor's."""
        cfg = self.cfg
        K = math.ceil(cfg.total_episodes / self.plan.resolved.episodes_per_update)
        f = lr_factor(cfg.lr_schedule, self.update_idx, K, cfg.warmup_updates)
        set_lr(self.actor_opt, cfg.actor_lr * f)
        if self.critic_opt is not None:
            set_lr(self.critic_opt, cfg.critic_lr * f)
        return cfg.actor_lr * f

    def _optimise(self, ep: Episodes, batch: SequenceBatch) -> dict[str, Any]:
        self.actor.train()
        stats = ppo_update(
            batch,
            self.algo,
            self.plan.learner,
            self._actor_fn(ep),
            self.actor_engine,
            self._critic_fn(ep) if self.critic is not None else None,
            self.critic_engine,
            train_actor=self.update_idx >= self.cfg.critic_warmup,
            generator=self.perm_gen,
            guard=lambda **q: check_finite(self.update_idx + 1, **q),
        ).stats
        self.actor.eval()
        stats["actor_skipped"] = int(stats["actor_skipped"])
        return stats

    # ------------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def success_rate(self, episodes: int, greedy: bool = True) -> float:
        """Success rate on fixed start states (seeds ``EVAL_SEED_BASE + i``), greedy by default."""
        from sppo_rl.envs.tasks import make_episode_env

        if self._eval_env is None or self._eval_env.num_envs != episodes:
            self._eval_env = make_episode_env(self.spec, num_envs=episodes, dense=self.cfg.dense)
        seeds = EVAL_SEED_BASE + np.arange(episodes)
        gen = torch.Generator().manual_seed(12345)
        flags = np.full(episodes, greedy)
        ep = collect(self._eval_env, self.actor, seeds, self.plan.resolved.horizon, flags, gen)
        return float(ep.success.mean())

    @torch.no_grad()
    def calibration(self, contexts: int = 64, samples: int = 16) -> dict[str, list[float]] | None:
        """A per-episode critic's ``sigmoid V(s_0)`` against the empirical success of ``samples``
        episodes from each of ``contexts`` fixed start states (None without one)."""
        from sppo_rl.envs.tasks import make_episode_env

        if self.critic is None:
            return None
        env = make_episode_env(self.spec, num_envs=contexts * samples, dense=self.cfg.dense)
        seeds = np.repeat(EVAL_SEED_BASE + 10_000 + np.arange(contexts), samples)
        ep = collect(
            env, self.actor, seeds, self.plan.resolved.horizon, None, torch.Generator().manual_seed(54321)
        )
        env.close()
        pred = value_units(self.algo, self.critic.values(ep.obs[::samples]))
        if pred.dim() != 1:
            return None
        emp = ep.success.view(contexts, samples).mean(1)
        return {"predicted": pred.tolist(), "empirical": emp.tolist(), "samples": [samples] * contexts}

    @torch.no_grad()
    def critic_trace(self, path: Path, episodes: int = 64) -> None:
        """Write what the critic says along ``episodes`` sampled episodes from fixed start states
        (:mod:`sppo_rl.runtime.trace`; nothing without a critic)."""
        from sppo_rl.envs.tasks import make_episode_env

        if self.critic is None:
            return
        env = make_episode_env(self.spec, num_envs=episodes, dense=self.cfg.dense)
        seeds = EVAL_SEED_BASE + 20_000 + np.arange(episodes)
        ep = collect(
            env, self.actor, seeds, self.plan.resolved.horizon, None, torch.Generator().manual_seed(4242)
        )
        env.close()
        v = value_units(self.algo, self.critic.values(ep.obs))
        write_trace(path, v.numpy(), ep.lengths.numpy(), ep.success.numpy(), self.plan.resolved.horizon)

    # ------------------------------------------------------------------------------------- loop

    @property
    def updates(self) -> int:
        return self.update_idx

    def evaluate(self) -> dict[str, Any]:
        """The periodic evaluation: greedy success on ``eval_episodes`` fixed start states."""
        return {"eval_success_rate": self.success_rate(self.cfg.eval_episodes)}

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Exports (final actor, calibration, critic trace) and the summary, computed from every row of
        ``metrics.jsonl`` (so a resumed run summarises the whole run). ``final_success_rate`` is the
        comparison protocol's final (:func:`sppo_rl.experiments.protocol.final_value`: the mean
        ``success_rate`` of the last ``max(1, ceil(0.1 n))`` of the ``n`` updates), the number ``sppo-rl
        sweep`` and ``sppo-rl report`` print for the same run."""
        cfg = self.cfg
        final = final_value([r.get("success_rate") for r in rows])
        summary = {
            "algo": self.algo.name,
            "task": self.spec.name,
            "seed": cfg.seed,
            "updates": self.update_idx,
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "wall_time_s": self.elapsed,
            "sps": self.env_steps / max(self.elapsed, 1e-9),
            "final_success_rate": None if math.isnan(final) else final,
        }
        if cfg.eval_episodes:
            summary["final_eval_success_rate"] = self.success_rate(cfg.eval_episodes)
        cal = self.calibration(cfg.calibration_contexts, cfg.calibration_samples)
        if cal is not None:
            atomic_write_text(self.out / "calibration.json", json.dumps(cal) + "\n")
        self.critic_trace(self.out / TRACE_FILE)
        meta = {"summary": summary, "config": flat_dict(cfg)}
        meta["observation"] = {"horizon": self.plan.resolved.horizon, "appended": self.spec.appended}
        save_actor_file(self.out / "final.pt", self.actor, meta)
        return summary

    def close(self) -> None:
        self.logger.close()
        self.env.close()
        unlock_run_dir(self.out)

    def run(self, callback: Any = None) -> dict[str, Any]:
        """Train to the budget; ``callback(row)`` after each update, ``False`` stops (:func:`run_loop`)."""
        cfg, E = self.cfg, self.plan.resolved.episodes_per_update
        total = math.ceil(cfg.total_episodes / E)
        bar = progress_bar(cfg.progress, total, self.update_idx, f"{self.algo.name}/{self.spec.name}")
        return run_loop(
            self,
            Schedule(
                total,
                cfg.eval_every,
                cfg.checkpoint_every,
                cfg.max_seconds,
                log_step=lambda r: r["env_steps"],  # CleanRL's global_step
            ),
            resume_hint=f"sppo-rl control --out-dir {self.out} --resume",
            bar=bar,
            postfix=lambda r: {"success": f"{r['success_rate']:.2f}", "sps": f"{r['sps']:.0f}"},
            callback=callback,
        )


def run_control(cfg: ControlConfig, callback: Any = None, command: bool = False) -> dict[str, Any]:
    """Entry point of ``sppo-rl control``; ends with the headline numbers and where to look next.
    ``callback(row) -> False`` stops the run after that update (:func:`~sppo_rl.runtime.loop.run_loop`)."""
    run = ControlRun(cfg)
    s = run.run(callback)
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    headline = (
        f"{s['algo']} on {s['task']}, seed {s['seed']}: success {fmt(s['final_success_rate'])} (final: last 10% of updates)"
        + (f", greedy {fmt(s['final_eval_success_rate'])}" if "final_eval_success_rate" in s else "")
        + f"; {s['updates']} updates, {s['episodes']} episodes in {s['wall_time_s']:.1f} s of training"
    )
    announce(run.out, headline, cfg.tensorboard, command=command)
    return s
