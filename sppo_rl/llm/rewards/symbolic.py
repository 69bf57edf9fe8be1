"""The symbolic comparison of two bare answers (``math_verify`` on LaTeX, never ``eval``), under a
wall-clock deadline: :func:`_symbolic_equal` requires the answer to parse as a whole
(:func:`_well_formed`), to answer rather than restate (:func:`_restates`), and compares small floats at
the reference's own precision; :func:`_deadline` raises :class:`_Deadline` in the comparison when its
time is up (``SIGALRM``, main thread only); :func:`warm_up` imports the parser once per process. The
entry points that call it are in :mod:`sppo_rl.llm.rewards.verify`.
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
from decimal import Decimal
from functools import lru_cache
from typing import Any

from sppo_rl.llm.rewards.answers import (
    _EXACT,
    _TEXT_WRAP,
    _as_base_numeral,
    _float_rounding,
    _normalise,
    _sci_to_latex,
)

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


_INT_FRAC = re.compile(r"\\frac\{\s*([+-]?[0-9]{1,50})\s*\}\{\s*([+-]?[0-9]{1,50})\s*\}")

_MIXED = re.compile(r"(-?[0-9]{1,50})\\frac\{([0-9]{1,50})\}\{([0-9]{1,50})\}")

_NO_VALUE = object()  # an answer the unevaluated parse could not read


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
    is no relation; any other relation (``4 = 5``, ``5 = 5``, ``4 \\equiv 5``, ``5 > 4``) is refused then.
    An answer that the unevaluated parse cannot read is refused when ``gold`` can be."""
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
    elif getattr(p, "is_Relational", False) and not getattr(g, "is_Relational", False):
        return "it states a relation between values (4 = 5, 4 \\equiv 5), not a value"
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
