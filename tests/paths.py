"""Where the tests find the paper's math data: ``$SPPO_RL_MATH_DATA``, else ``../shared/data/math`` beside
the repository. ``FIXTURES`` holds 24 evenly spaced rows of each of the six files, shipped with the
tests, so the loader and verifier checks run everywhere; the full files are checked where present.

Beside the paths: the helpers several test modules share (rows without their timing keys, two runs' rows
compared, the command line run in a child process or in this one, JSONL written, a gradient-recording
engine)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
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
ALGOS += ["reinforce++", "reinforce++-baseline", "opo", "opo-batch", "shrinkage", "spo", "astar-po", "sao"]
ALGOS += ["crf-ntf", "v05"]
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
                    ra["update"],
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


def strip_timing(rows: list[dict], timing) -> list[dict]:
    """``rows`` without the keys in ``timing`` (the metrics that measure time, not what was computed)."""
    return [{k: v for k, v in r.items() if k not in timing} for r in rows]


def assert_rows_close(a: list[dict], b: list[dict]) -> None:
    """Two runs logged the same rows with the same keys: floats equal within rel 1e-4 / abs 1e-5, every
    other value exactly."""
    import pytest

    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys(), (ra.get("update"), set(ra) ^ set(rb))
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, rel=1e-4, abs=1e-5), (ra.get("update"), k)
            else:
                assert rb[k] == v, (ra.get("update"), k)


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    """``python -m sppo_rl *args`` from the repository root, its output captured as text (10 min at most)."""
    return subprocess.run(
        [sys.executable, "-m", "sppo_rl", *args], capture_output=True, text=True, timeout=600, cwd=REPO
    )


def write_jsonl(path: Path, records: list) -> Path:
    """``records`` written to ``path`` one a line: a dict as JSON, a string as it is (a malformed line)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def child_env() -> dict[str, str]:
    """This process's environment for a child ``python -m sppo_rl``: outside any launcher, this checkout
    first on ``PYTHONPATH``, one OpenMP thread."""
    env = outside_a_launcher(dict(os.environ))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def grpo_cartpole_cmd(out: Path, *flags: str) -> list[str]:
    """``python -m sppo_rl control``: grpo on short-cartpole from a random policy, 256 episodes (4 updates),
    4 evaluation episodes, no TensorBoard, in ``out``; ``flags`` appended."""
    return [sys.executable, "-m", "sppo_rl", "control", "--task", "short-cartpole", "--algo", "grpo",
            "--total-episodes", "256", "--init-from", "none", "--eval-episodes", "4", "--no-tensorboard",
            "--out-dir", str(out), *flags]  # fmt: skip


class GradRecorder:
    """An engine that keeps the gradient of ``param`` at each step instead of stepping (the learner's
    ``boundary`` / ``backward`` / ``step`` protocol)."""

    def __init__(self, param) -> None:
        self.param, self.grads = param, []

    def boundary(self, last: bool) -> None:
        pass

    def backward(self, loss) -> None:
        loss.backward()

    def step(self) -> float:
        self.grads.append(self.param.grad.clone())
        self.param.grad = None
        return 0.0


def cli_refusal(capsys, argv: list[str], *needles: str) -> str:
    """``sppo-rl argv`` run in this process is refused: exit 2 and exactly one stderr line,
    ``sppo-rl: error: ...``, holding every one of ``needles``; that line."""
    import pytest

    from sppo_rl.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exc.value.code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("sppo-rl: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
