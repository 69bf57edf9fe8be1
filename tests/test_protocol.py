"""sppo_rl.experiments.protocol: each function on numbers worked by hand (interpolation, the common
window and grid, the area, the time below the target, "final", the target rule, the paired bootstrap,
the A/A splits and the verdict), and the A/A test: two IDENTICAL learning curves at very different
update costs (6.6 s and 1.2 s per update, an evaluation every 5 updates) through the old time-to-target
rule (trailing mean over 3 evaluations, target = one method's best, first evaluation at or above it)
give a ratio far from 1; through the protocol, ratios near 1 whose intervals contain 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
from paths import script_module
from scipy import stats as sps

from sppo_rl.experiments import protocol as P
from sppo_rl.runtime.curves import TAIL_FRAC, tail_value


def curve(seconds, acc, tokens_per_second: float = 100.0) -> P.Curve:
    s = np.asarray(seconds, dtype=float)
    return P.Curve(s, s * tokens_per_second, np.arange(len(s), dtype=float), np.asarray(acc, dtype=float))


# ---------------------------------------------------------------------------------- hand-made numbers


def test_final_is_the_mean_of_the_last_tenth_at_least_one():
    assert tail_value(range(1, 21)) == 19.5  # last 2 of 20
    assert tail_value(range(1, 31)) == 29  # last 3 of 30 (0.1 * 30 = 3.0000000000000004 in floats)
    assert tail_value([0.4, 0.9]) == 0.9  # at least one: not the mean 0.65, not the best
    assert tail_value([0.2, None, 0.6, math.nan, 0.8], frac=0.5) == 0.7  # rows without a value do not count
    assert math.isnan(tail_value([]))
    # the sweep used the last 10 updates: over 20 updates rising 0.05 per update it said 0.725
    assert tail_value([0.05 * i for i in range(1, 21)]) == pytest.approx(0.975)


def test_value_and_first_crossing_are_interpolated_between_raw_evaluations():
    x, y = [0, 10, 30], [0.2, 0.4, 0.8]
    assert P.value_at(x, y, 20) == pytest.approx(0.6)
    assert math.isnan(P.value_at(x, y, 31))  # no extrapolation
    # 0.5 is reached a quarter of the way from 10 s (0.4) to 30 s (0.8): 15 s, not the evaluation at 30 s
    assert P.crossing(x, y, 0.5) == pytest.approx(15.0)
    assert P.crossing(x, y, 0.1) == 0.0
    assert P.crossing(x, y, 0.9) is None


def test_time_below_the_target_counts_each_excursion():
    x, y = [0, 10, 20, 30, 40], [0.0, 1.0, 0.0, 1.0, 1.0]
    # below 0.5 on [0, 5), (15, 25): 5 + 10 = 15 s; the first crossing is at 5 s
    assert P.time_below(x, y, 0.5, 0, 40) == pytest.approx(15.0)
    assert P.crossing(x, y, 0.5) == pytest.approx(5.0)
    # on a window [8, 22]: below on (15, 22]: 7 s
    assert P.time_below(x, y, 0.5, 8, 22) == pytest.approx(7.0)
    # a rising curve that crosses once: the time below is its crossing time
    assert P.time_below([0, 10, 30], [0.2, 0.4, 0.8], 0.5, 0, 30) == pytest.approx(15.0)
    assert math.isnan(P.time_below(x, y, 0.5, 0, 50))  # the curve does not cover the window


def test_area_is_the_mean_of_the_piecewise_linear_curve_over_the_window():
    x, y = [0, 10, 30], [0.2, 0.4, 0.8]
    # trapezoids: 10 * 0.3 + 20 * 0.6 = 15 over 30 s
    assert P.area(x, y, 0, 30) == pytest.approx(0.5)
    # [5, 20]: y(5) = 0.3, y(10) = 0.4, y(20) = 0.6: 5 * 0.35 + 10 * 0.5 = 6.75 over 15 s
    assert P.area(x, y, 5, 20) == pytest.approx(0.45)
    assert math.isnan(P.area(x, y, 0, 40))


def test_window_and_grid_are_common_to_every_run():
    a = curve([0, 33, 66, 99], [0.1, 0.3, 0.5, 0.7])
    b = curve([2, 8, 14, 20, 26, 32, 38, 44, 50, 56, 62, 68, 74, 80], np.linspace(0.1, 0.9, 14))
    assert P.window([a, b], "seconds") == (2.0, 80.0)  # the latest start, the earliest end
    assert P.window([a, b], "tokens") == (200.0, 8000.0)
    grid, y = P.on_grid([a, b], "seconds", points=5)
    assert grid.tolist() == [2.0, 21.5, 41.0, 60.5, 80.0]
    # a at 41 s: 0.3 + (8 / 33) * 0.2
    assert y.shape == (2, 5) and y[0, 2] == pytest.approx(0.3 + 8 / 33 * 0.2)
    assert y[1, 0] == pytest.approx(0.1) and y[1, -1] == pytest.approx(0.9)


def test_target_is_set_by_pooled_finals_not_by_a_method_s_best():
    # runs start at 0.3, 0.3, 0.3, 0.4 (mean 0.325); finals 0.5, 0.6, 0.7, 0.9 (median 0.65)
    assert P.target_of([0.3, 0.3, 0.3, 0.4], [0.5, 0.6, 0.7, 0.9]) == pytest.approx(0.325 + 0.5 * 0.325)
    assert P.target_of([0.2], [0.6], gain=1.0) == pytest.approx(0.6)


def test_paired_bootstrap_resamples_seed_pairs_together():
    # the same seed gives the same noise to both methods: paired, the difference is 0 in every resample
    a = [0.3, 0.9, 0.5, 0.7]
    assert P.paired_bootstrap(a, a, "difference") == (0.0, 0.0, 0.0)
    # a twice b in every seed: the ratio of means is 2 in every resample (unpaired it would scatter)
    assert P.paired_bootstrap([2, 6, 4], [1, 3, 2], "ratio") == pytest.approx((2.0, 2.0, 2.0))
    # differences 0 and 2: a resample's mean is 0, 1 or 2 (p 1/4, 1/2, 1/4): the 95 % interval is [0, 2]
    assert P.paired_bootstrap([1, 3], [1, 1], "difference", reps=400) == (1.0, 0.0, 2.0)
    # seeded and deterministic; one pair gives no interval
    x, y = [0.1, 0.5, 0.4, 0.8, 0.3], [0.2, 0.3, 0.5, 0.6, 0.1]
    assert P.paired_bootstrap(x, y, "ratio", seed=3) == P.paired_bootstrap(x, y, "ratio", seed=3)
    assert P.paired_bootstrap(x, y, "ratio", seed=3) != P.paired_bootstrap(x, y, "ratio", seed=4)
    point, lo, hi = P.paired_bootstrap([1.0], [2.0], "ratio")
    assert point == 0.5 and math.isnan(lo) and math.isnan(hi)


def test_aa_null_splits_one_method_s_seeds_into_two_pseudo_methods():
    assert P.splits(3) == [
        ((0,), (1, 2)),
        ((1, 2), (0,)),
        ((1,), (0, 2)),
        ((0, 2), (1,)),
        ((2,), (0, 1)),
        ((0, 1), (2,)),
    ]
    assert P.splits(1) == []
    # seeds 1, 2, 3, 4: halves {1,2}-{3,4} = -2, {1,3}-{2,4} = -1, {1,4}-{2,3} = 0, and each the other way
    lo, hi, n = P.aa_null([[1, 2, 3, 4]], "difference")
    assert (lo, hi, n) == (-2.0, 2.0, 12)
    # pooled over the two methods; a ratio: 1 vs 2 seeds of [1, 1, 4]: 1/2.5, 2.5/1, 4/1, 1/4 (x2 for 1)
    lo, hi, n = P.aa_null([[1, 1, 4], [5]], "ratio")
    values = sorted([1 / 2.5, 2.5, 1 / 2.5, 2.5, 4.0, 0.25])
    assert n == 6 and (lo, hi) == pytest.approx(tuple(np.quantile(values, [0.025, 0.975])))
    assert math.isnan(P.aa_null([[1], [2]], "ratio")[0])


def test_protocol_decides_by_the_paired_test_with_a_primary_and_holm_per_table():
    """Three methods, five seeds; at 10 s: a = b + 0.1 (+- 0.01 per seed), c = b + (0.02, -0.01, 0.01,
    -0.02, 0). Primary (declared): acc_at_seconds. Two primary rows (a vs b, c vs b) are one Holm family,
    the eight other rows another. a vs b: differences 0.1, 0.11, 0.09, 0.1, 0.1 -> mean 0.1, sd 0.00707,
    t = 31.6 on 4 df: a difference. c vs b: mean 0, sd 0.01581; TOST within 0.05: (0 + 0.05) / 0.00707 =
    7.07 on 4 df, p = 0.001: equivalent."""
    bump_a = [0.0, 0.01, -0.01, 0.0, 0.0]
    bump_c = [0.02, -0.01, 0.01, -0.02, 0.0]
    base = [0.4 + 0.02 * k for k in range(5)]
    make = lambda end: {k: curve([0, 10], [0.2, e]) for k, e in enumerate(end)}  # noqa: E731
    curves = {
        "a": make([x + 0.1 + u for x, u in zip(base, bump_a)]),
        "b": make(base),
        "c": make([x + u for x, u in zip(base, bump_c)]),
    }
    r = P.protocol(curves, [("a", "b"), ("c", "b")], design=P.Design(primary="acc_at_seconds"))
    assert r["primary"] == "acc_at_seconds" and r["axes"] == ["seconds", "tokens"]
    assert r["notes"] == ["FLOPs: not available (these runs log no flops_total)"]
    primary = [row for row in r["table"] if row["role"] == "primary"]
    assert [(row["a"], row["statistic"]) for row in primary] == [
        ("a", "acc_at_seconds"),
        ("c", "acc_at_seconds"),
    ]
    assert len(r["table"]) == 10
    ab, cb = r["pairs"]["a_vs_b"]["acc_at_seconds"], r["pairs"]["c_vs_b"]["acc_at_seconds"]
    assert ab["estimate"] == pytest.approx(0.1) and ab["sd"] == pytest.approx(math.sqrt(0.0002 / 4))
    assert ab["holm_p"] == pytest.approx(min(1.0, 2 * ab["p"])) and ab["verdict"].startswith(
        "difference (Holm p = "
    )
    assert cb["tost_p"] == pytest.approx(float(sps.t.sf(0.05 / (math.sqrt(0.001 / 4) / math.sqrt(5)), 4)))
    assert cb["verdict"].startswith("equivalent within ±0.05 (TOST p = ")
    # no collapse: every run ends above its start
    assert r["collapse"]["counts"] == {m: {"n": 0, "of": 5} for m in "abc"}
    assert r["collapse"]["fisher_p"] == {"a_vs_b": 1.0, "c_vs_b": 1.0}
    # without a declared primary: accuracy at equal generated tokens, with the note
    r = P.protocol(curves, [("a", "b")])
    assert r["primary"] == "acc_at_tokens" and "no flops_total" in r["notes"][-1]


def test_flops_are_an_axis_where_every_run_logs_them():
    rows = lambda scale: [  # noqa: E731
        {
            "update": i,
            "wall_time_s": 2.0 * i,
            "generated_tokens": 100 * i,
            "flops_total": scale * i,
            "val_accuracy": 0.1 * i,
        }
        for i in range(4)
    ]
    a, b = P.Curve.of_rows(rows(1e9)), P.Curve.of_rows(rows(3e9))
    assert a.axis("flops").tolist() == [0, 1e9, 2e9, 3e9]
    r = P.protocol({"a": {0: a, 1: a}, "b": {0: b, 1: b}}, [("a", "b")], target=0.15)
    # b spends 3x the FLOPs per update: the window ends at a's 3e9, where b is at its first update
    assert r["axes"] == ["seconds", "tokens", "flops"] and r["windows"]["flops"] == [0.0, 3e9]
    assert r["primary"] == "acc_at_flops" and r["notes"] == []
    assert r["runs"]["b"][0]["acc_at_flops"] == pytest.approx(0.1) and r["runs"]["a"][0][
        "acc_at_flops"
    ] == pytest.approx(0.3)
    # an older run without flops_total: no flops axis
    old = [{k: v for k, v in row.items() if k != "flops_total"} for row in rows(1e9)]
    assert P.Curve.of_rows(old).flops is None
    with pytest.raises(KeyError, match="flops"):
        P.Curve.of_rows(old).axis("flops")


def test_protocol_end_to_end_on_hand_made_runs():
    a = {0: curve([0, 10, 20], [0.2, 0.6, 0.8]), 1: curve([0, 10, 20], [0.2, 0.4, 0.6])}
    b = {0: curve([0, 4, 8, 12, 16, 24], [0.2, 0.3, 0.4, 0.5, 0.6, 0.7])}
    r = P.protocol({"a": a, "b": b}, [("a", "b")])
    assert r["windows"]["seconds"] == [0.0, 20.0]
    # starts 0.2 (s0 0.2); finals 0.8, 0.6, 0.7 (the last 1 of 3, 1 of 6): median 0.7 -> target 0.45
    assert r["target"]["value"] == pytest.approx(0.45)
    ra, rb = r["runs"]["a"][1], r["runs"]["b"][0]
    assert ra["seconds_to_target"] == pytest.approx(12.5) and ra["reached_seconds"]  # 0.4 -> 0.6 over 10-20 s
    assert rb["seconds_to_target"] == pytest.approx(10.0)  # 0.4 at 8 s, 0.5 at 12 s
    assert rb["acc_at_seconds"] == pytest.approx(0.6 + 4 / 8 * 0.1)  # at the window's end, 20 s
    assert ra["auc_seconds"] == pytest.approx((10 * 0.3 + 10 * 0.5) / 20)
    pair = r["pairs"]["a_vs_b"]
    # only seed 0 is in both: one pair, no interval; the null comes from a's two seeds (1 vs 1, each split in both orders twice)
    t = pair["seconds_to_target"]
    assert t["seeds"] == [0] and t["per_seed"] == [pytest.approx(6.25 / 10)]
    assert t["verdict"] == "no test (1 seed pair with values)"
    assert t["null_splits"] == 4 and t["null"][0] < 1 < t["null"][1]


# ------------------------------------------------------------------------------------------ the A/A test


@pytest.fixture(scope="module")
def aa():
    """scripts/aa_null.py: the simulated A/A runs (identical curves, 6.6 s vs 1.2 s per update, an
    evaluation every 5 updates, 5 seeds) and yesterday's compare_llm rule."""
    with script_module("aa_null") as module:
        yield module


def test_old_rule_reports_a_ratio_for_identical_curves(aa):
    """The bias the issue describes: identical curves, 5 seeds, 200 repetitions; the old rule says the
    slow-update method needs ~1.5x the wall-clock (10-90 %: 1.14-2.0x), more than 1x in 96 % of them."""
    ratios = np.array([aa.old_time_ratio(list(s.values()), list(f.values())) for s, f in aa.repetitions(200)])
    assert np.median(ratios) > 1.3
    assert np.quantile(ratios, 0.1) > 1.05 and np.mean(ratios > 1) >= 0.9


def test_aa_protocol_finds_no_difference_between_identical_curves(aa):
    """The same simulated runs through the protocol (40 repetitions): every ratio's median within 5 % of
    1, every difference's within 0.02 of 0; the interval contains no difference in most repetitions (a
    paired t-interval over 5 seeds covers ~95 %) and the verdict is not "difference" in >= 90 % of
    them; the null interval contains no difference in every repetition. The
    interpolated first crossing alone stays biased (~1.25x: the method evaluated 5x more often has more
    chances to cross a noisy target early): hence the time below the target."""
    m = aa.measure(40)
    for name in (*P.DIFFERENCES, *P.RATIOS):
        none = 0.0 if name in P.DIFFERENCES else 1.0
        s = [p[name] for p in m["pairs"]]
        points = np.array([x["point"] for x in s])
        covered = np.mean([x["interval"][0] <= none <= x["interval"][1] for x in s])
        quiet = np.mean([not x["verdict"].startswith("difference") for x in s])
        assert abs(np.median(points) - none) < (0.02 if none == 0 else 0.05), name
        assert covered >= 0.75 and quiet >= 0.9, (name, covered, quiet)
        assert all(x["null"][0] <= none <= x["null"][1] for x in s), name
    # the first repetition, as compare_llm would print it: the time ratio's interval contains 1
    lo, hi = m["pairs"][0]["seconds_to_target"]["interval"]
    assert lo < 1 < hi
    assert np.median(m["first_crossing"]) > 1.15


def test_report_s_default_final_is_the_protocol_s():
    from sppo_rl.experiments.config import ReportConfig

    assert ReportConfig(inputs=("x",)).tail_frac == TAIL_FRAC


def test_a_run_without_evaluations_is_refused_not_dropped():
    a = {0: curve([0, 10], [0.2, 0.4]), 1: curve([], [])}
    with pytest.raises(ValueError, match="no evaluation in a seed 1"):
        P.protocol({"a": a}, [])


def test_control_curves_are_read_on_seconds_and_episodes():
    """A control run's rows (one success_rate per update) on the axes ("seconds", "episodes"): run A
    updates every 1 s, run B every 2 s, both 64 episodes an update and the same success per episode.
    Window: seconds [2, 3] (B's first, A's last), episodes [64, 192]. At 3 s A is at 0.6 (its third
    update), B at 0.2 + 0.5 * 0.2 = 0.3 (halfway between its first and second); at 192 episodes both 0.6."""
    rows = lambda dt: [  # noqa: E731
        {
            "update": i,
            "episodes": 64 * i,
            "env_steps": 640 * i,
            "wall_time_s": dt * i,
            "success_rate": 0.2 * i,
        }
        for i in (1, 2, 3)
    ]
    a, b = P.Curve.of_control_rows(rows(1.0)), P.Curve.of_control_rows(rows(2.0))
    assert a.axis("episodes").tolist() == [64, 128, 192] and a.axis("tokens").tolist() == [640, 1280, 1920]
    r = P.protocol({"a": {0: a}, "b": {0: b}}, [("a", "b")], target=0.5, axes=("seconds", "episodes"))
    assert r["windows"] == {"seconds": [2.0, 3.0], "episodes": [64.0, 192.0]}
    assert r["runs"]["a"][0]["acc_at_seconds"] == pytest.approx(0.6)
    assert r["runs"]["b"][0]["acc_at_seconds"] == pytest.approx(0.3)
    assert r["runs"]["a"][0]["acc_at_episodes"] == r["runs"]["b"][0]["acc_at_episodes"] == pytest.approx(0.6)
    pair = r["pairs"]["a_vs_b"]
    assert set(pair) - {"a", "b"} == {
        "acc_at_seconds",
        "acc_at_episodes",
        "auc_seconds",
        "seconds_to_target",
        "episodes_to_target",
    }
    assert pair["acc_at_seconds"]["point"] == pytest.approx(0.3)
    assert (
        P.statistic_names()
        == (P.DIFFERENCES, P.RATIOS)
        == (
            ("acc_at_seconds", "acc_at_tokens"),
            ("auc_seconds", "seconds_to_target", "tokens_to_target"),
        )
    )
