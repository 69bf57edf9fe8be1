"""Wall time of one make target under two revisions of this project, alternated in one benchmark.

``--baseline REV`` (any git revision) is checked out into a temporary worktree; the working tree is the
other arm. In each tree the script asks make what the target runs (``make -n TARGET VENV=...``, the line
that calls ``sppo-rl``: each revision's own flags) and runs that command in the tree, with the tree first
on ``PYTHONPATH`` so that its own ``sppo_rl`` is imported, the same venv for both. The order is ABBA ABBA
..., so that a drift in the machine's load falls on both arms alike. Per repetition it records the
command's wall seconds; printed:

- each run's seconds, then ``time(baseline) / time(current)`` (> 1: the current tree is faster) as the
  geometric mean over the pairs with its 95 % interval (a paired t interval on the log-ratios,
  :func:`sppo_rl.experiments.decision.time_ratio`);
- the **A/A** ratio: the baseline's runs against each other (the first of each pair of its runs against the
  second), the same code timed twice, whose interval is the timing null the comparison is read against.

A JSON object with every number is the last line.

``--args`` appends flags to both arms' commands and ``--current-args`` to the working tree's alone (the last
of a repeated flag wins), so ``--baseline HEAD`` with ``--current-args "--threads 2"`` times one setting
against another on the same code.

    python scripts/bench_revisions.py --baseline 3a8ff66 --target demo-real --reps 2   # ~35 min here
    python scripts/bench_revisions.py --baseline HEAD --target demo-real --args "--updates 4 --eval-every 4" \
        --current-args "--threads 2"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sppo_rl.experiments.decision import ratio_text, time_ratio

REPO = Path(__file__).resolve().parents[1]


def order(reps: int) -> list[str]:
    """ABBA ABBA ...: ``reps`` runs of each arm, ``"base"`` first."""
    out: list[str] = []
    while len(out) < 2 * reps:
        out += ["base", "current", "current", "base"]
    return out[: 2 * reps] if reps % 2 == 0 else out[: 2 * reps - 2] + ["base", "current"]


def target_command(tree: Path, target: str, venv: Path) -> str:
    """The ``sppo-rl`` command line ``make TARGET`` runs in ``tree`` (continuation lines joined)."""
    out = subprocess.run(
        ["make", "-s", "-n", "-C", str(tree), target, f"VENV={venv}", f"PYTHON={venv / 'bin' / 'python'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line for line in out.replace("\\\n", " ").splitlines() if "/bin/sppo-rl " in line]
    if len(lines) != 1:
        raise SystemExit(f"make -n {target} in {tree}: expected one sppo-rl command, found {len(lines)}")
    return lines[0].strip()


def with_args(command: str, *extra: str) -> str:
    """``command`` with the flags of ``extra`` appended in order (blank ones skipped)."""
    return " ".join([command, *(e.strip() for e in extra if e.strip())])


def run_once(tree: Path, command: str, log: Path) -> float:
    """Run ``command`` in ``tree`` with the tree's package first on the path; its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(command, shell=True, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{command!r} in {tree} exited {proc.returncode}; its output: {log}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the git revision to time against the working tree")
    ap.add_argument("--target", default="demo-real", help="the make target to time (default demo-real)")
    ap.add_argument("--reps", type=int, default=2, help="runs of each arm (default 2)")
    ap.add_argument("--venv", default=str(REPO / ".venv"), help="the venv both arms run in")
    ap.add_argument("--args", default="", help="flags appended to both arms' commands")
    ap.add_argument("--current-args", default="", help="flags appended to the working tree's command only")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    venv = Path(args.venv).resolve()
    work = Path(tempfile.mkdtemp(prefix="bench-revisions-"))
    base_tree = work / "baseline"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base_tree), args.baseline],
        check=True,
    )
    try:
        trees = {"base": base_tree, "current": REPO}
        commands = {arm: target_command(tree, args.target, venv) for arm, tree in trees.items()}
        commands = {arm: with_args(cmd, args.args) for arm, cmd in commands.items()}
        commands["current"] = with_args(commands["current"], args.current_args)
        for arm, cmd in commands.items():
            print(f"{arm}: {cmd}", flush=True)
        seconds: dict[str, list[float]] = {"base": [], "current": []}
        for i, arm in enumerate(order(args.reps)):
            s = run_once(trees[arm], commands[arm], work / f"{i:02d}-{arm}.log")
            seconds[arm].append(s)
            print(f"run {i + 1}: {arm} {s:.1f} s", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False)
    result: dict = {
        "baseline": args.baseline,
        "target": args.target,
        "commands": commands,
        "seconds": seconds,
    }
    result["current_vs_base"] = time_ratio(seconds["base"], seconds["current"])
    print(f"time(baseline) / time(current): {ratio_text(result['current_vs_base'], 'pair')}")
    base = seconds["base"]
    if len(base) >= 2:
        result["aa"] = time_ratio(base[0::2][: len(base) // 2], base[1::2][: len(base) // 2])
        print(f"A/A (the baseline's runs against each other): {ratio_text(result['aa'], 'pair')}")
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
