"""Peak memory of one LLM update against its micro-batch settings, and the recipes' memory table.

    python scripts/bench_memory.py              # measure on CPU (a ~39M-parameter Qwen2, 1,024-2,048-token responses)
    python scripts/bench_memory.py --table-only # only the estimated per-GPU table of the 1.5B and 7B recipes
    python scripts/bench_memory.py --critics    # SPPO's critic size vs peak memory: real `sppo-rl llm` runs

Measurement: each setting runs in its own process (peak RSS is a high-water mark) through the trainer's
own path: :func:`sppo_rl.llm.stages.to_batch.rollout_rows` and :func:`sppo_rl.agents.learner.ppo_update`
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

Critics (``--critics``): whole ``sppo-rl llm`` runs, each in its own process, on a locally built 183M-parameter
Qwen2 actor (:data:`CRITIC_MODELS`), one per configuration of :data:`CRITIC_RUNS` (SPPO with an
actor-size critic, a paper-ratio critic and the small critic; GRPO without a critic; PPO with an
actor-size token critic), all with the same prompts per update, response length and micro-batch.
The reward is the response length's parity (:func:`parity_reward`), so every actor trains. Each run's
peak is ``peak_memory_mb`` of its ``summary.json`` (the process's peak RSS on CPU). Beside it: the
exact model state of actor and critic, ``16 x parameters`` bytes (fp32 weights, gradients and AdamW's
two moments, :func:`model_state_bytes`), and the peak of the same process with no update (GRPO with
reward 0: every actor update skipped), so the table shows how much of each peak is model state.
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

    from sppo_rl.agents.algorithms import get_algorithm
    from sppo_rl.agents.batch import SequenceBatch
    from sppo_rl.agents.learner import LearnerConfig, forward_rows, ppo_update
    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.engines import HFTorchEngine
    from sppo_rl.llm.rollout.base import RolloutBatch
    from sppo_rl.llm.stages.to_batch import rollout_rows

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    actor = load_actor(args.model, dtype=torch.float32)
    if args.checkpointing:
        actor.gradient_checkpointing_enable()
    engine = HFTorchEngine(actor, 1e-6)
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
    from sppo_rl.llm.models.tiny import TINY_CHARSET, build_tiny_model

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


# ----------------------------------------------------------------------------------- critics' peak memory

CRITIC_MODELS = {  # build_tiny_model settings (Qwen2, the embedded model's charset and tokenizer)
    # actor: 183M parameters, the largest whose run stays near a minute of CPU time on one core
    "actor": dict(hidden_size=1024, layers=12, heads=16, kv_heads=4, max_position_embeddings=256),
    # 0.22x the actor, as the paper's 1.5B critic is 0.23x its 7B actor
    "paper-ratio": dict(hidden_size=512, layers=10, heads=8, kv_heads=4, max_position_embeddings=256),
    # the embedded tiny model (sppo_rl.llm.models.tiny.TINY_SETTINGS, the same cached folder): 1.0M parameters
    "small": dict(hidden_size=128, layers=4, heads=4, kv_heads=2, seed=0, max_position_embeddings=256),
}
CRITIC_RUNS = [  # (configuration, --algo, critic model or None for no critic)
    ("SPPO, actor-size critic", "sppo", "actor"),
    ("SPPO, paper-ratio critic", "sppo", "paper-ratio"),
    ("SPPO, small critic", "sppo", "small"),
    ("GRPO (N=8), no critic", "grpo", None),
    ("PPO, actor-size token critic", "ppo", "actor"),
]
CRITIC_FLAGS = [  # the same for every run: 4 prompts per update (GRPO: 8 responses each), 2-row passes
    "--updates", "2", "--prompts-per-step", "4", "--max-new-tokens", "16", "--micro-batch-size", "2",
    "--eval-every", "1000", "--val-size", "2", "--eval-samples", "1", "--checkpoint-every", "1000",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip
PAPER_GPU = {"actor-size critic": 0.915, "1.5B critic": 0.787}  # SPPO, 7B actor: GPU memory in use


def parity_reward(response: str, truth: str) -> float:
    """The runs' reward: the parity of the response's length. It varies within every group of samples,
    so every algorithm's actor trains (an untrained model never solves the arithmetic: GRPO's
    advantages would all be 0 and its actor update skipped, holding no gradients or AdamW moments)."""
    return float(len(response) % 2)


def zero_reward(response: str, truth: str) -> float:
    """The no-update run's reward: always 0, so GRPO skips every actor update (the same process as
    the others, models loaded, generating, evaluating and exporting, without training)."""
    return 0.0


def qwen2_params(config: dict, value_head: bool = False) -> int:
    """Parameters of a Qwen2 model from its ``config.json`` (``value_head``: a critic's backbone + head).

    ``V h`` embedding, then per layer ``q`` (``h x h`` + bias ``h``), ``k`` and ``v`` (``h x kv`` + bias
    ``kv`` each, ``kv = kv_heads x h / heads``), ``o`` (``h x h``, no bias), the MLP (``3 h I``) and two
    RMSNorms (``2 h``); the final norm ``h``; the LM head ``V h`` unless tied to the embedding. A critic
    is the backbone (no LM head) plus a linear head ``h + 1``.
    """
    h, V, L = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * config["intermediate_size"] + 2 * h
    backbone = V * h + L * layer + h
    if value_head:
        return backbone + h + 1
    return backbone + (0 if config.get("tie_word_embeddings", True) else V * h)


def model_state_bytes(params: int) -> int:
    """Training state of a model in fp32 with AdamW: weights, gradients, first and second moments,
    ``4 x 4 = 16`` bytes per parameter (the learner steps actor and critic after both backward passes
    of a minibatch, so both models' gradients are alive together)."""
    return 16 * params


def critic_command(
    algo: str, actor: str, critic: str | None, out: str, reward: str = "parity_reward"
) -> list[str]:
    """The ``sppo-rl llm`` command of one configuration (its own process)."""
    cmd = [sys.executable, "-m", "sppo_rl", "llm", "--algo", algo, "--model", actor]
    cmd += ["--critic-model", critic] if critic else []
    cmd += ["--reward-fn", f"{Path(__file__).resolve()}:{reward}"]
    return cmd + CRITIC_FLAGS + ["--out-dir", out]


def critic_rows(runs: list[dict], base_mib: float | None) -> list[dict]:
    """The table's rows: each run (``name``, ``state_bytes``, ``peak_mib`` or None for a failed run)
    with its model state in MiB, the share of its peak that is model state, the rest beyond the state
    and ``base_mib`` (the no-update run's peak less its actor weights: what the process holds besides
    model state), and its peak over the first run's (SPPO, actor-size critic; None where either is
    missing)."""
    ref = runs[0]["peak_mib"] if runs else None
    rows = []
    for r in runs:
        peak, state = r["peak_mib"], r["state_bytes"] / 2**20
        rows.append(
            {
                **r,
                "state_mib": state,
                "state_frac": state / peak if peak else None,
                "other_mib": peak - state - base_mib if peak and base_mib is not None else None,
                "vs_actor_critic": peak / ref if peak and ref else None,
            }
        )
    return rows


def critic_table(rows: list[dict], no_update_mib: float | None, base_mib: float | None) -> str:
    """The Markdown table of :func:`critic_rows`, a failed run marked as such, and the paper's ratio."""

    def num(x: float | None, fmt: str) -> str:
        return "failed" if x is None else format(x, fmt)

    lines = [
        "| configuration | actor + critic parameters | model state MiB | peak RSS MiB | state / peak "
        "| rest MiB | peak / SPPO actor-size critic |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        params = f"{r['actor_params'] / 1e6:.1f}M + " + (
            f"{r['critic_params'] / 1e6:.1f}M" if r["critic_params"] else "none"
        )
        lines.append(
            f"| {r['name']} | {params} | {r['state_mib']:,.0f} | {num(r['peak_mib'], ',.0f')} "
            f"| {num(r['state_frac'], '.0%')} | {num(r['other_mib'], ',.0f')} | {num(r['vs_actor_critic'], '.2f')} |"
        )
    paper = PAPER_GPU["1.5B critic"] / PAPER_GPU["actor-size critic"]
    lines.append(
        f"| paper (GPU, 7B actor): 1.5B vs 7B critic | | | {PAPER_GPU['actor-size critic']:.1%} -> "
        f"{PAPER_GPU['1.5B critic']:.1%} of the GPU | | | {paper:.2f} |"
    )
    lines.append(
        f"\nno-update run (GRPO, reward 0: the actor never steps): peak {num(no_update_mib, ',.0f')} MiB, "
        f"of which {num(base_mib, ',.0f')} MiB is not the actor's weights (python, torch, transformers, "
        "generation): the base of 'rest'"
    )
    return "\n".join(lines)


def run_critic(cmd: list[str], env: dict, out: str) -> dict:
    """Run one configuration; its peak (``summary.json``), its updates that stepped the actor
    (``metrics.jsonl``), its wall and CPU seconds. A failed run has ``peak_mib`` None."""
    import shutil
    import time

    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary, metrics = Path(out) / "summary.json", Path(out) / "metrics.jsonl"
    peak = json.loads(summary.read_text())["peak_memory_mb"] if summary.is_file() else None
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    if peak is None:
        print(f"failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)  # checkpoints and exports: GBs each
    return {
        "peak_mib": peak,
        "actor_updates": sum(1 for s in steps if s.get("actor_skipped") == 0),
        "wall_s": wall,
        "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
    }


def measure_critics(threads: int) -> None:
    """Build the models (cached), run the no-update baseline and every configuration, print the table
    and a JSON last line."""
    from sppo_rl.llm.models.sources import default_cache_dir
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    folders = {k: ensure_tiny_model(default_cache_dir(), TINY_CHARSET, **v) for k, v in CRITIC_MODELS.items()}
    config = {k: json.loads((f / "config.json").read_text()) for k, f in folders.items()}
    actor_params = qwen2_params(config["actor"])

    def show(name: str, r: dict) -> None:
        peak = "failed" if r["peak_mib"] is None else f"{r['peak_mib']:.0f} MiB"
        print(
            f"{name:30s} peak {peak:>9s}  actor updates {r['actor_updates']}  "
            f"({r['cpu_s']:.0f} s CPU, {r['wall_s']:.0f} s wall)",
            flush=True,
        )

    out = tempfile.mkdtemp(prefix="bench-critics-")
    base = run_critic(critic_command("grpo", str(folders["actor"]), None, out, "zero_reward"), env, out)
    show("no update (GRPO, reward 0)", base)
    no_update = base["peak_mib"]
    base_mib = no_update - 4 * actor_params / 2**20 if no_update is not None else None
    runs = []
    for name, algo, critic in CRITIC_RUNS:
        out = tempfile.mkdtemp(prefix="bench-critics-")
        cmd = critic_command(algo, str(folders["actor"]), str(folders[critic]) if critic else None, out)
        r = run_critic(cmd, env, out)
        show(name, r)
        critic_params = qwen2_params(config[critic], value_head=True) if critic else 0
        state = model_state_bytes(actor_params) + model_state_bytes(critic_params)
        runs.append(
            {"name": name, "algo": algo, "actor_params": actor_params, "critic_params": critic_params}
            | {"state_bytes": state, **r}
        )
    rows = critic_rows(runs, base_mib)
    print("\n" + critic_table(rows, no_update, base_mib))
    paper = PAPER_GPU["1.5B critic"] / PAPER_GPU["actor-size critic"]
    print(
        json.dumps(
            {
                "no_update_mib": no_update,
                "base_mib": base_mib,
                "paper_ratio": paper,
                "flags": CRITIC_FLAGS,
                "rows": rows,
            }
        )
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
    ap.add_argument("--critics", action="store_true", help="SPPO's critic size vs peak memory (real runs)")
    args = ap.parse_args()
    if args.threads < 1:
        print(f"bench_memory.py: error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        raise SystemExit(2)
    if args.worker:
        return worker(args)
    if args.critics:
        return measure_critics(args.threads)
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
