"""The typed seams of the packages the type checker checks (``[tool.mypy] files`` in ``pyproject.toml``;
``make typecheck`` runs mypy on them, ``make test`` runs it first).

mypy's ``--strict`` wants every signature annotated but takes ``Any`` as an annotation; here a function's
parameters and return, and a class's declared attributes, may not be a bare ``Any`` (alone or in a union:
``x: Any``, ``-> Any | None``) unless :data:`ALLOWED` names it with the reason. ``dict[str, Any]`` (a metrics
row, a JSON object) stays allowed. And every ``# type: ignore[code]`` there says why, in a comment after it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]

ALLOWED = {
    "sppo_rl/runtime/checkpoint.py:torch_load -> return": "whatever the checkpoint file holds",
    "sppo_rl/runtime/logging.py:json_safe -> return": "a JSON value: a dict, list, number, string or None",
    "sppo_rl/runtime/plan.py:RunPlan.given": "the config as the user gave it, of the world's own class",
}
"""``<file>:<function> -> <parameter or return>`` or ``<file>:<class>.<attribute>``: the reason it is ``Any``."""


def checked_files() -> list[Path]:
    """The Python files under ``[tool.mypy] files``."""
    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    out: list[Path] = []
    for entry in files:
        path = REPO / entry
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def _bare_any(node: ast.expr | None) -> bool:
    """Whether an annotation is ``Any``, or a ``|`` union with ``Any`` as one member."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.Name):
        return node.id == "Any"
    if isinstance(node, ast.Attribute):
        return node.attr == "Any"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _bare_any(node.left) or _bare_any(node.right)
    return False


def bare_any_annotations(path: Path, root: Path = REPO) -> list[str]:
    """``<file>:<function> -> <parameter or return>`` and ``<file>:<class>.<attribute>`` of every bare
    ``Any`` annotation in ``path`` (``<file>`` relative to ``root``)."""
    rel = path.relative_to(root).as_posix()
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            found += [f"{rel}:{node.name} -> {p.arg}" for p in params if _bare_any(p.annotation)]
            if _bare_any(node.returns):
                found.append(f"{rel}:{node.name} -> return")
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and _bare_any(st.annotation):
                    found.append(f"{rel}:{node.name}.{ast.unparse(st.target)}")
    return found


def test_the_checked_packages_are_named():
    names = {p.relative_to(REPO).parts[:2] for p in checked_files()}
    assert {("sppo_rl", "agents"), ("sppo_rl", "runtime")} <= names


def test_signatures_are_not_bare_any():
    found = [hit for path in checked_files() for hit in bare_any_annotations(path)]
    assert [hit for hit in found if hit not in ALLOWED] == []


def test_bare_any_is_found(tmp_path):
    """The check itself: each form it refuses is found, and ``dict[str, Any]`` is not."""
    (tmp_path / "m.py").write_text(
        "from typing import Any\n"
        "def f(a: Any, b: 'Any | None', *c: Any, d: dict[str, Any], **e: Any) -> typing.Any: ...\n"
        "class C:\n    x: Any\n    y: dict[str, Any]\n"
    )
    hits = bare_any_annotations(tmp_path / "m.py", tmp_path)
    assert hits == [f"m.py:f -> {x}" for x in ("a", "b", "c", "e", "return")] + ["m.py:C.x"]


def test_type_ignores_give_a_reason():
    """``# type: ignore[code]  # why``: a code (mypy checks that too) and a reason after it."""
    bare = []
    for path in checked_files():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line and not re.search(r"# type: ignore\[[a-z-, ]+\]\s+#\s*\S", line):
                bare.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert bare == []
