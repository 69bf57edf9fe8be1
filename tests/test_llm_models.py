"""The tiny model, the char-level tokenizer, the critics and the trainer's log-probs, on real transformers models."""

from __future__ import annotations

import hashlib

import pytest
import torch

from sppo_rl.llm.models.checks import check_same_tokenizer
from sppo_rl.llm.models.core import load_actor, logprobs_from_logits, positions_from_mask, sequence_logprobs
from sppo_rl.llm.models.critic import SequenceCritic, StepCritic
from sppo_rl.llm.models.tiny import (
    build_tiny_model,
    byte_level,
    char_vocab,
    ensure_tiny_model,
    load_tokenizer,
)

CHARSET = "0123456789+-*/=()<> {}\\\n.,:;abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", charset=CHARSET, seed=0)


@pytest.fixture(scope="module")
def tok(tiny):
    return load_tokenizer(tiny)


def _digest(folder):
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def _prompts(tok, texts, extra_left_pad=0):
    enc = tok(texts, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if extra_left_pad:
        pad = torch.full((ids.shape[0], extra_left_pad), tok.pad_token_id)
        ids, mask = torch.cat([pad, ids], 1), torch.cat([torch.zeros_like(pad), mask], 1)
    return ids, mask


def _with_responses(tok, prompt_ids, prompt_mask, responses):
    """``[prompt | response]`` rows: responses right-padded with the pad id."""
    enc = [tok(r)["input_ids"] for r in responses]
    T = max(len(e) for e in enc)
    r_ids = torch.full((len(enc), T), tok.pad_token_id)
    r_mask = torch.zeros(len(enc), T, dtype=torch.long)
    for i, e in enumerate(enc):
        r_ids[i, : len(e)] = torch.tensor(e)
        r_mask[i, : len(e)] = 1
    return torch.cat([prompt_ids, r_ids], 1), torch.cat([prompt_mask, r_mask], 1), T


# ------------------------------------------------------------------------------- tiny model


def test_build_is_deterministic_and_reloads_offline(tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again", charset=CHARSET, seed=0)
    other = build_tiny_model(tmp_path / "other", charset=CHARSET, seed=1)
    assert _digest(again) == _digest(tiny)
    assert _digest(other) != _digest(tiny)
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (tiny / name).is_file(), name

    rng = torch.get_rng_state()
    build_tiny_model(tmp_path / "rng", charset=CHARSET, seed=3)
    assert torch.equal(rng, torch.get_rng_state()), "building must not move the global RNG"

    model = load_actor(tiny)
    n_params = sum(p.numel() for p in model.parameters())
    assert model.config.model_type == "qwen2" and 2e5 < n_params < 1e7
    assert model.config.vocab_size == len(char_vocab(CHARSET))
    assert model.config.eos_token_id == 1 and model.config.pad_token_id == 0
    assert model.generation_config.eos_token_id == 1 and model.generation_config.pad_token_id == 0
    assert load_actor(tiny, dtype="bfloat16").dtype == torch.bfloat16


def test_tokenizer_round_trips_spaces_braces_backslashes(tok):
    texts = [" 12 + {3}\\ = 15 ", "\\boxed{42}", "a  b\n\nc", "(x*y)/z; 1,2:3.", "  "]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text), "one token per character, spaces included"
        assert tok.decode(ids) == text
        assert tok.convert_ids_to_tokens(ids) == [byte_level(c) for c in text]  # byte-level names: " " is "Ġ"
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.unk_token_id == 2
    assert tok("#")["input_ids"] == [], (
        "characters outside the charset are dropped (as Qwen2's tokenizer does)"
    )
    ids = tok("1+1")["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "1+1"
    assert tok.decode(ids) == "1+1<eos>"


def test_load_tokenizer_pads_left(tok):
    assert tok.padding_side == "left"
    ids, mask = _prompts(tok, ["1", "123"])
    assert ids.tolist() == [[0, 0, tok.convert_tokens_to_ids("1")], tok("123")["input_ids"]]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1]]


def test_ensure_tiny_model_builds_once(tmp_path):
    first = ensure_tiny_model(tmp_path, "0123456789+= ", hidden_size=32, layers=1, heads=2)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny_model(tmp_path, "0123456789+= ", hidden_size=32, layers=1, heads=2)
    assert again == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    other = ensure_tiny_model(tmp_path, "0123456789+= ", hidden_size=32, layers=2, heads=2)
    assert other != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name]), (
        "no temporary leftovers"
    )
    assert load_actor(other).config.num_hidden_layers == 2


# ------------------------------------------------------------------------------- sequence critic


@pytest.fixture(scope="module")
def seq_critic(tiny):
    torch.manual_seed(0)
    critic = SequenceCritic.from_backbone(tiny, init_std=0.05)  # larger than default so changes show
    return critic.eval()


def test_sequence_critic_initial_prior(tiny, tok):
    torch.manual_seed(0)
    critic = SequenceCritic.from_backbone(tiny, init_bias=-1.0)
    ids, mask = _prompts(tok, ["1+1=", "12+30="])
    with torch.no_grad():
        logits = critic(ids, mask)
    assert logits.shape == (2,)
    assert torch.allclose(logits, torch.full((2,), -1.0), atol=0.05)
    assert critic.head.weight.dtype == torch.float32


def test_sequence_critic_ignores_left_padding_and_response(seq_critic, tok):
    texts = ["1+1=", "12+30=", "7*8 ="]
    ids, mask = _prompts(tok, texts)
    with torch.no_grad():
        base = seq_critic(ids, mask)
        padded = seq_critic(*_prompts(tok, texts, extra_left_pad=5))
        alone = torch.stack([seq_critic(*_prompts(tok, [t]))[0] for t in texts])
        full_a, mask_a, T_a = _with_responses(tok, ids, mask, ["2<eos>", "42", "56 is it"])
        full_b, mask_b, T_b = _with_responses(tok, ids, mask, ["999999", "x", "{}\\"])
        from_a = seq_critic(full_a, mask_a, T_a)
        from_b = seq_critic(full_b, mask_b, T_b)
    torch.testing.assert_close(padded, base, atol=1e-5, rtol=0)
    torch.testing.assert_close(alone, base, atol=1e-5, rtol=0)
    assert torch.equal(from_a, base) and torch.equal(from_b, base)
    assert not torch.allclose(base[0], base[1]), "different prompts should get different values"


def test_sequence_critic_reads_the_last_prompt_token(seq_critic, tok):
    ids, mask = _prompts(tok, ["1+1=", "12+30="])
    with torch.no_grad():
        base = seq_critic(ids, mask)
        changed = ids.clone()
        changed[:, -1] = tok.convert_tokens_to_ids("x")
        assert (seq_critic(changed, mask) - base).abs().min() > 1e-4
        # The value is the head applied to the backbone's hidden state in the last prompt column, even
        # when the backbone runs over prompt + response.
        full, full_mask, T = _with_responses(tok, ids, mask, ["2", "42"])
        hidden = seq_critic.backbone(
            input_ids=full, attention_mask=full_mask, position_ids=positions_from_mask(full_mask)
        ).last_hidden_state
        torch.testing.assert_close(seq_critic.head(hidden[:, -T - 1]).squeeze(-1), base, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="left-padded"):
        seq_critic(*_with_responses(tok, ids, mask, ["2", "42"])[:2])  # right padding in the last column


def test_sequence_critic_save_load_round_trip(seq_critic, tok, tmp_path):
    ids, mask = _prompts(tok, ["1+1=", "12+30=", "abc"])
    seq_critic.save_pretrained(tmp_path / "critic", tokenizer=tok)
    loaded = SequenceCritic.from_pretrained(tmp_path / "critic").eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids, mask), seq_critic(ids, mask))
    check_same_tokenizer(tok, load_tokenizer(tmp_path / "critic"))
    with pytest.raises(ValueError, match="'sequence' critic, not a 'token'"):
        StepCritic.from_pretrained(tmp_path / "critic")


def test_critic_trains_toward_targets(tiny, tok):
    """A few BCE steps on the head + backbone move the predicted success probabilities toward R."""
    torch.manual_seed(0)
    critic = SequenceCritic.from_backbone(tiny)
    ids, mask = _prompts(tok, ["1+1=", "12+30=", "7*8=", "9-3="])
    R = torch.tensor([1.0, 0.0, 1.0, 0.0])
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(critic(ids, mask), R)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# ------------------------------------------------------------------------------- token critic


def test_token_critic_values_are_aligned(tiny, tok):
    torch.manual_seed(0)
    critic = StepCritic.from_backbone(tiny, init_std=0.05).eval()
    ids, mask = _prompts(tok, ["1+1=", "12+30="])
    full, full_mask, T = _with_responses(tok, ids, mask, ["2<eos>", "42<eos>"])
    with torch.no_grad():
        values = critic(full, full_mask, T)
        assert values.shape == (2, T)
        # t = 0 is the state before the first response token: the last prompt token, as SPPO's critic.
        same_net = SequenceCritic(critic.backbone, critic.head)
        torch.testing.assert_close(values[:, 0], same_net(ids, mask), atol=1e-5, rtol=0)
        # Changing response token 1 changes V at t >= 2 only (V(s_t) sees tokens before t).
        changed = full.clone()
        changed[:, ids.shape[1] + 1] = tok.convert_tokens_to_ids("z")
        diff = (critic(changed, full_mask, T) - values).abs()
    assert diff[:, :2].max() < 1e-5
    assert diff[:, 2].min() > 1e-5


def test_token_critic_save_load_round_trip(tiny, tok, tmp_path):
    torch.manual_seed(1)
    critic = StepCritic.from_backbone(tiny, init_std=0.05).eval()
    ids, mask = _prompts(tok, ["1+1=", "12+30="])
    full, full_mask, T = _with_responses(tok, ids, mask, ["2<eos>", "42"])
    critic.save_pretrained(tmp_path / "vc")
    loaded = StepCritic.from_pretrained(tmp_path / "vc").eval()
    with torch.no_grad():
        assert torch.equal(loaded(full, full_mask, T), critic(full, full_mask, T))
    with pytest.raises(FileNotFoundError):
        StepCritic.from_pretrained(tiny)


# ------------------------------------------------------------------------------- tokenizer check


def test_tokenizer_mismatch_is_refused(tiny, tok, tmp_path):
    check_same_tokenizer(tok, load_tokenizer(tiny))
    other = load_tokenizer(build_tiny_model(tmp_path / "other", charset="0123456789+-= xyz"))
    with pytest.raises(
        ValueError, match="vocabularies differ: actor has .* tokens, critic .*only in the actor"
    ):
        check_same_tokenizer(tok, other)
    shifted = load_tokenizer(build_tiny_model(tmp_path / "shifted", charset=CHARSET[::-1]))
    with pytest.raises(ValueError, match="different ids"):
        check_same_tokenizer(tok, shifted)
    repadded = load_tokenizer(tiny)
    repadded.pad_token = repadded.eos_token
    with pytest.raises(ValueError, match="pad_token_id differs: actor 0, critic 1"):
        check_same_tokenizer(tok, repadded)


# ------------------------------------------------------------------------------- log-probs


def test_sequence_logprobs_match_a_full_log_softmax(tiny, tok):
    model = load_actor(tiny).eval()
    ids, mask = _prompts(tok, ["1+1=", "12+30=", "7="])
    full, full_mask, T = _with_responses(tok, ids, mask, ["2<eos>", "42", "seven<eos>"])
    for temperature in (1.0, 0.6):
        with torch.no_grad():
            logp, entropy = sequence_logprobs(model, full, full_mask, T, temperature=temperature)
            logits = model(
                input_ids=full, attention_mask=full_mask, position_ids=positions_from_mask(full_mask)
            ).logits
        ref_all = torch.log_softmax(logits[:, -T - 1 : -1] / temperature, -1)
        ref = ref_all.gather(-1, full[:, -T:, None]).squeeze(-1)
        ref_entropy = -(ref_all.exp() * ref_all).sum(-1)
        valid = full_mask[:, -T:].bool()
        torch.testing.assert_close(logp[valid], ref[valid], atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy[valid], ref_entropy[valid], atol=1e-5, rtol=0)
        assert logp.dtype == torch.float32 and logp.shape == (3, T)

    half = load_actor(tiny, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        logp_bf16, _ = sequence_logprobs(half, full, full_mask, T)
        logp_fp32, _ = sequence_logprobs(model, full, full_mask, T)
    assert logp_bf16.dtype == torch.float32
    torch.testing.assert_close(logp_bf16[valid], logp_fp32[valid], atol=0.05, rtol=0)


def test_logprobs_from_logits_chunks_and_grads():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    whole_lp, whole_ent = logprobs_from_logits(logits, targets, 0.7)
    chunk_lp, chunk_ent = logprobs_from_logits(logits, targets, 0.7, chunk_elements=22)  # 2 rows per chunk
    torch.testing.assert_close(chunk_lp, whole_lp)
    torch.testing.assert_close(chunk_ent, whole_ent)
    (g_whole,) = torch.autograd.grad((whole_lp.sum() + whole_ent.sum()), logits)
    (g_chunk,) = torch.autograd.grad((chunk_lp.sum() + chunk_ent.sum()), logits)
    torch.testing.assert_close(g_chunk, g_whole)
    ref = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(whole_lp, ref)
    with pytest.raises(ValueError):
        logprobs_from_logits(logits, targets, 0.0)


def test_an_engine_checkpoint_holds_the_actor_as_save_pretrained_writes_it_and_old_ones_still_load(
    tiny, tmp_path
):
    """HFTorchEngine.save: a transformers actor's weights in ``model.safetensors`` (what its
    ``save_pretrained`` writes, a tied head once) and the optimizer in ``engine.pt``; load restores both
    exactly, reads the former layout (weights inside ``engine.pt``) and refuses weights of another model."""
    from sppo_rl.llm.models.engines import HFTorchEngine
    from sppo_rl.runtime.checkpoint import torch_load, torch_save

    def trained(seed):
        torch.manual_seed(seed)
        engine = HFTorchEngine(load_actor(tiny), lr=1e-2)
        ids = torch.randint(0, 20, (2, 6))
        engine.module(input_ids=ids).logits.square().mean().backward()
        engine.optimizer.step()
        return engine

    a = trained(0)
    a.save(tmp_path / "new")
    assert "module" not in torch_load(tmp_path / "new" / "engine.pt")
    a.module.save_pretrained(tmp_path / "export")
    assert _digest(tmp_path / "new") == _digest(tmp_path / "export"), "the export's very bytes"
    b = trained(1)
    b.load(tmp_path / "new")
    assert all(
        torch.equal(x, y) for x, y in zip(a.module.state_dict().values(), b.module.state_dict().values())
    )
    moments = lambda e: [t for st in e.optimizer.state_dict()["state"].values() for t in st.values()]  # noqa: E731
    assert len(moments(a)) > 0 and all(torch.equal(x, y) for x, y in zip(moments(a), moments(b), strict=True))
    old = {"module": a.module.state_dict(), "trainable_only": False, "optimizer": a.optimizer.state_dict()}
    (tmp_path / "old").mkdir()
    torch_save(old, tmp_path / "old" / "engine.pt")
    c = trained(2)
    c.load(tmp_path / "old")
    assert all(
        torch.equal(x, y) for x, y in zip(a.module.state_dict().values(), c.module.state_dict().values())
    )
    other = build_tiny_model(tmp_path / "other", charset=CHARSET, seed=0, layers=2)  # two layers short
    (tmp_path / "new" / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(RuntimeError, match="do not fit the model"):
        c.load(tmp_path / "new")


def _groups(tok):
    """Three prompts of different lengths, four responses each (rows of a prompt adjacent, as a group
    method samples them), responses of different lengths right-padded."""
    texts = ["1+1=", "12+30=", "7="]
    ids, mask = _prompts(tok, [t for t in texts for _ in range(4)], extra_left_pad=1)
    answers = [
        "2<eos>",
        "2",
        "22<eos>",
        "3",
        "42",
        "4<eos>",
        "42<eos>",
        "seven<eos>",
        "7<eos>",
        "7",
        "77",
        "x",
    ]
    full, full_mask, T = _with_responses(tok, ids, mask, answers)
    P = ids.shape[1]
    return ids, mask, full[:, P:], full_mask[:, P:], full, full_mask, T


def test_shared_prompt_logprobs_are_sequence_logprobs_with_each_prompt_run_once(tiny, tok):
    """The log-probs, entropies and the parameters' gradients of a masked log-prob sum equal those of
    :func:`sequence_logprobs` over the whole rows (to rounding), and the prompts' forward ran over the 3
    distinct prompts, not the 12 rows."""
    from sppo_rl.llm.models.core import shared_prompt_logprobs

    model = load_actor(tiny).eval()
    ids, mask, r_ids, r_mask, full, full_mask, T = _groups(tok)
    seen = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    grads = []
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        seen.clear()
        if shared:
            logp, ent = shared_prompt_logprobs(model, ids, mask, r_ids, r_mask, temperature=0.7)
            assert seen == [(3, ids.shape[1]), (12, T - 1)]
        else:
            logp, ent = sequence_logprobs(model, full, full_mask, T, temperature=0.7)
        (logp * r_mask).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        valid = r_mask.bool()
        if shared:
            got = (logp[valid].detach(), ent[valid].detach())
        else:
            torch.testing.assert_close(got[0], logp[valid].detach(), atol=1e-5, rtol=0)
            torch.testing.assert_close(got[1], ent[valid].detach(), atol=1e-5, rtol=0)
    hook.remove()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prompt_logprobs_decline_where_they_do_not_pay_or_cannot_run(tiny, tok):
    """None (run the rows whole) with more distinct prompts than half the rows, and with gradient
    checkpointing (which turns the cache off)."""
    from sppo_rl.llm.models.core import shared_prompt_logprobs

    model = load_actor(tiny).eval()
    ids, mask, r_ids, r_mask, *_ = _groups(tok)
    rows = torch.tensor([0, 4, 8, 9])  # three prompts in four rows
    assert shared_prompt_logprobs(model, ids[rows], mask[rows], r_ids[rows], r_mask[rows]) is None
    assert shared_prompt_logprobs(model, ids[:8], mask[:8], r_ids[:8], r_mask[:8]) is not None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert shared_prompt_logprobs(model.train(), ids, mask, r_ids, r_mask) is None
