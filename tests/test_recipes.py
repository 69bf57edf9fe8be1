"""The paper's recipes load, and one runs for real on CPU with its large-scale settings overridden."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import FIXTURES

from sppo_rl.cli import load_recipe, recipe_names
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.setup import TINY_CHARSET
from sppo_rl.runtime import RunError, read_metrics


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
        load_recipe(LLMConfig, str(bad))
    bad.write_text('{\n  "algo": \n}')
    with pytest.raises(RunError, match=r"bad.json:3: not valid JSON"):
        load_recipe(LLMConfig, str(bad))
    with pytest.raises(RunError, match="built-in recipes: .*sppo-7b-dapo"):
        load_recipe(LLMConfig, "no-such-recipe")


def test_recipe_runs_on_cpu_with_overrides(tmp_path):
    """The 7B recipe's pipeline (verl parquet prompts, math verifier, SPPO) on the tiny model, one process."""
    from sppo_rl.llm.tiny import ensure_tiny_model

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
        "--steps",
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
    assert rows[-1]["step"] == 1 and "val_accuracy" in rows[0]
    assert Path(out / "final" / "actor" / "config.json").exists()
