"""Logging conventions: CleanRL's TensorBoard names with env steps on the x-axis (control), verl / TRL
names with the update step on the x-axis (LLM), and wandb runs named, grouped and tagged like theirs."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
from configs import grpo_pairs_config

from sppo_rl.config import WandB
from sppo_rl.control.config import ControlConfig
from sppo_rl.llm.trainer import run_llm
from sppo_rl.runtime.logging import RunLogger, read_metrics, start_logging, tb_tag


def _tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``log_dir``: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tag_tables():
    assert tb_tag("sps", "control") == "charts/SPS"
    assert tb_tag("return", "control") == "charts/episodic_return"
    assert tb_tag("episode_length", "control") == "charts/episodic_length"
    assert tb_tag("policy_loss", "control") == "losses/policy_loss"
    assert tb_tag("success_rate", "control") == "charts/success_rate"
    assert tb_tag("val_accuracy", "llm") == "val/accuracy"
    assert tb_tag("val_greedy_accuracy", "llm") == "val/greedy_accuracy"
    assert tb_tag("policy_loss", "llm") == "actor/policy_loss"
    assert tb_tag("ratio_max", "llm") == "actor/ratio_max"
    assert tb_tag("critic_grad_norm", "llm") == "critic/grad_norm"
    assert tb_tag("v0_brier", "llm") == "critic/v0_brier"
    assert tb_tag("time_gen_s", "llm") == "timing/gen_s"
    assert tb_tag("response_length", "llm") == "response/length"
    assert tb_tag("reward_mean", "llm") == "reward/mean"
    assert tb_tag("sps") == "charts/sps" and tb_tag("entropy") == "losses/entropy"  # no world: as before
    with pytest.raises(ValueError, match="unknown logging world"):
        tb_tag("sps", "atari")


def test_control_run_logs_cleanrl_tags_over_env_steps(tmp_path):
    from sppo_rl.control.trainer import run_control

    out = tmp_path / "run"
    cfg = ControlConfig(
        task="short-cartpole", algo="ppo", total_episodes=128, init_from="none", out_dir=str(out),
        progress=False, tensorboard=True, eval_episodes=0,
    )  # fmt: skip
    run_control(cfg)
    rows = read_metrics(out / "metrics.jsonl")
    assert {"sps", "return", "episode_length", "episodes", "env_steps"} <= set(rows[0])  # keys as before
    scalars = _tb_scalars(out / "tb")
    env_steps = [r["env_steps"] for r in rows]
    assert env_steps != [r["episodes"] for r in rows]  # the two axes differ, so the test can tell them apart
    assert [s for s, _ in scalars["charts/SPS"]] == env_steps
    assert [v for _, v in scalars["charts/episodes"]] == [r["episodes"] for r in rows]
    for tag in (
        "charts/episodic_return", "charts/episodic_length", "charts/success_rate", "losses/policy_loss",
        "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac", "losses/explained_variance",
    ):  # fmt: skip
        assert [s for s, _ in scalars[tag]] == env_steps, tag
    assert "charts/sps" not in scalars and "charts/return" not in scalars


def test_llm_run_logs_verl_tags_over_update_steps(tiny_run):
    # tiny_run trains the actor even when every reward is equal: the actor's tags must appear
    scalars = _tb_scalars(tiny_run / "tb")
    assert [s for s, _ in scalars["actor/policy_loss"]] == [1, 2]
    assert [s for s, _ in scalars["actor/entropy"]] == [1, 2]
    assert [s for s, _ in scalars["val/accuracy"]] == [0, 1, 2]  # before training, then every update
    for tag in ("critic/bce", "reward/mean", "response/length", "timing/step_s", "perf/gen_tokens_per_s"):
        assert [s for s, _ in scalars[tag]] == [1, 2], tag
    assert not [t for t in scalars if t.startswith(("charts/", "losses/"))]


class _FakeWandb(types.ModuleType):
    """A ``wandb`` module that records ``init``'s arguments and the logged rows (no network, no files)."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.logged: list[tuple[dict, int]] = []

    def init(self, **kw):
        self.inits.append(kw)
        fake = self

        class Run:
            def log(self, data, step):
                fake.logged.append((data, step))

            def finish(self):
                pass

        return Run()


def test_wandb_run_is_named_grouped_and_tagged(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    base = dict(task="short-cartpole", algo="ppo", seed=3, tensorboard=False)
    cfg = ControlConfig(**base, wandb=WandB(enabled=True, entity="team", group="sweep-a", tags=("x", "y")))
    out = tmp_path / "a"
    out.mkdir()
    logger = start_logging(out, cfg, {}, None, world="control")
    logger.log({"sps": 10.0, "episodes": 4, "env_steps": 99}, step=99)
    logger.close()
    kw = fake.inits[-1]
    assert kw["name"] == "short-cartpole/ppo/seed3"
    assert (kw["group"], kw["tags"], kw["entity"], kw["mode"]) == ("sweep-a", ["x", "y"], "team", "offline")
    assert fake.logged == [({"charts/SPS": 10.0, "charts/episodes": 4, "charts/env_steps": 99}, 99)]
    out = tmp_path / "b"
    out.mkdir()
    start_logging(
        out, ControlConfig(**base, wandb=WandB(enabled=True), exp_name="mine"), {}, None, world="control"
    ).close()
    kw = fake.inits[-1]
    assert kw["name"] == "mine" and kw["group"] is None and kw["tags"] is None and kw["entity"] is None
    RunLogger(tmp_path / "c", tensorboard=False, wandb=WandB(enabled=True)).close()
    assert fake.inits[-1]["name"] == "c"  # a bare logger: the folder's name, as before


def test_new_wandb_settings_are_checked():
    assert ControlConfig(wandb=WandB(tags=("a",), group="g", entity="e"), exp_name="n").problems() == []
    problems = " ".join(ControlConfig(wandb=WandB(tags=("",), entity=""), exp_name=" ").problems())
    assert "--wandb-tags" in problems and "--exp-name" in problems and "--wandb-entity" in problems
    assert ControlConfig(wandb=WandB(tags=("t" * 65,))).problems()


def test_sweep_groups_its_runs_by_folder(tmp_path):
    from sppo_rl.experiments.config import SweepConfig
    from sppo_rl.experiments.sweep import parse_control, plan

    kw = dict(algos=("ppo",), tasks=("short-cartpole",), seeds=(0, 1), out_dir=str(tmp_path / "my-sweep"))
    (job,) = plan(SweepConfig(**kw))  # both seeds in one process: each seed's run inherits its group
    assert parse_control(job.args).wandb.group == "my-sweep" and job.name == "short-cartpole/ppo/seeds0,1"
    jobs = plan(SweepConfig(**kw, batch_seeds=False))
    assert [parse_control(j.args).wandb.group for j in jobs] == ["my-sweep", "my-sweep"]
    assert [j.name for j in jobs] == ["short-cartpole/ppo/seed0", "short-cartpole/ppo/seed1"]
    mine = dict(overrides={"wandb-group": "mine"}, batch_seeds=False)  # the user's group wins
    jobs = plan(SweepConfig(**kw, **mine))
    assert [parse_control(j.args).wandb.group for j in jobs] == ["mine", "mine"]
    assert jobs[0].args.count("--wandb-group") == 1


def test_resumed_control_run_keeps_the_events_before_its_checkpoint(tmp_path):
    import shutil

    from sppo_rl.control.trainer import run_control

    out = tmp_path / "run"
    kw = dict(
        task="short-cartpole", algo="ppo", init_from="none", out_dir=str(out), progress=False, eval_episodes=0
    )
    run_control(ControlConfig(**kw, total_episodes=128, checkpoint_every=1))
    full = [r["env_steps"] for r in read_metrics(out / "metrics.jsonl")]
    (out / "summary.json").unlink()  # as if killed after the first checkpoint: the second update is redone
    shutil.rmtree(out / "checkpoints" / "ckpt-000000002")
    # TensorBoard reads event files in name order, and a name holds the second it was opened: a resumed
    # run's file opened within the same second as the first may sort before it (then its purge comes
    # first and purges nothing). A user's resume comes seconds later at least.
    time.sleep(1.1)
    run_control(ControlConfig(**kw, total_episodes=128, checkpoint_every=1, resume=True))
    steps = [s for s, _ in _tb_scalars(out / "tb")["charts/SPS"]]
    assert steps == [r["env_steps"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps[0] == full[0] and len(steps) == 2


# ------------------------------------------------------------------------------------- completions


def test_clip_text_bounds_a_text_and_says_how_much_it_cut():
    from sppo_rl.llm.outputs.completions import clip_text

    assert clip_text("abc", 3) == "abc"
    assert clip_text("x" * 2500) == "x" * 2000 + " ... [+500 characters]"


def test_completions_are_logged_at_evaluations_and_every_n_updates(tmp_path, tiny, rewards):
    cfg = grpo_pairs_config(
        tmp_path, tiny, reward_fn=f"{rewards}:even", updates=3, eval_every=3, log_completions_every=2
    )
    run_llm(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    by = {(r["split"], r["update"]) for r in rows}
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

    cfg = grpo_pairs_config(
        tmp_path, tiny, reward_fn=f"{rewards}:even", updates=1, tensorboard=True, log_completions_every=1
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
    run_llm(
        grpo_pairs_config(
            tmp_path, tiny, reward_fn=f"{rewards}:even", updates=1, eval_every=1, log_completions_every=0
        )
    )
    assert not (tmp_path / "run" / "completions.jsonl").exists()
