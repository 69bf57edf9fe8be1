"""The model card (``README.md``) of an exported actor folder: what trained it, on what, how long, and
how it ended, so a folder copied away from its run still says what it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sppo_rl.runtime.files import atomic_write_text


def model_card(cfg: Any, summary: dict[str, Any], rows: list[dict[str, Any]], warnings: list[str]) -> str:
    """Markdown: the algorithm, the starting model, the data, the updates and samples, the summary's
    validation accuracies and the last update's mean reward, and the run's not-learning warnings."""
    import sppo_rl

    def fmt(v: Any) -> str:
        return "n/a" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))

    updates = [r for r in rows if r.get("reward_mean") is not None]
    start = cfg.model or "the embedded tiny Qwen2 model, warm-started on the task"
    data = cfg.task if cfg.task in ("arithmetic", "scratchpad") else Path(cfg.task).name
    if cfg.task in ("arithmetic", "scratchpad"):
        data += f" (generated: level {', '.join(map(str, cfg.level))}, data seed {cfg.data_seed})"
    lines = [
        "---",
        "library_name: transformers",
        "tags: [sppo-rl, reinforcement-learning, rlvr]",
        "---",
        "",
        f"# {summary['algo']} actor trained with sppo-rl {sppo_rl.__version__}",
        "",
        f"- algorithm: `{summary['algo']}`; seed {summary['seed']}",
        f"- started from: {start}",
        f"- training data: {data}; validation: {cfg.val_data or ('generated' if cfg.task == 'arithmetic' else 'none')}",
        f"- updates: {summary['steps']} of {cfg.prompts_per_step} prompts x {summary['group_size']} samples; "
        f"{summary['generated_tokens']} generated tokens; max_new_tokens {cfg.max_new_tokens}",
        f"- validation accuracy: start {fmt(summary.get('start_val_accuracy'))}, final "
        f"{fmt(summary.get('final_val_accuracy'))}, best {fmt(summary.get('best_val_accuracy'))}",
        f"- last update's mean reward: {fmt(updates[-1]['reward_mean'] if updates else None)}",
    ]
    if warnings:
        lines += ["", "## Warnings of the run", "", *(f"- {w}" for w in warnings)]
    settings = {k: v for k, v in vars(cfg).items() if k in ("actor_lr", "clip", "kl_coef", "temperature")}
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
        "```",
        "",
        f"Some settings: `{json.dumps(settings, default=str)}`; all of them are in the run folder's config.json.",
        "",
    ]
    return "\n".join(lines)


def write_model_card(
    folder: Path, cfg: Any, summary: dict[str, Any], rows: list[dict[str, Any]], warnings: list[str]
) -> Path:
    path = Path(folder) / "README.md"
    atomic_write_text(path, model_card(cfg, summary, rows, warnings))
    return path
