"""Run plumbing: atomic checkpoints (killed mid-save), metrics across a resume, run folders, guards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sppo_rl.runtime import (
    CheckpointManager,
    NonFiniteError,
    RunError,
    RunLogger,
    check_finite,
    prepare_run_dir,
    read_meta,
    read_metrics,
)
from sppo_rl.runtime.checkpoint import torch_load, torch_save


def _save(mgr: CheckpointManager, step: int, value: float) -> Path:
    return mgr.save(
        step, lambda d: torch_save({"w": torch.full((3,), value)}, d / "state.pt"), {"value": value}
    )


def test_checkpoints_rotate_and_reload(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=2)
    for step in (1, 2, 3):
        _save(mgr, step, float(step))
    names = [p.name for p in mgr.published()]
    assert names == ["ckpt-000000002", "ckpt-000000003"]
    latest = mgr.latest()
    assert read_meta(latest)["step"] == 3 and read_meta(latest)["value"] == 3.0
    assert torch.equal(torch_load(latest / "state.pt")["w"], torch.full((3,), 3.0))
    # re-saving the same step replaces it
    _save(mgr, 3, 9.0)
    assert read_meta(mgr.latest())["value"] == 9.0
    assert not list((tmp_path / "ck").glob(".tmp-*"))


def test_failed_write_leaves_previous_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck")
    _save(mgr, 1, 1.0)

    def boom(d: Path) -> None:
        (d / "half.bin").write_bytes(b"x" * 10)
        raise OSError("disk full")

    with pytest.raises(OSError):
        mgr.save(2, boom)
    assert mgr.latest().name == "ckpt-000000001"
    assert not list((tmp_path / "ck").glob(".tmp-*"))


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    from pathlib import Path
    from sppo_rl.runtime.checkpoint import CheckpointManager, torch_save
    mgr = CheckpointManager(sys.argv[1], keep=3)
    mgr.save(1, lambda d: torch_save({"w": torch.ones(4)}, d / "state.pt"), {"ok": True})
    def slow(d):
        with open(d / "state.pt", "wb") as f:
            f.write(b"partial")
            f.flush()
            print("WRITING", flush=True)
            time.sleep(60)
    mgr.save(2, slow)
    """
)


def test_sigkill_mid_save_keeps_previous_checkpoint_loadable(tmp_path):
    """A real process killed with SIGKILL while writing checkpoint 2 leaves checkpoint 1 intact."""
    script = tmp_path / "saver.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "ck")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "WRITING"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    mgr = CheckpointManager(tmp_path / "ck")
    assert mgr.latest().name == "ckpt-000000001"
    assert torch.equal(torch_load(mgr.latest() / "state.pt")["w"], torch.ones(4))
    assert list((tmp_path / "ck").glob(".tmp-ckpt-*")), "the torn save should be a temporary folder"
    _save(mgr, 2, 2.0)  # the next save cleans the torn one up
    assert mgr.latest().name == "ckpt-000000002"
    assert not list((tmp_path / "ck").glob(".tmp-ckpt-*"))


def test_logger_resume_keeps_earlier_rows_and_drops_redone_ones(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False)
    log.log({"step": 1, "x": 1.0}, step=1)
    log.log({"step": 2, "x": float("nan")}, step=2)
    pos = log.position()
    log.log({"step": 3, "x": 3.0}, step=3)  # written after the checkpoint at step 2: redone on resume
    log.close()
    before = (tmp_path / "metrics.jsonl").read_bytes()
    log = RunLogger(tmp_path, tensorboard=False, resume_position=pos, resume_step=2)
    log.log({"step": 3, "x": 3.5}, step=3)
    log.close()
    after = (tmp_path / "metrics.jsonl").read_bytes()
    assert after[:pos] == before[:pos]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["x"] is None and rows[2]["x"] == 3.5


def _tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``log_dir``: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_logger_writes_tensorboard(tmp_path):
    with RunLogger(tmp_path, tensorboard=True) as log:
        log.log({"success_rate": 0.5, "policy_loss": -0.1, "tag": "a", "nan": float("nan")}, step=7)
        log.log({"success_rate": 0.75, "policy_loss": -0.2, "done": True}, step=8)
    scalars = _tb_scalars(tmp_path / "tb")
    # numbers only (no strings, booleans or non-finite values), under CleanRL-style tags
    assert set(scalars) == {"charts/success_rate", "losses/policy_loss"}
    assert scalars["charts/success_rate"] == [(7, 0.5), (8, 0.75)]
    assert [s for s, _ in scalars["losses/policy_loss"]] == [7, 8]
    assert [v for _, v in scalars["losses/policy_loss"]] == pytest.approx([-0.1, -0.2])  # float32


def test_prepare_run_dir_refuses_to_clobber(tmp_path):
    out = prepare_run_dir(tmp_path / "run", resume=False)
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunError, match="already holds a run"):
        prepare_run_dir(out, resume=False)
    with pytest.raises(RunError, match="no checkpoint"):
        prepare_run_dir(out, resume=True)
    prepare_run_dir(out, resume=False, overwrite=True)
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_prepare_run_dir_unwritable_as_user(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(RunError, match="not writable"):
        prepare_run_dir(ro / "run", resume=False)


def test_prepare_run_dir_unwritable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RunError, match="not writable"):
        prepare_run_dir(blocker / "run", resume=False)


def test_check_finite_names_step_and_quantity():
    check_finite(3, loss=torch.tensor(1.0), grad=2.0)
    with pytest.raises(NonFiniteError, match=r"step 7: critic_loss is not finite"):
        check_finite(7, policy_loss=torch.tensor(0.0), critic_loss=torch.tensor(float("nan")))
    with pytest.raises(NonFiniteError, match="grad_norm"):
        check_finite(1, grad_norm=float("inf"))


def test_config_json_is_written(tmp_path):
    from dataclasses import dataclass

    from sppo_rl.runtime import save_config

    @dataclass
    class C:
        a: int = 1
        b: tuple[int, ...] = (2, 3)

    save_config(tmp_path, C())
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": 1, "b": [2, 3]}
