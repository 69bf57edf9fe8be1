"""A :class:`~sppo_rl.llm.rollout.base.Rollout` served by a child process: :class:`RolloutWorker`.

The learner keeps training while its sampler generates: the worker owns its backend (an
:class:`~sppo_rl.llm.rollout.hf.HFRollout` on a replica, or a ``VLLMRollout``, made in the child by a
picklable ``build`` such as :func:`replica_builder`), its own threads and, on CPU, its own core.

Contract.

- **Order.** The child serves its messages one at a time in the order they were sent (FIFO):
  ``("weights", ...)`` loads a push, ``("generate", id, ...)`` answers ``(id, batch)`` or
  ``(id, error)``, ``("stop",)`` closes the backend and exits. A push is therefore served after every
  request submitted before it and before every request submitted after it. Threads in the child read
  every message as it comes and send each answer, so neither side's send waits on the other and the
  next request starts while an answer waits to be read.
- **Versions.** :attr:`RolloutWorker.version` counts the :meth:`~RolloutWorker.update_weights` calls
  made so far; a :class:`Ticket`'s ``version`` is that count when it was submitted: the weights that
  served it. Results may be collected in any order.
- **Weights travel as copies**: each push is copied into one flat CPU buffer per dtype, allocated in
  shared memory (``torch.multiprocessing``), so the caller may change its tensors at once; the child
  loads views of it. A push the backend refuses (an unknown name) makes every later request fail with
  its message, until a complete push loads. Answers travel by value (plain pickle): one sent is read
  even after the child has exited.
- **Errors.** An exception in the child's ``generate`` is raised by :meth:`Ticket.result` (its own type
  when it pickles, else :class:`~sppo_rl.runtime.run.RunError`; the child's traceback is the cause); the
  worker keeps serving.
- **Signals.** The child ignores SIGTERM and SIGINT (blocked from its birth): a signal to the process
  group is the parent's to handle, and the parent closes the worker.
- **Death.** A child that dies (SIGKILL, the OOM killer) makes every unanswered :meth:`Ticket.result`,
  and every later call, raise :class:`WorkerDied` with one line naming the worker, its pid and how it
  ended. The parent polls its connection with a timeout and checks the process, so nothing hangs.
- **No orphans.** The child exits when its parent does: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux; it
  fires when the *thread* that started the worker ends, so start it from the main thread) and the end of
  its connection. :meth:`RolloutWorker.close` (also run at exit, waiting 5 s) sends stop, joins, then
  kills.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import itertools
import multiprocessing as mp
import numbers
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that send tensors through shared memory)
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.rollout.base import Rollout, RolloutBatch, SamplingParams, Seeds
from sppo_rl.runtime.run import RunError, RunFailed

_OWNED_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
PROCESS_NAME = "sppo-rollout"
"""The worker process's name (Linux), to tell it from the run's reward workers."""
_Layout = list[tuple[str, int, int, tuple[int, ...]]]  # (name, buffer, offset, shape) of each pushed tensor


def _quiet_resource_sharer(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``sys.excepthook`` without the connection errors of multiprocessing's resource-sharer thread: a
    push's shared memory reaches the child as a file descriptor that thread hands over, and a child killed
    before taking it makes the thread report a reset connection; the worker's death is said once, by
    :class:`WorkerDied`."""

    def hook_(kind: type[BaseException], value: BaseException, tb: Any) -> Any:
        sharer = any(f.filename.endswith("resource_sharer.py") for f in traceback.extract_tb(tb))
        if issubclass(kind, (OSError, EOFError)) and sharer:
            return None
        return hook(kind, value, tb)

    hook_.quiet_resource_sharer = True  # type: ignore[attr-defined]  # installed once (see RolloutWorker)
    return hook_


class WorkerDied(RunFailed):
    """The rollout worker's process ended while a request was unanswered or a call was made: the run stops
    (``sppo-rl`` exits 1 with this line; ``--resume`` goes on from the last checkpoint)."""


class _ChildTraceback(Exception):
    """The child's traceback: the cause of what :meth:`Ticket.result` raises."""


# ------------------------------------------------------------------------------------------ child


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent ends (and name it :data:`PROCESS_NAME`, what
    ``ps`` and ``/proc/PID/comm`` show); leave now if the parent has ended already."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            libc.prctl(_PR_SET_NAME, ctypes.c_char_p(PROCESS_NAME.encode()), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def _read_all(conn: Connection, inbox: queue.Queue[tuple[Any, ...]]) -> None:
    """Child's reader thread: every message into ``inbox`` as it comes (so the parent never blocks on a
    send); the end of the connection means the parent is gone: leave at once (exit code 3 if a message
    could not be read)."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(3)
        inbox.put(msg)
        if msg[0] == "stop":
            return


def _send_all(conn: Connection, outbox: queue.Queue[tuple[Any, ...] | None]) -> None:
    """Child's sender thread: each answer to the parent in order until None, so the child goes on to
    the next request while an answer waits to be read; the connection's end (parent gone): leave."""
    while (msg := outbox.get()) is not None:
        try:
            _answer(conn, msg)
        except (EOFError, OSError):
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(3)


def _describe(e: BaseException) -> str:
    return (f"{type(e).__name__}: {e}".splitlines() or [""])[0][:500]


def _unpack(buffers: list[Tensor], layout: _Layout) -> list[tuple[str, Tensor]]:
    """The ``(name, tensor)`` pairs of a push: views of its flat buffers (see :func:`_pack`)."""
    return [(name, buffers[g][o : o + torch.Size(shape).numel()].view(shape)) for name, g, o, shape in layout]


def _serve(conn: Connection, build: Callable[[], Rollout], threads: int, parent_pid: int) -> None:
    """The child: build the backend, answer ``("ready",)`` or ``("error", text)``, then serve messages
    in order until ``("stop",)``."""
    for sig in _OWNED_SIGNALS:  # blocked since the fork (see RolloutWorker.__init__): ignored, then unblocked
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _OWNED_SIGNALS)
    _die_with_parent(parent_pid)
    torch.set_num_threads(threads)
    try:
        backend = build()
    except BaseException as e:
        _answer(conn, ("error", _describe(e)))
        return
    _answer(conn, ("ready",))
    inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
    outbox: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
    threading.Thread(target=_read_all, args=(conn, inbox), daemon=True).start()
    sender = threading.Thread(target=_send_all, args=(conn, outbox), daemon=True)
    sender.start()
    weights_problem: str | None = None
    pushes = 0
    while True:
        msg = inbox.get()
        if msg[0] == "stop":
            outbox.put(None)
            sender.join()
            with contextlib.suppress(Exception):
                backend.close()
            return
        if msg[0] == "weights":
            _, buffers, layout, partial = msg
            pushes += 1
            try:
                backend.update_weights(_unpack(buffers, layout), partial=partial)
                weights_problem = weights_problem if partial else None
            except Exception as e:
                weights_problem = f"weight push {pushes} was not loaded: {_describe(e)}"
            del buffers
            continue
        _, request_id, prompts, params, seeds = msg
        try:
            if weights_problem is not None:
                raise RunError(weights_problem)
            outbox.put((request_id, backend.generate(prompts, params, seeds).to("cpu"), None, None))
        except Exception as e:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
            try:  # the same exception in the parent if it survives pickling, else its text
                portable: Exception | None = pickle.loads(pickle.dumps(e))
            except Exception:
                portable = None
            outbox.put((request_id, None, portable and e, f"{tb}{_describe(e)}"))


def _answer(conn: Connection, msg: tuple[Any, ...]) -> None:
    """Send ``msg`` to the parent by value (plain pickle, no shared memory: an answer never needs the
    child alive once sent, e.g. after it served stop and exited)."""
    conn.send_bytes(pickle.dumps(msg))


# ------------------------------------------------------------------------------------------ parent


def _pack(named_tensors: Iterable[tuple[str, Tensor]]) -> tuple[list[Tensor], _Layout]:
    """One flat CPU buffer per dtype, in shared memory, holding a copy of every tensor; and where each lies."""
    items = [(name, t.detach()) for name, t in named_tensors]
    dtypes = list(dict.fromkeys(t.dtype for _, t in items))
    sizes = {d: sum(t.numel() for _, t in items if t.dtype == d) for d in dtypes}
    buffers = [torch.empty(sizes[d], dtype=d).share_memory_() for d in dtypes]  # filled once, sent as is
    layout: _Layout = []
    offsets = dict.fromkeys(dtypes, 0)
    for name, t in items:
        group, offset = dtypes.index(t.dtype), offsets[t.dtype]
        buffers[group][offset : offset + t.numel()].copy_(t.reshape(-1))
        layout.append((name, group, offset, tuple(t.shape)))
        offsets[t.dtype] += t.numel()
    return buffers, layout


class Ticket:
    """A generate request in flight. ``version``: the worker's weight version that serves it (the
    number of :meth:`RolloutWorker.update_weights` calls made before it was submitted)."""

    def __init__(self, worker: RolloutWorker, request_id: int, version: int) -> None:
        self.worker, self.request_id, self.version = worker, request_id, version
        self._outcome: tuple[RolloutBatch | None, BaseException | None] | None = None

    def result(self) -> RolloutBatch:
        """The batch, waiting for it; raises what the child's ``generate`` raised, or
        :class:`WorkerDied` (one line) if the process ended first."""
        while self._outcome is None:
            self.worker._receive(block=True)
        batch, error = self._outcome
        if error is not None:
            raise error
        assert batch is not None
        return batch

    def done(self) -> bool:
        """Whether :meth:`result` would return (or raise) at once; never blocks."""
        if self._outcome is None:
            self.worker._receive(block=False)
        return self._outcome is not None


class RolloutWorker:
    """A rollout backend served by one child process (spawned), which calls ``build()`` to make it
    (see the module's contract).

    Args:
        build: a picklable callable returning the backend, run in the child (:func:`replica_builder`).
        tokenizer: the caller's tokenizer (the child decodes with its own; kept for callers).
        threads: the child's ``torch.set_num_threads``.
        name: how messages name the worker.
        start_timeout_s: how long the constructor waits for ``build()``.

    The constructor returns once the backend is built; it raises :class:`WorkerDied` if the child ends
    first, :class:`~sppo_rl.runtime.run.RunError` with the child's message if ``build()`` raises, and
    leaves no process behind either way. ``sleep`` and ``wake_up`` are no-ops: the worker's memory is
    its own.
    """

    shares_actor = False

    def __init__(
        self,
        build: Callable[[], Rollout],
        tokenizer: PreTrainedTokenizerBase,
        *,
        threads: int = 1,
        name: str = "rollout worker",
        start_timeout_s: float = 1800.0,
    ) -> None:
        self.tokenizer, self.name, self.version = tokenizer, name, 0
        self._ids = itertools.count()
        self._waiting: dict[int, Ticket] = {}
        self._send_lock, self._receive_lock = threading.Lock(), threading.Lock()
        self._ended: str | None = None  # why no call is served any more
        if not getattr(sys.excepthook, "quiet_resource_sharer", False):
            sys.excepthook = _quiet_resource_sharer(sys.excepthook)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_serve, args=(child, build, threads, os.getpid()), daemon=True)
        # The child inherits this thread's signal mask; multiprocessing's resource tracker, started with
        # the first spawned process, unblocks both signals once it is up: start it first.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _OWNED_SIGNALS)
        try:
            self._proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        child.close()
        atexit.register(self.close, 5.0)  # runs before multiprocessing's hook, which would wait forever
        try:
            self._await_ready(start_timeout_s)
        except BaseException:
            self._kill()
            raise

    @property
    def pid(self) -> int:
        assert self._proc.pid is not None
        return self._proc.pid

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(_POLL_S):
            if not self._proc.is_alive():
                break
            if time.monotonic() > deadline:
                raise RunError(f"{self.name} (pid {self.pid}) did not build its backend in {timeout_s:.0f} s")
        try:
            msg = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise WorkerDied(self._died(" while building its backend")) from None
        if msg[0] == "error":
            raise RunError(f"{self.name} could not build its backend: {msg[1]}")

    def _died(self, detail: str = "") -> str:
        """One line: the worker, its pid, how it ended (its exit code or signal)."""
        self._proc.join(5.0)
        code = self._proc.exitcode
        how = "its connection closed" if code is None else f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
        return f"{self.name} (pid {self.pid}) died{detail} ({how})"

    # -------------------------------------------------------------------------------- the protocol

    def submit(self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None) -> Ticket:
        """Queue a ``generate`` and return at once; :meth:`Ticket.result` waits for it."""
        seeds = seeds if seeds is None or isinstance(seeds, numbers.Integral) else [int(s) for s in seeds]
        with self._send_lock:
            ticket = Ticket(self, next(self._ids), self.version)
            self._waiting[ticket.request_id] = ticket
            try:
                self._send(("generate", ticket.request_id, list(prompts), params, seeds))
            except BaseException:  # not sent: nothing will answer it
                self._waiting.pop(ticket.request_id, None)
                raise
        return ticket

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None) -> RolloutBatch:
        """``submit(...).result()``."""
        return self.submit(prompts, params, seeds).result()

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], partial: bool = False) -> None:
        """Push copies of ``(name, tensor)`` pairs (the caller may change its tensors as soon as this
        returns); served in order with the requests (see the module's contract). ``version`` += 1."""
        buffers, layout = _pack(named_tensors)
        with self._send_lock:
            self._send(("weights", buffers, layout, bool(partial)))
            self.version += 1

    def sleep(self) -> None:
        """Nothing to free in this process: the worker's memory is its own."""

    wake_up = sleep

    def _send(self, msg: tuple[Any, ...]) -> None:
        if self._ended is not None:
            raise WorkerDied(self._ended)
        try:
            self._conn.send(msg)
        except OSError:  # BrokenPipeError: the child is gone
            self._receive(block=False)
            self._end(self._died())
            raise WorkerDied(self._ended or "") from None

    def _receive(self, block: bool) -> None:
        """Take the answers that have arrived (waiting up to :data:`_POLL_S` for one when ``block``) and
        hand them to their tickets; a dead child ends every unanswered one."""
        if not self._receive_lock.acquire(blocking=block):
            return
        try:
            if self._ended is not None and self._waiting:
                self._end(self._ended)
            while self._ended is None:
                if not self._conn.poll(_POLL_S if block else 0):
                    if block and not self._proc.is_alive() and not self._conn.poll(0):
                        self._end(self._died(f" with {len(self._waiting)} request(s) unanswered"))
                    return
                try:
                    request_id, batch, error, tb = pickle.loads(self._conn.recv_bytes())
                except (EOFError, OSError):
                    self._end(self._died(f" with {len(self._waiting)} request(s) unanswered"))
                    return
                ticket = self._waiting.pop(request_id)
                if error is None and batch is None:
                    error = RunError(f"{self.name} (pid {self.pid}): {tb.splitlines()[-1]}")
                if error is not None:
                    error.__cause__ = _ChildTraceback(f"in {self.name} (pid {self.pid}):\n{tb}")
                ticket._outcome = (batch, error)
                block = False  # one answer is enough: the caller checks its ticket
        finally:
            self._receive_lock.release()

    def _end(self, why: str) -> None:
        """No call is served any more; every unanswered ticket raises :class:`WorkerDied` ``why``."""
        self._ended = self._ended or why
        for ticket in self._waiting.values():
            ticket._outcome = (None, WorkerDied(self._ended))
        self._waiting.clear()

    def close(self, timeout_s: float = 30.0) -> None:
        """Send stop (served after every request already submitted: their answers are still taken),
        wait up to ``timeout_s`` for the child to exit, then kill it. Idempotent; the child is reaped."""
        atexit.unregister(self.close)
        if self._ended is None:
            with self._send_lock, contextlib.suppress(OSError, EOFError, ValueError):
                self._conn.send(("stop",))
            deadline = time.monotonic() + timeout_s
            while self._waiting and self._ended is None and time.monotonic() < deadline:
                self._receive(block=True)
            self._proc.join(max(0.0, deadline - time.monotonic()))
        self._end(f"{self.name} (pid {self.pid}) was closed")
        self._kill()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(10.0)
        with self._receive_lock:  # not under another thread's poll
            self._conn.close()
        atexit.unregister(self.close)

    def __enter__(self) -> RolloutWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ builders


def _build_replica(
    actor_path: str,
    dtype: str,
    pad_id: int,
    autocast: str | None,
    backend: str,
    vllm_kwargs: dict[str, Any] | None,
    device: str,
    sampler: Callable[..., Rollout] | None,
    adapted: list[str] | None,
) -> Rollout:
    """In the child: the sampler of :func:`replica_builder`."""
    from sppo_rl.llm.models.core import float32_head, load_actor, quiet_transformers
    from sppo_rl.llm.models.tiny import load_tokenizer

    quiet_transformers()
    tokenizer = load_tokenizer(actor_path)
    if backend == "vllm":
        from sppo_rl.llm.rollout.vllm import VLLMRollout

        engine = VLLMRollout(actor_path, tokenizer, **(vllm_kwargs or {}))
        if adapted is not None:  # LoRA: each vLLM layer a sync touches must get all its parts
            engine.check_partial_sync(adapted)
        return engine
    from sppo_rl.llm.rollout.hf import HFRollout

    # the parameters keep requiring grad, as the trained actor's do: torch's CPU kernels round the
    # log-probs differently (~5e-7) for weights that do not, and the replica must sample what the actor would
    replica = load_actor(actor_path, dtype=dtype, device=device).eval()
    cast = getattr(torch, autocast) if autocast else None
    if cast is not None and sampler is None:  # mixed precision: the LM head in float32, as the actor's
        float32_head(replica)
    make = sampler if sampler is not None else HFRollout
    return make(replica, tokenizer, add_special_tokens=False, pad_id=pad_id, autocast=cast)


def replica_builder(
    actor_path: str,
    dtype: str,
    pad_id: int,
    autocast: str | None = None,
    backend: str = "hf",
    vllm_kwargs: dict[str, Any] | None = None,
    device: str = "cpu",
    sampler: Callable[..., Rollout] | None = None,
    adapted: list[str] | None = None,
) -> Callable[[], Rollout]:
    """A picklable ``build`` for :class:`RolloutWorker`: in the child, the tokenizer of ``actor_path``
    and, for ``backend="hf"``, an :class:`~sppo_rl.llm.rollout.hf.HFRollout` (or ``sampler``, a class or
    picklable callable taking its arguments: the latent backend) on a replica loaded from
    ``actor_path`` in ``dtype`` on ``device`` (prompts taken as rendered, ``pad_id`` the run's, forward
    passes under ``autocast``, e.g. ``"bfloat16"``, its LM head then in float32: ``--precision bf16``); for ``backend="vllm"``, ``VLLMRollout(actor_path,
    tokenizer, **vllm_kwargs)``, its partial sync checked against the LoRA-``adapted`` tensor names."""
    if backend not in ("hf", "vllm"):
        raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")
    return functools.partial(
        _build_replica,
        str(actor_path),
        dtype,
        int(pad_id),
        autocast,
        backend,
        vllm_kwargs,
        device,
        sampler,
        adapted,
    )
