"""The package's shape: no import circle anywhere in ``sppo_rl/`` (imports inside functions count: a lazy
import that closes a circle is still one), and one import path per name (no module re-exports what it
imports, apart from a package's ``__init__``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "sppo_rl"


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:`` (never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    lines.add(sub.lineno)
    return lines


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``sppo_rl`` modules it imports anywhere in its body (``from a.b import c`` counts
    ``a.b``, and ``a.b.c`` when that is a module)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("sppo_rl")
            ):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_a_circle_of_lazy_imports():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    graph = import_graph()
    assert "sppo_rl.llm.trainer" in graph["sppo_rl.api"]  # imported inside train_llm: lazy imports count
    assert circles(graph) == []


LLM_MODULE_LINES = 650
"""About 600 lines: the most a module under ``sppo_rl/llm`` may hold (room left for a docstring or a check)."""


def test_no_llm_module_is_a_grab_bag():
    """Each module under ``sppo_rl/llm`` does one job, which keeps it under about 600 lines (before the
    split: ``models/core.py`` 928, ``rewards/verify.py`` 943, ``rewards/scorer.py`` 812,
    ``rollout/vllm.py`` 755)."""
    sizes = {
        str(path.relative_to(ROOT.parent)): len(path.read_text().splitlines())
        for path in (ROOT / "llm").rglob("*.py")
    }
    assert {path: n for path, n in sizes.items() if n > LLM_MODULE_LINES} == {}


def test_no_module_reexports_what_it_imports():
    """A ``# noqa: F401`` on an import outside a package's ``__init__`` is a second import path for a name;
    a side-effect import (``import sppo_rl.x``, registering something) is allowed."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "noqa: F401" in line and line.lstrip().startswith("from "):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{n}")
    assert offenders == []


RANKS = {
    "agents": 0,
    "config": 0,  # the settings base every world's config derives from; imports nothing of ours
    "runtime": 1,
    "envs": 2,
    "llm": 3,
    "control": 3,
    "experiments": 4,
    "api": 5,
    "cli": 5,
    "demo": 5,
    "__main__": 5,
}
"""Layers, lowest first: the shared core (agents) <- run plumbing (runtime) <- the control testbed (envs)
<- the two worlds (llm, control) <- what compares runs (experiments) <- the faces (api, cli, demo). The
package's own ``__init__`` (``sppo_rl``: ``__version__``, the testbed's registration, the API loaded on
first use) is outside the layers: Python runs it before any of its modules, whoever imports what."""

UPWARD_ALLOWED: dict[tuple[str, str], str] = {}
"""Imports that run up the layers on purpose, each with its reason."""


def rank(module: str) -> int | None:
    """The layer of ``module`` (:data:`RANKS`, by the first part of its name below ``sppo_rl``); None for
    the package's ``__init__`` and for a part not in :data:`RANKS`."""
    parts = module.split(".")
    return RANKS.get(parts[1]) if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every ``(importer, imported)`` pair where the imported module sits in a higher layer (the package's
    ``__init__`` on either side is no pair)."""
    pairs = ((a, b) for a, targets in graph.items() for b in targets if "." in a and "." in b)
    return sorted((a, b) for a, b in pairs if rank(b) > rank(a))


def test_the_layer_check_finds_an_upward_import():
    graph = {"sppo_rl.control.trainer": {"sppo_rl.experiments.protocol", "sppo_rl.runtime.loop"}}
    assert upward_imports(graph) == [("sppo_rl.control.trainer", "sppo_rl.experiments.protocol")]
    assert upward_imports({"sppo_rl.cli": {"sppo_rl.agents.learner"}, "sppo_rl.llm.x": {"sppo_rl"}}) == []


def test_no_import_runs_up_the_layers():
    """A module imports only modules of its own layer or lower (:data:`RANKS`), lazy imports included;
    the exceptions are listed with their reason (:data:`UPWARD_ALLOWED`)."""
    graph = import_graph()
    assert sorted(m for m in graph if "." in m and rank(m) is None) == []  # a new part needs a layer
    found = upward_imports(graph)
    assert [pair for pair in found if pair not in UPWARD_ALLOWED] == []
    assert [pair for pair in UPWARD_ALLOWED if pair not in found] == []  # a fixed one leaves the list
