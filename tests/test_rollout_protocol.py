"""The rollout protocol: every backend answers every call, one SamplingParams checks every setting once,
the factory picks the backend from the run's settings, and the latent algorithms stay out of the core."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sppo_rl.agents.algorithms import ALGORITHMS
from sppo_rl.llm.config import VLLM, LLMConfig
from sppo_rl.llm.latent.maths import LatentSettings
from sppo_rl.llm.latent.plugin import LATENT_FIXES, LatentPolicy
from sppo_rl.llm.latent.rollout import LatentRollout
from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.base import Rollout, SamplingParams
from sppo_rl.llm.rollout.factory import (
    context_limit,
    make_rollout,
    rollout_backend,
    sampler_context,
    sampling_params,
)
from sppo_rl.llm.rollout.hf import HFRollout


def test_every_backend_satisfies_the_protocol(tiny):
    """The trainer calls generate / update_weights / sleep / wake_up / close and reads shares_actor on
    whatever backend it has (the old HF engine had no sleep, wake_up, close: the trainer probed it
    with hasattr)."""
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    backends = [
        HFRollout(model, tok),
        HFRollout(model, tok, shares_actor=True),
        LatentRollout(model, tok, settings=LatentSettings(steps=1, topk=2)),
    ]
    for b in backends:
        assert isinstance(b, Rollout), type(b).__name__
        b.sleep(), b.wake_up()  # no-ops: the model is the caller's
        rb = b.generate(["1+2="], SamplingParams(n=2, max_new_tokens=3), seeds=[5])
        assert rb.batch_size == 2
        b.close()
    assert [b.shares_actor for b in backends] == [False, True, False]

    class NoSleep:  # a sampler missing one call is not a Rollout
        tokenizer, shares_actor = tok, False

        def generate(self, prompts, params, seeds=None): ...
        def update_weights(self, named_tensors, partial=False): ...
        def wake_up(self): ...
        def close(self): ...

    assert not isinstance(NoSleep(), Rollout)


def test_every_backend_generates_from_token_ids_under_one_name():
    """``generate_from_ids`` samples from prompts already tokenized, on every backend (the vLLM one is
    imported without vLLM); no backend has a second name for it."""
    from sppo_rl.llm.rollout.vllm import VLLMRollout

    for cls in (HFRollout, LatentRollout, VLLMRollout):
        assert callable(getattr(cls, "generate_from_ids", None)), cls.__name__
        assert not hasattr(cls, "generate_from_token_ids"), cls.__name__


BAD = [
    (dict(n=0), "n must be >= 1, got 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1, got 0"),
    (dict(temperature=0.0), "temperature must be positive (use greedy=True for argmax), got 0.0"),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
    (dict(top_k=-1), "top_k must be an integer >= 0 (0: off), got -1"),
    (dict(top_k=2.5), "top_k must be an integer >= 0 (0: off), got 2.5"),
    (dict(min_p=1.0), "min_p must be in [0, 1) (0: off), got 1.0"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0 (1: off), got 0.0"),
]


@pytest.mark.parametrize(
    "bad,message", BAD, ids=[next(iter(b)) + "=" + str(next(iter(b.values()))) for b, _ in BAD]
)
def test_sampling_params_refuse_each_bad_value_in_its_own_message(bad, message):
    """One line naming the bad setting only (the old check said "n and max_new_tokens must be >= 1, got
    n=0, max_new_tokens=256" for n=0). Every other setting at a valid value."""
    with pytest.raises(ValueError) as info:
        SamplingParams(**bad)
    assert str(info.value) == message


def test_sampling_params_of_the_run_and_its_greedy_decode():
    cfg = LLMConfig(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.3, max_new_tokens=17)
    p = sampling_params(cfg)
    assert p == SamplingParams(
        n=1, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.3, max_new_tokens=17
    )
    assert p.filters and not p.plain and SamplingParams(top_p=0.5).plain
    # the ReMax baseline and the greedy evaluation: argmax after the same penalty, log-probs at T = 1
    g = p.as_greedy()
    assert (g.n, g.greedy, g.temperature, g.top_p) == (1, True, 1.0, 1.0)
    assert (g.repetition_penalty, g.max_new_tokens, g.top_k, g.min_p) == (1.3, 17, 5, 0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n = 2  # type: ignore[misc]


def test_the_factory_picks_the_backend_from_the_run_settings(tiny, tmp_path):
    from sppo_rl.llm.models.engines import launcher_dist
    from sppo_rl.llm.plan import resolve

    actor, tok = load_actor(tiny), load_tokenizer(tiny)
    cfg = LLMConfig(model=str(tiny), algo="grpo", train_size=8, val_size=4, out_dir=str(tmp_path / "run"))
    plan = resolve(cfg, launcher_dist())[0]
    kw = dict(dtype=torch.float32, device=torch.device("cpu"), pad_id=7)
    shared = make_rollout(plan, actor, tok, tiny, **kw)
    assert type(shared) is HFRollout and shared.shares_actor and shared.model is actor
    assert shared.pad_token_id == 7  # the run's pad id, handed in
    on_replica = dataclasses.replace(plan, models=dataclasses.replace(plan.models, engine="deepspeed"))
    replica = make_rollout(on_replica, actor, tok, tiny, **kw)
    assert type(replica) is HFRollout and not replica.shares_actor and replica.model is not actor
    assert not replica.model.training and not any(p.requires_grad for p in replica.model.parameters())
    policy = LatentPolicy(LatentSettings(steps=2, topk=3))
    latent = make_rollout(dataclasses.replace(plan, latent=policy), actor, tok, tiny, **kw)
    assert type(latent) is LatentRollout and latent.shares_actor and latent.settings.steps == 2
    assert not latent.add_special_tokens  # prompts arrive rendered
    # the sampler's context: vLLM's --vllm-max-model-len caps the model's
    assert sampler_context(LLMConfig()) is None and plan.rollout.context_cap is None
    assert context_limit(sampler_context(LLMConfig()), 512) == 512
    capped = sampler_context(LLMConfig(rollout="vllm", vllm=VLLM(max_model_len=256)))
    assert context_limit(capped, 512) == 256 and context_limit(capped, None) == 256


def test_rollout_auto_is_hf_where_vllm_is_missing_or_does_not_apply():
    """``--rollout auto`` (the default) picks vLLM only for a named model with the torch engine, no LoRA and
    a token policy, and only where the vllm package is found (tests/test_vllm.py: where it imports)."""
    installed = lambda name: object()  # noqa: E731 -- find_spec as if vllm were there
    named = LLMConfig(model="smollm2-135m")
    assert named.rollout == "auto"
    assert rollout_backend(named, find_spec=lambda name: None) == "hf"  # not installed
    for cfg, latent in [
        (LLMConfig(), False),  # the embedded tiny model
        (LLMConfig(model="smollm2-135m", engine="deepspeed", dtype="bfloat16"), False),
        (dataclasses.replace(named, lora=dataclasses.replace(named.lora, rank=8)), False),
        (named, True),  # a latent policy samples with its own HF backend
    ]:
        assert rollout_backend(cfg, latent=latent, find_spec=installed) == "hf"
    for given in ("hf", "vllm"):
        assert rollout_backend(LLMConfig(model="smollm2-135m", rollout=given), find_spec=installed) == given


def test_the_latent_backend_refuses_what_it_does_not_sample_with(tiny):
    rollout = LatentRollout(load_actor(tiny), load_tokenizer(tiny), settings=LatentSettings(steps=1, topk=2))
    for option in (dict(top_k=3), dict(min_p=0.1), dict(repetition_penalty=1.2)):
        with pytest.raises(ValueError, match="temperature and top_p only"):
            rollout.generate(["1+2="], SamplingParams(**option))


def test_the_latent_algorithms_are_the_llm_only_ones():
    """The core knows which worlds can train an algorithm, not what a latent policy is: the latent
    plug-in names its algorithms, and those are exactly the ones the control world cannot train."""
    from sppo_rl.control.config import ControlConfig
    from sppo_rl.control.trainer import ControlRun
    from sppo_rl.runtime.run import RunError

    llm_only = {a.name for a in ALGORITHMS.values() if "control" not in a.worlds}
    assert llm_only == set(LATENT_FIXES) == {"latent-grpo", "latent-grpo-naive"}
    assert all("llm" in a.worlds for a in ALGORITHMS.values())
    assert not any(f.name == "latent" for f in dataclasses.fields(next(iter(ALGORITHMS.values()))))
    with pytest.raises(RunError, match="latent-grpo trains a language model only: use sppo-rl llm"):
        ControlRun(ControlConfig(algo="latent-grpo"))
