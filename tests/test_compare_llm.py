"""scripts/compare_llm.py end to end on a tiny model: the group variants sit beside GRPO in its
table, and ``--reuse`` keeps finished runs with the same settings and reruns changed ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "compare_llm.py"


def _compare(out: Path, tiny: Path, cache: Path, steps: int, *names: str) -> subprocess.CompletedProcess:
    llm_args = (
        f"--model {tiny} --train-size 32 --val-size 8 --eval-samples 2 --max-new-tokens 6 --threads 1 "
        "--no-tensorboard"
    )
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--prompts-per-step",
        "4",
        "--eval-every",
        "1",
        "--reuse",
        "--llm-args",
        llm_args,
        "--only",
        *names,
    ]
    env = dict(os.environ, SPPO_RL_CACHE=str(cache), MPLBACKEND="Agg")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


@pytest.mark.slow
def test_variants_are_compared_beside_grpo_and_finished_runs_are_reused(tmp_path, tiny):
    out = tmp_path / "cmp"
    proc = _compare(out, tiny, tmp_path / "cache", 1, "grpo", "bppo", "lampo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "compare.json").read_text())
    for name in ("grpo", "bppo", "lampo"):
        assert report[name]["group_size"] == 8
        assert report[name]["generated_tokens"] > 0
    table = (out / "compare.md").read_text()
    assert "| bppo | 8 |" in table and "| lampo | 8 |" in table
    assert (out / "compare.png").stat().st_size > 0

    # --reuse keeps a finished run whose settings match, and reruns one whose settings changed
    metrics = out / "grpo" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    proc = _compare(out, tiny, tmp_path / "cache", 1, "grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "grpo: reusing" in proc.stderr
    assert metrics.stat().st_mtime_ns == before
    assert set(json.loads((out / "compare.json").read_text())) == {"grpo"}
    proc = _compare(out, tiny, tmp_path / "cache", 2, "grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reusing" not in proc.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2]
