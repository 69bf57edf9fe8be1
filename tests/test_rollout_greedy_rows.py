"""HFRollout.generate_with_greedy: a prompt's sampled rows and its greedy row in one batched pass return
what the two calls ``generate(prompts, params, seeds)`` and ``generate(prompts, params.as_greedy())``
return: the same tokens, texts and stops, log-probs to float rounding (the decode batch differs)."""

from __future__ import annotations

import pytest
import torch

from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.tiny import build_tiny_model, load_tokenizer
from sppo_rl.llm.rollout.base import RolloutBatch, SamplingParams
from sppo_rl.llm.rollout.hf import HFRollout
from sppo_rl.llm.stages.collect import Sampler

CHARSET = "0123456789+-*/=() {}\\\nabcdefghijklmnopqrstuvwxyz"
PROMPTS = ["1+1=", "123 + 456 =", "a", "{x}\\y = 77 "]  # different lengths: left padding varies


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", charset=CHARSET, seed=0)


@pytest.fixture(scope="module")
def rollout(tiny):
    return HFRollout(load_actor(tiny), load_tokenizer(tiny))


def _same(a: RolloutBatch, b: RolloutBatch) -> None:
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.finished, b.finished) and a.texts == b.texts
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)
    assert torch.equal(a.prompt_index, b.prompt_index)
    assert a.num_generated_tokens == b.num_generated_tokens
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert torch.allclose(a.sampling_logprobs, b.sampling_logprobs, atol=1e-5)


SETTINGS = [
    (SamplingParams(n=8, temperature=1.0, max_new_tokens=30), [11, 12, 13, 14]),  # rows stop, batch shrinks
    (SamplingParams(n=3, temperature=0.7, top_p=0.9, max_new_tokens=12), [5, 6, 7, 8]),
    (SamplingParams(n=2, temperature=1.3, top_k=5, min_p=0.05, repetition_penalty=1.4, max_new_tokens=12), 9),
    (SamplingParams(n=1, temperature=0.6, max_new_tokens=12), 3),  # one seed for the call
]


@pytest.mark.parametrize("params,seeds", SETTINGS)
def test_one_pass_returns_what_the_sampled_and_the_greedy_call_return(rollout, params, seeds):
    sampled, greedy = rollout.generate_with_greedy(PROMPTS, params, seeds=seeds)
    _same(sampled, rollout.generate(PROMPTS, params, seeds=seeds))
    _same(greedy, rollout.generate(PROMPTS, params.as_greedy()))
    assert (greedy.sampling_logprobs == 0).all()


def test_unseeded_one_pass_draws_what_the_sampled_call_draws_from_the_global_rng(rollout):
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=10)
    torch.manual_seed(4)
    sampled, _ = rollout.generate_with_greedy(PROMPTS, params)
    torch.manual_seed(4)
    _same(sampled, rollout.generate(PROMPTS, params))


def test_the_greedy_rows_ride_in_the_sampled_rows_decode_steps(rollout):
    """One prefill over the distinct prompts, then each decode step runs the sampled and the greedy rows
    together: ``max`` of the two lengths steps, not their sum plus a second prefill."""
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12)
    seen: list[tuple[int, ...]] = []
    hook = rollout.model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(tuple(args[0].shape))
    )
    try:
        sampled, greedy = rollout.generate_with_greedy(PROMPTS, params, seeds=[1, 2, 3, 4])
    finally:
        hook.remove()
    assert seen[0][0] == len(PROMPTS), "one prefill row per prompt"
    assert seen[1] == (len(PROMPTS) * 4, 1), "then the 3 sampled rows and the greedy row of each prompt"
    assert len(seen) == max(sampled.response_len, greedy.response_len)


def test_the_sampler_gives_the_evaluation_both_batches_in_one_pass_or_two_calls(rollout):
    params = SamplingParams(temperature=0.8, max_new_tokens=10)
    positions = [3, 0, 2, 1]
    one = Sampler(rollout, params, seed=7).sample_and_greedy(PROMPTS, 2, -1, positions)

    class TwoCalls:  # a backend without generate_with_greedy (a vLLM engine, a rollout worker)
        tokenizer = rollout.tokenizer
        generate = rollout.generate

    two = Sampler(TwoCalls(), params, seed=7).sample_and_greedy(PROMPTS, 2, -1, positions)  # type: ignore[arg-type]
    _same(one[0], two[0])
    _same(one[1], two[1])


def test_greedy_params_are_refused(rollout):
    with pytest.raises(ValueError, match="greedy"):
        rollout.generate_with_greedy(PROMPTS, SamplingParams(greedy=True))
