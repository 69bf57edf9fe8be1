"""The run config both worlds share: one dataclass holding the fields that ``sppo-rl control`` and
``sppo-rl llm`` both have, with the same meaning and default (import-light: no torch).

Each world's config (:class:`~sppo_rl.control.config.ControlConfig`,
:class:`~sppo_rl.llm.config.LLMConfig`) extends it with its own fields and with the settings whose
defaults differ between the worlds (learning rates, epochs, minibatches, lambda, clipping norm, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RunConfig:
    """Settings every training run has: algorithm, seed, the PPO update, the run folder, logging."""

    algo: str = "sppo"
    """Algorithm: ppo, sppo, grpo, drgrpo, rloo, remax, reinforce, bppo, lampo, or the ablation ppo-bce."""
    seed: int = 0
    """Seed of everything: contexts (start states / prompt order), sampling, minibatch order, network init."""
    group_size: int | None = None
    """Samples per context (episodes per start state, responses per prompt) for group methods.
    Default: the algorithm's (GRPO 8, RLOO 5); in the control world capped so that an update holds at
    least two start states; 1 for non-group methods."""
    micro_batch_size: int | None = None
    """Rows (episodes / responses) per forward/backward pass in every pass; a minibatch's gradients
    accumulate over its micro-batches (None: a whole minibatch per pass). The update equals the unsplit one."""
    max_tokens_per_micro_batch: int | None = None
    """Token (step) budget of a pass: rows are packed longest first while (rows x longest row) fits, each
    micro-batch cut to its own longest row (verl's dynamic batch size)."""
    clip: float = 0.2
    """PPO clip range epsilon (both sides)."""
    clip_high: float | None = None
    """Upper clip range if different from --clip (asymmetric clipping)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (off by default)."""
    value_clip: float | None = None
    """Clip range of a per-step (token) critic's clipped MSE around its old values (None: plain MSE; verl: 0.5)."""
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """Loss aggregation over positions: token-mean (every step/token equal; verl's default and the paper's),
    seq-mean-token-mean (every sequence equal), seq-mean-token-sum-norm (sum over positions / horizon)."""
    gamma: float = 1.0
    """Discount of the step critic / GAE (1: the outcome is what counts)."""
    whiten: bool = False
    """Standardise GAE advantages over the batch's valid positions (ppo; verl's PPO always does)."""
    grpo_std: Literal["population", "sample"] = "sample"
    """Std convention of GRPO's normalisation (sample = torch.std, as verl)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    bppo_prefix_ratio: float = 0.4
    """BPPO: fraction of each selected sequence's positions trained on (its prefix)."""
    bppo_accuracy_threshold: float = 0.5
    """BPPO: below this batch accuracy the full groups are trained on (GRPO); at or above it, the binary prefix pairs."""
    resume: bool = False
    """Continue the run in --out-dir from its latest checkpoint (metrics continue exactly)."""
    overwrite: bool = False
    """Start over in an --out-dir that already holds a run (its metrics and checkpoints are deleted)."""
    max_seconds: float | None = None
    """Wall-clock budget of training in seconds: the last update is the first to end past it (None: none)."""
    threads: int = 1
    """torch threads on CPU (1 is fastest for small MLPs and the tiny model)."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events to <out_dir>/tb."""
    wandb: bool = False
    """Also log to Weights & Biases."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """wandb mode (offline by default: nothing leaves the machine)."""
    wandb_project: str = "sppo_rl"
    """wandb project name."""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form tags stored with the config (e.g. sweep coordinates)."""
