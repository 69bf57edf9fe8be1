"""sppo_rl: sequence-level PPO and its baselines for RL with verifiable rewards.

``sppo_rl.agents`` is the shared core; ``sppo_rl.envs`` the control testbed (registered with Gymnasium
on import when Gymnasium is installed); ``sppo_rl.control`` and ``sppo_rl.llm`` the two worlds' trainers.
"""

__version__ = "0.1.0"

try:  # registering the testbed is cheap; it needs the `control` extra
    import gymnasium as _gymnasium  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without the control extra
    pass
else:
    from sppo_rl import envs as _envs  # noqa: F401
