"""Reading an answer out of untrusted text, with no expression evaluated: the bounds on the work, the
boxed answer (:func:`extract_boxed`), plain numbers and numerals read exactly (``Decimal``, base
subscripts), the normalisation the fast comparisons use, the cost guard that refuses answers whose
symbolic evaluation could run unbounded in C code (:func:`too_costly`), and the final number of a
response without a box (:func:`last_number`). The verifiers built on them are in
:mod:`sppo_rl.llm.rewards.verify`.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal

MAX_SCAN_CHARS = 10_000
""":func:`extract_boxed` reads only this many trailing characters of a response."""

MAX_BRACE_DEPTH = 64
"""Deeper brace nesting inside ``\\boxed{...}`` is treated as malformed."""

MAX_ANSWER_CHARS = 512
"""A boxed answer longer than this scores 0 (the longest reference in the paper's data is 53 chars)."""

MAX_REFERENCE_CHARS = 4 * MAX_ANSWER_CHARS
"""A reference longer than this is compared by its text only, never parsed (a boxed answer, at most
:data:`MAX_ANSWER_CHARS` long, cannot equal it otherwise, and parsing it could take the whole deadline)."""

MAX_INT_DIGITS = 1_000
"""Integers with more digits than this are never converted with ``int()``."""

MAX_POWER_DIGITS = 1_000_000
"""Refuse an answer whose powers could produce an integer with about this many digits or more."""

MAX_NESTING = 6
"""Refuse answers whose brackets nest deeper (the LaTeX parser's time grows steeply with depth; the
references in the paper's data nest at most 3 deep)."""

MAX_FACTORIAL_ARG = 10_000
"""Refuse factorials, binomials and Gamma of arguments larger than this."""

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")

_INT_RE = re.compile(r"[+-]?[0-9]+")

_MANTISSA = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)"

_SCI_RE = re.compile(rf"({_MANTISSA})[eE]([+-]?[0-9]{{1,6}})")

# After _normalise: 1.5, 1.5e-3, 1.5\times10^{-3}, 1.5\cdot10^3, 10^{-3}
_NUMBER_RE = re.compile(
    rf"(?P<m>{_MANTISSA})(?:[eE](?P<e>[+-]?[0-9]{{1,6}}))?"
    rf"|(?:(?P<m2>{_MANTISSA})\\(?:times|cdot))?10\^(?:\{{(?P<e2>[+-]?[0-9]{{1,6}})\}}|(?P<e3>[0-9]))"
)

_EXACT = Context(prec=MAX_INT_DIGITS + 16, Emax=10**7, Emin=-(10**7))  # literals stay exact

_BASE_RE = re.compile(r"([0-9A-Za-z]+)_\{?([0-9]{1,2})\}?")

_DIGITS = re.compile(r"\d+")  # any script's digits: a conservative count of literals

_SPACING = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle|textstyle)\b|\s+")

_BIG_OPS = re.compile(r"\\(?:binom|dbinom|tbinom|choose|Gamma|prod|sum)(?![a-zA-Z])|(?<!\\)!")

_TOKEN = re.compile(r"[\d.]+|\\[a-zA-Z]+|.", re.DOTALL)


def extract_boxed(
    text: str, *, max_scan: int = MAX_SCAN_CHARS, max_depth: int = MAX_BRACE_DEPTH
) -> str | None:
    """The content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, stripped.

    Braces balance, escaped braces ``\\{`` ``\\}`` do not count, and ``\\boxed{\\frac{1}{2}}`` gives
    ``\\frac{1}{2}``. Returns ``None`` when there is no box, when the last box never closes (a
    truncated response), or when braces nest deeper than ``max_depth``. Only the last ``max_scan``
    characters are read, so the work is ``O(max_scan)`` whatever the input.
    """
    if not isinstance(text, str):
        return None
    tail = text[-max_scan:]
    last = None
    for last in _BOX_OPEN.finditer(tail):  # noqa: B007 - we want the final match
        pass
    if last is None:
        return None
    start = i = last.end()
    depth, n = 1, len(tail)
    while i < n:
        c = tail[i]
        if c == "\\":
            i += 2  # an escaped character, \{ and \} included
            continue
        if c == "{":
            depth += 1
            if depth > max_depth:
                return None
        elif c == "}":
            depth -= 1
            if depth == 0:
                return tail[start:i].strip()
        i += 1
    return None


_NUMBER_ONLY = re.compile(r"\s*[-\u2212]?[0-9][0-9,]{0,40}(?:\.[0-9]{1,40})?\s*\.?\s*")


def answer_format(text: str) -> str:
    """How a response gives its answer, right or wrong: ``"boxed"`` when :func:`extract_boxed` finds a
    closed ``\\boxed{...}`` in it, ``"number"`` when the whole response is one plain number (optionally
    signed, with thousands commas, a decimal part and one final period: ``122``, ``-7``, ``1,234.``, the
    form "Answer with just the number." asks for), else ``"other"`` (a sentence, an equation, an
    unclosed box). The format-learning curves of validation (``val_boxed_rate``, ``val_number_rate``)
    count these; no reward reads them."""
    if not isinstance(text, str):
        return "other"
    if extract_boxed(text) is not None:
        return "boxed"
    return "number" if len(text) <= 128 and _NUMBER_ONLY.fullmatch(text) else "other"


def _normalise(s: str) -> str:
    """Drop spacing and sizing macros, ``$`` and a final period; ``\\dfrac``/``\\tfrac`` -> ``\\frac``."""
    s = _SPACING.sub("", s).replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return s.rstrip(".")


def _as_int(s: str) -> int | None:
    """``s`` as an integer if it is an optional sign and at most :data:`MAX_INT_DIGITS` digits."""
    if len(s) <= MAX_INT_DIGITS + 1 and _INT_RE.fullmatch(s):
        return int(s)
    return None


def _as_decimal(s: str) -> Decimal | None:
    """A plain number as an exact ``Decimal``: ``27.0``, ``.5``, ``1.45e-5``, ``1.45\\times10^{-5}``.

    ``s`` is normalised (no spaces). Anything else, expressions included, gives ``None``.
    """
    m = _NUMBER_RE.fullmatch(s) if len(s) <= MAX_INT_DIGITS else None
    if m is None:
        return None
    mantissa = m["m"] or m["m2"] or "1"
    exponent = m["e"] or m["e2"] or m["e3"] or "0"
    try:
        return _EXACT.scaleb(Decimal(mantissa), int(exponent))
    except (ArithmeticError, ValueError):  # pragma: no cover - the regex admits only valid literals
        return None


def _as_base_numeral(s: str) -> int | None:
    """The value of a numeral written in base 2..36 with a subscript: ``4343_6``, ``1011_{2}``."""
    m = _BASE_RE.fullmatch(s) if len(s) <= 64 else None
    if m is None or not 2 <= int(m[2]) <= 36:
        return None
    try:
        return int(m[1], int(m[2]))
    except ValueError:
        return None


def _float_rounding(gold: Decimal | None) -> int:
    """Decimal places at which two numbers are compared when the reference is the literal ``gold``.

    math_verify rounds both sides to 6 decimal places, so every number below 5e-7 equals every other
    (``1e-27 = 2e-27 = 0``). Keep 6 places, or more for a small reference so that its first 6
    significant digits count: 6.72e-5 -> 10 places, 1.325e-27 -> 32.
    """
    if gold is None or gold == 0:
        return 6
    return max(6, 5 - gold.adjusted())


def _sci_to_latex(s: str) -> str:
    """``1.45e-5`` -> ``1.45\\times10^{-5}``; LaTeX would otherwise read ``e`` as Euler's number."""
    m = _SCI_RE.fullmatch(s)
    return f"{m.group(1)}\\times10^{{{m.group(2)}}}" if m else s


def _literal_bound(text: str) -> float:
    """An upper bound on the value of a sum/product of the integer literals in ``text``."""
    bound = 1.0
    for d in _DIGITS.findall(text):
        if len(d) > 12:
            return math.inf
        bound *= max(2, int(d))
    return bound


def _nesting(s: str) -> int:
    """The deepest nesting of ``( [ {`` brackets in ``s`` (escaped braces count too)."""
    depth = deepest = 0
    for c in s:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth = max(depth - 1, 0)
    return deepest


def _group_end(s: str, i: int, open_c: str, close_c: str) -> int:
    """Index just past the group opened at ``s[i]``; ``len(s)`` if it never closes."""
    depth = 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == open_c:
            depth += 1
        elif s[i] == close_c:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(s)


def _exponent(s: str, i: int) -> tuple[str, int]:
    """The exponent starting at ``s[i]`` (just after ``^`` or ``**``) and the index past it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return "", i
    if s[i] in "{(":
        j = _group_end(s, i, s[i], "}" if s[i] == "{" else ")")
        return s[i:j], j
    m = _TOKEN.match(s, i)
    assert m is not None  # _TOKEN matches any character
    return m.group(0), m.end()


def too_costly(answer: str) -> bool:
    """True when evaluating ``answer`` symbolically could take unbounded time or memory in C code.

    A conservative over-approximation (it may refuse a harmless answer, never the reverse for the
    constructs it models). Also true for answers longer than :data:`MAX_ANSWER_CHARS` or nesting
    brackets deeper than :data:`MAX_NESTING`, which parse slowly.

    - each power ``b^{e}`` (or ``b**e``) bounds ``e`` by the product of the integer literals in it;
      a power, factorial, sum or product inside an exponent, or a power directly raised again
      (``2^3^4``), is unbounded;
    - bounds multiply along powers nested through a bracketed base, ``((2^{10})^{10})^{10}``, and the
      result's digit count, about ``chain * digits(widest literal)``, must stay below
      :data:`MAX_POWER_DIGITS`;
    - with a factorial, binomial, Gamma, sum or product present, any power, any literal above
      :data:`MAX_FACTORIAL_ARG`, or a product of all literals above its square is refused.
    """
    if len(answer) > MAX_ANSWER_CHARS or _nesting(answer) > MAX_NESTING:
        return True
    literals = _DIGITS.findall(answer)
    has_pow = "^" in answer or "**" in answer
    if _BIG_OPS.search(answer) and (
        has_pow
        or any(len(d) > 6 or int(d) > MAX_FACTORIAL_ARG for d in literals)
        or _literal_bound(answer) > MAX_FACTORIAL_ARG**2
    ):
        return True
    if not has_pow:
        return False
    widest = max((len(d) for d in literals), default=1)
    # Each open bracket records the largest power chain inside it; a power whose base is the bracket
    # group that just closed multiplies its exponent bound onto that group's chain.
    stack: list[float] = [1.0]
    base_chain = 1.0
    i, n = 0, len(answer)
    while i < n:
        c = answer[i]
        if c == "\\" and i + 1 < n and answer[i + 1] in "{}":
            i += 2
            base_chain = 1.0
            continue
        if c in "({[":
            stack.append(1.0)
            base_chain = 1.0
        elif c in ")}]":
            base_chain = stack.pop() if len(stack) > 1 else 1.0
            stack[-1] = max(stack[-1], base_chain)
        elif c == "^" or answer.startswith("**", i):
            exp_text, j = _exponent(answer, i + (1 if c == "^" else 2))
            after = answer[j:].lstrip()
            if "^" in exp_text or "**" in exp_text or _BIG_OPS.search(exp_text) or after[:1] == "^":
                return True
            if after[:2] == "**":
                return True
            chain = base_chain * _literal_bound(exp_text)
            if chain * widest >= MAX_POWER_DIGITS:
                return True
            stack[-1] = max(stack[-1], chain)
            base_chain = 1.0
            i = j
            continue
        elif not c.isspace():
            base_chain = 1.0
        i += 1
    return False


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|textrm|mbox|mathrm|mathbf)\{([^{}]*)\}")


def unwrap_text(answer: str) -> str:
    """The value inside an answer that is one text group as a whole: ``\\text{4}`` -> ``4``,
    ``\\textbf{ 12 }`` -> ``12``; any other answer unchanged (``4\\text{ cm}`` keeps its unit)."""
    m = _TEXT_WRAP.fullmatch(answer.strip())
    return m.group(1).strip() if m and m.group(1).strip() else answer


_NUMBER_RUN = re.compile(r"[0-9]+(?:[.,][0-9]+)*")

_PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?|[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")

_MINUS = ("-", "\u2212")

# the text between the last two numbers that makes them alternatives: 122 or 123, 122, 123, 122/123, 12-13
_HEDGE_GAP = re.compile(
    r"(?:.*\bor\b.*|[\s,;/&~\-\u2212\u2013]*|\s*(?:to|and|and/or)\s*)", re.IGNORECASE | re.DOTALL
)

_GLUED_BEFORE = re.compile(r"[A-Za-z_^\\/.]")  # x2, a_2, 2^3, \frac..., 1/2, .5

_GLUED_AFTER = re.compile(r"[A-Za-z_^/]")  # 2x, 2_b, 2^3, 1/2

_OPERATOR_AFTER = re.compile(r"\s*[+*/^=\u00d7\u00f7\-\u2212]")


def last_number(text: str) -> Decimal | None:
    """The final number of ``text`` as an exact ``Decimal``, or None when there is none or it is not a
    clean answer. Only the last :data:`MAX_SCAN_CHARS` characters are read; no expression is evaluated.

    The final number is the last maximal run of digits, ``.`` and ``,`` (``1,234.5``). It must be a
    plain decimal (``122``, ``122.0``, thousands grouped by commas in threes: ``1,234``) of at most
    :data:`MAX_INT_DIGITS` characters, standing alone: no letter, ``_``, ``^``, ``\\``, ``/`` or ``.``
    glued before it (``x2``, ``2^3``, ``1/2``), no letter, ``_``, ``^`` or ``/`` glued after it
    (``2x``), and no operator after it (``122 + 1``: the answer is not finished). A ``-`` (or U+2212)
    right before it is its sign when no digit, letter or closing bracket precedes that sign
    (``= -7`` is -7, ``12-7`` is 7). It is refused (None) as a hedge when the text between it and the
    previous number holds the word ``or``, or only separators (commas, ``;``, ``/``, ``&``, ``~``,
    dashes), ``to``, ``and`` or ``and/or``, and the two numbers differ: ``122 or 123``,
    ``122, 123``, ``between 120 and 125``. ``59 + 63 = 122`` gives 122; ``The answer is 122.`` gives 122.
    """
    if not isinstance(text, str):
        return None
    tail = text[-MAX_SCAN_CHARS:]
    runs = list(_NUMBER_RUN.finditer(tail))
    if not runs:
        return None
    last = runs[-1]
    value = _signed_number(tail, last)
    if value is None:
        return None
    start = last.start() - (1 if _is_signed(tail, last.start()) else 0)
    if _OPERATOR_AFTER.match(tail, last.end()):
        return None
    if len(runs) > 1:
        prev = runs[-2]
        gap = tail[prev.end() : start]
        if _HEDGE_GAP.fullmatch(gap):
            other = _signed_number(tail, prev)
            if other is None or other != value:
                return None
    return value


def _is_signed(text: str, start: int) -> bool:
    """Whether a minus sign at ``start - 1`` is the sign of the number starting at ``start``."""
    if start == 0 or text[start - 1] not in _MINUS:
        return False
    before = text[start - 2] if start >= 2 else " "
    return not (before.isalnum() or before in ")]}")


def _signed_number(text: str, run: re.Match[str]) -> Decimal | None:
    """The number ``run`` matched in ``text``, with its sign, if it stands alone (see :func:`last_number`)."""
    digits = run.group(0)
    if len(digits) > MAX_INT_DIGITS or not _PLAIN_NUMBER.fullmatch(digits):
        return None
    s, e = run.start(), run.end()
    signed = _is_signed(text, s)
    before = text[s - 2 if signed else s - 1] if s - (2 if signed else 1) >= 0 else ""
    if not signed and before and _GLUED_BEFORE.match(before):
        return None
    if e < len(text) and _GLUED_AFTER.match(text[e]):
        return None
    value = _EXACT.create_decimal(digits.replace(",", ""))
    return -value if signed else value
