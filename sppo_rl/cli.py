"""The ``sppo-rl`` command line: one tyro subcommand per job, each a config dataclass.

Config modules are import-light (no torch, Gymnasium or transformers at import time), so ``--help`` is
fast; each subcommand's runner is imported only when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import tyro


@dataclass
class Info:
    """List the algorithms, advantage estimators and tasks this installation provides."""


def _run_info(_: Info) -> None:
    from sppo_rl.agents import ALGORITHMS, ESTIMATORS

    print("algorithms:")
    for a in ALGORITHMS.values():
        print(f"  {a.name:10s} {a.summary}")
    print("estimators:", ", ".join(ESTIMATORS))


def _lazy(module: str, function: str) -> Callable[[object], object]:
    def run(cfg: object) -> object:
        import importlib

        return getattr(importlib.import_module(module), function)(cfg)

    return run


def _commands() -> dict[str, tuple[type, Callable[[object], object]]]:
    from sppo_rl.control.config import ControlConfig, WarmstartConfig
    from sppo_rl.demo import DemoConfig
    from sppo_rl.experiments.config import ReportConfig, SweepConfig
    from sppo_rl.llm.config import LLMConfig

    return {
        "demo": (DemoConfig, _lazy("sppo_rl.demo", "run_demo")),
        "control": (ControlConfig, _lazy("sppo_rl.control.trainer", "run_control")),
        "warmstart": (WarmstartConfig, _lazy("sppo_rl.control.warmstart", "run_warmstart")),
        "sweep": (SweepConfig, _lazy("sppo_rl.experiments.sweep", "run_sweep")),
        "report": (ReportConfig, _lazy("sppo_rl.experiments.report", "run_report")),
        "llm": (LLMConfig, _lazy("sppo_rl.llm.trainer", "run_llm")),
        "info": (Info, _run_info),
    }


def main(argv: list[str] | None = None) -> None:
    commands = _commands()
    cfg = tyro.extras.subcommand_cli_from_dict(
        {name: cls for name, (cls, _) in commands.items()},
        prog="sppo-rl",
        description="Sequence-level PPO and its baselines for RL with verifiable rewards.",
        args=sys.argv[1:] if argv is None else argv,
    )
    from sppo_rl.runtime.run import RunError

    for cls, run in commands.values():
        if type(cfg) is cls:
            try:
                run(cfg)
            except (RunError, ValueError) as e:
                print(f"sppo-rl: error: {e}", file=sys.stderr)
                sys.exit(2)
            return
    raise AssertionError(f"no runner for {type(cfg).__name__}")  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    main()
