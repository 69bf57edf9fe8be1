"""Run plumbing shared by both worlds: checkpoints, metrics, preemption, numerical guards."""

from sppo_rl.runtime.checkpoint import CheckpointManager, read_meta
from sppo_rl.runtime.files import atomic_write_text
from sppo_rl.runtime.logging import RunLogger, read_metrics
from sppo_rl.runtime.run import (
    NonFiniteError,
    Preemption,
    RunError,
    check_finite,
    prepare_run_dir,
    save_config,
)

__all__ = [
    "CheckpointManager",
    "NonFiniteError",
    "Preemption",
    "RunError",
    "RunLogger",
    "atomic_write_text",
    "check_finite",
    "prepare_run_dir",
    "read_meta",
    "read_metrics",
    "save_config",
]
