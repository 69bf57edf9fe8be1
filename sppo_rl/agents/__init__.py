"""The shared agent core: advantage estimators, PPO losses and the sequence batch.

Knows neither Gymnasium nor transformers; both worlds' adapters build a :class:`SequenceBatch` and call
into this package.
"""

import sppo_rl.agents.rivals  # noqa: F401  (registers OPO's, the shrinkage and SPO's estimators)
import sppo_rl.agents.variants  # noqa: F401  (registers BPPO's selector and LamPO's estimator)
