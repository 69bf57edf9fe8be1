"""sppo_rl: sequence-level PPO and its baselines for RL with verifiable rewards.

``sppo_rl.agents`` is the shared core; ``sppo_rl.envs`` the control testbed (registered with Gymnasium
on import when Gymnasium is installed); ``sppo_rl.control`` and ``sppo_rl.llm`` the two worlds' trainers.
The Python API (:mod:`sppo_rl.api`: ``train_control``, ``train_llm``, ``Policy``, ``LLMPolicy``,
``evaluate_policy``;
``register_custom_task`` and ``SparseOutcome`` from :mod:`sppo_rl.envs.custom`) is importable from here
and loaded on first use, so ``import sppo_rl`` stays light.
"""

__version__ = "0.1.0"

try:  # registering the testbed is cheap; it needs the `control` extra
    import gymnasium as _gymnasium  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without the control extra
    pass
else:
    from sppo_rl import envs as _envs  # noqa: F401

_LAZY = {
    "train_control": "sppo_rl.api",
    "train_llm": "sppo_rl.api",
    "Policy": "sppo_rl.api",
    "LLMPolicy": "sppo_rl.api",
    "evaluate_policy": "sppo_rl.api",
    "register_custom_task": "sppo_rl.envs.custom",
    "SparseOutcome": "sppo_rl.envs.custom",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sppo_rl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
