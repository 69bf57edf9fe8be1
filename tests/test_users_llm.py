"""What TRL users bring to `sppo-rl llm` (issue 26): TRL-style and several weighted reward functions, a
reward that fails loudly, completions logged, TRL's data columns, sampling options, LoRA targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from paths import outside_a_launcher

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.reward import RewardScorer
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime import read_metrics
from sppo_rl.runtime.run import RunFailed

TRL_REWARDS = '''
def even(completions, **kwargs):
    """TRL's convention: a list over the batch; the data's columns arrive as keyword lists."""
    return [float(len(c) % 2 == 0) for c in completions]


def matches_solution(completions, solution, prompts):
    return [float(c == s) for c, s in zip(completions, solution)]


def starts_with_prompt(completions, prompts, **kwargs):
    return [float(c.startswith(p)) for c, p in zip(completions, prompts)]


def always(response, truth):
    return 1.0


def has_x(response, truth):
    return float("x" in response)


def broken(completions, **kwargs):
    return [1 / 0 for c in completions]


def none_for_z(response, truth):
    return None if response == "z" else 0.5
'''


@pytest.fixture(scope="module")
def rewards(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "trl_rewards.py"
    path.write_text(TRL_REWARDS)
    return path


def _cfg(tmp_path: Path, model: Path, **kw) -> LLMConfig:
    base = dict(
        task="arithmetic",
        model=str(model),
        algo="grpo",
        group_size=2,
        steps=2,
        prompts_per_step=4,
        train_size=64,
        val_size=4,
        eval_samples=2,
        eval_every=0,
        max_new_tokens=8,
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        threads=1,
    )
    base.update(kw)
    return LLMConfig(**base)


# ------------------------------------------------------------------------------------- item 2: rewards


def test_a_trl_style_reward_gets_the_batch_and_the_data_columns(rewards):
    with RewardScorer(f"{rewards}:matches_solution", timeout_s=5.0) as scorer:
        res = scorer.score(
            ["a", "b", "c"],
            ["-", "-", "-"],
            columns=[{"prompts": "p", "solution": "a"}, {"prompts": "p", "solution": "x"}, {"prompts": "p"}],
        )
    # item 2 lacks the column the function names: an error naming it, not a silent 0
    assert res.scores.tolist() == [1.0, 0.0, 0.0]
    assert res.valid.tolist() == [True, True, False] and res.errors == 1
    assert "needs column(s) solution" in res.error_samples[0]


def test_several_rewards_are_a_normalised_weighted_sum_each_kept_apart(rewards):
    spec = f"{rewards}:has_x,{rewards}:always"
    with RewardScorer(spec, timeout_s=5.0, weights=[1.0, 3.0]) as scorer:
        assert scorer.names == ["has_x", "always"]
        res = scorer.score(["x", "y"], ["-", "-"])
    # R = (1 * has_x + 3 * always) / 4: "x" -> (1 + 3) / 4, "y" -> (0 + 3) / 4
    assert res.scores.tolist() == [1.0, 0.75]
    assert res.parts.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    with RewardScorer([f"{rewards}:none_for_z", f"{rewards}:always"], timeout_s=5.0) as scorer:
        res = scorer.score(["z", "q"], ["-", "-"])
    # one function failing on an item makes the item invalid and counts against that function only
    assert res.valid.tolist() == [False, True] and res.scores.tolist() == [0.0, 0.75]
    assert res.fn_errors == [1, 0] and res.errors == 1
    assert np.isnan(res.parts[0, 0]) and res.parts[0, 1] == 1.0
    assert res.error_samples[0].startswith("item 0: none_for_z: TypeError")


def test_bad_reward_weights_are_refused_before_any_worker(rewards):
    from sppo_rl.config import ConfigError

    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        RewardScorer(f"{rewards}:always", weights=[1, 2])
    with pytest.raises(ConfigError, match="--reward-weights"):
        LLMConfig(reward_fn="math,integer", reward_weights=(1.0,)).validate()
    with pytest.raises(ConfigError, match="--reward-weights"):
        LLMConfig(reward_fn="math,integer", reward_weights=(0.0, 0.0)).validate()


def test_a_raising_reward_shows_its_first_traceback_once_and_counts_every_call(rewards, capfd):
    with RewardScorer(f"{rewards}:broken", timeout_s=5.0) as scorer:
        first = scorer.score(["a", "b", "c"], ["-"] * 3)
        second = scorer.score(["a", "b"], ["-"] * 2)
    err = capfd.readouterr().err
    assert (first.errors, second.errors) == (3, 2)
    assert err.count("Traceback (most recent call last)") == 1
    assert "ZeroDivisionError: division by zero" in err and "trl_rewards.py" in err


def test_a_trl_style_reward_trains_without_verifier_errors(tmp_path, tiny, rewards):
    """On the old code the trainer called f(response, answer): every call raised, every rollout was
    invalid and the run still finished."""
    run_llm(_cfg(tmp_path, tiny, reward_fn=f"{rewards}:even"))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2
    assert all(r["verifier_errors"] == 0 and r["invalid_rollouts"] == 0 for r in rows)


def test_several_rewards_are_logged_one_by_one(tmp_path, tiny, rewards):
    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:even,{rewards}:always", reward_weights=(1.0, 1.0))
    run_llm(cfg)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    for r in rows:
        assert r["rewards/always"] == 1.0 and r["reward_errors/even"] == 0
        assert r["reward_mean"] == pytest.approx((r["rewards/even"] + 1.0) / 2, abs=1e-6)


def test_a_reward_that_always_fails_stops_the_run(tmp_path, tiny, rewards):
    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:broken", steps=6, reward_fail_limit=2)
    with pytest.raises(RunFailed, match="no response got a valid reward in 2 consecutive updates"):
        run_llm(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and "--reward-fail-limit 2" in summary["stopped"]
    assert "ZeroDivisionError" in summary["last_error"] and summary["verifier_errors"] == 8
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2] and all(r["invalid_rollouts"] == 8 for r in rows)


def test_cli_exits_1_with_one_line_when_the_reward_always_fails(tmp_path, tiny, rewards):
    out = tmp_path / "cli"
    argv = ["--task", "arithmetic", "--model", str(tiny), "--algo", "grpo", "--group-size", "2"]
    argv += ["--steps", "5", "--prompts-per-step", "2", "--train-size", "16", "--val-size", "2"]
    argv += ["--eval-every", "0", "--max-new-tokens", "4", "--no-progress", "--no-tensorboard"]
    argv += ["--reward-fn", f"{rewards}:broken", "--reward-fail-limit", "2", "--out-dir", str(out)]
    env = outside_a_launcher({**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", "llm", *argv], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sppo-rl: error: no response got a valid reward in 2 consecutive updates")
    assert proc.stderr.count("Traceback (most recent call last)") == 1  # the reward's, shown once
    assert "stopped" in json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------------------------- item 4: completions


def test_clip_text_bounds_a_text_and_says_how_much_it_cut():
    from sppo_rl.llm.completions import clip_text

    assert clip_text("abc", 3) == "abc"
    assert clip_text("x" * 2500) == "x" * 2000 + " ... [+500 characters]"


def test_completions_are_logged_at_evaluations_and_every_n_updates(tmp_path, tiny, rewards):
    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:even", steps=3, eval_every=3, log_completions_every=2)
    run_llm(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    by = {(r["split"], r["step"]) for r in rows}
    assert by == {("val", 0), ("train", 2), ("val", 3)}
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == 8  # 4 prompts x 2 samples, under the cap of 8
    for r in rows:
        a, b = r["prompt"].rstrip("=").split("+")  # the row's prompt, answer and reward belong together
        assert int(r["answer"]) == int(a) + int(b)
        assert r["reward"] == float(len(r["response"]) % 2 == 0)
    assert all(r["valid"] for r in train) and all("valid" not in r for r in rows if r["split"] == "val")


def test_completions_reach_tensorboard_as_text(tmp_path, tiny, rewards):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(
        tmp_path, tiny, reward_fn=f"{rewards}:even", steps=1, tensorboard=True, log_completions_every=1
    )
    run_llm(cfg)
    acc = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "completions/train/text_summary" in tags and "completions/val/text_summary" in tags
    (event,) = acc.Tensors("completions/train/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 1 and text.startswith("| prompt | response | answer | reward |")
    assert len(text.splitlines()) == 2 + 8


def test_log_completions_every_0_writes_nothing(tmp_path, tiny, rewards):
    run_llm(_cfg(tmp_path, tiny, reward_fn=f"{rewards}:even", steps=1, eval_every=1, log_completions_every=0))
    assert not (tmp_path / "run" / "completions.jsonl").exists()
