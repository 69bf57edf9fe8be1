"""The one run loop: summaries from the whole metrics log, a finished run's resume, time budgets."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
from configs import control_config

from sppo_rl.config import from_flat
from sppo_rl.control.config import ControlConfig
from sppo_rl.control.trainer import run_control
from sppo_rl.runtime.logging import read_metrics

_cfg = partial(control_config, algo="grpo", total_episodes=64 * 12, checkpoint_every=4)


def test_kill_before_the_summary_then_resume_summarises_the_whole_run(tmp_path):
    """The run ends, but the process dies before summary.json: resuming writes the summary of every
    row of metrics.jsonl (valid JSON), not of the rows after the resume (there are none)."""
    cfg = _cfg(tmp_path)
    first = run_control(cfg)
    out = Path(cfg.out_dir)
    (out / "summary.json").unlink()
    (out / "final.pt").unlink()
    again = run_control(replace(cfg, resume=True))
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 12, "no update ran twice"
    # the protocol's final over all 12 updates: the last max(1, ceil(1.2)) = 2 (not the last 10)
    expected = float(np.mean([r["success_rate"] for r in rows[-2:]]))
    text = (out / "summary.json").read_text()
    assert "NaN" not in text
    assert json.loads(text)["tail_success_rate"] == again["tail_success_rate"] == expected
    assert first["tail_success_rate"] == expected
    assert (out / "final.pt").exists()


def test_resume_of_a_finished_run_changes_nothing_and_says_so(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    run_control(cfg)
    out = Path(cfg.out_dir)
    before = {p.name: p.read_bytes() for p in (out / "metrics.jsonl", out / "summary.json", out / "final.pt")}
    summary = run_control(replace(cfg, resume=True))
    assert "is finished (12 updates); nothing to resume" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in (out / "metrics.jsonl", out / "summary.json", out / "final.pt")}
    assert before == after
    assert summary == json.loads(before["summary.json"])


def test_time_budget_stops_the_control_run_early(tmp_path):
    summary = run_control(_cfg(tmp_path, max_seconds=1e-9))
    assert summary["updates"] == 1, "the first update to end past the budget is the last"
    assert len(read_metrics(Path(tmp_path / "run" / "metrics.jsonl"))) == 1


def _control_cmd(out: Path) -> list[str]:
    import sys

    return [sys.executable, "-m", "sppo_rl", "control", "--task", "short-cartpole", "--algo", "grpo"] + [
        "--total-episodes", "256", "--init-from", "none", "--no-progress", "--no-tensorboard",
        "--eval-episodes", "0", "--out-dir", str(out),
    ]  # fmt: skip


def test_a_second_run_on_a_busy_folder_is_refused_and_writes_nothing(tmp_path):
    import fcntl
    import os
    import subprocess

    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / ".run.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another run holds the folder
    try:
        proc = subprocess.run(_control_cmd(out), capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "is in use by another run" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [".run.lock"], "nothing written"


def test_two_runs_started_together_in_one_new_folder_never_mix(tmp_path):
    import subprocess

    out = tmp_path / "run"
    procs = [subprocess.Popen(_control_cmd(out), stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    refused = next(err for rc, err in results if rc == 2)
    assert "in use by another run" in refused or "already holds a run" in refused
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3, 4], "one run's rows, once each"


def test_resume_takes_the_saved_config_and_refuses_another_run(tmp_path, capsys):
    """`--out-dir R --resume` alone continues R as it was (here short-cartpole, seed 5), a larger budget
    is allowed, and a changed algorithm, task or seed is refused in one line that names the fields."""
    import pytest

    from sppo_rl.cli import main
    from sppo_rl.runtime.run import RunError

    out = tmp_path / "run"
    common = ["--init-from", "none", "--no-progress", "--no-tensorboard", "--eval-episodes", "0"]
    main(["control", "--task", "short-cartpole", "--algo", "grpo", "--seed", "5", "--total-episodes", "128",
          "--out-dir", str(out), *common])  # fmt: skip
    (out / "summary.json").unlink()  # as if stopped before its end
    capsys.readouterr()  # the first run's own end-of-run lines
    before = (out / "metrics.jsonl").read_bytes(), (out / "config.json").read_bytes()
    for flags, named in [
        (["--algo", "ppo"], "algo 'grpo' -> 'ppo'"),
        (["--seed", "0", "--task", "pendulum"], "task"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["control", "--out-dir", str(out), "--resume", *flags])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, err
    assert ((out / "metrics.jsonl").read_bytes(), (out / "config.json").read_bytes()) == before, (
        "nothing touched"
    )
    main(["control", "--out-dir", str(out), "--resume", "--total-episodes", "256"])
    saved = json.loads((out / "config.json").read_text())
    assert (saved["task"], saved["seed"], saved["algo"], saved["total_episodes"]) == (
        "short-cartpole",
        5,
        "grpo",
        256,
    )
    assert [r["update"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    with pytest.raises(RunError, match="seed 5 -> 1"):  # the Python API is held to the same rule
        saved.pop("resolved")
        run_control(from_flat(ControlConfig, {**saved, "seed": 1, "resume": True, "progress": False}))


def test_the_command_says_so_by_argument_not_by_a_module_global(capsys):
    """``announce(command=True)`` (the ``sppo-rl`` command) times the whole process even after a run loop
    in this process; without it, the run loop. Nothing in :mod:`sppo_rl.runtime.loop` is set at run time
    to choose."""
    import sppo_rl.runtime.loop as loop

    assert not hasattr(loop, "COMMAND") and not hasattr(loop, "_LOOP_STARTED")
    loop.announce(Path("x"), "h", False, command=True, loop_seconds=2.0)  # after a run loop of 2 s
    assert "wall time of the command" in capsys.readouterr().err
    loop.announce(Path("x"), "h", False, loop_seconds=2.0)
    assert "wall time of the run loop: 2.0 s" in capsys.readouterr().err
