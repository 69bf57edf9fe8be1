"""Naming and loading reward functions.

In the parent, without running user code: :func:`split_specs` splits ``"a,b"`` or a list into one name
per function, :func:`_resolve_spec` checks each (a built-in name, ``"path/to/file.py:function"``,
``"package.module:function"`` or a picklable callable) into the spec a worker is sent, and
:func:`spec_name` gives its short name for the metrics. In the worker: :func:`_load_all` loads the
callables a spec names (the built-ins with their internal deadline), :func:`call_style` tells this
project's ``fn(response, ground_truth)`` from TRL's ``fn(completions, **columns)``, and :func:`_trl_call`
calls the latter on one item.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

BUILTIN = ("math", "integer", "boxed-or-last-number")


class RewardFnError(ValueError):
    """The reward function cannot be loaded: a missing file or module, no such function, not callable."""


def _resolve_spec(fn: str | Callable[..., Any]) -> tuple[str, Any]:
    """Check ``fn`` in the parent, without running user code; the worker loads it.

    Returns ``("builtin", name)``, ``("file", (abs_path, function))``, ``("module", (module, function))``
    or ``("pickled", bytes)``.
    """
    if callable(fn):
        try:
            return "pickled", pickle.dumps(fn)
        except Exception as e:
            raise RewardFnError(
                f"reward function {fn!r} cannot be sent to a worker process ({e}); pass a module-level "
                "function or a 'module:function' / 'path/to/file.py:function' string"
            ) from None
    if not isinstance(fn, str):
        raise RewardFnError(
            f"reward function must be a name, a 'module:function' string or a callable, got {fn!r}"
        )
    if fn in BUILTIN:
        return "builtin", fn
    target, sep, name = fn.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise RewardFnError(
            f"unknown reward function {fn!r}; use one of {', '.join(BUILTIN)}, "
            "'path/to/file.py:function' or 'package.module:function'"
        )
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise RewardFnError(f"reward function file not found: {target} (in {fn!r})")
        return "file", (str(path), name)
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError) as e:
        raise RewardFnError(f"cannot import reward module {target!r} (in {fn!r}): {e}") from None
    if found is None:
        raise RewardFnError(f"reward module not found: {target!r} (in {fn!r})")
    return "module", (target, name)


def split_specs(fn: str | Callable[..., Any] | Sequence[str | Callable[..., Any]]) -> list[Any]:
    """The reward functions ``fn`` names: a list as is, a string split at commas (``"math,f.py:g"``),
    anything else alone."""
    if isinstance(fn, str):
        parts = [p.strip() for p in fn.split(",")]
        if len(parts) > 1 and not all(parts):
            raise RewardFnError(f"empty name in the reward function list {fn!r}")
        return parts
    if isinstance(fn, (list, tuple)):
        if not fn:
            raise RewardFnError("no reward function given")
        return list(fn)
    return [fn]


def spec_name(fn: str | Callable[..., Any]) -> str:
    """A short name of a reward function for its metrics: ``math``, the function of ``f.py:name``."""
    if isinstance(fn, str):
        return fn.rpartition(":")[2] or fn
    return getattr(fn, "__name__", type(fn).__name__)


def call_style(fn: Callable[..., Any]) -> str:
    """``"trl"`` if ``fn`` has a parameter named ``completions`` (TRL's ``f(completions, **columns)``
    over a batch), else ``"pair"`` (``f(response, ground_truth)``); a callable whose signature cannot be
    read is ``"pair"``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "pair"
    return "trl" if "completions" in params else "pair"


def _trl_call(fn: Callable[..., Any], response: str, truth: str, columns: Mapping[str, Any]) -> Any:
    """One item through a TRL-style function: keyword lists of length 1; its one value."""
    given = {k: [v] for k, v in columns.items() if k not in ("completions", "answer")}
    given.update(completions=[response], answer=[truth])
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        needed = [
            n
            for n, p in params.items()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in given
        ]
        if needed:
            raise TypeError(f"needs column(s) {', '.join(needed)}; the data gives {', '.join(sorted(given))}")
        given = {k: v for k, v in given.items() if k in params}
    out = fn(**given)
    if isinstance(out, np.ndarray):
        out = out.tolist()
    if not isinstance(out, (list, tuple)) or len(out) != 1:
        what = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
        raise TypeError(
            f"returned {what} for 1 completion (a TRL-style function returns a list, one per completion)"
        )
    return out[0]


def _load_all(kind: str, spec: Any, inner_timeout_s: float) -> list[tuple[Callable[..., Any], str]]:
    """Inside the worker: the callables (each with its :func:`call_style`) of a ``"several"`` spec."""
    specs = spec if kind == "several" else [(kind, spec)]
    fns = [_load(k, s, inner_timeout_s) for k, s in specs]
    return [(fn, call_style(fn)) for fn in fns]


def _load(kind: str, spec: Any, inner_timeout_s: float) -> Callable[[str, str], Any]:
    """Inside the worker: the callable the spec names."""
    if kind == "builtin":
        from sppo_rl.llm.rewards.symbolic import warm_up
        from sppo_rl.llm.rewards.verify import verify_boxed_or_last_number, verify_integer, verify_math

        if spec == "math":
            warm_up()
            return partial(verify_math, timeout_s=inner_timeout_s)
        if spec == "boxed-or-last-number":
            warm_up()
            return partial(verify_boxed_or_last_number, timeout_s=inner_timeout_s)
        return verify_integer
    if kind == "pickled":
        fn = pickle.loads(spec)
    else:
        where, name = spec
        if kind == "file":
            mod_name = f"_sppo_reward_{abs(hash(where)):x}"
            file_spec = importlib.util.spec_from_file_location(mod_name, where)
            if file_spec is None or file_spec.loader is None:
                raise RewardFnError(f"cannot load {where} as a Python module")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[mod_name] = module
            file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        if not hasattr(module, name):
            public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
            raise RewardFnError(
                f"{where} has no function {name!r} (callables there: {', '.join(public) or 'none'})"
            )
        fn = getattr(module, name)
    if not callable(fn):
        raise RewardFnError(f"reward function {fn!r} is not callable")
    return fn
