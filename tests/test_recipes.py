"""The paper's recipes load, and one runs for real on CPU with its large-scale settings overridden."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import FIXTURES

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.models.tiny import TINY_CHARSET
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.recipes import load_recipe, recipe_names
from sppo_rl.runtime.run import RunError


def test_every_recipe_is_a_valid_config():
    names = recipe_names()
    assert {
        "sppo-1.5b-deepscaler",
        "grpo-1.5b-deepscaler",
        "sppo-7b-dapo",
        "sppo-7b-dapo-1.5b-critic",
    } <= set(names)
    for name in names:
        cfg = load_recipe(LLMConfig, name)
        assert (
            cfg.engine == "deepspeed"
            and cfg.rollout == "vllm"
            and cfg.temperature == 0.6
            and cfg.kl_coef in (0, 0.001)
        )
    assert load_recipe(LLMConfig, "sppo-7b-dapo-1.5b-critic").critic_model.endswith("1.5B")
    assert load_recipe(LLMConfig, "grpo-7b-dapo").group_size == 8


def test_bad_recipes_are_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"algo": "sppo", "lerning_rate": 1}))
    with pytest.raises(RunError, match="unknown field.*lerning_rate"):
        load_recipe(LLMConfig, file=bad)
    bad.write_text('{\n  "algo": \n}')
    with pytest.raises(RunError, match=r"bad.json:3: not valid JSON"):
        load_recipe(LLMConfig, file=bad)
    with pytest.raises(RunError, match="built-in recipes: .*sppo-7b-dapo"):
        load_recipe(LLMConfig, "no-such-recipe")


def test_recipe_runs_on_cpu_with_overrides(tmp_path):
    """The 7B recipe's pipeline (verl parquet prompts, math verifier, SPPO) on the tiny model, one process."""
    from sppo_rl.llm.models.tiny import ensure_tiny_model

    # a context of 4096 positions: every fixture prompt fits (longer ones would be skipped)
    tiny = ensure_tiny_model(
        tmp_path / "cache",
        TINY_CHARSET,
        hidden_size=32,
        layers=1,
        heads=2,
        kv_heads=1,
        max_position_embeddings=4096,
    )
    data = FIXTURES / "dapo-math-17k_dedup.parquet"
    val = FIXTURES / "math__math_500.parquet"
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "sppo_rl",
        "llm",
        "--recipe",
        "sppo-7b-dapo",
        "--model",
        str(tiny),
        "--task",
        str(data),
        "--val-data",
        str(val),
        "--val-size",
        "4",
        "--eval-samples",
        "1",
        "--engine",
        "torch",
        "--rollout",
        "hf",
        "--dtype",
        "float32",
        "--no-gradient-checkpointing",
        "--updates",
        "1",
        "--prompts-per-step",
        "2",
        "--minibatches",
        "1",
        "--max-new-tokens",
        "8",
        "--threads",
        "1",
        "--no-progress",
        "--out-dir",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["actor_lr"] == 1e-6 and cfg["critic_lr"] == 1e-5 and cfg["temperature"] == 0.6
    assert cfg["resolved"]["reward_fn"] == "math" and cfg["resolved"]["train_examples"] == 24
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["update"] == 1 and "val_accuracy" in rows[0]
    assert Path(out / "final" / "actor" / "config.json").exists()


# ------------------------------------------------------------ a built-in recipe is found by name only


def _downloaded(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A run to protect, a reward file that leaves a mark when imported, and ``downloaded.json``: a recipe
    aimed at both, which a name joined into the recipes folder as a path would load as a trusted built-in."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "metrics.jsonl").write_text('{"step": 1}\n')
    mark = tmp_path / "imported"
    evil = tmp_path / "evil_reward.py"
    evil.write_text(f"open({str(mark)!r}, 'w').write('ran')\ndef f(response, truth):\n    return 1.0\n")
    (tmp_path / "downloaded.json").write_text(
        json.dumps({"out_dir": str(victim), "overwrite": True, "reward_fn": f"{evil}:f", "updates": 1})
    )
    return victim, mark, tmp_path / "downloaded"


@pytest.mark.parametrize("form", ["absolute", "absolute.json", "dotdot", "subfolder", "backslash"])
def test_recipe_is_a_name_never_a_path(tmp_path, capsys, monkeypatch, form):
    """``--recipe`` takes a built-in recipe's name; a path (absolute, ``../``, any separator) is refused in
    one line, exit 2, naming ``--recipe-file``; nothing is deleted or imported. Before: the absolute path
    without its suffix was joined into the recipes folder, loaded as trusted, and wiped the victim run."""
    from sppo_rl.cli import main

    victim, mark, path = _downloaded(tmp_path)
    monkeypatch.chdir(tmp_path)
    up = Path("..") / Path(*[".."] * len(Path(__file__).resolve().parents)) / str(path).lstrip("/")
    value = {
        "absolute": str(path),
        "absolute.json": f"{path}.json",
        "dotdot": str(up),
        "subfolder": "sub/sppo-7b-dapo",
        "backslash": "sub\\sppo-7b-dapo",
    }[form]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["llm", "--recipe", value])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1, lines
    assert "not a path" in lines[0] and "--recipe-file" in lines[0], lines[0]
    assert (victim / "metrics.jsonl").read_text() == '{"step": 1}\n' and not mark.exists()


def test_a_sweep_resolves_its_runs_recipe_by_name_only(tmp_path):
    """The same through a sweep's run flags: refused before any file, the victim intact."""
    from sppo_rl.experiments.config import SweepConfig
    from sppo_rl.experiments.sweep import parse_llm, sweep

    victim, mark, path = _downloaded(tmp_path)
    out = tmp_path / "sweep"
    cfg = SweepConfig(
        world="llm", runs={"a": f"--recipe {path}"}, seeds=(0,), out_dir=str(out), progress=False
    )
    with pytest.raises(ValueError, match="a built-in recipe's name, not a path"):
        sweep(cfg)
    with pytest.raises(ValueError, match="not a path.*--recipe-file"):
        parse_llm(["--recipe", str(path)])
    assert not out.exists() and (victim / "metrics.jsonl").exists() and not mark.exists()


def test_a_recipe_file_is_passed_explicitly_and_read_as_data(tmp_path, capsys):
    """``--recipe-file`` loads the user's file as untrusted data (its out_dir/overwrite/reward file refused
    unless given on the command line or ``--trust-recipe``); a built-in name there is a file name only."""
    from sppo_rl.cli import main
    from sppo_rl.runtime.recipes import recipe_default

    victim, mark, path = _downloaded(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["llm", "--recipe-file", f"{path}.json"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and "hyperparameters only" in lines[0], lines
    assert load_recipe(LLMConfig, file=f"{path}.json", trust=True).updates == 1
    with pytest.raises(RunError, match="--recipe-file sppo-7b-dapo: no such file"):
        load_recipe(LLMConfig, file="sppo-7b-dapo")
    with pytest.raises(RunError, match="give one recipe"):
        recipe_default(LLMConfig, ["--recipe", "sppo-7b-dapo", "--recipe-file", f"{path}.json"])
    assert (
        load_recipe(LLMConfig, "sppo-7b-dapo.json").group_size
        == load_recipe(LLMConfig, "sppo-7b-dapo").group_size
    )
    assert (victim / "metrics.jsonl").exists() and not mark.exists()
