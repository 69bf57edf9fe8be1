"""Run outputs: ``metrics.jsonl`` (one row per update), TensorBoard events, optional wandb.

``metrics.jsonl`` is opened for appending and flushed after every row. A checkpoint records the file's
length when it was taken (:meth:`RunLogger.position`); on ``--resume`` the rows written after that
checkpoint (work that the resumed run redoes) are cut off at exactly that length, so every row before
the checkpoint is kept byte for byte and no update appears twice. A file shorter than that length (or
missing) has lost rows the checkpoint counts on: resuming is refused rather than appending to it.

TensorBoard / wandb names follow each world's customs (:func:`tb_tag`, tables :data:`CONTROL_TAGS` and
:data:`LLM_TAGS`); ``metrics.jsonl`` keeps the plain keys.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sppo_rl.config import WandB
from sppo_rl.runtime.run import RunError, renamed

if TYPE_CHECKING:
    from sppo_rl.config import RunConfig

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

CONTROL_TAGS: dict[str, str] = {
    "sps": "charts/SPS",
    "return": "charts/episodic_return",
    "episode_length": "charts/episodic_length",
    "episodes": "charts/episodes",
    "learning_rate": "charts/learning_rate",
    "dual_clipfrac": "losses/dual_clipfrac",
    "ratio_min": "losses/ratio_min",
    "ratio_max": "losses/ratio_max",
}
"""Control world (CleanRL's names; the x-axis is ``global_step`` = env steps): the keys above, then
``losses/<key>`` for :data:`LOSS_KEYS` (policy_loss, value_loss, critic_bce, entropy, approx_kl, clipfrac,
explained_variance, grad_norm, ...) and ``charts/<key>`` for the rest (success_rate, eval_success_rate,
greedy_success_rate, env_steps, update_sps, ...)."""

LLM_TAGS: dict[str, str] = {
    "policy_loss": "actor/policy_loss",
    "entropy": "actor/entropy",
    "clipfrac": "actor/clipfrac",
    "dual_clipfrac": "actor/dual_clipfrac",
    "approx_kl": "actor/approx_kl",
    "approx_kl_k3": "actor/approx_kl_k3",
    "grad_norm": "actor/grad_norm",
    "learning_rate": "actor/lr",
    "kl_loss": "actor/kl_loss",
    "kl": "actor/kl",
    "loss_frac": "actor/loss_frac",
    "actor_skipped": "actor/skipped",
    "rewards_all_equal": "reward/all_equal",
    "critic_init_p0": "critic/init_p0",
    "value_loss": "critic/value_loss",
    "critic_bce": "critic/bce",
    "critic_grad_norm": "critic/grad_norm",
    "explained_variance": "critic/explained_variance",
    "val_accuracy": "val/accuracy",
    "pass_at_k": "val/pass_at_k",
    "response_length": "response/length",
    "response_clip_frac": "response/clip_frac",
    "step_time_s": "timing/step_s",
    "wall_time_s": "timing/wall_s",
    "gen_tokens_per_s": "perf/gen_tokens_per_s",
    "peak_memory_mb": "perf/peak_memory_mb",
    "generated_tokens": "perf/generated_tokens",
    "reward_mean": "reward/mean",
    "greedy_reward_mean": "reward/greedy_mean",
    "verifier_errors": "reward/verifier_errors",
    "invalid_rollouts": "reward/invalid_rollouts",
}
"""LLM world (verl / TRL names; the x-axis is the update step): the keys above, then by prefix (see
:data:`LLM_PREFIXES`): ``ratio_*`` and ``adv_*`` -> ``actor/...``, ``v0_*`` -> ``critic/v0_*``, ``val_*`` ->
``val/*`` (greedy_accuracy, critic_brier, ...), ``time_*`` -> ``timing/*`` (``time_gen_s`` ->
``timing/gen_s``), ``rollout_*`` -> ``rollout/*``, ``groups_*`` -> ``reward/groups_*``; anything else
``train/<key>``."""

LLM_PREFIXES: tuple[tuple[str, str], ...] = (
    ("ratio_", "actor/ratio_"),
    ("adv_", "actor/adv_"),
    ("length_adv_", "actor/length_adv_"),
    ("v0_", "critic/v0_"),
    ("val_", "val/"),
    ("time_", "timing/"),
    ("rollout_", "rollout/"),
    ("groups_", "reward/groups_"),
)

WORLDS = ("control", "llm")

TIMING_KEYS = frozenset(
    {
        "wall_time_s", "step_time_s", "time_gen_s", "time_score_s", "time_train_s", "time_sync_s",
        "gen_tokens_per_s", "peak_memory_mb", "sps", "update_sps", "collect_frac",
    }
)  # fmt: skip
"""Metrics-row keys that measure time or memory, not what was computed: left out when two runs' numbers are
compared (a resumed run against an uninterrupted one, the code before and after a refactor)."""


def json_safe(value: object) -> Any:
    """A value ``json.dumps`` writes as valid JSON: non-finite floats become null, numpy arrays lists,
    tensors and numpy scalars plain numbers; dicts, lists and tuples element by element."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:  # an array or tensor with dimensions
        return json_safe(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def tb_tag(key: str, world: str | None = None) -> str:
    """The TensorBoard / wandb name of a metrics key in ``world`` (``"control"``: :data:`CONTROL_TAGS`,
    ``"llm"``: :data:`LLM_TAGS`); without a world, CleanRL's ``losses/<key>`` for optimisation
    diagnostics and ``charts/<key>`` otherwise. A key holding ``/`` is already a tag."""
    if "/" in key:
        return key
    if world == "control" and key in CONTROL_TAGS:
        return CONTROL_TAGS[key]
    if world == "llm":
        if key in LLM_TAGS:
            return LLM_TAGS[key]
        for prefix, tag in LLM_PREFIXES:
            if key.startswith(prefix):
                return tag + key[len(prefix) :]
        return f"train/{key}"
    if world not in (None, *WORLDS):
        raise ValueError(f"unknown logging world {world!r}; valid: {', '.join(WORLDS)}")
    return f"losses/{key}" if key in LOSS_KEYS else f"charts/{key}"


class RunLogger:
    """Append metric rows to ``out_dir/metrics.jsonl`` and mirror numbers to TensorBoard / wandb.

    Args:
        out_dir: the run folder.
        config: the resolved config (stored with the wandb run).
        tensorboard: write ``out_dir/tb`` events.
        wandb: the run's :class:`~sppo_rl.config.WandB` section: logs to wandb when ``enabled`` (its
            ``mode`` "offline" by default: nothing leaves the machine), with its project, group, tags and
            entity (None: wandb's defaults). None: off.
        wandb_name: the wandb run's name (default: the folder's).
        world: ``"control"`` or ``"llm"``: the naming table of :func:`tb_tag` (None: CleanRL's two prefixes).
        resume_position: byte length of ``metrics.jsonl`` recorded by the checkpoint being resumed.
        resume_step: that checkpoint's step; TensorBoard events after it are purged.
    """

    def __init__(
        self,
        out_dir: str | Path,
        config: dict[str, Any] | None = None,
        *,
        tensorboard: bool = True,
        wandb: WandB | None = None,
        wandb_name: str | None = None,
        world: str | None = None,
        resume_position: int | None = None,
        resume_step: int | None = None,
    ) -> None:
        tb_tag("x", world)  # an unknown world is refused before anything is written
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self.world = world
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
        if wandb is not None and wandb.enabled:
            import wandb as wandb_lib

            id_file = self.out_dir / "wandb_id.txt"
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
            id_file.write_text(run_id)
            self._wandb = wandb_lib.init(
                project=wandb.project,
                dir=str(self.out_dir),
                config=config or {},
                id=run_id,
                resume="allow",
                mode=wandb.mode,
                name=wandb_name or self.out_dir.name,
                group=wandb.group,
                tags=list(wandb.tags) or None,
                entity=wandb.entity,
            )

    def position(self) -> int:
        """Byte length of ``metrics.jsonl`` after everything logged so far."""
        self._file.flush()
        return self._file.tell()

    def log(self, row: dict[str, Any], step: int) -> None:
        row = {k: json_safe(v) for k, v in row.items()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in numbers.items():
                self._tb.add_scalar(tb_tag(k, self.world), v, step)
        if self._wandb is not None:
            self._wandb.log({tb_tag(k, self.world): v for k, v in numbers.items()}, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        """A text (markdown) under ``tag`` at ``step`` in TensorBoard, where it is on (nothing otherwise)."""
        if self._tb is not None:
            self._tb.add_text(tag, text, step)

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


OLD_ROW_KEYS = {"step": "update"}  # vocab: old name
"""Metrics-row keys written under another name before both worlds shared one vocabulary (the LLM world's
``step``), each with its name now."""

OLD_SUMMARY_KEYS = {"steps": "updates", "final_success_rate": "tail_success_rate"}  # vocab: old name
"""``summary.json`` keys written under another name before both worlds shared one vocabulary (the LLM
world's ``steps``; the control world's mean success of the last 10 % of updates, once called final), each
with its name now."""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` (a torn last line, from a crash mid-write, is skipped), with the keys
    of :data:`OLD_ROW_KEYS` read under their names now (an LLM run's ``step`` is its ``update``)."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows.append(renamed(row, OLD_ROW_KEYS) if isinstance(row, dict) else row)
    return rows


def read_summary(path: str | Path) -> dict[str, Any]:
    """A run's ``summary.json``, with the keys of :data:`OLD_SUMMARY_KEYS` read under their names now
    (``steps`` is ``updates``; a control run's mean success over its last 10 % of updates is
    ``tail_success_rate``)."""
    return summary_now(json.loads(Path(path).read_text()))


def summary_now(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary (from ``summary.json`` or an actor file's metadata) with its keys under the names now."""
    return renamed(summary, OLD_SUMMARY_KEYS)


def start_logging(
    out_dir: str | Path,
    cfg: RunConfig,
    resolved: dict[str, Any],
    resume_from: Path | None,
    world: str | None = None,
) -> RunLogger:
    """Write ``config.json`` (the config plus its ``resolved`` settings) and open the run's metrics log,
    continuing after the checkpoint ``resume_from`` when resuming. ``cfg`` carries the logging fields
    every run config has (``tensorboard``, ``wandb``, ``wandb_project``, ``wandb_mode``, ``wandb_entity``,
    ``wandb_group``, ``wandb_tags``, ``exp_name``); ``world`` picks the tag names (:func:`tb_tag`). The
    wandb run is named ``exp_name``, else ``<task>/<algo>/seed<k>``. TensorBoard events after the
    checkpoint's ``log_step`` (its ``step`` if it has none) are purged on resume."""
    from sppo_rl.runtime.checkpoint import read_meta
    from sppo_rl.runtime.run import config_dict, save_config

    record = {**config_dict(cfg), "resolved": resolved}
    meta = read_meta(resume_from) if resume_from is not None else None
    if meta is not None:  # before anything is written
        check_metrics_length(Path(out_dir) / "metrics.jsonl", meta["metrics_bytes"])
    save_config(out_dir, record)
    name = getattr(cfg, "exp_name", None)
    if name is None and hasattr(cfg, "task") and hasattr(cfg, "algo") and hasattr(cfg, "seed"):
        name = f"{cfg.task}/{cfg.algo}/seed{cfg.seed}"
    return RunLogger(
        out_dir,
        record,
        tensorboard=cfg.tensorboard,
        wandb=cfg.wandb,
        wandb_name=name,
        world=world,
        resume_position=meta["metrics_bytes"] if meta else None,
        resume_step=meta.get("log_step", meta["step"]) if meta else None,
    )


class NullLogger:
    """Stands in for the metrics log on ranks other than 0."""

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def position(self) -> int:
        return 0

    def close(self) -> None:
        pass
