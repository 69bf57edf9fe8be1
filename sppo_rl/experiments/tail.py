"""The tail-effect diagnostic: where along a sequence does a critic tell success from failure?

A step (token) critic is trained on ``V(s_t)`` for every position, yet with one outcome at the end it
tends to separate successful from failed sequences only near their END; in the middle its values are the
same for both, so ``A_t = R - V(s_t)`` carries no more information there than a constant baseline would
(the "tail effect", Figure 1 of the SPPO paper). SPPO's critic reads the context only, ``V(s_0)``.

Every run with a critic leaves ``critic_trace.npz`` (control and LLM runs alike; its schema is declared
once, in :mod:`sppo_rl.runtime.trace`).

Definitions (``B`` bins, default 20; tail fraction ``f``, default 0.1):

- relative position of step ``t`` (``0 <= t < T``) of a sequence of length ``T``: ``u = t / (T - 1)``
  (``u = 0`` when ``T = 1``), so every sequence's first step sits at ``u = 0`` and its last step, the
  one right before the outcome, at ``u = 1``, whatever its length. Step ``t`` falls in bin
  ``b = min(floor(B u), B - 1)`` (exact integer arithmetic): bins ``[b/B, (b+1)/B)``, the last one closed;
- a sequence's value in bin ``b`` is the mean of its ``V(s_t)`` over its steps in that bin (a sequence
  shorter than ``B`` leaves some bins empty), so every sequence weighs the same in every bin it reaches;
- per bin and outcome: mean, 25th and 75th percentile over the sequences; the gap
  ``g_b = mean_success_b - mean_failure_b``; ``auc_b`` = ROC-AUC of the bin values (success vs failure);
- ``gap_first`` / ``auc_first``: gap and ROC-AUC of ``V(s_0)`` (exactly ``t = 0``);
  ``gap_last`` / ``auc_last``: of ``V(s_{T-1})``, each sequence's last position;
- ``gap_area = (1/B') sum_b g_b`` over the ``B'`` bins where both outcomes have values: the area under
  the gap curve over ``u`` in ``[0, 1]``;
- ``tail_share = sum_{b in tail} max(g_b, 0) / sum_b max(g_b, 0)`` over the bins where the gap is
  defined, the tail being the last ``k = max(1, round(f B))`` bins (``u >= 0.9`` with the defaults): the
  share of the success/failure separation that appears only in the last ``f`` of the positions. A gap
  that is the same everywhere gives ``k / B`` (0.1); a gap that exists only in the last 10% gives 1; NaN
  if the gap is nowhere positive;
- sequence critics: ``gap_v0`` and ``auc_v0``, the gap and ROC-AUC of ``sigmoid V(s_0)``;
- ROC-AUC ``= P(x_success > x_failure) + P(x_success = x_failure) / 2`` over all success/failure pairs
  (Mann-Whitney; 0.5 = no separation, 1 = every success above every failure). NaN without both outcomes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from sppo_rl.runtime.trace import TRACE_FILE, Trace, load_trace  # noqa: F401  (the schema lives there)

TAIL_BINS = 20
TAIL_FRAC = 0.1
FIGURE = "tail_effect.png"


def concat(traces: list[Trace]) -> Trace:
    """The sequences of several traces of one kind (e.g. the seeds of a group) as one trace."""
    kinds = {t.kind for t in traces}
    if len(kinds) != 1:
        raise ValueError(f"cannot pool traces of kinds {sorted(kinds)}")
    lengths = np.concatenate([t.lengths for t in traces])
    success = np.concatenate([t.success for t in traces])
    horizon = max(t.horizon for t in traces)
    if traces[0].kind == "sequence":
        return Trace("sequence", lengths, success, horizon, v0=np.concatenate([t.v0 for t in traces]))
    T = max(t.values.shape[1] for t in traces)
    values = np.concatenate([np.pad(t.values, ((0, 0), (0, T - t.values.shape[1]))) for t in traces])
    return Trace("step", lengths, success, horizon, values=values)


# ------------------------------------------------------------------------------------- statistics


def relative_bins(values, lengths, bins: int = TAIL_BINS) -> np.ndarray:
    """``[N, bins]``: each sequence's mean value over its steps ``t < T`` in bin
    ``b = min(floor(bins t / (T - 1)), bins - 1)`` (bin 0 when ``T = 1``); NaN where the sequence has no
    step in bin ``b`` (and for sequences of length 0). Padding is ignored."""
    v = np.asarray(values, dtype=float)
    L = np.asarray(lengths, dtype=int)
    N, T = v.shape
    t = np.arange(T)[None, :]
    valid = t < L[:, None]
    idx = np.minimum((t * bins) // np.maximum(L - 1, 1)[:, None], bins - 1)
    rows = np.broadcast_to(np.arange(N)[:, None], (N, T))
    sums = np.zeros((N, bins))
    counts = np.zeros((N, bins))
    np.add.at(sums, (rows[valid], idx[valid]), v[valid])
    np.add.at(counts, (rows[valid], idx[valid]), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def roc_auc(pos, neg) -> float:
    """ROC-AUC of scores ``pos`` (positives) against ``neg`` (NaNs dropped): the Mann-Whitney
    ``P(x_pos > x_neg) + P(x_pos = x_neg) / 2`` from average ranks. NaN if either side is empty."""
    p = np.asarray(pos, dtype=float)
    n = np.asarray(neg, dtype=float)
    p, n = p[~np.isnan(p)], n[~np.isnan(n)]
    if len(p) == 0 or len(n) == 0:
        return math.nan
    ranks = sps.rankdata(np.concatenate([p, n]))
    return float((ranks[: len(p)].sum() - len(p) * (len(p) + 1) / 2) / (len(p) * len(n)))


def _mean(x) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else math.nan


def _column_stats(m: np.ndarray) -> dict[str, list[float]]:
    """Mean, quartiles and count over the rows of ``m`` (NaNs dropped), per column."""
    out: dict[str, list[float]] = {"mean": [], "q25": [], "q75": [], "n": []}
    for col in m.T:
        col = col[~np.isnan(col)]
        out["n"].append(len(col))
        if len(col):
            q25, q75 = np.percentile(col, [25, 75])
            out["mean"].append(float(col.mean()))
            out["q25"].append(float(q25))
            out["q75"].append(float(q75))
        else:
            out["mean"].append(math.nan)
            out["q25"].append(math.nan)
            out["q75"].append(math.nan)
    return out


def tail_bins(bins: int, frac: float = TAIL_FRAC) -> int:
    """How many of ``bins`` make the tail: ``k = max(1, round(frac * bins))``."""
    return max(1, round(frac * bins))


def tail_share(gap, frac: float = TAIL_FRAC) -> float:
    """``sum_{last k bins} max(g_b, 0) / sum_b max(g_b, 0)`` over the non-NaN bins, ``k`` =
    :func:`tail_bins` (see the module docstring); NaN if no bin has a positive gap."""
    g = np.asarray(gap, dtype=float)
    pos = np.where(np.isnan(g), 0.0, np.maximum(g, 0.0))
    total = pos.sum()
    return float(pos[len(g) - tail_bins(len(g), frac) :].sum() / total) if total > 0 else math.nan


def step_numbers(trace: Trace, bins: int = TAIL_BINS, frac: float = TAIL_FRAC) -> dict[str, Any]:
    """The diagnostic of a step critic's trace (see the module docstring for every number)."""
    keep = trace.lengths > 0
    v, L, s = trace.values[keep], trace.lengths[keep], trace.success[keep]
    per_seq = relative_bins(v, L, bins)
    succ, fail = _column_stats(per_seq[s]), _column_stats(per_seq[~s])
    gap = [a - b for a, b in zip(succ["mean"], fail["mean"])]
    auc = [roc_auc(per_seq[s, b], per_seq[~s, b]) for b in range(bins)]
    first = v[:, 0]
    last = v[np.arange(len(L)), L - 1] if len(L) else np.zeros(0)
    defined = [g for g in gap if not math.isnan(g)]
    return {
        "kind": "step",
        "sequences": int(len(L)),
        "successes": int(s.sum()),
        "failures": int((~s).sum()),
        "length_success": _mean(L[s]),
        "length_failure": _mean(L[~s]),
        "bins": {
            "lo": [b / bins for b in range(bins)],
            "hi": [(b + 1) / bins for b in range(bins)],
            "success": succ,
            "failure": fail,
            "gap": gap,
            "auc": auc,
        },
        "gap_first": _mean(first[s]) - _mean(first[~s]),
        "auc_first": roc_auc(first[s], first[~s]),
        "gap_last": _mean(last[s]) - _mean(last[~s]),
        "auc_last": roc_auc(last[s], last[~s]),
        "gap_area": float(np.mean(defined)) if defined else math.nan,
        "tail_share": tail_share(gap, frac),
    }


def sequence_numbers(trace: Trace) -> dict[str, Any]:
    """The diagnostic of a sequence critic's trace: ``sigmoid V(s_0)`` by outcome, its gap and ROC-AUC."""
    v, s = trace.v0, trace.success
    quart = {
        name: [float(q) for q in np.percentile(x, [25, 50, 75])] if len(x) else [math.nan] * 3
        for name, x in (("success", v[s]), ("failure", v[~s]))
    }
    return {
        "kind": "sequence",
        "sequences": int(len(v)),
        "successes": int(s.sum()),
        "failures": int((~s).sum()),
        "v0_success_mean": _mean(v[s]),
        "v0_failure_mean": _mean(v[~s]),
        "v0_success_quartiles": quart["success"],
        "v0_failure_quartiles": quart["failure"],
        "gap_v0": _mean(v[s]) - _mean(v[~s]),
        "auc_v0": roc_auc(v[s], v[~s]),
        "points": {"success": v[s].tolist(), "failure": v[~s].tolist()},
    }


def diagnose(
    traced: Iterable[tuple[str, str, Trace]], bins: int = TAIL_BINS, frac: float = TAIL_FRAC
) -> list[dict[str, Any]]:
    """One entry per (task, algo, kind) of ``(task, algo, trace)`` triples, the traces of a group (its
    seeds) pooled; sorted by task, then step critics before sequence critics, then algorithm."""
    groups: dict[tuple[str, str, str], list[Trace]] = {}
    for task, algo, trace in traced:
        groups.setdefault((task, algo, trace.kind), []).append(trace)
    out = []
    for (task, algo, kind), traces in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][2] != "step", kv[0][1])
    ):
        pooled = concat(traces)
        numbers = step_numbers(pooled, bins, frac) if kind == "step" else sequence_numbers(pooled)
        out.append({"task": task, "algo": algo, "runs": len(traces), **numbers})
    return out


def definitions(bins: int = TAIL_BINS, frac: float = TAIL_FRAC) -> dict[str, str]:
    return {
        "tail effect": "from each run's critic_trace.npz (critic values along sampled sequences at the end "
        "of training), seeds of a group pooled; success = outcome R > 0.5. Step t of a sequence of length T "
        f"sits at u = t/(T-1) (first step 0, last step 1) and in bin min(floor({bins} u), {bins - 1}); a "
        "sequence's bin value is the mean of its V(s_t) there; lines = mean over sequences, bands = "
        "25th-75th percentile; gap_b = mean success - mean failure",
        "gap / ROC-AUC at t=0 and t=T-1": "difference of the mean critic value of successful and failed "
        "sequences, and the ROC-AUC P(v_success > v_failure) + P(=)/2, at the first step (V(s_0); for a "
        "sequence critic its only value, sigmoid V(s_0)) and at each sequence's last step",
        "gap area": "mean of gap_b over the bins where both outcomes have values (area under the gap curve)",
        f"tail share (last {frac:.0%})": f"sum of max(gap_b, 0) over the last {tail_bins(bins, frac)} of "
        f"{bins} bins divided by the sum over all bins: the share of the separation found only at the end; "
        f"{tail_bins(bins, frac) / bins:g} if the gap is the same everywhere, 1 if it exists only there",
    }


# ------------------------------------------------------------------------------------- figure


def plot(entries: list[dict[str, Any]], path: Path, colour: dict[str, str], frac: float = TAIL_FRAC) -> None:
    """``tail_effect.png``: per task, critic values against t/(T-1) by outcome (top) and their gap (bottom);
    sequence critics' V(s_0) as boxes left of 0."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    tasks = sorted({e["task"] for e in entries})
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig = Figure(figsize=(max(5.6, 4.8 * cols), 5.4 * rows), layout="constrained")
    gs = fig.add_gridspec(2 * rows, cols, height_ratios=[2.2, 1.0] * rows)
    for i, task in enumerate(tasks):
        r, c = divmod(i, cols)
        top = fig.add_subplot(gs[2 * r, c])
        bottom = fig.add_subplot(gs[2 * r + 1, c], sharex=top)
        mine = [e for e in entries if e["task"] == task]
        seq = [e for e in mine if e["kind"] == "sequence"]
        left = -0.05 * (2 * len(seq) + 1)  # room for two boxes per sequence critic
        nbins = max((len(e["bins"]["lo"]) for e in mine if e["kind"] == "step"), default=TAIL_BINS)
        for ax in (top, bottom):
            ax.axvspan(1 - tail_bins(nbins, frac) / nbins, 1.0, color="0.9", lw=0, zorder=0)
            ax.grid(alpha=0.3)
            ax.set_xlim(left, 1.0)
        bottom.axhline(0.0, color="0.4", lw=0.8)
        handles = []
        for e in (e for e in mine if e["kind"] == "step"):
            col, b = colour[e["algo"]], e["bins"]
            x = (np.array(b["lo"]) + np.array(b["hi"])) / 2
            for outcome, style, alpha in (("success", "-", 0.22), ("failure", "--", 0.12)):
                st = b[outcome]
                mean, q25, q75 = (np.array(st[k], dtype=float) for k in ("mean", "q25", "q75"))
                top.plot(x, mean, ls=style, color=col, lw=1.6)
                top.fill_between(
                    x, q25, q75, color=col, alpha=alpha, lw=0, hatch=None if style == "-" else "//"
                )
            bottom.plot(x, np.array(b["gap"], dtype=float), "o-", ms=3, color=col, lw=1.4)
            handles.append(
                Patch(
                    color=col,
                    label=f"{e['algo']} V(s_t): {e['successes']}+/{e['failures']}- "
                    f"(tail share {_fmt(e['tail_share'], '.2f')})",
                )
            )
        for j, e in enumerate(seq):
            col = colour[e["algo"]]
            xs = left + 0.05 * (2 * j + 1), left + 0.05 * (2 * j + 2)
            boxes = [
                (x, outcome, e["points"][outcome])
                for x, outcome in zip(xs, ("success", "failure"))
                if e["points"][outcome]
            ]
            if boxes:
                bp = top.boxplot(
                    [p for _, _, p in boxes],
                    positions=[x for x, _, _ in boxes],
                    widths=0.04,
                    patch_artist=True,
                    manage_ticks=False,
                )
                for box, (_, outcome, _) in zip(bp["boxes"], boxes):
                    success = outcome == "success"
                    box.set(facecolor=col if success else "white", edgecolor=col, alpha=0.8)
                    if not success:
                        box.set_hatch("//")
                for part in ("whiskers", "caps", "medians", "fliers"):
                    for artist in bp[part]:
                        artist.set(color=col)
            if not math.isnan(e["gap_v0"]):
                bottom.plot([np.mean(xs)], [e["gap_v0"]], "s", color=col, ms=6)
            handles.append(
                Patch(
                    color=col,
                    label=f"{e['algo']} V(s_0): {e['successes']}+/{e['failures']}- "
                    f"(AUC {_fmt(e['auc_v0'], '.2f')})",
                )
            )
        top.set_title(task if len(task) < 40 else "..." + task[-37:])
        top.set_ylabel("critic value")
        top.legend(handles=handles, fontsize=7, loc="upper left")
        bottom.set_xlabel("relative position t/(T-1)")
        bottom.set_ylabel("gap (success - failure)")
        ticks = [0, 0.25, 0.5, 0.75, 1.0]
        bottom.set_xticks(ticks)
        top.tick_params(labelbottom=False)
    fig.suptitle(
        "solid: successful, dashed/hatched: failed sequences\n"
        "line = mean over sequences, band = interquartile range\n"
        f"boxes left of 0: sequence critic V(s_0); grey: last {frac:.0%} of positions",
        fontsize=9,
    )
    fig.savefig(path, dpi=120)


# ------------------------------------------------------------------------------------- text


def _fmt(x: float | None, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(entries: list[dict[str, Any]], skipped: list[str], frac: float = TAIL_FRAC) -> list[str]:
    """The report's section: one row per (task, algo) with a critic trace."""
    if not entries:
        return [
            "## Tail effect of the critics",
            "",
            "Unreadable critic traces (left out): " + "; ".join(skipped),
        ]
    lines = [
        "## Tail effect of the critics",
        "",
        "Where along a sequence does the critic tell successful from failed sequences apart? "
        "A step critic that separates them only near the end gives mid-sequence advantages A_t = R - V(s_t) "
        "that carry no more information than a constant baseline.",
        "",
        "| task | algo | critic | runs | sequences (+/-) | gap at t=0 | ROC-AUC at t=0 | gap at t=T-1 "
        f"| ROC-AUC at t=T-1 | gap area | tail share (last {frac:.0%}) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        counts = f"{e['sequences']} ({e['successes']}/{e['failures']})"
        if e["kind"] == "step":
            cells = [
                "V(s_t)",
                _fmt(e["gap_first"], ".3f"),
                _fmt(e["auc_first"], ".3f"),
                _fmt(e["gap_last"], ".3f"),
                _fmt(e["auc_last"], ".3f"),
                _fmt(e["gap_area"], ".3f"),
                _fmt(e["tail_share"], ".2f"),
            ]
        else:
            cells = ["V(s_0)", _fmt(e["gap_v0"], ".3f"), _fmt(e["auc_v0"], ".3f"), "—", "—", "—", "—"]
        lines.append(
            f"| {e['task']} | {e['algo']} | {cells[0]} | {e['runs']} | {counts} | "
            + " | ".join(cells[1:])
            + " |"
        )
    one_sided = [f"{e['task']} / {e['algo']}" for e in entries if not (e["successes"] and e["failures"])]
    if one_sided:
        lines += ["", f"Only one outcome in the traces of {', '.join(one_sided)}: no gap can be measured."]
    if skipped:
        lines += ["", "Unreadable critic traces (left out): " + "; ".join(skipped)]
    lines += ["", f"![tail effect]({FIGURE})"]
    return lines
