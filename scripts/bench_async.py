"""Wall time per update of asynchronous rollouts against the synchronous update, on this machine's cores.

Each arm is a whole ``sppo-rl llm`` run (its own process; the tiny embedded model by default, or
``--model``), validation off during the timed updates; its time per update is the mean of ``step_time_s``
(the update from the request of its batch to the weights pushed) over updates 2..N (update 1 of an
asynchronous run has nothing to overlap). Every arm trains its actor in every update
(``--no-skip-equal-rewards``): an update whose rewards are all equal otherwise skips the actor's pass, and
the arms, sampling by different policies, would skip different updates and time different work. The arms, run in a rotated order in every repetition, so that a
slow period of the machine falls on each in turn:

- ``sync-1t``: ``--max-staleness 0``, one torch thread (the default); run twice, ``sync-1t`` and
  ``sync-1t-again``: the **A/A** pair, the same code timed twice, whose ratio is the timing null;
- ``sync-2t``: ``--max-staleness 0 --threads 2`` (both cores to one process);
- ``async-k1``: ``--max-staleness 1`` (the sampler in a worker process with one thread, the learner with
  one: both cores).

Printed: one line per run, then every ratio ``time(sync-1t) / time(arm)`` (> 1: the arm is faster) as the
geometric mean over repetitions with its 95 % interval (a paired t interval on the log-ratios,
:func:`sppo_rl.experiments.decision.paired_t`), the A/A ratio and interval beside them; the last line is
a JSON object with every number.

    python scripts/bench_async.py                          # the tiny model, 3 repetitions
    python scripts/bench_async.py --model smollm2-135m --updates 4 --reps 2 \\
        --llm-args "--prompts-per-step 16 --max-new-tokens 32 --arithmetic-prompt question"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sppo_rl.experiments.decision import ratio_text, time_ratio

ARMS: dict[str, list[str]] = {
    "sync-1t": ["--threads", "1"],
    "sync-1t-again": ["--threads", "1"],
    "sync-2t": ["--threads", "2"],
    "async-k1": ["--threads", "1", "--max-staleness", "1", "--rollout-threads", "1"],
}


def run_arm(name: str, args: argparse.Namespace, root: Path, rep: int) -> dict:
    """One run of arm ``name``: its per-update times (updates 2..N) and their mean."""
    out = root / f"{name}-{rep}"
    cmd = [sys.executable, "-m", "sppo_rl", "llm", "--algo", args.algo, "--updates", str(args.updates)]
    cmd += [
        "--eval-every",
        "100000",
        "--val-size",
        "8",
        "--eval-samples",
        "1",
        "--no-progress",
        "--no-tensorboard",
    ]
    cmd += ["--checkpoint-every", "100000", "--cache-dir", str(root / "cache"), "--out-dir", str(out)]
    cmd += ["--no-skip-equal-rewards"]  # the same work in every update of every arm (see the docstring)
    cmd += ["--model", args.model] if args.model else []
    cmd += [*shlex.split(args.llm_args), *ARMS[name]]
    env = {**os.environ, "OMP_NUM_THREADS": ARMS[name][1]}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(
            f"{name}: sppo-rl llm failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
        )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step_time_s"] for r in rows if "step_time_s" in r and r["update"] >= 2]
    return {"seconds_per_update": float(np.mean(steps)), "steps": steps, "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="a named model or folder (default: the embedded tiny model)"
    )
    ap.add_argument("--algo", default="sppo")
    ap.add_argument("--updates", type=int, default=8, help="updates per run (the first is not timed)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every arm (rotated order)")
    ap.add_argument(
        "--llm-args", default="--prompts-per-step 16 --max-new-tokens 24", help="more sppo-rl llm flags"
    )
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    if args.updates < 3 or args.reps < 1:
        raise SystemExit("--updates must be >= 3 and --reps >= 1")
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_async_"))
    root.mkdir(parents=True, exist_ok=True)
    names = list(ARMS)
    times: dict[str, list[float]] = {n: [] for n in names}
    print(f"machine: {os.cpu_count()} cores; runs in {root}", flush=True)
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            r = run_arm(name, args, root, rep)
            times[name].append(r["seconds_per_update"])
            print(
                f"rep {rep} {name:>14}: {r['seconds_per_update']:.3f} s per update (run {r['wall_s']:.0f} s)",
                flush=True,
            )
    base = times["sync-1t"]
    out = {"seconds_per_update": {n: float(np.mean(v)) for n, v in times.items()}, "reps": args.reps}
    out["aa"] = time_ratio(base, times["sync-1t-again"])
    for name in ("sync-2t", "async-k1"):
        out[name] = time_ratio(base, times[name])
    print(f"A/A (sync-1t timed twice): {ratio_text(out['aa'])}")
    print(f"sync-2t   vs sync-1t: {ratio_text(out['sync-2t'])}")
    print(f"async-k1  vs sync-1t: {ratio_text(out['async-k1'])}")
    a, b = out["async-k1"], time_ratio(times["sync-2t"], times["async-k1"])
    out["async-k1-vs-sync-2t"] = b
    print(
        f"async-k1  vs sync-2t: {ratio_text(b)}  (speed-up of K = 1 over the faster synchronous layout: {a['ratio']:.2f}x / {out['sync-2t']['ratio']:.2f}x)"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
