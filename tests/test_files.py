"""Atomic file writes (:mod:`sppo_rl.runtime.files`): one helper, used by every file the package
publishes by rename (a temporary file beside the target, fsynced, renamed into place, folder fsynced)."""

from __future__ import annotations

import ast
import io
import stat
from pathlib import Path

import pytest
import torch

from sppo_rl.runtime.files import atomic_write_bytes, atomic_write_text, current_umask

ROOT = Path(__file__).resolve().parents[1] / "sppo_rl"


def test_atomic_write_replaces_the_file_whole_with_the_umask_mode_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    atomic_write_text(target, "new ü\n")
    assert target.read_bytes() == "new ü\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~current_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")

    with pytest.raises(TypeError):  # the write fails (text where bytes go) after the temporary exists
        atomic_write_bytes(target, "new")  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_an_actor_file_holds_what_torch_save_writes(tmp_path):
    from sppo_rl.control.actor_files import load_actor_file, save_actor_file
    from sppo_rl.control.networks import Actor

    torch.manual_seed(0)
    actor = Actor(obs_dim=4, action_dim=2, discrete=True, hidden_sizes=(8,))
    save_actor_file(tmp_path / "final.pt", actor, {"task": "t"})
    expected = io.BytesIO()
    torch.save({"arch": actor.arch(), "actor": actor.state_dict(), "meta": {"task": "t"}}, expected)
    assert (tmp_path / "final.pt").read_bytes() == expected.getvalue()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.pt"]
    assert load_actor_file(tmp_path / "final.pt").arch() == actor.arch()


def _renames_a_file(node: ast.Call) -> bool:
    """``os.replace(a, b)``, or ``x.replace(y)`` / ``x.rename(y)`` on a name that says temporary."""
    f = node.func
    if not isinstance(f, ast.Attribute) or f.attr not in ("replace", "rename"):
        return False
    if isinstance(f.value, ast.Name) and f.value.id == "os":
        return f.attr == "replace"
    return len(node.args) == 1 and "tmp" in ast.unparse(f.value).lower()


def test_no_module_but_the_helper_renames_a_temporary_file_into_place():
    """A file written as temporary + rename anywhere else is a second atomic-write helper (with its own
    fsync and clean-up rules); folders published by ``os.rename`` (checkpoints, caches) are another job."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path == ROOT / "runtime" / "files.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _renames_a_file(node):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert offenders == []
