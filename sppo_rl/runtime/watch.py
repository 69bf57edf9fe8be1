"""What a user watches while a run goes: progress, and whether the run can learn at all.

- :class:`ProgressLines`: where stderr is not a terminal (a log file, a pipe, a batch job), one plain line
  per ``every`` updates or ``seconds`` seconds instead of tqdm's carriage-return frames;
- :func:`not_learning`: the warnings of a run whose updates cannot change the policy (the run loop prints
  each once, on stderr, and lists them in ``summary.json`` under ``"warnings"``).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

FIRST_UPDATES = 10
"""The success / reward is called constant when it is one value in each of the first this many updates
(fewer when the run has fewer, but at least :data:`MIN_UPDATES`)."""
MIN_UPDATES = 3
"""No warning about a constant signal before this many updates."""
RECENT_UPDATES = 10
"""``response_clip_frac`` is averaged over the last this many updates."""
CLIP_LIMIT = 0.5
"""Warn when more than this fraction of the recent responses hit ``--max-new-tokens``."""
SIGNALS = ("success_rate", "reward_mean")
"""The outcome of an update row: the control world's success rate, the LLM world's mean reward."""


def _signal(rows: list[dict[str, Any]]) -> str | None:
    return next((k for k in SIGNALS if any(r.get(k) is not None for r in rows)), None)


SIGNAL_NAMES = {"success_rate": "success rate", "reward_mean": "mean reward", "return": "shaped return"}


def not_learning(rows: list[dict[str, Any]], signal: str | None = None) -> list[dict[str, str]]:
    """The warnings ``[{"kind": ..., "message": ...}]`` of the update rows ``rows`` (rows without a
    success or reward, e.g. the LLM's evaluation before the first update, are skipped). ``signal``: the
    row key the run trains on (a control run with ``--dense``: ``return``, the shaped return); None: the
    first of :data:`SIGNALS` the rows hold. With ``n`` update rows:

    - ``zero_reward`` (an LLM run): ``n >= 1`` and ``reward_mean == 0`` in all ``n`` updates (no response
      was ever paid: often an answer format the verifier does not read); it replaces
      ``constant_signal``, which it implies once ``n >= MIN_UPDATES``;
    - ``constant_signal``: ``n >= MIN_UPDATES`` and the success (reward) is one value in each of the
      first ``min(n, FIRST_UPDATES)``;
    - ``zero_variance``: ``groups_zero_variance == 1`` in every update (every group's outcomes were
      equal, so every group advantage is 0);
    - ``actor_skipped``: ``actor_skipped == 1`` in every update (the policy never took a step);
    - ``responses_cut``: the mean ``response_clip_frac`` of the last ``RECENT_UPDATES`` updates is above
      ``CLIP_LIMIT`` (most responses end at the length limit, not where the model ended them).
    """
    key = signal if signal is not None and any(r.get(signal) is not None for r in rows) else _signal(rows)
    if key is None:
        return []
    updates = [r for r in rows if r.get(key) is not None]
    out: list[dict[str, str]] = []
    first = [r[key] for r in updates[:FIRST_UPDATES]]
    if key == "reward_mean" and all(r[key] == 0 for r in updates):
        out.append(
            {
                "kind": "zero_reward",
                "message": f"the mean reward (reward_mean) was 0 in all {len(updates)} updates: no response was "
                "ever paid, so there is nothing to learn from (answers in a format the verifier does not read? "
                "see --reward-fn boxed-or-last-number, --chat-template, --instruction, --max-new-tokens)",
            }
        )
    elif len(first) >= MIN_UPDATES and len(set(first)) == 1:
        what = SIGNAL_NAMES.get(key, key)
        out.append(
            {
                "kind": "constant_signal",
                "message": f"the {what} ({key}) was {first[0]:g} in each of the first {len(first)} updates: "
                "no outcome differs, so there is nothing to learn from (a task the policy never, or "
                "always, solves?)",
            }
        )
    zero = [r["groups_zero_variance"] for r in updates if r.get("groups_zero_variance") is not None]
    if zero and len(zero) == len(updates) and all(z >= 1.0 for z in zero):
        out.append(
            {
                "kind": "zero_variance",
                "message": f"every group had equal outcomes in all {len(zero)} updates "
                "(groups_zero_variance 1.0): every group advantage is 0",
            }
        )
    skipped = [r["actor_skipped"] for r in updates if r.get("actor_skipped") is not None]
    if skipped and len(skipped) == len(updates) and all(s >= 1 for s in skipped):
        out.append(
            {
                "kind": "actor_skipped",
                "message": f"the actor's step was skipped in all {len(skipped)} updates (actor_skipped 1): "
                "the policy has not changed",
            }
        )
    clip = [
        r["response_clip_frac"] for r in updates[-RECENT_UPDATES:] if r.get("response_clip_frac") is not None
    ]
    if clip and sum(clip) / len(clip) > CLIP_LIMIT:
        out.append(
            {
                "kind": "responses_cut",
                "message": f"{sum(clip) / len(clip):.0%} of the responses of the last {len(clip)} updates hit "
                "the length limit (response_clip_frac): they are cut before they end; raise --max-new-tokens",
            }
        )
    return out


class Bar(Protocol):
    """A progress bar over updates: tqdm's, or :class:`ProgressLines`."""

    def update(self, n: int = 1) -> object: ...

    def set_postfix(self, postfix: dict[str, str]) -> None: ...

    def write(self, line: str, file: TextIO | None = None) -> None: ...

    def close(self) -> None: ...


def warn(message: str, bar: Bar | None = None, file: TextIO | None = None) -> None:
    """``[sppo-rl] warning: <message>`` on stderr (through a tqdm bar's ``write``, so the bar stays whole)."""
    line = f"[sppo-rl] warning: {message}"
    stream = file or sys.stderr
    if bar is not None and hasattr(bar, "write"):
        bar.write(line, file=stream)
    else:
        print(line, file=stream, flush=True)


class ProgressLines:
    """tqdm's interface (``update``, ``set_postfix``, ``write``, ``close``) as plain lines on ``file``:
    ``[sppo-rl] <desc> update 12/256 | success 0.31 | sps 1234 | 3.2 s`` after the first update of the
    process, every ``every`` updates (default: ``max(1, total // 20)``), whenever ``seconds`` have
    passed since the last line, and after the last update. Each line is flushed."""

    def __init__(
        self,
        total: int,
        initial: int,
        desc: str,
        unit: str = "update",
        every: int | None = None,
        seconds: float = 30.0,
        file: TextIO | None = None,
    ) -> None:
        self.total, self.n, self.initial, self.desc, self.unit = total, initial, initial, desc, unit
        self.every = every or max(1, total // 20)
        self.seconds = seconds
        self.file = file or sys.stderr
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, postfix: dict[str, str]) -> None:
        now = time.monotonic()
        due = (
            self.n == self.initial + 1
            or self.n % self.every == 0
            or self.n >= self.total
            or now - self.last >= self.seconds
        )
        if not due:
            return
        self.last = now
        fields = [f"{self.unit} {self.n}/{self.total}", *(f"{k} {v}" for k, v in postfix.items())]
        fields.append(f"{now - self.start:.1f} s")
        print(f"[sppo-rl] {self.desc} " + " | ".join(fields), file=self.file, flush=True)

    def write(self, line: str, file: TextIO | None = None) -> None:
        print(line, file=file or self.file, flush=True)

    def close(self) -> None:
        pass
