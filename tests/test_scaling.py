"""ScaleRL's sigmoid fits (:mod:`sppo_rl.experiments.scaling`): known parameters recovered from noisy
synthetic seeds, fits that cannot be made say so, and the extrapolation error on a hand-made case."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sppo_rl.experiments import scaling as S

TRUE = dict(A=0.7, C_mid=2e14, B=1.5, R0=0.1)


def seeds(n: int = 5, noise: float = 0.02, points: int = 31, seed: int = 0, **kw):
    p = {**TRUE, **kw}
    rng = np.random.default_rng(seed)
    C = np.linspace(0, 1e15, points)
    clean = S.sigmoid(C, p["A"], p["C_mid"], p["B"], p["R0"])
    return [(C, clean + np.where(C > 0, rng.normal(0, noise, points), 0.0)) for _ in range(n)]


def test_known_parameters_are_recovered_from_noisy_seeds_and_the_intervals_cover_them():
    m = S.fit_method("m", seeds(), reps=100)
    f = m.fit
    assert f.ok and m.extrapolation.ok, (f.problem, m.extrapolation.verdict())
    assert f.A == pytest.approx(0.7, abs=0.02)
    assert f.C_mid == pytest.approx(2e14, rel=0.1)
    assert f.B == pytest.approx(1.5, abs=0.25)
    assert (
        m.A_ci[0] <= 0.7 <= m.A_ci[1]
        and m.C_mid_ci[0] <= 2e14 <= m.C_mid_ci[1]
        and m.B_ci[0] <= 1.5 <= m.B_ci[1]
    )
    assert m.converged >= 90 and m.reps == 100
    assert m.extrapolation.error < 0.02


def test_a_ceiling_below_the_start_is_a_decline_and_is_fitted_too():
    f = S.fit_method("down", seeds(A=0.05, R0=0.4), reps=0).fit
    assert f.ok and f.A == pytest.approx(0.05, abs=0.03)


@pytest.mark.parametrize(
    "C, R, why",
    [
        (np.linspace(0, 1e15, 20), np.full(20, 0.3), "no gain over R0"),
        (np.array([0, 1e14, 2e14, 3e14]), np.array([0.1, 0.2, 0.3, 0.4]), "3 points above C = 0"),
        # still rising along a straight line: the half-way point lies past the data, unknown
        (np.linspace(0, 1e15, 20), np.linspace(0.1, 0.3, 20), "ended on its bound"),
        # up at the first evaluation, flat after: the rise happened between two evaluations, unresolved
        (np.linspace(0, 1e15, 20), np.r_[0.1, np.full(19, 0.3)], "C_mid before the first evaluation"),
    ],
)
def test_a_fit_that_cannot_be_made_says_so(C, R, why):
    f = S.fit_sigmoid(C, R, float(R[0]))
    assert not f.ok and "did not converge" in f.problem and why in f.problem, f.problem
    assert f.A is None and f.C_mid is None and f.B is None
    with pytest.raises(ValueError, match="no fit"):
        f.predict(C)


def test_the_extrapolation_error_by_hand():
    """The first half is the sigmoid itself; the second half lies 0.1 above it: the first half's fit is
    the sigmoid, so every second-half point is missed by 0.1 -- error 0.1, more than the tolerance."""
    C = np.linspace(0, 1e15, 21)
    R = S.sigmoid(C, **TRUE)
    shifted = np.where(C > 5e14, R + 0.1, R)
    x = S.extrapolation(C, shifted, 0.1)
    assert x.C_half == 5e14 and x.points == 10
    assert x.error == pytest.approx(0.1, abs=1e-4) and x.max_error == pytest.approx(0.1, abs=1e-4)
    assert not x.ok and x.verdict() == "does not extrapolate (error > 0.05)"
    same = S.extrapolation(C, R, 0.1)
    assert same.error == pytest.approx(0.0, abs=1e-4) and same.verdict() == "extrapolates"


def test_the_mean_curve_reads_each_seed_between_its_evaluations_on_the_common_window():
    a = (np.array([0.0, 2.0, 4.0]), np.array([0.0, 0.4, 0.8]))
    b = (np.array([0.0, 1.0, 3.0]), np.array([0.2, 0.2, 0.6]))
    grid, mean = S.mean_curve([a, b])
    assert grid.tolist() == [0.0, 1.5, 3.0]
    assert mean.tolist() == pytest.approx([0.1, (0.3 + 0.3) / 2, (0.6 + 0.6) / 2])


def test_the_section_prints_the_table_saves_the_figure_and_names_what_it_left_out(tmp_path):
    def rows(C, R):
        return [
            {"update": i, "flops_total": float(c), "val_accuracy": float(r)}
            for i, (c, r) in enumerate(zip(C, R))
        ]

    good = [rows(C, R) for C, R in seeds(n=3)]
    flat = [rows(np.linspace(0, 1e15, 10), np.full(10, 0.3))] * 2
    old = [
        [{"update": 0, "val_accuracy": 0.1}, {"update": 5, "val_accuracy": 0.2}]
    ]  # before FLOPs were counted
    lines, fits = S.scaling_section({"good": good, "flat": flat, "old": old}, tmp_path / "fig.png", reps=20)
    text = "\n".join(lines)
    assert (tmp_path / "fig.png").stat().st_size > 10_000
    assert "| good | 3 |" in text and "extrapolates" in text
    assert "| flat | 2 |" in text and "did not converge: no gain over R0" in text
    assert "old (1 of 1 runs)" in text and "nan" not in text.lower()
    json.dumps(fits, allow_nan=False)  # every number finite, or None
    assert [f["name"] for f in fits] == ["good", "flat"] and fits[0]["extrapolation"][
        "verdict"
    ] == "extrapolates"


def test_sppo_rl_report_draws_accuracy_against_flops_with_the_fits(tmp_path):
    from sppo_rl.experiments.report import ReportConfig, run_report

    root = tmp_path / "runs"
    for algo, A in (("sppo", 0.7), ("grpo", 0.5)):
        for k, (C, R) in enumerate(seeds(n=2, A=A, seed=len(algo) + (A > 0.6))):
            folder = root / algo / f"seed{k}"
            folder.mkdir(parents=True)
            cfg = {
                "algo": algo,
                "task": "arithmetic",
                "seed": k,
                "updates": len(C) - 1,
                "prompts_per_step": 8,
            }
            (folder / "config.json").write_text(json.dumps(cfg))
            rows = [
                {
                    "update": i,
                    "wall_time_s": float(i),
                    "generated_tokens": 10 * i,
                    "flops_total": float(c),
                    "val_accuracy": float(r),
                }
                for i, (c, r) in enumerate(zip(C, R))
            ]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=50))
    assert (
        "llm_accuracy_vs_flops.png" in report["figures"]
        and (root / "report" / "llm_accuracy_vs_flops.png").is_file()
    )
    text = (root / "report" / "report.md").read_text()
    assert (
        "Accuracy against compute (ScaleRL sigmoid)" in text
        and "| sppo | 2 |" in text
        and "| grpo | 2 |" in text
    )
    assert {f["name"]: round(f["fit"]["A"], 1) for f in report["scaling"]} == {"sppo": 0.7, "grpo": 0.5}


def test_no_two_methods_share_a_colour_past_ten_methods():
    """Ten methods take matplotlib's cycle C0..C9; eleven or more take tab20's colours, all distinct
    (with the plain cycle the eleventh method was drawn in the first one's colour)."""
    from matplotlib.colors import to_hex

    from sppo_rl.experiments.scaling import method_colour

    assert [method_colour(i, 10) for i in range(10)] == [f"C{i}" for i in range(10)]
    eleven = [to_hex(method_colour(i, 11)) for i in range(11)]
    assert len(set(eleven)) == 11
