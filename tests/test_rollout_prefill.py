"""HFRollout's shared prefill: the ``n`` samples of a prompt share one forward over the prompt (its KV
cache repeated ``n`` times), and sample what a prefill over every copy would."""

from __future__ import annotations

import pytest
import torch

from sppo_rl.llm.models import load_actor
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.llm.rollout.hf import HFRollout
from sppo_rl.llm.tiny import build_tiny_model, load_tokenizer

CHARSET = "0123456789+-*/=() {}\\\nabcdefghijklmnopqrstuvwxyz"
PROMPTS = ["1+1=", "123 + 456 =", "a", "{x}\\y = 77 "]  # different lengths: left padding varies


class EveryCopy(HFRollout):
    """The former prefill: one forward over all ``P * n`` prompt rows."""

    def _prefill(self, prompt_ids, prompt_mask, positions, n):
        return self._forward(prompt_ids, prompt_mask, positions, None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", charset=CHARSET, seed=0)


def _rows_seen(rollout: HFRollout) -> list[tuple[int, int]]:
    """``(rows, positions)`` of every forward the model runs (a hook on its input embedding)."""
    seen: list[tuple[int, int]] = []
    rollout.model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(tuple(args[0].shape))
    )
    return seen


@pytest.mark.parametrize("n", [1, 4])
def test_the_prompt_is_run_once_per_prompt_and_the_samples_equal_a_prefill_of_every_copy(tiny, n):
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=12)
    shared = HFRollout(load_actor(tiny), load_tokenizer(tiny))
    seen = _rows_seen(shared)
    a = shared.generate(PROMPTS, params, seeds=[5, 6, 7, 8])
    prefill = seen[0]
    assert prefill[0] == len(PROMPTS), f"one prefill row per prompt, not per sample: {prefill}"
    assert seen[1] == (len(PROMPTS) * n, 1), "then one token per sample and step"
    assert all(shape[1] == 1 and shape[0] <= len(PROMPTS) * n for shape in seen[2:])
    b = EveryCopy(load_actor(tiny), load_tokenizer(tiny)).generate(PROMPTS, params, seeds=[5, 6, 7, 8])
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert torch.allclose(a.sampling_logprobs, b.sampling_logprobs, atol=1e-5)
    assert a.texts == b.texts and torch.equal(a.prompt_ids, b.prompt_ids)


def test_shared_prefill_with_a_repetition_penalty_counts_each_copys_prompt(tiny):
    """The repetition penalty's seen-token table is built from the expanded prompt rows, so every
    sample of a prompt penalises that prompt's tokens, with or without the shared prefill."""
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10, repetition_penalty=1.8)
    a = HFRollout(load_actor(tiny), load_tokenizer(tiny)).generate(PROMPTS, params, seeds=[1, 2, 3, 4])
    b = EveryCopy(load_actor(tiny), load_tokenizer(tiny)).generate(PROMPTS, params, seeds=[1, 2, 3, 4])
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)


class NoCompaction(HFRollout):
    """The former decode loop: stopped rows stay in the batch to the end."""

    def _sample_tokens(self, *args, **kwargs):
        import sppo_rl.llm.rollout.hf as hf

        keep, hf._compactable = hf._compactable, lambda generator, cache: False
        try:
            return super()._sample_tokens(*args, **kwargs)
        finally:
            hf._compactable = keep


def test_stopped_rows_leave_the_decode_batch_and_the_others_sample_the_same(tiny):
    """Per-row seeds: once an eighth of the rows have stopped the decode batch shrinks (a forward hook
    sees fewer rows), and every row's tokens and log-probs equal those of the loop that keeps them all."""
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=30)
    seeds = [11, 12, 13, 14]
    shrinking = HFRollout(load_actor(tiny), load_tokenizer(tiny))
    seen = _rows_seen(shrinking)
    a = shrinking.generate(PROMPTS, params, seeds=seeds)
    decode_rows = [shape[0] for shape in seen[1:]]
    assert a.finished.any() and not a.finished.all(), "want both stopped and cut rows"
    assert decode_rows[0] == 32 and min(decode_rows) < 32, decode_rows
    assert decode_rows == sorted(decode_rows, reverse=True)
    assert min(decode_rows) >= int((~a.finished).sum()), "rows that never stop are never dropped"
    b = NoCompaction(load_actor(tiny), load_tokenizer(tiny)).generate(PROMPTS, params, seeds=seeds)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.finished, b.finished) and a.texts == b.texts
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert torch.allclose(a.sampling_logprobs, b.sampling_logprobs, atol=1e-5)
    # one seed for the whole batch: the rows' draws depend on the batch, so the batch is kept whole
    seen.clear()
    shrinking.generate(PROMPTS, params, seeds=3)
    assert {shape[0] for shape in seen[1:]} == {32}
