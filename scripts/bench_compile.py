"""What ``--compile`` is made of, chosen by measurement: the control PPO update's floor work under each
candidate, and ``tanh`` per element.

The work is :func:`bench_throughput.floor_pieces`'s update (separate 2 x 64 actor and critic, 4 epochs x 4
minibatches over ``--rows`` rows of 5 inputs, the clipped loss and the value loss, Adam), one thread. The
candidates, each a fresh copy of the same networks:

- ``eager``: plain torch (the floor of ``bench_throughput``);
- ``fused-adam``: Adam's fused kernel;
- ``compiled-loss``: the loss function (both networks' forward, both losses) through ``torch.compile``
  with torch's own ``tanh``, and fused Adam;
- ``rational-op``: ``tanh`` by :class:`~sppo_rl.control.networks.RationalTanh` (its forward and backward each
  one compiled op), the rest eager, fused Adam;
- ``compiled-loss-rational``: the loss compiled with :class:`RationalTanh` inside (what ``--compile on``
  does to the learner's passes), fused Adam.

Each candidate runs once to compile (its CPU seconds printed), then ``--rounds`` rounds, the candidates in
a rotated order; printed: the fastest and median CPU ms per update and the speed-up of the median over
``eager``'s. Then ``tanh`` on a ``3200 x 64`` tensor: eager, compiled, :func:`rational_tanh` eager and
compiled, ns per element.

    taskset -c 1 python scripts/bench_compile.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from sppo_rl.control.networks import RationalTanh, rational_tanh

OBS, ACTIONS, HIDDEN, EPOCHS, MINIBATCHES = 5, 2, 64, 4, 4


def mlp(out: int, act: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(OBS, HIDDEN), act(), nn.Linear(HIDDEN, HIDDEN), act(), nn.Linear(HIDDEN, out)
    )


def update_fn(rows: int, act: type[nn.Module], compiled: bool, fused: bool) -> Callable[[], None]:
    """One update of the floor's work with these choices (networks and data from seed 0)."""
    torch.manual_seed(0)
    actor, critic = mlp(ACTIONS, act), mlp(1, act)
    obs, acts = torch.randn(rows, OBS), torch.randint(0, ACTIONS, (rows, 1))
    old, adv, ret = -torch.rand(rows, 1), torch.randn(rows, 1), torch.randn(rows, 1)
    kw = {"fused": True} if fused else {}
    opt_a = torch.optim.Adam(actor.parameters(), 3e-4, **kw)
    opt_c = torch.optim.Adam(critic.parameters(), 1e-3, **kw)

    def loss(o, a, lo, ad, r):
        logp = torch.log_softmax(actor(o), -1).gather(1, a)
        ratio = torch.exp(logp - lo)
        pg = -torch.min(ratio * ad, ratio.clamp(0.8, 1.2) * ad).mean()
        return pg + (critic(o) - r).pow(2).mean()

    fn = torch.compile(loss, dynamic=True) if compiled else loss
    mb = rows // MINIBATCHES
    gen = torch.Generator().manual_seed(0)

    def update() -> None:
        for _ in range(EPOCHS):
            perm = torch.randperm(rows, generator=gen)
            for j in range(MINIBATCHES):
                i = perm[j * mb : (j + 1) * mb]
                opt_a.zero_grad()
                opt_c.zero_grad()
                fn(obs[i], acts[i], old[i], adv[i], ret[i]).backward()
                opt_a.step()
                opt_c.step()

    return update


class _RationalOp(nn.Module):
    """``RationalTanh`` as a compiled op of its own inside eager code (forward and backward compiled)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.compile(RationalTanh(), dynamic=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


CANDIDATES = {
    "eager": (nn.Tanh, False, False),
    "fused-adam": (nn.Tanh, False, True),
    "compiled-loss": (nn.Tanh, True, True),
    "rational-op": (_RationalOp, False, True),
    "compiled-loss-rational": (RationalTanh, True, True),
}


def per_element_ns(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, calls: int = 200) -> float:
    fn(x)
    best = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        for _ in range(calls):
            fn(x)
        best = min(best, (time.process_time() - c0) / calls / x.numel() * 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=12_800, help="rows of one update (64 envs x 200 steps)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fns, times = {}, {}
    for name, (act, compiled, fused) in CANDIDATES.items():
        c0 = time.process_time()
        fns[name] = update_fn(args.rows, act, compiled, fused)
        fns[name]()
        print(f"{name}: first update (compiling) {time.process_time() - c0:.1f} CPU-s", flush=True)
        times[name] = []
    names = list(fns)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            c0 = time.process_time()
            fns[name]()
            times[name].append(time.process_time() - c0)
    base = statistics.median(times["eager"])
    print(f"\nupdate of {args.rows} rows, {EPOCHS} epochs x {MINIBATCHES} minibatches, {args.rounds} rounds:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<24} {min(ts) * 1e3:6.1f} ms best, {med * 1e3:6.1f} median, {base / med:.2f}x eager")
    x = torch.randn(3200, HIDDEN) * 2
    print("tanh on 3200 x 64, ns per element (fastest of 3):")
    for name, fn in [
        ("torch.tanh eager", torch.tanh),
        ("torch.tanh compiled", torch.compile(torch.tanh, dynamic=True)),
        ("rational_tanh eager", rational_tanh),
        ("rational_tanh compiled", torch.compile(rational_tanh, dynamic=True)),
    ]:
        print(f"  {name:<24} {per_element_ns(fn, x):.2f}")


if __name__ == "__main__":
    main()
