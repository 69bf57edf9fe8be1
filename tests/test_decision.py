"""sppo_rl.experiments.decision: each test on numbers worked by hand (the paired t-test, Holm's
correction, the minimum detectable effect, TOST, Fisher's exact test, the power calculator, the sign-flip
test, the probability of improvement, the verdict's wording), and the decision rule's error rates
simulated through the same functions (scripts/decision_sim.py) with a fixed seed: the false-positive
rate within 1 point of alpha and the 95 % interval's coverage >= 93 % under independent, correlated
(0.8) and 30 %-collapsing seeds at 5, 10 and 20 seeds, and the power at 1 sd as the noncentral t says."""

from __future__ import annotations

import math

import numpy as np
import pytest
from paths import script_module
from scipy import stats as sps

from sppo_rl.experiments import decision as D

# ---------------------------------------------------------------------------------- hand-made numbers


def test_paired_t_on_hand_worked_differences():
    """d = 1..5: mean 3, sd sqrt(2.5) = 1.5811, se 0.7071, t = 4.2426 on 4 df; t_{0.975, 4} = 2.7764:
    interval 3 -+ 1.9632; p as scipy's one-sample t-test."""
    t = D.paired_t(D.paired_values([2, 4, 6, 8, 10], [1, 2, 3, 4, 5], "difference"))
    assert (t["n"], t["mean"]) == (5, 3.0) and t["sd"] == pytest.approx(math.sqrt(2.5))
    assert t["t"] == pytest.approx(4.2426, abs=1e-4)
    assert (t["lo"], t["hi"]) == pytest.approx((3 - 1.9632, 3 + 1.9632), abs=1e-4)
    assert t["p"] == pytest.approx(sps.ttest_1samp([1, 2, 3, 4, 5], 0).pvalue, rel=1e-9)
    assert t["p"] == pytest.approx(0.01324, abs=1e-5)
    # no spread: a point interval, p 0 (a difference) or 1 (none); one value: no test
    assert D.paired_t([0.25] * 4)["p"] == 0.0 and D.paired_t([0.25] * 4)["lo"] == 0.25
    assert D.paired_t([0.0] * 4)["p"] == 1.0
    assert math.isnan(D.paired_t([0.3])["p"]) and math.isnan(D.paired_t([math.nan, 0.3])["p"])


def test_ratios_are_tested_on_log_ratios():
    # a = 2 b in every seed: ln 2 each, no spread: the geometric mean ratio 2, its interval [2, 2]
    r = D.compare([2, 4, 8], [1, 2, 4], "ratio", margin=1.25)
    assert r["estimate"] == pytest.approx(2.0) and r["interval"] == pytest.approx([2.0, 2.0]) and r["p"] == 0
    # a value <= 0 has no log-ratio: that seed is left out
    assert (
        D.paired_values([1, 0, 2], [1, 1, 1], "ratio")[1] != D.paired_values([1, 0, 2], [1, 1, 1], "ratio")[1]
    )
    assert D.compare([1, 0, 2], [1, 1, 1], "ratio", 1.25)["n"] == 2


def test_holm_step_down():
    """p = 0.01, 0.04, 0.03, 0.005 (m = 4): sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06,
    0.04 x 1 = 0.04 -> max so far 0.06; back in order: 0.03, 0.06, 0.06, 0.02. NaN does not count in m."""
    assert D.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = D.holm([0.02, math.nan, 0.04])
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert D.holm([0.5, 0.9]) == [1.0, 1.0] and D.holm([]) == []


def test_power_and_seeds_needed_match_the_tables():
    """Paired t, alpha 0.05 two-sided: effect = 1 sd at 10 pairs has power 0.803 (G*Power: 0.8031); 0.8
    needs 10 pairs for dz = 1 and 34 for dz = 0.5; the power depends on effect / sd only."""
    assert D.power_paired(10, 1.0, 1.0) == pytest.approx(0.8031, abs=5e-4)
    assert D.power_paired(10, -0.3, 0.3) == pytest.approx(D.power_paired(10, 1.0, 1.0))
    assert D.seeds_needed(1.0, 1.0) == 10 and D.seeds_needed(1.0, 0.5) == 34
    assert D.seeds_needed(0.08, 0.04) == 34
    assert D.power_paired(9, 1.0, 1.0) < 0.8 <= D.power_paired(10, 1.0, 1.0)
    with pytest.raises(ValueError, match="paired spread"):
        D.seeds_needed(0.0, 0.1)


def test_minimum_detectable_effect():
    """At 5 pairs, sd 1: the textbook (t_{0.975,4} + t_{0.8,4}) / sqrt 5 = (2.7764 + 0.9410) / 2.2361 =
    1.662; the noncentral t gives 1.682 (the textbook's is a little optimistic); the power there is 0.8;
    it scales with sd."""
    m = D.mde(1.0, 5)
    assert m == pytest.approx(1.682, abs=1e-3) and abs(m - 1.662) / 1.662 < 0.02
    assert D.power_paired(5, m, 1.0) == pytest.approx(0.8, abs=1e-6)
    assert D.mde(0.1, 5) == pytest.approx(0.1 * m) and D.mde(0.0, 5) == 0.0 and math.isnan(D.mde(1.0, 1))
    assert D.mde(1.0, 10) == pytest.approx(1.0, abs=0.01)  # the 0.803 above


def test_tost_is_the_90_percent_interval_inside_the_margin():
    """d = -0.01, 0.01, 0, 0.02, 0.03: mean 0.01, sd 0.01581, se 0.007071. Within 0.05: p = max(sf(0.06 /
    se), cdf(-0.04 / se)) = cdf(-5.657, 4) = 0.0024; the 90 % interval 0.01 -+ 2.1318 se = [-0.0051,
    0.0251] is inside. Within 0.02: not shown (p > 0.05), the interval crosses 0.02."""
    d = [-0.01, 0.01, 0.0, 0.02, 0.03]
    se = math.sqrt(0.001 / 4) / math.sqrt(5)
    assert D.tost(d, 0.05) == pytest.approx(float(sps.t.cdf(-0.04 / se, 4))) and D.tost(d, 0.05) < 0.003
    assert D.tost(d, 0.02) > 0.05
    assert (
        D.tost([0.01] * 3, 0.05) == 0.0
        and D.tost([0.06] * 3, 0.05) == 1.0
        and math.isnan(D.tost([0.1], 0.05))
    )


def test_fisher_exact_on_collapse_counts():
    """6 of 10 collapse against 0 of 10: the tables with the 6 collapses all in one row, C(10, 6) /
    C(20, 6) = 210 / 38760 = 0.005418, both tails: 0.010836 (as scipy)."""
    assert D.fisher_exact(6, 10, 0, 10) == pytest.approx(2 * 210 / 38760)
    assert D.fisher_exact(6, 10, 0, 10) == pytest.approx(sps.fisher_exact([[6, 4], [0, 10]]).pvalue)
    assert D.fisher_exact(1, 5, 1, 5) == 1.0
    assert D.collapsed(0.2, 0.0) and D.collapsed(0.2, 0.1) and not D.collapsed(0.2, 0.3)
    assert D.collapsed(0.0, 0.0)  # ends at 0

    # pooled over tasks: the counts add, the test runs on the sums
    def task(n: int) -> dict:
        return {
            "counts": {"ppo": {"n": n, "of": 5}, "sppo": {"n": 0, "of": 5}},
            "fisher_p": {"ppo_vs_sppo": 0.0},
        }

    pooled = D.pooled_collapse([task(3), task(3)])
    assert (
        pooled["counts"] == {"ppo": {"n": 6, "of": 10}, "sppo": {"n": 0, "of": 10}} and pooled["tasks"] == 2
    )
    assert pooled["fisher_p"] == {"ppo_vs_sppo": pytest.approx(2 * 210 / 38760)}


def test_sign_flip_and_probability_of_improvement():
    # d = 1, 2, 3: of the 8 sign vectors, +++ and --- have |mean| >= 2: p = 0.25; five pairs can never
    # go below 2 / 32 = 0.0625, whatever the data (why the t-test is the rule)
    assert D.sign_flip([1, 2, 3]) == 0.25
    assert D.sign_flip([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)
    # a = 1, 2 and b = 1, 0: (1 vs 1) 1/2, (1 vs 0) 1, (2 vs 1) 1, (2 vs 0) 1 -> 3.5 / 4
    assert D.probability_of_improvement([1, 2], [1, 0]) == 0.875


def test_verdict_wording():
    row = {"kind": "difference", "n": 5, "p": 0.2, "tost_p": 0.3, "mde": 0.1234, "margin": 0.05}
    (r,) = D.decide([dict(row)])
    assert r["verdict"] == "inconclusive: could not detect differences below 0.123" and r["holm_p"] == 0.2
    (r,) = D.decide([dict(row, tost_p=0.01)])
    assert r["verdict"] == "equivalent within ±0.05 (TOST p = 0.01)"
    a, b = D.decide([dict(row, p=0.01), dict(row, p=0.04)])  # Holm: 0.02 and 0.04
    assert a["verdict"] == "difference (Holm p = 0.02)" and b["verdict"] == "difference (Holm p = 0.04)"
    (r,) = D.decide([dict(row, kind="ratio", mde=1.31, margin=1.25)])
    assert r["verdict"] == "inconclusive: could not detect ratios within x/ 1.31"
    assert "|" not in r["verdict"]  # it sits in a markdown table
    (r,) = D.decide([dict(row, n=1, p=math.nan)])
    assert r["verdict"] == "no test (1 seed pair with values)"
    assert [
        D.shown(x) for x in ("difference (Holm p = 0.02)", "equivalent within ±0.05 (TOST p = 0.01)")
    ] == [
        "difference",
        "equivalent",
    ]
    assert D.shown("inconclusive: could not detect differences below 0.123") == "inconclusive"
    with pytest.raises(ValueError, match="margin"):
        D.Design(margin=0)


def test_default_primary_is_accuracy_at_equal_compute():
    assert D.default_primary(("seconds", "tokens", "flops")) == ("acc_at_flops", None)
    assert D.default_primary(("seconds", "episodes", "env_steps")) == ("acc_at_env_steps", None)
    primary, note = D.default_primary(("seconds", "tokens"))
    assert primary == "acc_at_tokens" and "no flops_total" in note


def test_power_script(capsys):
    with script_module("power") as power:
        out = power.main(["--sd", "1", "--effect", "1"])
        assert out["seeds"] == 10 and out["mde"][10] == pytest.approx(D.mde(1.0, 10))
        assert "10 seeds detect a difference of 1" in capsys.readouterr().out
        out = power.main(["--pilot-a", "1", "2", "3", "--pilot-b", "0", "0", "0", "--effect", "1"])
        assert out["sd"] == pytest.approx(1.0)
        with pytest.raises(SystemExit) as e:
            power.main(["--effect", "1"])
        assert e.value.code == 2 and "give --sd" in capsys.readouterr().err


# ------------------------------------------------------------------------------- the simulated rates


@pytest.fixture(scope="module")
def sim():
    with script_module("decision_sim") as module:
        yield module


@pytest.mark.parametrize("model", ["independent", "correlated 0.8", "30 % collapse"])
def test_false_positives_within_a_point_of_alpha_and_coverage_at_least_93(sim, model):
    """No true difference, 4000 comparisons per seed count (seeded, as ``decision_sim.py --reps 4000``):
    the share of "difference" within 1 point of alpha = 0.05 and the 95 % interval covering 0 at least
    93 % of the time, at 5, 10 and 20 seeds: the numbers of :data:`decision.SIMULATED`, which the reports
    print. (With 4000 repetitions a rate's standard error is 0.35 points; 200,000 vectorised repetitions
    put every cell within 0.3 points of 5 %.)"""
    for n in sim.SEEDS:
        r = sim.rates(model, n, 0.0, 4000, flips=False)
        assert abs(r["difference"] - D.ALPHA) <= 0.01 and r["coverage"] >= 0.93, (model, n, r)
        coverage, _, false_positives = D.SIMULATED[model][n]
        assert (r["coverage"], r["difference"]) == pytest.approx(
            (coverage, false_positives), abs=6e-5
        )  # the table rounds to 4 decimals


def test_power_at_one_sd_is_the_noncentral_t_s(sim):
    """Independent seeds, a true difference of 1 sd (paired spread sqrt 2): the simulated power within
    3 points of :func:`decision.power_paired` (0.23, 0.51, 0.85 at 5, 10, 20 seeds), and at the MDE 80 %."""
    for n in sim.SEEDS:
        exact = D.power_paired(n, 1.0, math.sqrt(2))
        assert abs(sim.rates("independent", n, 1.0, 3000, flips=False)["difference"] - exact) <= 0.03, n
    assert [round(D.power_paired(n, 1.0, math.sqrt(2)), 2) for n in sim.SEEDS] == [0.23, 0.51, 0.85]
    m, p = sim.power_at_mde(10, 3000)
    assert abs(p - 0.8) <= 0.03 and m == pytest.approx(D.mde(math.sqrt(2), 10))


def test_holm_keeps_a_table_s_family_wise_rate(sim):
    """7 pairs x 3 statistics, no difference: at least one raw p < 0.05 in ~1 - 0.95^21 = 66 % of tables;
    after Holm at most alpha (+ 1 point of noise)."""
    raw, holm = sim.family_rate(600)
    assert raw > 0.55 and holm <= D.ALPHA + 0.01


@pytest.mark.slow
def test_the_whole_simulation_prints_its_tables(sim, capsys):
    """The script end to end (4000 repetitions per cell, 200 of the simulated curves): its numbers within
    1 point of alpha; the time below the target, on curves evaluated every 7.5 s against every 1.5 s,
    has a median estimate of ~1.34 where the truth is 1 (the evaluation-density bias: interpolating a
    concave rise between sparse evaluations crosses the target late), while the primary stays near 5 %."""
    sim.main(["--reps", "4000", "--curve-reps", "200"])
    out = capsys.readouterr().out
    assert "| independent | 5 |" in out and "with Holm" in out
    for model in sim.MODELS:  # the coverage with a true difference of 1 sd, as SIMULATED says
        for n in sim.SEEDS:
            r = sim.rates(model, n, 1.0, 4000, flips=False)
            assert (
                r["coverage"]
                == pytest.approx(
                    D.SIMULATED[model][n][1], abs=6e-5
                )  # the table rounds to 4 decimals and r["coverage"] >= 0.93
            )
    cc = sim.curve_check(200)
    assert cc["acc_at_flops"]["role"] == "primary" and abs(cc["acc_at_flops"]["difference"] - 0.05) <= 0.04
    assert cc["seconds_to_target"]["estimate"] > 1.1


def test_values_equal_up_to_float_rounding_have_no_spread():
    # 0.3 - 0.55 and 0.34 - 0.59 differ in the last bits only: the same difference, p = 0
    d = D.paired_values([0.25 + 0.04 * k for k in range(5)], [0.5 + 0.04 * k for k in range(5)], "difference")
    assert np.ptp(d) > 0 and D.paired_t(d)["sd"] == 0 and D.paired_t(d)["p"] == 0


def test_restated_claims_from_the_docs_numbers(capsys):
    """scripts/restate_claims.py on the numbers the docs print: PPO collapses in 6 of 10 control runs
    (3 of 5 on LunarLander, 3 of 5 on Hopper) against SPPO's 0 of 10: Fisher's exact p = 0.0108 pooled,
    0.167 per task; the paired test on the per-seed finals is inconclusive on each task (p 0.066 and
    0.059, MDE ~0.8 and ~0.7); on SmolLM2 nothing under an MDE of 0.3; the latent table's SPPO vs GRPO
    at equal tokens (+0.050 [+0.035, +0.061] over 5 seeds) is a difference, Latent-GRPO vs its unfixed
    variant at equal tokens is not shown (Holm p 0.24)."""
    with script_module("restate_claims") as rc:
        out = rc.main()
    capsys.readouterr()
    assert out["collapse"]["pooled"] == {"ppo": 6, "sppo": 0, "fisher_p": pytest.approx(0.010836, abs=1e-6)}
    assert out["collapse"]["control"] == {
        "lunarlander": {"ppo": 3, "sppo": 0},
        "hopper": {"ppo": 3, "sppo": 0},
    }
    lunar, hopper, grpo, ppo, latent_finals = out["exact"]
    assert latent_finals["p"] == pytest.approx(0.0122, abs=5e-4) and out["collapse"]["latent"] == {
        "latent-grpo": 3,
        "latent-grpo-naive": 0,
    }
    assert lunar["p"] == pytest.approx(0.0655, abs=1e-4) and hopper["p"] == pytest.approx(0.0587, abs=1e-4)
    assert all(D.shown(r["verdict"]) == "inconclusive" for r in out["exact"][:4])
    assert grpo["mde"] > 0.3 and ppo["mde"] > 0.3
    latent = {(r["a"], r["b"], r["statistic"]): r for r in out["tables"]["latent"]}
    assert D.shown(latent["sppo", "grpo", "accuracy at equal generated tokens"]["verdict"]) == "difference"
    fixed = latent["latent-grpo", "latent-grpo-naive", "accuracy at equal generated tokens"]
    assert D.shown(fixed["verdict"]) == "inconclusive" and fixed["holm_p"] == pytest.approx(0.24, abs=0.01)


def test_ratio_text_prints_the_ratio_with_its_interval_or_says_there_is_none():
    """The benchmarks' line for a :func:`decision.time_ratio`: two decimals and the interval; one
    repetition (or pair) has no interval, and the text says which unit there was one of."""
    from sppo_rl.experiments.decision import ratio_text, time_ratio

    assert ratio_text({"ratio": 1.234, "lo": 1.1, "hi": 1.375}) == "1.23x [1.10, 1.38]"
    assert ratio_text(time_ratio([10.0], [5.0])) == "2.00x [n/a: one repetition]"
    assert ratio_text(time_ratio([10.0], [5.0]), "pair") == "2.00x [n/a: one pair]"
