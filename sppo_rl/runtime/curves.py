"""A run's logged curve read as one number, the same in every world and every tool that reads run folders
(a control run's own ``summary.json``, ``sppo-rl sweep``, ``sppo-rl report``, ``scripts/compare_llm.py``).
It sits below both worlds and the experiments so that a trainer need not import the comparison protocol
(:mod:`sppo_rl.experiments.protocol`) to summarise itself."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

TAIL_FRAC = 0.1  # "tail": the mean over the last 10 % of a run's logged values, at least one


def tail_value(values: Iterable[float | None], frac: float = TAIL_FRAC) -> float:
    """A run's tail value: ``mean(v_{n-k+1..n})`` with ``k = max(1, ceil(frac * n))`` over its ``n``
    logged values (None and NaN are rows that logged none; NaN if no value); the ceiling ignores float
    noise (0.1 * 30 gives k = 3)."""
    v = np.asarray([math.nan if x is None else x for x in values], dtype=float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return math.nan
    k = max(1, math.ceil(frac * len(v) - 1e-9))
    return float(v[-k:].mean())
