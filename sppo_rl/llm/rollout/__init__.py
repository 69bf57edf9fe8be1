"""Rollouts: sample responses to prompts and report the sampler's log-probs, one backend per module.

- :mod:`~sppo_rl.llm.rollout.base`: the protocol every backend implements (:class:`~.base.Rollout`),
  its one :class:`~.base.SamplingParams` and the :class:`~.base.RolloutBatch` it returns;
- :mod:`~sppo_rl.llm.rollout.hf`: the Hugging Face sampler (the actor itself, or a replica);
- :mod:`~sppo_rl.llm.rollout.vllm`: an in-process vLLM engine holding its own copy of the weights, with
  its requests and the reading of its outputs in :mod:`~sppo_rl.llm.rollout.vllm_sampling`, its
  weight-sync checks in :mod:`~sppo_rl.llm.rollout.vllm_sync` and its process hygiene in
  :mod:`~sppo_rl.llm.rollout.vllm_process`;
- the latent backend of Latent-GRPO: :mod:`sppo_rl.llm.latent.rollout`;
- :mod:`~sppo_rl.llm.rollout.factory`: the one place that picks a backend from the run's settings.

Every backend samples with ``generate(prompts, params, seeds)`` from text, and with ``generate_from_ids``
from prompts already tokenized (left-padded ids and mask for the HF and latent samplers, lists of ids
for vLLM).

Log-prob convention (every backend). At each step the sampler computes ``z = logits / temperature`` and
reports two log-probs of the token it emitted:

- ``logprobs``: ``log softmax(z)[token]``, the temperature-scaled distribution **without** any
  truncation. This is exactly what :func:`sppo_rl.llm.models.core.sequence_logprobs` recomputes at the
  same temperature, so it is what the trainer compares against (``logp_old`` of the PPO ratio, and
  the check that sampler and trainer agree).
- ``sampling_logprobs``: the log-prob under the distribution actually sampled from. With ``top_p``
  alone that is the nucleus renormalised: ``log softmax(z masked to the nucleus)[token]
  = logprobs - log(nucleus mass)``. It equals ``logprobs`` when nothing cuts or penalises the
  distribution and is larger otherwise; use it for off-policy corrections or to measure the
  truncation, not as ``logp_old``. Greedy decoding is deterministic, so its ``sampling_logprobs`` are
  0 (``logprobs`` still use ``temperature``).

The other settings of :class:`~.base.SamplingParams` change the distribution sampled from, in vLLM's
order: the repetition penalty on ``z`` (a token already in the prompt or the response has
``z / penalty`` if ``z > 0``, else ``z * penalty``: transformers' rule on the raw logits, the same after
division by ``T > 0``), then ``min_p`` (drop tokens whose probability is below ``min_p`` times the top
token's), ``top_k``, ``top_p``. ``sampling_logprobs`` are under that distribution; ``logprobs`` stay
``log softmax(z)[token]`` without any of it, so the sampler is off-policy by exactly
``sampling_logprobs - logprobs`` per token. Greedy decoding takes the argmax after the repetition
penalty (the filters never remove the argmax).
"""
