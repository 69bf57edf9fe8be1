"""Reliability: processes and files.

- reward workers and the process group: SIGTERM / SIGINT sent to the whole group (as ``timeout``, Slurm
  and systemd send it) used to kill the reward workers too, and the trainer crashed writing to their
  dead pipes; a worker that died while idle crashed the next batch the same way;
- file-system faults (disk full, a folder made read-only, the run folder deleted) end in one line naming
  the cause and exit 74, the earlier checkpoints intact, a vanished folder never re-created;
- the writability probe never follows a planted link and runs under the run lock;
- a checkpoint holding a pickle (checksums matching) falls back like a damaged one;
- two sweeps on one folder: the second is refused in one line.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sppo_rl.llm.rewards.scorer import RewardScorer
from sppo_rl.runtime.checkpoint import CheckpointManager, read_meta
from sppo_rl.runtime.logging import read_metrics

REPO = Path(__file__).resolve().parents[1]


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


def _llm_cmd(tiny: Path, out: Path, steps: int = 60) -> list[str]:
    return [
        sys.executable, "-m", "sppo_rl", "llm", "--model", str(tiny), "--steps", str(steps),
        "--prompts-per-step", "4", "--train-size", "64", "--val-size", "4", "--eval-samples", "1",
        "--eval-every", "5", "--checkpoint-every", "5", "--max-new-tokens", "8", "--no-progress", "--threads", "1", "--out-dir", str(out),
    ]  # fmt: skip


def _signal_group_during_training(cmd: list[str], out: Path, sig: int, rng: random.Random):
    """Start ``cmd`` in a new session, wait until a random number of rows (1-20) is in metrics.jsonl,
    sleep up to 0.2 s more, signal the whole process group, wait for the exit."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO
    )
    rows = rng.randint(1, 20)
    try:
        deadline = time.monotonic() + 600
        metrics = out / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and len(read_metrics(metrics)) >= rows:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.2))
        assert proc.poll() is None, "the run ended before it could be signalled"
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("sig,trials", [(signal.SIGTERM, 20), (signal.SIGINT, 10)])
def test_signal_to_the_process_group_always_saves_and_exits_128_plus_signal(tmp_path, tiny, sig, trials):
    """``kill -TERM -- -PGID`` (or -INT) at a random moment of an LLM run with two reward workers, again
    and again: every trial exits 128 + signal with a checkpoint saved that covers every logged update
    (3 of 5 trials used to exit 1 with BrokenPipeError, nothing saved). The last trial's run resumes
    and logs every step once."""
    rng = random.Random(27 + sig)
    failures = []
    for trial in range(trials):
        out = tmp_path / f"run{trial}"
        rc, err = _signal_group_during_training(_llm_cmd(tiny, out), out, sig, rng)
        ckpt = CheckpointManager(out / "checkpoints").latest()
        size = (out / "metrics.jsonl").stat().st_size
        ok = rc == 128 + sig and "Traceback" not in err and ckpt is not None
        # the checkpoint is intact and covers every row logged, nothing after it
        ok = (
            ok
            and CheckpointManager(out / "checkpoints").verify(ckpt)
            and read_meta(ckpt)["metrics_bytes"] == size
        )
        if not ok:
            failures.append(f"trial {trial}: rc {rc}, checkpoint {ckpt}: {err[-1500:]}")
    assert not failures, "\n".join(failures)
    proc = subprocess.run(
        [*_llm_cmd(tiny, out), "--resume"], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(61)), "every step once"


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
    return [
        sys.executable, "-m", "sppo_rl", "llm", "--model", str(tiny), "--steps", "100000",
        "--prompts-per-step", "2", "--train-size", "64", "--val-size", "4", "--eval-samples", "1",
        "--eval-every", "5", "--checkpoint-every", "2", "--max-new-tokens", "8", "--no-progress",
        "--threads", "1", "--out-dir", str(out), *extra,
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
        assert "disk full" in line and "0 bytes free on the file system of" in line and "--resume" in line
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
    import fcntl

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


# ================================================================== 12. an unsafe checkpoint


class _Planted:
    """Pickled as a call of ``Path.touch(marker)``: if it is ever unpickled, the marker file appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _plant_pickle(ckpt: Path, marker: Path) -> None:
    """Replace ``ckpt/state.pt`` by a torch file that also holds a pickled call, and rewrite meta.json's
    checksums to match: the checkpoint is 'intact', only its content is unsafe."""
    import json

    import torch

    from sppo_rl.runtime.checkpoint import checksum_tree, torch_load

    state = torch_load(ckpt / "state.pt")
    state = (
        {**state, "planted": _Planted(marker)} if isinstance(state, dict) else {"planted": _Planted(marker)}
    )
    torch.save(state, ckpt / "state.pt")
    meta = read_meta(ckpt)
    meta["files"] = checksum_tree(ckpt)
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_an_unsafe_checkpoint_with_matching_checksums_falls_back_to_the_intact_one(tmp_path, capsys):
    """resume() raised UnsafeCheckpointError (exit 1, a traceback) for the newest checkpoint; now it is
    skipped with a warning naming it, like a damaged one, and the previous one loads. No code ran."""
    import torch

    from sppo_rl.runtime.checkpoint import torch_load, torch_save

    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    for step in (1, 2):
        mgr.save(step, lambda d, s=step: torch_save({"w": torch.full((4,), float(s))}, d / "state.pt"), {})
    marker = tmp_path / "code-ran"
    _plant_pickle(tmp_path / "ck" / "ckpt-000000002", marker)
    assert mgr.verify(tmp_path / "ck" / "ckpt-000000002"), "the checksums match"
    loaded = []
    ckpt = mgr.resume(lambda c: loaded.append(torch_load(c / "state.pt")["w"]))
    assert (
        ckpt.name == "ckpt-000000001" and torch.equal(loaded[0], torch.full((4,), 1.0)) and len(loaded) == 1
    )
    err = capsys.readouterr().err
    assert "skipping damaged checkpoint ckpt-000000002" in err and "refusing to load" in err
    assert err.count("\n") == 2, err  # the skip and the 'resuming from' line
    assert not marker.exists(), "nothing of the pickle ran"


@pytest.mark.slow  # two control runs; the unit test above is the default suite's
def test_control_resume_past_an_unsafe_checkpoint_redoes_the_update(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "sppo_rl", "control", "--algo", "grpo", "--task", "short-cartpole",
        "--total-episodes", "256", "--init-from", "none", "--checkpoint-every", "1", "--eval-episodes", "0",
        "--no-progress", "--no-tensorboard", "--out-dir", str(out),
    ]  # fmt: skip
    assert subprocess.run(cmd, capture_output=True, timeout=600, cwd=REPO).returncode == 0
    (out / "summary.json").unlink()  # as if killed after its last checkpoint
    newest = CheckpointManager(out / "checkpoints").latest()
    _plant_pickle(newest, tmp_path / "code-ran")
    proc = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"skipping damaged checkpoint {newest.name}" in proc.stderr and "Traceback" not in proc.stderr
    assert [r["update"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert not (tmp_path / "code-ran").exists()


# ================================================================== 13. two sweeps on one folder


def test_a_sweep_on_a_folder_another_sweep_holds_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """The folder's ``.sweep.lock`` held (by this test, as a running sweep holds it): the sweep is refused
    in one line, exit 2, and the folder is left as it was (a second sweep used to run on, rewrite
    sweep.json and mark the other's runs busy)."""
    import fcntl

    out = tmp_path / "sweep"
    out.mkdir()
    holder = os.open(out / ".sweep.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        proc = subprocess.run(
            [sys.executable, "-m", "sppo_rl", "sweep", "--algos", "ppo", "--tasks", "short-cartpole", "--seeds",
             "0", "--total-episodes", "64", "--out-dir", str(out), "--no-progress"],
            capture_output=True, text=True, timeout=600, cwd=REPO,
        )  # fmt: skip
    finally:
        os.close(holder)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "in use by another sweep" in proc.stderr, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [".sweep.lock"], "nothing written"


@pytest.mark.slow  # two sweeps of two control runs each
def test_two_sweeps_on_one_folder_one_is_refused_in_one_line_and_sweep_json_stays_true(tmp_path):
    """Two ``sppo-rl sweep`` started together on one folder: one runs every job and exits 0, the other
    is refused in one line (exit 2) without writing; sweep.json lists every run finished (both used to
    exit 2, each marking runs the other finished 'busy')."""
    import json

    out = tmp_path / "sweep"
    args = [
        sys.executable, "-m", "sppo_rl", "sweep", "--algos", "ppo", "grpo", "--tasks", "short-cartpole",
        "--seeds", "0", "--workers", "1", "--total-episodes", "1280", "--out-dir", str(out), "--no-progress",
        "--overrides", "tensorboard=false", "eval-episodes=0", "init-from=none", "checkpoint-every=5",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 2], [(rc, e[-2000:]) for rc, _, e in results]
    (_, refused_out, refused_err), (_, _, ok_err) = sorted(results, key=lambda r: -r[0])
    assert refused_err.count("\n") == 1 and "in use by another sweep" in refused_err, refused_err
    assert refused_out == "", "the refused sweep printed no table: it ran nothing"
    manifest = json.loads((out / "sweep.json").read_text())
    assert [r["status"] for r in manifest["results"]] == ["done", "done"], manifest["results"]


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
