"""A long-horizon verifiable task: multi-digit arithmetic worked out on a written scratchpad.

The prompt is an expression followed by ``=`` (``"4738+2591="``); the reference response works the
columns right to left, one step per column, each step naming the column's digits, the carry in, their
two-digit sum ``s`` and the answer's digits so far (``s mod 10`` written in front of the previous
step's); a last step writes a final carry; then the answer is boxed::

    4738+2591=  ->  8+1+0=09 9; 3+9+0=12 29; 7+5+1=13 329; 4+2+1=07 7329; \\boxed{7329}
    4738*7=     ->  8*7+0=56 6; 3*7+5=26 66; 7*7+2=51 166; 4*7+5=33 3166; 0*7+3=03 33166; \\boxed{33166}

Long multiplication (level 5) writes one product per digit of the right factor, then adds them, the
second shifted by one column (``"473*26="``)::

    473*6: 3*6+0=18 8; 7*6+1=43 38; 4*6+4=28 838; 0*6+2=02 2838; 473*2: 3*2+0=06 6; 7*2+0=14 46;
    4*2+1=09 946; 2838+9460: 8+0+0=08 8; 3+6+0=09 98; 8+4+0=12 298; 2+9+1=12 2298; 0+0+1=01 12298;
    \\boxed{12298}

Every step is a local rule (copy a digit, one-digit sum or product, carry = the sum's first digit), so
a character-level model can learn it, but one wrong step anywhere makes the boxed answer wrong: the
outcome is decided across the whole response, which is what separates a prompt-level critic (SPPO)
from a per-token one (PPO) and from N samples per prompt (GRPO). Only the boxed answer is rewarded
(:data:`REWARD_FN`, :func:`sppo_rl.llm.rewards.verify.verify_integer`): a wrong scratchpad with the right box
is paid, a right scratchpad with a wrong box is not.

Operands have exactly the level's number of digits (a leading digit of 1-9). Response lengths in
characters (one token each with the tiny tokenizer, plus EOS), measured over every problem of level 5
and the all-nines worst case of the others (``tests/test_scratchpad.py`` checks them):

=====  ==============================================  ===========  ============
level  problem                                         steps        characters
=====  ==============================================  ===========  ============
1      a + b, each 4 digits                            4 or 5       66-83
2      a + b, each 6 digits                            6 or 7       101-120
3      a + b + c, each 5 digits                        5 or 6       93-113
4      a * d, a of 6 digits, d in 2..9                 6 or 7       101-120
5      a * b, a of 3 digits, b of 2 digits (no zero)   10 to 14     168-217
=====  ==============================================  ===========  ============

Splits are made by :func:`sppo_rl.llm.data.arithmetic.generated_splits`, as for the arithmetic task:
deterministic in ``seed`` and disjoint; the validation split is drawn first from its own stream (it
depends only on ``(seed, n_val, level)``), the training split from a second stream that skips every
validation prompt and duplicate, so a larger ``n_train`` extends the same list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from sppo_rl.llm.data.arithmetic import generated_splits
from sppo_rl.llm.data.files import Example

SOURCE = "scratchpad"
REWARD_FN = "integer"
"""The built-in reward of :class:`sppo_rl.llm.rewards.scorer.RewardScorer` that scores this task."""

SEPARATOR = "; "
"""Between two steps of the scratchpad (the tiny tokenizer has no newline)."""


@dataclass(frozen=True)
class Level:
    """How one difficulty level draws a problem, and how long its reference responses are.

    Attributes:
        kind: ``"add"`` (column addition of ``operands`` numbers), ``"mul"`` (a number times one digit
            2..9) or ``"long"`` (a number times a two-digit number with no zero digit).
        digits: digits of each operand (of the left factor for the products).
        operands: how many numbers are added (``"add"`` only).
        min_chars: the shortest reference response of the level, in characters.
        max_chars: the longest one.
    """

    kind: Literal["add", "mul", "long"]
    digits: int
    operands: int = 2
    min_chars: int = 0
    max_chars: int = 0


LEVELS: dict[int, Level] = {
    1: Level("add", 4, 2, 66, 83),
    2: Level("add", 6, 2, 101, 120),
    3: Level("add", 5, 3, 93, 113),
    4: Level("mul", 6, min_chars=101, max_chars=120),
    5: Level("long", 3, min_chars=168, max_chars=217),
}

MARGIN = 16
"""Tokens of ``--max-new-tokens`` beyond the longest reference (and its EOS) of the chosen levels."""


def max_new_tokens(levels: tuple[int, ...] | list[int]) -> int:
    """The default response budget for ``levels``: the longest reference of any of them, plus its EOS,
    plus :data:`MARGIN` (level 1: 83 + 1 + 16 = 100). Unknown levels are ignored here (the task refuses them)."""
    known = [LEVELS[lv].max_chars for lv in levels if lv in LEVELS]
    return max(known or [lv.max_chars for lv in LEVELS.values()]) + 1 + MARGIN


def capacity(level: Level) -> int:
    """How many distinct prompts ``level`` can produce."""
    numbers = 9 * 10 ** (level.digits - 1)  # exactly `digits` digits
    if level.kind == "add":
        return numbers**level.operands
    return numbers * (8 if level.kind == "mul" else 81)


def column_steps(numbers: list[int], times: int | None = None) -> tuple[list[str], str]:
    """The steps of column addition of ``numbers`` (or of ``numbers[0] * times``), right to left.

    Column ``k`` (0 = units) with digits ``x_i`` (0 where a number is shorter) and carry ``c`` in gives
    ``s = sum_i x_i + c`` (addition) or ``s = x_0 * times + c`` (product), written ``"x+y+c=ss p"`` or
    ``"x*t+c=ss p"``, where ``ss`` is ``s`` in two digits and ``p`` is ``s mod 10`` written in front of
    the previous step's ``p``; the next carry is ``s // 10``. A carry left after the last column gets
    one more step whose digits are 0. Returns the steps and the last ``p`` (the result's digits).
    """
    rev = [str(n)[::-1] for n in numbers]
    width = max(len(r) for r in rev)
    carry, partial, steps = 0, "", []
    for k in range(width + 1):
        if k == width and carry == 0:
            break
        digits = [int(r[k]) if k < len(r) else 0 for r in rev]
        s = (digits[0] * times if times is not None else sum(digits)) + carry
        partial = str(s % 10) + partial
        lhs = f"{digits[0]}*{times}" if times is not None else "+".join(map(str, digits))
        steps.append(f"{lhs}+{carry}={s:02d} {partial}")
        carry = s // 10
    return steps, partial


def scratchpad(level: Level, operands: list[int]) -> tuple[str, int]:
    """The prompt and the reference response's steps (without the box) for ``operands`` of ``level``,
    and the value; see the module docstring for the format."""
    if level.kind == "add":
        steps, _ = column_steps(operands)
        return SEPARATOR.join(steps), sum(operands)
    a, b = operands
    if level.kind == "mul":
        steps, _ = column_steps([a], times=b)
        return SEPARATOR.join(steps), a * b
    low, high = b % 10, b // 10
    steps_low, p_low = column_steps([a], times=low)
    steps_high, p_high = column_steps([a], times=high)
    steps_sum, _ = column_steps([int(p_low), int(p_high + "0")])
    parts = [f"{a}*{low}: " + SEPARATOR.join(steps_low), f"{a}*{high}: " + SEPARATOR.join(steps_high)]
    parts.append(f"{p_low}+{p_high}0: " + SEPARATOR.join(steps_sum))
    return SEPARATOR.join(parts), a * b


def _draw(rng: random.Random, level: Level) -> tuple[str, int]:
    """A random problem of ``level``: its prompt and value."""
    lo, hi = 10 ** (level.digits - 1), 10**level.digits - 1
    if level.kind == "add":
        operands = [rng.randint(lo, hi) for _ in range(level.operands)]
        return "+".join(map(str, operands)) + "=", sum(operands)
    a = rng.randint(lo, hi)
    b = rng.randint(2, 9) if level.kind == "mul" else 10 * rng.randint(1, 9) + rng.randint(1, 9)
    return f"{a}*{b}=", a * b


def parse_prompt(prompt: str) -> tuple[Level, list[int]]:
    """The level and operands of a prompt this task wrote (``"473*26="``); ``ValueError`` otherwise."""
    body = prompt.removesuffix("=")
    op = "*" if "*" in body else "+"
    parts = body.split(op)
    if not prompt.endswith("=") or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a scratchpad prompt: {prompt!r}")
    operands = [int(p) for p in parts]
    for level in LEVELS.values():
        kind = "add" if op == "+" else ("mul" if len(parts[1]) == 1 else "long")
        if level.kind == kind and len(parts[0]) == level.digits and len(parts) == level.operands:
            return level, operands
    raise ValueError(f"no level writes {prompt!r}")


def reference_response(example: Example) -> str:
    """The supervised target for ``example``: its scratchpad, then ``\\boxed{<answer>}``."""
    level, operands = parse_prompt(str(example.prompt))
    steps, value = scratchpad(level, operands)
    if str(value) != example.answer:
        raise ValueError(f"{example.prompt!r}: the answer {example.answer!r} is not {value}")
    return f"{steps}{SEPARATOR}\\boxed{{{value}}}"


def make_scratchpad(
    seed: int, n_train: int, n_val: int, level: int | tuple[int, ...] = 1
) -> tuple[list[Example], list[Example]]:
    """Train and validation examples of the scratchpad task, disjoint by prompt and without duplicates.

    ``level`` is one of :data:`LEVELS` or a tuple of them (each example draws its level uniformly from
    the tuple; ``meta["level"]`` records it). Raises ``ValueError`` for an unknown level, negative
    sizes, or more prompts than the levels can supply (:func:`capacity`). The splits are drawn by
    :func:`sppo_rl.llm.data.arithmetic.generated_splits`.
    """
    return generated_splits(SOURCE, LEVELS, level, _draw, capacity, seed, n_train, n_val)
