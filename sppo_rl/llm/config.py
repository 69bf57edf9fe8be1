"""Config of ``sppo-rl llm`` (import-light: no torch or transformers at import time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sppo_rl.config import Check, RunConfig, ge, gt, optional, within


@dataclass
class LLMConfig(RunConfig):
    """RL with verifiable rewards on a causal LM: SPPO (prompt-only critic) and every baseline.

    A paper recipe sets the defaults of every flag: `sppo-rl llm --recipe NAME|FILE.json [flags]` (flags
    after it override; `sppo-rl info` lists the built-in recipes)."""

    task: str = "arithmetic"
    """'arithmetic' (synthetic, generated from --data-seed) or a local jsonl/parquet file of problems."""
    val_data: str | None = None
    """Validation file (jsonl/parquet); default for arithmetic: its generated validation split; for a file: none."""
    prompt_key: str | None = None
    """Column holding the prompt (auto-detected: verl 'prompt', GSM8K 'question', MATH 'problem')."""
    answer_key: str | None = None
    """Column holding the reference answer (auto-detected: 'reward_model.ground_truth', 'answer', 'solution')."""
    level: tuple[int, ...] = (1,)
    """Arithmetic difficulty levels mixed in the train and validation splits."""
    train_size: int = 4000
    """Arithmetic: generated training problems."""
    val_size: int = 128
    """Validation problems (arithmetic: generated; files: the first N rows)."""
    data_seed: int = 1234
    """Seed of the generated arithmetic splits."""
    steps: int = 60
    """RL updates."""
    prompts_per_step: int = 32
    """Prompts per update; each gets --group-size samples (SPPO/PPO: 1)."""
    model: str | None = None
    """Actor: a local Hugging Face causal-LM folder. Default: the embedded tiny Qwen2 model, warm-started on the task."""
    critic_model: str | None = None
    """Critic backbone folder (may be smaller than the actor; its tokenizer must equal the actor's). Default: the actor's;
    'none' switches the critic off (refused for algorithms that need one)."""
    sft_steps: int = 1500
    """Embedded default only: most supervised warm-start steps on the task (the LLM twin of behaviour cloning)."""
    sft_lr: float = 1e-3
    """Embedded default only: warm-start learning rate."""
    sft_target: float = 0.3
    """Embedded default only: stop the warm start once sampled accuracy on held-out training prompts reaches this."""
    cache_dir: str | None = None
    """Where the embedded model and its warm start are built once (default: $SPPO_RL_CACHE or ~/.cache/sppo_rl)."""
    temperature: float = 1.0
    """Rollout temperature (the paper's recipes use 0.6 on real models)."""
    top_p: float = 1.0
    """Rollout nucleus mass."""
    max_new_tokens: int = 16
    """Longest response in tokens."""
    overlong_filter: bool = False
    """DAPO's overlong filtering: responses cut at --max-new-tokens (no stop token) are left out of the loss
    (their group statistics still count them); counted as overlong_filtered."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment: the last N tokens before --max-new-tokens cost up to
    --overlong-penalty in the reward, linearly (0: off). The critic's BCE target stays the outcome."""
    overlong_penalty: float = 1.0
    """The largest soft overlong punishment (reached at --max-new-tokens)."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens; longer ones are skipped, counted in a warning (default and upper bound: the
    model's context minus --max-new-tokens; 1024 if the model's config gives no context length)."""
    actor_lr: float = 1e-4
    """Actor AdamW learning rate."""
    critic_lr: float = 5e-4
    """Critic AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay of both optimisers."""
    epochs: int = 1
    """PPO epochs per batch (the paper: 1)."""
    minibatches: int = 2
    """Minibatches per epoch (rows split evenly; samples of a prompt may land in different minibatches)."""
    lam: float = 1.0
    """GAE lambda (ppo)."""
    kl_coef: float = 0.0
    """KL-to-reference coefficient (0: off, as in the paper's SPPO/GRPO/PPO runs)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator."""
    kl_in: Literal["reward", "loss"] = "loss"
    """Where the KL penalty goes: subtracted from token rewards, or added to the actor loss."""
    lampo_temperature: float = 1.0
    """LamPO: temperature of the confidence weighting of pairwise reward differences. 1.0 here (0.1 in
    the control world): on the tiny arithmetic task 0.1 keeps almost only the misordered pairs, which
    push probability towards unlikely responses, and the entropy ran away after ~100 updates."""
    max_grad_norm: float = 1.0
    """Gradient clipping of actor and critic."""
    reward_fn: str = "auto"
    """Reward: 'auto' (integer check for arithmetic, math-verify otherwise), 'integer', 'math', or 'file.py:function'
    returning a score in [0, 1] (a value outside it is refused: scored 0, counted in verifier_errors, with a warning)."""
    reward_timeout: float = 5.0
    """Seconds allowed per verification; a timeout or an exception scores 0 and counts in verifier_errors."""
    eval_every: int = 10
    """Validate every this many updates (and at the start and the end)."""
    eval_samples: int = 4
    """k: samples per validation prompt for mean@k accuracy and pass@k."""
    engine: Literal["torch", "deepspeed"] = "torch"
    """Training engine."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (2 or 3)."""
    offload: Literal["none", "optimizer", "all"] = "none"
    """DeepSpeed CPU offload: optimizer states, or optimizer states and parameters."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Training dtype (bfloat16 on GPUs)."""
    rollout: Literal["hf", "vllm"] = "hf"
    """Rollout engine: Hugging Face generation, or in-process vLLM with weight sync after each update."""
    vllm_max_model_len: int | None = None
    """vLLM: longest prompt + response in tokens (default: the model's own limit)."""
    vllm_gpu_memory_utilization: float = 0.4
    """vLLM: fraction of accelerator memory for its weights and KV cache."""
    vllm_sleep: bool = False
    """vLLM: put the engine to sleep during training (frees its KV cache; where the platform supports it)."""
    collective_timeout: float = 600.0
    """Seconds any collective (and weight sync) may take before the run fails with an error instead of hanging."""
    gradient_checkpointing: bool = False
    """Activation checkpointing in actor and critic."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    out_dir: str = "runs/llm"
    """Run folder: config.json, metrics.jsonl, tb/, checkpoints/, final/actor."""
    checkpoint_every: int = 20
    """Save a checkpoint every this many updates (and at the end and on SIGTERM / Ctrl-C)."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep."""

    def checks(self) -> list[Check]:
        return super().checks() + [
            ("level", lambda v: len(v) >= 1, "a non-empty list of levels"),
            ("train_size", ge(1), ">= 1"),
            ("val_size", ge(0), ">= 0"),
            ("steps", ge(1), ">= 1"),
            ("prompts_per_step", ge(1), ">= 1"),
            ("sft_steps", ge(0), ">= 0"),
            ("sft_lr", gt(0), "> 0"),
            ("sft_target", within(0, 1), "in [0, 1]"),
            ("temperature", gt(0), "> 0"),
            ("top_p", within(0, 1, open_lo=True), "in (0, 1]"),
            ("max_new_tokens", ge(1), ">= 1"),
            (
                "overlong_buffer",
                lambda v: ge(0)(v) and v <= self.max_new_tokens,
                ">= 0 and <= --max-new-tokens",
            ),
            ("overlong_penalty", ge(0), ">= 0"),
            ("max_prompt_tokens", optional(ge(1)), ">= 1, or None for the model's context"),
            ("max_prompt_tokens", optional(ge(1)), ">= 1, or None for the model's context"),
            ("weight_decay", ge(0), ">= 0"),
            ("kl_coef", ge(0), ">= 0"),
            ("reward_timeout", gt(0), "> 0 seconds"),
            ("eval_samples", ge(1), ">= 1"),
            ("zero_stage", lambda v: v in (2, 3), "2 or 3"),
            ("vllm_max_model_len", optional(ge(1)), ">= 1, or None for the model's own limit"),
            ("vllm_gpu_memory_utilization", within(0, 1, open_lo=True), "in (0, 1]"),
            ("collective_timeout", gt(0), "> 0 seconds"),
        ]
