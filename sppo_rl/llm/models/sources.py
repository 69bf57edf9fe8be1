"""Where a run's models come from, checked before the run folder is touched: the model cache
(``--cache-dir``, ``$SPPO_RL_CACHE``), ``--model`` / ``--critic-model`` folders and named models, the
embedded tiny model and its warm start (built once into the cache), the actor's context and the
critic's tokenizer; each refuses a user's mistake in one line."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data.files import Example
from sppo_rl.llm.data.tasks import GENERATED_TASKS, generated_task, readable_type
from sppo_rl.llm.models.checks import check_model_config, check_weight_files
from sppo_rl.llm.models.tiny import TINY_CHARSET, tiny_settings
from sppo_rl.runtime.run import RunError

if TYPE_CHECKING:
    from sppo_rl.llm.plan import WarmStart

SFT_SETTINGS: dict[str, dict[str, int]] = {
    "arithmetic": {},
    "scratchpad": {"batch_size": 32, "check_every": 10},
}
"""Warm-start settings of each generated task beyond the flags (keywords of
:func:`sppo_rl.llm.models.sft.supervised_warmstart`; arithmetic: its defaults, 64 pairs a step, a check every 25
steps). Scratchpad: 32 pairs a step, which reached the target in fewer CPU-seconds than 64 (see docs/llm.md),
and a check every 10 steps, since its sampled accuracy jumps (0.15 -> 0.49 within 25 steps)."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("SPPO_RL_CACHE", Path.home() / ".cache" / "sppo_rl"))


def check_model_paths(cfg: LLMConfig, cache: Path) -> None:
    """Refuse, before the run folder is touched, model folders that are not there: ``--model`` and
    ``--critic-model`` must be Hugging Face model folders or named models that are cached or can be built
    (:func:`sppo_rl.llm.models.pretrained.check_available`), the embedded default is for the generated tasks
    (arithmetic, scratchpad), and ``--chat-template on`` needs an actor tokenizer with a template. A data
    file of a type the loader does not read (a CSV) is refused first, whatever the model. ``cache``: the
    model cache (:func:`cache_folder`)."""
    for flag, value in (("--task", cfg.task), ("--val-data", cfg.val_data)):
        if value and value not in GENERATED_TASKS:
            readable_type(flag, value)
    if cfg.model is None and cfg.task not in GENERATED_TASKS:
        raise RunError(
            "the embedded tiny model is for --task arithmetic or scratchpad; give --model for other data"
        )
    from sppo_rl.llm.data.prompts import has_chat_template
    from sppo_rl.llm.models import pretrained

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


def model_folder(cache: Path, value: str | None) -> Path | None:
    """The folder a ``--model`` / ``--critic-model`` value names: a named model's
    (:mod:`sppo_rl.llm.models.pretrained`; built into the model cache ``cache`` on first use, verified on
    each), else the value as a path; None stays None."""
    from sppo_rl.llm.models import pretrained

    if value is None:
        return None
    try:
        ref = pretrained.parse_ref(value)
        if ref is None:
            return Path(value)
        return pretrained.resolve(ref, cache)
    except pretrained.PretrainedError as e:
        raise RunError(f"{value}: {e}") from None


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


@contextmanager
def task_scoring(task: str, timeout_s: float) -> Iterator[Callable[[list[str], list[str]], list[float]]]:
    """``score(texts, truths) -> list[float]`` by the generated ``task``'s own reward (its ``REWARD_FN``),
    whatever the run's ``--reward-fn``: the warm starts' accuracy checks decide when fine-tuning stops and
    what their cached record claims, and the cache key holds the task's settings, not the run's reward.
    (Scored by a run's own reward, a run with a reward that pays everything cached a warm start that
    "reached" its target at the first check, and every later run with those settings loaded it.) The
    reward workers start at the first call, so a cached warm start starts none, and stop on exit."""
    from sppo_rl.llm.rewards.scorer import start_scorer

    scorers: list[Any] = []

    def score(texts: list[str], truths: list[str]) -> list[float]:
        if not scorers:
            scorers.append(start_scorer(generated_task(task).REWARD_FN, timeout_s))
        return scorers[0].score(texts, truths).scores.tolist()

    try:
        yield score
    finally:
        for scorer in scorers:
            scorer.close()


def embedded_model(ws: WarmStart, train: list[Example]) -> tuple[Path, dict[str, Any]]:
    """The tiny Qwen2 model (:func:`tiny_settings` of the task), built once into the cache, then warm-started
    on the task's reference responses (also cached, keyed by the task's settings), its accuracy checks
    scored by the task's own reward (:func:`task_scoring`)."""
    from sppo_rl.llm.models.sft import supervised_warmstart
    from sppo_rl.llm.models.tiny import ensure_tiny_model

    if ws.task not in GENERATED_TASKS:
        raise RunError(
            "the embedded tiny model is for --task arithmetic or scratchpad; give --model for other data"
        )
    reference_response = generated_task(ws.task).reference_response
    cache = ws.cache
    base = ensure_tiny_model(cache, TINY_CHARSET, **tiny_settings(ws.task))
    prompts = [str(e.prompt) for e in train]
    answers = [e.answer for e in train]

    key, settings = _warmstart_settings(ws)
    with task_scoring(ws.task, ws.reward_timeout) as score:
        return supervised_warmstart(
            base,
            cache,
            prompts,
            [reference_response(e) for e in train],
            answers,
            score,
            max_new_tokens=ws.max_new_tokens,
            key_settings=key,
            progress=ws.progress,
            **settings,
            **SFT_SETTINGS[ws.task],
        )


def _warmstart_settings(ws: WarmStart) -> tuple[dict[str, Any], dict[str, Any]]:
    """The embedded model's warm start: the settings that key its cache folder beyond its own
    (``key_settings``), and its own (``steps``, ``lr``, ``target``, ``temperature``, ``seed``)."""
    key: dict[str, Any] = {"level": list(ws.level), "data_seed": ws.data_seed, "train_size": ws.train_size}
    if ws.task != "arithmetic":  # (arithmetic keeps its cache key) the budget of the accuracy checks too
        key.update(task=ws.task, max_new_tokens=ws.max_new_tokens, **SFT_SETTINGS[ws.task])
    return key, sft_settings(ws, ws.sft.steps)


def sft_settings(ws: WarmStart, steps: int) -> dict[str, Any]:
    """A warm start's own settings (``steps`` at most, then ``ws``'s ``lr``, ``target``, sampling
    ``temperature`` of the accuracy checks and ``seed``), as every warm start of the embedded model takes
    them: :func:`embedded_model`'s and the latent curriculum's stages."""
    return dict(steps=steps, lr=ws.sft.lr, target=ws.sft.target, temperature=ws.temperature, seed=ws.seed)


def cache_folder(cfg: LLMConfig) -> Path:
    """The model cache: ``--cache-dir``, else :func:`default_cache_dir`."""
    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()


def models_to_build(cfg: LLMConfig, cache: Path, ws: WarmStart, latent: bool = False) -> list[str]:
    """What a run of ``cfg`` (warm starts ``ws``) would build into the model cache ``cache``, as names for a
    message: the embedded
    tiny model and its warm start (a latent policy's own warm start is not foreseen here), and a named
    ``--model`` / ``--critic-model`` (:mod:`sppo_rl.llm.models.pretrained`) that is not cached; empty when every
    model it needs is there."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.sft import sft_done, sft_folder
    from sppo_rl.llm.models.tiny import tiny_model_built, tiny_model_folder

    out = []
    if cfg.model is None and cfg.task in GENERATED_TASKS:
        base = tiny_model_folder(cache, TINY_CHARSET, **tiny_settings(cfg.task))
        key, own = _warmstart_settings(ws)
        if not tiny_model_built(base):
            out.append(f"the embedded tiny model ({base.name})")
        elif not latent and not sft_done(sft_folder(base, cache, key, **own)):
            out.append("the embedded model's warm start")
    for value in (cfg.model, cfg.critic_model):
        ref = pretrained.parse_ref(value) if value and value != "none" else None
        if ref is not None and not (cache / ref.folder_name / pretrained.CHECKSUMS).is_file():
            out.append(ref.folder_name)
    return out


def check_cache(cfg: LLMConfig, cache: Path, ws: WarmStart, latent: bool = False) -> None:
    """Refuse, before the run folder is touched, a model cache that cannot serve the run: a path that
    is (or lies under) a file, or a folder that cannot be written while a model must be built into it
    (:func:`models_to_build`). A read-only cache that holds every model the run needs is fine."""
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
    build = models_to_build(cfg, cache, ws, latent)
    if build and not os.access(there, os.W_OK | os.X_OK):
        raise RunError(
            f"{what}: {there} is not writable (read-only or not yours), and {' and '.join(build)} must be "
            "built into it first; give a writable --cache-dir"
        )


def _tokenizer_folder(cfg: LLMConfig, cache: Path, value: str | None) -> Path | None:
    """The folder whose tokenizer ``--model`` / ``--critic-model`` ``value`` uses, where it exists before
    anything is built (a folder, a cached named model, the built embedded model); None otherwise."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.tiny import tiny_model_built, tiny_model_folder

    if value is None:
        if cfg.task not in GENERATED_TASKS:
            return None
        folder = tiny_model_folder(cache, TINY_CHARSET, **tiny_settings(cfg.task))
        return folder if tiny_model_built(folder) else None
    ref = pretrained.parse_ref(value)
    folder = Path(value) if ref is None else cache / ref.folder_name
    return folder if (folder / "config.json").is_file() else None


def check_critic_tokenizer(cfg: LLMConfig, cache: Path) -> None:
    """Refuse, before the run folder is touched, a ``--critic-model`` whose tokenizer differs from the
    actor's (:func:`sppo_rl.llm.models.checks.check_same_tokenizer`), where both exist already (a model still
    to be built is checked once built, by :func:`sppo_rl.llm.build.build_models`)."""
    from sppo_rl.llm.models.checks import check_same_tokenizer
    from sppo_rl.llm.models.tiny import load_tokenizer

    if cfg.critic_model in (None, "none"):
        return
    actor, critic = _tokenizer_folder(cfg, cache, cfg.model), _tokenizer_folder(cfg, cache, cfg.critic_model)
    if actor is None or critic is None:
        return
    try:
        check_same_tokenizer(load_tokenizer(actor), load_tokenizer(critic))
    except ValueError as e:
        raise ValueError(f"--critic-model {cfg.critic_model}: {e}") from None  # as build_models raised it


def check_context(cfg: LLMConfig, cache: Path) -> None:
    """Refuse, before the run folder is touched, a ``--max-new-tokens`` that leaves no room for a prompt
    in the actor's context (the embedded model's, or its folder's ``config.json``; a named model not
    yet built is checked once built, by :func:`sppo_rl.llm.build.prepare_prompts`)."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.rollout.factory import context_limit, sampler_context

    if cfg.model is None:
        ctx = tiny_settings(cfg.task)["max_position_embeddings"] if cfg.task in GENERATED_TASKS else None
    else:
        ref = pretrained.parse_ref(cfg.model)
        ctx = model_context(Path(cfg.model) if ref is None else cache / ref.folder_name)
    ctx = context_limit(sampler_context(cfg), ctx)
    if ctx is not None and ctx - cfg.max_new_tokens < 1:
        raise RunError(
            f"--max-new-tokens {cfg.max_new_tokens} leaves no room for a prompt in the model's context of "
            f"{ctx} tokens"
        )
