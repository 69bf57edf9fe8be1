"""Latent reasoning and Latent-GRPO (arXiv 2604.27998): the latent step, its log-probability, the three
fixes, the curriculum warm start and a short run, on hand-computed numbers and tiny local models."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from paths import GradRecorder
from torch import nn

from sppo_rl.agents.algorithms import compute_advantages, get_algorithm
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.agents.learner import LearnerConfig, ppo_update
from sppo_rl.agents.variants import first_token
from sppo_rl.llm.data.files import Example
from sppo_rl.llm.latent.maths import (
    LatentSettings,
    gumbel,
    gumbel_logpdf,
    latent_logprob,
    latent_noise,
    latent_step,
    mixture,
    valid_rows,
)
from sppo_rl.llm.latent.plugin import LATENT_FIXES, LatentPolicy, configure_latent
from sppo_rl.llm.latent.rollout import LatentRollout, latent_rows
from sppo_rl.llm.latent.warmstart import curriculum_loss, latent_warmstart, reasoning_lines, stage_response
from sppo_rl.llm.models.core import load_actor, sequence_logprobs
from sppo_rl.llm.models.sft import encode_pairs
from sppo_rl.llm.models.tiny import load_tokenizer
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.runtime.run import RunError


def phi(x: float) -> float:
    return -x - math.exp(-x)


# ---------------------------------------------------------------------------------- the latent step


def test_latent_step_mixture_and_logprob_by_hand():
    # p = [1/2, 1/4, 1/8, 1/8]; noise [0, 1, 2, 0]; s = log p + noise
    p = torch.tensor([0.5, 0.25, 0.125, 0.125])
    noise = torch.tensor([[0.0, 1.0, 2.0, 0.0]])
    step = latent_step(p.log()[None], noise, topk=2, tau=1.0)
    s = [math.log(0.5), math.log(0.25) + 1, math.log(0.125) + 2, math.log(0.125)]
    assert step.ids.tolist() == [[2, 1]]  # top-2 of s = [-0.693, -0.386, -0.079, -2.079]
    assert step.scores[0].tolist() == pytest.approx([s[2], s[1]], abs=1e-6)
    w2 = 1 / (1 + math.exp(s[1] - s[2]))  # softmax of the two scores: 0.5761, 0.4239
    assert step.weights[0].tolist() == pytest.approx([w2, 1 - w2], abs=1e-6)
    assert w2 == pytest.approx(0.5761, abs=1e-4)
    E = nn.Embedding(4, 2)
    with torch.no_grad():
        E.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]))
    e = mixture(E, step.ids, step.scores, tau=1.0)
    assert e[0].tolist() == pytest.approx([w2, 1.0], abs=1e-6)  # w2 * [1, 1] + (1 - w2) * [0, 1]
    # log-prob: the noise recovered from the scores is x = [2, 1]: mean(phi(2), phi(1)) = -1.7516
    lp = latent_logprob(step.scores, step.logp.gather(-1, step.ids))
    assert float(lp) == pytest.approx((phi(2) + phi(1)) / 2, abs=1e-6)
    assert float(lp) == pytest.approx(-1.7516, abs=1e-4)
    # a policy that doubles p(i_1) = p(token 2) moves x_1 from 2 to 2 - ln 2
    moved = latent_logprob(step.scores, step.logp.gather(-1, step.ids) + torch.tensor([[math.log(2), 0.0]]))
    assert float(moved) == pytest.approx((phi(2 - math.log(2)) + phi(1)) / 2, abs=1e-6)
    assert gumbel_logpdf(torch.tensor(0.0)).item() == pytest.approx(-1.0)


def test_latent_logprob_at_a_noise_scale_is_the_authors_phi_of_the_scaled_noise():
    """The authors' code evaluates ``phi(s_k - log p(i_k)) = phi(sigma * g_k)``: no division by sigma and
    no ``- log sigma``. At sigma = 0.5, noise g = [1, 1], K = 2: x = [0.5, 0.5], value phi(0.5) = -1.1065
    and d log pi / d log p(i_k) = (1 - e^-0.5) / 2 = 0.1967 per candidate. The exact density of the
    sampled noise (phi(g) - log sigma) would give (1 - e^-1) / (0.5 * 2) = 0.632 instead."""
    sigma = 0.5
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    scores = logp.detach() + sigma * torch.tensor([[1.0, 1.0]])
    lp = latent_logprob(scores, logp)
    value = float(lp.detach())
    assert value == pytest.approx(phi(0.5), abs=1e-6) and value == pytest.approx(-1.1065, abs=1e-4)
    lp.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([(1 - math.exp(-0.5)) / 2] * 2, abs=1e-6)
    assert float(logp.grad[0, 0]) == pytest.approx(0.1967, abs=1e-4)


def test_one_sided_noise_never_negative_and_aligns_every_candidate_with_the_advantage():
    g = gumbel((200_000,), torch.Generator().manual_seed(0), "cpu")
    one = latent_noise(g, one_sided=True, scale=0.5)
    two = latent_noise(g, one_sided=False)
    assert float(one.min()) >= 0.0 and float(one.max()) <= 4.5 * 0.5 + 1e-6
    assert float(two.min()) == pytest.approx(-1.5) and float(two.max()) == pytest.approx(3.0)
    # two-sided noise is negative with probability P(G < 0) = exp(-1) = 0.368
    assert float((two < 0).float().mean()) == pytest.approx(math.exp(-1), abs=0.005)
    # d log pi / d log p(i_k) = (1 - exp(-x_k)) / K: worked at x = [2, 1], K = 2
    s = torch.tensor([[2.0, 1.0]])
    lp_chosen = torch.zeros(1, 2, requires_grad=True)
    latent_logprob(s, lp_chosen).sum().backward()
    assert lp_chosen.grad[0].tolist() == pytest.approx([(1 - math.exp(-2)) / 2, (1 - math.exp(-1)) / 2])
    # on a real distribution: with one-sided noise every chosen candidate's gradient is >= 0 (a positive
    # advantage raises all of them); with two-sided noise some move against the advantage
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    for one_sided, expect_negative in ((True, False), (False, True)):
        noise = latent_noise(gumbel((64, 50), gen, "cpu"), one_sided)
        step = latent_step(logits, noise, topk=10, tau=1.0)
        chosen = step.logp.gather(-1, step.ids).detach().requires_grad_(True)
        latent_logprob(step.scores, chosen).sum().backward()
        assert bool((chosen.grad < 0).any()) == expect_negative
        assert torch.allclose(step.weights.sum(-1), torch.ones(64)) and bool((step.weights >= 0).all())


def test_invalid_latent_rollouts_are_cut_or_unboxed():
    texts = ["\\boxed{47}", "47", "\\boxed{4", "\\boxed{12}"]
    finished = torch.tensor([True, True, True, False])
    assert valid_rows(texts, finished).tolist() == [True, False, False, False]


# ---------------------------------------------------------------------------------- fix (c): the selector


def test_first_token_selector_worked_example():
    mask = torch.ones(4, 2)
    adv = torch.tensor([0.87, 0.87, -0.87, 0.87])[:, None].expand(4, 2)
    logp = torch.tensor([-0.5, -0.2, -0.1, -0.9])[:, None].expand(4, 2)
    kw = dict(mask=mask, rewards=torch.tensor([1.0, 1, 0, 1]), group_ids=torch.zeros(4, dtype=torch.long))
    out = first_token(**kw, advantages=adv, logp_old=logp)
    # row 2 is the most likely but wrong; row 1 is the most likely correct: only its first step stays
    assert out.tolist() == [[0, 1], [1, 1], [0, 1], [0, 1]]
    # the sampler's log-probs stand in when logp_old is left out
    assert first_token(**kw, advantages=adv, logp_rollout=logp).tolist() == out.tolist()
    with pytest.raises(ValueError, match="logp_old"):
        first_token(**kw, advantages=adv)
    # a group without a positive advantage is left alone; groups are separate; ties go to the lower row
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    adv = torch.tensor([-1.0, -1, 1, 1, 0.5, 0.5])[:, None] * mask
    lp = torch.tensor([[-1.0, -1, -1], [-2, -2, 0], [-3, -3, -3], [-2, 0, 0], [-1, -1, -1], [-1, -1, -1]])
    gid = torch.tensor([0, 0, 1, 1, 2, 2])
    out = first_token(mask=mask, rewards=torch.ones(6), group_ids=gid, advantages=adv, logp_old=lp)
    # group 1: mean log-probs -3 and -2 -> row 3 wins; group 2: a tie -> row 4 wins
    assert out[:, 0].tolist() == [1, 1, 0, 1, 1, 0]
    assert torch.equal(out[:, 1:], mask[:, 1:])


def test_latent_grpo_advantages_mask_invalid_rows_and_select_one_first_step():
    algo = get_algorithm("latent-grpo")
    assert algo.selector == "first-token" and LATENT_FIXES[algo.name] == {
        "one_sided": True,
        "mask_invalid": True,
    }
    mask = torch.ones(5, 3)
    logp = torch.tensor([-0.4, -0.3, -0.1, -0.2, -0.9])[:, None].expand(5, 3).clone()
    batch = SequenceBatch(
        mask=mask,
        logp_old=logp,
        rewards=torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]),
        group_ids=torch.zeros(5, dtype=torch.long),
        valid=torch.tensor([True, True, False, True, True]),
    )
    compute_advantages(batch, algo, std="sample")
    # valid rows R = [1, 1, 0, 0]: sample std 0.5774, A = +-0.866; the invalid row 2 (the most likely
    # of the correct ones) gets 0 and is no candidate: row 1 wins the first step
    a = 0.5 / math.sqrt(1 / 3)
    assert batch.advantages[:, 1].tolist() == pytest.approx([a, a, 0.0, -a, -a], abs=1e-4)
    assert batch.loss_mask[:, 0].tolist() == [0, 1, 0, 0, 0]
    assert batch.loss_mask[:, 1:].tolist() == [[1, 1], [1, 1], [0, 0], [1, 1], [1, 1]]
    assert batch.advantages[:, 0].tolist() == pytest.approx([0.0, a, 0.0, 0.0, 0.0], abs=1e-4)


def test_latent_grpo_gives_the_lone_valid_member_of_a_group_its_outcome():
    """The authors' code takes a group with one valid member at mean 0 and std 1: ``A = R`` (1 for a lone
    correct row, 0 for a lone wrong one), not 0. Groups: 0 = [1, invalid, invalid], 1 = [0, invalid],
    2 = [1, 0] (sample std 0.7071: A = +-0.7071). Explicit GRPO keeps 0 for a lone member."""
    batch = SequenceBatch(
        mask=torch.ones(7, 2),
        logp_old=torch.full((7, 2), -0.5),
        rewards=torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 2, 2]),
        valid=torch.tensor([True, False, False, True, False, True, True]),
    )
    compute_advantages(batch, get_algorithm("latent-grpo"))
    a = 0.5 / math.sqrt(0.5)
    assert batch.advantages[:, 1].tolist() == pytest.approx([1.0, 0, 0, 0, 0, a, -a], abs=1e-5)
    compute_advantages(batch, get_algorithm("grpo"))
    assert batch.advantages[:, 1].tolist() == pytest.approx([0.0, 0, 0, 0, 0, a, -a], abs=1e-5)


def test_masked_rows_give_no_gradient_through_the_learner():
    theta = torch.zeros(4, requires_grad=True)  # one log-prob shift per row

    def actor(rows: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.full((len(rows), T), -1.0) + theta[rows][:, None]
        return logp, torch.zeros(len(rows), T)

    def run(valid: torch.Tensor | None) -> torch.Tensor:
        batch = SequenceBatch(
            mask=torch.ones(4, 3),
            logp_old=torch.full((4, 3), -1.0),
            rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
            group_ids=torch.zeros(4, dtype=torch.long),
            valid=valid,
        )
        compute_advantages(batch, get_algorithm("grpo"), std="population")
        engine = GradRecorder(theta)
        ppo_update(batch, get_algorithm("grpo"), LearnerConfig(), actor, engine)
        return engine.grads[0]

    g = run(torch.tensor([True, True, False, True]))
    assert float(g[2]) == 0.0
    # valid R = [1, 0, 0]: population std 0.4714, A = [1.414, -0.707, -0.707]; the token-mean over the
    # 9 valid positions gives d loss / d theta_b = -A_b * 3 / 9
    assert g[[0, 1, 3]].tolist() == pytest.approx(
        [-math.sqrt(2) / 3, math.sqrt(2) / 6, math.sqrt(2) / 6], abs=1e-5
    )
    assert float(run(None)[2]) != 0.0  # the same row, valid, does get a gradient


# ---------------------------------------------------------------------------------- rollouts on a tiny model


def test_rollout_logprobs_are_recomputed_by_the_learner(tiny):
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    s = LatentSettings(steps=3, topk=4, noise_scale=0.7)
    engine = LatentRollout(model, tok, settings=s, add_special_tokens=False)
    rb = engine.generate(["12+35=", "7+8="], SamplingParams(n=3, max_new_tokens=6), seeds=[1, 2])
    assert rb.latent_ids.shape == (6, 3, 4) and bool((rb.response_mask[:, :3] == 1).all())
    again = engine.generate(["12+35=", "7+8="], SamplingParams(n=3, max_new_tokens=6), seeds=[1, 2])
    assert torch.equal(again.latent_scores, rb.latent_scores) and again.texts == rb.texts
    # texts hold the answer tokens only
    answer = tok.decode(
        rb.response_ids[0, 3:][rb.response_mask[0, 3:].bool()].tolist(), skip_special_tokens=True
    )
    assert rb.texts[0] == answer
    with torch.no_grad():
        lp, ent = latent_rows(rb, model, 1.0, s, "cpu")(torch.arange(6), rb.response_len)
    m = rb.response_mask.float()
    assert float(((lp - rb.logprobs) * m).abs().max()) < 1e-4
    assert bool((ent[:, :3] > 0).all())
    # the authors' rule: a latent step's log-prob is phi(s_k - log p(i_k)), at most phi(0) = -1, and the
    # same whatever the noise scale that made the stored scores (the exact density would add - log 0.7
    # and divide the noise by 0.7)
    assert float(rb.logprobs[:, :3].max()) <= -1.0 + 1e-5
    with torch.no_grad():
        lp1, _ = latent_rows(rb, model, 1.0, dataclasses.replace(s, noise_scale=1.0), "cpu")(
            torch.arange(6), rb.response_len
        )
    assert torch.allclose(lp1, lp, atol=1e-6)
    greedy = engine.generate(["12+35="], SamplingParams(greedy=True, max_new_tokens=4))
    assert float(greedy.logprobs[0, :3].abs().sum()) == 0.0  # noise-free latent steps carry no log-prob


def test_one_sided_noise_samples_the_same_rollouts_and_changes_only_the_log_probs(tiny):
    # a constant shift of every score changes neither the top-K nor the softmax weights: the fix acts on
    # the update (through the log-probs), not on what is sampled
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    out = {}
    for one_sided in (True, False):
        s = LatentSettings(steps=2, topk=4, noise_scale=0.5, one_sided=one_sided)
        engine = LatentRollout(model, tok, settings=s, add_special_tokens=False)
        out[one_sided] = engine.generate(
            ["12+35=", "58+67="], SamplingParams(n=4, max_new_tokens=5), seeds=[3, 4]
        )
    one, two = out[True], out[False]
    assert torch.equal(one.latent_ids, two.latent_ids) and one.texts == two.texts
    assert torch.allclose(one.latent_scores - two.latent_scores, torch.full_like(one.latent_scores, 0.75))
    assert not torch.allclose(one.logprobs[:, :2], two.logprobs[:, :2])
    assert torch.allclose(one.logprobs[:, 2:], two.logprobs[:, 2:])  # answer tokens: unchanged


def test_configure_latent_resolves_the_fixes_and_refuses_what_it_cannot_run():
    from sppo_rl.llm.config import Latent, LLMConfig

    train = [Example("58+67=", "125"), Example("12+35=", "47")]
    algo, policy = configure_latent(LLMConfig(algo="latent-grpo"), get_algorithm("latent-grpo"), train)
    assert policy.settings.steps == 3 and policy.settings.one_sided and algo.selector == "first-token"
    cfg = LLMConfig(algo="latent-grpo-naive", latent=Latent(one_sided=True, first_token=True, steps=2))
    algo, policy = configure_latent(cfg, get_algorithm("latent-grpo-naive"), train)
    assert policy.settings.one_sided and not policy.settings.mask_invalid and policy.settings.steps == 2
    assert algo.selector == "first-token"
    cfg = LLMConfig(algo="latent-grpo", latent=Latent(first_token=False, mask_invalid=False))
    algo, policy = configure_latent(cfg, get_algorithm("latent-grpo"), train)
    assert algo.selector is None and not policy.settings.mask_invalid
    assert configure_latent(LLMConfig(algo="grpo"), get_algorithm("grpo"), train)[1] is None
    with pytest.raises(RunError, match="vocabulary of 98 tokens"):  # the embedded tiny model's
        configure_latent(
            LLMConfig(algo="latent-grpo", latent=Latent(topk=99)), get_algorithm("latent-grpo"), train
        )
    with pytest.raises(RunError, match="--rollout hf"):
        configure_latent(LLMConfig(algo="latent-grpo", rollout="vllm"), get_algorithm("latent-grpo"), train)
    with pytest.raises(RunError, match=r"--temperature and --top-p only \(not --top-k"):
        configure_latent(LLMConfig(algo="latent-grpo", top_k=5), get_algorithm("latent-grpo"), train)
    # the policy's validity combines the verifier's with the latent rule only when fix (a) is on
    rb = type("RB", (), {"texts": ["\\boxed{1}", "1"], "finished": torch.tensor([True, True])})()
    ok, bad = LatentPolicy(LatentSettings(steps=1)).valid(rb, torch.tensor([True, True]))
    assert ok.tolist() == [True, False] and bad == 1
    ok, bad = LatentPolicy(LatentSettings(steps=1, mask_invalid=False)).valid(rb, torch.tensor([True, True]))
    assert ok.tolist() == [True, True] and bad == 1


# ---------------------------------------------------------------------------------- the curriculum


def test_reasoning_lines_and_stages():
    lines, box = reasoning_lines("arithmetic", Example("58+67=", "125"))
    assert lines == ["15", "12", "01"] and box == "\\boxed{125}"  # 8+7, 5+6+carry, the last carry
    assert reasoning_lines("arithmetic", Example("12+35=", "47"))[0] == ["07", "04"]
    assert stage_response(lines, box, 0) == "15; 12; 01; \\boxed{125}"
    assert stage_response(lines, box, 2) == "01; \\boxed{125}"
    assert stage_response(lines, box, 5) == "\\boxed{125}"  # more latent steps than lines
    assert reasoning_lines("arithmetic", Example("12-35=", "-23")) == ([], "\\boxed{-23}")
    lines, box = reasoning_lines("scratchpad", Example("3611+2429=", "6040"))
    assert lines[0] == "1+9+0=10 0" and len(lines) == 4 and box == "\\boxed{6040}"


def test_stage_zero_is_plain_supervised_training_and_latent_stages_backpropagate(tiny):
    model, tok = load_actor(tiny), load_tokenizer(tiny)
    prompts, responses = ["12+35=", "7+8="], ["2+5+0=07 7; \\boxed{47}", "\\boxed{15}"]
    ids, attn, T = encode_pairs(tok, prompts, responses)
    P = ids.shape[1] - T
    logp, _ = sequence_logprobs(model, ids, attn, T)
    m = attn[:, -T:].float()
    sft = -(logp * m).sum() / m.sum()
    s = LatentSettings(steps=1, topk=3)
    loss0 = curriculum_loss(model, ids[:, :P], attn[:, :P], ids[:, P:], attn[:, P:], 0, s)
    assert float(loss0.detach()) == pytest.approx(float(sft.detach()), abs=1e-5)
    # stage 1: the gradient reaches the logits at the prompt's last position through the mixture weights
    head = model.get_output_embeddings().weight
    loss1 = curriculum_loss(model, ids[:, :P], attn[:, :P], ids[:, P:], attn[:, P:], 1, s)
    (g,) = torch.autograd.grad(loss1, head)
    assert float(g.abs().sum()) > 0 and float(loss1.detach()) != pytest.approx(float(loss0.detach()))


def test_latent_warmstart_is_cached_by_its_settings(tiny, tmp_path):
    examples = [
        Example(f"{a}+{b}=", str(a + b)) for a, b in [(12, 35), (58, 67), (5, 3), (40, 41), (9, 9)] * 2
    ]
    lines, boxes = zip(*[reasoning_lines("arithmetic", e) for e in examples])
    calls = []

    def score(texts: list[str], truths: list[str]) -> list[float]:
        calls.append(len(texts))
        return [0.0] * len(texts)

    kw = dict(steps=2, lr=1e-3, target=0.5, temperature=1.0, batch_size=4, check_every=1, holdout=2)
    args = ([str(e.prompt) for e in examples], lines, boxes, [e.answer for e in examples], score)
    folder, record = latent_warmstart(tiny, tmp_path, *args, LatentSettings(steps=2, topk=3), **kw)
    assert [s["stage"] for s in record["stages"]] == [1, 2]
    assert [s["steps"] for s in record["stages"]] == [2, 2]
    assert (folder / "config.json").is_file() and len(calls) == 4
    again, _ = latent_warmstart(tiny, tmp_path, *args, LatentSettings(steps=2, topk=3), **kw)
    assert again == folder and len(calls) == 4  # cached: nothing retrained
    other, _ = latent_warmstart(tiny, tmp_path, *args, LatentSettings(steps=1, topk=3), **kw)
    assert other != folder


# ---------------------------------------------------------------------------------- end to end


def test_two_updates_of_latent_grpo_and_the_naive_variant(tiny, tmp_path):
    from configs import llm_config

    from sppo_rl.llm.trainer import run_llm
    from sppo_rl.runtime.logging import read_metrics

    for algo in ("latent-grpo", "latent-grpo-naive"):
        cfg = llm_config(
            tmp_path, tiny, algo, algo=algo, prompts_per_step=2, group_size=4, val_size=4, eval_every=2,
            max_new_tokens=6, latent_steps=2, latent_topk=4,
        )  # fmt: skip
        summary = run_llm(cfg)
        rows = read_metrics(Path(tmp_path / algo / "metrics.jsonl"))
        assert summary["updates"] == 2 and [r["update"] for r in rows] == [0, 1, 2]
        last = rows[-1]
        assert last["rollout_logp_diff"] < 1e-4, "the learner's latent log-probs must equal the sampler's"
        assert last["response_length"] > 2  # two latent steps, then answer tokens
        assert 0 <= last["latent_invalid"] <= 8
