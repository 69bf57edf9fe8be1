"""The reward scorer: real worker processes, reward functions that raise, hang, crash or lie."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from configs import grpo_pairs_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import MATH_DATA, REPO, outside_a_launcher, write_jsonl

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.rewards.answers import last_number
from sppo_rl.llm.rewards.scorer import RewardScorer
from sppo_rl.llm.rewards.specs import RewardFnError
from sppo_rl.llm.rewards.verify import verify_boxed_or_last_number, verify_integer
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import RunFailed

FNS = REPO / "tests" / "fixtures" / "math" / "reward_fns.py"
MATH500 = MATH_DATA / "math__math_500.parquet"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0); it is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def misbehave():
    with RewardScorer(f"{FNS}:misbehave", timeout_s=1.0) as scorer:
        yield scorer


@pytest.fixture(scope="module")
def math_scorer():
    with RewardScorer("math", timeout_s=2.0, workers=2) as scorer:
        yield scorer


# ------------------------------------------------------------------------------------- built-ins


def test_integer_scores_in_order():
    responses = [r"\boxed{3}", r"\boxed{4}", "3", r"\boxed{-3}", r"\boxed{003}"]
    with RewardScorer("integer", workers=2) as scorer:
        res = scorer.score(responses, ["3", "3", "3", "-3", "3"])
    assert res.scores.dtype == np.float32 and res.scores.shape == (5,)
    assert res.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert (res.errors, res.timeouts) == (0, 0)


def test_integer_ground_truth_error_is_counted():
    with RewardScorer("integer") as scorer:
        res = scorer.score([r"\boxed{1}", r"\boxed{1}"], ["x", "1"])
    assert res.scores.tolist() == [0.0, 1.0]
    assert res.errors == 1 and "integer ground truth" in res.error_samples[0]


def test_math_scores(math_scorer):
    res = math_scorer.score(
        [r"\boxed{\dfrac{1}{2}}", r"\boxed{0.5}", r"\boxed{2\sqrt{2}}", r"\boxed{3}", "no box"],
        [r"\frac12", r"\frac{1}{2}", r"\sqrt{8}", "4", "1"],
    )
    assert res.scores.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert res.errors == 0


def test_empty_batch(math_scorer):
    res = math_scorer.score([], [])
    assert res.scores.shape == (0,) and res.errors == 0


def test_bad_arguments(math_scorer):
    with pytest.raises(ValueError, match="2 responses but 1 ground truths"):
        math_scorer.score(["a", "b"], ["1"])
    with pytest.raises(TypeError, match="response 1 is int"):
        math_scorer.score(["a", 3], ["1", "2"])
    with pytest.raises(ValueError, match="timeout_s"):
        RewardScorer("math", timeout_s=0)
    with pytest.raises(ValueError, match="workers"):
        RewardScorer("math", workers=0)


# --------------------------------------------------------------------------------- misbehaviour


def test_every_kind_of_failure_scores_zero_and_is_counted(misbehave):
    items = "ok raise hang ok spin nan inf str none exit die ok other".split()
    restarts = misbehave.restarts
    t0 = time.monotonic()
    res = misbehave.score(items, ["-"] * len(items))
    elapsed = time.monotonic() - t0
    assert res.scores.tolist() == [1.0 if x == "ok" else 0.0 for x in items]
    # raise, hang, spin, nan, inf, str, none, exit, die
    assert res.errors == 9
    assert res.timeouts == 2  # hang, spin
    assert misbehave.restarts - restarts == 3  # hang, spin, die
    assert elapsed < 2 * 1.0 + 3 * 5.0
    samples = "\n".join(res.error_samples)
    assert "item 1: ZeroDivisionError" in samples and "item 2: timed out" in samples
    # the scorer is healthy afterwards
    assert misbehave.score(["ok"] * 3, ["-"] * 3).scores.tolist() == [1.0] * 3


def test_a_hang_does_not_lose_the_rest_of_the_batch():
    with RewardScorer(f"{FNS}:misbehave", timeout_s=0.5, workers=2) as scorer:
        items = ["ok", "hang", "ok", "ok", "hang", "ok", "ok"]
        res = scorer.score(items, ["-"] * len(items))
        assert res.scores.tolist() == [1.0 if x == "ok" else 0.0 for x in items]
        assert (res.errors, res.timeouts) == (2, 2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the address-space limit reads /proc")
def test_the_worker_outlives_memory_exhaustion(misbehave):
    res = misbehave.score(["hog", "ok"], ["-", "-"])
    assert res.scores.tolist() == [0.0, 1.0]
    assert res.errors == 1 and "MemoryError" in res.error_samples[0]


def test_batch_deadline_bounds_the_whole_call():
    with RewardScorer(f"{FNS}:slow", timeout_s=5.0, batch_timeout_s=1.0) as scorer:
        t0 = time.monotonic()
        res = scorer.score(["0.3"] * 10, ["-"] * 10)
        elapsed = time.monotonic() - t0
        assert elapsed < 1.0 + 3.0  # the deadline plus one worker restart
        done = int(res.scores.sum())
        assert 1 <= done <= 4
        assert res.timeouts == res.errors == 10 - done
        assert scorer.score(["0"], ["-"]).scores.tolist() == [1.0]


# -------------------------------------------------------------------------------- function specs


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown reward function 'nope'"),
        ("tests/fixtures/math/missing.py:fn", "file not found"),
        ("no_such_module_xyz:fn", "module not found"),
        ("no_such_pkg_xyz.sub:fn", "cannot import reward module"),
        (f"{FNS}:", "unknown reward function"),
        (lambda r, t: 1.0, "cannot be sent to a worker"),
        (42, "must be a name"),
    ],
)
def test_invalid_spec_fails_before_any_process_starts(spec, message):
    t0 = time.monotonic()
    with pytest.raises(RewardFnError, match=message):
        RewardScorer(spec)
    assert time.monotonic() - t0 < 1.0  # less than starting a worker process


@pytest.mark.parametrize(
    "spec, message",
    [
        (f"{FNS}:no_such_function", "has no function 'no_such_function'.*misbehave"),
        (f"{FNS}:NOT_A_FUNCTION", "not callable"),
        ("sppo_rl.llm.rewards.verify:no_such_function", "has no function"),
    ],
)
def test_missing_function_fails_at_construction(spec, message):
    with pytest.raises(RewardFnError, match=message):
        RewardScorer(spec)


@pytest.mark.parametrize("spec", ["sppo_rl.llm.rewards.verify:verify_integer", verify_integer])
def test_module_and_callable_specs(spec):
    with RewardScorer(spec) as scorer:
        assert scorer.score([r"\boxed{5}", r"\boxed{6}"], ["5", "5"]).scores.tolist() == [1.0, 0.0]


def test_relative_file_spec(monkeypatch):
    monkeypatch.chdir(REPO)
    with RewardScorer("tests/fixtures/math/reward_fns.py:exact") as scorer:
        assert scorer.score(["a", "b"], ["a", "a"]).scores.tolist() == [1.0, 0.0]


# ------------------------------------------------------------------------------------ lifecycle


def test_close_stops_the_workers():
    scorer = RewardScorer("integer", workers=2)
    pids = scorer.pids
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    scorer.close()
    assert scorer.closed and _wait_gone(pids, 5.0)
    scorer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        scorer.score(["a"], ["a"])


def _run_child(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )


def test_workers_stop_when_the_program_exits_without_close():
    child = _run_child(
        """
        from sppo_rl.llm.rewards.scorer import RewardScorer
        s = RewardScorer("integer", workers=2)
        print(*s.pids, flush=True)
        """
    )
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    pids = [int(p) for p in out.split()]
    assert len(pids) == 2 and _wait_gone(pids, 5.0)


def test_a_hung_worker_stops_when_its_parent_is_killed():
    child = _run_child(
        f"""
        from sppo_rl.llm.rewards.scorer import RewardScorer
        s = RewardScorer({str(FNS) + ":misbehave"!r}, timeout_s=600)
        print(*s.pids, flush=True)
        s.score(["hang"], ["-"])
        """
    )
    assert child.stdout is not None
    pids = [int(p) for p in child.stdout.readline().split()]
    time.sleep(0.5)  # the worker is now inside time.sleep(3600)
    child.kill()
    child.wait(10)
    assert len(pids) == 1 and _wait_gone(pids, 5.0)


# --------------------------------------------------------------------------- throughput, untrusted


def test_throughput(math_scorer):
    """Integer: 1,000 items; math-verify: MATH-500 references, right and wrong (the symbolic path)."""
    n = 1000
    with RewardScorer("integer") as scorer:
        scorer.score(["x"], ["1"])
        res = scorer.score([f"\\boxed{{{i}}}" for i in range(n)], [str(i - i % 2) for i in range(n)])
    assert res.scores.sum() == n / 2
    integer_rate = n / res.seconds
    pq = pytest.importorskip("pyarrow.parquet")
    if MATH500.is_file():
        truths = [
            r["ground_truth"]
            for r in pq.read_table(MATH500, columns=["reward_model"])["reward_model"].to_pylist()
        ]
    else:  # pragma: no cover
        truths = [f"\\frac{{{i}}}{{{i + 1}}}" for i in range(500)]
    truths = truths[:300]
    right = math_scorer.score([f"\\boxed{{{t}}}" for t in truths], truths)
    wrong = math_scorer.score([f"\\boxed{{{t}+1}}" for t in truths], truths)
    assert right.scores.mean() == 1.0 and wrong.scores.mean() == 0.0
    print(
        f"\ninteger: {integer_rate:,.0f} items/s (1 worker); math-verify, 2 workers: "
        f"{len(truths) / right.seconds:,.0f} items/s on right answers (fast path), "
        f"{len(truths) / wrong.seconds:,.0f} items/s on wrong ones (symbolic)"
    )
    assert integer_rate > 1000


NASTY = [
    r"\boxed{10^{10^{10}}}",
    r"\boxed{9**9**9**9}",
    r"\boxed{(10^{10})!}",
    r"\boxed{(x+1)^{997}-(x-1)^{997}}",
    r"\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
    r"\boxed{1e999999}",
    "\\boxed{\x00\u202e}",
    r"\boxed{" * 1000,
    "x" * 1_000_000,
]


def test_nasty_inputs_through_the_scorer(math_scorer):
    t0 = time.monotonic()
    res = math_scorer.score(NASTY, ["5"] * len(NASTY))
    assert res.scores.tolist() == [0.0] * len(NASTY)
    assert (res.errors, res.timeouts) == (0, 0)
    assert time.monotonic() - t0 < 10.0


def test_responses_are_never_run_as_code_in_the_worker(math_scorer, tmp_path):
    target = tmp_path / "pwned"
    codes = [
        f"__import__('pathlib').Path('{target}').touch()",
        f"__import__('os').system('touch {target}')",
        f"open('{target}', 'w').write('x')",
    ]
    responses = [f"\\boxed{{{c}}}" for c in codes] + codes
    res = math_scorer.score(responses, ["1"] * len(responses))
    assert res.errors == 0
    assert not target.exists()


answer = st.lists(
    st.sampled_from(
        [r"\frac", r"\sqrt", "{", "}", "^", "^{", "(", ")", "!", "9", "99999999", "x", r"\pi", "+", "-"]
    )
    | st.text(max_size=5),
    max_size=20,
).map("".join)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(answer.map(lambda s: f"\\boxed{{{s}}}"), min_size=10, max_size=10))
def test_fuzz_through_the_scorer(math_scorer, responses):
    """Generated responses through the worker path: no errors, no hangs, each batch bounded."""
    res = math_scorer.score(responses, ["34"] * len(responses))
    assert res.errors == 0 and res.timeouts == 0
    assert set(res.scores.tolist()) <= {0.0, 1.0}
    assert res.seconds < len(responses) * 2.0


# ---------------------------------------------------------------------- a reward function that forks

FORKING = textwrap.dedent(
    """
    import os, sys

    def child_returns(response, truth):
        '''Forks; both processes return (the child a wrong score), the parent without waiting.'''
        if os.fork() == 0:
            return 0.5
        return 1.0 if response == truth else 0.0

    def child_exits(response, truth):
        '''Forks; the child leaves with sys.exit(0), as code-execution sandboxes end, and the parent waits.'''
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        return 1.0 if response == truth else 0.0

    def strays(response, truth):
        '''Writes replies of its own on the worker's pipe: one to no item, one not a reply at all.'''
        import gc
        from multiprocessing.connection import Connection

        for conn in [o for o in gc.get_objects() if isinstance(o, Connection)]:
            conn.send(("ok", -1, ([0.5], None)))
            conn.send("noise")
        return 1.0 if response == truth else 0.0
    """
)


def _descendants(pid: int) -> list[int]:
    """Live (not zombie) processes below ``pid``: a chain of forked children would show here."""
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=True) if _alive(p.pid)]


@pytest.mark.parametrize("name", ["child_returns", "child_exits"])
def test_a_reward_function_that_forks_scores_correctly(tmp_path, capfd, name):
    """The forked child leaves (pid check) without writing to the worker's pipe, and replies are matched
    to items. Before: ``child_returns`` killed the trainer (IndexError in the scorer) and ``child_exits``
    made the child a second worker on the same pipe: every item "SystemExit: 0", one more process per
    item, BrokenPipe tracebacks."""
    fns = tmp_path / "forking.py"
    fns.write_text(FORKING)
    truths = ["1", "2", "3", "4", "5", "6"]
    responses = ["1", "x", "3", "x", "5", "6"]
    with RewardScorer(f"{fns}:{name}", timeout_s=5.0, workers=2) as scorer:
        for _ in range(2):
            res = scorer.score(responses, truths)
            assert res.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
            assert (res.errors, res.timeouts, scorer.restarts) == (0, 0, 0), res.error_samples
        assert len(scorer.pids) == 2
        # a child that returned leaves at once, but on a busy machine it may not have run yet: wait for it
        deadline = time.monotonic() + 30.0
        while any(_descendants(w) for w in scorer.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [_descendants(w) for w in scorer.pids] == [[], []], "a forked child lives on"
    err = capfd.readouterr().err
    assert "BrokenPipe" not in err and "Traceback" not in err, err[-2000:]


def test_stray_replies_on_the_pipe_never_shift_the_scores(tmp_path):
    """Replies are matched to items by index: a reply to no item and a message that is no reply are
    dropped. Before: each stray reply was taken as the next item's (scores shifted, then a crash)."""
    fns = tmp_path / "forking.py"
    fns.write_text(FORKING)
    truths = ["1", "2", "3", "4"]
    with RewardScorer(f"{fns}:strays", timeout_s=5.0) as scorer:
        res = scorer.score(["1", "x", "3", "4"], truths)
    assert res.scores.tolist() == [1.0, 0.0, 1.0, 1.0] and res.errors == 0, res.error_samples


SEEN = '''
import json


def seen(completions, prompts, rendered_prompts, **columns):
    """1 when the completion is the JSON of the prompt and the rendered prompt this function received."""
    return [float(completions[0] == json.dumps([prompts[0], rendered_prompts[0]]))]
'''


def test_trl_functions_get_the_datas_prompt_and_the_rendered_one_by_name(tmp_path):
    """A TRL-style function receives ``prompts`` as the data gives them (text or chat messages, before
    the run's chat template, system prompt and instruction) and the model's text as ``rendered_prompts``."""
    from test_llm_data import _chat_tokenizer

    from sppo_rl.llm.data.files import Example
    from sppo_rl.llm.data.prompts import PromptFormat, render, render_examples
    from sppo_rl.llm.stages.score import Scoring

    (tmp_path / "fns.py").write_text(SEEN)
    tok, fmt = _chat_tokenizer(), PromptFormat(instruction="Answer with just the number.")
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    given = [Example("12+35=", "47"), Example(chat, "1", meta={"level": 2})]
    examples = render_examples(given, tok, fmt)
    assert examples[0].prompt == "<|user|>12+35= Answer with just the number.\n<|assistant|>"
    assert [e.data_prompt for e in examples] == [e.prompt for e in given]  # kept as the data gives it
    texts = [json.dumps([e.prompt, render(e.prompt, tok, fmt)]) for e in given]
    with RewardScorer(f"{tmp_path / 'fns.py'}:seen") as scorer:
        scores = Scoring(scorer)(texts + texts[::-1], ["47", "1", "1", "47"], examples + examples[::-1])
    assert scores.errors == 0 and scores.R.tolist() == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("weights", [(1e308, 1e308), (1.7e308, 1e308, 5e307), (1e308, 1e-300)])
def test_weights_whose_sum_overflows_still_give_the_weighted_mean(tmp_path, weights):
    """``R = sum_j w_j r_j / sum_j w_j`` with each weight finite but their sum past the largest float:
    ``1e308 1e308`` summed to inf, and every reward became 0 (x / inf). The weights are scaled by a
    power of two (exact), so R is what the formula gives: the first function's reward is 1, the
    others' 0, ``R = w_1 / sum(w)``."""
    import math

    fn = tmp_path / "r.py"
    fn.write_text("def one(response, truth):\n    return 1.0\n\ndef zero(response, truth):\n    return 0.0\n")
    spec = ",".join([f"{fn}:one"] + [f"{fn}:zero"] * (len(weights) - 1))
    with RewardScorer(spec, timeout_s=5.0, weights=list(weights)) as scorer:
        res = scorer.score(["a"], ["-"])
    scale = 2.0 ** -math.frexp(max(weights))[1]
    want = (weights[0] * scale) / sum(w * scale for w in weights)
    assert res.scores.tolist() == [pytest.approx(want, rel=1e-12)] and res.scores[0] > 0
    assert res.valid.tolist() == [True]


# ---------------------------------------------------------------------------------------- GSM8K


@pytest.mark.parametrize(
    "response, expected",
    [
        ("so 24+26 = 50\n#### 50", 1.0),
        ("#### 1,234", 0.0),  # the reference is 50
        ("#### $50.", 1.0),
        ("#### 50.0", 1.0),
        ("#### 50 or 51", 0.0),
        ("#### 24+26", 0.0),
        ("#### 49\n#### 50", 1.0),  # the last one counts
        ("#### 50\n#### 49", 0.0),
        (r"\boxed{50}", 1.0),
        (r"#### 50 but \boxed{49}", 0.0),  # a box wins
        ("The answer is 50.", 0.0),
    ],
)
def test_gsm8k_reward_reads_the_hashes_answer(response, expected):
    from sppo_rl.llm.rewards.verify import verify_gsm8k, verify_math

    assert verify_gsm8k(response, "50") == expected
    if "\\boxed" not in response:
        assert verify_math(response, "50") == 0.0  # strict stays strict


def test_the_math_reward_on_gsm8k_data_reads_hashes_and_stays_strict_elsewhere(tmp_path):
    from sppo_rl.llm.data.tasks import GSM8K_REWARD, load_task
    from sppo_rl.llm.rewards.scorer import RewardScorer

    gsm = write_jsonl(tmp_path / "g.jsonl", [{"question": "24+26?", "answer": "24+26=50\n#### 50"}])
    boxed = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "24+26?", "answer": "50"}])
    assert load_task(LLMConfig(task=str(gsm), model="m"))[2] == GSM8K_REWARD
    assert load_task(LLMConfig(task=str(gsm), model="m", reward_fn="math"))[2] == GSM8K_REWARD
    assert load_task(LLMConfig(task=str(boxed), model="m"))[2] == "math"
    with RewardScorer(GSM8K_REWARD, timeout_s=10) as scorer:
        scores = scorer.score(["so 24+26 = 50\n#### 50", "#### 51", r"\boxed{50}"], ["50"] * 3).scores
    assert scores.tolist() == [1.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------- rewards


def test_a_trl_style_reward_gets_the_batch_and_the_data_columns(rewards):
    with RewardScorer(f"{rewards}:matches_solution", timeout_s=5.0) as scorer:
        res = scorer.score(
            ["a", "b", "c"],
            ["-", "-", "-"],
            columns=[{"prompts": "p", "solution": "a"}, {"prompts": "p", "solution": "x"}, {"prompts": "p"}],
        )
    # item 2 lacks the column the function names: an error naming it, not a silent 0
    assert res.scores.tolist() == [1.0, 0.0, 0.0]
    assert res.valid.tolist() == [True, True, False] and res.errors == 1
    assert "needs column(s) solution" in res.error_samples[0]


def test_several_rewards_are_a_normalised_weighted_sum_each_kept_apart(rewards):
    spec = f"{rewards}:has_x,{rewards}:always"
    with RewardScorer(spec, timeout_s=5.0, weights=[1.0, 3.0]) as scorer:
        assert scorer.names == ["has_x", "always"]
        res = scorer.score(["x", "y"], ["-", "-"])
    # R = (1 * has_x + 3 * always) / 4: "x" -> (1 + 3) / 4, "y" -> (0 + 3) / 4
    assert res.scores.tolist() == [1.0, 0.75]
    assert res.parts.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    with RewardScorer([f"{rewards}:none_for_z", f"{rewards}:always"], timeout_s=5.0) as scorer:
        res = scorer.score(["z", "q"], ["-", "-"])
    # one function failing on an item makes the item invalid and counts against that function only
    assert res.valid.tolist() == [False, True] and res.scores.tolist() == [0.0, 0.75]
    assert res.fn_errors == [1, 0] and res.errors == 1
    assert np.isnan(res.parts[0, 0]) and res.parts[0, 1] == 1.0
    assert res.error_samples[0].startswith("item 0: none_for_z: TypeError")


def test_bad_reward_weights_are_refused_before_any_worker(rewards):
    from sppo_rl.config import ConfigError

    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        RewardScorer(f"{rewards}:always", weights=[1, 2])
    with pytest.raises(ConfigError, match="--reward-weights"):
        LLMConfig(reward_fn="math,integer", reward_weights=(1.0,)).validate()
    with pytest.raises(ConfigError, match="--reward-weights"):
        LLMConfig(reward_fn="math,integer", reward_weights=(0.0, 0.0)).validate()


def test_a_raising_reward_shows_its_first_traceback_once_and_counts_every_call(rewards, capfd):
    with RewardScorer(f"{rewards}:broken", timeout_s=5.0) as scorer:
        first = scorer.score(["a", "b", "c"], ["-"] * 3)
        second = scorer.score(["a", "b"], ["-"] * 2)
    err = capfd.readouterr().err
    assert (first.errors, second.errors) == (3, 2)
    assert err.count("Traceback (most recent call last)") == 1
    assert "ZeroDivisionError: division by zero" in err and "trl_rewards.py" in err


def test_a_trl_style_reward_trains_without_verifier_errors(tmp_path, tiny, rewards):
    """On the old code the trainer called f(response, answer): every call raised, every rollout was
    invalid and the run still finished."""
    run_llm(grpo_pairs_config(tmp_path, tiny, reward_fn=f"{rewards}:even"))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["update"] > 0]
    assert len(rows) == 2
    assert all(r["verifier_errors"] == 0 and r["invalid_rollouts"] == 0 for r in rows)


def test_several_rewards_are_logged_one_by_one(tmp_path, tiny, rewards):
    cfg = grpo_pairs_config(
        tmp_path, tiny, reward_fn=f"{rewards}:even,{rewards}:always", reward_weights=(1.0, 1.0)
    )
    run_llm(cfg)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["update"] > 0]
    for r in rows:
        assert r["rewards/always"] == 1.0 and r["reward_errors/even"] == 0
        assert r["reward_mean"] == pytest.approx((r["rewards/even"] + 1.0) / 2, abs=1e-6)


def test_a_reward_that_always_fails_stops_the_run(tmp_path, tiny, rewards):
    cfg = grpo_pairs_config(tmp_path, tiny, reward_fn=f"{rewards}:broken", updates=6, reward_fail_limit=2)
    with pytest.raises(RunFailed, match="no response got a valid reward in 2 consecutive updates"):
        run_llm(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["updates"] == 2 and "--reward-fail-limit 2" in summary["stopped"]
    assert "ZeroDivisionError" in summary["last_error"] and summary["verifier_errors"] == 8
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["update"] > 0]
    assert [r["update"] for r in rows] == [1, 2] and all(r["invalid_rollouts"] == 8 for r in rows)
    assert summary["flops_total"] == rows[-1]["flops_total"] > 0  # the compute spent so far


def test_cli_exits_1_with_one_line_when_the_reward_always_fails(tmp_path, tiny, rewards):
    out = tmp_path / "cli"
    argv = ["--task", "arithmetic", "--model", str(tiny), "--algo", "grpo", "--group-size", "2"]
    argv += ["--updates", "5", "--prompts-per-step", "2", "--train-size", "16", "--val-size", "2"]
    argv += ["--eval-every", "0", "--max-new-tokens", "4", "--no-progress", "--no-tensorboard"]
    argv += ["--reward-fn", f"{rewards}:broken", "--reward-fail-limit", "2", "--out-dir", str(out)]
    env = outside_a_launcher({**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", "llm", *argv], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sppo-rl: error: no response got a valid reward in 2 consecutive updates")
    assert proc.stderr.count("Traceback (most recent call last)") == 1  # the reward's, shown once
    assert "stopped" in json.loads((out / "summary.json").read_text())


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
    from sppo_rl.llm.data.tasks import load_task
    from sppo_rl.llm.rewards.scorer import RewardScorer

    with RewardScorer("boxed-or-last-number", timeout_s=10.0) as scorer:
        res = scorer.score(["59 + 63 = 122", "122 or 123", "\\boxed{122}", "nope"], ["122"] * 4)
    assert res.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    _, _, auto = load_task(LLMConfig(task="arithmetic", train_size=8, val_size=2))
    assert auto == "integer"  # 'auto' keeps the strict boxed reward on boxed data
