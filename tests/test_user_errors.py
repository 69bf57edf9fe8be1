"""Every user mistake is refused in one line on stderr (``sppo-rl: error: ...``, naming the flag, or the
file and line), with exit code 2, before anything is written: no run folder is created, and an existing
one (even with ``--overwrite``) is left exactly as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import cli_refusal

from sppo_rl.config import ConfigError, RunConfig
from sppo_rl.control.config import ControlConfig
from sppo_rl.llm.config import LLMConfig
from sppo_rl.runtime.run import RunError

CONTROL = ["control", "--task", "short-cartpole", "--algo", "grpo", "--total-episodes", "64", "--no-progress"]
CONTROL += ["--no-tensorboard", "--eval-episodes", "0"]


def snapshot(folder: Path) -> dict[str, str] | None:
    """Every entry under ``folder`` with a hash of its bytes (None: the folder does not exist)."""
    if not folder.exists():
        return None
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def refused(capsys, argv: list[str], out: Path, *needles: str) -> str:
    """Run the CLI; assert exit code 2, exactly one stderr line naming ``needles``, ``out`` untouched."""
    before = snapshot(out)
    line = cli_refusal(capsys, [*argv, "--out-dir", str(out)], *needles)
    assert snapshot(out) == before, "the run folder was created or changed"
    return line


def fake_run(folder: Path) -> None:
    """A folder holding a finished run with every export, a sweep's lock and log, and the run lock."""
    (folder / "checkpoints" / "ckpt-000000002").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-000000002" / "state.pt").write_bytes(b"state")
    (folder / "final" / "actor").mkdir(parents=True)
    (folder / "final" / "actor" / "config.json").write_text("{}")
    (folder / "tb").mkdir()
    (folder / "tb" / "events").write_bytes(b"events")
    for name in ("metrics.jsonl", "summary.json", "config.json", "final.pt", "calibration.json"):
        (folder / name).write_text(f"old {name}\n")
    for name in ("critic_trace.npz", "wandb_id.txt", ".run.lock", ".lock", "log.txt"):
        (folder / name).write_text(f"old {name}\n")


# ------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--clip", "-1"], "--clip must be > 0"),
        (["--max-grad-norm", "-1"], "--max-grad-norm must be > 0"),
        (["--gamma", "2"], "--gamma must be in [0, 1]"),
        (["--lam", "-0.1"], "--lam must be in [0, 1]"),
        (["--hidden-sizes", "64", "0"], "--hidden-sizes must be layer widths >= 1"),
        (["--episodes-per-update", "0"], "--episodes-per-update must be >= 1"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be >= 1"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints must be >= 1"),
        (["--eval-every", "-1"], "--eval-every must be >= 0"),
        (["--eval-every", "2", "--eval-episodes", "0"], "--eval-episodes must be >= 1 when --eval-every"),
        (["--dual-clip", "1"], "--dual-clip must be > 1"),
        (["--actor-lr", "0"], "--actor-lr must be > 0"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--threads", "0"], "--threads must be in [1, "),
        (["--seed", "-3"], "--seed must be an integer in [0, 2^48 - 1"),
        (["--max-seconds", "0"], "--max-seconds must be > 0"),
        (["--ent-coef", "nan"], "--ent-coef must be >= 0"),
        (["--threads", "100000"], "--threads must be in [1, "),
        (["--threads", "5000"], "4 x this machine's CPUs), got 5000"),
        (["--seed", str(2**70)], f"--seed must be an integer in [0, 2^48 - 1 = {2**48 - 1}], got {2**70}"),
    ],
)
def test_control_numbers_out_of_range_are_refused(tmp_path, capsys, flags, named):
    refused(capsys, [*CONTROL, *flags], tmp_path / "run", named)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--updates", "0"], "--updates must be >= 1"),
        (["--prompts-per-step", "0"], "--prompts-per-step must be >= 1"),
        (["--temperature", "0"], "--temperature must be > 0"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--kl-coef", "-1"], "--kl-coef must be >= 0"),
        (["--kl-clamp", "-1"], "--kl-clamp must be >= 0"),
        (["--reward-timeout", "0"], "--reward-timeout must be > 0"),
        (["--group-size", "0"], "--group-size must be >= 1"),
        (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be >= 1"),
        (["--threads", "100000"], "--threads must be in [0, "),
        (["--threads", "5000"], "4 x this machine's CPUs); 0: auto, got 5000"),
        (["--threads", "-1"], "--threads must be in [0, "),
        (["--seed", str(2**70)], "--seed must be an integer in [0, 2^48 - 1"),
    ],
)
def test_llm_numbers_out_of_range_are_refused(tmp_path, capsys, flags, named):
    refused(capsys, ["llm", "--task", "arithmetic", *flags], tmp_path / "run", named)


def test_the_thread_bound_is_four_per_cpu_and_the_largest_seed_runs_everywhere(tmp_path):
    """``--threads`` is bounded by 4 x ``os.cpu_count()``, stated in the message; a seed at the top of
    its range is accepted, and every seed derived from it fits a torch generator (64 bits)."""
    import os

    import torch

    from sppo_rl.config import MAX_SEED, max_threads

    assert max_threads() == 4 * os.cpu_count()
    assert RunConfig(threads=max_threads()).problems() == []
    assert RunConfig(threads=max_threads() + 1).problems() == [
        f"--threads must be in [1, {max_threads()}] (4 x this machine's CPUs), got {max_threads() + 1}"
    ]
    assert LLMConfig(seed=MAX_SEED).problems() == [] and ControlConfig(seed=MAX_SEED).problems() == []
    torch.Generator().manual_seed(MAX_SEED * 7919 + 10**9)  # the minibatch order's seed of any update
    with pytest.raises(ValueError, match="Overflow"):
        torch.Generator().manual_seed(2**70)


def test_every_problem_is_named_in_the_one_line(tmp_path, capsys):
    line = refused(capsys, [*CONTROL, "--clip", "-1", "--gamma", "2"], tmp_path / "run")
    assert "--clip" in line and "--gamma" in line


def test_the_trainers_validate_too(tmp_path):
    """The Python API refuses the same settings before creating the run folder."""
    from sppo_rl.control.trainer import ControlRun
    from sppo_rl.llm.trainer import LLMRun

    with pytest.raises(ConfigError, match="--checkpoint-every must be >= 1"):
        ControlRun(ControlConfig(task="short-cartpole", checkpoint_every=0, out_dir=str(tmp_path / "c")))
    with pytest.raises(ConfigError, match="--epochs must be >= 1"):
        LLMRun(LLMConfig(epochs=0, out_dir=str(tmp_path / "l")))
    assert not (tmp_path / "c").exists() and not (tmp_path / "l").exists()


def test_a_sweep_validates_its_control_settings_before_any_run(tmp_path):
    from sppo_rl.experiments.config import SweepConfig
    from sppo_rl.experiments.sweep import plan

    cfg = SweepConfig(
        algos=("grpo",), tasks=("short-cartpole",), overrides={"epochs": "0"}, out_dir=str(tmp_path / "s")
    )
    with pytest.raises(ConfigError, match="--epochs must be >= 1"):
        plan(cfg)
    assert not (tmp_path / "s").exists()


def test_every_numeric_field_has_a_range():
    """A new int/float setting must get a line in its class's ``checks()`` (or be listed here)."""
    unchecked = {"data_seed"}  # any integer seeds the generated arithmetic splits
    for cls in (RunConfig, ControlConfig, LLMConfig):
        hints = typing.get_type_hints(cls)
        numeric = {
            f.name
            for f in dataclasses.fields(cls)
            if any(t in (int, float) for t in (hints[f.name], *typing.get_args(hints[f.name])))
            or f.name == "hidden_sizes"
        }
        checked = {name for name, _, _ in cls().checks()}
        assert numeric - checked - unchecked == set(), cls.__name__


def test_defaults_and_shipped_recipes_are_valid():
    from sppo_rl.runtime.recipes import load_recipe, recipe_names

    assert RunConfig().problems() == ControlConfig().problems() == LLMConfig().problems() == []
    for name in recipe_names():
        load_recipe(LLMConfig, name).validate()


# ------------------------------------------------------------------------------------- recipes


def test_a_recipe_value_of_the_wrong_type_names_file_and_line(tmp_path, capsys):
    recipe = tmp_path / "r.json"
    recipe.write_text('{\n  "algo": "grpo",\n  "updates": "ten"\n}\n')
    refused(
        capsys, ["llm", "--recipe-file", str(recipe)], tmp_path / "run", f"{recipe}:3", "updates", "integer"
    )


def test_a_recipe_value_out_of_range_names_file_and_line(tmp_path, capsys):
    recipe = tmp_path / "r.json"
    recipe.write_text('{\n  "clip": -1\n}\n')
    refused(
        capsys, ["control", "--recipe-file", str(recipe)], tmp_path / "run", f"{recipe}:2", "clip must be > 0"
    )


@pytest.mark.parametrize(
    "command, body, named",
    [
        ("llm", '"updates": 2,\n  "epochs": ' + "9" * 5000, ":3: epochs is an integer of 5,000 digits"),
        ("control", '"hidden_sizes": [64, -' + "1" * 5000 + "]", ":2: hidden_sizes holds an integer of 5,000 digits"),
        ("control", '"seed": ' + "1" * 31, ":2: seed is an integer of 31 digits"),
        ("llm", '"epochs": ' + "9" * 30, ":2: epochs must be at most 1,000,000,000"),
    ],
    ids=["5000-digits", "in-a-list", "31-digit-seed", "30-digits"],
)  # fmt: skip
def test_a_huge_integer_in_a_recipe_names_the_key(tmp_path, capsys, command, body, named):
    """A 5,000-digit integer used to end in Python's int-string limit error (a traceback, no key named)."""
    recipe = tmp_path / "r.json"
    recipe.write_text("{\n  " + body + "\n}\n")
    line = refused(capsys, [command, "--recipe-file", str(recipe)], tmp_path / "run", f"{recipe}{named}")
    assert len(line) < 300


def test_a_recipe_that_is_not_an_object_is_refused(tmp_path, capsys):
    recipe = tmp_path / "r.json"
    recipe.write_text("[1, 2]\n")
    refused(capsys, ["llm", "--recipe-file", str(recipe)], tmp_path / "run", str(recipe), "JSON object")


# ------------------------------------------------------------------------------------- control files


def test_init_from_a_file_that_is_not_a_checkpoint(tmp_path, capsys):
    junk = tmp_path / "notes.pt"
    junk.write_bytes(b"these are not weights")
    refused(capsys, [*CONTROL, "--init-from", str(junk)], tmp_path / "run", "--init-from", str(junk))


def test_resume_of_a_missing_folder_creates_nothing(tmp_path, capsys):
    refused(capsys, [*CONTROL, "--resume"], tmp_path / "run", "--resume: no checkpoint")


# ------------------------------------------------------------------------------------- overwrite


def test_overwrite_with_a_bad_setting_deletes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    fake_run(out)
    junk = tmp_path / "notes.pt"
    junk.write_bytes(b"these are not weights")
    refused(capsys, [*CONTROL, "--overwrite", "--init-from", str(junk)], out, "--init-from")
    refused(capsys, [*CONTROL, "--overwrite", "--clip", "-1"], out, "--clip")


def test_overwrite_with_bad_llm_data_deletes_nothing(tmp_path, capsys, tiny):
    out = tmp_path / "run"
    fake_run(out)
    missing = tmp_path / "nope.jsonl"
    refused(capsys, ["llm", "--model", str(tiny), "--task", str(missing), "--overwrite"], out, str(missing))


def test_overwrite_removes_the_whole_previous_run_but_the_locks_and_sweep_log(tmp_path):
    from sppo_rl.runtime.run import prepare_run_dir, unlock_run_dir

    out = tmp_path / "run"
    fake_run(out)
    prepare_run_dir(out, resume=False, overwrite=True)
    unlock_run_dir(out)
    assert sorted(p.name for p in out.iterdir()) == [".lock", ".run.lock", ".sppo-run.json", "log.txt"]
    assert (out / "log.txt").read_text() == "old log.txt\n"


def test_a_folder_holding_a_run_is_refused_without_creating_the_lock(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    refused(capsys, CONTROL, out, "already holds a run")


# ------------------------------------------------------------------------------------- llm files


@pytest.mark.parametrize("flag", ["--task", "--val-data"])
@pytest.mark.parametrize("kind", ["folder", "missing"])
def test_llm_data_that_is_a_folder_or_missing(tmp_path, capsys, tiny, flag, kind):
    data = tmp_path / "data.jsonl"
    if kind == "folder":
        data.mkdir()
    argv = ["llm", "--model", str(tiny), flag, str(data)]
    if flag == "--val-data":
        good = tmp_path / "train.jsonl"
        good.write_text('{"question": "1+1", "answer": "2"}\n')
        argv += ["--task", str(good)]
    refused(capsys, argv, tmp_path / "run", flag, str(data), "folder" if kind == "folder" else "not found")


def test_a_jsonl_line_nested_100000_deep(tmp_path, capsys, tiny):
    data = tmp_path / "deep.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    refused(
        capsys, ["llm", "--model", str(tiny), "--task", str(data)], tmp_path / "run", "deep.jsonl:2", "deep"
    )


def test_non_utf8_data_names_file_and_line(tmp_path, capsys, tiny):
    data = tmp_path / "latin1.jsonl"
    text = '{"question": "1+1", "answer": "2"}\n{"question": "caf\u00e9 1+2", "answer": "3"}\n'
    data.write_bytes(text.encode("latin-1"))
    refused(
        capsys,
        ["llm", "--model", str(tiny), "--task", str(data)],
        tmp_path / "run",
        "latin1.jsonl:2",
        "UTF-8",
    )


def test_a_lone_surrogate_in_a_prompt_names_file_and_line(tmp_path, capsys, tiny):
    """``"\\ud800"`` in a JSONL prompt used to reach the tokenizer (a ``TypeError`` traceback)."""
    data = tmp_path / "surrogate.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "\\ud800 1+2", "answer": "3"}\n')
    argv = ["llm", "--model", str(tiny), "--task", str(data)]
    refused(capsys, argv, tmp_path / "run", "surrogate.jsonl:2", "lone surrogate", "question")


def test_non_utf8_json_names_file_and_line(tmp_path):
    from sppo_rl.llm.data.files import DataError, load_examples

    data = tmp_path / "latin1.json"
    data.write_bytes(
        '[\n{"question": "1+1", "answer": "2"},\n{"question": "caf\u00e9", "answer": "3"}\n]'.encode(
            "latin-1"
        )
    )
    with pytest.raises(DataError, match="latin1.json:3: not UTF-8"):
        load_examples(data)


def test_critic_model_that_does_not_exist(tmp_path, capsys, tiny):
    argv = ["llm", "--model", str(tiny), "--algo", "sppo", "--critic-model", "/nonexistent"]
    refused(capsys, argv, tmp_path / "run", "--critic-model /nonexistent")


# ------------------------------------------------------------------------------------- refused before the lock


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for this block: a read-only bind mount as root (chmod does not stop root),
    else mode 0555; skips the test where neither is possible."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode != 0:
        pytest.skip("needs mount(2) as root for a read-only folder")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_max_new_tokens_beyond_the_context_is_refused_before_the_run_folder(tmp_path, capsys, tiny):
    """The embedded model's context (256) and a folder's ``config.json`` (512) are known before anything
    is built: ``--max-new-tokens 100000000`` used to be refused only after ``.run.lock`` existed."""
    flags = ["--max-new-tokens", "100000000", "--cache-dir", str(tmp_path / "cache")]
    refused(capsys, ["llm", *flags], tmp_path / "run", "--max-new-tokens 100000000", "context of 256 tokens")
    argv = ["llm", "--model", str(tiny), *flags]
    refused(capsys, argv, tmp_path / "run", "--max-new-tokens 100000000", "context of 512 tokens")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_cache_dir_that_is_a_file_is_refused_before_the_run_folder(tmp_path, capsys, under):
    cache = tmp_path / "cache.txt"
    cache.write_text("not a folder")
    given = cache / under if under else cache
    argv = ["llm", "--cache-dir", str(given)]
    refused(capsys, argv, tmp_path / "run", f"--cache-dir {given}: {cache} is a file, not a folder")


def test_a_critic_with_another_tokenizer_is_refused_before_the_run_folder(tmp_path, capsys, tiny):
    from sppo_rl.llm.models.tiny import ensure_tiny_model

    digits = ensure_tiny_model(
        tmp_path / "other", "0123456789+=", hidden_size=32, layers=1, heads=2, kv_heads=1
    )
    argv = ["llm", "--model", str(tiny), "--algo", "sppo", "--critic-model", str(digits)]
    refused(capsys, argv, tmp_path / "run", f"--critic-model {digits}: the critic's tokenizer differs")


def test_a_read_only_cache_is_refused_when_a_model_must_be_built_and_used_when_it_holds_it(tmp_path, capsys):
    from sppo_rl.llm.models.pretrained import CHECKSUMS
    from sppo_rl.llm.models.sources import check_cache, models_to_build
    from sppo_rl.llm.plan import warm_start_of

    cache = tmp_path / "cache"
    cache.mkdir()
    with read_only(cache):
        argv = ["llm", "--cache-dir", str(cache)]
        refused(
            capsys,
            argv,
            tmp_path / "run",
            f"--cache-dir {cache}: {cache} is not writable",
            "embedded tiny model",
        )
    named = LLMConfig(model="smollm2-135m:layers=4", algo="grpo", cache_dir=str(cache))
    ws = warm_start_of(named, cache)
    assert models_to_build(named, cache, ws) == ["smollm2-135m-layers4-v1"]
    (cache / "smollm2-135m-layers4-v1").mkdir()
    (cache / "smollm2-135m-layers4-v1" / CHECKSUMS).write_text("{}")
    assert models_to_build(named, cache, ws) == []
    with read_only(cache):
        check_cache(named, cache, ws)  # everything the run needs is there: a read-only cache serves it
        with pytest.raises(RunError, match="is not writable .* smollm2-135m-v1 must be built"):
            check_cache(dataclasses.replace(named, model="smollm2-135m"), cache, ws)


# ------------------------------------------------------------------------------------- launcher variables


@pytest.mark.parametrize(
    "env, named",
    [
        ({"RANK": "1"}, "RANK=1 in the environment: a rank must be in [0, 0] (WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 in the environment: the number of processes must be in [1,"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE=-1 in the environment"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' in the environment is not an integer"),
        ({"WORLD_SIZE": "9" * 5000}, "WORLD_SIZE='999"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 in the environment: a rank must be in [0, 1]"),
        ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x' in the environment is not an integer"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"}, "LOCAL_RANK=2 in the environment"),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE=3 in the environment"),
    ],
    ids=["rank-alone", "world-0", "world-neg", "world-abc", "world-5000-digits", "rank-too-big",
         "local-abc", "local-rank-too-big", "local-world-too-big"],
)  # fmt: skip
def test_stale_launcher_variables_are_refused_naming_the_variable(tmp_path, capsys, monkeypatch, env, named):
    """A launcher's variables left in the environment (a ``RANK`` without its ``WORLD_SIZE``, a zero
    or garbled one) used to end in a ZeroDivisionError, an unpack of None, "--minibatches must be in
    [1, -4]" or int()'s message without the variable's name."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["llm", "--task", "arithmetic", "--train-size", "16", "--val-size", "4", "--algo", "grpo"]
    refused(capsys, argv, tmp_path / "run", named)


def test_launcher_variables_of_a_real_launch_are_read():
    from sppo_rl.runtime.launcher import launcher_env

    assert launcher_env({}) == {"WORLD_SIZE": 1, "RANK": 0, "LOCAL_WORLD_SIZE": None, "LOCAL_RANK": 0}
    torchrun = {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert launcher_env(torchrun) == {"WORLD_SIZE": 8, "RANK": 5, "LOCAL_WORLD_SIZE": 4, "LOCAL_RANK": 1}
    deepspeed = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}  # no LOCAL_WORLD_SIZE
    assert launcher_env(deepspeed)["LOCAL_RANK"] == 1


# ------------------------------------------------------------------------------------- reward files

LLM_SMALL = ["llm", "--task", "arithmetic", "--train-size", "16", "--val-size", "4", "--algo", "grpo"]


@pytest.mark.parametrize(
    "body, named",
    [
        ("raise SystemExit(3)\n", "SystemExit"),
        ("import os\nos._exit(4)\n", "exit code 4"),
        ("import time\ntime.sleep(3600)\n", "did not load the function within"),
    ],
    ids=["SystemExit", "os._exit", "hang"],
)
def test_a_reward_file_that_exits_or_hangs_at_import(tmp_path, capsys, monkeypatch, tiny, body, named):
    from sppo_rl.llm.rewards.scorer import RewardScorer

    monkeypatch.setitem(RewardScorer.__init__.__kwdefaults__, "start_timeout_s", 3.0)
    fn = tmp_path / "reward.py"
    fn.write_text(body + "def score(response, truth):\n    return 1.0\n")
    argv = [*LLM_SMALL, "--model", str(tiny), "--reward-fn", f"{fn}:score"]
    refused(capsys, argv, tmp_path / "run", f"--reward-fn {fn}:score", named)


def test_a_reward_outside_0_1_is_an_error_scored_0_with_one_warning(tmp_path, capsys):
    from sppo_rl.llm.rewards.scorer import RewardScorer

    fn = tmp_path / "reward.py"
    fn.write_text(
        "def score(response, truth):\n    return {'a': -5, 'b': 2.5, 'c': 0.5, 'd': True}.get(response, 1)\n"
    )
    with RewardScorer(f"{fn}:score", timeout_s=5.0) as scorer:
        res = scorer.score(["a", "b", "c", "d", "e", "a"], ["-"] * 6)
    assert res.scores.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0, 0.0]
    assert res.errors == 3
    assert "outside [0, 1]" in res.error_samples[0]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "-5" in warnings[0] and "[0, 1]" in warnings[0]


def test_each_world_validates_its_settings_once_per_run(tmp_path, capsys, monkeypatch, tiny):
    """The plan's ``resolve`` is the one place a run's settings are validated: the command leaves it to
    it (still one line, exit 2, nothing written), and a bad setting is still refused before any other
    check."""
    from sppo_rl.config import RunConfig

    calls: list[str] = []
    validate = RunConfig.validate

    def counted(self: RunConfig) -> None:
        calls.append(type(self).__name__)
        validate(self)

    monkeypatch.setattr(RunConfig, "validate", counted)
    missing = str(tmp_path / "nowhere")
    refused(capsys, ["llm", "--model", missing], tmp_path / "run", f"--model {missing}: not a Hugging Face")
    assert calls == ["LLMConfig"]
    calls.clear()
    refused(capsys, ["control", "--algo", "latent-grpo"], tmp_path / "run", "trains a language model only")
    assert calls == ["ControlConfig"]
    calls.clear()
    refused(capsys, ["llm", "--model", missing, "--temperature", "-1"], tmp_path / "run", "--temperature")
    assert calls == ["LLMConfig"]
    calls.clear()  # the Python API validates before it writes its data files, and the run does not again
    from sppo_rl import api

    with pytest.raises(RunError, match="not a Hugging Face"):
        api.train_llm([{"prompt": "1+1=", "answer": "2"}], model=missing, out_dir=str(tmp_path / "api"))
    assert calls == ["LLMConfig"] and not (tmp_path / "api").exists()
    calls.clear()
    api.train_llm(model=str(tiny), updates=1, prompts_per_step=2, train_size=8, val_size=2, eval_every=0,
                  max_new_tokens=4, out_dir=str(tmp_path / "api-run"), progress=False, tensorboard=False,
                  threads=1)  # fmt: skip
    assert calls == ["LLMConfig"]
