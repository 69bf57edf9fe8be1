"""``--autocast bfloat16``: mixed precision with the torch engine (speed on a CPU with
AVX512-BF16 or AMX). The trainer's forward passes (log-probs, values: ``build.row_fn``) and the HF rollout
run under ``torch.autocast``; weights, optimizer, log-softmax and loss stay float32. Checked on the small
Llama of ``test_pretrained`` (a BPE tokenizer and a chat template): each side really computes in
bfloat16 (its numbers move off float32's, and back onto them with autocast off), a run trains end to end
and records it, and the settings it cannot serve are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from test_pretrained import build_small_llama

    return build_small_llama(tmp_path_factory.mktemp("llama"))


def _batch(llama: Path):
    """Two prompts x 2 samples of at most 6 tokens from the float32 model, seeded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout

    tok = AutoTokenizer.from_pretrained(llama)
    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32)
    rb = HFRollout(model, tok, add_special_tokens=False).generate(
        ["12+34=", "what is 7 times 8?"], SamplingParams(n=2, max_new_tokens=6), seeds=[1, 2]
    )
    return model, tok, rb


def test_the_trainers_rows_compute_in_bfloat16_under_autocast_and_in_float32_without(llama):
    from sppo_rl.llm.build import row_fn
    from sppo_rl.llm.models.core import sequence_logprobs

    model, _, rb = _batch(llama)
    T = rb.response_ids.shape[1]
    ids = torch.cat([rb.prompt_ids, rb.response_ids], 1)
    attn = torch.cat([rb.prompt_mask, rb.response_mask], 1)
    rows = torch.arange(len(rb.texts))
    with torch.no_grad():
        fp32 = sequence_logprobs(model, ids, attn, T)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = sequence_logprobs(model, ids, attn, T)[0]
        got = {}
        for mode in ("off", "bfloat16"):
            plan = SimpleNamespace(
                models=SimpleNamespace(autocast=mode),
                rollout=SimpleNamespace(temperature=1.0),
                latent=None,
                device=torch.device("cpu"),
            )
            logp = row_fn(plan)(rb, model, True)(rows, T)[0]
            assert logp.dtype == torch.float32  # the log-softmax stays float32
            got[mode] = logp
    mask = rb.response_mask.bool()
    assert torch.equal(got["off"][mask], fp32[mask])
    assert torch.equal(got["bfloat16"][mask], bf16[mask])
    assert (bf16 - fp32)[mask].abs().max() > 1e-6  # bfloat16 matmuls do move the numbers


def test_the_hf_rollout_samples_from_bfloat16_matmuls_under_autocast(llama):
    """Greedy decodes from the same prompts: the first token's log-prob moves off float32's by bfloat16's
    rounding (not by more than a few hundredths), and autocast=None is float32 exactly."""
    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout

    model, tok, _ = _batch(llama)
    greedy = SamplingParams(max_new_tokens=1, greedy=True)
    prompts = ["12+34=", "what is 7 times 8?", "hello"]
    a = HFRollout(model, tok, add_special_tokens=False).generate(prompts, greedy)
    b = HFRollout(model, tok, add_special_tokens=False, autocast=None).generate(prompts, greedy)
    model.train()
    c = HFRollout(model, tok, add_special_tokens=False, autocast=torch.bfloat16).generate(prompts, greedy)
    assert model.training and not torch.is_autocast_enabled("cpu")  # mode restored, autocast left
    assert torch.equal(a.logprobs, b.logprobs)
    same = (a.response_ids == c.response_ids)[:, 0]
    assert same.any()
    gap = (a.logprobs - c.logprobs)[same, 0].abs()
    assert gap.max() > 1e-6 and gap.max() < 5e-2
    assert next(model.parameters()).dtype == torch.float32  # weights untouched


def test_a_run_under_autocast_trains_and_records_it(tmp_path, llama):
    from test_real_model import _cfg, _parity, _rows

    from sppo_rl.llm.trainer import run_llm

    rows = {}
    for mode in ("off", "bfloat16"):
        run_llm(
            _cfg(
                tmp_path,
                llama,
                name=mode,
                autocast=mode,
                reward_fn=_parity(tmp_path),
                updates=2,
                prompts_per_step=4,
                max_new_tokens=6,
            )
        )
        rows[mode] = [r for r in _rows(tmp_path / mode) if "policy_loss" in r]
        assert json.loads((tmp_path / mode / "config.json").read_text())["autocast"] == mode
    assert len(rows["bfloat16"]) == 2
    assert [r["policy_loss"] for r in rows["off"]] != [r["policy_loss"] for r in rows["bfloat16"]]


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(engine="deepspeed"), "--autocast must be off unless --engine torch with --dtype float32"),
        (dict(dtype="bfloat16"), "--autocast must be off unless --engine torch with --dtype float32"),
    ],
)
def test_autocast_is_refused_where_it_cannot_serve(kw, words):
    from sppo_rl.llm.config import LLMConfig

    with pytest.raises(ValueError, match=words):
        LLMConfig(autocast="bfloat16", **kw).validate()
