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
  (Mann-Whitney; 0.5 = no separation, 1 = every success above every failure, below 0.5 = the critic
  ranks them the wrong way round). NaN without both outcomes.

Per seed, never pooled: every number above is computed within ONE run's trace (one seed's critic), then
summarised over the seeds of a (task, algorithm) group. Pooling the seeds' sequences would rank one
critic's values against another's: two critics that each separate perfectly, one on a low value scale
with mostly successes and one on a high scale with mostly failures, pool to an AUC below 0.5. A summary
over seeds of a number ``x`` (``x_k`` for seed ``k``, NaN seeds left out) holds ``mean``, ``min``,
``max``, the per-seed ``values`` (NaN kept, in seed order), ``n`` (seeds where ``x`` is defined) and,
for a ROC-AUC, ``inverted = #{k : x_k < 0.5}``; per bin the same mean, min and max over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from sppo_rl.runtime.trace import Trace

TAIL_BINS = 20
TAIL_FRAC = 0.1
FIGURE = "tail_effect.png"


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
    """The diagnostic of a sequence critic's trace: ``sigmoid V(s_0)`` by outcome, its gap and ROC-AUC.
    The advantage ``R - V(s_0)`` uses that one value at every position, so ``gap_first = gap_last =
    gap_v0`` and ``auc_first = auc_last = auc_v0``."""
    v, s = trace.v0, trace.success
    quart = {
        name: [float(q) for q in np.percentile(x, [25, 50, 75])] if len(x) else [math.nan] * 3
        for name, x in (("success", v[s]), ("failure", v[~s]))
    }
    gap, auc = _mean(v[s]) - _mean(v[~s]), roc_auc(v[s], v[~s])
    return {
        "kind": "sequence",
        "sequences": int(len(v)),
        "successes": int(s.sum()),
        "failures": int((~s).sum()),
        "v0_success_mean": _mean(v[s]),
        "v0_failure_mean": _mean(v[~s]),
        "v0_success_quartiles": quart["success"],
        "v0_failure_quartiles": quart["failure"],
        "gap_v0": gap,
        "auc_v0": auc,
        "gap_first": gap,
        "auc_first": auc,
        "gap_last": gap,
        "auc_last": auc,
        "points": {"success": v[s].tolist(), "failure": v[~s].tolist()},
    }


STEP_SCALARS = ("auc_first", "auc_last", "gap_first", "gap_last", "gap_area", "tail_share")
SEQUENCE_SCALARS = (
    "auc_v0",
    "gap_v0",
    "v0_success_mean",
    "v0_failure_mean",
    "auc_first",
    "auc_last",
    "gap_first",
    "gap_last",
)
BIN_CURVES = ("success", "failure", "gap", "auc")


def over_seeds(values) -> dict[str, Any]:
    """Summary of one number over seeds: ``mean``, ``min``, ``max`` over the seeds where it is defined
    (NaN if none), the per-seed ``values`` (NaN kept), ``n`` defined seeds, and ``inverted``: how many
    are below 0.5 (meaningful for ROC-AUCs: a critic that ranks the outcomes the wrong way round)."""
    x = np.asarray(values, dtype=float)
    d = x[~np.isnan(x)]
    return {
        "mean": float(d.mean()) if len(d) else math.nan,
        "min": float(d.min()) if len(d) else math.nan,
        "max": float(d.max()) if len(d) else math.nan,
        "values": [float(v) for v in x],
        "n": int(len(d)),
        "inverted": int((d < 0.5).sum()),
    }


def _curve_over_seeds(curves: list[list[float]]) -> dict[str, list[float]]:
    """Per bin: mean, min and max over the seeds' curves (NaN bins left out; NaN where no seed has one)."""
    m = np.asarray(curves, dtype=float)  # [seeds, bins]
    out: dict[str, list[float]] = {"mean": [], "min": [], "max": [], "n": []}
    for col in m.T:
        col = col[~np.isnan(col)]
        out["n"].append(int(len(col)))
        for key, f in (("mean", np.mean), ("min", np.min), ("max", np.max)):
            out[key].append(float(f(col)) if len(col) else math.nan)
    return out


def _seed_order(run: dict[str, Any]) -> tuple:
    seed = run.get("seed")
    return (not isinstance(seed, int), seed if isinstance(seed, int) else 0, str(seed), str(run.get("path")))


def diagnose(
    traced: Iterable[tuple[str, str, dict[str, Any], Trace]], bins: int = TAIL_BINS, frac: float = TAIL_FRAC
) -> list[dict[str, Any]]:
    """One entry per (task, algo, kind) of ``(task, algo, run, trace)`` tuples, ``run`` naming the run
    (e.g. ``{"seed": 0, "path": ...}``). Every number is computed per run (``seeds``: ``run`` plus its
    :func:`step_numbers` / :func:`sequence_numbers`, in seed order) and summarised over them
    (:func:`over_seeds`; per bin: :func:`_curve_over_seeds` of each seed's success mean, failure mean,
    gap and ROC-AUC). Sorted by task, then step critics before sequence critics, then algorithm."""
    groups: dict[tuple[str, str, str], list[tuple[dict[str, Any], Trace]]] = {}
    for task, algo, run, trace in traced:
        groups.setdefault((task, algo, trace.kind), []).append((dict(run), trace))
    out = []
    for (task, algo, kind), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][2] != "step", kv[0][1])
    ):
        members.sort(key=lambda m: _seed_order(m[0]))
        seeds = [
            {**run, **(step_numbers(t, bins, frac) if kind == "step" else sequence_numbers(t))}
            for run, t in members
        ]
        entry: dict[str, Any] = {
            "task": task,
            "algo": algo,
            "kind": kind,
            "runs": len(seeds),
            "sequences": sum(e["sequences"] for e in seeds),
            "successes": sum(e["successes"] for e in seeds),
            "failures": sum(e["failures"] for e in seeds),
            "one_outcome_seeds": sum(1 for e in seeds if not (e["successes"] and e["failures"])),
        }
        for key in STEP_SCALARS if kind == "step" else SEQUENCE_SCALARS:
            entry[key] = over_seeds([e[key] for e in seeds])
        if kind == "step":
            entry["bins"] = {
                "lo": [b / bins for b in range(bins)],
                "hi": [(b + 1) / bins for b in range(bins)],
                **{
                    name: _curve_over_seeds(
                        [
                            e["bins"][name]["mean"] if name in ("success", "failure") else e["bins"][name]
                            for e in seeds
                        ]
                    )
                    for name in BIN_CURVES
                },
            }
        entry["seeds"] = seeds
        out.append(entry)
    return out


def definitions(bins: int = TAIL_BINS, frac: float = TAIL_FRAC) -> dict[str, str]:
    return {
        "tail effect": "from each run's critic_trace.npz (critic values along sampled sequences at the end "
        "of training); success = outcome R > 0.5. Every number is computed within one run (one seed's "
        "critic) and then summarised over the seeds of the group: mean [min, max], the per-seed values, "
        "and how many seeds are inverted (ROC-AUC < 0.5); the seeds' sequences are never pooled, since one "
        "critic's values cannot be ranked against another's. Step t of a sequence of length T "
        f"sits at u = t/(T-1) (first step 0, last step 1) and in bin min(floor({bins} u), {bins - 1}); a "
        "sequence's bin value is the mean of its V(s_t) there; per seed and bin: mean over its successful "
        "and over its failed sequences, gap_b = mean success - mean failure, and the ROC-AUC of the bin values",
        "gap / ROC-AUC at t=0 and t=T-1": "difference of the mean critic value of successful and failed "
        "sequences, and the ROC-AUC P(v_success > v_failure) + P(=)/2, at the first step (V(s_0)) and at "
        "each sequence's last step; a sequence critic has one value, sigmoid V(s_0), which its advantage "
        "R - V(s_0) uses at every position, so its numbers are the same at t=0 and t=T-1",
        "gap area": "mean of gap_b over the bins where both outcomes have values (area under the gap curve)",
        f"tail share (last {frac:.0%})": f"sum of max(gap_b, 0) over the last {tail_bins(bins, frac)} of "
        f"{bins} bins divided by the sum over all bins: the share of the separation found only at the end; "
        f"{tail_bins(bins, frac) / bins:g} if the gap is the same everywhere, 1 if it exists only there",
    }


# ------------------------------------------------------------------------------------- figure


def plot(entries: list[dict[str, Any]], path: Path, colour: dict[str, str], frac: float = TAIL_FRAC):
    """``tail_effect.png``: per task, each seed's critic values against t/(T-1) by outcome (top) and each
    seed's ROC-AUC per bin with the mean and min-max band over seeds (bottom); sequence critics' per-seed
    V(s_0) means and AUCs as points left of 0, their mean AUC as a dotted line over every position."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    tasks = sorted({e["task"] for e in entries})
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig = Figure(figsize=(max(5.6, 4.8 * cols), 5.8 * rows), layout="constrained")
    gs = fig.add_gridspec(2 * rows, cols, height_ratios=[1.6, 1.2] * rows)
    for i, task in enumerate(tasks):
        r, c = divmod(i, cols)
        top = fig.add_subplot(gs[2 * r, c])
        bottom = fig.add_subplot(gs[2 * r + 1, c], sharex=top)
        mine = [e for e in entries if e["task"] == task]
        seq = [e for e in mine if e["kind"] == "sequence"]
        left = -0.08 * (len(seq) + 0.5)  # a column of points per sequence critic
        nbins = max((len(e["bins"]["lo"]) for e in mine if e["kind"] == "step"), default=TAIL_BINS)
        for ax in (top, bottom):
            ax.axvspan(1 - tail_bins(nbins, frac) / nbins, 1.0, color="0.9", lw=0, zorder=0)
            ax.grid(alpha=0.3)
            ax.set_xlim(left, 1.0)
        bottom.axhline(0.5, color="0.4", lw=0.8)
        bottom.set_ylim(-0.03, 1.03)
        handles = []
        for e in (e for e in mine if e["kind"] == "step"):
            col, b = colour[e["algo"]], e["bins"]
            x = (np.array(b["lo"]) + np.array(b["hi"])) / 2
            for s in e["seeds"]:
                for outcome, style in (("success", "-"), ("failure", "--")):
                    top.plot(
                        x, np.array(s["bins"][outcome]["mean"], dtype=float), ls=style, color=col, lw=1.0
                    )
                bottom.plot(x, np.array(s["bins"]["auc"], dtype=float), color=col, lw=0.7, alpha=0.6)
            auc = b["auc"]
            lo, hi = np.array(auc["min"], dtype=float), np.array(auc["max"], dtype=float)
            bottom.fill_between(x, lo, hi, color=col, alpha=0.15, lw=0)
            bottom.plot(x, np.array(auc["mean"], dtype=float), "o-", ms=3, color=col, lw=1.8)
            first, last = e["auc_first"], e["auc_last"]
            handles.append(
                Line2D(
                    [],
                    [],
                    color=col,
                    lw=1.8,
                    label=f"{e['algo']} V(s_t), {e['runs']} seeds: AUC first {_fmt(first['mean'], '.2f')} "
                    f"({first['inverted']}/{first['n']} inv.), last {_fmt(last['mean'], '.2f')} "
                    f"({last['inverted']}/{last['n']} inv.)",
                )
            )
        for j, e in enumerate(seq):
            col = colour[e["algo"]]
            x0 = left + 0.08 * (j + 0.5)
            k = len(e["seeds"])
            for n, s in enumerate(e["seeds"]):
                xs = x0 + 0.04 * ((n + 0.5) / k - 0.5)
                ys = [s["v0_success_mean"], s["v0_failure_mean"]]
                top.plot([xs, xs], ys, color=col, lw=0.8)
                top.plot([xs], [ys[0]], "o", color=col, ms=5)
                top.plot([xs], [ys[1]], "o", mfc="white", mec=col, ms=5)
                bottom.plot([xs], [s["auc_v0"]], "s", color=col, ms=5)
            auc = e["auc_v0"]
            if not math.isnan(auc["mean"]):
                bottom.plot([0.0, 1.0], [auc["mean"]] * 2, ":", color=col, lw=1.8)
            handles.append(
                Line2D(
                    [],
                    [],
                    color=col,
                    ls=":",
                    marker="s",
                    label=f"{e['algo']} V(s_0), {e['runs']} seeds: AUC {_fmt(auc['mean'], '.2f')} "
                    f"({auc['inverted']}/{auc['n']} inv.)",
                )
            )
        top.set_title(task if len(task) < 40 else "..." + task[-37:])
        top.set_ylabel("critic value (per seed)")
        bottom.legend(handles=handles, fontsize=7, loc="lower right")
        bottom.set_xlabel("relative position t/(T-1)")
        bottom.set_ylabel("ROC-AUC success vs failure")
        bottom.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
        top.tick_params(labelbottom=False)
    from sppo_rl.experiments.figures import fit_title

    fit_title(
        fig,
        "top: each seed's mean value over its successful (solid) and failed (dashed) sequences; "
        "points left of 0: sequence critic V(s_0), filled = successes, open = failures\n"
        "bottom: ROC-AUC within each seed (thin), mean over seeds (thick), min-max band; "
        f"below 0.5 = inverted ranking; grey: last {frac:.0%} of positions",
        fontsize=8,
    )
    fig.savefig(path, dpi=120)
    return fig


# ------------------------------------------------------------------------------------- text


def _fmt(x: float | None, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _range(x: dict[str, Any], fmt: str) -> str:
    """``mean [min, max]`` of an :func:`over_seeds` summary (just the value for one seed)."""
    if x["n"] <= 1:
        return _fmt(x["mean"], fmt)
    return f"{_fmt(x['mean'], fmt)} [{_fmt(x['min'], fmt)}, {_fmt(x['max'], fmt)}]"


def _inverted(x: dict[str, Any]) -> str:
    return f"{x['inverted']}/{x['n']}" if x["n"] else "—"


def markdown(entries: list[dict[str, Any]], skipped: list[str], frac: float = TAIL_FRAC) -> list[str]:
    """The report's section: one row per (task, algo) with its numbers summarised over seeds (mean
    [min, max], inverted seeds), then one row per seed."""
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
        "that carry no more information than a constant baseline. Every number is computed within one seed's "
        "run and then summarised over seeds: mean [min, max]; inverted = seeds whose ROC-AUC is below 0.5 "
        "(the critic ranks the outcomes the wrong way round). A sequence critic's one value V(s_0) serves "
        "every position, so its t=0 and t=T-1 numbers are the same.",
        "",
        "| task | algo | critic | seeds | sequences (+/-) | ROC-AUC at t=0 | inverted | ROC-AUC at t=T-1 "
        f"| inverted | gap area | tail share (last {frac:.0%}) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        counts = f"{e['sequences']} ({e['successes']}/{e['failures']})"
        step = e["kind"] == "step"
        cells = [
            "V(s_t)" if step else "V(s_0)",
            str(e["runs"]),
            counts,
            _range(e["auc_first"], ".3f"),
            _inverted(e["auc_first"]),
            _range(e["auc_last"], ".3f"),
            _inverted(e["auc_last"]),
            _range(e["gap_area"], ".3f") if step else "—",
            _range(e["tail_share"], ".2f") if step else "—",
        ]
        lines.append(f"| {e['task']} | {e['algo']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per seed:",
        "",
        "| task | algo | seed | sequences (+/-) | ROC-AUC at t=0 | ROC-AUC at t=T-1 | gap at t=0 | gap at t=T-1 "
        f"| gap area | tail share (last {frac:.0%}) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        for s in e["seeds"]:
            step = e["kind"] == "step"
            cells = [
                str(s.get("seed", "—")),
                f"{s['sequences']} ({s['successes']}/{s['failures']})",
                _fmt(s["auc_first"], ".3f"),
                _fmt(s["auc_last"], ".3f"),
                _fmt(s["gap_first"], ".3f"),
                _fmt(s["gap_last"], ".3f"),
                _fmt(s["gap_area"], ".3f") if step else "—",
                _fmt(s["tail_share"], ".2f") if step else "—",
            ]
            lines.append(f"| {e['task']} | {e['algo']} | " + " | ".join(cells) + " |")
    one_sided = [
        f"{e['task']} / {e['algo']} ({e['one_outcome_seeds']} of {e['runs']})"
        for e in entries
        if e["one_outcome_seeds"]
    ]
    if one_sided:
        lines += [
            "",
            "Seeds with only one outcome in their trace (no gap or ROC-AUC; left out of the summaries): "
            + ", ".join(one_sided)
            + ".",
        ]
    if skipped:
        lines += ["", "Unreadable critic traces (left out): " + "; ".join(skipped)]
    lines += ["", f"![tail effect]({FIGURE})"]
    return lines
