"""The control world's trainer: batches, every algorithm learning, determinism, resume, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from configs import control_config
from paths import ALGOS, CONTROL_TIMING, strip_timing

from sppo_rl import api
from sppo_rl.agents.algorithms import compute_advantages, get_algorithm
from sppo_rl.agents.batch import SequenceBatch
from sppo_rl.control.config import WarmstartConfig
from sppo_rl.control.networks import Actor
from sppo_rl.control.rollout import collect
from sppo_rl.control.trainer import ControlRun, run_control
from sppo_rl.envs.tasks import get_task, make_episode_env
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report import run_report
from sppo_rl.runtime.checkpoint import torch_load
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import NonFiniteError, RunError

TIMING = {"wall_time_s", "sps", "update_sps", "collect_frac"}


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.fixture(scope="module")
def episodes():
    """16 random-policy episodes of a terminal-reward task, in groups of 4 sharing a start state."""
    spec = get_task("short-cartpole")
    env = make_episode_env(spec.name, num_envs=16)
    torch.manual_seed(0)
    actor = Actor(spec.obs_dim, spec.action_dim, spec.discrete)
    seeds = np.repeat(np.array([11, 22, 33, 44]), 4)
    ep = collect(env, actor, seeds, spec.horizon, None, torch.Generator().manual_seed(0))
    env.close()
    return ep


def test_collected_batch_is_padded_terminal_reward(episodes):
    ep = episodes
    assert ep.obs.shape[:2] == ep.logp.shape == ep.rewards.shape
    mask = ep.mask
    # groups share s_0
    for g in range(4):
        assert torch.equal(ep.obs[4 * g, 0].expand(4, -1), ep.obs[4 * g : 4 * g + 4, 0])
    # reward only on the last valid step, equal to the success flag; nothing on padding
    last = ep.lengths - 1
    assert torch.equal(ep.rewards[torch.arange(16), last], ep.success)
    off_last = ep.rewards.clone()
    off_last[torch.arange(16), last] = 0
    assert torch.all(off_last == 0)
    assert torch.all(ep.logp[mask == 0] == 0)
    assert 0 < float(ep.success.mean()) < 1, "the fixture needs both outcomes"


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5), (1.0, 0.0)])
def test_ppo_advantages_on_collected_batch_with_constant_critic(episodes, gamma, lam):
    ep, c = episodes, 0.3
    mask = ep.mask
    batch = SequenceBatch(mask=mask, logp_old=ep.logp, rewards=ep.success, token_rewards=ep.rewards * mask)
    batch.values = torch.full_like(mask, c) * mask
    compute_advantages(batch, get_algorithm("ppo"), gamma=gamma, lam=lam)
    gl = gamma * lam
    for b in range(16):
        L, R = int(ep.lengths[b]), float(ep.success[b])
        for t in range(L):
            # delta_k = (gamma - 1) c for k < L - 1, delta_{L-1} = R - c
            expect = (gamma - 1) * c * sum(gl**j for j in range(L - 1 - t)) + gl ** (L - 1 - t) * (R - c)
            assert float(batch.advantages[b, t]) == pytest.approx(expect, abs=1e-5)
        assert torch.all(batch.advantages[b, L:] == 0)


def test_sequence_level_advantages_on_collected_batch(episodes):
    ep = episodes
    mask = ep.mask
    R = ep.success
    batch = SequenceBatch(
        mask=mask,
        logp_old=ep.logp,
        rewards=R,
        group_ids=torch.arange(4).repeat_interleave(4),
        baseline_rewards=torch.zeros(16),
    )
    batch.values = torch.full((16,), float(np.log(0.25 / 0.75)))  # V(s_0) = 0.25
    compute_advantages(batch, get_algorithm("sppo"))
    torch.testing.assert_close(batch.advantages, (R - 0.25)[:, None] * mask)
    compute_advantages(batch, get_algorithm("drgrpo"))
    means = R.view(4, 4).mean(1).repeat_interleave(4)
    torch.testing.assert_close(batch.advantages, (R - means)[:, None] * mask)
    compute_advantages(batch, get_algorithm("remax"))
    torch.testing.assert_close(batch.advantages, R[:, None] * mask)


@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithm_solves_the_easy_sparse_task(tmp_path, algo):
    # GSPO's own clip range (3e-4 / 4e-4 on the sequence ratio, for LLM responses) stops most of 4 epochs
    # x 4 minibatches here after the first step (0.27 success after 1536 episodes): PPO's 0.2 instead
    extra = {"clip": 0.2} if algo == "gspo" else {}
    summary = run_control(control_config(tmp_path, algo=algo, total_episodes=1536, eval_episodes=64, **extra))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["success_rate"] < 0.5, "the task must start hard for a random policy"
    last = float(np.mean([r["success_rate"] for r in rows[-3:]]))
    assert last >= 0.9, (algo, [round(r["success_rate"], 2) for r in rows])
    assert summary["final_eval_success_rate"] >= 0.9


def test_metrics_rows_and_run_folder(tmp_path):
    run_control(control_config(tmp_path, algo="sppo", total_episodes=128, tensorboard=True))
    out = tmp_path / "run"
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) == 2
    for key in (
        "episodes",
        "env_steps",
        "success_rate",
        "wall_time_s",
        "sps",
        "policy_loss",
        "clipfrac",
        "approx_kl",
    ):
        assert key in rows[-1], key
    assert {"entropy", "critic_bce", "v0_mean", "v0_brier"} <= set(rows[-1])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["algo"] == "sppo" and cfg["resolved"]["episodes_per_update"] == 64
    assert (
        (out / "final.pt").exists()
        and (out / "summary.json").exists()
        and (out / "calibration.json").exists()
    )
    assert list((out / "tb").glob("events.*")) and list((out / "checkpoints").glob("ckpt-*"))
    cal = json.loads((out / "calibration.json").read_text())
    assert len(cal["predicted"]) == len(cal["empirical"]) == 64
    trace = np.load(out / "critic_trace.npz")
    assert str(trace["kind"]) == "sequence" and trace["v0"].shape == trace["success"].shape == (64,)


def test_ppo_logs_explained_variance(tmp_path):
    run_control(control_config(tmp_path, algo="ppo", total_episodes=128))
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert "explained_variance" in row and "value_loss" in row
    trace = np.load(tmp_path / "run" / "critic_trace.npz")
    assert str(trace["kind"]) == "step"
    L = trace["lengths"]
    assert trace["values"].shape == (64, int(L.max()))
    assert all((trace["values"][b, L[b] :] == 0).all() for b in range(64))


def test_same_seed_same_metrics_and_different_seed_differs(tmp_path):
    a = run_control(control_config(tmp_path / "a", algo="grpo", total_episodes=256))
    b = run_control(control_config(tmp_path / "b", algo="grpo", total_episodes=256))
    c = run_control(control_config(tmp_path / "c", algo="grpo", total_episodes=256, seed=1))
    ra, rb, rc = (read_metrics(tmp_path / x / "run" / "metrics.jsonl") for x in "abc")
    assert _strip(ra) == _strip(rb)
    assert _strip(ra) != _strip(rc)
    assert a["env_steps"] == b["env_steps"]
    wa = torch.load(tmp_path / "a" / "run" / "final.pt", weights_only=False)["actor"]
    wb = torch.load(tmp_path / "b" / "run" / "final.pt", weights_only=False)["actor"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    del c


@pytest.mark.parametrize("algo", ["sppo", "ppo", "remax", "spo", "astar-po"])
def test_resume_equals_uninterrupted(tmp_path, algo):
    full = control_config(tmp_path / "full", algo=algo, total_episodes=512, checkpoint_every=2)
    run_control(full)
    part = control_config(tmp_path / "part", algo=algo, total_episodes=256, checkpoint_every=2)
    run_control(part)
    run_control(replace(part, total_episodes=512, resume=True))
    r_full = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    r_part = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    assert len(r_part) == len(r_full) == 8
    assert _strip(r_part) == _strip(r_full)


def test_equal_outcomes_make_no_update(tmp_path):
    """All 64 episodes fail (random policy, precision task): GRPO's advantages are exactly 0 and the actor
    takes no optimizer step (Adam's momentum would otherwise still move it)."""
    run = ControlRun(control_config(tmp_path, algo="grpo", task="precision-cartpole", total_episodes=64))
    before = {k: v.clone() for k, v in run.actor.state_dict().items() if k.startswith("body")}
    row = run.update()
    assert row["success_rate"] == 0.0 and row["actor_skipped"] == 1
    after = run.actor.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not run.actor_opt.state


def test_nan_stops_with_named_step_and_keeps_checkpoint(tmp_path):
    run = ControlRun(control_config(tmp_path, algo="sppo", total_episodes=256))
    row = run.update()
    run.logger.log(row, step=run.state.episodes)
    ckpt = run.save_checkpoint()
    with torch.no_grad():
        run.critic.body[0].weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="step 2: advantages"):
        run.update()
    run.logger.close()
    assert run.ckpts.latest() == ckpt
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 1


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(task="nope"), "valid:.*precision-cartpole"),
        (dict(algo="nope"), "valid: ppo, sppo"),
        (dict(algo="grpo", group_size=1), "group_size >= 2"),
        (dict(algo="grpo", group_size=3, episodes_per_update=64), "multiple of group_size"),
        (dict(algo="sppo", group_size=4), "does not use groups"),
        (dict(init_from="/no/such/file.pt"), "no such file"),
        (dict(total_episodes=10), "smaller than one update"),
    ],
)
def test_bad_settings_are_refused_before_work(tmp_path, kw, match):
    with pytest.raises((RunError, ValueError), match=match):
        ControlRun(control_config(tmp_path, **kw))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_cli_reports_bad_input_clearly(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sppo_rl",
            "control",
            "--algo",
            "grpo",
            "--group-size",
            "1",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "group_size >= 2" in proc.stderr and "Traceback" not in proc.stderr


def test_warmstart_pipeline_gives_imperfect_start(tmp_path):
    from sppo_rl.control.warmstart import run_warmstart

    meta = run_warmstart(
        WarmstartConfig(
            task="short-cartpole",
            out_dir=str(tmp_path),
            expert_episodes=1024,
            expert_episodes_per_update=32,
            demo_episodes=64,
            eval_episodes=64,
            target_success=0.5,
            progress=False,
        )
    )
    assert meta["expert_success_sampled"] > 0.8
    assert 0.0 < meta["success_sampled"] < 1.0
    assert meta["demo_successes"] > 0
    # stage 3 starts from it
    summary = run_control(
        control_config(
            tmp_path,
            algo="sppo",
            init_from=str(tmp_path / "short-cartpole" / "warmstart.pt"),
            total_episodes=128,
        )
    )
    assert summary["episodes"] == 128


def test_first_ratio_is_exactly_one_with_moving_observation_statistics(tmp_path):
    """Random init normalises observations with running statistics; the update must recompute the
    log-probs on the inputs they were sampled with, so before any step the PPO ratio is exactly 1."""
    run = ControlRun(
        control_config(
            tmp_path, algo="reinforce", total_episodes=128, epochs=1, minibatches=1, actor_lr=1e-12
        )
    )
    run.update()
    row = run.update()
    assert row["ratio_min"] == pytest.approx(1.0, abs=1e-5) and row["ratio_max"] == pytest.approx(
        1.0, abs=1e-5
    )
    assert not bool(run.actor.norm.frozen) and float(run.actor.norm.count) > 1


QUICKSTART = (
    "control --task CartPole-v0 --algo ppo --dense --gamma 0.99 --init-from none --total-episodes 640"
)
"""The README's control quickstart (``sppo-rl`` + this)."""


def _quickstart(tmp_path: Path, capsys, episodes: int, dense: bool = True) -> tuple[str, dict]:
    from sppo_rl.cli import main

    args = QUICKSTART.replace("640", str(episodes)).split()
    if not dense:
        args.remove("--dense")
    out = tmp_path / ("dense" if dense else "sparse")
    capsys.readouterr()
    assert main([*args, "--out-dir", str(out), "--no-progress", "--no-tensorboard"]) in (0, None)
    return capsys.readouterr().err, json.loads((out / "summary.json").read_text())


def test_the_not_learning_warning_reads_the_shaped_return_with_dense(tmp_path, capsys):
    """The quickstart's first 10 updates (160 episodes): with ``--dense`` the shaped return is the
    signal and varies, so no "nothing to learn" warning although no episode succeeds yet; the same run on
    the binary outcome (no ``--dense``; 3 updates, the fewest the rule reads) still gets it, on stderr
    and in ``summary.json``."""
    err, summary = _quickstart(tmp_path, capsys, 160)
    rows = read_metrics(tmp_path / "dense" / "metrics.jsonl")
    assert len(rows) == 10 and all(r["success_rate"] == 0 for r in rows)  # the old rule would fire
    assert "nothing to learn" not in err and not summary.get("warnings")
    err, summary = _quickstart(tmp_path, capsys, 48, dense=False)
    assert "the success rate (success_rate) was 0 in each of the first 3 updates" in err
    assert any("nothing to learn" in w for w in summary["warnings"])


def test_not_learning_reads_the_signal_it_is_given():
    """``signal="return"``: a constant success with a varying shaped return is no constant signal; a
    constant return is, named as the shaped return; rows without the key fall back to the success."""
    from sppo_rl.runtime.watch import not_learning

    rows = [{"success_rate": 0.0, "return": float(r)} for r in (10, 12, 15)]
    assert [w["kind"] for w in not_learning(rows)] == ["constant_signal"]
    assert not_learning(rows, "return") == []
    flat = [{**r, "return": 9.0} for r in rows]
    assert "the shaped return (return) was 9" in not_learning(flat, "return")[0]["message"]
    assert [w["kind"] for w in not_learning([{"success_rate": 0.0}] * 3, "return")] == ["constant_signal"]


@pytest.mark.slow
def test_the_readme_quickstart_prints_no_warning(tmp_path, capsys):
    """The whole quickstart (640 episodes, about 45 s on a shared 2-core machine): no warning at all."""
    err, summary = _quickstart(tmp_path, capsys, 640)
    assert "warning" not in err and not summary.get("warnings")
    assert summary["tail_success_rate"] > 0.5


def test_spo_start_states_draw_by_uncertainty_and_discount_by_distance():
    """SPO's pool (sppo_rl/control/spo.py): a start state the tracker is sure of (p_hat ~ 1: weight
    0.05) is drawn with probability 0.05 / (0.05 + 3 * 0.55) = 0.029 against 0.324 for an unseen one; a
    policy that moved by D = 0.005 on a state's last episode discounts its counts by 2^(-0.005 / 0.06)."""
    from types import SimpleNamespace

    from sppo_rl.control.spo import StartStates

    pool = StartStates(4, seed=0)
    assert np.array_equal(pool.seeds, StartStates(4, seed=0).seeds)
    pool.tracker.alpha[0], pool.tracker.beta[0] = 1e9, 0.0
    rng = np.random.default_rng(0)
    first = [int(pool.draw(1, rng)[0]) for _ in range(4000)]
    assert 60 <= first.count(0) <= 180 and all(1000 <= first.count(c) <= 1600 for c in (1, 2, 3))
    assert sorted(pool.draw(4, rng).tolist()) == [0, 1, 2, 3]

    ep = SimpleNamespace(
        success=torch.tensor([1.0]),
        mask=torch.tensor([[1.0, 1.0, 0.0]]),
        obs=torch.zeros(1, 3, 2),
        actions=torch.zeros(1, 3),
        logp=torch.tensor([[-0.5, -0.7, 0.0]]),
    )
    moved = SimpleNamespace(logp_entropy=lambda obs, actions: (torch.tensor([-0.505, -0.695]), None))
    assert pool.distances(moved, [2]) == [0.0]  # never seen: D = 0, rho = 0.96
    assert pool.observe([2], ep, [0.0]) == [0.96]
    assert pool.tracker.alpha[2] == pytest.approx(0.96 * 0.5 + 1)
    (d,) = pool.distances(moved, [2])
    assert d == pytest.approx(0.005)
    assert pool.observe([2], ep, [d]) == [pytest.approx(2 ** (-0.005 / 0.06))]


def test_astar_v_star_is_estimated_from_k_reference_episodes_per_pool_state():
    """A*-PO's stage 1 (sppo_rl/control/astar.py): ``V*`` of each of the pool's 3 start states from its
    ``k = 3`` episodes of the frozen initial actor, run in rounds of the env's 4 sub-envs (the last round
    of 9 episodes filled with 3 repeats that are left out): the same episodes collected by hand give the same table."""
    from sppo_rl.agents.rivals import optimal_value
    from sppo_rl.control.astar import ReferenceValues
    from sppo_rl.control.spo import StartStates

    spec = get_task("short-cartpole")
    env = make_episode_env(spec.name, num_envs=4)
    torch.manual_seed(0)
    actor = Actor(spec.obs_dim, spec.action_dim, spec.discrete)
    table = ReferenceValues(3, seed=5, actor=actor)
    assert np.array_equal(table.seeds, StartStates(3, seed=5).seeds)  # SPO's pool
    with torch.no_grad():
        actor.body[0].weight.add_(1.0)  # the run's actor moves; the reference is a copy
    table.estimate(env, spec.horizon, samples=3, beta1=0.5, seed=7)
    rows = np.repeat(table.seeds, 3)
    gen = torch.Generator().manual_seed(7 + 3)
    a = collect(env, table.reference, rows[:4], spec.horizon, None, gen)
    b = collect(env, table.reference, rows[4:8], spec.horizon, None, gen)
    c = collect(env, table.reference, rows[8:].repeat(4), spec.horizon, None, gen)
    R = torch.cat([a.success, b.success, c.success[:1]]).double().view(3, 3)
    env.close()
    assert torch.equal(table.v_star, optimal_value(R, 0.5))
    assert table.env_steps == int(a.lengths.sum() + b.lengths.sum() + c.lengths[0])
    assert table.values([2, 0]).tolist() == [table.v_star[2].item(), table.v_star[0].item()]
    assert not torch.equal(table.reference.body[0].weight, actor.body[0].weight)


def test_astar_po_regresses_onto_r_minus_v_star_against_the_frozen_initial_actor(tmp_path):
    """One epoch of one minibatch: at update 1 the actor is the reference, so the loss is
    ``mean_b (R_b - V*_b)^2`` exactly and the implicit reward 0; at update 2 the actor has moved away
    from the reference (a ratio to the *old* policy would read 0 again). V*, the reference and stage 1's
    env steps are in the checkpoint; the reference never moves."""
    cfg = control_config(
        tmp_path,
        algo="astar-po",
        total_episodes=128,
        epochs=1,
        minibatches=1,
        spo_contexts=64,
        astar_samples=2,
    )
    run = ControlRun(cfg)
    ref0 = {k: v.clone() for k, v in run.astar.reference.state_dict().items()}
    same = [torch.equal(ref0[k], t) for k, t in run.actor.state_dict().items() if k != "norm.frozen"]
    assert all(same) and bool(ref0["norm.frozen"])  # the initial actor, its observation statistics frozen
    v = run.astar.v_star
    assert v.shape == (64,) and run.state.env_steps == run.astar.env_steps > 0
    rollout = run.collect_rollouts()
    R = rollout.episodes.success.double()
    expected = float(((R - v[rollout.contexts]) ** 2).mean())
    _, m1 = run.train(rollout)
    assert m1["policy_loss"] == pytest.approx(expected, rel=1e-5)
    assert m1["implicit_reward"] == 0.0 and m1["astar_v_star"] == pytest.approx(
        float(v[rollout.contexts].mean())
    )
    _, m2 = run.train(run.collect_rollouts())
    assert m2["implicit_reward"] != 0.0
    assert all(torch.equal(ref0[k], t) for k, t in run.astar.reference.state_dict().items())
    state = run.state_dict()
    assert torch.equal(state["astar"]["v_star"], v) and state["astar"]["env_steps"] == run.astar.env_steps
    run.close()


def test_the_plan_is_a_run_plan_without_the_config(tmp_path):
    """The control plan has the shape both worlds share; the loop's ``updates`` is ``ceil(total / E)``."""
    from dataclasses import fields

    from sppo_rl.control.plan import resolve
    from sppo_rl.runtime.plan import RunPlan

    cfg = control_config(tmp_path, total_episodes=100, episodes_per_update=32)
    plan = resolve(cfg)
    assert isinstance(plan, RunPlan) and plan.given is cfg
    assert "cfg" not in {f.name for f in fields(plan)}
    assert plan.loop.updates == 4 and plan.loop.out_dir == tmp_path / "run"


def test_after_planning_the_control_world_reads_only_the_plan(tmp_path, monkeypatch):
    """Every read of a config attribute by a module of ``sppo_rl.control`` after ``resolve`` returned
    is recorded (a run with a critic, greedy evaluations, calibration, a checkpoint): there is none.
    The plan's ``given`` is written to ``config.json`` and ``final.pt`` by the run plumbing, not read."""
    import dataclasses

    import sppo_rl.control.trainer as trainer

    planned, reads = [], []

    from sppo_rl.control.config import ControlConfig

    class Watched(ControlConfig):
        def __getattribute__(self, name: str):
            if planned and not name.startswith("__"):
                module = sys._getframe(1).f_globals.get("__name__", "")
                if module.startswith("sppo_rl.control"):
                    reads.append(f"{module}: {name}")
            return super().__getattribute__(name)

    def resolve(cfg):
        plan = real(cfg)
        planned.append(True)
        return plan

    real = trainer.resolve
    monkeypatch.setattr(trainer, "resolve", resolve)
    given = control_config(tmp_path, algo="sppo", total_episodes=64, eval_every=1, eval_episodes=4)
    given = replace(given, calibration_contexts=2, calibration_samples=2)
    summary = run_control(Watched(**{f.name: getattr(given, f.name) for f in dataclasses.fields(given)}))
    assert summary["updates"] == 1 and "final_eval_success_rate" in summary
    assert planned and reads == []


def test_the_run_state_is_what_the_checkpoint_holds(tmp_path):
    """An update returns its row and moves the run's counters (one :class:`RunState`); the checkpoint
    holds them under the keys older checkpoints have, and they come back whole."""
    from dataclasses import asdict

    from sppo_rl.control.trainer import RunState
    from sppo_rl.runtime.checkpoint import torch_load

    run = ControlRun(control_config(tmp_path, algo="grpo", total_episodes=128))
    try:
        assert run.state == RunState()
        row = run.update()
        s = run.state
        assert (s.update, s.episodes, s.env_steps, s.elapsed) == (1, 64, row["env_steps"], row["wall_time_s"])
        saved = torch_load(run.save_checkpoint() / "state.pt")
        assert {k: saved[k] for k in ("update", "episodes", "env_steps", "elapsed")} == asdict(s)
        assert RunState.from_checkpoint(saved) == s
    finally:
        run.close()


QUIET = dict(progress=False, tensorboard=False)


_cfg = partial(control_config, algo="sppo", total_episodes=64, episodes_per_update=16, checkpoint_every=1)


def test_control_schedule_callback_stop_and_exact_resume(tmp_path):
    full = _cfg(tmp_path / "full", lr_schedule="linear")
    run_control(full)
    rows = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    assert [r["learning_rate"] for r in rows] == pytest.approx([3e-4 * f for f in (1.0, 0.75, 0.5, 0.25)])
    ckpt = sorted((tmp_path / "full" / "run" / "checkpoints").iterdir())[-1]
    state = torch_load(ckpt / "state.pt")  # the optimizers ran at the scheduled rates
    assert state["actor_opt"]["param_groups"][0]["lr"] == pytest.approx(3e-4 * 0.25)
    assert state["critic_opt"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.25)

    seen = []

    def stop_after_two(row):
        seen.append(row["update"])
        return row["update"] < 2  # False at update 2

    part = _cfg(tmp_path / "part", lr_schedule="linear")
    summary = run_control(part, callback=stop_after_two)
    assert seen == [1, 2] and summary["stopped_by_callback"] == 2 and summary["updates"] == 2
    assert len(read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")) == 2
    run_control(replace(part, resume=True))  # continues at update 3 with the schedule's lr, not 1.0
    resumed = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    assert strip_timing(resumed, CONTROL_TIMING) == strip_timing(rows, CONTROL_TIMING)
    a = torch_load(tmp_path / "full" / "run" / "final.pt")["actor"]
    b = torch_load(tmp_path / "part" / "run" / "final.pt")["actor"]
    assert all(torch.equal(a[k], b[k]) for k in a), "bit-identical weights"


def test_train_control_callback_none_or_true_does_not_stop(tmp_path):
    calls = []
    policy = api.train_control(
        "short-cartpole", algo="grpo", total_episodes=32, episodes_per_update=16, init_from="none",
        eval_episodes=0, out_dir=str(tmp_path / "r"), callback=lambda row: calls.append(row["episodes"]), **QUIET,
    )  # fmt: skip
    assert calls == [16, 32] and "stopped_by_callback" not in policy.summary
    with pytest.raises(TypeError, match="callback must be a function"):
        api.train_control("short-cartpole", callback=3, out_dir=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_summary_final_is_the_last_tenth_of_the_updates(tmp_path):
    """20 updates: 18 at 0.0, then 1.0 and 0.5. The protocol's final is the mean of the last
    ceil(0.1 * 20) = 2: 0.75; the last 10 updates gave 0.15, the last update 0.5."""
    run = ControlRun(control_config(tmp_path, algo="grpo", total_episodes=64 * 12))
    try:
        rows = [{"update": i + 1, "success_rate": y} for i, y in enumerate([0.0] * 18 + [1.0, 0.5])]
        assert run.finish(rows)["tail_success_rate"] == pytest.approx(0.75)
        # 7 updates (one a row without a success rate, which does not count): the last one
        rows = [{"update": i + 1, "success_rate": y} for i, y in enumerate([0.0] * 6 + [0.25])]
        assert run.finish(rows + [{"update": 8}])["tail_success_rate"] == 0.25
        assert run.finish([])["tail_success_rate"] is None
    finally:
        run.close()


def test_the_summary_is_computed_from_rows_state_and_plan(tmp_path):
    from sppo_rl.control.plan import resolve
    from sppo_rl.control.summary import summary_of
    from sppo_rl.control.trainer import RunState

    plan = resolve(control_config(tmp_path, algo="grpo", seed=7))
    rows = [{"update": 1, "success_rate": 0.25}, {"update": 2, "success_rate": 0.75}]
    state = RunState(update=2, episodes=128, env_steps=1000, elapsed=4.0)
    assert summary_of(rows, state, plan) == {
        "algo": "grpo",
        "task": "short-cartpole",
        "seed": 7,
        "updates": 2,
        "episodes": 128,
        "env_steps": 1000,
        "wall_time_s": 4.0,
        "sps": 250.0,
        "tail_success_rate": 0.75,
    }


def test_headline_summary_and_report_agree(tmp_path, capsys):
    summary = run_control(control_config(tmp_path, algo="grpo", total_episodes=64 * 12))
    out = capsys.readouterr()
    assert "(tail: mean of the last 10% of updates)" in out.out + out.err
    assert "last 10 updates" not in out.out + out.err
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    report = run_report(ReportConfig(inputs=(str(tmp_path / "run"),), out=str(tmp_path / "report")))
    (group,) = report["groups"]
    assert saved["tail_success_rate"] == summary["tail_success_rate"] == group["tail_success_mean"]
