"""What every training run shares: its folder, its config file, preemption, numerical guards."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from sppo_rl.runtime.files import atomic_write_text

if TYPE_CHECKING:
    from sppo_rl.config import RunConfig


class RunError(RuntimeError):
    """A run cannot start or continue; the message says why and what to do."""


class RunFailed(RuntimeError):
    """A started run that had to stop on a failure it cannot train through (``sppo-rl`` exits with status 1,
    the message on one line; ``summary.json`` records why); ``row``: the metrics row of the update that
    stopped it (empty: none)."""

    def __init__(self, message: str, row: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.row: dict[str, Any] = row or {}


class NonFiniteError(RunError):
    """A loss or gradient became NaN/Inf. Nothing from the bad step was written."""


RUN_LOCK = ".run.lock"
_HELD: dict[Path, int] = {}  # run folders this process holds, and the lock's descriptor


def try_lock(path: Path) -> int | None:
    """Open ``path`` (created 0644, never through a symbolic link, not inherited by children) and take an
    exclusive non-blocking ``flock``: its descriptor, or None when another process holds it. The
    ``OSError`` of the open is the caller's to word."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock_run_dir(out: Path) -> None:
    """Take an exclusive ``flock`` on ``out/.run.lock`` for as long as this process lives (or until
    :func:`unlock_run_dir`): a second process on the same folder is refused in one line. Taking it
    again in the same process is a no-op. (A sweep's own ``.lock`` is another file.)"""
    key = out.resolve()
    if key in _HELD:
        return
    try:  # a link planted as the lock is refused, never followed
        fd = try_lock(out / RUN_LOCK)
    except OSError as e:
        if os.path.islink(out / RUN_LOCK):
            raise RunError(f"{out / RUN_LOCK} is a symbolic link; refusing to use {out}") from None
        raise _not_writable(out, e) from None
    if fd is None:
        raise RunError(
            f"{out} is in use by another run (it holds {out / RUN_LOCK}); wait for it to end or choose "
            "another --out-dir"
        ) from None
    _HELD[key] = fd


def _not_writable(out: Path, e: OSError) -> Exception:
    """A full disk is the storage's fault (:class:`~sppo_rl.runtime.storage.StorageError`, exit 74);
    no permission, a read-only folder or a file in the way is the choice of folder (:class:`RunError`)."""
    from sppo_rl.runtime.storage import FULL, storage_error

    fault = storage_error(e, out) if e.errno in FULL else None
    return fault or RunError(f"output folder {out} is not writable: {e.strerror or e}")


def check_run_dir(out: str | Path) -> None:
    """Raise :class:`~sppo_rl.runtime.storage.StorageError` if the run folder ``out`` is gone: deleted,
    moved or replaced since this process locked it (its ``.run.lock`` is no longer the file the lock
    is held on, or has no name left), or, unlocked, no longer a folder. Called before every write of
    the run loop, so a deleted run is never re-created half (a ``metrics.jsonl`` written into the
    void, a lone ``checkpoints/``)."""
    from sppo_rl.runtime.storage import vanished_error

    out = Path(out)
    fd = _HELD.get(out.resolve())
    if fd is None:
        if not out.is_dir():
            raise vanished_error(out)
        return
    try:
        held = os.fstat(fd)
        named = os.stat(out / RUN_LOCK, follow_symlinks=False)
    except OSError:
        raise vanished_error(out) from None
    if held.st_nlink == 0 or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
        raise vanished_error(out, "was replaced")


def probe_writable(out: Path) -> None:
    """Create, write and remove a file of a fresh name in ``out``: ``O_CREAT | O_EXCL`` never follows a
    link nor opens an existing file, so nothing outside the folder can be written through it."""
    import secrets

    probe = out / f".write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"ok")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


def unlock_run_dir(out: Path) -> None:
    fd = _HELD.pop(Path(out).resolve(), None)
    if fd is not None:
        os.close(fd)


KEEP_ON_OVERWRITE = frozenset({RUN_LOCK, ".lock", "log.txt"})
"""What ``--overwrite`` leaves in a run folder: this run's lock, and a sweep's lock and log (the sweep
holds ``.lock`` and is appending this very run's output to ``log.txt``)."""

RUN_MARKER = ".sppo-run.json"
"""The file that makes a folder a run folder of this project: written when a run takes the folder
(:func:`prepare_run_dir`), before any other file of the run."""

RUN_ENTRIES = frozenset(
    {
        RUN_MARKER, RUN_LOCK, ".lock", "log.txt", "metrics.jsonl", "checkpoints", "config.json", "summary.json",
        "final", "final.pt", "calibration.json", "critic_trace.npz", "wandb_id.txt", "tb", "wandb",
        "completions.jsonl", "report",
    }
)  # fmt: skip
"""The names a run writes at the top of its folder (with the sweep's ``.lock`` and ``log.txt``, and
``report/``, where ``sppo-rl report RUN`` writes by default)."""

_RUN_FILE = re.compile(
    r"(train|val)-[0-9a-f]{12}\.jsonl"  # train_llm's examples, named by their content
    r"|\.write-probe.*"  # probe_writable's file of a moment (an earlier version's: .write-probe)
    r"|\.(metrics\.jsonl|config\.json|summary\.json|calibration\.json|final\.pt|critic_trace\.npz"
    r"|completions\.jsonl|(train|val)-[0-9a-f]{12}\.jsonl|\.?sppo-run\.json)\..*"  # an atomic write's temporary
    # (the marker's is "..sppo-run.json.XXXX": a run starting beside another must not take it for foreign)
)
_RUN_CHILDREN = {
    "checkpoints": re.compile(r"ckpt-\d{9}|\.tmp-ckpt-.*"),
    "final": re.compile(r"actor|critic|actor-adapter"),
}
"""What a run writes inside its ``checkpoints/`` and ``final/``: anything else there (another tool's
``checkpoints/epoch1.ckpt``) is not the run's."""


def _run_entry(entry: Path) -> bool:
    return entry.name in RUN_ENTRIES or bool(_RUN_FILE.fullmatch(entry.name))


def foreign_entries(out: Path) -> list[str]:
    """The entries of ``out`` that no run of this project writes (:data:`RUN_ENTRIES`, and in
    ``checkpoints/`` and ``final/`` only the run's own), as relative paths: ``src``, ``.git``,
    ``NOTES.md``, ``checkpoints/epoch1.ckpt``. Empty for a folder that is missing or holds a run alone."""
    if not out.is_dir():
        return []
    found: list[str] = []
    for entry in sorted(out.iterdir()):
        if not _run_entry(entry):
            found.append(entry.name)
        elif entry.name in _RUN_CHILDREN and entry.is_dir() and not entry.is_symlink():
            pattern = _RUN_CHILDREN[entry.name]
            found += [
                f"{entry.name}/{c.name}" for c in sorted(entry.iterdir()) if not pattern.fullmatch(c.name)
            ]
        elif entry.name in _RUN_CHILDREN:
            found.append(entry.name)  # a file or a link where the run keeps a folder
    return found


def is_marked(out: Path) -> bool:
    """Whether ``out`` holds this project's :data:`RUN_MARKER` (a plain file, never a link)."""
    return (out / RUN_MARKER).is_file() and not (out / RUN_MARKER).is_symlink()


def _check_ours(out: Path) -> None:
    """Refuse a folder that is not the project's: one without :data:`RUN_MARKER` that holds an entry no
    run writes (:func:`foreign_entries`). A folder with the marker is a run folder (entries the user added
    there are kept, never deleted); one without it but holding run files alone is a run written before the
    marker existed (resumed or overwritten as before, and marked when taken); an empty one is new."""
    if is_marked(out):
        return
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise RunError(
            f"{out} holds files no sppo-rl run wrote ({shown}); a run never writes into, resumes or overwrites "
            "such a folder: choose another --out-dir (a new or empty folder)"
        )


def _mark(out: Path) -> None:
    atomic_write_text(out / RUN_MARKER, json.dumps({"sppo_rl": "run folder"}) + "\n")


def _remove_run_entries(out: Path) -> None:
    """``--overwrite``: remove what a run wrote in ``out`` (its :data:`RUN_ENTRIES` but
    :data:`KEEP_ON_OVERWRITE` and the marker; in ``checkpoints/`` and ``final/`` the run's own entries,
    then the folder if nothing else is left); anything else in the folder is left as it is."""
    import shutil

    def remove(entry: Path) -> None:
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            raise RunError(f"--overwrite: cannot remove {entry}: {e.strerror or e}") from None

    gone = [
        e.name
        for e in sorted(out.iterdir())
        if e.name not in KEEP_ON_OVERWRITE and e.name != RUN_MARKER and _run_entry(e)
    ]
    shown = ", ".join(gone[:8]) + (f", ... ({len(gone)} in all)" if len(gone) > 8 else "")
    print(f"[sppo-rl] --overwrite: removing the previous run in {out}: {shown}", file=sys.stderr, flush=True)
    for entry in sorted(out.iterdir()):
        if entry.name in KEEP_ON_OVERWRITE or entry.name == RUN_MARKER or not _run_entry(entry):
            continue
        pattern = _RUN_CHILDREN.get(entry.name)
        if pattern is None or entry.is_symlink() or not entry.is_dir():
            remove(entry)
            continue
        for child in sorted(entry.iterdir()):
            if pattern.fullmatch(child.name):
                remove(child)
        if not any(entry.iterdir()):
            entry.rmdir()


def _has_run(out: Path) -> bool:
    return (out / "metrics.jsonl").exists() or (out / "checkpoints").exists()


def _has_checkpoint(out: Path) -> bool:
    """Whether ``out/checkpoints`` holds a checkpoint, published or left complete at a staged name by a
    replacement cut short (:func:`~sppo_rl.runtime.files.recoverable`; the resume puts it back)."""
    from sppo_rl.runtime.files import recoverable

    folder = out / "checkpoints"
    return folder.is_dir() and (any(folder.glob("ckpt-*")) or bool(recoverable(folder)))


def _busy(out: Path) -> bool:
    """Whether another process holds ``out``'s run lock (probed without creating anything)."""
    if out.resolve() in _HELD:
        return False
    try:
        fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock
    return False


def prepare_run_dir(out_dir: str | Path, *, resume: bool, overwrite: bool = False) -> Path:
    """Create/check the run folder; call it after every setting has been validated, as the last step
    before the run's work.

    - a folder that already holds a run (``metrics.jsonl`` or ``checkpoints/``) is refused unless
      ``resume`` (continue it) or ``overwrite`` (start over) is given, so no earlier result is lost by
      accident; ``resume`` of a folder without checkpoints is refused too. These refusals come before
      anything is created or written;
    - the folder is locked for this run (:func:`lock_run_dir`): two runs never share it;
    - then, under the lock, the folder must be writable (:func:`probe_writable`: a file of a fresh
      name, so a link planted in the folder is never followed); a full disk there is a
      :class:`~sppo_rl.runtime.storage.StorageError` (exit 74), no permission or a read-only folder a
      :class:`RunError` (the user's choice of folder: exit 2);
    - a folder that is not the project's (no :data:`RUN_MARKER`, and an entry no run writes: ``src/``,
      ``.git/``, ``NOTES.md``, another tool's ``checkpoints/epoch1.ckpt``) is refused whatever the flags
      (:func:`_check_ours`), before anything is created; a folder holding run files alone, written
      before the marker existed, is a run folder;
    - ``overwrite`` of a folder holding a run removes what the previous run wrote: its
      :data:`RUN_ENTRIES` except :data:`KEEP_ON_OVERWRITE` (the lock ``.run.lock``, a sweep's ``.lock``
      and ``log.txt``), so no ``final.pt``, ``final/``, ``calibration.json``, trace or ``config.json`` of
      the old run is left to be mistaken for the new one's; entries the user added to a marked run
      folder are left; one line on stderr names what it removes;
    - the folder is marked (:data:`RUN_MARKER`) before the run writes anything else.
    """
    out = Path(out_dir)
    _check_ours(out)
    if resume and not _has_checkpoint(out):
        raise RunError(f"--resume: no checkpoint in {out / 'checkpoints'}; start the run without --resume")
    if not resume and not overwrite and _has_run(out) and not _busy(out):
        raise RunError(
            f"{out} already holds a run; pass --resume to continue it, or --overwrite to start over, "
            "or choose another --out-dir"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _not_writable(out, e) from None
    lock_run_dir(out)
    try:
        probe_writable(out)
    except OSError as e:
        unlock_run_dir(out)
        raise _not_writable(out, e) from None
    try:
        _check_ours(out)  # again, now that the folder is locked
    except RunError:
        unlock_run_dir(out)
        raise
    has_run = _has_run(out)
    if resume:
        if not _has_checkpoint(out):
            raise RunError(
                f"--resume: no checkpoint in {out / 'checkpoints'}; start the run without --resume"
            )
    elif has_run and not overwrite:
        raise RunError(
            f"{out} already holds a run; pass --resume to continue it, or --overwrite to start over, "
            "or choose another --out-dir"
        )
    elif has_run and overwrite:
        _remove_run_entries(out)
    _mark(out)
    return out


RESUMABLE = frozenset(
    {
        "resume", "overwrite", "out_dir", "total_episodes", "updates", "max_seconds", "progress", "tensorboard",
        "wandb", "wandb_mode", "wandb_project", "checkpoint_every", "keep_checkpoints", "eval_every",
        "eval_episodes", "calibration_contexts", "calibration_samples", "threads", "extra", "cache_dir",
        "reward_timeout", "collective_timeout", "wandb_entity", "wandb_group", "wandb_tags", "exp_name",
        "log_completions_every", "reward_fail_limit", "export_adapter", "optimizer_state",
        "resume_without_optimizer",
    }
)  # fmt: skip
"""Settings a resumed run may change (budgets, cadence, logging, resources); any other change would
continue one run as another."""


OLD_CONFIG_KEYS = {"steps": "updates"}  # vocab: old name
"""``config.json`` keys saved under another name before both worlds shared one vocabulary (the LLM
world's budget of updates, once ``steps``), each with its name now."""


def renamed(record: dict[str, Any], old: dict[str, str]) -> dict[str, Any]:
    """``record`` with each key of ``old`` under its name now, where the record lacks that name (a file
    written before the rename); in place of the old key, so the order stays. A record written since comes
    back unchanged (the same object)."""
    if not any(k in record and new not in record for k, new in old.items()):
        return record
    return {(old[k] if k in old and old[k] not in record else k): v for k, v in record.items()}


def config_now(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config (``config.json``) with its keys under the names now (:data:`OLD_CONFIG_KEYS`)."""
    return renamed(saved, OLD_CONFIG_KEYS)


def saved_config(out_dir: str | Path) -> dict[str, Any] | None:
    """The config a run saved in ``out_dir/config.json`` (without its ``resolved`` part; keys under
    their names now, :func:`config_now`), or None."""
    path = Path(out_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not a readable config ({e})") from None
    if not isinstance(saved, dict):
        raise RunError(f"{path}: not a config object")
    saved.pop("resolved", None)
    return config_now(saved)


def check_resume(out_dir: str | Path, cfg: RunConfig) -> None:
    """Refuse to resume the run in ``out_dir`` with settings that would make it another run: every
    field outside :data:`RESUMABLE` must equal the saved one; the refusal names the fields."""
    saved = saved_config(out_dir)
    if saved is None:
        return
    now = json.loads(json.dumps(config_dict(cfg), default=str))
    changed = [k for k in now if k not in RESUMABLE and k in saved and saved[k] != now[k]]
    if changed:
        diffs = ", ".join(f"{k} {saved[k]!r} -> {now[k]!r}" for k in changed)
        raise RunError(
            f"--resume of {out_dir} with other settings than the run's own ({diffs}); resume with the same "
            "ones (flags left out are taken from its config.json) or start another --out-dir"
        )


def config_dict(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """A config as ``config.json`` holds it: one key per flag (:func:`sppo_rl.config.flat_dict`)."""
    from sppo_rl.config import flat_dict

    return flat_dict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)


def save_config(out_dir: str | Path, cfg: RunConfig | dict[str, Any], name: str = "config.json") -> Path:
    """Write the resolved config next to the run's results (atomically)."""
    path = Path(out_dir) / name
    atomic_write_text(path, json.dumps(config_dict(cfg), indent=2, default=str) + "\n")
    return path


class Preempted(Exception):
    """An update or evaluation given up because a preemption signal's grace period ran out (see
    :class:`Preemption`); the run's state is what it was before it, so it is redone on resume."""


class Preemption:
    """Context manager turning SIGTERM / SIGINT into a flag checked between updates.

    The first signal sets :attr:`requested` (and :attr:`requested_at`); the trainer finishes the
    current update, saves a checkpoint and exits with a message saying how to resume. Work that can
    hang (reward scoring) polls :meth:`stop_now`: once the signal is :attr:`grace_s` seconds old, it
    stops and the update (or evaluation) in flight is given up (:class:`Preempted`) and redone on
    resume, so the process exits within about ``grace_s`` plus the time of one save. A second SIGINT
    raises ``KeyboardInterrupt`` at once (abandoning the update; the last checkpoint stays valid).
    Handlers are installed only in the main thread and restored on exit; :attr:`active` is the one in
    force (None outside a run loop).
    """

    grace_s: float = 30.0
    active: Preemption | None = None

    def __init__(self, waits_on: str | None = None) -> None:
        self.waits_on = waits_on  # work that may outlive the signal (the LLM world: "reward scoring")
        self.requested: str | None = None
        self.requested_at: float | None = None
        self._old: dict[int, Any] = {}
        self._outer: Preemption | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested_at = time.monotonic()
        self.requested = name
        note = (
            f" ({self.waits_on} still running after {self.grace_s:.0f} s is given up, and that work is redone "
            "on resume)"
            if self.waits_on
            else ""
        )
        print(
            f"\n[sppo-rl] {name} received: finishing this update, then saving a checkpoint{note}",
            file=sys.stderr,
        )

    def stop_now(self) -> bool:
        """True once a signal came at least :attr:`grace_s` seconds ago."""
        return self.requested_at is not None and time.monotonic() - self.requested_at >= self.grace_s

    def __enter__(self) -> Preemption:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handler)
        self._outer, Preemption.active = Preemption.active, self
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        Preemption.active, self._outer = self._outer, None


def preemption_stop_now() -> bool:
    """Whether the active :class:`Preemption`'s grace period has run out (False outside a run loop)."""
    pre = Preemption.active
    return pre is not None and pre.stop_now()


def check_finite(step: int, **quantities: torch.Tensor | float | None) -> None:
    """Raise :class:`NonFiniteError` naming the step and the first non-finite quantity."""
    for name, value in quantities.items():
        if value is None:
            continue
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(
                f"step {step}: {name} is not finite ({t.flatten()[:4].tolist()}); stopping. "
                "The last good checkpoint is kept; nothing from this step was written."
            )


def exit_preempted(out_dir: Path, signame: str, resume_hint: str) -> NoReturn:
    """Print how to resume and exit with the conventional code (128 + signal number)."""
    print(f"[sppo-rl] stopped by {signame}; checkpoint saved in {out_dir / 'checkpoints'}", file=sys.stderr)
    print(f"[sppo-rl] resume with: {resume_hint}", file=sys.stderr)
    sys.exit(128 + int(getattr(signal, signame)))


def set_threads(n: int) -> None:
    """Torch intra-op threads (1 is fastest for small MLPs) and the OpenMP default for children."""
    torch.set_num_threads(max(1, n))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, n)))
