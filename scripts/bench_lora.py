"""Trainable parameters, model state, checkpoint and weight-sync size: LoRA against full fine-tuning.

    python scripts/bench_lora.py              # the embedded tiny Qwen2 (0.8M) and a ~19M Qwen2, full vs --lora-rank 8
    python scripts/bench_lora.py --rank 16

For each model (built locally, fp32, CPU), the actor (causal LM) and SPPO's critic (backbone + value head),
with full fine-tuning and with LoRA of rank r on the default targets (attention and MLP projections,
alpha = 16): one real AdamW step of the trainer's engine (:class:`sppo_rl.llm.models.engines.HFTorchEngine`) on a
random batch of 4 x 32 tokens, then, counted from the tensors themselves:

- parameters and trainable parameters;
- model state = every parameter + the gradients (counted after ``backward``, before the step) + AdamW's
  state (counted after the step): with LoRA the frozen base weights have no gradient and no moments;
- the checkpoint's ``engine.pt`` size (with LoRA: the trainable tensors and their optimizer state);
- the bytes a rollout engine receives after each update (``engine.sync_state_items()``: the full state,
  or with LoRA the merged weights and biases of the adapted modules only).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from sppo_rl.llm.config import LORA_TARGETS
from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.critic import SequenceCritic
from sppo_rl.llm.models.engines import HFTorchEngine
from sppo_rl.llm.models.lora import apply_lora
from sppo_rl.llm.models.tiny import TINY_CHARSET, TINY_SETTINGS, ensure_tiny_model

MODELS = {
    "tiny (embedded)": dict(TINY_SETTINGS),
    "~19M": dict(hidden_size=512, layers=5, heads=8, kv_heads=2, seed=0, max_position_embeddings=256),
}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(folder: Path, kind: str, rank: int, alpha: float, work: Path) -> dict[str, float]:
    torch.manual_seed(0)
    if kind == "actor":
        model = load_actor(folder, dtype=torch.float32)
        lora_target = model
    else:
        model = SequenceCritic.from_backbone(folder, dtype=torch.float32)
        lora_target = model.backbone
    if rank:
        apply_lora(lora_target, rank, alpha, LORA_TARGETS, seed=0)
    engine = HFTorchEngine(model, lr=1e-4)
    ids = torch.randint(3, 20, (4, 32))
    mask = torch.ones_like(ids)
    model.train()
    if kind == "actor":
        loss = model(input_ids=ids, labels=ids).loss
    else:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids, mask), torch.ones(4))
    engine.backward(loss)
    grads = _bytes(p.grad for p in model.parameters() if p.grad is not None)
    engine.step()
    states = _bytes(t for s in engine.optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    params = list(model.parameters())
    engine.save(work)
    synced = float("nan")
    if kind == "actor":  # each storage once (a tied head is the embedding; vLLM takes it once)
        synced = _bytes({t.data_ptr(): t for _, t in engine.sync_state_items()}.values())
    return {
        "params": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "state_mb": (_bytes(params) + grads + states) / 2**20,
        "ckpt_mb": (work / "engine.pt").stat().st_size / 2**20,
        "sync_mb": synced / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    head = f"{'model':16} {'part':6} {'training':9} {'params':>11} {'trainable':>11} {'%':>6} "
    print(head + f"{'state MiB':>10} {'ckpt MiB':>9} {'sync MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, settings in MODELS.items():
            folder = ensure_tiny_model(Path(tmp) / "models", TINY_CHARSET, **settings)
            for kind in ("actor", "critic"):
                for rank in (0, args.rank):
                    r = measure(folder, kind, rank, args.alpha, Path(tmp) / f"{name}-{kind}-{rank}")
                    label = "full" if rank == 0 else f"LoRA r={rank}"
                    share = 100 * r["trainable"] / r["params"]
                    print(
                        f"{name:16} {kind:6} {label:9} {r['params']:>11,} {r['trainable']:>11,} {share:>6.2f} "
                        f"{r['state_mb']:>10.2f} {r['ckpt_mb']:>9.2f} {r['sync_mb']:>9.2f}"
                    )


if __name__ == "__main__":
    main()
