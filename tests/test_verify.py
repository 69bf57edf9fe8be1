"""The verifiers: boxed extraction, integer and math equivalence, the paper's data, untrusted input."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import FIXTURES  # noqa: E402
from paths import MATH_DATA as DATA  # noqa: E402

from sppo_rl.llm.rewards.answers import extract_boxed, too_costly
from sppo_rl.llm.rewards.symbolic import _well_formed
from sppo_rl.llm.rewards.verify import verify_integer, verify_math

FILES = [
    "dapo-math-17k_dedup.parquet",
    "math__aime2025_2025.parquet",
    "math__aime_repeated_8x_240.parquet",
    "math__amc23_2025.parquet",
    "math__math_500.parquet",
    "math__minerva_math_2025_processed.parquet",
]
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="the paper's math data is not on this machine")

# ----------------------------------------------------------------------------------- extract_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{47}.", "47"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\fbox{12}", "12"),
        (r"\boxed {  7 }", "7"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{\}}", r"\}"),
        (r"\boxed{a}\boxed{\boxed{b}}", "b"),
        (r"\boxed{}", ""),
        ("no box here", None),
        (r"\boxed{12} \boxed{3", None),  # the final answer was cut off
        (r"\boxed 5", None),
        (None, None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_bounds_depth_and_scan():
    assert extract_boxed(r"\boxed{" + "{" * 10 + "1" + "}" * 10 + "}") is not None
    deep = r"\boxed{" + "{" * 100 + "1" + "}" * 100 + "}"
    assert extract_boxed(deep) is None
    far = r"\boxed{5}" + " " * 20_000
    assert extract_boxed(far) is None  # only the tail is read
    assert extract_boxed(far, max_scan=30_000) == "5"
    t0 = time.perf_counter()
    assert extract_boxed(r"\boxed{" * 200_000 + "1") is None
    assert extract_boxed("{" * 5_000_000) is None
    assert time.perf_counter() - t0 < 1.0


# ---------------------------------------------------------------------------------- verify_integer


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        (r"\boxed{47}", "47", 1.0),
        (r"\boxed{-12}", "-12", 1.0),
        (r"\boxed{ 007 }", "7", 1.0),
        (r"\boxed{+5}", "5", 1.0),
        (r"\boxed{- 5}", "-5", 1.0),
        (r"\boxed{46}", "47", 0.0),
        (r"\boxed{47.0}", "47", 0.0),
        (r"\boxed{40+7}", "47", 0.0),
        ("47", "47", 0.0),
        (r"\boxed{" + "9" * 5000 + "}", "9", 0.0),
        (r"\boxed{4}\boxed{7}", "7", 1.0),
    ],
)
def test_verify_integer(response, truth, expected):
    assert verify_integer(response, truth) == expected


def test_verify_integer_rejects_a_non_integer_truth():
    with pytest.raises(ValueError, match="integer ground truth"):
        verify_integer(r"\boxed{1}", "1/2")


# ------------------------------------------------------------------------------- verify_math pairs

EQUAL = [
    (r"\frac{1}{2}", "0.5"),
    ("0.5", r"\frac{1}{2}"),
    ("1/2", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", r"\frac12"),
    (r"\tfrac{1}{2}", "0.5"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}"),
    (r"\pi/2", r"\frac{\pi}{2}"),
    (r"\{2, 1\}", r"\{1,2\}"),
    ("[0,1)", "[0, 1)"),
    (r"(2, \infty)", r"(2,\infty)"),
    (r"x \in (2,\infty)", r"(2,\infty)"),
    (r"3+2\sqrt2, 3-2\sqrt2", r"3 \pm 2 \sqrt{2}"),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
    ("27", "27.0"),
    ("1,000", "1000"),
    ("0.5", r"50\%"),
    ("336", r"336^\circ"),
    (r"1.325 \times 10^{-27}", "1.325e-27"),
    (r"6.72\times10^{-5}", ".0000672"),
    (r"\frac{1}{3}", "0.333333"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
]
DIFFERENT = [
    ("3", "4"),
    ("-0.5", r"\frac{1}{2}"),
    (r"\frac{1}{3}", "0.33"),
    (r"\sqrt{2}", "1.41421"),
    (r"2\sqrt{3}", r"\sqrt{8}"),
    ("(0,1]", "[0, 1)"),
    (r"\{1,2,3\}", r"\{1,2\}"),
    ("1.325e-28", "1.325e-27"),
    (r"\frac{1.325}{10^{28}}", "1.325e-27"),  # math_verify alone calls these equal (rounding to 6 places)
    (r"\frac{673}{10^7}", ".0000672"),
    (r"\frac{81}{50}", "1.6"),
    ("0", "4.6e-24"),
    ("52_9", "52_8"),  # another base: math_verify alone drops the subscript
    ("x^2+1", "(x+1)^2"),
    (r"\text{Monday}", r"\text{Tuesday}"),
    ("", "0"),
]


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("pred, truth", EQUAL)
def test_equivalent_answers_accepted(pred, truth, fast_path):
    assert verify_math(f"The answer is $\\boxed{{{pred}}}$.", truth, fast_path=fast_path) == 1.0


@pytest.mark.parametrize("pred, truth", DIFFERENT)
def test_different_answers_rejected(pred, truth):
    assert verify_math(f"\\boxed{{{pred}}}", truth) == 0.0


# --------------------------------------------------------------------------- junk after the answer

# (reference, the reference with junk appended, the same answer written another way). The parser reads
# juxtaposition as multiplication, so each junk form is the reference times 1: a policy that learned to
# append a digit was paid for it.
NEAR_MISSES = [
    (r"11\sqrt2", r"11\sqrt21", r"\sqrt{242}"),  # \sqrt21 is \sqrt{2} 1: 11 * sqrt(2) * 1
    ("6+9i", "6+9i1", "9i+6"),
    (r"12\pi", r"12\pi1", r"\pi \cdot 12"),
    (r"2 \pi / \omega", r"2 \pi / \omega1", r"\frac{2\pi}{\omega}"),
    ("SRMC=LRMC", "SRMC=LRMC1", "LRMC = SRMC"),
]


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("truth, junk, correct", NEAR_MISSES)
def test_a_digit_appended_to_the_answer_scores_zero(truth, junk, correct, fast_path):
    assert verify_math(f"\\boxed{{{junk}}}", truth, fast_path=fast_path) == 0.0
    assert verify_math(f"\\boxed{{{truth}}}", truth, fast_path=fast_path) == 1.0
    assert verify_math(f"\\boxed{{{correct}}}", truth, fast_path=fast_path) == 1.0


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(
    "junk, truth",
    [
        (r"\frac{1}{2})", r"\frac{1}{2}"),  # math_verify falls back on reading a part: 1/2
        (r"\frac{1}{2}1", "0.5"),
        (r"\frac{1}{2}{1}", "0.5"),  # a number in invisible braces
        ("x^2 1", "x^2"),
        (r"\infty1", r"\infty"),
        (r"5\%1", r"5\%"),
        ("47 1", "48"),  # read as the mixed number 47 + 1/1, as 2\frac{1}{2} is 2.5
        (r"90^\circ1", "91"),  # the same after the degree sign is dropped
        ("52_81", "52_8"),  # base 81 does not exist; math_verify alone drops the subscript
        (r"5\text{ cm}{1}", "5"),  # math_verify drops a unit and, with it, all up to the last "}"
        (r"2\text{ m}+3\text{ m}", "2"),
        (r"5.4 \text{ cents}{1}", r"5.4 \text{ cents}"),
    ],
)
def test_other_junk_scores_zero(junk, truth, fast_path):
    assert verify_math(f"\\boxed{{{junk}}}", truth, fast_path=fast_path) == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        r"2\frac{1}{2}",  # a mixed number: the integer comes first
        r"3\sqrt{2}\pi",
        r"2^{2} \cdot 3",  # an explicit product may end with a number
        r"1.5\times10^{-3}",
        r"\frac{1}2",
        r"5\text{ cm}^2",
        r"864 \mbox{ inches}^2",
        r"\log_2 8",
        "1011_{2}",
        r"x \in (2,\infty)",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
    ],
)
def test_well_formed_answers_are_not_junk(answer):
    assert _well_formed(answer)
    assert verify_math(f"\\boxed{{{answer}}}", answer, fast_path=False) == 1.0


def test_a_digit_that_keeps_the_value_is_not_junk():
    """Rejection is by form, not by text: a well-formed answer with the reference's value is right."""
    assert verify_math(r"\boxed{0 \cdot 51}", r"0 \cdot 5") == 1.0
    assert verify_math(r"\boxed{1^{21}}", "1^{2}") == 1.0


def test_an_answer_that_does_not_parse_matches_by_text_only():
    """Minerva writes a few references in Python (``-1./3``): they match themselves, nothing else."""
    assert verify_math(r"\boxed{-1./3}", "-1./3", fast_path=False) == 1.0
    assert verify_math(r"\boxed{-1./31}", "-1./3", fast_path=False) == 0.0
    assert verify_math(r"\boxed{-1./3}", "-1/3", fast_path=False) == 0.0


def test_numerals_in_other_bases_compare_by_value():
    assert verify_math(r"\boxed{1011_2}", "11_{10}") == 1.0
    assert verify_math(r"\boxed{4343_6}", "4343_6") == 1.0
    assert verify_math(r"\boxed{52_9}", "52_8") == 0.0


def test_needs_a_box_and_reads_the_last_one():
    assert verify_math("The answer is 47.", "47") == 0.0
    assert verify_math(r"\boxed{12} no wait \boxed{47}", "47") == 1.0
    assert verify_math(r"\boxed{47} no wait \boxed{12}", "47") == 0.0
    assert verify_math(r"\boxed{47", "47") == 0.0


@pytest.mark.parametrize("bad", [None, 47, b"\\boxed{47}", ["\\boxed{47}"]])
def test_non_string_inputs_score_zero(bad):
    assert verify_math(bad, "47") == 0.0
    assert verify_math(r"\boxed{47}", bad) == 0.0


# ------------------------------------------------------------------------------------ paper data


def _truths(name: str, sample: int | None = None, root: Path = DATA) -> list[str]:
    rows = pq.read_table(root / name, columns=["reward_model"]).column("reward_model").to_pylist()
    truths = [r["ground_truth"] for r in rows]
    if sample is not None and len(truths) > sample:
        step = len(truths) / sample
        truths = [truths[int(i * step)] for i in range(sample)]
    return truths


def _balanced(s: str) -> bool:
    depth = 0
    for c in re.sub(r"\\[{}]", "", s):
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
    return depth == 0


def _change_last_digit(s: str) -> str | None:
    """The same answer with its last ASCII digit d replaced by d+1 mod 10."""
    digits = [m.start() for m in re.finditer("[0-9]", s)]
    if not digits:
        return None
    i = digits[-1]
    return s[:i] + str((int(s[i]) + 1) % 10) + s[i + 1 :]


def _rates(truths: list[str]) -> dict[str, float]:
    """Acceptance of ``\\boxed{truth}`` (default, and symbolic path only) and rejection of two
    perturbations that always change the value: ``truth+1`` and the last digit changed."""
    usable = [t for t in truths if _balanced(t)]
    changed = [(t, c) for t in usable if (c := _change_last_digit(t)) is not None]
    return {
        "rows": len(truths),
        "unbalanced": len(truths) - len(usable),
        "refused_as_costly": sum(too_costly(t) for t in usable),
        "accept": sum(verify_math(f"\\boxed{{{t}}}", t) for t in usable) / len(usable),
        "accept_symbolic": sum(verify_math(f"\\boxed{{{t}}}", t, fast_path=False) for t in usable)
        / len(usable),
        "reject_plus_one": 1 - sum(verify_math(f"\\boxed{{{t}+1}}", t) for t in usable) / len(usable),
        "reject_digit": 1 - sum(verify_math(f"\\boxed{{{c}}}", t) for t, c in changed) / len(changed),
    }


def _check_rates(name: str, rates: dict[str, float]) -> None:
    print(
        f"\n{name}: "
        + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in rates.items())
    )
    assert rates["accept"] == 1.0
    assert rates["refused_as_costly"] == 0
    assert rates["accept_symbolic"] >= 0.99
    assert rates["reject_plus_one"] >= 0.99
    assert rates["reject_digit"] >= 0.98


@needs_data
@pytest.mark.parametrize("name", FILES)
def test_paper_data_accepted_and_perturbations_rejected(name):
    sample = 400 if name.startswith("dapo") else None  # the full 17k rows: test_full_dapo_file (slow)
    _check_rates(name, _rates(_truths(name, sample)))


@pytest.mark.parametrize("name", FILES)
def test_shipped_subsets_accepted_and_perturbations_rejected(name):
    """The 24-row subsets shipped in tests/fixtures run everywhere, with or without the full files."""
    _check_rates(name, _rates(_truths(name, root=FIXTURES)))


@needs_data
@pytest.mark.slow
def test_full_dapo_file():
    _check_rates(FILES[0], _rates(_truths(FILES[0])))


JUNK = ["1", " 1", "{1}", ")"]
"""Appended to a reference, each makes a different answer or a malformed one. ``)`` unbalances it
(math_verify alone then reads a part of it). A digit appended to a trailing number changes it (``2`` ->
``21``, ``1.5`` -> ``1.51``, ``x^2`` -> ``x^21``, ``1.3e-27`` -> ``1.3e-271``); anywhere else it is
juxtaposed, which the grammar reads as a product (``\\pi1``) or a mixed number (``47 1``) and the
verifier refuses. A reference the junk could leave equal in value (``0 \\cdot 5`` -> ``0 \\cdot 51``,
``1^{2}`` -> ``1^{21}``) would need an exemption here: none of the paper's six files has one (checked
over all rows by test_full_files_reject_junk)."""

MALFORMED_REFERENCES = {"np.arcsin(10/13)", "-1./3", "-3./2"}
"""Minerva references written in Python rather than LaTeX: they match by their text only."""


def _junk_report(truths: list[str]) -> dict[str, list]:
    """Over the balanced references: those that do not parse as a whole, those a response holding
    exactly the reference fails (symbolic path), and the (reference, junk) pairs that were paid."""
    usable = [t for t in truths if _balanced(t)]
    malformed = [t for t in usable if not _well_formed(t)]
    return {
        "malformed": malformed,
        "self_rejected": [
            t
            for t in usable
            if t not in malformed and verify_math(f"\\boxed{{{t}}}", t, fast_path=False) != 1
        ],
        "junk_paid": [(t, j) for t in usable for j in JUNK if verify_math(f"\\boxed{{{t}{j}}}", t) != 0],
    }


def _check_junk(truths: list[str]) -> None:
    report = _junk_report(truths)
    assert set(report["malformed"]) <= MALFORMED_REFERENCES
    assert report["self_rejected"] == []
    assert report["junk_paid"] == []


@pytest.mark.parametrize("name", FILES)
def test_shipped_subsets_reject_junk(name):
    _check_junk(_truths(name, root=FIXTURES))


@needs_data
@pytest.mark.parametrize("name", FILES)
def test_paper_data_rejects_junk(name):
    _check_junk(_truths(name, 200))


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_full_files_reject_junk(name):
    _check_junk(_truths(name))


@needs_data
def test_minerva_references_truncated_at_the_first_closing_brace():
    """A data defect, pinned: 68 of Minerva's 272 references lost everything after their first ``}``
    (``\\frac{2 \\pi c^{2``); no response can match them. Every other reference verifies."""
    truths = _truths(FILES[-1])
    broken = [t for t in truths if not _balanced(t)]
    assert len(broken) == 68
    assert all(verify_math(f"\\boxed{{{t}}}", t) == 0.0 for t in broken)


# ------------------------------------------------------------------------------- untrusted input

NASTY = [
    r"10^{10^{10}}",
    r"9**9**9**9",
    r"9^{9^{9^{9}}}",
    r"((2^{1000})^{1000})^{1000}",
    r"\left(9\right)^{99999999}",
    r"10^{999999}",
    r"2^3^4",
    r"(10^{10})!",
    r"99999999999!",
    r"\binom{1000000000}{500000000}",
    r"\prod_{i=1}^{10^9} i",
    r"e^{e^{e^{e^{10}}}}",
    r"1e999999",
    r"1e-999999",
    "9" * 5000,
    r"\sqrt{" * 60 + "2" + "}" * 60,
    "(" * 40 + "1" + ")" * 40,
    r"\frac{1}{" * 30 + "2" + "}" * 30,
    "__import__('os').system('echo pwned')",
    "().__class__.__base__.__subclasses__()",
    "lambda: 0",
    "\x00\x01\x1b[2J\u202e",
    "\U0001f600" * 100,
]


@pytest.mark.parametrize("answer", NASTY)
def test_nasty_answers_are_bounded(answer):
    t0 = time.perf_counter()
    assert verify_math(f"\\boxed{{{answer}}}", "5", timeout_s=1.0) == 0.0
    assert verify_math(f"\\boxed{{{answer}}}", "5", timeout_s=1.0, fast_path=False) == 0.0
    assert time.perf_counter() - t0 < 3.0


@pytest.mark.parametrize(
    "answer",
    [
        r"10^{10^{10}}",
        r"9^{9^{9}}",
        r"((2^{100})^{100})^{100}",
        r"2^3^4",
        r"(10^{10})!",
        r"\binom{10^9}{7}",
        r"x^{10^{7}}",
    ],
)
def test_too_costly_refuses(answer):
    assert too_costly(answer)


@pytest.mark.parametrize(
    "answer",
    [
        r"2^{2023}-1",
        r"\frac{100!}{50!}",
        r"(x+1)^{2}",
        r"(2^{10})^{3}",
        r"\binom{10}{3}",
        r"3^{1/2}",
        "x^2+1",
    ],
)
def test_too_costly_allows_ordinary_answers(answer):
    assert not too_costly(answer)
    assert verify_math(f"\\boxed{{{answer}}}", answer, fast_path=False) == 1.0


def test_refused_answers_still_match_by_text():
    assert verify_math(r"\boxed{10^{10^{10}}}", r"10^{10^{10}}") == 1.0


def test_deadline_ends_slow_symbolic_work():
    slow = r"(x+1)^{997}-(x-1)^{997}"  # about 9 s of sympy without a deadline
    assert not too_costly(slow)
    t0 = time.perf_counter()
    assert verify_math(f"\\boxed{{{slow}}}", "2", timeout_s=0.3, fast_path=False) == 0.0
    assert time.perf_counter() - t0 < 1.5


def test_deadline_fires_again_when_its_first_alarm_is_swallowed():
    """An exception raised in a gc callback or ``__del__`` is dropped by Python; the deadline must
    not depend on its first alarm landing elsewhere."""
    import signal

    from sppo_rl.llm.rewards.symbolic import _Deadline, _deadline

    def busy(until: float) -> None:
        while time.perf_counter() < until:
            pass

    t0 = time.perf_counter()
    with pytest.raises(_Deadline):
        with _deadline(0.1):
            try:
                busy(t0 + 5.0)
            except _Deadline:
                pass  # swallowed, as Python does inside a gc callback
            busy(t0 + 5.0)
    assert time.perf_counter() - t0 < 1.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_deadline_keeps_an_existing_alarm_and_handler():
    import signal

    def mine(signum, frame):  # pragma: no cover - never fires
        raise AssertionError

    old = signal.signal(signal.SIGALRM, mine)
    try:
        assert verify_math(r"\boxed{\frac{1}{2}}", "0.5", fast_path=False) == 1.0
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, old)


def test_works_off_the_main_thread():
    out = {}

    def run():
        out["yes"] = verify_math(r"\boxed{\dfrac{1}{2}}", "0.5", fast_path=False)
        out["no"] = verify_math(r"\boxed{\dfrac{3}{4}}", "0.5", fast_path=False)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert out == {"yes": 1.0, "no": 0.0}


CODE = [
    "__import__('pathlib').Path('{p}').touch()",
    "__import__('os').system('touch {p}')",
    "open('{p}', 'w').write('x')",
    "exec(\"open('{p}','w')\")",
    "eval(\"__import__('pathlib').Path('{p}').touch()\")",
]


@pytest.mark.parametrize("template", CODE)
def test_responses_are_never_run_as_code(template, tmp_path):
    target = tmp_path / "pwned"
    code = template.format(p=target)
    for fast in (True, False):
        verify_math(f"\\boxed{{{code}}}", "1", fast_path=fast)
        verify_math(f"\\boxed{{{code}}}", code, fast_path=fast)  # also as the reference
        verify_math(code, "1", fast_path=fast)
    verify_integer(f"\\boxed{{{code}}}", "1")
    assert not target.exists()


# ------------------------------------------------------------------------------------------ fuzz

PIECES = [
    *[r"\frac", r"\dfrac", r"\sqrt", r"\boxed{", r"\fbox{", "{", "}", "{{{{", "}}}}", "^", "^{", "**", "!"],
    *["(", ")", "[", "]", r"\{", r"\}", r"\left(", r"\right)", r"\left[", r"\right]", "\\\\", "_", "_{"],
    *[
        r"\binom",
        r"\Gamma",
        r"\int",
        r"\sum_{i=1}^{",
        r"\prod",
        r"\lim",
        r"\infty",
        r"\pi",
        r"\text{",
        r"\mbox{",
    ],
    *[
        r"\cdot",
        r"\times",
        r"\pm",
        r"\le",
        r"\cup",
        r"\begin{pmatrix}",
        r"\end{pmatrix}",
        "&",
        "%",
        r"\%",
        "$",
    ],
    *["9", "99999999999999999999", "1e999999", "1e-999999", "10^{10^{10}}", "9**9**9**9", "e^{", "0.", ".5"],
    *["__import__('os').system('x')", "exec(", "eval(", "lambda: 0", "().__class__", "open('/tmp/x','w')"],
    *["x", "y", "i", "-", "+", "/", "=", ",", " ", "\n", "\x00", "\x1b[2J", "\u202e", "\u00e9", "\U0001f600"],
]
fragment = st.one_of(
    st.sampled_from(PIECES),
    st.integers(0, 10**60).map(str),
    st.text(st.characters(codec="utf-8"), max_size=6),
)
answer = st.lists(fragment, max_size=24).map("".join)
response = st.one_of(
    answer.map(lambda s: f"\\boxed{{{s}}}"), answer.map(lambda s: f"x \\boxed{{{s}}} y"), answer
)
TRUTHS = ["34", r"\frac{1}{2}", r"(2,\infty)", "1.325e-27", r"\{1,2\}", r"3 \pm 2 \sqrt{2}", "x^2+1", "-7"]
FUZZ_TIMEOUT_S = 1.0


@pytest.mark.timeout(600, method="thread")  # a last resort only: each call below is bounded by itself
@settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(response, min_size=5, max_size=5), st.sampled_from(TRUTHS) | answer)
def test_fuzz_verify_math_is_bounded(responses, truth):
    """10,000 generated responses (2,000 examples x 5): 0.0 or 1.0, never an exception, each call
    within its deadline plus a margin."""
    for r in responses:
        t0 = time.perf_counter()
        score = verify_math(r, truth, timeout_s=FUZZ_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        assert score in (0.0, 1.0)
        assert elapsed < FUZZ_TIMEOUT_S + 1.0, (elapsed, r, truth)


# ------------------------------------------------------------- answers, not restatements or hedges

RESTATEMENTS = [
    ("2+2", "4"),
    (r"37\times 43", "1591"),
    (r"\dbinom{8}{4}", "70"),
    (r"\binom{8}{4}", "70"),
    (r"\log_2 64", "6"),
    ("19^2", "361"),
    (r"\frac34+\frac58", r"\frac{11}{8}"),
    (r"\int_0^1 x^2dx", r"\frac{1}{3}"),
    (r"\lim_{x \to 0} (4+x)", "4"),
    ("4+x-x", "4"),
    (r"\sqrt{16}", "4"),
    ("3!", "6"),
    (r"\frac{8}{2}", "4"),  # a fraction of integers not in lowest terms
    (r"\frac{22}{16}", r"\frac{11}{8}"),
    (r"\frac{1.325}{10^{27}}", "1.325e-27"),  # a decimal divided by a power of ten
    (r"x^2+1+y-y", "x^2+1"),  # a free variable the reference lacks
]
"""Each pair is equal in value, and was paid 1.0 before: the answer restates the question."""

HEDGES = [
    r"4\text{ or 5}",
    r"4\text{, but maybe 5}",
    r"4\mbox{ -- not sure, could be 7}",
    r"4\textbf{ or 5}",
    r"4\,\text{or 5}",
    r"4 \text{ (not 5)}",
    r"\text{4 or 5}",
    r"4\text{ cm}",  # a unit the reference does not have is text after the value
]

STILL_PAID = [
    (r"\frac{11}{8}", "11/8"),
    ("11/8", r"\frac{11}{8}"),
    (r"\frac{11}{8}", "1.375"),
    ("x = 4", "4"),
    (r"x \in (2,\infty)", r"(2,\infty)"),
    (r"5\text{ cm}", r"5\text{ cm}"),  # a unit the reference also has
    (r"5 \text{cm}", r"5\text{ cm}"),
    (r"\text{4}", "4"),  # a plain text group wrapping the value itself
    (r"\textbf{ 4 }", "4"),
    (r"\text{Monday}", r"\text{Monday}"),
    (r"2\frac{1}{2}", r"\frac{5}{2}"),  # a mixed number
    (r"1.5\times10^{-3}", "0.0015"),  # scientific notation
    ("10^{3}", "1000"),
    (r"2\sqrt{2}", r"\sqrt{8}"),  # an irrational closed form is an answer
    (r"\pi \cdot 12", r"12\pi"),
    (r"-\frac{3}{4}", "-0.75"),
    ("x^2+2x+1", "(x+1)^2"),  # symbolic references keep math_verify's equivalence
    (r"2^{10}", "2^{10}"),  # the reference itself unevaluated: as written
    (r"0 \cdot 51", r"0 \cdot 5"),
]


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("pred, truth", RESTATEMENTS)
def test_a_restated_question_scores_zero(pred, truth, fast_path):
    assert verify_math(f"\\boxed{{{pred}}}", truth, fast_path=fast_path) == 0.0
    assert verify_math(f"\\boxed{{{truth}}}", truth, fast_path=fast_path) == 1.0


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("pred", HEDGES)
def test_a_hedge_or_text_after_the_value_scores_zero(pred, fast_path):
    assert verify_math(f"\\boxed{{{pred}}}", "4", fast_path=fast_path) == 0.0


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(
    "pred, truth",
    [
        # references latex2sympy reads only evaluated (MATH-500 has both kinds): hedges still score 0
        (r"1\frac{4}{5}\text{ or 5}", r"1\frac{4}{5}"),
        (r"137 \frac{1}{2}+q-q", r"137 \frac{1}{2}"),
        (r"1\frac{8}{10}", r"1\frac{4}{5}"),
        (r"(-\infty,2)\cup(3,\infty)\text{ or 5}", r"(-\infty, 2) \cup (3, \infty)"),
    ],
)
def test_hedges_after_references_read_only_evaluated_score_zero(pred, truth, fast_path):
    assert verify_math(f"\\boxed{{{pred}}}", truth, fast_path=fast_path) == 0.0
    assert verify_math(f"\\boxed{{{truth}}}", truth, fast_path=fast_path) == 1.0


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("pred, truth", STILL_PAID)
def test_answers_in_simplest_form_are_still_paid(pred, truth, fast_path):
    assert verify_math(f"\\boxed{{{pred}}}", truth, fast_path=fast_path) == 1.0


def _fresh_letter(t: str) -> str:
    return next(c for c in "qwzkj" if c not in t)


def _near_misses(t: str) -> list[str]:
    """Answers equal in value to the reference ``t`` that must score 0: ``t`` with a hedge after it,
    with a free variable added and taken away, and for an integer ``n`` its restatements as a
    computation (``(n-1)+1``, ``n \\times 1``, ``\\frac{2n}{2}``, ``\\sqrt{n^2}``, ...); for a decimal
    or fraction of integers ``(t)+0`` and ``1 \\times (t)``."""
    q = _fresh_letter(t)
    out = [t + h for h in (r"\text{ or 5}", r"\text{, but maybe 5}", r" \text{ (not 5)}", r"\,\text{or 5}")]
    out.append(f"{t}+{q}-{q}")
    if re.fullmatch(r"-?[0-9]{1,6}", t):
        n = int(t)
        out += [f"({n - 1})+1", f"{n}\\times 1", f"\\frac{{{2 * n}}}{{2}}", f"\\int_0^{{{n}}} 1\\,dx"]
        if abs(n) != 10:  # 10^{1} is scientific notation, a numeral
            out.append(f"{n}^{{1}}")
        if n >= 0:
            out.append(f"\\sqrt{{{n * n}}}")
        if 1 <= n <= 1000:
            out.append(f"\\dbinom{{{n}}}{{1}}")
    elif re.fullmatch(r"-?[0-9]*\.[0-9]+|-?\\frac\{[0-9]+\}\{[0-9]+\}", t):
        out += [f"({t})+0", f"1\\times ({t})"]
    return out


def _near_misses_paid(truths: list[str]) -> list[tuple[str, str]]:
    usable = [t for t in truths if _balanced(t) and t not in MALFORMED_REFERENCES]
    assert all(verify_math(f"\\boxed{{{t}}}", t) == 1.0 for t in usable)
    return [(t, m) for t in usable for m in _near_misses(t) if verify_math(f"\\boxed{{{m}}}", t) != 0.0]


@pytest.mark.parametrize("name", FILES)
def test_shipped_subsets_refuse_restatements_and_hedges(name):
    assert _near_misses_paid(_truths(name, root=FIXTURES)) == []


@needs_data
@pytest.mark.parametrize("name", FILES)
def test_paper_data_refuses_restatements_and_hedges(name):
    assert _near_misses_paid(_truths(name, 12)) == []


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_full_files_refuse_restatements_and_hedges(name):
    # DAPO's 17k rows take about an hour (0.2 s a row, 1,500 evenly spaced rows: 292 s, none paid): 600 of them
    sample = 600 if name.startswith("dapo") else None
    assert _near_misses_paid(_truths(name, sample)) == []


RELATIONS = (
    r"\approx \approxeq \thickapprox \simeq \sim \thicksim \cong \propto \doteq \eqsim \backsim \asymp \neq \ne "
    r"\leq \le \geq \ge < > \ll \gg \lesssim \gtrsim \lessapprox \gtrapprox \prec \succ \subset \subseteq \ni "
    r"\mid \parallel \perp \to \rightarrow \mapsto \Rightarrow \implies \iff \Leftrightarrow \coloneqq := "
    r"\triangleq \models \vdash \nsim \ncong \not= ~ \stackrel{?}{=} \overset{!}{=}"
).split() + ["\u2248"]


@pytest.mark.parametrize("relation", RELATIONS)
def test_a_relation_between_two_values_is_not_a_value(relation):
    """``\\boxed{4 R 5}`` is a statement, not the value 4: it scores 0 for 4 whatever the relation R
    (``\\approx`` was paid for 4, the grammar reading it as its left side; ``=`` and ``\\equiv`` are
    equations, judged by their value)."""
    assert verify_math(f"\\boxed{{4 {relation} 5}}", "4") == 0.0


@pytest.mark.parametrize("relation", ["=", r"\equiv", ">", r"\geq"])
def test_a_relation_between_two_values_is_not_its_right_side_either(relation):
    """``\\boxed{4 = 5}`` is a false statement, not the value 5 (it was paid for 5: the grammar judged an
    equation by its right side); ``\\boxed{5 = 5}`` is a statement too. An equation whose left side is the
    asked variable is still judged by its value, and a reference that is a relation is compared as one."""
    for left in ("4", "5"):
        for gold in ("4", "5"):
            assert verify_math(f"\\boxed{{{left} {relation} 5}}", gold) == 0.0, (left, gold)
    assert verify_math(r"\boxed{x = 5}", "5") == 1.0 and verify_math(r"\boxed{x = 5}", "x = 5") == 1.0
    assert verify_math(r"\boxed{5}", "5") == 1.0


@pytest.mark.parametrize(
    "answer",
    [r"4 \approx 5", r"3 \approx 4 \approx 5", r"x \approx 4", r"4 \approxeq 5", "4 \u2248 5", r"4\approx"],
)
def test_an_approximation_is_never_paid_as_a_value(answer):
    for gold in ("3", "4", "5"):
        assert verify_math(f"\\boxed{{{answer}}}", gold) == 0.0, gold
        assert verify_math(f"\\boxed{{{answer}}}", gold, fast_path=False) == 0.0, gold
    assert verify_math(r"\boxed{4}", "4") == 1.0 and verify_math(r"\boxed{x = 4}", "4") == 1.0
    assert verify_math(r"\boxed{\approx 4}", r"\approx 4") == 1.0  # a reference that is one itself
