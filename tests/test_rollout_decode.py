"""HFRollout's decode steps (sppo_rl/llm/rollout/decode.py): the KV cache written in place, the one-token
attention in float32, the Gumbel noise built in place, the decode step without the model's per-call
machinery; float32 samples equal transformers' own path's."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from sppo_rl.llm.models.core import cache_of, float32_head, load_actor, sequence_logprobs
from sppo_rl.llm.models.tiny import build_tiny_model, load_tokenizer
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.llm.rollout.decode import (
    DECODE_ATTENTION,
    DecodeStep,
    GrowingLayer,
    decode_attention,
    decode_attention_on,
)
from sppo_rl.llm.rollout.hf import HFRollout, _gumbel_argmax, autocast_to

CHARSET = "0123456789+-*/=() {}\\\nabcdefghijklmnopqrstuvwxyz"
PROMPTS = ["1+1=", "123 + 456 =", "a", "{x}\\y = 77 "]  # different lengths: left padding varies


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", charset=CHARSET, seed=0)


def _kv(B: int, L: int, dtype=torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 2, L, 8, generator=g).to(dtype), torch.randn(B, 2, L, 8, generator=g).to(dtype)


def test_growing_layer_holds_what_concatenation_would_and_writes_in_place():
    cache = DynamicCache()
    cache.update(*_kv(3, 5), layer_idx=0)
    reference = [cache.layers[0].keys.clone(), cache.layers[0].values.clone()]
    assert GrowingLayer.replacing(cache, extra=4)
    layer = cache.layers[0]
    storage = layer.keys.untyped_storage().data_ptr()
    for step in range(6):  # past the room for 4: the buffers are rebuilt, twice as long
        k, v = _kv(3, 1, seed=step + 1)
        keys, values = cache.update(k, v, layer_idx=0)
        reference = [torch.cat([reference[0], k], dim=-2), torch.cat([reference[1], v], dim=-2)]
        assert torch.equal(keys, reference[0]) and torch.equal(values, reference[1])
        assert cache.get_seq_length() == 6 + step
        if step < 4:  # no copy of the cache: the same storage
            assert keys.untyped_storage().data_ptr() == storage
    keep = torch.tensor([2, 0])
    cache.batch_select_indices(keep)
    assert torch.equal(layer.keys, reference[0][keep]) and torch.equal(layer.values, reference[1][keep])
    layer.batch_repeat_interleave(2)
    assert torch.equal(layer.keys, reference[0][keep].repeat_interleave(2, dim=0))
    layer.crop(-3)
    assert layer.get_seq_length() == 8 and torch.equal(
        layer.values, reference[1][keep].repeat_interleave(2, 0)[:, :, :8]
    )


def test_growing_layer_widens_bfloat16_exactly():
    """Under autocast the values arrive in bfloat16: stored widened to float32, every value unchanged."""
    cache = DynamicCache()
    k, v = _kv(2, 3, torch.bfloat16)
    cache.update(k, v, layer_idx=0)
    GrowingLayer.replacing(cache, extra=2)
    k2, v2 = _kv(2, 1, torch.bfloat16, seed=9)
    keys, values = cache.update(k2, v2, layer_idx=0)
    assert keys.dtype == values.dtype == torch.float32
    assert torch.equal(values, torch.cat([v, v2], dim=-2).float())


@pytest.mark.parametrize("masked", [False, True])
def test_decode_attention_is_sdpa_for_one_query_token(masked):
    """``softmax(q K^T / sqrt(d) + mask) V`` per query head on its key/value head (9 query heads on 3):
    within 1e-6 of transformers' sdpa attention in float32, with and without padded key positions."""

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal = 3, True

    g = torch.Generator().manual_seed(0)
    B, L = 4, 11
    q, k, v = (torch.randn(B, h, s, 16, generator=g) for h, s in ((9, 1), (3, L), (3, L)))
    mask = None
    if masked:
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
        mask[1, ..., :4] = False
        mask[3, ..., :1] = False
    ours, _ = decode_attention(Module(), q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(Module(), q, k, v, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (B, 1, 9, 16)
    assert torch.allclose(ours, theirs, atol=1e-6)
    prompt = torch.randn(B, 9, 3, 16, generator=g)  # several query tokens: transformers' sdpa itself
    assert torch.equal(
        decode_attention(Module(), prompt, k, v, None)[0],
        sdpa_attention_forward(Module(), prompt, k, v, None)[0],
    )


def test_decode_attention_is_switched_on_only_inside_and_only_over_sdpa(tiny):
    model = load_actor(tiny)
    assert model.config._attn_implementation == "sdpa"
    with decode_attention_on(model) as on:
        assert on and model.config._attn_implementation == DECODE_ATTENTION
    assert model.config._attn_implementation == "sdpa"
    with decode_attention_on(model, enabled=False) as on:
        assert not on and model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "eager"
    with decode_attention_on(model) as on:
        assert not on and model.config._attn_implementation == "eager"


def test_gumbel_noise_built_in_place_draws_what_the_written_out_formula_draws():
    """``argmax(log_q - log(-log(u)))`` with ``u`` from each row's generator: the in-place version (into a
    reused buffer wider than the batch) picks the same tokens as the formula written out."""
    g = torch.Generator().manual_seed(3)
    log_q = torch.log_softmax(torch.randn(5, 300, generator=g) * 3, dim=-1)
    log_q[0, :100] = float("-inf")  # a filtered row: never chosen
    seeds = [11, 12, 13, 14, 15]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    u = torch.stack([torch.rand(300, generator=gen) for gen in gens]).clamp(1e-20, 1.0 - 1e-7)
    expected = (log_q + -torch.log(-torch.log(u))).argmax(-1)
    buffer = torch.empty(8, 300)
    got = _gumbel_argmax(log_q, [torch.Generator().manual_seed(s) for s in seeds], buffer)
    assert torch.equal(got, expected) and int(got[0]) >= 100
    one = _gumbel_argmax(log_q, torch.Generator().manual_seed(4))
    u = torch.rand(5, 300, generator=torch.Generator().manual_seed(4)).clamp(1e-20, 1.0 - 1e-7)
    assert torch.equal(one, (log_q - torch.log(-torch.log(u))).argmax(-1))


@pytest.mark.parametrize("n, seeds", [(1, 3), (4, [5, 6, 7, 8])])
def test_float32_samples_equal_transformers_own_decode(tiny, n, seeds):
    """Same seed, same tokens as with transformers' cache and attention (fast_decode=False); the
    log-probs within 1e-5 (the attention's rounding)."""
    params = SamplingParams(n=n, temperature=0.8, max_new_tokens=14)
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    a = HFRollout(model, tok).generate(PROMPTS, params, seeds=seeds)
    b = HFRollout(model, tok, fast_decode=False).generate(PROMPTS, params, seeds=seeds)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert torch.allclose(a.sampling_logprobs, b.sampling_logprobs, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"


def test_bfloat16_sampler_logprobs_stay_as_close_to_float32_as_before(tiny):
    """Under autocast bfloat16 the fast decode attends in float32: on the sampled tokens its log-probs
    are at most 0.01 nats further (mean |diff|) from a float32 recomputation than transformers' own
    bfloat16 decode's are, and within 0.05 nats of it."""
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16)
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    gaps = []
    for fast in (True, False):
        rb = HFRollout(model, tok, autocast=torch.bfloat16, fast_decode=fast).generate(
            PROMPTS, params, seeds=[1, 2, 3, 4]
        )
        with torch.no_grad():
            exact, _ = sequence_logprobs(model.eval(), rb.input_ids, rb.attention_mask, rb.response_len)
        gaps.append(float((rb.logprobs - exact)[rb.response_mask.bool()].abs().mean()))
    fast_gap, own_gap = gaps
    assert fast_gap <= own_gap + 0.01 and fast_gap < 0.05, gaps


def _llama(seed: int = 0):
    """A tiny Llama (SmolLM2's architecture: no biases, tied embeddings), built in memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, rope_theta=100000.0,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _prefilled(model, ids, mask, autocast):
    """The model's output over ``ids`` with its cache's layers made :class:`GrowingLayer` s."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), autocast_to(autocast, torch.device("cpu")), decode_attention_on(model):
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    assert GrowingLayer.replacing(cache_of(out), 2)  # room for 2: the third step rebuilds the buffers
    return out.logits[:, -1:], cache_of(out), positions[:, -1:] + 1


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_decode_step_logits_are_the_models_own(tiny, arch, autocast):
    """Four decode steps over left-padded rows: :class:`DecodeStep`'s logits equal, bit for bit, those of
    the model's own forward on a copy of the same cache (float32, and under autocast with the float32
    head), and so do the caches they leave."""
    model = load_actor(tiny).eval() if arch == "qwen2" else _llama()
    if autocast is not None:
        float32_head(model)
    V = model.config.vocab_size
    ids = torch.randint(3, V, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding of different lengths
    mask[2, :1] = 0
    step = DecodeStep.for_model(model)
    assert step is not None
    logits, ours, position = _prefilled(model, ids, mask, autocast)
    _, theirs, _ = _prefilled(model, ids, mask, autocast)
    for _ in range(4):
        token = logits[:, -1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, mask.new_ones(3, 1)], dim=1)
        with torch.no_grad(), autocast_to(autocast, torch.device("cpu")), decode_attention_on(model):
            expected = model(
                input_ids=token, attention_mask=mask, position_ids=position, cache=theirs, use_cache=True,
                logits_to_keep=1,
            ).logits  # fmt: skip
            assert DecodeStep.runs(ours)
            logits = step(token, mask, position, ours)
        assert logits.shape == (3, 1, V) and torch.equal(logits, expected)
        position = position + 1
    for a, b in zip(ours.layers, theirs.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_decode_step_is_built_only_where_its_arithmetic_is_the_models(tiny):
    """None for a model in training mode, with a forward hook (DeepSpeed ZeRO-3 gathers weights in
    hooks), with a projection that is not a plain ``nn.Linear`` (an adapter), with sliding-window layers,
    or of another architecture; a cache whose layers are not :class:`GrowingLayer` s is not run."""
    from transformers import GPT2Config, GPT2LMHeadModel

    assert DecodeStep.for_model(_llama()) is not None
    assert DecodeStep.for_model(_llama().train()) is None
    hooked = _llama()
    handle = hooked.model.layers[1].mlp.register_forward_pre_hook(lambda *_: None)
    assert DecodeStep.for_model(hooked) is None
    handle.remove()
    assert DecodeStep.for_model(hooked) is not None

    class Adapted(torch.nn.Linear):
        pass

    adapted = _llama()
    adapted.model.layers[0].self_attn.v_proj.__class__ = Adapted
    assert DecodeStep.for_model(adapted) is None
    sliding = load_actor(tiny).eval()
    sliding.config.layer_types = ["sliding_attention"] * sliding.config.num_hidden_layers
    assert DecodeStep.for_model(sliding) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=1, n_head=2)).eval()
    assert DecodeStep.for_model(gpt2) is None
    cache = DynamicCache()
    cache.update(*_kv(1, 2), layer_idx=0)
    assert not DecodeStep.runs(cache) and not DecodeStep.runs(None)


def test_sampling_runs_its_decode_steps_through_decode_step(tiny, monkeypatch):
    """HFRollout's decode loop uses :class:`DecodeStep` for a supported model (one call per decode step
    after the first token), so the equality above is what sampling gets."""
    calls = []
    original = DecodeStep.__call__

    def counted(self, *args):
        calls.append(args[0].shape[0])
        return original(self, *args)

    monkeypatch.setattr(DecodeStep, "__call__", counted)
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    rb = HFRollout(model, tok).generate(PROMPTS, SamplingParams(n=2, max_new_tokens=6), seeds=1)
    assert len(calls) == rb.response_len - 1 and calls[0] == 2 * len(PROMPTS)
    calls.clear()
    HFRollout(model, tok, fast_decode=False).generate(PROMPTS, SamplingParams(n=2, max_new_tokens=6), seeds=1)
    assert calls == []
