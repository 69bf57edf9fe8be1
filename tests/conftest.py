"""Fixtures shared by the test modules: ``tiny`` (a tiny Qwen2, once per module), ``tiny_run`` (a finished
tiny LLM run, once per session) and ``rewards`` (reward functions in TRL's convention). The run settings
they build from are in ``configs.py``; helpers the modules share are in ``paths.py``."""

from __future__ import annotations

from pathlib import Path

import pytest


def _tiny_model(cache: Path) -> Path:
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

    return ensure_tiny_model(cache, TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Qwen2 with the arithmetic charset (hidden 32, one layer), built offline once per module.

    Modules that need another tiny model (test_llm_models, test_rollout, test_vllm) define their own
    ``tiny``, which takes precedence over this one.
    """
    return _tiny_model(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The folder of a finished tiny LLM run, built once per session; tests only read it. It is
    :func:`configs.llm_config` of the ``tiny`` model with sppo, TensorBoard on and the actor trained even
    when every reward of a batch is equal: 2 updates, validation before training and after each update.
    It holds ``metrics.jsonl``, ``summary.json``, ``config.json``, ``tb/``, ``final/`` and ``checkpoints/``."""
    from configs import llm_config

    from sppo_rl.llm.trainer import run_llm

    root = tmp_path_factory.mktemp("tiny_run")
    model = _tiny_model(root / "model")
    run_llm(llm_config(root, model, algo="sppo", tensorboard=True, skip_equal_rewards=False))
    return root / "run"


TRL_REWARDS = '''
def even(completions, **kwargs):
    """TRL's convention: a list over the batch; the data's columns arrive as keyword lists."""
    return [float(len(c) % 2 == 0) for c in completions]


def matches_solution(completions, solution, prompts):
    return [float(c == s) for c, s in zip(completions, solution)]


def starts_with_prompt(completions, prompts, **kwargs):
    return [float(c.startswith(p)) for c, p in zip(completions, prompts)]


def always(response, truth):
    return 1.0


def has_x(response, truth):
    return float("x" in response)


def broken(completions, **kwargs):
    return [1 / 0 for c in completions]


def none_for_z(response, truth):
    return None if response == "z" else 0.5
'''


@pytest.fixture(scope="module")
def rewards(tmp_path_factory) -> Path:
    """A file of reward functions (``TRL_REWARDS``), TRL's batch convention and ours, for ``--reward-fn``."""
    path = tmp_path_factory.mktemp("rewards") / "trl_rewards.py"
    path.write_text(TRL_REWARDS)
    return path
