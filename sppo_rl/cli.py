"""The ``sppo-rl`` command line: one tyro subcommand per job, each a config dataclass.

Config modules are import-light (no torch, Gymnasium or transformers at import time), so ``--help`` is
fast; each subcommand's runner is imported only when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import tyro

from sppo_rl.runtime.flags import HELP_LAYOUT, VIEW_ONLY, flag_view, flat_fields, from_view, parse
from sppo_rl.runtime.recipes import recipe_default, recipe_names


@dataclass
class Info:
    """List the algorithms, advantage estimators, tasks, named models and recipes this installation provides."""


def _run_info(_: Info) -> None:
    from sppo_rl.agents.advantages import ESTIMATORS
    from sppo_rl.agents.algorithms import ALGORITHMS

    print("algorithms:")
    for a in ALGORITHMS.values():
        print(f"  {a.name:10s} {a.summary}")
    print("estimators:", ", ".join(ESTIMATORS))
    try:
        from sppo_rl.envs.tasks import TASKS
    except ImportError:  # pragma: no cover - without the control extra
        TASKS = {}
    print("control tasks (sppo-rl control --task NAME):")
    for t in TASKS.values():
        print(f"  {t.name:24s} horizon {t.horizon:5d}  success: {t.success}")
    print(
        "llm tasks (sppo-rl llm --task ...): arithmetic, scratchpad (both generated), or a local .jsonl / .json / "
        ".parquet file"
    )
    from sppo_rl.llm.models.pretrained import INSTALL_HINT, REGISTRY, missing_modules

    print("named models (sppo-rl llm --model NAME, --critic-model NAME:layers=L; nothing downloaded):")
    for m in REGISTRY.values():
        missing = missing_modules(m)
        state = "installed" if not missing else f"not installed: {INSTALL_HINT}"
        print(
            f"  {m.name:24s} {m.params / 1e6:.1f} M parameters, {m.layers} layers, from {m.package} ({state})"
        )
    print("llm recipes (sppo-rl llm --recipe NAME):", ", ".join(recipe_names()))


def _lazy(module: str, function: str) -> Callable[..., object]:
    def run(cfg: object, **kw: object) -> object:
        import importlib

        return getattr(importlib.import_module(module), function)(cfg, **kw)

    return run


def _commands() -> dict[str, tuple[type, Callable[..., object]]]:
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


def resume_defaults(cls: type, args: list[str]) -> object | None:
    """The config saved in the ``--out-dir`` named by ``args`` (or the default one), as defaults for a
    resumed run; None when there is none (the trainer then says there is nothing to resume)."""
    import dataclasses

    from sppo_rl.config import flat_keys, from_flat
    from sppo_rl.runtime.run import saved_config

    out = next((a.split("=", 1)[1] for a in args if a.startswith("--out-dir=")), None)
    if out is None and "--out-dir" in args and args.index("--out-dir") + 1 < len(args):
        out = args[args.index("--out-dir") + 1]
    if out is None:
        out = next(f.default for f in dataclasses.fields(cls) if f.name == "out_dir")
    saved = saved_config(out)
    if saved is None:
        return None
    names = flat_keys(cls)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in names}
    return from_flat(cls, values)


OTHER_WORLD: dict[str, tuple[str, ...]] = {"control": ("tis_cap",)}
"""Fields a command's config inherits but does not use (the other world's): left out of its ``--help``
(and refused by its ``validate``)."""


def help_view(command: str, cls: type) -> type:
    """``cls`` as ``sppo-rl <command> --help`` shows it: the algorithm flag (``--algo``, a sweep's
    ``--algos``) lists every algorithm of the registry the command can train
    (:data:`sppo_rl.agents.algorithms.ALGORITHMS` whose ``worlds`` has the command's world), a sweep's
    ``--tasks`` every control task (:data:`sppo_rl.envs.tasks.TASKS`), and :data:`OTHER_WORLD`'s fields
    are hidden (a subclass carrying these as ``__sppo_help__`` and ``__sppo_suppress__``, which
    :func:`sppo_rl.runtime.flags.flag_view` reads). Only for the help text: it imports the registry (torch), which a run
    imports anyway."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    if not ({"algo", "algos", "tasks"} & names):
        return cls
    from sppo_rl.agents.algorithms import ALGORITHMS

    world = "llm" if command == "llm" else "control"
    algos = [a.name for a in ALGORITHMS.values() if world in a.worlds]
    helps = {
        "algo": f"Algorithm ({len(algos)}; `sppo-rl info` describes each): {', '.join(algos)}.",
        "algos": f"Algorithms ({len(algos)}; `sppo-rl info` describes each): {', '.join(algos)}.",
    }
    if command == "sweep":
        from sppo_rl.envs.tasks import TASKS

        helps["tasks"] = f"Control tasks (short names; `sppo-rl info` shows each): {', '.join(TASKS)}."
    attrs = {
        "__sppo_help__": {k: v for k, v in helps.items() if k in names},
        "__sppo_suppress__": OTHER_WORLD.get(command, ()),
        "__doc__": cls.__doc__,
        "__module__": cls.__module__,
    }
    return type(cls.__name__, (cls,), attrs)


COMMAND_SUMMARIES: dict[str, str] = {
    "demo": "PPO vs SPPO on a control task and the tiny LLM (minutes)",
    "control": "train on a sparse-reward control task (Gymnasium)",
    "warmstart": "build a control task's warm start (expert + cloning)",
    "sweep": "run algorithms x tasks x seeds, resumably",
    "report": "plots and tables from run folders",
    "llm": "RL with verifiable rewards on a causal LM",
    "info": "list algorithms, tasks, named models and recipes",
}
"""The one-line purpose of each subcommand, as ``sppo-rl --help`` lists them."""


FOREIGN_FLAGS: dict[str, tuple[str, str]] = {
    # TRL's GRPOConfig
    "num_generations": ("--group-size", "TRL's num_generations"),
    "per_device_train_batch_size": ("--prompts-per-step", "TRL's per_device_train_batch_size, which counts completions"),
    "generation_batch_size": ("--prompts-per-step", "TRL's generation_batch_size, which counts completions"),
    "max_completion_length": ("--max-new-tokens", "TRL's max_completion_length"),
    "max_prompt_length": ("--max-prompt-tokens", "TRL's max_prompt_length"),
    "beta": ("--kl-coef", "TRL's beta"),
    "epsilon": ("--clip", "TRL's epsilon"),
    "epsilon_high": ("--clip-high", "TRL's epsilon_high"),
    "loss_type": ("--agg", "TRL's loss_type"),
    "importance_sampling_level": ("--ratio-level", "TRL's importance_sampling_level"),
    "mask_truncated_completions": ("--overlong-filter", "TRL's mask_truncated_completions"),
    "num_iterations": ("--epochs", "TRL's num_iterations"),
    "steps_per_generation": ("--minibatches", "TRL's steps_per_generation"),
    "gradient_accumulation_steps": ("--minibatches", "TRL's gradient_accumulation_steps"),
    "use_vllm": ("--rollout vllm", "TRL's use_vllm"),
    "vllm_importance_sampling_correction": ("--tis-cap", "TRL's vllm_importance_sampling_correction"),
    "learning_rate": ("--actor-lr", "TRL's learning_rate"),
    "max_steps": ("--updates", "TRL's max_steps"),
    "eval_steps": ("--eval-every", "TRL's eval_steps"),
    "save_steps": ("--checkpoint-every", "TRL's save_steps"),
    "reward_funcs": ("--reward-fn", "TRL's reward_funcs"),
    "log_completions": ("--log-completions-every", "TRL's log_completions"),
    "bf16": ("--dtype bfloat16", "TRL's bf16"),
    "scale_rewards": ("--algo drgrpo", "TRL's scale_rewards=False"),
    "output_dir": ("--out-dir", "TRL's output_dir"),
    "model_name_or_path": ("--model", "TRL's model_name_or_path"),
    "lora_r": ("--lora-rank", "peft's r"),
    # verl's PPO trainer config (dotted; any prefix such as actor_rollout_ref. may come before)
    "rollout.n": ("--group-size", "verl's actor_rollout_ref.rollout.n"),
    "data.train_batch_size": ("--prompts-per-step", "verl's data.train_batch_size"),
    "data.max_response_length": ("--max-new-tokens", "verl's data.max_response_length"),
    "data.max_prompt_length": ("--max-prompt-tokens", "verl's data.max_prompt_length"),
    "actor.kl_loss_coef": ("--kl-coef", "verl's actor.kl_loss_coef"),
    "kl_ctrl.kl_coef": ("--kl-coef --kl-in reward", "verl's algorithm.kl_ctrl.kl_coef"),
    "actor.kl_loss_type": ("--kl-estimator", "verl's actor.kl_loss_type"),
    "actor.clip_ratio": ("--clip", "verl's actor.clip_ratio"),
    "actor.clip_ratio_low": ("--clip", "verl's actor.clip_ratio_low"),
    "actor.clip_ratio_high": ("--clip-high", "verl's actor.clip_ratio_high"),
    "actor.clip_ratio_c": ("--dual-clip", "verl's actor.clip_ratio_c"),
    "actor.loss_agg_mode": ("--agg", "verl's actor.loss_agg_mode"),
    "actor.ppo_epochs": ("--epochs", "verl's actor.ppo_epochs"),
    "actor.ppo_mini_batch_size": ("--minibatches", "verl's actor.ppo_mini_batch_size, a size where this is a count"),
    "actor.ppo_micro_batch_size_per_gpu": ("--micro-batch-size", "verl's actor.ppo_micro_batch_size_per_gpu"),
    "actor.ppo_max_token_len_per_gpu": ("--max-tokens-per-micro-batch", "verl's actor.ppo_max_token_len_per_gpu"),
    "actor.entropy_coeff": ("--ent-coef", "verl's actor.entropy_coeff"),
    "actor.grad_clip": ("--max-grad-norm", "verl's actor.grad_clip"),
    "actor.optim.lr": ("--actor-lr", "verl's actor.optim.lr"),
    "critic.optim.lr": ("--critic-lr", "verl's critic.optim.lr"),
    "critic.cliprange_value": ("--value-clip", "verl's critic.cliprange_value"),
    "algorithm.adv_estimator": ("--algo", "verl's algorithm.adv_estimator"),
    "algorithm.gamma": ("--gamma", "verl's algorithm.gamma"),
    "algorithm.lam": ("--lam", "verl's algorithm.lam"),
    "trainer.critic_warmup": ("--critic-warmup", "verl's trainer.critic_warmup"),
    "trainer.total_training_steps": ("--updates", "verl's trainer.total_training_steps"),
    "trainer.test_freq": ("--eval-every", "verl's trainer.test_freq"),
    "trainer.save_freq": ("--checkpoint-every", "verl's trainer.save_freq"),
    "rollout.name": ("--rollout", "verl's actor_rollout_ref.rollout.name"),
    "model.lora_rank": ("--lora-rank", "verl's actor_rollout_ref.model.lora_rank"),
    "data.prompt_key": ("--prompt-key", "verl's data.prompt_key"),
    # this project's own names before both worlds shared one vocabulary
    "steps": ("--updates", "its name before, --steps"),  # vocab: old name
    "final_frac": ("--tail-frac", "its name before, --final-frac"),  # vocab: old name
    "autocast": ("--precision", "its name before, --autocast; --autocast bfloat16 is --precision bf16"),
}  # fmt: skip
"""TRL's (``GRPOConfig``) and verl's names, each with this project's flag and whose name it is: the table
of docs/llm.md ("Coming from TRL or verl"), read when ``sppo-rl llm`` meets a flag it does not know; and
this project's own flags before a rename."""


def _split_recipe(args: list[str]) -> list[str]:
    """``--recipe=NAME`` and ``--recipe-file=PATH`` as two arguments each (the form :func:`main` reads)."""
    out: list[str] = []
    for a in args:
        flag = a.split("=", 1)[0]
        out += [flag, a.split("=", 1)[1]] if flag in ("--recipe", "--recipe-file") and "=" in a else [a]
    return out


def known_flags(command: str, cls: type) -> set[str]:
    """Every ``--flag`` that ``sppo-rl <command>`` takes (``--no-`` forms included)."""
    keys = list(flat_fields(cls))
    if command in HELP_LAYOUT:
        keys += list(VIEW_ONLY)
    names = {k.replace("_", "-") for k in keys}
    return {"--help"} | {f"--{n}" for n in names} | {f"--no-{n}" for n in names}


def unknown_flag(command: str, cls: type, args: list[str]) -> str | None:
    """One line about the first ``--flag`` of ``args`` that ``sppo-rl <command>`` does not take: the
    flag TRL's or verl's name stands for (:data:`FOREIGN_FLAGS`), else the closest flag's name, and the
    command's ``--help``; None when every flag is known (tyro then parses, and refuses the rest)."""
    import difflib
    import re

    known = known_flags(command, cls)
    for a in args:
        m = re.fullmatch(r"--([A-Za-z0-9][A-Za-z0-9_.-]*)(=.*)?", a)
        if m is None or "--" + m[1].replace("_", "-") in known:
            continue
        name = m[1].lower().replace("-", "_")
        parts = name.split(".")
        hit = next(
            (
                FOREIGN_FLAGS[".".join(parts[i:])]
                for i in range(len(parts))
                if ".".join(parts[i:]) in FOREIGN_FLAGS
                and FOREIGN_FLAGS[".".join(parts[i:])][0].split()[0] in known
            ),
            None,
        )
        if hit is not None:
            hint = f"; did you mean {hit[0]} ({hit[1]})?"
        else:
            close = difflib.get_close_matches("--" + m[1].replace("_", "-"), sorted(known), n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]}?" if close else "."
        return f"unknown flag --{m[1]}{hint} See sppo-rl {command} --help"
    return None


def main(argv: list[str] | None = None) -> None:
    from sppo_rl.runtime.run import RunError, RunFailed

    args = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if args and args[0] in commands and ("-h" in args or "--help" in args):  # the help text only
        cls, run = commands[args[0]]
        commands[args[0]] = (help_view(args[0], cls), run)
    if args and args[0] in commands:
        args = [args[0], *_split_recipe(args[1:])]
        unknown = unknown_flag(args[0], commands[args[0]][0], args[1:])
        if unknown:
            print(f"sppo-rl {args[0]}: error: {unknown}", file=sys.stderr)
            sys.exit(2)
    if ("--recipe" in args or "--recipe-file" in args) and args and args[0] in commands:
        # `sppo-rl llm --recipe NAME [flags]`: the recipe gives the defaults, the flags override them
        cls, run = commands[args[0]]
        try:
            default, rest = recipe_default(cls, args[1:])
        except RunError as e:
            print(f"sppo-rl: error: {e}", file=sys.stderr)
            sys.exit(2)
        cfg = parse(cls, rest, default=default, prog=f"sppo-rl {args[0]}")
    elif "--resume" in args and args and args[0] in ("control", "llm"):
        # `sppo-rl control --out-dir R --resume`: the run's saved config gives the defaults, flags override
        cls, _ = commands[args[0]]
        try:
            default = resume_defaults(cls, args[1:])
        except RunError as e:
            print(f"sppo-rl: error: {e}", file=sys.stderr)
            sys.exit(2)
        cfg = parse(cls, args[1:], default=default, prog=f"sppo-rl {args[0]}")
    else:
        from typing import Annotated, Union

        views = {name: flag_view(cls, name) for name, (cls, _) in commands.items()}
        listing = not (
            args and args[0] in commands
        )  # the root's list: one line each; a command: its docstring
        choices = tuple(
            Annotated[
                view,
                tyro.conf.subcommand(name=name, description=COMMAND_SUMMARIES[name] if listing else None),
            ]
            for name, view in views.items()
        )
        cfg = tyro.cli(
            Union[choices],  # type: ignore[valid-type]  # noqa: UP007 (a tuple of types)
            prog="sppo-rl",
            description="Sequence-level PPO and its baselines for RL with verifiable rewards. "
            "`sppo-rl COMMAND --help` lists a command's flags.",
            args=args,
        )
        name = next(n for n, view in views.items() if type(cfg) is view)
        cfg = from_view(commands[name][0], cfg)
    for command, (cls, run) in commands.items():
        if type(cfg) is cls:
            try:
                if command in ("llm", "control"):  # their plan validates every setting first, once
                    run(cfg, command=True)  # the wall time printed at the end is the process's
                else:
                    if hasattr(cfg, "validate"):
                        cfg.validate()  # every setting's type and range, before any work
                    run(cfg)
            except (RunError, ValueError) as e:
                print(f"sppo-rl: error: {e}", file=sys.stderr)
                sys.exit(2)
            except RunFailed as e:  # the run started, then had to stop (summary.json says why)
                print(f"sppo-rl: error: {e}", file=sys.stderr)
                sys.exit(1)
            except (OSError, RuntimeError) as e:  # the run folder's storage failed: one line, exit 74
                from sppo_rl.runtime.storage import storage_error

                fault = storage_error(e, getattr(cfg, "out_dir", None))
                if fault is None:
                    raise
                print(f"sppo-rl: error: {fault}", file=sys.stderr)
                sys.exit(fault.exit_code)
            return
    raise AssertionError(f"no runner for {type(cfg).__name__}")  # pragma: no cover


def entry() -> None:
    """The ``sppo-rl`` command and ``python -m sppo_rl``: :func:`main`, then, in a process that joined a
    process group (a torchrun or DeepSpeed rank), its exit status through
    :func:`sppo_rl.llm.models.engines.end_process`, which skips the interpreter's teardown. An unexpected
    exception takes the ordinary way out (its traceback, status 1)."""
    try:
        main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            _end_process(e.code or 0)
        raise
    _end_process(0)


def _end_process(code: int) -> None:
    torch = sys.modules.get("torch")  # no process group without torch (and --help stays import-light)
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        from sppo_rl.llm.models.engines import end_process

        end_process(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
