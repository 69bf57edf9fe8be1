"""Training throughput against the peers: this project's PPO, Stable-Baselines3's PPO, CleanRL's ``ppo.py``
and rejax's PPO (JAX), on identical settings, per core, A/B alternated, with the A/A null and the floor.

Identical settings (:class:`Setting`, one object read by every implementation; a test checks each gets
the same numbers): separate actor and critic of 2 x 64 tanh units, 64 envs, 4 epochs x 4 minibatches,
one torch thread, the whole run pinned to one core (``--cpu``, default the first this process may use;
``os.sched_setaffinity``, which the subprocesses inherit). Two settings:

- ``stock``: stock ``CartPole-v1`` for all, from scratch. Ours: ``sppo-rl control --task CartPole-v1
  --dense --init-from none`` with 64 episodes per update, each run to its end (at most 500 steps; the id
  runs on the project's batched NumPy CartPole, the same episodes as ``gymnasium.make``); the peers
  collect 64 envs x 500 steps per update on their own env of the id: SB3 a ``DummyVecEnv`` of
  ``gymnasium.make``, CleanRL its ``SyncVectorEnv``, rejax gymnax's JAX CartPole-v1;
- ``batched``: each on its fastest env: ours the batched PrecisionCartPole (H = 200) from its shipped
  warm start (full-length episodes), the peers stock CartPole-v1 with 64 x 200 steps per update.

Speed is env steps per CPU-second of training (``time.process_time`` of the process that trains;
rejax's over its compiled program, compile timed apart; CleanRL's own ``SPS:`` line with its clock read
as CPU time, ``scripts/peer_cleanrl.py``). CPU seconds, not wall seconds: on a shared machine a
process waiting for its core does not count. ``--rounds`` rounds; each times ours first and last (A and
B: the same code twice) and the peers between them, in an order rotated every round. Printed per peer:
its steps/s (median [min-max] over rounds), ``ours / peer`` = ``sqrt(A B) / peer`` per round (median
[min-max]) beside the A/A interval ``[min A/B, max A/B]`` (the spread of our own code timed twice), and
each implementation's fraction of the floor.

The floor (:func:`floor_pieces`, timed in every round, each piece's fastest round kept): the same work's
pieces timed alone in torch, per env step: one batched env step of the 64 envs (ours), the actor's
forward and sample and the critic's forward on 64 rows, each / 64, plus 4 epochs of 4 minibatches of
forward + backward + Adam over one update's rollout (64 x ``n_steps`` rows) / its rows.
``fraction of floor = steps/s x floor seconds per step``.

``--plain-env`` adds ``ours-plain`` (setting ``stock``): ours on ``gymnasium.make`` copies of the id,
each stepped with every wrapper and check (:func:`plain_episode_env`), the path the fast ones replace.
``--compile`` adds ``ours-compiled``: ours with ``--compile on`` (:mod:`sppo_rl.control.compiled`),
compiled once by an untimed warm-up run before the rounds (its CPU seconds beyond a compiled run's printed
apart, as rejax's compile); ours A and B are eager. ``--ours-seeds S`` (default 16) adds ``oursS`` (and
``oursS-compiled``): ``S`` seeds in one process (``--seeds``), ``--seeds-steps`` env steps each, their
steps/s summed and per seed, and per round the per-seed ratio to rejax's ``--rejax-seeds`` vmapped seeds.

Peers that are not in this environment: rejax runs in ``--rejax-python`` (``make bench-peers`` builds
``.venv-rejax`` from ``requirements/rejax.txt``; skipped when absent), once with one seed and once with
``--rejax-seeds`` seeds vmapped in one program (their steps/s summed, and per seed); CleanRL runs from
``--cleanrl PATH``, the path of CleanRL's ``ppo.py`` (not shipped here; skipped without it).

    taskset -c 0 python scripts/bench_throughput.py --rejax-python .venv-rejax/bin/python \\
        --cleanrl ~/cleanrl/cleanrl/ppo.py --rounds 3
    make bench-peers CLEANRL_PPO=~/cleanrl/cleanrl/ppo.py

Last line: JSON with every measurement and summary per setting.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Setting:
    """The work every implementation does (peers: ``num_envs`` x ``n_steps`` env steps per update)."""

    name: str
    ours_task: str
    ours_dense: bool
    ours_init: str  # "none" (from scratch) or "auto" (the task's shipped warm start)
    env_id: str = "CartPole-v1"
    num_envs: int = 64
    n_steps: int = 500
    epochs: int = 4
    minibatches: int = 4
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"

    @property
    def rollout(self) -> int:
        """Env steps of one peer update."""
        return self.num_envs * self.n_steps


SETTINGS = {
    "stock": Setting("stock", ours_task="CartPole-v1", ours_dense=True, ours_init="none"),
    "batched": Setting(
        "batched", ours_task="precision-cartpole", ours_dense=False, ours_init="auto", n_steps=200
    ),
}


# ----------------------------------------------------------------------------- settings of each one


def ours_config(s: Setting, out_dir: str, compile: str = "off") -> dict:
    """``ControlConfig`` fields of our PPO on ``s`` (``compile``: ``--compile``; the reference is eager)."""
    return dict(
        compile=compile,
        algo="ppo",
        task=s.ours_task,
        dense=s.ours_dense,
        init_from=s.ours_init,
        episodes_per_update=s.num_envs,
        hidden_sizes=s.hidden,
        activation=s.activation,
        epochs=s.epochs,
        minibatches=s.minibatches,
        threads=1,
        out_dir=out_dir,
        progress=False,
        tensorboard=False,
        eval_episodes=0,
        total_episodes=10**9,
        checkpoint_every=10**9,
    )


def sb3_kwargs(s: Setting) -> dict:
    """``stable_baselines3.PPO`` arguments on ``s`` (besides the policy name and the env)."""
    return dict(
        n_steps=s.n_steps,
        batch_size=s.rollout // s.minibatches,
        n_epochs=s.epochs,
        device="cpu",
        policy_kwargs=dict(
            net_arch=dict(pi=list(s.hidden), vf=list(s.hidden)),
            activation_fn={"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[s.activation],
        ),
        verbose=0,
        seed=0,
    )


def cleanrl_args(s: Setting, steps: int) -> list[str]:
    """CleanRL ``ppo.py`` arguments on ``s`` (its networks are 2 x 64 tanh, separate, by construction)."""
    if s.hidden != (64, 64) or s.activation != "tanh":
        raise ValueError("CleanRL's ppo.py has 2 x 64 tanh networks only")
    return [
        "--env-id", s.env_id, "--num-envs", str(s.num_envs), "--num-steps", str(s.n_steps),
        "--num-minibatches", str(s.minibatches), "--update-epochs", str(s.epochs),
        "--total-timesteps", str(steps), "--no-cuda",
    ]  # fmt: skip


def rejax_args(s: Setting, iterations: int, seeds: int) -> list[str]:
    """``scripts/peer_rejax.py`` arguments on ``s``."""
    return [
        "--env", s.env_id, "--num-envs", str(s.num_envs), "--num-steps", str(s.n_steps),
        "--epochs", str(s.epochs), "--minibatches", str(s.minibatches),
        "--hidden", *map(str, s.hidden), "--activation", s.activation,
        "--iterations", str(iterations), "--seeds", str(seeds),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- the maths


def aa_interval(a: list[float], b: list[float]) -> tuple[float, float]:
    """``[min, max]`` over rounds of ``A / B``: our code timed twice in each round."""
    r = [x / y for x, y in zip(a, b, strict=True)]
    return min(r), max(r)


def ratio_interval(a: list[float], b: list[float], peer: list[float]) -> tuple[float, float, float]:
    """``ours / peer`` per round, ours = ``sqrt(A B)`` (the round's two timings of ours): (median, min, max)."""
    r = [math.sqrt(x * y) / p for x, y, p in zip(a, b, peer, strict=True)]
    return statistics.median(r), min(r), max(r)


def floor_seconds_per_step(pieces: dict[str, float], num_envs: int, rollout: int) -> float:
    """Seconds per env step of the floor: ``env + actor + critic`` (seconds per batched call of
    ``num_envs`` rows) ``/ num_envs + update`` (seconds for all epochs over the rollout) ``/ rollout``."""
    return (pieces["env"] + pieces["actor"] + pieces["critic"]) / num_envs + pieces["update"] / rollout


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}-{max(xs):,.0f}]"


# ----------------------------------------------------------------------------- the implementations


def ours(s: Setting, steps: int, plain: bool = False, compile: str = "off", seeds: int = 1) -> dict:
    """Our PPO: env steps per CPU-second (and per wall second) of ``update`` calls; ``plain``: on
    :func:`plain_episode_env` instead of the task's own episode env; ``compile``: ``--compile`` (the
    process compiles once: a warm-up run before the rounds); ``seeds > 1``: ``--seeds 0-(seeds-1)`` in
    one process (:class:`~sppo_rl.control.seeds.SeedRuns`), ``steps`` per seed, steps/s summed and per seed."""
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.seeds import SeedRuns
    from sppo_rl.control.trainer import ControlRun

    with tempfile.TemporaryDirectory() as d:
        cfg = ControlConfig(**ours_config(s, d, compile), seeds=f"0-{seeds - 1}" if seeds > 1 else None)
        run = SeedRuns(cfg, ControlRun) if seeds > 1 else ControlRun(cfg)
        runs = run.runs if seeds > 1 else [run]
        if plain:
            run.env.close()
            run.env = plain_episode_env(s.ours_task, s.num_envs, s.ours_dense)
        updates, c0, w0 = 0, time.process_time(), time.perf_counter()
        while runs[0].state.env_steps < steps:
            run.update()
            updates += 1
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        n = sum(r.state.env_steps for r in runs)
        if seeds > 1:
            run.close()
        else:
            run.logger.close()
            run.env.close()
    out = {"sps_cpu": n / cpu, "sps_wall": n / wall, "env_steps": n, "updates": updates, "cpu_s": cpu}
    return {**out, "per_seed_sps_cpu": n / cpu / seeds, "seeds": seeds} if seeds > 1 else out


def plain_episode_env(env_id: str, num_envs: int, dense: bool):
    """The episode vector env of a Gymnasium id as it runs without the fast paths of
    :mod:`sppo_rl.envs.stock`: ``num_envs`` copies of ``gymnasium.make(env_id)`` (every wrapper on), each
    stepped through its own checked ``step``. The same episodes (``tests/test_envs_stock.py``)."""
    import gymnasium as gym

    from sppo_rl.envs.custom import SparseOutcomeVectorEnv
    from sppo_rl.envs.stock import stock_success

    class Plain(SparseOutcomeVectorEnv):
        def step(self, actions):
            a, n = self._actions(actions), self.num_envs
            rewards, ended = np.zeros(n), np.zeros(n, dtype=bool)
            for i in np.flatnonzero(~self._done):
                obs, rewards[i], term, _, info = self.envs[i].step(a[i])
                self._obs[i], self._t[i] = obs, self._t[i] + 1
                if term:
                    ended[i] = self._done[i] = True
                    self._success[i], self._failed[i] = info["success"], info["failed"]
            return self._obs.copy(), rewards, self._done.copy(), np.zeros(n, dtype=bool), self._info(ended)

    env = Plain(env_id, stock_success(env_id)[0], num_envs=num_envs, dense=dense)
    for copy in env.envs:
        copy.base = gym.make(env_id)
    return env


def sb3(s: Setting, steps: int) -> dict:
    """Stable-Baselines3's PPO on a ``DummyVecEnv`` of ``num_envs`` ``gymnasium.make(env_id)``."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(lambda: gym.make(s.env_id), n_envs=s.num_envs)
    model = PPO("MlpPolicy", env, **sb3_kwargs(s))
    c0, w0 = time.process_time(), time.perf_counter()
    model.learn(total_timesteps=steps)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    env.close()
    return {"sps_cpu": model.num_timesteps / cpu, "sps_wall": model.num_timesteps / wall}


def cleanrl(s: Setting, steps: int, path: str) -> dict:
    """CleanRL's ``ppo.py`` at ``path`` through ``scripts/peer_cleanrl.py``, in a scratch folder."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, str(HERE / "peer_cleanrl.py"), "--ppo", path, "--", *cleanrl_args(s, steps)]
        out = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=_one_thread())
    if out.returncode != 0:
        raise RuntimeError(f"CleanRL failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _one_thread() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}


class Rejax:
    """A ``scripts/peer_rejax.py --serve`` process: compiled once, then one timed run per :meth:`run`."""

    def __init__(self, python: str, s: Setting, iterations: int, seeds: int) -> None:
        cmd = [python, str(HERE / "peer_rejax.py"), *rejax_args(s, iterations, seeds), "--serve"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_one_thread()
        )
        self.ready = self._read()  # compile_s

    def _read(self) -> dict:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"rejax exited with {self.proc.wait()}")
        return json.loads(line)

    def run(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


# ----------------------------------------------------------------------------- the floor


def _best(fn, calls: int, repeats: int = 5) -> float:
    """Fewest CPU seconds per call of ``fn`` over ``repeats`` timings of ``calls`` calls."""
    best = math.inf
    for _ in range(repeats):
        c0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - c0) / calls)
    return best


def floor_pieces(s: Setting, obs_dim: int = 5, actions: int = 2) -> dict[str, float]:
    """CPU seconds of each piece alone (see the module docstring): ``env`` (one batched step of our
    stock CartPole, 64 envs), ``actor`` (forward, softmax sample, log-prob on 64 rows), ``critic``
    (forward on 64 rows), ``update`` (``epochs`` x ``minibatches`` of forward + backward + Adam of both
    networks over the rollout's rows, the PPO clipped loss and the value loss)."""
    from sppo_rl.envs.tasks import make_episode_env

    torch.manual_seed(0)
    n = s.num_envs

    def mlp(out: int) -> torch.nn.Sequential:
        layers, d = [], obs_dim
        for h in s.hidden:
            layers += [torch.nn.Linear(d, h), torch.nn.Tanh()]
            d = h
        return torch.nn.Sequential(*layers, torch.nn.Linear(d, out))

    actor, critic = mlp(actions), mlp(1)
    env = make_episode_env("CartPole-v1", num_envs=n)
    env.reset(seed=0)
    alternate = [np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)]
    k = [0]

    def env_step():
        k[0] += 1
        _, _, done, _, _ = env.step(alternate[k[0] % 2])
        if done.all():
            env.reset(seed=k[0])

    x = torch.randn(n, obs_dim)

    @torch.no_grad()
    def act():
        logp = torch.log_softmax(actor(x), -1)
        a = torch.multinomial(logp.exp(), 1)
        return logp.gather(1, a)

    @torch.no_grad()
    def value():
        return critic(x)

    B = s.rollout
    obs, act_b = torch.randn(B, obs_dim), torch.randint(0, actions, (B, 1))
    old_logp, adv, ret = -torch.rand(B, 1), torch.randn(B, 1), torch.randn(B, 1)
    opt_a, opt_c = torch.optim.Adam(actor.parameters(), 3e-4), torch.optim.Adam(critic.parameters(), 1e-3)
    mb = B // s.minibatches

    def update():
        for _ in range(s.epochs):
            perm = torch.randperm(B)
            for j in range(s.minibatches):
                i = perm[j * mb : (j + 1) * mb]
                logp = torch.log_softmax(actor(obs[i]), -1).gather(1, act_b[i])
                ratio = torch.exp(logp - old_logp[i])
                pg = -torch.min(ratio * adv[i], ratio.clamp(0.8, 1.2) * adv[i]).mean()
                vf = (critic(obs[i]) - ret[i]).pow(2).mean()
                opt_a.zero_grad()
                opt_c.zero_grad()
                (pg + vf).backward()
                opt_a.step()
                opt_c.step()

    pieces = {
        "env": _best(env_step, 400),
        "actor": _best(act, 400),
        "critic": _best(value, 400),
        "update": _best(update, 1, repeats=3),
    }
    env.close()
    return pieces


# ----------------------------------------------------------------------------- main


def measure(s: Setting, args, rejax_procs: dict[str, Rejax]) -> dict:
    """``args.rounds`` rounds of ours (A), the peers in a rotated order, ours (B)."""
    peers: dict[str, object] = {"sb3": lambda: sb3(s, args.steps)}
    if args.plain_env and s.ours_task == s.env_id:
        peers["ours-plain"] = lambda: ours(s, args.steps, plain=True)
    if args.compile:
        warm = ours(s, args.steps, compile="on")  # compiles (once per process), untimed
        peers["ours-compiled"] = lambda: {**ours(s, args.steps, compile="on"), "warmup_cpu_s": warm["cpu_s"]}
    if args.ours_seeds > 1:
        n, steps = args.ours_seeds, args.seeds_steps or args.steps // 4
        peers[f"ours{n}"] = lambda: ours(s, steps, seeds=n)
        if args.compile:
            ours(s, steps, compile="on", seeds=n)  # a stack of n seeds compiles its own acting, untimed
            peers[f"ours{n}-compiled"] = lambda: ours(s, steps, compile="on", seeds=n)
    if args.cleanrl:
        peers["cleanrl"] = lambda: cleanrl(s, args.steps, args.cleanrl)
    for name, proc in rejax_procs.items():
        peers[name] = proc.run
    names = list(peers)
    runs: dict[str, list[dict]] = {"ours_a": [], "ours_b": [], "floor": [], **{k: [] for k in names}}
    for r in range(args.rounds):
        runs["floor"].append(floor_pieces(s))
        order = names[r % len(names) :] + names[: r % len(names)] if names else []
        runs["ours_a"].append(ours(s, args.steps))
        print(f"[{s.name} round {r + 1}] ours A: {runs['ours_a'][-1]['sps_cpu']:,.0f}", file=sys.stderr)
        for k in order:
            runs[k].append(peers[k]())
            print(f"[{s.name} round {r + 1}] {k}: {runs[k][-1]['sps_cpu']:,.0f}", file=sys.stderr)
        runs["ours_b"].append(ours(s, args.steps))
        print(f"[{s.name} round {r + 1}] ours B: {runs['ours_b'][-1]['sps_cpu']:,.0f}", file=sys.stderr)
    return runs


def summarise(s: Setting, runs: dict[str, list[dict]], floor_s: float) -> dict:
    a = [x["sps_cpu"] for x in runs["ours_a"]]
    b = [x["sps_cpu"] for x in runs["ours_b"]]
    aa = aa_interval(a, b)
    both = a + b
    out = {
        "ours": {"sps_cpu": statistics.median(both), "fraction_of_floor": statistics.median(both) * floor_s}
    }
    print(f"\n{s.name}: {s}")
    print(
        f"  floor {1 / floor_s:,.0f} steps/s ({floor_s * 1e6:.2f} us per step); A/A [{aa[0]:.2f}-{aa[1]:.2f}]"
    )
    print(f"  ours     {spread(both)} steps/CPU-s, {statistics.median(both) * floor_s:.2f} of the floor")
    for k, xs in runs.items():
        if k in ("ours_a", "ours_b", "floor"):
            continue
        peer = [x["sps_cpu"] for x in xs]
        med, lo, hi = ratio_interval(a, b, peer)
        out[k] = {
            "sps_cpu": statistics.median(peer),
            "ours_over_peer": [med, lo, hi],
            "fraction_of_floor": statistics.median(peer) * floor_s,
        }
        extra, label = "", k
        if "warmup_cpu_s" in xs[0]:  # the warm-up run's CPU seconds beyond a compiled run's
            compile_s = xs[0]["warmup_cpu_s"] - xs[0]["env_steps"] / statistics.median(peer)
            out[k]["compile_s"] = compile_s
            extra = f" (compiled in {compile_s:.1f} CPU-s)"
        if "per_seed_sps_cpu" in xs[0]:
            per_seed = statistics.median(x["per_seed_sps_cpu"] for x in xs)
            out[k]["per_seed_sps_cpu"] = per_seed
            compiled = f"; compiled in {xs[0]['compile_s']:.0f} s" if "compile_s" in xs[0] else ""
            out[k]["compile_s"] = xs[0].get("compile_s")
            extra = f" (compiled in {xs[0]['compile_s']:.0f} s)" if compiled else ""
            if xs[0]["seeds"] > 1:
                extra = f" (all {xs[0]['seeds']} seeds; per seed {per_seed:,.0f}{compiled})"
                label = f"{k} (all seeds)"
        print(
            f"  {k:<8} {spread(peer)} steps/CPU-s{extra}, {out[k]['fraction_of_floor']:.2f} of the floor; "
            f"ours (1 seed)/{label} {med:.2f} [{lo:.2f}-{hi:.2f}] (A/A [{aa[0]:.2f}-{aa[1]:.2f}])"
        )
    for k in [k for k in runs if k.startswith("ours") and runs[k] and runs[k][0].get("seeds", 1) > 1]:
        for peer in [p for p in runs if p.startswith("rejax") and runs[p] and runs[p][0].get("seeds", 1) > 1]:
            r = [x["per_seed_sps_cpu"] / y["per_seed_sps_cpu"] for x, y in zip(runs[k], runs[peer])]
            out[k][f"per_seed_over_{peer}"] = [statistics.median(r), min(r), max(r)]
            print(
                f"  per seed: {k} / {peer} {statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}] (per round)"
            )
    out["aa"] = list(aa)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=["stock"])
    ap.add_argument("--steps", type=int, default=128_000, help="env steps per timing of ours, SB3, CleanRL")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="the core to run on (default: the first allowed; -1: no pinning)",
    )
    ap.add_argument("--rejax-python", default=None, help="python of the rejax venv (default .venv-rejax)")
    ap.add_argument("--rejax-seeds", type=int, default=16)
    ap.add_argument(
        "--plain-env",
        action="store_true",
        help="also time ours on gymnasium.make copies of the stock id (no fast path) as a peer: ours-plain",
    )
    ap.add_argument("--cleanrl", default=None, help="path of CleanRL's ppo.py (not shipped; skipped without)")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also time ours with --compile on as a peer: ours-compiled (ours A and B stay eager)",
    )
    ap.add_argument(
        "--ours-seeds",
        type=int,
        default=16,
        help="also time ours with this many seeds in one process (--seeds; 1: not), beside rejax's vmapped seeds",
    )
    ap.add_argument(
        "--seeds-steps", type=int, default=None, help="env steps per seed of that run (default --steps / 4)"
    )
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and args.cpu != -1:
        allowed = os.sched_getaffinity(0)
        cpu = min(allowed) if args.cpu is None else args.cpu
        if cpu not in allowed:
            ap.error(f"--cpu {cpu}: this process may run on cores {sorted(allowed)} only")
        os.sched_setaffinity(0, {cpu})  # the peers' subprocesses inherit it
    torch.set_num_threads(1)
    rejax_python = args.rejax_python or str(Path(".venv-rejax/bin/python"))
    if not Path(rejax_python).exists():
        print(f"rejax skipped: no {rejax_python} (make bench-peers builds it)", file=sys.stderr)
        rejax_python = None
    if not args.cleanrl:
        print("CleanRL skipped: pass --cleanrl PATH/TO/cleanrl/ppo.py", file=sys.stderr)
    results = {}
    for name in args.settings:
        s = SETTINGS[name]
        procs: dict[str, Rejax] = {}
        if rejax_python:
            iters = max(1, args.steps // s.rollout)
            procs["rejax"] = Rejax(rejax_python, s, iters, 1)
            procs[f"rejax{args.rejax_seeds}"] = Rejax(rejax_python, s, max(1, iters // 2), args.rejax_seeds)
        try:
            runs = measure(s, args, procs)
        finally:
            for p in procs.values():
                p.close()
        pieces = {k: min(f[k] for f in runs["floor"]) for k in runs["floor"][0]}  # each piece's best round
        floor_s = floor_seconds_per_step(pieces, s.num_envs, s.rollout)
        results[name] = {
            "setting": asdict(s),
            "floor_pieces_s": pieces,
            "floor_s_per_step": floor_s,
            "summary": summarise(s, runs, floor_s),
            "runs": runs,
        }
    print(json.dumps(results))


def load_warmstart_into_sb3(model, task: str) -> None:
    """Copy the shipped warm-start actor into SB3's policy network, folding the normalisation in
    (``W' = W / sd``, ``b' = b - W mu / sd``); used by ``scripts/peer_sb3.py``."""
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


if __name__ == "__main__":
    main()
