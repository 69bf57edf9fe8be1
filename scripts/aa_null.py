"""The A/A test of the comparison protocol, printed: two methods with IDENTICAL learning curves
(``0.3 + 0.4 (1 - exp(-t / 50 s))``, 95 % of the way at 150 s) but very different update costs (6.6 s and
1.2 s per update, as GRPO and SPPO at level 5), an evaluation every 5 updates on 64 prompts (binomial
noise), a 300 s budget, 5 seeds each, repeated ``--reps`` times. Through yesterday's
``compare_llm.py`` rule (trailing mean over 3 evaluations, target = the slow method's best mean
smoothed curve, the first evaluation at or above it, the median over seed pairs) and through
:mod:`sppo_rl.experiments.protocol`, it prints the reported ratio (median and 10-90 % over repetitions),
how often the 95 % interval contains "no difference", and how often the verdict is not "difference".

    python scripts/aa_null.py --reps 200
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from sppo_rl.experiments import protocol as P
from sppo_rl.experiments.stats import trailing_mean


def learning_curve(t):
    """The same curve for both methods: 0.3 -> 0.7, 95 % of the way at 150 s."""
    return 0.3 + 0.4 * (1 - np.exp(-t / 50))


def simulated_run(rng, seconds_per_update: float, budget: float = 300, every: int = 5, val: int = 64):
    """An evaluation every ``every`` updates (and at the end) on ``val`` prompts: binomial noise around
    :func:`learning_curve`; tokens proportional to seconds (the curves are identical on both axes)."""
    updates = int(math.ceil(budget / seconds_per_update))
    steps = np.arange(0, updates + 1, every)
    steps = steps if steps[-1] == updates else np.append(steps, updates)
    t = steps * seconds_per_update
    return P.Curve(t, t * 1000.0, steps.astype(float), rng.binomial(val, learning_curve(t)) / val)


def old_time_ratio(slow: list[P.Curve], fast: list[P.Curve], window: int = 3) -> float:
    """Yesterday's compare_llm rule: each seed's curve smoothed by a trailing mean over ``window``
    evaluations; the target the best of the slow method's mean smoothed curve (seeds cut to the
    shortest); the seconds at the first evaluation whose smoothed value reaches it; the median over seed
    pairs of slow / fast."""
    smooth = [[trailing_mean(c.accuracy, window) for c in m] for m in (slow, fast)]
    n = min(len(s) for s in smooth[0])
    target = np.mean([s[:n] for s in smooth[0]], axis=0).max()

    def reach(c, s):
        hit = np.flatnonzero(s >= target - 1e-9)
        return c.seconds[hit[0]] if len(hit) else None

    pairs = [(reach(a, sa), reach(b, sb)) for a, sa, b, sb in zip(slow, smooth[0], fast, smooth[1])]
    return float(np.median([a / b for a, b in pairs if a is not None and b is not None and b > 0]))


def repetitions(reps: int, seeds: int = 5, seed: int = 2026):
    """``reps`` draws of (slow, fast): ``seeds`` simulated runs each at 6.6 s and 1.2 s per update."""
    rng = np.random.default_rng(seed)
    for _ in range(reps):
        slow = {k: simulated_run(rng, 6.6) for k in range(seeds)}  # "GRPO": evaluated every 33 s
        fast = {k: simulated_run(rng, 1.2) for k in range(seeds)}  # "SPPO": every 6 s
        yield slow, fast


def measure(reps: int, seeds: int = 5) -> dict:
    """Per repetition: the old rule's ratio, the ratio of the mean interpolated first crossings, and the
    protocol's comparison of slow against fast."""
    old, first, pairs = [], [], []
    for slow, fast in repetitions(reps, seeds):
        old.append(old_time_ratio(list(slow.values()), list(fast.values())))
        r = P.protocol({"slow": slow, "fast": fast}, [("slow", "fast")])
        mean_first = [
            np.mean([r["runs"][m][k]["seconds_first_crossing"] for k in r["runs"][m]])
            for m in ("slow", "fast")
        ]
        first.append(mean_first[0] / mean_first[1])
        pairs.append(r["pairs"]["slow_vs_fast"])
    return {"old": np.array(old), "first_crossing": np.array(first), "pairs": pairs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="repetitions of the 5-seed A/A comparison")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args(argv)
    m = measure(args.reps, args.seeds)
    q = lambda v: f"{np.median(v):.2f}x (10-90 %: {np.quantile(v, 0.1):.2f}-{np.quantile(v, 0.9):.2f}x)"  # noqa: E731
    print(f"A/A, identical curves, 6.6 s vs 1.2 s per update, {args.seeds} seeds, {args.reps} repetitions")
    print(f"old rule (smooth 3, target = slow method's best, first evaluation): slow needs {q(m['old'])}")
    print(f"first crossing interpolated between raw evaluations (ratio of means): {q(m['first_crossing'])}")
    print(
        "| protocol statistic | median over repetitions | 10-90 % | interval contains none | null contains none | no 'difference' |"
    )
    print("|---|---|---|---|---|---|")
    for name in (*P.DIFFERENCES, *P.RATIOS):
        none = 0.0 if name in P.DIFFERENCES else 1.0
        s = [p[name] for p in m["pairs"]]
        points = np.array([x["point"] for x in s])
        cover = np.mean([x["interval"][0] <= none <= x["interval"][1] for x in s])
        null = np.mean([x["null"][0] <= none <= x["null"][1] for x in s])
        quiet = np.mean([not x["verdict"].startswith("difference") for x in s])
        fmt = "+.3f" if none == 0 else ".3f"
        print(
            f"| {name} | {np.median(points):{fmt}} | {np.quantile(points, 0.1):{fmt}} to "
            f"{np.quantile(points, 0.9):{fmt}} | {cover:.0%} | {null:.0%} | {quiet:.0%} |"
        )


if __name__ == "__main__":
    main()
