"""`sppo-rl llm` end to end on the tiny model: every algorithm, run folder, resume, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from configs import TINY_LLM_FLAGS, llm_config
from paths import ALGOS, outside_a_launcher, reward_file

from sppo_rl.agents.algorithms import get_algorithm
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.models.tiny import TINY_CHARSET
from sppo_rl.llm.trainer import LLMRun, run_llm
from sppo_rl.runtime.logging import TIMING_KEYS, read_metrics
from sppo_rl.runtime.run import RunError

TIMING = TIMING_KEYS


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_trains_and_leaves_a_loadable_actor(tmp_path, tiny, algo):
    group = 4 if get_algorithm(algo).requires.groups else None
    summary = run_llm(llm_config(tmp_path, tiny, algo=algo, group_size=group))
    out = tmp_path / "run"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2]
    for key in (
        "reward_mean",
        "response_length",
        "clipfrac",
        "approx_kl",
        "entropy",
        "gen_tokens_per_s",
        "time_gen_s",
        "time_score_s",
        "time_train_s",
        "val_accuracy",
        "pass_at_k",
        "verifier_errors",
    ):
        assert key in rows[-1] or (
            key in ("clipfrac", "approx_kl", "entropy") and rows[-1]["actor_skipped"]
        ), key
    assert rows[-1]["rollout_logp_diff"] < 1e-4, "trainer log-probs must equal the sampler's"
    assert summary["updates"] == 2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "final" / "actor", local_files_only=True)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert (out / "final" / "actor" / "tokenizer.json").exists()
    if algo in ("sppo", "sppo-seq", "ppo", "ppo-bce"):
        assert (out / "final" / "critic" / "value_head.safetensors").exists()
        import numpy as np

        trace = np.load(out / "critic_trace.npz")
        assert str(trace["kind"]) == ("sequence" if algo.startswith("sppo") else "step")
        assert len(trace["success"]) == 8 * 2  # val prompts x eval samples


def test_group_rows_and_greedy_baseline(tmp_path, tiny):
    run = LLMRun(llm_config(tmp_path, tiny, algo="remax"))
    row = run.update()
    run.close()
    assert "greedy_reward_mean" in row
    run = LLMRun(llm_config(tmp_path / "g", tiny, algo="grpo", group_size=3, temperature=2.0))
    row = run.update()
    run.close()
    # 4 prompts x 3 samples: each prompt's 3 responses form one group (group statistics exist only for
    # groups of two or more, and their fractions add up to every group)
    assert row["groups_all_correct"] + row["groups_all_wrong"] + row["groups_mixed"] == pytest.approx(1.0)
    assert row["response_length"] > 0 and run.plan.rows_per_step == 12


def test_resume_matches_uninterrupted_within_tolerance(tmp_path, tiny):
    full = llm_config(tmp_path / "full", tiny, algo="sppo", updates=4, checkpoint_every=2)
    run_llm(full)
    part = llm_config(tmp_path / "part", tiny, algo="sppo", updates=2, checkpoint_every=2)
    run_llm(part)
    run_llm(replace(part, updates=4, resume=True))
    a = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    assert [r["update"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for k, v in ra.items():
            if k in TIMING or not isinstance(v, float):
                continue
            assert rb[k] == pytest.approx(v, rel=1e-4, abs=1e-5), (ra["update"], k)
    wa = torch.load  # final weights agree
    from safetensors.torch import load_file

    fa = load_file(tmp_path / "full" / "run" / "final" / "actor" / "model.safetensors")
    fb = load_file(tmp_path / "part" / "run" / "final" / "actor" / "model.safetensors")
    assert all(torch.allclose(fa[k], fb[k], atol=1e-5) for k in fa)
    del wa


def test_spo_resume_is_exact_with_its_tracker_in_the_checkpoint(tmp_path, tiny):
    """SPO's tracker, each prompt's last response and the draw's generator are in the checkpoint: 2 updates
    then resumed to 4 equals 4 in one go, bit for bit (8 prompts, 4 per update: prompts recur, so the
    discounts and the prioritised draw depend on the restored state)."""
    from safetensors.torch import load_file

    parity = tmp_path / "parity.py"  # pays an even length: a reward that varies, so that the actor moves
    parity.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    kw = dict(algo="spo", updates=4, checkpoint_every=2, train_size=8, temperature=2.0, actor_lr=1e-3)
    kw["reward_fn"] = f"{parity}:score"
    run_llm(llm_config(tmp_path / "full", tiny, **kw))
    run_llm(llm_config(tmp_path / "part", tiny, **{**kw, "updates": 2}))
    run_llm(llm_config(tmp_path / "part", tiny, **{**kw, "resume": True}))
    a = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    assert any(r.get("spo_distance", 0.0) > 0 for r in a)  # a prompt was seen again after the actor moved
    fa = load_file(tmp_path / "full" / "run" / "final" / "actor" / "model.safetensors")
    fb = load_file(tmp_path / "part" / "run" / "final" / "actor" / "model.safetensors")
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def test_spo_distance_is_zero_when_the_actor_has_not_moved(tmp_path, tiny):
    """Every prompt is drawn every update (4 of 4); with a learning rate of 1e-30 the actor does not move,
    so re-scoring each prompt's last response gives back the log-probs it was sampled with: ``D = 0`` and
    ``rho = 0.96`` (a misaligned re-scoring -- prompt padding, a shifted response -- gives ``D > 0``)."""
    parity = tmp_path / "parity.py"
    parity.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    cfg = llm_config(
        tmp_path, tiny, algo="spo", updates=3, train_size=4, actor_lr=1e-30, reward_fn=f"{parity}:score"
    )
    run_llm(replace(cfg, eval_every=0))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    trained = [r for r in rows if "spo_distance" in r]
    assert len(trained) == 3 and trained[0]["spo_distance"] == 0.0  # first visit: D = 0 by definition
    assert all(r["spo_distance"] < 1e-5 and r["spo_rho"] == 0.96 for r in trained[1:])


def test_astar_po_trains_and_resumes_exactly_with_its_v_star_table_in_the_checkpoint(tmp_path, tiny):
    """A*-PO's stage 1 runs once, before update 1: ``V*`` of each of the 8 training prompts from its
    ``k = 3`` reference samples, kept in the checkpoint; 2 updates then resumed to 4 equals 4 in one go,
    bit for bit, and the resumed run does not sample stage 1 again (its V* and totals come back)."""
    from safetensors.torch import load_file

    parity = tmp_path / "parity.py"  # pays an even length: a reward that varies, so that the actor moves
    parity.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    kw = dict(algo="astar-po", updates=4, checkpoint_every=2, train_size=8, temperature=2.0, actor_lr=1e-3)
    kw.update(reward_fn=f"{parity}:score", astar_samples=3, astar_beta2=0.1)
    full = LLMRun(llm_config(tmp_path / "full", tiny, **kw))
    table = list(full.state.order.v_star)
    assert len(table) == 8 and all(0.0 <= v <= 1.0 for v in table) and len(set(table)) > 1
    assert full.state.generated_tokens > 0 and full.state.flops["rollout"] > 0  # stage 1 counted
    full.run()
    full.close()
    run_llm(llm_config(tmp_path / "part", tiny, **{**kw, "updates": 2}))
    resumed = LLMRun(llm_config(tmp_path / "part", tiny, **{**kw, "resume": True}))
    assert resumed.state.order.v_star == table
    resumed.run()
    resumed.close()
    a = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    trained = [r for r in a if "astar_v_star" in r]
    assert len(trained) == 4 and any(r["implicit_reward"] != 0.0 for r in trained[1:])
    fa = load_file(tmp_path / "full" / "run" / "final" / "actor" / "model.safetensors")
    fb = load_file(tmp_path / "part" / "run" / "final" / "actor" / "model.safetensors")
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def test_reward_function_that_raises_or_hangs_is_counted_and_the_run_goes_on(tmp_path, tiny):
    fn = Path(__file__).parent / "fixtures" / "faulty_reward.py"
    cfg = llm_config(
        tmp_path, tiny, algo="grpo", group_size=2, reward_fn=f"{fn}:flaky", reward_timeout=0.5, eval_every=0
    )
    summary = run_llm(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert summary["updates"] == 2
    errors = sum(r.get("verifier_errors", 0) + r.get("val_verifier_errors", 0) for r in rows)
    assert errors > 0


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(algo="nope"), "valid: ppo, sppo"),
        (dict(algo="grpo", group_size=1), "group_size >= 2"),
        (dict(algo="sppo", group_size=4), "does not use groups"),
        (dict(task="nope"), "unknown task"),
        (dict(task="/no/such/file.jsonl"), "No such file|not found|does not exist"),
        (dict(reward_fn="/no/such.py:f"), "no such|not found|does not exist"),
        (dict(algo="sppo", critic_model="none"), "needs a sequence-level critic"),
        (dict(algo="ppo", critic_model="none"), "needs a step-level critic"),
        (dict(vllm_dtype="bfloat16", rollout="hf"), "--vllm-dtype must be left unset with --rollout hf"),
        (
            dict(vllm_dtype="bfloat16"),
            "--vllm-dtype is the vLLM sampler's; --rollout auto samples with Hugging",
        ),
    ],
)
def test_bad_settings_are_refused(tmp_path, tiny, kw, match):
    with pytest.raises((RunError, ValueError, FileNotFoundError), match=match):
        LLMRun(llm_config(tmp_path, tiny, **kw))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_critic_with_another_tokenizer_is_refused(tmp_path, tiny):
    from sppo_rl.llm.models.tiny import ensure_tiny_model

    other = ensure_tiny_model(tmp_path / "c2", "0123456789+-=", hidden_size=32, layers=1, heads=2, kv_heads=1)
    with pytest.raises(ValueError, match="tokenizer"):
        LLMRun(llm_config(tmp_path, tiny, algo="sppo", critic_model=str(other)))


def test_smaller_critic_model(tmp_path, tiny):
    from sppo_rl.llm.models.tiny import ensure_tiny_model

    small = ensure_tiny_model(tmp_path / "c3", TINY_CHARSET, hidden_size=16, layers=1, heads=2, kv_heads=1)
    summary = run_llm(llm_config(tmp_path, tiny, algo="sppo", critic_model=str(small), updates=1))
    assert summary["updates"] == 1
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["resolved"]["critic"] == str(small)


def test_the_run_resolves_its_model_folders_and_its_pad_id_once(tmp_path, tiny):
    """Folders given as paths are the plan's (the build does not resolve them again), and one pad id
    serves the sampler and the stages."""
    from sppo_rl.llm.models.tiny import ensure_tiny_model
    from sppo_rl.llm.rollout.base import pad_id_of

    small = ensure_tiny_model(tmp_path / "c3", TINY_CHARSET, hidden_size=16, layers=1, heads=2, kv_heads=1)
    run = LLMRun(llm_config(tmp_path, tiny, algo="sppo", critic_model=str(small)))
    settings, m = run.plan.models, run.models
    assert settings.actor_folder == m.actor_path == Path(tiny)
    assert settings.critic_folder == m.critic_path == small
    run.close()
    assert m.pad_id == pad_id_of(m.tokenizer) == m.rollout.pad_token_id


def test_embedded_default_builds_and_warm_starts_once(tmp_path):
    cfg = llm_config(tmp_path, None, algo="sppo", updates=1, sft_steps=4, sft_target=0.99)
    s1 = run_llm(cfg)
    assert s1["warmstart"]["steps"] == 4
    assert (
        len(list((tmp_path / "cache").glob("tiny-*"))) == 1
        and len(list((tmp_path / "cache").glob("sft-*"))) == 1
    )
    s2 = run_llm(replace(cfg, overwrite=True))  # reuses both cached folders
    assert s2["warmstart"] == s1["warmstart"]


def test_the_warm_start_is_checked_by_the_tasks_own_reward_not_the_runs(tmp_path):
    """A run whose --reward-fn pays everything builds the embedded warm start (cache key: the task's
    settings, not the reward): its accuracy checks score with the task's verifier ("integer"), so its
    record says what that verifier says. Scored by the run's reward, it claimed accuracy 1.0 after the
    first check (and stopped there), and every later run with those settings loaded it."""
    ones = reward_file(tmp_path / "ones.py", "def one(response, truth):\n    return 1.0\n")
    cfg = llm_config(tmp_path, None, algo="sppo", updates=1, sft_steps=4, sft_target=0.99, reward_fn=ones)
    s1 = run_llm(cfg)
    assert s1["warmstart"]["steps"] == 4 and s1["warmstart"]["holdout_accuracy"] < 0.99
    default = run_llm(replace(cfg, reward_fn="auto", out_dir=str(tmp_path / "auto")))
    assert default["warmstart"] == s1["warmstart"]  # one cached warm start, the task's
    assert len(list((tmp_path / "cache").glob("sft-*"))) == 1


def test_cli_llm_two_steps(tmp_path, tiny):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sppo_rl",
            "llm",
            "--algo",
            "sppo",
            "--task",
            "arithmetic",
            "--updates",
            "2",
            "--seed",
            "0",
            "--out-dir",
            str(out),
            "--model",
            str(tiny),
            *TINY_LLM_FLAGS,
            "--no-progress",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "metrics.jsonl").exists() and (out / "final" / "actor" / "config.json").exists()


def test_time_budget_stops_the_run(tmp_path, tiny):
    summary = run_llm(
        llm_config(tmp_path, tiny, algo="sppo", updates=10_000, max_seconds=0.5, eval_every=1000)
    )
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert 1 <= summary["updates"] < 10_000
    assert rows[-1]["wall_time_s"] >= 0.5 and "val_accuracy" in rows[-1]  # the last update is validated


@pytest.mark.parametrize("algo", ["ppo", "sppo", "grpo"])
def test_micro_batches_train_exactly_like_one_pass(tmp_path, tiny, algo):
    """Every pass (old log-probs, values, training) in micro-batches of one row, or packed by a token
    budget, gives the unsplit run's losses, gradient norms and final weights."""
    from safetensors.torch import load_file

    common = dict(
        algo=algo,
        epochs=2,
        minibatches=2,
        actor_lr=1e-3,
        critic_lr=1e-3,
        temperature=2.0,
        reward_fn=reward_file(tmp_path / "parity.py"),
    )
    runs = {}
    for name, kw in {
        "whole": {},
        "rows": dict(micro_batch_size=1),
        "tokens": dict(max_tokens_per_micro_batch=40),
    }.items():
        cfg = llm_config(tmp_path / name, tiny, **common, **kw)
        run_llm(cfg)
        runs[name] = (read_metrics(Path(cfg.out_dir) / "metrics.jsonl"), Path(cfg.out_dir))
    keys = ("policy_loss", "grad_norm", "entropy", "value_loss", "critic_bce", "critic_grad_norm")
    ref_rows, ref_dir = runs["whole"]
    assert any(r.get("grad_norm", 0) > 0 for r in ref_rows), (
        "the run must train for the comparison to mean anything"
    )
    ref_w = load_file(ref_dir / "final" / "actor" / "model.safetensors")
    for name in ("rows", "tokens"):
        rows, out = runs[name]
        for ra, rb in zip(ref_rows, rows):
            for k in keys:
                if k in ra:
                    assert rb[k] == pytest.approx(ra[k], abs=1e-5), (name, ra["update"], k)
        w = load_file(out / "final" / "actor" / "model.safetensors")
        assert max(float((ref_w[k] - w[k]).abs().max()) for k in ref_w) < 1e-5, name


def test_one_on_policy_pass_skips_the_old_log_prob_forward(tmp_path, tiny):
    """1 epoch x 1 minibatch: the ratio is exactly 1 (logp_old is the pass's own, detached)."""
    cfg = llm_config(
        tmp_path,
        tiny,
        algo="grpo",
        epochs=1,
        minibatches=1,
        actor_lr=1e-3,
        temperature=2.0,
        reward_fn=reward_file(tmp_path / "parity.py"),
    )
    run_llm(cfg)
    rows = [r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if "policy_loss" in r]
    assert rows, "the run must train"
    for r in rows:
        assert r["ratio_min"] == r["ratio_max"] == 1.0 and r["approx_kl"] == 0.0
        assert r["rollout_logp_diff"] < 1e-4  # the sampler's own log-probs agree with the pass's


def test_truncated_importance_sampling_logs_the_sampler_mismatch(tmp_path, tiny):
    cfg = llm_config(tmp_path, tiny, algo="grpo", group_size=4, tis_cap=2.0, temperature=2.0, actor_lr=1e-3)
    run_llm(cfg)
    rows = [r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if "rollout_mismatch_max" in r]
    assert rows, "every update logs the mismatch"
    for r in rows:  # the HF sampler's numbers are the trainer's: the weights are 1, the mismatch ~0
        assert 0.0 <= r["rollout_mismatch_mean"] <= r["rollout_mismatch_max"] < 1e-4


def test_kl_to_the_reference_is_logged_and_grows_from_zero(tmp_path, tiny):
    """Update 1 samples from the reference itself (KL exactly 0); once the actor has moved, it is > 0."""
    cfg = llm_config(
        tmp_path, tiny, algo="sppo", kl_coef=0.1, kl_in="reward", actor_lr=1e-2, temperature=2.0,
        skip_equal_rewards=False,  # its first batch may score all 0, which would leave the actor alone
    )  # fmt: skip
    run_llm(cfg)
    rows = [r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if r["update"] > 0]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[1]["kl"] > 1e-6


def test_the_process_group_is_destroyed_before_the_interpreter_tears_down():
    """gloo's worker threads outliving the interpreter abort a finished rank (SIGABRT, "terminate called
    without an active exception") now and then; the group must be gone when the exit hooks run. A hook
    registered before the group runs after the group's own (atexit is last in, first out)."""
    code = (
        "import atexit, torch\n"
        "atexit.register(lambda: print('up at exit:', torch.distributed.is_initialized()))\n"
        "from sppo_rl.llm.models.engines import init_process_group\n"
        "d = init_process_group(60, always=True)\n"
        "print('world', torch.distributed.get_world_size(), d.rank)\n"
    )
    env = outside_a_launcher(dict(os.environ))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["world 1 0", "up at exit: False"], done.stdout


def test_a_checkpoint_copied_from_a_grpo_run_is_named_not_a_vanished_file(tmp_path, tiny, capsys):
    """A GRPO checkpoint (no critic) copied into an SPPO run's checkpoints/: ``--resume`` names the
    algorithm its meta.json shows, one line, exit 2. Before: "part of the run folder vanished" (exit 74)."""
    import shutil

    from sppo_rl.cli import main

    run_llm(llm_config(tmp_path / "g", tiny, algo="grpo", group_size=2, updates=1, eval_every=0))
    run_llm(llm_config(tmp_path, tiny, algo="sppo", updates=1, eval_every=0))
    (grpo,) = (tmp_path / "g" / "run" / "checkpoints").glob("ckpt-*")
    shutil.copytree(grpo, tmp_path / "run" / "checkpoints" / "ckpt-000000009")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["llm", "--out-dir", str(tmp_path / "run"), "--resume", "--updates", "3"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2, lines
    assert lines[-1].startswith("sppo-rl: error: --resume: ") and "written by a grpo run" in lines[-1], lines
    assert "this run is sppo" in lines[-1] and "vanished" not in lines[-1]


def test_a_default_run_talks_in_plain_lines_and_ends_with_greedy_beside_sampled(tmp_path, tiny, capsys):
    """Progress is on by default: with stderr not a terminal (here: captured), plain lines labelled with
    the algorithm and the task, no carriage returns; the final line and ``summary.json`` give the greedy
    validation accuracy beside the sampled one; ``--overwrite`` says what it removes."""
    cfg = replace(llm_config(tmp_path, tiny, algo="grpo", group_size=2), progress=LLMConfig.progress)
    assert cfg.progress
    summary = run_llm(cfg)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [x for x in err.splitlines() if x.startswith("[sppo-rl] grpo/arithmetic update ")]
    assert lines and lines[-1].startswith("[sppo-rl] grpo/arithmetic update 2/2")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_greedy_accuracy" in r]
    assert (
        saved["start_greedy_accuracy"] == rows[0]["val_greedy_accuracy"] == summary["start_greedy_accuracy"]
    )
    assert saved["final_greedy_accuracy"] == rows[-1]["val_greedy_accuracy"]
    done = next(x for x in err.splitlines() if x.startswith("[sppo-rl] done: "))
    g0, g1 = saved["start_greedy_accuracy"], saved["final_greedy_accuracy"]
    assert f"; greedy {g0:.3f} -> {g1:.3f};" in done and "val accuracy sampled " in done
    card = (tmp_path / "run" / "final" / "actor" / "README.md").read_text()
    assert f"greedy: start {g0:.4f}, final {g1:.4f}" in card
    run_llm(replace(cfg, updates=1, overwrite=True, progress=False))
    err = capsys.readouterr().err
    assert f"--overwrite: removing the previous run in {tmp_path / 'run'}: " in err and "metrics.jsonl" in err


# ------------------------------------------------------------------------------- the run's state


def test_run_state_is_saved_and_loaded_whole_and_old_checkpoints_still_load():
    """Every counter of :class:`RunState` round-trips through ``state.pt``'s dict; a checkpoint of an
    older version (no FLOPs, no ``critic_init_p0``, no fail streak) loads with those at their start."""
    from sppo_rl.llm.models.flops import PARTS
    from sppo_rl.llm.stages.collect import PromptOrder
    from sppo_rl.llm.trainer import RunState

    order = PromptOrder(10, seed=1)
    order.draw(3)
    flops = {part: i + 1 for i, part in enumerate(PARTS)}
    state = RunState(
        order, updates=3, elapsed=1.5, generated_tokens=42, flops=flops, critic_init_p0=0.25, fail_streak=2
    )
    saved = state.saved(torch.get_rng_state())
    assert saved["update"] == 3  # the key old checkpoints have
    fresh = PromptOrder(10, seed=7)
    loaded = RunState.load(saved, fresh)
    assert loaded == RunState(fresh, 3, 1.5, 42, flops, 0.25, 2) and loaded.order is fresh
    assert fresh.draw(4) == order.draw(4)  # the order goes on where it was
    old = {k: v for k, v in saved.items() if k not in ("flops", "critic_init_p0", "fail_streak")}
    loaded = RunState.load(old, PromptOrder(10, seed=7))
    assert (
        loaded.flops == dict.fromkeys(PARTS, 0) and loaded.critic_init_p0 is None and loaded.fail_streak == 0
    )


def test_an_update_returns_its_row_and_the_next_state_and_leaves_the_runs_alone(tmp_path, tiny):
    run = LLMRun(llm_config(tmp_path, tiny, algo="grpo", group_size=2))
    try:
        before = run.state
        done = run.train_update(before)
        assert run.state is before and before.updates == 0 and before.generated_tokens == 0
        assert done.failure is None and done.state.updates == 1 and done.row["update"] == 1
        assert done.state.generated_tokens == done.row["generated_tokens"] > 0
        assert done.state.elapsed == done.row["wall_time_s"] > 0
        assert run.update()["update"] == 1 and run.state.updates == 1  # update() moves the run on
    finally:
        run.close()


QUIET = dict(progress=False, tensorboard=False)


def test_llm_schedule_and_callback(tmp_path, tiny):
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.trainer import run_llm

    cfg = LLMConfig(task="arithmetic", model=str(tiny), updates=4, prompts_per_step=2, group_size=2, train_size=16,
                    val_size=4, eval_samples=1, eval_every=0, max_new_tokens=4, algo="grpo", out_dir=str(tmp_path / "run"),
                    threads=1, cache_dir=str(tmp_path / "cache"), lr_schedule="cosine", warmup_updates=2,
                    actor_lr=1e-4, **QUIET)  # fmt: skip
    rows_seen = []

    def stop_at_three(row):
        rows_seen.append(row["update"])
        return False if row["update"] == 3 else None

    summary = run_llm(cfg, callback=stop_at_three)
    assert rows_seen == [1, 2, 3] and summary["stopped_by_callback"] == 3 and summary["updates"] == 3
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "learning_rate" in r]
    # warm-up 1/2, 2/2, then cosine over K - W = 2 updates: p = 0 -> 1.0
    assert [r["learning_rate"] for r in rows] == pytest.approx([0.5e-4, 1e-4, 1e-4])
    assert (tmp_path / "run" / "final" / "actor").is_dir()
