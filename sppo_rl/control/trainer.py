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
from dataclasses import asdict, dataclass
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
    policy_loss,
)
from sppo_rl.agents.algorithms import Algorithm, critic_values, estimator_params
from sppo_rl.control.config import ControlConfig
from sppo_rl.control.networks import Actor, Critic
from sppo_rl.control.rollout import Episodes, collect
from sppo_rl.runtime import (
    CheckpointManager,
    Preemption,
    check_finite,
    prepare_run_dir,
)
from sppo_rl.runtime.checkpoint import atomic_write_text, torch_load, torch_save
from sppo_rl.runtime.logging import start_logging
from sppo_rl.runtime.run import RunError, exit_preempted, set_threads

WARMSTART_DIR = Path(__file__).resolve().parent.parent / "assets" / "warmstart"
EVAL_SEED_BASE = 2_000_000_000  # evaluation start states: seeds EVAL_SEED_BASE + i, never drawn for training


def default_group_size(algo: Algorithm, episodes: int) -> int:
    """The algorithm's N, reduced to the largest divisor of ``episodes`` that leaves >= 2 start states."""
    if not algo.requires.groups:
        return 1
    for g in range(min(algo.group_size, episodes // 2), 1, -1):
        if episodes % g == 0:
            return g
    return 2


@dataclass
class Resolved:
    """Settings derived from the config and the task, saved beside it."""

    task: str
    env_id: str
    horizon: int
    episodes_per_update: int
    group_size: int
    contexts_per_update: int
    greedy_per_update: int
    init_from: str


def resolve_init(init_from: str, task: str) -> Path | None:
    """Where the actor's initial weights come from (None: random init)."""
    if init_from == "none":
        return None
    if init_from == "auto":
        path = WARMSTART_DIR / f"{task}.pt"
        return path if path.exists() else None
    path = Path(init_from)
    if path.is_dir():
        for candidate in (path / "final.pt", path / "warmstart.pt"):
            if candidate.exists():
                return candidate
        ckpts = CheckpointManager(path / "checkpoints").latest()
        if ckpts is not None:
            return ckpts / "state.pt"
        raise RunError(f"--init-from {path}: no final.pt, warmstart.pt or checkpoint inside")
    if not path.exists():
        raise RunError(f"--init-from {path}: no such file")
    return path


def load_actor_file(path: Path) -> Actor:
    """An :class:`Actor` from a warm-start / final file (``{"arch", "actor"}``) or a run checkpoint."""
    blob = torch_load(path)
    if "arch" not in blob or "actor" not in blob:
        raise RunError(f"{path} is not an actor file (expected keys 'arch' and 'actor')")
    actor = Actor(**blob["arch"])
    actor.load_state_dict(blob["actor"])
    return actor


def save_actor_file(path: Path, actor: Actor, meta: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch_save({"arch": actor.arch(), "actor": actor.state_dict(), "meta": meta}, tmp)
    tmp.replace(path)


class ControlRun:
    """State and loop of one control run. ``run()`` trains to the budget and returns the summary."""

    def __init__(self, cfg: ControlConfig) -> None:
        from sppo_rl.envs import get_task, make_episode_env

        self.cfg = cfg
        self.algo = get_algorithm(cfg.algo)
        try:
            self.spec = get_task(cfg.task)
        except (KeyError, ValueError) as e:
            raise RunError(str(e).strip("'\"")) from None
        req = self.algo.requires
        E = cfg.episodes_per_update or self.spec.episodes_per_update
        G = cfg.group_size if cfg.group_size is not None else default_group_size(self.algo, E)
        check_setup(self.algo, G, E)
        if cfg.total_episodes < E:
            raise RunError(
                f"--total-episodes ({cfg.total_episodes}) is smaller than one update ({E} episodes)"
            )
        if cfg.epochs < 1 or cfg.minibatches < 1 or cfg.minibatches > E:
            raise RunError(f"need epochs >= 1 and 1 <= minibatches <= episodes_per_update ({E})")
        contexts = E // G
        n_greedy = contexts if req.greedy_baseline else 0
        init_path = resolve_init(cfg.init_from, self.spec.name)
        self.resolved = Resolved(
            task=self.spec.name,
            env_id=self.spec.env_id,
            horizon=self.spec.horizon,
            episodes_per_update=E,
            group_size=G,
            contexts_per_update=contexts,
            greedy_per_update=n_greedy,
            init_from=str(init_path) if init_path else "none",
        )
        self.out = prepare_run_dir(cfg.out_dir, resume=cfg.resume, overwrite=cfg.overwrite)
        set_threads(cfg.threads)
        torch.manual_seed(cfg.seed)

        # networks (a warm start fixes the actor's architecture and freezes its observation statistics)
        if init_path is not None:
            self.actor = load_actor_file(init_path)
            self.actor.norm.frozen.fill_(True)
            if self.actor.obs_dim != self.spec.obs_dim or self.actor.discrete != self.spec.discrete:
                raise RunError(
                    f"{init_path} was made for another observation/action space than {self.spec.name}"
                )
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
            self.critic = Critic(self.spec.obs_dim, cfg.hidden_sizes, cfg.activation, norm=self.actor.norm)
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
        self.env = make_episode_env(self.spec.name, num_envs=E + n_greedy, dense=cfg.dense)
        self._eval_env = None

        # randomness: start states, action sampling, minibatch order
        self.seed_rng = np.random.default_rng(cfg.seed)
        self.sample_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.perm_gen = torch.Generator().manual_seed(cfg.seed + 2)
        self.update_idx = 0
        self.episodes = 0
        self.env_steps = 0
        self.elapsed = 0.0
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=cfg.keep_checkpoints)

        ckpt = self.ckpts.latest() if cfg.resume else None  # prepare_run_dir checked there is one
        if ckpt is not None:
            self.load_state(torch_load(ckpt / "state.pt"))
        self.logger = start_logging(self.out, cfg, asdict(self.resolved), ckpt)

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

    def save_checkpoint(self) -> Path:
        state = self.state_dict()
        meta = {"metrics_bytes": self.logger.position(), "episodes": self.episodes, "algo": self.algo.name}
        return self.ckpts.save(self.update_idx, lambda d: torch_save(state, d / "state.pt"), meta)

    # ------------------------------------------------------------------------------------- one update

    def _seeds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row reset seeds, group ids and greedy flags for one update."""
        r = self.resolved
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
            with torch.no_grad():
                if self.algo.requires.critic == "sequence":
                    batch.values = self.critic(ep.obs[:, 0])
                else:
                    batch.values = self.critic(ep.obs) * mask
        return batch

    def update(self) -> dict[str, Any]:
        cfg, algo, r = self.cfg, self.algo, self.resolved
        t0 = time.perf_counter()
        seeds, groups, greedy = self._seeds()
        self.actor.eval()
        ep_all = collect(self.env, self.actor, seeds, r.horizon, greedy, self.sample_gen)
        t_collect = time.perf_counter() - t0
        n = r.episodes_per_update
        ep = ep_all.rows(torch.arange(n))
        greedy_success = ep_all.success[n:] if r.greedy_per_update else None
        batch = self._batch(ep, groups[:n], greedy_success)
        compute_advantages(batch, algo, **estimator_params(cfg))
        check_finite(self.update_idx + 1, advantages=batch.advantages)
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
        }
        if greedy_success is not None:
            row["greedy_success_rate"] = float(greedy_success.mean())
        row.update(stats)
        return row

    def _optimise(self, ep: Episodes, batch: SequenceBatch) -> dict[str, Any]:
        cfg, algo = self.cfg, self.algo
        mask = batch.mask
        valid = mask > 0
        stats: dict[str, list[float]] = {}
        out: dict[str, Any] = {}
        seq_critic = algo.requires.critic == "sequence"
        if self.critic is not None:
            pred = critic_values(algo, batch.values)
            if seq_critic:
                p = torch.sigmoid(batch.values)
                out["v0_mean"] = float(p.mean())
                out["v0_brier"] = float(((p - batch.rewards) ** 2).mean())
                out["v0_gap"] = float(p.mean() - batch.rewards.mean())
            else:
                out["explained_variance"] = explained_variance(pred, batch.returns, mask)
                out["value_mean"] = float(pred[valid].mean())
        adv_zero = bool((batch.advantages == 0).all())
        out["actor_skipped"] = int(adv_zero)
        out["loss_frac"] = float(batch.loss_mask.sum() / mask.sum().clamp(min=1))
        B = batch.batch_size
        mb_rows = torch.tensor_split(torch.arange(B), cfg.minibatches)
        self.actor.train()
        for _epoch in range(cfg.epochs):
            perm = torch.randperm(B, generator=self.perm_gen)
            for rows_idx in mb_rows:
                rows = perm[rows_idx]
                m_valid = valid[rows]
                m_mask = mask[rows]
                obs_v = ep.obs[rows][m_valid]
                losses: dict[str, Tensor] = {}
                if not adv_zero:
                    logp_v, ent_v = self.actor.logp_entropy(obs_v, ep.actions[rows][m_valid])
                    logp = torch.zeros_like(m_mask)
                    logp = logp.masked_scatter(m_valid, logp_v)
                    ent = torch.zeros_like(m_mask).masked_scatter(m_valid, ent_v)
                    pl, pm = policy_loss(
                        logp,
                        batch.logp_old[rows],
                        batch.advantages[rows],
                        batch.loss_mask[rows],
                        clip_low=cfg.clip,
                        clip_high=cfg.clip if cfg.clip_high is None else cfg.clip_high,
                        dual_clip=cfg.dual_clip,
                        agg=cfg.agg,
                        length_budget=self.resolved.horizon,
                    )
                    entropy = agg_loss(ent, batch.loss_mask[rows], cfg.agg, self.resolved.horizon)
                    losses["policy_loss"] = pl
                    losses["actor"] = pl - cfg.ent_coef * entropy
                    for k, v in pm.items():
                        stats.setdefault(k, []).append(v)
                    stats.setdefault("policy_loss", []).append(float(pl.detach()))
                    stats.setdefault("entropy", []).append(float(entropy.detach()))
                if self.critic is not None:
                    if seq_critic:
                        pred = self.critic(ep.obs[rows, 0])
                        vl = critic_loss(algo, pred, batch.returns[rows], m_mask)
                    else:
                        v_v = self.critic(obs_v)
                        pred = torch.zeros_like(m_mask).masked_scatter(m_valid, v_v)
                        vl = critic_loss(
                            algo,
                            pred,
                            batch.returns[rows],
                            m_mask,
                            old_pred=batch.values[rows],
                            clip=cfg.value_clip,
                        )
                    losses["critic"] = vl
                    stats.setdefault("critic_bce" if algo.critic_loss == "bce" else "value_loss", []).append(
                        float(vl.detach())
                    )
                check_finite(self.update_idx + 1, **losses)
                total = sum(v for k, v in losses.items() if k in ("actor", "critic"))
                if not isinstance(total, Tensor):
                    continue
                self.actor_opt.zero_grad(set_to_none=True)
                if self.critic_opt is not None:
                    self.critic_opt.zero_grad(set_to_none=True)
                total.backward()
                if "actor" in losses:
                    gn = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), cfg.max_grad_norm)
                    check_finite(self.update_idx + 1, actor_grad_norm=gn)
                    stats.setdefault("grad_norm", []).append(float(gn))
                if self.critic is not None:
                    cgn = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                    check_finite(self.update_idx + 1, critic_grad_norm=cgn)
                    stats.setdefault("critic_grad_norm", []).append(float(cgn))
                if "actor" in losses:
                    self.actor_opt.step()
                if self.critic_opt is not None:
                    self.critic_opt.step()
        self.actor.eval()
        for k, vals in stats.items():
            if k == "ratio_min":
                out[k] = min(vals)
            elif k == "ratio_max":
                out[k] = max(vals)
            else:
                out[k] = float(np.mean(vals))
        return out

    # ------------------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self, episodes: int, greedy: bool = True) -> float:
        """Success rate on fixed start states (seeds ``EVAL_SEED_BASE + i``), greedy by default."""
        from sppo_rl.envs import make_episode_env

        if self._eval_env is None or self._eval_env.num_envs != episodes:
            self._eval_env = make_episode_env(self.spec.name, num_envs=episodes, dense=self.cfg.dense)
        seeds = EVAL_SEED_BASE + np.arange(episodes)
        gen = torch.Generator().manual_seed(12345)
        flags = np.full(episodes, greedy)
        ep = collect(self._eval_env, self.actor, seeds, self.resolved.horizon, flags, gen)
        return float(ep.success.mean())

    @torch.no_grad()
    def calibration(self, contexts: int = 64, samples: int = 16) -> dict[str, list[float]] | None:
        """Start-state critic's ``sigmoid V(s_0)`` against the empirical success of ``samples`` episodes
        from each of ``contexts`` fixed start states (None without a sequence critic)."""
        from sppo_rl.envs import make_episode_env

        if self.critic is None or self.algo.requires.critic != "sequence":
            return None
        env = make_episode_env(self.spec.name, num_envs=contexts * samples, dense=self.cfg.dense)
        seeds = np.repeat(EVAL_SEED_BASE + 10_000 + np.arange(contexts), samples)
        gen = torch.Generator().manual_seed(54321)
        ep = collect(env, self.actor, seeds, self.resolved.horizon, None, gen)
        env.close()
        pred = torch.sigmoid(self.critic(ep.obs[::samples, 0]))
        emp = ep.success.view(contexts, samples).mean(1)
        return {"predicted": pred.tolist(), "empirical": emp.tolist(), "samples": [samples] * contexts}

    @torch.no_grad()
    def critic_trace(self, episodes: int = 64) -> dict[str, np.ndarray] | None:
        """What the critic says along ``episodes`` sampled episodes from fixed start states, for the
        tail-effect diagnostic: a step critic's ``V(s_t)`` (in reward units) for every step, or a
        sequence critic's ``V(s_0)``, with each episode's length and outcome (None without a critic)."""
        from sppo_rl.envs import make_episode_env

        if self.critic is None:
            return None
        env = make_episode_env(self.spec.name, num_envs=episodes, dense=self.cfg.dense)
        seeds = EVAL_SEED_BASE + 20_000 + np.arange(episodes)
        ep = collect(env, self.actor, seeds, self.resolved.horizon, None, torch.Generator().manual_seed(4242))
        env.close()
        out = {
            "lengths": ep.lengths.numpy(),
            "success": ep.success.numpy(),
            "horizon": np.array(self.resolved.horizon),
        }
        if self.algo.requires.critic == "sequence":
            out["kind"] = np.array("sequence")
            out["v0"] = torch.sigmoid(self.critic(ep.obs[:, 0])).numpy()
        else:
            out["kind"] = np.array("step")
            out["values"] = (critic_values(self.algo, self.critic(ep.obs)) * ep.mask).numpy()
        return out

    # ------------------------------------------------------------------------------------- loop

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        total_updates = math.ceil(cfg.total_episodes / self.resolved.episodes_per_update)
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=total_updates * self.resolved.episodes_per_update,
                initial=self.episodes,
                unit="ep",
                desc=f"{self.algo.name}/{self.spec.name}",
                dynamic_ncols=True,
            )
        recent: list[float] = []
        try:
            with Preemption() as pre:
                while self.update_idx < total_updates:
                    row = self.update()
                    if cfg.eval_every and self.update_idx % cfg.eval_every == 0:
                        row["eval_success_rate"] = self.evaluate(cfg.eval_episodes)
                    self.logger.log(row, step=self.episodes)
                    recent = (recent + [row["success_rate"]])[-10:]
                    if bar is not None:
                        bar.update(self.resolved.episodes_per_update)
                        bar.set_postfix(success=f"{row['success_rate']:.2f}", sps=f"{row['sps']:.0f}")
                    if pre.requested:
                        self.save_checkpoint()
                        self.logger.close()
                        if bar is not None:
                            bar.close()
                        exit_preempted(
                            self.out, pre.requested, f"sppo-rl control --out-dir {self.out} --resume"
                        )
                    if self.update_idx % cfg.checkpoint_every == 0 or self.update_idx == total_updates:
                        self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
        summary = {
            "algo": self.algo.name,
            "task": self.spec.name,
            "seed": cfg.seed,
            "updates": self.update_idx,
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "wall_time_s": self.elapsed,
            "sps": self.env_steps / max(self.elapsed, 1e-9),
            "final_success_rate": float(np.mean(recent)) if recent else float("nan"),
        }
        if cfg.eval_episodes:
            summary["final_eval_success_rate"] = self.evaluate(cfg.eval_episodes)
        cal = self.calibration(cfg.calibration_contexts, cfg.calibration_samples)
        if cal is not None:
            atomic_write_text(self.out / "calibration.json", json.dumps(cal) + "\n")
        trace = self.critic_trace()
        if trace is not None:
            np.savez_compressed(self.out / "critic_trace.npz", **trace)
        save_actor_file(self.out / "final.pt", self.actor, {"summary": summary, "config": asdict(cfg)})
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.logger.close()
        self.env.close()
        return summary


def run_control(cfg: ControlConfig) -> dict[str, Any]:
    """Entry point of ``sppo-rl control``."""
    return ControlRun(cfg).run()
