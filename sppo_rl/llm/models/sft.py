"""Supervised warm start of the embedded model: the LLM twin of behaviour cloning.

The tiny model starts random; a short teacher-forced fine-tune on ``prompt -> reference response``
pairs brings it to a non-zero but imperfect sampled accuracy, from which RL on the binary reward can
improve. Fine-tuning stops at the first check where the sampled accuracy on held-out training prompts
reaches ``target`` (or after ``max_steps``); the validation split is never looked at.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sppo_rl.llm.models.core import load_actor, sequence_logprobs
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.base import SamplingParams, left_pad
from sppo_rl.llm.rollout.hf import HFRollout
from sppo_rl.runtime.files import cache_build, follow_umask

_DONE = "SFT_COMPLETE.json"


def encode_pairs(
    tokenizer: Any, prompts: Sequence[str], responses: Sequence[str]
) -> tuple[Tensor, Tensor, int]:
    """``[left-padded prompt | right-padded response + EOS]`` rows, in the rollout layout.

    Returns ``(input_ids, attention_mask, T)`` with ``T`` the response width.
    """
    pad = tokenizer.pad_token_id
    p_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    r_ids = [tokenizer(r, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for r in responses]
    prompt_ids, prompt_mask = left_pad(p_ids, pad)
    resp, resp_mask = right_pad(r_ids, pad)
    return torch.cat([prompt_ids, resp], 1), torch.cat([prompt_mask, resp_mask], 1), resp.shape[1]


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """``(ids, mask)`` ``[B, T]`` long with each (non-empty) sequence left-aligned (right padding)."""
    T = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), T), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def holdout_split(num: int, holdout: int, batch_size: int, what: str = "pairs") -> tuple[int, int]:
    """``(n_train, batch_size)``: the first ``n_train`` of ``num`` warm-start ``what`` train, the last
    ``min(holdout, num // 4)`` are held out for the accuracy checks; ``batch_size`` at most ``n_train``."""
    holdout = min(holdout, num // 4)
    n_train = num - holdout
    if holdout < 1 or n_train < 1:
        raise ValueError(f"need at least 4 warm-start {what}, got {num}")
    return n_train, min(batch_size, n_train)


def fine_tune(
    model: nn.Module,
    engine: Any,
    batch_loss: Callable[[list[int]], Tensor],
    prompts: Sequence[str],
    answers: Sequence[str],
    score: Any,
    *,
    n_train: int,
    rng: random.Random,
    steps: int,
    lr: float,
    target: float,
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
    check_every: int,
    seed: int,
    progress: bool,
    label: str = "[warm start]",
) -> tuple[int, float, list[tuple[int, float]]]:
    """The supervised loop of the warm starts: at most ``steps`` updates of a fresh AdamW (``lr``, no
    weight decay, gradient norm clipped to 1) on ``batch_loss(idx)``, ``idx`` ``batch_size`` indices
    drawn by ``rng`` from the first ``n_train`` pairs. Every ``check_every`` steps and at the last,
    ``engine`` samples the held-out prompts ``prompts[n_train:]`` (seed ``seed + step``) and
    ``score(texts, truths) -> list[float]`` gives their accuracy; the loop ends at the first check that
    reaches ``target``. Returns ``(steps taken, last accuracy, [(step, accuracy), ...])``."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    history: list[tuple[int, float]] = []
    acc, step = 0.0, 0
    while step < steps:
        loss = batch_loss(rng.sample(range(n_train), batch_size))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % check_every == 0 or step == steps:
            ho = range(n_train, len(prompts))
            out = engine.generate(
                [prompts[i] for i in ho],
                SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
                seeds=seed + step,
            )
            acc = float(sum(score(out.texts, [answers[i] for i in ho])) / len(ho))
            model.train()
            history.append((step, acc))
            if progress:
                print(
                    f"{label} step {step}: loss {float(loss.detach()):.3f}, sampled accuracy {acc:.3f}",
                    file=sys.stderr,
                )
            if acc >= target:
                break
    return step, acc, history


def sft_key(base: Path, settings: dict[str, Any]) -> str:
    blob = json.dumps({"base": base.name, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sft_folder(base: Path, cache_dir: Path, key_settings: dict[str, Any] | None, **settings: Any) -> Path:
    """The folder :func:`supervised_warmstart` caches the warm start of ``base`` in, for ``settings``
    (its ``steps``, ``lr``, ``target``, ``temperature``, ``seed``) and ``key_settings``."""
    return cache_dir / f"sft-{sft_key(base, dict(key_settings or {}, **settings))}"


def sft_done(folder: Path) -> bool:
    """Whether ``folder`` holds a finished warm start."""
    return (folder / _DONE).is_file()


def supervised_warmstart(
    base: Path,
    cache_dir: Path,
    prompts: Sequence[str],
    responses: Sequence[str],
    answers: Sequence[str],
    score: Any,
    *,
    steps: int,
    lr: float,
    target: float,
    temperature: float,
    max_new_tokens: int,
    batch_size: int = 64,
    check_every: int = 25,
    holdout: int = 128,
    seed: int = 0,
    key_settings: dict[str, Any] | None = None,
    progress: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Fine-tune the model in ``base`` on the pairs; cache the result under ``cache_dir/sft-<key>``.

    ``score(texts, truths) -> list[float]`` scores sampled responses on the ``holdout`` last pairs.
    Returns the folder (HF model + tokenizer) and its record (steps taken, accuracy history).
    """
    folder = sft_folder(
        base, cache_dir, key_settings, steps=steps, lr=lr, target=target, temperature=temperature, seed=seed
    )
    settings = dict(key_settings or {}, steps=steps, lr=lr, target=target, temperature=temperature, seed=seed)
    if (folder / _DONE).is_file():
        return folder, json.loads((folder / _DONE).read_text())
    print(
        f"[sppo-rl] building the warm start of the embedded model once (up to {steps} supervised steps; "
        f"minutes on a CPU): it is cached in {folder} for every later run with these settings",
        file=sys.stderr,
        flush=True,
    )
    tokenizer = load_tokenizer(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = load_actor(base)
        n_train, batch_size = holdout_split(len(prompts), holdout, batch_size)

        def batch_loss(idx: list[int]) -> Tensor:
            ids, mask, T = encode_pairs(tokenizer, [prompts[i] for i in idx], [responses[i] for i in idx])
            logp, _ = sequence_logprobs(model, ids, mask, T)
            rmask = mask[:, -T:].float()
            return -(logp * rmask).sum() / rmask.sum()

        step, acc, history = fine_tune(
            model,
            HFRollout(model, tokenizer),
            batch_loss,
            prompts,
            answers,
            score,
            n_train=n_train,
            rng=random.Random(seed),
            steps=steps,
            lr=lr,
            target=target,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            check_every=check_every,
            seed=seed,
            progress=progress,
        )
    record = {"steps": step, "holdout_accuracy": acc, "history": history, "settings": settings}
    return folder, save_cached(folder, _DONE, model, tokenizer, record)


def save_cached(
    folder: Path, done: str, model: Any, tokenizer: Any, record: dict[str, Any]
) -> dict[str, Any]:
    """Write ``model``, ``tokenizer`` and ``record`` (as ``folder/done``, the completion marker) into a
    temporary sibling and rename it to ``folder``, so that concurrent builders never see a half-written
    folder (the first to finish wins; :func:`~sppo_rl.runtime.files.cache_build`); returns the record read
    back from ``folder``."""
    with cache_build(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / done).write_text(json.dumps(record, indent=2) + "\n")
        follow_umask(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / done).is_file():
                raise
    return json.loads((folder / done).read_text())
