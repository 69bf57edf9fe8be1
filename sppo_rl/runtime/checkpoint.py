"""Atomic, rotating checkpoints shared by the control and LLM trainers.

A checkpoint is a folder ``<dir>/ckpt-<step:09d>/``. It is written under a temporary name in the same
parent folder, every file is flushed and fsynced, ``meta.json`` is written last, and only then is the
folder renamed into place (``os.rename`` of a folder is atomic on POSIX). A process killed at any moment
therefore leaves either the complete new checkpoint or none of it: the previous one stays loadable.
Leftover temporary folders are ignored and removed by the next save. The newest ``keep`` are kept: the
older ones are deleted only after the new one is published and read back against its checksums
(:meth:`CheckpointManager.verify`), so even ``keep = 1`` always leaves one intact checkpoint on disk.

``meta.json`` lists every other file of the checkpoint with its size and SHA-256 (``"files"``), so a
checkpoint damaged after it was published (a truncated, zeroed or overwritten file, a deleted one) is
recognised before it is loaded. :meth:`CheckpointManager.resume` loads the newest intact checkpoint,
skipping damaged ones with a warning on stderr that names them; checkpoints written before checksums
existed are tried unverified, and one that fails to load is skipped the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import torch

from sppo_rl.runtime.files import CHECKPOINT_META as META
from sppo_rl.runtime.files import CHECKPOINT_STAGED_PREFIX as _TMP_PREFIX
from sppo_rl.runtime.files import atomic_link, current_umask, fsync_dir, recoverable

_NAME = re.compile(r"^ckpt-(\d{9})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (damaged, unreadable); the message names the file."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checksum_tree(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` of every file under ``folder`` except
    ``meta.json`` (files are hashed in parallel threads: hashlib releases the GIL)."""
    folder = Path(folder)
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != META)
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(paths)))) as pool:
        digests = list(pool.map(sha256_file, paths))
    return {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": d}
        for p, d in zip(paths, digests)
    }


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and the folders themselves."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


class CheckpointManager:
    """Save and find checkpoints under ``directory``.

    ``save(step, write)`` calls ``write(tmp_folder)`` to fill a fresh folder, then publishes it
    atomically as ``ckpt-<step>``; ``meta`` (JSON-serialisable) is stored as ``meta.json`` with the
    size and SHA-256 of every file. ``latest()`` returns the newest published checkpoint folder, or
    None; ``resume(load)`` loads the newest intact one (:meth:`verify`), falling back past damaged ones.

    ``next_meta`` holds fields added to the next save's ``meta.json`` only (the run loop stores there a
    row whose evaluation a preemption deferred); ``resumed_meta`` is the ``meta.json`` of the
    checkpoint :meth:`resume` loaded.
    """

    def __init__(self, directory: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.next_meta: dict[str, Any] = {}
        self.resumed_meta: dict[str, Any] | None = None

    def published(self) -> list[Path]:
        """Published checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
        return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]  # found: names it matches

    def latest(self) -> Path | None:
        ckpts = [p for p in self.published() if (p / "meta.json").is_file()]
        return ckpts[-1] if ckpts else None

    def save(self, step: int, write: Callable[[Path], None], meta: dict[str, Any] | None = None) -> Path:
        """Publish a new checkpoint. In a multi-process job every rank calls this (collective):
        rank 0 makes the temporary folder, every rank's ``write`` fills it (e.g. its ZeRO shard), and
        rank 0 publishes it once all ranks are done."""
        rank, world = _rank_world()
        final = self.directory / f"ckpt-{step:09d}"
        tmp: Path | None = None
        if rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            recover(self.directory)  # a replacement killed half-way: its complete copy back, then clean
            for stale in self.directory.glob(_TMP_PREFIX + "*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=_TMP_PREFIX))
            os.chmod(
                tmp, 0o777 & ~current_umask()
            )  # mkdtemp's 0700: a published checkpoint follows the umask
        if world > 1:
            box = [str(tmp) if tmp else None]
            torch.distributed.broadcast_object_list(box, src=0)
            tmp = Path(cast(str, box[0]))  # rank 0's folder
        assert tmp is not None
        try:
            write(tmp)
            if world > 1:
                torch.distributed.barrier()
            if rank == 0:
                files = checksum_tree(tmp)
                record = {"step": step, **(meta or {}), **self.next_meta, "files": files}
                with open(tmp / META, "w") as f:
                    json.dump(record, f, indent=1, default=str)
                fsync_tree(tmp)
                if final.exists():  # re-saving the same step (e.g. the final save after a periodic one)
                    # complete copies only ever move: one sits at ckpt-<step>, or both at their staged
                    # names, which recover() puts back; never none
                    staged, old = _staged(self.directory, step)
                    shutil.rmtree(staged, ignore_errors=True)
                    shutil.rmtree(old, ignore_errors=True)
                    os.rename(tmp, staged)
                    tmp = staged
                    fsync_dir(self.directory)
                    os.rename(final, old)
                    os.rename(staged, final)
                    fsync_dir(self.directory)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.rename(tmp, final)
                fsync_dir(self.directory)
        except BaseException:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.next_meta = {}
        if rank == 0:
            try:  # read back: the older ones go only once the new one is known intact
                self.verify(final)
            except CheckpointError as e:
                print(
                    f"[sppo-rl] warning: the checkpoint just written does not verify ({e}); the older ones are kept",
                    file=sys.stderr,
                )
            else:
                for old in self.published()[: -self.keep]:
                    shutil.rmtree(old, ignore_errors=True)
        if world > 1:
            torch.distributed.barrier()
        return final

    def verify(self, ckpt: Path) -> bool:
        """Check ``ckpt`` against its ``meta.json``: every file listed there present, of the listed size
        and SHA-256. True: verified; False: an older checkpoint without checksums (unverified: only
        loading it can tell). Raises :class:`CheckpointError` naming the damaged file."""
        meta = read_meta(ckpt)
        files = meta.get("files")
        if files is None:
            return False
        if not isinstance(files, dict):
            raise CheckpointError(f"{Path(ckpt) / META}: 'files' is not a mapping")
        for rel, entry in sorted(files.items()):
            path = Path(ckpt) / rel
            if not isinstance(entry, dict):
                raise CheckpointError(f"{Path(ckpt) / META}: the entry of {rel!r} is not a mapping")
            if not path.is_file():
                raise CheckpointError(f"{path} is missing")
            size = path.stat().st_size
            if size != entry.get("bytes"):
                raise CheckpointError(f"{path} holds {size} bytes, {entry.get('bytes')} were written")
            if sha256_file(path) != entry.get("sha256"):
                raise CheckpointError(f"{path} does not match the SHA-256 written with it (damaged)")
        return True

    def resume(self, load: Callable[[Path], Any] | None = None) -> Path:
        """The newest intact checkpoint, loaded with ``load(ckpt)`` if given.

        Newest first, each checkpoint is verified (:meth:`verify`); a damaged one, one holding a file
        :func:`torch_load` refuses (:class:`UnsafeCheckpointError`: a pickle of other objects, even
        with matching checksums), or an unverified (pre-checksum) one whose ``load`` fails, is skipped
        with a warning on stderr naming it and why, and the previous one is tried. A ``RunError`` from ``load`` (e.g. settings that do not fit) and
        any failure loading a verified checkpoint propagate. Raises :class:`CheckpointError` when none
        is intact; nothing in the run folder is changed either way.
        """
        from sppo_rl.runtime.run import RunError

        recover(self.directory)
        ckpts = self.published()
        skipped: list[str] = []
        for ckpt in reversed(ckpts):
            try:
                verified = self.verify(ckpt)
                if load is not None:
                    try:
                        load(ckpt)
                    except RunError:
                        raise
                    except UnsafeCheckpointError as e:  # checksums match what was written: still refused
                        raise CheckpointError(" ".join(str(e).split())) from None
                    except Exception as e:
                        if verified:
                            raise
                        detail = " ".join(str(e).split())[:300]
                        raise CheckpointError(
                            f"{ckpt} (written without checksums) cannot be loaded: {type(e).__name__}: {detail}"
                        ) from None
            except CheckpointError as e:
                print(f"[sppo-rl] warning: skipping damaged checkpoint {ckpt.name}: {e}", file=sys.stderr)
                skipped.append(str(e))
                continue
            if skipped:
                print(
                    f"[sppo-rl] warning: resuming from {ckpt.name}, the newest intact checkpoint "
                    f"({len(skipped)} newer one(s) skipped; the updates after it are redone)",
                    file=sys.stderr,
                )
            self.resumed_meta = read_meta(ckpt)
            return ckpt
        where = self.directory
        if not ckpts:
            raise CheckpointError(f"--resume: no checkpoint in {where}; start the run without --resume")
        raise CheckpointError(
            f"--resume: no intact checkpoint in {where} ({len(ckpts)} damaged: {'; '.join(skipped)}); "
            "nothing was changed; start over with --overwrite, or choose another --out-dir"
        )


def _staged(directory: Path, step: int) -> tuple[Path, Path]:
    """Where :meth:`CheckpointManager.save` stages the replacement of ``ckpt-<step>``: the new complete
    copy, then the old one, moved aside for the instant between two renames."""
    return directory / f"{_TMP_PREFIX}new-{step:09d}", directory / f"{_TMP_PREFIX}old-{step:09d}"


def recover(directory: str | Path) -> list[Path]:
    """Put each :func:`recoverable` copy back at its checkpoint's name (the run folder's lock holder
    calls this: a resume, a save); the checkpoints recovered."""
    directory = Path(directory)
    done = []
    for step, src in sorted(recoverable(directory).items()):
        final = directory / f"ckpt-{step:09d}"
        os.rename(src, final)
        print(
            f"[sppo-rl] recovered checkpoint {final.name} from {src.name} (a replacement was cut short)",
            file=sys.stderr,
        )
        done.append(final)
    if done:
        fsync_dir(directory)
    return done


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def read_meta(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json``; :class:`CheckpointError` naming the file if it is missing or not a
    JSON object with a ``step``."""
    path = Path(ckpt) / META
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{path} is not a checkpoint record (a JSON object with an integer 'step')")
    return meta


def check_written_by(ckpt: Path, meta: dict[str, Any], algo: str) -> None:
    """Refuse, in one line (``RunError``, exit 2), a checkpoint whose ``meta.json`` names another
    algorithm than the run resuming it (one copied from another run's folder): its files would not be
    the ones this run loads (a GRPO checkpoint holds no critic), which would read as a vanished file."""
    from sppo_rl.runtime.run import RunError

    written = meta.get("algo")
    if written is not None and written != algo:
        raise RunError(
            f"--resume: {ckpt} was written by a {written} run (its meta.json says algo {written!r}), and this "
            f"run is {algo}: a checkpoint continues only the algorithm that wrote it (copied from another run?); "
            "move it out of checkpoints/, or start over with --overwrite"
        )


def link_identical(folder: Path, ckpt: Path, part: str) -> list[Path]:
    """Store weights once: each file ``folder/<name>`` of the size and SHA-256 that ``ckpt``'s
    ``meta.json`` lists for ``<part>/<name>`` becomes a hard link to that file (the final export and the
    last checkpoint, which hold the same weights in the same bytes). Files that differ, and every file
    where the file system has no hard links, keep their own copy. Returns the files linked.

    Nothing writes a checkpoint's file in place (a checkpoint is only ever published whole), and
    :func:`unshare` unlinks ``folder``'s files before it is written again, so the link never lets one
    change the other."""
    files = read_meta(ckpt).get("files") or {}
    linked = []
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        entry, source = files.get(f"{part}/{path.name}"), Path(ckpt) / part / path.name
        if not isinstance(entry, dict) or entry.get("bytes") != path.stat().st_size or not source.is_file():
            continue
        if path.samefile(source) or sha256_file(path) != entry.get("sha256"):
            continue
        if atomic_link(source, path):  # else no hard links here (or across): the copy stays
            linked.append(path)
    return linked


def unshare(folder: Path) -> None:
    """Unlink every file of ``folder`` (recursively) that has another hard link (:func:`link_identical`),
    so that writing ``folder`` anew writes new files and leaves the checkpoint's alone."""
    if Path(folder).is_dir():
        for path in Path(folder).rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1:
                path.unlink()


def torch_save(obj: object, path: Path) -> None:
    """``torch.save`` to ``path`` (inside a checkpoint's temporary folder; the folder is published atomically)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A file :func:`torch_load` refused: it holds objects other than tensors and plain data."""


def torch_load(path: Path) -> Any:
    """Read a file written by :func:`torch_save` (a checkpoint's state, an engine's, an actor file).

    Always ``torch.load(..., weights_only=True)``: only tensors, ``torch.Size`` / dtypes, and plain
    Python data (dicts, lists, tuples, sets, strings, bytes, numbers, bools, None, ordered dicts) are
    rebuilt, which is all the project saves (RNG states as tuples / dicts of ints or as byte tensors).
    Unpickling runs no code from the file, so a file from elsewhere (``--init-from``, a copied run)
    cannot execute anything; one that needs any other object raises :class:`UnsafeCheckpointError`,
    naming the file and the object.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = str(exc).strip().splitlines()
        reason = next((line for line in detail if "GLOBAL" in line or "Unsupported" in line), None)
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain Python data "
            f"(torch.load with weights_only=True; only files the project writes, or other trusted "
            f"tensor files, load): {reason or (detail[0] if detail else type(exc).__name__)}"
        ) from exc
