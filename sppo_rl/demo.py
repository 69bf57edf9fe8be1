"""``sppo-rl demo``: the README's first command. PPO vs SPPO side by side, in both worlds.

1. Control: PPO and SPPO from the same shipped warm start of a sparse terminal-reward task, the same
   start states (same seed) and the same budget.
2. LLM: the embedded default (a tiny Qwen2 model built locally and warm-started on arithmetic), then
   PPO (per-token critic) and SPPO (prompt-only critic) for the same number of updates.

The tables printed at the end are read back from the runs' ``metrics.jsonl`` files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DemoConfig:
    """A short PPO-vs-SPPO comparison on a sparse control task and on the embedded tiny LLM."""

    task: str = "precision-cartpole"
    """Control task (short name)."""
    algos: tuple[str, ...] = ("ppo", "sppo")
    """Algorithms to compare in both worlds."""
    total_episodes: int = 3072
    """Control: episodes per algorithm."""
    llm_steps: int = 80
    """LLM: updates per algorithm (0 skips the LLM part)."""
    seed: int = 0
    """Seed shared by the runs."""
    out_dir: str = "runs/demo"
    """Runs go to <out_dir>/control/<algo> and <out_dir>/llm/<algo>."""
    progress: bool = True
    """Show progress bars."""


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import run_control
    from sppo_rl.runtime.logging import read_metrics

    control: dict[str, dict] = {}
    for algo in cfg.algos:
        out = Path(cfg.out_dir) / "control" / algo
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
        summary["first_success_rate"] = read_metrics(out / "metrics.jsonl")[0]["success_rate"]
        control[algo] = summary
    llm: dict[str, dict] = {}
    if cfg.llm_steps:
        from sppo_rl.llm.config import LLMConfig
        from sppo_rl.llm.trainer import run_llm

        for algo in cfg.algos:
            out = Path(cfg.out_dir) / "llm" / algo
            llm[algo] = run_llm(
                LLMConfig(
                    algo=algo,
                    updates=cfg.llm_steps,
                    seed=cfg.seed,
                    out_dir=str(out),
                    overwrite=True,
                    progress=cfg.progress,
                )
            )

    print(f"\ncontrol: {cfg.task}, seed {cfg.seed}, {cfg.total_episodes} episodes each (success rate)")
    print(
        f"{'algo':8s} {'first batch':>11s} {'final (10%)':>12s} {'greedy eval':>11s} {'wall s':>7s} {'steps/s':>8s}"
    )
    for algo, s in control.items():
        print(
            f"{algo:8s} {s['first_success_rate']:11.2f} {s['tail_success_rate']:12.2f} "
            f"{s.get('final_eval_success_rate', float('nan')):11.2f} {s['wall_time_s']:7.1f} {s['sps']:8.0f}"
        )
    if llm:
        print(
            f"\nllm: embedded tiny Qwen2 on arithmetic, {cfg.llm_steps} updates each (validation mean@k accuracy)"
        )
        print(f"{'algo':8s} {'warm start':>10s} {'final':>7s} {'best':>7s} {'wall s':>7s} {'peak MiB':>9s}")
        for algo, s in llm.items():
            print(
                f"{algo:8s} {s['start_val_accuracy']:10.3f} {s['final_val_accuracy']:7.3f} {s['best_val_accuracy']:7.3f} "
                f"{s['wall_time_s']:7.1f} {s['peak_memory_mb']:9.0f}"
            )
    print(f"\nruns: {cfg.out_dir}/{{control,llm}}/<algo>/ (config.json, metrics.jsonl, tb/, final)")
    return {"control": control, "llm": llm}
