"""Peak memory of one LLM update against its micro-batch settings, and the recipes' memory table.

    python scripts/bench_memory.py              # measure on CPU (a ~39M-parameter Qwen2, 1,024-2,048-token responses)
    python scripts/bench_memory.py --table-only # only the estimated per-GPU table of the 1.5B and 7B recipes

Measurement: each setting runs in its own process (peak RSS is a high-water mark) through the trainer's
own path: :func:`sppo_rl.llm.trainer.rollout_rows` and :func:`sppo_rl.agents.learner.ppo_update`
(old log-probs in micro-batches, then one training pass with gradient accumulation). It prints the
process's peak RSS before the update (model, AdamW states, one warm-up step) and during it; the
difference is what the update itself holds, which must follow the micro-batch's tokens, not the
minibatch's.

Table: per-GPU memory of training under ZeRO-3 on 8 GPUs with bf16 weights: model states
``16 bytes x parameters / 8`` per model (bf16 weights 2 + bf16 gradients 2 + fp32 master weights,
Adam m and v 12), actor and critic; activations per token of the micro-batch: the logits kept for
the log-prob's backward (``2 x vocab`` bytes) plus, without checkpointing, ``34 x hidden`` bytes per
layer (the usual estimate for a transformer layer with fused attention, 2-byte activations), with
checkpointing one layer's input per layer (``2 x hidden x layers``) plus one layer recomputed
(``34 x hidden``); the vLLM engine's bf16 weights (2 bytes x parameters, one copy per GPU), its KV
cache freed during training by ``--vllm-sleep``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

GB = 1e9
MODEL = dict(
    hidden_size=640, layers=8, heads=10, kv_heads=5, intermediate_size=1920, max_position_embeddings=2304
)
PROMPT = 32


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    """One setting in this process: print one JSON line of measurements."""
    import torch

    from sppo_rl.agents import LearnerConfig, SequenceBatch, forward_rows, get_algorithm, ppo_update
    from sppo_rl.llm.engines import TorchEngine
    from sppo_rl.llm.models import load_actor
    from sppo_rl.llm.rollout import RolloutBatch
    from sppo_rl.llm.trainer import rollout_rows

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    actor = load_actor(args.model, dtype=torch.float32)
    if args.checkpointing:
        actor.gradient_checkpointing_enable()
    engine = TorchEngine(actor, 1e-6)
    n_params = sum(p.numel() for p in actor.parameters())
    vocab = actor.config.vocab_size

    def rollout(rows: int, length: int) -> RolloutBatch:
        g = torch.Generator().manual_seed(1)
        lengths = torch.linspace(length // 2, length, rows).long()
        resp_mask = (torch.arange(length)[None] < lengths[:, None]).long()
        return RolloutBatch(
            prompt_ids=torch.randint(3, vocab, (rows, PROMPT), generator=g),
            prompt_mask=torch.ones(rows, PROMPT, dtype=torch.long),
            response_ids=torch.randint(3, vocab, (rows, length), generator=g) * resp_mask,
            response_mask=resp_mask,
            logprobs=torch.zeros(rows, length),
            sampling_logprobs=torch.zeros(rows, length),
            texts=[""] * rows,
            prompt_index=torch.arange(rows),
            finished=torch.ones(rows, dtype=torch.bool),
            num_generated_tokens=int(resp_mask.sum()),
        )

    def update(rb: RolloutBatch, cfg: LearnerConfig) -> None:
        mask = rb.response_mask.float()
        lengths = rb.response_lengths
        cost = lengths + PROMPT
        actor.eval()
        logp_old = forward_rows(rollout_rows(rb, actor, True, 1.0, "cpu"), lengths, cost, cfg)
        R = (torch.arange(rb.batch_size) % 2).float()
        batch = SequenceBatch(
            mask=mask, logp_old=logp_old, rewards=R, group_ids=torch.zeros(rb.batch_size).long()
        )
        batch.advantages = (2 * R - 1)[:, None] * mask
        batch.loss_mask = mask
        actor.train()
        ppo_update(batch, get_algorithm("grpo"), cfg, rollout_rows(rb, actor, True, 1.0, "cpu"), engine)

    update(rollout(2, 8), LearnerConfig())  # warm-up: AdamW states exist, allocator primed
    before = rss_mb()
    cfg = LearnerConfig(micro_batch_size=args.micro_batch_size, max_tokens_per_micro_batch=args.max_tokens)
    update(rollout(args.rows, args.response), cfg)
    print(
        json.dumps(
            {
                "params_m": n_params / 1e6,
                "rows": args.rows,
                "response": args.response,
                "micro_batch_size": args.micro_batch_size,
                "max_tokens": args.max_tokens,
                "checkpointing": args.checkpointing,
                "rss_before_mb": before,
                "rss_peak_mb": rss_mb(),
                "update_mb": rss_mb() - before,
            }
        )
    )


def measure(threads: int) -> list[dict]:
    from sppo_rl.llm.tiny import build_tiny_model
    from sppo_rl.llm.trainer import TINY_CHARSET

    folder = Path(tempfile.mkdtemp(prefix="bench-memory-")) / "model"
    build_tiny_model(folder, charset=TINY_CHARSET, **MODEL)
    settings = [
        # (rows, response, micro_batch_size, max_tokens, checkpointing)
        (8, 1024, None, None, False),
        (8, 1024, 4, None, False),
        (8, 1024, 2, None, False),
        (8, 1024, 1, None, False),
        (16, 1024, 1, None, False),
        (8, 2048, 1, None, False),
        (8, 2048, None, 4200, False),
        (8, 2048, 1, None, True),
    ]
    out = []
    for rows, resp, mbs, tok, ckpt in settings:
        cmd = [sys.executable, __file__, "--worker", "--model", str(folder), "--rows", str(rows)]
        cmd += ["--response", str(resp), "--threads", str(threads)]
        cmd += ["--micro-batch-size", str(mbs)] if mbs else []
        cmd += ["--max-tokens", str(tok)] if tok else []
        cmd += ["--checkpointing"] if ckpt else []
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)}
        )
        if proc.returncode != 0:
            sys.exit(f"setting {rows, resp, mbs, tok, ckpt} failed:\n{proc.stderr[-2000:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        out.append(row)
        print(
            f"rows {rows:3d} x response {resp:5d}  micro-batch "
            f"{(str(mbs) + ' rows') if mbs else (str(tok) + ' tokens') if tok else 'whole':>11}"
            f"{'  +ckpt' if ckpt else '       '}  peak {row['rss_peak_mb']:8.0f} MiB  update {row['update_mb']:7.0f} MiB",
            flush=True,
        )
    return out


# ----------------------------------------------------------------------------------- the recipes' table

ARCH = {  # from the models' config.json (Qwen2 architecture)
    "1.5B": dict(params=1.777e9, hidden=1536, layers=28, vocab=151936),
    "7B": dict(params=7.616e9, hidden=3584, layers=28, vocab=152064),
}
RECIPES = [  # (recipe, actor, critic or None, tokens per micro-batch)
    ("sppo-1.5b-deepscaler", "1.5B", "1.5B", 16384),
    ("ppo-1.5b-deepscaler", "1.5B", "1.5B", 16384),
    ("grpo-1.5b-deepscaler", "1.5B", None, 16384),
    ("sppo-7b-dapo", "7B", "7B", 12288),
    ("sppo-7b-dapo-1.5b-critic", "7B", "1.5B", 12288),
    ("grpo-7b-dapo", "7B", None, 12288),
]


def per_token(arch: dict, checkpointing: bool) -> float:
    """Activation bytes per token of a micro-batch (see the module docstring)."""
    h, L, V = arch["hidden"], arch["layers"], arch["vocab"]
    layers = (2 * h * L + 34 * h) if checkpointing else 34 * h * L
    return layers + 2 * V


def table(gpus: int = 8) -> list[dict]:
    rows = []
    for name, actor, critic, tokens in RECIPES:
        a = ARCH[actor]
        states = 16 * a["params"] / gpus + (16 * ARCH[critic]["params"] / gpus if critic else 0)
        vllm = 2 * a["params"]
        for ckpt in (True, False):
            act = tokens * max(per_token(a, ckpt), per_token(ARCH[critic], ckpt) if critic else 0)
            rows.append(
                {
                    "recipe": name,
                    "checkpointing": ckpt,
                    "states_gb": states / GB,
                    "act_per_token_kb": per_token(a, ckpt) / 1e3,
                    "tokens": tokens,
                    "activations_gb": act / GB,
                    "vllm_weights_gb": vllm / GB,
                    "total_gb": (states + act + vllm) / GB,
                }
            )
    return rows


def print_table() -> None:
    print(
        "\nPer-GPU memory of training, ZeRO-3 on 8 GPUs, bf16 (estimate; formulas in scripts/bench_memory.py):"
    )
    print(
        f"{'recipe':27s} {'ckpt':>5s} {'states GB':>9s} {'act KB/tok':>10s} {'tokens':>6s} {'act GB':>7s} "
        f"{'vLLM w GB':>9s} {'total GB':>8s} {'fits 80':>7s} {'fits 141':>8s}"
    )
    for r in table():
        print(
            f"{r['recipe']:27s} {'yes' if r['checkpointing'] else 'no':>5s} {r['states_gb']:9.1f} "
            f"{r['act_per_token_kb']:10.0f} {r['tokens']:6d} {r['activations_gb']:7.1f} {r['vllm_weights_gb']:9.1f} "
            f"{r['total_gb']:8.1f} {'yes' if r['total_gb'] < 80 * 0.9 else 'no':>7s} "
            f"{'yes' if r['total_gb'] < 141 * 0.9 else 'no':>8s}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--micro-batch-size", type=int)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--table-only", action="store_true", help="print only the recipes' estimated table")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.table_only:
        rows = measure(args.threads)
        whole, one = rows[0]["update_mb"], rows[3]["update_mb"]
        print(
            f"\nupdate memory: whole minibatch of 8 rows {whole:.0f} MiB -> 1 row per micro-batch {one:.0f} MiB "
            f"({whole / max(one, 1):.1f}x less); 16 rows at 1 row per micro-batch: {rows[4]['update_mb']:.0f} MiB"
        )
    print_table()


if __name__ == "__main__":
    main()
