"""Latent reasoning on the embedded tiny model, and Latent-GRPO (arXiv 2604.27998) as a plug-in of the LLM world.

Sources. The paper (Deng et al., "Latent-GRPO: Group Relative Policy Optimization for Latent
Reasoning", arXiv 2604.27998) could be read here only as its abstract and the opening of its
introduction, so its equation numbers are not available to this module. Every definition below is
read from the authors' public code (github.com/DJC-GO-SOLO/Latent-GRPO): the latent sampler
(``sglang_latent_reasoning_pkg/.../layers/sampler.py``), the training-side log-probability
(``verl-0.4.x/verl/utils/torch_functional.py``, ``logprobs_from_logits_topk_gumbel``), the
advantages (``verl-0.4.x/verl/trainer/ppo/core_algos.py``, ``compute_latent_grpo_outcome_advantage_*``)
and the released training scripts (top-K 10, Gumbel-softmax temperature 1, noise scale 1, one-sided
noise on). This module writes its own code from those definitions.

**The latent step** (vocabulary-space latent reasoning). At a latent position the model's next-token
logits ``l`` give ``log p = log softmax(l)`` (no temperature). Gumbel noise ``g_v`` is drawn for every
token ``v`` of the vocabulary, clipped to ``[-1.5, 3]``, and scaled by ``sigma`` (the noise scale)::

    s_v = log p(v) + sigma * g_v                    perturbed scores
    (i_1..i_K) = top-K of s,  s_k = s_{i_k}          the K candidates (by perturbed score)
    w = softmax(s_{1..K} / tau)                       mixture weights, tau = Gumbel-softmax temperature
    e = sum_k w_k E[i_k]                              the next INPUT embedding (E: token embeddings)

The latent phase ends, in the paper's sampler, when the noise-free argmax token is the latent-end
marker (``</think>``); here it lasts a fixed ``L = --latent-steps`` steps (the tiny task's reasoning has
at most ``L`` lines, see the warm start), then the answer is decoded as ordinary tokens at the run's
temperature and scored by the task's verifier.

**The log-probability of a latent step** (what makes the PPO ratio computable). Under a policy ``theta``
the shift that turns its log-probs into the stored scores is ``x_k = s_k - log p_theta(i_k)``; the step's
log-probability is the mean standard-Gumbel log-density of it over the K candidates, as the authors'
``logprobs_from_logits_topk_gumbel`` computes it::

    log pi_theta(z_t) = (1 / K) sum_k phi(x_k),   phi(x) = -x - exp(-x)

At sampling time ``x_k = sigma * g_k`` (the scaled noise drawn), so the rollout's own value is
``mean_k phi(sigma * g_k)``; recomputed later from the stored ``(i_k, s_k)`` it is a differentiable
function of the policy's log-probs of the K candidates, with ``d log pi / d log p(i_k) = (1 - exp(-x_k)) / K``.
This is the authors' rule at every ``sigma``. It is not the density of the sampled noise when
``sigma != 1`` (that would be ``mean_k phi(x_k / sigma) - log sigma``, with gradient
``(1 - exp(-x_k / sigma)) / (sigma K)``: at ``sigma = 0.5`` and ``g = 1``, 0.632 per candidate for K = 2
against the authors' 0.197); at the released scripts' ``sigma = 1`` the two agree.
Answer tokens keep the usual ``log softmax(l / T)[token]``. The rollout stores ``(i_k, s_k)`` per latent
step (:class:`~.rollout.LatentRolloutBatch`); the learner's ``actor(rows, T)`` rebuilds the same input
embeddings from them (the mixture weights come from the stored scores, so they are constants) and
returns the latent positions' log-probs, then the answer tokens'.

**The three fixes**, each switchable for the comparison (``latent-grpo-naive`` switches all off):

(a) *Invalid-sample advantage masking* (bottleneck: rollouts that leave the valid latent manifold).
    The authors' code masks responses that reach the length limit: they get advantage 0 and are left
    out of their group's mean and std. Here a latent rollout is *invalid* when it stopped without an
    end token (cut at ``--max-new-tokens``) or has no parseable ``\\boxed{...}`` answer: both mean the
    latent steps led the model off the format it was trained on. Invalid rows become
    ``SequenceBatch.valid = False`` (advantage 0, no loss, out of the group statistics:
    :func:`~sppo_rl.agents.algorithms.compute_advantages`). :func:`~.maths.valid_rows`. A group left with ONE
    valid member gets ``A = R`` as in the authors' code (its mean taken as 0, its std as 1: the
    ``latent-grpo`` algorithm's estimator parameter ``lone="reward"``), where explicit GRPO gives 0.
(b) *One-sided noise sampling* (bottleneck: trajectory rewards giving wrong per-step updates). The
    clipped noise is shifted by ``+1.5``: ``g' = clip(g, -1.5, 3) + 1.5`` lies in ``[0, 4.5]``, so every
    candidate's ``x_k >= 0`` at sampling. Since ``d log pi / d log p(i_k) = (1 - exp(-x_k)) / K``,
    a positive advantage then raises (and a negative one lowers) the probability of every candidate
    of the step; with two-sided noise about 37 % of the candidates (``P(G < 0) = 1/e``) have
    ``x_k < 0`` and move against their advantage. :func:`~.maths.latent_noise`.
(c) *Optimal correct-path first-token selection* (bottleneck: averaging several correct latent paths
    gives an invalid mixture). Among the rows of a group with a positive advantage, only the one with
    the highest length-normalised old log-prob keeps its first latent step in the loss; the first
    step of every other row of that group is dropped. The selector ``"first-token"``
    (:func:`sppo_rl.agents.variants.first_token`).

**Warm start** (:func:`~.warmstart.latent_warmstart`). A latent policy is made, as COCONUT makes one, by a
curriculum from explicit reasoning to latent: stage 0 fine-tunes the tiny model on responses with
explicit reasoning lines (the arithmetic task's column sums, or the scratchpad task's own lines)
then the box; stage ``k = 1..L`` replaces the first
``k`` lines by ``k`` latent steps (built from the model's own noise-free top-K mixture, back-propagated
through) and trains on the rest. Both stage 0 (the explicit model, the comparable warm start of
explicit GRPO) and the last stage are cached like :mod:`sppo_rl.llm.models.sft`, keyed by their settings.

Construction at small scale (this project's, not the paper's): a fixed number of latent steps, no
top-p nucleus on latent steps, the authors' straight-through "flip" of negative-advantage gradients
left out, and the invalid rule above (the authors' code masks only length-capped responses).

The package (a plug-in: the core's :class:`~sppo_rl.agents.algorithms.Algorithm` knows nothing of
latent policies, only that these algorithms train in the LLM world alone):

- :mod:`~.maths`: the latent step, its log-probability, the noise, the validity rule, the settings;
- :mod:`~.rollout`: the latent rollout backend and the learner's recomputation of its log-probs;
- :mod:`~.warmstart`: the reasoning lines and the explicit-to-latent curriculum;
- :mod:`~.plugin`: the fixes each latent algorithm runs with, :func:`~.plugin.configure_latent` and
  :class:`~.plugin.LatentPolicy`, what the trainer calls;
- ``python -m sppo_rl.llm.latent explicit-model|latent-model [flags]`` (:mod:`~.__main__`): build the
  warm starts.
"""
