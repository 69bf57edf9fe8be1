"""The decision rule's error rates, simulated through the functions the reports call
(:mod:`sppo_rl.experiments.decision`: :func:`~sppo_rl.experiments.decision.paired_t`,
:func:`~sppo_rl.experiments.decision.decide`, :func:`~sppo_rl.experiments.decision.mde`, and the whole
:func:`sppo_rl.experiments.protocol.protocol` on simulated curves).

Per-seed statistics of two methods A and B (one number per seed, e.g. the accuracy at equal compute), in
units of one method's seed standard deviation, under three noise models:

- ``independent``: ``a_k = delta + e_k``, ``b_k = f_k``, ``e, f ~ N(0, 1)`` independent;
- ``correlated 0.8``: the same with ``corr(e_k, f_k) = 0.8`` (same warm start, same prompts per seed);
- ``30 % collapse``: every run of either method independently collapses with probability 0.3 to the
  value -3 (3 sd below, whatever the method); the others as ``independent``; the true mean difference is
  then ``0.7 delta``.

For 5, 10 and 20 seeds it prints the false-positive rate of "difference" (``delta = 0``; one comparison
is one family), the coverage of the 95 % paired-t interval (of the true mean difference, at ``delta = 0``
and 1), the power at ``delta = 0.5, 1, 2`` sd, the sign-flip permutation test's rates beside them, the
power at the minimum detectable effect that :func:`~sppo_rl.experiments.decision.mde` gives for the true
spread (80 % if it is right), and the chance of at least one false "difference" in a table of 7 pairs x
3 statistics after Holm's correction. Then the whole protocol on simulated A/A curves: identical
fast-rising curves (``0.3 + 0.4 (1 - exp(-t / 5 s))``) evaluated every 7.5 s and every 1.5 s, 64
binomial prompts per evaluation, 60 s: how often each statistic says "difference", and the median ratio
of the time below the target (the evaluation-density bias).

    python scripts/decision_sim.py --reps 4000      # about a minute
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from sppo_rl.experiments import decision as D
from sppo_rl.experiments import protocol as P

MODELS = ("independent", "correlated 0.8", "30 % collapse")
SEEDS = (5, 10, 20)
EFFECTS = (0.5, 1.0, 2.0)
COLLAPSE_P, COLLAPSE_VALUE, RHO = 0.3, -3.0, 0.8


def draw(model: str, n: int, delta: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """One comparison's per-seed values ``(a, b)`` under ``model`` and the true mean difference."""
    e, f = rng.standard_normal(n), rng.standard_normal(n)
    if model == "correlated 0.8":
        f = RHO * e + math.sqrt(1 - RHO**2) * f
    a, b, true = delta + e, f, delta
    if model == "30 % collapse":
        a = np.where(rng.random(n) < COLLAPSE_P, COLLAPSE_VALUE, a)
        b = np.where(rng.random(n) < COLLAPSE_P, COLLAPSE_VALUE, b)
        true = (1 - COLLAPSE_P) * delta
    return a, b, true


def rates(
    model: str, n: int, delta: float, reps: int, seed: int = 2026, flips: bool = True
) -> dict[str, float]:
    """Over ``reps`` comparisons: the share whose verdict (one-row family, :func:`decide`) is
    "difference", whose 95 % interval holds the true difference, and (``flips``) whose sign-flip p <
    0.05 (NaN without)."""
    rng = np.random.default_rng([seed, n, int(delta * 100), MODELS.index(model)])
    found = cover = flipped = 0
    for _ in range(reps):
        a, b, true = draw(model, n, delta, rng)
        d = D.paired_values(a, b, "difference")
        t = D.paired_t(d)
        (row,) = D.decide([{"kind": "difference", "n": t["n"], "p": t["p"], "tost_p": 1.0, "mde": 0.0}])
        found += D.shown(row["verdict"]) == "difference"
        cover += t["lo"] <= true <= t["hi"]
        flipped += flips and D.sign_flip(d) < D.ALPHA
    return {
        "difference": found / reps,
        "coverage": cover / reps,
        "sign_flip": flipped / reps if flips else math.nan,
    }


def power_at_mde(n: int, reps: int, seed: int = 2026) -> tuple[float, float]:
    """The MDE :func:`decision.mde` gives for the true paired spread ``sqrt(2)`` (independent seeds) and
    the simulated share of "difference" at that true effect (80 % if the MDE is right)."""
    m = D.mde(math.sqrt(2), n)
    return m, rates("independent", n, m, reps, seed, flips=False)["difference"]


def family_rate(reps: int, n: int = 5, rows: int = 21, seed: int = 2026) -> tuple[float, float]:
    """A table of ``rows`` comparisons (7 pairs x 3 statistics), no true difference, independent seeds:
    the share of tables with at least one "difference", without and with Holm's correction."""
    rng = np.random.default_rng([seed, rows, n])
    raw = holm = 0
    for _ in range(reps):
        table = []
        for _ in range(rows):
            a, b, _true = draw("independent", n, 0.0, rng)
            t = D.paired_t(D.paired_values(a, b, "difference"))
            table.append({"kind": "difference", "n": t["n"], "p": t["p"], "tost_p": 1.0, "mde": 0.0})
        raw += any(r["p"] < D.ALPHA for r in table)
        holm += any(D.shown(r["verdict"]) == "difference" for r in D.decide(table))
    return raw / reps, holm / reps


# ---------------------------------------------------------------- the whole protocol on simulated curves


def fast_curve(t):
    """Identical for both methods: 0.3 -> 0.7, 95 % of the way at 15 s (fast against the sparse
    method's 7.5 s between evaluations)."""
    return 0.3 + 0.4 * (1 - np.exp(-t / 5))


def curve_run(rng, every_s: float, budget: float = 60.0, val: int = 64) -> P.Curve:
    """An evaluation every ``every_s`` seconds on ``val`` prompts (binomial noise); tokens and FLOPs
    proportional to seconds (the curves are identical on every axis)."""
    t = np.arange(0.0, budget + 1e-9, every_s)
    acc = rng.binomial(val, fast_curve(t)) / val
    return P.Curve(t, t * 1000.0, np.arange(len(t), dtype=float), acc, flops=t * 1e12)


def curve_check(reps: int, seeds: int = 5, seed: int = 2026) -> dict[str, dict[str, float]]:
    """``reps`` A/A comparisons of ``seeds`` runs evaluated every 7.5 s against ``seeds`` every 1.5 s,
    through :func:`protocol.protocol` (its decision rule): per statistic the share of "difference" and
    the median estimate."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {}
    for _ in range(reps):
        curves = {
            "sparse": {k: curve_run(rng, 7.5) for k in range(seeds)},
            "dense": {k: curve_run(rng, 1.5) for k in range(seeds)},
        }
        r = P.protocol(curves, [("sparse", "dense")])
        for row in r["table"]:
            out.setdefault(row["statistic"], []).append(row)
    return {
        name: {
            "difference": float(np.mean([D.shown(x["verdict"]) == "difference" for x in rows])),
            "estimate": float(np.median([x["estimate"] for x in rows])),
            "role": rows[0]["role"],
        }
        for name, rows in out.items()
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000, help="repetitions per cell")
    ap.add_argument("--curve-reps", type=int, default=200, help="repetitions of the simulated-curve A/A")
    args = ap.parse_args(argv)
    print(f"paired t-test (alpha {D.ALPHA}), {args.reps} repetitions per cell; effects in seed sd")
    print(
        "| noise | seeds | false positives | coverage at 0 | coverage at 1 sd | power 0.5 / 1 / 2 sd | sign-flip: FP, power 1 sd |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model in MODELS:
        for n in SEEDS:
            null, one = rates(model, n, 0.0, args.reps), rates(model, n, 1.0, args.reps)
            power = [
                rates(model, n, e, args.reps)["difference"] if e != 1.0 else one["difference"]
                for e in EFFECTS
            ]
            print(
                f"| {model} | {n} | {null['difference']:.1%} | {null['coverage']:.1%} | {one['coverage']:.1%} | "
                + " / ".join(f"{p:.0%}" for p in power)
                + f" | {null['sign_flip']:.1%}, {one['sign_flip']:.0%} |"
            )
    print()
    for n in SEEDS:
        m, p = power_at_mde(n, args.reps)
        print(f"MDE at {n} seeds (paired spread sqrt 2 = 1.414): {m:.3f} sd; simulated power there {p:.1%}")
    raw, holm = family_rate(args.reps)
    print(
        f"7 pairs x 3 statistics, no difference, 5 seeds: any false 'difference' {raw:.1%} raw, {holm:.1%} with Holm"
    )
    print()
    cc = curve_check(args.curve_reps)
    print(
        f"the whole protocol, A/A curves evaluated every 7.5 s vs 1.5 s, 5 seeds, {args.curve_reps} repetitions"
    )
    print("| statistic | role | 'difference' | median estimate |")
    print("|---|---|---:|---:|")
    for name, s in cc.items():
        print(f"| {name} | {s['role']} | {s['difference']:.1%} | {s['estimate']:.3f} |")


if __name__ == "__main__":
    main()
