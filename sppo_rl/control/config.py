"""Config of ``sppo-rl control``: one dataclass drives the CLI, the saved ``config.json`` and the tests.

Import-light on purpose (no torch / Gymnasium), so ``sppo-rl --help`` is quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ControlConfig:
    """Stage 3 of the pipeline: RL on a sparse terminal-reward control task, from a warm start."""

    algo: str = "sppo"
    """Algorithm: ppo, sppo, grpo, drgrpo, rloo, remax, reinforce, bppo, lampo, or the ablation ppo-bce."""
    task: str = "precision-cartpole"
    """Task short name (precision-cartpole, mountaincar, hopper, lunarlander, pendulum, ...) or Gymnasium id."""
    seed: int = 0
    """Seed of everything: start states, action sampling, minibatch order, network init."""
    total_episodes: int = 4096
    """Training budget in episodes (sampled episodes; ReMax's greedy episodes are counted in env_steps only)."""
    episodes_per_update: int | None = None
    """Episodes per update; default: the task's (SPEC: 64 CartPole, 16 LunarLander/Pendulum, 8 MountainCar/Hopper)."""
    group_size: int | None = None
    """Episodes per start state (group methods: N reset with the same seed). Default: the algorithm's, capped so
    that at least two start states make an update; 1 for non-group methods."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and the critic (used when not initialising from a checkpoint)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation of both networks."""
    actor_lr: float = 3e-4
    """Adam learning rate of the policy."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic (step critic for ppo, start-state critic for sppo)."""
    epochs: int = 4
    """PPO epochs over each batch."""
    minibatches: int = 4
    """Minibatches per epoch (episodes are split evenly; a minibatch never splits an episode)."""
    clip: float = 0.2
    """PPO clip range epsilon (both sides)."""
    clip_high: float | None = None
    """Upper clip range if different from --clip (asymmetric clipping)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (off by default)."""
    value_clip: float | None = None
    """Clip range of the step critic's clipped MSE (None: plain MSE)."""
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """Loss aggregation over steps: token-mean (every step equal), seq-mean-token-mean (every episode equal),
    seq-mean-token-sum-norm (sum over steps / horizon)."""
    gamma: float = 1.0
    """Discount of the step critic / GAE (1: the outcome is what counts)."""
    lam: float = 0.95
    """GAE lambda (ppo)."""
    whiten: bool = False
    """Standardise GAE advantages over the batch (ppo)."""
    grpo_std: Literal["population", "sample"] = "sample"
    """Std convention of GRPO's normalisation (sample = torch.std, as verl)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    bppo_prefix_ratio: float = 0.4
    """BPPO: fraction of each selected sequence's positions trained on (its prefix)."""
    bppo_accuracy_threshold: float = 0.5
    """BPPO: below this batch accuracy the full groups are trained on (GRPO); at or above it, the binary prefix pairs."""
    lampo_temperature: float = 0.1
    """LamPO: temperature of the confidence weighting of pairwise reward differences."""
    max_grad_norm: float = 0.5
    """Gradient clipping (global norm) for the actor and the critic separately."""
    dense: bool = False
    """Train on the dense shaped reward instead of the terminal binary one (stage 1: the expert)."""
    init_from: str = "auto"
    """Actor initialisation: 'auto' = the shipped warm start of the task if there is one, else random;
    'none' = random; or a path to a warm-start file or a run folder's checkpoint."""
    normalize_obs: bool = True
    """Normalise observations with running statistics (frozen at the warm start's when initialising from one)."""
    log_std_init: float = -0.5
    """Initial log-std of the Gaussian policy (continuous actions, random init only)."""
    out_dir: str = "runs/control"
    """Run folder: config.json, metrics.jsonl, tb/, checkpoints/, final.pt."""
    resume: bool = False
    """Continue the run in --out-dir from its latest checkpoint (metrics continue exactly)."""
    overwrite: bool = False
    """Start over in an --out-dir that already holds a run (its metrics and checkpoints are deleted)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many updates (and always at the end and on SIGTERM / Ctrl-C)."""
    keep_checkpoints: int = 3
    """How many checkpoints to keep."""
    eval_every: int = 0
    """Every this many updates, measure the greedy policy's success on --eval-episodes fixed start states (0: off)."""
    eval_episodes: int = 64
    """Start states of the greedy evaluation."""
    calibration_contexts: int = 64
    """SPPO's calibration.json: fixed start states whose V(s_0) is compared with their empirical success."""
    calibration_samples: int = 16
    """SPPO's calibration.json: episodes per start state for the empirical success."""
    threads: int = 1
    """torch threads (1 is fastest for small MLPs)."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events to out_dir/tb."""
    wandb: bool = False
    """Also log to Weights & Biases."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """wandb mode (offline by default: nothing leaves the machine)."""
    wandb_project: str = "sppo_rl"
    """wandb project name."""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form tags stored with the config (e.g. sweep coordinates)."""


@dataclass
class WarmstartConfig:
    """Stages 1-2: train a dense-reward expert, keep its successful episodes, behaviour-clone them."""

    task: str = "precision-cartpole"
    """Task short name or Gymnasium id."""
    seed: int = 0
    """Seed of the expert, the demonstrations and the clone."""
    out_dir: str = "runs/warmstart"
    """Folder for the expert run (<out_dir>/<task>/expert) and the warm-start file (<out_dir>/<task>/warmstart.pt)."""
    expert_episodes: int | None = None
    """Expert budget in episodes (default: per task, see EXPERTS in warmstart.py)."""
    expert_episodes_per_update: int | None = None
    """Expert episodes per PPO update (default: per task)."""
    expert_lr: float | None = None
    """Expert actor learning rate (default: per task)."""
    expert_hidden_sizes: tuple[int, ...] = (64, 64)
    """Expert network widths."""
    expert_from: str | None = None
    """Skip stage 1 and clone this actor file (e.g. a previous <out_dir>/<task>/expert/final.pt)."""
    demo_episodes: int = 256
    """Expert episodes collected (sampled actions) for cloning; only successful ones are kept."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the cloned policy (the one stage 3 trains)."""
    bc_lr: float = 3e-4
    """Adam learning rate of behaviour cloning."""
    bc_batch: int = 256
    """Minibatch size (states) of behaviour cloning."""
    bc_max_steps: int = 5000
    """Upper bound on cloning gradient steps."""
    check_every: int = 5
    """Measure the clone's success every this many gradient steps at first (later every 25 % more steps)."""
    check_growth: float = 1.25
    """Later checks come when the step count has grown by this factor (1.0: every --check-every steps)."""
    check_episodes: int = 64
    """Episodes (fixed start states) per success check during cloning."""
    target_success: float = 0.3
    """Stop cloning once the clone's sampled success rate reaches this (non-zero but imperfect)."""
    eval_episodes: int = 128
    """Episodes (fixed start states) per success measurement."""
    install: bool = False
    """Also copy the result into the package (sppo_rl/assets/warmstart/<task>.pt) for --init-from auto."""
    threads: int = 1
    """torch threads."""
    progress: bool = True
    """Show progress bars."""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form tags stored in the file's metadata."""
