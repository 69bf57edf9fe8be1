"""Run outputs: ``metrics.jsonl`` (one row per update), TensorBoard events, optional wandb.

``metrics.jsonl`` is opened for appending and flushed after every row. A checkpoint records the file's
length when it was taken (:meth:`RunLogger.position`); on ``--resume`` the rows written after that
checkpoint (work that the resumed run redoes) are cut off at exactly that length, so every row before
the checkpoint is kept byte for byte and no update appears twice. A file shorter than that length (or
missing) has lost rows the checkpoint counts on: resuming is refused rather than appending to it.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any

from sppo_rl.runtime.run import RunError

LOSS_KEYS = {
    "policy_loss",
    "value_loss",
    "critic_bce",
    "clipfrac",
    "approx_kl",
    "approx_kl_k3",
    "entropy",
    "explained_variance",
    "grad_norm",
    "critic_grad_norm",
    "kl",
}


def _clean(value: Any) -> Any:
    """JSON-safe scalars: non-finite floats become null, tensors and numpy scalars plain numbers."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def tb_tag(key: str) -> str:
    """CleanRL-style tag: ``losses/<key>`` for optimisation diagnostics, ``charts/<key>`` otherwise."""
    if "/" in key:
        return key
    return f"losses/{key}" if key in LOSS_KEYS else f"charts/{key}"


class RunLogger:
    """Append metric rows to ``out_dir/metrics.jsonl`` and mirror numbers to TensorBoard / wandb.

    Args:
        out_dir: the run folder.
        config: the resolved config (stored with the wandb run).
        tensorboard: write ``out_dir/tb`` events.
        wandb: also log to wandb (``wandb_mode`` "offline" by default: nothing leaves the machine).
        resume_position: byte length of ``metrics.jsonl`` recorded by the checkpoint being resumed.
        resume_step: that checkpoint's step; TensorBoard events after it are purged.
    """

    def __init__(
        self,
        out_dir: str | Path,
        config: dict[str, Any] | None = None,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "sppo_rl",
        wandb_mode: str = "offline",
        resume_position: int | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        if resume_position is not None:
            check_metrics_length(self.path, resume_position)
        if resume_position is not None and self.path.exists() and self.path.stat().st_size > resume_position:
            with open(self.path, "r+b") as f:
                f.truncate(resume_position)
        elif resume_position is None and self.path.exists():
            self.path.unlink()  # a fresh run in a reused folder starts a fresh file
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(log_dir=str(self.out_dir / "tb"), purge_step=purge)
        self._wandb = None
        if wandb:
            import wandb as wandb_lib

            id_file = self.out_dir / "wandb_id.txt"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
            id_file.write_text(run_id)
            self._wandb = wandb_lib.init(
                project=wandb_project,
                dir=str(self.out_dir),
                config=config or {},
                id=run_id,
                resume="allow",
                mode=wandb_mode,
                name=self.out_dir.name,
            )

    def position(self) -> int:
        """Byte length of ``metrics.jsonl`` after everything logged so far."""
        self._file.flush()
        return self._file.tell()

    def log(self, row: dict[str, Any], step: int) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in numbers.items():
                self._tb.add_scalar(tb_tag(k), v, step)
        if self._wandb is not None:
            self._wandb.log({tb_tag(k): v for k, v in numbers.items()}, step=step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_metrics_length(path: Path, recorded: int) -> None:
    """Refuse (:class:`RunError`, naming both sizes) a metrics file shorter than the ``recorded`` byte
    length a checkpoint counts on: appending to it would glue a torn row to the next one and lose rows."""
    size = path.stat().st_size if path.exists() else None
    if recorded > 0 and (size is None or size < recorded):
        have = "is missing" if size is None else f"holds {size} bytes"
        raise RunError(
            f"--resume: {path} {have} but the checkpoint recorded {recorded} bytes of metrics; rows were "
            "lost, so the run is not continued (restore the file, or start over with --overwrite)"
        )


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` (a torn last line, from a crash mid-write, is skipped)."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def start_logging(
    out_dir: str | Path, cfg: Any, resolved: dict[str, Any], resume_from: Path | None
) -> RunLogger:
    """Write ``config.json`` (the config plus its ``resolved`` settings) and open the run's metrics log,
    continuing after the checkpoint ``resume_from`` when resuming. ``cfg`` carries the logging fields
    every run config has (``tensorboard``, ``wandb``, ``wandb_project``, ``wandb_mode``)."""
    from sppo_rl.runtime.checkpoint import read_meta
    from sppo_rl.runtime.run import config_dict, save_config

    record = {**config_dict(cfg), "resolved": resolved}
    meta = read_meta(resume_from) if resume_from is not None else None
    if meta is not None:  # before anything is written
        check_metrics_length(Path(out_dir) / "metrics.jsonl", meta["metrics_bytes"])
    save_config(out_dir, record)
    return RunLogger(
        out_dir,
        record,
        tensorboard=cfg.tensorboard,
        wandb=cfg.wandb,
        wandb_project=cfg.wandb_project,
        wandb_mode=cfg.wandb_mode,
        resume_position=meta["metrics_bytes"] if meta else None,
        resume_step=meta["step"] if meta else None,
    )
