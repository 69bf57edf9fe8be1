"""``sppo-rl warmstart``: stages 1 and 2 of the paper's pipeline (SPEC section 4).

1. **Expert**: this project's own PPO (GAE, gamma 0.99) on the task's dense shaped reward
   (``dense=True``: same dynamics, termination and success test; only the reward differs).
2. **Behaviour cloning**: the expert's episodes on fresh start states are filtered to the successful
   ones; a fresh policy network is fitted to the expert's actions at those states (cross-entropy to the
   expert's argmax for discrete actions; MSE to the expert's mean for continuous ones, with the
   expert's log-std copied). Cloning stops at the first check where the clone's *sampled* success rate
   on the sparse task reaches ``target_success``, so the warm start succeeds sometimes but not always:
   RL on the binary reward (stage 3) has room to improve and a signal to learn from.

The output file (``{"arch", "actor", "meta"}``) is what ``sppo-rl control --init-from`` reads;
``--install`` also copies it into the package (``sppo_rl/assets/warmstart/<task>.pt``), where
``--init-from auto`` finds it.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sppo_rl.control.actor_files import WARMSTART_DIR, load_actor_file, save_actor_file
from sppo_rl.control.config import ControlConfig, WarmstartConfig
from sppo_rl.control.evaluate import EVAL_SEED_BASE
from sppo_rl.control.networks import Actor
from sppo_rl.control.rollout import collect
from sppo_rl.control.trainer import ControlRun
from sppo_rl.runtime.files import atomic_write_text
from sppo_rl.runtime.run import RunError, set_threads

# Expert PPO settings per task (stage 1): budget in episodes, episodes per update, learning rate, entropy.
EXPERTS: dict[str, dict[str, Any]] = {
    "short-cartpole": dict(total_episodes=3000, episodes_per_update=32, actor_lr=1e-3),
    "precision-cartpole": dict(total_episodes=6000, episodes_per_update=32, actor_lr=1e-3),
    "mountaincar": dict(total_episodes=600, episodes_per_update=8, actor_lr=1e-3),
    "pendulum": dict(total_episodes=400, episodes_per_update=8, actor_lr=1e-3),
    "lunarlander": dict(total_episodes=3000, episodes_per_update=16, actor_lr=3e-4),
    "hopper": dict(total_episodes=4000, episodes_per_update=8, actor_lr=3e-4),
}


@torch.no_grad()
def success_rate(actor: Actor, task: str, episodes: int, greedy: bool, seed_offset: int = 0) -> float:
    """Success on ``episodes`` fixed evaluation start states (sampled or greedy actions)."""
    from sppo_rl.envs.tasks import get_task, make_episode_env

    spec = get_task(task)
    env = make_episode_env(spec.name, num_envs=episodes)
    seeds = EVAL_SEED_BASE + seed_offset + np.arange(episodes)
    gen = torch.Generator().manual_seed(777 + seed_offset)
    ep = collect(env, actor, seeds, spec.horizon, np.full(episodes, greedy), gen)
    env.close()
    return float(ep.success.mean())


def train_expert(cfg: WarmstartConfig, task: str, folder: Path) -> Path:
    """Stage 1: PPO on the dense reward; returns the expert's actor file."""
    defaults = EXPERTS.get(task, dict(total_episodes=2000, episodes_per_update=16, actor_lr=3e-4))
    ccfg = ControlConfig(
        algo="ppo",
        task=task,
        seed=cfg.seed,
        total_episodes=cfg.expert_episodes or defaults["total_episodes"],
        episodes_per_update=cfg.expert_episodes_per_update or defaults["episodes_per_update"],
        hidden_sizes=cfg.expert_hidden_sizes,
        actor_lr=cfg.expert_lr or defaults["actor_lr"],
        critic_lr=1e-3,
        epochs=10,
        minibatches=8,
        gamma=0.99,
        lam=0.95,
        whiten=True,
        value_clip=None,
        dense=True,
        init_from="none",
        out_dir=str(folder),
        overwrite=True,
        eval_episodes=0,
        checkpoint_every=25,
        threads=cfg.threads,
        progress=cfg.progress,
    )
    ControlRun(ccfg).run()
    return folder / "final.pt"


def clone(cfg: WarmstartConfig, task: str, expert: Actor) -> tuple[Actor, dict[str, Any]]:
    """Stage 2: collect expert demonstrations, keep successes, fit a fresh actor until target success."""
    from sppo_rl.envs.tasks import get_task, make_episode_env

    spec = get_task(task)
    env = make_episode_env(spec.name, num_envs=cfg.demo_episodes)
    rng = np.random.default_rng(cfg.seed + 100)
    seeds = rng.integers(0, 2**31 - 1, size=cfg.demo_episodes)
    gen = torch.Generator().manual_seed(cfg.seed + 101)
    demos = collect(env, expert, seeds, spec.horizon, None, gen)
    env.close()
    ok = demos.success > 0.5
    if int(ok.sum()) == 0:
        raise RunError(
            f"the expert succeeded in 0 of {cfg.demo_episodes} episodes on {task}; train it longer "
            "(--expert-episodes) before cloning"
        )
    good = demos.rows(torch.nonzero(ok)[:, 0])
    states = good.obs[good.mask > 0]
    with torch.no_grad():
        target = expert(states)
        labels = target.argmax(-1) if expert.discrete else target
    torch.manual_seed(cfg.seed + 102)
    student = Actor(spec.obs_dim, spec.action_dim, spec.discrete, cfg.hidden_sizes, "tanh")
    student.norm.load_state_dict(expert.norm.state_dict())
    student.norm.frozen.fill_(True)
    if not spec.discrete:
        with torch.no_grad():
            student.log_std.copy_(expert.log_std)
        student.log_std.requires_grad_(False)
    opt = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=cfg.bc_lr)
    bgen = torch.Generator().manual_seed(cfg.seed + 103)
    history: list[tuple[int, float]] = []
    snapshots: list[tuple[int, float, dict]] = []
    step, loss = 0, torch.tensor(float("nan"))
    while True:
        rate = success_rate(student, task, cfg.check_episodes, greedy=False)
        history.append((step, rate))
        snapshots.append((step, rate, copy.deepcopy(student.state_dict())))
        if cfg.progress:
            print(
                f"[warmstart] bc step {step}: loss {loss.item():.4f}, sampled success {rate:.3f}",
                file=sys.stderr,
            )
        if rate >= cfg.target_success or step >= cfg.bc_max_steps:
            break
        # checks every `check_every` steps at first, then at steps growing geometrically (cloning moves fast early)
        for _ in range(max(cfg.check_every, int(step * (cfg.check_growth - 1.0)))):
            idx = torch.randint(0, states.shape[0], (min(cfg.bc_batch, states.shape[0]),), generator=bgen)
            out = student(states[idx])
            if spec.discrete:
                loss = torch.nn.functional.cross_entropy(out, labels[idx])
            else:
                loss = ((out - labels[idx]) ** 2).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
    # of the checked snapshots that succeed sometimes but not always, the one closest to the target
    imperfect = [s for s in snapshots if 0.0 < s[1] < 1.0]
    if not imperfect:
        raise RunError(
            f"behaviour cloning on {task} never gave a success rate strictly between 0 and 1 "
            f"(checks: {history}); try a smaller --check-every or --bc-lr"
        )
    chosen = min(imperfect, key=lambda s: (abs(s[1] - cfg.target_success), s[0]))
    student.load_state_dict(chosen[2])
    info = {
        "demo_episodes": cfg.demo_episodes,
        "demo_successes": int(ok.sum()),
        "demo_states": int(states.shape[0]),
        "bc_steps": chosen[0],
        "bc_check_success": chosen[1],
        "bc_history": history,
    }
    return student, info


def run_warmstart(cfg: WarmstartConfig) -> dict[str, Any]:
    """Entry point of ``sppo-rl warmstart``."""
    from sppo_rl.envs.tasks import get_task

    set_threads(cfg.threads)
    try:
        spec = get_task(cfg.task)
    except (KeyError, ValueError) as e:
        raise RunError(str(e).strip("'\"")) from None
    if not 0.0 < cfg.target_success < 1.0:
        raise RunError(f"--target-success must be in (0, 1), got {cfg.target_success}")
    folder = Path(cfg.out_dir) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    expert_file = (
        Path(cfg.expert_from) if cfg.expert_from else train_expert(cfg, spec.name, folder / "expert")
    )
    expert = load_actor_file(expert_file)
    t_expert = time.perf_counter() - t0
    expert_sampled = success_rate(expert, spec.name, cfg.eval_episodes, greedy=False, seed_offset=50_000)
    student, info = clone(cfg, spec.name, expert)
    # the reported start: fresh start states, not the ones cloning was stopped on
    sampled = success_rate(student, spec.name, cfg.eval_episodes, greedy=False, seed_offset=50_000)
    greedy = success_rate(student, spec.name, cfg.eval_episodes, greedy=True, seed_offset=50_000)
    meta = {
        "task": spec.name,
        "env_id": spec.env_id,
        "seed": cfg.seed,
        "expert_success_sampled": expert_sampled,
        "success_sampled": sampled,
        "success_greedy": greedy,
        "eval_episodes": cfg.eval_episodes,
        "seconds": time.perf_counter() - t0,
        "expert_seconds": t_expert,
        "command": "sppo-rl warmstart " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "",
        "config": asdict(cfg),
        **info,
    }
    out = folder / "warmstart.pt"
    save_actor_file(out, student, meta)
    atomic_write_text(folder / "warmstart.json", json.dumps(meta, indent=2, default=str) + "\n")
    if cfg.install:
        WARMSTART_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, WARMSTART_DIR / f"{spec.name}.pt")
    print(
        f"[warmstart] {spec.name}: expert {expert_sampled:.2f}, clone sampled {sampled:.2f} / greedy {greedy:.2f} "
        f"-> {out}",
        file=sys.stderr,
    )
    return meta
