"""Throughput peer: rejax's PPO (JAX; rollout and update in one jitted program) on gymnax's CartPole-v1.

Runs in its own virtual environment (``make bench-peers`` builds ``.venv-rejax``: rejax 0.1.3, gymnax
0.0.9, jax for the CPU), launched by ``scripts/bench_throughput.py``; it imports nothing of this project.
Same work as the other implementations there: separate actor and critic of ``--hidden`` units (tanh),
``--num-envs`` envs x ``--num-steps`` steps per iteration, ``--epochs`` epochs of ``--minibatches``
minibatches. Timed: ``--iterations`` of rejax's own ``train_iteration`` (rollout, GAE, update) in one
``jax.lax.fori_loop``, compiled first (the compile is timed apart), then run ``--repeats`` times; no
evaluation runs inside (rejax's ``train`` would evaluate 128 episodes every ``eval_freq`` steps).
``--seeds S > 1`` vmaps the program over S seeds (S independent agents in one program).

Prints one JSON line, the fastest of ``--repeats`` runs: ``compile_s``, ``cpu_s`` (this process's CPU
seconds over the run, all threads) and ``wall_s``, ``env_steps`` (over all seeds), ``sps_cpu`` /
``sps_wall`` and ``per_seed_sps_cpu`` (= ``sps_cpu / S``). ``--serve``: a line ``{"compile_s": ...}``
once compiled, then such a line per ``run`` line read on stdin (the benchmark alternates it with the
others without compiling again).

    .venv-rejax/bin/python scripts/peer_rejax.py --iterations 4 --seeds 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--num-envs", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    ap.add_argument("--activation", default="tanh")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--serve", action="store_true", help="time one run per 'run' line read on stdin")
    args = ap.parse_args()

    import jax
    from rejax import PPO

    algo = PPO.create(
        env=args.env,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        num_epochs=args.epochs,
        num_minibatches=args.minibatches,
        total_timesteps=args.num_envs * args.num_steps * args.iterations,
        skip_initial_evaluation=True,
        agent_kwargs={"hidden_layer_sizes": tuple(args.hidden), "activation": args.activation},
    )

    def run(rng):
        ts = algo.init_state(rng)
        return jax.lax.fori_loop(0, args.iterations, lambda _, s: algo.train_iteration(s), ts)  # all of it

    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    fn = jax.jit(jax.vmap(run)) if args.seeds > 1 else jax.jit(run)
    arg = keys if args.seeds > 1 else keys[0]
    w0 = time.perf_counter()
    compiled = fn.lower(arg).compile()
    compile_s = time.perf_counter() - w0
    steps = args.num_envs * args.num_steps * args.iterations * args.seeds

    def timed() -> dict:
        c0, w0 = time.process_time(), time.perf_counter()
        jax.block_until_ready(compiled(arg))
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        return {
            "impl": "rejax",
            "seeds": args.seeds,
            "compile_s": compile_s,
            "env_steps": steps,
            "cpu_s": cpu,
            "wall_s": wall,
            "sps_cpu": steps / cpu,
            "sps_wall": steps / wall,
            "per_seed_sps_cpu": steps / cpu / args.seeds,
            "versions": {"jax": jax.__version__},
        }

    if args.serve:  # one line when compiled, then one timed run per "run" line on stdin
        print(json.dumps({"impl": "rejax", "compile_s": compile_s}), flush=True)
        for line in sys.stdin:
            if line.strip() == "run":
                print(json.dumps(timed()), flush=True)
        return
    runs = [timed() for _ in range(args.repeats)]
    print(json.dumps(min(runs, key=lambda r: r["cpu_s"])))


if __name__ == "__main__":
    main()
