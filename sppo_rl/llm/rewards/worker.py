"""The reward worker process and its limits (:class:`~sppo_rl.llm.rewards.scorer.RewardScorer` runs
several).

Protocol on the worker's pipe (:func:`_worker_main`): after loading the functions it answers
``("ready",)`` or ``("error", message)``; then, for each ``("score", [(i, response, truth, columns),
...])`` it sends ``("ok", i, (parts, traceback))`` per item as each finishes (:func:`_score_parts`: each
function's checked score, :func:`_check_value`, or its error message; the traceback of the process's
first failure, else None), until ``("stop",)`` or a closed pipe.

Limits: the worker ignores SIGTERM and SIGINT (blocked from its birth, the trainer owns its lifetime),
exits when its parent is gone (:func:`_watch_parent`), may grow its address space by a set amount
beyond what it holds after loading (:func:`_limit_memory`, ``RLIMIT_AS``), and a process a reward
function forks leaves without writing to the pipe (:func:`_leave_if_forked`). :class:`_Worker` is the
parent's handle: start (and load), send, kill, stop.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import numbers
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from sppo_rl.llm.rewards.specs import RewardFnError, _load_all, _trl_call


class RewardRangeError(ValueError):
    """A reward function returned a number outside ``[0, 1]`` (the item counts as a verifier error)."""


class RewardWorkerError(RuntimeError):
    """A worker process could not be (re)started."""


_TRACEBACK_SENT = False  # in a worker: whether it has sent a traceback already (one per process)


_WORKER_PID: int | None = None  # in a worker: its own process id (a reward function's fork has another)


def _leave_if_forked() -> None:
    """In a process a reward function forked from the worker (its pid is not the worker's), once the
    function returned or raised there (``sys.exit(0)`` included): leave at once, writing nothing to the
    worker's pipe and running no ``atexit`` or finaliser of the worker's."""
    if _WORKER_PID is not None and os.getpid() != _WORKER_PID:
        os._exit(0)


def _score_parts(
    fns: list[tuple[Callable[..., Any], str]], response: str, truth: str, columns: Mapping[str, Any]
) -> tuple[list[float | str], str | None]:
    """Inside the worker: each function's checked score of one item, or its error message; and the
    traceback of the first failure this process met (None after that)."""
    global _TRACEBACK_SENT
    parts: list[float | str] = []
    tb = None
    for fn, style in fns:
        try:
            try:
                value = _trl_call(fn, response, truth, columns) if style == "trl" else fn(response, truth)
            finally:
                _leave_if_forked()
            parts.append(_check_value(value))
        except BaseException as e:  # SystemExit from a reward function included
            parts.append(_describe(e))
            if not _TRACEBACK_SENT and not isinstance(e, RewardRangeError):
                _TRACEBACK_SENT = True
                tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
    return parts, tb


def _limit_memory(extra_mb: int | None) -> None:
    if not extra_mb:
        return
    try:
        import resource

        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * page
    except (ImportError, OSError, ValueError):
        return  # no RLIMIT_AS or no /proc: unbounded
    limit = current + extra_mb * 2**20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent is gone, even while the main thread is stuck in a reward function."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)


def _check_value(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"returned {type(value).__name__}, not a number")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"returned a non-finite value {out}")
    if not 0.0 <= out <= 1.0:
        raise RewardRangeError(f"returned {out}, outside [0, 1]")
    return out


def _describe(e: BaseException) -> str:
    try:
        text = f"{type(e).__name__}: {e}"
    except Exception:  # a broken __str__
        text = type(e).__name__
    return text[:300]


def _worker_main(
    conn: Connection, kind: str, spec: Any, inner_timeout_s: float, memory_mb: int | None, parent_pid: int
) -> None:
    """Load the functions, answer ``("ready",)`` or ``("error", msg)``, then score chunks until told to
    stop: for each item send ``("ok", i, (parts, traceback))`` (:func:`_score_parts`). A process a
    reward function forks leaves as soon as the function returns or raises in it
    (:func:`_leave_if_forked`), so only the worker ever answers on the pipe."""
    global _WORKER_PID
    _WORKER_PID = os.getpid()
    # The trainer owns the worker's lifetime: SIGTERM / SIGINT sent to the whole process group (``timeout``,
    # Slurm, systemd, Ctrl-C) are the trainer's to handle, and it stops its workers once it has saved.
    # Both were blocked since the fork (see _Worker.start); ignored now, then unblocked.
    for sig in _OWNED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _OWNED_SIGNALS)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        fns = _load_all(kind, spec, inner_timeout_s)
    except BaseException as e:
        conn.send(("error", _describe(e)))
        return
    _limit_memory(memory_mb)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        for i, response, truth, columns in msg[1]:
            parts = _score_parts(fns, response, truth, columns)
            _leave_if_forked()
            conn.send(("ok", i, parts))


_OWNED_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class _Worker:
    """One worker process and the items it currently holds.

    Lifetime: the worker ignores SIGTERM and SIGINT (blocked from its birth, so a signal to the process
    group while it starts cannot kill it either) and exits when told to stop, when its pipe closes or
    when its parent is gone (checked every second). Whatever else ends it (SIGKILL, the OOM killer, a
    reward function calling ``os._exit``) is found out by the scorer: dead while idle, it is restarted
    before it is given items (:meth:`alive`; a pipe found broken on :meth:`send` the same); dead while
    scoring, the item it held is scored invalid and the rest go to its replacement.
    """

    def __init__(self, args: tuple[Any, ...], start_timeout_s: float) -> None:
        self.args = args
        self.start_timeout_s = start_timeout_s
        self.proc: Any = None
        self.conn: Connection | None = None
        self.pending: deque[int] = deque()
        self.deadline = math.inf

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_worker_main, args=(child, *self.args, os.getpid()), daemon=True)
        # The child inherits this thread's signal mask. multiprocessing's resource tracker, started with
        # the first spawned process, unblocks both signals once it is up: start it first.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _OWNED_SIGNALS)
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(
                signal.SIG_SETMASK, old_mask
            )  # a signal that came meanwhile: delivered now
        child.close()
        self.proc, self.conn = proc, parent
        if not parent.poll(self.start_timeout_s):
            self.kill()
            raise RewardWorkerError(
                f"the reward worker did not load the function within {self.start_timeout_s:.0f} s "
                "(does importing its module hang?)"
            )
        try:
            msg = parent.recv()
        except (EOFError, OSError):
            proc.join(5.0)
            code = proc.exitcode
            self.kill()
            raise RewardWorkerError(
                f"the reward worker exited while loading the function (exit code {code}): its module ends "
                "the process when imported, or the main script does (a spawned process re-imports it, so "
                "keep a script's work under `if __name__ == '__main__':`)"
            ) from None
        if msg[0] == "error":
            self.kill()
            raise RewardFnError(f"cannot load the reward function: {msg[1]}")

    def alive(self) -> bool:
        return self.conn is not None and self.proc is not None and self.proc.is_alive()

    def send(self, items: list[tuple[int, str, str, Any]], timeout_s: float) -> bool:
        """Give ``items`` to the worker; False (nothing given) if its pipe is broken: it died while idle."""
        assert self.conn is not None
        try:
            self.conn.send(("score", items))
        except (OSError, EOFError, ValueError):  # BrokenPipeError, ConnectionResetError, a closed handle
            return False
        self.pending.extend(item[0] for item in items)
        self.deadline = time.monotonic() + timeout_s
        return True

    def kill(self) -> None:
        """Kill the process (it may be stuck in C code, so no polite request first)."""
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(5.0)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None
        self.pending.clear()
        self.deadline = math.inf

    def stop(self) -> None:
        """Ask an idle worker to exit, then make sure it has."""
        if self.conn is not None and not self.pending:
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(("stop",))
            if self.proc is not None:
                self.proc.join(1.0)
        self.kill()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        with contextlib.suppress(Exception):
            w.stop()
