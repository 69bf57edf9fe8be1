"""The stages of one LLM update, one module each, in the order :meth:`~sppo_rl.llm.trainer.LLMRun.update`
runs them (each a function or a small class with explicit inputs and outputs, timed by one
:class:`~sppo_rl.llm.stages.row.StageTimer`):

1. :mod:`~sppo_rl.llm.stages.collect` -- this rank's prompts of the update sampled ``G`` times each
   (ReMax: and decoded greedily), round after round with DAPO's dynamic sampling;
2. :mod:`~sppo_rl.llm.stages.score` -- every response verified against its reference (bounded in time;
   a failed verification makes the rollout *invalid*);
3. :mod:`~sppo_rl.llm.stages.to_batch` -- the kept groups as one :class:`~sppo_rl.agents.batch.SequenceBatch`:
   the sampler's tokens, ``logp_old``, the reference's log-probs, the critic's values and the token rewards;
4. :mod:`~sppo_rl.llm.stages.advantages` -- the algorithm's estimator fills the advantages;
5. :mod:`~sppo_rl.llm.stages.train` -- PPO epochs over minibatches update actor and critic;
6. :mod:`~sppo_rl.llm.stages.sync` -- the rollout gets the actor's new weights;
7. :mod:`~sppo_rl.llm.stages.row` -- the update's metrics row, as named sums over ranks.
"""
