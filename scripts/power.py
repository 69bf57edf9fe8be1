"""Seeds a paired comparison needs: from a pilot's paired spread (the sample sd of the per-seed
differences ``a_k - b_k``, given with ``--sd`` or computed from ``--pilot-a`` and ``--pilot-b``, one value
per seed, paired by position), the fewest seeds at which the paired t-test finds a true difference of
``--effect`` with probability ``--power`` at ``--alpha`` (the noncentral t of
:func:`sppo_rl.experiments.decision.seeds_needed`), and the minimum detectable effect at 5, 10 and 20
seeds (:func:`~sppo_rl.experiments.decision.mde`).

    python scripts/power.py --sd 0.08 --effect 0.05
    python scripts/power.py --pilot-a 0.61 0.55 0.58 0.64 0.60 --pilot-b 0.52 0.50 0.57 0.55 0.49 --effect 0.05
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from sppo_rl.experiments import decision as D


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"power: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> dict:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sd", type=float, default=None, help="the pilot's paired spread (sd of a_k - b_k)")
    ap.add_argument("--pilot-a", type=float, nargs="+", default=None, help="method A's per-seed values")
    ap.add_argument("--pilot-b", type=float, nargs="+", default=None, help="method B's, the same seeds")
    ap.add_argument("--effect", type=float, required=True, help="the true difference to detect")
    ap.add_argument("--alpha", type=float, default=D.ALPHA)
    ap.add_argument("--power", type=float, default=D.POWER)
    args = ap.parse_args(argv)
    if (args.sd is None) == (args.pilot_a is None):
        ap.error("give --sd, or --pilot-a and --pilot-b")
    if args.pilot_a is not None:
        if args.pilot_b is None or len(args.pilot_a) != len(args.pilot_b) or len(args.pilot_a) < 2:
            ap.error("--pilot-a and --pilot-b: the same number of seeds, at least 2")
        args.sd = float(np.std(np.subtract(args.pilot_a, args.pilot_b), ddof=1))
    if not (math.isfinite(args.sd) and args.sd > 0):
        ap.error(f"the paired spread must be > 0, got {args.sd}")
    if not (args.effect != 0 and 0 < args.alpha < 1 and 0 < args.power < 1):
        ap.error("need --effect != 0, 0 < --alpha < 1, 0 < --power < 1")
    n = D.seeds_needed(args.sd, args.effect, args.alpha, args.power)
    mdes = {k: D.mde(args.sd, k, args.alpha, args.power) for k in (5, 10, 20)}
    print(
        f"paired spread {args.sd:.4g}: {n} seeds detect a difference of {abs(args.effect):g} with power "
        f"{args.power:g} at alpha {args.alpha:g} (paired t-test)"
    )
    print("minimum detectable effect: " + ", ".join(f"{m:.3g} at {k} seeds" for k, m in mdes.items()))
    return {"sd": args.sd, "seeds": n, "mde": mdes}


if __name__ == "__main__":
    main()
