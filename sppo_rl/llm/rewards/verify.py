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

Reading answers out of text (extraction, plain numbers, the cost guard, the last number) is in
:mod:`sppo_rl.llm.rewards.answers`; the symbolic comparison and its deadline are in
:mod:`sppo_rl.llm.rewards.symbolic`.
"""

from __future__ import annotations

import re

from sppo_rl.llm.rewards.answers import (
    _BOX_OPEN,
    MAX_ANSWER_CHARS,
    MAX_REFERENCE_CHARS,
    MAX_SCAN_CHARS,
    _as_base_numeral,
    _as_decimal,
    _as_int,
    _normalise,
    extract_boxed,
    last_number,
    too_costly,
    unwrap_text,
)
from sppo_rl.llm.rewards.symbolic import (
    _Deadline,
    _deadline,
    _symbolic_equal,
    warm_up,
)


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


LENIENT_REWARD = "boxed-or-last-number"
"""``--reward-fn`` name of :func:`verify_boxed_or_last_number` (explicit only: never an ``auto`` choice)."""


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
