"""The launcher's variables: what torchrun or deepspeed tells each process it starts (its rank, the
number of processes), read and checked in one place, before anything is read or written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypedDict

LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK")
"""What a launcher (torchrun, deepspeed) tells each process it starts; unset, the process is alone."""
MAX_PROCESSES = 1_000_000
"""The largest ``WORLD_SIZE`` taken (no job has a million ranks; a larger value is a stale or garbled one)."""


class LauncherEnv(TypedDict):
    """:func:`launcher_env`'s answer: ``LOCAL_WORLD_SIZE`` None where the launcher did not set it."""

    WORLD_SIZE: int
    RANK: int
    LOCAL_WORLD_SIZE: int | None
    LOCAL_RANK: int


def launcher_env(environ: Mapping[str, str] | None = None) -> LauncherEnv:
    """The launcher's variables (:data:`LAUNCHER_VARIABLES`) of ``environ`` (default ``os.environ``)
    as integers, checked together: ``1 <= WORLD_SIZE <=`` :data:`MAX_PROCESSES` (unset: 1),
    ``0 <= RANK < WORLD_SIZE``, ``1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE`` (unset: ``WORLD_SIZE``) and
    ``0 <= LOCAL_RANK < LOCAL_WORLD_SIZE`` (unset: 0); ``LOCAL_WORLD_SIZE`` is returned as given (None:
    unset, as under deepspeed's launcher, which does not set it). Anything else, e.g. a ``RANK=1`` left over from
    another job with ``WORLD_SIZE`` unset, or ``WORLD_SIZE=0``, is refused (:class:`RunError`) in one
    line naming the variable and its value, before anything is read or written."""
    from sppo_rl.runtime.run import RunError

    env = os.environ if environ is None else environ

    def read(name: str) -> int | None:
        raw = env.get(name)
        if raw is None:
            return None
        text = raw.strip()
        if not (text.lstrip("+-").isdigit() and len(text) <= 12):
            raise RunError(f"{name}={raw!r:.40} in the environment is not an integer ({_LAUNCHED})")
        return int(text)

    world, rank, local_world, local_rank = (read(n) for n in LAUNCHER_VARIABLES)
    n = 1 if world is None else world
    if not 1 <= n <= MAX_PROCESSES:
        raise RunError(
            f"WORLD_SIZE={world} in the environment: the number of processes must be in [1, {MAX_PROCESSES:,}] ({_LAUNCHED})"
        )
    unset = "" if world is not None else " (WORLD_SIZE is not set: one process)"
    if rank is not None and not 0 <= rank < n:
        raise RunError(f"RANK={rank} in the environment: a rank must be in [0, {n - 1}]{unset} ({_LAUNCHED})")
    local_n = n if local_world is None else local_world
    if not 1 <= local_n <= n:
        raise RunError(
            f"LOCAL_WORLD_SIZE={local_world} in the environment: must be in [1, WORLD_SIZE = {n}]{unset} ({_LAUNCHED})"
        )
    if local_rank is not None and not 0 <= local_rank < local_n:
        raise RunError(
            f"LOCAL_RANK={local_rank} in the environment: must be in [0, {local_n - 1}]{unset} ({_LAUNCHED})"
        )
    return {
        "WORLD_SIZE": n,
        "RANK": rank or 0,
        "LOCAL_WORLD_SIZE": local_world,
        "LOCAL_RANK": local_rank or 0,
    }


_LAUNCHED = "torchrun and deepspeed set these for each process they start; unset a leftover one"
