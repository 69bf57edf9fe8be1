"""Run plumbing: atomic checkpoints (killed mid-save), metrics across a resume, run folders, guards."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sppo_rl.runtime.checkpoint import CheckpointManager, read_meta, torch_load, torch_save
from sppo_rl.runtime.logging import RunLogger, read_metrics
from sppo_rl.runtime.run import NonFiniteError, RunError, check_finite, prepare_run_dir


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
    log.log({"update": 1, "x": 1.0}, step=1)
    log.log({"update": 2, "x": float("nan")}, step=2)
    pos = log.position()
    log.log({"update": 3, "x": 3.0}, step=3)  # written after the checkpoint at step 2: redone on resume
    log.close()
    before = (tmp_path / "metrics.jsonl").read_bytes()
    log = RunLogger(tmp_path, tensorboard=False, resume_position=pos, resume_step=2)
    log.log({"update": 3, "x": 3.5}, step=3)
    log.close()
    after = (tmp_path / "metrics.jsonl").read_bytes()
    assert after[:pos] == before[:pos]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3]
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

    from sppo_rl.runtime.run import save_config

    @dataclass
    class C:
        a: int = 1
        b: tuple[int, ...] = (2, 3)

    save_config(tmp_path, C())
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": 1, "b": [2, 3]}


# ------------------------------------------------------- a run folder is the project's by its marker


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``: a file's bytes, None for a folder."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")
    }


def _project(folder: Path) -> Path:
    """A user's project folder: code, a git repository, notes, another tool's checkpoint."""
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "train.py").write_text("print('mine')\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "NOTES.md").write_text("notes\n")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "epoch1.ckpt").write_bytes(b"weights")
    return folder


CONTROL_ARGV = [
    "control",
    "--task",
    "short-cartpole",
    "--algo",
    "grpo",
    "--total-episodes",
    "64",
    "--no-progress",
]
CONTROL_ARGV += ["--no-tensorboard", "--eval-episodes", "0"]


@pytest.mark.parametrize("flag", [None, "--overwrite", "--resume"])
def test_a_folder_of_user_files_is_refused_whatever_the_flags(tmp_path, capsys, flag):
    """Before: "already holds a run ... --overwrite to start over", and --overwrite deleted every entry.
    Now one line, exit 2, naming what is not a run's, and not a byte changed (no lock file either)."""
    from sppo_rl.cli import main

    out = _project(tmp_path / "proj")
    before = _tree(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*CONTROL_ARGV, "--out-dir", str(out), *([flag] if flag else [])])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1, lines
    for word in ("no sppo-rl run wrote", ".git", "NOTES.md", "checkpoints/epoch1.ckpt", "src"):
        assert word in lines[0], (word, lines[0])
    assert _tree(out) == before


def test_a_folder_of_user_files_alone_is_not_taken(tmp_path):
    """Before: accepted silently (the run wrote among the user's files, and a later --overwrite deleted them)."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "NOTES.md").write_text("notes\n")
    with pytest.raises(RunError, match=r"no sppo-rl run wrote \(NOTES.md\)"):
        prepare_run_dir(out, resume=False)
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.md"]


def test_overwrite_removes_only_what_the_run_wrote(tmp_path):
    """In a marked run folder the user may keep their own files; --overwrite removes the run's entries
    only (in ``checkpoints/`` the run's checkpoints, not another tool's file)."""
    from sppo_rl.runtime.run import unlock_run_dir

    out = prepare_run_dir(tmp_path / "run", resume=False)
    unlock_run_dir(out)
    _save(CheckpointManager(out / "checkpoints"), 1, 1.0)
    for name in ("metrics.jsonl", "config.json", "summary.json", "final.pt"):
        (out / name).write_text("run\n")
    (out / "final" / "actor").mkdir(parents=True)
    (out / "NOTES.md").write_text("mine\n")
    (out / "checkpoints" / "epoch1.ckpt").write_bytes(b"weights")
    with pytest.raises(RunError, match="already holds a run"):
        prepare_run_dir(out, resume=False)
    prepare_run_dir(out, resume=False, overwrite=True)
    unlock_run_dir(out)
    assert sorted(_tree(out)) == [
        ".run.lock",
        ".sppo-run.json",  # RUN_MARKER
        "NOTES.md",
        "checkpoints",
        "checkpoints/epoch1.ckpt",
    ]
    assert (out / "NOTES.md").read_text() == "mine\n"


def test_a_run_folder_from_before_the_marker_resumes_and_is_marked(tmp_path):
    """A folder holding run files alone (no marker: written before it existed) is still a run folder:
    resumed or overwritten as before, and marked when taken."""
    from sppo_rl.runtime.run import unlock_run_dir

    out = tmp_path / "old"
    _save(CheckpointManager(out / "checkpoints"), 2, 2.0)
    (out / "metrics.jsonl").write_text('{"step": 2}\n')
    (out / "log.txt").write_text("sweep log\n")
    (out / "report").mkdir()  # sppo-rl report RUN, as every run's last line suggests
    prepare_run_dir(out, resume=True)
    unlock_run_dir(out)
    assert (out / ".sppo-run.json").is_file() and (out / "metrics.jsonl").exists()  # RUN_MARKER


# ------------------------------------------------------ a checkpoint replaced: killed between renames

REPLACE_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, torch
    from sppo_rl.runtime.checkpoint import CheckpointManager, torch_save
    mgr = CheckpointManager(sys.argv[1], keep=1)
    mgr.save(5, lambda d: torch_save({"w": torch.full((3,), 1.0)}, d / "state.pt"), {"copy": "first"})
    rename = os.rename
    def rename_then_die(src, dst):
        rename(src, dst)
        if os.path.basename(str(src)) == "ckpt-000000005":  # the old copy moved aside: SIGKILL now
            os.kill(os.getpid(), signal.SIGKILL)
    os.rename = rename_then_die
    mgr.save(5, lambda d: torch_save({"w": torch.full((3,), 2.0)}, d / "state.pt"), {"copy": "second"})
    """
)


def test_a_replacement_killed_between_its_renames_leaves_a_checkpoint_resume_finds(tmp_path):
    """Step 5 saved again with keep 1 (a resume after a preempted deferred evaluation), the process
    SIGKILLed right after the old copy was renamed aside. Before: both complete copies sat in ``.tmp-*``
    folders, ``--resume`` said "no checkpoint" and the next save deleted both. Now the run folder is
    resumable, resume recovers a complete copy (the new one), and the next save keeps it."""
    from sppo_rl.runtime.run import unlock_run_dir

    out = tmp_path / "run"
    script = tmp_path / "replace.py"
    script.write_text(REPLACE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out / "checkpoints")], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not list((out / "checkpoints").glob("ckpt-*")), "the kill came between the renames"
    (out / "metrics.jsonl").write_text('{"step": 5}\n')
    prepare_run_dir(out, resume=True)  # before: "--resume: no checkpoint"
    unlock_run_dir(out)
    mgr = CheckpointManager(out / "checkpoints", keep=1)
    ckpt = mgr.resume()
    assert ckpt.name == "ckpt-000000005" and mgr.verify(ckpt)
    assert mgr.resumed_meta["copy"] == "second"
    assert torch.equal(torch_load(ckpt / "state.pt")["w"], torch.full((3,), 2.0))
    _save(mgr, 6, 6.0)
    assert [p.name for p in mgr.published()] == ["ckpt-000000006"]
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_a_replacement_killed_after_staging_recovers_the_old_copy_left_by_earlier_versions(tmp_path):
    """The layout an earlier version left (the old copy at ``.tmp-ckpt-old-<step>``, the new one under a
    random temporary name) is recovered too: the old copy, complete, comes back at its name."""
    ck = tmp_path / "checkpoints"
    mgr = CheckpointManager(ck, keep=1)
    _save(mgr, 3, 3.0)
    os.rename(ck / "ckpt-000000003", ck / ".tmp-ckpt-old-000000003")
    (ck / ".tmp-ckpt-abc123").mkdir()
    assert mgr.resume().name == "ckpt-000000003" and mgr.resumed_meta["value"] == 3.0


# ------------------------------------------------------------------------------- schedules, callbacks


def test_lr_factor_hand_numbers():
    from sppo_rl.runtime.schedule import lr_factor

    assert [lr_factor("linear", k, 4) for k in range(4)] == [1.0, 0.75, 0.5, 0.25]  # CleanRL's 1 - k/K
    cos = [lr_factor("cosine", k, 6, warmup_updates=2) for k in range(6)]
    assert cos == pytest.approx(
        [0.5, 1.0, 1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 - math.cos(math.pi / 4)) / 2]
    )
    assert [lr_factor("constant", k, 5, warmup_updates=3) for k in range(5)] == pytest.approx(
        [1 / 3, 2 / 3, 1, 1, 1]
    )
    assert [lr_factor("linear", k, 5, warmup_updates=1) for k in range(5)] == [1.0, 1.0, 0.75, 0.5, 0.25]
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_factor("step", 0, 4)
