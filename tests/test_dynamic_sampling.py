"""DAPO's dynamic sampling (arXiv 2503.14476): groups whose valid outcomes are all equal are dropped and more
prompts are drawn from the data order, at most --dynamic-sampling-rounds extra rounds, until the batch holds
--prompts-per-step informative groups; at the cap the run trains on what it found."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from configs import llm_config
from paths import LLM_TIMING, reward_file

from sppo_rl.agents.algorithms import GROUP_KINDS, group_signal
from sppo_rl.config import ConfigError
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.models.engines import free_port
from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.llm.stages.to_batch import cat_rows as _cat_rows
from sppo_rl.llm.trainer import LLMRun, run_llm
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import RunError

REPO = Path(__file__).resolve().parents[1]
DS = "dynamic_sampling/"

# the answer's last digit decides: 0-2 every sample right (an all-correct group), 3-5 every sample wrong,
# 6-9 a coin per sample (the response's length parity): mostly mixed groups
MIXED_REWARD = (
    "def by_digit(response, truth):\n"
    "    d = truth.strip()[-1:]\n"
    "    if d in '012':\n"
    "        return 1.0\n"
    "    if d in '345':\n"
    "        return 0.0\n"
    "    return float(len(response) % 2 == 0)\n"
)


def test_group_signal_classifies_by_the_valid_outcomes():
    R = torch.tensor(
        [
            [1.0, 0.0, 1.0, 1.0],  # mixed
            [1.0, 1.0, 1.0, 1.0],  # all correct
            [0.0, 0.0, 0.0, 0.0],  # all wrong
            [1.0, 1.0, 0.0, 1.0],  # the 0 is invalid: all correct among the valid (mixed if it counted)
            [1.0, 0.0, 0.0, 0.0],  # one valid member only: nothing to compare
            [0.3, 0.3, 0.7, 0.3],  # partial credit that differs: mixed
        ]
    )
    valid = torch.ones(6, 4, dtype=torch.bool)
    valid[3, 2] = False
    valid[4, 1:] = False
    kinds = [GROUP_KINDS[k] for k in group_signal(R, valid)]
    assert kinds == ["mixed", "all_correct", "all_wrong", "all_correct", "too_few_valid", "mixed"]
    assert [GROUP_KINDS[k] for k in group_signal(R)][3:5] == ["mixed", "mixed"]


def _cfg(tmp_path: Path, tiny: Path, **kw) -> LLMConfig:
    reward = reward_file(tmp_path / "by_digit.py", MIXED_REWARD)
    base = dict(algo="grpo", group_size=4, train_size=32, val_size=4, eval_samples=1, eval_every=0, temperature=2.0,
                reward_fn=reward, dynamic_sampling_rounds=1)  # fmt: skip
    return llm_config(tmp_path, tiny, **{**base, **kw})


def test_bad_settings_are_refused_before_the_run_folder(tmp_path, tiny):
    with pytest.raises(ConfigError, match="--dynamic-sampling-rounds must be >= 0"):
        LLMRun(_cfg(tmp_path, tiny, dynamic_sampling_rounds=-1))
    with pytest.raises(RunError, match="sppo samples no groups"):
        LLMRun(_cfg(tmp_path, tiny, algo="sppo", group_size=None))
    assert not (tmp_path / "run").exists()


def _check_row(r: dict, cfg: LLMConfig) -> None:
    """The counters add up, and the trained batch holds only informative groups plus loss-free filler."""
    n, K = cfg.prompts_per_step, cfg.dynamic_sampling_rounds
    sampled, kept = r[DS + "groups_sampled"], r[DS + "groups_kept"]
    assert sampled == n * (r[DS + "extra_rounds"] + 1) and r[DS + "extra_rounds"] <= K
    dropped = sum(r[DS + k] for k in ("dropped_all_correct", "dropped_all_wrong", "dropped_too_few_valid"))
    assert kept + r[DS + "surplus"] + dropped == sampled and kept + r[DS + "short"] == n
    if r[DS + "short"]:
        assert r[DS + "extra_rounds"] == K, "short only once the cap is hit"
    if r[DS + "extra_rounds"] < K:
        assert r[DS + "short"] == 0 and r[DS + "surplus"] >= 0
    if kept:  # group hygiene over the trained groups' valid rows: every one is mixed
        assert r["groups_mixed"] == 1.0 and r["groups_all_correct"] == r["groups_all_wrong"] == 0.0
    # no invalid rollouts here: the loss covers every trained token exactly when no group is missing
    assert (r["loss_frac"] == 1.0) == (r[DS + "short"] == 0)


def test_dynamic_sampling_refills_the_batch_from_the_data_order_and_counts_the_cost(tmp_path, tiny):
    cfg = _cfg(tmp_path, tiny, dynamic_sampling_rounds=2, updates=1, train_size=64)
    run = LLMRun(cfg)
    try:
        left = len(run.train_set)  # the first epoch's order is drawn at the first prompt
        rows = [run.update() for _ in range(3)]
    finally:
        run.close()
    for r in rows:
        _check_row(r, cfg)
    # every round's prompts came off the data order: 3 updates used exactly the groups they sampled
    assert len(run.state.order.order) == left - sum(r[DS + "groups_sampled"] for r in rows)
    assert sum(r[DS + "extra_rounds"] for r in rows) > 0
    assert (
        sum(r[DS + "dropped_all_correct"] for r in rows) > 0
        and sum(r[DS + "dropped_all_wrong"] for r in rows) > 0
    )
    # generated_tokens counts every sampled response, the dropped groups' included
    tokens = [rows[0]["generated_tokens"]] + [
        b["generated_tokens"] - a["generated_tokens"] for a, b in zip(rows, rows[1:])
    ]
    for r, t in zip(rows, tokens):
        assert t == round(r["response_length"] * r[DS + "groups_sampled"] * cfg.group_size)


def test_the_cap_trains_on_what_was_found_and_an_empty_batch_does_not_crash(tmp_path, tiny):
    cfg = _cfg(tmp_path, tiny, updates=3)
    run_llm(cfg)
    rows = [r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if r["update"] > 0]
    for r in rows:
        _check_row(r, cfg)
    assert any(r[DS + "short"] > 0 for r in rows), "with one extra round this task leaves some updates short"
    # every group all correct: nothing informative anywhere; the update is skipped, not a crash
    ones = reward_file(tmp_path / "ones.py", "def one(response, truth):\n    return 1.0\n")
    cfg = _cfg(tmp_path, tiny, updates=1, reward_fn=ones, out_dir=str(tmp_path / "ones"))
    run_llm(cfg)
    (r,) = [r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if r["update"] > 0]
    assert r[DS + "groups_kept"] == 0 and r[DS + "short"] == 4 and r[DS + "dropped_all_correct"] == 8
    assert r["actor_skipped"] == 1 and r[DS + "extra_rounds"] == 1


def test_resume_with_dynamic_sampling_equals_the_uninterrupted_run(tmp_path, tiny):
    (tmp_path / "full").mkdir()
    (tmp_path / "part").mkdir()
    full = _cfg(
        tmp_path / "full", tiny, updates=4, checkpoint_every=2, out_dir=str(tmp_path / "full" / "run")
    )
    run_llm(full)
    part = _cfg(
        tmp_path / "part", tiny, updates=2, checkpoint_every=2, out_dir=str(tmp_path / "part" / "run")
    )
    run_llm(part)
    run_llm(replace(part, updates=4, resume=True))
    a = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    assert [r["update"] for r in b] == [0, 1, 2, 3, 4]
    assert sum(r.get(DS + "extra_rounds", 0) for r in a[3:]) > 0, "the resumed steps drew extra rounds"
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k, v in ra.items():
            if k in LLM_TIMING:
                continue
            assert rb[k] == (pytest.approx(v, rel=1e-4, abs=1e-5) if isinstance(v, float) else v), (
                ra["update"],
                k,
            )
    from safetensors.torch import load_file

    fa = load_file(tmp_path / "full" / "run" / "final" / "actor" / "model.safetensors")
    fb = load_file(tmp_path / "part" / "run" / "final" / "actor" / "model.safetensors")
    assert all(torch.allclose(fa[k], fb[k], atol=1e-5) for k in fa)


@pytest.mark.slow
def test_two_deepspeed_ranks_agree_on_the_rounds(tmp_path, tiny):
    """Two gloo ranks under DeepSpeed, each filling its own half of the batch: they draw the same number of
    rounds (the shortfall is summed over ranks), so no collective is left waiting; the run ends and its
    counters (summed over ranks) add up."""
    pytest.importorskip("deepspeed")
    cfg = _cfg(tmp_path, tiny, updates=2)
    args = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        "-m", "sppo_rl", "llm", "--algo", "grpo", "--group-size", "4", "--model", str(tiny),
        "--updates", "2", "--prompts-per-step", "4", "--train-size", "32", "--val-size", "4",
        "--eval-samples", "1", "--eval-every", "0", "--max-new-tokens", "8", "--temperature", "2.0",
        "--reward-fn", cfg.reward_fn, "--dynamic-sampling-rounds", "1", "--engine", "deepspeed",
        "--out-dir", cfg.out_dir, "--no-progress", "--no-tensorboard", "--threads", "1",
        "--collective-timeout", "120",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [r for r in read_metrics(Path(cfg.out_dir) / "metrics.jsonl") if r["update"] > 0]
    assert len(rows) == 2
    for r in rows:
        _check_row(r, cfg)


def _rollouts(lengths: list[int], width: int, prompt_width: int) -> RolloutBatch:
    B = len(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = (torch.arange(1, B * width + 1).view(B, width) * mask).long()
    return RolloutBatch(
        prompt_ids=torch.full((B, prompt_width), 7),
        prompt_mask=torch.ones(B, prompt_width, dtype=torch.long),
        response_ids=ids,
        response_mask=mask,
        logprobs=-ids.float() * mask,
        sampling_logprobs=-ids.float() * mask,
        texts=[str(n) for n in lengths],
        prompt_index=torch.arange(B),
        finished=torch.ones(B, dtype=torch.bool),
        num_generated_tokens=int(mask.sum()),
    )


def test_kept_rows_are_cut_to_their_longest_response_not_the_widest_round():
    """The batch's width must equal ``max(response_lengths)``, the width of the learner's old log-probs:
    a round padded to 5 positions whose kept rows end by position 3 gave mask [.., 5] vs logp [.., 3]."""
    a = _rollouts([5, 3, 2], width=5, prompt_width=2)  # row 0 (length 5) is dropped
    b = _rollouts([1, 2], width=4, prompt_width=3)
    out = _cat_rows([(a, torch.tensor([1, 2])), (b, torch.tensor([1]))], 0, torch.tensor([0, 0, 1]))
    assert out.response_mask.shape == (3, 3) and out.response_ids.shape == (3, 3)
    assert out.response_lengths.tolist() == [3, 2, 2]
    assert out.response_ids[0].tolist() == a.response_ids[1, :3].tolist()
    assert out.logprobs[2].tolist() == [*b.logprobs[1, :2].tolist(), 0.0]
    assert out.prompt_mask.tolist() == [[0, 1, 1], [0, 1, 1], [1, 1, 1]]  # left-padded to 3
    assert out.texts == ["3", "2", "2"] and out.num_generated_tokens == 7
