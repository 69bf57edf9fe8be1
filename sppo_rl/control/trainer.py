"""``sppo-rl control``: the control world's trainer over the shared core.

Read top to bottom, as CleanRL's ``ppo.py`` or SB3's ``learn -> collect_rollouts -> train``:
:meth:`ControlRun.run` hands the run to the shared loop (:func:`~sppo_rl.runtime.loop.run_loop`), which
calls :meth:`ControlRun.update` until the budget is spent; one update, in the order it runs:

1. :meth:`~ControlRun.collect_rollouts`: draw ``episodes_per_update / group_size`` start-state seeds
   (:func:`~sppo_rl.control.rollout.start_states`); each is used ``group_size`` times (a group shares
   ``s_0``); ReMax adds one greedy episode per seed; :func:`~sppo_rl.control.rollout.collect` runs all
   episodes to their end in one vector env;
2. :meth:`~ControlRun.train`: the episodes become a :class:`~sppo_rl.agents.batch.SequenceBatch` (outcome
   ``R`` = success); the critic the estimator asks for fills ``values`` (``V(s_t)`` per step, or one
   logit ``V(s_0)``); :func:`~sppo_rl.agents.algorithms.compute_advantages`, then PPO epochs over
   minibatches of whole episodes with the clipped loss and the algorithm's critic loss;
3. the run's counters (:class:`RunState`) move on by what the update collected, and
   :func:`update_row` makes its metrics row from them, the rollout and the training's metrics.

The run reads its :class:`~sppo_rl.control.plan.Plan`, never the config. Its end (the summary, the exports)
is :mod:`sppo_rl.control.summary`; what it measures besides training, :mod:`sppo_rl.control.evaluate`.
The trainer never tests the algorithm's name: it reads ``algo.requires`` and ``algo.critic_loss``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.algorithms import compute_advantages
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.learner import TorchEngine, forward_rows, ppo_update
from sppo_rl.control.actor_files import load_actor_file
from sppo_rl.control.astar import ReferenceValues
from sppo_rl.control.compiled import announce as announce_compile
from sppo_rl.control.compiled import compiled
from sppo_rl.control.config import ControlConfig
from sppo_rl.control.evaluate import success_rate
from sppo_rl.control.networks import CRITICS, Actor, StepCritic, use_rational_tanh
from sppo_rl.control.plan import resolve, schedule
from sppo_rl.control.rollout import Episodes, Rollout, collect_seeds, start_states
from sppo_rl.control.spo import StartStates
from sppo_rl.control.stack import StackedActor
from sppo_rl.control.summary import headline, summary_of, write_exports
from sppo_rl.runtime.checkpoint import CheckpointManager, check_written_by, read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import start_logging
from sppo_rl.runtime.loop import announce, progress_bar, run_loop
from sppo_rl.runtime.run import check_finite, check_resume, prepare_run_dir, set_threads, unlock_run_dir
from sppo_rl.runtime.schedule import lr_factor, set_lr


@dataclass(frozen=True)
class RunState:
    """The run's counters after ``update`` updates: the episodes sampled (ReMax's greedy ones not
    counted), the env steps taken (greedy ones counted) and the seconds spent updating. A checkpoint's
    ``state.pt`` holds them under these names (:meth:`to_checkpoint`, :meth:`from_checkpoint`)."""

    update: int = 0
    episodes: int = 0
    env_steps: int = 0
    elapsed: float = 0.0

    def after(self, episodes: int, env_steps: int, seconds: float) -> RunState:
        """The counters after one more update that sampled ``episodes`` episodes and ``env_steps`` steps
        in ``seconds``."""
        return RunState(
            self.update + 1, self.episodes + episodes, self.env_steps + env_steps, self.elapsed + seconds
        )

    def to_checkpoint(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> RunState:
        return cls(**{f.name: state[f.name] for f in fields(cls)})


class ControlRun:
    """One control run: its networks, optimisers, env and randomness, built from the plan; its counters
    (:class:`RunState`). ``run()`` trains to the budget and returns the summary; each :meth:`update`
    collects (:meth:`collect_rollouts`), then trains (:meth:`train`)."""

    def __init__(self, cfg: ControlConfig, env: Any = None) -> None:
        """``env``: the vector env to collect in (None: its own, of ``episodes_per_update`` plus the greedy
        episodes' sub-envs); a multi-seed run (:mod:`sppo_rl.control.seeds`) collects for its seeds itself
        and gives each one env of that size for A*-PO's stage 1."""
        from sppo_rl.envs.tasks import make_episode_env

        self.plan = plan = resolve(cfg)
        self.algo, self.spec = plan.algo, plan.spec
        net, loop = plan.networks, plan.loop
        self.out = prepare_run_dir(loop.out_dir, resume=loop.resume, overwrite=loop.overwrite)
        if loop.resume:
            check_resume(self.out, plan.given)
        set_threads(loop.threads)
        torch.manual_seed(loop.seed)

        # networks (a warm start fixes the actor's architecture and freezes its observation statistics)
        if net.init_path is not None:
            self.actor = load_actor_file(net.init_path)
            self.actor.norm.frozen.fill_(True)
        else:
            self.actor = Actor(
                self.spec.obs_dim,
                self.spec.action_dim,
                self.spec.discrete,
                net.hidden_sizes,
                net.activation,
                net.log_std_init,
            )
            if not net.normalize_obs:
                self.actor.norm.frozen.fill_(True)
        req = self.algo.requires
        self.critic = None
        if req.critic != "none":
            self.critic = CRITICS[req.critic](
                self.spec.obs_dim, net.hidden_sizes, net.activation, norm=self.actor.norm
            )
        self.compiled = net.compiled
        if self.compiled:  # sppo_rl.control.compiled
            announce_compile()
            use_rational_tanh(self.actor)
            if self.critic is not None:
                use_rational_tanh(self.critic)
        self.actor_opt = self._adam(self.actor.parameters(), plan.optim.actor_lr)
        self.critic_opt = (
            self._adam(
                [p for n, p in self.critic.named_parameters() if not n.startswith("norm.")],
                plan.optim.critic_lr,
            )
            if self.critic is not None
            else None
        )
        r = plan.resolved
        self.env = env or make_episode_env(
            self.spec, num_envs=r.episodes_per_update + r.greedy_per_update, dense=plan.dense
        )
        self._own_env = env is None
        self._eval_env = None

        # randomness: start states, action sampling, minibatch order
        self.seed_rng = np.random.default_rng(loop.seed)
        self.sample_gen = torch.Generator().manual_seed(loop.seed + 1)
        self.perm_gen = torch.Generator().manual_seed(loop.seed + 2)
        # SPO's value tracker over a fixed pool of start states (sppo_rl.control.spo)
        self.spo = StartStates(plan.spo_contexts, loop.seed) if req.tracker else None
        # A*-PO's reference (the initial actor, frozen) and V* over the same pool (sppo_rl.control.astar)
        self.astar = ReferenceValues(plan.spo_contexts, loop.seed, self.actor) if req.optimal_values else None
        self.state = RunState()
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=loop.keep_checkpoints)

        def load(ckpt: Path) -> None:
            check_written_by(ckpt, read_meta(ckpt), self.algo.name)
            self.load_state(torch_load(ckpt / "state.pt"))

        # the newest intact checkpoint (damaged ones are skipped with a warning; none intact: refused)
        ckpt = self.ckpts.resume(load) if loop.resume else None
        if self.astar is not None and ckpt is None:  # A*-PO's stage 1, before update 1 (never on resume)
            t0, a = time.perf_counter(), plan.astar
            self.astar.estimate(self.env, r.horizon, a.samples, a.beta1, loop.seed)
            self.state = RunState(env_steps=self.astar.env_steps, elapsed=time.perf_counter() - t0)
        resolved = {
            **asdict(plan.resolved),
            "compiled": net.compiled,
            "learner": asdict(plan.learner),
        }  # the update's settings in force
        self.logger = start_logging(self.out, plan.given, resolved, ckpt, world="control")

    @property
    def signal(self) -> str:
        """The update row's key of what the run trains on, for the not-learning warnings
        (:func:`~sppo_rl.runtime.watch.not_learning`): the shaped ``return`` with ``--dense``, else the
        binary outcome's ``success_rate``."""
        return "return" if self.plan.dense else "success_rate"

    @property
    def updates(self) -> int:
        """Updates done so far (restored on resume)."""
        return self.state.update

    @property
    def elapsed(self) -> float:
        """Seconds spent updating so far (restored on resume)."""
        return self.state.elapsed

    def _adam(self, params: Any, lr: float) -> torch.optim.Adam:
        """Adam (eps 1e-5, CleanRL's), its fused kernel with ``--compile on``."""
        return torch.optim.Adam(params, lr=lr, eps=1e-5, fused=True if self.compiled else None)

    @property
    def actor_engine(self) -> TorchEngine:
        return TorchEngine(self.actor, self.actor_opt, self.plan.optim.max_grad_norm)

    @property
    def critic_engine(self) -> TorchEngine | None:
        if self.critic is None:
            return None
        return TorchEngine(self.critic, self.critic_opt, self.plan.optim.max_grad_norm)

    # ------------------------------------------------------------------------------------- the loop

    def run(self, callback: Any = None) -> dict[str, Any]:
        """Train to the budget; ``callback(row)`` after each update, ``False`` stops (:func:`run_loop`)."""
        loop = self.plan.loop
        bar = progress_bar(
            loop.progress, loop.updates, self.state.update, f"{self.algo.name}/{self.spec.name}"
        )
        return run_loop(
            self,
            schedule(loop),
            resume_hint=f"sppo-rl control --out-dir {self.out} --resume",
            bar=bar,
            postfix=lambda r: {"success": f"{r['success_rate']:.2f}", "sps": f"{r['sps']:.0f}"},
            callback=callback,
        )

    def update(self) -> dict[str, Any]:
        """One update: collect the episodes, train on them; the run's counters move on by what was
        collected. Returns the update's metrics row."""
        t0 = time.perf_counter()
        rollout = self.collect_rollouts()
        t_collect = time.perf_counter() - t0
        lr, metrics = self.train(rollout)
        return self.record(rollout, lr, metrics, t_collect, time.perf_counter() - t0)

    def record(
        self, rollout: Rollout, lr: float, metrics: dict[str, Any], t_collect: float, dt: float
    ) -> dict[str, Any]:
        """The counters move on by the update that collected ``rollout`` in ``t_collect`` of its ``dt``
        seconds; returns its metrics row (:func:`update_row`)."""
        self.state = self.state.after(self.plan.resolved.episodes_per_update, rollout.env_steps, dt)
        return update_row(self.state, rollout, lr, metrics, t_collect, dt)

    # ------------------------------------------------------------------------------------- collect

    def draw(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """The update's start states: reset seeds, group ids, greedy flags and SPO's pool indices
        (:func:`~sppo_rl.control.rollout.start_states`, from this run's ``seed_rng``)."""
        return start_states(self.plan.resolved, self.seed_rng, self.spo or self.astar)

    def collect_rollouts(self) -> Rollout:
        """Draw the update's start states (:meth:`draw`) and run every episode to its end, acting
        through the stack of one actor (:func:`~sppo_rl.control.rollout.collect_seeds`: the numbers a
        multi-seed run gives this seed)."""
        seeds, groups, greedy, contexts = self.draw()
        self.actor.eval()
        (ep_all,) = collect_seeds(
            self.env,
            StackedActor([self.actor], compiled=self.compiled),
            seeds[None],
            self.plan.resolved.horizon,
            greedy,
            [self.sample_gen],
        )
        return self.rollout(ep_all, groups, contexts)

    def rollout(self, ep_all: Episodes, groups: np.ndarray, contexts: list[int]) -> Rollout:
        """The update's :class:`~sppo_rl.control.rollout.Rollout` of the episodes collected from
        :meth:`draw`'s start states (the sampled ones first, then ReMax's greedy ones)."""
        r = self.plan.resolved
        n = r.episodes_per_update
        return Rollout(
            episodes=ep_all.rows(torch.arange(n)),
            groups=groups[:n],
            greedy_success=ep_all.success[n:] if r.greedy_per_update else None,
            contexts=contexts,
            env_steps=ep_all.env_steps,
        )

    # ------------------------------------------------------------------------------------- train

    def train(self, rollout: Rollout) -> tuple[float, dict[str, Any]]:
        """Advantages, then PPO epochs on the rollout; then the observation statistics move. Returns the
        actor's learning rate and the update's training metrics (SPO's tracker, the learner's)."""
        algo, ep, update = self.algo, rollout.episodes, self.state.update + 1
        batch = self._batch(rollout)
        if self.spo is not None:
            batch.tracker_values = self.spo.tracker.p_hat(rollout.contexts).to(batch.mask.dtype)
        if self.astar is not None:
            batch.optimal_values = self.astar.values(rollout.contexts).to(batch.mask.dtype)
        compute_advantages(batch, algo, **self.plan.estimator)
        check_finite(update, advantages=batch.advantages)
        metrics: dict[str, Any] = {}
        if self.spo is not None:  # the outcomes enter the tracker after the estimate, before the update
            distances = self.spo.distances(self.actor, rollout.contexts)
            rhos = self.spo.observe(rollout.contexts, ep, distances)
            metrics = {
                "spo_p_hat": float(batch.tracker_values.mean()),
                "spo_distance": float(np.mean(distances)),
                "spo_rho": float(np.mean(rhos)),
            }
        if self.astar is not None:
            metrics["astar_v_star"] = float(batch.optimal_values.mean())
        lr = self._schedule_lr()
        metrics.update(self._optimise(ep, batch))
        # observation statistics move only after the update, so that within it the log-probs are
        # recomputed on exactly the inputs they were sampled on (the first ratio is exactly 1)
        self.actor.norm.update(ep.obs[ep.mask > 0])
        return lr, metrics

    def _batch(self, rollout: Rollout) -> SequenceBatch:
        ep, groups, greedy_success = rollout.episodes, rollout.groups, rollout.greedy_success
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
        if self.astar is not None:  # A*-PO's regression reads the reference's log-probs
            ref = self._actor_fn(ep, self.astar.reference)
            batch.ref_logp = forward_rows(ref, batch.lengths, batch.lengths, self.plan.learner)
        return batch

    def _actor_fn(self, ep: Episodes, actor: Actor | None = None):
        """``(rows, T) -> (logp, entropy)`` of the taken actions under ``actor`` (None: the run's),
        computed on valid steps only."""
        policy = self.actor if actor is None else actor
        logp_entropy = compiled(Actor.logp_entropy, self.compiled)

        def taken(rows: Tensor, T: int) -> tuple[Tensor, Tensor]:
            valid = ep.mask[rows, :T] > 0
            logp_v, ent_v = logp_entropy(policy, ep.obs[rows, :T][valid], ep.actions[rows, :T][valid])
            zeros = torch.zeros(valid.shape, dtype=logp_v.dtype)
            return zeros.masked_scatter(valid, logp_v), zeros.masked_scatter(valid, ent_v)

        return taken

    def _critic_fn(self, ep: Episodes):
        """``(rows, T) -> values``: the critic on the episodes' observations, its own kind deciding which:
        a per-step critic on valid steps only (0 on padding, as the actor's log-probs), a start-state
        critic on the first step."""
        critic = self.critic
        assert critic is not None
        values = compiled(type(critic).values, self.compiled)
        if not isinstance(critic, StepCritic):
            return lambda rows, T: values(critic, ep.obs[rows, :T])

        def step_values(rows: Tensor, T: int) -> Tensor:
            valid = ep.mask[rows, :T] > 0
            v = values(critic, ep.obs[rows, :T][valid])
            return torch.zeros(valid.shape, dtype=v.dtype).masked_scatter(valid, v)

        return step_values

    def _schedule_lr(self) -> float:
        """Set both optimizers' learning rates for the update about to run (``--lr-schedule``, from the
        update index: :mod:`sppo_rl.runtime.schedule`); returns the actor's."""
        opt = self.plan.optim
        f = lr_factor(opt.lr_schedule, self.state.update, self.plan.loop.updates, opt.warmup_updates)
        set_lr(self.actor_opt, opt.actor_lr * f)
        if self.critic_opt is not None:
            set_lr(self.critic_opt, opt.critic_lr * f)
        return opt.actor_lr * f

    def _optimise(self, ep: Episodes, batch: SequenceBatch) -> dict[str, Any]:
        update = self.state.update + 1
        self.actor.train()
        stats = ppo_update(
            batch,
            self.algo,
            self.plan.learner,
            self._actor_fn(ep),
            self.actor_engine,
            self._critic_fn(ep) if self.critic is not None else None,
            self.critic_engine,
            train_actor=self.state.update >= self.plan.optim.critic_warmup,
            generator=self.perm_gen,
            guard=lambda **q: check_finite(update, **q),
        ).stats
        self.actor.eval()
        stats["actor_skipped"] = int(stats["actor_skipped"])
        return stats

    # ------------------------------------------------------------------------------------- evaluate

    def success_rate(self, episodes: int, greedy: bool = True) -> float:
        """Success rate on ``episodes`` fixed start states (:func:`~sppo_rl.control.evaluate.success_rate`),
        greedy by default."""
        from sppo_rl.envs.tasks import make_episode_env

        if self._eval_env is None or self._eval_env.num_envs != episodes:
            self._eval_env = make_episode_env(self.spec, num_envs=episodes, dense=self.plan.dense)
        return success_rate(self.actor, self._eval_env, self.plan.resolved.horizon, greedy)

    def evaluate(self) -> dict[str, Any]:
        """The periodic evaluation: greedy success on ``eval_episodes`` fixed start states."""
        return {"eval_success_rate": self.success_rate(self.plan.evaluation.episodes)}

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
            **self.state.to_checkpoint(),
            **({"spo": self.spo.state_dict()} if self.spo is not None else {}),
            **({"astar": self.astar.state_dict()} if self.astar is not None else {}),
        }

    def load_state(self, s: dict[str, Any]) -> None:
        if s["actor_arch"] != self.actor.arch():
            self.actor = Actor(**s["actor_arch"])
            if self.compiled:
                use_rational_tanh(self.actor)
            self.actor_opt = self._adam(self.actor.parameters(), self.plan.optim.actor_lr)
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
        self.state = RunState.from_checkpoint(s)
        if self.spo is not None:
            self.spo.load_state_dict(s["spo"])
        if self.astar is not None:
            self.astar.load_state_dict(s["astar"])
            if self.compiled:
                use_rational_tanh(self.astar.reference)

    def save_checkpoint(self) -> Path:
        state = self.state_dict()
        meta = {
            "metrics_bytes": self.logger.position(),
            "episodes": self.state.episodes,
            "algo": self.algo.name,
        }
        meta["log_step"] = self.state.env_steps  # the x-axis of the logs (global_step = env steps)
        return self.ckpts.save(self.state.update, lambda d: torch_save(state, d / "state.pt"), meta)

    # ------------------------------------------------------------------------------------- the end

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary (:func:`~sppo_rl.control.summary.summary_of`, from every row of ``metrics.jsonl``,
        so a resumed run summarises the whole run, and the run's counters), the final greedy
        evaluation, then the exports (:func:`~sppo_rl.control.summary.write_exports`)."""
        summary = summary_of(rows, self.state, self.plan)
        if self.plan.evaluation.episodes:
            summary["final_eval_success_rate"] = self.success_rate(self.plan.evaluation.episodes)
        write_exports(self.out, self.plan, self.actor, self.critic, summary)
        return summary

    def close(self) -> None:
        self.logger.close()
        if self._own_env:
            self.env.close()
        unlock_run_dir(self.out)


def update_row(
    state: RunState, rollout: Rollout, lr: float, metrics: dict[str, Any], t_collect: float, dt: float
) -> dict[str, Any]:
    """The metrics row of the update that left the run at ``state``: the counters, the sampled episodes'
    success, length and return, the timing (``dt`` seconds, ``t_collect`` of them collecting), the
    actor's learning rate, the greedy episodes' success (ReMax), then the training ``metrics``."""
    ep = rollout.episodes
    row: dict[str, Any] = {
        "update": state.update,
        "episodes": state.episodes,
        "env_steps": state.env_steps,
        "success_rate": float(ep.success.mean()),
        "episode_length": float(ep.lengths.float().mean()),
        "return": float((ep.rewards * ep.mask).sum(-1).mean()),
        "wall_time_s": state.elapsed,
        "sps": state.env_steps / max(state.elapsed, 1e-9),
        "update_sps": rollout.env_steps / dt,
        "collect_frac": t_collect / dt,
        "learning_rate": lr,
    }
    if rollout.greedy_success is not None:
        row["greedy_success_rate"] = float(rollout.greedy_success.mean())
    row.update(metrics)
    return row


def run_control(cfg: ControlConfig, callback: Any = None, command: bool = False) -> dict[str, Any]:
    """Entry point of ``sppo-rl control``; ends with the headline numbers and where to look next.
    ``callback(row) -> False`` stops the run after that update (:func:`~sppo_rl.runtime.loop.run_loop`).
    With ``cfg.seeds``, every seed's run in one process (:class:`~sppo_rl.control.seeds.SeedRuns`)."""
    from sppo_rl.control.seeds import SeedRuns, seeds_headline

    multi = cfg.seeds is not None  # read before planning: after it, the run reads only the plan
    run = SeedRuns(cfg, ControlRun) if multi else ControlRun(cfg)
    started = time.monotonic()
    summary = run.run(callback)
    seconds = time.monotonic() - started
    line = seeds_headline(summary) if multi else headline(summary)
    announce(run.out, line, run.plan.loop.tensorboard, command=command, loop_seconds=seconds)
    return summary
