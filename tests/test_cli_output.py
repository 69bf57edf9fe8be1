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
    assert "--recipe NAME" in help_text and "--recipe-file" in help_text
    with pytest.raises(SystemExit):
        main(["control", "--help"])
    assert "SPEC" not in help_text + capsys.readouterr().out


def _help(command: str, capsys) -> str:
    import re

    with pytest.raises(SystemExit):
        main([command, "--help"])
    return re.sub(r"[│╭╮╰╯─\s]+", " ", capsys.readouterr().out)  # the box and the wrapping undone


def test_algo_help_lists_every_algorithm_of_the_registry(capsys):
    from sppo_rl.agents.algorithms import ALGORITHMS

    control = [a.name for a in ALGORITHMS.values() if "control" in a.worlds]
    assert len(control) == 19 and len(ALGORITHMS) == 21  # the old help named 10
    text = _help("control", capsys)
    assert f"--algo STR Algorithm (19; `sppo-rl info` describes each): {', '.join(control)}. " in text
    text = _help("llm", capsys)
    assert f"Algorithm (21; `sppo-rl info` describes each): {', '.join(ALGORITHMS)}. " in text
    text = _help("sweep", capsys)
    assert f"Algorithms (19; `sppo-rl info` describes each): {', '.join(control)}. " in text


def test_sweep_help_names_the_tasks(capsys):
    from sppo_rl.envs.tasks import TASKS

    text = _help("sweep", capsys)
    assert "sppo_rl.envs.tasks.TASKS" not in text
    assert f"Control tasks (short names; `sppo-rl info` shows each): {', '.join(TASKS)}. " in text


def test_control_help_hides_and_control_refuses_llm_only_flags(tmp_path, capsys):
    assert "--tis-cap" in _help("llm", capsys)
    assert "--tis-cap" not in _help("control", capsys)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["control", "--task", "short-cartpole", "--tis-cap", "2", "--out-dir", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "sppo-rl: error: --tis-cap must be unset in the control world (it corrects a rollout engine's log-probs: "
        "an sppo-rl llm setting), got 2.0"
    ]
    assert not out.exists()
