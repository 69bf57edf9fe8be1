"""The model card (``README.md``) of an exported actor folder: what trained it, on what, how long, and
how it ended, so a folder copied away from its run still says what it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sppo_rl.runtime.files import atomic_write_text

if TYPE_CHECKING:
    from sppo_rl.llm.data.prompts import PromptFormat
    from sppo_rl.llm.plan import Plan


def model_card(
    plan: Plan,
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    warnings: list[str],
    template: bool = False,
) -> str:
    """Markdown (of the run ``plan``): the algorithm, the starting model, the data, the updates and samples, the summary's
    validation accuracies and the last update's mean reward, the run's not-learning warnings, and how
    its prompts were rendered (``template``: through the tokenizer's chat template) with a use example
    that renders them the same way."""
    import sppo_rl

    def fmt(v: Any) -> str:
        return "n/a" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))

    updates = [r for r in rows if r.get("reward_mean") is not None]
    d, rollout = plan.data, plan.rollout
    start = plan.models.model or "the embedded tiny Qwen2 model, warm-started on the task"
    data = d.task if d.task in ("arithmetic", "scratchpad") else Path(d.task).name
    if d.task in ("arithmetic", "scratchpad"):
        data += f" (generated: level {', '.join(map(str, d.level))}, data seed {d.data_seed})"
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
        f"- training data: {data}; validation: {d.val_data or ('generated' if d.task == 'arithmetic' else 'none')}",
        f"- updates: {summary['updates']} of {rollout.prompts_per_step} prompts x {summary['group_size']} samples; "
        f"{summary['generated_tokens']} generated tokens; max_new_tokens {rollout.max_new_tokens}",
        f"- validation accuracy, sampled: start {fmt(summary.get('start_val_accuracy'))}, final "
        f"{fmt(summary.get('final_val_accuracy'))}, best {fmt(summary.get('best_val_accuracy'))}; greedy: start "
        f"{fmt(summary.get('start_greedy_accuracy'))}, final {fmt(summary.get('final_greedy_accuracy'))}",
        f"- last update's mean reward: {fmt(updates[-1]['reward_mean'] if updates else None)}",
    ]
    if warnings:
        lines += ["", "## Warnings of the run", "", *(f"- {w}" for w in warnings)]
    settings = {
        "clip": plan.learner.clip,
        "temperature": rollout.temperature,
        "actor_lr": plan.models.actor_lr,
        "kl_coef": plan.update.kl_coef,
    }
    lines += ["", *prompt_lines(d.prompt_format, template)]
    lines += [
        "",
        f"Some settings: `{json.dumps(settings, default=str)}`; all of them are in the run folder's config.json.",
        "",
    ]
    return "\n".join(lines)


def prompt_lines(fmt: PromptFormat, template: bool) -> list[str]:
    """The card's "Prompts" and "Use" sections: how the run turned a prompt into the model's text
    (:func:`sppo_rl.llm.data.prompts.render` with ``fmt``; ``template``: whether the chat template
    was applied), and the same rendering with ``transformers`` and with ``LLMPolicy``."""
    instruction, system = fmt.instruction, fmt.system_prompt
    how = [
        "## Prompts",
        "",
        "The model was trained on prompts rendered this way (prompt_format.json; `LLMPolicy.generate` "
        "does the same):",
        "",
        "- a plain-text prompt is one user message",
        f"- instruction appended to the last user message after a space: {json.dumps(instruction) if instruction else 'none'}",
        f"- system prompt: {json.dumps(system) if system is not None else 'none (the template default, if any)'}",
        f"- chat template: {'applied, with the generation prompt' if template else 'not applied; message contents joined by blank lines'}",
        "",
        "## Use",
        "",
        "```python",
    ]
    q = json.dumps("What is 41 + 74?" + (f" {instruction}" if instruction else ""))
    if template:
        messages = f'[{{"role": "user", "content": {q}}}]'
        if system is not None:
            messages = f'[{{"role": "system", "content": {json.dumps(system)}}}, {messages[1:]}'
        how += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
            f"text = tokenizer.apply_chat_template({messages}, tokenize=False, add_generation_prompt=True)",
        ]
    else:
        text = q if not system else json.dumps(f"{system}\n\n" + json.loads(q))
        how += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
            f"text = {text}",
        ]
    how += [
        "ids = tokenizer(text, return_tensors='pt', add_special_tokens=False)",
        "out = model.generate(**ids, max_new_tokens=32, do_sample=False)",
        "print(tokenizer.decode(out[0, ids['input_ids'].shape[1]:], skip_special_tokens=True))",
        "# or, rendering exactly as in training:",
        "from sppo_rl import LLMPolicy",
        'print(LLMPolicy.load("<this folder>").generate(["What is 41 + 74?"]))',
        "```",
    ]
    return how


def write_model_card(
    folder: Path, plan: Plan, summary: dict[str, Any], rows: list[dict[str, Any]], warnings: list[str]
) -> Path:
    from sppo_rl.llm.data.prompts import has_chat_template

    path = Path(folder) / "README.md"
    template = plan.data.prompt_format.chat_template != "off" and has_chat_template(folder)
    atomic_write_text(path, model_card(plan, summary, rows, warnings, template))
    return path
