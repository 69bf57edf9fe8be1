"""The latent step's maths, pure functions over tensors (definitions: :mod:`sppo_rl.llm.latent`), and
the latent policy's settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sppo_rl.llm.rewards.answers import extract_boxed

NOISE_LOW, NOISE_HIGH = -1.5, 3.0
"""The clip range of the Gumbel noise (the authors' sampler); one-sided noise is shifted by ``-NOISE_LOW``."""


def gumbel(
    shape: tuple[int, ...], generator: torch.Generator | list[torch.Generator] | None, device: Any
) -> Tensor:
    """Standard Gumbel noise ``-log(-log u)``, ``u ~ U(0, 1)``; a list of generators gives row ``b`` of a
    ``[B, V]`` draw its own stream (as :class:`~sppo_rl.llm.rollout.hf.HFRollout` does)."""
    if isinstance(generator, list):
        u = torch.stack([torch.rand(shape[-1], generator=g, device=device) for g in generator])
    else:
        u = torch.rand(shape, generator=generator, device=device)
    return -torch.log(-torch.log(u.clamp(min=1e-20, max=1.0 - 1e-7)))


def latent_noise(g: Tensor, one_sided: bool, scale: float = 1.0) -> Tensor:
    """The noise added to the log-probs of a latent step: ``scale * clip(g, -1.5, 3)``, shifted by
    ``+1.5`` when ``one_sided`` (then in ``[0, 4.5 * scale]``: never negative)."""
    noise = g.clamp(NOISE_LOW, NOISE_HIGH)
    if one_sided:
        noise = noise - NOISE_LOW
    return scale * noise


@dataclass
class LatentStep:
    """One latent step of a batch: ``ids`` ``[B, K]`` (candidates, by perturbed score), ``scores``
    ``[B, K]`` (their perturbed scores ``s_k``), ``weights`` ``[B, K]`` (``softmax(s / tau)``) and
    ``logp`` ``[B, V]`` (the unperturbed ``log softmax(logits)``)."""

    ids: Tensor
    scores: Tensor
    weights: Tensor
    logp: Tensor


def latent_step(logits: Tensor, noise: Tensor, topk: int, tau: float) -> LatentStep:
    """``s = log softmax(logits) + noise``; the top-``topk`` of ``s`` and their mixture weights
    ``softmax(s_topk / tau)`` (see the module docstring)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    scores, ids = (logp + noise).topk(topk, dim=-1)
    return LatentStep(ids, scores, torch.softmax(scores / tau, dim=-1), logp)


def gumbel_logpdf(x: Tensor) -> Tensor:
    """``phi(x) = -x - exp(-x)``, the standard Gumbel log-density."""
    return -x - torch.exp(-x)


def latent_logprob(scores: Tensor, logp_chosen: Tensor) -> Tensor:
    """``mean_k phi(s_k - log p(i_k))`` over the last axis (the K candidates): the log-probability of a
    latent step whose stored scores are ``scores`` under a policy giving its candidates the log-probs
    ``logp_chosen`` (the authors' rule: the noise scale sigma that made the scores is not divided out)."""
    return gumbel_logpdf(scores - logp_chosen).mean(-1)


def mixture(embedding: nn.Module, ids: Tensor, scores: Tensor, tau: float) -> Tensor:
    """``sum_k softmax(scores / tau)_k E[ids_k]`` over the last axis of ``ids`` / ``scores`` ``[..., K]``:
    the latent input embedding ``[..., H]``."""
    w = torch.softmax(scores.float() / tau, dim=-1)
    vectors = embedding(ids)
    return (w.unsqueeze(-1).to(vectors.dtype) * vectors).sum(-2)


def valid_rows(texts: Sequence[str], finished: Tensor) -> Tensor:
    """``[B]`` bool: a latent rollout stays on the manifold when it ended with a stop token and its text
    holds a parseable ``\\boxed{...}`` (read by :func:`~sppo_rl.llm.rewards.answers.extract_boxed`, a plain string
    scan: a model's output is never evaluated)."""
    boxed = torch.tensor([extract_boxed(t) is not None for t in texts], dtype=torch.bool)
    return finished.cpu().bool() & boxed


@dataclass(frozen=True)
class LatentSettings:
    """The latent policy's settings (the ``--latent-*`` flags, resolved).

    Attributes:
        steps: latent steps ``L`` after the prompt.
        topk: candidates ``K`` mixed per step.
        tau: Gumbel-softmax temperature of the mixture weights.
        noise_scale: ``sigma``; 0 makes every latent step noise-free (the warm start's checks).
        one_sided: fix (b), one-sided noise.
        mask_invalid: fix (a), invalid rollouts masked out of the update.
    """

    steps: int
    topk: int = 10
    tau: float = 1.0
    noise_scale: float = 1.0
    one_sided: bool = True
    mask_invalid: bool = True
