"""The ``sppo-rl`` command line: one tyro subcommand per job, each a config dataclass.

Config modules are import-light (no torch, Gymnasium or transformers at import time), so ``--help`` is
fast; each subcommand's runner is imported only when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tyro


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


RECIPE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
"""A built-in recipe's name: letters, digits, ``_``, ``.``, ``-``; no separator, no ``..``."""


def builtin_recipe(name: str) -> Path:
    """The file of the built-in recipe ``name`` (``sppo-7b-dapo``, or with ``.json``), looked up by name
    among the package's recipes, never joined as a path: a name with a separator, ``..`` or any character
    outside :data:`RECIPE_NAME` is refused in one line (a recipe file of the user's own is passed with
    ``--recipe-file``, and read as untrusted data)."""
    import re

    from sppo_rl.runtime.run import RunError

    stem = name[: -len(".json")] if name.endswith(".json") else name
    if not re.fullmatch(RECIPE_NAME, stem) or ".." in stem:
        raise RunError(
            f"--recipe {name}: a built-in recipe's name, not a path (built-in recipes: "
            f"{', '.join(recipe_names())}); pass a recipe file of your own with --recipe-file PATH"
        )
    if stem not in recipe_names():
        raise RunError(
            f"--recipe {name}: no such built-in recipe (built-in recipes: {', '.join(recipe_names())}); "
            f"pass a recipe file of your own with --recipe-file PATH"
        )
    return _recipes_folder() / f"{stem}.json"


def load_recipe(
    cls: type,
    name: str | None = None,
    *,
    file: str | Path | None = None,
    trust: bool = False,
    given: set[str] | frozenset[str] = frozenset(),
) -> object:
    """A config whose defaults come from a JSON recipe (``{field: value}``): the built-in recipe ``name``
    (:func:`builtin_recipe`; shipped with the package, so trusted) or the user's recipe ``file`` (exactly
    one of the two); unknown fields, a key given twice, and values of the wrong type or out of range, are
    refused naming the file and the line.

    A recipe file is data: its fields of :data:`UNSAFE_RECIPE_FIELDS` (out_dir, overwrite, resume, a
    reward file, model folders, ...) are refused in one line unless ``trust`` (``--trust-recipe``) or the
    field is in ``given`` (passed on the command line, so the recipe's value is not used)."""
    import json
    import re

    from sppo_rl.config import MAX_COUNT, from_flat, unknown_keys
    from sppo_rl.runtime.run import RunError

    if (name is None) == (file is None):
        raise TypeError("load_recipe takes a built-in recipe's name or a recipe file, one of the two")
    if name is not None:
        file = builtin_recipe(name)
        trust = True
    else:
        file = Path(file)  # type: ignore[arg-type]
        if not file.is_file():
            raise RunError(f"--recipe-file {file}: no such file")
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
    (:data:`sppo_rl.agents.algorithms.ALGORITHMS` whose ``worlds`` has the command's world), a sweep's
    ``--tasks`` every control task (:data:`sppo_rl.envs.tasks.TASKS`), and :data:`OTHER_WORLD`'s fields
    are hidden (a subclass carrying these as ``__sppo_help__`` and ``__sppo_suppress__``, which
    :func:`flag_view` reads). Only for the help text: it imports the registry (torch), which a run
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

COMMON = "common"
"""The name of the group of a command's first, most-set flags (tyro's top-level options)."""

HELP_LAYOUT: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "llm": [
        (COMMON, "", ("algo", "model", "task", "steps", "out_dir", "recipe", "recipe_file", "trust_recipe", "reward_fn", "seed")),
        ("data", "Prompts and answers: the task's data, its columns and how a prompt is rendered.", (
            "val_data", "prompt_key", "answer_key", "level", "arithmetic_prompt", "train_size", "val_size",
            "data_seed", "chat_template", "system_prompt", "instruction", "max_prompt_tokens")),
        ("reward", "The reward functions' weights, limits and failures.", (
            "reward_weights", "reward_timeout", "reward_fail_limit")),
        ("sampling", "Rollouts: samples per prompt, batch of prompts, decoding.", (
            "group_size", "prompts_per_step", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
            "max_new_tokens", "dynamic_sampling_rounds")),
        ("optimisation", "The update: learning rates, epochs, minibatches, schedule.", (
            "actor_lr", "critic_lr", "weight_decay", "epochs", "minibatches", "micro_batch_size",
            "max_tokens_per_micro_batch", "max_grad_norm", "lr_schedule", "warmup_updates")),
        ("policy-loss", "The surrogate: clipping, ratio, aggregation, advantage normalisation.", (
            "clip", "clip_high", "dual_clip", "agg", "ratio_level", "policy_loss", "tis_cap",
            "group_std_threshold", "grpo_std", "whiten", "ent_coef", "skip_equal_rewards", "bppo_prefix_ratio",
            "bppo_accuracy_threshold", "lampo_temperature")),
        ("critic", "The critic: its model, targets and start.", (
            "critic_model", "critic_init", "critic_warmup", "value_clip", "gamma", "lam", "lam_critic",
            "lam_alpha")),
        ("kl", "The KL penalty to the reference model (off by default).", ("kl_coef", "kl_estimator", "kl_in", "kl_clamp")),
        ("overlong", "DAPO's handling of responses cut at --max-new-tokens.", (
            "overlong_filter", "overlong_buffer", "overlong_penalty")),
        ("embedded-model", "The embedded tiny model's supervised warm start and cache.", (
            "sft_steps", "sft_lr", "sft_target", "cache_dir")),
        ("latent", "Latent-GRPO's settings (latent algorithms only).", (
            "latent_steps", "latent_topk", "latent_gumbel_temperature", "latent_noise_scale", "latent_one_sided",
            "latent_mask_invalid", "latent_first_token", "latent_sft_steps")),
        ("scale", "Devices, precision, engines and adapters.", (
            "device", "threads", "dtype", "autocast", "engine", "zero_stage", "offload", "gradient_checkpointing",
            "collective_timeout", "rollout", "vllm_max_model_len", "vllm_gpu_memory_utilization", "vllm_sleep",
            "vllm_dtype", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "export_adapter")),
        ("evaluation", "Validation and what is logged.", (
            "eval_every", "eval_samples", "log_completions_every", "progress", "tensorboard", "exp_name",
            "wandb", "wandb_mode", "wandb_project", "wandb_entity", "wandb_group", "wandb_tags", "extra")),
        ("run-folder", "Checkpoints, resuming and the run's budget.", (
            "resume", "overwrite", "resume_without_optimizer", "checkpoint_every", "keep_checkpoints",
            "optimizer_state", "max_seconds")),
    ],
    "control": [
        (COMMON, "", ("algo", "task", "total_episodes", "out_dir", "recipe", "recipe_file", "trust_recipe", "init_from", "dense",
                      "seed")),
        ("environment", "The task's success test, batch and networks.", (
            "success", "episodes_per_update", "group_size", "hidden_sizes", "activation", "normalize_obs",
            "log_std_init", "spo_contexts")),
        ("optimisation", "The update: learning rates, epochs, minibatches, schedule.", (
            "actor_lr", "critic_lr", "epochs", "minibatches", "micro_batch_size", "max_tokens_per_micro_batch",
            "max_grad_norm", "lr_schedule", "warmup_updates")),
        ("policy-loss", "The surrogate: clipping, ratio, aggregation, advantage normalisation.", (
            "clip", "clip_high", "dual_clip", "agg", "ratio_level", "policy_loss", "tis_cap",
            "group_std_threshold", "grpo_std", "whiten", "ent_coef", "bppo_prefix_ratio",
            "bppo_accuracy_threshold", "lampo_temperature")),
        ("critic", "The critic: its targets and start.", (
            "critic_warmup", "value_clip", "gamma", "lam", "lam_critic", "lam_alpha")),
        ("evaluation", "Greedy evaluation, calibration and what is logged.", (
            "eval_every", "eval_episodes", "calibration_contexts", "calibration_samples", "threads", "progress",
            "tensorboard", "exp_name", "wandb", "wandb_mode", "wandb_project", "wandb_entity", "wandb_group",
            "wandb_tags", "extra")),
        ("run-folder", "Checkpoints, resuming and the run's budget.", (
            "resume", "overwrite", "checkpoint_every", "keep_checkpoints", "max_seconds")),
    ],
}  # fmt: skip
"""How ``sppo-rl llm`` and ``sppo-rl control`` group their flags in ``--help`` (and in tyro's parser): the
common group first (tyro's top-level options), then one group per topic, each listing flat keys
(:func:`sppo_rl.config.flat_keys`). Only the layout: every flag keeps its name and every key of
``config.json`` its spelling; a key no group names lands in a last "other" group."""

VIEW_ONLY: dict[str, tuple[object, object, str]] = {
    "recipe": (
        str | None,
        None,
        "A built-in recipe as the defaults, by name (`sppo-rl info` lists them); flags beside it win.",
    ),
    "recipe_file": (
        str | None,
        None,
        "Your own JSON recipe {field: value} as the defaults, read as untrusted data; flags beside it win.",
    ),
    "trust_recipe": (
        tyro.conf.FlagCreatePairsOff[bool],
        False,
        "Let a recipe file set fields that touch files, code or the network (else refused).",
    ),
}
"""Flags a command takes that are no config field (:func:`main` reads them before tyro parses the rest):
shown in the common group of every command with a layout, never saved in ``config.json``."""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal after it in the class body) of ``cls`` and its bases,
    unwrapped: one paragraph, single spaces, as ``--help`` shows it."""
    import ast
    import inspect
    import re
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or "__dataclass_fields__" not in vars(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        except (OSError, TypeError, IndexError, SyntaxError):  # a class built at run time: no source
            continue
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = re.sub(r"\s+", " ", after.value.value).strip()
    return docs


def _flat_fields(cls: type) -> dict[str, tuple[object, object, str]]:
    """``{flat key: (type hint with its markers, dataclass field of its default, help)}`` of ``cls``."""
    import dataclasses
    from typing import get_type_hints

    from sppo_rl.config import flat_keys

    out: dict[str, tuple[object, object, str]] = {}
    top = {f.name: f for f in dataclasses.fields(cls)}
    hints = get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    overrides = getattr(cls, "__sppo_help__", {})
    for key, (name, inner) in flat_keys(cls).items():
        if inner is None:
            out[key] = (hints[name], top[name], overrides.get(key, docs.get(name, "")))
        else:
            section = top[name].default_factory
            g = next(g for g in dataclasses.fields(section) if g.name == inner)
            out[key] = (
                get_type_hints(section, include_extras=True)[inner],
                g,
                field_docs(section).get(inner, ""),
            )
    return out


def flag_view(cls: type, command: str | None = None) -> type:
    """``cls`` as tyro parses it and ``--help`` shows it: one flag per flat key (``--lora-rank``, not tyro's
    ``--lora.rank``), each with its field's docstring unwrapped as its help; with a :data:`HELP_LAYOUT`
    for ``command``, the common flags first (with :data:`VIEW_ONLY`'s) and the rest in groups, one per
    topic. :func:`from_view` turns what tyro returns back into ``cls``, :func:`to_view` the other way."""
    import dataclasses
    from typing import Annotated

    fields = _flat_fields(cls)
    suppressed = getattr(cls, "__sppo_suppress__", ())
    layout = HELP_LAYOUT.get(command or "", [])

    def entry(key: str, named: bool) -> tuple:
        if key in VIEW_ONLY:
            tp, default, text = VIEW_ONLY[key]
            f = dataclasses.field(default=default)
        else:
            tp, f, text = fields[key]
            f = _same_default(f)
        marks = [tyro.conf.Suppress] if key in suppressed else []
        metavar = {"recipe": "NAME", "recipe_file": "FILE.json"}.get(key)
        arg = tyro.conf.arg(name=key.replace("_", "-"), prefix_name=False, help=text or None, metavar=metavar)
        return (
            key,
            Annotated[(tp, arg, *marks)]
            if named
            else Annotated[(tp, tyro.conf.arg(help=text or None), *marks)],
            f,
        )

    if not layout:
        view = [entry(key, named=False) for key in fields]
        out = dataclasses.make_dataclass(cls.__name__, view)
    else:
        placed = {key for _, _, keys in layout for key in keys}
        groups = [*layout, ("other", "Other settings.", tuple(k for k in fields if k not in placed))]
        view = []
        for name, text, keys in groups:
            keys = tuple(k for k in keys if k in fields or k in VIEW_ONLY)
            if not keys:
                continue
            if name == COMMON:
                view += [entry(k, named=True) for k in keys]
                continue
            group = dataclasses.make_dataclass(f"{cls.__name__}_{name}", [entry(k, named=True) for k in keys])
            group.__doc__, group.__sppo_group__ = text, True  # type: ignore[attr-defined]
            arg = tyro.conf.arg(name=name, help=text)
            view.append(
                (
                    name.replace("-", "_") + "_options",
                    Annotated[group, arg],
                    dataclasses.field(default_factory=group),
                )
            )
        out = dataclasses.make_dataclass(cls.__name__, view)
    out.__doc__, out.__module__ = cls.__doc__, cls.__module__
    out.__sppo_config__ = cls  # type: ignore[attr-defined]
    return out


def _view_values(value: object) -> dict[str, object]:
    """The flat ``{key: value}`` a view instance holds (its groups' fields in place)."""
    import dataclasses

    out: dict[str, object] = {}
    for f in dataclasses.fields(value):  # type: ignore[arg-type]
        v = getattr(value, f.name)
        if (
            dataclasses.is_dataclass(v)
            and not isinstance(v, type)
            and getattr(type(v), "__sppo_group__", False)
        ):
            out.update(_view_values(v))
        else:
            out[f.name] = v
    return out


def from_view(cls: type, value: object) -> object:
    """The ``cls`` a :func:`flag_view` instance stands for (its :data:`VIEW_ONLY` flags dropped)."""
    from sppo_rl.config import from_flat

    flat = {k: v for k, v in _view_values(value).items() if k not in VIEW_ONLY}
    return from_flat(cls, flat)


def to_view(view: type, cfg: object) -> object:
    """The :func:`flag_view` instance holding ``cfg``'s settings (for tyro's ``default``)."""
    import dataclasses

    from sppo_rl.config import flat_dict

    flat = flat_dict(cfg)
    values = {}
    for f in dataclasses.fields(view):
        kind = f.default_factory
        if getattr(kind, "__sppo_group__", False):
            values[f.name] = kind(**{g.name: flat[g.name] for g in dataclasses.fields(kind)})
        elif f.name in flat:
            values[f.name] = flat[f.name]
    return view(**values)


def command_of(cls: type) -> str | None:
    """The subcommand whose config ``cls`` is (or extends), None for another class."""
    for name, (kind, _) in _commands().items():
        if isinstance(cls, type) and issubclass(cls, kind):
            return name
    return None


def parse(cls: type, args: list[str], *, default: object | None = None, prog: str | None = None) -> object:
    """The ``cls`` that the flags ``args`` give (tyro's parser on :func:`flag_view`), from the defaults of
    ``default`` when given; exits as tyro does (status 2) on a flag it refuses. ``--recipe`` is read by
    :func:`main` before this parse: here it is refused."""
    view = flag_view(cls, command_of(cls))
    out = tyro.cli(view, default=None if default is None else to_view(view, default), args=args, prog=prog)
    if getattr(out, "recipe", None) is not None or getattr(out, "recipe_file", None) is not None:
        print(f"{prog or 'sppo-rl'}: error: --recipe and --recipe-file are not taken here", file=sys.stderr)
        sys.exit(2)
    return from_view(cls, out)


def _same_default(f: object) -> object:
    import dataclasses

    if f.default_factory is not dataclasses.MISSING:  # type: ignore[attr-defined]
        return dataclasses.field(default_factory=f.default_factory)  # type: ignore[attr-defined]
    return dataclasses.field(default=f.default)  # type: ignore[attr-defined]


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
    "max_steps": ("--steps", "TRL's max_steps"),
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
    "trainer.total_training_steps": ("--steps", "verl's trainer.total_training_steps"),
    "trainer.test_freq": ("--eval-every", "verl's trainer.test_freq"),
    "trainer.save_freq": ("--checkpoint-every", "verl's trainer.save_freq"),
    "rollout.name": ("--rollout", "verl's actor_rollout_ref.rollout.name"),
    "model.lora_rank": ("--lora-rank", "verl's actor_rollout_ref.model.lora_rank"),
    "data.prompt_key": ("--prompt-key", "verl's data.prompt_key"),
}  # fmt: skip
"""TRL's (``GRPOConfig``) and verl's names, each with this project's flag and whose name it is: the table
of docs/llm.md ("Coming from TRL or verl"), read when ``sppo-rl llm`` meets a flag it does not know."""


def _split_recipe(args: list[str]) -> list[str]:
    """``--recipe=NAME`` and ``--recipe-file=PATH`` as two arguments each (the form :func:`main` reads)."""
    out: list[str] = []
    for a in args:
        flag = a.split("=", 1)[0]
        out += [flag, a.split("=", 1)[1]] if flag in ("--recipe", "--recipe-file") and "=" in a else [a]
    return out


def known_flags(command: str, cls: type) -> set[str]:
    """Every ``--flag`` that ``sppo-rl <command>`` takes (``--no-`` forms included)."""
    keys = list(_flat_fields(cls))
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


def _recipes_folder() -> Path:
    return Path(__file__).parent / "recipes"


def recipe_names() -> list[str]:
    return sorted(p.stem for p in _recipes_folder().glob("*.json"))


def recipe_default(cls: type, args: list[str]) -> tuple[object | None, list[str]]:
    """``args`` without ``--recipe NAME``, ``--recipe-file PATH`` and ``--trust-recipe``, and the config
    the recipe gives as the defaults (None without one): :func:`load_recipe`, with the fields the other
    flags set as ``given``. RunError in one line if refused (both forms, a flag without its value)."""
    from sppo_rl.runtime.run import RunError

    forms = [f for f in ("--recipe", "--recipe-file") if f in args]
    if not forms:
        return None, args
    trust = "--trust-recipe" in args
    args = [a for a in args if a != "--trust-recipe"]
    if len(forms) > 1:
        raise RunError("--recipe and --recipe-file: give one recipe (a built-in name or a file)")
    i = args.index(forms[0])
    if i + 1 >= len(args) or args[i + 1].startswith("--"):
        raise RunError(f"{forms[0]} needs {'a name' if forms[0] == '--recipe' else 'a file'}")
    rest = args[:i] + args[i + 2 :]
    source = {"name": args[i + 1]} if forms[0] == "--recipe" else {"file": args[i + 1]}
    return load_recipe(cls, **source, trust=trust, given=cli_fields(rest)), rest


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
                if hasattr(cfg, "validate"):
                    cfg.validate()  # every setting's type and range, before any work
                if command in ("llm", "control"):
                    run(cfg, command=True)  # the wall time printed at the end is the process's
                else:
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
