"""Files written so that a crash at any moment leaves the old content or the new, never a mix:
:func:`atomic_write_bytes` writes a temporary file beside the target, flushes and fsyncs it, renames it
into place and fsyncs the folder; new files and folders get the permissions the process's umask allows
(:func:`follow_umask`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's file-mode creation mask: ``/proc/self/status``'s ``Umask`` where Linux gives it
    (reading it elsewhere means setting it, which another thread could see for an instant)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give ``path`` (and, for a folder, everything under it) the modes a plain ``open`` / ``mkdir`` would
    have: files ``0o666 & ~umask``, folders ``0o777 & ~umask``. For what ``mkstemp`` / ``mkdtemp`` (and
    libraries written with them, e.g. safetensors' files) create private (0600 / 0700)."""
    mask = current_umask()
    path = Path(path)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder, fsync, rename; the file's mode
    follows the umask (as a plain ``open`` would), not ``mkstemp``'s 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_link(source: Path, path: Path) -> bool:
    """Replace ``path`` by a hard link to ``source`` (the same bytes stored once): a link made under a
    temporary name beside ``path``, renamed into place, the folder fsynced, so a crash leaves the old file
    or the link. False, with ``path`` untouched, where the file system makes no such link."""
    path = Path(path)
    staged = path.with_name(f".{path.name}.link")
    try:
        staged.unlink(missing_ok=True)
        os.link(source, staged)
    except OSError:
        return False
    os.replace(staged, path)
    fsync_dir(path.parent)
    return True


STALE_UNLOCKED_S = 3600.0
"""Age after which a temporary build folder without a lock file (an earlier version's, or one whose
builder was killed between creating it and locking it) is taken for abandoned."""


BUILD_LOCK = b"sppo-rl cache build\n"
"""What the lock file of a cache build holds: a lock file without it is not the project's."""


def _lock_free(lock: Path) -> int | None:
    """The descriptor of the cache build lock ``lock`` with its ``flock`` taken (its holder is gone),
    or None (held, no such file, or not a lock file of the project's: :data:`BUILD_LOCK`)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.pread(fd, len(BUILD_LOCK) + 1, 0) != BUILD_LOCK:
            raise OSError("not a cache build lock")
    except OSError:
        os.close(fd)
        return None
    return fd


def clean_stale_builds(cache: Path, name: str) -> list[Path]:
    """Remove the temporary folders of cache builds whose builder is gone (:func:`cache_build`): a
    ``*.tmp-*`` folder whose lock file ``<folder>.lock`` no process holds (a builder holds it while it
    builds; the lock file is the project's, so any build's); without a lock file, only a
    ``<name>.tmp-*`` / ``<name>.old-*`` folder of the build about to start (``name``) untouched for
    :data:`STALE_UNLOCKED_S` (an earlier version's, which took no lock); and lock files left without
    their folder. A build in progress is never touched, nor anything else in the folder. Returns what
    was removed."""
    removed: list[Path] = []
    try:
        entries = sorted(cache.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if ".tmp-" not in entry.name and not entry.name.startswith(f"{name}.old-"):
            continue
        if entry.name.endswith(".lock"):
            if entry.with_name(entry.name[: -len(".lock")]).exists():
                continue  # handled with its folder
            fd = _lock_free(entry)
            if fd is not None:
                with contextlib.suppress(OSError):
                    entry.unlink()
                os.close(fd)
            continue
        if not entry.is_dir() or entry.is_symlink():
            continue
        lock = entry.with_name(entry.name + ".lock")
        if lock.exists():
            fd = _lock_free(lock)
            if fd is None:
                continue  # its builder is at work
            try:
                shutil.rmtree(entry, ignore_errors=True)
                with contextlib.suppress(OSError):
                    lock.unlink()
            finally:
                os.close(fd)
        elif entry.name.startswith((f"{name}.tmp-", f"{name}.old-")):
            try:
                age = time.time() - entry.stat().st_mtime
            except OSError:
                continue
            if age < STALE_UNLOCKED_S:
                continue
            shutil.rmtree(entry, ignore_errors=True)
        else:
            continue
        removed.append(entry)
    return removed


@contextlib.contextmanager
def cache_build(folder: Path) -> Iterator[Path]:
    """A temporary sibling of the cache folder ``folder`` to build it in (``<name>.tmp-*``), locked
    (``flock`` on ``<tmp>.lock``) for as long as the block runs, removed after it if still there (the
    block renames it into place when the build is complete, after :func:`follow_umask`). Before it,
    :func:`clean_stale_builds` removes what killed builds left in the cache. A storage fault of the
    cache (disk full, a file-size limit, an I/O error) raised in the block or here is a
    :class:`~sppo_rl.runtime.storage.StorageError` naming the free space (exit 74)."""
    from sppo_rl.runtime.storage import cache_error

    cache = folder.parent
    fd: int | None = None
    tmp: Path | None = None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        clean_stale_builds(cache, folder.name)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=cache))
        fd = os.open(
            tmp.with_name(tmp.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, BUILD_LOCK)
        yield tmp
    except Exception as e:
        fault = cache_error(e, cache)
        if fault is not None:
            raise fault from e
        raise
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp.with_name(tmp.name + ".lock"))  # type: ignore[union-attr]  # fd is set after tmp
            os.close(fd)


CHECKPOINT_STAGED_PREFIX = ".tmp-ckpt-"
"""Where a checkpoint replaced for the same step is staged (``.tmp-ckpt-new-<step>``, ``...-old-<step>``)."""
CHECKPOINT_META = "meta.json"
"""A checkpoint's metadata file, written last: a folder holding it is complete."""


def recoverable(directory: str | Path) -> dict[int, Path]:
    """``{step: folder}`` of complete checkpoints a replacement killed between its renames left at a
    staged name (:func:`sppo_rl.runtime.checkpoint._staged`) while ``ckpt-<step>`` is missing: the new copy where its ``meta.json``
    (written last, before the copy is staged) is there, else the old one."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    found: dict[int, Path] = {}
    for kind in ("old", "new"):  # the new copy wins
        for p in directory.glob(f"{CHECKPOINT_STAGED_PREFIX}{kind}-*"):
            m = re.fullmatch(rf"{re.escape(CHECKPOINT_STAGED_PREFIX)}{kind}-(\d{{9}})", p.name)
            if (
                m
                and p.is_dir()
                and (p / CHECKPOINT_META).is_file()
                and not (directory / f"ckpt-{m.group(1)}").exists()
            ):
                found[int(m.group(1))] = p
    return found
