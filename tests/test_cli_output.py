"""What a user sees: the end of a run says what came out and where, `info` lists what it says it lists."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios

import pytest
from paths import child_env, grpo_cartpole_cmd

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
    for name in (
        "sppo",
        "grpo",
        "spo",
        "astar-po",
        "precision-cartpole",
        "hopper",
        "arithmetic",
        "sppo-7b-dapo",
    ):
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
    assert len(control) == 24 and len(ALGORITHMS) == 26  # the old help named 10
    text = _help("control", capsys)
    assert f"--algo STR Algorithm (24; `sppo-rl info` describes each): {', '.join(control)}. " in text
    text = _help("llm", capsys)
    assert f"Algorithm (26; `sppo-rl info` describes each): {', '.join(ALGORITHMS)}. " in text
    text = _help("sweep", capsys)
    assert f"Algorithms (24; `sppo-rl info` describes each): {', '.join(control)}. " in text


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


PROGRESS = re.compile(r"^\[sppo-rl\] grpo/short-cartpole update (\d+)/4 \| success \d\.\d\d \| sps \d+ \| ")


# ----------------------------------------------------------------------------------- progress


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path):
    r = subprocess.run(
        grpo_cartpole_cmd(tmp_path / "run"), capture_output=True, text=True, env=child_env(), timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr  # tqdm's frames were 26 carriage returns on one physical line
    lines = r.stderr.splitlines()
    updates = [int(m.group(1)) for m in map(PROGRESS.match, lines) if m]
    assert updates == [1, 2, 3, 4]  # every max(1, 4 // 20) = 1 update
    done = next(i for i, line in enumerate(lines) if line.startswith("[sppo-rl] done:"))
    assert max(i for i, line in enumerate(lines) if PROGRESS.match(line)) < done


def test_no_progress_prints_only_the_final_lines(tmp_path):
    r = subprocess.run(grpo_cartpole_cmd(tmp_path / "run", "--no-progress"), capture_output=True, text=True, env=child_env(),
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("[sppo-rl]")]
    assert [line.split(":")[0] for line in lines] == [
        "[sppo-rl] done", "[sppo-rl] run folder", "[sppo-rl] wall time of the command", "[sppo-rl] next"]  # fmt: skip


def test_a_terminal_still_gets_the_tqdm_bar(tmp_path):
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    proc = subprocess.Popen(
        grpo_cartpole_cmd(tmp_path / "run"), stdin=child_fd, stdout=child_fd, stderr=child_fd, env=child_env()
    )
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(main_fd)
    text = b"".join(chunks).decode(errors="replace")
    assert "\r" in text and "4/4" in text
    assert not any(PROGRESS.match(line.strip("\r")) for line in text.splitlines())


# ----------------------------------------------------------------------------------- wall time


def test_wall_time_of_the_command_counts_from_the_process_start():
    """Python, then 1.5 s of work before the run plumbing is imported: the old clock started at that
    import and printed about 0.0 s."""
    code = ("import time; time.sleep(1.5)\n"
            "from pathlib import Path\n"
            "from sppo_rl.runtime.loop import announce\n"
            "announce(Path('x'), 'h', False)\n")  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    seconds = float(re.search(r"wall time of the command: ([\d.]+) s", r.stderr).group(1))
    assert seconds >= 1.5


def test_called_from_python_the_wall_time_is_the_run_loops(tmp_path, capsys):
    """In a notebook the process started long before the run: the line says what it measured."""
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import run_control

    run_control(ControlConfig(task="short-cartpole", algo="grpo", total_episodes=64, init_from="none",
                              progress=False, tensorboard=False, eval_episodes=4, out_dir=str(tmp_path / "r")))  # fmt: skip
    err = capsys.readouterr().err
    assert re.search(r"^\[sppo-rl\] wall time of the run loop: [\d.]+ s$", err, re.M), err
    assert "wall time of the command" not in err


# ----------------------------------------------------------------------------------- messages


def test_control_sigint_message_says_nothing_of_reward_scoring(tmp_path):
    proc = subprocess.Popen(grpo_cartpole_cmd(tmp_path / "run", "--total-episodes", "1000000"), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=child_env())  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:  # the first progress line: the run loop (and its signal handler) is on
        if " update 1/" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130
    assert "[sppo-rl] SIGINT received: finishing this update, then saving a checkpoint\n" in rest
    assert "reward scoring" not in rest  # the control world scores no rewards


def test_critic_from_a_causal_lm_folder_prints_no_head_load_report(tmp_path, capfd):
    from transformers import LlamaConfig, LlamaForCausalLM

    from sppo_rl.llm.models.critic import SequenceCritic

    lm = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))  # fmt: skip
    lm.save_pretrained(tmp_path / "lm")
    capfd.readouterr()
    SequenceCritic.from_backbone(tmp_path / "lm")
    assert "LOAD REPORT" not in capfd.readouterr().err  # was a table: lm_head.weight | UNEXPECTED


def test_head_only_report_filter_keeps_every_other_report():
    import logging

    from sppo_rl.llm.models.critic import _HeadOnlyReport

    def kept(table: str) -> bool:
        text = "\x1b[1mLlamaModel LOAD REPORT\x1b[0m from: x\nKey | Status | |\n----+----+-+-\n" + table
        return _HeadOnlyReport().filter(logging.LogRecord("t", logging.WARNING, "", 0, text, None, None))

    assert not kept("lm_head.weight | UNEXPECTED | |\n")
    assert kept("lm_head.weight | UNEXPECTED | |\nlayers.0.mlp.up_proj.weight | MISSING | |\n")
    assert kept("norm.weight | UNEXPECTED | |\n")


def test_first_embedded_llm_run_says_up_front_it_builds_the_warm_start(tmp_path, capsys):
    from sppo_rl.llm.config import SFT, LLMConfig
    from sppo_rl.llm.trainer import run_llm

    def run(name: str) -> str:
        cfg = LLMConfig(task="arithmetic", updates=1, prompts_per_step=2, train_size=16, val_size=4, eval_samples=1,
                        max_new_tokens=4, sft=SFT(steps=1), out_dir=str(tmp_path / name), progress=False,
                        tensorboard=False, cache_dir=str(tmp_path / "cache"))  # fmt: skip
        run_llm(cfg)
        return capsys.readouterr().err

    first = run("a")
    notice = "[sppo-rl] building the warm start of the embedded model once (up to 1 supervised steps; "
    assert notice in first and first.index(notice) < first.index("[sppo-rl] done:")
    assert "cached in " + str(tmp_path / "cache" / "sft-") in first
    assert notice not in run("b")  # cached: no notice, no wait
