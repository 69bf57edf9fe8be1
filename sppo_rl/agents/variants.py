"""GRPO variants from the seed survey, as parts of the shared core: BPPO, LamPO, Latent-GRPO's selector.

- **BPPO** (binary prefix policy optimisation, arXiv 2605.28028) keeps GRPO's advantages, computed over
  the whole group, but trains on less: per group only the shortest correct and the shortest incorrect
  sequence, and of each only a prefix. It is the selector ``"binary-prefix"`` used with the ``grpo``
  estimator (:func:`binary_prefix`).
- **LamPO** (Lambda-style policy optimisation, arXiv 2605.19416) replaces the group mean by pairwise
  comparisons inside the group, each weighted by how far the sampling policy already ranks the pair
  the right way. It is the estimator ``"lampo"`` (:func:`lampo`).
- **Latent-GRPO** (arXiv 2604.27998) trains, per group, the first latent step of one correct sequence
  only: the selector ``"first-token"`` (:func:`first_token`), used with the ``grpo`` estimator on the
  latent policy of :mod:`sppo_rl.llm.latent` (which holds its other two fixes).

BPPO and LamPO read their parameters from the trainer's estimator parameters (one dictionary shared by the
estimator and the selector), so their names carry the method's prefix: ``bppo_prefix_ratio``,
``bppo_accuracy_threshold``, ``lampo_temperature``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sppo_rl.agents.advantages import Requirements, broadcast, register_estimator, sequence_scores
from sppo_rl.agents.selection import register_selector

BPPO_PREFIX_RATIO = 0.4
"""Fraction of each chosen sequence trained on (the survey: 30-50 %, 40 % in its pseudocode)."""
BPPO_ACCURACY_THRESHOLD = 0.5
"""Batch accuracy from which BPPO selects. Below one half a correct sequence is the minority outcome, the
scarce signal that GRPO keeps in full; from one half on, most groups hold both outcomes (with G = 8 and
independent outcomes at accuracy 0.5, 99 % of them), so the binary pair exists nearly everywhere. The
paper's own value was not found in the sources consulted."""
CORRECT_ABOVE = 0.5
"""A sequence with outcome ``R > 0.5`` is correct (``R == 1`` for binary rewards)."""
LAMPO_TEMPERATURE = 0.1
"""The order of the within-group spread of mean token log-probs (0.03-0.06 on short-cartpole while it
learns), so the pair weights move visibly (about 0.5-1.5) without switching pairs off; 0.01 saturates
them and learned the easy control task markedly slower, 1.0 made LamPO nearly RLOO there."""

# --------------------------------------------------------------------------------------------------
# BPPO


def prefix_lengths(lengths: Tensor, ratio: float) -> Tensor:
    """``L_p = max(1, ceil(ratio * L))`` for ``L >= 1`` (0 for an empty sequence), ``[B]`` long.

    The product is taken in float64 less ``1e-9`` before rounding up, so that rounding error cannot add
    a position: ``0.55 * 100`` evaluates to ``55.00000000000001`` and still gives 55, not 56.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"bppo_prefix_ratio must be in (0, 1], got {ratio}")
    L = lengths.to(torch.float64)
    lp = torch.ceil(ratio * L - 1e-9).clamp(min=1.0).long()
    return torch.where(lengths > 0, lp, torch.zeros_like(lp))


def shortest_per_class(lengths: Tensor, correct: Tensor, group_ids: Tensor) -> Tensor:
    """``[B]`` bool: the shortest correct and the shortest incorrect row of every group.

    "Shortest" is the fewest valid positions; a tie goes to the lowest row index. Rows of length 0 have
    nothing to train on and are never chosen. A group without a correct (incorrect) row gives no correct
    (incorrect) row.
    """
    B = lengths.shape[0]
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max().item()) + 1 if B else 0
    # one integer key per row: sorting by it sorts by length, then by row index
    key = lengths.long() * B + torch.arange(B, device=lengths.device)
    none = torch.iinfo(torch.long).max
    chosen = torch.zeros(B, dtype=torch.bool, device=lengths.device)
    for cls in (correct, ~correct):
        eligible = cls & (lengths > 0)
        k = torch.where(eligible, key, torch.full_like(key, none))
        best = torch.full((G,), none, dtype=torch.long, device=lengths.device).scatter_reduce_(
            0, inv, k, "amin"
        )
        chosen |= eligible & (k == best[inv])
    return chosen


def prefix_mask(mask: Tensor, rows: Tensor, ratio: float) -> Tensor:
    """``[B, T]``: the first ``L_p`` valid positions of each chosen row (``rows`` bool ``[B]``), 0 elsewhere."""
    valid = mask > 0
    lp = prefix_lengths(valid.sum(-1), ratio)
    rank = torch.cumsum(valid.long(), dim=-1)  # 1-based index of each valid position
    keep = valid & (rank <= lp[:, None]) & rows[:, None]
    return keep.to(mask.dtype)


@register_selector("binary-prefix")
@torch.no_grad()
def binary_prefix(
    *,
    mask: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    bppo_prefix_ratio: float = BPPO_PREFIX_RATIO,
    bppo_accuracy_threshold: float = BPPO_ACCURACY_THRESHOLD,
    **_: object,
) -> Tensor:
    """BPPO's loss mask: the shortest correct and shortest incorrect sequence per group, on a prefix.

    A sequence is *correct* when its outcome ``R > 0.5`` (``R == 1`` for binary rewards, as in the
    survey's pseudocode). The *batch accuracy* is the fraction of correct sequences in the batch.

    - accuracy ``< bppo_accuracy_threshold``: every valid position of every sequence (the loss mask is
      ``mask``): plain GRPO while the policy still fails often and each success is rare signal;
    - otherwise, per group, the shortest correct and the shortest incorrect sequence (fewest valid
      positions; ties to the lowest row index; empty rows never), each on its first
      ``L_p = max(1, ceil(bppo_prefix_ratio * L))`` valid positions. A group with no correct (or no
      incorrect) sequence gives only the kind it has.

    The advantages stay the ``grpo`` estimator's, normalised over the FULL group (all ``G`` sequences),
    as in the paper: ``A = (1 - mu) / sigma`` for a correct and ``(0 - mu) / sigma`` for an incorrect
    sequence with binary rewards. ``sigma`` follows the trainer's ``std`` parameter (``"sample"`` by
    default, as verl; the survey's pseudocode divides by the population std, ``std="population"``; for
    a fixed G the two differ by the constant factor ``sqrt((G - 1) / G)``). An equal-outcome group has
    ``A = 0``, so its chosen row adds no gradient, as in the pseudocode (under ``token-mean`` its
    positions still count in the denominator, as an equal-outcome group's do in GRPO). The pseudocode
    takes ``int(ratio * L)`` positions (rounded down, possibly 0); here the prefix is rounded up and
    never empty. ``bppo_accuracy_threshold = 0`` always selects; ``1`` selects only when every sequence
    is correct (which trains nothing), so it means "never".

    Worked example (one group, ratio 0.4): ``R = [1, 0, 1, 0, 0, 1]``, lengths ``[7, 5, 4, 9, 5, 10]``,
    accuracy 0.5 >= 0.5: rows 2 (shortest correct, length 4) and 1 (incorrect, length 5, tied with
    row 4 and lower) on their first ``ceil(1.6) = 2`` and ``ceil(2.0) = 2`` positions; population std
    gives them ``A = +1`` and ``-1``, sample std ``+-0.5 / sqrt(0.3) = +-0.9129``.
    """
    if not 0.0 <= bppo_accuracy_threshold <= 1.0:
        raise ValueError(f"bppo_accuracy_threshold must be in [0, 1], got {bppo_accuracy_threshold}")
    prefix_lengths(torch.ones(1, dtype=torch.long), bppo_prefix_ratio)  # validates the ratio
    if group_ids is None:
        raise ValueError("the binary-prefix selector needs group_ids [B]")
    if rewards.shape != mask.shape[:1] or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must be [B] = [{mask.shape[0]}]")
    correct = rewards > CORRECT_ABOVE
    accuracy = float(correct.float().mean()) if correct.numel() else 0.0
    if accuracy < bppo_accuracy_threshold:
        return mask
    rows = shortest_per_class((mask > 0).sum(-1), correct, group_ids.to(mask.device))
    return prefix_mask(mask, rows, bppo_prefix_ratio)


# --------------------------------------------------------------------------------------------------
# LamPO


def sequence_confidence(logp_old: Tensor, mask: Tensor) -> Tensor:
    """``c_b = mean_t logp_old[b, t]`` over valid positions (0 for an empty sequence), ``[B]`` float64."""
    m = mask.to(torch.float64)
    return (logp_old.to(torch.float64) * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def group_table(group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Rows laid out by group: ``table[g, k]`` is the ``k``-th row (in row order) of the ``g``-th group,
    -1 past the group's end; ``inv[b], slot[b]`` is row ``b``'s place. Pairwise work on ``table`` costs
    ``n_groups * G_max^2``, not ``B^2``."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    B, n = inv.shape[0], counts.shape[0]
    order = torch.argsort(inv, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inv)
    slot[order] = torch.arange(B, device=inv.device) - starts[inv[order]]
    g_max = int(counts.max().item()) if n else 0
    table = torch.full((n, g_max), -1, dtype=torch.long, device=inv.device)
    table[inv, slot] = torch.arange(B, device=inv.device)
    return inv, slot, table


@register_estimator("lampo", Requirements(groups=True, logprobs=True))
@torch.no_grad()
def lampo(
    *,
    token_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    logp_old: Tensor,
    lampo_temperature: float = LAMPO_TEMPERATURE,
    **_: object,
) -> tuple[Tensor, Tensor]:
    """Pairwise decomposed advantage, LambdaRank style, broadcast to the sequence.

    For sequence ``i`` of a group ``g`` of size ``G``::

        A_i  = 1/(G - 1) * sum_{j in g, j != i} (R_i - R_j) * w_ij
        w_ij = 2 * sigmoid(-sign(R_i - R_j) * (c_i - c_j) / tau)
        c_i  = mean over the valid positions of logp_old[i, t]   (the sampling policy's confidence)

    with ``tau = lampo_temperature``. For a pair with a better sequence ``b`` and a worse one ``l``,
    ``P(b > l) = sigmoid((c_b - c_l) / tau)`` is the policy's own (Bradley-Terry / RankNet) probability
    of the right order, and ``w = 2 * (1 - P(b > l))``: LambdaRank's pair weight ``|dZ| * (1 - P)`` with
    ``|dZ| = |R_i - R_j|``, scaled by 2 so that an undecided policy (``P = 1/2``) weighs 1. Pairs the
    policy already orders correctly and confidently fade (``w -> 0``); pairs it orders the wrong way
    count up to twice. The paper (arXiv 2605.19416, withdrawn; re-submitted as arXiv 2605.21235, also
    withdrawn) states in its abstract that each pairwise reward gap is "attenuated by the policy's own
    probabilistic confidence in the established preference", computed "from sequence log-probability
    differences"; its full text, with the exact formula, could not be consulted. The formula here is
    therefore a LambdaRank-style construction from that description, not necessarily the authors'.
    Confidence is the length-normalised (mean) log-prob, so that length alone does not decide it.

    Properties (each checked in ``tests/test_variants.py``):

    - ``w_ij = w_ji``, so the pair terms are antisymmetric and ``sum_{i in g} A_i = 0`` (centred);
    - a group whose rewards are all equal (a singleton included) gets exactly 0;
    - equal confidences, or ``tau -> inf``: ``w = 1`` and ``A_i = R_i - mean_{j != i} R_j``: RLOO, i.e.
      ``G / (G - 1)`` times Dr. GRPO's ``R_i - mean_g``;
    - ``tau -> 0``: ``w`` in ``{0, 1, 2}`` (right order, tie, wrong order);
    - ``|A_i| <= 2 * max_j |R_i - R_j|``; raising ``c`` of the best sequence lowers its advantage.

    Worked example (``tau = 1``, one group): ``R = [1, 1, 0, 0]``,
    ``c = [-0.5, -0.5 - ln 3, -0.5 - ln 3, -0.5]``. Pairs (correct, incorrect): (0, 2) ``c`` gap
    ``+ln 3``, ``P = 3/4``, ``w = 1/2``; (0, 3) and (1, 2) gap 0, ``w = 1``; (1, 3) gap ``-ln 3``,
    ``w = 3/2``. So ``A = [(1/2 + 1)/3, (1 + 3/2)/3, -(1/2 + 1)/3, -(1 + 3/2)/3] = [1/2, 5/6, -1/2, -5/6]``
    (RLOO: ``[2/3, 2/3, -2/3, -2/3]``).
    """
    if not lampo_temperature > 0.0:
        raise ValueError(f"lampo_temperature must be > 0, got {lampo_temperature}")
    if group_ids is None or group_ids.shape != mask.shape[:1]:
        raise ValueError(f"lampo needs group_ids of shape ({mask.shape[0]},)")
    if logp_old is None or logp_old.shape != mask.shape:
        raise ValueError(f"lampo needs logp_old of shape {tuple(mask.shape)}")
    R = sequence_scores(token_rewards, mask)
    inv, slot, table = group_table(group_ids.to(mask.device))
    present = table >= 0  # [n_groups, G_max]
    rows = table.clamp(min=0)
    r = R.to(torch.float64)[rows]
    c = sequence_confidence(logp_old, mask)[rows]
    dr = r[:, :, None] - r[:, None, :]  # R_i - R_j within each group
    dc = c[:, :, None] - c[:, None, :]  # c_i - c_j
    w = 2.0 * torch.sigmoid(-torch.sign(dr) * dc / lampo_temperature)
    eye = torch.eye(table.shape[1], dtype=torch.bool, device=table.device)
    pair = present[:, :, None] & present[:, None, :] & ~eye
    peers = present.sum(-1, keepdim=True).to(torch.float64) - 1.0
    a = torch.where(pair, dr * w, torch.zeros_like(dr)).sum(-1) / peers.clamp(min=1.0)
    return broadcast(a[inv, slot].to(R.dtype), mask), R


# --------------------------------------------------------------------------------------------------
# Latent-GRPO


@register_selector("first-token")
@torch.no_grad()
def first_token(
    *,
    mask: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    advantages: Tensor,
    logp_old: Tensor | None = None,
    logp_rollout: Tensor | None = None,
    **_: object,
) -> Tensor:
    """Latent-GRPO's optimal correct-path first-token selection (arXiv 2604.27998), as a loss mask.

    At the first position every sequence of a group shares its context (the prompt), so reinforcing the
    first latent step of several correct sequences pushes the policy towards the average of their
    mixtures, which need not be a valid latent state ("latent mixture non-closure"). Per group:

    - the *candidates* are the rows whose advantage at their first valid position is ``> 0``;
    - the *winner* is the candidate with the highest length-normalised old log-prob
      ``c_b = mean_t logp_old[b, t]`` over its valid positions (ties: the lowest row index);
    - in a group with a winner, every other row loses its first valid position from the loss mask
      (positive and negative rows alike, as in the authors' code); a group without a candidate, and
      every later position, is left alone.

    ``logp_old`` is the policy's before the update; where a run leaves it out (one fused on-policy
    pass) ``logp_rollout``, the sampler's log-probs of the same actions, stands in. The authors' code
    sets the dropped positions' advantage to 0 and keeps them in the token-mean's denominator; as a
    selector they leave the loss mask instead, so the denominator has one position fewer per dropped row.

    Worked example (one group of four, two positions each): advantages at position 0
    ``[0.87, 0.87, -0.87, 0.87]``, ``c = [-0.5, -0.2, -0.1, -0.9]``: candidates rows 0, 1, 3 (row 2 has the
    highest ``c`` but a negative advantage), winner row 1; the loss mask keeps ``[[0, 1], [1, 1], [0, 1],
    [0, 1]]``.
    """
    logp = logp_old if logp_old is not None else logp_rollout
    if logp is None:
        raise ValueError("the first-token selector needs logp_old (or the sampler's logp_rollout) [B, T]")
    if group_ids is None or group_ids.shape != mask.shape[:1]:
        raise ValueError(f"the first-token selector needs group_ids of shape ({mask.shape[0]},)")
    B = mask.shape[0]
    if B == 0:
        return mask
    valid = mask > 0
    length = valid.sum(-1)
    first = valid.long().argmax(-1)  # first valid position (0 with right padding)
    rows = torch.arange(B, device=mask.device)
    a0 = advantages[rows, first]
    candidate = (a0 > 0) & (length > 0)
    c = sequence_confidence(logp, mask)
    _, inv = torch.unique(group_ids.to(mask.device), return_inverse=True)
    G = int(inv.max().item()) + 1
    score = torch.where(candidate, c, torch.full_like(c, -torch.inf))
    best = torch.full((G,), -torch.inf, dtype=c.dtype, device=mask.device).scatter_reduce_(
        0, inv, score, "amax"
    )
    tied = candidate & (score == best[inv])
    none = torch.full((G,), B, dtype=torch.long, device=mask.device)
    pick = none.scatter_reduce_(0, inv, torch.where(tied, rows, torch.full_like(rows, B)), "amin")
    has_winner = pick[inv] < B
    drop = has_winner & (rows != pick[inv]) & (length > 0)
    out = mask.clone()
    out[rows[drop], first[drop]] = 0
    return out
