"""File-system faults of a running run: one line naming the cause, exit status :data:`EXIT_STORAGE`.

A run that cannot write its folder any more stops at that write with a :class:`StorageError`; the
command prints its message as one line and exits 74 (``EX_IOERR`` of ``sysexits.h``), distinct from 2
(a user mistake, refused before any work) and 1 (a bug: a traceback). The faults it names:

- disk full (``ENOSPC``, ``EDQUOT``; and torch's ``inline_container`` writer errors such as ``unexpected
  pos``, which report a short write without its cause, when the file system has under
  :data:`NEARLY_FULL` bytes free): with the bytes left free on the run folder's file system;
- a read-only file system (``EROFS``), or a folder that is no longer writable (``EACCES``, ``EPERM``);
- the run folder vanished (deleted, renamed or replaced while the run writes to it; see
  :func:`sppo_rl.runtime.run.check_run_dir`): never re-created, the run stops at its next write;
- any other I/O error (``EIO``) or a torch writer error with space left.

Checkpoints are published atomically (:mod:`sppo_rl.runtime.checkpoint`), so the ones written before
the fault are intact; the message says how to go on.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

EXIT_STORAGE = 74
NEARLY_FULL = 16 * 2**20
"""Free bytes under which a write error that names no cause is taken for a full disk."""

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
DENIED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_TORCH_WRITER = ("inline_container", "unexpected pos", "PytorchStreamWriter failed")


class StorageError(RuntimeError):
    """The run's folder cannot be written (disk full, read-only, vanished, an I/O error); the message
    names the cause. The command exits with :attr:`exit_code` (74)."""

    exit_code = EXIT_STORAGE


def free_bytes(path: str | Path) -> int | None:
    """Bytes free to an unprivileged writer on the file system holding ``path`` (or its nearest existing
    parent), or None if none can be asked."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown space"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 16:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]  # None ends the loop
    return seen


def _within(name: object, out: Path) -> bool:
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False
    try:
        text = os.fsdecode(name)
        return Path(text).absolute().is_relative_to(out.absolute())
    except (TypeError, ValueError):
        return False


def vanished_error(out: str | Path, how: str = "vanished") -> StorageError:
    return StorageError(
        f"the run folder {out} {how} while the run was writing to it (deleted, moved or unmounted); "
        "stopped at its next write without re-creating it"
    )


def storage_error(exc: BaseException, out: str | Path | None, hint: str = "") -> StorageError | None:
    """The :class:`StorageError` that ``exc`` (raised while the run in ``out`` wrote its files) stands
    for, or None if it is no file-system fault. ``hint`` ends the message (how to go on).

    ``EACCES`` / ``EPERM`` / ``ENOENT`` count only for a path inside ``out`` (or ``out`` gone): the
    same errors on a data file are the user's to fix, not a fault of the run's storage."""
    if isinstance(exc, StorageError):
        return exc
    if out is None:
        return None
    out = Path(out)
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno is not None:
            code, name = e.errno, e.filename
            where = f" writing {os.fsdecode(name)}" if isinstance(name, (str, bytes)) else ""
            if code in FULL:
                return StorageError(
                    f"disk full{where}: {_size(free_bytes(out))} free on the file system of {out} "
                    f"({os.strerror(code)}){hint}"
                )
            if not out.is_dir() and code in (errno.ENOENT, errno.ESTALE, *DENIED):
                return vanished_error(out)
            if code == errno.EROFS:
                return StorageError(f"read-only file system{where}: {out} cannot be written any more{hint}")
            if code in DENIED and (_within(name, out) or name is None):
                return StorageError(
                    f"{out} is no longer writable{where} ({os.strerror(code)}); make it writable again{hint}"
                )
            if code == errno.ENOENT and _within(name, out):
                return StorageError(
                    f"part of the run folder vanished: {os.fsdecode(name)} is gone (deleted while the run "
                    f"wrote to it){hint}"
                )
            if code == errno.EIO:
                return StorageError(f"I/O error{where} on the file system of {out}{hint}")
        if isinstance(e, RuntimeError) and any(t in str(e) for t in _TORCH_WRITER):
            free = free_bytes(out)
            detail = " ".join(str(e).split())[:160]
            if not out.is_dir():
                return vanished_error(out)
            if free is not None and free < NEARLY_FULL:
                return StorageError(
                    f"disk full: {_size(free)} free on the file system of {out} (torch's writer: {detail}){hint}"
                )
            return StorageError(f"writing a checkpoint in {out} failed (torch's writer: {detail}){hint}")
    return None


_OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""How an error of Rust code (safetensors' writer) names its errno: ``I/O error: No space left on device
(os error 28)``."""


def _errno_of(e: BaseException) -> int | None:
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno
    m = _OS_ERROR.search(str(e)) if not isinstance(e, OSError) else None
    return int(m.group(1)) if m else None


def cache_error(exc: BaseException, cache: str | Path) -> StorageError | None:
    """The :class:`StorageError` (exit 74) that ``exc``, raised while a model was built into the cache
    folder ``cache``, stands for, naming the bytes free there; None if it is no storage fault. A full disk
    or quota (``ENOSPC``, ``EDQUOT``, also as safetensors' ``(os error 28)``), a file larger than the
    file system or the process's file-size limit takes (``EFBIG``), an I/O error (``EIO``), and torch's
    writer error on a nearly full disk."""
    cache = Path(cache)
    hint = "; free some space there, or pass --cache-dir on a disk with room"
    for e in _causes(exc):
        code = _errno_of(e)
        free = _size(free_bytes(cache))
        if code in FULL:
            return StorageError(
                f"disk full building the model cache in {cache}: {free} free on its file system "
                f"({os.strerror(code)}){hint}"
            )
        if code == errno.EFBIG:
            return StorageError(
                f"a file of the model cache in {cache} is larger than the file system or the file-size limit "
                f"allows ({os.strerror(code)}); {free} free on its file system{hint}"
            )
        if code == errno.EIO:
            return StorageError(
                f"I/O error building the model cache in {cache} ({free} free on its file system)"
            )
        if isinstance(e, RuntimeError) and any(t in str(e) for t in _TORCH_WRITER):
            left = free_bytes(cache)
            if left is not None and left < NEARLY_FULL:
                return StorageError(
                    f"disk full building the model cache in {cache}: {_size(left)} free{hint}"
                )
    return None
