"""Verifiable rewards: score a model's response against a reference answer.

Responses are untrusted text. Nothing here evaluates them as code: answers are read by a LaTeX grammar
(``latex2sympy2`` through ``math_verify``), never by ``eval``, ``sympify`` or ``parse_expr`` on a string.
Work is bounded on any input:

- :func:`extract_boxed` looks at the last :data:`MAX_SCAN_CHARS` characters only and gives up past
  :data:`MAX_BRACE_DEPTH` nested braces;
- an answer longer than :data:`MAX_ANSWER_CHARS` scores 0;
- :func:`verify_math` refuses (:func:`too_costly`) answers whose evaluation could build astronomically
  large integers in C code, where no Python-level timeout can interrupt it (power towers such as
  ``9^{9^{9}}``, nested powers whose exponents multiply past :data:`MAX_POWER_DIGITS` digits,
  factorials and binomials of large arguments), and deeply nested ones; such an answer can still
  match a reference by exact text;
- a response's answer must parse as a whole into one expression (:func:`_well_formed`), so trailing
  junk scores 0 whether math_verify would skip it by reading a part of the answer (``\\frac{1}{2})``
  as ``1/2``) or the grammar would multiply it in (``11\\sqrt21`` as ``11\\sqrt{2} \\cdot 1``,
  ``6+9i1``, ``SRMC=LRMC1``; ``47 1`` as the mixed number ``48``);
- an answer is paid as written, not as a restatement of the question (:func:`_restates`): a part built
  only from number literals whose value is rational must be a single literal (``2+2``, ``19^2``,
  ``\\dbinom{8}{4}``, ``\\log_2 64``, ``\\frac{6}{4}`` score 0 for 4, 361, 70, 6, 3/2); integrals,
  limits, sums and derivatives are refused; and the answer may name no symbol the reference lacks
  (``4+x-x``; text, which is read as a symbol: ``4\\text{ or 5}``). The answer stated as a variable's
  value (``x = 4``) is judged by its value; a reference that is itself unevaluated switches the first two
  rules off;
- the symbolic comparison runs under a wall-clock deadline (``SIGALRM`` via ``setitimer``) when called
  on the main thread. On other threads signals are unavailable and only the caps above bound the work:
  run scoring in :class:`sppo_rl.llm.rewards.scorer.RewardScorer`, whose worker process is killed on a hang.

Every verifier returns ``1.0`` (correct) or ``0.0`` (wrong, unparsable, or refused) and never raises on
an untrusted response. :func:`verify_boxed_or_last_number` (``--reward-fn boxed-or-last-number``, explicit
only) is :func:`verify_math` on a response with a box and, without one, compares the response's final
number (:func:`last_number`: hedges such as ``122 or 123`` refused) with a numeric reference exactly.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from decimal import Context, Decimal
from functools import lru_cache
from typing import Any

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
# A factor that is only a number literal, possibly in invisible braces: 1, {1}, 0.5, 2e3, 52_8
_BARE_NUMBER = re.compile(r"\{*(?:[0-9][0-9.,]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(?:_\{?[0-9A-Za-z]+\}?)?\}*")
# What math_verify's normalisation strips as a trailing unit (latex2sympy2_extended's
# unit_superscript_regex): from the first \text{ or \mbox{ whose lazy match can reach the end.
_UNIT_TAIL = re.compile(r"(\\(?:text|mbox){.*?})(\^\d|\{\^\d\})?$")
# ... and what it should strip: one text group, optionally squared/cubed (\text{ cm}^2, \mbox{m}^{-1})
_ONE_UNIT = re.compile(r"\\(?:text|mbox)\{[^{}]*\}\s*(?:\^\s*(?:-?\d|\{\s*-?\d+\s*\})|\{\^\d\})?")


class _Deadline(BaseException):
    """Raised by the alarm inside a comparison; a ``BaseException`` so library ``except Exception``
    clauses cannot swallow it and keep working past the deadline."""


class _DropTimeoutWarning(logging.Filter):
    """math_verify warns once that its own (signal) timeout is off; ours replaces it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ------------------------------------------------------------------------------------ extraction


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


# ------------------------------------------------------------------------------- fast comparisons


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


# ---------------------------------------------------------------------------------- cost guard


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


# ------------------------------------------------------------------------------------- deadline

_REALARM_S = 0.05
"""Seconds between repeated alarms once a deadline has passed (see :func:`_deadline`)."""


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`_Deadline` in the block after ``seconds`` of wall time (main thread only).

    A no-op off the main thread, where ``seconds`` is ``None`` or non-positive, or when another
    ``ITIMER_REAL`` timer is already pending (its owner's deadline is left untouched).

    After the first alarm the timer repeats every :data:`_REALARM_S`: Python drops an exception raised
    while a garbage-collector callback, ``__del__`` or weakref callback runs ("Exception ignored
    in ..."), so a single alarm landing there would let the work run on unbounded. On the way out the
    handler is switched off before the timer is disarmed and the old handler put back, and that
    cleanup is retried if an alarm interrupts it.
    """
    usable = (
        seconds is not None
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    )
    if not usable:
        yield
        return

    done = False

    def _on_alarm(signum: int, frame: Any) -> None:
        if not done:
            raise _Deadline

    old = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds, _REALARM_S)
        yield
    finally:
        while True:
            try:
                done = True
                signal.setitimer(signal.ITIMER_REAL, 0.0)
                signal.signal(signal.SIGALRM, old)
                break
            except _Deadline:  # an alarm before ``done`` was set: the cleanup is idempotent, redo it
                continue


# ----------------------------------------------------------------------------------- verifiers


_warm = False


def warm_up() -> None:
    """Import math_verify and run one comparison, once per process, so that a deadline later measures
    comparisons rather than imports and parser start-up (about a second on a cold process)."""
    global _warm
    if not _warm:
        _symbolic_equal(r"\sqrt{8}", r"2\sqrt{2}")
        _symbolic_equal("(1,2)", "(1,2)")
        _warm = True


def _latex_config() -> list[Any]:
    from math_verify import LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0)]


class _Malformed(Exception):
    """A syntax error in :func:`_well_formed`'s parse."""


def _raise_on_syntax_error() -> Any:
    from antlr4.error.ErrorListener import ErrorListener

    class _Raise(ErrorListener):
        def syntaxError(self, recognizer: Any, symbol: Any, line: int, column: int, msg: str, e: Any) -> None:
            raise _Malformed(f"column {column}: {msg}")

    return _Raise()


def _well_formed(pred: str) -> bool:
    """Whether the whole of a response's boxed answer is one expression, with no junk appended.

    The answer is normalised as math_verify normalises a boxed answer and parsed with latex2sympy's
    grammar, which must reach the end of the text without a syntax error. math_verify alone does not
    require this: when the whole answer fails to parse it reads a part of it instead (``\\frac{1}{2})``
    scores as ``1/2``).

    The grammar also reads juxtaposition as multiplication, so a digit appended to an answer is
    multiplied in (``11\\sqrt21`` is ``11\\sqrt{2} \\cdot 1``, ``12\\pi1`` is ``12\\pi \\cdot 1``, ``6+9i1``
    is ``6 + 9i \\cdot 1``) or, after an integer, added as a mixed number (``47 1`` is 48, as
    ``2\\frac{1}{2}`` is 2.5). Written mathematics puts a numeric factor first, so a number literal
    (bare or in braces, ``{1}``) juxtaposed after another factor is refused, as is a number with a
    subscript that is not a valid base (``52_81``). ``2\\sqrt{2}``, ``2\\frac{1}{2}``, ``x^2 \\cdot 3`` and
    ``3 \\times 10^{5}`` are well formed.

    Units are kept for this parse (``5\\text{ cm}`` reads as a product with a symbol), because the
    normalisation that drops a trailing unit drops everything from the first ``\\text{`` to the final
    ``}``: ``5\\text{ cm}{1}`` and ``2\\text{ m}+3\\text{ m}`` are refused, ``5\\text{ cm}^2`` is not.
    Runs under the caller's deadline (:func:`_symbolic_equal`).
    """
    from antlr4 import CommonTokenStream, InputStream
    from latex2sympy2_extended.antlr_parser import PSLexer, PSParser

    latex = _normalised_latex(pred)
    unit = _UNIT_TAIL.search(latex)
    if unit and latex[: unit.start()].strip() and not _ONE_UNIT.fullmatch(unit.group(0)):
        return False
    lexer = PSLexer(InputStream(latex))
    lexer.removeErrorListeners()
    lexer.addErrorListener(_raise_on_syntax_error())
    parser = PSParser(CommonTokenStream(lexer))
    parser.removeErrorListeners()
    parser.addErrorListener(_raise_on_syntax_error())
    try:
        tree = parser.math()
    except _Malformed:
        return False
    factors = (PSParser.PostfixContext, PSParser.Postfix_nofuncContext)
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (PSParser.UnaryContext, PSParser.Unary_nofuncContext)):
            juxtaposed = [c for c in node.getChildren() if isinstance(c, factors)]
            if any(_BARE_NUMBER.fullmatch(f.getText()) for f in juxtaposed[1:]):
                return False
        elif isinstance(node, PSParser.Number_subexprContext) and node.subexpr() is not None:
            if _as_base_numeral(node.getText()) is None:
                return False
        stack.extend(node.getChildren() if hasattr(node, "getChildren") else ())
    return True


def _normalised_latex(answer: str) -> str:
    """``answer`` normalised as math_verify normalises a boxed answer, units kept (``units=False``)."""
    from latex2sympy2_extended.math_normalization import normalize_latex

    config = replace(_latex_config()[0].normalization_config, boxed="last", units=False)
    return normalize_latex(f"\\boxed{{{_sci_to_latex(answer)}}}", config)


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|textrm|mbox|mathrm|mathbf)\{([^{}]*)\}")
_INT_FRAC = re.compile(r"\\frac\{\s*([+-]?[0-9]{1,50})\s*\}\{\s*([+-]?[0-9]{1,50})\s*\}")
_MIXED = re.compile(r"(-?[0-9]{1,50})\\frac\{([0-9]{1,50})\}\{([0-9]{1,50})\}")
_NO_VALUE = object()  # an answer the unevaluated parse could not read


def unwrap_text(answer: str) -> str:
    """The value inside an answer that is one text group as a whole: ``\\text{4}`` -> ``4``,
    ``\\textbf{ 12 }`` -> ``12``; any other answer unchanged (``4\\text{ cm}`` keeps its unit)."""
    m = _TEXT_WRAP.fullmatch(answer.strip())
    return m.group(1).strip() if m and m.group(1).strip() else answer


def _unevaluated(answer: str) -> Any:
    """``answer`` read into sympy WITHOUT evaluation (``2+2`` stays ``Add(2, 2)``), by math_verify's
    normalisation (units kept: text is read as a symbol) and latex2sympy's grammar; :data:`_NO_VALUE`
    if it does not parse. Runs under the caller's deadline."""
    import sympy
    from latex2sympy2_extended import latex2sympy

    mixed = _MIXED.fullmatch(_normalise(answer))
    if mixed and 0 < int(mixed.group(2)) < int(
        mixed.group(3)
    ):  # latex2sympy reads 2\frac{1}{2} evaluated only
        whole, num, den = (abs(int(g)) for g in mixed.groups())
        return sympy.Rational((whole * den + num) * (-1 if mixed.group(1).startswith("-") else 1), den)
    latex = _normalised_latex(answer)
    try:
        with sympy.evaluate(False):
            return latex2sympy(latex, is_real=True, convert_degrees=False, normalization_config=None)
    except _Deadline:
        raise
    except Exception:
        return _NO_VALUE


def _is_literal(node: Any) -> bool:
    """A number as it is written: an integer, a decimal, a fraction (latex2sympy reads ``\\frac{3}{4}``
    as one ``Rational``; lowest terms are checked on the text), a reciprocal ``b^{-1}`` (the
    denominator of ``\\frac{\\sqrt3}{3}``), a percentage, or scientific notation ``m \\times 10^{k}``."""
    import sympy

    if isinstance(node, sympy.Number):
        return True
    if isinstance(node, sympy.Pow) and isinstance(node.exp, sympy.Integer):
        base = node.base
        return isinstance(base, sympy.Integer) and (node.exp == -1 or base == 10)
    if isinstance(node, sympy.Mul) and len(node.args) == 2:
        a, b = node.args
        if isinstance(b, sympy.UnevaluatedExpr) or isinstance(a, sympy.UnevaluatedExpr):
            return True  # 50\% = 50 * (1/100)
        return isinstance(a, sympy.Number) and _is_literal(b) and isinstance(b, sympy.Pow) and b.base == 10
    return False


_CALCULUS = ("Integral", "Limit", "Sum", "Product", "Derivative")


def _restatement(expr: Any) -> str | None:
    """The first part of ``expr`` (an unevaluated sympy tree) that is an operation on number literals
    with a rational value (``2+2``, ``37 \\cdot 43``, ``19^2``, ``\\binom{8}{4}``, ``\\log_2 64``,
    ``\\sqrt{16}``), or a calculus operation (integral, limit, sum, product, derivative), as text; None
    if there is none. ``\\sqrt{2}``, ``2\\sqrt{2}``, ``12\\pi``, ``\\frac{11}{8}`` and ``-3`` are answers."""
    import sympy

    stack = [expr]
    while stack:
        node = stack.pop()
        if not isinstance(node, sympy.Basic):
            if isinstance(node, (list, tuple)):
                stack.extend(node)
            continue
        name = type(node).__name__
        if name in _CALCULUS:
            return str(node)
        args = node.args
        if (
            args
            and not isinstance(node, (sympy.UnevaluatedExpr, sympy.Set, sympy.Tuple, sympy.MatrixBase))
            and not getattr(node, "is_Relational", False)
            and not _is_literal(node)
            and all(
                isinstance(a, sympy.Number) or _is_literal(a)
                for a in sympy.preorder_traversal(node)
                if not a.args
            )
            and not node.free_symbols
            and not node.atoms(sympy.NumberSymbol, type(sympy.I))
        ):
            try:
                value = node.doit()
            except _Deadline:
                raise
            except Exception:
                return str(node)
            if getattr(value, "is_rational", False) or isinstance(value, sympy.Float):
                return str(node)
            continue  # an irrational closed form (\sqrt{8}): its parts are literals
        stack.extend(args)
    return None


def _unreduced_fraction(latex: str) -> str | None:
    """The first ``\\frac{a}{b}`` of integers in ``latex`` that is not in lowest terms (or has ``b`` 0 or 1)."""
    for m in _INT_FRAC.finditer(latex):
        a, b = int(m.group(1)), int(m.group(2))
        if abs(b) <= 1 or math.gcd(a, b) != 1:
            return m.group(0)
    return None


_COMMAND = re.compile(r"\\[a-zA-Z]+")


def _written_symbols(answer: str) -> set[str]:
    """The symbols ``answer`` names as written: the content of each text group (``\\text{ cm}`` ->
    ``cm``) and each letter outside commands and text groups (for references the unevaluated parse
    cannot read)."""
    latex = _normalised_latex(answer)
    texts = {m.group(1).strip() for m in _TEXT_WRAP.finditer(latex)}
    rest = _COMMAND.sub(" ", _TEXT_WRAP.sub(" ", latex))
    return texts | {c for c in rest if c.isalpha()}


def _symbols(expr: Any) -> set[str]:
    free = getattr(expr, "free_symbols", set())
    return {str(x) for x in free}


@lru_cache(maxsize=8192)
def _reference_form(gold: str) -> tuple[Any, frozenset[str], bool]:
    """A reference's unevaluated parse (:data:`_NO_VALUE` if none), the symbols it names (as written,
    :func:`_written_symbols`, when it does not parse), and whether it is itself unevaluated; once per
    reference (references repeat across samples)."""
    g = _unevaluated(gold)
    if g is _NO_VALUE:
        return g, frozenset(_written_symbols(gold)), True
    unevaluated = _restatement(g) is not None or _unreduced_fraction(_normalised_latex(gold)) is not None
    return g, frozenset(_symbols(g)), unevaluated


_APPROX = re.compile(r"\\approx(?:eq)?(?![a-zA-Z])|\u2248")
"""``\\approx``, ``\\approxeq`` and U+2248: the relations the grammar drops, reading ``4 \\approx 5`` as 4 and
``x \\approx 4`` as 4 (of 55 relations tried; ``\\sim``, ``\\simeq``, ``\\neq``, ``<``, ``\\to`` and the others
parse as relations, or not at all, and score 0 against a value)."""


def _restates(pred: str, gold: str) -> str | None:
    """Why the (well-formed) answer ``pred`` is not paid against ``gold`` although it may equal it in
    value, or None: it names a symbol ``gold`` lacks (a free variable, ``4+x-x``, or text after the
    value, ``4\\text{ or 5}``, which the grammar reads as a symbol), an approximation (:data:`_APPROX`:
    ``4 \\approx 5``, ``x \\approx 4``) unless ``gold`` is one, or, unless ``gold`` is itself
    unevaluated, it holds an unevaluated operation (:func:`_restatement`) or a fraction of integers
    not in lowest terms. An answer ``v = value`` or ``v \\in set`` is judged by its value when ``gold``
    is no relation. An answer that the unevaluated parse cannot read is refused when ``gold`` can be."""
    import sympy

    if _APPROX.search(pred) and not _APPROX.search(gold):
        return "it states an approximation (\\approx), which the grammar reads as its left side alone"
    g, gold_symbols, gold_unevaluated = _reference_form(gold)
    if g is _NO_VALUE:  # math_verify's verdict stands, but text and letters only as the reference has them
        extra = _written_symbols(pred) - gold_symbols
        return f"it names {', '.join(sorted(extra))}, which the reference does not" if extra else None
    p = _unevaluated(pred)
    if p is _NO_VALUE:
        return "it does not parse as one expression"
    if (
        isinstance(p, sympy.Equality)
        and isinstance(p.lhs, sympy.Symbol)
        and not getattr(g, "is_Relational", False)
    ):
        p = p.rhs  # "x = 4": the value of the asked variable
    extra = _symbols(p) - gold_symbols
    if extra:
        return f"it names {', '.join(sorted(extra))}, which the reference does not"
    if not gold_unevaluated:
        why = _restatement(p) or _unreduced_fraction(_normalised_latex(pred))
        if why is not None:
            return f"{why} is an unevaluated operation"
    return None


@lru_cache(maxsize=8192)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    """Reference answers repeat across samples of a prompt; parse each once (no timeout: trusted)."""
    from math_verify import parse

    return tuple(parse(f"\\boxed{{{_sci_to_latex(gold)}}}", _latex_config(), parsing_timeout=None))


def _close_to(expr: Any, gold: Decimal, places: int) -> bool:
    """Whether a parsed number lies within half a unit of the ``places``-th decimal of ``gold`` (or
    within ``1e-10`` of it, relatively).

    Non-numeric expressions (relations, sets, symbols) pass: math_verify's verdict stands for them.
    """
    if not getattr(expr, "is_number", False):
        return True
    value = expr.evalf(30)
    if not value.is_real:
        return False
    diff = abs(Decimal(str(value)) - gold)
    # Floats parsed from LaTeX carry ~15 significant digits, hence the relative floor.
    return diff <= max(_EXACT.scaleb(Decimal(5), -places - 1), abs(gold).scaleb(-10))


def _symbolic_equal(pred: str, gold: str, gold_number: Decimal | None = None) -> bool:
    """math_verify's verdict on two bare answers (LaTeX extraction only: no ``parse_expr``).

    When the reference is a nonzero literal, floats are compared at :func:`_float_rounding` places and
    an accepted number must also lie within half a unit of the last of them: math_verify compares a
    non-atomic expression through ``evalf(chop=True)``, which would call ``1.3/10^{28}`` equal to
    ``1.3e-27``.
    """
    from math_verify import parse, verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return False
    if not _well_formed(pred):
        # As math_verify's string fallback: an answer that does not parse matches by its text only.
        return _normalise(pred) == _normalise(gold) != ""
    if _restates(pred, gold) is not None:
        return False
    # first_match: only the whole box is read; math_verify would otherwise fall back on a part of it
    pred_parsed = parse(
        f"\\boxed{{{_sci_to_latex(pred)}}}",
        _latex_config(),
        extraction_mode="first_match",
        parsing_timeout=None,
    )
    if not pred_parsed:
        return False
    rounding = _float_rounding(gold_number)
    if not verify(list(gold_parsed), pred_parsed, float_rounding=rounding, timeout_seconds=None):
        return False
    if gold_number is None or gold_number == 0:
        return True
    return _close_to(pred_parsed[0], gold_number, rounding)


def verify_math(
    response: str, ground_truth: str, timeout_s: float | None = 5.0, *, fast_path: bool = True
) -> float:
    """1.0 if the last ``\\boxed{}`` answer in ``response`` equals ``ground_truth`` mathematically.

    Steps: extract the boxed answer (:func:`extract_boxed`; none -> 0). With ``fast_path``: equal
    normalised text is accepted; two plain numbers (``27`` / ``27.0``, ``1.3e-5`` /
    ``1.3\\times10^{-5}``) are decided exactly, and two numerals with a base subscript (``52_8``) by
    value. Otherwise answers that :func:`too_costly` flags score 0; an answer that does not parse
    as a whole into one expression, junk appended included (:func:`_well_formed`: ``12\\pi1``,
    ``\\frac{1}{2})``), matches by equal normalised text only; the rest are parsed with ``math_verify``
    (LaTeX only) and compared symbolically and numerically under a ``timeout_s`` deadline, which
    also bounds the well-formedness parse. ``\\frac{1}{2}``, ``\\dfrac12``, ``0.5`` and ``1/2`` are
    equal; so are ``2\\sqrt{2}`` and ``\\sqrt{8}``, and the same set or interval written differently.
    A box that is one text group is read as its content (``\\text{4}``). A well-formed answer equal in
    value still scores 0 when it restates rather than answers (:func:`_restates`: ``2+2``,
    ``\\dbinom{8}{4}``, ``\\frac{6}{4}``, ``4+x-x``) or has text after its value that the reference
    lacks (``4\\text{ or 5}``). A reference over :data:`MAX_REFERENCE_CHARS` is matched by its text only.

    ``fast_path=False`` forces the symbolic comparison (tests, benchmarks). Never raises on its
    inputs: any error, refusal or deadline scores 0.0. (A missing ``math_verify`` install raises
    ``ImportError``, once the fast path cannot decide.)
    """
    try:
        pred = extract_boxed(response)
        if pred is None or not isinstance(ground_truth, str) or len(pred) > MAX_ANSWER_CHARS:
            return 0.0
        if len(ground_truth) > MAX_REFERENCE_CHARS:  # never parsed: only its own text could match
            return float(_normalise(pred) == _normalise(ground_truth.strip()) != "")
        pred, gold = unwrap_text(pred), unwrap_text(ground_truth.strip())
        p, g = _normalise(pred), _normalise(gold)
        gd = _as_decimal(g)
        if fast_path:
            if p == g and p:
                return 1.0
            pd = _as_decimal(p)
            if pd is not None and gd is not None:
                return float(pd == gd)
            pb, gb = _as_base_numeral(p), _as_base_numeral(g)
            if pb is not None and gb is not None:
                return float(pb == gb)
        if too_costly(pred):
            return 0.0
    except Exception:
        return 0.0
    warm_up()  # outside the try: a missing dependency must not pass for wrong answers
    try:
        with _deadline(timeout_s):
            return float(_symbolic_equal(pred, gold, gd))
    except (Exception, _Deadline):
        return 0.0


_HASHES_LINE = re.compile(r"####[ \t]*([^\n]*)")


def verify_gsm8k(response: str, ground_truth: str, timeout_s: float | None = 4.0) -> float:
    """:func:`verify_math` for data in GSM8K's layout, which also states a final answer as ``#### n``.

    With a ``\\boxed{}`` in ``response`` this is :func:`verify_math`. Without one, the text after the
    last ``####`` up to the end of its line is the answer: thousands separators, ``$`` and a final
    period dropped, it must be a plain number equal to ``ground_truth`` exactly (``#### 1,234`` for
    1234, ``#### 50.0`` for 50); anything else on that line (``#### 50 or 51``, ``#### 24+26``) scores 0.
    """
    try:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return 0.0
        tail = response[-MAX_SCAN_CHARS:]
        if _BOX_OPEN.search(tail) is None:
            last = None
            for last in _HASHES_LINE.finditer(tail):  # noqa: B007 - we want the final match
                pass
            if last is None:
                return 0.0
            answer = last.group(1).strip().replace(",", "").replace("$", "").rstrip(".").strip()
            pd, gd = _as_decimal(answer), _as_decimal(_normalise(ground_truth.strip()).replace(",", ""))
            return float(pd is not None and gd is not None and pd == gd)
    except Exception:
        return 0.0
    return verify_math(response, ground_truth, timeout_s)


def verify_integer(response: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{}`` in ``response`` holds exactly the integer ``ground_truth``.

    The boxed text must be an optional sign and digits (surrounding spaces allowed): ``\\boxed{-7}``
    and ``\\boxed{007}`` match ``-7`` and ``7``; ``\\boxed{7.0}`` and ``\\boxed{3+4}`` do not. A
    ``ground_truth`` that is not an integer raises ``ValueError`` (a caller's mistake, not the model's).
    """
    gold = _as_int(str(ground_truth).strip())
    if gold is None:
        raise ValueError(f"verify_integer needs an integer ground truth, got {ground_truth!r}")
    pred = extract_boxed(response)
    if pred is None:
        return 0.0
    value = _as_int(pred.replace(" ", ""))
    return float(value is not None and value == gold)


# ---------------------------------------------------------------------------- lenient: last number

LENIENT_REWARD = "boxed-or-last-number"
"""``--reward-fn`` name of :func:`verify_boxed_or_last_number` (explicit only: never an ``auto`` choice)."""

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


def verify_boxed_or_last_number(response: str, ground_truth: str, timeout_s: float | None = 5.0) -> float:
    """A lenient reward for models that answer without ``\\boxed{}`` (``--reward-fn boxed-or-last-number``).

    With a ``\\boxed{`` (or ``\\fbox{``) anywhere in the response's last :data:`MAX_SCAN_CHARS`
    characters, this is exactly :func:`verify_math` (the strict rules: a box that never closes scores
    0, and no fallback to a number elsewhere). Without one, 1.0 if :func:`last_number` of the response
    equals ``ground_truth`` read as a plain number (``_normalise``\\ d, commas dropped: ``122``,
    ``-7``, ``0.5``, ``1,234``) exactly, as decimals (``122.0`` pays for ``122``); a reference that is
    no plain number (``\\frac{1}{2}``) is paid by a box only. Never raises; never evaluates the text.
    """
    try:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return 0.0
        if _BOX_OPEN.search(response[-MAX_SCAN_CHARS:]) is None:
            gold = _as_decimal(_normalise(unwrap_text(ground_truth.strip())).replace(",", ""))
            pred = last_number(response)
            return float(gold is not None and pred is not None and pred == gold)
    except Exception:
        return 0.0
    return verify_math(response, ground_truth, timeout_s)
