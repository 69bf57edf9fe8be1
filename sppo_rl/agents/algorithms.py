"""Algorithms = an advantage estimator + a critic loss + defaults. Shared by the control and LLM worlds.

A trainer never tests an algorithm's name: it reads :attr:`Algorithm.requires` (what the estimator
needs: a critic per step or per sequence, groups, a greedy rollout) and :attr:`Algorithm.critic_loss`,
then calls :func:`compute_advantages` and :func:`critic_loss`.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch import Tensor

from sppo_rl.agents.advantages import Requirements, get_estimator
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.losses import AggMode, bce_value_loss, clipped_value_loss

if TYPE_CHECKING:
    from sppo_rl.config import RunConfig

CriticLoss = Literal["none", "mse", "bce"]
Config = TypeVar("Config", bound="RunConfig")


@dataclass(frozen=True)
class Algorithm:
    """A named method.

    Attributes:
        name: the CLI name.
        estimator: key in :data:`sppo_rl.agents.advantages.ESTIMATORS`.
        critic_loss: ``"mse"`` (clipped MSE, critic outputs values), ``"bce"`` (critic outputs success
            logits, fitted with BCE to the outcome or the lambda-return), ``"none"`` (no critic).
        group_size: default number of sequences per context (1 = one sample per context).
        summary: one line for ``--help`` and the README.
        selector: key in :data:`sppo_rl.agents.selection.SELECTORS` choosing which positions the
            policy loss is taken over (None: every valid position).
        defaults: the run settings the method is defined with (``agg``, ``ratio_level``,
            ``policy_loss``, ``clip`` / ``clip_high``, ``kl_coef`` / ``kl_in`` / ``kl_estimator``), used
            where a run leaves them unset (None): :func:`resolve_defaults`.
        estimator_params: estimator parameters the method is defined with (Latent-GRPO's
            ``lone="reward"``); parameters a caller passes to :func:`compute_advantages` win.
        worlds: the worlds that can train it (``"control"``, ``"llm"``); a trainer refuses an
            algorithm whose ``worlds`` leaves its own out.
    """

    name: str
    estimator: str
    critic_loss: CriticLoss
    group_size: int
    summary: str
    selector: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    estimator_params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    worlds: tuple[str, ...] = field(default=("control", "llm"), compare=False, hash=False)

    @property
    def requires(self) -> Requirements:
        return get_estimator(self.estimator).requires


GSPO_DEFAULTS: dict[str, Any] = {
    "ratio_level": "sequence",
    "agg": "seq-mean-token-mean",
    "clip": 3e-4,
    "clip_high": 4e-4,
}
"""GSPO as its paper runs it (arXiv 2507.18071, Sec. 5.1: clip 3e-4 left / 4e-4 right on the sequence
ratio; verl's GSPO example and TRL's GSPO docs use the same): at PPO's 0.2 the sequence ratios of a
short run (0.998-1.008 on the tiny model) are never clipped. The objective is a mean over sequences."""

REINFORCE_PP_DEFAULTS: dict[str, Any] = {"kl_coef": 0.01, "kl_in": "reward", "kl_estimator": "k1"}
"""REINFORCE++'s token-level KL penalty in the reward (arXiv 2501.03262:
``r_t = 1[t = end] R - beta KL_t``, ``KL_t = log pi_old / pi_ref``, i.e. k1) with OpenRLHF's coefficient
(``examples/scripts/train_reinforce_llama_ray.sh``: ``--advantage_estimator reinforce --init_kl_coef
0.01``, KL in the reward, k1 by default). LLM world only (the control world has no reference policy)."""

ASTAR_DEFAULTS: dict[str, Any] = {"policy_loss": "regression", "agg": "seq-mean-token-mean"}
"""A*-PO's stage 2 (arXiv 2505.20686; TRL's ``A2POTrainer.compute_loss``, the authors'
``compute_policy_loss``): a least-squares regression instead of a clipped surrogate
(:func:`~sppo_rl.agents.losses.regression_loss`), its squared errors averaged over sequences."""

SAO_DEFAULTS: dict[str, Any] = {
    "policy_loss": "dis",
    "clip": 0.3,
    "clip_high": 5.0,
    "lam_critic": 1.0,
    "lam_alpha": 1.5,
}
"""SAO (Single-rollout Asynchronous Optimization, arXiv 2607.07508) as its paper's math runs set it: the
DIS trust region ``(1 - 0.3, 1 + 5)`` (Sec. 3.1; its SWE-Bench runs use ``0.8 / 3``), the critic's GAE
lambda 1 and the actor's length-adaptive ``lambda = 1 - 1 / (1.5 l)``, as the implementations that
cite the paper read it (docs/algorithms.md "SAO": the paper's text was not reachable). The asynchrony is the
LLM world's ``--max-staleness`` with ``--off-policy behaviour`` (docs/algorithms.md "SAO")."""

CRF_NTF_DEFAULTS: dict[str, Any] = {"clip": 0.2, "clip_high": 10.0, "agg": "seq-mean-token-mean"}
"""C-RF with negative-token filtering (arXiv 2606.17250) as a reproduction of its ALFWorld runs sets it:
the clip range 0.2 below and 10 above (``min(r, 1 + 10)`` on a success, ``max(r, 1 - 0.2)`` on a
failure), each response's loss a mean over its tokens."""

UNSET: dict[str, Any] = {"clip": 0.2, "kl_coef": 0.0, "kl_in": "loss", "kl_estimator": "k3"}
"""What a run setting left None means where its algorithm has no default of its own."""

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ppo", "gae", "mse", 1, "token/step-level PPO: per-step critic, GAE, clipped MSE"),
        Algorithm(
            "sppo", "sppo", "bce", 1, "sequence-level PPO: critic on the context only, A = R - V(s_0), BCE"
        ),
        Algorithm("grpo", "grpo", "none", 8, "GRPO: group-normalised outcome, no critic"),
        Algorithm(
            "drgrpo",
            "drgrpo",
            "none",
            8,
            "Dr. GRPO: group-centred outcome, no std division, sum over tokens / a fixed length",
            defaults={"agg": "seq-mean-token-sum-norm"},
        ),
        Algorithm(
            "gspo",
            "grpo",
            "none",
            8,
            "GSPO: GRPO advantages, one importance ratio per sequence (geometric mean), clipped per "
            "sequence to [1 - 3e-4, 1 + 4e-4]; GSPO-token: --ratio-level sequence-token",
            defaults=GSPO_DEFAULTS,
        ),
        Algorithm(
            "sppo-seq",
            "sppo",
            "bce",
            1,
            "SPPO with GSPO's sequence ratio: a fully sequence-level bandit PPO",
            defaults={"ratio_level": "sequence", "agg": "seq-mean-token-mean"},
        ),
        Algorithm(
            "cispo",
            "grpo",
            "none",
            8,
            "CISPO: GRPO advantages, REINFORCE weighted by a stop-gradient importance ratio capped at 1 + eps_high",
            defaults={"policy_loss": "cispo"},
        ),
        Algorithm(
            "reinforce++",
            "reinforce++",
            "none",
            1,
            "REINFORCE++: per-token KL (k1, 0.01) in the reward, return-to-go whitened over the batch",
            defaults=REINFORCE_PP_DEFAULTS,
        ),
        Algorithm(
            "reinforce++-baseline",
            "reinforce++-baseline",
            "none",
            8,
            "REINFORCE++ with a baseline: outcome minus its group mean, return-to-go whitened over the batch",
        ),
        Algorithm("rloo", "rloo", "none", 5, "RLOO: leave-one-out group baseline"),
        Algorithm("remax", "remax", "none", 1, "ReMax: baseline = outcome of one greedy rollout"),
        Algorithm("reinforce", "reinforce", "none", 1, "REINFORCE: A = R (no baseline)"),
        Algorithm(
            "reinforce-batch",
            "reinforce",
            "none",
            1,
            "REINFORCE with a batch baseline: one sample per prompt, A = R - mean of the batch's outcomes",
            estimator_params={"subtract_mean": True},
        ),
        Algorithm(
            "opo",
            "opo",
            "none",
            8,
            "OPO: outcome minus the group's length-weighted mean reward (optimal baseline)",
        ),
        Algorithm(
            "opo-batch",
            "opo-batch",
            "none",
            1,
            "OPO's optimal baseline over the batch: one sample per prompt, A = R - sum l R / sum l",
        ),
        Algorithm(
            "spo",
            "spo",
            "none",
            1,
            "SPO: A = R - p_hat(prompt) from a KL-discounted Beta tracker, normalised over the batch",
        ),
        Algorithm(
            "astar-po",
            "astar-po",
            "none",
            1,
            "A*-PO: V* from k reference samples per prompt before training, then one sample per prompt "
            "and a least-squares fit of beta2 log(pi / pi_ref) to R - V*",
            defaults=ASTAR_DEFAULTS,
        ),
        Algorithm(
            "shrinkage",
            "shrinkage",
            "none",
            4,
            "James-Stein baseline: each leave-one-out group mean shrunk toward the other prompts' mean",
        ),
        Algorithm(
            "sao",
            "gae",
            "mse",
            1,
            "SAO: one sample per prompt, a per-token critic (GAE, critic lambda 1, actor lambda "
            "1 - 1/(1.5 l)), REINFORCE weighted by the ratio inside (0.7, 6), masked outside (DIS)",
            defaults=SAO_DEFAULTS,
        ),
        Algorithm(
            "crf-ntf",
            "crf-ntf",
            "none",
            1,
            "C-RF with negative-token filtering: one sample per prompt, the batch split into successes "
            "(+) and failures (-), each side half the weight; a failure is penalised on its 10 % least "
            "likely tokens only",
            defaults=CRF_NTF_DEFAULTS,
        ),
        Algorithm(
            "v05",
            "v05",
            "bce",
            4,
            "V0.5's baseline: the context critic's value fused with the group mean by the MSE-optimal "
            "weight, the critic alone unless the mean departs from it by more than the sampling noise",
        ),
        Algorithm(
            "ppo-bce", "gae", "bce", 1, "ablation: step-level PPO whose per-step critic is trained with BCE"
        ),
        Algorithm(
            "bppo",
            "grpo",
            "none",
            8,
            "BPPO: GRPO advantages; once accurate, train only the shortest correct and incorrect prefixes",
            selector="binary-prefix",
        ),
        Algorithm(
            "lampo", "lampo", "none", 8, "LamPO: pairwise reward gaps weighted by the policy's confidence"
        ),
        Algorithm(
            "latent-grpo",
            "grpo",
            "none",
            8,
            "Latent-GRPO: GRPO on latent reasoning steps; invalid rollouts masked, one-sided noise, "
            "one correct path's first step",
            selector="first-token",
            estimator_params={"lone": "reward"},
            worlds=("llm",),  # a latent-reasoning policy: sppo_rl.llm.latent
        ),
        Algorithm(
            "latent-grpo-naive",
            "grpo",
            "none",
            8,
            "GRPO on latent reasoning steps without Latent-GRPO's three fixes (the comparison's baseline)",
            worlds=("llm",),
        ),
    ]
}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(ALGORITHMS)}") from None


def resolve_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a run's settings by name) with every setting that is None and that ``defaults`` (an
    algorithm's) names set to the default: a setting the user gave always wins. ``clip_high`` takes the
    algorithm's only while ``clip`` is unset too: ``--clip 0.1`` alone means 0.1 on both sides, not
    0.1 on the left and the algorithm's right. Example (``gspo``): ``{clip: None, clip_high: None}`` ->
    ``3e-4 / 4e-4``; ``{clip: 0.1, clip_high: None}`` -> ``0.1 / None`` (= 0.1)."""
    out = dict(values)
    for name, value in defaults.items():
        if name not in out or out[name] is not None:
            continue
        if name == "clip_high" and values.get("clip") is not None:
            continue
        out[name] = value
    return out


def with_algorithm_defaults(cfg: Config, algo: Algorithm) -> Config:
    """The run config ``cfg`` (a dataclass) with its unset (None) settings resolved: the algorithm's
    defaults (:func:`resolve_defaults`), then :data:`UNSET` for the fields that have no None meaning of
    their own. The LLM trainer runs on it (its ``config.json`` keeps the settings as given, and
    ``resolved.unset`` what the unset ones became); the control world needs only
    :meth:`~sppo_rl.agents.learner.LearnerConfig.from_run` (it has no KL settings)."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    out = resolve_defaults(values, algo.defaults)
    out = resolve_defaults(out, {k: v for k, v in UNSET.items() if k != "clip_high"})
    changed = {k: v for k, v in out.items() if v is not values[k]}
    return dataclasses.replace(cfg, **changed) if changed else cfg


def default_group_size(algo: Algorithm, rows: int | None = None) -> int:
    """``N`` when a run does not set ``--group-size``: 1 for a method without groups, else the
    algorithm's own; when the rows per update are fixed (``rows``: the control world's episodes per
    update), the largest ``N`` up to it that divides ``rows`` and leaves at least two contexts."""
    if not algo.requires.groups:
        return 1
    if rows is None:
        return algo.group_size
    for g in range(min(algo.group_size, rows // 2), 1, -1):
        if rows % g == 0:
            return g
    return 2


def check_setup(
    algo: Algorithm, group_size: int, batch_size: int, use_critic: bool = True, whiten: bool = False
) -> None:
    """Refuse contradictory settings with one clear message.

    - a group method needs ``group_size >= 2``; a non-group method takes ``group_size = 1``
      (GRPO with N = 1 would give zero advantage to every sequence);
    - ``batch_size`` (sequences per update) must be a positive multiple of ``group_size``;
    - a method whose estimator needs a critic cannot run with the critic switched off;
    - ``whiten`` (``--whiten``) only with an estimator that reads it (GAE's: ppo, ppo-bce, sao): any
      other would run exactly as without it, so the flag would be silently ignored.
    """
    req = algo.requires
    if whiten and not _reads_whiten(algo):
        readers = sorted(a.name for a in ALGORITHMS.values() if _reads_whiten(a))
        raise ValueError(
            f"--whiten standardises GAE advantages; {algo.name}'s estimator does not read it (it would "
            f"run exactly as without it). It applies to: {', '.join(readers)}"
        )
    if req.groups and group_size < 2:
        raise ValueError(
            f"{algo.name} compares the {group_size} sample(s) of a context with each other and needs "
            f"group_size >= 2 (default {algo.group_size})"
        )
    if not req.groups and group_size != 1:
        raise ValueError(f"{algo.name} does not use groups; group_size must be 1, got {group_size}")
    if batch_size <= 0 or batch_size % group_size:
        raise ValueError(
            f"sequences per update ({batch_size}) must be a positive multiple of group_size ({group_size})"
        )
    if req.critic != "none" and not use_critic:
        raise ValueError(f"{algo.name} needs a {req.critic}-level critic, but the critic is disabled")
    if req.critic_output == "logit" and algo.critic_loss != "bce":
        raise ValueError(f"{algo.name}'s estimator reads critic logits; its critic must be trained with BCE")


def _reads_whiten(algo: Algorithm) -> bool:
    return "whiten" in inspect.signature(get_estimator(algo.estimator)).parameters


def estimator_params(cfg: object, defaults: dict[str, Any] | None = None) -> dict[str, object]:
    """Estimator and selector parameters read from a run config (both worlds' configs name them alike):
    ``gamma``, ``lam``, ``whiten``, ``std`` (from ``grpo_std``), ``bppo_prefix_ratio``,
    ``bppo_accuracy_threshold``, ``lampo_temperature``, ``lam_critic``, ``lam_alpha``, ``std_threshold``
    (from ``group_std_threshold``). Fields a config lacks are left out, so the
    functions' own defaults apply; a field the config leaves None takes the algorithm's value in
    ``defaults`` (:func:`resolve_defaults`: SAO's ``lam_critic`` and ``lam_alpha``)."""
    names = {
        "gamma": "gamma",
        "lam": "lam",
        "whiten": "whiten",
        "std": "grpo_std",
        "bppo_prefix_ratio": "bppo_prefix_ratio",
        "bppo_accuracy_threshold": "bppo_accuracy_threshold",
        "lampo_temperature": "lampo_temperature",
        "lam_critic": "lam_critic",
        "lam_alpha": "lam_alpha",
        "std_threshold": "group_std_threshold",
    }
    values = resolve_defaults({f: getattr(cfg, f) for f in names.values() if hasattr(cfg, f)}, defaults or {})
    return {key: values[field] for key, field in names.items() if field in values}


def critic_values(algo: Algorithm, critic_out: Tensor) -> Tensor:
    """Critic output in the units the estimator wants: logits stay logits for a logit estimator;
    a BCE-trained critic's logits become values ``sigmoid(logit)`` for a value estimator."""
    if algo.requires.critic_output == "value" and algo.critic_loss == "bce":
        return torch.sigmoid(critic_out)
    return critic_out


def value_units(algo: Algorithm, critic_out: Tensor) -> Tensor:
    """Critic output in reward units: ``sigmoid(logit)`` for a BCE-trained (success) critic, the value
    itself for an MSE-trained one (diagnostics: critic traces, calibration)."""
    return torch.sigmoid(critic_out) if algo.critic_loss == "bce" else critic_out


@torch.no_grad()
def compute_advantages(batch: SequenceBatch, algo: Algorithm, **params: object) -> SequenceBatch:
    """Fill ``batch.advantages``, ``batch.returns`` and ``batch.loss_mask``.

    Passes every estimator ``token_rewards``, ``mask`` and ``rewards`` (the outcome alone), and exactly
    what it declares: ``values`` (``batch.values``, converted by :func:`critic_values`), ``group_ids``,
    ``baseline_rewards``, ``logp_old``, ``tracker_values``, ``optimal_values``; ``params`` are
    estimator and selector parameters (``gamma``, ``lam``, ``whiten``, ``std``, ``eps``, ...). The
    loss mask is ``batch.mask``, or what the algorithm's selector keeps of it.

    Invalid rows (``batch.valid`` False: outcome unknown) are masked here, once for every estimator
    and selector: they run on the valid rows alone, so a group's mean, std and leave-one-out
    baselines, LamPO's pairs, BPPO's accuracy and any batch whitening are over valid rows only, and a
    group left with fewer than two valid members gets 0 from a group estimator (as a singleton does;
    Latent-GRPO's ``lone="reward"``: ``A = R`` for one valid member).
    An invalid row gets advantage 0, a zero ``loss_mask`` row and a return of 0 (the critic loss gives
    it no weight). ``params`` go over the algorithm's own :attr:`Algorithm.estimator_params` (Latent-GRPO
    gives a lone valid member ``A = R``). Example (GRPO, one group ``R = [1, 0, invalid, 1]``): the advantages of ``[1, 0, 1]``
    (sample std: ``[0.577, -1.155, 0.577]``) and 0 for the invalid row, not those of ``[1, 0, 0, 1]``.
    """
    params = {**algo.estimator_params, **params}
    valid = batch.valid
    if valid is None or bool(valid.all()):
        batch.advantages, batch.returns, batch.loss_mask = _estimate(batch, algo, params)
        return batch
    rows = torch.nonzero(valid, as_tuple=True)[0]
    B, T = batch.mask.shape
    adv = batch.mask.new_zeros(B, T)
    loss_mask = batch.mask.new_zeros(B, T)
    returns = batch.mask.new_zeros((B, T) if algo.requires.critic == "step" else (B,))
    if len(rows):
        a, r, m = _estimate(batch.index(rows), algo, params)
        adv, returns = adv.to(a.dtype), returns.to(r.dtype)
        adv[rows], returns[rows], loss_mask[rows] = a, r, m.to(loss_mask.dtype)
    batch.advantages, batch.returns, batch.loss_mask = adv, returns, loss_mask
    return batch


def _estimate(
    batch: SequenceBatch, algo: Algorithm, params: dict[str, object]
) -> tuple[Tensor, Tensor, Tensor]:
    """``(advantages, returns, loss_mask)`` of the algorithm's estimator and selector on every row of
    ``batch``."""
    est = get_estimator(algo.estimator)
    req = algo.requires
    kwargs: dict[str, object] = {
        "token_rewards": batch.token_rewards,
        "mask": batch.mask,
        "rewards": batch.rewards,
        **params,
    }
    if req.critic != "none":
        if batch.values is None:
            raise ValueError(f"{algo.name} needs critic values in the batch")
        kwargs["values"] = critic_values(algo, batch.values)
    if req.groups:
        if batch.group_ids is None:
            raise ValueError(f"{algo.name} needs group_ids in the batch")
        kwargs["group_ids"] = batch.group_ids
    if req.greedy_baseline:
        if batch.baseline_rewards is None:
            raise ValueError(f"{algo.name} needs baseline_rewards (greedy rollouts) in the batch")
        kwargs["baseline_rewards"] = batch.baseline_rewards
    if req.logprobs:
        kwargs["logp_old"] = batch.logp_old
    if req.tracker:
        if batch.tracker_values is None:
            raise ValueError(f"{algo.name} needs tracker_values (a per-context value tracker) in the batch")
        kwargs["tracker_values"] = batch.tracker_values
    if req.optimal_values:
        if batch.optimal_values is None:
            raise ValueError(f"{algo.name} needs optimal_values (each context's V*) in the batch")
        kwargs["optimal_values"] = batch.optimal_values
    advantages, returns = est(**kwargs)
    if algo.critic_loss == "bce" and req.critic == "sequence":
        # the success critic's target is the outcome itself, even when a KL penalty sits in the reward
        # (R - KL is no probability: as a BCE target it makes the loss unbounded below)
        returns = batch.rewards.to(batch.mask.dtype).clone()
    loss_mask = batch.mask
    if algo.selector is not None:
        from sppo_rl.agents.selection import get_selector

        loss_mask = get_selector(algo.selector)(
            mask=batch.mask,
            rewards=batch.rewards,
            group_ids=batch.group_ids,
            advantages=advantages,
            logp_old=batch.logp_old,
            logp_rollout=batch.logp_rollout,
            **params,
        )
        advantages = advantages * loss_mask
    return advantages, returns, loss_mask


GROUP_KINDS: tuple[str, ...] = ("mixed", "all_correct", "all_wrong", "too_few_valid")
"""What :func:`group_signal` says of a group: index 0 is the only informative kind."""


def group_signal(rewards: Tensor, valid: Tensor | None = None, correct_above: float = 0.5) -> Tensor:
    """DAPO's dynamic-sampling test on groups laid out as rows of ``rewards`` ``[n, G]`` (``valid`` the
    same shape, bool; None: all valid). Returns ``[n]`` long indices into :data:`GROUP_KINDS`:

    - ``too_few_valid`` (3): fewer than two valid members: nothing to compare;
    - ``all_correct`` (1) / ``all_wrong`` (2): every valid outcome is equal, above ``correct_above`` or
      not: a group estimator gives each member exactly 0;
    - ``mixed`` (0): at least two valid outcomes differ (``0 < #correct < G`` for binary outcomes):
      the only groups with a signal.
    """
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.to(torch.bool)
    r = rewards.double()
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1)
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1)
    kind = torch.where(hi > lo, 0, torch.where(hi > correct_above, 1, 2))
    return torch.where(valid.sum(-1) < 2, torch.full_like(kind, 3), kind).long()


def critic_loss(
    algo: Algorithm,
    pred: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_pred: Tensor | None = None,
    clip: float | None = 0.2,
    agg: AggMode = "token-mean",
    valid: Tensor | None = None,
) -> Tensor:
    """The algorithm's critic loss on fresh critic outputs ``pred`` (values or logits).

    - ``mse``: clipped MSE against ``returns`` (per position), clipped around ``old_pred``;
    - ``bce`` with a sequence critic: ``mean_b BCE(logit_b, R_b)``, no clipping;
    - ``bce`` with a step critic (the ablation): per-position BCE against the lambda-returns clamped to
      ``[0, 1]`` (with ``gamma = lam = 1`` and a binary outcome the target is exactly ``R``).

    ``valid`` ``[B]`` bool (None: all): invalid rows (unknown outcome) have no target and no weight:
    the means above run over valid rows (positions) only; with none valid the loss is 0 (no gradient).
    """
    if valid is not None:
        keep = valid.to(device=mask.device, dtype=torch.bool)
        mask = mask * keep[:, None].to(mask.dtype)
        if pred.dim() == 1:
            if not bool(keep.any()):
                return pred.sum() * 0.0
            pred, returns = pred[keep], returns[keep]
    if algo.critic_loss == "mse":
        return clipped_value_loss(
            pred, old_pred if old_pred is not None else pred.detach(), returns, mask, clip, agg
        )
    if algo.critic_loss == "bce":
        if pred.dim() == 1:
            return bce_value_loss(pred, returns)
        return bce_value_loss(pred, returns.clamp(0.0, 1.0), mask, agg)
    raise ValueError(f"{algo.name} has no critic")
