"""Reliability: damaged checkpoints, oversized input, preemption grace.

- damaged checkpoints: every file of a checkpoint carries its SHA-256 in ``meta.json``; a damaged newest
  checkpoint (truncated, zeroed, garbage, a file missing, ``meta.json`` broken or missing) is skipped with
  a warning naming it and the previous intact one is loaded; with none intact, or a ``metrics.jsonl``
  shorter than the checkpoint recorded, ``--resume`` is refused in one line and nothing is touched;
- oversized input: a 30 MB data line and a 100,000-character prompt are skipped and counted, never
  read whole or tokenized;
- preemption grace: after SIGTERM, reward scoring that hangs is cut off after ``Preemption.grace_s``; the
  update is given up (redone on resume) or the evaluation deferred (done first on resume), a checkpoint
  is saved and the process exits with 143.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from paths import CONTROL_TIMING, LLM_TIMING

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data.files import fit_prompts, load_examples
from sppo_rl.llm.models.engines import free_port
from sppo_rl.llm.rewards.scorer import RewardScorer
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime.checkpoint import CheckpointError, CheckpointManager, read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import RunLogger, read_metrics
from sppo_rl.runtime.run import Preemption, RunError

REPO = Path(__file__).resolve().parents[1]
FIXTURE_REWARDS = REPO / "tests" / "fixtures" / "math" / "reward_fns.py"


def _strip(rows, timing):
    return [{k: v for k, v in r.items() if k not in timing} for r in rows]


def _close(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys(), (ra.get("step"), set(ra) ^ set(rb))
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, rel=1e-4, abs=1e-5), (ra.get("step"), k)
            else:
                assert rb[k] == v, (ra.get("step"), k)


# ================================================================== 4. damaged checkpoints (unit)


def _save(mgr: CheckpointManager, step: int) -> Path:
    return mgr.save(step, lambda d: torch_save({"w": torch.full((64,), float(step))}, d / "state.pt"), {})


def _damage(ckpt: Path, how: str) -> str:
    """Damage ``ckpt`` one way; the file the warning must name."""
    state, meta = ckpt / "state.pt", ckpt / "meta.json"
    if how == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif how == "zeroed":
        state.write_bytes(b"\0" * state.stat().st_size)
    elif how == "garbage":
        state.write_bytes(os.urandom(state.stat().st_size))
    elif how == "flipped-byte":  # same size, one byte changed in the tensor data
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    elif how == "missing-state":
        state.unlink()
    elif how == "broken-meta":
        meta.write_text(meta.read_text()[:20])
        return "meta.json"
    elif how == "missing-meta":
        meta.unlink()
        return "meta.json"
    else:
        raise AssertionError(how)
    return "state.pt"


DAMAGE = ["truncated", "zeroed", "garbage", "flipped-byte", "missing-state", "broken-meta", "missing-meta"]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_one_loads(
    tmp_path, capsys, how
):
    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    for step in (1, 2, 3):
        _save(mgr, step)
    assert set(read_meta(tmp_path / "ck" / "ckpt-000000003")["files"]) == {"state.pt"}
    named = _damage(tmp_path / "ck" / "ckpt-000000003", how)
    loaded = []
    ckpt = CheckpointManager(tmp_path / "ck").resume(lambda c: loaded.append(torch_load(c / "state.pt")["w"]))
    assert ckpt.name == "ckpt-000000002"
    assert len(loaded) == 1 and torch.equal(loaded[0], torch.full((64,), 2.0)), (
        "only the intact one is loaded"
    )
    err = capsys.readouterr().err
    assert "ckpt-000000003" in err and named in err and "warning" in err
    assert (tmp_path / "ck" / "ckpt-000000003").exists(), "nothing is deleted"


def test_checkpoints_without_checksums_still_load_and_a_broken_one_falls_back(tmp_path, capsys):
    """Checkpoints written before checksums existed are tried unverified: an intact one loads; one whose
    torch.load fails is skipped like a damaged one."""
    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    for step in (1, 2):
        ckpt = _save(mgr, step)
        meta = read_meta(ckpt)
        del meta["files"]
        (ckpt / "meta.json").write_text(json.dumps(meta))
    assert mgr.verify(ckpt) is False, "unverified, not damaged"
    load = lambda c: torch_load(c / "state.pt")  # noqa: E731
    assert mgr.resume(load).name == "ckpt-000000002"
    (ckpt / "state.pt").write_bytes(b"\0" * 100)
    assert mgr.resume(load).name == "ckpt-000000001"
    assert "ckpt-000000002" in capsys.readouterr().err


def test_no_intact_checkpoint_is_one_error_naming_each(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    for step in (1, 2):
        _save(mgr, step)
    _damage(tmp_path / "ck" / "ckpt-000000001", "garbage")
    _damage(tmp_path / "ck" / "ckpt-000000002", "broken-meta")
    with pytest.raises(CheckpointError) as e:
        mgr.resume(lambda c: None)
    msg = str(e.value)
    assert "\n" not in msg and "no intact checkpoint" in msg
    assert "ckpt-000000001/state.pt" in msg and "ckpt-000000002/meta.json" in msg


def test_metrics_shorter_than_recorded_is_refused_naming_both_sizes(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.log({"step": step, "x": 0.5}, step=step)
    pos = log.position()
    log.close()
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(path.read_bytes()[: pos - 7])  # half a row lost
    before = path.read_bytes()
    with pytest.raises(RunError, match=f"holds {pos - 7} bytes but the checkpoint recorded {pos} bytes"):
        RunLogger(tmp_path, tensorboard=False, resume_position=pos, resume_step=3)
    assert path.read_bytes() == before, "nothing glued on"


# ================================================================== 4. damaged checkpoints (runs)


def _control(out: Path, *extra: str) -> list[str]:
    return [
        "control", "--algo", "grpo", "--task", "short-cartpole", "--total-episodes", "256", "--init-from",
        "none", "--checkpoint-every", "1", "--keep-checkpoints", "3", "--eval-episodes", "0", "--no-progress",
        "--no-tensorboard", "--out-dir", str(out), *extra,
    ]  # fmt: skip


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sppo_rl", *args], capture_output=True, text=True, timeout=600, cwd=REPO
    )


@pytest.mark.parametrize("how", ["truncated", pytest.param("missing-state", marks=pytest.mark.slow)])
def test_control_resume_skips_a_damaged_checkpoint_and_equals_an_uninterrupted_run(tmp_path, how):
    full, part = tmp_path / "full", tmp_path / "part"
    assert _cli(_control(full)).returncode == 0
    assert _cli(_control(part)).returncode == 0
    (part / "summary.json").unlink()  # as if killed after its last checkpoint
    newest = CheckpointManager(part / "checkpoints").latest()
    _damage(newest, how)
    proc = _cli(_control(part, "--resume"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"skipping damaged checkpoint {newest.name}" in proc.stderr
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["update"] for r in b] == [1, 2, 3, 4], "the update after the intact checkpoint is redone, once"
    assert _strip(a, CONTROL_TIMING) == _strip(b, CONTROL_TIMING)


def test_resume_with_no_intact_checkpoint_refuses_and_keeps_the_metrics(tmp_path):
    """meta.json missing everywhere: the run used to start over and delete metrics.jsonl."""
    out = tmp_path / "run"
    assert _cli(_control(out)).returncode == 0
    (out / "summary.json").unlink()
    for ckpt in CheckpointManager(out / "checkpoints").published():
        (ckpt / "meta.json").unlink()
    before = (out / "metrics.jsonl").read_bytes()
    proc = _cli(_control(out, "--resume"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "no intact checkpoint" in error[0] and "meta.json is missing" in error[0]
    assert "Traceback" not in proc.stderr
    assert (out / "metrics.jsonl").read_bytes() == before


def test_resume_with_torn_metrics_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    assert _cli(_control(out)).returncode == 0
    (out / "summary.json").unlink()
    recorded = read_meta(CheckpointManager(out / "checkpoints").latest())["metrics_bytes"]
    torn = (out / "metrics.jsonl").read_bytes()[: recorded - 30]
    (out / "metrics.jsonl").write_bytes(torn)
    proc = _cli(_control(out, "--resume"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and f"holds {len(torn)} bytes" in proc.stderr
    assert f"recorded {recorded} bytes" in proc.stderr
    assert (out / "metrics.jsonl").read_bytes() == torn


def _llm(tiny: Path, out: Path, **kw) -> LLMConfig:
    base = dict(
        algo="sppo",
        model=str(tiny),
        steps=3,
        prompts_per_step=2,
        train_size=32,
        val_size=4,
        eval_samples=2,
        eval_every=1000,
        max_new_tokens=6,
        checkpoint_every=1,
        keep_checkpoints=3,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
        threads=1,
    )
    base.update(kw)
    return LLMConfig(**base)


def test_llm_resume_skips_a_damaged_engine_file(tmp_path, tiny, capsys):
    """LLM checkpoints hold actor/ and critic/ engine folders and state.pt: a damaged actor/engine.pt is
    caught by its checksum, and the resumed run redoes the lost step as an uninterrupted one did."""
    full, part = tmp_path / "full", tmp_path / "part"
    run_llm(_llm(tiny, full))
    run_llm(_llm(tiny, part))
    (part / "summary.json").unlink()
    newest = CheckpointManager(part / "checkpoints").latest()
    assert {"actor/engine.pt", "critic/engine.pt", "state.pt"} <= set(read_meta(newest)["files"])
    engine = newest / "actor" / "engine.pt"
    engine.write_bytes(engine.read_bytes()[:1000])
    capsys.readouterr()
    run_llm(replace(_llm(tiny, part), resume=True))
    assert f"skipping damaged checkpoint {newest.name}" in capsys.readouterr().err
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    _close(_strip(a, LLM_TIMING), _strip(b, LLM_TIMING))


# ================================================================== 6. oversized input


def _write_data(path: Path, huge_chars: int = 30 * 2**20) -> None:
    """Six ordinary problems, one 30 MB question, one 1.5 MB one and one of 100,000 characters."""
    with path.open("w") as f:
        for i in range(3):
            f.write(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")
        f.write(json.dumps({"prompt": "1" * huge_chars + "+1=", "answer": "2"}) + "\n")
        f.write(json.dumps({"prompt": "2" * 1_500_000 + "+1=", "answer": "3"}) + "\n")
        f.write(json.dumps({"prompt": "3" * 100_000 + "+1=", "answer": "4"}) + "\n")
        for i in range(3, 6):
            f.write(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")


def test_oversized_records_are_skipped_and_counted_without_being_read_whole(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    _write_data(path)
    tracemalloc.start()
    try:
        examples = load_examples(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, f"the 30 MB line was held in memory ({peak / 2**20:.0f} MiB)"
    assert [e.answer for e in examples] == ["0", "2", "4", "4", "6", "8", "10"]
    assert [e.index for e in examples] == list(range(7))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipped 2 oversized record(s)" in err and str(path) in err
    assert "data.jsonl:4" in err and "data.jsonl:5" in err


def test_prompts_longer_than_the_limit_are_dropped_without_tokenizing_the_huge_ones(tiny, capsys):
    from sppo_rl.llm.data.files import Example
    from sppo_rl.llm.models.tiny import load_tokenizer

    tok = load_tokenizer(tiny)
    seen: list[int] = []

    class Spy:
        chat_template = None

        def __call__(self, texts, **kw):
            seen.extend(len(t) for t in texts)
            return tok(texts, **kw)

    examples = [
        Example("1+1=", "2"),
        Example("9" * 100_000, "1"),
        Example("8" * 90, "1"),
        Example("2+2=", "4"),
    ]
    kept = fit_prompts(examples, Spy(), 64, where="d.jsonl", why="test")
    assert [e.answer for e in kept] == ["2", "4"]
    assert max(seen) <= 8 * 64, "a prompt over 8 characters per allowed token is never tokenized"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d.jsonl: skipped 2 of 4 prompt(s) longer than 64 tokens" in err


MEASURE = """
import resource, runpy, sys
sys.argv = ["sppo_rl", *sys.argv[1:]]
try:
    runpy.run_module("sppo_rl", run_name="__main__")
finally:
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def test_llm_run_on_data_with_a_30mb_question_skips_it_and_stays_small(tmp_path, tiny):
    data = tmp_path / "data.jsonl"
    _write_data(data)
    out = tmp_path / "run"
    args = [
        "llm", "--task", str(data), "--val-data", str(data), "--val-size", "4", "--model", str(tiny),
        "--reward-fn", f"{FIXTURE_REWARDS}:exact", "--steps", "4", "--prompts-per-step", "2", "--algo", "grpo",
        "--group-size", "2", "--max-new-tokens", "4", "--eval-every", "1000", "--no-progress",
        "--no-tensorboard", "--out-dir", str(out),
    ]  # fmt: skip

    def cap_memory() -> None:  # the unfixed code tried to tokenize (and run) a 30 M-token prompt
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30))

    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        preexec_fn=cap_memory,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_mb = int(proc.stderr.split("PEAK_RSS_KB")[1].split()[0]) / 1024
    assert peak_mb < 1500, f"peak RSS {peak_mb:.0f} MiB"
    assert took < 240
    # the loader skips the 30 MB and 1.5 MB records (in both files), the trainer the 100,000-character
    # prompt: the model's context is 512 tokens, minus 4 for the response
    assert proc.stderr.count("skipped 2 oversized record(s)") == 2
    assert f"{data}: skipped 1 of 7 prompt(s) longer than 508 tokens" in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["train_examples"] == 6
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_no_prompt_that_fits_is_refused_in_one_line(tmp_path, tiny):
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": "7" * 600, "answer": "1"}) + "\n" for _ in range(3)))
    proc = _cli(
        ["llm", "--task", str(data), "--model", str(tiny), "--no-progress", "--out-dir", str(tmp_path / "r")]
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "none of its 3 prompts fits in 496 tokens" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


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


HANG_REWARD = """
import os, time
from pathlib import Path

HERE = Path(__file__).parent


def reward(response, truth):
    if (HERE / "HANG").exists() and truth in (HERE / "HANG").read_text().split():
        (HERE / "ENTERED").touch()
        time.sleep(3600)
    return float(len(response) % 2)
"""


def _hang_task(tmp_path: Path) -> tuple[Path, Path, str]:
    """A training file (answers 0..9), a validation file (answers 777) and a reward function that hangs
    on the answers listed in ``HANG`` once that file exists."""
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+0=", "answer": str(i)}) + "\n" for i in range(10)))
    val.write_text("".join(json.dumps({"prompt": f"{i}+7=", "answer": "777"}) + "\n" for i in range(3)))
    fn = tmp_path / "hang_reward.py"
    fn.write_text(HANG_REWARD)
    return train, val, f"{fn}:reward"


def _hang_cfg(tiny: Path, tmp_path: Path, out: Path, **kw) -> LLMConfig:
    train, val, fn = _hang_task(tmp_path)
    base = dict(task=str(train), val_data=str(val), reward_fn=fn, reward_timeout=600.0, steps=4)
    base.update(kw)
    return _llm(tiny, out, **base)


def _sigterm_when_entered(tmp_path: Path, start_when, hang_on: str) -> threading.Thread:
    """A thread: once ``start_when()`` holds, make the reward hang on the answers ``hang_on``, then
    SIGTERM this process as soon as the reward function is inside the hang."""

    def go() -> None:
        deadline = time.monotonic() + 300
        while not start_when() and time.monotonic() < deadline:
            time.sleep(0.02)
        (tmp_path / "HANG").write_text(hang_on)
        while not (tmp_path / "ENTERED").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("phase", ["update", "validation"])
def test_sigterm_during_hanging_scoring_saves_and_exits_and_the_resume_matches(
    tmp_path, tiny, monkeypatch, phase
):
    """A reward function hangs (600 s timeout) and SIGTERM comes: scoring is cut off after the grace
    period, the update in flight is given up (or the due evaluation deferred), a checkpoint is saved and
    the process exits with 143; the resumed run then logs exactly what an uninterrupted run logs."""
    monkeypatch.setattr(Preemption, "grace_s", 1.0)
    eval_every = 2 if phase == "validation" else 1000
    full = tmp_path / "full"
    run_llm(_hang_cfg(tiny, tmp_path, full, eval_every=eval_every))
    out = tmp_path / "part"
    metrics = out / "metrics.jsonl"
    # hang in step 2's scoring ("update": training answers) or in its validation ("validation": 777)
    hang_on = "777" if phase == "validation" else " ".join(str(i) for i in range(10))
    _sigterm_when_entered(tmp_path, lambda: metrics.exists() and len(read_metrics(metrics)) >= 2, hang_on)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        run_llm(_hang_cfg(tiny, tmp_path, out, eval_every=eval_every))
    took = time.monotonic() - t0
    assert e.value.code == 128 + signal.SIGTERM
    assert took < 120
    ckpt = CheckpointManager(out / "checkpoints").latest()
    meta = read_meta(ckpt)
    rows = read_metrics(metrics)
    step = meta["step"]  # 1 unless the machine was slow to start the hang
    if phase == "update":
        assert 1 <= step < 4 and "deferred_row" not in meta, (
            "the step in flight was given up, not trained on zeros"
        )
        assert [r["step"] for r in rows] == list(range(step + 1))
    else:
        assert step in (2, 4) and meta["deferred_row"]["row"]["step"] == step
        assert "val_accuracy" not in meta["deferred_row"]["row"]
        assert [r["step"] for r in rows] == list(range(step)), "the step's row waits for its evaluation"
    (tmp_path / "HANG").unlink()
    run_llm(replace(_hang_cfg(tiny, tmp_path, out, eval_every=eval_every), resume=True))
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(metrics)
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    _close(_strip(a, LLM_TIMING), _strip(b, LLM_TIMING))
    assert all(r.get("verifier_errors", 0) == 0 for r in b), "no cut-off score was kept"


@pytest.mark.slow
def test_sigterm_to_a_run_stuck_in_a_600s_reward_exits_143_within_a_minute_and_resumes(tmp_path, tiny):
    """The reported case, as a real process with the default grace period: SIGTERM while the reward
    function sleeps (timeout 600 s) ends the run with 143 well within a minute, with a checkpoint that
    resumes to the end."""
    out = tmp_path / "run"
    train, val, fn = _hang_task(tmp_path)
    args = [
        sys.executable, "-m", "sppo_rl", "llm", "--task", str(train), "--val-data", str(val), "--model",
        str(tiny), "--reward-fn", fn, "--reward-timeout", "600", "--steps", "4", "--prompts-per-step", "2",
        "--max-new-tokens", "6", "--eval-every", "1000", "--checkpoint-every", "1", "--no-progress",
        "--no-tensorboard", "--out-dir", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and len(read_metrics(metrics)) >= 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        (tmp_path / "HANG").write_text(" ".join(str(i) for i in range(10)))
        while not (tmp_path / "ENTERED").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert took < 60, f"took {took:.0f} s after SIGTERM"
    assert "resume with:" in err
    (tmp_path / "HANG").unlink()
    done = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_two_process_deepspeed_resume_skips_a_checkpoint_with_a_damaged_rank_shard(tmp_path, tiny):
    """ZeRO-2 on two CPU processes: every rank's shard is in the checksums; a truncated rank-1 optimizer
    shard makes rank 0 pick the previous checkpoint, which every rank loads; the redone step matches."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    args = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        "-m", "sppo_rl", "llm", "--algo", "sppo", "--steps", "3", "--model", str(tiny), "--prompts-per-step",
        "4", "--train-size", "32", "--val-size", "4", "--max-new-tokens", "6", "--eval-every", "1000",
        "--checkpoint-every", "1", "--keep-checkpoints", "3", "--no-progress", "--no-tensorboard", "--threads",
        "1", "--engine", "deepspeed", "--zero-stage", "2", "--out-dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
    first = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert first.returncode == 0, first.stderr[-3000:]
    before = read_metrics(out / "metrics.jsonl")
    (out / "summary.json").unlink()
    newest = CheckpointManager(out / "checkpoints").latest()
    shard = newest / "critic" / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    assert "critic/ds/zero_pp_rank_1_mp_rank_00_optim_states.pt" in read_meta(newest)["files"]
    shard.write_bytes(shard.read_bytes()[:500])
    again = subprocess.run(
        [*args[:6], "29632", *args[7:], "--resume"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"skipping damaged checkpoint {newest.name}" in again.stderr and "zero_pp_rank_1" in again.stderr
    after = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in after] == [0, 1, 2, 3]
    _close(_strip(before, LLM_TIMING), _strip(after, LLM_TIMING))
