"""Checkpoints that cannot be trusted: every file of a checkpoint carries its SHA-256 in ``meta.json``; a
damaged newest checkpoint (truncated, zeroed, garbage, a file missing, ``meta.json`` broken or missing)
or one holding a pickle of other objects (checksums matching) is skipped with a warning naming it and the
previous intact one is loaded, its later updates redone; with none intact, or a ``metrics.jsonl``
shorter than the checkpoint recorded, ``--resume`` is refused in one line and nothing is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from configs import checkpointed_llm_config
from paths import CONTROL_TIMING, LLM_TIMING, REPO, assert_rows_close, run_cli, strip_timing

from sppo_rl.llm.models.engines import free_port
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime.checkpoint import (
    CheckpointError,
    CheckpointManager,
    link_identical,
    read_meta,
    torch_load,
    torch_save,
    unshare,
)
from sppo_rl.runtime.logging import RunLogger, read_metrics
from sppo_rl.runtime.run import RunError

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


def test_an_export_links_the_files_its_checkpoint_holds_alike_and_writing_it_again_leaves_them(tmp_path):
    """link_identical: a file of the same bytes as the checkpoint's becomes a hard link to it (stored
    once), one that differs keeps its copy; unshare: before the export is written again its linked files
    are unlinked, so a write in place (``open(..., "wb")``) leaves the checkpoint intact."""
    weights, other = os.urandom(4096), os.urandom(100)

    def write(d: Path) -> None:
        (d / "actor").mkdir()
        (d / "actor" / "model.safetensors").write_bytes(weights)
        (d / "actor" / "config.json").write_bytes(other)

    mgr = CheckpointManager(tmp_path / "ck", keep=1)
    ckpt = mgr.save(1, write, {})
    export = tmp_path / "final" / "actor"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_bytes(weights)
    (export / "config.json").write_bytes(b"{}")  # differs: stays a copy
    assert link_identical(export, ckpt, "actor") == [export / "model.safetensors"]
    assert (export / "model.safetensors").samefile(ckpt / "actor" / "model.safetensors")
    assert not (export / "config.json").samefile(ckpt / "actor" / "config.json")
    assert link_identical(export, ckpt, "actor") == []  # linked already
    unshare(export.parent)
    with open(export / "model.safetensors", "wb") as f:  # the next export, written in place
        f.write(b"new weights")
    assert mgr.verify(ckpt) and (ckpt / "actor" / "model.safetensors").read_bytes() == weights


def test_metrics_shorter_than_recorded_is_refused_naming_both_sizes(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.log({"update": step, "x": 0.5}, step=step)
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


@pytest.mark.parametrize("how", ["truncated", pytest.param("missing-state", marks=pytest.mark.slow)])
def test_control_resume_skips_a_damaged_checkpoint_and_equals_an_uninterrupted_run(tmp_path, how):
    full, part = tmp_path / "full", tmp_path / "part"
    assert run_cli(_control(full)).returncode == 0
    assert run_cli(_control(part)).returncode == 0
    (part / "summary.json").unlink()  # as if killed after its last checkpoint
    newest = CheckpointManager(part / "checkpoints").latest()
    _damage(newest, how)
    proc = run_cli(_control(part, "--resume"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"skipping damaged checkpoint {newest.name}" in proc.stderr
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["update"] for r in b] == [1, 2, 3, 4], "the update after the intact checkpoint is redone, once"
    assert strip_timing(a, CONTROL_TIMING) == strip_timing(b, CONTROL_TIMING)


def test_resume_with_no_intact_checkpoint_refuses_and_keeps_the_metrics(tmp_path):
    """meta.json missing everywhere: the run used to start over and delete metrics.jsonl."""
    out = tmp_path / "run"
    assert run_cli(_control(out)).returncode == 0
    (out / "summary.json").unlink()
    for ckpt in CheckpointManager(out / "checkpoints").published():
        (ckpt / "meta.json").unlink()
    before = (out / "metrics.jsonl").read_bytes()
    proc = run_cli(_control(out, "--resume"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "no intact checkpoint" in error[0] and "meta.json is missing" in error[0]
    assert "Traceback" not in proc.stderr
    assert (out / "metrics.jsonl").read_bytes() == before


def test_resume_with_torn_metrics_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    assert run_cli(_control(out)).returncode == 0
    (out / "summary.json").unlink()
    recorded = read_meta(CheckpointManager(out / "checkpoints").latest())["metrics_bytes"]
    torn = (out / "metrics.jsonl").read_bytes()[: recorded - 30]
    (out / "metrics.jsonl").write_bytes(torn)
    proc = run_cli(_control(out, "--resume"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and f"holds {len(torn)} bytes" in proc.stderr
    assert f"recorded {recorded} bytes" in proc.stderr
    assert (out / "metrics.jsonl").read_bytes() == torn


def test_llm_resume_skips_a_damaged_engine_file(tmp_path, tiny, capsys):
    """LLM checkpoints hold actor/ and critic/ engine folders and state.pt: a damaged actor/engine.pt is
    caught by its checksum, and the resumed run redoes the lost step as an uninterrupted one did."""
    full, part = tmp_path / "full", tmp_path / "part"
    run_llm(checkpointed_llm_config(tiny, full))
    run_llm(checkpointed_llm_config(tiny, part))
    (part / "summary.json").unlink()
    newest = CheckpointManager(part / "checkpoints").latest()
    assert {"actor/engine.pt", "critic/engine.pt", "state.pt"} <= set(read_meta(newest)["files"])
    engine = newest / "actor" / "engine.pt"
    engine.write_bytes(engine.read_bytes()[:1000])
    capsys.readouterr()
    run_llm(replace(checkpointed_llm_config(tiny, part), resume=True))
    assert f"skipping damaged checkpoint {newest.name}" in capsys.readouterr().err
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["update"] for r in b] == [0, 1, 2, 3]
    assert_rows_close(strip_timing(a, LLM_TIMING), strip_timing(b, LLM_TIMING))


@pytest.mark.slow
def test_two_process_deepspeed_resume_skips_a_checkpoint_with_a_damaged_rank_shard(tmp_path, tiny):
    """ZeRO-2 on two CPU processes: every rank's shard is in the checksums; a truncated rank-1 optimizer
    shard makes rank 0 pick the previous checkpoint, which every rank loads; the redone step matches."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    args = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        "-m", "sppo_rl", "llm", "--algo", "sppo", "--updates", "3", "--model", str(tiny), "--prompts-per-step",
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
    assert [r["update"] for r in after] == [0, 1, 2, 3]
    assert_rows_close(strip_timing(before, LLM_TIMING), strip_timing(after, LLM_TIMING))


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
