"""The one run loop of both worlds: updates, evaluation and checkpoint cadence, time budget,
preemption, progress bar and ``summary.json``.

A world's run object supplies what differs (:class:`Run`); the loop owns the order in which things
happen, so both worlds stop, save, resume and summarise alike.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

from sppo_rl.runtime.files import atomic_write_text
from sppo_rl.runtime.logging import json_safe, read_metrics, read_summary
from sppo_rl.runtime.run import Preempted, Preemption, check_run_dir, exit_preempted
from sppo_rl.runtime.storage import storage_error
from sppo_rl.runtime.watch import FIRST_UPDATES, Bar, ProgressLines, not_learning, warn

DEFERRED = "deferred_row"
"""Key in a checkpoint's ``meta.json``: the metrics row (and its log step) of the last update, whose
evaluation a preemption deferred; a resumed run evaluates, completes and logs it first."""


class MetricsLog(Protocol):
    def log(self, row: dict[str, Any], step: int) -> None: ...


class Run(Protocol):
    out: Path
    elapsed: float

    @property
    def logger(self) -> MetricsLog: ...  # metrics.jsonl and the trackers (rank 0), else a null one

    @property
    def updates(self) -> int: ...  # updates done so far (restored on resume)

    def update(self) -> dict[str, Any]: ...  # one update; its metrics row

    def evaluate(self) -> dict[str, Any]: ...  # periodic evaluation metrics ({} if none)

    def save_checkpoint(self) -> Path: ...

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]: ...  # exports; the summary

    def close(self) -> None: ...  # the logger and the run's workers


@dataclass(frozen=True)
class Schedule:
    """``total_updates``; ``eval_every`` (0: never; also after the last update when ``eval_last``);
    ``eval_first``: a row before the first update (these fields plus the evaluation; None: none);
    ``checkpoint_every`` (and always after the last update); ``max_seconds``: the last update is the
    first to end past it (None: no time budget); ``log_step``: a row's step on the logs' x-axis."""

    total_updates: int
    eval_every: int = 0
    checkpoint_every: int = 10
    max_seconds: float | None = None
    eval_first: dict[str, Any] | None = None
    eval_last: bool = False
    log_step: Callable[[dict[str, Any]], int] = lambda row: int(row.get("update", row.get("step", 0)))


def run_loop(
    run: Run,
    schedule: Schedule,
    *,
    resume_hint: str,
    bar: Bar | None = None,
    postfix: Callable[[dict[str, Any]], dict[str, str]] = lambda row: {},
    agree: Callable[[bool], bool] = lambda flag: flag,
    main: bool = True,
    callback: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Train until the schedule ends, then ``run.finish(rows of metrics.jsonl)``; rank 0 writes the
    summary it returns to ``summary.json``. ``agree(flag)`` is True on every rank when any rank's flag
    is (data parallel: the time budget and a preemption signal stop all ranks together). On SIGTERM /
    SIGINT the update in flight finishes, a checkpoint is saved and the process exits (128 + signal).

    Preemption never waits on unbounded work: an update whose reward scoring outlives the signal's
    grace period (:attr:`Preemption.grace_s`) is given up by the run (:class:`Preempted`, its state as
    before it) and redone on resume; an evaluation due after the signal, or cut short by it, is
    deferred: the checkpoint keeps the update's row (``meta.json`` key :data:`DEFERRED`) and the
    resumed run evaluates and logs it first. Either way the resumed run logs what an uninterrupted
    one would have.

    ``callback(row)`` (rank 0) is called with a copy of each update's metrics row once it is logged;
    returning ``False`` (not merely falsy) stops the run there: a checkpoint is saved, the run is
    finished as at the end of its budget, and the summary says ``stopped_by_callback`` (the update);
    ``--resume`` continues it. An exception from the callback propagates.

    A run that cannot learn says so (:func:`~sppo_rl.runtime.watch.not_learning`): on rank 0 each
    warning is printed on stderr as soon as the first :data:`~sppo_rl.runtime.watch.FIRST_UPDATES`
    updates of a fresh run show it, all of them again at the end (above the headline), and the summary lists them all (``"warnings"``: their messages).

    File-system faults: before each write (a metrics row, a checkpoint, the exports, the summary) rank 0
    checks that its run folder is still the one it locked (:func:`check_run_dir`); a write that fails
    for want of space, permission or the folder itself becomes a
    :class:`~sppo_rl.runtime.storage.StorageError` naming the cause (the run's workers and logger
    closed, the earlier checkpoints intact)."""
    hook = threading.excepthook

    def quiet_writer_thread(args: threading.ExceptHookArgs) -> None:
        """TensorBoard's writer thread dies of the same fault the run reports: its traceback would only
        repeat it (the writer raises it again in this thread at its next call)."""
        thread = type(args.thread).__name__ if args.thread is not None else ""
        if thread == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            if storage_error(args.exc_value, run.out) is not None:
                return
        hook(args)

    threading.excepthook = quiet_writer_thread
    try:
        return _run_loop(run, schedule, resume_hint, bar, postfix, agree, main, callback)
    except (OSError, RuntimeError) as exc:
        hint = f"; the checkpoints written before are intact: then resume with {resume_hint}"
        fault = storage_error(exc, run.out, hint)
        if fault is None:
            raise
        try:
            run.close()  # the reward workers; the logger's own last writes may fail the same way
        except Exception:  # noqa: BLE001 - the fault is what is reported
            pass
        if fault is exc:
            raise
        raise fault from exc
    finally:
        threading.excepthook = hook


def _run_loop(
    run: Run,
    schedule: Schedule,
    resume_hint: str,
    bar: Bar | None,
    postfix: Callable[[dict[str, Any]], dict[str, str]],
    agree: Callable[[bool], bool],
    main: bool,
    callback: Callable[[dict[str, Any]], Any] | None,
) -> dict[str, Any]:
    def guard() -> None:
        if main:
            check_run_dir(run.out)

    def log(row: dict[str, Any], step: int) -> None:
        guard()
        run.logger.log(row, step=step)

    def save() -> None:
        guard()
        run.save_checkpoint()

    done = run.updates >= schedule.total_updates or (
        schedule.max_seconds is not None and run.elapsed >= schedule.max_seconds
    )
    if done and (run.out / "summary.json").is_file():  # a finished run, resumed: nothing to do
        if main:
            print(
                f"[sppo-rl] {run.out} is finished ({run.updates} updates); nothing to resume", file=sys.stderr
            )
        run.close()
        if bar is not None:
            bar.close()
        return read_summary(run.out / "summary.json")
    ckpts = getattr(run, "ckpts", None)
    deferred = ((ckpts.resumed_meta if ckpts is not None else None) or {}).get(DEFERRED)
    stopped = None  # the update after which the callback stopped the run
    seen: list[dict[str, Any]] = []  # a fresh run's first update rows, for the early warnings
    fresh = run.updates == 0
    warned: set[str] = set()

    def watch(rows: list[dict[str, Any]], again: bool = False) -> list[str]:
        """Print the warnings of ``rows`` not printed yet (``again``: all of them, at the end)."""
        found = not_learning(rows, getattr(run, "signal", None))
        for w in found:
            if (again or w["kind"] not in warned) and main:
                warn(w["message"], bar)
            warned.add(w["kind"])
        return [w["message"] for w in found]

    try:
        with Preemption(getattr(run, "waits_on", None)) as pre:

            def stop(row: dict[str, Any] | None = None, step: int = 0) -> NoReturn:
                """Save (with ``row``, whose evaluation is deferred to the resumed run) and exit."""
                if row is not None and ckpts is not None:
                    ckpts.next_meta[DEFERRED] = {
                        "row": {k: json_safe(v) for k, v in row.items()},
                        "step": step,
                    }
                save()
                run.close()
                if bar is not None:
                    bar.close()
                exit_preempted(run.out, pre.requested or "SIGTERM", resume_hint)

            def evaluated(row: dict[str, Any]) -> bool:
                """Add the evaluation to ``row``; False if a preemption came first or cut it short."""
                if agree(pre.requested is not None):
                    return False
                try:
                    row.update(run.evaluate())
                except Preempted:
                    return False
                return True

            first = None
            resumed_deferred = agree(deferred is not None)
            if resumed_deferred:  # ranks other than 0 only take part in the evaluation
                first = deferred or {"row": {}, "step": 0}
            elif schedule.eval_first is not None and run.updates == 0:
                first = {"row": dict(schedule.eval_first), "step": 0}
            if first is not None:
                row = dict(first["row"])
                if not evaluated(row):
                    stop(first["row"], first["step"])
                log(row, first["step"])
                if agree(pre.requested is not None):
                    stop()
                if resumed_deferred and (run.updates % schedule.checkpoint_every == 0 or done):
                    save()
            last = done
            while not last:
                try:
                    row = run.update()
                except Preempted:  # given up, the run as before it: redone on resume
                    stop()
                out_of_time = schedule.max_seconds is not None and run.elapsed >= schedule.max_seconds
                last = run.updates >= schedule.total_updates or agree(out_of_time)
                every = schedule.eval_every
                step = schedule.log_step(row)
                due = every and (run.updates % every == 0 or (last and schedule.eval_last))
                if due and not evaluated(row):
                    stop(row, step)
                log(row, step)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(postfix(row))
                if fresh and len(seen) < FIRST_UPDATES:
                    seen.append({k: json_safe(v) for k, v in row.items()})
                    if len(seen) == FIRST_UPDATES:
                        watch(seen)
                if agree(pre.requested is not None):
                    stop()
                halt = callback is not None and agree(main and callback(dict(row)) is False)
                if run.updates % schedule.checkpoint_every == 0 or last or halt:
                    save()
                if halt:
                    stopped = run.updates
                    break
    finally:
        if bar is not None:
            bar.close()
    guard()
    rows = read_metrics(run.out / "metrics.jsonl") if main else []
    summary = run.finish(rows)
    if stopped is not None:
        summary["stopped_by_callback"] = stopped
        if main:
            print(f"[sppo-rl] the callback stopped the run after update {stopped}", file=sys.stderr)
    run.close()
    if main:
        guard()
        summary["warnings"] = watch(rows, again=True)
        text = json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False)
        atomic_write_text(run.out / "summary.json", text + "\n")
    return summary


STARTED = time.monotonic()  # when this process imported the run plumbing (after Python and torch started)


def command_seconds() -> float:
    """Seconds since this process started: Linux's ``/proc/self/stat`` start time (clock ticks after
    boot) against ``/proc/uptime``, so the interpreter's start and every import count; elsewhere the
    seconds since :data:`STARTED`."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime; fields[0] is field 3
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - start)
    except (OSError, ValueError, IndexError):
        return time.monotonic() - STARTED


def announce(
    out: Path,
    headline: str,
    tensorboard: bool,
    main: bool = True,
    command: bool = False,
    loop_seconds: float | None = None,
) -> None:
    """The end of a command on stderr: the headline numbers, the run folder, the wall time (of the
    whole process with ``command``, in the ``sppo-rl`` command, or when no ``loop_seconds`` are given;
    else ``loop_seconds``, the caller's measure of its run loop: called from Python, ``train_control``,
    a notebook) and the commands that look further (a report, TensorBoard)."""
    if not main:
        return
    if command or loop_seconds is None:
        wall = f"wall time of the command: {command_seconds():.1f} s"
    else:
        wall = f"wall time of the run loop: {loop_seconds:.1f} s"
    lines = [
        f"[sppo-rl] done: {headline}",
        f"[sppo-rl] run folder: {out} (summary.json, metrics.jsonl, config.json)",
        f"[sppo-rl] {wall}",
        f"[sppo-rl] next: sppo-rl report {out}"
        + (f"    tensorboard --logdir {out / 'tb'}" if tensorboard else ""),
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def progress_bar(enabled: bool, total: int, initial: int, desc: str, unit: str = "update") -> Bar | None:
    """Progress over updates on stderr: a tqdm bar where stderr is a terminal (or in a notebook), plain
    lines (:class:`~sppo_rl.runtime.watch.ProgressLines`) where it is a file or a pipe; None when not
    ``enabled``."""
    if not enabled:
        return None
    if not (sys.stderr.isatty() or "ipykernel" in sys.modules):
        return ProgressLines(total, initial, desc, unit)
    from tqdm.auto import tqdm

    bar: Bar = tqdm(total=total, initial=initial, unit=unit, desc=desc, dynamic_ncols=True, file=sys.stderr)
    return bar
