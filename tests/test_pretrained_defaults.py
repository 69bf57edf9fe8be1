"""What a pretrained model needs (issue 25): the lenient ``boxed-or-last-number`` reward, no actor
update when every reward of a batch is equal, SPPO's critic initialised from the first batch's success
rate, and checkpoints that keep only the newest K and may leave out the optimizer states.

Runs use the small Llama with a real BPE tokenizer and a chat template built in ``test_pretrained.py``
(seconds each); nothing is downloaded."""

from __future__ import annotations

import math

import pytest

from sppo_rl.llm.verify import last_number, verify_boxed_or_last_number

# ------------------------------------------------------------------------------- lenient reward


@pytest.mark.parametrize(
    "response, truth, paid",
    [
        ("59 + 63 = 122", "122", 1.0),  # the equation's result is the final number
        ("The answer is 122.", "122", 1.0),  # a sentence's final period is no decimal point
        ("122.0", "122", 1.0),  # equal as decimals
        ("The total is 1,234 apples", "1234", 1.0),  # thousands grouped in threes
        ("x = -7", "-7", 1.0),  # a sign after '=' belongs to the number
        ("59 + 63 = 122", "123", 0.0),
        ("122 or 123", "122", 0.0),  # a hedge: two different final numbers
        ("122 or 123", "123", 0.0),
        ("122, 123", "123", 0.0),
        ("somewhere between 120 and 122", "122", 0.0),
        ("122 (or maybe 123)", "123", 0.0),
        ("122 or 122", "122", 1.0),  # the same number twice is no hedge
        ("12-7", "7", 0.0),  # a range, and no sign: the '-' follows a digit
        ("the answer is 122 + 1", "122", 0.0),  # an unfinished expression
        ("122x", "122", 0.0),  # glued to a letter: not a number on its own
        ("2^122", "122", 0.0),
        ("1/122", "122", 0.0),
        ("12,34", "1234", 0.0),  # not thousands in threes
        ("1.2.3", "3", 0.0),
        ("", "122", 0.0),
        ("no digits here", "122", 0.0),
        ("\u0661\u0662\u0662", "122", 0.0),  # other scripts' digits are not read
        ("61*2", "122", 0.0),  # never evaluated: eval would give 122, the final number is 2
        ("__import__('math').floor(122.9)", "122", 0.0),  # code is text: its final number is 122.9
        ("122", "\\frac{1}{2}", 0.0),  # a non-numeric reference is paid by a box only
        ("\\boxed{122}", "122", 1.0),  # a box is judged by the strict verifier ...
        ("\\boxed{123} so 122", "122", 0.0),  # ... and only by it, however the text ends
        ("\\boxed{2+120} = 122", "122", 0.0),  # the strict rules stand: a restatement scores 0
        ("so \\boxed{122", "122", 0.0),  # an unclosed box: no fallback to the final number
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ],
)
def test_boxed_or_last_number_pays_clean_final_numbers_only(response, truth, paid):
    assert verify_boxed_or_last_number(response, truth) == paid


def test_last_number_values_and_garbage():
    assert last_number("59 + 63 = 122") == 122
    assert last_number("-122") == -122
    assert last_number("so 122.5.") == 122.5
    assert last_number("122\n\n<|im_end|>") == 122  # a special token after it is no operator
    assert last_number("(3)-7") == 7  # after a closing bracket '-' is subtraction, not a sign
    assert last_number("9" * 2000) is None  # longer than MAX_INT_DIGITS: never converted
    assert verify_boxed_or_last_number(None, "1") == 0.0  # type: ignore[arg-type]
    assert verify_boxed_or_last_number("1", None) == 0.0  # type: ignore[arg-type]


def test_the_lenient_reward_is_a_builtin_name_scored_in_a_worker_and_never_auto():
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.reward import RewardScorer
    from sppo_rl.llm.setup import load_task

    with RewardScorer("boxed-or-last-number", timeout_s=10.0) as scorer:
        res = scorer.score(["59 + 63 = 122", "122 or 123", "\\boxed{122}", "nope"], ["122"] * 4)
    assert res.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    _, _, auto = load_task(LLMConfig(task="arithmetic", train_size=8, val_size=2))
    assert auto == "integer"  # 'auto' keeps the strict boxed reward on boxed data
