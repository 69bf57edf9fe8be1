"""``--precision``: mixed precision with the torch engine (bfloat16 matmuls over float32 master weights) with
the LM head's logits and the critic's value head in float32 (:class:`~sppo_rl.llm.models.core.Float32Head`).
The trainer's forward passes (log-probs, values: ``build.row_fn``) and the HF rollout run under
``torch.autocast``; weights, optimizer, head, log-softmax and loss stay float32. Checked on the small Llama of
``test_pretrained`` (a BPE tokenizer and a chat template): each side really computes in bfloat16 (its numbers
move off float32's), the head really computes in float32 (its logits equal a float32 matmul of the bfloat16
body's hidden states, unlike autocast's own head), the sampler's log-probs are the trainer's to bfloat16's
rounding, ``auto`` resolves by the rule its flag states, a run trains end to end and records it, and the
settings it cannot serve are refused in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from test_pretrained import build_small_llama

    return build_small_llama(tmp_path_factory.mktemp("llama"))


def _model(llama: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32), AutoTokenizer.from_pretrained(
        llama
    )


def _batch(llama: Path):
    """Two prompts x 2 samples of at most 6 tokens from the float32 model, seeded."""
    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout

    model, tok = _model(llama)
    rb = HFRollout(model, tok, add_special_tokens=False).generate(
        ["12+34=", "what is 7 times 8?"], SamplingParams(n=2, max_new_tokens=6), seeds=[1, 2]
    )
    return model, tok, rb


def test_the_float32_head_computes_the_logits_in_float32_over_the_bfloat16_body(llama):
    """Under autocast the patched head's logits equal ``hidden.float() @ W^T`` in float32 exactly, where
    autocast's own head rounds them through bfloat16; its state dict, its tie to the embeddings and its class
    under ``deepcopy`` are kept."""
    from sppo_rl.llm.models.core import Float32Head, float32_head

    model, _ = _model(llama)
    keys = list(model.state_dict())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ids = torch.tensor([[5, 9, 17, 3, 8]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(ids, output_hidden_states=True)
        hidden = plain.hidden_states[-1]
        float32_head(model)
        patched = model(ids).logits
    head = model.get_output_embeddings()
    assert isinstance(head, Float32Head) and list(model.state_dict()) == keys
    assert (head.weight is model.get_input_embeddings().weight) == tied
    assert plain.logits.dtype == torch.bfloat16 and patched.dtype == torch.float32
    assert torch.equal(patched, F.linear(hidden.float(), head.weight))  # the float32 matmul, exactly
    assert (patched - plain.logits.float()).abs().max() > 1e-4  # autocast's head does round them
    assert isinstance(copy.deepcopy(model).get_output_embeddings(), Float32Head)
    assert float32_head(model) is model  # a second call is a no-op
    with pytest.raises(TypeError, match="nn.Linear"):
        float32_head(SimpleNamespace(head=torch.nn.Identity()))


def test_the_trainers_rows_compute_in_bfloat16_under_bf16_and_in_float32_under_fp32(llama):
    from sppo_rl.llm.build import row_fn
    from sppo_rl.llm.models.core import float32_head, sequence_logprobs

    model, _, rb = _batch(llama)
    T = rb.response_ids.shape[1]
    ids = torch.cat([rb.prompt_ids, rb.response_ids], 1)
    attn = torch.cat([rb.prompt_mask, rb.response_mask], 1)
    rows = torch.arange(len(rb.texts))

    def plan(precision: str) -> SimpleNamespace:
        return SimpleNamespace(
            models=SimpleNamespace(precision=precision, shared_prompt=False),
            rollout=SimpleNamespace(temperature=1.0),
            latent=None,
            device=torch.device("cpu"),
        )

    with torch.no_grad():
        fp32 = sequence_logprobs(model, ids, attn, T)[0]
        off = row_fn(plan("fp32"))(rb, model, True)(rows, T)[0]
        float32_head(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = sequence_logprobs(model, ids, attn, T)[0]
        on = row_fn(plan("bf16"))(rb, model, True)(rows, T)[0]
    assert off.dtype == on.dtype == torch.float32  # the log-softmax stays float32
    mask = rb.response_mask.bool()
    assert torch.equal(off[mask], fp32[mask])
    assert torch.equal(on[mask], bf16[mask])
    assert (bf16 - fp32)[mask].abs().max() > 1e-6  # bfloat16 matmuls do move the numbers


def test_the_sampler_scores_its_tokens_as_the_trainer_does_under_bf16(llama):
    """The HF rollout under autocast with the float32 head: its sampling log-probs equal the trainer's
    recomputation of the same tokens to bfloat16's rounding (the log-prob mismatch a run logs as
    ``rollout_logp_diff``), and float32 sampling is float32 exactly; the model's mode and dtype are restored."""
    from sppo_rl.llm.models.core import float32_head, sequence_logprobs
    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout

    model, tok = _model(llama)
    prompts, params = ["12+34=", "what is 7 times 8?", "hello"], SamplingParams(n=2, max_new_tokens=6)
    a = HFRollout(model, tok, add_special_tokens=False).generate(prompts, params, seeds=[1, 2, 3])
    b = HFRollout(model, tok, add_special_tokens=False, autocast=None).generate(
        prompts, params, seeds=[1, 2, 3]
    )
    assert torch.equal(a.logprobs, b.logprobs)
    float32_head(model)
    model.train()
    c = HFRollout(model, tok, add_special_tokens=False, autocast=torch.bfloat16).generate(
        prompts, params, seeds=[1, 2, 3]
    )
    assert model.training and not torch.is_autocast_enabled("cpu")  # mode restored, autocast left
    assert next(model.parameters()).dtype == torch.float32  # weights untouched
    T = c.response_ids.shape[1]
    ids = torch.cat([c.prompt_ids, c.response_ids], 1)
    attn = torch.cat([c.prompt_mask, c.response_mask], 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        trained = sequence_logprobs(model.eval(), ids, attn, T)[0]
    mask = c.response_mask.bool()
    gap = (trained - c.logprobs)[mask].abs()
    assert gap.max() < 5e-2  # one precision on both sides: only bfloat16's rounding of the batch shapes


def test_a_worker_replica_gets_the_float32_head_under_bf16_and_only_then(llama):
    from sppo_rl.llm.models.core import Float32Head
    from sppo_rl.llm.rollout.worker import replica_builder

    for autocast, kind in ((None, torch.nn.Linear), ("bfloat16", Float32Head)):
        rollout = replica_builder(str(llama), "float32", 0, autocast)()  # what the worker builds, here
        assert type(rollout.model.get_output_embeddings()) is kind
        assert rollout.autocast == (torch.bfloat16 if autocast else None)


def test_auto_precision_resolves_by_its_stated_rule(tmp_path, llama):
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.models.core import native_bf16
    from sppo_rl.llm.plan import PRECISION_MIN_BYTES, precision_of

    cpu = torch.device("cpu")
    native = "bf16" if native_bf16(cpu) else "fp32"
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "model.safetensors", "wb") as f:  # sparse: the size is what the rule reads
        f.truncate(PRECISION_MIN_BYTES)
    assert precision_of(LLMConfig(), None, cpu) == "fp32"  # the embedded tiny model
    assert precision_of(LLMConfig(model=str(llama)), llama, cpu) == "fp32"  # a small folder
    assert precision_of(LLMConfig(model=str(big)), big, cpu) == native
    assert precision_of(LLMConfig(model="smollm2-135m"), None, cpu) == native  # a named model
    assert precision_of(LLMConfig(model="smollm2-135m", engine="deepspeed"), None, cpu) == "fp32"
    assert precision_of(LLMConfig(model="smollm2-135m", dtype="bfloat16"), None, cpu) == "fp32"
    assert precision_of(LLMConfig(precision="bf16"), None, cpu) == "bf16"  # as given
    assert precision_of(LLMConfig(model="smollm2-135m", precision="fp32"), None, cpu) == "fp32"
    assert not native_bf16(torch.device("meta"))


def test_a_run_under_bf16_trains_and_records_it(tmp_path, llama):
    from test_real_model import _cfg, _parity, _rows

    from sppo_rl.llm.trainer import run_llm

    rows = {}
    for mode in ("auto", "bf16"):
        run_llm(
            _cfg(
                tmp_path,
                llama,
                name=mode,
                precision=mode,
                reward_fn=_parity(tmp_path),
                updates=2,
                prompts_per_step=4,
                max_new_tokens=6,
            )
        )
        rows[mode] = [r for r in _rows(tmp_path / mode) if "policy_loss" in r]
        record = json.loads((tmp_path / mode / "config.json").read_text())
        assert record["precision"] == mode and record["resolved"]["precision"] == {"auto": "fp32"}.get(
            mode, mode
        )
        assert record["resolved"]["threads"] == 1  # --threads resolved (given, or auto for a small model)
    assert len(rows["bf16"]) == 2
    assert [r["policy_loss"] for r in rows["auto"]] != [r["policy_loss"] for r in rows["bf16"]]


def test_a_bf16_run_builds_its_actor_reference_and_critic_with_float32_heads(tmp_path, llama):
    from test_real_model import _cfg, _parity

    from sppo_rl.llm.models.core import Float32Head
    from sppo_rl.llm.trainer import LLMRun

    for mode, kind in (("bf16", Float32Head), ("fp32", torch.nn.Linear)):
        cfg = _cfg(
            tmp_path,
            llama,
            name=mode,
            precision=mode,
            reward_fn=_parity(tmp_path),
            algo="sppo",
            group_size=1,
            kl_coef=0.1,
        )
        run = LLMRun(cfg)
        try:
            m = run.models
            assert type(m.actor.get_output_embeddings()) is kind
            assert type(m.ref.get_output_embeddings()) is kind
            assert type(m.critic.head) is kind
            assert m.rollout.autocast == (torch.bfloat16 if mode == "bf16" else None)
        finally:
            run.close()


@pytest.mark.parametrize("kw", [dict(engine="deepspeed"), dict(dtype="bfloat16")])
def test_bf16_is_refused_where_it_cannot_serve(kw):
    from sppo_rl.llm.config import LLMConfig

    words = "--precision must be auto or fp32 unless --engine torch with --dtype float32"
    with pytest.raises(ValueError, match=words):
        LLMConfig(precision="bf16", **kw).validate()


def test_the_old_flag_names_the_new_one():
    from sppo_rl.cli import unknown_flag
    from sppo_rl.llm.config import LLMConfig

    said = unknown_flag("llm", LLMConfig, ["--autocast", "bfloat16"])
    assert said.startswith("unknown flag --autocast; did you mean --precision (its name before, --autocast;")
