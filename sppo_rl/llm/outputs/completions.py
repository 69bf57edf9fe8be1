"""Sampled completions kept for reading: ``completions.jsonl`` in the run folder, and TensorBoard text.

Every ``--log-completions-every N`` updates (the training samples of that update) and at every evaluation
(the validation samples), :meth:`CompletionLog.write` appends at most ``max_rows`` rows, the first rows of
the batch in order (a group's samples are adjacent, so a group method shows its first prompts' groups)::

    {"update": 10, "split": "train", "prompt": "12+35=", "response": "\\\\boxed{47}", "answer": "47",
     "reward": 1.0, "valid": true}

``update`` is the number of updates done; ``valid`` is false where the reward function failed (its
``reward`` is then a placeholder 0), absent where the caller does not say. A text longer than
``max_chars`` characters is cut to its first ``max_chars`` and marked ``" ... [+N characters]"``, so a
row is bounded whatever the model writes. The same rows go to TensorBoard as one markdown table per call
(tag ``completions/train`` or ``completions/val``) when a text writer is given. On resume, rows are
appended (updates redone after the last checkpoint may appear twice).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

COMPLETIONS_FILE = "completions.jsonl"
MAX_ROWS = 8
MAX_CHARS = 2000


def clip_text(text: str, max_chars: int = MAX_CHARS) -> str:
    """``text`` if it has at most ``max_chars`` characters, else its first ``max_chars`` and
    ``" ... [+N characters]"`` (N the characters cut)."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]} ... [+{len(text) - max_chars} characters]"


def _cell(text: str) -> str:
    """A markdown table cell: pipes escaped, line breaks as <br>."""
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


class CompletionLog:
    """Appends sampled completions to ``folder/completions.jsonl`` (see the module docstring).

    Args:
        folder: the run folder.
        every: training samples are written every this many updates (:meth:`due`); 0: nothing is written.
        text: ``text(tag, markdown, step)``, e.g. a TensorBoard writer's ``add_text``; None: the file only.
        max_rows: rows per call; max_chars: characters per text field.
    """

    def __init__(
        self,
        folder: Path,
        every: int,
        text: Callable[[str, str, int], Any] | None = None,
        *,
        max_rows: int = MAX_ROWS,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self.path = Path(folder) / COMPLETIONS_FILE
        self.every, self.text = every, text
        self.max_rows, self.max_chars = max_rows, max_chars

    def due(self, step: int) -> bool:
        """Whether the training samples of update ``step`` are written."""
        return self.every > 0 and step % self.every == 0

    def write_batch(
        self, step: int, split: str, prompts: list[str], rb: Any, truths: list[str], R: Any, valid: Any = None
    ) -> None:
        """The first ``max_rows`` rows of the rollout batch ``rb`` with their rewards ``R`` (and validity), at
        ``step``: row ``i``'s prompt is ``prompts[rb.prompt_index[i]]``, its reference ``truths[...]``."""
        k = min(len(rb.texts), self.max_rows)
        index = [int(i) for i in rb.prompt_index[:k]]
        self.write(
            step,
            split,
            [prompts[i] for i in index],
            rb.texts[:k],
            [truths[i] for i in index],
            R[:k].tolist(),
            None if valid is None else valid[:k].tolist(),
        )

    def write(
        self,
        step: int,
        split: str,
        prompts: Sequence[str],
        responses: Sequence[str],
        answers: Sequence[str],
        rewards: Sequence[float],
        valid: Sequence[bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Append the first ``max_rows`` items (one per response; ``prompts[i]`` is response ``i``'s
        prompt); the rows written. Nothing when ``every`` is 0."""
        if self.every <= 0:
            return []
        rows = []
        for i in range(min(self.max_rows, len(responses))):
            row: dict[str, Any] = {
                "update": int(step),
                "split": split,
                "prompt": clip_text(str(prompts[i]), self.max_chars),
                "response": clip_text(str(responses[i]), self.max_chars),
                "answer": clip_text(str(answers[i]), self.max_chars),
                "reward": float(rewards[i]),
            }
            if valid is not None:
                row["valid"] = bool(valid[i])
            rows.append(row)
        if not rows:
            return rows
        with open(self.path, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        if self.text is not None:
            lines = ["| prompt | response | answer | reward |", "|---|---|---|---|"]
            for r in rows:
                reward = f"{r['reward']:.3f}" + ("" if r.get("valid", True) else " (invalid)")
                lines.append(
                    f"| {_cell(r['prompt'])} | {_cell(r['response'])} | {_cell(r['answer'])} | {reward} |"
                )
            self.text(f"completions/{split}", "\n".join(lines), int(step))
        return rows
