"""The shared agent core: advantage estimators, PPO losses and the sequence batch.

Knows neither Gymnasium nor transformers; both worlds' adapters build a :class:`SequenceBatch` and call
into this package.
"""

import sppo_rl.agents.rivals  # noqa: F401  (registers OPO's, the shrinkage and SPO's estimators)
import sppo_rl.agents.variants  # noqa: F401  (registers BPPO's selector and LamPO's estimator)
from sppo_rl.agents.advantages import ESTIMATORS, Requirements, get_estimator, register_estimator
from sppo_rl.agents.algorithms import (
    ALGORITHMS,
    Algorithm,
    check_setup,
    compute_advantages,
    critic_loss,
    get_algorithm,
)
from sppo_rl.agents.batch import SequenceBatch, lengths_to_mask, pad_sequences, terminal_rewards
from sppo_rl.agents.learner import LOCAL, LearnerConfig, TorchEngine, forward_rows, micro_batches, ppo_update
from sppo_rl.agents.losses import (
    agg_loss,
    agg_units,
    bce_value_loss,
    clipped_value_loss,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    policy_loss,
)

__all__ = [
    "ALGORITHMS",
    "ESTIMATORS",
    "LOCAL",
    "LearnerConfig",
    "TorchEngine",
    "Algorithm",
    "Requirements",
    "SequenceBatch",
    "agg_loss",
    "agg_units",
    "bce_value_loss",
    "check_setup",
    "clipped_value_loss",
    "compute_advantages",
    "critic_loss",
    "entropy_from_logits",
    "explained_variance",
    "forward_rows",
    "get_algorithm",
    "get_estimator",
    "kl_penalty",
    "lengths_to_mask",
    "micro_batches",
    "pad_sequences",
    "policy_loss",
    "ppo_update",
    "register_estimator",
    "terminal_rewards",
]
