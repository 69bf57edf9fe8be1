"""The not-learning warnings (:mod:`sppo_rl.runtime.watch`): the rules on hand-made rows, and real runs
that cannot learn (a random-policy GRPO cartpole run, an LLM run whose responses are all cut) warn and
record it, while a run with mixed outcomes warns of nothing."""

from __future__ import annotations

import json

from sppo_rl.cli import main
from sppo_rl.runtime.watch import not_learning

# ----------------------------------------------------------------------------------- not learning


def test_not_learning_rules_on_hand_made_rows():
    row = {"success_rate": 0.0, "groups_zero_variance": 1.0, "actor_skipped": 1}
    kinds = lambda rows: [w["kind"] for w in not_learning(rows)]  # noqa: E731
    assert kinds([row] * 2) == ["zero_variance", "actor_skipped"]  # two updates: too few to call constant
    assert kinds([row] * 3) == ["constant_signal", "zero_variance", "actor_skipped"]
    # one group with a spread in one update, one actor step taken: only the constant success is left
    mixed = [row, {**row, "groups_zero_variance": 0.5, "actor_skipped": 0}, row]
    assert kinds(mixed) == ["constant_signal"]
    # the signal differs within the first 10 updates: no warning, though it is constant after them
    assert kinds([{"success_rate": 0.5}] + [{"success_rate": 0.0}] * 20) == []
    # the LLM's evaluation-only row (no reward) does not count as an update
    llm = [{"update": 0, "val_accuracy": 0.1}] + [
        {"reward_mean": r, "response_clip_frac": 0.5} for r in (0, 1, 0)
    ]
    assert kinds(llm) == []  # a clip fraction of exactly one half is not "most"
    cut = llm + [{"reward_mean": 1.0, "response_clip_frac": 1.0}]  # mean of the last 4: 0.625
    assert kinds(cut) == ["responses_cut"]
    assert "62%" in not_learning(cut)[0]["message"]


def test_readme_random_cartpole_grpo_run_warns_and_records_it(tmp_path, capsys):
    """The README's `control --task CartPole-v1 --algo grpo --init-from none`: a random policy never lasts
    500 steps, so every group is all-failures and the actor never steps. The run said "done" only."""
    out = tmp_path / "run"
    main(["control", "--task", "CartPole-v1", "--algo", "grpo", "--init-from", "none", "--total-episodes", "160",
          "--no-progress", "--no-tensorboard", "--eval-episodes", "4", "--out-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and {r["groups_zero_variance"] for r in rows} == {1.0}
    warnings = json.loads((out / "summary.json").read_text())["warnings"]
    assert len(warnings) == 3
    assert "was 0 in each of the first 10 updates" in warnings[0]
    assert "groups_zero_variance 1.0" in warnings[1] and "all 10 updates" in warnings[1]
    assert "actor_skipped 1" in warnings[2]
    for w in warnings:  # early (at the 10th update) and again above the headline
        assert err.count(f"[sppo-rl] warning: {w}") == 2
    assert err.index("[sppo-rl] warning:") < err.index("[sppo-rl] done:")


def test_a_run_with_mixed_outcomes_has_no_warnings(tmp_path):
    out = tmp_path / "run"
    main(["control", "--task", "short-cartpole", "--algo", "grpo", "--total-episodes", "256", "--init-from", "none",
          "--no-progress", "--no-tensorboard", "--eval-episodes", "4", "--out-dir", str(out)])  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len({r["success_rate"] for r in rows}) > 1 and min(r["groups_zero_variance"] for r in rows) < 1
    assert json.loads((out / "summary.json").read_text())["warnings"] == []


def test_llm_run_whose_responses_are_all_cut_warns(tmp_path, tiny, capsys):
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.trainer import run_llm

    cfg = LLMConfig(task="arithmetic", model=str(tiny), algo="grpo", group_size=2, updates=2, prompts_per_step=2,
                    train_size=16, val_size=4, eval_samples=1, eval_every=0, max_new_tokens=1,
                    out_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                    cache_dir=str(tmp_path / "cache"))  # fmt: skip
    summary = run_llm(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    clip = [r["response_clip_frac"] for r in rows if "response_clip_frac" in r]
    assert len(clip) == 2 and sum(clip) / 2 > 0.5  # one token: only a first-token EOS is not cut
    cut = [w for w in summary["warnings"] if "hit the length limit" in w]
    assert cut and cut[0].startswith(f"{sum(clip) / 2:.0%} of the responses of the last 2 updates")
    assert f"[sppo-rl] warning: {cut[0]}" in capsys.readouterr().err
    # the exported actor says what made it
    card = (tmp_path / "run" / "final" / "actor" / "README.md").read_text()
    assert "# grpo actor trained with sppo-rl" in card and f"started from: {tiny}" in card
    assert "updates: 2 of 2 prompts x 2 samples" in card and "max_new_tokens 1" in card
    assert "hit the length limit" in card
