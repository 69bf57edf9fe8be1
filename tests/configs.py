"""The tiny runs the tests build: one factory per world, each a whole run in ``tmp_path / name`` that
finishes in seconds on a CPU. A test passes what it specifically needs as keywords (flat keys, as on the
command line: ``lora_rank=4``); a module whose tests share settings binds them once with
:func:`functools.partial`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sppo_rl.config import from_flat
from sppo_rl.control.config import ControlConfig
from sppo_rl.llm.config import LLMConfig


def llm_config(tmp_path: Path, model: Path | str | None, name: str = "run", **kw: Any) -> LLMConfig:
    """An arithmetic run of ``model`` (``None``: the embedded model, built in ``tmp_path / "cache"``):
    2 updates of 4 prompts drawn from 64, 8 validation prompts sampled twice after every update, 8 new
    tokens, one thread, no progress bar or TensorBoard; ``kw`` overrides any of it."""
    base = dict(
        task="arithmetic",
        model=str(model) if model else None,
        updates=2,
        prompts_per_step=4,
        train_size=64,
        val_size=8,
        eval_samples=2,
        eval_every=1,
        max_new_tokens=8,
        out_dir=str(tmp_path / name),
        progress=False,
        tensorboard=False,
        threads=1,
        cache_dir=str(tmp_path / "cache"),
    )
    return from_flat(LLMConfig, {**base, **kw})


def grpo_pairs_config(tmp_path: Path, model: Path | str | None, name: str = "run", **kw: Any) -> LLMConfig:
    """:func:`llm_config` with grpo in groups of 2 and 4 validation prompts, validated only before
    training and at the end (``eval_every`` 0); ``kw`` overrides any of it."""
    return llm_config(
        tmp_path, model, name, **{**dict(algo="grpo", group_size=2, val_size=4, eval_every=0), **kw}
    )


def control_config(tmp_path: Path, name: str = "run", **kw: Any) -> ControlConfig:
    """A short-cartpole run from a random policy (no warm start): 256 episodes, no evaluation episodes,
    no progress bar or TensorBoard; ``kw`` overrides any of it."""
    base = dict(
        task="short-cartpole",
        total_episodes=256,
        init_from="none",
        out_dir=str(tmp_path / name),
        progress=False,
        tensorboard=False,
        eval_episodes=0,
    )
    return ControlConfig(**{**base, **kw})


def checkpointed_llm_config(model: Path | str, out: Path, **kw: Any) -> LLMConfig:
    """An sppo run in ``out`` that checkpoints after every update (3 kept): 3 updates of 2 prompts drawn
    from 32, 6 new tokens, validation only before training (``eval_every`` 1000); ``kw`` overrides any of it."""
    base = dict(algo="sppo", updates=3, prompts_per_step=2, train_size=32, val_size=4, eval_every=1000,
                max_new_tokens=6, checkpoint_every=1, keep_checkpoints=3)  # fmt: skip
    return llm_config(out.parent, model, out.name, **{**base, **kw})


TINY_LLM_FLAGS = ("--prompts-per-step", "4", "--train-size", "64", "--val-size", "8", "--max-new-tokens", "8")
""":func:`llm_config`'s sizes as ``sppo-rl llm`` flags, for the tests that run the command line."""
