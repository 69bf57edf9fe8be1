"""How a run turns each prompt into the text the model reads: ``--chat-template``, ``--system-prompt``,
``--instruction``.

Every prompt, a plain string (the generated tasks, GSM8K, MATH, plain records) or chat messages (verl),
becomes a list of messages: a string ``s`` is ``[{"role": "user", "content": s}]``. Then:

1. ``instruction`` (if set) is appended to the last user message, after one space: ``"12+35="`` with
   ``"Answer with just the number."`` becomes ``"12+35= Answer with just the number."``.
2. ``system_prompt`` (if set) replaces the leading system message, or is put first when there is none.
   Unset, the data's messages are kept and a template may add its own default system prompt (SmolLM2's
   does); ``""`` gives an empty system message under a template and none without.
3. With the template on, the text is ``tokenizer.apply_chat_template(messages, tokenize=False,
   add_generation_prompt=True)``; with it off, the messages' contents joined by blank lines (a plain
   string with no options: itself, unchanged).

``chat_template``: ``on`` uses the tokenizer's template (an error if it has none), ``off`` never does,
``auto`` uses it exactly when the tokenizer has one. The embedded tiny model has none, so ``auto`` gives
it the same text as before these options existed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data.files import Example, Message, Prompt

CHAT_TEMPLATE_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class PromptFormat:
    """The three prompt options of a run (see the module docstring)."""

    chat_template: str = "auto"
    system_prompt: str | None = None
    instruction: str | None = None

    def __post_init__(self) -> None:
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise ValueError(
                f"chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {self.chat_template!r}"
            )

    def uses_template(self, tokenizer: Any) -> bool:
        """Whether prompts go through ``tokenizer``'s chat template; ``ValueError`` for ``on`` without one."""
        has = bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template == "on" and not has:
            raise ValueError("--chat-template on: the tokenizer has no chat template")
        return has and self.chat_template != "off"


def messages_of(prompt: Prompt, fmt: PromptFormat, template: bool) -> list[Message]:
    """``prompt`` as chat messages with ``fmt``'s instruction and system prompt applied (steps 1-2)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if fmt.instruction:
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        last = users[-1] if users else len(messages) - 1
        messages[last]["content"] += " " + fmt.instruction
    if fmt.system_prompt is not None:
        if messages and messages[0]["role"] == "system":
            messages = messages[1:]
        if template or fmt.system_prompt:
            messages = [{"role": "system", "content": fmt.system_prompt}, *messages]
    return messages


def render(prompt: Prompt, tokenizer: Any, fmt: PromptFormat) -> str:
    """The text the model reads for ``prompt`` under ``fmt`` (step 3 of the module docstring)."""
    template = fmt.uses_template(tokenizer)
    messages = messages_of(prompt, fmt, template)
    if template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)


def render_examples(examples: list[Example], tokenizer: Any, fmt: PromptFormat) -> list[Example]:
    """``examples`` with each prompt replaced by its rendered text (:func:`render`) and the data's own
    kept in ``given_prompt`` (reward functions receive it); answers, sources, indices and meta unchanged.
    A rendered prompt is a string that :func:`sppo_rl.llm.data.files.render_prompt` returns as is, so the run's
    later steps read it unchanged."""
    return [
        dataclasses.replace(e, prompt=render(e.data_prompt, tokenizer, fmt), given_prompt=e.data_prompt)
        for e in examples
    ]


FORMAT_FILE = "prompt_format.json"
"""The file in an exported actor folder that records its run's :class:`PromptFormat`."""


def save_format(folder: str | Path, fmt: PromptFormat) -> Path:
    """Write ``fmt`` to ``folder/prompt_format.json`` (read back by :func:`load_format`)."""
    from sppo_rl.runtime.files import atomic_write_text

    path = Path(folder) / FORMAT_FILE
    atomic_write_text(path, json.dumps(dataclasses.asdict(fmt), indent=2) + "\n")
    return path


def format_of(settings: dict[str, Any]) -> PromptFormat:
    """The :class:`PromptFormat` of a run's settings (``config.json``'s, or ``prompt_format.json``'s)."""
    mode = settings.get("chat_template") or "auto"
    return PromptFormat(str(mode), settings.get("system_prompt"), settings.get("instruction"))


def load_format(folder: str | Path, run_dir: str | Path | None = None) -> PromptFormat:
    """The prompt options a model was trained with: ``folder/prompt_format.json``, else the run's
    ``config.json`` (``run_dir``), else the defaults (``auto``, no system prompt, no instruction)."""
    for path in (Path(folder) / FORMAT_FILE, Path(run_dir) / "config.json" if run_dir else None):
        if path is not None and path.is_file():
            return format_of(json.loads(path.read_text()))
    return PromptFormat()


def has_chat_template(folder: str | Path) -> bool:
    """Whether the tokenizer saved in ``folder`` has a chat template (a ``chat_template.jinja`` or
    ``chat_template.json`` file, or a ``chat_template`` in ``tokenizer_config.json``), read from its
    files without loading it."""
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def prompt_format(cfg: LLMConfig) -> Any:
    """The run's :class:`sppo_rl.llm.data.prompts.PromptFormat` (``--chat-template``, ``--system-prompt``,
    ``--instruction``)."""
    from sppo_rl.llm.data.prompts import PromptFormat

    return PromptFormat(cfg.chat_template, cfg.system_prompt, cfg.instruction)
