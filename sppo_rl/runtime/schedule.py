"""Learning-rate schedules of both worlds: the factor of the base learning rate at update ``k``.

Pure and stateless: the factor is recomputed from the update index before every update, so a resumed
run uses exactly the learning rates of an uninterrupted one with nothing extra in its checkpoints.

With ``K`` updates in the run (``--total-episodes / episodes per update``, rounded up, or ``--updates``),
``W`` warm-up updates and ``k = 0 .. K-1`` the index of the update about to run:

- warm-up, ``k < W``: ``f = (k + 1) / W`` (linear up to 1 at ``k = W - 1``; unlike Hugging Face's
  warm-up the first update is not taken at learning rate 0, which would spend its samples for nothing);
- then, with ``p = (k - W) / (K - W)`` (0 at the first update after warm-up):

  - ``constant``: ``f = 1``;
  - ``linear``: ``f = 1 - p`` (CleanRL's anneal: with ``W = 0`` it is ``1 - k / K``, ``1/K`` at the
    last update, never 0);
  - ``cosine``: ``f = (1 + cos(pi p)) / 2`` (TRL's / verl's warm-up + cosine decay to 0).

The actor's and the critic's learning rates both follow ``f`` (each times its own base rate).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

LrSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")


def lr_factor(schedule: str, update: int, total_updates: int, warmup_updates: int = 0) -> float:
    """The factor ``f`` of the base learning rate for update ``update`` (0-based) of ``total_updates``
    (see the module docstring). ``ValueError`` for an unknown schedule or a negative count."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    if update < 0 or total_updates < 1 or warmup_updates < 0:
        raise ValueError(
            f"need update >= 0, total_updates >= 1, warmup_updates >= 0; got {update}, {total_updates}, "
            f"{warmup_updates}"
        )
    k, K, W = int(update), int(total_updates), int(warmup_updates)
    if k < W:
        return (k + 1) / W
    if schedule == "constant":
        return 1.0
    p = min((k - W) / max(K - W, 1), 1.0)
    if schedule == "linear":
        return 1.0 - p
    return 0.5 * (1.0 + math.cos(math.pi * p))


class ParamGroups(Protocol):
    """What :func:`set_lr` sets: a torch optimizer, or DeepSpeed's wrapper of one."""

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...


def set_lr(optimizer: ParamGroups, lr: float) -> None:
    """Set every parameter group's learning rate of ``optimizer`` (torch, or DeepSpeed's wrapper of one,
    which shares its ``param_groups``) to ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
