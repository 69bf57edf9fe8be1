"""``sppo-rl demo``: the README's first command. PPO vs SPPO on a sparse control task, side by side.

Both start from the same shipped warm start, see the same start states (same seed) and the same budget;
the table printed at the end is read from the runs' ``metrics.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

from sppo_rl.control.config import ControlConfig, DemoConfig
from sppo_rl.control.trainer import run_control
from sppo_rl.runtime.logging import read_metrics


def run_demo(cfg: DemoConfig) -> dict[str, dict]:
    results = {}
    for algo in cfg.algos:
        out = Path(cfg.out_dir) / algo
        summary = run_control(
            ControlConfig(
                algo=algo,
                task=cfg.task,
                seed=cfg.seed,
                total_episodes=cfg.total_episodes,
                out_dir=str(out),
                overwrite=True,
                progress=cfg.progress,
            )
        )
        rows = read_metrics(out / "metrics.jsonl")
        summary["first_success_rate"] = rows[0]["success_rate"]
        results[algo] = summary
    print(f"\n{cfg.task}, seed {cfg.seed}, {cfg.total_episodes} episodes each")
    print(
        f"{'algo':8s} {'first batch':>11s} {'last 10 upd.':>12s} {'greedy eval':>11s} {'wall s':>7s} {'steps/s':>8s}"
    )
    for algo, s in results.items():
        print(
            f"{algo:8s} {s['first_success_rate']:11.2f} {s['final_success_rate']:12.2f} "
            f"{s.get('final_eval_success_rate', float('nan')):11.2f} {s['wall_time_s']:7.1f} {s['sps']:8.0f}"
        )
    print(f"runs: {cfg.out_dir}/<algo>/ (metrics.jsonl, tb/, final.pt)")
    return results
