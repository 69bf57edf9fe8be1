"""A config class as command-line flags: :func:`flag_view` gives tyro one flag per flat key (the
``--help`` layout of ``sppo-rl llm`` and ``sppo-rl control`` in :data:`HELP_LAYOUT`), :func:`parse` turns
flags into the config. Below the worlds and the command line: it names no config class by import, so
``sppo_rl.cli``, the sweep and ``python -m sppo_rl.llm.latent`` parse flags the same way through it."""

from __future__ import annotations

import sys
from typing import Any

import tyro

COMMON = "common"
"""The name of the group of a command's first, most-set flags (tyro's top-level options)."""


HELP_LAYOUT: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "llm": [
        (COMMON, "", ("algo", "model", "task", "updates", "out_dir", "recipe", "recipe_file", "trust_recipe", "reward_fn", "seed")),
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
            "bppo_accuracy_threshold", "lampo_temperature", "astar_samples", "astar_beta1", "astar_beta2")),
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
            "device", "threads", "dtype", "precision", "engine", "zero_stage", "offload", "gradient_checkpointing",
            "shared_prompt", "collective_timeout", "rollout", "vllm_max_model_len", "vllm_gpu_memory_utilization", "vllm_sleep",
            "vllm_dtype", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "export_adapter")),
        ("async", "Asynchronous rollouts: a sampler process working ahead of the learner, and the correction.", (
            "max_staleness", "rollout_worker", "rollout_threads", "off_policy")),
        ("evaluation", "Validation and what is logged.", (
            "eval_every", "eval_samples", "log_completions_every", "progress", "tensorboard", "exp_name",
            "wandb", "wandb_mode", "wandb_project", "wandb_entity", "wandb_group", "wandb_tags", "extra")),
        ("run-folder", "Checkpoints, resuming and the run's budget.", (
            "resume", "overwrite", "resume_without_optimizer", "checkpoint_every", "keep_checkpoints",
            "optimizer_state", "max_seconds")),
    ],
    "control": [
        (COMMON, "", ("algo", "task", "total_episodes", "out_dir", "recipe", "recipe_file", "trust_recipe", "init_from", "dense",
                      "seed", "seeds")),
        ("environment", "The task's success test, batch and networks.", (
            "success", "episodes_per_update", "group_size", "hidden_sizes", "activation", "normalize_obs",
            "log_std_init", "spo_contexts")),
        ("optimisation", "The update: learning rates, epochs, minibatches, schedule.", (
            "actor_lr", "critic_lr", "epochs", "minibatches", "micro_batch_size", "max_tokens_per_micro_batch",
            "max_grad_norm", "lr_schedule", "warmup_updates")),
        ("policy-loss", "The surrogate: clipping, ratio, aggregation, advantage normalisation.", (
            "clip", "clip_high", "dual_clip", "agg", "ratio_level", "policy_loss", "tis_cap",
            "group_std_threshold", "grpo_std", "whiten", "ent_coef", "bppo_prefix_ratio",
            "bppo_accuracy_threshold", "lampo_temperature", "astar_samples", "astar_beta1", "astar_beta2")),
        ("critic", "The critic: its targets and start.", (
            "critic_warmup", "value_clip", "gamma", "lam", "lam_critic", "lam_alpha")),
        ("evaluation", "Greedy evaluation, calibration, what is logged, threads and compiling.", (
            "eval_every", "eval_episodes", "calibration_contexts", "calibration_samples", "threads", "compile", "progress",
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
"""Flags a command takes that are no config field (:func:`sppo_rl.cli.main` reads them before tyro parses the rest):
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
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]  # a class body
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


def flat_fields(cls: type) -> dict[str, tuple[object, object, str]]:
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
            section: Any = top[name].default_factory  # the section's class
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

    fields = flat_fields(cls)
    suppressed = getattr(cls, "__sppo_suppress__", ())
    layout = HELP_LAYOUT.get(command or "", [])

    def entry(key: str, named: bool) -> tuple[str, Any, Any]:
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
            group.__doc__, group.__sppo_group__ = text, True  # type: ignore[attr-defined]  # our mark on the class
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
    out.__sppo_config__ = cls  # type: ignore[attr-defined]  # our mark on the class
    return out


def _view_values(value: object) -> dict[str, object]:
    """The flat ``{key: value}`` a view instance holds (its groups' fields in place)."""
    import dataclasses

    out: dict[str, object] = {}
    for f in dataclasses.fields(value):  # type: ignore[arg-type]  # a view is a dataclass
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
        kind: Any = f.default_factory  # a section's class, or MISSING
        if getattr(kind, "__sppo_group__", False):
            values[f.name] = kind(**{g.name: flat[g.name] for g in dataclasses.fields(kind)})
        elif f.name in flat:
            values[f.name] = flat[f.name]
    return view(**values)


LAYOUT_OF: dict[str, str] = {
    "sppo_rl.llm.config.LLMConfig": "llm",
    "sppo_rl.control.config.ControlConfig": "control",
}
"""The config classes with a :data:`HELP_LAYOUT`, as ``module.Name`` (this module imports no world), each
with its command: ``sppo-rl llm`` parses :class:`~sppo_rl.llm.config.LLMConfig`, ``sppo-rl control``
:class:`~sppo_rl.control.config.ControlConfig`."""


def layout_command(cls: type) -> str | None:
    """The command of :data:`LAYOUT_OF` whose config ``cls`` is or extends (first in its MRO), None for
    any other class (flags without groups)."""
    for klass in getattr(cls, "__mro__", ()):
        command = LAYOUT_OF.get(f"{klass.__module__}.{klass.__qualname__}")
        if command is not None:
            return command
    return None


def parse(cls: type, args: list[str], *, default: object | None = None, prog: str | None = None) -> object:
    """The ``cls`` that the flags ``args`` give (tyro's parser on :func:`flag_view`), from the defaults of
    ``default`` when given; exits as tyro does (status 2) on a flag it refuses. ``--recipe`` is read by
    :func:`sppo_rl.cli.main` before this parse: here it is refused. The flags are laid out as the
    command's whose config ``cls`` is (:func:`layout_command`)."""
    view = flag_view(cls, layout_command(cls))
    out = tyro.cli(view, default=None if default is None else to_view(view, default), args=args, prog=prog)
    if getattr(out, "recipe", None) is not None or getattr(out, "recipe_file", None) is not None:
        print(f"{prog or 'sppo-rl'}: error: --recipe and --recipe-file are not taken here", file=sys.stderr)
        sys.exit(2)
    return from_view(cls, out)


def _same_default(f: object) -> object:
    import dataclasses

    if f.default_factory is not dataclasses.MISSING:  # type: ignore[attr-defined]  # f: a dataclasses.Field
        return dataclasses.field(default_factory=f.default_factory)  # type: ignore[attr-defined]  # likewise
    return dataclasses.field(default=f.default)  # type: ignore[attr-defined]  # likewise
