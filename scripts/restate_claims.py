"""Every comparison the docs print, reread under the decision rule of :mod:`sppo_rl.experiments.decision`
(the run folders behind them are gone, so the numbers are the ones the docs print, copied below with the
table each comes from).

Two kinds of input:

- **Per-seed values** the docs print (finals per seed: docs/results.md's PPO and SPPO on LunarLander and
  Hopper, docs/llm.md's SmolLM2 table): the exact paired t-test on them, its MDE, TOST against the
  margin, and the collapse counts (a run ending at 0 or below its start) with Fisher's exact test, per
  task and pooled.
- **Tables of the old protocol** (point estimate and 95 % paired-bootstrap interval over 5 seed pairs, no
  per-seed values): the paired spread recovered from the interval, ``s = (hi - lo) / (2 x 1.96) x sqrt n x
  sqrt(n / (n - 1))`` (a percentile bootstrap of a mean over n pairs has sd ``s sqrt((n - 1) / n) /
  sqrt n``; ratios on the log scale, the ratio of means standing in for the geometric mean), then five
  values with exactly that mean and spread through the same functions the reports call. APPROXIMATE:
  a 5-seed bootstrap interval is itself noisy and a little narrow, so these p-values lean optimistic;
  the verdicts say what the printed numbers support, no more.

Each table's primary statistic is what the rule would declare: accuracy at equal generated tokens (these
runs logged no FLOPs); success at equal episodes for the control tables (the printed compute axis; the
rule's own default, env steps, was not printed). Holm over the primary rows of a table, and over its
secondary rows; margin 0.05 in accuracy, x/ 1.25 for ratios.

    python scripts/restate_claims.py
"""

from __future__ import annotations

import math

import numpy as np

from sppo_rl.experiments import decision as D

PRIMARY = {"accuracy at equal generated tokens", "success at equal episodes"}

# docs/results.md, "Per-seed finals (seeds 0-4)" under the PPO / SPPO protocol tables (5 seeds each);
# a control run starts at success ~0, so "collapsed" there is "ends at 0"
CONTROL_FINALS = {
    "lunarlander": {"ppo": [0.00, 0.00, 0.00, 0.96, 0.93], "sppo": [0.97, 0.72, 0.93, 0.98, 0.96]},
    "hopper": {"ppo": [0.00, 0.00, 0.79, 0.86, 0.00], "sppo": [0.80, 0.84, 0.81, 0.91, 0.71]},
}
# docs/llm.md, "Per seed, validation accuracy at the start -> final (of 64 prompts; seeds 0-4)",
# SmolLM2-135M, 480 s each
REAL_START_FINAL = {
    "sppo": [(0.031, 0.562), (0.016, 0.000), (0.000, 0.047), (0.000, 0.078), (0.031, 0.188)],
    "grpo": [(0.031, 0.031), (0.016, 0.250), (0.000, 0.008), (0.000, 0.016), (0.031, 0.234)],
    "ppo": [(0.031, 0.578), (0.016, 0.328), (0.000, 0.109), (0.000, 0.234), (0.031, 0.031)],
}
# docs/algorithms.md, the latent set's "What it shows": finals of Latent-GRPO (fixed) and its unfixed
# variant, seeds 0-4; their mean start 0.374 (the set's table; per-seed starts are not printed)
LATENT_FINALS = {
    "latent-grpo": [0.49, 0.01, 0.13, 0.51, 0.27],
    "latent-grpo-naive": [0.70, 0.52, 0.65, 0.67, 0.53],
}
LATENT_START = 0.374

# (A, B, statistic, seed pairs, A - B or A / B, bootstrap lo, hi, per-seed (min, max) or None), copied
# from the verdict tables of each source
TABLES = {
    "methods": {
        "source": "tiny Qwen2, arithmetic, 5 seeds, 25 s (docs/algorithms.md, 'Methods under the protocol' table)",
        "rows": [
            ("grpo", "sppo", "accuracy at equal wall-clock", 5, 0.027, -0.004, 0.066, (-0.021, 0.096)),
            ("grpo", "sppo", "accuracy at equal generated tokens", 5, -0.034, -0.079, 0.018, (-0.098, 0.065)),
            ("grpo", "sppo", "area under accuracy-vs-seconds", 5, 1.08, 1.04, 1.14, (1.04, 1.19)),
            ("grpo", "sppo", "seconds to target", 5, 0.43, 0.22, 0.61, (0.1, 0.69)),
            ("grpo", "sppo", "tokens to target", 5, 0.86, 0.49, 1.24, (0.24, 1.45)),
            ("gspo", "sppo", "accuracy at equal wall-clock", 5, 0.03, -0.038, 0.103, (-0.083, 0.158)),
            ("gspo", "sppo", "accuracy at equal generated tokens", 5, -0.004, -0.062, 0.05, (-0.113, 0.087)),
            ("gspo", "sppo", "area under accuracy-vs-seconds", 5, 1.11, 1.05, 1.16, (1.01, 1.21)),
            ("gspo", "sppo", "seconds to target", 5, 0.36, 0.17, 0.6, (0.08, 0.73)),
            ("gspo", "sppo", "tokens to target", 5, 0.87, 0.49, 1.32, (0.26, 1.45)),
            ("sppo-seq", "sppo", "accuracy at equal wall-clock", 5, -0.034, -0.091, 0.026, (-0.095, 0.056)),
            (
                "sppo-seq",
                "sppo",
                "accuracy at equal generated tokens",
                5,
                -0.107,
                -0.192,
                -0.023,
                (-0.218, 0.04),
            ),
            ("sppo-seq", "sppo", "area under accuracy-vs-seconds", 5, 0.91, 0.87, 0.96, (0.84, 1.01)),
            ("sppo-seq", "sppo", "seconds to target", 5, 1.19, 0.97, 1.49, (0.82, 1.67)),
            ("sppo-seq", "sppo", "tokens to target", 5, 1.14, 0.89, 1.51, (0.72, 1.83)),
            ("grpo-tis", "sppo", "accuracy at equal wall-clock", 5, 0.035, -0.021, 0.104, (-0.032, 0.16)),
            (
                "grpo-tis",
                "sppo",
                "accuracy at equal generated tokens",
                5,
                -0.034,
                -0.079,
                0.018,
                (-0.098, 0.065),
            ),
            ("grpo-tis", "sppo", "area under accuracy-vs-seconds", 5, 1.1, 1.07, 1.15, (1.05, 1.2)),
            ("grpo-tis", "sppo", "seconds to target", 5, 0.39, 0.2, 0.53, (0.09, 0.56)),
            ("grpo-tis", "sppo", "tokens to target", 5, 0.86, 0.49, 1.24, (0.24, 1.45)),
            ("dapo", "sppo", "accuracy at equal wall-clock", 5, 0.047, -0.001, 0.095, (-0.019, 0.119)),
            ("dapo", "sppo", "accuracy at equal generated tokens", 5, -0.052, -0.092, -0.003, (-0.118, 0.04)),
            ("dapo", "sppo", "area under accuracy-vs-seconds", 5, 1.11, 1.04, 1.18, (1.0, 1.24)),
            ("dapo", "sppo", "seconds to target", 5, 0.5, 0.22, 0.79, (0.1, 0.94)),
            ("dapo", "sppo", "tokens to target", 5, 1.02, 0.6, 1.55, (0.33, 2.2)),
            ("ppo", "sppo", "accuracy at equal wall-clock", 5, -0.051, -0.098, -0.001, (-0.111, 0.037)),
            ("ppo", "sppo", "accuracy at equal generated tokens", 5, -0.034, -0.082, 0.013, (-0.114, 0.045)),
            ("ppo", "sppo", "area under accuracy-vs-seconds", 5, 0.97, 0.93, 1.02, (0.93, 1.06)),
            ("ppo", "sppo", "seconds to target", 5, 1.13, 0.89, 1.46, (0.73, 1.68)),
            ("ppo", "sppo", "tokens to target", 5, 1.01, 0.77, 1.35, (0.62, 1.74)),
            ("ppo-vc", "sppo", "accuracy at equal wall-clock", 5, 0.007, -0.03, 0.044, (-0.059, 0.056)),
            (
                "ppo-vc",
                "sppo",
                "accuracy at equal generated tokens",
                5,
                0.014,
                -0.017,
                0.049,
                (-0.037, 0.079),
            ),
            ("ppo-vc", "sppo", "area under accuracy-vs-seconds", 5, 0.98, 0.92, 1.04, (0.87, 1.06)),
            ("ppo-vc", "sppo", "seconds to target", 5, 1.0, 0.81, 1.34, (0.71, 1.8)),
            ("ppo-vc", "sppo", "tokens to target", 5, 1.02, 0.79, 1.47, (0.72, 2.12)),
        ],
    },
    "latent": {
        "source": "tiny Qwen2, latent curriculum, 5 seeds, 60 s (docs/algorithms.md, Latent-GRPO table)",
        "rows": [
            (
                "latent-grpo",
                "grpo",
                "accuracy at equal wall-clock",
                5,
                -0.316,
                -0.51,
                -0.127,
                (-0.654, 0.008),
            ),
            (
                "latent-grpo",
                "grpo",
                "accuracy at equal generated tokens",
                5,
                -0.066,
                -0.181,
                0.049,
                (-0.263, 0.104),
            ),
            ("latent-grpo", "grpo", "area under accuracy-vs-seconds", 5, 0.73, 0.49, 0.98, (0.3, 1.2)),
            ("latent-grpo", "grpo", "seconds to target", 5, 4.01, 0.86, 53.6, (0.05, 24.5)),
            ("latent-grpo", "grpo", "tokens to target", 5, 1.19, 0.2, 21.35, (0.07, 8.03)),
            (
                "latent-grpo-naive",
                "grpo",
                "accuracy at equal wall-clock",
                5,
                0.022,
                -0.071,
                0.115,
                (-0.137, 0.166),
            ),
            (
                "latent-grpo-naive",
                "grpo",
                "accuracy at equal generated tokens",
                5,
                -0.027,
                -0.131,
                0.077,
                (-0.163, 0.106),
            ),
            (
                "latent-grpo-naive",
                "grpo",
                "area under accuracy-vs-seconds",
                5,
                0.97,
                0.82,
                1.15,
                (0.75, 1.28),
            ),
            ("latent-grpo-naive", "grpo", "seconds to target", 5, 1.95, 0.17, 33.48, (0.05, 13.45)),
            ("latent-grpo-naive", "grpo", "tokens to target", 5, 1.16, 0.18, 19.44, (0.08, 8.03)),
            ("sppo", "grpo", "accuracy at equal wall-clock", 5, 0.001, -0.03, 0.035, (-0.047, 0.068)),
            ("sppo", "grpo", "accuracy at equal generated tokens", 5, 0.05, 0.035, 0.061, (0.02, 0.063)),
            ("sppo", "grpo", "area under accuracy-vs-seconds", 5, 0.96, 0.95, 0.97, (0.93, 0.97)),
            ("sppo", "grpo", "seconds to target", 5, 1.54, 1.06, 1.98, (1.06, 1.89)),
            ("sppo", "grpo", "tokens to target", 5, 0.58, 0.39, 0.79, (0.34, 0.77)),
            (
                "latent-grpo",
                "latent-grpo-naive",
                "accuracy at equal wall-clock",
                5,
                -0.338,
                -0.471,
                -0.206,
                (-0.525, -0.158),
            ),
            (
                "latent-grpo",
                "latent-grpo-naive",
                "accuracy at equal generated tokens",
                5,
                -0.039,
                -0.069,
                -0.01,
                (-0.099, -0.002),
            ),
            (
                "latent-grpo",
                "latent-grpo-naive",
                "area under accuracy-vs-seconds",
                5,
                0.75,
                0.58,
                0.88,
                (0.4, 0.94),
            ),
            ("latent-grpo", "latent-grpo-naive", "seconds to target", 5, 2.06, 1.43, 7.15, (0.83, 11.0)),
            ("latent-grpo", "latent-grpo-naive", "tokens to target", 5, 1.03, 0.98, 1.21, (0.94, 1.57)),
        ],
    },
    "real": {
        "source": "SmolLM2-135M, arithmetic, 5 seeds, 480 s (docs/llm.md, the real-model table)",
        "rows": [
            ("grpo", "sppo", "accuracy at equal wall-clock", 5, -0.08, -0.326, 0.119, (-0.522, 0.237)),
            ("grpo", "sppo", "accuracy at equal generated tokens", 5, -0.093, -0.312, 0.041, (-0.516, 0.078)),
            ("grpo", "sppo", "area under accuracy-vs-seconds", 5, 0.48, 0.12, 2.8, (0.01, 5.06)),
            ("grpo", "sppo", "seconds to target", 5, 1.11, 0.61, 2.42, (0.33, 9.64)),
            ("grpo", "sppo", "tokens to target", 5, 1.15, 0.85, 2.04, (0.76, 6.74)),
            ("ppo", "sppo", "accuracy at equal wall-clock", 5, 0.045, -0.075, 0.178, (-0.156, 0.296)),
            ("ppo", "sppo", "accuracy at equal generated tokens", 5, 0.008, -0.041, 0.055, (-0.075, 0.091)),
            ("ppo", "sppo", "area under accuracy-vs-seconds", 5, 0.99, 0.67, 3.79, (0.46, 5.62)),
            ("ppo", "sppo", "seconds to target", 5, 0.96, 0.64, 1.41, (0.47, 2.89)),
            ("ppo", "sppo", "tokens to target", 5, 1.05, 0.95, 1.35, (0.91, 2.92)),
        ],
    },
    "scratchpad-1": {
        "source": "tiny Qwen2, scratchpad level 1, 5 seeds, 40 s (docs/llm.md)",
        "rows": [
            ("grpo", "sppo", "accuracy at equal wall-clock", 5, 0.2, 0.159, 0.245, (0.132, 0.279)),
            ("grpo", "sppo", "accuracy at equal generated tokens", 5, 0.183, 0.106, 0.263, (0.07, 0.33)),
            ("grpo", "sppo", "area under accuracy-vs-seconds", 5, 2.05, 1.76, 2.48, (1.64, 2.68)),
            ("grpo", "sppo", "seconds to target", 5, 0.22, 0.08, 0.35, (0.0, 0.39)),
            ("grpo", "sppo", "tokens to target", 5, 0.38, 0.13, 0.62, (0.0, 0.73)),
        ],
    },
    "scratchpad-5": {
        "source": "tiny Qwen2, scratchpad level 5, 5 seeds, 100 s (docs/llm.md)",
        "rows": [
            ("grpo", "sppo", "accuracy at equal wall-clock", 5, -0.004, -0.018, 0.006, (-0.031, 0.01)),
            (
                "grpo",
                "sppo",
                "accuracy at equal generated tokens",
                5,
                -0.018,
                -0.031,
                -0.002,
                (-0.036, 0.013),
            ),
            ("grpo", "sppo", "area under accuracy-vs-seconds", 5, 0.98, 0.93, 1.04, (0.9, 1.08)),
            ("grpo", "sppo", "seconds to target", 5, 0.89, 0.2, 1.41, (0.15, 3.61)),
            ("grpo", "sppo", "tokens to target", 5, 0.8, 0.35, 1.17, (0.3, 6.18)),
            ("ppo", "sppo", "accuracy at equal wall-clock", 5, -0.012, -0.031, 0.002, (-0.047, 0.006)),
            ("ppo", "sppo", "accuracy at equal generated tokens", 5, -0.009, -0.018, 0.001, (-0.021, 0.007)),
            ("ppo", "sppo", "area under accuracy-vs-seconds", 5, 0.97, 0.93, 1.01, (0.89, 1.03)),
            ("ppo", "sppo", "seconds to target", 5, 1.23, 0.98, 1.5, (0.52, 1.52)),
            ("ppo", "sppo", "tokens to target", 5, 1.0, 1.0, 1.0, (1.0, 1.0)),
        ],
    },
    "arithmetic": {
        "source": "tiny Qwen2, arithmetic, 5 seeds, 40 s (docs/llm.md)",
        "rows": [
            ("grpo", "sppo", "accuracy at equal wall-clock", 5, 0.032, 0.016, 0.048, (0.005, 0.057)),
            ("grpo", "sppo", "accuracy at equal generated tokens", 5, 0.003, -0.042, 0.05, (-0.061, 0.087)),
            ("grpo", "sppo", "area under accuracy-vs-seconds", 5, 1.07, 1.0, 1.13, (0.92, 1.17)),
            ("grpo", "sppo", "seconds to target", 5, 0.64, 0.25, 1.05, (0.0, 1.45)),
            ("grpo", "sppo", "tokens to target", 5, 0.87, 0.48, 1.14, (0.0, 1.33)),
            ("ppo", "sppo", "accuracy at equal wall-clock", 5, -0.02, -0.073, 0.027, (-0.115, 0.049)),
            ("ppo", "sppo", "accuracy at equal generated tokens", 5, 0.003, -0.005, 0.009, (-0.009, 0.011)),
            ("ppo", "sppo", "area under accuracy-vs-seconds", 5, 0.99, 0.94, 1.02, (0.9, 1.04)),
            ("ppo", "sppo", "seconds to target", 5, 0.99, 0.85, 1.13, (0.84, 1.26)),
            ("ppo", "sppo", "tokens to target", 5, 0.97, 0.86, 1.13, (0.78, 1.2)),
        ],
    },
    "hopper": {
        "source": "Hopper, PPO vs SPPO, 5 seeds (docs/results.md, protocol table)",
        "rows": [
            ("ppo", "sppo", "success at equal wall-clock", 5, -0.429, -0.691, -0.188, None),
            ("ppo", "sppo", "success at equal episodes", 5, -0.575, -0.925, -0.2, None),
            ("ppo", "sppo", "area under success-vs-seconds", 5, 0.631, 0.415, 0.807, None),
            ("ppo", "sppo", "seconds below target", 5, 1.065, 1.015, 1.144, None),
            ("ppo", "sppo", "episodes below target", 5, 1.427, 1.2, 1.706, None),
        ],
    },
    "lunarlander": {
        "source": "LunarLander, PPO vs SPPO, 5 seeds (docs/results.md, protocol table)",
        "rows": [
            ("ppo", "sppo", "success at equal wall-clock", 5, -0.336, -0.691, 0.019, None),
            ("ppo", "sppo", "success at equal episodes", 5, -0.463, -0.887, -0.037, None),
            ("ppo", "sppo", "area under success-vs-seconds", 5, 0.587, 0.295, 0.837, None),
            ("ppo", "sppo", "seconds below target", 5, 5.636, 3.667, 7.793, None),
            ("ppo", "sppo", "episodes below target", 5, 5.479, 4.012, 7.306, None),
        ],
    },
}


def standard(n: int) -> np.ndarray:
    """``n`` equally spaced values with mean 0 and sample sd 1."""
    z = np.arange(n, dtype=float) - (n - 1) / 2
    return z / z.std(ddof=1)


def from_interval(a: str, b: str, stat: str, n: int, point: float, lo: float, hi: float) -> dict:
    """One printed row as the rule reads it (approximate, see the module docstring)."""
    ratio = "seconds" in stat and "equal" not in stat or "area" in stat or "target" in stat
    kind = "ratio" if ratio else "difference"
    to = math.log if ratio else (lambda x: x)
    width = to(hi) - to(lo) if hi > 0 and lo > 0 or not ratio else math.nan
    sd = width / (2 * 1.96) * math.sqrt(n) * math.sqrt(n / (n - 1))
    d = to(point) + sd * standard(n)
    values = np.exp(d) if ratio else d
    margin = D.RATIO_MARGIN if ratio else D.MARGIN
    row = D.compare(values, np.ones(n) if ratio else np.zeros(n), kind, margin)
    return {
        **row,
        "a": a,
        "b": b,
        "statistic": stat,
        "point": point,
        "role": "primary" if stat in PRIMARY else "secondary",
    }


def restate_table(rows) -> list[dict]:
    """Every row of one printed table, Holm over its primary rows and over its secondary rows."""
    out = [from_interval(*r[:7]) for r in rows]
    for role in ("primary", "secondary"):
        D.decide([r for r in out if r["role"] == role])
    return out


def exact(a, b, margin: float = D.MARGIN) -> dict:
    """The exact paired test of per-seed values ``a`` and ``b``."""
    return D.compare(np.asarray(a, dtype=float), np.asarray(b, dtype=float), "difference", margin)


def collapse_counts(per_method: dict[str, list[tuple[float, float]]]) -> dict[str, int]:
    return {m: sum(D.collapsed(s, f) for s, f in runs) for m, runs in per_method.items()}


def main() -> dict:
    out: dict = {}
    print("## Exact: per-seed finals the docs print")
    rows = []
    for task, f in CONTROL_FINALS.items():
        rows.append({**exact(f["ppo"], f["sppo"]), "what": f"{task}: ppo vs sppo, tail success"})
    for m in ("grpo", "ppo"):
        a = [x[1] for x in REAL_START_FINAL[m]]
        b = [x[1] for x in REAL_START_FINAL["sppo"]]
        rows.append({**exact(a, b), "what": f"SmolLM2: {m} vs sppo, final accuracy"})
    fixed, naive = LATENT_FINALS["latent-grpo"], LATENT_FINALS["latent-grpo-naive"]
    rows.append(
        {
            **exact(fixed, naive),
            "what": "latent: latent-grpo vs latent-grpo-naive, final accuracy (exploratory)",
        }
    )
    D.decide(rows[:2])  # one family per source
    D.decide(rows[2:4])
    D.decide(rows[4:])
    for r in rows:
        print(
            f"- {r['what']}: {r['estimate']:+.3f} [{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}], "
            f"p = {r['p']:.3g} (Holm {r['holm_p']:.3g}), paired sd {r['sd']:.3f}, MDE {r['mde']:.3f}, "
            f"TOST p {r['tost_p']:.3g}, IQM {r['iqm_a']:.3f} vs {r['iqm_b']:.3f}, "
            f"P(A > B) {r['prob_improvement']:.2f}: {r['verdict']}"
        )
    out["exact"] = rows
    control = {
        t: collapse_counts({m: [(0.0, x) for x in v] for m, v in f.items()})
        for t, f in CONTROL_FINALS.items()
    }
    for t, c in control.items():
        print(
            f"- {t}: collapsed ppo {c['ppo']}/5, sppo {c['sppo']}/5, Fisher p = {D.fisher_exact(c['ppo'], 5, c['sppo'], 5):.3g}"
        )
    pooled = (sum(c["ppo"] for c in control.values()), sum(c["sppo"] for c in control.values()))
    fisher = D.fisher_exact(pooled[0], 10, pooled[1], 10)
    print(
        f"- pooled over both tasks: ppo {pooled[0]}/10, sppo {pooled[1]}/10, Fisher's exact p = {fisher:.3g}"
    )
    real = collapse_counts(REAL_START_FINAL)
    print(
        "- SmolLM2: collapsed (final at 0 or below its start) "
        + ", ".join(f"{m} {k}/5" for m, k in real.items())
        + f"; Fisher sppo vs grpo p = {D.fisher_exact(real['sppo'], 5, real['grpo'], 5):.3g}"
    )
    latent = collapse_counts({m: [(LATENT_START, x) for x in v] for m, v in LATENT_FINALS.items()})
    print(
        f"- latent: below the mean start {LATENT_START}: latent-grpo {latent['latent-grpo']}/5, "
        f"latent-grpo-naive {latent['latent-grpo-naive']}/5, Fisher p = "
        f"{D.fisher_exact(latent['latent-grpo'], 5, latent['latent-grpo-naive'], 5):.3g}"
    )
    out["collapse"] = {
        "latent": latent,
        "control": control,
        "pooled": {"ppo": pooled[0], "sppo": pooled[1], "fisher_p": fisher},
        "real": real,
    }

    print("\n## Approximate: the old protocol's tables (spread recovered from the bootstrap interval)")
    out["tables"] = {}
    for name, t in TABLES.items():
        rows = restate_table(t["rows"])
        out["tables"][name] = rows
        prim = [r for r in rows if r["role"] == "primary"]
        need = [D.seeds_needed(r["sd"], D.MARGIN) for r in prim if r["sd"] > 0]
        print(f"\n### {name}: {t['source']}")
        print("| A vs B | statistic | role | printed | p (Holm) | paired sd | MDE (80%) | TOST p | verdict |")
        print("|---|---|---|---:|---:|---:|---:|---:|---|")
        for r in rows:
            fmt = ".3f" if r["kind"] == "difference" else ".2f"
            print(
                f"| {r['a']} vs {r['b']} | {r['statistic']} | {r['role']} | {r['point']:{fmt}} | "
                f"{r['p']:.2g} ({r['holm_p']:.2g}) | {r['sd']:.3f} | {r['mde']:{fmt}} | {r['tost_p']:.2g} | {r['verdict']} |"
            )
        if need:
            print(
                f"Seeds to detect 0.05 on the primary at these spreads: {min(need)}-{max(need)} (scripts/power.py)."
            )
    return out


if __name__ == "__main__":
    main()
