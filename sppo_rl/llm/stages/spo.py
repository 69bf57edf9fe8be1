"""SPO's value tracker in the LLM world: one context per training prompt (its index in the training set).

- **Draw** (:class:`SpoOrder`, in place of :class:`~sppo_rl.llm.stages.collect.PromptOrder`): each update's
  ``prompts_per_step`` prompts are drawn from the whole training set without replacement, prompt ``i``
  with probability proportional to ``w_i = sqrt(p_hat_i (1 - p_hat_i)) + 0.05`` (sequentially: the
  Efraimidis-Spirakis keys ``u_i^(1 / w_i)``, the ``k`` largest), from the data order's seeded generator.
- **Baseline** (:func:`tracker_values`): each row's ``p_hat`` of its prompt, read before the update's
  outcomes enter the tracker, as ``batch.tracker_values`` for the ``spo`` estimator.
- **Discount** (:func:`observe`): for a prompt seen before, ``D`` = the mean over its last response's tokens
  of ``|log pi_then - log pi_now|`` (``pi_then``: the log-probs that response had when it was sampled;
  ``pi_now``: the actor that sampled this update, before it trains), ``rho = clip(2^(-D / 0.06), 0.875,
  0.96)``; a prompt never seen: ``D = 0``. Then ``alpha <- rho alpha + R``, ``beta <- rho beta + 1 - R``
  for each valid row, and the row's response is kept as the prompt's last one.

The tracker, every prompt's last response and the generator are in the checkpoint (:meth:`SpoOrder.state`),
so a resumed run draws and discounts exactly as an uninterrupted one. One rank only (the tracker would
have to see every rank's outcomes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from sppo_rl.agents.learner import Reducer, forward_rows
from sppo_rl.agents.rivals import ValueTracker, spo_discount
from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.llm.stages.collect import PromptOrder
from sppo_rl.llm.stages.to_batch import UpdateBatch, cat_rows

if TYPE_CHECKING:
    from sppo_rl.llm.build import RowsOf
    from sppo_rl.llm.plan import Plan


class SpoOrder(PromptOrder):
    """The prompts' draw by the tracker's uncertainty, and the tracker itself (see the module docstring)."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n, seed)
        self.tracker = ValueTracker()
        self.last: dict[int, dict[str, Tensor]] = {}  # prompt -> its last response (trimmed) and log-probs
        self.drawn: list[int] = []
        self.rescored: list[tuple[int, int]] = []  # (prompt, response) lengths re-scored this update (FLOPs)

    def draw(self, k: int) -> list[int]:
        w = self.tracker.sampling_weights(list(range(self.n))).tolist()
        keys = [self.rng.random() ** (1.0 / wi) for wi in w]
        self.drawn = sorted(range(self.n), key=lambda i: -keys[i])[:k]
        return list(self.drawn)

    def state(self) -> dict[str, Any]:
        spo = {"tracker": self.tracker.state_dict(), "last": dict(self.last), "drawn": list(self.drawn)}
        return {**super().state(), "spo": spo}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.tracker.load_state_dict(state["spo"]["tracker"])
        self.last = {int(k): dict(v) for k, v in state["spo"]["last"].items()}
        self.drawn = list(state["spo"]["drawn"])


def contexts(order: SpoOrder, rb: RolloutBatch) -> list[int]:
    """Each row's prompt index in the training set."""
    return [order.drawn[int(i)] for i in rb.prompt_index.tolist()]


def tracker_values(order: SpoOrder, prepared: UpdateBatch) -> None:
    """Put each row's ``p_hat`` into the update's batch (before the estimate)."""
    batch = prepared.batch
    batch.tracker_values = order.tracker.p_hat(contexts(order, prepared.rb)).to(
        batch.mask.device, batch.mask.dtype
    )


def _stored_rows(order: SpoOrder, seen: list[int], pad_id: int) -> RolloutBatch:
    parts = []
    for c in seen:
        s = order.last[c]
        L = s["response_ids"].shape[0]
        one = RolloutBatch(
            prompt_ids=s["prompt_ids"][None],
            prompt_mask=torch.ones(1, s["prompt_ids"].shape[0], dtype=torch.long),
            response_ids=s["response_ids"][None],
            response_mask=torch.ones(1, L, dtype=torch.long),
            logprobs=s["logp"][None],
            sampling_logprobs=s["logp"][None],
            texts=[""],
            prompt_index=torch.zeros(1, dtype=torch.long),
            finished=torch.ones(1, dtype=torch.bool),
            num_generated_tokens=L,
        )
        parts.append((one, torch.zeros(1, dtype=torch.long)))
    return cat_rows(parts, pad_id, torch.arange(len(seen)))


@torch.no_grad()
def observe(
    order: SpoOrder,
    prepared: UpdateBatch,
    valid: Tensor,
    plan: Plan,
    actor: torch.nn.Module,
    rows: RowsOf,
    reduction: Reducer,
    pad_id: int,
) -> dict[str, float]:
    """Discount and fold this update's valid outcomes into the tracker, keep each row's response as its
    prompt's last (see the module docstring); returns the metrics ``spo_p_hat``, ``spo_distance``,
    ``spo_rho``. Runs before the actor trains on the update."""
    rb, batch = prepared.rb, prepared.batch
    ctx = contexts(order, rb)
    keep = [b for b in range(len(ctx)) if bool(valid[b])]
    seen = sorted({ctx[b] for b in keep if ctx[b] in order.last})
    distance = dict.fromkeys({ctx[b] for b in keep}, 0.0)
    order.rescored = [
        (int(order.last[c]["prompt_ids"].shape[0]), int(order.last[c]["response_ids"].shape[0])) for c in seen
    ]
    if seen:
        old = _stored_rows(order, seen, pad_id).to(plan.device)
        lengths = old.response_lengths.cpu()
        cost = (old.prompt_mask.sum(-1) + old.response_lengths).cpu()
        actor.eval()
        now = forward_rows(rows(old, actor, True), lengths, cost, plan.learner, reduction).float()
        m = old.response_mask.float()
        d = ((old.logprobs.float() - now).abs() * m).sum(-1) / m.sum(-1).clamp(min=1)
        distance.update({c: float(x) for c, x in zip(seen, d.tolist(), strict=True)})
    logp = batch.logp_old if batch.logp_old is not None else rb.logprobs
    p_hat = batch.tracker_values
    rhos = [spo_discount(distance[ctx[b]]) for b in keep]
    order.tracker.update([ctx[b] for b in keep], [float(batch.rewards[b]) for b in keep], rhos)
    for b in keep:
        pm, rm = rb.prompt_mask[b].cpu() > 0, rb.response_mask[b].cpu() > 0
        order.last[ctx[b]] = {
            "prompt_ids": rb.prompt_ids[b].cpu()[pm].clone(),
            "response_ids": rb.response_ids[b].cpu()[rm].clone(),
            "logp": logp[b].detach().float().cpu()[rm].clone(),
        }
    n = max(len(keep), 1)
    return {
        "spo_p_hat": float(p_hat.mean()) if p_hat is not None else float("nan"),
        "spo_distance": sum(distance[ctx[b]] for b in keep) / n,
        "spo_rho": sum(rhos) / n,
    }
