"""The decision rule of every comparison (``sppo-rl report``, ``sppo-rl sweep``'s folders through it,
``scripts/compare_llm.py``): a paired test over seeds whose error rates are known, because
``scripts/decision_sim.py`` measures them through these same functions and ``tests/test_decision.py``
pins what it measures.

- **One primary statistic per comparison set, named before its runs** (:class:`Design`): by default the
  accuracy at equal compute at the end of the common window (:func:`default_primary`: FLOPs where the
  runs log ``flops_total``, else generated tokens; control runs: env steps), with an equivalence margin
  ``margin`` (accuracy) and ``ratio_margin`` (ratios). Every other statistic is secondary (exploratory).
- **Paired t-test over seeds** (:func:`paired_t`): ``d_k = a_k - b_k`` for a difference, ``d_k = ln(a_k /
  b_k)`` for a ratio (its estimate the geometric mean ratio ``exp(mean d)``); ``t = mean(d) / (s_d /
  sqrt(n))`` on ``n - 1`` degrees of freedom, two-sided ``p``, the ``1 - alpha`` t-interval. Chosen over
  the sign-flip permutation test (:func:`sign_flip`, printed by the simulation beside it) because with 5
  seeds the smallest sign-flip p is ``2 / 2^5 = 0.0625 > 0.05``: it can never find anything; where both
  work the simulation shows the t-test's false-positive rate at alpha and its coverage >= 95 %, under
  independent, correlated and collapsing seeds.
- **Holm's correction** (:func:`holm`) over every row of one table: the primary table (one row per pair
  of methods) is one family, the secondary table another.
- **Verdict** (:func:`verdict`): ``difference (Holm p = ...)`` when the Holm-adjusted p is below alpha;
  else ``equivalent within +-margin (TOST p = ...)`` when the two one-sided tests (:func:`tost`) reject
  both "below -margin" and "above +margin" at alpha (the ``1 - 2 alpha`` interval inside the margin);
  else ``inconclusive: could not detect differences below MDE``, the **minimum detectable effect** (:func:`mde`): the
  true mean difference a paired t-test on this many seeds, with the observed paired spread, finds with
  80 % power.
- **Collapse counts** (:func:`collapsed`, :func:`fisher_exact`): a run that ends at 0 or below its own
  start; per method, Fisher's exact test between two methods' counts (pooled over tasks by adding).
- **Beside the means**: rliable's interquartile mean (:func:`sppo_rl.experiments.stats.iqm`) and
  probability of improvement (:func:`probability_of_improvement`).
- **Power** (:func:`power_paired`, :func:`seeds_needed`; ``scripts/power.py``): from a pilot's paired spread,
  the seeds needed to detect a stated effect at alpha 0.05 with power 0.8 (the noncentral t).

Pure NumPy and SciPy.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

from sppo_rl.experiments.stats import iqm

ALPHA = 0.05
POWER = 0.8
MARGIN = 0.05  # equivalence margin of an accuracy difference, declared before the runs
RATIO_MARGIN = 1.25  # equivalence margin of a ratio: within [1 / 1.25, 1.25]
SIGN_FLIP_EXACT = 12  # up to this many pairs every sign vector is enumerated

# What ``python scripts/decision_sim.py --reps 4000`` (seeded) measured through these functions: per
# noise model (that script's) and seed count, the coverage of the 95 % paired-t interval with no true
# difference and with a true difference of 1 sd, and the false-positive rate of "difference" (one
# comparison). tests/test_decision.py recomputes them (3000 repetitions) and checks they agree.
SIMULATED = {
    # model: {seeds: (coverage at 0, coverage at 1 sd, false-positive rate)}
    "independent": {5: (0.9473, 0.9527, 0.0527), 10: (0.9500, 0.9533, 0.0500), 20: (0.9503, 0.9497, 0.0498)},
    "correlated 0.8": {
        5: (0.9513, 0.9483, 0.0488),
        10: (0.9473, 0.9505, 0.0527),
        20: (0.9503, 0.9470, 0.0498),
    },
    "30 % collapse": {
        5: (0.9507, 0.9547, 0.0493),
        10: (0.9423, 0.9430, 0.0578),
        20: (0.9545, 0.9495, 0.0455),
    },
}


@dataclass(frozen=True)
class Design:
    """What a comparison set declares before its runs: the primary statistic (None: the default of the
    runs' axes, :func:`default_primary`), the equivalence margins and alpha."""

    primary: str | None = None
    margin: float = MARGIN
    ratio_margin: float = RATIO_MARGIN
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        if not (self.margin > 0 and self.ratio_margin > 1 and 0 < self.alpha < 1):
            raise ValueError(
                f"need margin > 0, ratio margin > 1 and 0 < alpha < 1, got {self.margin}, "
                f"{self.ratio_margin}, {self.alpha}"
            )


def default_primary(axes: tuple[str, ...]) -> tuple[str, str | None]:
    """The default primary statistic on ``axes`` and a note when it is not the compute axis: accuracy at
    equal FLOPs (``acc_at_flops``) where ``flops`` is an axis; else at equal env steps (control) or
    generated tokens (LLM runs that do not log ``flops_total``), with the note saying so."""
    if "flops" in axes:
        return "acc_at_flops", None
    if "env_steps" in axes:
        return "acc_at_env_steps", None
    if "tokens" in axes:
        return "acc_at_tokens", (
            "these runs log no flops_total: the primary statistic is the accuracy at equal generated "
            "tokens, which leaves out the critic's and the value model's compute"
        )
    return f"acc_at_{axes[0]}", f"no compute axis among {', '.join(axes)}: primary at equal {axes[0]}"


# ---------------------------------------------------------------------------------------- the tests


def paired_values(a, b, kind: str) -> np.ndarray:
    """The per-seed values the test reads: ``a_k - b_k`` (``difference``) or ``ln(a_k / b_k)``
    (``ratio``; NaN where either is not > 0). NaN pairs are dropped by the tests."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if kind == "difference":
        return a - b
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((a > 0) & (b > 0), np.log(np.where(a > 0, a, 1) / np.where(b > 0, b, 1)), np.nan)


def _finite(d) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    return d[np.isfinite(d)]


def _spread(d: np.ndarray) -> float:
    """The sample sd of ``d``; 0 where it is float rounding (below ``1e-12 max(1, max |d|)``): values
    equal up to rounding have no spread."""
    sd = float(d.std(ddof=1))
    return 0.0 if sd <= 1e-12 * max(1.0, float(np.abs(d).max())) else sd


def paired_t(d, alpha: float = ALPHA) -> dict[str, float]:
    """Paired t-test of ``mean(d) = 0``: ``n``, ``mean``, ``sd = sqrt(sum (d - mean)^2 / (n - 1))``,
    ``t = mean / (sd / sqrt(n))``, ``p = 2 (1 - F_{n-1}(|t|))`` and the interval ``mean -+ t_{1 - alpha/2,
    n-1} sd / sqrt(n)``. With ``sd = 0`` (up to float rounding): ``p = 0`` if ``mean != 0`` else 1, the interval a point. NaN
    (p, interval, sd) under two values."""
    d = _finite(d)
    n = len(d)
    out = {"n": n, "mean": float(d.mean()) if n else math.nan, "sd": math.nan, "t": math.nan}
    out |= {"p": math.nan, "lo": math.nan, "hi": math.nan}
    if n < 2:
        return out
    mean, sd = float(d.mean()), _spread(d)
    out["sd"] = sd
    if sd == 0:
        return out | {
            "p": 0.0 if mean != 0 else 1.0,
            "lo": mean,
            "hi": mean,
            "t": math.copysign(math.inf, mean),
        }
    se = sd / math.sqrt(n)
    t = mean / se
    half = _t_quantile(1 - alpha / 2, n - 1) * se
    return out | {"t": t, "p": float(2 * special.stdtr(n - 1, -abs(t))), "lo": mean - half, "hi": mean + half}


@functools.lru_cache(maxsize=1024)
def _t_quantile(q: float, df: int) -> float:
    """``t_{q, df}``, the Student-t quantile (cached: the simulation asks for the same few many times)."""
    return float(sps.t.ppf(q, df))


@functools.lru_cache(maxsize=SIGN_FLIP_EXACT)
def _all_signs(n: int) -> np.ndarray:
    """Every sign vector of length ``n``, ``[2^n, n]``."""
    return np.array(list(itertools.product((1.0, -1.0), repeat=n)))


def time_ratio(base, arm) -> dict[str, Any]:
    """How many times faster ``arm`` ran than ``base``: the seconds ``base[k] / arm[k]`` per repetition
    ``k`` (``per_rep``), their geometric mean (``ratio``) and its 95 % interval (``lo``, ``hi``: a paired t
    interval on the log-ratios, :func:`paired_t`; None from one repetition)."""
    logs = np.log(np.asarray(base, dtype=float)) - np.log(np.asarray(arm, dtype=float))
    t = paired_t(logs)
    return {
        "ratio": math.exp(t["mean"]),
        "lo": None if math.isnan(t["lo"]) else math.exp(t["lo"]),
        "hi": None if math.isnan(t["hi"]) else math.exp(t["hi"]),
        "per_rep": [float(math.exp(x)) for x in logs],
    }


def ratio_text(r: dict[str, Any], unit: str = "repetition") -> str:
    """A :func:`time_ratio` as printed: ``1.23x [1.10, 1.37]``, or ``1.23x [n/a: one <unit>]`` where one
    repetition gives no interval."""
    ci = f"[{r['lo']:.2f}, {r['hi']:.2f}]" if r["lo"] is not None else f"[n/a: one {unit}]"
    return f"{r['ratio']:.2f}x {ci}"


def sign_flip(d, reps: int = 4000, seed: int = 0) -> float:
    """Two-sided sign-flip permutation p-value of ``mean(d) = 0``: the share of sign vectors ``s`` with
    ``|mean(s d)| >= |mean(d)|`` (all ``2^n`` for ``n <= SIGN_FLIP_EXACT``, else ``reps`` drawn with
    ``default_rng(seed)``, the observed one counted). NaN under one value."""
    d = _finite(d)
    n = len(d)
    if n < 1:
        return math.nan
    observed = abs(d.mean()) - 1e-12
    if n <= SIGN_FLIP_EXACT:
        return float(np.mean(np.abs(_all_signs(n) @ d / n) >= observed))
    signs = 1.0 - 2.0 * np.random.default_rng(seed).integers(0, 2, size=(reps, n))
    return float((np.sum(np.abs(signs @ d / n) >= observed) + 1) / (reps + 1))


def tost(d, margin: float, alpha: float = ALPHA) -> float:
    """Two one-sided tests of equivalence within ``(-margin, margin)``: ``p = max(p_lo, p_hi)``, ``p_lo =
    1 - F_{n-1}((mean + margin) / se)`` (against ``mean <= -margin``), ``p_hi = F_{n-1}((mean - margin) /
    se)`` (against ``mean >= margin``), ``se = sd / sqrt(n)``. ``p < alpha`` exactly when the ``1 - 2
    alpha`` t-interval lies inside the margin. With ``sd = 0``: 0 inside the margin, else 1; NaN under two
    values."""
    d = _finite(d)
    n = len(d)
    if n < 2 or not margin > 0:
        return math.nan
    mean, sd = float(d.mean()), _spread(d)
    if sd == 0:
        return 0.0 if abs(mean) < margin else 1.0
    se = sd / math.sqrt(n)
    p_lo = float(sps.t.sf((mean + margin) / se, n - 1))
    p_hi = float(sps.t.cdf((mean - margin) / se, n - 1))
    return max(p_lo, p_hi)


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values: with the ``m`` finite p sorted ``p_(1) <= ... <= p_(m)``,
    ``p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``; NaN stays NaN (and does not count in ``m``).
    Rejecting where ``p~ < alpha`` keeps the chance of any false rejection in the family <= alpha."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), np.nan)
    idx = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
    m, running = len(idx), 0.0
    for j, i in enumerate(idx):
        running = max(running, min(1.0, (m - j) * float(p[i])))
        out[i] = running
    return out.tolist()


def power_paired(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test on ``n`` pairs when the true mean difference is ``effect`` and
    the paired spread ``sd``: ``P(|T| > t_{1 - alpha/2, n-1})`` with ``T`` noncentral t on ``n - 1``
    degrees of freedom, noncentrality ``effect sqrt(n) / sd``. E.g. ``n = 10, effect = sd``: 0.803."""
    if n < 2 or not sd > 0:
        return math.nan
    crit = float(sps.t.ppf(1 - alpha / 2, n - 1))
    nc = abs(effect) * math.sqrt(n) / sd  # the power is symmetric in the effect's sign
    upper, lower = float(sps.nct.sf(crit, n - 1, nc)), float(sps.nct.cdf(-crit, n - 1, nc))
    # far in the tail scipy's noncentral t can return NaN: there the upper part is 1, the lower 0
    return min(1.0, (1.0 if math.isnan(upper) else upper) + (0.0 if math.isnan(lower) else lower))


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable effect: the true mean difference ``delta > 0`` at which
    :func:`power_paired` ``(n, delta, sd) = power`` (solved on the noncentral t). Close to the textbook
    ``(t_{1 - alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n)``; 0 when ``sd = 0``; NaN under two pairs."""
    if n < 2 or math.isnan(sd):
        return math.nan
    if sd == 0:
        return 0.0
    # solved in units of sd (the power depends on effect / sd only), then scaled back
    hi = (float(sps.t.ppf(1 - alpha / 2, n - 1)) + float(sps.t.ppf(power, n - 1))) / math.sqrt(n) * 2
    return sd * float(optimize.brentq(lambda e: power_paired(n, e, 1.0, alpha) - power, 1e-9, hi, xtol=1e-12))


def seeds_needed(
    sd: float, effect: float, alpha: float = ALPHA, power: float = POWER, most: int = 100_000
) -> int:
    """The fewest seed pairs ``n >= 2`` at which :func:`power_paired` ``(n, effect, sd) >= power``: what a
    pilot with paired spread ``sd`` says a comparison needs to detect ``effect``. E.g. ``effect = sd``:
    10; ``effect = sd / 2``: 34."""
    if not (sd > 0 and effect != 0):
        raise ValueError(f"need a paired spread > 0 and an effect != 0, got {sd} and {effect}")
    lo, hi = 2, 2
    while power_paired(hi, effect, sd, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > most:
            raise ValueError(f"more than {most} seeds needed")
    while lo < hi:  # power rises with n: the first n that reaches it
        mid = (lo + hi) // 2
        if power_paired(mid, effect, sd, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


# --------------------------------------------------------------------------------- collapse, rliable


def collapsed(start: float, final: float) -> bool:
    """A run that collapsed: it ends at 0 (``final <= 0``) or below its own start (``final < start``)."""
    return bool(final <= 0 or final < start)


def fisher_exact(fail_a: int, n_a: int, fail_b: int, n_b: int) -> float:
    """Two-sided Fisher's exact test of equal collapse rates on the table ``[[fail_a, n_a - fail_a],
    [fail_b, n_b - fail_b]]`` (the hypergeometric probabilities no larger than the observed one,
    summed; ``scipy.stats.fisher_exact``). E.g. 6 of 10 against 0 of 10: p = 0.0108."""
    return float(sps.fisher_exact([[fail_a, n_a - fail_a], [fail_b, n_b - fail_b]]).pvalue)


def pooled_collapse(per_task: list[dict[str, Any]]) -> dict[str, Any]:
    """Collapse counts added over tasks (each a :func:`sppo_rl.experiments.protocol.collapses` result:
    ``counts`` per method and ``fisher_p`` per pair ``A_vs_B``), and Fisher's exact test per pair on the
    sums. E.g. 3 of 5 and 3 of 5 against 0 of 5 and 0 of 5: 6 of 10 against 0 of 10, p = 0.0108."""
    counts: dict[str, dict[str, int]] = {}
    pairs: list[str] = []
    for task in per_task:
        for m, c in task["counts"].items():
            mine = counts.setdefault(m, {"n": 0, "of": 0})
            mine["n"], mine["of"] = mine["n"] + c["n"], mine["of"] + c["of"]
        pairs += [k for k in task["fisher_p"] if k not in pairs]
    tests = {}
    for key in pairs:
        a, b = key.split("_vs_", 1)
        tests[key] = fisher_exact(counts[a]["n"], counts[a]["of"], counts[b]["n"], counts[b]["of"])
    return {"counts": counts, "fisher_p": tests, "tasks": len(per_task)}


def probability_of_improvement(a, b) -> float:
    """rliable's probability of improvement of A over B: ``(1 / (n m)) sum_i sum_j [1(a_i > b_j) + 1/2
    1(a_i = b_j)]`` over all ``n x m`` run pairs (the Mann-Whitney U over ``n m``); NaN without runs."""
    a, b = _finite(a), _finite(b)
    if not (len(a) and len(b)):
        return math.nan
    gt = (a[:, None] > b[None, :]).mean()
    eq = (a[:, None] == b[None, :]).mean()
    return float(gt + 0.5 * eq)


# ----------------------------------------------------------------------------- one comparison, verdicts


def compare(a, b, kind: str, margin: float, alpha: float = ALPHA) -> dict[str, Any]:
    """One statistic between methods A and B over their seed pairs ``(a_k, b_k)``: the paired t-test on
    :func:`paired_values` (``estimate``: the mean difference, or the geometric mean ratio ``exp(mean
    ln(a_k / b_k))``; ``interval`` its ``1 - alpha`` t-interval, exponentiated for a ratio), the raw
    ``p``, the sign-flip p beside it, the minimum detectable effect (a ratio: the factor ``exp(MDE)``),
    the TOST p against ``margin`` (a ratio: ``ln margin``), the means and IQMs of A and B and the
    probability of improvement of A over B. ``holm_p`` and ``verdict`` come from :func:`decide`."""
    d = paired_values(a, b, kind)
    t = paired_t(d, alpha)
    log_margin = math.log(margin) if kind == "ratio" else margin
    m = mde(t["sd"], t["n"], alpha)
    back = (lambda x: math.exp(x) if not math.isnan(x) else x) if kind == "ratio" else (lambda x: x)  # noqa: E731
    fa, fb = _finite(a), _finite(b)
    return {
        "kind": kind,
        "n": t["n"],
        "estimate": back(t["mean"]),
        "interval": [back(t["lo"]), back(t["hi"])],
        "sd": t["sd"],
        "p": t["p"],
        "sign_flip_p": sign_flip(d) if t["n"] >= 1 else math.nan,
        "mde": back(m),
        "margin": margin,
        "tost_p": tost(d, log_margin, alpha),
        "mean_a": float(fa.mean()) if len(fa) else math.nan,
        "mean_b": float(fb.mean()) if len(fb) else math.nan,
        "iqm_a": float(iqm(fa)) if len(fa) else math.nan,
        "iqm_b": float(iqm(fb)) if len(fb) else math.nan,
        "prob_improvement": probability_of_improvement(a, b),
    }


def verdict(row: dict[str, Any], alpha: float = ALPHA) -> str:
    """The row's verdict from its ``holm_p``, ``tost_p``, ``mde`` and ``kind``: ``difference (Holm p =
    ...)``, ``equivalent within +-margin (TOST p = ...)``, ``inconclusive: could not detect differences
    below MDE`` (a ratio: ``ratios within x/ MDE``), or ``no test (...)`` under two seed pairs. No ``|``
    in it: it sits in a markdown table."""
    if row["n"] < 2 or math.isnan(row["p"]):
        return f"no test ({row['n']} seed pair{'s' * (row['n'] != 1)} with values)"
    if row["holm_p"] < alpha:
        return f"difference (Holm p = {row['holm_p']:.3g})"
    ratio = row["kind"] == "ratio"
    if row["tost_p"] < alpha:
        within = f"x/ {row['margin']:g}" if ratio else f"±{row['margin']:g}"
        return f"equivalent within {within} (TOST p = {row['tost_p']:.3g})"
    if ratio:
        return f"inconclusive: could not detect ratios within x/ {row['mde']:.2f}"
    return f"inconclusive: could not detect differences below {row['mde']:.3f}"


def decide(rows: list[dict[str, Any]], alpha: float = ALPHA) -> list[dict[str, Any]]:
    """One table (one family): Holm's correction over the rows' p (:func:`holm`), then each row's
    :func:`verdict`; the rows are updated in place and returned."""
    for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
        row["holm_p"] = adjusted
        row["verdict"] = verdict(row, alpha)
    return rows


def shown(verdict_text: str) -> str:
    """The verdict's kind: ``difference``, ``equivalent``, ``inconclusive`` or ``no test``."""
    return verdict_text.split(" (")[0].split(":")[0].split(" within")[0]


# ------------------------------------------------------------------------------------------ the tables


def coverage_note(seeds: int) -> str:
    """The simulated coverage of the 95 % interval at the simulated seed count nearest ``seeds``, over
    the noise models of :data:`SIMULATED` (``scripts/decision_sim.py``)."""
    n = min(SIMULATED["independent"], key=lambda k: (abs(k - seeds), k))
    cov = [c for m in SIMULATED for c in SIMULATED[m][n][:2]]
    return (
        f"simulated coverage of the 95% interval at {n} seeds: {min(cov):.1%}-{max(cov):.1%} over "
        f"{', '.join(SIMULATED)} seeds (scripts/decision_sim.py)"
    )


def _fmt(x: float | None, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table_lines(result: dict[str, Any], label=lambda name: name) -> list[str]:
    """Markdown of a :func:`sppo_rl.experiments.protocol.protocol` result's decision: the primary table
    (one family), the secondary (exploratory) table, the collapse counts with Fisher's exact test, and
    the notes. ``label(statistic)`` names a statistic."""
    rows = result["table"]
    if not rows:
        return []
    seeds = max(r["n"] for r in rows)
    d = result["design"]
    head = (
        "| A vs B | statistic | seed pairs | A mean (IQM) | B mean (IQM) | A - B or A / B | 95% interval | "
        "p (Holm) | P(A > B) | MDE (80%) | TOST p | verdict |"
    )
    lines = [
        f"Primary statistic (declared before the runs): {label(result['primary'])}; equivalence margin "
        f"±{d['margin']:g} (ratios x/ {d['ratio_margin']:g}); alpha {d['alpha']:g}. A paired t-test over "
        "the seeds both methods have (ratios: on ln(a/b), estimate the geometric mean ratio); Holm's "
        f"correction over each table; {coverage_note(seeds)}.",
    ]
    for role, title in (("primary", "Primary"), ("secondary", "Secondary (exploratory)")):
        mine = [r for r in rows if r["role"] == role]
        if not mine:
            continue
        lines += ["", f"{title}:", "", head, "|" + "---|" * 12]
        for r in mine:
            diff = r["kind"] == "difference"
            fmt, what = ("+.3f", "A - B") if diff else (".3f", "A / B")
            lo, hi = r["interval"]
            lines.append(
                f"| {r['a']} vs {r['b']} | {label(r['statistic'])} ({what}) | {r['n']} | "
                f"{_fmt(r['mean_a'], '.3f')} ({_fmt(r['iqm_a'], '.3f')}) | "
                f"{_fmt(r['mean_b'], '.3f')} ({_fmt(r['iqm_b'], '.3f')}) | {_fmt(r['estimate'], fmt)} | "
                + ("—" if math.isnan(lo) else f"[{lo:{fmt}}, {hi:{fmt}}]")
                + f" | {_fmt(r['p'], '.2g')} ({_fmt(r['holm_p'], '.2g')}) | {_fmt(r['prob_improvement'], '.2f')} | "
                f"{_fmt(r['mde'], '.3f' if diff else '.2f')} | {_fmt(r['tost_p'], '.2g')} | {r['verdict']} |"
            )
    c = result.get("collapse")
    if c:
        counts = ", ".join(f"{m} {v['n']}/{v['of']}" for m, v in c["counts"].items())
        tests = ", ".join(f"{k.replace('_vs_', ' vs ')} p = {p:.2g}" for k, p in c["fisher_p"].items())
        lines += [
            "",
            f"Collapsed runs (final at 0 or below the run's own start): {counts}"
            + (f"; Fisher's exact test: {tests}." if tests else "."),
        ]
    lines += [f"Note: {n}." for n in result.get("notes", [])]
    return lines
