"""The PPO learner: one update of actor and critic on a :class:`SequenceBatch`, for both worlds.

A world supplies two callables over rows of its own rollout data and two training engines:

- ``actor(rows, T) -> (logp, entropy)``, both ``[len(rows), T]``: the current policy's log-prob of
  each taken action (token or step) and its entropy, on those rows cut to their first ``T`` positions;
- ``critic(rows, T) -> values``: ``[len(rows), T]`` for a per-position critic or ``[len(rows)]`` for
  a per-sequence one (logits or values, as the algorithm's critic loss wants): one call signature for
  both kinds, so no world branches on the critic's kind;
- engines with ``boundary(last)`` (called before each micro-batch: is it the last before ``step``?),
  ``backward(loss)`` and ``step() -> grad_norm`` (clip, optimizer step, zero the gradients).

Every pass runs in micro-batches (:func:`micro_batches`), each cut to its own longest row, and the
gradients of a minibatch accumulate over them. Each micro-batch's loss is weighted by its share of
the aggregation's units (:func:`~sppo_rl.agents.losses.agg_units`) in the whole minibatch over every
data-parallel rank, times the number of ranks (engines average gradients over ranks), so that the
loss, the gradient and the weights after the update equal those of one unsplit batch in one process.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from sppo_rl.agents.algorithms import Algorithm, critic_loss, critic_values, resolve_defaults
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.losses import (
    KL_CLAMP,
    AggMode,
    KLEstimator,
    LossMode,
    RatioLevel,
    agg_loss,
    agg_units,
    explained_variance,
    kl_penalty,
    policy_loss,
    regression_loss,
)

ActorFn = Callable[[Tensor, int], tuple[Tensor, Tensor]]
"""``actor(rows, T) -> (logp, entropy)``, both ``[len(rows), T]``."""
CriticFn = Callable[[Tensor, int], Tensor]
"""``critic(rows, T) -> values``, ``[len(rows), T]`` (a per-position critic) or ``[len(rows)]``."""
RowsFn = ActorFn | CriticFn
"""Either: what :func:`forward_rows` runs over every row."""


class Reducer(Protocol):
    """Data-parallel reductions over ranks (:data:`LOCAL` in one process)."""

    world: int

    def all_sum(self, values: list[float]) -> list[float]: ...

    def all_max(self, values: list[float]) -> list[float]: ...


class Engine(Protocol):
    def boundary(self, last: bool) -> None: ...

    def backward(self, loss: Tensor) -> None: ...

    def step(self) -> float: ...


class _Local:
    world = 1

    def all_sum(self, values: list[float]) -> list[float]:
        return list(values)

    all_max = all_sum


LOCAL: Reducer = _Local()


class TorchEngine:
    """Plain PyTorch around ``optimizer``: gradients accumulate over ``backward`` calls; ``step`` clips
    their global norm to ``max_grad_norm`` (None: measures it only), steps when it is finite, zeroes
    them and returns the norm before clipping."""

    def __init__(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float | None
    ):
        self.module, self.optimizer, self.max_grad_norm = module, optimizer, max_grad_norm
        self.params = [p for g in optimizer.param_groups for p in g["params"]]

    def boundary(self, last: bool) -> None:
        pass

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        if self.max_grad_norm is not None:
            gn = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        else:
            grads = [p.grad.detach().norm() for p in self.params if p.grad is not None]
            gn = float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
        if torch.isfinite(torch.tensor(gn)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return gn


@dataclass(frozen=True)
class LearnerConfig:
    """The update's settings (both worlds' configs fill it; see their ``--help`` for each flag).

    ``length_budget`` is ``L`` of ``seq-mean-token-sum-norm`` (the horizon or ``max_new_tokens``):
    fixed, so cutting a micro-batch short never changes it. ``kl_coef > 0`` with ``batch.ref_logp``
    adds ``kl_coef * agg(k(logp, ref_logp))`` to the actor's loss, each ``k`` bounded to
    ``[-kl_clamp, kl_clamp]`` (:func:`~sppo_rl.agents.losses.kl_penalty`). ``ratio_level`` and ``policy_loss``
    choose the surrogate (:func:`~sppo_rl.agents.losses.policy_loss`: GSPO's sequence ratio, CISPO).
    ``tis_cap = C`` with ``batch.logp_rollout`` (the sampler's own log-probs ``mu``) weighs each
    position's loss by ``min(pi_old / mu, C)``: truncated importance sampling against a rollout engine
    whose numbers differ from the trainer's (vLLM's kernels, another precision).
    """

    epochs: int = 1
    minibatches: int = 1
    clip: float = 0.2
    clip_high: float | None = None
    """The upper clip range (None: ``clip``); CISPO's weight cap ``1 + clip_high``."""
    dual_clip: float | None = None
    agg: AggMode = "token-mean"
    length_budget: int | None = None
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_clamp: float | None = KL_CLAMP
    value_clip: float | None = None
    micro_batch_size: int | None = None
    max_tokens_per_micro_batch: int | None = None
    ratio_level: RatioLevel = "token"
    policy_loss: LossMode = "ppo"
    tis_cap: float | None = None
    astar_beta2: float = 1e-3
    """``beta2`` of ``policy_loss="regression"`` (A*-PO: :func:`~sppo_rl.agents.losses.regression_loss`);
    the run config's field of the same name."""

    @classmethod
    def from_run(
        cls, run_cfg: object, length_budget: int, defaults: dict[str, Any] | None = None, **overrides: object
    ) -> LearnerConfig:
        """The fields a world's run config names alike (``epochs``, ``clip``, ``agg``, ...); where the
        run leaves one of them None, the algorithm's default in ``defaults`` (Dr. GRPO's aggregation,
        GSPO's clip range: :func:`~sppo_rl.agents.algorithms.resolve_defaults`), else this class's
        default; then ``overrides``. Fields the run config lacks keep this class's defaults."""
        kw = {f.name: getattr(run_cfg, f.name) for f in fields(cls) if hasattr(run_cfg, f.name)}
        kw = resolve_defaults(kw, defaults or {})
        kw = {k: v for k, v in kw.items() if v is not None or k not in _NOT_NONE}
        return cls(**{**kw, "length_budget": length_budget, **overrides})


_NOT_NONE = {
    "agg",
    "ratio_level",
    "policy_loss",
    "clip",
    "kl_coef",
    "kl_estimator",
}  # None in a run config means "the algorithm's default"


def micro_batches(
    rows: Tensor, cost: Tensor, max_rows: int | None, max_tokens: int | None, count: int | None = None
) -> list[Tensor]:
    """Split ``rows`` into micro-batches: longest first, a micro-batch takes the next row while it keeps
    at most ``max_rows`` rows and a padded size ``rows x longest cost`` of at most ``max_tokens`` (a row
    alone always fits). ``count`` (>= the packing's own) splits the largest micro-batches further, so
    that every data-parallel rank runs the same number of passes."""
    order = rows[torch.argsort(cost[rows], descending=True, stable=True)]
    out: list[list[int]] = []
    for r in order.tolist():
        cur = out[-1] if out else None
        if cur is not None:
            n, width = len(cur) + 1, float(cost[cur[0]])
            if (max_rows is None or n <= max_rows) and (max_tokens is None or n * width <= max_tokens):
                cur.append(r)
                continue
        out.append([r])
    while count is not None and len(out) < count:
        i = max(range(len(out)), key=lambda j: len(out[j]))
        if len(out[i]) < 2:
            raise ValueError(f"cannot split {len(rows)} rows into {count} micro-batches")
        half = len(out[i]) // 2
        out[i : i + 1] = [out[i][:half], out[i][half:]]
    return [torch.tensor(m, dtype=torch.long) for m in out]


def plan(rows: Tensor, cost: Tensor, cfg: LearnerConfig, dist: Reducer) -> list[Tensor]:
    """:func:`micro_batches` with the same number of micro-batches on every rank."""
    mbs = micro_batches(rows, cost, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch)
    (count,) = dist.all_max([float(len(mbs))])
    if int(count) == len(mbs):
        return mbs
    return micro_batches(rows, cost, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, int(count))


@torch.no_grad()
def forward_rows(
    fn: RowsFn, lengths: Tensor, cost: Tensor, cfg: LearnerConfig, dist: Reducer = LOCAL
) -> Tensor:
    """``fn(rows, T)`` over all rows in micro-batches, reassembled as ``[B, max(lengths)]`` (or ``[B]``)
    with zeros past each row's end: the old log-probs, the reference's and the critic's values."""
    B, T = len(lengths), max(int(lengths.max()), 1) if len(lengths) else 1
    out: Tensor | None = None
    for rows in plan(torch.arange(B), cost, cfg, dist):
        t = max(int(lengths[rows].max()), 1)
        part = fn(rows, t)
        part = part[0] if isinstance(part, tuple) else part
        if out is None:
            out = part.new_zeros((B, T) if part.dim() == 2 else (B,))
        if part.dim() == 2:
            inside = torch.arange(t, device=part.device) < lengths[rows, None].to(part.device)
            out[rows.to(out.device), :t] = torch.where(inside, part, torch.zeros_like(part))
        else:
            out[rows.to(out.device)] = part
    assert out is not None
    return out


def _cut(batch: SequenceBatch, rows: Tensor, T: int) -> SequenceBatch:
    """Rows ``rows`` of ``batch``, every ``[B, T']`` field cut to its first ``T`` positions."""
    b = batch.index(rows.to(batch.mask.device))
    cut = {k: v[:, :T] for k, v in vars(b).items() if isinstance(v, Tensor) and v.dim() == 2}
    return replace(b, **cut) if cut else b


def critic_stats(batch: SequenceBatch, algo: Algorithm, dist: Reducer = LOCAL) -> dict[str, float]:
    """Before the update: a sequence critic's ``sigmoid V(s_0)`` mean, Brier score and gap to the
    outcome mean; a step critic's explained variance of the returns (this rank's). Valid rows only."""
    if batch.values is None:
        return {}
    if batch.valid is not None:
        batch = batch.index(torch.nonzero(batch.valid, as_tuple=True)[0])
    assert batch.values is not None  # index() keeps it
    if batch.values.dim() == 1:
        p = torch.sigmoid(batch.values.float())
        n, sp, sb, sr = dist.all_sum(
            [p.numel(), float(p.sum()), float(((p - batch.rewards) ** 2).sum()), float(batch.rewards.sum())]
        )
        n = max(n, 1.0)
        return {"v0_mean": sp / n, "v0_brier": sb / n, "v0_gap": (sp - sr) / n}
    pred = critic_values(algo, batch.values)
    assert batch.returns is not None, "a step critic's returns come with the advantages"
    return {"explained_variance": explained_variance(pred, batch.returns, batch.mask)}


def rollout_mismatch(batch: SequenceBatch, dist: Reducer = LOCAL) -> dict[str, float]:
    """How far the sampler's log-probs ``mu`` are from the trainer's ``pi_old`` on the same tokens:
    ``rollout_mismatch_mean`` / ``_max`` of ``|log pi_old - log mu|`` over valid positions."""
    if batch.logp_rollout is None or batch.logp_old is None:
        return {}
    d = ((batch.logp_old - batch.logp_rollout).abs() * batch.mask).float()
    total, n = dist.all_sum([float(d.sum()), float(batch.mask.sum())])
    (mx,) = dist.all_max([float(d.max()) if d.numel() else 0.0])
    return {"rollout_mismatch_mean": total / max(n, 1.0), "rollout_mismatch_max": mx}


def group_stats_summary(batch: SequenceBatch, dist: Reducer = LOCAL) -> dict[str, float]:
    """Group hygiene (groups of two or more sequences): fractions of all-correct, all-wrong and mixed
    groups (outcome ``R > 0.5`` is correct) and of zero-variance groups; the norms of the raw centred
    outcomes ``R - mean_g`` and of the advantages the estimator gave (per sequence, at its first
    position); the mean length of sequences with a positive and with a negative advantage. Over valid
    rows only (a group is its valid members; the call makes the same collectives on every rank)."""
    if batch.group_ids is None or batch.advantages is None:
        return {}
    _, counts = torch.unique(batch.group_ids.cpu(), return_counts=True)
    if not len(counts) or int(counts.max()) < 2:
        return {}
    if batch.valid is not None:
        batch = batch.index(torch.nonzero(batch.valid, as_tuple=True)[0])
    assert batch.group_ids is not None and batch.advantages is not None  # index() keeps them
    _, inv, counts = torch.unique(batch.group_ids.cpu(), return_inverse=True, return_counts=True)
    R = batch.rewards.detach().double().cpu()
    G = len(counts)
    hits = torch.zeros(G, dtype=torch.float64).scatter_add_(0, inv, (R > 0.5).double())
    mean = torch.zeros(G, dtype=torch.float64).scatter_add_(0, inv, R) / counts
    spread = torch.zeros(G, dtype=torch.float64).scatter_add_(0, inv, (R - mean[inv]) ** 2)
    multi = counts >= 2
    a = batch.advantages[:, 0].detach().double().cpu()
    lengths = batch.lengths.double().cpu()
    pos, neg = a > 0, a < 0
    sums = dist.all_sum(
        [
            float(multi.sum()),
            float((multi & (hits == counts)).sum()),
            float((multi & (hits == 0)).sum()),
            float((multi & (spread == 0)).sum()),
            float(((R - mean[inv]) ** 2).sum()),
            float((a**2).sum()),
            float(lengths[pos].sum()),
            float(pos.sum()),
            float(lengths[neg].sum()),
            float(neg.sum()),
        ]
    )
    n = max(sums[0], 1.0)
    return {
        "groups_all_correct": sums[1] / n,
        "groups_all_wrong": sums[2] / n,
        "groups_mixed": (sums[0] - sums[1] - sums[2]) / n,
        "groups_zero_variance": sums[3] / n,
        "adv_norm_raw": sums[4] ** 0.5,
        "adv_norm": sums[5] ** 0.5,
        "length_adv_pos": sums[6] / max(sums[7], 1.0),
        "length_adv_neg": sums[8] / max(sums[9], 1.0),
    }


def outcomes_equal(
    outcomes: Tensor, valid: Tensor | None = None, dist: Reducer = LOCAL, tol: float = 1e-9
) -> bool:
    """Whether every valid row's outcome in ``outcomes`` ``[B]`` is the same over every rank:
    ``max R - min R <= tol`` (True when no row is valid).

    The LLM trainer then leaves the actor alone (``actor_skipped``; ``--no-skip-equal-rewards`` turns
    this off): equal outcomes carry no information about which response is better, yet a critic's
    ``A = R - V`` is non-zero (SPPO with every ``R = 0`` and ``V = 0.3`` gives ``A = -0.3`` to every
    response, pushing whatever was sampled down), as is ReMax's ``R - R_greedy`` when the greedy
    rollout scored differently; group methods already give every equal group ``A = 0``."""
    keep = outcomes.float() if valid is None else outcomes.float()[valid.bool()]
    hi, neg_lo = dist.all_max(
        [float(keep.max()) if keep.numel() else -math.inf, float(-keep.min()) if keep.numel() else -math.inf]
    )
    return not (hi > -math.inf) or hi + neg_lo <= tol


@dataclass(frozen=True)
class Trained:
    """What one update's optimisation produced: ``stats``, the mean over minibatches of each statistic
    (losses: their mean over ranks), and ``logp_old`` ``[B, T]``, the old log-probs the policy loss used:
    ``batch.logp_old`` as given, or with ``batch.logp_old = None`` those of the training pass itself
    (``logp.detach() * mask``; None when no training pass ran)."""

    stats: dict[str, float]
    logp_old: Tensor | None


def ppo_update(
    batch: SequenceBatch,
    algo: Algorithm,
    cfg: LearnerConfig,
    actor: ActorFn,
    actor_engine: Engine,
    critic: CriticFn | None = None,
    critic_engine: Engine | None = None,
    *,
    train_actor: bool = True,
    generator: torch.Generator | None = None,
    cost: Tensor | None = None,
    dist: Reducer = LOCAL,
    guard: Callable[..., None] = lambda **_: None,
) -> Trained:
    """``cfg.epochs`` passes over ``cfg.minibatches`` random minibatches of rows; one optimizer step
    per minibatch and engine. The actor is left alone (``actor_skipped``) when ``train_actor`` is
    false or every advantage on every rank is 0. ``batch.logp_old = None`` (one epoch, one minibatch
    only) takes ``logp.detach()`` of the training pass itself (ratio exactly 1), returned as
    :attr:`Trained.logp_old` (``batch`` itself is not changed). ``cost`` ``[B]``: each row's tokens for
    the micro-batch budget (default: its length). ``guard`` receives every loss and gradient norm by name
    (the world stops the run on a non-finite one)."""
    B, lengths = batch.batch_size, batch.lengths.cpu()
    cost = lengths if cost is None else cost.cpu()
    if batch.logp_old is None and cfg.epochs * cfg.minibatches > 1:
        raise ValueError("logp_old may be left out only for one epoch of one minibatch")
    assert batch.advantages is not None and batch.loss_mask is not None, "compute_advantages fills them"
    nonzero, kept, valid = dist.all_sum(
        [float((batch.advantages != 0).sum()), float(batch.loss_mask.sum()), float(batch.mask.sum())]
    )
    train_actor = train_actor and nonzero > 0
    fill_old = batch.logp_old is None
    logp_old = torch.zeros_like(batch.mask) if fill_old else batch.logp_old
    out = {"actor_skipped": float(not train_actor), "loss_frac": kept / max(valid, 1.0)}
    out.update(critic_stats(batch, algo, dist))
    out.update(group_stats_summary(batch, dist))
    sums: dict[str, float] = {}
    extremes: dict[str, float] = {}
    L = cfg.length_budget

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value

    for _ in range(cfg.epochs):
        for mb in torch.tensor_split(torch.randperm(B, generator=generator), cfg.minibatches):
            mb_batch = batch.index(mb.to(batch.mask.device))
            assert mb_batch.loss_mask is not None
            a_tot, c_tot, n_tot = dist.all_sum(
                [
                    agg_units(mb_batch.loss_mask, cfg.agg),
                    _critic_units(mb_batch),
                    float(mb_batch.loss_mask.sum()),
                ]
            )
            mbs = plan(mb, cost, cfg, dist)
            for i, rows in enumerate(mbs):
                T = max(int(lengths[rows].max()), 1)
                b = _cut(batch, rows, T)
                assert b.advantages is not None and b.loss_mask is not None
                if train_actor:
                    actor_engine.boundary(i == len(mbs) - 1)
                    logp, ent = actor(rows, T)
                    if fill_old:
                        b.logp_old = logp.detach() * b.mask
                        logp_old[rows.to(batch.mask.device), :T] = b.logp_old  # type: ignore[index]  # zeros, set above
                    tis = None
                    assert b.logp_old is not None  # given, or filled just above
                    if cfg.tis_cap is not None and b.logp_rollout is not None:
                        tis = torch.exp((b.logp_old - b.logp_rollout).clamp(max=20.0)).clamp(max=cfg.tis_cap)
                    if cfg.policy_loss == "regression":  # A*-PO: least squares onto R - V*, no surrogate
                        if b.ref_logp is None:
                            raise ValueError("the regression loss needs the reference's log-probs (ref_logp)")
                        pl, pm = regression_loss(
                            logp, b.ref_logp, b.advantages, b.loss_mask, cfg.astar_beta2, cfg.agg, L, b.logp_old
                        )  # fmt: skip
                    else:
                        pl, pm = policy_loss(
                            logp, b.logp_old, b.advantages, b.loss_mask, cfg.clip,
                            cfg.clip if cfg.clip_high is None else cfg.clip_high, cfg.dual_clip, cfg.agg, L,
                            cfg.ratio_level, cfg.policy_loss, tis,
                        )  # fmt: skip
                    entropy = agg_loss(ent, b.loss_mask, cfg.agg, L)
                    loss = pl - cfg.ent_coef * entropy
                    w = agg_units(b.loss_mask, cfg.agg) * dist.world / max(a_tot, 1.0)
                    if cfg.kl_coef > 0 and b.ref_logp is not None:
                        kl_tok = kl_penalty(logp, b.ref_logp, cfg.kl_estimator, cfg.kl_clamp)
                        kl = agg_loss(kl_tok, b.loss_mask, cfg.agg, L)
                        loss = loss + cfg.kl_coef * kl
                        add("kl_loss", float(kl.detach()) * w)
                    guard(policy_loss=loss)
                    actor_engine.backward(loss * w)
                    w_tok = float(b.loss_mask.sum()) * dist.world / max(n_tot, 1.0)  # pm are token means
                    for k, v in pm.items():
                        if k in ("ratio_min", "ratio_max"):
                            extremes[k] = (min if k == "ratio_min" else max)(extremes.get(k, v), v)
                        else:
                            add(k, v * w_tok)
                    add("policy_loss", float(pl.detach()) * w)
                    add("entropy", float(entropy.detach()) * w)
                if critic is not None and critic_engine is not None:
                    critic_engine.boundary(i == len(mbs) - 1)
                    pred = critic(rows, T).float()
                    pred = pred * b.mask if pred.dim() == 2 else pred
                    assert b.returns is not None, "a critic's targets come with the advantages"
                    vl = critic_loss(
                        algo, pred, b.returns, b.mask, old_pred=b.values, clip=cfg.value_clip, valid=b.valid
                    )
                    w = _critic_units(b) * dist.world / max(c_tot, 1.0)
                    guard(critic_loss=vl)
                    critic_engine.backward(vl * w)
                    add("critic_bce" if algo.critic_loss == "bce" else "value_loss", float(vl.detach()) * w)
            if train_actor:
                gn = actor_engine.step()
                guard(actor_grad_norm=gn)
                add("grad_norm", gn)
            if critic is not None and critic_engine is not None:
                cgn = critic_engine.step()
                guard(critic_grad_norm=cgn)
                add("critic_grad_norm", cgn)
    if fill_old and not train_actor:
        logp_old = None  # no training pass ran: nothing to take them from
    out.update(rollout_mismatch(replace(batch, logp_old=logp_old), dist))
    steps = cfg.epochs * cfg.minibatches
    keys = sorted(sums)
    for k, v in zip(keys, dist.all_sum([sums[k] / steps for k in keys])):
        out[k] = v / dist.world
    return Trained({**out, **extremes}, logp_old)


def _critic_units(b: SequenceBatch) -> float:
    """A per-position critic loss is a token mean over ``mask``; a per-sequence one a mean over rows
    (valid rows only: an invalid row has no target)."""
    if b.returns is None or b.values is None:
        return 0.0
    v = b.valid_rows
    return float((b.mask * v[:, None].to(b.mask.dtype)).sum()) if b.returns.dim() == 2 else float(v.sum())
