"""HFRollout's shared prefill: the ``n`` samples of a prompt share one forward over the prompt (its KV
cache repeated ``n`` times), a head every prompt shares (a chat template's system message) runs once,
and both sample what a prefill over every copy would."""

from __future__ import annotations

import pytest
import torch

from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.tiny import build_tiny_model, load_tokenizer
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.llm.rollout.hf import HFRollout

CHARSET = "0123456789+-*/=() {}\\\nabcdefghijklmnopqrstuvwxyz"
PROMPTS = ["1+1=", "123 + 456 =", "a", "{x}\\y = 77 "]  # different lengths: left padding varies


class EveryCopy(HFRollout):
    """The former prefill: one forward over all ``P * n`` prompt rows."""

    def _prefill(self, prompt_ids, prompt_mask, positions, n):
        return self._forward(prompt_ids, prompt_mask, positions, None), prompt_mask


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


HEAD = "system answer with the number\n"  # 30 characters of the charset, one token each
SHARED = [HEAD + p for p in PROMPTS]


def test_shared_prefix_of_every_prompt_is_run_once_then_the_remainders_then_the_samples():
    """``shared_prefix`` counts the leading tokens all left-padded rows share (at least
    ``SHARED_PREFIX_MIN``, never a row's last token); with different remainders one short head is 0."""
    from sppo_rl.llm.rollout.hf import SHARED_PREFIX_MIN, shared_prefix

    pad = 0
    rows = [[pad, pad, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1], [5, 6, 7, 8, 9, 10, 11, 12, 13, 2, 3, 4]]
    ids = torch.tensor(rows)
    mask = (ids != pad).long()
    assert SHARED_PREFIX_MIN == 8 and shared_prefix(ids, mask) == 9
    assert shared_prefix(ids[:, 4:], mask[:, 4:]) == 0  # 5 shared tokens < 8
    same = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]] * 2)
    assert shared_prefix(same, torch.ones_like(same)) == 8  # the last token stays in the rows' part
    assert shared_prefix(same[:1], torch.ones_like(same[:1])) == 0  # one row: nothing to share


@pytest.mark.parametrize("n,seeds", [(1, [5, 6, 7, 8]), (4, [5, 6, 7, 8]), (8, 3)])
def test_a_shared_head_runs_once_and_the_samples_equal_a_prefill_of_every_copy(tiny, n, seeds):
    """The head every prompt starts with is one forward of one row, the remainders one forward of the
    ``P`` prompts after it (left-padded behind the head), then decode: tokens equal the plain prefill's,
    log-probs within float rounding (with per-row seeds rows also leave the batch as they stop)."""
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=12, repetition_penalty=1.3)
    shared = HFRollout(load_actor(tiny), load_tokenizer(tiny))
    seen = _rows_seen(shared)
    a = shared.generate(SHARED, params, seeds=seeds)
    assert seen[0] == (1, len(HEAD)), f"the head once, as one row: {seen[:2]}"
    longest_rest = max(len(p) for p in PROMPTS)
    assert seen[1] == (len(PROMPTS), longest_rest), "then the remainders, one row per prompt"
    assert seen[2] == (len(PROMPTS) * n, 1)
    b = EveryCopy(load_actor(tiny), load_tokenizer(tiny)).generate(SHARED, params, seeds=seeds)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert torch.allclose(a.sampling_logprobs, b.sampling_logprobs, atol=1e-5)
    assert a.texts == b.texts and torch.equal(a.prompt_ids, b.prompt_ids)


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


def test_a_chat_templates_system_message_is_shared_on_a_bpe_llama(tmp_path):
    """On a small Llama with a byte-level BPE and a ChatML template, prompts that start with the same
    system message share its prefill; the samples equal a prefill of every copy."""
    from test_pretrained import build_small_llama, chatml

    llama = build_small_llama(tmp_path / "llama")
    system = ("system", "You are a careful calculator.")
    prompts = [chatml(system, ("user", q)) for q in ("3+4=", "What is the sum? 21+35=", "7+70=")]
    tok = load_tokenizer(llama)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=10)
    shared = HFRollout(load_actor(llama), tok)
    seen = _rows_seen(shared)
    a = shared.generate(prompts, params, seeds=[1, 2, 3])
    assert seen[0][0] == 1 and seen[0][1] >= 8, f"the system message once: {seen[:2]}"
    assert seen[1] == (3, max(lengths) - seen[0][1])
    b = EveryCopy(load_actor(llama), load_tokenizer(llama)).generate(prompts, params, seeds=[1, 2, 3])
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
