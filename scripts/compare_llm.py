"""The paper's LLM comparison at small scale: SPPO (N=1), GRPO (N=8), RLOO, ReMax and PPO on the tiny
arithmetic task, all from the same warm start, the same prompts per update and the same number of
updates; plus SPPO with a critic smaller than the actor, and the two group variants BPPO and LamPO
(N=8, like GRPO).

Every run is its own ``sppo-rl llm`` process (so peak memory is per run) writing to
``<out>/<name>/``; the script then reads the metrics back and writes ``<out>/compare.md``,
``<out>/compare.json`` and ``<out>/compare.png`` (validation accuracy against optimizer steps,
generated tokens and wall-clock seconds).

    python scripts/compare_llm.py --out runs/compare_llm --steps 150       # the same number of updates
    python scripts/compare_llm.py --out runs/compare_llm --seconds 180     # the same wall-clock budget

"Time to GRPO's best": the first wall-clock second (and generated token count) at which a run's
validation accuracy reaches the best accuracy GRPO reached in its whole run, the paper's "5.9x"
measured here. Model-state memory is counted exactly: parameters + gradients + two AdamW moments, in
float32, for the trainable models (actor and critic); peak RSS is the process's, dominated at this size
by the Python and torch runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUNS = [
    ("sppo", ["--algo", "sppo"]),
    ("grpo", ["--algo", "grpo", "--group-size", "8"]),
    ("rloo", ["--algo", "rloo", "--group-size", "5"]),
    ("remax", ["--algo", "remax"]),
    ("ppo", ["--algo", "ppo"]),
    ("sppo-small-critic", ["--algo", "sppo", "--critic-model", "{small}"]),
    ("bppo", ["--algo", "bppo", "--group-size", "8"]),
    ("lampo", ["--algo", "lampo", "--group-size", "8"]),
    ("gspo", ["--algo", "gspo", "--group-size", "8"]),
    ("sppo-seq", ["--algo", "sppo-seq"]),
    ("cispo", ["--algo", "cispo", "--group-size", "8"]),
    ("reinforce++", ["--algo", "reinforce++"]),
    ("reinforce++-baseline", ["--algo", "reinforce++-baseline", "--group-size", "8"]),
    # token-level PPO with VC-PPO / VAPO's critic fixes: unbiased critic targets, length-adaptive actor
    # lambda (alpha 1: lambda 0.9 at 10 tokens; VAPO's 0.05 is for responses of hundreds), value pre-training
    ("ppo-vc", ["--algo", "ppo", "--lam-critic", "1.0", "--lam-alpha", "1.0", "--critic-warmup", "5"]),
]


def model_state_mib(folder: Path) -> float:
    """Parameters x 4 copies (weights, gradients, AdamW m and v) x 4 bytes, in MiB."""
    from safetensors import safe_open

    n = 0
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for k in f.keys():
            n += _numel(f.get_slice(k).get_shape())
    return n * 4 * 4 / 2**20


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def finished_with(run_dir: Path, flags: list[str]) -> bool:
    """True when ``run_dir`` holds a finished run (``summary.json``) whose saved config agrees with every
    flag of ``flags``: ``--group-size 8`` <-> ``group_size == 8``, ``--no-tensorboard`` <->
    ``tensorboard is False``, a bare ``--overwrite`` <-> ``overwrite is True``."""
    if not (run_dir / "summary.json").is_file() or not (run_dir / "config.json").is_file():
        return False
    config = json.loads((run_dir / "config.json").read_text())
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not flag.startswith("--"):
            return False
        key = flag[2:].replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            if str(config.get(key)) != flags[i + 1]:
                return False
            i += 2
            continue
        if key.startswith("no_") and key[3:] in config:
            if config[key[3:]] is not False:
                return False
        elif config.get(key) is not True:
            return False
        i += 1
    return True


def first_reach(rows: list[dict], target: float, key: str) -> float | None:
    for r in rows:
        if r.get("val_accuracy") is not None and r["val_accuracy"] >= target - 1e-12:
            return r.get(key)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/compare_llm")
    ap.add_argument("--steps", type=int, default=150, help="updates per run (without --seconds)")
    ap.add_argument(
        "--seconds", type=float, default=None, help="equal wall-clock budget per run instead of equal updates"
    )
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="run only these names")
    ap.add_argument(
        "--llm-args",
        default="",
        help='more `sppo-rl llm` flags for every run, one string (e.g. "--model /path --max-new-tokens 8")',
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep a run whose folder already holds a finished run with the same settings instead of rerunning it",
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from sppo_rl.llm.tiny import ensure_tiny_model
    from sppo_rl.llm.trainer import TINY_CHARSET, TINY_SETTINGS, default_cache_dir

    small = ensure_tiny_model(
        default_cache_dir(),
        TINY_CHARSET,
        **{**TINY_SETTINGS, "hidden_size": 64, "layers": 2, "heads": 2, "kv_heads": 1},
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results: dict[str, dict] = {}
    for name, flags in RUNS:
        if args.only and name not in args.only:
            continue
        run_dir = out / name
        cmd = [
            sys.executable,
            "-m",
            "sppo_rl",
            "llm",
            *[f.format(small=small) for f in flags],
            "--steps",
            str(args.steps),
            "--prompts-per-step",
            str(args.prompts_per_step),
            "--eval-every",
            str(args.eval_every),
            "--seed",
            str(args.seed),
            *shlex.split(args.llm_args),
            "--out-dir",
            str(run_dir),
            "--no-progress",
            "--overwrite",
        ]
        t0 = time.perf_counter()
        if args.reuse and finished_with(run_dir, cmd[cmd.index("llm") + 1 : cmd.index("--out-dir")]):
            print(f"{name}: reusing the finished run in {run_dir}", file=sys.stderr)
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name} failed ({proc.returncode})")
        summary = json.loads((run_dir / "summary.json").read_text())
        config = json.loads((run_dir / "config.json").read_text())["resolved"]
        rows = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
        ]
        state = model_state_mib(Path(config["actor"]))
        if config["critic"] != "none":
            state += model_state_mib(Path(config["critic"]))
        results[name] = {
            "summary": summary,
            "rows": rows,
            "model_state_mib": state,
            "process_s": time.perf_counter() - t0,
        }
        print(
            f"{name}: val {summary['start_val_accuracy']:.3f} -> {summary['final_val_accuracy']:.3f} "
            f"(best {summary['best_val_accuracy']:.3f}) in {summary['wall_time_s']:.0f} s",
            file=sys.stderr,
        )

    grpo_best = results["grpo"]["summary"]["best_val_accuracy"] if "grpo" in results else None
    table = [
        "| run | samples/prompt | start | final | best | s to GRPO's best | tokens to GRPO's best | "
        "wall s | gen tokens | peak RSS MiB | model-state MiB |",
        "|" + "---|" * 11,
    ]
    report = {}
    for name, r in results.items():
        s, rows = r["summary"], r["rows"]
        t_best = first_reach(rows, grpo_best, "wall_time_s") if grpo_best is not None else None
        k_best = first_reach(rows, grpo_best, "generated_tokens") if grpo_best is not None else None
        report[name] = {
            **{
                k: s[k]
                for k in (
                    "start_val_accuracy",
                    "final_val_accuracy",
                    "best_val_accuracy",
                    "wall_time_s",
                    "generated_tokens",
                    "peak_memory_mb",
                    "group_size",
                )
            },
            "seconds_to_grpo_best": t_best,
            "tokens_to_grpo_best": k_best,
            "model_state_mib": r["model_state_mib"],
        }
        table.append(
            f"| {name} | {s['group_size']} | {s['start_val_accuracy']:.3f} | {s['final_val_accuracy']:.3f} | "
            f"{s['best_val_accuracy']:.3f} | {'—' if t_best is None else f'{t_best:.0f}'} | "
            f"{'—' if k_best is None else f'{k_best:,}'} | {s['wall_time_s']:.0f} | {s['generated_tokens']:,} | "
            f"{s['peak_memory_mb']:.0f} | {r['model_state_mib']:.1f} |"
        )
    if (
        grpo_best is not None
        and report.get("sppo", {}).get("seconds_to_grpo_best")
        and report["grpo"]["seconds_to_grpo_best"]
    ):
        ratio = report["grpo"]["seconds_to_grpo_best"] / report["sppo"]["seconds_to_grpo_best"]
        table.append(
            f"\nGRPO's best validation accuracy: {grpo_best:.3f}; GRPO needs {ratio:.1f}x SPPO's wall-clock to reach it."
        )
        report["grpo_over_sppo_time_to_grpo_best"] = ratio
    md = "\n".join(table)
    print(md)
    (out / "compare.md").write_text(md + "\n")
    (out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, out / "compare.png")


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16.5, 4), sharey=True)
    for name, r in results.items():
        rows = [row for row in r["rows"] if row.get("val_accuracy") is not None]
        y = [row["val_accuracy"] for row in rows]
        for ax, key in zip(axes, ("step", "generated_tokens", "wall_time_s")):
            ax.plot([row[key] for row in rows], y, marker="o", ms=3, label=name)
    for ax, label in zip(axes, ("optimizer steps (updates)", "generated tokens", "wall-clock seconds")):
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy (mean@k)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right")
    fig.suptitle("tiny Qwen2 on arithmetic, same warm start")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
