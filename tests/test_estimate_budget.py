"""scripts/estimate_budget.py: the late-training cost per episode of hand-made runs, the core-hours
worked by hand, the fallback for an algorithm not measured, and bad input refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import script_module


@pytest.fixture(scope="module")
def est():
    with script_module("estimate_budget") as module:
        yield module


def _run(folder: Path, task: str, algo: str, seconds: list[float], per_update: int = 10) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"task": task, "algo": algo, "seed": 0}))
    rows = [
        {"update": i + 1, "episodes": (i + 1) * per_update, "wall_time_s": w} for i, w in enumerate(seconds)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_late_cost_is_taken_over_the_last_updates_only(est):
    # 8 updates of 10 episodes: 1 s each for the first six, 3 s each for the last two (longer episodes)
    rows = [{"episodes": 10 * (i + 1), "wall_time_s": w} for i, w in enumerate([1, 2, 3, 4, 5, 6, 9, 12])]
    # tail 0.25: from row int(8 * 0.75) = 6 (w 9, e 70) to row 7 (w 12, e 80): 0.3 s per episode
    assert est.episode_cost(rows, 0.25) == pytest.approx(0.3)
    # the whole run: (12 - 1) / 70
    assert est.episode_cost(rows, 1.0) == pytest.approx(11 / 70)
    assert est.episode_cost(rows[:1], 0.25) is None


def test_core_hours_by_hand_and_the_fallback(est, tmp_path, capsys):
    _run(tmp_path / "a" / "hopper" / "ppo" / "seed0", "hopper", "ppo", [1, 2, 3, 4])  # 0.1 s / episode
    _run(tmp_path / "a" / "hopper" / "ppo" / "seed1", "hopper", "ppo", [3, 6, 9, 12])  # 0.3
    _run(tmp_path / "a" / "hopper" / "sppo" / "seed0", "hopper", "sppo", [2, 4, 6, 8])  # 0.2
    est.main([str(tmp_path / "a"), "--budgets", "hopper=36000", "--algos", "ppo", "sppo", "grpo"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["algo"]: r for r in report["rows"]}
    # ppo: mean 0.2 s x 36,000 episodes x 3 seeds = 21,600 s = 6 h; at the slowest run (0.3): 9 h
    assert rows["ppo"]["core_hours"] == pytest.approx(6.0) and rows["ppo"]["core_hours_max"] == pytest.approx(
        9.0
    )
    assert rows["sppo"]["core_hours"] == pytest.approx(6.0) and rows["sppo"]["runs"] == 1
    # grpo was not measured: the mean over ppo (0.2) and sppo (0.2), not counted as measured
    assert not rows["grpo"]["measured"] and rows["grpo"]["core_hours"] == pytest.approx(6.0)
    assert report["core_hours"] == pytest.approx(18.0)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--budgets", "hopper=0"], "TASK=EPISODES"),
        (["--budgets", "walker2d=100"], "no finished run of task 'walker2d'"),
        (["--budgets", "hopper=10", "--tail", "0"], "--tail"),
    ],
)
def test_bad_input_is_one_line_exit_2(est, tmp_path, capsys, argv, words):
    _run(tmp_path / "r", "hopper", "ppo", [1, 2, 3, 4])
    with pytest.raises(SystemExit) as e:
        est.main([str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and words in err
    with pytest.raises(SystemExit):
        est.main([str(tmp_path / "missing"), "--budgets", "hopper=10"])
    assert "no such folder" in capsys.readouterr().err


def test_a_multi_seed_runs_seeds_share_its_seconds_and_its_own_folder_is_not_a_run(est, tmp_path):
    """A batched sweep's (task, algo) folder holds the multi-seed run (its summary lists the seeds'),
    whose seconds its seeds share: each seed's cost is the set's over the seed count, and the set's own
    folder (the seeds' mean) is not counted as a run."""
    folder = tmp_path / "hopper" / "ppo"
    _run(folder / "seed0", "hopper", "ppo", [2, 4, 6, 8])  # 0.2 s / episode for both seeds together
    _run(folder / "seed1", "hopper", "ppo", [2, 4, 6, 8])
    (folder / "summary.json").write_text(
        json.dumps({"task": "hopper", "algo": "ppo", "seeds": [0, 1], "seed_summaries": [{}, {}]})
    )
    (folder / "metrics.jsonl").write_text((folder / "seed0" / "metrics.jsonl").read_text())
    runs = est.find_runs([tmp_path])
    assert [p.name for p, _ in runs] == ["seed0", "seed1"]
    assert est.costs(runs, 0.5) == {("hopper", "ppo"): [pytest.approx(0.1), pytest.approx(0.1)]}
