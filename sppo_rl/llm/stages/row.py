"""Stage 7, ``row``: an update's metrics row, from named sums over every rank (:func:`update_sums`) and the
stages' times (:class:`StageTimer`).

Per update (every sampled row of every round counts, dropped groups' too; the KL over the trained rows):
``reward_mean`` = sum of valid outcomes / valid rows; ``response_length`` = response tokens / rows;
``response_clip_frac`` = rows cut at ``--max-new-tokens`` / rows; ``verifier_errors``;
``invalid_rollouts``; ``generated_tokens`` (cumulative, greedy decodes included); ``flops_total`` and its
parts ``flops_rollout``, ``flops_greedy``, ``flops_actor``, ``flops_reference``, ``flops_critic``
(cumulative FLOPs of training, validation not counted: :mod:`sppo_rl.llm.models.flops`); ``gen_tokens_per_s``
= this update's generated tokens / generation seconds; ``greedy_reward_mean`` (ReMax); ``kl`` = the
KL penalty's sum / trained tokens; DAPO's ``dynamic_sampling/*`` counts; ``rewards/NAME`` per reward
function when several are combined; the learner's statistics; and the times ``time_gen_s``,
``time_score_s`` (collect and score, every round), ``time_train_s`` (to_batch, advantages, train),
``time_sync_s`` and ``step_time_s`` (the whole update).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.algorithms import GROUP_KINDS

if TYPE_CHECKING:
    from sppo_rl.llm.models.engines import Dist
    from sppo_rl.llm.stages.collect import Round


class StageTimer:
    """Seconds spent in each named stage of one update: ``with timer("gen"): ...`` adds up."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    def total(self) -> float:
        """Seconds since the timer was made (the update's start)."""
        return time.perf_counter() - self.t0


def update_sums(
    rounds: list[Round],
    informative: int,
    mask: Tensor,
    kl_tok: Tensor | None,
    dynamic: bool,
    dist: Dist,
    device: torch.device,
    flops: dict[str, int] | None = None,
) -> dict[str, float]:
    """The update's counts, each summed over ranks, by name (every rank builds the same names in the same
    order, one collective for all); ``flops`` (this rank's FLOPs by part) as ``flops/<part>``."""
    import torch

    sampled = [r.rb for r in rounds] + [g for g in (r.greedy for r in rounds) if g is not None]
    all_R = torch.cat([r.R for r in rounds])
    all_valid = torch.cat([r.valid for r in rounds])
    all_rows = [r.rb for r in rounds]
    g_valid = [
        (r.baseline * r.baseline_valid, r.baseline_valid)
        for r in rounds
        if r.baseline is not None and r.baseline_valid is not None  # both set, or neither (ReMax)
    ]
    kinds = torch.cat([cast(Tensor, r.kinds) for r in rounds]) if dynamic else torch.zeros(0)
    local = {
        "reward": float((all_R * all_valid).sum()),
        "valid": float(all_valid.sum()),
        "rows": float(all_R.numel()),
        "response_tokens": float(sum(int(b.response_mask.sum()) for b in all_rows)),
        "generated": float(sum(int(b.response_mask.sum()) for b in sampled)),
        "cut": float(sum(int((~b.finished).sum()) for b in all_rows)),
        "errors": float(sum(r.errors for r in rounds)),
        "greedy_reward": float(sum(float(s.sum()) for s, _ in g_valid)),
        "greedy_valid": float(sum(int(v.sum()) for _, v in g_valid)),
        "kl": float(kl_tok.sum()) if kl_tok is not None else 0.0,
        "kl_tokens": float(mask.sum()),
        "invalid": float((~all_valid).sum()),
        "informative": float(informative),
        **{f"kind/{name}": float((kinds == k).sum()) for k, name in enumerate(GROUP_KINDS)},
        **{f"flops/{part}": float(v) for part, v in (flops or {}).items()},
    }
    return dict(zip(local, dist.all_sum(list(local.values()), device)))


def update_row(
    step: int,
    tot: dict[str, float],
    timer: StageTimer,
    totals: dict[str, float],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The metrics row of update ``step`` (1-based) from :func:`update_sums`' ``tot``; ``totals`` holds the
    run's cumulative ``generated_tokens`` and ``wall_time_s`` and this update's ``step_time_s``; ``extra``
    the learner's statistics and the entries computed elsewhere (``learning_rate``, ``peak_memory_mb``,
    ``rollout_logp_diff``)."""
    return {
        "update": step,
        "reward_mean": tot["reward"] / max(tot["valid"], 1.0),
        "response_length": tot["response_tokens"] / tot["rows"],
        "response_clip_frac": tot["cut"] / tot["rows"],
        "verifier_errors": int(tot["errors"]),
        "invalid_rollouts": int(tot["invalid"]),
        "generated_tokens": int(totals["generated_tokens"]),
        **{k: v for k, v in totals.items() if k.startswith("flops_")},
        "gen_tokens_per_s": tot["generated"] / max(timer["gen"], 1e-9),
        "time_gen_s": timer["gen"],
        "time_score_s": timer["score"],
        "time_train_s": timer["train"],
        "time_sync_s": timer["sync"],
        "step_time_s": totals["step_time_s"],
        "wall_time_s": totals["wall_time_s"],
        **extra,
    }


def flops_row(flops: dict[str, int]) -> dict[str, int]:
    """The run's cumulative FLOPs as a row's entries: ``flops_total`` and ``flops_<part>`` for each part
    of :data:`~sppo_rl.llm.models.flops.PARTS` (validation not included)."""
    return {"flops_total": sum(flops.values()), **{f"flops_{k}": v for k, v in flops.items()}}


def dynamic_sampling_row(tot: dict[str, float], rounds: int, prompts_per_step: int) -> dict[str, int]:
    """DAPO's counts: groups sampled, kept, dropped by kind, the surplus of mixed groups beyond the batch,
    the extra rounds and how many groups the batch fell short by."""
    mixed, correct, wrong, few = (tot[f"kind/{k}"] for k in GROUP_KINDS)
    return {
        "dynamic_sampling/groups_sampled": int(mixed + correct + wrong + few),
        "dynamic_sampling/groups_kept": int(tot["informative"]),
        "dynamic_sampling/dropped_all_correct": int(correct),
        "dynamic_sampling/dropped_all_wrong": int(wrong),
        "dynamic_sampling/dropped_too_few_valid": int(few),
        "dynamic_sampling/surplus": int(mixed - tot["informative"]),
        "dynamic_sampling/extra_rounds": rounds - 1,
        "dynamic_sampling/short": int(prompts_per_step - tot["informative"]),
    }


def reward_fn_row(names: list[str], fn: np.ndarray, dist: Dist, device: torch.device) -> dict[str, Any]:
    """Each reward function on its own, when several are combined: the mean over its valid scores, and its
    failures (``fn``: ``[k, 3]`` sums of :class:`~sppo_rl.llm.stages.collect.Collected`)."""
    if len(names) <= 1:
        return {}
    s = dist.all_sum(fn.flatten().tolist(), device)
    out: dict[str, Any] = {}
    for j, name in enumerate(names):
        out[f"rewards/{name}"] = s[3 * j] / max(s[3 * j + 1], 1.0)
        out[f"reward_errors/{name}"] = int(s[3 * j + 2])
    return out


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory (CUDA) or peak resident set size of this process (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
