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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sppo_rl.llm.rewards.scorer import RewardScorer
from sppo_rl.llm.rewards.specs import RewardFnError
from sppo_rl.llm.rewards.verify import verify_integer

REPO = Path(__file__).resolve().parents[1]
FNS = REPO / "tests" / "fixtures" / "math" / "reward_fns.py"
from paths import MATH_DATA  # noqa: E402

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
