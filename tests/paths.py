"""Where the tests find the paper's math data: ``$SPPO_RL_MATH_DATA``, else ``../shared/data/math`` beside
the repository. ``FIXTURES`` holds 24 evenly spaced rows of each of the six files, shipped with the
tests, so the loader and verifier checks run everywhere; the full files are checked where present."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from sppo_rl.runtime.logging import TIMING_KEYS

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "math"
MATH_DATA = Path(os.environ.get("SPPO_RL_MATH_DATA", REPO.parent / "shared" / "data" / "math"))
ALGOS = [
    "ppo",
    "sppo",
    "grpo",
    "drgrpo",
    "rloo",
    "remax",
    "reinforce",
    "ppo-bce",
    "gspo",
    "sppo-seq",
    "cispo",
]
ALGOS += ["reinforce++", "reinforce++-baseline", "opo", "opo-batch", "shrinkage", "spo"]
"""The algorithms that both worlds' every-algorithm tests train (test_control, test_llm_trainer)."""

# metrics that measure time, not what was computed (left out when two runs are compared)
CONTROL_TIMING = LLM_TIMING = TIMING_KEYS


def assert_rows_match(
    a: list[dict], b: list[dict], keys: tuple[str, ...], rel: float = 1e-4, abs: float = 1e-5
) -> None:
    """Two runs' metrics rows agree, row by row, on every key of ``keys`` the first run logged."""
    import pytest

    for ra, rb in zip(a, b):
        for key in keys:
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], rel=rel, abs=abs), (
                    ra["step"],
                    key,
                    ra[key],
                    rb[key],
                )


# a reward that needs no model to be right: the parity of the response's length (mixed outcomes from an
# untrained model, so every method has something to learn)
PARITY_REWARD = "def even(response, truth):\n    return float(len(response) % 2 == 0)\n"


def reward_file(path: Path, source: str = PARITY_REWARD) -> str:
    """Write ``source`` (Python defining one function ``f(response, truth) -> float``) to ``path``; return
    the ``--reward-fn`` value ``"<path>:<name>"`` of its first function."""
    name = re.search(r"^def (\w+)\(", source, re.M)
    if name is None:
        raise ValueError("the reward source defines no function")
    path.write_text(source)
    return f"{path}:{name.group(1)}"


@contextlib.contextmanager
def script_module(name: str) -> Iterator[ModuleType]:
    """``scripts/<name>.py`` imported as the module ``name`` (registered in ``sys.modules`` while in use,
    as dataclasses and pickling need), removed again on exit."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def outside_a_launcher(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the launcher's rank variables (torchrun sets them), so that a subprocess started
    from it is a process of its own: ``launcher_dist`` reads world 1 and a group of one gets a free port."""
    return {
        k: v
        for k, v in env.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
