"""The Python API (`sppo_rl.api`) and bring-your-own-task (`sppo_rl.envs.custom`): the module docstring's
examples run as written, policies save / load / predict, Gymnasium ids train from Python and the command
line, the success predicate decides the outcomes, and rewards that a worker process could not import are
refused with the reason."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import sppo_rl
from sppo_rl import api
from sppo_rl.cli import main
from sppo_rl.envs.custom import SparseOutcome, SparseOutcomeVectorEnv, register_custom_task
from sppo_rl.envs.tasks import get_task, make_episode_env
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import RunError

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
QUIET = dict(progress=False, tensorboard=False)


def examples() -> list[str]:
    return FENCE.findall(api.__doc__ or "")


def run_example(i: int, namespace: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(examples()[i], f"sppo_rl.api docstring, example {i + 1}", "exec"), namespace)
    return out.getvalue()


# ------------------------------------------------------------------------------- module-level rewards


def always_right(response: str, truth: str) -> float:
    """A reward the integer verifier would never give on an untrained model: proves the callable ran."""
    return 1.0


def first_char_matches(response: str, truth: str) -> float:
    return float(response[:1] == truth[:1])


always_right_alias = always_right


class Scorer:
    def score(self, response: str, truth: str) -> float:
        return 1.0


def shadowed(response: str, truth: str) -> float:
    return 0.0


_original_shadowed = shadowed


def shadowed(response: str, truth: str) -> float:  # noqa: F811 - the name now points elsewhere
    return 1.0


# ------------------------------------------------------------------------------- the package surface


def test_import_sppo_rl_stays_light_and_resolves_the_api_lazily():
    code = (
        "import sys, sppo_rl; assert 'torch' not in sys.modules and 'sppo_rl.api' not in sys.modules, 'eager'; "
        "f = sppo_rl.train_control; assert 'sppo_rl.api' in sys.modules and 'torch' not in sys.modules; "
        "from sppo_rl import LLMPolicy, Policy, SparseOutcome, register_custom_task, train_llm; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert {"train_control", "train_llm", "Policy", "LLMPolicy", "register_custom_task"} <= set(dir(sppo_rl))
    assert sppo_rl.Policy is api.Policy and sppo_rl.SparseOutcome is SparseOutcome
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sppo_rl.nope  # noqa: B018


def test_the_docstring_has_four_five_line_examples():
    blocks = examples()
    assert len(blocks) == 4
    assert [len(b.strip().splitlines()) for b in blocks] == [5, 5, 5, 5]


# ------------------------------------------------------------------------------- the docstring's examples


def test_example_1_control_policy_trains_saves_loads_and_predicts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    printed = run_example(0, ns).split()
    policy, obs = ns["policy"], ns["obs"]
    assert policy.summary["episodes"] == 128 and policy.summary["task"] == "short-cartpole"
    assert policy.run_dir.parent == Path("runs/api") and (tmp_path / policy.run_dir / "final.pt").is_file()
    assert printed == [
        str(policy.predict(obs, deterministic=True)[0]),
        str(policy.summary["tail_success_rate"]),
    ]
    loaded = api.Policy.load("policy.pt")
    batch = np.stack([obs, obs * 0.5, -obs])
    assert np.array_equal(
        loaded.predict(batch, deterministic=True)[0], policy.predict(batch, deterministic=True)[0]
    )
    assert loaded.task == "short-cartpole" and loaded.summary == policy.summary
    run = api.Policy.load(policy.run_dir)  # a run folder: its final.pt, summary.json
    assert run.run_dir == policy.run_dir and run.summary == json.loads(
        (policy.run_dir / "summary.json").read_text()
    )


def test_example_2_own_task_outcomes_come_from_the_predicate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    printed = run_example(1, ns)
    policy = ns["policy"]
    assert policy.summary["task"] == "cartpole-upright" and policy.summary["episodes"] == 64
    assert printed.split()[0] == str(policy.summary["tail_success_rate"])
    assert policy.predict([[0.0, 0.0, 0.01, 0.0, 1.0]] * 3)[0].shape == (3,)
    saved = json.loads((policy.run_dir / "config.json").read_text())
    assert saved["resolved"]["horizon"] == 20 and saved["resolved"]["task"] == "cartpole-upright"
    rows = read_metrics(policy.run_dir / "metrics.jsonl")
    assert all(r["episode_length"] <= 20 for r in rows)
    # the outcomes are the predicate's verdict on each episode's last state: replay 64 random episodes
    env = make_episode_env("cartpole-upright", num_envs=64)
    env.reset(seed=list(range(64)))
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs, _, term, _, info = env.step(rng.integers(0, 2, 64))
    assert term.all()
    upright = ns["upright"]
    want = [  # on each episode's last observation (an ended copy keeps it), the time left dropped
        bool(upright(o[:-1], {}, bool(n < 20), bool(n == 20))) for o, n in zip(obs, info["length"])
    ]
    assert info["success"].tolist() == want and 0 < sum(want) < 64


def test_example_3_llm_trains_on_in_memory_examples_and_generates(tmp_path, monkeypatch, tiny):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"model_dir": str(tiny)}
    printed = run_example(2, ns)
    policy = ns["policy"]
    assert policy.summary["updates"] == 1 and policy.summary["algo"] == "grpo"
    saved = json.loads((policy.run_dir / "config.json").read_text())
    assert saved["reward_fn"] == "sppo_rl.llm.rewards.verify:verify_integer"
    data = Path(saved["task"])
    assert data.parent == policy.run_dir and data.name.startswith("train-") and data.suffix == ".jsonl"
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(lines) == 100 and lines[23] == {"prompt": "2+3=", "answer": "5"}
    assert (tmp_path / "tiny-grpo" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "tiny-grpo" / "generation_config.json").read_text())["max_new_tokens"] == 16
    out = api.LLMPolicy.load("tiny-grpo").generate(["2+3="])
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], str)
    assert printed.startswith(repr(out)) and printed.rstrip().endswith(str(policy.run_dir))


INSTRUCTION = "Answer with just the number."


def saw_the_data_prompt(completions, prompts, rendered_prompts, **columns):
    """TRL-style: 1 when ``prompts`` holds the data's own text and ``rendered_prompts`` that text with the
    run's instruction through the small Llama's ChatML template (``test_pretrained.chatml``, written out:
    the worker imports nothing more)."""
    want = f"<|im_start|>user\n{prompts[0]} {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    return [float(rendered_prompts[0] == want and "<|" not in prompts[0])]


def test_llm_policy_renders_plain_prompts_as_the_run_did(tmp_path):
    """On a small Llama with a chat template and ``instruction``: reward functions saw the data's prompt
    and the rendered one; ``LLMPolicy`` (loaded from the run, from ``final/actor`` copied away, or from
    ``save_pretrained``) renders a plain string as training did, and generates from that text; the model
    card says how."""
    from test_pretrained import build_small_llama, chatml

    llama = build_small_llama(tmp_path / "llama")
    train = [(f"{a}+{a}=", str(2 * a)) for a in range(6)]
    out = tmp_path / "run"
    kw = dict(updates=1, prompts_per_step=2, group_size=2, max_new_tokens=4, instruction=INSTRUCTION, **QUIET)
    api.train_llm(train, reward=saw_the_data_prompt, algo="grpo", model=str(llama), out_dir=str(out), **kw)
    assert read_metrics(out / "metrics.jsonl")[-1]["reward_mean"] == 1.0
    want = chatml(("user", f"3+4= {INSTRUCTION}"))
    policy = api.LLMPolicy.load(out)
    assert policy.prompt_format.instruction == INSTRUCTION and policy.render("3+4=") == [want]
    assert policy.render([[{"role": "user", "content": "3+4="}]]) == [want]  # chat messages alike
    copied = tmp_path / "actor"
    import shutil

    shutil.copytree(out / "final" / "actor", copied)
    saved = policy.save_pretrained(tmp_path / "saved")
    for folder in (copied, saved):  # away from the run folder
        assert api.LLMPolicy.load(folder).render("3+4=") == [want]
    assert policy.generate(["3+4="]) == policy.generate([want], rendered=True)
    card = (out / "final" / "actor" / "README.md").read_text()
    assert INSTRUCTION in card and "apply_chat_template" in card


# ------------------------------------------------------------------------------- Policy


def test_policy_predict_shapes_sampling_and_save_load(tmp_path):
    from sppo_rl.control.actor_files import load_actor_file
    from sppo_rl.control.networks import Actor

    torch.manual_seed(0)
    disc = api.Policy(Actor(5, 3, True), meta={"config": {"task": "x"}})
    obs = np.random.default_rng(0).normal(size=(2, 4, 5)).astype(np.float32)
    act = lambda p, x, **kw: p.predict(x, deterministic=True, **kw)[0]  # noqa: E731  (greedy)
    single = act(disc, obs[0, 0])
    assert single.shape == () and single.dtype == np.int64
    assert act(disc, obs[0]).shape == (4,) and act(disc, obs).shape == (2, 4)
    assert act(disc, obs[0].tolist()).tolist() == act(disc, obs[0]).tolist()  # lists in
    state = torch.get_rng_state()
    act(disc, obs)
    assert torch.equal(state, torch.get_rng_state()), "greedy predict must not draw from torch's global RNG"
    a, state = disc.predict(np.repeat(obs[0, :1], 256, 0), seed=3)  # SB3's default: sampled
    assert state is None and np.array_equal(a, disc.predict(np.repeat(obs[0, :1], 256, 0), seed=3)[0])
    assert np.array_equal(disc.predict(obs, greedy=True)[0], act(disc, obs))  # the older name
    assert len(set(a.tolist())) > 1, "sampling draws different actions"
    with pytest.raises(ValueError, match="takes the task.s 5 features"):
        disc.predict(np.zeros(4))

    cont = api.Policy(Actor(4, 2, False))
    assert act(cont, np.zeros(4)).shape == (2,) and act(cont, np.zeros((3, 4))).shape == (3, 2)
    assert act(cont, np.zeros((3, 4))).dtype == np.float32

    path = disc.save(tmp_path / "sub" / "p.pt")
    back = api.Policy.load(path)
    assert np.array_equal(act(back, obs), act(disc, obs)) and back.task == "x" and back.run_dir is None
    assert isinstance(load_actor_file(path), Actor)  # the project's actor file format


def test_policy_load_refuses_files_that_would_run_code(tmp_path):
    from sppo_rl.control.networks import Actor
    from sppo_rl.runtime.checkpoint import UnsafeCheckpointError

    actor = Actor(5, 2, True)
    path = tmp_path / "evil.pt"
    torch.save(
        {"arch": actor.arch(), "actor": actor.state_dict(), "meta": {"x": types.SimpleNamespace()}}, path
    )
    with pytest.raises(UnsafeCheckpointError, match="weights_only"):
        api.Policy.load(path)
    with pytest.raises(FileNotFoundError, match="no final.pt"):
        api.Policy.load(tmp_path)


# ------------------------------------------------------------------------------- bring your own task


def test_sparse_outcome_follows_the_episode_contract():
    calls = []

    def success(obs, info, terminated, truncated):
        calls.append((obs.shape, terminated, truncated))
        return obs[0] > -10  # always true while the pole stands

    env = SparseOutcome("CartPole-v1", success=success, horizon=5)
    assert env.observation_space.shape == (5,) and env.horizon == 5
    obs, _ = env.reset(seed=0)
    assert obs[-1] == 1.0 and obs.dtype == np.float32
    rewards, times = [], []
    for _ in range(5):
        obs, r, term, trunc, info = env.step(0)
        rewards.append(r)
        times.append(obs[-1])
    assert rewards == [0.0, 0.0, 0.0, 0.0, 1.0] and term and not trunc
    assert times == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.0])
    assert info["success"] is True and info["failed"] is False
    assert calls == [((4,), False, True)], "called once, at the end, with truncated=True at the horizon"
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)

    dense = SparseOutcome("CartPole-v1", success=lambda *a: False, horizon=5, dense=True)
    dense.reset(seed=0)
    assert [dense.step(1)[1] for _ in range(5)] == [1.0] * 5  # CartPole's +1 per step, outcome 0

    # the default rule: survived = truncated by the time limit without terminating
    default = SparseOutcome("CartPole-v1")
    assert default.horizon == 500
    default.reset(seed=0)
    while True:
        _, r, term, _, info = default.step(0)  # always left: the pole falls
        if term:
            break
    assert r == 0.0 and info["success"] is False and info["failed"] is True


def test_vector_env_freezes_ended_copies_and_matches_single_envs():
    make = lambda: gym.make("CartPole-v1")  # noqa: E731 - a factory, one new env per copy
    vec = SparseOutcomeVectorEnv(make, horizon=30, num_envs=4)
    obs, _ = vec.reset(seed=[0, 0, 1, 1])
    assert (
        np.array_equal(obs[0], obs[1])
        and np.array_equal(obs[2], obs[3])
        and not np.array_equal(obs[0], obs[2])
    )
    actions = np.array([[0, 1, 1, 1]] * 30)  # sub-env 0 falls early; the others may survive
    singles = [SparseOutcome(make, horizon=30) for _ in range(4)]
    single_obs = [e.reset(seed=s)[0] for e, s in zip(singles, [0, 0, 1, 1])]
    ended_at = [None] * 4
    for t in range(30):
        before = obs.copy()
        obs, r, term, trunc, info = vec.step(actions[t])
        for i, e in enumerate(singles):
            if ended_at[i] is None:
                single_obs[i], sr, st, _, sinfo = e.step(int(actions[t, i]))
                assert np.array_equal(obs[i], single_obs[i]) and r[i] == sr
                if st:
                    ended_at[i] = t
                    assert info["ended"][i] and info["success"][i] == sinfo["success"]
            else:  # frozen: last observation, reward 0, terminated, not stepped
                assert np.array_equal(obs[i], before[i]) and r[i] == 0.0 and term[i] and not info["ended"][i]
        assert not trunc.any()
        if term.all():
            break
    assert term.all() and ended_at[0] is not None and ended_at[0] < 29
    assert set(info) == {"success", "failed", "ended", "length"}


def test_predicate_decides_success_and_equal_outcomes_skip_the_actor(tmp_path):
    register_custom_task("api-never", "CartPole-v1", success=lambda *a: False, horizon=10)
    register_custom_task("api-always", "CartPole-v1", success=lambda *a: True, horizon=10)
    register_custom_task("api-right", "CartPole-v1", success=lambda o, i, te, tr: o[0] > 0, horizon=10)
    kw = dict(algo="grpo", total_episodes=32, init_from="none", eval_episodes=8, **QUIET)
    never = api.train_control("api-never", out_dir=str(tmp_path / "never"), **kw)
    always = api.train_control("api-always", out_dir=str(tmp_path / "always"), **kw)
    right = api.train_control("api-right", out_dir=str(tmp_path / "right"), **kw)
    for policy, rate in ((never, 0.0), (always, 1.0)):
        rows = read_metrics(policy.run_dir / "metrics.jsonl")
        assert len(rows) == 2 and all(r["success_rate"] == rate and r["actor_skipped"] == 1 for r in rows)
    rows = read_metrics(right.run_dir / "metrics.jsonl")
    assert all(0 < r["success_rate"] < 1 for r in rows) and any(r["actor_skipped"] == 0 for r in rows)


def test_train_control_on_a_plain_gymnasium_id(tmp_path):
    policy = api.train_control(
        "CartPole-v1", algo="grpo", total_episodes=32, init_from="none", eval_episodes=8,
        out_dir=str(tmp_path / "run"), **QUIET,
    )  # fmt: skip
    assert policy.summary["task"] == "CartPole-v1" and policy.summary["episodes"] == 32
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert saved["horizon"] == 500 and saved["episodes_per_update"] == 16 and saved["init_from"] == "none"
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    # a random policy never keeps CartPole up for 500 steps: success (survived) is 0, lengths are short
    assert all(r["success_rate"] == 0.0 and r["episode_length"] < 500 for r in rows)
    obs, _ = SparseOutcome("CartPole-v1").reset(seed=1)
    assert policy.predict(obs)[0] in (0, 1)


def test_cli_control_takes_a_gymnasium_id_and_refuses_one_without_a_horizon(tmp_path, capsys):
    out = tmp_path / "cli"
    main(["control", "--task", "CartPole-v1", "--algo", "grpo", "--total-episodes", "64", "--init-from", "none",
          "--eval-episodes", "8", "--no-progress", "--no-tensorboard", "--out-dir", str(out)])  # fmt: skip
    assert "done: grpo on CartPole-v1" in capsys.readouterr().err
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["episodes"] for r in rows] == [16, 32, 48, 64]
    with pytest.raises(SystemExit) as e:
        main(["control", "--task", "Blackjack-v1", "--no-progress", "--out-dir", str(tmp_path / "bj")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "Blackjack-v1 has no max_episode_steps" in err[0]
        and err[0].startswith("sppo-rl: error:")
    )
    assert not (tmp_path / "bj").exists()


def test_custom_tasks_refuse_what_they_cannot_train_on():
    with pytest.raises(ValueError, match="no max_episode_steps"):
        get_task("Blackjack-v1")
    with pytest.raises(ValueError, match="not a flat Box"):
        get_task("FrozenLake-v1")
    with pytest.raises(ValueError, match="built-in task"):
        register_custom_task("hopper", "CartPole-v1")
    with pytest.raises(TypeError, match="not an env"):
        register_custom_task("x-env", gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="horizon must be"):
        SparseOutcome("CartPole-v1", horizon=0)
    with pytest.raises(ValueError, match="unknown task 'nope'.*register_custom_task"):
        get_task("nope")


# ------------------------------------------------------------------------------- rewards


def test_reward_spec_accepts_importable_functions_and_says_why_it_refuses_others(monkeypatch):
    assert api.reward_spec(None) == "auto" and api.reward_spec("math") == "math"
    assert api.reward_spec(always_right) == f"{__name__}:always_right"
    from sppo_rl.llm.rewards.verify import verify_math

    assert api.reward_spec(verify_math) == "sppo_rl.llm.rewards.verify:verify_math"
    with pytest.raises(ValueError, match=r"is a lambda.*separate worker process.*top level of a \.py module"):
        api.reward_spec(lambda r, t: 1.0)

    def local(r, t):
        return 1.0

    with pytest.raises(ValueError, match="inside another function"):
        api.reward_spec(local)
    with pytest.raises(ValueError, match="not a top-level function"):
        api.reward_spec(Scorer().score)
    with pytest.raises(ValueError, match="is not importable as"):
        api.reward_spec(_original_shadowed)
    notebook = types.ModuleType("__main__")  # an interactive session: no __file__
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    fn = types.FunctionType(always_right.__code__, {}, "in_cell")
    fn.__module__, fn.__qualname__ = "__main__", "in_cell"
    with pytest.raises(ValueError, match="notebook or the interactive interpreter"):
        api.reward_spec(fn)
    script = types.ModuleType("__main__")
    script.__file__ = "/some/where/train.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert api.reward_spec(fn) == "/some/where/train.py:in_cell"


def test_train_llm_refuses_a_lambda_before_touching_anything(tmp_path):
    with pytest.raises(ValueError, match="lambda"):
        api.train_llm([("1+1=", "2")], reward=lambda r, t: 1.0, out_dir=str(tmp_path / "run"))
    with pytest.raises(TypeError, match=r"unknown setting\(s\) stepz"):
        api.train_llm([("1+1=", "2")], stepz=1, out_dir=str(tmp_path / "run"))
    with pytest.raises(TypeError, match="example 1: expected a \\(prompt, answer\\) pair"):
        api.train_llm([("1+1=", "2"), "3"], out_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="--updates must be >= 1"):
        api.train_llm([("1+1=", "2")], updates=0, out_dir=str(tmp_path / "run"))
    with pytest.raises(RunError, match="give --model for other data"):
        api.train_llm([("1+1=", "2")], out_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_train_llm_scores_with_the_callable_and_resumes_with_the_same_examples(tmp_path, tiny):
    train = [(f"{a}+{a}=", str(2 * a)) for a in range(10)]
    val = [("7+1=", "8"), ("2+2=", "4")]
    kw = dict(model=str(tiny), updates=1, prompts_per_step=4, max_new_tokens=4, eval_samples=2, **QUIET)
    out = tmp_path / "run"
    policy = api.train_llm(train, reward=always_right, algo="sppo", val_examples=val, out_dir=str(out), **kw)
    saved = json.loads((out / "config.json").read_text())
    assert saved["reward_fn"] == f"{__name__}:always_right"
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["reward_mean"] == 1.0 and policy.summary["final_val_accuracy"] == 1.0  # the callable's
    assert [json.loads(x)["prompt"] for x in Path(saved["val_data"]).read_text().splitlines()] == [
        "7+1=",
        "2+2=",
    ]
    texts = policy.generate(["1+1=", "2+2=", "3+3="])
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    loaded = api.LLMPolicy.load(out)
    assert loaded.run_dir == out and loaded.summary == policy.summary and loaded.max_new_tokens == 4
    assert loaded.generate(["1+1=", "2+2=", "3+3="]) == texts  # greedy: the same model, the same words
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(
        policy.save_pretrained(tmp_path / "copy"), local_files_only=True
    )
    with pytest.raises(FileExistsError):
        policy.save_pretrained(tmp_path / "copy")

    files = sorted(p.name for p in out.iterdir())
    with pytest.raises(RunError, match="already holds a run"):  # refused before writing anything
        api.train_llm(train[:5], reward=always_right, algo="sppo", out_dir=str(out), **kw)
    assert sorted(p.name for p in out.iterdir()) == files
    with pytest.raises(RunError, match="other settings"):  # other examples: another --task file
        api.train_llm(
            train[:5], reward=always_right, algo="sppo", val_examples=val, out_dir=str(out), resume=True, **kw
        )
    more = api.train_llm(
        train,
        reward=always_right,
        algo="sppo",
        val_examples=val,
        out_dir=str(out),
        resume=True,
        **{**kw, "updates": 2},
    )
    assert (
        more.summary["updates"] == 2 and [r["update"] for r in read_metrics(out / "metrics.jsonl")][-1] == 2
    )
    again = api.train_llm(
        train, reward=first_char_matches, algo="sppo", out_dir=str(out), overwrite=True, **kw
    )  # overwrite clears the folder after the trainer read the data: the data file is put back
    assert (
        Path(json.loads((out / "config.json").read_text())["task"]).is_file()
        and again.summary["updates"] == 1
    )


# ------------------------------------------------------------------------------- SB3 habits


def _policy(H: int = 5):
    """A continuous policy: its greedy action (the Gaussian mean) moves with every input, the time left too."""
    from sppo_rl.control.networks import Actor

    torch.manual_seed(0)
    meta = {"config": {"task": "Pendulum-v1"}, "observation": {"horizon": H, "appended": "(H - t) / H"}}
    return api.Policy(Actor(5, 1, False), meta=meta)


def test_predict_on_the_env_observation_counts_the_steps_itself():
    policy = _policy(H=5)

    def mean(x, time_left):  # the actor on the task's observation, built by hand
        with torch.no_grad():
            return policy.actor(torch.from_numpy(np.r_[x, time_left][None].astype(np.float32))).numpy()[0]

    xs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    ref = [mean(x, (5 - t) / 5) for t, x in enumerate(xs)]
    assert not np.array_equal(mean(xs[0], 1.0), mean(xs[0], 0.8)), "the time left moves the action"
    act = lambda x, **kw: policy.predict(x, deterministic=True, **kw)[0]  # noqa: E731
    own = [act(x, episode_start=t == 0) for t, x in enumerate(xs)]  # the env's own 4 features
    assert all(np.array_equal(a, b) for a, b in zip(own, ref))  # the time left computed inside
    with pytest.raises(ValueError, match="step 6 of an episode of horizon 5.*episode_start"):
        act(xs[0], episode_start=False)
    assert np.array_equal(act(xs[0], episode_start=True), ref[0])  # a new episode: t = 0
    assert np.array_equal(act(np.r_[xs[3], 0.4]), ref[3])  # the task's observation: as is
    # a batch keeps one counter per row; episode_start per row restarts only those rows
    policy.reset()
    batch = np.stack([xs[1], xs[1]])
    act(batch, episode_start=True)
    second = act(batch, episode_start=[True, False])
    # (a batch of two rounds differently from one row: equal to float32 precision)
    assert np.allclose(second[0], mean(xs[1], 1.0), rtol=1e-6, atol=1e-7)
    assert np.allclose(second[1], mean(xs[1], 0.8), rtol=1e-6, atol=1e-7)
    assert not np.allclose(second[0], second[1], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="the env's own 4"):
        policy.predict(np.zeros(3))


SB3_LOOP = """
obs, info = env.reset(seed=0)
for _ in range(60):
    action, _states = model.predict(obs, deterministic=True)
    obs, reward, terminated, truncated, info = env.step(action)
    if terminated or truncated:
        obs, info = env.reset()
"""
"""Stable-Baselines3's basic-usage loop (its README and "Getting Started" page, the Gymnasium form)."""


def _cartpole_policy(H: int):
    """A random discrete policy for CartPole's 4 features plus the time left, with horizon ``H``."""
    from sppo_rl.control.networks import Actor

    torch.manual_seed(1)
    meta = {"config": {"task": "CartPole-v1"}, "observation": {"horizon": H, "appended": "(H - t) / H"}}
    return api.Policy(Actor(5, 2, True), meta=meta)


def test_sb3s_usage_loop_runs_unchanged_on_a_wrapped_env_and_is_refused_unwrapped():
    """SB3's loop: ``action, _states = model.predict(obs, deterministic=True)`` with Gymnasium's
    reset/step. On ``policy.wrap(env)`` it runs as written, the time left restarting at each reset and
    the episode cut at ``H`` (its actions equal ``predict`` with ``episode_start`` marked by hand on the
    plain env, across episode ends); on the plain env it is refused at the first call, naming the fix."""
    import gymnasium as gym

    H = 9
    policy = _cartpole_policy(H)
    seen: list = []

    class Recording(gym.Wrapper):
        def step(self, action):
            seen.append(int(action))
            return super().step(action)

    env = policy.wrap(Recording(gym.make("CartPole-v1")))
    assert env.observation_space.shape == (5,)
    exec(SB3_LOOP, {"env": env, "model": policy})
    plain = gym.make("CartPole-v1")
    obs, _ = plain.reset(seed=0)
    want, t, ends = [], 0, 0
    for _ in range(60):
        action, state = policy.predict(obs, episode_start=t == 0, deterministic=True)
        assert state is None
        want.append(int(action))
        obs, _, terminated, _, _ = plain.step(action)
        t += 1
        if terminated or t == H:
            obs, _ = plain.reset()
            t, ends = 0, ends + 1
    assert seen == want and ends >= 6
    with pytest.raises(ValueError, match="without episode_start.*policy.wrap"):
        exec(SB3_LOOP, {"env": gym.make("CartPole-v1"), "model": policy})


def test_sb3s_own_evaluate_policy_runs_our_policy_on_the_plain_env():
    """``stable_baselines3.common.evaluation.evaluate_policy`` (a VecEnv, ``predict(obs, state=...,
    episode_start=..., deterministic=...)``) on the plain env gives the returns of this project's
    ``evaluate_policy`` (same seeds, deterministic), both calling ``predict`` SB3's way."""
    import gymnasium as gym
    from stable_baselines3.common.evaluation import evaluate_policy as sb3_evaluate
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    policy = _cartpole_policy(500)
    vec = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1"))])
    vec.seed(3)
    returns, lengths = sb3_evaluate(
        policy, vec, n_eval_episodes=1, deterministic=True, return_episode_rewards=True
    )
    ours = api.evaluate_policy(policy, "CartPole-v1", n_eval_episodes=1, deterministic=True, seed=3)
    assert lengths == list(ours.lengths) and returns == list(ours.returns) and 5 < lengths[0] < 500


def test_a_trained_policy_predicts_and_evaluates_on_plain_cartpole(tmp_path):
    policy = api.train_control(
        "CartPole-v1", algo="grpo", total_episodes=16, init_from="none", eval_episodes=4,
        out_dir=str(tmp_path / "run"), **QUIET,
    )  # fmt: skip
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)  # 4 features: raised "takes 5 features" before
    assert policy.predict(obs, episode_start=True)[0] in (0, 1)
    assert Path(api.Policy.load(tmp_path / "run").run_dir) == tmp_path / "run"
    ev = api.evaluate_policy(policy, env, n_eval_episodes=3, seed=10)
    assert ev.returns == tuple(float(n) for n in ev.lengths), "CartPole pays +1 per step"
    assert ev.success_rate == 0.0 and ev.successes == (False, False, False)  # never 500 steps
    mean, std = ev  # unpacks like SB3's (mean, std)
    assert mean == pytest.approx(np.mean(ev.lengths)) and std == pytest.approx(np.std(ev.lengths))
    # the same seeds on the task env give the same episodes (success from its info)
    task_env = get_task("CartPole-v1").load()()
    ev2 = api.evaluate_policy(policy, task_env, n_eval_episodes=3, seed=10)
    assert ev2.lengths == ev.lengths and ev2.success_rate == 0.0 and ev2.returns == (0.0, 0.0, 0.0)


def test_evaluate_policy_on_mountaincar_hand_numbers():
    from sppo_rl.control.networks import Actor

    torch.manual_seed(0)
    meta = {"config": {"task": "MountainCar-v0"}, "observation": {"horizon": 200, "appended": "(H - t) / H"}}
    policy = api.Policy(Actor(3, 3, True), meta=meta)  # untrained: never reaches the flag
    ev = api.evaluate_policy(policy, "MountainCar-v0", n_eval_episodes=2, seed=0)
    assert ev.returns == (-200.0, -200.0) and ev.std_return == 0.0 and ev.lengths == (200, 200)
    assert ev.success_rate == 0.0, "judged by the stock rule (goal reached), not by surviving"
    with pytest.raises(ValueError, match="n_eval_episodes"):
        api.evaluate_policy(policy, "MountainCar-v0", n_eval_episodes=0)


def test_api_docstring_sb3_example_runs_as_written(tmp_path, monkeypatch):
    import contextlib
    import io
    import re

    monkeypatch.chdir(tmp_path)
    code = re.findall(r"^```python\n(.*?)^```", api.__doc__, re.S | re.M)[3]
    assert "evaluate_policy" in code
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "sppo_rl.api docstring, example 4", "exec"), ns)
    policy = ns["policy"]
    assert policy.summary["episodes"] == 32 and "stopped_by_callback" not in policy.summary
    rows = read_metrics(policy.run_dir / "metrics.jsonl")
    assert [r["learning_rate"] for r in rows] == pytest.approx([3e-4, 1.5e-4])  # linear over 2 updates
    action, mean = out.getvalue().split()
    assert int(action) in (0, 1) and float(mean) == round(ns["mean"], 1)
    assert api.evaluate_policy(policy, ns["env"], 5, seed=0).mean_return == ns["mean"]  # seeded: repeatable
