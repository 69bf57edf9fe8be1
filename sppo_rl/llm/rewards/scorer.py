"""Reward scoring in worker processes, so that a reward function that raises, hangs or crashes never
stops a training run.

:class:`RewardScorer` keeps ``workers`` persistent processes (``spawn`` context: fresh interpreters, safe
next to torch's threads; as with any spawned process, the main script is re-imported in each, so a
script keeps its work under ``if __name__ == "__main__":``). Each loads the reward function once, then scores items one after another and
reports every result as it finishes. The parent gives each item ``timeout_s`` seconds from the moment
the previous one reported:

- a function that raises, returns a non-number, NaN or infinity, or a number outside ``[0, 1]``: the
  item scores 0.0 and counts in ``errors`` (the worker catches it and goes on; the first out-of-range
  value also prints a warning on stderr);
- a hang past ``timeout_s``: the worker is killed and restarted, the item scores 0.0 and counts in
  ``errors`` and ``timeouts``, and the rest of the batch is scored by the new worker;
- a worker that dies (segfault, ``os._exit``, out of memory, SIGKILL) while scoring: the item it held
  scores 0.0 and counts in ``errors``; the worker is restarted. One that dies while idle (between
  items or calls) is restarted before it is given items: nothing is lost, no error is counted.

Workers ignore SIGTERM and SIGINT: a signal to the whole process group (``timeout``, Slurm, systemd,
Ctrl-C in a terminal) is the trainer's to handle; the workers go on scoring the update in flight, and
the trainer stops them after it has saved its checkpoint (they also exit when the trainer is gone).

A batch therefore takes at most about ``ceil(n / workers) * (timeout_s + restart)``; ``batch_timeout_s``
caps it further (unfinished items then score 0.0 as timeouts). ``score(..., stop=f)`` polls ``f()`` at
least every half second and, once it is true, stops at once: the items in flight and those not begun
score 0.0 as timeouts and count in ``interrupted`` (a preempted run gives up its update this way).
Each worker's address space may grow by ``memory_limit_mb`` beyond what it holds after loading the
function (Linux/macOS ``RLIMIT_AS``).

The reward function is ``"math"`` (:func:`sppo_rl.llm.rewards.verify.verify_math`), ``"integer"``
(:func:`sppo_rl.llm.rewards.verify.verify_integer`), ``"boxed-or-last-number"``
(:func:`sppo_rl.llm.rewards.verify.verify_boxed_or_last_number`), a path ``"path/to/file.py:function"``, a module
``"package.module:function"``, or a picklable module-level callable. The worker tells its calling
convention from its signature (:func:`call_style`):

- ``fn(response: str, ground_truth: str) -> float`` (this project's; the built-ins), called per item;
- TRL's, any function with a parameter named ``completions``: ``fn(completions: list[str], **columns)
  -> list[float]``, called by keyword with lists over the batch: ``completions``, ``prompts`` (the
  prompts as the data gives them: text or chat messages), ``rendered_prompts`` (the text the model
  read: the prompt with the run's chat template, system prompt and instruction), ``answer`` (the reference the data's answer
  column gives, as the built-ins get it) and every other column of the data (``solution``, ``level``,
  ...: ``Example.meta``). A function without ``**kwargs`` gets only the columns it names (a column it
  names that the data lacks is an error for each item). The batch here is one item (lists of length
  1), so every item keeps its own deadline and a failure costs that item only; a function that needs
  several completions at once (a diversity bonus) does not fit.

Several functions ``f_1 .. f_k`` (a list, or one string ``"a,b"``) with weights ``w_j >= 0`` score
each item ``R = sum_j w_j r_j / sum_j w_j`` (weights default to 1): the weights are normalised, so
``R`` stays an outcome in ``[0, 1]`` (TRL sums them unnormalised; for group-normalised advantages the
scale makes no difference). An item is valid only when every function gave it a valid score;
``ScoreResult.parts`` holds each function's score (NaN where it failed) and ``fn_errors`` each one's
error count. The first failure of a function that raises is shown once with its traceback on stderr;
every later one is counted.

The reward contract: a score is an outcome in ``[0, 1]`` (1 right, 0 wrong; partial credit in between;
a bool counts as 0 or 1). The trainers rely on it: SPPO's critic is trained with binary cross-entropy
on it and reports accuracy from it. A value outside ``[0, 1]`` (a penalty of -5, a score out of 10) is
refused as invalid: the item scores 0.0 and counts in ``errors`` like any other verifier error, with a
warning on stderr the first time, so it can neither pass as a reward nor be logged as an accuracy.
Rescale such a function's output into ``[0, 1]``.

Validity. Every failure above (an exception, a timeout, a dead worker, a value that is no number in
``[0, 1]``, an interrupted item) leaves the item's outcome unknown: ``ScoreResult.valid`` is False for
it, and the trainer masks such a rollout (no advantage, no loss, left out of group statistics and the
critic's targets) instead of paying it as a failure. A malformed *answer* is not a failure of the
verifier: a function that returns 0.0 for it gives a valid score of 0.
"""

from __future__ import annotations

import math
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from sppo_rl.llm.rewards.specs import RewardFnError, _resolve_spec, spec_name, split_specs
from sppo_rl.llm.rewards.worker import RewardRangeError, RewardWorkerError, _shutdown, _Worker
from sppo_rl.runtime.run import RunError

MAX_ERROR_SAMPLES = 5


@dataclass
class ScoreResult:
    """Scores of one batch.

    Attributes:
        scores: ``float32 [n]``; 0.0 for every item that failed.
        valid: ``bool [n]``; True where the function returned a score in ``[0, 1]``, False for every item
            counted in ``errors`` (its outcome is unknown; the 0.0 in ``scores`` is a placeholder).
        errors: items that raised, hung, crashed the worker or returned a non-finite value, a
            non-number or a number outside [0, 1] (timeouts included).
        timeouts: items that ran past ``timeout_s`` (or the batch deadline, or were cut off by ``stop``).
        interrupted: items not scored because ``stop`` became true (counted in timeouts and errors).
        seconds: wall time of the call.
        error_samples: the first few error messages, ``"item 3: ZeroDivisionError: ..."``.
        parts: ``float32 [n, k]``, function ``j``'s score of item ``i`` (NaN where it failed or the item
            was not scored); ``scores`` is their weighted mean where every part is valid.
        fn_errors: per function, the items it failed on (raised, or returned no number in [0, 1]);
            timeouts and dead workers are counted in ``errors`` only.
    """

    scores: np.ndarray
    valid: np.ndarray = None  # type: ignore[assignment]  (filled in by __post_init__)
    errors: int = 0
    timeouts: int = 0
    interrupted: int = 0
    seconds: float = 0.0
    error_samples: list[str] = field(default_factory=list)
    parts: np.ndarray = None  # type: ignore[assignment]  (filled in by __post_init__)
    fn_errors: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.valid is None:
            self.valid = np.ones(len(self.scores), dtype=bool)
        if self.parts is None:
            self.parts = np.full((len(self.scores), max(1, len(self.fn_errors))), np.nan, dtype=np.float32)


# --------------------------------------------------------------------------------------- scorer


def _check_inputs(
    responses: Sequence[str], truths: Sequence[str], columns: Sequence[Mapping[str, Any]] | None
) -> None:
    """``ValueError`` unless ``responses``, ``truths`` (and ``columns``) have one entry per item;
    ``TypeError`` for a response or truth that is no ``str``."""
    if len(responses) != len(truths):
        raise ValueError(f"{len(responses)} responses but {len(truths)} ground truths")
    if columns is not None and len(columns) != len(responses):
        raise ValueError(f"{len(responses)} responses but {len(columns)} column rows")
    for name, seq in (("response", responses), ("ground truth", truths)):
        for i, x in enumerate(seq):
            if not isinstance(x, str):
                raise TypeError(f"{name} {i} is {type(x).__name__}, not str")


@dataclass
class _Batch:
    """One :meth:`RewardScorer.score` call in progress: its items, those no worker holds yet (``todo``,
    in order), and the result so far."""

    responses: Sequence[str]
    truths: Sequence[str]
    columns: Sequence[Mapping[str, Any]]
    result: ScoreResult
    todo: deque[int]

    def items(self, indices: list[int]) -> list[tuple[int, str, str, Mapping[str, Any]]]:
        """The items ``indices`` as a worker is sent them: ``(i, response, truth, columns)``."""
        return [(i, self.responses[i], self.truths[i], self.columns[i]) for i in indices]

    def fail(self, i: int, message: str, timeout: bool = False) -> None:
        """Item ``i`` failed: invalid, counted in ``errors`` (and ``timeouts``), its message kept among
        the first :data:`MAX_ERROR_SAMPLES`."""
        result = self.result
        result.valid[i] = False
        result.errors += 1
        result.timeouts += int(timeout)
        if len(result.error_samples) < MAX_ERROR_SAMPLES:
            result.error_samples.append(f"item {i}: {message}")


class RewardScorer:
    """Score responses against ground truths in ``workers`` persistent processes.

    Args:
        fn: ``"math"``, ``"integer"``, ``"path/to/file.py:function"``, ``"module:function"`` or a
            picklable module-level callable, ``fn(response, ground_truth) -> float`` or TRL-style
            ``fn(completions, **columns) -> list[float]``; or several of them, a list or one string
            ``"a,b"`` (see the module docstring).
        weights: one weight ``>= 0`` per function (their sum ``> 0``); default all 1.
        timeout_s: seconds each item may take; past that its worker is killed and restarted. The
            built-in ``"math"`` verifier also gets an internal deadline of ``0.8 * timeout_s``, which
            ends slow symbolic work without a restart (scoring 0.0, not counted as a timeout).
        workers: number of processes.
        memory_limit_mb: address space each worker may add after loading ``fn``; ``None``: no limit.
        start_timeout_s: seconds a worker may take to start and load ``fn``.
        batch_timeout_s: optional cap on one :meth:`score` call.

    Raises:
        RewardFnError: at construction, before any work, if ``fn`` cannot be loaded.

    Use as a context manager or call :meth:`close`; workers are also stopped at interpreter exit.
    """

    def __init__(
        self,
        fn: str | Callable[..., Any] | Sequence[str | Callable[..., Any]] = "math",
        timeout_s: float = 5.0,
        workers: int = 1,
        *,
        weights: Sequence[float] | None = None,
        memory_limit_mb: int | None = 4096,
        start_timeout_s: float = 60.0,
        batch_timeout_s: float | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        fns = split_specs(fn)
        specs = [_resolve_spec(f) for f in fns]
        self.weights = [1.0] * len(fns) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(fns):
            raise RewardFnError(f"{len(self.weights)} reward weights for {len(fns)} reward functions")
        if not all(math.isfinite(w) and w >= 0 for w in self.weights) or sum(self.weights) <= 0:
            raise RewardFnError(f"reward weights must be >= 0 with a positive sum, got {self.weights}")
        if not math.isfinite(
            sum(self.weights)
        ):  # each finite, their sum past the largest float (1e308 twice):
            top = math.frexp(max(self.weights))[1]  # scaled by a power of two, exactly; R is unchanged
            self.weights = [math.ldexp(w, -top) for w in self.weights]
        names = [spec_name(f) for f in fns]
        self.names = [n if names.count(n) == 1 else f"{n}_{j}" for j, n in enumerate(names)]
        kind, spec = ("several", specs) if len(specs) > 1 else specs[0]
        self.fn = fn
        self._traceback_shown = False
        self.timeout_s = float(timeout_s)
        self.batch_timeout_s = batch_timeout_s
        self.restarts = 0
        self._range_warned = False
        args = (kind, spec, 0.8 * self.timeout_s, memory_limit_mb)
        self._workers = [_Worker(args, start_timeout_s) for _ in range(workers)]
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        try:
            for w in self._workers:
                w.start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop the workers; the scorer cannot be used afterwards."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (they change when a worker is restarted)."""
        return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.is_alive()]

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------- scoring

    def _restart(self, w: _Worker) -> None:
        w.kill()
        self.restarts += 1
        w.start()

    def score(
        self,
        responses: Sequence[str],
        truths: Sequence[str],
        *,
        stop: Callable[[], bool] | None = None,
        columns: Sequence[Mapping[str, Any]] | None = None,
    ) -> ScoreResult:
        """Score ``responses[i]`` against ``truths[i]``; see :class:`ScoreResult`. ``columns[i]`` (picklable
        values: ``prompts``, ``rendered_prompts`` and the data's other columns) goes to TRL-style functions
        as keyword lists.

        Items go to the workers in chunks; each worker answers its items in order. ``stop`` is polled
        at least every 0.5 s; once it returns True, the items left score 0.0 and count in
        ``interrupted`` (workers busy with an item are killed, and restarted by the next call). If this
        call is interrupted (``KeyboardInterrupt``) or a worker cannot be restarted, the scorer closes
        itself and re-raises.

        Steps: :func:`_check_inputs`, then :meth:`_run` over a :class:`_Batch` until every item is
        scored (:meth:`_take`) or failed (:meth:`_Batch.fail`); an exception on the way
        :meth:`_abandon`\\ s the workers mid-batch.
        """
        if self.closed:
            raise RuntimeError("RewardScorer is closed")
        _check_inputs(responses, truths, columns)
        t0 = time.monotonic()
        n = len(responses)
        result = ScoreResult(np.zeros(n, dtype=np.float32), fn_errors=[0] * len(self.names))
        if n == 0:
            return result
        batch = _Batch(
            responses, truths, columns if columns is not None else [{}] * n, result, deque(range(n))
        )
        try:
            self._run(batch, stop, t0)
        except BaseException:
            self._abandon()
            raise
        result.seconds = time.monotonic() - t0
        return result

    def _run(self, batch: _Batch, stop: Callable[[], bool] | None, t0: float) -> None:
        """Until every item of ``batch`` is answered or failed: stop at once if ``stop()`` says so
        (:meth:`_interrupt`), give idle workers a chunk each (:meth:`_hand_out`), give up past the batch
        deadline (:meth:`_expire`), else wait for replies or a worker's deadline (:meth:`_collect`)."""
        chunk = max(1, min(64, math.ceil(len(batch.responses) / (4 * len(self._workers)))))
        batch_deadline = t0 + self.batch_timeout_s if self.batch_timeout_s else math.inf
        poll_s = 0.5 if stop is not None else math.inf
        while batch.todo or any(w.pending for w in self._workers):
            if stop is not None and stop():
                self._interrupt(batch)
                return
            self._hand_out(batch, chunk)
            busy = [w for w in self._workers if w.pending]
            now = time.monotonic()
            if now >= batch_deadline:
                self._expire(batch, busy)
                return
            wait_s = max(0.0, min(min(w.deadline for w in busy), batch_deadline, now + poll_s) - now)
            self._collect(batch, busy, wait_s)

    def _hand_out(self, batch: _Batch, chunk: int) -> None:
        """Give each idle worker the next ``chunk`` items of ``batch.todo`` (a dead one restarted first).
        A worker found dead on sending is restarted and sent the items again; if that fails too, they
        fail."""
        for w in self._workers:
            if not w.pending and batch.todo:
                if not w.alive():  # killed by an earlier stop, or died while idle
                    self._restart(w)
                indices = [batch.todo.popleft() for _ in range(min(chunk, len(batch.todo)))]
                items = batch.items(indices)
                if not w.send(items, self.timeout_s):  # died just now: a new one gets the items
                    self._restart(w)
                    if not w.send(items, self.timeout_s):
                        for i in indices:
                            batch.fail(i, "reward worker died before it was given the item")

    def _collect(self, batch: _Batch, busy: list[_Worker], wait_s: float) -> None:
        """Wait up to ``wait_s`` for replies, then read every busy worker's (:meth:`_receive`); a worker
        past its item's deadline with nothing to read fails that item as a timeout and is restarted,
        its other items going back to the front of ``batch.todo``."""
        ready = wait([w.conn for w in busy if w.conn is not None], timeout=wait_s)
        for w in busy:
            if w.conn in ready:
                self._receive(w, batch)
            elif time.monotonic() >= w.deadline and not (w.conn is not None and w.conn.poll()):
                i = w.pending.popleft()
                batch.fail(i, f"timed out after {self.timeout_s} s", timeout=True)
                batch.todo.extendleft(reversed(w.pending))
                self._restart(w)

    def _interrupt(self, batch: _Batch) -> None:
        """``stop()`` became true: the replies already waiting still count; every item still held by a
        worker (which is killed) or not given out fails as a timeout and counts in ``interrupted``."""
        cut = "scoring stopped (the run is being preempted)"
        for w in self._workers:
            if w.pending:
                self._receive(w, batch)  # results already waiting still count
            if w.pending:
                for i in w.pending:
                    batch.fail(i, cut, timeout=True)
                    batch.result.interrupted += 1
                w.kill()
        for i in batch.todo:
            batch.fail(i, cut, timeout=True)
            batch.result.interrupted += 1
        batch.todo.clear()

    def _expire(self, batch: _Batch, busy: list[_Worker]) -> None:
        """The batch deadline passed: the replies already waiting still count; every item still held
        (its worker restarted) or not given out fails as a timeout."""
        late = f"batch deadline of {self.batch_timeout_s} s passed"
        for w in busy:
            self._receive(w, batch)  # results already waiting still count
            if w.pending:
                for i in w.pending:
                    batch.fail(i, late, timeout=True)
                self._restart(w)
        for i in batch.todo:
            batch.fail(i, late, timeout=True)
        batch.todo.clear()

    def _abandon(self) -> None:
        """An interrupt (or a failed restart) left workers mid-batch: kill those, and close the scorer
        if any worker is left without a process."""
        for w in self._workers:
            if w.pending:
                w.kill()
        if any(w.conn is None for w in self._workers):
            self.close()

    def _take(self, batch: _Batch, i: int, value: Any) -> None:
        """Combine item ``i``'s reply ``(parts, traceback)`` (:func:`_score_parts`) into its score
        ``sum_j w_j r_j / sum_j w_j``, or fail it with its first function's error; each function's score
        goes to ``parts``, each error to ``fn_errors``."""
        parts, tb = value
        result = batch.result
        bad = [(j, p) for j, p in enumerate(parts) if isinstance(p, str)]
        for j, p in enumerate(parts):
            if isinstance(p, str):
                result.fn_errors[j] += 1
            else:
                result.parts[i, j] = p
        if tb is not None and not self._traceback_shown:
            self._show_traceback(bad, tb)
        if bad:
            j, message = bad[0]
            batch.fail(i, message if len(parts) == 1 else f"{self.names[j]}: {message}")
            if message.startswith(RewardRangeError.__name__) and not self._range_warned:
                self._warn_out_of_range(j, message)
            return
        w = self.weights
        result.scores[i] = sum(wj * float(p) for wj, p in zip(w, parts)) / sum(w)

    def _show_traceback(self, bad: list[tuple[int, str]], tb: str) -> None:
        """The first traceback a worker sent, once per scorer, under the name of the function that raised."""
        self._traceback_shown = True
        j = next((j for j, p in bad if not p.startswith(RewardRangeError.__name__)), 0)
        print(
            f"[sppo-rl] reward function {self.names[j]!r} failed (its first traceback, shown once; "
            f"every failure counts in verifier_errors):\n{tb.rstrip()}",
            file=sys.stderr,
        )

    def _warn_out_of_range(self, j: int, message: str) -> None:
        """The first score outside ``[0, 1]``, once per scorer."""
        self._range_warned = True
        print(
            f"[sppo-rl] warning: reward function {self.names[j]!r} {message.split(': ', 1)[-1]}; "
            "rewards must be in [0, 1]: such items score 0 and count as verifier errors",
            file=sys.stderr,
        )

    def _receive(self, w: _Worker, batch: _Batch) -> None:
        """Drain every message already waiting on ``w``'s pipe."""
        assert w.conn is not None
        while w.pending:
            try:
                if not w.conn.poll():
                    return
                message = w.conn.recv()
            except (EOFError, OSError):
                i = w.pending.popleft()
                code = None
                if w.proc is not None:
                    w.proc.join(2.0)
                    code = w.proc.exitcode
                batch.fail(i, f"reward worker died (exit code {code})")
                batch.todo.extendleft(reversed(w.pending))
                self._restart(w)
                return
            try:
                kind, i, value = message
            except (TypeError, ValueError):
                continue  # not a reply at all: dropped
            if i not in w.pending:
                continue  # a reply to no item this worker holds (answered already, or never given): dropped
            w.pending.remove(i)  # replies are matched to items by their index, not by their order
            if kind == "ok":
                self._take(batch, i, value)
            else:
                batch.fail(i, value)
            w.deadline = time.monotonic() + self.timeout_s

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._workers)} workers"
        return f"RewardScorer(fn={self.fn!r}, timeout_s={self.timeout_s}, {state})"


def start_scorer(reward_fn: str, timeout_s: float, weights: tuple[float, ...] | None = None) -> RewardScorer:
    """The reward workers, started (the function loaded) before any work: a reward function that cannot
    be loaded, or whose file exits, crashes or hangs when imported, is refused in one line. ``reward_fn``
    may name several functions, comma-separated, weighted by ``weights``."""
    try:
        return RewardScorer(reward_fn, timeout_s=timeout_s, weights=weights)
    except (RewardFnError, RewardWorkerError) as e:
        raise RunError(f"--reward-fn {reward_fn}: {e}") from None
