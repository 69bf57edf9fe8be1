"""The analytic FLOPs model (:mod:`sppo_rl.llm.models.flops`) against ``torch.utils.flop_counter.FlopCounterMode``
on the tiny Qwen2 and a small Llama, and the per-update counter of a real ``sppo-rl llm`` run.

FlopCounterMode counts matmuls (``mm``, ``addmm``, ``bmm``, convolutions and the SDPA kernels it knows);
it leaves out elementwise work (norms, activations, softmax, rotary embeddings, the loss), as the model
does. Attention runs as ``eager`` here: on the CPU, torch's fused SDPA kernel
(``_scaled_dot_product_flash_attention_for_cpu``) is not one FlopCounterMode counts, so an ``sdpa``
model's count would miss the attention term. Under eager attention the two agree exactly (the tolerance
asserted is a relative 1e-9, i.e. equal integers)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from configs import llm_config
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from sppo_rl.llm.models import flops as F
from sppo_rl.llm.models.core import cache_kwarg, cache_of, load_actor, sequence_logprobs
from sppo_rl.llm.models.critic import CRITICS
from sppo_rl.llm.models.tiny import build_tiny_model, load_tokenizer
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.llm.rollout.hf import HFRollout

CHARSET = "0123456789+-*/=() abcdefghijklmnopqrstuvwxyz"
TOL = 1e-9


def counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def eager(model):
    model.config._attn_implementation = "eager"
    return model.eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny Qwen2 (tied embeddings, grouped KV heads, biases on q/k/v), 2 layers."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", charset=CHARSET, hidden_size=64, layers=2)


def tiny_model(folder: Path):
    return eager(load_actor(folder))


def llama():
    """A small Llama built locally: untied LM head, 4 query heads over 2 KV heads, head_dim 24 (not
    hidden / heads), gated MLP."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
    )  # fmt: skip
    return eager(LlamaForCausalLM(cfg))


MODELS = {"tiny-qwen2": None, "llama": llama}


@pytest.fixture(params=list(MODELS))
def model(request, folder):
    return tiny_model(folder) if MODELS[request.param] is None else MODELS[request.param]()


def close(got: int, want: int) -> bool:
    return abs(got - want) <= TOL * want


def test_the_layers_matmul_weights_are_the_linear_layers_of_the_model(model):
    s = F.Shape.of(model.config)
    linear = sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and "lm_head" not in n
    )
    assert s.body == linear
    assert F.Shape.of(model.config.to_dict()) == s  # a config.json dict reads the same


def test_forward_matches_the_flop_counter(model):
    s = F.Shape.of(model.config)
    ids = torch.randint(3, 30, (3, 11))
    got = counted(lambda: model(input_ids=ids, use_cache=False))
    assert close(got, 3 * F.forward(s, 11, logits=11)), (got, 3 * F.forward(s, 11, logits=11))
    # the trainer's pass: log-probs of the last T tokens (logits_to_keep = T + 1)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        got = counted(lambda: sequence_logprobs(model, ids, mask, 4))
    assert close(got, F.policy_pass(s, [(7, 4)] * 3))


def test_forward_and_backward_is_three_forwards(model):
    s = F.Shape.of(model.config)
    ids = torch.randint(3, 30, (2, 9))
    model.train()

    def step():
        logp, _ = sequence_logprobs(model, ids, torch.ones_like(ids), 5)
        logp.sum().backward()

    got = counted(step)
    want = 3 * F.policy_pass(s, [(4, 5)] * 2)
    assert close(got, want), (got, want)


def test_gradient_checkpointing_runs_the_layers_again_and_lora_leaves_out_only_its_adapters():
    """With gradient checkpointing a training pass is ``3 F`` plus the layers' forward again: an upper
    bound, as torch's non-reentrant checkpoint stops recomputing a layer once the backward has what it
    needs (here part of attention's products is not redone): the counter lies between ``3 F`` plus the
    layers' weights again and the model. Under LoRA the model counts ``2 F`` (no weight gradient for the
    frozen weights) and leaves out the adapters' own matmuls: FlopCounterMode counts more, by about the
    adapters' training pass, ``6 N_lora`` a token."""
    from sppo_rl.llm.config import LORA_TARGETS
    from sppo_rl.llm.models.lora import apply_lora

    ids, rows = torch.randint(3, 30, (2, 40)), [(20, 20)] * 2

    def train(model):
        model.train()
        return counted(lambda: sequence_logprobs(model, ids, torch.ones_like(ids), 20)[0].sum().backward())

    model = llama()
    s = F.Shape.of(model.config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    u = F.UpdateShape(s, old_logp_pass=False, recompute=True)
    want = F.update_flops(u, [], rows, True)["actor"]
    assert want == 3 * F.policy_pass(s, rows) + F.policy_pass(s, rows, head=False)
    got = train(model)  # measured: 56,614,656 against the model's 58,580,736 (3.4 % above)
    assert 3 * F.policy_pass(s, rows) + 2 * s.body * 80 <= got <= want, (got, want)
    model = apply_lora(llama(), 8, 16.0, LORA_TARGETS, seed=0)
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    got, want = train(model), 2 * F.policy_pass(s, rows)
    # measured: 37,661,184 against 29,551,104 (+27 % at r = 8, h = 64); the adapters' 6 N_lora a token
    # are 97 % of the gap
    assert 0.9 * 6 * adapters * 80 <= got - want <= 1.1 * 6 * adapters * 80, (got, want)


def test_a_kv_cached_decode_step_matches_the_flop_counter(model):
    s = F.Shape.of(model.config)
    ids = torch.randint(3, 30, (2, 6))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        nxt = torch.randint(3, 30, (2, 1))
        cache = {cache_kwarg(model): cache_of(out)}
        got = counted(lambda: model(input_ids=nxt, use_cache=True, **cache))
    # the whole logits row of the one new position; the token attends over 6 cached keys and itself
    assert close(got, 2 * F.decode(s, 7)), (got, 2 * F.decode(s, 7))


@pytest.mark.parametrize(
    "name, figures",
    [("tiny-qwen2", (4_578_816, 13_736_448, 513_792)), ("llama", (2_927_616, 8_782_848, 335_104))],
)
def test_the_figures_in_the_docs(folder, name, figures):
    """docs/llm.md's table: 2 rows of prompt 4 + response 5 (forward, forward + backward), one decode
    step of 2 rows over 10 keys, counted by FlopCounterMode and equal to the model."""
    model = tiny_model(folder) if MODELS[name] is None else MODELS[name]()
    s, ids = F.Shape.of(model.config), torch.randint(3, 30, (2, 9))
    with torch.no_grad():
        fwd = counted(lambda: sequence_logprobs(model, ids, torch.ones_like(ids), 5))
    model.train()
    both = counted(lambda: sequence_logprobs(model, ids, torch.ones_like(ids), 5)[0].sum().backward())
    model.eval()
    with torch.no_grad():
        cache = {cache_kwarg(model): cache_of(model(input_ids=ids))}
        step = counted(lambda: model(input_ids=ids[:, :1], use_cache=True, **cache))
    one = F.policy_pass(s, [(4, 5)] * 2)
    assert (fwd, both, step) == figures == (one, 3 * one, 2 * F.decode(s, 10))


def test_a_whole_rollout_as_the_sampler_runs_it(folder):
    """One prompt, 3 seeded samples: one prefill, then each sample's decode steps (a stopped row leaves
    the batch), as :func:`~sppo_rl.llm.models.flops.rollout` counts them."""
    model, tok = tiny_model(folder), load_tokenizer(folder)
    s = F.Shape.of(model.config)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12)
    rollout = HFRollout(model, tok)
    with FlopCounterMode(display=False) as fc:
        rb = rollout.generate(["12+34="], params, seeds=[7])
    prompts, responses, n, _ = F.round_lengths(rb, 3)
    assert n == 3 and prompts == [6] and max(responses) > 1
    assert close(fc.get_total_flops(), F.rollout(s, prompts, responses, 3)), (responses, fc.get_total_flops())


@pytest.mark.parametrize("kind", ["sequence", "step"])
def test_critics_at_their_own_size(folder, kind):
    critic = CRITICS[kind].from_backbone(folder)
    critic.backbone.config._attn_implementation = "eager"
    s = F.Shape.of(critic.config)
    ids = torch.randint(3, 30, (2, 10))
    with torch.no_grad():
        got = counted(lambda: critic(ids, torch.ones_like(ids), 4))
    assert close(got, F.critic_pass(s, [(6, 4)] * 2, kind)), got


def test_decode_tail_is_the_sum_of_its_steps_and_a_prompt_is_prefilled_once():
    s = F.Shape(layers=2, hidden=8, heads=2, head_dim=4, kv_heads=1, intermediate=16, vocab=11)
    for p, r in [(5, 0), (5, 1), (5, 2), (3, 7)]:
        assert F.decode_tail(s, p, r) == sum(F.decode(s, p + i) for i in range(1, r))
    two = F.rollout(s, [5], [3, 4], 2)
    assert two == F.forward(s, 5, logits=1) + F.decode_tail(s, 5, 3) + F.decode_tail(s, 5, 4)
    with pytest.raises(ValueError, match="responses"):
        F.rollout(s, [5], [3], 2)
    with pytest.raises(ValueError, match="no hidden_size"):
        F.Shape.of({"vocab_size": 3})


# ------------------------------------------------------------------------------------- a real run's counter


_cfg = partial(llm_config, updates=3, val_size=4, eval_samples=1, eval_every=3)


def _expected(run, got, actor_trained: bool) -> dict[str, int]:
    """An update's FLOPs put together by hand from the rollouts it sampled: which passes ran is read off
    the run's settings (epochs, old-log-prob pass, reference, critic)."""
    G, s = run.group_size, F.Shape.of(run.models.actor_engine.module.config)
    out = dict.fromkeys(F.PARTS, 0)
    for r in got.rounds:
        rows = F.row_lengths(r.rb)
        out["rollout"] += sum(F.forward(s, p, logits=1) for p, _ in rows[::G])
        out["rollout"] += sum(F.decode_tail(s, p, n) for p, n in rows)
        if r.greedy is not None:
            out["greedy"] += sum(
                F.forward(s, p, logits=1) + F.decode_tail(s, p, n) for p, n in F.row_lengths(r.greedy)
            )
    trained = [F.row_lengths(got.rounds[i].rb)[k * G + j] for i, k in got.groups for j in range(G)]
    one = sum(F.forward(s, p + n, logits=n + 1) for p, n in trained)
    epochs = run.plan.learner.epochs
    out["actor"] = one * (int(not run.plan.fused) + (3 * epochs if actor_trained else 0))
    out["reference"] = one if run.models.ref is not None else 0
    if run.models.critic_engine is not None:
        c = F.Shape.of(run.models.critic_engine.module.config)
        kind = run.plan.algo.requires.critic
        per = [
            F.forward(c, p, values=1) if kind == "sequence" else F.forward(c, p + n, values=n)
            for p, n in trained
        ]
        out["critic"] = sum(per) * (1 + 3 * epochs)
    return out


def _record_collects(monkeypatch) -> list:
    """Every update's :class:`~sppo_rl.llm.stages.collect.Collected`, in order, as the run collects them."""
    from sppo_rl.llm.stages.collect import Collector

    seen = []
    collect = Collector.collect

    def keep(self, step, timer, version):
        got = collect(self, step, timer, version)
        seen.append(got)
        return got

    monkeypatch.setattr(Collector, "collect", keep)
    return seen


CASES = {
    "sppo": dict(algo="sppo", epochs=2, kl_coef=0.05),  # sequence critic, reference, old log-probs
    "ppo": dict(algo="ppo", kl_coef=0.0),  # a critic on every response token
    "remax": dict(algo="remax", kl_coef=0.0),  # the greedy rollout
    "dapo": dict(algo="grpo", group_size=4, kl_coef=0.0, dynamic_sampling_rounds=2),  # extra rounds
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_runs_flops_are_the_model_applied_to_what_it_sampled(tmp_path, tiny, monkeypatch, case):
    from sppo_rl.llm.trainer import LLMRun
    from sppo_rl.runtime.logging import read_metrics

    seen = _record_collects(monkeypatch)
    run = LLMRun(_cfg(tmp_path, tiny, **CASES[case]))
    summary = run.run()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2, 3] and rows[0]["flops_total"] == 0
    if case == "sppo":
        assert (
            run.models.ref is not None and not run.plan.fused and run.plan.algo.requires.critic == "sequence"
        )
    if case == "dapo":
        assert any(len(g.rounds) > 1 for g in seen), "no extra round was drawn"
    total = dict.fromkeys(F.PARTS, 0)
    for got, row in zip(seen, rows[1:]):
        for k, v in _expected(run, got, not row["actor_skipped"]).items():
            total[k] += v
        assert {k: row[f"flops_{k}"] for k in F.PARTS} == total, row["update"]
        assert row["flops_total"] == sum(total.values())
    assert all(b["flops_total"] > a["flops_total"] for a, b in zip(rows, rows[1:]))
    assert summary["flops_total"] == rows[-1]["flops_total"]
    assert summary["flops_rollout"] == rows[-1]["flops_rollout"]
    assert (total["greedy"] > 0) == (case == "remax") and (total["critic"] > 0) == (case in ("sppo", "ppo"))


@pytest.mark.slow
def test_the_counters_survive_resume_exactly(tmp_path, tiny):
    from sppo_rl.llm.trainer import run_llm
    from sppo_rl.runtime.logging import read_metrics

    kw = dict(algo="sppo", epochs=2, kl_coef=0.05, checkpoint_every=2)
    run_llm(_cfg(tmp_path / "full", tiny, **kw))
    part = _cfg(tmp_path / "part", tiny, **kw, updates=2)
    run_llm(part)
    resumed = run_llm(replace(part, updates=3, resume=True))
    a = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    keys = ["flops_total", *(f"flops_{k}" for k in F.PARTS)]
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert resumed["flops_total"] == b[-1]["flops_total"] > 0


@pytest.mark.slow
def test_spo_counts_its_re_scoring_pass(tmp_path, tiny, monkeypatch):
    """SPO re-scores each revisited prompt's last response with the actor (its KL discount): one more
    no-gradient pass ``F(p + r, r + 1, 0)`` per revisited prompt, ``(p, r)`` that response's lengths,
    counted in ``flops_actor`` (4 prompts, all drawn every update: updates 2 and 3 revisit every one)."""
    from sppo_rl.llm.trainer import LLMRun
    from sppo_rl.runtime.logging import read_metrics

    seen = _record_collects(monkeypatch)
    parity = tmp_path / "parity.py"
    parity.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    run = LLMRun(_cfg(tmp_path, tiny, algo="spo", train_size=4, reward_fn=f"{parity}:score"))
    run.run()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    s = F.Shape.of(run.models.actor_engine.module.config)
    last: dict[int, tuple[int, int]] = {}
    total, rescored = dict.fromkeys(F.PARTS, 0), 0
    for got, row in zip(seen, rows[1:]):
        r = got.rounds[0]
        lengths = F.row_lengths(r.rb)
        prompts = [id(r.examples[int(i)]) for i in r.rb.prompt_index]
        extra = sum(
            F.forward(s, last[k][0] + last[k][1], logits=last[k][1] + 1) for k in prompts if k in last
        )
        rescored += extra
        for k, v in _expected(run, got, not row["actor_skipped"]).items():
            total[k] += v
        total["actor"] += extra
        assert {k: row[f"flops_{k}"] for k in F.PARTS} == total, row["update"]
        last.update(zip(prompts, lengths))
    assert rescored > 0


def test_astar_counts_its_stage_1_rollout(tmp_path, tiny, monkeypatch):
    """A*-PO's stage 1 samples ``k = 2`` responses to every training prompt before update 1: each
    prompt's prefill ``F(p, 1, 0)`` and every sample's decode are in ``flops_rollout`` from update 1 on,
    on top of what the updates spend (the reference's pass, which its regression reads, included)."""
    from sppo_rl.llm.stages.collect import Sampler
    from sppo_rl.llm.stages.vstar import STAGE1_BASE
    from sppo_rl.llm.trainer import LLMRun
    from sppo_rl.runtime.logging import read_metrics

    stage1 = []
    sample = Sampler.sample

    def keep(self, prompts, n, base, positions):
        rb = sample(self, prompts, n, base, positions)
        if base == STAGE1_BASE:
            stage1.append(rb)
        return rb

    monkeypatch.setattr(Sampler, "sample", keep)
    seen = _record_collects(monkeypatch)
    run = LLMRun(_cfg(tmp_path, tiny, algo="astar-po", train_size=6, astar_samples=2))
    run.run()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    s = F.Shape.of(run.models.actor_engine.module.config)
    assert len(stage1) == 2 and run.models.ref is not None  # 6 prompts, 4 per generation call
    lengths = [F.row_lengths(rb) for rb in stage1]
    first = sum(F.forward(s, p, logits=1) for rows_ in lengths for p, _ in rows_[::2])
    first += sum(F.decode_tail(s, p, n) for rows_ in lengths for p, n in rows_)
    total = dict.fromkeys(F.PARTS, 0)
    total["rollout"] = first
    for got, row in zip(seen, rows[1:]):
        for k, v in _expected(run, got, not row["actor_skipped"]).items():
            total[k] += v
        assert {k: row[f"flops_{k}"] for k in F.PARTS} == total, row["update"]
    assert total["reference"] > 0
    assert rows[1]["generated_tokens"] == sum(rb.num_generated_tokens for rb in stage1) + sum(
        r.rb.num_generated_tokens for r in seen[0].rounds
    )
