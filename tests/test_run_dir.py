"""The run folder against the file system: disk full, a folder made read-only or deleted mid-run end in
one line naming the cause and exit 74, the earlier checkpoints intact, a vanished folder never
re-created; the writability probe never follows a planted link and runs under the run lock; run files
follow the umask."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO, child_env, grpo_cartpole_cmd

from sppo_rl.runtime.checkpoint import CheckpointManager
from sppo_rl.runtime.logging import read_metrics

# ================================================================== 9, 10, 11. file-system faults

EX_IOERR = 74


def _can_mount() -> bool:
    probe = Path(f"/tmp/.sppo-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True
        )
        if ok.returncode != 0:
            return False
        subprocess.run(["umount", str(probe)], check=True)
        return True
    except OSError:
        return False
    finally:
        probe.rmdir()


MOUNTS = pytest.mark.skipif(
    os.geteuid() != 0 or not _can_mount(),
    reason="needs root and mount(2) (a small tmpfs for a real full disk, a read-only bind mount)",
)


class _Tmpfs:
    """A real tmpfs of ``size_mb`` mounted at ``path`` (unmounted, lazily, on exit)."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path, self.size_mb, self.binds = path, size_mb, []

    def __enter__(self) -> _Tmpfs:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)], check=True
        )
        return self

    def fill(self) -> None:
        """Write a filler file until the file system refuses (ENOSPC): a real full disk."""
        with open(self.path / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as e:
                assert e.errno == 28, e
        assert os.statvfs(self.path).f_bavail == 0

    def read_only(self, folder: Path) -> None:
        """Make ``folder`` read-only from now on: a bind mount of it onto itself, remounted read-only
        (files the run holds open stay writable, as on a remount; every new open fails with EROFS)."""
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        self.binds.append(folder)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)

    def __exit__(self, *exc: object) -> None:
        for folder in reversed(self.binds):
            subprocess.run(["umount", "-l", str(folder)], check=False)
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def _control_cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "sppo_rl", "control", "--algo", "grpo", "--task", "short-cartpole",
        "--total-episodes", "2000000", "--init-from", "none", "--checkpoint-every", "3", "--eval-episodes", "0",
        "--no-progress", "--out-dir", str(out), *extra,
    ]  # fmt: skip


def _fs_llm_cmd(tiny: Path, out: Path, *extra: str) -> list[str]:
    # 3 checkpoints kept (1 is the default): those seen before a fault are not rotated away before it lands
    return [
        sys.executable, "-m", "sppo_rl", "llm", "--model", str(tiny), "--updates", "100000",
        "--prompts-per-step", "2", "--train-size", "64", "--val-size", "4", "--eval-samples", "1",
        "--eval-every", "5", "--checkpoint-every", "2", "--max-new-tokens", "8", "--no-progress",
        "--threads", "1", "--keep-checkpoints", "3", "--out-dir", str(out), *extra,
    ]  # fmt: skip


def _fault_mid_run(cmd: list[str], out: Path, fault) -> tuple[int, str, list[Path]]:
    """Start ``cmd``; once two checkpoints are published call ``fault()``; wait for the exit (the run
    has a budget it cannot finish: only the fault ends it). Returns the exit status, stderr and the
    checkpoints published before the fault."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if len(list((out / "checkpoints").glob("ckpt-*/meta.json"))) >= 2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        before = CheckpointManager(out / "checkpoints").published()
        fault()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err, before


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("sppo-rl: error:")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def _delete(out: Path) -> None:
    """``rm -rf`` of the run folder while the run writes into it (retried while it adds files)."""
    deadline = time.monotonic() + 60
    while out.exists() and time.monotonic() < deadline:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.parametrize(
    "world,tensorboard",
    [
        ("control", True),
        ("control", False),
        ("llm", False),
        pytest.param("llm", True, marks=pytest.mark.slow),
    ],
)
def test_a_run_folder_deleted_mid_run_stops_at_the_next_write_and_is_never_recreated(
    tmp_path, tiny, world, tensorboard
):
    """``rm -rf`` of a running run's folder: one line naming it, exit 74, and nothing re-created (control
    died of a FileNotFoundError traceback, or, without TensorBoard, trained on into the deleted metrics
    file and re-created checkpoints/; the LLM run the same)."""
    out = tmp_path / "run"
    extra = () if tensorboard else ("--no-tensorboard",)
    cmd = _control_cmd(out, *extra) if world == "control" else _fs_llm_cmd(tiny, out, *extra)
    rc, err, _ = _fault_mid_run(cmd, out, lambda: _delete(out))
    line = _one_error_line(err)
    assert rc == EX_IOERR, err[-3000:]
    assert f"the run folder {out} vanished" in line and "without re-creating it" in line
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))


@MOUNTS
@pytest.mark.parametrize("world", ["control", pytest.param("llm", marks=pytest.mark.slow)])
def test_a_full_disk_mid_run_is_one_line_with_the_free_space_and_the_checkpoints_resume(
    tmp_path, tiny, world
):
    """The disk fills up under a running run (a real 64 MB tmpfs, filled to ENOSPC): one line 'disk full'
    with the bytes free, exit 74 (a traceback of OSError ENOSPC or of torch's 'unexpected pos', exit
    1); every checkpoint published before is intact, and once space is freed --resume goes on."""
    with _Tmpfs(tmp_path / "disk", 64) as disk:
        out = disk.path / "run"
        cmd = _control_cmd(out) if world == "control" else _fs_llm_cmd(tiny, out, "--no-tensorboard")
        rc, err, before = _fault_mid_run(cmd, out, disk.fill)
        line = _one_error_line(err)
        assert rc == EX_IOERR, err[-3000:]
        # the free space is read when the error is reported, after the failed write's temporary file is
        # gone: 0 bytes, or the little that file had taken (176 KiB seen under a parallel test run)
        assert re.search(r"disk full.*: [0-9.]+ (bytes|KiB) free on the file system of ", line), line
        assert "--resume" in line
        mgr = CheckpointManager(out / "checkpoints")
        assert all(mgr.verify(c) for c in before if c.exists()) and mgr.latest() is not None
        assert not list((out / "checkpoints").glob(".tmp-ckpt-*")), "the half-written checkpoint is removed"
        if world == "control":
            (disk.path / "filler").unlink()
            target = int(mgr.latest().name[5:]) + 5  # five updates more than the newest checkpoint
            again = [*cmd, "--resume", "--total-episodes", str(64 * target)]
            proc = subprocess.run(again, capture_output=True, text=True, timeout=600, cwd=REPO)
            assert proc.returncode == 0, proc.stderr[-3000:]
            updates = [r["update"] for r in read_metrics(out / "metrics.jsonl")]
            assert updates == list(range(1, target + 1)), "every update once"


def test_torch_writer_error_on_a_full_disk_is_named_disk_full(tmp_path):
    """torch.save to a path on a full disk raises only RuntimeError('[enforce fail at
    inline_container.cc] unexpected pos ...'), which does not say why: it is named disk full (with
    the free bytes) when the disk is full, and a failed write, not a full disk, when it is not."""
    import torch

    from sppo_rl.runtime.storage import StorageError, storage_error

    if os.geteuid() != 0 or not _can_mount():
        pytest.skip("needs root and mount(2) for a real full disk")
    with _Tmpfs(tmp_path / "disk", 1) as disk:
        disk.fill()
        with pytest.raises(RuntimeError, match="unexpected pos") as e:
            torch.save({"w": torch.zeros(20000)}, str(disk.path / "x.pt"))
        fault = storage_error(e.value, disk.path)
        assert isinstance(fault, StorageError) and str(fault).startswith("disk full: 0 bytes free")
    roomy = storage_error(e.value, tmp_path)  # the same error where there is room: not a full disk
    assert (
        isinstance(roomy, StorageError) and "disk full" not in str(roomy) and "unexpected pos" in str(roomy)
    )
    assert storage_error(ValueError("unexpected pos"), tmp_path) is None


@MOUNTS
@pytest.mark.parametrize(
    "world,tensorboard", [("control", True), pytest.param("llm", False, marks=pytest.mark.slow)]
)
def test_a_folder_made_read_only_mid_run_is_one_line_and_the_checkpoints_stay(
    tmp_path, tiny, world, tensorboard
):
    """The run folder turns read-only under the run (a read-only bind mount: chmod does not stop root):
    one line 'read-only file system', exit 74 (a TensorBoard writer traceback, exit 1); the checkpoints
    published before are intact."""
    with _Tmpfs(tmp_path / "disk", 64) as disk:
        out = disk.path / "run"
        extra = () if tensorboard else ("--no-tensorboard",)
        cmd = _control_cmd(out, *extra) if world == "control" else _fs_llm_cmd(tiny, out, *extra)
        rc, err, before = _fault_mid_run(cmd, out, lambda: disk.read_only(out))
        line = _one_error_line(err)
        assert rc == EX_IOERR, err[-3000:]
        assert "read-only file system" in line and "checkpoints written before are intact" in line
        mgr = CheckpointManager(out / "checkpoints")
        assert before and all(mgr.verify(c) for c in before)


# ================================================================== 8. the writability probe


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder holding a link ``.write-probe`` to a file outside it (as root any file could be hit)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / ".write-probe").symlink_to(victim)
    return out, victim


def test_the_write_probe_never_follows_a_planted_link(tmp_path):
    """prepare_run_dir wrote 'ok' through a planted ``.write-probe`` link into the file it points to,
    then removed the link; the probe now takes a fresh name with O_EXCL: the victim and the link stay."""
    from sppo_rl.runtime.run import prepare_run_dir, unlock_run_dir

    out, victim = _planted(tmp_path)
    prepare_run_dir(out, resume=False)
    unlock_run_dir(out)
    assert victim.read_text() == "precious\n"
    assert (out / ".write-probe").is_symlink(), "the planted link is left alone"
    assert sorted(p.name for p in out.iterdir()) == [".run.lock", ".sppo-run.json", ".write-probe"], (
        "no probe left"
    )


def test_the_write_probe_runs_under_the_lock_a_busy_folder_gets_nothing_written(tmp_path):
    """A second run on a folder whose lock another process holds is refused before its probe: the
    probe used to run first and write through the planted link."""

    from sppo_rl.runtime.run import RunError, prepare_run_dir

    out, victim = _planted(tmp_path)
    holder = os.open(out / ".run.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(RunError, match="in use by another run"):
            prepare_run_dir(out, resume=False)
    finally:
        os.close(holder)
    assert victim.read_text() == "precious\n" and (out / ".write-probe").is_symlink()


def test_a_link_planted_as_the_run_lock_is_refused(tmp_path):
    from sppo_rl.runtime.run import RunError, prepare_run_dir

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / ".run.lock").symlink_to(victim)
    with pytest.raises(RunError, match="is a symbolic link"):
        prepare_run_dir(out, resume=False)
    assert victim.read_text() == "precious\n"


@MOUNTS
def test_a_full_disk_at_the_start_is_a_storage_fault_not_a_user_mistake(tmp_path):
    """prepare_run_dir on a full disk: StorageError 'disk full' (exit 74), not RunError (exit 2); the
    folder is left unlocked."""
    from sppo_rl.runtime.run import _HELD, prepare_run_dir
    from sppo_rl.runtime.storage import StorageError

    with _Tmpfs(tmp_path / "disk", 1) as disk:
        disk.fill()
        with pytest.raises(StorageError, match="^disk full.*0 bytes free"):
            prepare_run_dir(disk.path / "run", resume=False)
        assert (disk.path / "run").resolve() not in _HELD


# ----------------------------------------------------------------------------------- file modes


UMASK_SCRIPT = """
import os, sys
os.umask(0o022)
from sppo_rl.cli import main
if __name__ == "__main__":
    main(sys.argv[1:])
"""


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mode & 0o777 for p in root.rglob("*")}


def _run_with_umask(tmp_path: Path, args: list[str]) -> tuple[dict[str, int], str]:
    script = tmp_path / "umask_main.py"
    script.write_text(UMASK_SCRIPT)
    r = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=child_env(), timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return _modes(Path(args[args.index("--out-dir") + 1])), r.stdout + r.stderr


def test_control_run_files_follow_the_umask(tmp_path):
    out = tmp_path / "run"
    modes, _ = _run_with_umask(tmp_path, grpo_cartpole_cmd(out, "--no-progress")[3:])
    for name in (
        "config.json",
        "summary.json",
        "metrics.jsonl",
        "final.pt",
        "checkpoints/ckpt-000000004/state.pt",
    ):
        assert modes[name] == 0o644, (name, oct(modes[name]))  # config.json and summary.json were 0600
    assert modes["checkpoints/ckpt-000000004"] == 0o755  # was mkdtemp's 0700
    assert {oct(m) for m in modes.values()} <= {"0o644", "0o755"}


def test_llm_run_files_follow_the_umask(tmp_path, tiny):
    out = tmp_path / "run"
    args = ["llm", "--task", "arithmetic", "--model", str(tiny), "--updates", "1", "--prompts-per-step", "2",
            "--train-size", "16", "--val-size", "4", "--eval-samples", "1", "--max-new-tokens", "4",
            "--no-progress", "--no-tensorboard", "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out)]  # fmt: skip
    modes, output = _run_with_umask(tmp_path, args)
    assert "Setting accelerator to CPU" not in output  # DeepSpeed's warning, on every --engine torch run
    for name in ("config.json", "summary.json", "metrics.jsonl", "final/actor/model.safetensors",
                 "final/critic/value_head.safetensors", "final/actor/README.md"):  # fmt: skip
        assert modes[name] == 0o644, (name, oct(modes[name]))  # safetensors' files were 0600
    assert modes["checkpoints/ckpt-000000001"] == 0o755
    assert {oct(m) for m in modes.values()} <= {"0o644", "0o755"}


@pytest.mark.parametrize("mask", [0o077, 0o027])
def test_atomic_writes_keep_a_stricter_umask(tmp_path, mask):
    code = (f"import os; os.umask({mask:#o})\n"
            "from pathlib import Path\n"
            "from sppo_rl.runtime.files import atomic_write_text\n"
            "atomic_write_text(Path(os.environ['F']), 'x')\n")  # fmt: skip
    f = tmp_path / "f.json"
    subprocess.run([sys.executable, "-c", code], env={**child_env(), "F": str(f)}, check=True, timeout=60)
    assert f.stat().st_mode & 0o777 == 0o666 & ~mask


def test_the_files_of_a_run_starting_beside_it_are_not_foreign(tmp_path):
    """A run that starts while another is marking the same new folder sees that run's files of a moment:
    its lock, its write probe and the marker's atomic-write temporary (``..sppo-run.json.XXXX``, the
    marker's own name starting with a dot). Taken for foreign, the second run was refused with "holds
    files no sppo-rl run wrote" instead of "in use by another run" (a clean-clone CI run, 2026-12-05)."""
    import tempfile

    from sppo_rl.runtime.run import RUN_LOCK, RUN_MARKER, foreign_entries

    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_LOCK).write_text("")
    (out / ".write-probe-123-abcd1234").write_text("ok")
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{RUN_MARKER}.")  # as atomic_write_bytes names it
    os.close(fd)
    assert Path(tmp).name.startswith("..sppo-run.json.")
    assert foreign_entries(out) == []
    (out / "NOTES.md").write_text("mine\n")
    assert foreign_entries(out) == ["NOTES.md"]
