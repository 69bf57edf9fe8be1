"""What a user sees of a run: a run that cannot learn says so, progress readable in a log file, run files
readable by others as the umask says, an honest wall time, a model card in the exported actor."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from sppo_rl.cli import main
from sppo_rl.runtime.watch import not_learning
from tests.paths import REPO, outside_a_launcher

PROGRESS = re.compile(r"^\[sppo-rl\] grpo/short-cartpole update (\d+)/4 \| success \d\.\d\d \| sps \d+ \| ")


def _env() -> dict[str, str]:
    env = outside_a_launcher(dict(os.environ))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _control(out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "sppo_rl", "control", "--task", "short-cartpole", "--algo", "grpo",
            "--total-episodes", "256", "--init-from", "none", "--eval-episodes", "4", "--no-tensorboard",
            "--out-dir", str(out), *flags]  # fmt: skip


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
    llm = [{"step": 0, "val_accuracy": 0.1}] + [
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

    cfg = LLMConfig(task="arithmetic", model=str(tiny), algo="grpo", group_size=2, steps=2, prompts_per_step=2,
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


# ----------------------------------------------------------------------------------- progress


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path):
    r = subprocess.run(_control(tmp_path / "run"), capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr  # tqdm's frames were 26 carriage returns on one physical line
    lines = r.stderr.splitlines()
    updates = [int(m.group(1)) for m in map(PROGRESS.match, lines) if m]
    assert updates == [1, 2, 3, 4]  # every max(1, 4 // 20) = 1 update
    done = next(i for i, line in enumerate(lines) if line.startswith("[sppo-rl] done:"))
    assert max(i for i, line in enumerate(lines) if PROGRESS.match(line)) < done


def test_no_progress_prints_only_the_final_lines(tmp_path):
    r = subprocess.run(_control(tmp_path / "run", "--no-progress"), capture_output=True, text=True, env=_env(),
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("[sppo-rl]")]
    assert [line.split(":")[0] for line in lines] == [
        "[sppo-rl] done", "[sppo-rl] run folder", "[sppo-rl] wall time of the command", "[sppo-rl] next"]  # fmt: skip


def test_a_terminal_still_gets_the_tqdm_bar(tmp_path):
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    proc = subprocess.Popen(
        _control(tmp_path / "run"), stdin=child_fd, stdout=child_fd, stderr=child_fd, env=_env()
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
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
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


# ----------------------------------------------------------------------------------- file modes


UMASK_SCRIPT = """
import os, sys
os.umask(0o022)
from sppo_rl.cli import main
if __name__ == "__main__":
    main(sys.argv[1:])
"""


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mode & 0o777 for p in root.rglob("*")}


def _run_with_umask(tmp_path: Path, args: list[str]) -> tuple[dict[str, int], str]:
    script = tmp_path / "umask_main.py"
    script.write_text(UMASK_SCRIPT)
    r = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=_env(), timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return _modes(Path(args[args.index("--out-dir") + 1])), r.stdout + r.stderr


def test_control_run_files_follow_the_umask(tmp_path):
    out = tmp_path / "run"
    modes, _ = _run_with_umask(tmp_path, _control(out, "--no-progress")[3:])
    for name in (
        "config.json",
        "summary.json",
        "metrics.jsonl",
        "final.pt",
        "checkpoints/ckpt-000000004/state.pt",
    ):
        assert modes[name] == 0o644, (name, oct(modes[name]))  # config.json and summary.json were 0600
    assert modes["checkpoints/ckpt-000000004"] == 0o755  # was mkdtemp's 0700
    assert {oct(m) for m in modes.values()} <= {"0o644", "0o755"}


def test_llm_run_files_follow_the_umask(tmp_path, tiny):
    out = tmp_path / "run"
    args = ["llm", "--task", "arithmetic", "--model", str(tiny), "--steps", "1", "--prompts-per-step", "2",
            "--train-size", "16", "--val-size", "4", "--eval-samples", "1", "--max-new-tokens", "4",
            "--no-progress", "--no-tensorboard", "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out)]  # fmt: skip
    modes, output = _run_with_umask(tmp_path, args)
    assert "Setting accelerator to CPU" not in output  # DeepSpeed's warning, on every --engine torch run
    for name in ("config.json", "summary.json", "metrics.jsonl", "final/actor/model.safetensors",
                 "final/critic/value_head.safetensors", "final/actor/README.md"):  # fmt: skip
        assert modes[name] == 0o644, (name, oct(modes[name]))  # safetensors' files were 0600
    assert modes["checkpoints/ckpt-000000001"] == 0o755
    assert {oct(m) for m in modes.values()} <= {"0o644", "0o755"}


@pytest.mark.parametrize("mask", [0o077, 0o027])
def test_atomic_writes_keep_a_stricter_umask(tmp_path, mask):
    code = (f"import os; os.umask({mask:#o})\n"
            "from pathlib import Path\n"
            "from sppo_rl.runtime.files import atomic_write_text\n"
            "atomic_write_text(Path(os.environ['F']), 'x')\n")  # fmt: skip
    f = tmp_path / "f.json"
    subprocess.run([sys.executable, "-c", code], env={**_env(), "F": str(f)}, check=True, timeout=60)
    assert f.stat().st_mode & 0o777 == 0o666 & ~mask


# ----------------------------------------------------------------------------------- messages


def test_control_sigint_message_says_nothing_of_reward_scoring(tmp_path):
    proc = subprocess.Popen(_control(tmp_path / "run", "--total-episodes", "1000000"), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=_env())  # fmt: skip
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
        cfg = LLMConfig(task="arithmetic", steps=1, prompts_per_step=2, train_size=16, val_size=4, eval_samples=1,
                        max_new_tokens=4, sft=SFT(steps=1), out_dir=str(tmp_path / name), progress=False,
                        tensorboard=False, cache_dir=str(tmp_path / "cache"))  # fmt: skip
        run_llm(cfg)
        return capsys.readouterr().err

    first = run("a")
    notice = "[sppo-rl] building the warm start of the embedded model once (up to 1 supervised steps; "
    assert notice in first and first.index(notice) < first.index("[sppo-rl] done:")
    assert "cached in " + str(tmp_path / "cache" / "sft-") in first
    assert notice not in run("b")  # cached: no notice, no wait


# ----------------------------------------------------------------------------------- packaging


def test_license_types_and_gymnasium_are_declared():
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    assert (REPO / "sppo_rl" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["sppo_rl"]
    assert any(
        d.startswith("gymnasium") for d in project["dependencies"]
    )  # `pip install sppo-rl` can run control


@pytest.mark.slow
def test_the_wheel_ships_license_types_and_gymnasium(tmp_path):
    import shutil
    import zipfile

    src = tmp_path / "src"  # a copy: building in place leaves build/ and *.egg-info in the repository
    shutil.copytree(REPO / "sppo_rl", src / "sppo_rl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, timeout=300, capture_output=True)  # fmt: skip
    (wheel,) = tmp_path.glob("sppo_rl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sppo_rl/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "sppo_rl/recipes/grpo-7b-dapo.json" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Requires-Dist: gymnasium<2,>=1.1\n" in meta
