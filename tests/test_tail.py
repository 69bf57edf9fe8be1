"""The tail-effect diagnostic: its numbers on traces with a known answer, the report section, and the
whole path from real control and LLM runs to ``tail_effect.png``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sppo_rl.experiments import tail
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report import run_report

PNG = b"\x89PNG\r\n\x1a\n"

# ------------------------------------------------------------------------------------- statistics


def test_relative_bins_by_hand():
    pad = 99.0  # padding must never count
    values = np.array(
        [
            [1, 2, 3, 4, 5, 6],  # T = 6, 3 bins: min(3t//5, 2) = 0,0,1,1,2,2
            [10, 20, pad, pad, pad, pad],  # T = 2: min(3t//1, 2) = 0,2 -> bin 1 empty
            [7, 7, 7, 7, 7, 7],  # T = 0: no bins at all
            [1, 3, 5, pad, pad, pad],  # T = 3: min(3t//2, 2) = 0,1,2
            [4, pad, pad, pad, pad, pad],  # T = 1: its one step is its first: bin 0
        ],
        dtype=float,
    )
    got = tail.relative_bins(values, [6, 2, 0, 3, 1], bins=3)
    want = np.array([[1.5, 3.5, 5.5], [10, np.nan, 20], [np.nan] * 3, [1, 3, 5], [4, np.nan, np.nan]])
    np.testing.assert_array_equal(got, want)
    # 4 bins over T = 6: min(4t//5, 3) = 0,0,1,2,3,3 (uneven bins average what they hold)
    np.testing.assert_array_equal(tail.relative_bins(values[:1], [6], bins=4), [[1.5, 3, 4, 5.5]])
    # more bins than steps: first step in the first bin, last step in the last, whatever the length
    np.testing.assert_array_equal(
        tail.relative_bins(values[1:2], [2], bins=5), [[10, np.nan, np.nan, np.nan, 20]]
    )


def test_roc_auc_by_hand():
    assert tail.roc_auc([3, 4], [1, 2]) == 1.0
    assert tail.roc_auc([1, 2], [3, 4]) == 0.0
    assert tail.roc_auc([1, 1], [1, 1]) == 0.5
    # pairs (0.9,0.5)=1 (0.9,0.4)=1 (0.4,0.5)=0 (0.4,0.4)=1/2 -> 2.5 / 4
    assert tail.roc_auc([0.9, 0.4], [0.5, 0.4]) == 0.625
    assert tail.roc_auc([0.9, np.nan], [0.5]) == 1.0
    assert math.isnan(tail.roc_auc([], [1.0])) and math.isnan(tail.roc_auc([1.0], [np.nan]))


def test_tail_share_by_hand():
    assert tail.tail_share([0.6] * 20) == pytest.approx(0.1)  # the same gap everywhere
    assert tail.tail_share([0.0] * 18 + [0.5, 0.9]) == 1.0  # only in the last 10%
    centres = (np.arange(20) + 0.5) / 20  # gap = u: (0.925 + 0.975) / 10 = 0.19 (integral: 0.19 too)
    assert tail.tail_share(centres) == pytest.approx(0.19)
    # negative gaps count as no separation, NaN bins are ignored, and the tail is the last 10% of bins
    assert tail.tail_share([-1.0] * 9 + [np.nan, 1.0]) == 1.0
    assert tail.tail_share([0.3, np.nan, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], frac=0.2) == pytest.approx(
        0.2 / 1.1
    )
    # the tail is the last max(1, round(frac * bins)) bins
    assert (tail.tail_bins(20), tail.tail_bins(4), tail.tail_bins(15), tail.tail_bins(10, 0.25)) == (
        2,
        1,
        2,
        2,
    )
    assert tail.tail_share([1.0, 1.0, 1.0, 2.0]) == 0.4
    assert math.isnan(tail.tail_share([-0.1] * 20)) and math.isnan(tail.tail_share([np.nan] * 20))


def synthetic(rng, n: int, separate_from: float, noise: float = 0.02) -> tail.Trace:
    """Half successes, half failures, lengths 20..60 padded to 64: a step critic that says 0.5 for both
    outcomes until relative position ``u = t / (T - 1) = separate_from``, then 0.95 for successes and
    0.05 for failures."""
    lengths = rng.integers(20, 61, size=n)
    success = np.arange(n) % 2 == 0
    T = 64
    u = np.arange(T)[None, :] / (lengths[:, None] - 1)
    late = np.where(success[:, None], 0.95, 0.05)
    values = np.where(u >= separate_from, late, 0.5) + noise * rng.standard_normal((n, T))
    values[np.arange(T)[None, :] >= lengths[:, None]] = 0.0  # zero padding, as the trainers write it
    return tail.Trace("step", lengths, success, T, values=values)


def test_separation_only_in_the_last_tenth_is_reported_as_a_tail_effect():
    e = tail.step_numbers(synthetic(np.random.default_rng(0), 400, separate_from=0.9))
    assert (e["sequences"], e["successes"], e["failures"]) == (400, 200, 200)
    assert e["tail_share"] > 0.97  # all of the separation sits in the last two of 20 bins
    gap = np.array(e["bins"]["gap"])
    assert np.abs(gap[:18]).max() < 0.02 and gap[18:] == pytest.approx([0.9, 0.9], abs=0.01)
    assert abs(e["gap_first"]) < 0.02 and 0.4 < e["auc_first"] < 0.6  # V(s_0) says nothing
    assert e["gap_last"] == pytest.approx(0.9, abs=0.01) and e["auc_last"] == 1.0
    assert e["gap_area"] == pytest.approx(0.9 * 2 / 20, abs=0.01)
    assert np.array(e["bins"]["auc"])[18:].min() == 1.0 and 0.3 < np.array(e["bins"]["auc"])[:18].mean() < 0.7
    # every sequence reaches every bin (lengths >= 20 = bins), quartiles bracket the means
    assert e["bins"]["success"]["n"] == [200] * 20 and e["bins"]["failure"]["n"] == [200] * 20
    s = e["bins"]["success"]
    assert all(lo <= m <= hi for lo, m, hi in zip(s["q25"], s["mean"], s["q75"]))


def test_separation_from_the_start_is_not_a_tail_effect():
    e = tail.step_numbers(synthetic(np.random.default_rng(1), 400, separate_from=0.0))
    assert e["tail_share"] == pytest.approx(0.1, abs=0.005)  # the tail holds its 10% share, no more
    assert e["gap_first"] == pytest.approx(0.9, abs=0.01) and e["auc_first"] == 1.0
    assert e["gap_area"] == pytest.approx(0.9, abs=0.01)
    halfway = tail.step_numbers(synthetic(np.random.default_rng(2), 400, separate_from=0.5))
    assert halfway["tail_share"] == pytest.approx(0.2, abs=0.01)  # 2 of the 10 separated bins
    assert halfway["bins"]["gap"][9] == pytest.approx(0.0, abs=0.02)
    assert halfway["bins"]["gap"][10] == pytest.approx(0.9, abs=0.02)


def test_variable_lengths_weigh_every_sequence_equally_in_a_bin():
    # a long success (T = 40, V = 1) and a short one (T = 2, V = 0) against one failure (T = 4, V = 0):
    # per bin the success mean is (1 + 0) / 2 wherever both reach, whatever their step counts
    values = np.zeros((3, 40))
    values[0, :40] = 1.0
    trace = tail.Trace("step", np.array([40, 2, 4]), np.array([True, True, False]), 40, values=values)
    e = tail.step_numbers(trace, bins=4)
    assert e["bins"]["success"]["n"] == [2, 1, 1, 2]  # T = 2 covers the first and the last bin only
    assert e["bins"]["success"]["mean"] == [0.5, 1.0, 1.0, 0.5]
    assert e["bins"]["failure"]["n"] == [1, 1, 1, 1]  # T = 4: min(4t//3, 3) = 0, 1, 2, 3
    assert e["bins"]["gap"] == [0.5, 1.0, 1.0, 0.5]
    assert e["gap_first"] == 0.5 and e["gap_last"] == 0.5  # last steps: V = 1 (t = 39), 0 (t = 1); 0
    assert e["gap_area"] == 0.75
    assert e["tail_share"] == pytest.approx(0.5 / 3.0)  # the last of 4 bins: 0.5 / (0.5 + 1 + 1 + 0.5)
    assert (e["length_success"], e["length_failure"]) == (21.0, 4.0)


def test_one_outcome_only_gives_nan_not_an_error():
    trace = synthetic(np.random.default_rng(3), 10, 0.9)
    trace.success[:] = False
    e = tail.step_numbers(trace)
    assert e["successes"] == 0 and math.isnan(e["tail_share"]) and math.isnan(e["auc_last"])
    seq = tail.sequence_numbers(tail.Trace("sequence", np.ones(3, int), np.zeros(3, bool), 8, v0=np.ones(3)))
    assert math.isnan(seq["gap_v0"]) and math.isnan(seq["auc_v0"]) and seq["v0_failure_mean"] == 1.0


def test_sequence_critic_numbers():
    v0 = np.array([0.9, 0.7, 0.4, 0.6, 0.2])
    trace = tail.Trace("sequence", np.ones(5, int), np.array([1, 1, 1, 0, 0]) > 0, 1, v0=v0)
    e = tail.sequence_numbers(trace)
    assert e["v0_success_mean"] == pytest.approx(2.0 / 3) and e["v0_failure_mean"] == pytest.approx(0.4)
    assert e["gap_v0"] == pytest.approx(2.0 / 3 - 0.4)
    # pairs: 0.9 > both, 0.7 > both, 0.4 > 0.2 only -> 5 / 6
    assert e["auc_v0"] == pytest.approx(5 / 6)
    assert e["v0_success_quartiles"] == pytest.approx([0.55, 0.7, 0.8])
    assert e["points"] == {"success": [0.9, 0.7, 0.4], "failure": [0.6, 0.2]}


def test_load_trace_checks_the_file(tmp_path):
    good = tmp_path / "good.npz"
    np.savez_compressed(
        good,
        kind=np.array("step"),
        lengths=np.array([2, 3]),
        success=np.array([1.0, 0.0], dtype=np.float32),
        horizon=np.array(3),
        values=np.zeros((2, 3), dtype=np.float32),
    )
    t = tail.load_trace(good)
    assert t.kind == "step" and t.success.tolist() == [True, False] and t.horizon == 3
    (tmp_path / "torn.npz").write_bytes(good.read_bytes()[:40])
    with pytest.raises(ValueError, match="not a readable npz"):
        tail.load_trace(tmp_path / "torn.npz")
    np.savez(
        tmp_path / "short.npz",
        kind=np.array("step"),
        lengths=np.array([4]),
        success=np.array([1.0]),
        values=np.zeros((1, 3)),
    )
    with pytest.raises(ValueError, match="T >= every length"):
        tail.load_trace(tmp_path / "short.npz")
    np.savez(tmp_path / "odd.npz", kind=np.array("token"), lengths=np.array([1]), success=np.array([1.0]))
    with pytest.raises(ValueError, match="unknown kind"):
        tail.load_trace(tmp_path / "odd.npz")


# ------------------------------------------------------------------------------------- report


def write_llm_run(folder: Path, algo: str, trace: dict[str, np.ndarray]) -> None:
    """A run folder as the LLM trainer writes it: its config (task 'arithmetic', no task in 'resolved'),
    metrics rows without success_rate, and a critic trace."""
    folder.mkdir(parents=True)
    cfg = {"algo": algo, "task": "arithmetic", "seed": 0, "max_new_tokens": 12, "resolved": {"group_size": 1}}
    (folder / "config.json").write_text(json.dumps(cfg))
    rows = [{"step": 0, "val_accuracy": 0.5}, {"step": 1, "reward_mean": 0.5, "val_accuracy": 0.5}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text("{}")
    np.savez_compressed(folder / "critic_trace.npz", **trace)


def llm_traces() -> tuple[dict, dict]:
    """Token critic: 4 responses of 3..12 tokens; successes get V = 0.5 until their last token, then 1;
    failures 0.5 then 0. Prompt critic: V(s_p) per response, lengths 1 (as the LLM trainer writes them)."""
    lengths = np.array([12, 5, 3, 10])
    success = np.array([1, 0, 1, 0], dtype=np.float32)
    values = np.zeros((4, 12), dtype=np.float32)
    for b, (n, r) in enumerate(zip(lengths, success)):
        values[b, :n] = 0.5
        values[b, n - 1] = r
    step = dict(kind=np.array("step"), lengths=lengths, success=success, horizon=np.array(12), values=values)
    seq = dict(
        kind=np.array("sequence"),
        lengths=np.ones(4, dtype=int),
        success=success,
        horizon=np.array(12),
        v0=np.array([0.8, 0.3, 0.6, 0.6], dtype=np.float32),
    )
    return step, seq


def test_report_on_llm_runs_only(tmp_path):
    step, seq = llm_traces()
    write_llm_run(tmp_path / "runs" / "ppo", "ppo", step)
    write_llm_run(tmp_path / "runs" / "sppo", "sppo", seq)
    report = run_report(ReportConfig(inputs=(str(tmp_path / "runs"),)))
    assert report["groups"] == [] and "tail_effect.png" in report["figures"]
    assert not any(f.startswith("success_vs") for f in report["figures"]), (
        "no control curves without control runs"
    )
    ppo, sppo = report["tail_effect"]
    assert (ppo["task"], ppo["algo"], ppo["kind"]) == ("arithmetic", "ppo", "step")
    assert (sppo["task"], sppo["algo"], sppo["kind"]) == ("arithmetic", "sppo", "sequence")
    # every token but the last says 0.5 for both outcomes; each last token, alone, makes bin 19.
    # Bins reached (min(20t // (T-1), 19)): successes T = 12 and 3 {0,1,3,5,7,9,10,12,14,16,18,19} and
    # {0,10,19}; failures T = 5 and 10 {0,5,10,15,19} and {0,2,4,6,8,11,13,15,17,19}: both in {0,5,10,19}
    assert ppo["gap_first"] == 0.0 and ppo["gap_last"] == 1.0 and ppo["auc_last"] == 1.0
    gap = np.array(ppo["bins"]["gap"], dtype=float)
    assert np.flatnonzero(~np.isnan(gap)).tolist() == [0, 5, 10, 19]
    assert gap[[0, 5, 10, 19]].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert ppo["gap_area"] == 0.25 and ppo["tail_share"] == 1.0
    assert (
        sppo["gap_v0"] == pytest.approx(0.7 - 0.45) and sppo["auc_v0"] == 0.875
    )  # pairs 0.8>0.3, 0.8>0.6, 0.6>0.3, 0.6=0.6
    out = tmp_path / "runs" / "report"
    md = (out / "report.md").read_text()
    assert "## LLM runs" in md and "success_vs_episodes.png" not in md
    assert "| arithmetic | ppo | V(s_t) | 1 | 4 (2/2) | 0.000 | 0.500 | 1.000 | 1.000 | 0.250 | 1.00 |" in md
    assert "| arithmetic | sppo | V(s_0) | 1 | 4 (2/2) | 0.250 | 0.875 | — |" in md
    assert "![tail effect](tail_effect.png)" in md and "**tail share (last 10%)**" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved["tail_effect"][0]["bins"]["gap"][0] == 0.0
    assert (out / "tail_effect.png").read_bytes()[:8] == PNG


def test_report_pools_seeds_and_skips_unreadable_traces(tmp_path):
    step, seq = llm_traces()
    write_llm_run(tmp_path / "runs" / "ppo0", "ppo", step)
    write_llm_run(tmp_path / "runs" / "ppo1", "ppo", step)
    write_llm_run(tmp_path / "runs" / "sppo", "sppo", seq)
    (tmp_path / "runs" / "sppo" / "critic_trace.npz").write_bytes(b"PK\x03\x04 torn")
    report = run_report(ReportConfig(inputs=(str(tmp_path / "runs"),), out=str(tmp_path / "out")))
    (ppo,) = report["tail_effect"]
    assert ppo["runs"] == 2 and (ppo["sequences"], ppo["successes"]) == (8, 4)
    assert ppo["gap_last"] == 1.0
    assert len(report["tail_effect_skipped"]) == 1 and "sppo" in report["tail_effect_skipped"][0]
    assert "Unreadable critic traces" in (tmp_path / "out" / "report.md").read_text()


def test_report_command_line_writes_the_figure(tmp_path):
    step, seq = llm_traces()
    write_llm_run(tmp_path / "runs" / "ppo", "ppo", step)
    write_llm_run(tmp_path / "runs" / "sppo", "sppo", seq)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", "report", str(tmp_path / "runs"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "## Tail effect of the critics" in proc.stdout
    data = (out / "tail_effect.png").read_bytes()
    assert data[:8] == PNG and len(data) > 20_000


def test_plot_one_panel_per_task(tmp_path):
    rng = np.random.default_rng(4)
    traced = [("task-a", "ppo", synthetic(rng, 40, 0.9)), ("task-b", "ppo-bce", synthetic(rng, 40, 0.0))]
    traced.append(
        (
            "task-a",
            "sppo",
            tail.Trace("sequence", np.ones(4, int), np.array([1, 0, 1, 0]) > 0, 1, v0=rng.random(4)),
        )
    )
    entries = tail.diagnose(traced)
    assert [(e["task"], e["algo"]) for e in entries] == [
        ("task-a", "ppo"),
        ("task-a", "sppo"),
        ("task-b", "ppo-bce"),
    ]
    path = tmp_path / "tail.png"
    tail.plot(entries, path, {"ppo": "#1f77b4", "sppo": "#d62728", "ppo-bce": "#ff7f0e"})
    from matplotlib.image import imread

    img = imread(path)
    assert img.shape[1] > img.shape[0]  # two task columns side by side


# ------------------------------------------------------------------------------------- real runs


def test_report_on_real_control_runs(tmp_path):
    """PPO and SPPO on short-cartpole from scratch, 384 episodes each: the step critic separates the
    outcomes at the end of an episode (the pole is falling or off-centre), hardly at its start."""
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import run_control

    for algo in ("ppo", "sppo"):
        run_control(
            ControlConfig(
                algo=algo,
                task="short-cartpole",
                total_episodes=384,
                init_from="none",
                out_dir=str(tmp_path / "runs" / algo),
                progress=False,
                tensorboard=False,
                eval_episodes=0,
            )
        )
    report = run_report(ReportConfig(inputs=(str(tmp_path / "runs"),)))
    out = tmp_path / "runs" / "report"
    assert "tail_effect.png" in report["figures"]
    data = (out / "tail_effect.png").read_bytes()
    assert data[:8] == PNG and len(data) > 20_000
    ppo, sppo = report["tail_effect"]
    assert (ppo["algo"], ppo["kind"], sppo["algo"], sppo["kind"]) == ("ppo", "step", "sppo", "sequence")
    for e in (ppo, sppo):
        assert e["sequences"] == 64 and e["successes"] > 0 and e["failures"] > 0, e
    assert ppo["length_failure"] < ppo["length_success"] == 30.0  # some failures fell before t = 30
    assert ppo["auc_first"] < 0.7 < ppo["auc_last"]
    assert ppo["tail_share"] > 0.15  # above the 0.1 of a gap spread evenly
    assert 0.0 <= sppo["auc_v0"] <= 1.0
    md = (out / "report.md").read_text()
    assert (
        "| short-cartpole | ppo | V(s_t) | 1 | 64 (" in md
        and "| short-cartpole | sppo | V(s_0) | 1 | 64 (" in md
    )
    assert "| short-cartpole | ppo | 1 |" in md  # the success table is still there


def test_report_on_real_llm_runs(tmp_path):
    """PPO (token critic) and SPPO (prompt critic) on the tiny model for two steps, with a verifiable
    reward the untrained model meets about half the time (the response holds a digit)."""
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.tiny import ensure_tiny_model
    from sppo_rl.llm.trainer import TINY_CHARSET, run_llm

    model = ensure_tiny_model(tmp_path / "cache", TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1)
    (tmp_path / "digit.py").write_text(
        "def has_digit(response, ground_truth):\n    return float(any(c.isdigit() for c in response))\n"
    )
    for algo in ("ppo", "sppo"):
        run_llm(
            LLMConfig(
                algo=algo,
                model=str(model),
                steps=2,
                prompts_per_step=4,
                train_size=32,
                val_size=16,
                eval_samples=2,
                max_new_tokens=8,
                reward_fn=f"{tmp_path / 'digit.py'}:has_digit",
                out_dir=str(tmp_path / "runs" / algo),
                cache_dir=str(tmp_path / "cache"),
                progress=False,
                tensorboard=False,
            )
        )
    report = run_report(ReportConfig(inputs=(str(tmp_path / "runs"),)))
    ppo, sppo = report["tail_effect"]
    assert (ppo["task"], ppo["algo"], ppo["kind"]) == ("arithmetic", "ppo", "step")
    assert (sppo["task"], sppo["algo"], sppo["kind"]) == ("arithmetic", "sppo", "sequence")
    assert ppo["sequences"] == sppo["sequences"] == 32  # 16 validation prompts x 2 samples
    assert ppo["successes"] > 0 and ppo["failures"] > 0
    assert ppo["bins"]["success"]["n"][0] == ppo["successes"]  # every response has a first token
    assert (tmp_path / "runs" / "report" / "tail_effect.png").read_bytes()[:8] == PNG
