"""Raw environment throughput of the control testbed: env-steps per second, random actions.

For each task: the single environment (``gymnasium.make``, reset whenever an episode ends) and the
episode vector env (``make_episode_env``) at a few sizes ``N``, where ended sub-envs are revived at once
through ``reset(options={"reset_mask": ...})`` so every call steps ``N`` live episodes. Actions are
drawn up front, so the numbers measure the environments, not the sampler. Prints a table, then one
JSON line (the last line) with every number.

    python scripts/bench_envs.py --seconds 1 --num-envs 8 64 --tasks cartpole hopper
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import gymnasium as gym
import numpy as np

from sppo_rl.envs.tasks import TASKS, TaskSpec, make_episode_env


def _actions(spec: TaskSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if spec.discrete:
        return rng.integers(0, spec.action_dim, size=shape, dtype=np.int64)
    low, high = spec.action_low, spec.action_high
    return rng.uniform(low, high, size=(*shape, spec.action_dim)).astype(np.float32)


def bench_single(spec: TaskSpec, seconds: float, seed: int = 0) -> float:
    """Env-steps per second of ``gymnasium.make(spec.env_id)``."""
    env = gym.make(spec.env_id)
    pool = _actions(spec, (4096,), np.random.default_rng(seed))
    env.reset(seed=seed)
    steps, episodes = 0, 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(256):
            _, _, term, trunc, _ = env.step(pool[steps % len(pool)])
            steps += 1
            if term or trunc:
                episodes += 1
                env.reset(seed=seed + episodes)
        if time.perf_counter() >= deadline:
            break
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def bench_vector(spec: TaskSpec, num_envs: int, seconds: float, seed: int = 0) -> float:
    """Env-steps per second of ``make_episode_env(spec, num_envs)`` with every sub-env kept live."""
    env = make_episode_env(spec.name, num_envs=num_envs)
    pool = _actions(spec, (64, num_envs), np.random.default_rng(seed))
    env.reset(seed=seed)
    steps, calls, resets = 0, 0, 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(16):
            _, _, term, _, _ = env.step(pool[calls % len(pool)])
            calls += 1
            steps += num_envs
            if term.any():
                resets += 1
                env.reset(seed=seed + resets * num_envs, options={"reset_mask": term})
        if time.perf_counter() >= deadline:
            break
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget of each measurement")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64], help="vector sizes N")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help="short names (default: all)")
    args = parser.parse_args(argv)
    specs = [TASKS[name] for name in args.tasks]

    results: dict[str, dict[str, float | str]] = {}
    header = f"{'task':24s} {'backend':8s} {'single':>10s}" + "".join(
        f" {'N=' + str(n):>10s}" for n in args.num_envs
    )
    print(header)
    print("-" * len(header))
    for spec in specs:
        row: dict[str, float | str] = {"backend": spec.backend, "single": bench_single(spec, args.seconds)}
        for n in args.num_envs:
            row[f"vec{n}"] = bench_vector(spec, n, args.seconds)
        results[spec.name] = row
        cells = "".join(f" {row[f'vec{n}']:10.0f}" for n in args.num_envs)
        print(f"{spec.name:24s} {spec.backend:8s} {row['single']:10.0f}{cells}", flush=True)
    report = {
        "unit": "env-steps/s",
        "seconds": args.seconds,
        "num_envs": args.num_envs,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "results": results,
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
