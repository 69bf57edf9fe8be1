"""What a user sees: the end of a run says what came out and where, `info` lists what it says it lists."""

from __future__ import annotations

import pytest

from sppo_rl.cli import main


def test_control_ends_with_headline_folder_wall_time_and_next_commands(tmp_path, capsys):
    out = tmp_path / "run"
    main(["control", "--task", "short-cartpole", "--algo", "grpo", "--total-episodes", "128", "--init-from", "none",
          "--no-progress", "--eval-episodes", "16", "--out-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err.splitlines()[-4:]
    assert err[0].startswith("[sppo-rl] done: grpo on short-cartpole, seed 0: success ")
    assert ", greedy " in err[0] and "2 updates, 128 episodes" in err[0]
    assert err[1] == f"[sppo-rl] run folder: {out} (summary.json, metrics.jsonl, config.json)"
    assert err[2].startswith("[sppo-rl] wall time of the command: ") and err[2].endswith(" s")
    assert err[3] == f"[sppo-rl] next: sppo-rl report {out}    tensorboard --logdir {out / 'tb'}"


def test_info_lists_algorithms_tasks_and_recipes(capsys):
    main(["info"])
    text = capsys.readouterr().out
    for name in ("sppo", "grpo", "precision-cartpole", "hopper", "arithmetic", "sppo-7b-dapo"):
        assert name in text, name


def test_llm_help_tells_about_recipes_and_no_spec(capsys):
    with pytest.raises(SystemExit):
        main(["llm", "--help"])
    help_text = capsys.readouterr().out
    assert "--recipe NAME" in help_text
    with pytest.raises(SystemExit):
        main(["control", "--help"])
    assert "SPEC" not in help_text + capsys.readouterr().out
