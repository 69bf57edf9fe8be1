"""The latent policy's warm start: a curriculum from explicit reasoning lines to latent steps (see
"Warm start" in :mod:`sppo_rl.llm.latent`), each stage cached."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from sppo_rl.llm.latent.maths import LatentSettings, mixture
from sppo_rl.llm.latent.rollout import LatentRollout
from sppo_rl.llm.models.core import load_actor, positions_from_mask
from sppo_rl.llm.models.sft import fine_tune, holdout_split, right_pad, save_cached, supervised_warmstart
from sppo_rl.llm.models.sources import sft_settings, task_scoring
from sppo_rl.llm.rollout.base import left_pad

if TYPE_CHECKING:
    from sppo_rl.llm.plan import WarmStart

STEP_SEPARATOR = "; "
"""Between two reasoning lines (the scratchpad task's separator: the tiny tokenizer has no newline)."""
LATENT_FORMAT = 1
"""Bumped whenever the latent warm start changes what it trains; part of its cache key."""
_DONE = "LATENT_SFT_COMPLETE.json"


def column_sums(numbers: Sequence[int]) -> list[str]:
    """Column addition of non-negative ``numbers``, right to left: one line per column, the column's
    digits plus the carry in, written in two digits (``58 + 67``: ``15``, ``12``, and ``01`` for the carry
    left after the last column). The answer's digits are the lines' last digits read from the last line
    back, after the last line's carry (``125``)."""
    rev = [str(n)[::-1] for n in numbers]
    carry, lines = 0, []
    for k in range(max(len(r) for r in rev) + 1):
        if k == max(len(r) for r in rev) and carry == 0:
            break
        s = sum(int(r[k]) for r in rev if k < len(r)) + carry
        lines.append(f"{s:02d}")
        carry = s // 10
    return lines


def reasoning_lines(task: str, example: Any) -> tuple[list[str], str]:
    """The reasoning lines and the boxed answer of ``example``'s reference response.

    ``scratchpad``: its reference response split at :data:`STEP_SEPARATOR` (the last part is the box).
    ``arithmetic``: a sum of non-negative integers gets its :func:`column_sums` (``"58+67="`` ->
    ``15; 12; 01; \\boxed{125}``: short lines, so that the explicit stage trains fast on one CPU core);
    any other expression has no lines (its latent steps then only precede the box)."""
    box = f"\\boxed{{{example.answer}}}"
    if task == "scratchpad":
        from sppo_rl.llm.data.scratchpad import reference_response

        parts = reference_response(example).split(STEP_SEPARATOR)
        return parts[:-1], parts[-1]
    terms = str(example.prompt).removesuffix("=").split("+")
    if not all(t.isdigit() for t in terms):
        return [], box
    if sum(int(t) for t in terms) != int(example.answer):
        raise ValueError(f"{example.prompt!r}: the terms do not add up to the answer {example.answer}")
    return column_sums([int(t) for t in terms]), box


def stage_response(lines: Sequence[str], box: str, k: int) -> str:
    """The explicit text of curriculum stage ``k``: the lines after the first ``k`` (replaced by ``k``
    latent steps), then the box, joined by :data:`STEP_SEPARATOR`."""
    return STEP_SEPARATOR.join([*lines[min(k, len(lines)) :], box])


def curriculum_loss(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    target_ids: Tensor,
    target_mask: Tensor,
    k: int,
    settings: LatentSettings,
) -> Tensor:
    """Cross-entropy of the stage-``k`` targets after ``k`` latent steps (COCONUT's objective with
    vocabulary-space latents): step ``j`` feeds back the noise-free mixture of the top-K of the model's
    own next-token distribution, computed by a forward over everything before it; gradients flow back
    through every mixture. Token-mean over ``target_mask``."""
    embedding = model.get_input_embeddings()
    x, attn = embedding(prompt_ids), prompt_mask
    for _ in range(k):
        out = model(
            inputs_embeds=x, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=False
        )
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        scores, ids = logp.topk(settings.topk, dim=-1)
        e = mixture(embedding, ids, scores, settings.tau).to(x.dtype)
        x = torch.cat([x, e[:, None]], 1)
        attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
    T = target_ids.shape[1]
    x = torch.cat([x, embedding(target_ids)], 1)
    attn = torch.cat([attn, target_mask], 1)
    out = model(inputs_embeds=x, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=False)
    logits = out.logits[:, -(T + 1) : -1].float()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1), reduction="none"
    )
    m = target_mask.float().reshape(-1)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def _key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def latent_warmstart(
    explicit: Path,
    cache_dir: Path,
    prompts: Sequence[str],
    lines: Sequence[Sequence[str]],
    boxes: Sequence[str],
    answers: Sequence[str],
    score: Callable[[list[str], list[str]], list[float]],
    settings: LatentSettings,
    *,
    steps: int,
    lr: float,
    target: float,
    temperature: float,
    batch_size: int = 32,
    check_every: int = 25,
    holdout: int = 128,
    seed: int = 0,
    key_settings: dict[str, Any] | None = None,
    progress: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Stages ``1..L`` of the curriculum from the explicit model in ``explicit`` (stage 0), cached under
    ``cache_dir/latent-sft-<key>``. Each stage trains at most ``steps`` updates of ``batch_size`` pairs
    (a fresh AdamW, as COCONUT resets its optimizer per stage) and ends at the first check where the
    sampled accuracy of the ``holdout`` last pairs, with ``k`` noise-free latent steps, reaches ``target``.
    Returns the folder and its record (steps and accuracy history per stage)."""
    L = settings.steps
    record_settings = dict(
        key_settings or {},
        explicit=explicit.name,
        latent_steps=L,
        topk=settings.topk,
        tau=settings.tau,
        steps=steps,
        lr=lr,
        target=target,
        temperature=temperature,
        batch_size=batch_size,
        seed=seed,
        format=LATENT_FORMAT,
    )
    folder = cache_dir / f"latent-sft-{_key(record_settings)}"
    if (folder / _DONE).is_file():
        return folder, json.loads((folder / _DONE).read_text())
    from sppo_rl.llm.models.tiny import load_tokenizer

    tokenizer = load_tokenizer(explicit)
    n_train, batch_size = holdout_split(len(prompts), holdout, batch_size, "examples")
    quiet = dataclasses.replace(settings, noise_scale=0.0)
    p_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    stages: list[dict[str, Any]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = load_actor(explicit)
        rng = random.Random(seed)
        for k in range(1, L + 1):
            texts = [stage_response(ln, b, k) for ln, b in zip(lines, boxes)]
            r_ids = [
                tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts
            ]
            stage_cfg = dataclasses.replace(quiet, steps=k)

            def batch_loss(
                idx: list[int], r_ids: list[list[int]] = r_ids, cfg: LatentSettings = stage_cfg
            ) -> Tensor:
                pid, pmask = left_pad([p_ids[i] for i in idx], tokenizer.pad_token_id)
                tid, tmask = right_pad([r_ids[i] for i in idx], tokenizer.pad_token_id)
                return curriculum_loss(model, pid, pmask, tid, tmask, cfg.steps, cfg)

            step, acc, history = fine_tune(
                model,
                LatentRollout(model, tokenizer, settings=stage_cfg, add_special_tokens=False),
                batch_loss,
                prompts,
                answers,
                score,
                n_train=n_train,
                rng=rng,
                steps=steps,
                lr=lr,
                target=target,
                temperature=temperature,
                max_new_tokens=max(len(r) for r in r_ids) + 4,
                batch_size=batch_size,
                check_every=check_every,
                seed=seed,
                progress=progress,
                label=f"[latent warm start] stage {k}/{L}",
            )
            stages.append({"stage": k, "steps": step, "holdout_accuracy": acc, "history": history})
    record = {"explicit": str(explicit), "stages": stages, "settings": record_settings}
    return folder, save_cached(folder, _DONE, model, tokenizer, record)


def _warmstart_inputs(ws: WarmStart, train: list[Any]) -> tuple[Path, list[str], list[str], dict[str, Any]]:
    """What both warm starts of ``ws`` take: the cache folder, the prompts and answers of ``train`` and the
    data part of their cache keys. (Their accuracy checks are scored by the task's own reward:
    :func:`~sppo_rl.llm.models.sources.task_scoring`.)"""
    key = {"level": list(ws.level), "data_seed": ws.data_seed, "train_size": ws.train_size}
    return ws.cache, [str(e.prompt) for e in train], [e.answer for e in train], key


def explicit_model(
    ws: WarmStart, train: list[Any]
) -> tuple[Path, dict[str, Any], list[list[str]], list[str]]:
    """Stage 0 of the curriculum (settings ``ws``): the embedded tiny model fine-tuned on responses with
    explicit reasoning lines (:func:`reasoning_lines`), cached by :func:`sppo_rl.llm.models.sft.supervised_warmstart`; also the
    lines and boxes of ``train``. For ``scratchpad`` it is the task's own embedded warm start."""
    from sppo_rl.llm.data.tasks import generated_task
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model, tiny_settings

    cache, prompts, answers, key = _warmstart_inputs(ws, train)
    base = ensure_tiny_model(cache, TINY_CHARSET, **tiny_settings(ws.task))
    generated_task(ws.task)  # refuses a task without an embedded model
    lines, boxes = zip(*[reasoning_lines(ws.task, e) for e in train]) if train else ((), ())
    responses = [stage_response(ln, b, 0) for ln, b in zip(lines, boxes)]
    if ws.task != "arithmetic":
        key["task"] = (
            ws.task
        )  # scratchpad: stage 0 is its own reference response; the task keeps the key apart
    else:
        key["reasoning"] = "column-sums"
    max_len = max(len(r) for r in responses) + 1 + 4
    with task_scoring(ws.task, ws.reward_timeout) as score:
        folder, record = supervised_warmstart(
            base,
            cache,
            prompts,
            responses,
            answers,
            score,
            max_new_tokens=max(ws.max_new_tokens or 0, max_len) if ws.task == "scratchpad" else max_len,
            key_settings=key,
            progress=ws.progress,
            **sft_settings(ws, ws.sft.steps),
        )
    return folder, record, [list(x) for x in lines], list(boxes)


def embedded_latent_model(
    ws: WarmStart, train: list[Any], settings: LatentSettings
) -> tuple[Path, dict[str, Any]]:
    """The embedded tiny model made a latent reasoner: stage 0 (:func:`explicit_model`), then stages
    ``1..L`` (:func:`latent_warmstart`), each built once into the cache."""
    folder0, record0, lines, boxes = explicit_model(ws, train)
    cache, prompts, answers, key = _warmstart_inputs(ws, train)
    with task_scoring(ws.task, ws.reward_timeout) as score:
        folder, record = latent_warmstart(
            folder0,
            cache,
            prompts,
            lines,
            boxes,
            answers,
            score,
            settings,
            key_settings={"task": ws.task, **key},
            progress=ws.progress,
            **sft_settings(ws, ws.latent_sft_steps),
        )
    return folder, {"explicit": {"folder": str(folder0), **record0}, "latent": record}
