"""The config walk: which modules read a run's settings, and how often the reading leaves a module and
comes back, for one short LLM run (the embedded tiny model, 2 updates) and one short control run, each
in this process.

What is counted: every read of a *setting*, i.e. of a dataclass field (not a method or a property) of

- the config classes: :class:`~sppo_rl.llm.config.LLMConfig`, :class:`~sppo_rl.control.config.ControlConfig`
  and the dataclasses nested in them (LoRA, overlong, warm start, latent settings, ...), whichever copy
  is read (the user's, ``plan.given``, one with the algorithm's defaults filled in);
- the plan's settings sections: every dataclass defined in :mod:`sppo_rl.runtime.plan`,
  :mod:`sppo_rl.llm.plan` or :mod:`sppo_rl.control.plan` other than a plan itself (``Plan``,
  ``RunPlan``, ``Task``): e.g. :class:`~sppo_rl.runtime.plan.LoopSettings` and a world's sections. A read
  of the plan's own fields (``plan.algo``, ``plan.loop``) is not counted: it hands a part on, it reads
  no setting.

Each read is charged to the module whose code made it (``sys._getframe``: the caller of the attribute
access; reads from outside ``sppo_rl`` -- ``dataclasses.replace``, ``copy`` -- are left out). In the order
they happen, consecutive reads from one module make one *stay*; the walk prints the distinct modules, the
stays, and the *returns* (stays minus modules: how often the reading came back to a module it had left),
once for every setting read and once for the reads of a config alone (the user's object and its copies,
not the plan's sections: where the config itself travels).

Usage (from a checkout, with its ``sppo_rl`` first on the path)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python scripts/config_walk.py [--verbose]

The LLM run uses the model cache (``$SPPO_RL_CACHE``) like any run: built once, then read.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

READS: list[tuple[str, bool]] = []
"""(reading module, whether the object read is a config: not a plan's section), in order."""


def _record(cls: type, config: bool) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    inner = cls.__getattribute__

    def getattribute(self: Any, name: str) -> Any:
        if name in names:
            module = sys._getframe(1).f_globals.get("__name__", "")
            if module.startswith("sppo_rl"):
                READS.append((module, config))
        return inner(self, name)

    cls.__getattribute__ = getattribute  # type: ignore[method-assign]


def _nested(cls: type, seen: set[type]) -> None:
    """``cls`` and the dataclasses its default instance holds, recursively."""
    if cls in seen:
        return
    seen.add(cls)
    try:
        value = cls()
    except TypeError:
        return
    for f in dataclasses.fields(cls):
        v = getattr(value, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            _nested(type(v), seen)


def watched_classes() -> list[tuple[type, bool]]:
    """The config classes (True) and the plans' settings sections (False; see the module docstring)."""
    import importlib

    from sppo_rl.control.config import ControlConfig
    from sppo_rl.llm.config import LLMConfig

    configs: set[type] = set()
    for cls in (LLMConfig, ControlConfig):
        _nested(cls, configs)
    classes: set[type] = set()
    for name in ("sppo_rl.runtime.plan", "sppo_rl.llm.plan", "sppo_rl.control.plan"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == name
                and value.__name__ not in ("Plan", "RunPlan", "Task")
            ):
                classes.add(value)
    watched = [(c, True) for c in configs] + [(c, False) for c in classes - configs]
    return sorted(watched, key=lambda cw: (cw[0].__module__, cw[0].__name__))


def walk(reads: list[str]) -> tuple[int, int, int, list[tuple[str, int]]]:
    """Distinct modules, stays, returns, and the stays in order (module, reads)."""
    stays: list[tuple[str, int]] = []
    for m in reads:
        if stays and stays[-1][0] == m:
            stays[-1] = (m, stays[-1][1] + 1)
        else:
            stays.append((m, 1))
    modules = len({m for m, _ in stays})
    return modules, len(stays), len(stays) - modules, stays


def llm_run(out: Path) -> None:
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.trainer import run_llm

    names = {f.name for f in dataclasses.fields(LLMConfig)}
    updates = (
        {"steps": 2} if "steps" in names else {"updates": 2}
    )  # vocab: old name (the walk also runs on older code)
    cfg = LLMConfig(
        **updates, prompts_per_step=4, eval_every=2, val_size=8, eval_samples=2, checkpoint_every=100,
        progress=False, tensorboard=False, seed=3, out_dir=str(out),
    )  # fmt: skip
    run_llm(cfg)


def control_run(out: Path) -> None:
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import run_control

    cfg = ControlConfig(
        task="short-cartpole", algo="sppo", total_episodes=64, init_from="none", progress=False,
        tensorboard=False, eval_episodes=4, out_dir=str(out),
    )  # fmt: skip
    run_control(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="print every stay")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    for cls, config in watched_classes():
        _record(cls, config)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world, run in (("llm", llm_run), ("control", control_run)):
            READS.clear()
            run(Path(tmp) / world)
            results[world] = (walk([m for m, _ in READS]), walk([m for m, config in READS if config]))
    for world, ((modules, stays, returns, order), (c_modules, c_stays, c_returns, _)) in results.items():
        print(
            f"{world}: settings {modules} modules, {stays} stays, {returns} returns; "
            f"the config alone {c_modules} modules, {c_stays} stays, {c_returns} returns"
        )
        if args.verbose:
            for m, n in order:
                print(f"    {m} ({n})")


if __name__ == "__main__":
    main()
