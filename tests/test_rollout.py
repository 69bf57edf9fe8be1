"""HFRollout on the tiny Qwen2 model: layout, sampler/trainer log-prob agreement, seeding, speed."""

from __future__ import annotations

import time

import pytest
import torch

from sppo_rl.llm.models.core import load_actor, positions_from_mask, sequence_logprobs
from sppo_rl.llm.models.tiny import build_tiny_model, load_tokenizer
from sppo_rl.llm.rollout.base import Rollout, RolloutBatch, SamplingParams
from sppo_rl.llm.rollout.hf import HFRollout, top_p_mask

CHARSET = "0123456789+-*/=() {}\\\nabcdefghijklmnopqrstuvwxyz"
# Prompts of different lengths, so left padding varies from row to row.
PROMPTS = ["1+1=", "123 + 456 =", "a", "{x}\\y = 77 "]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", charset=CHARSET, seed=0)


@pytest.fixture(scope="module")
def engine(tiny):
    return HFRollout(load_actor(tiny), load_tokenizer(tiny))


def _check_layout(batch: RolloutBatch, engine: HFRollout, num_prompts: int, n: int) -> None:
    B, T = batch.response_ids.shape
    tok = engine.tokenizer
    assert B == num_prompts * n == batch.batch_size
    assert batch.prompt_index.tolist() == [i for i in range(num_prompts) for _ in range(n)]
    assert batch.prompt_mask[:, -1].all(), "prompts are left-padded"
    assert (batch.prompt_ids[batch.prompt_mask == 0] == tok.pad_token_id).all()
    mask = batch.response_mask
    assert (mask[:, 1:] <= mask[:, :-1]).all(), "response mask is a prefix of ones"
    assert (batch.response_ids[mask == 0] == tok.pad_token_id).all()
    assert (batch.logprobs[mask == 0] == 0).all() and (batch.sampling_logprobs[mask == 0] == 0).all()
    assert (batch.logprobs[mask == 1] < 0).all()
    lengths = batch.response_lengths
    last = batch.response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
    ends_with_eos = last == tok.eos_token_id
    assert torch.equal(batch.finished, ends_with_eos)
    eos_inside = (batch.response_ids == tok.eos_token_id) & (mask == 1)
    assert (eos_inside.sum(1) == ends_with_eos.long()).all(), (
        "at most one EOS, and it is the last valid token"
    )
    assert (lengths[~batch.finished] == T).all(), "unfinished rows run to max length"
    assert batch.num_generated_tokens == int(mask.sum())
    for i in range(B):
        valid = batch.response_ids[i, : lengths[i]].tolist()
        assert batch.texts[i] == tok.decode(valid, skip_special_tokens=True)


def test_layout_and_stop_at_eos(engine):
    batch = engine.generate(PROMPTS, SamplingParams(n=8, temperature=1.0, max_new_tokens=30), seeds=0)
    _check_layout(batch, engine, len(PROMPTS), 8)
    assert batch.finished.any() and not batch.finished.all(), "want both EOS-terminated and truncated rows"
    assert batch.response_len == 30
    assert isinstance(engine, Rollout)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.6, 1.0), (1.3, 0.8)])
def test_trainer_logprobs_equal_sampler_logprobs(engine, temperature, top_p):
    batch = engine.generate(
        PROMPTS, SamplingParams(n=6, temperature=temperature, top_p=top_p, max_new_tokens=24), seeds=1
    )
    _check_layout(batch, engine, len(PROMPTS), 6)
    assert batch.finished.any() and not batch.finished.all()
    model, T = engine.model, batch.response_len
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, batch.input_ids, batch.attention_mask, T, temperature=temperature)
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=positions_from_mask(batch.attention_mask),
        ).logits[:, -T - 1 : -1]
    valid = batch.response_mask.bool()
    torch.testing.assert_close(logp[valid], batch.logprobs[valid], atol=2e-5, rtol=0)

    # sampling_logprobs: the nucleus-renormalised distribution = logprobs - log(nucleus mass).
    z = logits.float() / temperature
    outside = top_p_mask(z, top_p)
    nucleus_mass = torch.softmax(z, -1).masked_fill(outside, 0.0).sum(-1)
    expected = logp - nucleus_mass.log()
    torch.testing.assert_close(batch.sampling_logprobs[valid], expected[valid], atol=2e-5, rtol=0)
    in_nucleus = ~outside.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    assert in_nucleus[valid].all(), "every sampled token lies in the nucleus"
    if top_p == 1.0:
        assert torch.equal(batch.sampling_logprobs, batch.logprobs)
    else:
        assert (batch.sampling_logprobs[valid] > batch.logprobs[valid]).any()


def test_greedy_is_deterministic_argmax(engine):
    a = engine.generate(PROMPTS, SamplingParams(n=2, greedy=True, max_new_tokens=12))
    b = engine.generate(PROMPTS, SamplingParams(n=2, greedy=True, max_new_tokens=12), seeds=123)
    _check_layout(a, engine, len(PROMPTS), 2)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert torch.equal(a.response_ids[0::2], a.response_ids[1::2]), "the n greedy samples of a prompt agree"
    assert (a.sampling_logprobs == 0).all()
    T = a.response_len
    with torch.no_grad():
        logits = engine.model(
            input_ids=a.input_ids,
            attention_mask=a.attention_mask,
            position_ids=positions_from_mask(a.attention_mask),
        ).logits[:, -T - 1 : -1]
    valid = a.response_mask.bool()
    assert torch.equal(logits.argmax(-1)[valid], a.response_ids[valid])


def test_seeded_sampling_is_reproducible_and_leaves_global_rng(engine):
    rng = torch.get_rng_state()
    a = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=16), seeds=7)
    b = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=16), seeds=7)
    c = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=16), seeds=8)
    assert torch.equal(rng, torch.get_rng_state())
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    assert not torch.equal(a.response_ids[0], a.response_ids[1]), "the n samples of a prompt differ"


def test_model_mode_is_restored_and_no_graph_is_built(engine):
    model = engine.model
    model.train()
    batch = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4), seeds=0)
    assert model.training
    assert not batch.logprobs.requires_grad
    model.eval()
    engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4), seeds=0)
    assert not model.training


def test_update_weights(tiny):
    engine = HFRollout(load_actor(tiny), load_tokenizer(tiny))
    before = engine.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=8))
    engine.update_weights(None)
    donor = load_actor(build_tiny_model(tiny.parent / "donor", charset=CHARSET, seed=5))
    engine.update_weights(donor.state_dict().items())
    after = engine.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=8))
    assert not torch.equal(before.logprobs, after.logprobs)
    reference = HFRollout(donor, engine.tokenizer).generate(
        PROMPTS, SamplingParams(greedy=True, max_new_tokens=8)
    )
    assert torch.equal(after.response_ids, reference.response_ids)
    with pytest.raises(KeyError, match="unknown parameter"):
        engine.update_weights([("no.such.weight", torch.zeros(1))])


def test_top_p_mask_keeps_the_nucleus():
    z = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert top_p_mask(z, 0.75).tolist() == [False, False, True, True]
    assert top_p_mask(z, 0.85).tolist() == [False, False, False, True]
    assert top_p_mask(z, 1e-6).tolist() == [False, True, True, True]
    assert top_p_mask(z.flip(0), 0.75).tolist() == [True, True, False, False]


def test_bad_arguments_are_refused(engine):
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(PROMPTS, SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(PROMPTS, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate(["1", ""], SamplingParams())
    ids = torch.tensor([[5, 6, 0]])
    with pytest.raises(ValueError, match="left-padded"):
        engine.generate_from_ids(ids, (ids != 0).long(), SamplingParams())


@pytest.mark.slow
def test_throughput_batch64_16_tokens(tiny, capsys):
    """Generated tokens/s on 2 CPU threads (batch 64, 16 new tokens, no early stop); printed, not asserted."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tok = load_tokenizer(tiny)
        engine = HFRollout(load_actor(tiny), tok, stop_token_ids=[-1])  # never stops early
        prompts = [f"{i}+{2 * i}=" for i in range(64)]
        engine.generate(prompts, SamplingParams(max_new_tokens=16), seeds=0)  # warm-up
        times = []
        for seed in range(3):
            start = time.perf_counter()
            batch = engine.generate(prompts, SamplingParams(temperature=0.6, max_new_tokens=16), seeds=seed)
            times.append(time.perf_counter() - start)
            assert batch.response_ids.shape == (64, 16) and batch.num_generated_tokens == 64 * 16
    finally:
        torch.set_num_threads(threads)
    rate = 64 * 16 / min(times)
    with capsys.disabled():
        print(f"\nHFRollout tiny model: {rate:.0f} generated tokens/s (batch 64, 16 new tokens, 2 threads)")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sampler_and_trainer_agree(tiny):
    model = load_actor(tiny, device="cuda")
    engine = HFRollout(model, load_tokenizer(tiny))
    a = engine.generate(PROMPTS, SamplingParams(n=4, temperature=0.6, top_p=0.9, max_new_tokens=24), seeds=3)
    b = engine.generate(PROMPTS, SamplingParams(n=4, temperature=0.6, top_p=0.9, max_new_tokens=24), seeds=3)
    assert a.response_ids.device.type == "cuda" and torch.equal(a.response_ids, b.response_ids)
    _check_layout(a.to("cpu"), engine, len(PROMPTS), 4)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, a.input_ids, a.attention_mask, a.response_len, temperature=0.6)
    valid = a.response_mask.bool()
    torch.testing.assert_close(logp[valid], a.logprobs[valid], atol=1e-4, rtol=0)


def test_per_prompt_seeds_make_samples_independent_of_the_batch_split(engine):
    """Data-parallel ranks that split a batch draw what one process drawing it whole would."""
    prompts = ["1+2=", "33+4=", "5+66=", "7+8=", "90+1="]
    seeds = [11, 22, 33, 44, 55]
    whole = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=8), seeds=seeds)
    parts = [
        engine.generate(
            prompts[a:b], SamplingParams(n=3, temperature=1.0, max_new_tokens=8), seeds=seeds[a:b]
        )
        for a, b in ((0, 2), (2, 5))
    ]
    assert whole.texts == parts[0].texts + parts[1].texts
    other = engine.generate(
        prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=8), seeds=[s + 1 for s in seeds]
    )
    assert other.texts != whole.texts
    with pytest.raises(ValueError, match="seeds for"):
        engine.generate(prompts, SamplingParams(), seeds=seeds[:2])
