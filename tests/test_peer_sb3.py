"""scripts/peer_sb3.py: SB3's PPO starts from exactly our warm-start policy, success is read per episode
from the env's flag, SB3's episode stream becomes update rows as ours logs, the first-reach and summary
numbers follow the report's definitions (its crossing on the raw curve) on hand-worked runs, bad input is refused before any file is
written, and a short run on PrecisionCartPole goes end to end beside our PPO."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from paths import script_module

from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report_runs import Run, find_runs

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "peer_sb3.py"


@pytest.fixture(scope="module")
def peer():
    with script_module("peer_sb3") as module:
        yield module


# ------------------------------------------------------------------------------------- the warm start


@pytest.mark.parametrize("task", ["precision-cartpole", "hopper"])
def test_sb3_policy_is_our_warm_start(peer, task):
    """On observations spread around the warm start's normalisation statistics, SB3's action distribution
    equals our actor's: the same probabilities (discrete) or the same mean and std (continuous). A folding
    that forgot the bias shift ``-W mu / sd`` or the scaling ``1 / sd`` moves the logits by O(1)."""
    from sppo_rl.control.actor_files import WARMSTART_DIR, load_actor_file

    actor = load_actor_file(WARMSTART_DIR / f"{task}.pt")
    model = peer.make_sb3(peer.sb3_settings(task, seed=0, budget=64, n_steps=8))
    mu = actor.norm.mean.float()
    sd = torch.sqrt(actor.norm.var + 1e-8).float()
    obs = mu + 2 * sd * torch.randn(256, len(mu), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = actor(obs)
        dist = model.policy.get_distribution(obs).distribution
        if actor.discrete:
            assert torch.allclose(dist.probs, torch.softmax(ours, -1), atol=1e-5)
            assert (dist.probs - 0.5).abs().max() > 0.05  # the check has teeth: not a uniform policy
        else:
            assert torch.allclose(dist.mean, ours, atol=1e-5)
            assert torch.allclose(dist.stddev, torch.exp(actor.log_std).expand_as(ours), atol=1e-6)
    model.get_env().close()


# ------------------------------------------------------------------------------------- success per episode


def test_episode_outcomes_read_the_success_flag_of_ended_envs(peer):
    dones = np.array([False, True, False, True, True])
    infos = [
        {},  # running: no flag needed
        {"success": True, "episode": {"r": 1.0}},
        {"success": True},  # running: its flag (if any) is not an episode end
        {"success": np.bool_(False)},
        {"success": False, "terminal_observation": np.zeros(3)},
    ]
    assert peer.episode_outcomes(dones, infos) == [1.0, 0.0, 0.0]
    assert peer.episode_outcomes(np.zeros(5, dtype=bool), infos) == []


@pytest.mark.parametrize("flag", [None, 1, 1.0, "True"])
def test_an_ended_episode_without_a_boolean_flag_is_refused(peer, flag):
    infos = [{"success": True}, {} if flag is None else {"success": flag}]
    with pytest.raises(ValueError, match="env 1 ended an episode without a boolean 'success'"):
        peer.episode_outcomes([True, True], infos)


def test_update_rows_cut_the_episode_stream_into_blocks(peer):
    success = [1, 0, 0, 1, 1, 1, 1, 0, 1, 1]
    wall = [0.5, 0.5, 1.0, 2.0, 2.5, 3.0, 3.0, 4.0, 4.5, 5.0]
    steps = [10, 10, 20, 40, 50, 60, 60, 80, 90, 100]
    rows = peer.update_rows(success, wall, steps, per_update=4)
    assert len(rows) == 2  # the trailing 2 episodes are not a whole update
    assert rows[0] == {
        "update": 1,
        "episodes": 4,
        "env_steps": 40,
        "success_rate": 0.5,
        "wall_time_s": 2.0,
        "sps": 20.0,
    }
    assert rows[1]["episodes"] == 8 and rows[1]["success_rate"] == 0.75
    assert rows[1]["wall_time_s"] == 4.0 and rows[1]["env_steps"] == 80 and rows[1]["sps"] == 20.0


# ------------------------------------------------------------------------------------- first reach, summary


def _run(seed: int, success: list[float], wall: list[float]) -> Run:
    rows = [
        {"episodes": 4 * (i + 1), "success_rate": s, "wall_time_s": w, "sps": 1.0}
        for i, (s, w) in enumerate(zip(success, wall))
    ]
    return Run(Path(f"r{seed}"), "t", "ppo", seed, True, {}, rows, None, label="ppo")


def test_first_reach_and_group_summary_by_hand(peer):
    """The report's crossing (protocol.crossing, straight lines between raw rows), not a smoothed first
    row. Seed 0: raw 0, .5, 1, 1 at episodes 4, 8, 12, 16 (1-4 s): 0.5 is reached at row 1 itself ->
    episode 8 (2 s); 0.9 between rows 1 and 2: 8 + (0.9 - 0.5) / (1 - 0.5) * 4 = 11.2 episodes,
    2 + 0.8 * 1 = 2.8 s. The old rule (first row of a trailing mean over 2: 0, .25, .75, 1) said 12 and 16
    episodes (3 and 4 s). Seed 1: raw .5 throughout (2-8 s): 0.5 at its first row, episode 4 (2 s), never
    0.9. Tail success (last half of the rows): 1.0 and 0.5 -> mean 0.75, and no interval from two seeds
    (the t half-width would be 12.706 * 0.3536 / 1.414 = 3.18). Seconds per 1,000 episodes: 4/16 and 8/16
    s per episode -> 250 and 500, mean 375."""
    cfg = ReportConfig(inputs=("x",), tail_frac=0.5)
    a = peer.run_summary(_run(0, [0.0, 0.5, 1.0, 1.0], [1, 2, 3, 4]), cfg)
    b = peer.run_summary(_run(1, [0.5] * 4, [2, 4, 6, 8]), cfg)
    assert a["episodes_to"] == {"0.5": 8.0, "0.9": pytest.approx(11.2)}
    assert a["wall_to"] == {"0.5": 2.0, "0.9": pytest.approx(2.8)}
    assert b["episodes_to"] == {"0.5": 4.0, "0.9": None} and b["wall_to"] == {"0.5": 2.0, "0.9": None}
    assert (a["tail_success"], b["tail_success"]) == (1.0, 0.5)
    assert (a["s_per_1k_episodes"], b["s_per_1k_episodes"]) == (250.0, 500.0)

    g = peer.group_summary([a, b], cfg)
    assert g["episodes_to"]["0.5"] == {"median": 6.0, "min": 4.0, "max": 8.0, "reached": 2, "seeds": 2}
    assert (
        g["episodes_to"]["0.9"]["median"] == pytest.approx(11.2) and g["episodes_to"]["0.9"]["reached"] == 1
    )
    assert g["wall_to"]["0.9"]["median"] == pytest.approx(2.8) and g["wall_to"]["0.9"]["reached"] == 1
    assert g["tail_success_mean"] == 0.75
    assert math.isnan(
        g["tail_success_half"]
    )  # two seeds: fewer runs than an interval needs (report.MIN_RUNS)
    assert g["s_per_1k_episodes"] == 375.0

    row = peer.markdown([g], cfg).splitlines()[2]
    assert row == "| t | ppo | 2 | 16 | 6 [4-8] (2/2) | 11 (1/2) | 2.8 (1/2) | 0.75 | 375.0 |"


def test_crossings_are_the_reports_on_the_same_run(peer):
    """One definition: the script's episodes to x are exactly ``sppo-rl report``'s on the same run, and its
    seconds to x the same crossing on wall_time_s. Raw 0.2, 0.95, 0.3, 0.3, 1 at episodes 4-20 (1-5 s):
    the raw curve first reaches 0.9 between rows 0 and 1, at 4 + 0.7 / 0.75 * 4 = 7.73 episodes
    (1 + 0.7 / 0.75 = 1.93 s), and 0.5 at 4 + 0.3 / 0.75 * 4 = 5.6; a trailing mean over 5 rows (0.2,
    0.575, 0.483, 0.438, 0.55) never reaches 0.9 and reaches 0.5 only at row 1 (8 episodes)."""
    from sppo_rl.experiments.report_numbers import run_numbers

    run = _run(0, [0.2, 0.95, 0.3, 0.3, 1.0], [1, 2, 3, 4, 5])
    cfg = ReportConfig(inputs=("x",))
    mine = peer.run_summary(run, cfg)
    assert mine["episodes_to"] == run_numbers(run, cfg)["episodes_to"]
    assert mine["episodes_to"]["0.9"] == pytest.approx(4 + 0.7 / 0.75 * 4)
    assert mine["wall_to"]["0.9"] == pytest.approx(1 + 0.7 / 0.75)
    assert mine["episodes_to"]["0.5"] == pytest.approx(5.6)
    assert mine["wall_to"]["0.5"] == pytest.approx(1.4)


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--tasks", "no-such-task", "--budgets", "no-such-task=64"], "--tasks: unknown task 'no-such-task'"),
        (["--tasks", "hopper"], "--budgets: no budget for hopper"),
        (["--tasks", "hopper", "--budgets", "hopper=7"], "less than one update (8 episodes)"),
        (["--tasks", "hopper", "--budgets", "hopper=8", "cartpole=64"], "cartpole not in --tasks"),
        (["--tasks", "hopper", "--budgets", "hopper=lots"], "expected TASK=EPISODES"),
        (["--tasks", "hopper", "--budgets", "hopper=8", "--seeds", "0", "0"], "--seeds: distinct"),
        (
            ["--tasks", "hopper", "--budgets", "hopper=8", "--algos", "ppo", "nope"],
            "unknown algorithm 'nope'",
        ),
        (["--tasks", "hopper", "--budgets", "hopper=8", "--ours", "/no/such/dir"], "--ours: /no/such/dir"),
        (["--tasks", "hopper", "--budgets", "hopper=8", "--skip-sb3"], "--skip-sb3 leaves nothing"),
        (["--tasks", "hopper", "--budgets", "hopper=8", "--smooth", "5"], "--smooth was removed"),
        (["--tasks", "hopper", "--budgets", "hopper=8", "--overrides", "epochs=2"], "to --run-ours only"),
        (
            ["--tasks", "hopper", "--budgets", "hopper=8", "--run-ours", "--overrides", "nope=1"],
            "--overrides nope: not a control setting",
        ),
        (
            ["--tasks", "hopper", "--budgets", "hopper=8", "--run-ours", "--overrides", "seed=3"],
            "--overrides seed: set by the sweep itself",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(peer, tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        peer.main([*argv, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and err.startswith("peer_sb3.py: error: ") and "\n" not in err
    assert not out.exists()


def test_ours_without_matching_runs_is_refused(peer, tmp_path, capsys):
    empty, out = tmp_path / "empty", tmp_path / "out"
    empty.mkdir()
    argv = [
        "--tasks",
        "hopper",
        "--budgets",
        "hopper=8",
        "--skip-sb3",
        "--ours",
        str(empty),
        "--out",
        str(out),
    ]
    with pytest.raises(SystemExit) as e:
        peer.main(argv)
    assert e.value.code == 2 and "no run of ppo, sppo on these tasks and seeds" in capsys.readouterr().err
    assert not out.exists()


def test_out_that_is_a_file_is_refused(peer, tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("keep me")
    with pytest.raises(SystemExit) as e:
        peer.main(["--tasks", "hopper", "--budgets", "hopper=8", "--out", str(out)])
    assert e.value.code == 2 and "is a file" in capsys.readouterr().err
    assert out.read_text() == "keep me"


# ------------------------------------------------------------------------------------- end to end


def _peer(out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--tasks", "precision-cartpole", "--seeds", "0"]
    cmd += ["--budgets", "precision-cartpole=256", "--out", str(out), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_smoke_sb3_on_precision_cartpole_then_reused(peer, tmp_path, capsys):
    """256 episodes (4 updates of 64) of SB3 from the warm start. SB3's first block is the warm-start
    policy (its first 64 episodes all end inside the first rollout, before any update): its success is
    that of the warm start (~0.33 over 1,024 episodes), where a policy not loaded (random) never
    succeeds. A second call with the same settings reuses the finished run."""
    out = tmp_path / "peer"
    proc = _peer(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [g["label"] for g in result["groups"]] == ["sb3-ppo"]
    assert result["groups"][0]["episodes"] == 256
    assert (out / "peer_sb3.md").read_text() in proc.stdout
    assert json.loads((out / "peer_sb3.json").read_text()) == result

    folder = out / "sb3" / "precision-cartpole" / "seed0"
    episodes = json.loads((folder / "episodes.json").read_text())
    assert len(episodes["success"]) == 256 and set(episodes["success"]) <= {0.0, 1.0}
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["episodes"] for r in rows] == [64, 128, 192, 256]
    for k, r in enumerate(rows):
        assert r["success_rate"] == pytest.approx(np.mean(episodes["success"][64 * k : 64 * (k + 1)]))
    assert 0.1 < rows[0]["success_rate"] < 0.7
    assert rows[0]["env_steps"] == 64 * 200  # n_steps measured from the warm start: 200 x 64 envs
    (run,) = find_runs((str(out / "sb3"),))  # sppo-rl report reads the SB3 folder as an algorithm
    assert (run.algo, run.task, len(run.rows)) == ("sb3-ppo", "precision-cartpole", 4)

    capsys.readouterr()
    again = peer.main(
        ["--tasks", "precision-cartpole", "--seeds", "0", "--budgets", "precision-cartpole=256"]
        + ["--out", str(out)]
    )
    err = capsys.readouterr().err
    assert "reusing" in err and "training" not in err
    assert again["groups"][0]["episodes"] == 256
    assert json.loads((out / "peer_sb3.json").read_text()) == result  # the same numbers, rewritten


@pytest.mark.slow
def test_smoke_beside_our_ppo(tmp_path):
    """--run-ours trains our PPO with the same budget (a sweep in <out>/ours) and puts it beside SB3."""
    out = tmp_path / "peer"
    proc = _peer(out, "--algos", "ppo", "--run-ours")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [g["label"] for g in result["groups"]] == ["sb3-ppo", "ppo"]
    assert [g["episodes"] for g in result["groups"]] == [256, 256]
    ours = json.loads((out / "ours" / "precision-cartpole" / "ppo" / "seed0" / "config.json").read_text())
    assert (ours["total_episodes"], ours["threads"]) == (256, 1)
    assert "| precision-cartpole | ppo | 1 | 256 |" in proc.stdout
