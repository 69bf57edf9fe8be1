"""Actor files of the control world: where a run's initial weights come from (``--init-from``), and
the ``{"arch", "actor", "meta"}`` file a warm start and a finished run (``final.pt``) are saved as. Every
file is read with ``weights_only`` (:func:`sppo_rl.runtime.checkpoint.torch_load`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from sppo_rl.control.networks import Actor
from sppo_rl.runtime.checkpoint import CheckpointManager, torch_load
from sppo_rl.runtime.files import atomic_write_bytes
from sppo_rl.runtime.run import RunError

WARMSTART_DIR = Path(__file__).resolve().parent.parent / "assets" / "warmstart"


def resolve_init(init_from: str, task: str) -> Path | None:
    """Where the actor's initial weights come from (None: random init)."""
    if init_from == "none":
        return None
    if init_from == "auto":
        path = WARMSTART_DIR / f"{task}.pt"
        return path if path.exists() else None
    path = Path(init_from)
    if path.is_dir():
        for candidate in (path / "final.pt", path / "warmstart.pt"):
            if candidate.exists():
                return candidate
        ckpts = CheckpointManager(path / "checkpoints").latest()
        if ckpts is not None:
            return ckpts / "state.pt"
        raise RunError(f"--init-from {path}: no final.pt, warmstart.pt or checkpoint inside")
    if not path.exists():
        raise RunError(f"--init-from {path}: no such file")
    return path


def load_actor_file(path: Path) -> Actor:
    """An :class:`Actor` from a warm-start / final file (``{"arch", "actor"}``) or a run checkpoint."""
    blob = torch_load(path)
    if "arch" not in blob or "actor" not in blob:
        raise RunError(f"{path} is not an actor file (expected keys 'arch' and 'actor')")
    actor = Actor(**blob["arch"])
    actor.load_state_dict(blob["actor"])
    return actor


def check_init_actor(path: Path, spec: Any) -> None:
    """Refuse, in one line naming it, an ``--init-from`` file that is not a readable actor file or was
    made for another observation/action space than ``spec``'s (read under a forked RNG: checking
    draws no random numbers)."""
    try:
        with torch.random.fork_rng(devices=[]):
            actor = load_actor_file(path)
    except RunError:
        raise
    except Exception as e:  # torch / pickle / a state dict that does not fit: anything unreadable
        first = (str(e).strip().splitlines() or [""])[0][:300]
        kind = type(e).__qualname__
        if type(e).__module__ != "builtins":
            kind = f"{type(e).__module__}.{kind}"
        raise RunError(f"--init-from {path}: not a readable actor file ({kind}: {first})") from None
    if actor.obs_dim != spec.obs_dim or actor.discrete != spec.discrete:
        raise RunError(f"--init-from {path} was made for another observation/action space than {spec.name}")


def save_actor_file(path: Path, actor: Actor, meta: dict[str, Any]) -> None:
    """Write the actor file ``{"arch", "actor", "meta"}`` at ``path`` atomically
    (:func:`sppo_rl.runtime.files.atomic_write_bytes`)."""
    buffer = io.BytesIO()
    torch.save({"arch": actor.arch(), "actor": actor.state_dict(), "meta": meta}, buffer)
    atomic_write_bytes(path, buffer.getvalue())
