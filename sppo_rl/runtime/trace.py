"""The critic trace: what a run's critic says along sampled sequences, written by both worlds at the
end of a run (``critic_trace.npz``) and read by the tail-effect diagnostic (:mod:`sppo_rl.experiments.tail`).

Schema: ``kind`` ``"step"`` or ``"sequence"``; ``lengths`` ``[N]``; ``success`` ``[N]`` (the outcome
``R``; ``R > 0.5`` counts as success); ``horizon``; step critics: ``values`` ``[N, T]``, ``V(s_t)`` in
reward units (a BCE-trained critic's ``sigmoid``), zero past each length; sequence critics: ``v0``
``[N]``, ``sigmoid V(s_0)``.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRACE_FILE = "critic_trace.npz"


@dataclass
class Trace:
    """One ``critic_trace.npz`` (see the module docstring)."""

    kind: str
    lengths: np.ndarray  # [N] int
    success: np.ndarray  # [N] bool
    horizon: int
    values: np.ndarray | None = None  # [N, T] float, step critics
    v0: np.ndarray | None = None  # [N] float, sequence critics


def load_trace(path: str | Path) -> Trace:
    """Read and check a ``critic_trace.npz``; ``ValueError`` says what is wrong with a malformed one."""
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a missing, torn or foreign file
        raise ValueError(f"{path}: not a readable npz file ({e})") from None
    missing = {"kind", "lengths", "success"} - set(data)
    if missing:
        raise ValueError(f"{path}: missing {', '.join(sorted(missing))}")
    kind = str(data["kind"])
    lengths = np.asarray(data["lengths"]).astype(int).ravel()
    success = np.asarray(data["success"], dtype=float).ravel() > 0.5
    if len(lengths) != len(success):
        raise ValueError(f"{path}: {len(lengths)} lengths but {len(success)} outcomes")
    horizon = int(data["horizon"]) if "horizon" in data else int(lengths.max(initial=0))
    if kind == "step":
        values = np.asarray(data.get("values"), dtype=float)
        if values.ndim != 2 or values.shape[0] != len(lengths) or (lengths > values.shape[1]).any():
            raise ValueError(f"{path}: step trace needs values [N, T] with T >= every length")
        if values.shape[1] == 0:
            raise ValueError(f"{path}: step trace without a single position")
        return Trace(kind, lengths, success, horizon, values=values)
    if kind == "sequence":
        v0 = np.asarray(data.get("v0"), dtype=float).ravel()
        if v0.shape != lengths.shape:
            raise ValueError(f"{path}: sequence trace needs v0 [N]")
        return Trace(kind, lengths, success, horizon, v0=v0)
    raise ValueError(f"{path}: unknown kind {kind!r} (step or sequence)")


def write_trace(
    path: str | Path, values: np.ndarray, lengths: np.ndarray, success: np.ndarray, horizon: int
) -> None:
    """Write a trace from a critic's output in value units: ``[N]`` (a sequence critic's ``V(s_0)``)
    or ``[N, T]`` (a step critic's ``V(s_t)``, zeroed past each length); the shape gives the kind."""
    values, lengths = np.asarray(values, dtype=np.float32), np.asarray(lengths).astype(int)
    out = {"lengths": lengths, "success": np.asarray(success, dtype=np.float32), "horizon": np.array(horizon)}
    if values.ndim == 1:
        out.update(kind=np.array("sequence"), v0=values)
    else:
        inside = np.arange(values.shape[1])[None] < lengths[:, None]
        out.update(kind=np.array("step"), values=np.where(inside, values, 0.0).astype(np.float32))
    np.savez_compressed(path, **out)  # type: ignore[arg-type]  # numpy's stubs: a ** key could be allow_pickle
