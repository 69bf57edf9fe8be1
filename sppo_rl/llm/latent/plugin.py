"""Latent-GRPO as a plug-in of the LLM world: which algorithms run a latent policy (:data:`LATENT_FIXES`),
:func:`configure_latent` (the run's flags resolved into a :class:`LatentPolicy`, or None for a token
policy) and :class:`LatentPolicy`, what the trainer calls for a latent policy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from sppo_rl.llm.latent.maths import LatentSettings, valid_rows
from sppo_rl.llm.latent.rollout import LatentRollout, latent_rows
from sppo_rl.llm.latent.warmstart import embedded_latent_model, reasoning_lines
from sppo_rl.llm.rollout.base import RolloutBatch

LATENT_FIXES: dict[str, dict[str, bool]] = {
    "latent-grpo": {"one_sided": True, "mask_invalid": True},
    "latent-grpo-naive": {"one_sided": False, "mask_invalid": False},
}
"""The algorithms (:data:`sppo_rl.agents.algorithms.ALGORITHMS` names) whose policy is latent, and the Latent-GRPO
fixes each runs with unless the run's flags say otherwise: (b) ``one_sided`` noise, (a) ``mask_invalid``
rollouts. Fix (c) is the algorithm's ``selector`` (``"first-token"``). These algorithms are LLM-only
(their ``worlds`` is ``("llm",)``)."""


def _pick(value: bool | None, default: bool) -> bool:
    return default if value is None else bool(value)


class LatentPolicy:
    """What the LLM trainer routes through when its algorithm's policy is latent: the warm start
    (:meth:`embedded_model`), the rollout backend (:meth:`rollout`, which the rollout factory builds),
    the learner's ``actor(rows, T)`` (:meth:`rows`) and the validity of rollouts (:meth:`valid`, fix a)."""

    def __init__(self, settings: LatentSettings) -> None:
        self.settings = settings

    def rollout(self, model: nn.Module, tokenizer: Any, **kwargs: Any) -> LatentRollout:
        """The latent backend on ``model`` (``kwargs``: those of :class:`~sppo_rl.llm.rollout.hf.HFRollout`)."""
        return LatentRollout(model, tokenizer, settings=self.settings, **kwargs)

    def rows(self, rb: RolloutBatch, model: nn.Module, temperature: float, device: Any) -> Any:
        return latent_rows(rb, model, temperature, self.settings, device)

    def valid(self, rb: RolloutBatch, valid: Tensor) -> tuple[Tensor, int]:
        """``valid`` (the verifier's) and, with fix (a) on, the latent rule; and the number of rows the
        latent rule calls invalid (counted whether or not the fix is on)."""
        ok = valid_rows(rb.texts, rb.finished)
        bad = int((~ok).sum())
        return (valid & ok if self.settings.mask_invalid else valid), bad

    def embedded_model(self, ws: Any, train: list[Any]) -> tuple[Path, dict[str, Any]]:
        """The embedded tiny model made a latent reasoner (:func:`embedded_latent_model`; ``ws``: the
        plan's :class:`~sppo_rl.llm.models.sources.WarmStart`)."""
        return embedded_latent_model(ws, train, self.settings)


def configure_latent(cfg: Any, algo: Any, train: list[Any]) -> tuple[Any, LatentPolicy | None]:
    """The algorithm to run and its latent policy (None for a token policy), from the run's flags:
    ``--latent-steps`` (None: the most reasoning lines of a training example, at least 1),
    ``--latent-one-sided`` / ``--latent-mask-invalid`` / ``--latent-first-token`` (None: the algorithm's
    own; ``first-token`` off drops the selector). Refuses, in one line, what the latent policy cannot
    run with (vLLM rollouts, dynamic sampling, a vocabulary smaller than ``--latent-topk``, sampling
    options beyond ``--temperature`` and ``--top-p``)."""
    from sppo_rl.runtime.run import RunError

    own = LATENT_FIXES.get(algo.name)
    if own is None:
        return algo, None
    if getattr(cfg, "rollout", "hf") == "vllm":  # auto: the Hugging Face engine here
        raise RunError(f"{algo.name} rolls out latent steps with the Hugging Face engine only (--rollout hf)")
    if getattr(cfg, "dynamic_sampling_rounds", 0):
        raise RunError(f"{algo.name} does not support --dynamic-sampling-rounds yet")
    vocab = _vocab_size(cfg.model)
    if vocab is not None and cfg.latent.topk > vocab:
        raise RunError(f"--latent-topk {cfg.latent.topk} exceeds the model's vocabulary of {vocab} tokens")
    steps = cfg.latent.steps
    if steps is None:
        steps = max([len(reasoning_lines(cfg.task, e)[0]) for e in train] + [1])
    settings = LatentSettings(
        steps=steps,
        topk=cfg.latent.topk,
        tau=cfg.latent.gumbel_temperature,
        noise_scale=cfg.latent.noise_scale,
        one_sided=_pick(cfg.latent.one_sided, own.get("one_sided", True)),
        mask_invalid=_pick(cfg.latent.mask_invalid, own.get("mask_invalid", True)),
    )
    if not _pick(cfg.latent.first_token, algo.selector == "first-token") and algo.selector == "first-token":
        algo = dataclasses.replace(algo, selector=None)
    elif _pick(cfg.latent.first_token, False) and algo.selector is None:
        algo = dataclasses.replace(algo, selector="first-token")
    if cfg.top_k or cfg.min_p or cfg.repetition_penalty != 1.0:
        raise RunError(
            f"{algo.name} samples with --temperature and --top-p only (not --top-k, --min-p, --repetition-penalty)"
        )
    return algo, LatentPolicy(settings)


def _vocab_size(model: str | None) -> int | None:
    """The vocabulary of ``--model`` (its ``config.json``) or of the embedded tiny model; None if unknown."""
    if model is None:
        from sppo_rl.llm.models.tiny import TINY_CHARSET, char_vocab

        return len(char_vocab(TINY_CHARSET))
    try:
        size = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return size if isinstance(size, int) else None
