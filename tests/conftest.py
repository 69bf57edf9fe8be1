"""Fixtures shared by the test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Qwen2 with the arithmetic charset (hidden 32, one layer), built offline once per module.

    Modules that need another tiny model (test_llm_models, test_rollout, test_vllm) define their own
    ``tiny``, which takes precedence over this one.
    """
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

    return ensure_tiny_model(
        tmp_path_factory.mktemp("cache"), TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1
    )
