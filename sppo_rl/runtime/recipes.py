"""Recipes: JSON files ``{field: value}`` that give a command's defaults, the package's built-in ones
(``--recipe NAME``, trusted) and the user's own (``--recipe-file PATH``, read as untrusted data: fields
that touch files, code or the network are refused unless ``--trust-recipe``)."""

from __future__ import annotations

from pathlib import Path

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
        file = Path(file)  # type: ignore[arg-type]  # one of name and file is given
        if not file.is_file():
            raise RunError(f"--recipe-file {file}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
        values = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_recipe_int)
    except _DuplicateKey as e:
        key = re.compile(rf'"{re.escape(str(e))}"\s*:')
        found = [i for i, t in enumerate(text.splitlines(), 1) if key.search(t)]
        at = f":{found[1]}" if len(found) > 1 else ""
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


def _recipes_folder() -> Path:
    return Path(__file__).parent.parent / "recipes"


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
