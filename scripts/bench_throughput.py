"""End-to-end training throughput: this project's PPO and SPPO against Stable-Baselines3's PPO.

Same task, same network (64-64 tanh actor and critic), same rollout size (SB3 gets ``num_envs``
envs x ``n_steps`` = our mean env steps per update), same epochs and minibatches, one torch thread,
the same env-step budget, all in this one process; plus the raw env-step rate of the same task and
vector width as the ceiling. Two starting points:

- ``--init warmstart`` (default): both start from the task's shipped warm-start policy, the regime of
  stage 3 and of the paper's study (long episodes). SB3's policy network gets the same weights, with
  our observation normalisation folded exactly into its first layer (``W' = W / sd``,
  ``b' = b - W mu / sd``; the +-10 clip is the only difference, and is not reached here);
- ``--init random``: both from scratch (short episodes: tiny updates, dominated by per-update costs).

    python scripts/bench_throughput.py                   # PrecisionCartPole and SparseHopper
    python scripts/bench_throughput.py --init random --steps 100000 --tasks precision-cartpole

Printed: one line per measurement, then a JSON object (last line) with, for PrecisionCartPole at the
top level and per task under ``tasks``: ``sps`` (our PPO, env steps per second of training),
``sppo_sps``, ``sb3_sps``, ``speedup_vs_sb3`` (= sps / sb3_sps), ``env_sps`` (random actions through
the same episode vector env), ``fraction_of_env_limit`` (= sps / env_sps).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time

import numpy as np
import torch


def env_rate(task: str, num_envs: int, seconds: float) -> float:
    """Env steps per second with random actions through ``make_episode_env`` (episodes reset when all end)."""
    from sppo_rl.envs.tasks import get_task, make_episode_env

    spec = get_task(task)
    env = make_episode_env(spec.name, num_envs=num_envs)
    rng = np.random.default_rng(0)
    steps, seed, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.reset(seed=[seed + i for i in range(num_envs)])
        seed += num_envs
        active = np.ones(num_envs, dtype=bool)
        for _ in range(spec.horizon):
            if spec.discrete:
                a = rng.integers(0, spec.action_dim, size=num_envs)
            else:
                a = rng.uniform(spec.action_low, spec.action_high, size=(num_envs, spec.action_dim)).astype(
                    np.float32
                )
            _, _, term, trunc, _ = env.step(a)
            steps += int(active.sum())
            active &= ~(term | trunc)
            if not active.any():
                break
    env.close()
    return steps / (time.perf_counter() - t0)


def ours(task: str, algo: str, steps: int, epochs: int, minibatches: int, init: str) -> tuple[float, float]:
    """(training env steps per second, mean env steps per update) of ``sppo-rl control``."""
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import ControlRun

    with tempfile.TemporaryDirectory() as d:
        run = ControlRun(
            ControlConfig(
                algo=algo,
                task=task,
                init_from="auto" if init == "warmstart" else "none",
                hidden_sizes=(64, 64),
                activation="tanh",
                epochs=epochs,
                minibatches=minibatches,
                out_dir=d,
                progress=False,
                tensorboard=False,
                eval_episodes=0,
                total_episodes=10**9,
                checkpoint_every=10**9,
            )
        )
        updates, t0 = 0, time.perf_counter()
        while run.state.env_steps < steps:
            run.update()
            updates += 1
        dt = time.perf_counter() - t0
        env_steps = run.state.env_steps
        run.logger.close()
        run.env.close()
    return env_steps / dt, env_steps / updates


def load_warmstart_into_sb3(model, task: str) -> None:
    """Copy the shipped warm-start actor into SB3's policy network, folding the normalisation in."""
    from sppo_rl.control.actor_files import WARMSTART_DIR, load_actor_file

    actor = load_actor_file(WARMSTART_DIR / f"{task}.pt")
    mu = actor.norm.mean.float()
    sd = torch.sqrt(actor.norm.var + 1e-8).float()
    first, second, last = actor.body[0], actor.body[2], actor.body[4]
    pi = model.policy.mlp_extractor.policy_net
    with torch.no_grad():
        pi[0].weight.copy_(first.weight / sd)
        pi[0].bias.copy_(first.bias - (first.weight * (mu / sd)).sum(1))
        pi[2].weight.copy_(second.weight)
        pi[2].bias.copy_(second.bias)
        model.policy.action_net.weight.copy_(last.weight)
        model.policy.action_net.bias.copy_(last.bias)
        if not actor.discrete:
            model.policy.log_std.copy_(actor.log_std)


def sb3(
    task: str, num_envs: int, n_steps: int, steps: int, epochs: int, minibatches: int, init: str
) -> float:
    """Stable-Baselines3 PPO env steps per second on ``num_envs`` DummyVecEnv copies of the task."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from sppo_rl.envs.tasks import get_task

    spec = get_task(task)
    env = make_vec_env(lambda: gym.make(spec.env_id), n_envs=num_envs)
    rollout = n_steps * num_envs
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=n_steps,
        batch_size=max(1, rollout // minibatches),
        n_epochs=epochs,
        device="cpu",
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
        verbose=0,
        seed=0,
    )
    if init == "warmstart":
        load_warmstart_into_sb3(model, spec.name)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    dt = time.perf_counter() - t0
    env.close()
    return model.num_timesteps / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["precision-cartpole", "hopper"])
    ap.add_argument("--steps", type=int, default=None, help="env steps per measurement (default per task)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--env-seconds", type=float, default=5.0)
    ap.add_argument("--init", choices=["warmstart", "random"], default="warmstart")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from sppo_rl.envs.tasks import get_task

    budget = {"precision-cartpole": 300_000, "hopper": 80_000}
    results = {}
    for task in args.tasks:
        spec = get_task(task)
        steps = args.steps or budget.get(spec.name, 100_000)
        n = spec.episodes_per_update
        env_sps = env_rate(spec.name, n, args.env_seconds)
        print(f"{spec.name}: raw env steps/s with {n} envs: {env_sps:,.0f}", file=sys.stderr)
        sps, per_update = ours(spec.name, "ppo", steps, args.epochs, args.minibatches, args.init)
        print(
            f"{spec.name}: ours ppo {sps:,.0f} steps/s ({per_update:,.0f} steps per update)", file=sys.stderr
        )
        sppo_sps, _ = ours(spec.name, "sppo", steps, args.epochs, args.minibatches, args.init)
        print(f"{spec.name}: ours sppo {sppo_sps:,.0f} steps/s", file=sys.stderr)
        n_steps = max(2, math.ceil(per_update / n))
        sb3_sps = sb3(spec.name, n, n_steps, steps, args.epochs, args.minibatches, args.init)
        print(f"{spec.name}: sb3 ppo {sb3_sps:,.0f} steps/s ({n} envs x {n_steps} steps)", file=sys.stderr)
        results[spec.name] = {
            "sps": sps,
            "sppo_sps": sppo_sps,
            "sb3_sps": sb3_sps,
            "speedup_vs_sb3": sps / sb3_sps,
            "sppo_speedup_vs_sb3": sppo_sps / sb3_sps,
            "env_sps": env_sps,
            "fraction_of_env_limit": sps / env_sps,
            "sppo_fraction_of_env_limit": sppo_sps / env_sps,
            "num_envs": n,
            "steps_per_update": per_update,
            "env_steps": steps,
            "init": args.init,
        }
    top = results.get("precision-cartpole", next(iter(results.values())))
    print(
        json.dumps(
            {
                **{
                    k: top[k]
                    for k in ("sps", "sb3_sps", "speedup_vs_sb3", "env_sps", "fraction_of_env_limit")
                },
                "tasks": results,
            }
        )
    )


if __name__ == "__main__":
    main()
