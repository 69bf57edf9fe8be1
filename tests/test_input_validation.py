"""Untrusted input refused before any work: recipes are data, absurd budgets, model folders checked
before anything is built, a reward that cannot pay the data, data rows that contradict each other,
references that can never be paid. Every refusal: one line on stderr, exit 2, no run folder (GSM8K's
``#### n`` answer is read by the math reward: ``test_reward.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import FIXTURES, cli_refusal, write_jsonl

from sppo_rl.cli import main
from sppo_rl.llm.config import LLMConfig
from sppo_rl.runtime.recipes import load_recipe, recipe_names
from sppo_rl.runtime.run import RunError

MATH500 = FIXTURES / "math__math_500.parquet"


def refused(capsys, argv: list[str], out: Path, *needles: str) -> str:
    """Run the CLI in this process: exit 2, exactly one stderr line holding ``needles``, ``out`` never created."""
    line = cli_refusal(capsys, argv, *needles)
    assert not out.exists(), "a run folder was left"
    return line


# ---------------------------------------------------------------------------------- recipes are data


def _victim(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A finished run to protect, a reward file that leaves a mark when imported, a recipe aiming at both."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "metrics.jsonl").write_text('{"step": 1}\n')
    (victim / "config.json").write_text("{}")
    mark = tmp_path / "imported"
    evil = tmp_path / "evil_reward.py"
    evil.write_text(f"open({str(mark)!r}, 'w').write('ran')\ndef f(response, truth):\n    return 1.0\n")
    recipe = tmp_path / "paper.json"
    recipe.write_text(
        json.dumps({"algo": "grpo", "out_dir": str(victim), "overwrite": True, "reward_fn": f"{evil}:f"})
    )
    return victim, mark, recipe


def test_a_recipe_cannot_delete_a_run_or_import_code(tmp_path, capsys):
    """Before: the victim run was wiped and the reward file imported."""
    victim, mark, recipe = _victim(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["llm", "--recipe-file", str(recipe)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1, lines
    for word in ("hyperparameters only", "out_dir", "overwrite", "reward_fn", "--trust-recipe"):
        assert word in lines[0]
    assert (victim / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert not mark.exists()


def test_unsafe_recipe_fields_pass_when_given_on_the_command_line_or_trusted(tmp_path):
    victim, mark, recipe = _victim(tmp_path)
    with pytest.raises(RunError, match="out_dir.*overwrite.*reward_fn"):
        load_recipe(LLMConfig, file=recipe)
    with pytest.raises(RunError, match="reward_fn") as e:
        load_recipe(LLMConfig, file=recipe, given={"out_dir", "overwrite"})
    assert "out_dir" not in str(e.value)
    cfg = load_recipe(LLMConfig, file=recipe, given={"out_dir", "overwrite", "reward_fn"})
    assert cfg.algo == "grpo"
    cfg = load_recipe(LLMConfig, file=recipe, trust=True)
    assert cfg.out_dir == str(victim) and cfg.overwrite is True
    assert not mark.exists()  # loading a recipe never imports its reward


def test_trust_recipe_and_command_line_flags_from_the_cli(tmp_path, capsys):
    """With --trust-recipe, or with every unsafe field's flag given, the recipe loads and the run goes on
    to its next check (here --updates 0, refused before anything is touched)."""
    victim, mark, recipe = _victim(tmp_path)
    own = tmp_path / "mine"
    line = refused(
        capsys, ["llm", "--recipe-file", str(recipe), "--trust-recipe", "--updates", "0"], own, "--updates"
    )
    assert "recipe" not in line
    argv = [
        "llm",
        "--recipe-file",
        str(recipe),
        "--out-dir",
        str(own),
        "--no-overwrite",
        "--reward-fn",
        "math",
    ]
    line = refused(capsys, [*argv, "--updates", "0"], own, "--updates")
    assert "recipe" not in line
    assert (victim / "metrics.jsonl").exists() and not mark.exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("resume", True),
        ("model", "/some/model"),
        ("critic_model", "/some/critic"),
        ("cache_dir", "/tmp/elsewhere"),
        ("wandb_mode", "online"),
        ("reward_fn", "os:system"),
    ],
)
def test_each_unsafe_field_is_refused_from_a_recipe_file(tmp_path, field, value):
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"updates": 3, field: value}))
    with pytest.raises(RunError, match=field):
        load_recipe(LLMConfig, file=recipe)


def test_harmless_values_of_those_fields_load(tmp_path):
    recipe = tmp_path / "r.json"
    recipe.write_text(
        json.dumps(
            {
                "updates": 3,
                "reward_fn": "math",
                "overwrite": False,
                "critic_model": "none",
                "task": "x.parquet",
            }
        )
    )
    cfg = load_recipe(LLMConfig, file=recipe)
    assert (cfg.updates, cfg.reward_fn, cfg.critic_model) == (3, "math", "none")


def test_the_shipped_recipes_still_load_though_they_name_models():
    for name in recipe_names():
        cfg = load_recipe(LLMConfig, name)
        cfg.validate()
        assert cfg.model  # trusted: shipped with the package


def test_a_key_given_twice_in_a_recipe_is_refused_naming_the_line(tmp_path, capsys):
    """Before: the last value won silently."""
    recipe = tmp_path / "r.json"
    recipe.write_text('{\n  "updates": 5,\n  "algo": "grpo",\n  "updates": 500\n}\n')
    refused(
        capsys,
        ["llm", "--recipe-file", str(recipe), "--out-dir", str(tmp_path / "run")],
        tmp_path / "run",
        f"{recipe}:4",
        "updates is given twice",
    )


@pytest.mark.parametrize("argv", [["--updates", str(10**30)], ["--prompts-per-step", str(10**12)]])
def test_an_absurd_budget_is_refused(tmp_path, capsys, argv):
    """Before: ``--updates 10^30`` was accepted."""
    out = tmp_path / "run"
    refused(capsys, ["llm", *argv, "--out-dir", str(out)], out, "must be at most 1,000,000,000")


def test_an_absurd_budget_in_a_recipe_names_the_line(tmp_path, capsys):
    recipe = tmp_path / "r.json"
    recipe.write_text('{\n  "algo": "grpo",\n  "updates": 1000000000000000000000000000000\n}\n')
    out = tmp_path / "run"
    refused(
        capsys, ["llm", "--recipe-file", str(recipe), "--out-dir", str(out)], out, f"{recipe}:3", "updates"
    )


def test_seeds_are_not_budgets():
    assert LLMConfig(seed=2**40, data_seed=2**40).problems() == []
    assert LLMConfig(updates=10**9).problems() == []
    assert LLMConfig(updates=10**9 + 1).problems() != []


# ------------------------------------------------------------------------------- model folder checks

BASE_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "vocab_size": 98,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def _model(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**BASE_CONFIG, **changes}))
    return folder


def test_parameter_estimate_bounds_the_real_count_from_above(tmp_path):
    """By hand: V h + L (4 h^2 + 3 h I) = 98*128 + 4*(4*128^2 + 3*128*512) = 12,544 + 1,048,576. The tiny
    Qwen2 built from the same config (on the meta device, no memory) has fewer, grouped KV heads using 3 h^2."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from sppo_rl.llm.models.checks import estimate_parameters

    assert estimate_parameters(BASE_CONFIG) == 1_061_120
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(_model(tmp_path)))
    real = sum(p.numel() for p in model.parameters())
    assert real <= 1_061_120 <= 1.1 * real


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"num_hidden_layers": 1_000_000}, "parameters"),
        ({"vocab_size": 10**12}, "vocab_size must be an integer in [1, 1,000,000,000]"),
        ({"hidden_size": 10**6}, "parameters"),
        ({"intermediate_size": 10**9}, "parameters"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"hidden_size": "128"}, "hidden_size"),
        ({"model_type": "no-such-architecture"}, "transformers cannot read its config.json"),
    ],
)
def test_a_hostile_model_config_is_refused_before_anything_is_built(tmp_path, capsys, changes, needle):
    """Before: 10^6 layers were built until memory ran out; the others ended in a traceback, each leaving
    a run folder holding .run.lock."""
    model = _model(tmp_path, **changes)
    out = tmp_path / "run"
    argv = ["llm", "--model", str(model), "--task", str(MATH500), "--out-dir", str(out), "--no-progress"]
    line = refused(capsys, argv, out, "--model", needle)
    if needle == "parameters":
        assert "GiB" in line


def test_a_config_that_is_not_an_object_is_one_line(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("[1, 2]")
    out = tmp_path / "run"
    refused(
        capsys,
        ["llm", "--model", str(model), "--task", str(MATH500), "--out-dir", str(out)],
        out,
        "JSON object",
    )


def test_the_million_layer_config_from_the_command_line(tmp_path):
    """The real command: exit 2 and one line, no run folder (it used to grow past 1.6 GB)."""
    model = _model(tmp_path, num_hidden_layers=1_000_000)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sppo_rl", "llm", "--model", str(model), "--task", str(MATH500)]
    p = subprocess.run([*cmd, "--out-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "parameters" in p.stderr and not out.exists()


def test_a_model_that_fits_is_not_refused(tmp_path):
    from sppo_rl.llm.models.checks import check_model_config

    check_model_config(_model(tmp_path), "--model")  # about 4 MB of weights
    with pytest.raises(ValueError, match="more than the 0.0 GiB"):
        check_model_config(_model(tmp_path), "--model", memory=1000)


# ---------------------------------------------------------------------------- reward against the data


def test_the_integer_reward_on_non_integer_references_is_refused(tmp_path, capsys):
    """Before: the run went to "done" with every rollout invalid and nothing trained."""
    data = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": f"p{i}", "answer": a} for i, a in enumerate(["3", r"\frac{1}{2}"])]
    )
    model = _model(tmp_path)
    out = tmp_path / "run"
    argv = [
        "llm",
        "--model",
        str(model),
        "--task",
        str(data),
        "--reward-fn",
        "integer",
        "--out-dir",
        str(out),
    ]
    refused(capsys, argv, out, "--reward-fn integer", "1 of 2", r"\\frac{1}{2}", "--reward-fn math")


def test_the_integer_reward_on_integer_references_passes_the_check():
    from sppo_rl.llm.data.files import Example, non_integer_references

    examples = [Example("p", a) for a in ["3", "-12", " 7 ", "1,000", "2.0"]]
    assert [e.answer for e in non_integer_references(examples)] == ["1,000", "2.0"]


# ------------------------------------------------------------------------------ data that contradicts


def test_a_prompt_with_two_different_answers_is_refused(tmp_path):
    """Before: accepted silently (no response can be right for both)."""
    from sppo_rl.llm.data.files import DataError, load_examples

    data = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1+1?", "answer": "2"},
            {"prompt": "2+2?", "answer": "4"},
            {"prompt": "1+1?", "answer": "3"},
        ],
    )
    with pytest.raises(DataError, match=r"d.jsonl: records 0 and 2 .* same prompt but different answers"):
        load_examples(data)


def test_exact_repeats_are_counted_in_one_warning(tmp_path, capsys):
    from sppo_rl.llm.data.files import load_examples

    rows = [{"prompt": "1+1?", "answer": "2"}] * 3 + [{"prompt": "2+2?", "answer": "4"}] * 2
    capsys.readouterr()
    assert len(load_examples(write_jsonl(tmp_path / "d.jsonl", rows))) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "3 record(s) repeat an earlier one" in err[0]
        and "2 distinct prompt(s) of 5" in err[0]
    )


def test_the_paper_files_have_no_conflicts():
    from sppo_rl.llm.data.files import load_examples

    for f in sorted(FIXTURES.glob("*.parquet")):
        load_examples(f)


# --------------------------------------------------------------------------- references never payable


def test_a_200k_character_reference_is_never_parsed():
    """Before: every sample cost the full deadline parsing it; it can never be paid."""
    from sppo_rl.llm.rewards.symbolic import _parse_gold
    from sppo_rl.llm.rewards.verify import verify_math

    huge = "1+" * 100_000 + "1"
    before = _parse_gold.cache_info()
    assert verify_math(r"\boxed{100001}", huge) == 0.0
    assert verify_math(rf"\boxed{{{huge}}}", huge) == 0.0  # a box that long is refused too
    after = _parse_gold.cache_info()
    assert (after.hits, after.misses) == (before.hits, before.misses)


def test_unpayable_references_are_dropped_with_a_warning(tmp_path, capsys):
    from sppo_rl.llm.data.tasks import load_task

    data = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1" * 200_000}, {"prompt": "b", "answer": "2"}]
    )
    capsys.readouterr()
    train, _, reward = load_task(LLMConfig(task=str(data), model="m"))
    assert [e.answer for e in train] == ["2"] and reward == "math"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipped 1 of 2" in err[0] and "longer than 512 characters" in err[0]
