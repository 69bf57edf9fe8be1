"""The LLM world's adapter: causal-LM actors and critics, rollouts, prompts, verifiers and rewards.

It turns generated responses into the shared :class:`sppo_rl.agents.batch.SequenceBatch` and supplies
log-probs and values; the algorithms themselves live in :mod:`sppo_rl.agents`.
"""
