"""What TRL users bring to `sppo-rl llm`: TRL-style and several weighted reward functions, a
reward that fails loudly, completions logged, TRL's data columns, sampling options, LoRA targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from paths import outside_a_launcher

from sppo_rl.config import from_flat
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.rewards.scorer import RewardScorer
from sppo_rl.llm.rollout.base import SamplingParams
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import RunFailed

TRL_REWARDS = '''
def even(completions, **kwargs):
    """TRL's convention: a list over the batch; the data's columns arrive as keyword lists."""
    return [float(len(c) % 2 == 0) for c in completions]


def matches_solution(completions, solution, prompts):
    return [float(c == s) for c, s in zip(completions, solution)]


def starts_with_prompt(completions, prompts, **kwargs):
    return [float(c.startswith(p)) for c, p in zip(completions, prompts)]


def always(response, truth):
    return 1.0


def has_x(response, truth):
    return float("x" in response)


def broken(completions, **kwargs):
    return [1 / 0 for c in completions]


def none_for_z(response, truth):
    return None if response == "z" else 0.5
'''


@pytest.fixture(scope="module")
def rewards(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "trl_rewards.py"
    path.write_text(TRL_REWARDS)
    return path


def _cfg(tmp_path: Path, model: Path, **kw) -> LLMConfig:
    base = dict(
        task="arithmetic",
        model=str(model),
        algo="grpo",
        group_size=2,
        steps=2,
        prompts_per_step=4,
        train_size=64,
        val_size=4,
        eval_samples=2,
        eval_every=0,
        max_new_tokens=8,
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        threads=1,
    )
    base.update(kw)
    return from_flat(LLMConfig, base)


# ------------------------------------------------------------------------------------- rewards


def test_a_trl_style_reward_gets_the_batch_and_the_data_columns(rewards):
    with RewardScorer(f"{rewards}:matches_solution", timeout_s=5.0) as scorer:
        res = scorer.score(
            ["a", "b", "c"],
            ["-", "-", "-"],
            columns=[{"prompts": "p", "solution": "a"}, {"prompts": "p", "solution": "x"}, {"prompts": "p"}],
        )
    # item 2 lacks the column the function names: an error naming it, not a silent 0
    assert res.scores.tolist() == [1.0, 0.0, 0.0]
    assert res.valid.tolist() == [True, True, False] and res.errors == 1
    assert "needs column(s) solution" in res.error_samples[0]


def test_several_rewards_are_a_normalised_weighted_sum_each_kept_apart(rewards):
    spec = f"{rewards}:has_x,{rewards}:always"
    with RewardScorer(spec, timeout_s=5.0, weights=[1.0, 3.0]) as scorer:
        assert scorer.names == ["has_x", "always"]
        res = scorer.score(["x", "y"], ["-", "-"])
    # R = (1 * has_x + 3 * always) / 4: "x" -> (1 + 3) / 4, "y" -> (0 + 3) / 4
    assert res.scores.tolist() == [1.0, 0.75]
    assert res.parts.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    with RewardScorer([f"{rewards}:none_for_z", f"{rewards}:always"], timeout_s=5.0) as scorer:
        res = scorer.score(["z", "q"], ["-", "-"])
    # one function failing on an item makes the item invalid and counts against that function only
    assert res.valid.tolist() == [False, True] and res.scores.tolist() == [0.0, 0.75]
    assert res.fn_errors == [1, 0] and res.errors == 1
    assert np.isnan(res.parts[0, 0]) and res.parts[0, 1] == 1.0
    assert res.error_samples[0].startswith("item 0: none_for_z: TypeError")


def test_bad_reward_weights_are_refused_before_any_worker(rewards):
    from sppo_rl.config import ConfigError

    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        RewardScorer(f"{rewards}:always", weights=[1, 2])
    with pytest.raises(ConfigError, match="--reward-weights"):
        LLMConfig(reward_fn="math,integer", reward_weights=(1.0,)).validate()
    with pytest.raises(ConfigError, match="--reward-weights"):
        LLMConfig(reward_fn="math,integer", reward_weights=(0.0, 0.0)).validate()


def test_a_raising_reward_shows_its_first_traceback_once_and_counts_every_call(rewards, capfd):
    with RewardScorer(f"{rewards}:broken", timeout_s=5.0) as scorer:
        first = scorer.score(["a", "b", "c"], ["-"] * 3)
        second = scorer.score(["a", "b"], ["-"] * 2)
    err = capfd.readouterr().err
    assert (first.errors, second.errors) == (3, 2)
    assert err.count("Traceback (most recent call last)") == 1
    assert "ZeroDivisionError: division by zero" in err and "trl_rewards.py" in err


def test_a_trl_style_reward_trains_without_verifier_errors(tmp_path, tiny, rewards):
    """On the old code the trainer called f(response, answer): every call raised, every rollout was
    invalid and the run still finished."""
    run_llm(_cfg(tmp_path, tiny, reward_fn=f"{rewards}:even"))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2
    assert all(r["verifier_errors"] == 0 and r["invalid_rollouts"] == 0 for r in rows)


def test_several_rewards_are_logged_one_by_one(tmp_path, tiny, rewards):
    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:even,{rewards}:always", reward_weights=(1.0, 1.0))
    run_llm(cfg)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    for r in rows:
        assert r["rewards/always"] == 1.0 and r["reward_errors/even"] == 0
        assert r["reward_mean"] == pytest.approx((r["rewards/even"] + 1.0) / 2, abs=1e-6)


def test_a_reward_that_always_fails_stops_the_run(tmp_path, tiny, rewards):
    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:broken", steps=6, reward_fail_limit=2)
    with pytest.raises(RunFailed, match="no response got a valid reward in 2 consecutive updates"):
        run_llm(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and "--reward-fail-limit 2" in summary["stopped"]
    assert "ZeroDivisionError" in summary["last_error"] and summary["verifier_errors"] == 8
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2] and all(r["invalid_rollouts"] == 8 for r in rows)
    assert summary["flops_total"] == rows[-1]["flops_total"] > 0  # the compute spent so far


def test_cli_exits_1_with_one_line_when_the_reward_always_fails(tmp_path, tiny, rewards):
    out = tmp_path / "cli"
    argv = ["--task", "arithmetic", "--model", str(tiny), "--algo", "grpo", "--group-size", "2"]
    argv += ["--steps", "5", "--prompts-per-step", "2", "--train-size", "16", "--val-size", "2"]
    argv += ["--eval-every", "0", "--max-new-tokens", "4", "--no-progress", "--no-tensorboard"]
    argv += ["--reward-fn", f"{rewards}:broken", "--reward-fail-limit", "2", "--out-dir", str(out)]
    env = outside_a_launcher({**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", "llm", *argv], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sppo-rl: error: no response got a valid reward in 2 consecutive updates")
    assert proc.stderr.count("Traceback (most recent call last)") == 1  # the reward's, shown once
    assert "stopped" in json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------------------------- completions


def test_clip_text_bounds_a_text_and_says_how_much_it_cut():
    from sppo_rl.llm.outputs.completions import clip_text

    assert clip_text("abc", 3) == "abc"
    assert clip_text("x" * 2500) == "x" * 2000 + " ... [+500 characters]"


def test_completions_are_logged_at_evaluations_and_every_n_updates(tmp_path, tiny, rewards):
    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:even", steps=3, eval_every=3, log_completions_every=2)
    run_llm(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    by = {(r["split"], r["step"]) for r in rows}
    assert by == {("val", 0), ("train", 2), ("val", 3)}
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == 8  # 4 prompts x 2 samples, under the cap of 8
    for r in rows:
        a, b = r["prompt"].rstrip("=").split("+")  # the row's prompt, answer and reward belong together
        assert int(r["answer"]) == int(a) + int(b)
        assert r["reward"] == float(len(r["response"]) % 2 == 0)
    assert all(r["valid"] for r in train) and all("valid" not in r for r in rows if r["split"] == "val")


def test_completions_reach_tensorboard_as_text(tmp_path, tiny, rewards):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(
        tmp_path, tiny, reward_fn=f"{rewards}:even", steps=1, tensorboard=True, log_completions_every=1
    )
    run_llm(cfg)
    acc = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "completions/train/text_summary" in tags and "completions/val/text_summary" in tags
    (event,) = acc.Tensors("completions/train/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 1 and text.startswith("| prompt | response | answer | reward |")
    assert len(text.splitlines()) == 2 + 8


def test_log_completions_every_0_writes_nothing(tmp_path, tiny, rewards):
    run_llm(_cfg(tmp_path, tiny, reward_fn=f"{rewards}:even", steps=1, eval_every=1, log_completions_every=0))
    assert not (tmp_path / "run" / "completions.jsonl").exists()


# ------------------------------------------------------------------------------------- data columns


def test_trl_prompt_and_solution_columns_load_without_flags(tmp_path):
    from sppo_rl.llm.data.files import load_examples

    path = tmp_path / "trl.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": "Half of 1?"}], "solution": "So it is $\\boxed{\\frac12}$."},
        {"prompt": "2+2?", "solution": "\\boxed{4}", "level": 1},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = load_examples(path)
    assert a.prompt == rows[0]["prompt"] and a.answer == "\\frac12"
    assert a.meta["solution"] == rows[0]["solution"]  # a TRL-style reward gets the column as it is
    assert (b.prompt, b.answer, b.meta["level"]) == ("2+2?", "4", 1)


def test_an_unknown_layout_names_the_cli_flags(tmp_path):
    from sppo_rl.llm.data.files import DataError, load_examples

    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"text": "hi", "gold": "1"}) + "\n")
    with pytest.raises(DataError, match="--prompt-key and --answer-key") as e:
        load_examples(path)
    assert "prompt_key" not in str(e.value)
    path.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(DataError, match=r"missing key 'answer' \(keys: prompt\); --answer-key names"):
        load_examples(path, format="plain")


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

    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:even", steps=1, top_k=1, log_completions_every=1)
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


# ------------------------------------------------------------------------------------- LoRA


def test_all_linear_wraps_every_linear_module_but_the_head(tiny):
    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.lora import apply_lora, lora_layers

    model = apply_lora(load_actor(tiny, dtype="float32"), 2, 4.0, ("all-linear",), seed=0)
    names = {n.rsplit(".", 1)[-1] for n in lora_layers(model)}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert "lm_head" not in {n for n in lora_layers(model)}


def test_gpt2_conv1d_layers_take_lora_and_merge_exactly():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from sppo_rl.llm.models.lora import apply_lora, lora_layers, merged_state_items

    config = GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = apply_lora(GPT2LMHeadModel(config), 2, 4.0, ("c_attn", "c_proj", "c_fc"), seed=0).eval()
    assert {n.rsplit(".", 1)[-1] for n in lora_layers(model)} == {"c_attn", "c_proj", "c_fc"}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    plain = GPT2LMHeadModel(config).eval()
    state = dict(merged_state_items(model))
    plain.load_state_dict({**state, "lm_head.weight": state["transformer.wte.weight"]})
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        # Conv1D keeps W as [in, out]: the merge must add (B A)^T, else the outputs differ
        assert float((plain(ids).logits - model(ids).logits).abs().max()) < 1e-5


def test_export_adapter_writes_a_peft_folder_that_computes_the_merged_actor(tmp_path, tiny, rewards):
    import torch
    from peft import PeftModel

    from sppo_rl.llm.models.core import load_actor

    cfg = _cfg(tmp_path, tiny, reward_fn=f"{rewards}:even", steps=2, lora_rank=4, export_adapter=True)
    cfg.actor_lr = 1e-2  # so that the adapters move visibly from B = 0
    run_llm(cfg)
    final = tmp_path / "run" / "final"
    assert sorted(p.name for p in (final / "actor-adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        merged = load_actor(final / "actor", dtype="float32").eval()(ids).logits
        base = load_actor(tiny, dtype="float32").eval()
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, str(final / "actor-adapter")).eval()(ids).logits
    assert float((adapted - merged).abs().max()) < 1e-5
    assert float((plain - merged).abs().max()) > 1e-4  # the adapters did train
    with pytest.raises(Exception, match="--export-adapter"):
        LLMConfig(export_adapter=True).validate()


def test_a_gpt2_folder_trains_sppo_with_all_linear_lora(tmp_path, tiny, rewards):
    """GPT-2's linear layers are Conv1D: before, --lora-targets could name none of them."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.tiny import load_tokenizer

    tok = load_tokenizer(tiny)
    folder = tmp_path / "gpt2"
    config = GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=len(tok), n_positions=64,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = _cfg(tmp_path, folder, algo="sppo", group_size=None, reward_fn=f"{rewards}:even", lora_rank=2)
    cfg.lora.targets, cfg.export_adapter, cfg.actor_lr = ("all-linear",), True, 1e-2
    run_llm(cfg)
    adapter = json.loads((tmp_path / "run" / "final" / "actor-adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["c_attn", "c_fc", "c_proj"] and adapter["fan_in_fan_out"]
    base = load_file_dict(folder / "model.safetensors")
    merged = load_file_dict(tmp_path / "run" / "final" / "actor" / "model.safetensors")
    changed = {k.rsplit(".", 2)[-2] for k in base if not torch.equal(base[k], merged[k])}
    assert changed == {"c_attn", "c_fc", "c_proj"}  # only the adapted layers, merged back
    assert load_actor(tmp_path / "run" / "final" / "actor", dtype="float32") is not None


def load_file_dict(path):
    from safetensors.torch import load_file

    return load_file(str(path))
