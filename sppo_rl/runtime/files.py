"""Files written so that a crash at any moment leaves the old content or the new, never a mix:
:func:`atomic_write_bytes` writes a temporary file beside the target, flushes and fsyncs it, renames it
into place and fsyncs the folder; new files and folders get the permissions the process's umask allows
(:func:`follow_umask`)."""

from __future__ import annotations

import os
import tempfile
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
