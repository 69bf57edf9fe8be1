"""A synthetic verifiable task: integer arithmetic with difficulty levels, for tiny models on a CPU.

A prompt is an expression followed by ``=`` (``"12+35="``); the reference response boxes the integer
value (``"\\boxed{47}"``), scored by :func:`sppo_rl.llm.rewards.verify.verify_integer`. Prompts have at most
12 characters and responses at most 14, so a character-level model learns the format fast.

==========  ===============  =========================================================  ================
level       operands         operators                                                  answer range
==========  ===============  =========================================================  ================
1           2, each 0..99    ``+``                                                      0..198
2           2, each 0..99    ``+ -``                                                    -99..198
3           3, each 0..99    ``+ -``                                                    -198..297
4           2 or 3, 0..99    ``+ - *``, at most one ``*``, whose right factor is 0..9    -990..990
5           3, each 0..999   ``+ - *``, at most one ``*``, whose right factor is 0..99   -99900..99900
==========  ===============  =========================================================  ================

Usual precedence applies (``*`` before ``+``/``-``, left to right otherwise). Splits are deterministic
in ``seed`` and disjoint: the validation split is drawn first from its own stream, so it depends only on
``(seed, n_val, level)``; the training split is drawn from a second stream, skipping every validation
prompt and duplicate, so a larger ``n_train`` extends the same list.
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from sppo_rl.llm.data.files import Example

SOURCE = "arithmetic"
REWARD_FN = "integer"
"""The built-in reward of :class:`sppo_rl.llm.rewards.scorer.RewardScorer` that scores this task."""

ARITHMETIC_CHARSET = "".join(sorted(set(string.digits + "+-*=" + "\\boxed{}")))
"""Every character a prompt or a reference response can contain."""


def charset() -> str:
    """The characters of :data:`ARITHMETIC_CHARSET`, sorted: digits, ``*+-=``, ``\\``, ``b d e o x``
    and braces."""
    return ARITHMETIC_CHARSET


@dataclass(frozen=True)
class Level:
    """How one difficulty level draws an expression.

    Attributes:
        operands: allowed operand counts, one chosen uniformly.
        max_operand: operands are drawn uniformly from ``0..max_operand``.
        ops: allowed operators.
        max_factor: the right factor of the (at most one) product is drawn from ``0..max_factor``.
    """

    operands: tuple[int, ...]
    max_operand: int
    ops: str
    max_factor: int = 0


LEVELS: dict[int, Level] = {
    1: Level((2,), 99, "+"),
    2: Level((2,), 99, "+-"),
    3: Level((3,), 99, "+-"),
    4: Level((2, 3), 99, "+-*", max_factor=9),
    5: Level((3,), 999, "+-*", max_factor=99),
}


def capacity(level: Level) -> int:
    """How many distinct prompts ``level`` can produce."""
    total = 0
    for n in level.operands:
        for ops in itertools.product(level.ops, repeat=n - 1):
            if ops.count("*") <= 1:
                total += (level.max_operand + 1) ** (n - ops.count("*")) * (
                    level.max_factor + 1
                ) ** ops.count("*")
    return total


def _evaluate(operands: list[int], ops: list[str]) -> int:
    """Integer value with ``*`` before ``+``/``-``; no ``eval``."""
    terms = [operands[0]]
    signs = [1]
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def _draw(rng: random.Random, level: Level) -> tuple[str, int]:
    n = rng.choice(level.operands)
    ops = [rng.choice(level.ops) for _ in range(n - 1)]
    if ops.count("*") > 1:  # keep only the first product
        first = ops.index("*")
        ops = [op if op != "*" or i == first else rng.choice("+-") for i, op in enumerate(ops)]
    operands = [rng.randint(0, level.max_operand)]
    for op in ops:
        operands.append(rng.randint(0, level.max_factor if op == "*" else level.max_operand))
    text = str(operands[0]) + "".join(op + str(x) for op, x in zip(ops, operands[1:]))
    return text + "=", _evaluate(operands, ops)


def reference_response(example: Example) -> str:
    """The supervised target for ``example``: ``\\boxed{<answer>}``."""
    return f"\\boxed{{{example.answer}}}"


L = TypeVar("L")
"""A task's description of one level (:class:`Level` here), as :func:`generated_splits` passes it on."""


def generated_splits(
    source: str,
    table: Mapping[int, L],
    level: int | tuple[int, ...],
    draw: Callable[[random.Random, L], tuple[str, int]],
    capacity: Callable[[L], int],
    seed: int,
    n_train: int,
    n_val: int,
) -> tuple[list[Example], list[Example]]:
    """Train and validation examples of a generated task, disjoint by prompt and without duplicates.

    ``level`` is a key of ``table`` or a tuple of them; each example draws its level uniformly from the
    tuple (``meta["level"]`` records it, ``meta["split"]`` its split), then ``draw(rng, table[level])``
    gives its prompt and integer answer. The validation split is drawn first from the stream
    ``"{source}:{seed}:val"``, so it depends only on ``(seed, n_val, level)``; the training split from
    ``"{source}:{seed}:train"``, skipping every validation prompt and duplicate, so a larger ``n_train``
    extends the same list. Raises ``ValueError`` for an unknown level, negative sizes, more prompts than
    the levels can supply (the sum of ``capacity`` over the distinct levels), or a split whose distinct
    prompts are not found within ``30 * n + 10,000`` draws.
    """
    levels = (level,) if isinstance(level, int) else tuple(level)
    unknown = [lv for lv in levels if lv not in table]
    if not levels or unknown:
        raise ValueError(f"unknown level(s) {unknown or level!r}; valid: {', '.join(map(str, table))}")
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_val={n_val}")
    available = sum(capacity(table[lv]) for lv in set(levels))
    if n_train + n_val > available:
        raise ValueError(
            f"level(s) {levels} have at most {available} distinct prompts; asked for {n_train} + {n_val}"
        )

    def split(name: str, n: int, skip: set[str]) -> list[Example]:
        rng = random.Random(f"{source}:{seed}:{name}")
        out: list[Example] = []
        seen = set(skip)
        attempts, budget = 0, 30 * n + 10_000  # drawing all N prompts of a level takes about N ln N
        while len(out) < n:
            attempts += 1
            if attempts > budget:
                raise ValueError(
                    f"could draw only {len(out)} distinct {name} prompts of level(s) {levels} "
                    f"(after excluding {len(skip)}); ask for fewer or add harder levels"
                )
            lv = rng.choice(levels)
            prompt, value = draw(rng, table[lv])
            if prompt in seen:
                continue
            seen.add(prompt)
            out.append(Example(prompt, str(value), source, len(out), {"level": lv, "split": name}))
        return out

    val = split("val", n_val, set())
    train = split("train", n_train, {str(e.prompt) for e in val})
    return train, val


PROMPT_FORMS = ("equation", "question")
"""How a prompt of this task may be worded (``--arithmetic-prompt``): the expression as drawn, or
:func:`as_question` of it."""


def as_question(prompt: str) -> str:
    """An equation prompt in words: ``"41+74="`` -> ``"What is 41 + 74?"`` (one space around every
    operator; operands are never negative, so every ``-`` is a subtraction). The map is one-to-one, so
    the splits stay disjoint and free of duplicates."""
    expression = prompt.removesuffix("=")
    for op in "+-*":
        expression = expression.replace(op, f" {op} ")
    return f"What is {expression}?"


def make_arithmetic(
    seed: int, n_train: int, n_val: int, level: int | tuple[int, ...] = 1
) -> tuple[list[Example], list[Example]]:
    """Train and validation examples of the arithmetic task, disjoint by prompt and without duplicates.

    ``level`` is one of :data:`LEVELS` or a tuple of them (each example draws its level uniformly from
    the tuple; ``meta["level"]`` records it). Raises ``ValueError`` for an unknown level, negative
    sizes, or more prompts than the levels can supply (:func:`capacity`; level 1 has 10,000). The splits
    are drawn by :func:`generated_splits`.
    """
    return generated_splits(SOURCE, LEVELS, level, _draw, capacity, seed, n_train, n_val)
