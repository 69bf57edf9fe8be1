"""Throughput of seeds as a batch dimension: ``S`` seeds in one process (``sppo-rl control --seeds``).

For each ``S`` in ``--sizes``, a multi-seed run of ``S`` seeds (:class:`~sppo_rl.control.seeds.SeedRuns`)
does ``--updates`` updates; the sizes take turns (A/B alternated, ``--repeats`` rounds, so each size is
timed more than once: the spread of a size's own rounds is its A/A null). Printed per round and size:
``set_sps``, the env steps per second of all ``S`` seeds together (what a CPU-second buys), ``seed_sps``
(``set_sps / S``, one seed's progress), and the seconds of one seed-update spent collecting (the set's
collection over ``S``) and training; then a JSON line with each size's median ``set_sps`` and its ratio
to the first size's.

    python scripts/bench_seeds.py --sizes 1 4 16 --updates 3 --repeats 2

``--train-pass``: instead, the choice of ``sppo_rl.control.stack`` (training seed by seed): one training
pass (forward and backward of a 4-64-64-2 actor's log-probs and entropy and of a step critic's values)
over ``--sizes[-1]`` seeds' minibatches of each of ``--rows`` rows per seed, stacked (``torch.baddbmm`` over
weights ``torch.stack``-ed from the seeds' own; every seed has the same rows, so nothing is padded) against
seed by seed (each seed's own ``Actor.logp_entropy`` and ``StepCritic``), alternated; milliseconds per pass
of all seeds, one number per round. ``--padding``: which of ``--rows`` rows' gradients change when zero-
gradient rows are padded after them (why a stacked update of seeds with different row counts is not exact).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sppo_rl.control.config import ControlConfig
from sppo_rl.control.seeds import SeedRuns
from sppo_rl.control.trainer import ControlRun


def one(size: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    cfg = ControlConfig(
        task=args.task,
        algo=args.algo,
        seeds=f"0-{size - 1}",
        total_episodes=10**6,
        out_dir=str(root / f"s{size}-{time.monotonic_ns()}"),
        progress=False,
        tensorboard=False,
        eval_episodes=0,
        checkpoint_every=10**6,
        init_from=args.init_from,
    )
    run = SeedRuns(cfg, ControlRun)
    try:
        steps, seconds, collect, before = 0, 0.0, 0.0, 0
        for _ in range(args.updates):
            t0 = time.perf_counter()
            row = run.update()
            dt = time.perf_counter() - t0
            steps, seconds, before = steps + row["env_steps"] - before, seconds + dt, row["env_steps"]
            collect += row["seed_rows"][0]["collect_frac"] * dt
    finally:
        run.close()
    return {
        "set_sps": steps / seconds,
        "seed_sps": steps / seconds / size,
        "collect_s_per_seed_update": collect / args.updates / size,
        "train_s_per_seed_update": (seconds - collect) / args.updates / size,
    }


def _stacked_body(bodies: list[torch.nn.Sequential], x: torch.Tensor) -> torch.Tensor:
    """``x [S, M, in]`` through the seeds' MLPs as one stack of their own (differentiable) weights."""
    linears = [[m for m in b if isinstance(m, torch.nn.Linear)] for b in bodies]
    for i in range(len(linears[0])):
        w = torch.stack([ls[i].weight for ls in linears])
        b = torch.stack([ls[i].bias for ls in linears])
        x = torch.baddbmm(b[:, None], x, w.transpose(1, 2))
        if i < len(linears[0]) - 1:
            x = torch.tanh(x)
    return x


def train_pass(args: argparse.Namespace) -> None:
    from sppo_rl.agents.losses import entropy_from_logits
    from sppo_rl.control.networks import Actor, StepCritic

    S = args.sizes[-1]
    actors = [Actor(4, 2, True) for _ in range(S)]
    critics = [StepCritic(4, norm=a.norm) for a in actors]

    def data(m: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [torch.randn(m, 4) for _ in range(S)], [torch.randint(0, 2, (m,)) for _ in range(S)]

    def loop(m: int) -> None:
        obs, act = data(m)
        for a, c, o, x in zip(actors, critics, obs, act):
            lp, ent = a.logp_entropy(o, x)
            (lp.sum() + ent.sum()).backward()
            (c(o) ** 2).sum().backward()

    def stacked(m: int) -> None:
        obs, act = data(m)
        x = torch.stack([a.norm(o) for a, o in zip(actors, obs)])
        out = _stacked_body([a.body for a in actors], x)
        logp = torch.log_softmax(out, -1).gather(-1, torch.stack(act)[..., None])[..., 0]
        (logp.sum() + entropy_from_logits(out).sum()).backward()
        v = _stacked_body([c.body for c in critics], x)[..., 0]
        (v**2).sum().backward()

    for m in args.rows:
        times: dict[str, list[float]] = {"stacked": [], "seed by seed": []}
        for _ in range(args.repeats):
            for name, f in (("stacked", stacked), ("seed by seed", loop)):
                t0 = time.perf_counter()
                for _ in range(5):
                    f(m)
                times[name].append((time.perf_counter() - t0) / 5 * 1e3)
        print(
            json.dumps(
                {"rows_per_seed": m, "seeds": S, **{k: [round(t, 1) for t in v] for k, v in times.items()}}
            )
        )


def padding(args: argparse.Namespace) -> None:
    """Whether a ``baddbmm`` layer's weight and bias gradients over ``M`` rows stay the same, bit for bit,
    with ``P`` zero-gradient rows padded after them (what an exact stacked update of seeds with different
    row counts would need)."""
    g = torch.Generator().manual_seed(0)

    def grads(x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.zeros(1, dy.shape[-1], x.shape[-1], requires_grad=True)
        b = torch.zeros(1, dy.shape[-1], requires_grad=True)
        torch.baddbmm(b[:, None], x, w.transpose(1, 2)).backward(dy)
        assert w.grad is not None and b.grad is not None
        return w.grad, b.grad

    for d_in, d_out in ((4, 64), (64, 64), (64, 2)):
        changed = []
        for m in args.rows:
            for pad in (1, 7, 64, 700):
                x, dy = torch.randn(1, m, d_in, generator=g), torch.randn(1, m, d_out, generator=g)
                w, b = grads(x, dy)
                xp = torch.cat([x, torch.randn(1, pad, d_in, generator=g)], 1)
                wp, bp = grads(xp, torch.cat([dy, torch.zeros(1, pad, d_out)], 1))
                if not (torch.equal(w, wp) and torch.equal(b, bp)):
                    changed.append(
                        {"rows": m, "pad": pad, "weight": torch.equal(w, wp), "bias": torch.equal(b, bp)}
                    )
        print(json.dumps({"layer": f"{d_in}->{d_out}", "changed_by_padding": changed}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--task", default="precision-cartpole")
    p.add_argument("--algo", default="ppo")
    p.add_argument("--init-from", default="auto")
    p.add_argument("--train-pass", action="store_true")
    p.add_argument("--rows", type=int, nargs="+", default=[200, 800, 3200])
    p.add_argument("--padding", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.train_pass:
        train_pass(args)
        return
    if args.padding:
        padding(args)
        return
    results: dict[int, list[dict[str, float]]] = {s: [] for s in args.sizes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for size in args.sizes if r % 2 == 0 else reversed(args.sizes):
                m = one(size, args, Path(tmp))
                results[size].append(m)
                print(
                    f"round {r} S={size:3d}: " + ", ".join(f"{k} {v:.4g}" for k, v in m.items()), flush=True
                )
    base = statistics.median(m["set_sps"] for m in results[args.sizes[0]])
    out = {
        str(s): {
            "set_sps": statistics.median(m["set_sps"] for m in ms),
            "rounds": [round(m["set_sps"]) for m in ms],
            "ratio_to_first": statistics.median(m["set_sps"] for m in ms) / base,
        }
        for s, ms in results.items()
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
