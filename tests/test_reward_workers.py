"""The reward worker processes and signals: workers ignore SIGTERM / SIGINT sent to the whole process
group (the trainer owns their lifetime), one that died while idle is replaced before the next batch, and
scoring stops soon after a stop is requested, the scorer still usable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from paths import REPO

from sppo_rl.llm.rewards.scorer import RewardScorer

FIXTURE_REWARDS = REPO / "tests" / "fixtures" / "math" / "reward_fns.py"


# ================================================================== 9. preemption grace


def test_scoring_stops_soon_after_stop_is_requested_and_the_scorer_recovers(tmp_path):
    stop_at = time.monotonic() + 1.0
    with RewardScorer(f"{FIXTURE_REWARDS}:slow", timeout_s=600, workers=2) as scorer:
        t0 = time.monotonic()
        res = scorer.score(
            ["0", "600", "600", "0"], ["", "", "", ""], stop=lambda: time.monotonic() > stop_at
        )
        took = time.monotonic() - t0
        assert took < 5, f"scoring took {took:.1f} s after a stop at 1 s"
        assert res.interrupted >= 2 and res.timeouts >= res.interrupted and res.errors >= res.interrupted
        assert res.scores.tolist()[1:3] == [0.0, 0.0]
        again = scorer.score(["0", "0"], ["", ""])  # workers killed by the stop are restarted
        assert again.scores.tolist() == [1.0, 1.0] and again.errors == 0


def _wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until ``pid`` has exited (a zombie counts: it runs no more)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not exit")


RESPONSES = ["\\boxed{4}", "\\boxed{5}", "so \\boxed{7}", "\\boxed{12}"]


TRUTHS = ["4", "4", "7", "12"]


# ================================================================== 1, 2. reward workers


def test_a_worker_killed_while_idle_is_replaced_and_the_next_batch_scores_right():
    """Both workers SIGKILLed between two calls: the second call used to die of BrokenPipeError writing
    to the first dead pipe; now each dead worker is restarted before it is given items, and nothing of
    the batch is lost or counted as an error."""
    with RewardScorer("integer", workers=2, timeout_s=120) as scorer:  # no item timeout on a busy machine
        first = scorer.score(RESPONSES, TRUTHS)
        assert first.scores.tolist() == [1.0, 0.0, 1.0, 1.0] and first.errors == 0
        old = scorer.pids
        for pid in old:
            os.kill(pid, signal.SIGKILL)
        for pid in old:
            _wait_gone(pid)
        # the exit is seen by the scorer's process handle a moment after /proc shows it (a worker it has
        # not yet seen die gets its items, and they score invalid: the dead-while-scoring path)
        deadline = time.monotonic() + 30
        while any(w.alive() for w in scorer._workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        again = scorer.score(RESPONSES, TRUTHS)
        assert again.scores.tolist() == [1.0, 0.0, 1.0, 1.0], (again.error_samples, again.errors)
        assert again.valid.all() and again.errors == 0, again.error_samples
        assert scorer.restarts == 2 and len(scorer.pids) == 2 and not set(scorer.pids) & set(old)


def test_workers_ignore_sigterm_and_sigint_the_trainer_owns_their_lifetime():
    """A worker answers after SIGTERM and SIGINT were sent to it: it ignored them (it used to die of
    SIGTERM, the process group's usual stop signal)."""
    with RewardScorer("integer", workers=2, timeout_s=120) as scorer:  # no item timeout on a busy machine
        old = scorer.pids
        for pid in old:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        res = scorer.score(RESPONSES, TRUTHS)  # answered after the signals arrived
        assert res.scores.tolist() == [1.0, 0.0, 1.0, 1.0] and res.errors == 0
        assert scorer.pids == old and scorer.restarts == 0


STORM = r"""
import os, signal, sys, threading, time
from sppo_rl.llm.rewards.scorer import RewardScorer

if __name__ == "__main__":
    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    done = threading.Event()

    def storm():
        while not done.is_set():
            os.killpg(0, signal.SIGTERM)
            time.sleep(0.005)

    threading.Thread(target=storm, daemon=True).start()
    with RewardScorer("integer", workers=2, timeout_s=120) as scorer:  # no item timeout on a busy machine
        for _ in range(3):  # every restart is a new start under the storm
            for pid in scorer.pids:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            res = scorer.score(["\\boxed{4}", "\\boxed{5}"], ["4", "4"])
            print("scores", res.scores.tolist(), "errors", res.errors, flush=True)
        print("restarts", scorer.restarts, flush=True)
    done.set()
    print("signals", len(got) > 0, flush=True)
"""


def test_sigterm_to_the_group_while_workers_start_never_kills_them(tmp_path):
    """A process group under a storm of SIGTERMs (every 5 ms) while its reward workers start and are
    restarted three times: no start fails (a worker used to die of the signal while its interpreter
    was still booting, before it could ignore it: 'the reward worker exited while loading')."""
    script = tmp_path / "storm.py"
    script.write_text(STORM)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines.count("scores [1.0, 0.0] errors 0") == 3, proc.stdout
    assert "restarts 6" in lines and "signals True" in lines
