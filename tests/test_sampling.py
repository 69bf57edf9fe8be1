"""Sampling options (``--top-k``, ``--min-p``, ``--repetition-penalty``): the logit filters by hand, their
limits sample the argmax, the penalised distribution is the one sampled, and the flags reach a run and
are checked."""

from __future__ import annotations

import pytest
from configs import grpo_pairs_config

from sppo_rl.config import from_flat
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime.logging import read_metrics

# ------------------------------------------------------------------------------------- sampling


def test_filters_by_hand():
    import torch

    from sppo_rl.llm.rollout.hf import filter_logits, repetition_penalty

    z = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda top_p, **kw: torch.isfinite(filter_logits(z, SamplingParams(top_p=top_p, **kw)))[0].tolist()  # noqa: E731
    # min_p 0.2: threshold 0.2 * 0.5 = 0.1 drops 0.05 only
    assert kept(1.0, min_p=0.2) == [True, True, True, False]
    assert kept(1.0, top_k=2) == [True, True, False, False]
    # min_p first, then top_p on what is left: [0.5, 0.3, 0.15] / 0.95 has mass 0.842 >= 0.82 before the third
    assert kept(0.82, min_p=0.2) == [True, True, False, False]
    # top_p alone: the mass before the third is 0.8 < 0.82 (kept), before the fourth 0.95 (dropped)
    assert kept(0.82) == [True, True, True, False]
    seen = torch.tensor([[True, True, False]])
    assert repetition_penalty(torch.tensor([[2.0, -1.0, 0.5]]), seen, 2.0).tolist() == [[1.0, -2.0, 0.5]]
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-1)


def _engine(tiny):
    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.tiny import load_tokenizer
    from sppo_rl.llm.rollout.hf import HFRollout

    model = load_actor(tiny, dtype="float32").eval()
    return HFRollout(model, load_tokenizer(tiny))


PROMPTS = ["12+35=", "7+8=", "99+1="]


def test_top_k_1_and_min_p_near_1_sample_the_argmax(tiny):
    greedy = _engine(tiny).generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=6))
    for options in (dict(top_k=1), dict(min_p=0.999)):
        rb = _engine(tiny).generate(
            PROMPTS, SamplingParams(n=2, max_new_tokens=6, **options), seeds=[1, 2, 3]
        )
        for row in range(6):
            g = greedy.response_ids[row // 2][greedy.response_mask[row // 2].bool()]
            assert rb.response_ids[row][rb.response_mask[row].bool()].tolist() == g.tolist(), options
        # one token left: its sampling log-prob is log 1; logprobs stay the untruncated ones
        assert float(rb.sampling_logprobs.abs().max()) < 1e-6
        assert torch_allclose(rb.logprobs[::2, : greedy.response_len], greedy.logprobs)


def torch_allclose(a, b) -> bool:
    import torch

    return bool(torch.allclose(a, b, atol=1e-5))


def test_repetition_penalty_samples_from_the_penalised_distribution(tiny):
    import torch

    from sppo_rl.llm.models.core import sequence_logprobs
    from sppo_rl.llm.rollout.hf import repetition_penalty

    engine, rho, T = _engine(tiny), 1.7, 0.8
    params = SamplingParams(n=2, temperature=T, max_new_tokens=6, repetition_penalty=rho)
    rb = engine.generate(PROMPTS, params, seeds=[4, 5, 6])
    with torch.no_grad():
        logits = engine.model(input_ids=rb.input_ids, attention_mask=rb.attention_mask).logits.float()
    P = rb.prompt_ids.shape[1]
    V = logits.shape[-1]
    for b in range(rb.batch_size):
        seen = torch.zeros(1, V, dtype=torch.bool)
        seen[0, rb.prompt_ids[b][rb.prompt_mask[b].bool()]] = True
        for t in range(int(rb.response_lengths[b])):
            z = logits[b : b + 1, P + t - 1] / T
            token = int(rb.response_ids[b, t])
            want = torch.log_softmax(repetition_penalty(z, seen, rho), -1)[0, token]
            assert float(rb.sampling_logprobs[b, t]) == pytest.approx(float(want), abs=1e-4)
            seen[0, token] = True
    # the trainer's log-probs (no penalty) are what the engine reports as logprobs
    lp, _ = sequence_logprobs(engine.model, rb.input_ids, rb.attention_mask, rb.response_len, T)
    assert torch_allclose(lp * rb.response_mask, rb.logprobs)
    assert float((rb.sampling_logprobs - rb.logprobs).abs().max()) > 1e-3  # the penalty did change q


def test_sampling_flags_reach_the_run_and_are_checked(tmp_path, tiny, rewards):
    from sppo_rl.config import ConfigError

    cfg = grpo_pairs_config(
        tmp_path, tiny, reward_fn=f"{rewards}:even", updates=1, top_k=1, log_completions_every=1
    )
    run_llm(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1]["rollout_logp_diff"] < 1e-4  # logp_old still equals the sampler's logprobs
    for bad, flag in (
        (dict(top_k=-1), "--top-k"),
        (dict(min_p=1.0), "--min-p"),
        (dict(repetition_penalty=0.0), "--repetition-penalty"),
    ):
        with pytest.raises(ConfigError, match=flag):
            from_flat(LLMConfig, bad).validate()
