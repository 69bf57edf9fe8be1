"""The scratchpad task: hand-checked worked examples, lengths per level, splits, reward, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sppo_rl.config import ConfigError, from_flat
from sppo_rl.llm.config import SFT, LLMConfig
from sppo_rl.llm.data.files import Example
from sppo_rl.llm.data.scratchpad import (
    LEVELS,
    MARGIN,
    REWARD_FN,
    capacity,
    make_scratchpad,
    max_new_tokens,
    reference_response,
    scratchpad,
)
from sppo_rl.llm.models.tiny import TINY_CHARSET, TINY_SETTINGS, tiny_settings
from sppo_rl.llm.rewards.verify import verify_integer
from sppo_rl.runtime.logging import read_metrics


def _ref(prompt: str, answer: int) -> str:
    return reference_response(Example(prompt, str(answer)))


# Worked by hand, column by column (units first): digits, carry in, two-digit sum, the answer so far.
WORKED = [
    # 8+1=9; 3+9=12 (write 2, carry 1); 7+5+1=13 (carry 1); 4+2+1=7
    ("4738+2591=", 7329, "8+1+0=09 9; 3+9+0=12 29; 7+5+1=13 329; 4+2+1=07 7329; \\boxed{7329}"),
    # every column carries, and the last carry becomes a fifth column of zeros
    (
        "5678+4567=",
        10245,
        "8+7+0=15 5; 7+6+1=14 45; 6+5+1=12 245; 5+4+1=10 0245; 0+0+1=01 10245; \\boxed{10245}",
    ),
    # three operands: a column of 9+9+9 plus a carry of 2 sums to 29, so the carry stays 2
    (
        "99999+99999+99999=",
        299997,
        "9+9+9+0=27 7; 9+9+9+2=29 97; 9+9+9+2=29 997; 9+9+9+2=29 9997; 9+9+9+2=29 99997; "
        "0+0+0+2=02 299997; \\boxed{299997}",
    ),
    # one-digit product: 8*7=56 (carry 5); 3*7+5=26; 7*7+2=51; 4*7+5=33; the carry 3 is the last column
    (
        "473801*7=",
        3316607,
        "1*7+0=07 7; 0*7+0=00 07; 8*7+0=56 607; 3*7+5=26 6607; 7*7+2=51 16607; 4*7+5=33 316607; "
        "0*7+3=03 3316607; \\boxed{3316607}",
    ),
    # long multiplication: 473*6 = 2838, 473*2 = 946, 2838 + 9460 = 12298
    (
        "473*26=",
        12298,
        "473*6: 3*6+0=18 8; 7*6+1=43 38; 4*6+4=28 838; 0*6+2=02 2838; "
        "473*2: 3*2+0=06 6; 7*2+0=14 46; 4*2+1=09 946; "
        "2838+9460: 8+0+0=08 8; 3+6+0=09 98; 8+4+0=12 298; 2+9+1=12 2298; 0+0+1=01 12298; \\boxed{12298}",
    ),
]


@pytest.mark.parametrize("prompt,answer,expected", WORKED)
def test_worked_examples(prompt, answer, expected):
    assert _ref(prompt, answer) == expected
    assert verify_integer(expected, str(answer)) == 1.0
    assert set(expected) <= set(TINY_CHARSET), "the tiny tokenizer must cover every character"


def test_a_wrong_answer_in_the_example_is_refused():
    with pytest.raises(ValueError, match="is not 7329"):
        _ref("4738+2591=", 7330)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_reference_verifies_and_fits_its_level(level):
    train, val = make_scratchpad(7, 400, 50, level)
    lv = LEVELS[level]
    for e in train + val:
        response = reference_response(e)
        assert verify_integer(response, e.answer) == 1.0, e.prompt
        assert lv.min_chars <= len(response) <= lv.max_chars, (e.prompt, len(response))
        assert e.meta["level"] == level and set(str(e.prompt) + response) <= set(TINY_CHARSET)
    # the documented bounds are attained: the longest by all nines (a carry out of every column), the
    # shortest without a final carry (levels 1-4 have only these two lengths)
    if lv.kind != "long":
        nine = int("9" * lv.digits)
        ops = [nine] * lv.operands if lv.kind == "add" else [nine, 9]
        steps, value = scratchpad(lv, ops)
        assert len(f"{steps}; \\boxed{{{value}}}") == lv.max_chars
        low = [10 ** (lv.digits - 1)] * (lv.operands if lv.kind == "add" else 1)
        steps, value = scratchpad(lv, low + ([] if lv.kind == "add" else [2]))
        assert len(f"{steps}; \\boxed{{{value}}}") == lv.min_chars
    assert 64 <= lv.min_chars and lv.max_chars <= 256


def test_long_multiplication_lengths_over_every_problem():
    lv = LEVELS[5]
    lengths = set()
    for a in range(100, 1000):
        for b in (10 * hi + lo for hi in range(1, 10) for lo in range(1, 10)):
            steps, value = scratchpad(lv, [a, b])
            assert value == a * b
            lengths.add(len(f"{steps}; \\boxed{{{value}}}"))
    assert (min(lengths), max(lengths)) == (lv.min_chars, lv.max_chars)
    assert capacity(lv) == 900 * 81


def test_splits_are_deterministic_disjoint_and_extend():
    train, val = make_scratchpad(3, 300, 40, (1, 4, 5))
    again_train, again_val = make_scratchpad(3, 300, 40, (1, 4, 5))
    assert [(e.prompt, e.answer) for e in train] == [(e.prompt, e.answer) for e in again_train]
    assert [e.prompt for e in val] == [e.prompt for e in again_val]
    prompts = [e.prompt for e in train]
    assert len(set(prompts)) == 300 and not set(prompts) & {e.prompt for e in val}
    assert {e.meta["level"] for e in train} == {1, 4, 5}
    bigger, val2 = make_scratchpad(3, 500, 40, (1, 4, 5))
    assert [e.prompt for e in bigger[:300]] == prompts and [e.prompt for e in val2] == [e.prompt for e in val]
    other, _ = make_scratchpad(4, 300, 40, (1, 4, 5))
    assert [e.prompt for e in other] != prompts
    for e in train[:50]:  # the prompt's own numbers give the answer
        body = str(e.prompt)[:-1]
        x, y = (body.split("*") if "*" in body else (body, None))[:2]
        value = int(x) * int(y) if y is not None else sum(map(int, body.split("+")))
        assert e.answer == str(value)


def test_bad_sizes_and_levels_are_refused():
    with pytest.raises(ValueError, match="unknown level"):
        make_scratchpad(0, 10, 10, 6)
    with pytest.raises(ValueError, match=">= 0"):
        make_scratchpad(0, -1, 10, 1)


def test_only_the_final_box_is_paid():
    ref = _ref("4738+2591=", 7329)
    assert REWARD_FN == "integer"
    # a wrong scratchpad (7+5+1=14) with the right box is paid: only the outcome counts
    assert verify_integer(ref.replace("7+5+1=13 329", "7+5+1=14 429"), "7329") == 1.0
    # a right scratchpad whose box is corrupted is not
    assert verify_integer(ref.replace("\\boxed{7329}", "\\boxed{7339}"), "7329") == 0.0
    assert verify_integer(ref.replace("\\boxed{7329}", "\\boxed{7329.5}"), "7329") == 0.0
    # a second box after the right one is what counts; a box cut off by the token limit pays nothing
    assert verify_integer(ref + "; \\boxed{7330}", "7329") == 0.0
    assert verify_integer(ref[:-1], "7329") == 0.0
    # the scratchpad's own answer-so-far without a box is not an answer
    assert verify_integer(ref.split("; \\boxed")[0], "7329") == 0.0


def test_max_new_tokens_defaults_per_task_and_level():
    from sppo_rl.llm.models.engines import launcher_dist
    from sppo_rl.llm.plan import resolve

    def resolved(**kw):  # what the run resolves (resolve leaves the config as given)
        cfg = from_flat(LLMConfig, dict(train_size=8, val_size=4, **kw))
        plan = resolve(cfg, launcher_dist())[0]
        assert cfg.max_new_tokens == kw.get("max_new_tokens")
        return plan.rollout.max_new_tokens

    assert resolved(task="arithmetic") == 16
    assert resolved(task="scratchpad") == LEVELS[1].max_chars + 1 + MARGIN == 100
    assert resolved(task="scratchpad", level=(1, 5)) == 217 + 1 + MARGIN == max_new_tokens((5, 1))
    assert resolved(task="scratchpad", max_new_tokens=40) == 40  # an explicit value is kept
    with pytest.raises(ConfigError, match="--max-new-tokens must be >= 1"):
        resolved(task="scratchpad", max_new_tokens=0)
    with pytest.raises(ConfigError, match="--overlong-buffer"):
        resolved(task="scratchpad", overlong_buffer=101)  # beyond the resolved default of 100


def test_tiny_settings_per_task():
    assert tiny_settings("arithmetic") == TINY_SETTINGS  # arithmetic's cached models stay valid
    sp = tiny_settings("scratchpad")
    assert sp == {**TINY_SETTINGS, "max_position_embeddings": 512}
    longest_prompt = max(len(str(e.prompt)) for lv in LEVELS for e in make_scratchpad(0, 50, 0, lv)[0])
    assert longest_prompt + max_new_tokens(tuple(LEVELS)) <= sp["max_position_embeddings"]
    with pytest.raises(ValueError, match="no embedded model"):
        tiny_settings("data.jsonl")


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sppo_rl", "llm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bad_level_exits_2_with_one_line_before_any_file(tmp_path):
    out = tmp_path / "run"
    proc = _cli("--task", "scratchpad", "--level", "6", "--out-dir", str(out), "--cache-dir", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "sppo-rl: error: --task scratchpad: unknown level(s) [6]; valid: 1, 2, 3, 4, 5"
    assert "Traceback" not in proc.stderr and not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_trains_on_the_scratchpad_and_resumes(tmp_path, tiny):
    out = tmp_path / "run"
    proc = _cli(
        *("--task", "scratchpad", "--algo", "sppo", "--model", str(tiny), "--updates", "1"),
        *("--prompts-per-step", "4", "--train-size", "32", "--val-size", "4", "--eval-samples", "1"),
        *("--out-dir", str(out), "--no-progress", "--threads", "1", "--no-tensorboard"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["task"] == "scratchpad" and cfg["max_new_tokens"] == 100  # level 1's default budget, saved
    # resuming takes the saved settings: the resolved budget must equal the one resolved again
    proc = _cli("--out-dir", str(out), "--resume", "--updates", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2]
    # an untrained model rarely stops early: its responses run far past arithmetic's 16 tokens
    assert rows[-1]["response_length"] > 16


def test_embedded_model_warm_starts_on_the_scratchpad(tmp_path):
    """The embedded default on --task scratchpad: a base model with a 512-token context, a warm start
    keyed by the task (a few steps here; the real one is measured in docs/llm.md)."""
    from sppo_rl.llm.trainer import run_llm

    cfg = LLMConfig(
        task="scratchpad",
        updates=1,
        prompts_per_step=2,
        train_size=16,
        val_size=2,
        eval_samples=1,
        sft=SFT(steps=2, target=0.99),
        out_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        tensorboard=False,
    )
    summary = run_llm(cfg)
    assert summary["warmstart"]["steps"] == 2
    settings = summary["warmstart"]["settings"]
    assert (settings["task"], settings["max_new_tokens"], settings["batch_size"]) == ("scratchpad", 100, 32)
    (base,) = (tmp_path / "cache").glob("tiny-*")
    assert json.loads((base / "config.json").read_text())["max_position_embeddings"] == 512
