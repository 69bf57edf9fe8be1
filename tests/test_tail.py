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
from sppo_rl.runtime.trace import Trace, load_trace

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


def synthetic(rng, n: int, separate_from: float, noise: float = 0.02) -> Trace:
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
    return Trace("step", lengths, success, T, values=values)


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
    trace = Trace("step", np.array([40, 2, 4]), np.array([True, True, False]), 40, values=values)
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
    seq = tail.sequence_numbers(Trace("sequence", np.ones(3, int), np.zeros(3, bool), 8, v0=np.ones(3)))
    assert math.isnan(seq["gap_v0"]) and math.isnan(seq["auc_v0"]) and seq["v0_failure_mean"] == 1.0


def test_sequence_critic_numbers():
    v0 = np.array([0.9, 0.7, 0.4, 0.6, 0.2])
    trace = Trace("sequence", np.ones(5, int), np.array([1, 1, 1, 0, 0]) > 0, 1, v0=v0)
    e = tail.sequence_numbers(trace)
    assert e["v0_success_mean"] == pytest.approx(2.0 / 3) and e["v0_failure_mean"] == pytest.approx(0.4)
    assert e["gap_v0"] == pytest.approx(2.0 / 3 - 0.4)
    # pairs: 0.9 > both, 0.7 > both, 0.4 > 0.2 only -> 5 / 6
    assert e["auc_v0"] == pytest.approx(5 / 6)
    assert e["v0_success_quartiles"] == pytest.approx([0.55, 0.7, 0.8])
    assert e["points"] == {"success": [0.9, 0.7, 0.4], "failure": [0.6, 0.2]}
    # one value serves every position: the first and last numbers are V(s_0)'s
    assert e["auc_first"] == e["auc_last"] == e["auc_v0"] and e["gap_first"] == e["gap_last"] == e["gap_v0"]


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
    t = load_trace(good)
    assert t.kind == "step" and t.success.tolist() == [True, False] and t.horizon == 3
    (tmp_path / "torn.npz").write_bytes(good.read_bytes()[:40])
    with pytest.raises(ValueError, match="not a readable npz"):
        load_trace(tmp_path / "torn.npz")
    np.savez(
        tmp_path / "short.npz",
        kind=np.array("step"),
        lengths=np.array([4]),
        success=np.array([1.0]),
        values=np.zeros((1, 3)),
    )
    with pytest.raises(ValueError, match="T >= every length"):
        load_trace(tmp_path / "short.npz")
    np.savez(tmp_path / "odd.npz", kind=np.array("token"), lengths=np.array([1]), success=np.array([1.0]))
    with pytest.raises(ValueError, match="unknown kind"):
        load_trace(tmp_path / "odd.npz")


# ------------------------------------------------------------------------------------- per seed


def constant_trace(kind: str, success: list[int], value: list[float], length: int = 3) -> Trace:
    """A trace whose critic says ``value[i]`` at every step of sequence ``i`` (or as its V(s_0))."""
    n, s = len(success), np.array(success) > 0
    if kind == "sequence":
        return Trace("sequence", np.full(n, length), s, length, v0=np.array(value, dtype=float))
    values = np.repeat(np.array(value, dtype=float)[:, None], length, axis=1)
    return Trace("step", np.full(n, length), s, length, values=values)


@pytest.mark.parametrize("kind", ["step", "sequence"])
def test_seeds_are_not_ranked_against_each_other(kind):
    # seed 0's critic on a low scale, mostly successes: 0.2 (x3) against 0.1; seed 1's on a high scale,
    # mostly failures: 0.9 against 0.8 (x3). Each separates perfectly: AUC 1 within each seed.
    low = constant_trace(kind, [1, 1, 1, 0], [0.2, 0.2, 0.2, 0.1])
    high = constant_trace(kind, [1, 0, 0, 0], [0.9, 0.8, 0.8, 0.8])
    (e,) = tail.diagnose([("t", "a", {"seed": 1}, high), ("t", "a", {"seed": 0}, low)], bins=3)
    assert [s["seed"] for s in e["seeds"]] == [0, 1] and e["runs"] == 2 and e["sequences"] == 8
    for key in ("auc_first", "auc_last") + (("auc_v0",) if kind == "sequence" else ()):
        assert e[key]["values"] == [1.0, 1.0] and e[key]["mean"] == 1.0 and e[key]["inverted"] == 0, key
    assert e["gap_first"]["values"] == pytest.approx([0.1, 0.1]) and e["gap_first"]["mean"] == pytest.approx(
        0.1
    )
    if kind == "step":
        assert e["bins"]["auc"]["mean"] == [1.0, 1.0, 1.0] and e["bins"]["gap"]["mean"] == pytest.approx(
            [0.1] * 3
        )
    # what pooling the two seeds' sequences says instead: successes {0.2 x3, 0.9} against failures
    # {0.1, 0.8 x3}: each 0.2 beats only 0.1 (3 pairs), 0.9 beats all 4 -> 7/16, "inverted"
    pooled = tail.roc_auc([0.2, 0.2, 0.2, 0.9], [0.1, 0.8, 0.8, 0.8])
    assert pooled == 7 / 16 and e["auc_first"]["mean"] != pooled


def test_an_inverted_seed_is_counted():
    # step critics, T = 2 and 2 bins (t = 0 in bin 0, t = 1 in bin 1); every seed separates at the end,
    # at the start seed 0 separates, seed 1 says the same for both, seed 2 ranks them the wrong way round
    def seed(first_success: float, first_failure: float) -> Trace:
        values = np.array([[first_success, 0.9], [first_failure, 0.1]])
        return Trace("step", np.array([2, 2]), np.array([True, False]), 2, values=values)

    traced = [("t", "ppo", {"seed": k}, seed(*v)) for k, v in enumerate([(0.6, 0.4), (0.5, 0.5), (0.3, 0.7)])]
    (e,) = tail.diagnose(traced, bins=2)
    assert e["auc_first"]["values"] == [1.0, 0.5, 0.0]  # 0.5 is no separation, not an inversion
    assert (e["auc_first"]["mean"], e["auc_first"]["min"], e["auc_first"]["max"]) == (0.5, 0.0, 1.0)
    assert (e["auc_first"]["inverted"], e["auc_first"]["n"]) == (1, 3)
    assert e["auc_last"]["values"] == [1.0] * 3 and e["auc_last"]["inverted"] == 0
    assert e["gap_first"]["values"] == pytest.approx([0.2, 0.0, -0.4])
    assert e["bins"]["auc"] == {"mean": [0.5, 1.0], "min": [0.0, 1.0], "max": [1.0, 1.0], "n": [3, 3]}
    # tail share per seed: gaps (0.2, 0.8) -> 0.8; (0, 0.8) -> 1; (-0.4, 0.8) -> 1 (negative gap = none)
    assert e["tail_share"]["values"] == pytest.approx([0.8, 1.0, 1.0])
    assert e["tail_share"]["mean"] == pytest.approx(2.8 / 3)
    # a sequence critic with an inverted seed and a seed that saw one outcome only (left out, counted)
    seqs = [
        constant_trace("sequence", [1, 1, 0], [0.9, 0.8, 0.1]),  # 1.0
        constant_trace("sequence", [1, 1, 0, 0], [0.9, 0.4, 0.5, 0.4]),  # 2.5 / 4 (test_roc_auc_by_hand)
        constant_trace("sequence", [1, 0, 0], [0.1, 0.9, 0.5]),  # 0.0
        constant_trace("sequence", [1, 1], [0.5, 0.6]),  # NaN
    ]
    (s,) = tail.diagnose([("t", "sppo", {"seed": k}, t) for k, t in enumerate(seqs)])
    auc = s["auc_v0"]
    assert auc["values"][:3] == [1.0, 0.625, 0.0] and math.isnan(auc["values"][3])
    assert (auc["n"], auc["inverted"], auc["min"], auc["max"]) == (3, 1, 0.0, 1.0)
    assert auc["mean"] == pytest.approx(1.625 / 3) and s["one_outcome_seeds"] == 1
    md = "\n".join(tail.markdown([e, s], []))
    assert (
        "| t | ppo | V(s_t) | 3 | 6 (3/3) | 0.500 [0.000, 1.000] | 1/3 | 1.000 [1.000, 1.000] | 0/3 |" in md
    )
    assert (
        "| t | sppo | V(s_0) | 4 | 12 (7/5) | 0.542 [0.000, 1.000] | 1/3 | 0.542 [0.000, 1.000] | 1/3 | — | — |"
        in md
    )
    assert "| t | ppo | 2 | 2 (1/1) | 0.000 | 1.000 | -0.400 | 0.800 | 0.200 | 1.00 |" in md
    assert "| t | sppo | 3 | 2 (2/0) | — | — |" in md and "t / sppo (1 of 4)" in md


# ------------------------------------------------------------------------------------- report


def write_llm_run(folder: Path, algo: str, trace: dict[str, np.ndarray], seed: int = 0) -> None:
    """A run folder as the LLM trainer writes it: its config (task 'arithmetic', no task in 'resolved'),
    metrics rows without success_rate, and a critic trace."""
    folder.mkdir(parents=True)
    cfg = {
        "algo": algo,
        "task": "arithmetic",
        "seed": seed,
        "max_new_tokens": 12,
        "resolved": {"group_size": 1},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    rows = [{"update": 0, "val_accuracy": 0.5}, {"update": 1, "reward_mean": 0.5, "val_accuracy": 0.5}]
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
    (p,) = ppo["seeds"]
    assert p["seed"] == 0 and p["path"] == str((tmp_path / "runs" / "ppo").resolve())
    assert p["gap_first"] == 0.0 and p["auc_first"] == 0.5 and p["gap_last"] == 1.0 and p["auc_last"] == 1.0
    gap = np.array(p["bins"]["gap"], dtype=float)
    assert np.flatnonzero(~np.isnan(gap)).tolist() == [0, 5, 10, 19]
    assert gap[[0, 5, 10, 19]].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert p["gap_area"] == 0.25 and p["tail_share"] == 1.0
    assert ppo["auc_last"]["values"] == [1.0] and ppo["bins"]["auc"]["mean"][19] == 1.0
    assert ppo["bins"]["auc"]["n"][1] == 0  # bin 1: no failure reaches it, no seed has an AUC there
    # pairs 0.8>0.3, 0.8>0.6, 0.6>0.3, 0.6=0.6; the prompt critic's one value serves every position
    assert sppo["gap_v0"]["mean"] == pytest.approx(0.7 - 0.45) and sppo["auc_v0"]["values"] == [0.875]
    assert sppo["auc_first"] == sppo["auc_last"] == sppo["auc_v0"]
    out = tmp_path / "runs" / "report"
    md = (out / "report.md").read_text()
    assert "## LLM runs" in md and "success_vs_episodes.png" not in md
    assert "| arithmetic | ppo | V(s_t) | 1 | 4 (2/2) | 0.500 | 0/1 | 1.000 | 0/1 | 0.250 | 1.00 |" in md
    assert "| arithmetic | sppo | V(s_0) | 1 | 4 (2/2) | 0.875 | 0/1 | 0.875 | 0/1 | — | — |" in md
    assert "| arithmetic | ppo | 0 | 4 (2/2) | 0.500 | 1.000 | 0.000 | 1.000 | 0.250 | 1.00 |" in md
    assert "![tail effect](tail_effect.png)" in md and "**tail share (last 10%)**" in md
    saved = json.loads((out / "report.json").read_text())
    assert saved["tail_effect"][0]["seeds"][0]["bins"]["gap"][0] == 0.0
    assert saved["tail_effect"][0]["bins"]["auc"]["mean"][1] is None  # NaN -> null
    assert (out / "tail_effect.png").read_bytes()[:8] == PNG


def test_report_summarises_seeds_and_skips_unreadable_traces(tmp_path):
    step, seq = llm_traces()
    flipped = dict(step, values=step["values"].copy())  # seed 1: last token 0 for successes, 1 for failures
    for b, n in enumerate(step["lengths"]):
        flipped["values"][b, n - 1] = 1.0 - step["values"][b, n - 1]
    write_llm_run(tmp_path / "runs" / "ppo1", "ppo", flipped, seed=1)
    write_llm_run(tmp_path / "runs" / "ppo0", "ppo", step, seed=0)
    write_llm_run(tmp_path / "runs" / "sppo", "sppo", seq)
    (tmp_path / "runs" / "sppo" / "critic_trace.npz").write_bytes(b"PK\x03\x04 torn")
    report = run_report(ReportConfig(inputs=(str(tmp_path / "runs"),), out=str(tmp_path / "out")))
    (ppo,) = report["tail_effect"]
    assert ppo["runs"] == 2 and (ppo["sequences"], ppo["successes"]) == (8, 4)
    assert [s["seed"] for s in ppo["seeds"]] == [0, 1]
    last = ppo["auc_last"]
    assert last["values"] == [1.0, 0.0] and (last["mean"], last["inverted"], last["n"]) == (0.5, 1, 2)
    assert ppo["gap_last"]["values"] == [1.0, -1.0] and ppo["bins"]["auc"]["min"][19] == 0.0
    assert len(report["tail_effect_skipped"]) == 1 and "sppo" in report["tail_effect_skipped"][0]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Unreadable critic traces" in md
    assert (
        "| arithmetic | ppo | V(s_t) | 2 | 8 (4/4) | 0.500 [0.500, 0.500] | 0/2 | 0.500 [0.000, 1.000] | 1/2 |"
        in md
    )
    assert "| arithmetic | ppo | 1 | 4 (2/2) | 0.500 | 0.000 | 0.000 | -1.000 |" in md


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
    traced = [
        (task, algo, {"seed": k}, synthetic(rng, 40, u))
        for k in range(3)
        for task, algo, u in (("task-a", "ppo", 0.9), ("task-b", "ppo-bce", 0.0))
    ]
    traced += [
        (
            "task-a",
            "sppo",
            {"seed": k},
            Trace("sequence", np.ones(4, int), np.array([1, 0, 1, 0]) > 0, 1, v0=rng.random(4)),
        )
        for k in range(2)
    ]
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
    (p,) = ppo["seeds"]
    assert p["length_failure"] < p["length_success"] == 30.0  # some failures fell before t = 30
    assert p["auc_first"] < 0.7 < p["auc_last"] and ppo["auc_last"]["values"] == [p["auc_last"]]
    assert p["tail_share"] > 0.15  # above the 0.1 of a gap spread evenly
    assert 0.0 <= sppo["auc_v0"]["mean"] <= 1.0
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
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model
    from sppo_rl.llm.trainer import run_llm

    model = ensure_tiny_model(tmp_path / "cache", TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1)
    (tmp_path / "digit.py").write_text(
        "def has_digit(response, ground_truth):\n    return float(any(c.isdigit() for c in response))\n"
    )
    for algo in ("ppo", "sppo"):
        run_llm(
            LLMConfig(
                algo=algo,
                model=str(model),
                updates=2,
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
    # every response has a first token; the step critic's trace gives a ROC-AUC at every position
    assert ppo["seeds"][0]["bins"]["success"]["n"][0] == ppo["successes"]
    assert ppo["auc_first"]["n"] == ppo["auc_last"]["n"] == 1 and sppo["auc_v0"]["n"] == 1
    assert (tmp_path / "runs" / "report" / "tail_effect.png").read_bytes()[:8] == PNG
