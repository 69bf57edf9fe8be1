"""Seeds as a batch dimension (sppo_rl.control.stack): seed k of a stack computes what its own networks
compute alone, bit for bit, whatever the other seeds and the stack's size."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from configs import control_config
from paths import CONTROL_TIMING, strip_timing

from sppo_rl.control.config import parse_seeds
from sppo_rl.control.networks import Actor
from sppo_rl.control.rollout import collect_seeds
from sppo_rl.control.stack import StackedActor, stacked_linear
from sppo_rl.control.trainer import run_control
from sppo_rl.envs.tasks import get_task, make_episode_env
from sppo_rl.runtime.logging import read_metrics


def actors(
    n: int, discrete: bool = True, obs_dim: int = 4, action_dim: int = 2, seed0: int = 0
) -> list[Actor]:
    out = []
    for k in range(n):
        torch.manual_seed(seed0 + k)
        a = Actor(obs_dim, action_dim, discrete, log_std_init=-0.5 + 0.1 * k)
        with torch.no_grad():  # distinct observation statistics per seed
            a.norm.mean.copy_(torch.randn(obs_dim, dtype=torch.float64))
            a.norm.var.copy_(torch.rand(obs_dim, dtype=torch.float64) + 0.5)
            for p in a.body.parameters():  # larger outputs than the 0.01-gain head gives
                p.add_(0.3 * torch.randn_like(p))
        out.append(a)
    return out


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, a control run's default (the stack is exact there: see test_stacked_linear...)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("out", [1, 2, 4, 64])
@pytest.mark.parametrize("d_in", [4, 64])
@pytest.mark.parametrize("rows", [1, 2, 5, 64, 3000])
def test_stacked_linear_slices_do_not_depend_on_the_stack(out, d_in, rows):
    """The kernel fact the stack rests on: slice k of the stacked layer is the same, to the bit, in a
    stack of 16 and alone (the single run is the stack of one), at one thread (a control run's default:
    with two, a Zen 2 CPU split 5-11 rows of 64-wide layers differently by the stack's size)."""
    g = torch.Generator().manual_seed(0)
    S = 16
    w, b = torch.randn(S, out, d_in, generator=g), torch.randn(S, out, generator=g)
    x = torch.randn(S, rows, d_in, generator=g)
    y = stacked_linear(x, w, b)
    for k in (0, 5, 15):
        assert torch.equal(y[k], stacked_linear(x[k : k + 1], w[k : k + 1], b[k : k + 1])[0])


@pytest.mark.parametrize("discrete,obs_dim,action_dim", [(True, 4, 2), (False, 8, 3), (False, 3, 1)])
def test_stacked_actor_forward_equals_each_actor(discrete, obs_dim, action_dim):
    acts = actors(5, discrete, obs_dim, action_dim)
    obs = torch.randn(5, 37, obs_dim)
    out = StackedActor(acts)(obs)
    for k, a in enumerate(acts):
        assert torch.equal(out[k], StackedActor([a])(obs[k : k + 1])[0])
        torch.testing.assert_close(out[k], a(obs[k]), rtol=1e-5, atol=1e-6)  # nn.Linear: float rounding


@pytest.mark.parametrize("discrete,obs_dim,action_dim", [(True, 4, 2), (False, 8, 3), (False, 3, 1)])
def test_stacked_actor_samples_each_seed_from_its_own_generator(discrete, obs_dim, action_dim):
    acts = actors(4, discrete, obs_dim, action_dim)
    stack = StackedActor(acts)
    obs = torch.randn(4, 16, obs_dim)
    greedy = torch.zeros(16, dtype=torch.bool)
    greedy[12:] = True
    gens = [torch.Generator().manual_seed(100 + k) for k in range(4)]
    active = [True, False, True, True]
    a, logp = stack.act(obs, greedy, gens, active)
    for k in (0, 2, 3):
        one = StackedActor([acts[k]])
        a1, logp1 = one.act(obs[k : k + 1], greedy, [torch.Generator().manual_seed(100 + k)], [True])
        assert torch.equal(a[k], a1[0]) and torch.equal(logp[k], logp1[0])
    assert torch.equal(gens[1].get_state(), torch.Generator().manual_seed(101).get_state())  # untouched


@pytest.mark.parametrize("task", ["precision-cartpole", "pendulum", "CartPole-v1"])
def test_collect_seeds_gives_each_seed_its_episodes_alone(task):
    """Seed k's episodes from a 4-seed collection (its start states, its generator) equal those it
    collects alone (a stack of one): same observations, actions, log-probs, rewards, lengths, outcomes."""
    spec = make_episode_env(task, num_envs=1)
    obs_dim = spec.observation_space.shape[-1]
    space = spec.single_action_space if hasattr(spec, "single_action_space") else spec.action_space
    discrete = hasattr(space, "n")
    action_dim = int(space.n) if discrete else int(space.shape[-1])
    spec.close()
    S, n = 4, 6
    acts = actors(S, discrete, obs_dim, action_dim)
    for a in acts:
        a.norm.mean.zero_()
        a.norm.var.fill_(1.0)
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, 2**31 - 1, size=(S, n))
    greedy = np.zeros(n, dtype=bool)
    greedy[-1] = True
    env = make_episode_env(task, num_envs=S * n)
    horizon = get_task(task).horizon
    gens = [torch.Generator().manual_seed(7 + k) for k in range(S)]
    many = collect_seeds(env, StackedActor(acts), seeds, horizon, greedy, gens)
    lengths = set()
    for k in range(S):
        gen = torch.Generator().manual_seed(7 + k)
        (alone,) = collect_seeds(
            make_episode_env(task, num_envs=n),
            StackedActor([acts[k]]),
            seeds[k : k + 1],
            horizon,
            greedy,
            [gen],
        )
        # the next update draws on from the same place
        assert torch.equal(gens[k].get_state(), gen.get_state())
        for f in ("obs", "actions", "logp", "rewards", "lengths", "success", "greedy"):
            assert torch.equal(getattr(many[k], f), getattr(alone, f)), (k, f)
        assert np.array_equal(many[k].seeds, alone.seeds)
        lengths.add(int(alone.lengths.max()))
    assert len(lengths) > 1 or task == "pendulum"  # the seeds' episodes end at different steps


# ------------------------------------------------------------------------------------- multi-seed runs


def _seed_files(out: Path) -> tuple[list[dict], dict, dict, dict]:
    """A run folder's rows (timings stripped), summary (timings stripped), config and final actor."""
    rows = strip_timing(read_metrics(out / "metrics.jsonl"), CONTROL_TIMING)
    summary = json.loads((out / "summary.json").read_text())
    summary = {k: v for k, v in summary.items() if k not in ("wall_time_s", "sps")}
    config = json.loads((out / "config.json").read_text())
    config.pop("out_dir")
    actor = torch.load(out / "final.pt", weights_only=False)["actor"]
    return rows, summary, config, actor


@pytest.mark.parametrize("algo", ["sppo", "ppo", "remax", "spo", "astar-po"])
def test_seed_k_of_a_multi_seed_run_is_its_single_run(tmp_path, algo):
    """``--seeds 0,3``: each seed's folder holds what ``--seed K`` alone writes (rows, summary, config but
    the folder, final weights), bit for bit; SPO's tracker and A*-PO's V* are each seed's own."""
    _check_seeds_alone(tmp_path, algo=algo)


def test_seed_k_of_a_compiled_multi_seed_run_is_its_single_run(tmp_path):
    """The same with ``--compile on`` (the stack's acting compiled for two seeds, then for one)."""
    _check_seeds_alone(tmp_path, algo="ppo", compile="on")


def _check_seeds_alone(tmp_path: Path, **kw) -> None:
    multi = control_config(tmp_path, "multi", seeds="0,3", total_episodes=192, **kw)
    summary = run_control(multi)
    assert summary["seeds"] == [0, 3] and len(summary["seed_summaries"]) == 2
    for k in (0, 3):
        run_control(control_config(tmp_path, f"alone-{k}", seed=k, total_episodes=192, **kw))
        rows, s, config, actor = _seed_files(tmp_path / "multi" / f"seed{k}")
        rows1, s1, config1, actor1 = _seed_files(tmp_path / f"alone-{k}")
        assert len(rows) == 3 and rows == rows1
        assert s == s1 and config == config1
        assert actor.keys() == actor1.keys() and all(torch.equal(actor[n], actor1[n]) for n in actor)
    set_rows = read_metrics(tmp_path / "multi" / "metrics.jsonl")  # the seeds' mean per update
    seed_rows = [read_metrics(tmp_path / "multi" / f"seed{k}" / "metrics.jsonl") for k in (0, 3)]
    assert [r["update"] for r in set_rows] == [1, 2, 3]
    for i, r in enumerate(set_rows):
        assert r["env_steps"] == sum(s[i]["env_steps"] for s in seed_rows)
        assert r["success_rate"] == pytest.approx(np.mean([s[i]["success_rate"] for s in seed_rows]))


@pytest.mark.parametrize("compile", ["off", "on"])
def test_a_multi_seed_run_resumes_exactly(tmp_path, compile):
    """Stopped after update 2 and resumed, each seed's rows and weights are the uninterrupted run's,
    eager or compiled (fused Adam's state and the rational tanh come back with the checkpoint)."""
    full = control_config(
        tmp_path, "full", seeds="1-2", total_episodes=256, checkpoint_every=2, compile=compile
    )
    run_control(full)
    part = control_config(
        tmp_path, "part", seeds="1-2", total_episodes=128, checkpoint_every=2, compile=compile
    )
    run_control(part)
    run_control(replace(part, total_episodes=256, resume=True))
    for sub in ("", "seed1", "seed2"):
        a = read_metrics(tmp_path / "full" / sub / "metrics.jsonl")
        b = read_metrics(tmp_path / "part" / sub / "metrics.jsonl")
        assert [r["update"] for r in b] == [1, 2, 3, 4]
        assert strip_timing(a, CONTROL_TIMING) == strip_timing(b, CONTROL_TIMING)
    a, b = (
        torch.load(tmp_path / x / "seed2" / "final.pt", weights_only=False)["actor"] for x in ("full", "part")
    )
    assert all(torch.equal(a[n], b[n]) for n in a)


def _multi_args(out: Path) -> list[str]:
    return [sys.executable, "-m", "sppo_rl", "control", "--seeds", "0-1", "--task", "short-cartpole",
            "--total-episodes", "640", "--init-from", "none", "--checkpoint-every", "1000", "--eval-every", "4",
            "--eval-episodes", "8", "--no-progress", "--no-tensorboard", "--out-dir", str(out)]  # fmt: skip


@pytest.mark.slow  # 60 s on 2 busy cores
def test_a_preempted_multi_seed_run_resumes_exactly(tmp_path):
    """SIGTERM after a few updates: every seed's checkpoint is saved, the process exits 143 saying how
    to resume, and the resumed set's rows (the set's and each seed's) equal an uninterrupted run's."""
    subprocess.run(_multi_args(tmp_path / "full"), check=True, capture_output=True, timeout=600)
    part = tmp_path / "part"
    proc = subprocess.Popen(_multi_args(part), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (part / "metrics.jsonl").exists() and len(read_metrics(part / "metrics.jsonl")) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "--seeds 0-1 --resume" in err
    assert len(read_metrics(part / "metrics.jsonl")) < 10
    assert all(list((part / f"seed{k}" / "checkpoints").glob("ckpt-*")) for k in (0, 1))
    subprocess.run([*_multi_args(part), "--resume"], check=True, capture_output=True, timeout=600)
    for sub in ("", "seed0", "seed1"):
        a = read_metrics(tmp_path / "full" / sub / "metrics.jsonl")
        b = read_metrics(part / sub / "metrics.jsonl")
        assert [r["update"] for r in b] == list(range(1, 11)), "every update once, in order"
        assert strip_timing(a, CONTROL_TIMING) == strip_timing(b, CONTROL_TIMING)
        assert sum("eval_success_rate" in r for r in b) == 2


def test_seeds_are_ranges_and_lists():
    assert (
        parse_seeds("0-3,7") == [0, 1, 2, 3, 7] and parse_seeds("5") == [5] and parse_seeds("2,1,2") == [2, 1]
    )
    for bad in ("x", "3-1", "0,,2", "-1", ""):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_bad_seeds_are_refused_in_one_line_before_any_file(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", "control", "--seeds", "3-1", "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--seeds" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_train_control_with_seeds_returns_each_seeds_policy(tmp_path):
    from sppo_rl import api

    kw = dict(total_episodes=64, init_from="none", progress=False, tensorboard=False, eval_episodes=0)
    policies = api.train_control("short-cartpole", seeds="2,0", out_dir=str(tmp_path / "set"), **kw)
    assert [p.summary["seed"] for p in policies] == [2, 0]
    assert [p.run_dir for p in policies] == [tmp_path / "set" / "seed2", tmp_path / "set" / "seed0"]
