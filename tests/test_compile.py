"""``--compile`` (sppo_rl.control.compiled): the rational tanh, the compiled passes against eager ones,
a compiled run's log-probs recomputed exactly as they were sampled, eager by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from configs import control_config

from sppo_rl.control.compiled import announce, compiled
from sppo_rl.control.networks import (
    TANH_CLIP,
    Actor,
    RationalTanh,
    StepCritic,
    rational_tanh,
    use_rational_tanh,
)
from sppo_rl.control.plan import resolve
from sppo_rl.control.trainer import ControlRun, run_control
from sppo_rl.runtime.logging import read_metrics


def test_rational_tanh_is_tanh_to_float_rounding():
    x = torch.linspace(-20, 20, 400_001)
    y = rational_tanh(x)
    assert (y.double() - torch.tanh(x.double())).abs().max() < 3.6e-7
    assert torch.equal(rational_tanh(-x), -y)  # odd
    assert float(y.abs().max()) <= 1.0
    assert torch.equal(
        rational_tanh(torch.tensor([-1e30, -TANH_CLIP, 0.0, 1e30])), torch.tensor([-1.0, -1.0, 0.0, 1.0])
    )


def test_rational_tanh_backward_is_tanhs():
    """The gradient is ``1 - y^2`` of its own output (as tanh's), not the rational function's derivative."""
    x = torch.randn(1000, dtype=torch.float32) * 3
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    RationalTanh()(a).sum().backward()
    torch.tanh(b).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6)
    y = rational_tanh(x)
    assert torch.equal(a.grad, 1 - y * y)


def test_use_rational_tanh_keeps_the_state_dict():
    a = Actor(4, 2, True)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    use_rational_tanh(a)
    assert not any(isinstance(m, torch.nn.Tanh) for m in a.modules())
    assert sum(isinstance(m, RationalTanh) for m in a.modules()) == 2
    after = a.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in after)


@pytest.mark.parametrize("discrete", [True, False])
def test_compiled_passes_equal_eager_ones(discrete):
    """The compiled actor and critic passes compute what the same modules compute eager (values and
    gradients), at every minibatch size (dynamic shapes)."""
    torch.manual_seed(0)
    actor = Actor(4, 2, discrete)
    critic = StepCritic(4, norm=actor.norm)
    use_rational_tanh(actor)
    use_rational_tanh(critic)
    for n in (7, 300, 1001):
        obs = torch.randn(n, 4) * 2
        acts = torch.randint(0, 2, (n,)) if discrete else torch.randn(n, 2)
        out = {}
        for on in (False, True):
            actor.zero_grad()
            critic.zero_grad()
            lp, ent = compiled(Actor.logp_entropy, on)(actor, obs, acts)
            v = compiled(StepCritic.values, on)(critic, obs)
            (lp.sum() + ent.sum() + v.square().sum()).backward()
            grads = [p.grad.clone() for p in [*actor.parameters(), *critic.body.parameters()]]
            out[on] = (lp.detach(), ent.detach(), v.detach(), grads)
        for x, y in zip(out[False][:3], out[True][:3]):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        for x, y in zip(out[False][3], out[True][3]):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_a_compiled_run_recomputes_the_sampled_log_probs_exactly(tmp_path):
    """Acting and the training pass share the rational tanh (both compiled): the training pass (with
    gradients) recomputes an episode's log-probs to the bit, so the first ratio is 1."""
    run = ControlRun(control_config(tmp_path, algo="ppo", compile="on"))
    assert run.compiled and not any(isinstance(m, torch.nn.Tanh) for m in run.actor.modules())
    ep = run.collect_rollouts().episodes
    logp, _ = run._actor_fn(ep)(
        torch.arange(ep.mask.shape[0]), ep.mask.shape[1]
    )  # with gradients, as trained
    assert logp.requires_grad and torch.equal(logp.detach() * ep.mask, ep.logp * ep.mask)
    run.logger.close()


def test_a_compiled_run_is_the_eager_run_to_float_rounding(tmp_path, capfd):
    """Its first update's rows are the eager run's to float rounding (same episodes, same steps);
    config.json records the setting; one line says it compiles."""
    rows = {}
    announce.cache_clear()  # once per process: this test's run says it again
    for mode in ("off", "on"):
        run_control(control_config(tmp_path, mode, algo="ppo", compile=mode, total_episodes=64))
        rows[mode] = read_metrics(tmp_path / mode / "metrics.jsonl")[0]
        config = json.loads((tmp_path / mode / "config.json").read_text())
        assert config["resolved"]["compiled"] == (mode == "on")
    assert rows["on"]["env_steps"] == rows["off"]["env_steps"]
    for k in ("success_rate", "policy_loss", "value_loss", "entropy", "grad_norm", "critic_grad_norm"):
        assert rows["on"][k] == pytest.approx(rows["off"][k], rel=1e-4, abs=1e-6), k
    assert "--compile on" in capfd.readouterr().err


def test_compile_is_off_unless_asked(tmp_path):
    """Eager is the default (the reference); ``on`` is recorded in the plan."""
    assert not resolve(control_config(tmp_path)).networks.compiled
    assert resolve(control_config(tmp_path, compile="on")).networks.compiled


def test_compile_without_a_cpp_compiler_is_one_line_before_any_file(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler")}
    cmd = [sys.executable, "-m", "sppo_rl", "control", "--task", "short-cartpole", "--compile", "on"]
    p = subprocess.run([*cmd, "--out-dir", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "C++ compiler" in lines[0] and "--compile off" in lines[0], p.stderr
    assert not out.exists()
