"""The pure parts of scripts/bench_llm_step.py (no TRL needed): TRL's reward there scores exactly as this
project's ``integer`` reward, the median leaves out the warm-up steps, the ratio is ours / TRL, settings
that cannot give a measurement are refused, and ours' command carries the benchmark's settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import script_module

from sppo_rl.llm.rewards.verify import verify_integer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_llm_step") as module:
        yield module


RESPONSES = [
    "\\boxed{47}",
    "\\boxed{ 47 }",
    "\\boxed{4 7}",
    "\\boxed{047}",
    "\\boxed{+47}",
    "\\boxed{-47}",
    "\\boxed{47.0}",
    "\\boxed{40+7}",
    "\\boxed{47",  # truncated: never closes
    "\\boxed{",
    "\\boxe",
    "47",
    "",
    "\\boxed{3}\\boxed{47}",
    "\\boxed{47}\\boxed{3}",
    "\\fbox{47}",
    "\\boxed {47}",
    "\\boxed{{47}}",
    "\\boxed{\\{47}",
    "x\\boxed{47}<eos>yz",
]


@pytest.mark.parametrize("answer", ["47", "-47", "3", "0"])
def test_trl_reward_is_the_projects_integer_reward(bench, answer):
    for text in RESPONSES:
        assert bench.integer_reward(text, answer) == verify_integer(text, answer), text


def test_median_leaves_out_warmup(bench):
    times = [9.0, 7.0, 1.0, 3.0, 2.0]
    assert bench.median_after_warmup(times, 2) == 2.0
    assert bench.median_after_warmup(times, 0) == 3.0
    assert bench.median_after_warmup([5.0, 1.0, 2.0, 4.0, 3.0], 1) == 2.5
    with pytest.raises(ValueError, match="nothing left"):
        bench.median_after_warmup([1.0, 2.0], 2)
    with pytest.raises(ValueError):
        bench.median_after_warmup([1.0, 2.0], -1)


def test_ratio_is_ours_over_trl(bench):
    assert bench.ratio(1.0, 4.0) == 0.25
    assert bench.ratio(3.0, 1.5) == 2.0
    for bad in [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (float("nan"), 1.0)]:
        with pytest.raises(ValueError):
            bench.ratio(*bad)


def _args(bench, *argv):
    return bench.parser().parse_args(list(argv))


def test_defaults_are_the_benchmark_settings(bench):
    args = _args(bench)
    bench.check_args(args)
    assert (args.steps, args.warmup, args.prompts, args.group_size) == (12, 2, 8, 8)
    assert (args.max_new_tokens, args.lr, args.threads) == (8, 1e-5, 2)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "2", "--warmup", "2"], "must exceed --warmup"),
        (["--warmup", "-1"], "--warmup"),
        (["--group-size", "1"], "--group-size"),
        (["--prompts", "0"], "--prompts"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--threads", "0"], "--threads"),
        (["--rounds", "0"], "--rounds"),
        (["--lr", "0"], "--lr"),
        (["--train-size", "64"], "--train-size"),
    ],
)
def test_settings_without_a_measurement_are_refused(bench, argv, message):
    with pytest.raises(ValueError, match=message):
        bench.check_args(_args(bench, *argv))


def test_ours_command_carries_the_settings(bench, tmp_path):
    args = _args(bench, "--steps", "5", "--prompts", "4", "--group-size", "6", "--max-new-tokens", "3")
    cmd = bench.ours_command(args, tmp_path / "model", tmp_path / "train.jsonl", tmp_path / "ours")
    flags = dict(zip(cmd[2::1], cmd[3::1]))
    assert cmd[1] == "llm"
    assert flags["--algo"] == "grpo"
    assert flags["--updates"] == "5"
    assert flags["--prompts-per-step"] == "4"
    assert flags["--group-size"] == "6"
    assert flags["--max-new-tokens"] == "3"
    assert flags["--actor-lr"] == "1e-05"
    assert flags["--epochs"] == "1" and flags["--minibatches"] == "1"
    assert flags["--kl-coef"] == "0" and flags["--reward-fn"] == "integer"
    assert flags["--eval-every"] == "0" and flags["--threads"] == "2"
    assert int(flags["--checkpoint-every"]) > 5  # no checkpoint inside the timed steps
    assert {"--no-progress", "--no-tensorboard"} <= set(cmd)


def test_read_ours_keeps_update_rows(bench, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"update": 0, "val_accuracy": 0.0},
        {"update": 1, "step_time_s": 2.0},
        {"update": 2, "step_time_s": 1.0},
    ]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert [r["update"] for r in bench.read_ours(metrics)] == [1, 2]


def test_table_shows_medians_minima_and_ratios(bench):
    ours, trl = [0.5, 0.4, 0.9], [2.0, 1.0, 3.0]
    text = bench.format_table([("ours", ours, "a"), ("TRL", trl, "b")], bench.ratio(0.5, 2.0))
    lines = text.splitlines()
    assert lines[2].split()[1:4] == ["0.500", "0.400", "3"]
    assert lines[3].split()[1:4] == ["2.000", "1.000", "3"]
    assert lines[-1].split()[-2:] == ["0.250", "0.400"]


def test_round_ratios_give_ours_over_trl_beside_ours_timed_twice(bench):
    """Per round ours ran twice around TRL: the ratio is the median of both ours' steps over TRL's, the
    A/A ours' second run over its first; the warm-up steps are left out of both."""

    def ours(*steps):
        return {"rows": [{"step_time_s": s} for s in steps]}

    pairs = [(ours(9.0, 1.0, 1.0), ours(9.0, 1.2, 1.2)), (ours(9.0, 2.0, 2.0), ours(9.0, 2.0, 2.0))]
    trl = [{"step_time_s": [9.0, 2.2, 2.2]}, {"step_time_s": [9.0, 4.0, 4.0]}]
    r = bench.round_ratios(pairs, trl, warmup=1)
    assert r["ours_a"] == [1.0, 2.0] and r["ours_b"] == [1.2, 2.0] and r["trl"] == [2.2, 4.0]
    assert r["ours_vs_trl"]["per_rep"] == pytest.approx([1.1 / 2.2, 0.5])
    assert r["ours_vs_trl"]["ratio"] == pytest.approx(0.5)
    assert r["aa"]["per_rep"] == pytest.approx([1.2, 1.0])
