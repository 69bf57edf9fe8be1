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
    print("llm recipes (sppo-rl llm --recipe NAME):", ", ".join(recipe_names()))


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


RECIPE_BUILTIN_REWARDS = ("auto", "math", "integer", "boxed-or-last-number")

UNSAFE_RECIPE_FIELDS: dict[str, str] = {
    "out_dir": "writes there",
    "overwrite": "deletes a run",
    "resume": "appends to a run",
    "reward_fn": "imports and runs a Python file or module",
    "model": "reads a model folder",
    "critic_model": "reads a model folder",
    "cache_dir": "writes there",
    "init_from": "reads a checkpoint",
    "expert_from": "reads a checkpoint",
    "install": "writes into the installation",
    "task": "imports a module",
    "wandb": "sends the run to Weights & Biases",
    "wandb_mode": "sends the run over the network",
    "ray_address": "connects to a cluster",
}
"""Fields a recipe file may not set (it holds hyperparameters only), with what each would do; read
from a recipe only when the user passes the same field on the command line (whose value wins) or
``--trust-recipe``. A value that does nothing of the kind passes: ``overwrite``/``resume``/``wandb``
false, a built-in ``reward_fn`` (auto, math, integer, boxed-or-last-number), ``task`` without ``module:`` (a data file or a
generated task), ``wandb_mode`` offline, ``critic_model`` ``"none"``."""


def _harmless(name: str, value: object) -> bool:
    if name in ("overwrite", "resume", "wandb"):
        return value is False
    if name == "reward_fn":
        return value in RECIPE_BUILTIN_REWARDS
    if name == "task":
        return isinstance(value, str) and ":" not in value
    if name == "wandb_mode":
        return value == "offline"
    if name == "critic_model":
        return value == "none"
    return False


def cli_fields(args: list[str]) -> set[str]:
    """The config fields named by ``--flag``, ``--flag=value`` and ``--no-flag`` options in ``args``."""
    out = set()
    for a in args:
        if a.startswith("--"):
            name = a[2:].split("=", 1)[0].replace("-", "_")
            out.add(name)
            out.add(name.removeprefix("no_"))
    return out


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


MAX_RECIPE_DIGITS = 30
"""A recipe's integers of more digits are refused by name (:class:`_HugeInt`); no setting comes near."""


class _HugeInt:
    """An integer of a recipe with more than :data:`MAX_RECIPE_DIGITS` digits, kept as its digit count:
    converting a 5,000-digit one raises Python's int-string limit error, which names no key."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def _recipe_int(text: str) -> int | _HugeInt:
    return _HugeInt(text) if len(text.lstrip("-")) > MAX_RECIPE_DIGITS else int(text)


def load_recipe(
    cls: type, path: str, *, trust: bool = False, given: set[str] | frozenset[str] = frozenset()
) -> object:
    """A config whose defaults come from a JSON recipe file (``{field: value}``); unknown fields, a key
    given twice, and values of the wrong type or out of range, are refused naming the file and the line.

    A recipe is data: a file's fields of :data:`UNSAFE_RECIPE_FIELDS` (out_dir, overwrite, resume, a
    reward file, model folders, ...) are refused in one line unless ``trust`` (``--trust-recipe``) or the
    field is in ``given`` (passed on the command line, so the recipe's value is not used). The built-in
    recipes, shipped with the package, are trusted."""
    import json
    import re
    from pathlib import Path

    from sppo_rl.config import MAX_COUNT, from_flat, unknown_keys
    from sppo_rl.runtime.run import RunError

    file = Path(path)
    if not file.is_file():
        builtin = Path(__file__).parent / "recipes" / (path if path.endswith(".json") else f"{path}.json")
        if not builtin.is_file():
            raise RunError(f"--recipe {path}: no such file (built-in recipes: {', '.join(recipe_names())})")
        file = builtin
        trust = True
    try:
        text = file.read_text(encoding="utf-8")
        values = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_recipe_int)
    except _DuplicateKey as e:
        key = re.compile(rf'"{re.escape(str(e))}"\s*:')
        lines = [i for i, t in enumerate(text.splitlines(), 1) if key.search(t)]
        at = f":{lines[1]}" if len(lines) > 1 else ""
        raise RunError(f"{file}{at}: {e} is given twice (a recipe names each field once)") from None
    except json.JSONDecodeError as e:
        raise RunError(f"{file}:{e.lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        bad = e.object[e.start]
        raise RunError(f"{file}: not UTF-8 text (byte {bad:#04x} at offset {e.start})") from None
    except RecursionError:
        raise RunError(f"{file}: JSON nested too deeply") from None
    except OSError as e:
        raise RunError(f"--recipe {file}: cannot read it ({e.strerror or e})") from None
    if not isinstance(values, dict):
        raise RunError(f"{file}: a recipe is a JSON object {{field: value}}, got {type(values).__name__}")
    unknown = [k for k in unknown_keys(cls, values) if k != "_comment"]
    if unknown:
        raise RunError(f"{file}: unknown field(s) {', '.join(unknown)} for {cls.__name__}")
    values.pop("_comment", None)
    for (
        name,
        value,
    ) in values.items():  # before anything converts it: Python refuses str(int) past 4300 digits
        huge = next(
            (v for v in (value if isinstance(value, list) else [value]) if isinstance(v, _HugeInt)), None
        )
        if huge is not None:
            key = re.compile(rf'"{re.escape(name)}"\s*:')
            line = next((i for i, t in enumerate(text.splitlines(), 1) if key.search(t)), None)
            raise RunError(
                f"{file}{f':{line}' if line else ''}: {name} {'holds' if isinstance(value, list) else 'is'} an "
                f"integer of {huge.digits:,} digits; no "
                f"setting takes one that large (a count at most {MAX_COUNT:,}, a seed at most 2^48 - 1)"
            )
    if not trust:
        unsafe = [
            n for n in values if n in UNSAFE_RECIPE_FIELDS and n not in given and not _harmless(n, values[n])
        ]
        if unsafe:
            what = "; ".join(f"{n} ({UNSAFE_RECIPE_FIELDS[n]})" for n in unsafe)
            flags = " ".join("--" + n.replace("_", "-") for n in unsafe)
            raise RunError(
                f"{file}: a recipe file sets hyperparameters only, and this one sets {what}; "
                f"pass {flags} on the command line, or add --trust-recipe if you trust the file"
            )
    for name, value in values.items():
        if isinstance(value, list):
            values[name] = tuple(value)
    cfg = from_flat(cls, values)
    if hasattr(cfg, "field_problems"):
        lines = text.splitlines()
        for name, message in cfg.field_problems():
            if name in values:
                key = re.compile(rf'"{re.escape(name)}"\s*:')
                line = next((i for i, t in enumerate(lines, 1) if key.search(t)), None)
                raise RunError(f"{file}{f':{line}' if line else ''}: {name} {message}")
    return cfg


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
    (:data:`sppo_rl.agents.ALGORITHMS` whose ``worlds`` has the command's world), a sweep's
    ``--tasks`` every control task (:data:`sppo_rl.envs.tasks.TASKS`), and :data:`OTHER_WORLD`'s fields
    are hidden. Only for the help text: it imports the registry (torch), which a run imports anyway."""
    import dataclasses
    from typing import Annotated, get_type_hints

    names = {f.name: f for f in dataclasses.fields(cls)}
    if not ({"algo", "algos", "tasks"} & set(names)):
        return cls
    from sppo_rl.agents import ALGORITHMS

    hints = get_type_hints(cls, include_extras=True)
    world = "llm" if command == "llm" else "control"
    algos = [a.name for a in ALGORITHMS.values() if world in a.worlds]
    helps = {
        "algo": f"Algorithm ({len(algos)}; `sppo-rl info` describes each): {', '.join(algos)}.",
        "algos": f"Algorithms ({len(algos)}; `sppo-rl info` describes each): {', '.join(algos)}.",
    }
    if command == "sweep":
        from sppo_rl.envs.tasks import TASKS

        helps["tasks"] = f"Control tasks (short names; `sppo-rl info` shows each): {', '.join(TASKS)}."
    view = []
    for name, text in helps.items():
        if name in names:
            view.append((name, Annotated[hints[name], tyro.conf.arg(help=text)], _same_default(names[name])))
    for name in OTHER_WORLD.get(command, ()):
        view.append((name, Annotated[hints[name], tyro.conf.Suppress], _same_default(names[name])))
    return _subclass(cls, view)


def _subclass(cls: type, overrides: list) -> type:
    """A dataclass of ``cls``'s fields with ``overrides`` (``(name, type, field)``) in their place; tyro
    reads the other fields' help from ``cls``'s source."""
    import dataclasses

    out = dataclasses.make_dataclass(cls.__name__, overrides, bases=(cls,))
    out.__doc__, out.__module__ = cls.__doc__, cls.__module__
    return out


def flag_view(cls: type) -> type:
    """``cls`` as tyro parses it: each :class:`~sppo_rl.config.Section` field's settings are flags named by
    their flat key (``--lora-rank``, not tyro's ``--lora.rank``), shown as one group with the section's
    help. :func:`parse` turns what tyro returns back into ``cls``."""
    import dataclasses
    from typing import Annotated, get_type_hints

    from sppo_rl.config import Section

    view = []
    for f in dataclasses.fields(cls):
        section = f.default_factory
        if not (isinstance(section, type) and issubclass(section, Section)):
            continue
        hints = get_type_hints(section)
        inner = []
        for g in dataclasses.fields(section):
            name = g.metadata.get("key", f"{f.name}_{g.name}").replace("_", "-")
            arg = tyro.conf.arg(name=name, prefix_name=False)
            inner.append((g.name, Annotated[hints[g.name], arg], _same_default(g)))
        shown = _subclass(section, inner)
        view.append(
            (f.name, Annotated[shown, tyro.conf.arg(name=f.name)], dataclasses.field(default_factory=shown))
        )
    return _subclass(cls, view) if view else cls


def _as(kind: type, value: object) -> object:
    """``value`` (a dataclass) rebuilt as ``kind``, its sections as ``kind``'s section classes."""
    import dataclasses

    values = {}
    for f in dataclasses.fields(kind):
        v = getattr(value, f.name)
        section = f.default_factory
        if isinstance(section, type) and dataclasses.is_dataclass(section) and dataclasses.is_dataclass(v):
            v = _as(section, v)
        values[f.name] = v
    return kind(**values)


def parse(cls: type, args: list[str], *, default: object | None = None, prog: str | None = None) -> object:
    """The ``cls`` that the flags ``args`` give (tyro's parser on :func:`flag_view`), from the defaults of
    ``default`` when given; exits as tyro does (status 2) on a flag it refuses."""
    view = flag_view(cls)
    if view is cls:
        return tyro.cli(cls, default=default, args=args, prog=prog)
    out = tyro.cli(view, default=None if default is None else _as(view, default), args=args, prog=prog)
    return _as(cls, out)


def _same_default(f: object) -> object:
    import dataclasses

    if f.default_factory is not dataclasses.MISSING:  # type: ignore[attr-defined]
        return dataclasses.field(default_factory=f.default_factory)  # type: ignore[attr-defined]
    return dataclasses.field(default=f.default)  # type: ignore[attr-defined]


def recipe_names() -> list[str]:
    from pathlib import Path

    return sorted(p.stem for p in (Path(__file__).parent / "recipes").glob("*.json"))


def main(argv: list[str] | None = None) -> None:
    from sppo_rl.runtime.run import RunError, RunFailed

    args = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if args and args[0] in commands and ("-h" in args or "--help" in args):  # the help text only
        cls, run = commands[args[0]]
        commands[args[0]] = (help_view(args[0], cls), run)
    if "--recipe" in args and args and args[0] in commands:
        # `sppo-rl llm --recipe FILE [flags]`: the recipe gives the defaults, the flags override them
        trust = "--trust-recipe" in args
        args = [a for a in args if a != "--trust-recipe"]
        i = args.index("--recipe")
        if i + 1 >= len(args):
            print("sppo-rl: error: --recipe needs a file", file=sys.stderr)
            sys.exit(2)
        cls, run = commands[args[0]]
        rest = args[1:i] + args[i + 2 :]
        try:
            default = load_recipe(cls, args[i + 1], trust=trust, given=cli_fields(rest))
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
        views = {name: flag_view(cls) for name, (cls, _) in commands.items()}
        cfg = tyro.extras.subcommand_cli_from_dict(
            views,
            prog="sppo-rl",
            description="Sequence-level PPO and its baselines for RL with verifiable rewards.",
            args=args,
        )
        name = next(n for n, view in views.items() if type(cfg) is view)
        cfg = _as(commands[name][0], cfg) if views[name] is not commands[name][0] else cfg
    for cls, run in commands.values():
        if type(cfg) is cls:
            import sppo_rl.runtime.loop

            sppo_rl.runtime.loop.COMMAND = True  # the wall time printed at the end is the process's
            try:
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
    :func:`sppo_rl.llm.engines.end_process`, which skips the interpreter's teardown. An unexpected
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
        from sppo_rl.llm.engines import end_process

        end_process(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
