"""Asynchronous rollouts (``--max-staleness K``) end to end on the tiny model: K = 0 is the synchronous
update, whether the sampler runs inline or in a worker process; K = 1 samples each batch by the policy of
the update before, the same numbers inline and in a worker; it resumes exactly with the requested rounds
in the checkpoint; SIGTERM to the process group ends in a checkpoint and no process is left behind; a
killed worker stops the run with one line; the off-policy corrections do what their help says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from configs import TINY_LLM_FLAGS, llm_config
from paths import ALGOS, LLM_TIMING, assert_rows_close, strip_timing
from safetensors.torch import load_file

from sppo_rl.llm.trainer import LLMRun, run_llm
from sppo_rl.runtime.logging import read_metrics

PARITY = "def score(response, truth):\n    return float(len(response) % 2 == 0)\n"
"""Pays an even length: a reward that varies from the first update, so that the actor moves."""


def _moving(tmp_path: Path, tiny: Path, name: str, **kw):
    """A run whose actor moves every update (the parity reward, temperature 2, lr 1e-3, trained on equal
    rewards too)."""
    parity = tmp_path / "parity.py"
    parity.write_text(PARITY)
    base = dict(algo="sppo", updates=4, temperature=2.0, actor_lr=1e-3, reward_fn=f"{parity}:score")
    base["skip_equal_rewards"] = False
    return llm_config(tmp_path, tiny, name, **{**base, **kw})


def _rows(out: Path) -> list[dict]:
    """The run's metrics rows without what measures the process (time, its peak memory)."""
    return strip_timing(read_metrics(out / "metrics.jsonl"), {*LLM_TIMING, "peak_memory_mb"})


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "actor" / "model.safetensors")


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_k0_in_a_worker_process_is_the_synchronous_update_bit_for_bit(tmp_path, tiny):
    run_llm(_moving(tmp_path, tiny, "inline"))
    run_llm(_moving(tmp_path, tiny, "worker", rollout_worker="process"))
    assert _rows(tmp_path / "inline") == _rows(tmp_path / "worker")
    assert _same_weights(tmp_path / "inline", tmp_path / "worker")
    assert "staleness" not in read_metrics(tmp_path / "inline" / "metrics.jsonl")[1]


def test_k1_samples_by_the_previous_policy_the_same_inline_and_in_a_worker(tmp_path, tiny):
    run_llm(_moving(tmp_path, tiny, "sync"))
    run_llm(_moving(tmp_path, tiny, "inline", max_staleness=1, rollout_worker="inline"))
    run_llm(_moving(tmp_path, tiny, "worker", max_staleness=1))
    inline, worker = _rows(tmp_path / "inline"), _rows(tmp_path / "worker")
    assert inline == worker and _same_weights(tmp_path / "inline", tmp_path / "worker")
    trained = [r for r in inline if "staleness" in r]
    assert [r["staleness"] for r in trained] == [0.0, 1.0, 1.0, 1.0]
    sync = [r for r in _rows(tmp_path / "sync") if "reward_mean" in r]
    # update 1 trains on the same batch (both sampled by the initial policy): the same row, up to the
    # rounding of decoupled PPO's weights min(pi_old / mu, 5), 1 within 1e-6 here
    assert_rows_close([{k: v for k, v in trained[0].items() if k != "staleness"}], sync[:1])
    # later ones on samples of the policy before: their log-probs mu are those of the update before, not
    # the learner's (synchronous: equal up to rounding)
    assert max(r["rollout_logp_diff"] for r in sync) < 1e-5
    assert trained[0]["rollout_logp_diff"] < 1e-5 < min(r["rollout_logp_diff"] for r in trained[1:])


@pytest.mark.parametrize("worker", ["inline", pytest.param("process", marks=pytest.mark.slow)])
def test_k1_resumes_exactly_with_the_requested_round_in_the_checkpoint(tmp_path, tiny, worker):
    kw = dict(max_staleness=1, rollout_worker=worker, checkpoint_every=2)
    run_llm(_moving(tmp_path, tiny, "full", **kw))
    run_llm(_moving(tmp_path, tiny, "part", **{**kw, "updates": 2}))
    state = torch.load(
        next((tmp_path / "part" / "checkpoints").glob("ckpt-*")) / "state.pt", weights_only=True
    )
    assert [p["step"] for p in state["pending"]] == [2], "update 3's batch, sampled during update 2"
    run_llm(_moving(tmp_path, tiny, "part", **{**kw, "resume": True}))
    assert _rows(tmp_path / "full") == _rows(tmp_path / "part")
    assert _same_weights(tmp_path / "full", tmp_path / "part")


@pytest.mark.slow
def test_k2_streams_two_batches_ahead(tmp_path, tiny):
    run_llm(_moving(tmp_path, tiny, "k2", max_staleness=2, rollout_worker="inline", updates=5))
    rows = [r for r in read_metrics(tmp_path / "k2" / "metrics.jsonl") if "staleness" in r]
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 2.0, 2.0, 2.0]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_k1_runs_every_algorithm_in_a_worker(tmp_path, tiny, algo):
    s = run_llm(llm_config(tmp_path, tiny, algo=algo, max_staleness=1, updates=3, train_size=16))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "staleness" in r]
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0] and s["updates"] == 3


@pytest.mark.slow
def test_k1_with_dynamic_sampling_tags_each_round(tmp_path, tiny):
    """DAPO's extra rounds are requested when update u needs them, by update u's weights."""
    kw = dict(algo="grpo", group_size=2, dynamic_sampling_rounds=2, max_staleness=1, rollout_worker="inline")
    s = run_llm(_moving(tmp_path, tiny, "dapo", **kw))
    assert s["updates"] == 4
    rows = [r for r in read_metrics(tmp_path / "dapo" / "metrics.jsonl") if "staleness" in r]
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert any(r["dynamic_sampling/extra_rounds"] > 0 for r in rows)


def test_behaviour_correction_takes_the_ratio_against_the_samplers_log_probs(tmp_path, tiny):
    run = LLMRun(
        _moving(tmp_path, tiny, "b", max_staleness=1, rollout_worker="inline", off_policy="behaviour")
    )
    try:
        assert run.plan.update.off_policy == "behaviour" and run.plan.learner.tis_cap is None
        rows = [run.update() for _ in range(3)]
    finally:
        run.close()
    assert all(r["rollout_logp_diff"] == 0.0 for r in rows)  # pi_old is mu itself


def test_decoupled_is_the_default_with_staleness_and_caps_at_tis_cap(tmp_path, tiny):
    from sppo_rl.llm.models.engines import launcher_dist
    from sppo_rl.llm.plan import DECOUPLED_CAP, resolve

    def plan(**kw):
        return resolve(llm_config(tmp_path, tiny, **kw), launcher_dist())[0]

    assert plan().update.off_policy == "none" and plan().learner.tis_cap is None
    assert plan(max_staleness=1).update.off_policy == "decoupled"
    assert plan(max_staleness=1).learner.tis_cap == DECOUPLED_CAP
    assert plan(max_staleness=1, tis_cap=2.0).learner.tis_cap == 2.0
    assert plan(tis_cap=2.0).update.off_policy == "decoupled"  # today's TIS, at K = 0
    assert plan(max_staleness=1).rollout.worker == "process" and plan().rollout.worker == "inline"


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--max-staleness", "-1"], "--max-staleness"),
        (["--off-policy", "behaviour", "--tis-cap", "2"], "--tis-cap"),
        (["--max-staleness", "1", "--vllm-sleep"], "--vllm-sleep"),
        (["--rollout-threads", "0"], "--rollout-threads"),
    ],
)
def test_bad_async_settings_are_one_line_and_exit_2(tmp_path, tiny, flags, words):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sppo_rl", "llm", "--model", str(tiny), "--out-dir", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------------- real processes


def _args(tiny: Path, out: Path, updates: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "sppo_rl", "llm", "--algo", "sppo", "--model", str(tiny), "--updates", str(updates),
        *TINY_LLM_FLAGS, "--eval-every", "1000", "--checkpoint-every", "1000", "--no-progress", "--no-tensorboard",
        "--threads", "1", "--max-staleness", "1", "--out-dir", str(out), *extra,
    ]  # fmt: skip


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _worker_of(proc: subprocess.Popen) -> int:
    """The rollout worker's pid: the run's child named ``sppo-rollout`` (it names itself so: /proc/PID/comm)."""
    for pid in _children(proc.pid):
        try:
            if (Path("/proc") / str(pid) / "comm").read_text().strip() == "sppo-rollout":
                return pid
        except OSError:
            continue
    raise AssertionError("no rollout worker among the run's children")


def _wait_rows(proc: subprocess.Popen, metrics: Path, rows: int) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(read_metrics(metrics)) >= rows:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended or stalled before {rows} rows: {proc.poll()}")


@pytest.mark.slow
def test_sigterm_to_the_group_saves_a_checkpoint_and_leaves_no_process(tmp_path, tiny):
    full, part = tmp_path / "full", tmp_path / "part"
    subprocess.run(_args(tiny, full, 12), check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen(
        _args(tiny, part, 12),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_rows(proc, part / "metrics.jsonl", 3)
        worker = _worker_of(proc)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "resume with: sppo-rl llm" in err
    deadline = time.time() + 10
    while _alive(worker) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "the rollout worker outlived the run"
    subprocess.run([*_args(tiny, part, 12), "--resume"], check=True, capture_output=True, timeout=600)
    a, b = _rows(full), _rows(part)
    assert [r["update"] for r in b] == [r["update"] for r in a]
    assert a == b


def test_a_killed_worker_stops_the_run_with_one_line_and_resume_goes_on(tmp_path, tiny):
    out = tmp_path / "run"
    proc = subprocess.Popen(_args(tiny, out, 200, "--checkpoint-every", "1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        _wait_rows(proc, out / "metrics.jsonl", 3)
        os.kill(_worker_of(proc), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "rollout worker" in lines[-1] and "Traceback" not in err, err[-2000:]
    assert not [p for p in _children(proc.pid) if _alive(p)]
    done = len(read_metrics(out / "metrics.jsonl"))
    subprocess.run([*_args(tiny, out, done + 1), "--resume"], check=True, capture_output=True, timeout=600)


@pytest.mark.slow
def test_k1_latent_grpo_samples_latent_steps_in_the_worker_as_inline(tmp_path, tiny):
    """The latent backend is built in the worker too (its plug-in travels to the child): the same run."""
    kw = dict(
        algo="latent-grpo", prompts_per_step=2, group_size=4, val_size=4, eval_every=2, max_new_tokens=6
    )
    kw.update(latent_steps=2, latent_topk=4, max_staleness=1, updates=3)
    run_llm(llm_config(tmp_path, tiny, "inline", rollout_worker="inline", **kw))
    run_llm(llm_config(tmp_path, tiny, "worker", rollout_worker="process", **kw))
    assert _rows(tmp_path / "inline") == _rows(tmp_path / "worker")
    assert [
        r["staleness"] for r in read_metrics(tmp_path / "worker" / "metrics.jsonl")[1:] if "staleness" in r
    ] == [
        0.0,
        1.0,
        1.0,
    ]
