"""Preemption of real processes: SIGTERM / Ctrl-C save a checkpoint, say how to resume, and the resumed
run continues exactly (control) or within tolerance (LLM); the metrics file keeps every row once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import CONTROL_TIMING, LLM_TIMING

from sppo_rl.runtime.logging import read_metrics


def _control_args(out: Path, episodes: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sppo_rl",
        "control",
        "--algo",
        "sppo",
        "--task",
        "short-cartpole",
        "--total-episodes",
        str(episodes),
        "--init-from",
        "none",
        "--checkpoint-every",
        "1000",
        "--eval-episodes",
        "0",
        "--no-progress",
        "--no-tensorboard",
        "--out-dir",
        str(out),
    ]


def _interrupt_after(cmd: list[str], metrics: Path, rows: int, sig: int) -> subprocess.CompletedProcess:
    """Start ``cmd``, wait until ``metrics`` holds ``rows`` rows, send ``sig``, wait for the exit."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and len(read_metrics(metrics)) >= rows:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _strip(rows, timing):
    return [{k: v for k, v in r.items() if k not in timing} for r in rows]


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_control_preempted_then_resumed_equals_uninterrupted(tmp_path, sig):
    full = tmp_path / "full"
    subprocess.run(_control_args(full, 1280), check=True, capture_output=True, timeout=600)
    part = tmp_path / "part"
    proc = _interrupt_after(_control_args(part, 1280), part / "metrics.jsonl", 3, sig)
    assert proc.returncode == 128 + sig, proc.stderr[-2000:]
    assert "resume with: sppo-rl control" in proc.stderr and "--resume" in proc.stderr
    assert list((part / "checkpoints").glob("ckpt-*"))
    stopped = len(read_metrics(part / "metrics.jsonl"))
    assert 3 <= stopped < 20
    subprocess.run([*_control_args(part, 1280), "--resume"], check=True, capture_output=True, timeout=600)
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["update"] for r in b] == list(range(1, 21)), "every update once, in order"
    assert _strip(a, CONTROL_TIMING) == _strip(b, CONTROL_TIMING)


def _llm_args(tiny: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sppo_rl",
        "llm",
        "--algo",
        "sppo",
        "--model",
        str(tiny),
        "--steps",
        "40",
        "--prompts-per-step",
        "4",
        "--train-size",
        "64",
        "--val-size",
        "8",
        "--max-new-tokens",
        "8",
        "--eval-every",
        "10",
        "--checkpoint-every",
        "1000",
        "--no-progress",
        "--no-tensorboard",
        "--threads",
        "1",
        "--out-dir",
        str(out),
    ]


def test_llm_preempted_then_resumed_matches_within_tolerance(tmp_path, tiny):
    full = tmp_path / "full"
    subprocess.run(_llm_args(tiny, full), check=True, capture_output=True, timeout=600)
    part = tmp_path / "part"
    proc = _interrupt_after(_llm_args(tiny, part), part / "metrics.jsonl", 4, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert "resume with: sppo-rl llm" in proc.stderr
    subprocess.run([*_llm_args(tiny, part), "--resume"], check=True, capture_output=True, timeout=600)
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(0, 41)), "every step once, in order"
    for ra, rb in zip(_strip(a, LLM_TIMING), _strip(b, LLM_TIMING)):
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, rel=1e-4, abs=1e-5), (ra["step"], k)
            else:
                assert rb[k] == v, (ra["step"], k)
