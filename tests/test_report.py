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

from sppo_rl.agents import ALGORITHMS
from sppo_rl.experiments import stats
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report import PALETTE, colours, run_report
from sppo_rl.runtime import RunError

# ------------------------------------------------------------------------------------- statistics


def test_t_interval():
    mean, half = stats.t_interval([1, 2, 3])  # s = 1
    assert mean == 2 and half == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    mean, half = stats.t_interval([1, 2, 3, 4, 5, math.nan])  # NaN dropped; s = sqrt(2.5)
    assert mean == 3 and half == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-4)
    mean, half = stats.t_interval([0.75])
    assert mean == 0.75 and math.isnan(half)
    assert all(math.isnan(v) for v in stats.t_interval([]))


def test_trailing_mean_interpolate_crossing_tail():
    assert stats.trailing_mean([1, 2, 3, 4, 5], 3).tolist() == [1, 1.5, 2, 3, 4]
    assert stats.trailing_mean([1, 2, 3], 1).tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        stats.trailing_mean([1], 0)
    got = stats.interpolate([0, 10], [0, 1], [-1, 0, 2.5, 10, 11])
    assert np.isnan(got[[0, 4]]).all() and got[1:4].tolist() == [0, 0.25, 1]
    assert stats.first_crossing([64, 128, 192], [0.2, 0.5, 0.9], 0.5) == 128  # >= counts
    assert stats.first_crossing([64, 128, 192], [0.2, 0.5, 0.9], 0.95) is None
    assert stats.tail_mean(range(1, 21), 0.1) == 19.5  # last 2 of 20
    assert stats.tail_mean(range(1, 31), 0.1) == 29  # last 3 of 30 (0.1 * 30 is 3.0000000000000004 in floats)
    assert stats.tail_mean([4, 5], 0.1) == 5  # at least one
    assert math.isnan(stats.tail_mean([], 0.1))


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


# ------------------------------------------------------------------------------------- report


def write_run(folder: Path, task, algo, seed, success, *, sps=3840.0, finished=True, calibration=None):
    """A run folder as the control trainer writes it: 64 episodes of 30 steps per update, 0.5 s each."""
    folder.mkdir(parents=True)
    cfg = {"algo": algo, "task": task, "seed": seed, "total_episodes": 1280, "resolved": {"task": task}}
    (folder / "config.json").write_text(json.dumps(cfg))
    rows = [
        {
            "update": i,
            "episodes": 64 * i,
            "env_steps": 1920 * i,
            "success_rate": y,
            "wall_time_s": 0.5 * i,
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
    assert ppo["final_success_per_seed"] == [1.0, 0.625, 0.25]
    assert ppo["final_success_mean"] == pytest.approx(0.625)
    assert ppo["final_success_half"] == pytest.approx(4.3027 * 0.375 / math.sqrt(3), rel=1e-4)
    # smoothed over 3: seed 0 reaches 0.5 at update 12 (0.583), 0.9 at 17 (0.917); seed 1 0.5 at 13
    assert ppo["episodes_to"]["0.5"] == {"median": 800, "reached": 2, "seeds": 3}  # median(768, 832)
    assert ppo["episodes_to"]["0.9"] == {"median": 1088, "reached": 1, "seeds": 3}
    assert ppo["wall_time_s"] == 10.0 and ppo["sps"] == 4000.0

    sppo = groups["short-cartpole", "sppo"]
    assert (sppo["seeds"], sppo["finished"]) == (2, 1)  # the run without rows is left out
    # final: 0.75 and 1.0 (last 1 of 10 rows; the torn line is skipped) -> s = 0.17678
    assert sppo["final_success_mean"] == pytest.approx(0.875)
    assert sppo["final_success_half"] == pytest.approx(12.7062 * 0.176777 / math.sqrt(2), rel=1e-4)
    # seed 1 smoothed: 0.25, 0.375, 0.583 (update 3), 0.833, 1.0 (update 5)
    assert sppo["episodes_to"]["0.5"] == {"median": 128, "reached": 2, "seeds": 2}  # median(64, 192)
    assert sppo["episodes_to"]["0.9"] == {"median": 320, "reached": 1, "seeds": 2}
    assert sppo["wall_time_s"] == 7.5

    single = groups["cartpole", "ppo"]
    assert single["final_success_mean"] == 0.5 and math.isnan(single["final_success_half"])

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

    out = runs / "report"
    md = (out / "report.md").read_text()
    assert "| short-cartpole | ppo | 3 | 0.625 ± 0.932 | 800 (2/3) | 1088 (1/3) | 10.0 | 4000 |" in md
    assert (
        "| short-cartpole | sppo | 2 (1 unfinished) | 0.875 ± 1.588 | 128 (2/2) | 320 (1/2) | 7.5 | 3840 |"
        in md
    )
    assert "| cartpole | ppo | 1 | 0.500 | 64 (1/1) | — (0/1) | 5.0 | 3840 |" in md
    assert "| short-cartpole | sppo | 1 | 4 | 0.939 | 1.000 | 0.0625 | 0.1656 | 0.0094 |" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved["groups"][0]["final_success_half"] is None  # NaN is written as null
    assert saved["groups"][1]["episodes_to"] == ppo["episodes_to"]
    for name in ("success_vs_episodes.png", "success_vs_wall_time.png", "calibration.png"):
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
    assert "| short-cartpole | ppo | 3 | 0.625 ± 0.932 | 800 (2/3) |" in proc.stdout
    assert (out / "report.json").is_file() and not (runs / "report").exists()


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
