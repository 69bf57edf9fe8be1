"""Core-hours of a control sweep at budgets this machine cannot run, estimated from finished runs.

For each finished control run found under the given folders (``summary.json`` and ``metrics.jsonl``, as
``sppo-rl sweep`` writes them), the cost of one episode late in training: the wall-clock seconds over
the episodes of the last ``--tail`` fraction of its updates, ``c = (w_end - w_k) / (e_end - e_k)``. Late
episodes are the longest (a trained policy survives to the horizon), so ``c x budget`` bounds a run's
training time from above when the run starts from the same warm start. Per (task, algorithm): the mean
and min-max of ``c`` over the runs found; the estimate for ``--seeds`` runs at the task's budget is
``seeds x mean(c) x budget / 3600`` core-hours (one run = one process on one core, ``OMP_NUM_THREADS=1``;
a batched sweep runs a (task, algorithm)'s seeds in one process, whose seconds its seeds share: a seed's
``c`` is then its set's over the seed count, and the core-hours are the same sum), and the same at the slowest run's ``c`` (the task's slowest when not measured). Runs measured with other jobs on the same cores read slower than a quiet core:
the estimate is then high. Algorithms asked for but not measured on a task get the mean over the
algorithms that were (labelled so).

Prints a table, the total, the ``sppo-rl sweep --backend ray`` command for those budgets, and its last
line as JSON.

    python scripts/estimate_budget.py runs/vc/base-hopper runs/vc/base-lander \\
        --budgets hopper=20000 lunarlander=30000 --algos ppo sppo grpo rloo remax ppo-bce
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def episode_cost(rows: list[dict], tail: float) -> float | None:
    """Seconds per episode over the last ``tail`` fraction of the update rows (None: too few rows)."""
    rows = [r for r in rows if "episodes" in r and "wall_time_s" in r]
    if len(rows) < 2:
        return None
    k = min(len(rows) - 2, int(len(rows) * (1 - tail)))
    a, b = rows[k], rows[-1]
    if b["episodes"] <= a["episodes"]:
        return None
    return (b["wall_time_s"] - a["wall_time_s"]) / (b["episodes"] - a["episodes"])


def find_runs(folders: list[Path]) -> list[tuple[Path, dict]]:
    """Finished control runs under ``folders``: ``(folder, summary)`` for each ``summary.json`` holding a
    ``task`` beside a ``metrics.jsonl``."""
    out = []
    for folder in folders:
        for path in sorted(folder.rglob("summary.json")):
            summary = json.loads(path.read_text())
            multi = "seed_summaries" in summary  # a multi-seed run's own folder: its seed<K> folders count
            if "task" in summary and not multi and (path.parent / "metrics.jsonl").exists():
                out.append((path.parent, summary))
    return out


def shared_by(run: Path) -> int:
    """How many seeds share ``run``'s seconds: the seed count of the multi-seed run (``sppo-rl control
    --seeds``, a batched ``sppo-rl sweep``) whose ``seed<K>`` folder it is, else 1."""
    try:
        parent = json.loads((run.parent / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return 1
    return (len(parent.get("seed_summaries") or []) or 1) if isinstance(parent, dict) else 1


def costs(runs: list[tuple[Path, dict]], tail: float) -> dict[tuple[str, str], list[float]]:
    """``(task, algo) -> [c per run]``; a seed of a multi-seed run: its set's seconds over the set's seed
    count (:func:`shared_by`), the core-seconds of one seed's episode."""
    out: dict[tuple[str, str], list[float]] = {}
    for run, summary in runs:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        c = episode_cost(rows, tail)
        if c is not None:
            out.setdefault((summary["task"], summary["algo"]), []).append(c / shared_by(run))
    return out


def estimate(
    measured: dict[tuple[str, str], list[float]], budgets: dict[str, int], algos: list[str], seeds: int
) -> dict:
    """Per (task, algo): seconds per episode (mean, min, max, runs) and core-hours for ``seeds`` runs; the
    algorithms without a measurement on a task take the mean over those with one (``"measured": False``)."""
    rows = []
    for task, budget in budgets.items():
        known = {a: statistics.fmean(v) for (t, a), v in measured.items() if t == task}
        if not known:
            raise ValueError(f"no finished run of task {task!r} in the folders given")
        fallback = statistics.fmean(known.values())
        for algo in algos:
            runs = measured.get((task, algo), [])
            c = statistics.fmean(runs) if runs else fallback
            rows.append(
                {
                    "task": task,
                    "algo": algo,
                    "budget": budget,
                    "measured": bool(runs),
                    "runs": len(runs),
                    "s_per_episode": c,
                    "min": min(runs) if runs else None,
                    "max": max(runs) if runs else None,
                    "core_hours": seeds * c * budget / 3600,
                    "core_hours_max": seeds * (max(runs) if runs else max(known.values())) * budget / 3600,
                }
            )
    return {
        "seeds": seeds,
        "rows": rows,
        "core_hours": sum(r["core_hours"] for r in rows),
        "core_hours_max": sum(r["core_hours_max"] for r in rows),
    }


def table(report: dict) -> str:
    lines = [
        "| task (budget) | algorithm | s / episode late in training (runs, min-max) | core-hours, "
        f"{report['seeds']} seeds | at the slowest run's cost |",
        "|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        cost = (
            f"{r['s_per_episode']:.3f} ({r['runs']}, {r['min']:.3f}-{r['max']:.3f})"
            if r["measured"]
            else f"{r['s_per_episode']:.3f} (not measured: the task's mean)"
        )
        lines.append(
            f"| {r['task']} ({r['budget']:,}) | {r['algo']} | {cost} | {r['core_hours']:.1f} | "
            f"{r['core_hours_max']:.1f} |"
        )
    lines.append(f"| total | | | {report['core_hours']:.1f} | {report['core_hours_max']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="folders holding finished control runs")
    ap.add_argument("--budgets", nargs="+", required=True, metavar="TASK=EPISODES")
    ap.add_argument("--algos", nargs="+", default=["ppo", "sppo", "grpo", "rloo", "remax", "ppo-bce"])
    ap.add_argument("--seeds", type=int, default=3, help="runs per (task, algorithm)")
    ap.add_argument("--tail", type=float, default=0.25, help="fraction of the last updates measured")
    args = ap.parse_args(argv)
    try:
        budgets = {}
        for item in args.budgets:
            task, _, n = item.partition("=")
            if not task or not n.isdigit() or int(n) <= 0:
                raise ValueError(f"--budgets wants TASK=EPISODES with EPISODES > 0, got {item!r}")
            budgets[task] = int(n)
        if not 0 < args.tail <= 1 or args.seeds < 1:
            raise ValueError("--tail must be in (0, 1] and --seeds >= 1")
        missing = [str(f) for f in args.folders if not f.is_dir()]
        if missing:
            raise ValueError(f"no such folder: {', '.join(missing)}")
        report = estimate(costs(find_runs(args.folders), args.tail), budgets, args.algos, args.seeds)
    except ValueError as e:
        print(f"estimate_budget: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(table(report))
    b = " ".join(f"{t}={n}" for t, n in budgets.items())
    print(
        f"\nsppo-rl sweep --algos {' '.join(args.algos)} --tasks {' '.join(budgets)} "
        f"--seeds {' '.join(str(s) for s in range(args.seeds))} --budgets {b} "
        "--backend ray --ray-address <address> --workers <cores> --out-dir runs/study-full"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
