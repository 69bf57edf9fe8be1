"""``--threads``: the LLM world's auto default (0) and how it resolves, the control world's floor of 1, and
runs side by side in a sweep getting one thread each."""

from __future__ import annotations

import os

import pytest

from sppo_rl.config import ConfigError
from sppo_rl.control.config import ControlConfig
from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.plan import PRECISION_MIN_BYTES, threads_of

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_auto_threads_take_every_cpu_for_a_pretrained_model_and_one_for_a_small_one(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    small, big = tmp_path / "small", tmp_path / "big"
    for folder, size in ((small, 1024), (big, PRECISION_MIN_BYTES)):
        folder.mkdir()
        with open(folder / "model.safetensors", "wb") as f:  # sparse: the size is what the rule reads
            f.truncate(size)
    assert LLMConfig().threads == 0  # auto by default
    assert threads_of(LLMConfig(), None) == 1  # the embedded tiny model
    assert threads_of(LLMConfig(model=str(small)), small) == 1
    assert threads_of(LLMConfig(model=str(big)), big) == CPUS
    assert threads_of(LLMConfig(model="smollm2-135m"), None) == CPUS  # a named model
    assert threads_of(LLMConfig(model="smollm2-135m", threads=3), None) == 3  # as given
    worker = LLMConfig(model="smollm2-135m", max_staleness=1, rollout_threads=1)
    assert threads_of(worker, None) == max(1, CPUS - 1)  # the rollout worker's thread left to it
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks on this machine share its CPUs
    assert threads_of(LLMConfig(model="smollm2-135m"), None) == max(1, CPUS // 2)


def test_zero_threads_is_auto_for_llm_runs_and_refused_for_control_runs():
    LLMConfig(threads=0).validate()
    with pytest.raises(ConfigError, match=r"--threads must be in \[1, "):
        ControlConfig(threads=0).validate()
    with pytest.raises(ConfigError, match=r"--threads must be in \[0, .*0: auto"):
        LLMConfig(threads=-1).validate()


def test_runs_side_by_side_get_one_thread_each_unless_their_flags_say(tmp_path):
    from sppo_rl.experiments.sweep import llm_jobs

    jobs = llm_jobs(
        [("a", 0, ["--algo", "sppo", "--updates", "2"]), ("b", 0, ["--algo", "sppo", "--threads", "2"])],
        tmp_path,
        threads=1,
    )
    assert jobs[0].args[jobs[0].args.index("--threads") + 1] == "1"
    assert jobs[1].args.count("--threads") == 1 and jobs[1].args[jobs[1].args.index("--threads") + 1] == "2"
    (alone,) = llm_jobs([("c", 0, ["--algo", "sppo"])], tmp_path / "alone")
    assert "--threads" not in alone.args
