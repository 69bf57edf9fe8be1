"""What an LLM run needs before it trains: its data, its models (the embedded tiny one built and
warm-started once), its reward workers, a process group, quiet library output; each refuses a user's
mistake in one line before the run folder is touched."""

from __future__ import annotations

import dataclasses
import os
import resource
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data.files import Example, load_examples
from sppo_rl.llm.models.core import check_model_config, check_weight_files, sequence_logprobs
from sppo_rl.llm.rewards.scorer import RewardFnError, RewardScorer, RewardWorkerError
from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.runtime.run import RunError

TINY_CHARSET = "".join(
    chr(c) for c in range(32, 127)
)  # printable ASCII: every character a tiny-task text uses
TINY_SETTINGS = dict(hidden_size=128, layers=4, heads=4, kv_heads=2, seed=0, max_position_embeddings=256)
"""The embedded base model of ``--task arithmetic`` (see :func:`tiny_settings`)."""
GENERATED_TASKS = ("arithmetic", "scratchpad")
"""The tasks generated from ``--data-seed`` that the embedded tiny model is built and warm-started for."""


SFT_SETTINGS: dict[str, dict[str, int]] = {
    "arithmetic": {},
    "scratchpad": {"batch_size": 32, "check_every": 10},
}
"""Warm-start settings of each generated task beyond the flags (keywords of
:func:`sppo_rl.llm.models.sft.supervised_warmstart`; arithmetic: its defaults, 64 pairs a step, a check every 25
steps). Scratchpad: 32 pairs a step, which reached the target in fewer CPU-seconds than 64 (see docs/llm.md),
and a check every 10 steps, since its sampled accuracy jumps (0.15 -> 0.49 within 25 steps)."""


def tiny_settings(task: str) -> dict[str, Any]:
    """The settings of the embedded base model for ``task`` (keywords of
    :func:`sppo_rl.llm.models.tiny.build_tiny_model`): :data:`TINY_SETTINGS` for arithmetic (its cache key
    unchanged); for scratchpad the same width and depth with a context of 512 positions, which holds the
    longest prompt (18 tokens) and the longest default response budget (234 tokens, level 5) with room to
    spare (RoPE: the context adds no weights). ``ValueError`` for any other task."""
    if task == "arithmetic":
        return dict(TINY_SETTINGS)
    if task == "scratchpad":
        return {**TINY_SETTINGS, "max_position_embeddings": 512}
    raise ValueError(f"no embedded model for task {task!r}; valid: {', '.join(GENERATED_TASKS)}")


def default_cache_dir() -> Path:
    return Path(os.environ.get("SPPO_RL_CACHE", Path.home() / ".cache" / "sppo_rl"))


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory (CUDA) or peak resident set size of this process (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_task(cfg: LLMConfig) -> tuple[list[Example], list[Example], str]:
    """Training and validation examples, and the reward function that scores them. A missing data
    file or a directory is refused naming the flag; a malformed record raises a ``DataError`` naming
    the file and the line."""
    if cfg.val_data:
        data_file("--val-data", cfg.val_data)
    if cfg.task in GENERATED_TASKS:
        task = generated_task(cfg.task)
        try:
            train, val = task.make(cfg.data_seed, cfg.train_size, cfg.val_size, tuple(cfg.level))
        except ValueError as e:
            raise RunError(f"--task {cfg.task}: {e}") from None
        if cfg.task == "arithmetic" and cfg.arithmetic_prompt == "question":
            from sppo_rl.llm.data.arithmetic import as_question

            train, val = (
                [dataclasses.replace(e, prompt=as_question(str(e.prompt))) for e in s] for s in (train, val)
            )
        return train, val, (task.REWARD_FN if cfg.reward_fn == "auto" else cfg.reward_fn)
    path = Path(cfg.task)
    if not path.suffix and not path.is_dir():
        raise RunError(
            f"unknown task {cfg.task!r}; valid: 'arithmetic', 'scratchpad' or a .jsonl/.json/.parquet file"
        )
    data_file("--task", cfg.task)
    train = load_examples(path, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key)
    val = (
        load_examples(cfg.val_data, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key, limit=cfg.val_size)
        if cfg.val_data
        else []
    )
    return train, val, data_reward(cfg, train, val)


GSM8K_REWARD = "sppo_rl.llm.rewards.verify:verify_gsm8k"
"""The ``math`` reward on data in GSM8K's layout: ``\\boxed{}`` or GSM8K's own ``#### n``."""


def data_reward(cfg: LLMConfig, train: list[Example], val: list[Example]) -> str:
    """The reward function of a data file's run, checked against its references (in place: drops the
    references the math verifier can never pay, with a warning): ``--reward-fn integer`` on
    non-integer references is refused in one line; ``math`` (and ``auto``) on GSM8K's layout becomes
    :data:`GSM8K_REWARD`, which also reads GSM8K's ``#### n`` final answer."""
    from sppo_rl.llm.data.files import drop_unpayable_references, non_integer_references
    from sppo_rl.llm.rewards.verify import MAX_ANSWER_CHARS

    reward = "math" if cfg.reward_fn == "auto" else cfg.reward_fn
    if reward == "integer":
        for flag, examples in (("--task", train), ("--val-data", val)):
            bad = non_integer_references(examples)
            if bad:
                raise RunError(
                    f"--reward-fn integer: {len(bad)} of {len(examples)} references of {flag} "
                    f"{cfg.task if flag == '--task' else cfg.val_data} are not integers (record {bad[0].index}: "
                    f"{bad[0].answer!r:.40}), and would never be paid; use --reward-fn math"
                )
    if reward == "math":
        train[:] = drop_unpayable_references(train, MAX_ANSWER_CHARS, cfg.task)
        val[:] = drop_unpayable_references(val, MAX_ANSWER_CHARS, str(cfg.val_data))
        if train and all(e.format == "gsm8k" for e in train[:1]):
            return GSM8K_REWARD
    return reward


def generated_task(task: str) -> Any:
    """The module of a generated task, with ``make(seed, n_train, n_val, levels)``, ``REWARD_FN`` and
    ``reference_response(example)``: :mod:`sppo_rl.llm.data.arithmetic` or :mod:`sppo_rl.llm.data.scratchpad`."""
    import types

    if task == "arithmetic":
        from sppo_rl.llm.data import arithmetic as module

        make = module.make_arithmetic
    elif task == "scratchpad":
        from sppo_rl.llm.data import scratchpad as module

        make = module.make_scratchpad
    else:
        raise ValueError(f"not a generated task: {task!r}; valid: {', '.join(GENERATED_TASKS)}")
    return types.SimpleNamespace(
        make=make, REWARD_FN=module.REWARD_FN, reference_response=module.reference_response
    )


def data_file(flag: str, value: str) -> Path:
    """``value`` as the data file ``flag`` names, refused in one line if it is a folder or missing."""
    path = Path(value)
    if path.is_dir():
        raise RunError(f"{flag} {value}: is a folder, not a data file (.jsonl, .json or .parquet)")
    if not path.is_file():
        raise RunError(f"{flag} {value}: file not found")
    return path


def readable_type(flag: str, value: str) -> None:
    """Refuse in one line a data file whose extension the loader does not read (``.csv``, ``.txt``)."""
    from sppo_rl.llm.data.files import _READERS

    suffix = Path(value).suffix.lower()
    if suffix and suffix not in _READERS:
        what = "CSV files are not read" if suffix == ".csv" else f"{suffix} files are not read"
        raise RunError(
            f"{flag} {value}: {what}; use one of {', '.join(_READERS)} (a CSV becomes JSON lines with "
            "Python's csv.DictReader and json.dumps, one object per row)"
        )


def check_model_paths(cfg: LLMConfig) -> None:
    """Refuse, before the run folder is touched, model folders that are not there: ``--model`` and
    ``--critic-model`` must be Hugging Face model folders or named models that are cached or can be built
    (:func:`sppo_rl.llm.models.pretrained.check_available`), the embedded default is for the generated tasks
    (arithmetic, scratchpad), and ``--chat-template on`` needs an actor tokenizer with a template. A data
    file of a type the loader does not read (a CSV) is refused first, whatever the model."""
    for flag, value in (("--task", cfg.task), ("--val-data", cfg.val_data)):
        if value and value not in GENERATED_TASKS:
            readable_type(flag, value)
    if cfg.model is None and cfg.task not in GENERATED_TASKS:
        raise RunError(
            "the embedded tiny model is for --task arithmetic or scratchpad; give --model for other data"
        )
    from sppo_rl.llm.data.prompts import has_chat_template
    from sppo_rl.llm.models import pretrained

    cache = cache_folder(cfg)
    for flag, value in (("--model", cfg.model), ("--critic-model", cfg.critic_model)):
        if value is None or (flag == "--critic-model" and value == "none"):
            continue
        try:
            ref = pretrained.parse_ref(value)
            if ref is not None:  # a named model: in the cache, or its package installed to build it
                pretrained.check_available(ref, cache)
                continue
        except pretrained.PretrainedError as e:
            raise RunError(f"{flag} {e}") from None
        if not (Path(value) / "config.json").is_file():
            what = "no config.json" if Path(value).is_dir() else "no such folder"
            raise RunError(f"{flag} {value}: not a Hugging Face model folder ({what})")
        try:  # its sizes against this machine, transformers' own checks, its pickled weights: before anything is built
            check_model_config(value, flag, cfg.dtype)
            check_weight_files(value, flag)
        except ValueError as e:
            raise RunError(str(e)) from None
    if cfg.chat_template == "on" and (
        cfg.model is None or (pretrained.parse_ref(cfg.model) is None and not has_chat_template(cfg.model))
    ):
        raise RunError(
            f"--chat-template on: the tokenizer of {cfg.model or 'the embedded tiny model'} has no chat template"
        )


def model_folder(cfg: LLMConfig, value: str | None) -> Path | None:
    """The folder a ``--model`` / ``--critic-model`` value names: a named model's
    (:mod:`sppo_rl.llm.models.pretrained`; built into the cache on first use, verified on each), else the
    value as a path; None stays None."""
    from sppo_rl.llm.models import pretrained

    if value is None:
        return None
    try:
        ref = pretrained.parse_ref(value)
        if ref is None:
            return Path(value)
        return pretrained.resolve(ref, cache_folder(cfg))
    except pretrained.PretrainedError as e:
        raise RunError(f"{value}: {e}") from None


def prompt_format(cfg: LLMConfig) -> Any:
    """The run's :class:`sppo_rl.llm.data.prompts.PromptFormat` (``--chat-template``, ``--system-prompt``,
    ``--instruction``)."""
    from sppo_rl.llm.data.prompts import PromptFormat

    return PromptFormat(cfg.chat_template, cfg.system_prompt, cfg.instruction)


def start_scorer(reward_fn: str, timeout_s: float, weights: tuple[float, ...] | None = None) -> RewardScorer:
    """The reward workers, started (the function loaded) before any work: a reward function that cannot
    be loaded, or whose file exits, crashes or hangs when imported, is refused in one line. ``reward_fn``
    may name several functions, comma-separated, weighted by ``weights``."""
    try:
        return RewardScorer(reward_fn, timeout_s=timeout_s, weights=weights)
    except (RewardFnError, RewardWorkerError) as e:
        raise RunError(f"--reward-fn {reward_fn}: {e}") from None


def model_context(folder: Path) -> int | None:
    """The longest sequence the model in ``folder`` takes, from its ``config.json``
    (``max_position_embeddings`` or its equivalents), or None if it does not say."""
    import json

    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for part in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(part.get(key), int) and part[key] > 0:
                return int(part[key])
    return None


def embedded_model(cfg: LLMConfig, train: list[Example], scorer: RewardScorer) -> tuple[Path, dict[str, Any]]:
    """The tiny Qwen2 model (:func:`tiny_settings` of the task), built once into the cache, then warm-started
    on the task's reference responses (also cached, keyed by the task's settings)."""
    from sppo_rl.llm.models.sft import supervised_warmstart
    from sppo_rl.llm.models.tiny import ensure_tiny_model

    if cfg.task not in GENERATED_TASKS:
        raise RunError(
            "the embedded tiny model is for --task arithmetic or scratchpad; give --model for other data"
        )
    reference_response = generated_task(cfg.task).reference_response
    cache = cache_folder(cfg)
    base = ensure_tiny_model(cache, TINY_CHARSET, **tiny_settings(cfg.task))
    prompts = [str(e.prompt) for e in train]
    answers = [e.answer for e in train]

    def score(texts: list[str], truths: list[str]) -> list[float]:
        return scorer.score(texts, truths).scores.tolist()

    key, settings = _warmstart_settings(cfg)
    return supervised_warmstart(
        base,
        cache,
        prompts,
        [reference_response(e) for e in train],
        answers,
        score,
        max_new_tokens=cfg.max_new_tokens,
        key_settings=key,
        progress=cfg.progress,
        **settings,
        **SFT_SETTINGS[cfg.task],
    )


def _warmstart_settings(cfg: LLMConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The embedded model's warm start: the settings that key its cache folder beyond its own
    (``key_settings``), and its own (``steps``, ``lr``, ``target``, ``temperature``, ``seed``)."""
    key: dict[str, Any] = {"level": list(cfg.level), "data_seed": cfg.data_seed, "train_size": cfg.train_size}
    if cfg.task != "arithmetic":  # (arithmetic keeps its cache key) the budget of the accuracy checks too
        key.update(task=cfg.task, max_new_tokens=cfg.max_new_tokens, **SFT_SETTINGS[cfg.task])
    own = dict(
        steps=cfg.sft.steps, lr=cfg.sft.lr, target=cfg.sft.target, temperature=cfg.temperature, seed=cfg.seed
    )
    return key, own


def cache_folder(cfg: LLMConfig) -> Path:
    """The model cache: ``--cache-dir``, else :func:`default_cache_dir`."""
    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()


def models_to_build(cfg: LLMConfig, latent: bool = False) -> list[str]:
    """What a run of ``cfg`` would build into the model cache, as names for a message: the embedded
    tiny model and its warm start (a latent policy's own warm start is not foreseen here), and a named
    ``--model`` / ``--critic-model`` (:mod:`sppo_rl.llm.models.pretrained`) that is not cached; empty when every
    model it needs is there."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.sft import sft_done, sft_folder
    from sppo_rl.llm.models.tiny import tiny_model_built, tiny_model_folder

    cache, out = cache_folder(cfg), []
    if cfg.model is None and cfg.task in GENERATED_TASKS:
        base = tiny_model_folder(cache, TINY_CHARSET, **tiny_settings(cfg.task))
        key, own = _warmstart_settings(cfg)
        if not tiny_model_built(base):
            out.append(f"the embedded tiny model ({base.name})")
        elif not latent and not sft_done(sft_folder(base, cache, key, **own)):
            out.append("the embedded model's warm start")
    for value in (cfg.model, cfg.critic_model):
        ref = pretrained.parse_ref(value) if value and value != "none" else None
        if ref is not None and not (cache / ref.folder_name / pretrained.CHECKSUMS).is_file():
            out.append(ref.folder_name)
    return out


def check_cache(cfg: LLMConfig, latent: bool = False) -> None:
    """Refuse, before the run folder is touched, a model cache that cannot serve the run: a path that
    is (or lies under) a file, or a folder that cannot be written while a model must be built into it
    (:func:`models_to_build`). A read-only cache that holds every model the run needs is fine."""
    cache = cache_folder(cfg)
    what = (
        f"--cache-dir {cfg.cache_dir}"
        if cfg.cache_dir
        else f"the model cache {cache} (--cache-dir, $SPPO_RL_CACHE)"
    )
    there = cache
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise RunError(f"{what}: {there} is a file, not a folder")
    build = models_to_build(cfg, latent)
    if build and not os.access(there, os.W_OK | os.X_OK):
        raise RunError(
            f"{what}: {there} is not writable (read-only or not yours), and {' and '.join(build)} must be "
            "built into it first; give a writable --cache-dir"
        )


def _tokenizer_folder(cfg: LLMConfig, value: str | None) -> Path | None:
    """The folder whose tokenizer ``--model`` / ``--critic-model`` ``value`` uses, where it exists before
    anything is built (a folder, a cached named model, the built embedded model); None otherwise."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.tiny import tiny_model_built, tiny_model_folder

    if value is None:
        if cfg.task not in GENERATED_TASKS:
            return None
        folder = tiny_model_folder(cache_folder(cfg), TINY_CHARSET, **tiny_settings(cfg.task))
        return folder if tiny_model_built(folder) else None
    ref = pretrained.parse_ref(value)
    folder = Path(value) if ref is None else cache_folder(cfg) / ref.folder_name
    return folder if (folder / "config.json").is_file() else None


def check_critic_tokenizer(cfg: LLMConfig) -> None:
    """Refuse, before the run folder is touched, a ``--critic-model`` whose tokenizer differs from the
    actor's (:func:`sppo_rl.llm.models.core.check_same_tokenizer`), where both exist already (a model still
    to be built is checked once built, by :func:`sppo_rl.llm.build.build_models`)."""
    from sppo_rl.llm.models.core import check_same_tokenizer
    from sppo_rl.llm.models.tiny import load_tokenizer

    if cfg.critic_model in (None, "none"):
        return
    actor, critic = _tokenizer_folder(cfg, cfg.model), _tokenizer_folder(cfg, cfg.critic_model)
    if actor is None or critic is None:
        return
    try:
        check_same_tokenizer(load_tokenizer(actor), load_tokenizer(critic))
    except ValueError as e:
        raise ValueError(f"--critic-model {cfg.critic_model}: {e}") from None  # as build_models raised it


def check_context(cfg: LLMConfig) -> None:
    """Refuse, before the run folder is touched, a ``--max-new-tokens`` that leaves no room for a prompt
    in the actor's context (the embedded model's, or its folder's ``config.json``; a named model not
    yet built is checked once built, by :func:`sppo_rl.llm.build.prepare_prompts`)."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.rollout.factory import context_limit

    if cfg.model is None:
        ctx = tiny_settings(cfg.task)["max_position_embeddings"] if cfg.task in GENERATED_TASKS else None
    else:
        ref = pretrained.parse_ref(cfg.model)
        ctx = model_context(Path(cfg.model) if ref is None else cache_folder(cfg) / ref.folder_name)
    ctx = context_limit(cfg, ctx)
    if ctx is not None and ctx - cfg.max_new_tokens < 1:
        raise RunError(
            f"--max-new-tokens {cfg.max_new_tokens} leaves no room for a prompt in the model's context of "
            f"{ctx} tokens"
        )


class NullLogger:
    """Stands in for the metrics log on ranks other than 0."""

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def position(self) -> int:
        return 0

    def close(self) -> None:
        pass


def quiet_transformers() -> None:
    """No weight-loading or shard-writing bars from transformers (the run has its own progress bar);
    its warnings and errors still show."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def rollout_rows(rb: RolloutBatch, model: Any, policy: bool, temperature: float, device: Any) -> Any:
    """The learner's world callable over rows of ``rb``: ``(rows, T) ->`` a policy's ``(logp, entropy)``
    (actor or reference; ``policy=True``) or a critic's values (either kind: one call signature), on
    those rows cut to their own columns: the prompt's leading all-padding columns and the response
    past ``T`` are dropped, so a micro-batch costs what its own longest row costs."""

    def fn(rows: Tensor, T: int) -> Any:
        rows = rows.to(device)
        pm = rb.prompt_mask[rows]
        first = int(pm.any(0).float().argmax())
        ids = torch.cat([rb.prompt_ids[rows, first:], rb.response_ids[rows, :T]], 1)
        attn = torch.cat([pm[:, first:], rb.response_mask[rows, :T]], 1)
        return sequence_logprobs(model, ids, attn, T, temperature) if policy else model(ids, attn, T)

    return fn
