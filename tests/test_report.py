"""``sppo-rl report`` and its statistics, on run folders written by hand with known numbers.

t quantiles used below (from a printed table): t_{0.975,1} = 12.7062, t_{0.975,2} = 4.3027,
t_{0.975,4} = 2.7764.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from sppo_rl.agents.algorithms import ALGORITHMS
from sppo_rl.experiments import stats
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report import run_report
from sppo_rl.experiments.report_runs import PALETTE, colours
from sppo_rl.runtime.run import RunError

# ------------------------------------------------------------------------------------- statistics


def test_t_interval():
    mean, half = stats.t_interval([1, 2, 3])  # s = 1
    assert mean == 2 and half == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    mean, half = stats.t_interval([1, 2, 3, 4, 5, math.nan])  # NaN dropped; s = sqrt(2.5)
    assert mean == 3 and half == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-4)
    mean, half = stats.t_interval([0.75])
    assert mean == 0.75 and math.isnan(half)
    assert all(math.isnan(v) for v in stats.t_interval([]))


def test_trailing_mean_interpolate_crossing():  # final: tests/test_protocol.py
    assert stats.trailing_mean([1, 2, 3, 4, 5], 3).tolist() == [1, 1.5, 2, 3, 4]
    assert stats.trailing_mean([1, 2, 3], 1).tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        stats.trailing_mean([1], 0)
    got = stats.interpolate([0, 10], [0, 1], [-1, 0, 2.5, 10, 11])
    assert np.isnan(got[[0, 4]]).all() and got[1:4].tolist() == [0, 0.25, 1]
    assert stats.first_crossing([64, 128, 192], [0.2, 0.5, 0.9], 0.5) == 128  # >= counts
    assert stats.first_crossing([64, 128, 192], [0.2, 0.5, 0.9], 0.95) is None


def test_correlations():
    # ties: ranks x = [1, 2.5, 2.5, 4], y = [1, 3, 2, 4]; deviations [-1.5, 0, 0, 1.5], [-1.5, .5, -.5, 1.5]
    assert stats.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert stats.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert stats.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(stats.pearson([1, 1, 1], [1, 2, 3])) and math.isnan(stats.pearson([1], [2]))


# predicted sigmoid V(s_0) and empirical success of 4 start states, 4 episodes each
P, Y, M = [0.1, 0.3, 0.35, 0.8], [0.0, 0.25, 0.5, 0.75], [4, 4, 4, 4]
# by hand: means 0.3875 and 0.375; sum dp*dy = 0.26875, sum dp^2 = 0.261875, sum dy^2 = 0.3125
PEARSON = 0.26875 / math.sqrt(0.261875 * 0.3125)
# bins (10): {0.1} -> 1, {0.3, 0.35} -> 3, {0.8} -> 8: |0.1-0|/4 + 2|0.325-0.375|/4 + |0.8-0.75|/4
ECE = 0.1 / 4 + 2 * 0.05 / 4 + 0.05 / 4
# (p-y)^2 = .01, .0025, .0225, .0025; y(1-y) = 0, .1875, .25, .1875
BRIER = (0.01 + 0.19 + 0.2725 + 0.19) / 4
MSE = (0.01 + 0.0025 + 0.0225 + 0.0025) / 4


def test_calibration_statistics():
    assert stats.pearson(P, Y) == pytest.approx(PEARSON) and PEARSON == pytest.approx(0.93946, abs=1e-5)
    assert stats.spearman(P, Y) == pytest.approx(1.0)
    assert stats.ece(P, Y, M) == pytest.approx(ECE) == 0.0625
    assert stats.brier(P, Y, M) == pytest.approx(BRIER) == pytest.approx(0.165625)
    assert stats.mse(P, Y, M) == pytest.approx(MSE) == pytest.approx(0.009375)
    bins = stats.reliability_bins(P, Y, M)
    assert [(b["lo"], b["weight"]) for b in bins] == [(0.1, 4), (0.3, 8), (0.8, 4)]
    assert bins[1]["pred"] == pytest.approx(0.325) and bins[1]["emp"] == pytest.approx(0.375)
    # weights count: bin 0 holds 3 episodes off by 0.05, bin 9 (p = 1.0 included) 1 episode off by 0.5
    assert stats.ece([0.05, 1.0], [0.0, 0.5], [3, 1]) == pytest.approx(0.05 * 3 / 4 + 0.5 / 4)
    assert stats.brier([1.0, 0.0], [1.0, 0.0]) == 0 and stats.brier([0.5], [1.0]) == 0.25


# ------------------------------------------------------------------------------------- rliable-style


def test_iqm_worked_numbers():
    assert stats.iqm([0, 1, 2, 3, 4, 5, 6, 7]) == 3.5  # drop 2 at each end: mean(2, 3, 4, 5)
    assert stats.iqm([7, 0, 5, 2, 6, 1, 3, 4]) == 3.5  # order does not matter
    assert stats.iqm([100, 0, 1, 2, 10]) == pytest.approx(13 / 3)  # n = 5: drop 1 each end, mean(1, 2, 10)
    assert stats.iqm([-50, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000]) == 5.5  # n = 12: drop 3 each end, mean(3..8)
    assert stats.iqm([0.25, 1.0, 0.625]) == pytest.approx(0.625)  # n < 4: nothing dropped, the mean
    assert stats.iqm([0.3]) == 0.3 and math.isnan(stats.iqm([]))
    # one IQM per row (the bootstrap's resamples)
    assert stats.iqm([[0, 1, 2, 3, 4, 5, 6, 7], [1, 1, 9, 9, 9, 9, 1, 1]]).tolist() == [3.5, 5.0]
    # scipy's trimmed mean, which rliable uses, for every n from 1 to 13
    rng = np.random.default_rng(0)
    for n in range(1, 14):
        x = rng.random(n)
        assert stats.iqm(x) == pytest.approx(sps.trim_mean(x, 0.25)), n


def test_optimality_gap_and_clipping():
    assert stats.optimality_gap([0.5, 1.0, 0.8]) == pytest.approx((0.5 + 0 + 0.2) / 3)
    assert stats.optimality_gap([1.2, 0.4]) == pytest.approx(0.3)  # overshoot does not count
    assert stats.optimality_gap([0.5, 0.9], gamma=0.8) == pytest.approx(0.15)
    # a t-interval over 2 seeds (0.75, 1.0): 0.875 ± 1.588 -> [0, 1], clipped
    assert stats.clip_interval(0.875, 1.588) == (0.0, 1.0, True)
    lo, hi, clipped = stats.clip_interval(0.5, 0.1)
    assert (lo, hi, clipped) == (pytest.approx(0.4), pytest.approx(0.6), False)
    assert stats.clip_interval(0.95, 0.1)[1:] == (1.0, True)  # one side is enough
    assert math.isnan(stats.clip_interval(0.5, math.nan)[0])


def test_stratified_bootstrap_properties():
    mean = stats.pooled(stats.AGGREGATES["mean"])
    iqm = stats.pooled(stats.iqm)
    # all runs equal: every resample is the same, the interval collapses to the value
    assert stats.stratified_bootstrap([[0.5, 0.5, 0.5], [0.5, 0.5]], iqm) == (0.5, 0.5, 0.5)
    # stratified: task A's runs all score 0, task B's all 1; every resample keeps 3 runs of each task,
    # so the pooled mean is 0.5 in every one (an unstratified bootstrap would spread it over [0, 1])
    assert stats.stratified_bootstrap([[0, 0, 0], [1, 1, 1]], mean) == (0.5, 0.5, 0.5)
    # one task with runs (0, 1): a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4; the
    # 2.5% and 97.5% quantiles are 0 and 1; the 30% and 70% quantiles (a 40% interval) are both 0.5
    assert stats.stratified_bootstrap([[0.0, 1.0]], mean) == (0.5, 0.0, 1.0)
    assert stats.stratified_bootstrap([[0.0, 1.0]], mean, confidence=0.4) == (0.5, 0.5, 0.5)
    # percentile interval, not symmetric around the point: runs (0, 0, 1) have mean 1/3; a resample holds
    # k ones with probability C(3,k) (1/3)^k (2/3)^(3-k): 8/27, 12/27, 6/27, 1/27 for means 0, 1/3, 2/3, 1;
    # 1/27 = 3.7% > 2.5%, so the 97.5% quantile is 1 and the 2.5% one 0 (a "basic" bootstrap interval,
    # 2 * point - quantiles, would be [-1/3, 2/3])
    assert stats.stratified_bootstrap([[0.0, 0.0, 1.0]], mean) == (pytest.approx(1 / 3), 0.0, 1.0)
    # a single run per task gives no interval; NaN scores and empty tasks are dropped
    point, lo, hi = stats.stratified_bootstrap([[0.2], [0.4]], mean)
    assert point == pytest.approx(0.3) and math.isnan(lo) and math.isnan(hi)
    assert stats.stratified_bootstrap([[0.0, 1.0, math.nan], []], mean) == (0.5, 0.0, 1.0)
    # reproducible: the same seed gives the same interval, another seed another one
    scores = [[0.1, 0.4, 0.35, 0.8, 0.9], [0.5, 0.7, 0.2]]
    a = stats.stratified_bootstrap(scores, iqm, reps=500, seed=3)
    assert stats.stratified_bootstrap(scores, iqm, reps=500, seed=3) == a
    assert stats.stratified_bootstrap(scores, iqm, reps=500, seed=4) != a
    point, lo, hi = a
    assert point == pytest.approx(stats.iqm(scores[0] + scores[1])) and 0.1 <= lo < point < hi <= 0.9
    # a wider confidence gives a wider interval from the same resamples
    lo90, hi90 = stats.stratified_bootstrap(scores, iqm, reps=500, confidence=0.9, seed=3)[1:]
    assert lo <= lo90 <= hi90 <= hi and (lo, hi) != (lo90, hi90)


def test_performance_profile_on_hand_made_scores():
    taus = [0.0, 0.5, 0.55, 1.0]
    # task A: [0.2, 0.5, 0.9, 1.0] -> > 0: 4/4, > 0.5: 2/4 (0.5 itself does not count), > 0.55: 2/4, > 1: 0
    # task B: [0.0, 0.6]           -> > 0: 1/2, > 0.5: 1/2, > 0.55: 1/2, > 1: 0
    scores = [[0.2, 0.5, 0.9, 1.0], [0.0, 0.6]]
    got = stats.performance_profile(scores, taus)
    assert got.tolist() == [0.75, 0.5, 0.5, 0.0]  # tasks weigh equally (pooled would give 5/6 at tau = 0)
    assert stats.performance_profile([scores[0]], taus).tolist() == [1.0, 0.5, 0.5, 0.0]
    # the band: pointwise bootstrap interval around the profile
    p, lo, hi = stats.stratified_bootstrap(scores, lambda s: stats.performance_profile(s, taus))
    assert p.tolist() == got.tolist() and lo.shape == hi.shape == (4,)
    assert (lo <= p).all() and (p <= hi).all() and lo[3] == hi[3] == 0  # nobody is above 1
    assert hi[0] - lo[0] > 0  # task B's 0.0 / 0.6 may be drawn twice
    # runs all equal within their task: the band collapses onto the profile
    p, lo, hi = stats.stratified_bootstrap(
        [[0.2, 0.2], [0.7, 0.7, 0.7]], lambda s: stats.performance_profile(s, [0.1, 0.5, 0.9])
    )
    assert p.tolist() == lo.tolist() == hi.tolist() == [1.0, 0.5, 0.0]


# ------------------------------------------------------------------------------------- report


def write_run(
    folder: Path,
    task,
    algo,
    seed,
    success,
    *,
    sps=3840.0,
    finished=True,
    calibration=None,
    config=None,
    seconds_per_update=0.5,
):
    """A run folder as the control trainer writes it: 64 episodes of 30 steps per update, 0.5 s each."""
    folder.mkdir(parents=True)
    cfg = {
        "algo": algo,
        "task": task,
        "seed": seed,
        "total_episodes": 1280,
        "actor_lr": 3e-4,
        "out_dir": str(folder),
        "threads": 1,
        "resolved": {"task": task},
        **(config or {}),
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    rows = [
        {
            "update": i,
            "episodes": 64 * i,
            "env_steps": 1920 * i,
            "success_rate": y,
            "wall_time_s": seconds_per_update * i,
            "sps": sps,
        }
        for i, y in enumerate(success, 1)
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (folder / "metrics.jsonl").write_text(text if finished else text + '{"update": 99, "success_')  # torn
    if finished:
        (folder / "summary.json").write_text("{}")
    if calibration:
        (folder / "calibration.json").write_text(json.dumps(calibration))


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "sweep"
    sc = root / "short-cartpole"
    ppo = [
        [0.0] * 5 + [0.25] * 5 + [0.75] * 5 + [1.0] * 5,
        [0.0] * 10 + [0.625] * 10,
        [0.25] * 20,
    ]
    for seed, ys in enumerate(ppo):
        write_run(sc / "ppo" / f"seed{seed}", "short-cartpole", "ppo", seed, ys, sps=3000.0 + 1000 * seed)
    cal = {"predicted": P, "empirical": Y, "samples": M}
    write_run(sc / "sppo" / "seed0", "short-cartpole", "sppo", 0, [0.75] * 20, calibration=cal)
    write_run(sc / "sppo" / "seed1", "short-cartpole", "sppo", 1, [0.25, 0.5] + [1.0] * 8, finished=False)
    write_run(root / "cartpole" / "ppo" / "seed0", "cartpole", "ppo", 0, [0.5] * 10)
    (root / "short-cartpole" / "sppo" / "seed2").mkdir()  # a run that has not written anything yet
    (root / "short-cartpole" / "sppo" / "seed2" / "config.json").write_text('{"algo": "sppo", "seed": 2}')
    (root / "short-cartpole" / "sppo" / "seed2" / "metrics.jsonl").write_text("")
    return root


def test_report_numbers_on_known_runs(runs):
    report = run_report(ReportConfig(inputs=(str(runs),), smooth=3))
    groups = {(g["task"], g["algo"]): g for g in report["groups"]}
    assert list(groups) == [("cartpole", "ppo"), ("short-cartpole", "ppo"), ("short-cartpole", "sppo")]

    ppo = groups["short-cartpole", "ppo"]
    # final (last 2 of 20 updates): 1.0, 0.625, 0.25 -> mean 0.625, s = 0.375
    assert ppo["tail_success_per_seed"] == [1.0, 0.625, 0.25]
    assert ppo["tail_success_mean"] == pytest.approx(0.625)
    assert ppo["tail_success_half"] == pytest.approx(4.3027 * 0.375 / math.sqrt(3), rel=1e-4)
    # crossings of the raw curve, interpolated between updates (smoothed over 3 they were 800 and 1088):
    # seed 0 goes 0.25 (update 10, 640 episodes) -> 0.75 (704): 0.5 at 640 + 0.25/0.5 * 64 = 672, and
    # 0.75 (960) -> 1.0 (1024): 0.9 at 960 + 0.15/0.25 * 64 = 998.4; seed 1 0 (640) -> 0.625 (704): 0.5
    # at 640 + 0.5/0.625 * 64 = 691.2; seed 2 (0.25) never
    assert ppo["episodes_to"]["0.5"] == {"median": pytest.approx(681.6), "reached": 2, "seeds": 3}
    assert ppo["episodes_to"]["0.9"] == {"median": pytest.approx(998.4), "reached": 1, "seeds": 3}
    assert ppo["wall_time_s"] == 10.0 and ppo["sps"] == 4000.0

    sppo = groups["short-cartpole", "sppo"]
    assert (sppo["seeds"], sppo["finished"]) == (2, 1)  # the run without rows is left out
    # final: 0.75 and 1.0 (last 1 of 10 rows; the torn line is skipped) -> s = 0.17678
    assert sppo["tail_success_mean"] == pytest.approx(0.875)
    assert math.isnan(sppo["tail_success_half"])  # two seeds: too few for an interval (MIN_RUNS = 3)
    # seed 0 is at 0.75 from its first update (64); seed 1 raw 0.25, 0.5 (update 2: 128, >= counts),
    # 1.0 (192): 0.9 at 128 + 0.4/0.5 * 64 = 179.2
    assert sppo["episodes_to"]["0.5"] == {"median": 96, "reached": 2, "seeds": 2}  # median(64, 128)
    assert sppo["episodes_to"]["0.9"] == {"median": pytest.approx(179.2), "reached": 1, "seeds": 2}
    assert sppo["wall_time_s"] == 7.5

    single = groups["cartpole", "ppo"]
    assert single["tail_success_mean"] == 0.5 and math.isnan(single["tail_success_half"])

    (cal,) = report["calibration"]
    assert (cal["task"], cal["algo"], cal["runs"], cal["start_states"]) == ("short-cartpole", "sppo", 1, 4)
    assert cal["pearson"] == pytest.approx(PEARSON) and cal["spearman"] == pytest.approx(1.0)
    assert cal["ece"] == pytest.approx(ECE) and cal["brier"] == pytest.approx(BRIER)

    # the curve: on the episode grid, the mean and t-interval of the interpolated smoothed runs
    (c,) = [c for c in report["curves"] if (c["task"], c["algo"]) == ("short-cartpole", "ppo")]
    x = np.array(c["episodes"]["x"])
    assert x[0] == 64 and x[-1] == 1280 and len(x) == 200
    j = int(np.argmin(abs(x - 1280)))  # last point: smoothed 1.0, 0.625, 0.25
    assert c["episodes"]["mean"][j] == pytest.approx(0.625)
    assert c["episodes"]["half"][j] == pytest.approx(4.3027 * 0.375 / math.sqrt(3), rel=1e-4)

    # the t-interval leaves [0, 1] (0.625 ± 0.932): clipped, and said so; sppo's two seeds give none
    assert ppo["tail_success_ci"] == [0.0, 1.0] and ppo["tail_success_clipped"]
    assert all(math.isnan(v) for v in sppo["tail_success_ci"]) and not sppo["tail_success_clipped"]
    assert single["tail_success_clipped"] is False and single["iqm"] == 0.5
    # IQM over 3 seeds drops floor(3/4) = 0: the mean. Its bootstrap over the 27 equally likely resamples
    # of (1.0, 0.625, 0.25): the lowest mean, 0.25 (all three 0.25), has probability 1/27 = 3.7% > 2.5%,
    # so it is the 2.5% quantile; the same for 1.0 at the top
    assert ppo["iqm"] == pytest.approx(0.625) and ppo["iqm_ci"] == [0.25, 1.0]
    # sppo: (0.75, 1.0): a bootstrap of two values says nothing, so no interval
    assert sppo["iqm"] == pytest.approx(0.875) and all(math.isnan(v) for v in sppo["iqm_ci"])
    assert math.isnan(single["iqm_ci"][0])  # one seed: no interval

    # aggregates over both tasks: ppo's four runs 0.5 | 1.0, 0.625, 0.25 -> IQM drops one at each end
    agg = {e["label"]: e for e in report["aggregates"]["control"]["table"]}
    assert agg["ppo"]["tasks"] == ["cartpole", "short-cartpole"] and agg["ppo"]["runs"] == 4
    assert agg["ppo"]["iqm"]["value"] == pytest.approx((0.5 + 0.625) / 2)
    assert agg["ppo"]["mean"]["value"] == pytest.approx(2.375 / 4)
    assert agg["ppo"]["median"]["value"] == pytest.approx((0.5 + 0.625) / 2)
    assert agg["ppo"]["optimality_gap"]["value"] == pytest.approx((0.5 + 0 + 0.375 + 0.75) / 4)
    # cartpole has one run: every resample keeps 0.5 there; short-cartpole's mean moves in [0.25, 1]
    lo, hi = agg["ppo"]["mean"]["ci"]
    assert (0.5 + 3 * 0.25) / 4 <= lo < agg["ppo"]["mean"]["value"] < hi <= (0.5 + 3 * 1.0) / 4

    out = runs / "report"
    md = (out / "report.md").read_text()
    assert (
        "| short-cartpole | ppo | 3 | 0.625 [0.000, 1.000] | 0.625 [0.250, 1.000] | 682 (2/3) | 998 (1/3) "
        "| 10.0 | 4000 |" in md
    )
    assert (
        "| short-cartpole | sppo | 2 (1 unfinished) | 0.875 (n = 2: no interval) | 0.875 (n = 2: no interval) "
        "| 96 (2/2) "
        "| 179 (1/2) | 7.5 | 3840 |" in md
    )
    assert (
        "| cartpole | ppo | 1 | 0.500 (n = 1: no interval) | 0.500 (n = 1: no interval) | 64 (1/1) | — (0/1) "
        "| 5.0 | 3840 |" in md
    )
    assert "t-intervals clipped to [0, 1]" in md and "short-cartpole / ppo." in md
    assert "| ppo | 2 | 4 | 0.562 [" in md
    assert "| short-cartpole | sppo | 1 | 4 | 0.939 | 1.000 | 0.0625 | 0.1656 | 0.0094 |" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved["groups"][0]["tail_success_half"] is None  # NaN is written as null
    assert saved["groups"][1]["episodes_to"] == ppo["episodes_to"]
    names = [
        "success_vs_episodes.png",
        "success_vs_wall_time.png",
        "performance_profile.png",
        "aggregates.png",
    ]
    assert saved["figures"] == names + ["calibration.png"]
    for name in names + ["calibration.png"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_report_command_line(runs, tmp_path):
    out = tmp_path / "elsewhere"
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", "report", str(runs), "--out", str(out), "--smooth", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "| short-cartpole | ppo | 3 | 0.625 [0.000, 1.000] | 0.625 [0.250, 1.000] | 682 (2/3) |"
        in proc.stdout
    )
    assert (out / "report.json").is_file() and not (runs / "report").exists()


def _ramps(root: Path, seeds: int) -> Path:
    """ppo and sppo on one task, seed k: success 0.05 i + 0.04 k at update i = 1..10 (64 episodes each),
    the same per episode for both; ppo's updates take 1 s, sppo's 0.5 s. Each ends where it started
    relative to the other (final 0.5 + 0.04 k for both): only a reading at equal seconds tells them apart."""
    for algo, dt in (("ppo", 1.0), ("sppo", 0.5)):
        for k in range(seeds):
            ys = [0.05 * i + 0.04 * k for i in range(1, 11)]
            write_run(root / algo / f"seed{k}", "short-cartpole", algo, k, ys, seconds_per_update=dt)
    return root


def test_comparisons_follow_the_protocol_at_equal_seconds(tmp_path):
    """By hand (d_k = 0.04 k, k = 0..4). Window: seconds [1, 5] (ppo's first update, sppo's last),
    episodes [64, 640], env steps [1920, 19200]. The primary (the default for control runs): success at
    equal env steps, the same curve for both: 0 in every seed, no spread -> "equivalent within ±0.05"
    (TOST p = 0). Secondary, one Holm family of six: success at 5 s: ppo 0.25 + d_k, sppo 0.5 + d_k:
    -0.25 in every seed, p = 0 -> a difference. Area over [1, 5] = the value at 3 s: 0.15 + d vs 0.3 + d,
    per-seed ratios 0.5, 0.559, 0.605, 0.643, 0.674 (geometric mean 0.593), tested on their logs. Target:
    s0 = mean start 0.05 + 0.08 = 0.13, pooled finals' median 0.58 -> 0.355. Seconds below it (plus the
    window's start 1): ppo crosses at (0.355 - d) / 0.05 = 7.1, 6.3, 5.5 (after 5: 5), 4.7, 3.9; sppo at
    (0.355 - d) / 0.1 = 3.55 ... 1.95. Tail success (each at its own end) is the same for both."""
    report = run_report(ReportConfig(inputs=(str(_ramps(tmp_path / "r", 5)),), bootstrap_reps=500))
    groups = {g["label"]: g for g in report["groups"]}
    assert groups["ppo"]["tail_success_per_seed"] == pytest.approx(groups["sppo"]["tail_success_per_seed"])
    (c,) = report["comparisons"]
    assert (c["world"], c["task"], c["labels"]) == ("control", "short-cartpole", ["ppo", "sppo"])
    assert c["windows"] == {"seconds": [1.0, 5.0], "episodes": [64.0, 640.0], "env_steps": [1920.0, 19200.0]}
    assert c["target"]["value"] == pytest.approx(0.355)
    assert [r["seconds_to_target"] for r in c["runs"]["ppo"].values()] == pytest.approx([5, 5, 5, 4.7, 3.9])
    assert [r["seconds_to_target"] for r in c["runs"]["sppo"].values()] == pytest.approx(
        [3.55, 3.15, 2.75, 2.35, 1.95]
    )
    assert c["primary"] == "acc_at_env_steps"
    p = c["pairs"]["ppo_vs_sppo"]
    e = p["acc_at_env_steps"]
    assert e["role"] == "primary" and e["point"] == pytest.approx(0) and e["tost_p"] == 0
    assert e["verdict"] == "equivalent within ±0.05 (TOST p = 0)"
    s = p["acc_at_seconds"]
    assert s["role"] == "secondary" and s["point"] == pytest.approx(-0.25)
    assert s["interval"] == pytest.approx([-0.25, -0.25]) and s["seeds"] == [0, 1, 2, 3, 4]
    assert s["verdict"] == "difference (Holm p = 0)"  # no spread beyond float rounding
    ratios = [(0.15 + 0.04 * k) / (0.3 + 0.04 * k) for k in range(5)]
    a = p["auc_seconds"]
    assert a["point"] == pytest.approx(math.exp(np.mean(np.log(ratios)))) and a["interval"][1] < 1
    assert a["verdict"].startswith("difference (Holm p = ")
    t = p["seconds_to_target"]
    t_ratios = np.log(np.array([5, 5, 5, 4.7, 3.9]) / np.array([3.55, 3.15, 2.75, 2.35, 1.95]))
    assert t["point"] == pytest.approx(math.exp(t_ratios.mean())) and 1 < t["interval"][0]
    assert sum(row["role"] == "secondary" for row in c["table"]) == 6
    assert p["episodes_to_target"]["point"] == pytest.approx(1)
    assert p["episodes_to_target"]["verdict"] == "equivalent within x/ 1.25 (TOST p = 0)"
    assert c["collapse"]["counts"] == {"ppo": {"n": 0, "of": 5}, "sppo": {"n": 0, "of": 5}}
    md = (tmp_path / "r" / "report" / "report.md").read_text()
    assert "### Comparisons over seeds (control; the comparison protocol)" in md
    assert "Window: 1.0-5.0 training seconds, 64-640 episodes, 1,920-19,200 env steps; target 0.355" in md
    assert "Primary statistic (declared before the runs): success at equal env steps" in md
    row = next(x for x in md.splitlines() if x.startswith("| ppo vs sppo | success at equal wall-clock"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[2:7] == ["5", "0.330 (0.330)", "0.580 (0.580)", "-0.250", "[-0.250, -0.250]"]
    assert cells[-1] == "difference (Holm p = 0)"
    assert "| ppo vs sppo | seconds below target (A / B) | 5 | 4.720 (4.900) | 2.750 (2.750) |" in md
    assert "Collapsed runs (final at 0 or below the run's own start): ppo 0/5, sppo 0/5" in md
    # four seeds: the same difference; the paired test needs no minimum beyond two pairs
    few = run_report(ReportConfig(inputs=(str(_ramps(tmp_path / "four", 4)),), bootstrap_reps=200))
    assert (
        few["comparisons"][0]["pairs"]["ppo_vs_sppo"]["acc_at_seconds"]["verdict"]
        == "difference (Holm p = 0)"
    )


def test_the_declared_primary_and_margin_come_from_the_flags_or_the_sweep(tmp_path):
    """--primary / --margin; else the sweep.json of the first input (sppo-rl sweep --primary --margin)."""
    root = _ramps(tmp_path / "r", 3)
    (root / "sweep.json").write_text(json.dumps({"config": {"primary": "acc_at_seconds", "margin": 0.1}}))
    (c,) = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=100))["comparisons"]
    assert c["primary"] == "acc_at_seconds" and c["design"]["margin"] == 0.1
    cfg = ReportConfig(inputs=(str(root),), bootstrap_reps=100, primary="acc_at_episodes", margin=0.02)
    (c,) = run_report(cfg)["comparisons"]
    assert c["primary"] == "acc_at_episodes" and c["design"]["margin"] == 0.02
    assert c["pairs"]["ppo_vs_sppo"]["acc_at_episodes"]["verdict"] == "equivalent within ±0.02 (TOST p = 0)"
    with pytest.raises(ValueError, match="--primary acc_at_nothing: not a statistic"):
        run_report(ReportConfig(inputs=(str(root),), primary="acc_at_nothing"))
    with pytest.raises(ValueError, match="0 < --margin < 1"):
        run_report(ReportConfig(inputs=(str(root),), margin=0.0))


def test_no_runs_is_an_error(tmp_path):
    with pytest.raises(RunError, match="no such folder"):
        run_report(ReportConfig(inputs=(str(tmp_path / "missing"),)))
    (tmp_path / "empty" / "run").mkdir(parents=True)
    (tmp_path / "empty" / "run" / "metrics.jsonl").write_text("")  # no config.json: not a run
    with pytest.raises(RunError, match="no run with metrics"):
        run_report(ReportConfig(inputs=(str(tmp_path / "empty"),)))
    assert not (tmp_path / "empty" / "report").exists()


def test_every_algorithm_has_its_own_fixed_colour():
    assert set(ALGORITHMS) <= set(PALETTE) and len(set(PALETTE.values())) == len(PALETTE)
    assert colours(["ppo", "zeta", "alpha"])["alpha"] != colours(["ppo", "zeta", "alpha"])["zeta"]
    assert colours(["sppo"])["sppo"] == colours(["ppo", "sppo", "grpo"])["sppo"]


# ------------------------------------------------------------------------------------- groups, LLM, figures


def test_runs_that_differ_in_a_setting_are_separate_groups(tmp_path):
    root = tmp_path / "runs"
    # short-cartpole: sppo at two actor learning rates, two seeds each; bookkeeping differs too (threads,
    # progress, out_dir), which must not split anything
    for lr, ys in ((3e-4, [[0.5] * 10, [0.7] * 10]), (1e-3, [[0.9] * 10, [1.0] * 10])):
        for seed, y in enumerate(ys):
            write_run(
                root / f"sc-lr{lr}" / f"seed{seed}",
                "short-cartpole",
                "sppo",
                seed,
                y,
                config={
                    "actor_lr": lr,
                    "threads": 1 + seed,
                    "progress": bool(seed),
                    # left at its default (None, resolved to 64) or spelled out: the same setting
                    "episodes_per_update": [None, 64][seed],
                    "resolved": {"task": "short-cartpole", "episodes_per_update": 64},
                },
            )
    # cartpole: only the default rate, and a budget of its own (differs between tasks only: no label);
    # four seeds, tail success 0, 0.5, 0.75, 1
    for seed, y in enumerate([0.0, 0.5, 0.75, 1.0]):
        write_run(
            root / "cp" / f"seed{seed}",
            "cartpole",
            "sppo",
            seed,
            [y] * 10,
            config={"total_episodes": 640, "episodes_per_update": 64},
        )
    write_run(root / "ppo", "short-cartpole", "ppo", 0, [0.5] * 10, config={"actor_lr": 1e-3})
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=200))
    got = [(g["task"], g["label"], g["seeds"]) for g in report["groups"]]
    assert got == [
        ("cartpole", "sppo actor_lr=0.0003", 4),
        ("short-cartpole", "ppo", 1),  # ppo's one run: its own rate is no setting to tell apart
        ("short-cartpole", "sppo actor_lr=0.0003", 2),
        ("short-cartpole", "sppo actor_lr=0.001", 2),
    ]
    groups = {(g["task"], g["label"]): g for g in report["groups"]}
    assert groups["short-cartpole", "sppo actor_lr=0.0003"]["tail_success_mean"] == pytest.approx(0.6)
    assert groups["short-cartpole", "sppo actor_lr=0.001"]["tail_success_mean"] == pytest.approx(0.95)
    assert groups["short-cartpole", "sppo actor_lr=0.001"]["settings"] == {"actor_lr": 1e-3}
    # four seeds: the IQM drops one at each end, mean(0.5, 0.75), where the mean is 0.5625
    cp = groups["cartpole", "sppo actor_lr=0.0003"]
    assert cp["iqm"] == 0.625 and cp["tail_success_mean"] == 0.5625
    # aggregates follow the labels across tasks
    agg = {e["label"]: e for e in report["aggregates"]["control"]["table"]}
    assert agg["sppo actor_lr=0.0003"]["tasks"] == ["cartpole", "short-cartpole"]
    assert (
        agg["sppo actor_lr=0.001"]["tasks"] == ["short-cartpole"] and agg["sppo actor_lr=0.001"]["runs"] == 2
    )
    assert {c["label"] for c in report["curves"]} == {"ppo", "sppo actor_lr=0.0003", "sppo actor_lr=0.001"}
    md = (root / "report" / "report.md").read_text()
    assert "| short-cartpole | sppo actor_lr=0.001 | 2 |" in md and "sppo (n=" not in md
    assert "| cartpole | sppo actor_lr=0.0003 | 4 | 0.562 [" in md and "| 0.625 [" in md
    # the same runs and seed give the same numbers (the bootstrap is seeded)
    again = run_report(ReportConfig(inputs=(str(root),), out=str(tmp_path / "again"), bootstrap_reps=200))
    assert again["aggregates"]["control"]["table"][1]["iqm"]["ci"][0] > 0  # an interval, not NaN
    saved = [json.loads((d / "report.json").read_text()) for d in (root / "report", tmp_path / "again")]
    assert saved[0]["aggregates"] == saved[1]["aggregates"] and saved[0]["groups"] == saved[1]["groups"]


def write_llm_run(folder: Path, algo, seed, evals, *, config=None, finished=True):
    """An LLM run folder as the trainer writes it: one row per update (``update`` 1..), 100 generated tokens
    and 2 s per update, ``val_accuracy`` at step 0 (its own row) and at the steps in ``evals``."""
    folder.mkdir(parents=True)
    cfg = {
        "algo": algo,
        "task": "arithmetic",
        "seed": seed,
        "updates": max(evals),
        "prompts_per_step": 8,
        "actor_lr": 1e-4,
        "out_dir": str(folder),
        "cache_dir": "/somewhere",
        **(config or {}),
    }
    (folder / "config.json").write_text(json.dumps({**cfg, "resolved": {"model": "tiny"}}))
    rows = [{"update": 0, "wall_time_s": 0.0, "generated_tokens": 0, "val_accuracy": evals[0]}]
    for step in range(1, max(evals) + 1):
        row = {"update": step, "reward_mean": 0.5, "generated_tokens": 100 * step, "wall_time_s": 2.0 * step}
        if step in evals:
            row["val_accuracy"] = evals[step]
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (folder / "summary.json").write_text("{}")


def test_llm_runs_get_curves_a_table_and_aggregates(tmp_path):
    root = tmp_path / "llm"
    write_llm_run(root / "grpo" / "seed0", "grpo", 0, {0: 0.25, 2: 0.5, 4: 0.75})
    write_llm_run(root / "grpo" / "seed1", "grpo", 1, {0: 0.25, 2: 0.25, 4: 0.5})
    write_llm_run(root / "sppo" / "seed0", "sppo", 0, {0: 0.25, 2: 0.5, 4: 1.0}, config={"device": "cuda"})
    write_llm_run(
        root / "sppo" / "seed1",
        "sppo",
        1,
        {0: 0.25, 2: 0.75, 4: 1.0},
        config={"device": "cpu"},
        finished=False,
    )
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=200, grid_points=5))
    assert report["groups"] == [] and report["figures"] == [
        "llm_val_accuracy.png",
        "performance_profile.png",
        "aggregates.png",
    ]
    (sppo, grpo) = report["llm_groups"]  # the device differs between the sppo seeds: still one group
    assert (grpo["label"], grpo["seeds"], grpo["evaluations"], grpo["updates"]) == ("grpo", 2, 3, 4)
    # tail val accuracy: the last of 3 evaluations (10% of 3, at least one); grpo 0.75 and 0.5
    assert grpo["tail_val_accuracy_per_seed"] == [0.75, 0.5] and grpo["tail_val_accuracy_mean"] == 0.625
    # two seeds: too few for an interval (MIN_RUNS = 3), t or bootstrap
    assert math.isnan(grpo["tail_val_accuracy_half"]) and not grpo["tail_val_accuracy_clipped"]
    assert grpo["iqm"] == 0.625 and all(math.isnan(v) for v in grpo["iqm_ci"] + grpo["tail_val_accuracy_ci"])
    assert (grpo["generated_tokens"], grpo["wall_time_s"], grpo["start_val_accuracy_mean"]) == (
        400,
        8.0,
        0.25,
    )
    assert (sppo["seeds"], sppo["finished"], sppo["iqm"]) == (2, 1, 1.0)
    # curves: on the step grid 0, 1, 2, 3, 4 (grid_points=5) the mean of the two seeds, interpolated
    (c,) = [c for c in report["llm_curves"] if c["label"] == "grpo"]
    assert c["update"]["x"] == [0, 1, 2, 3, 4]
    assert c["update"]["mean"] == pytest.approx([0.25, 0.3125, 0.375, 0.5, 0.625])
    assert c["generated_tokens"]["x"] == [0, 100, 200, 300, 400] and c["wall_time_s"]["x"][-1] == 8.0
    # no band from two seeds
    assert all(math.isnan(v) for v in c["update"]["half"] + c["update"]["lo"] + c["update"]["hi"])
    agg = {e["label"]: e for e in report["aggregates"]["llm"]["table"]}
    assert agg["sppo"]["optimality_gap"]["value"] == 0 and agg["grpo"]["mean"]["value"] == 0.625
    out = root / "report"
    md = (out / "report.md").read_text()
    assert (
        "| arithmetic | grpo | 2 | 3 | 4 | 0.250 | 0.625 (n = 2: no interval) | 0.625 (n = 2: no interval) "
        "| 400 | 8.0 |" in md
    )
    assert "![validation accuracy](llm_val_accuracy.png)" in md and "### Aggregates over tasks (llm" in md
    # the protocol between the labels (sppo before grpo): accuracy at equal tokens (400, the last
    # evaluation of all; the primary, as these runs log no FLOPs) per seed 1.0 - 0.75, 1.0 - 0.5: mean
    # 0.375, sd 0.1768, se 0.125, t = 3 on 1 df: p = 0.205; interval 0.375 -+ 12.706 x 0.125; the null
    # from grpo's two seeds (+-0.25) and sppo's (0): [-0.25, 0.25]
    (c,) = report["comparisons"]
    assert c["world"] == "llm" and c["windows"] == {"seconds": [0.0, 8.0], "tokens": [0.0, 400.0]}
    assert c["primary"] == "acc_at_tokens" and "no flops_total" in c["notes"][-1]
    s = c["pairs"]["sppo_vs_grpo"]["acc_at_tokens"]
    assert s["point"] == pytest.approx(0.375) and s["p"] == pytest.approx(0.2048, abs=1e-4)
    assert s["interval"] == pytest.approx([0.375 - 12.7062 * 0.125, 0.375 + 12.7062 * 0.125], abs=1e-3)
    assert s["null"] == pytest.approx([-0.25, 0.25])
    assert s["verdict"] == f"inconclusive: could not detect differences below {s['mde']:.3f}" and s["mde"] > 1
    assert (
        "| sppo vs grpo | accuracy at equal generated tokens (A - B) | 2 | 1.000 (1.000) | 0.625 (0.625) | +0.375 | "
        in md
    )
    for name in report["figures"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    assert not (out / "success_vs_episodes.png").exists()


def _visible(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def test_six_algorithms_get_one_panel_each_with_the_others_in_grey(tmp_path):
    from matplotlib.colors import to_hex

    from sppo_rl.experiments.report_plots import GREY, plot_curves, plot_profiles
    from sppo_rl.experiments.report_runs import Run, find_runs, styles

    algos = ["ppo", "sppo", "grpo", "rloo", "remax", "reinforce"]
    root = tmp_path / "six"
    for i, algo in enumerate(algos):
        for task in ("short-cartpole", "cartpole"):
            for seed in (0, 1):
                write_run(root / task / algo / f"seed{seed}", task, algo, seed, [0.1 * i + 0.05 * seed] * 10)
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=100, grid_points=10))
    assert (root / "report" / "success_vs_episodes.png").is_file()
    # redraw from the report's numbers: one panel per (task, algorithm), 3 a row
    curves = {(c["task"], c["label"]): c for c in report["curves"]}
    style = styles(find_runs((str(root),), skip=(root / "report").resolve()), algos)
    fig = plot_curves(
        curves, ["cartpole", "short-cartpole"], algos, "episodes", tmp_path / "a.png", "", style
    )
    panels = _visible(fig)
    assert len(panels) == 12 and panels[1].get_title() == "cartpole\nsppo (n=2)"
    lines = panels[1].get_lines()
    coloured = [ln for ln in lines if to_hex(ln.get_color()) != to_hex(GREY)]
    assert len(lines) == 6 and [to_hex(ln.get_color()) for ln in coloured] == [PALETTE["sppo"]]
    # up to --max-overlay algorithms: one panel per task with all of them in colour
    fig = plot_curves(
        curves, ["cartpole", "short-cartpole"], algos[:4], "episodes", tmp_path / "b.png", "", style
    )
    assert len(_visible(fig)) == 2 and len(_visible(fig)[0].get_lines()) == 4
    fig = plot_curves(curves, ["cartpole"], algos, "episodes", tmp_path / "c.png", "", style, max_overlay=6)
    assert len(_visible(fig)) == 1
    # the performance profile follows the same rule
    fig = plot_profiles(report["aggregates"], tmp_path / "p.png", style)
    assert len(_visible(fig)) == 6
    # two settings of one algorithm: its colour in two shades and two line styles
    style2 = styles(
        [Run(Path("."), "t", "sppo", 0, True, {}, [], None, label=lb) for lb in ("sppo a=1", "sppo a=2")],
        ["sppo a=1", "sppo a=2"],
    )
    assert style2["sppo a=1"] == (PALETTE["sppo"], "-") and style2["sppo a=2"][1] == "--"
    assert style2["sppo a=2"][0] != PALETTE["sppo"]


# ------------------------------------------------------------------------------------- figure layout


def _layout_runs(root: Path) -> Path:
    """Control runs of 20, 14 and 8 updates (the seeds end at 10, 7 and 4 s), one SPPO run with a
    calibration, critic traces of both kinds; two LLM runs with validation at steps 0-3 and one without."""
    from sppo_rl.runtime.trace import write_trace

    rng = np.random.default_rng(0)
    cal = {"predicted": P, "empirical": Y, "samples": M}
    for algo in ("ppo", "sppo"):
        for seed, n in enumerate((20, 14, 8)):
            f = root / "short-cartpole" / algo / f"seed{seed}"
            write_run(f, "short-cartpole", algo, seed, list(np.linspace(0, 0.9, n)),
                      calibration=cal if algo == "sppo" else None)  # fmt: skip
            lengths, success = rng.integers(5, 31, 32), (rng.uniform(size=32) < 0.5).astype(float)
            values = rng.uniform(0, 1, (32, 30)) if algo == "ppo" else rng.uniform(0, 1, 32)
            write_trace(f / "critic_trace.npz", values, lengths, success, 30)
    for seed in (0, 1):
        write_llm_run(root / "llm" / "grpo" / f"seed{seed}", "grpo", seed, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4})
    f = root / "llm" / "sppo" / "seed0"  # an LLM run without validation (--eval-every 0)
    f.mkdir(parents=True)
    (f / "config.json").write_text(
        json.dumps({"algo": "sppo", "task": "arithmetic", "seed": 0, "prompts_per_step": 8})
    )
    (f / "metrics.jsonl").write_text(
        "".join(json.dumps({"update": s, "reward_mean": 0.5}) + "\n" for s in (1, 2))
    )
    return root


def _titles_inside(fig) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [fig._suptitle] + [ax.title for ax in fig.axes if ax.get_visible()]
    for t in texts:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (t.get_text(), box, fig.bbox.width)


@pytest.fixture
def layout(tmp_path):
    from sppo_rl.experiments.report_runs import find_runs, label_order, styles

    root = _layout_runs(tmp_path / "runs")
    report = run_report(ReportConfig(inputs=(str(root / "short-cartpole"),), out=str(tmp_path / "ctl"),
                                     bootstrap_reps=50))  # fmt: skip
    runs = find_runs((str(root),))
    return root, report, styles(runs, label_order(runs)), tmp_path


def test_single_world_profile_and_tail_effect_titles_fit_the_figure(layout):
    from sppo_rl.experiments import tail
    from sppo_rl.experiments.report_plots import plot_profiles

    _, report, style, tmp = layout
    _titles_inside(plot_profiles(report["aggregates"], tmp / "p.png", style))  # one world: 5.2 in wide
    _titles_inside(tail.plot(report["tail_effect"], tmp / "t.png", {lb: c for lb, (c, _) in style.items()}))


def test_wall_time_mean_is_drawn_solid_only_where_every_seed_has_data(layout):
    from sppo_rl.experiments.report_numbers import curve
    from sppo_rl.experiments.report_plots import X_AXES, plot_curves
    from sppo_rl.experiments.report_runs import find_runs

    root, _, style, tmp = layout
    members = [r for r in find_runs((str(root / "short-cartpole"),)) if r.algo == "ppo"]
    c = curve(members, "wall_time_s", ReportConfig(inputs=("x",)))
    assert max(c["x"]) == 10.0 and c["n"][-1] == 1  # the 20-update seed runs alone after 4 s
    curves = {("short-cartpole", "ppo"): {x: curve(members, x, ReportConfig(inputs=("x",))) for x in X_AXES}}
    fig = plot_curves(curves, ["short-cartpole"], ["ppo"], "wall_time_s", tmp / "w.png", "note", style)
    ax = fig.axes[0]
    solid = next(line for line in ax.get_lines() if line.get_linewidth() == 1.6)
    x, y = np.asarray(solid.get_xdata()), np.asarray(solid.get_ydata(), dtype=float)
    assert np.isnan(y[x > 4.0 + 1e-9]).all() and not np.isnan(y[x < 4.0]).any()  # ended with the first seed
    assert "dotted: fewer seeds" in ax.get_legend().get_texts()[0].get_text()
    _titles_inside(fig)


def test_update_ticks_are_whole_numbers(layout):
    from sppo_rl.experiments.report_numbers import curve
    from sppo_rl.experiments.report_plots import LLM_X_AXES, plot_llm_curves
    from sppo_rl.experiments.report_runs import find_runs

    root, _, style, tmp = layout
    members = [r for r in find_runs((str(root / "llm"),)) if r.rows]
    cfg = ReportConfig(inputs=("x",))
    curves = {
        ("arithmetic", "grpo"): {x: curve(members, x, cfg, "val_accuracy", smooth=1) for x in LLM_X_AXES}
    }
    fig = plot_llm_curves(curves, ["arithmetic"], ["grpo"], tmp / "l.png", "note", style)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    updates, tokens = fig.axes[0], fig.axes[1]
    visible = lambda ax: [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]  # noqa: E731
    assert visible(updates) == [0, 1, 2, 3]  # the old ticks: 0, 0.8, 1.6, 2.4
    assert all(float(t).is_integer() for t in visible(tokens))


def test_calibration_legend_marker_is_of_ordinary_size(layout):
    from matplotlib.lines import Line2D

    from sppo_rl.experiments.report_numbers import calibration_numbers
    from sppo_rl.experiments.report_plots import plot_reliability
    from sppo_rl.experiments.report_runs import find_runs

    root, _, style, tmp = layout
    runs = [r for r in find_runs((str(root / "short-cartpole"),)) if r.calibration]
    cal = {("short-cartpole", "sppo"): calibration_numbers(runs, 10)}
    fig = plot_reliability(cal, ["short-cartpole"], ["sppo"], tmp / "c.png", 10, style)
    (handle,) = fig.axes[0].get_legend().legend_handles
    assert isinstance(handle, Line2D) and handle.get_markersize() == 5  # was the largest bin's circle


def test_report_says_which_runs_it_left_out(layout, capsys):
    root, _, _, tmp = layout
    report = run_report(ReportConfig(inputs=(str(root / "llm"),), out=str(tmp / "llm"), bootstrap_reps=50))
    assert [(g["algo"], g["seeds"]) for g in report["llm_groups"]] == [("grpo", 2)]
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("report: left out")]
    assert err == [
        "report: left out of the figures and tables, 1 run(s) that logged updates but no val_accuracy (no "
        f"validation: --eval-every 0?): {(root / 'llm' / 'sppo' / 'seed0').resolve()}"
    ]


def test_a_run_without_training_seconds_leaves_its_task_out_of_the_comparisons_and_says_so(tmp_path):
    root = tmp_path / "llm"
    for algo in ("sppo", "grpo"):
        write_llm_run(root / algo / "seed0", algo, 0, {0: 0.25, 2: 0.5, 4: 0.75})
    path = root / "grpo" / "seed0" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "wall_time_s"}) + "\n" for r in rows)
    )
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=50))
    (c,) = report["comparisons"]
    assert "pairs" not in c and str(root / "grpo" / "seed0") in c["skipped"]
    md = (root / "report" / "report.md").read_text()
    assert "no comparison: axes seconds, tokens not finite and increasing in " in md


def test_collapses_are_counted_per_task_and_pooled_with_fisher_s_exact_test(tmp_path):
    """Two tasks, 3 seeds a side: ppo ends at 0 in 2 of 3 seeds on each, sppo never. Per task 2/3 vs
    0/3 (Fisher p = 0.4); pooled 4/6 vs 0/6: the tables with all 4 in one row, C(6, 4) / C(12, 4) = 15 /
    495, both tails: p = 0.0606."""
    root = tmp_path / "r"
    for task in ("short-cartpole", "precision-cartpole"):
        for k in range(3):
            write_run(root / task / "ppo" / f"seed{k}", task, "ppo", k, [0.1, 0.3, 0.0 if k < 2 else 0.6])
            write_run(root / task / "sppo" / f"seed{k}", task, "sppo", k, [0.1, 0.4, 0.7 + 0.01 * k])
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=100))
    for c in report["comparisons"]:
        assert c["collapse"]["counts"] == {"ppo": {"n": 2, "of": 3}, "sppo": {"n": 0, "of": 3}}
        assert c["collapse"]["fisher_p"]["ppo_vs_sppo"] == pytest.approx(0.4)
    md = (root / "report" / "report.md").read_text()
    assert (
        "Collapsed runs pooled over the 2 tasks: ppo 4/6, sppo 0/6; Fisher's exact test: ppo vs sppo p = 0.061."
        in md
    )
    assert 2 * 15 / 495 == pytest.approx(0.0606, abs=1e-4)


def test_llm_runs_on_the_same_data_are_one_task_whatever_the_file(tmp_path):
    """The same examples as ``.parquet`` and ``.jsonl`` (another name too) are one task, named after the
    first file, so its algorithms are compared; other content is another task."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    records = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(5)]
    pq.write_table(pa.Table.from_pylist(records), data / "sums.parquet")
    (data / "sums-copy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (data / "other.jsonl").write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    root = tmp_path / "runs"
    for seed, (algo, file) in enumerate([("grpo", "sums.parquet"), ("grpo", "sums-copy.jsonl"),
                                         ("sppo", "sums-copy.jsonl"), ("sppo", "other.jsonl")]):  # fmt: skip
        task = str(data / file)
        write_llm_run(root / f"r{seed}", algo, seed, {0: 0.25, 2: 0.5}, config={"task": task})
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=50, grid_points=5))
    tasks = {(g["task"], g["label"], g["seeds"]) for g in report["llm_groups"]}
    # named after the first file by path ("sums-copy.jsonl" sorts before "sums.parquet")
    assert tasks == {("sums-copy", "grpo", 2), ("sums-copy", "sppo", 1), ("other", "sppo", 1)}
    assert [c["task"] for c in report["comparisons"]] == ["sums-copy"]


def _segments_cross_a_count_change(ax, c) -> list[float]:
    """The x of every drawn segment whose two ends have different seed counts ``c["n"]``."""
    x, n = np.asarray(c["x"]), np.asarray(c["n"])
    bad = []
    for line in ax.get_lines():
        lx, ly = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
        if len(lx) < 2:
            continue
        i = np.searchsorted(x, lx)
        for k in range(len(lx) - 1):
            if np.isfinite(ly[k]) and np.isfinite(ly[k + 1]) and n[i[k]] != n[i[k + 1]]:
                bad.append(float(lx[k]))
    return bad


def test_a_seeds_end_draws_no_drop_and_the_count_change_is_marked(layout):
    """Seeds ending at 4 and 7 s: no drawn segment joins points over different numbers of seeds (that
    segment is the false "collapse"), and each later piece is marked n=2, n=1."""
    from sppo_rl.experiments.report_numbers import curve
    from sppo_rl.experiments.report_plots import X_AXES, plot_curves
    from sppo_rl.experiments.report_runs import find_runs

    root, _, style, tmp = layout
    members = [r for r in find_runs((str(root / "short-cartpole"),)) if r.algo == "ppo"]
    curves = {("short-cartpole", "ppo"): {x: curve(members, x, ReportConfig(inputs=("x",))) for x in X_AXES}}
    fig = plot_curves(curves, ["short-cartpole"], ["ppo"], "wall_time_s", tmp / "w.png", "note", style)
    ax = fig.axes[0]
    assert _segments_cross_a_count_change(ax, curves["short-cartpole", "ppo"]["wall_time_s"]) == []
    assert sorted(t.get_text() for t in ax.texts) == ["n=1", "n=2"]


def test_figures_are_print_sized_with_short_titles_and_the_method_in_the_caption(layout):
    """Every PNG 6.5 in wide at 200 dpi (1300 px); titles of a few words; the method under each figure
    in report.md."""
    import struct

    from sppo_rl.experiments.report_plots import plot_curves

    _, report, style, tmp = layout
    out = tmp / "ctl"
    md = (out / "report.md").read_text()
    for name in report["figures"]:
        head = (out / name).read_bytes()[:24]
        if name.startswith("tail"):  # the tail diagnostic's own figure
            continue
        assert struct.unpack(">I", head[16:20])[0] == 1300, name
        assert report["captions"].get(name) and f"*{report['captions'][name]}*" in md, name
    assert "95% t-intervals" in report["captions"]["success_vs_episodes.png"]
    fig = plot_curves({}, ["short-cartpole"], [], "episodes", tmp / "e.png", "a long method note", style)
    assert fig._suptitle.get_text() == "success rate vs episodes"


@pytest.mark.parametrize(
    "key, value, shown",
    [("wall_time_s", math.nan, "wall_time_s is nan"), ("success_rate", [1, 2], "success_rate is [1, 2]"),
     ("episodes", "64", "episodes is '64'")],
    ids=["nan", "list", "string"],
)  # fmt: skip
def test_a_run_with_a_value_that_is_no_number_is_named_and_skipped_the_rest_reported(
    tmp_path, capsys, key, value, shown
):
    """A metrics value the report reads as a number that is NaN, a list or a string used to stop the
    whole report with numpy's message, naming no file; the run is now left out with one line on stderr
    naming its file and row, and the report is made from the others."""
    from sppo_rl.cli import main

    root = _ramps(tmp_path / "r", 5)
    metrics = root / "sppo" / "seed4" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[2][key] = value
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))  # NaN as json.dumps writes it
    capsys.readouterr()
    main(["report", str(root), "--bootstrap-reps", "100"])
    err = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert err == [f"report: skipped {metrics}: row 3: {shown}, not a finite number"]
    report = json.loads((root / "report" / "report.json").read_text())
    seeds = {g["label"]: g["seeds"] for g in report["groups"]}
    assert seeds == {"ppo": 5, "sppo": 4}
