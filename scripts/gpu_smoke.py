"""GPU smoke test: a few SPPO updates of a small real-size model with vLLM rollouts and DeepSpeed ZeRO-3.

Prints generated tokens/s, the split of each update's time (generation, scoring, training, weight
sync) and peak GPU memory, from the run's ``metrics.jsonl``; the last line is a JSON summary.

    python scripts/gpu_smoke.py --model /path/to/Qwen2.5-0.5B-Instruct --gpus 1
    python scripts/gpu_smoke.py --gpus 2            # no --model: a random ~0.5B Qwen2 built locally

Needs CUDA, the ``vllm`` package and DeepSpeed in the environment; nothing is downloaded: ``--model``
is a local folder, or the script builds a randomly initialised Qwen2 of the 0.5B shape with the
project's character-level tokenizer (enough to measure throughput and memory, not accuracy).
Data: the shipped 24-row subsets of DAPO-Math-17k and MATH-500 (or ``--data`` / ``--val-data``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "math"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default=None, help="local HF causal-LM folder (default: a random 0.5B-shape Qwen2)"
    )
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--data", default=str(FIXTURES / "dapo-math-17k_dedup.parquet"))
    ap.add_argument("--val-data", default=str(FIXTURES / "math__math_500.parquet"))
    ap.add_argument("--out", default="runs/gpu_smoke")
    ap.add_argument(
        "--max-tokens-per-micro-batch",
        type=int,
        default=8192,
        help="token budget of each forward/backward pass (fits a 0.5B-7B model with checkpointing; README memory table)",
    )
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_smoke.py needs a CUDA GPU")
    model = args.model
    if model is None:
        from sppo_rl.llm.models.sources import default_cache_dir
        from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

        model = str(
            ensure_tiny_model(
                default_cache_dir(),
                TINY_CHARSET,
                hidden_size=896,
                layers=24,
                heads=14,
                kv_heads=2,
                intermediate_size=4864,
                max_position_embeddings=4096,
            )
        )
    out = Path(args.out)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.gpus),
        "-m",
        "sppo_rl",
        "llm",
        "--algo",
        "sppo",
        "--model",
        model,
        "--task",
        args.data,
        "--val-data",
        args.val_data,
        "--val-size",
        "16",
        "--eval-samples",
        "1",
        "--eval-every",
        "0",
        "--engine",
        "deepspeed",
        "--zero-stage",
        "3",
        "--rollout",
        "vllm",  # with several GPUs: one engine per rank (vLLM's external launcher; run on CPU only so far)
        "--dtype",
        "bfloat16",
        "--temperature",
        "0.6",
        "--updates",
        str(args.updates),
        "--prompts-per-step",
        str(args.prompts_per_step),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--vllm-max-model-len",
        str(args.max_new_tokens + 1024),
        "--gradient-checkpointing",
        "--max-tokens-per-micro-batch",
        str(args.max_tokens_per_micro_batch),
        "--minibatches",
        "2",
        "--no-progress",
        "--overwrite",
        "--out-dir",
        str(out),
    ]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, env=dict(os.environ))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["update"] > 0]
    print(
        f"{'step':>4} {'tok/s':>8} {'gen s':>7} {'score s':>8} {'train s':>8} {'sync s':>7} {'peak GiB':>9}"
    )
    for r in steps:
        print(
            f"{r['update']:4d} {r['gen_tokens_per_s']:8.0f} {r['time_gen_s']:7.2f} {r['time_score_s']:8.2f} "
            f"{r['time_train_s']:8.2f} {r.get('time_sync_s', 0.0):7.2f} {r['peak_memory_mb'] / 1024:9.2f}"
        )
    later = steps[1:] or steps  # the first update includes compilation and warm-up
    summary = {
        "model": model,
        "gpus": args.gpus,
        "gen_tokens_per_s": sum(r["gen_tokens_per_s"] for r in later) / len(later),
        "step_time_s": sum(r["step_time_s"] for r in later) / len(later),
        "time_split": {
            k: sum(r.get(k, 0.0) for r in later) / len(later)
            for k in ("time_gen_s", "time_score_s", "time_train_s", "time_sync_s")
        },
        "peak_memory_gib": max(r["peak_memory_mb"] for r in steps) / 1024,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
