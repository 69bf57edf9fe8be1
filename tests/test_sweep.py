"""``sppo-rl sweep``: real control subprocesses, failures isolated, resume of only what is left, Ray."""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from paths import REPO

from sppo_rl.agents.algorithms import ALGORITHMS
from sppo_rl.control.config import ControlConfig
from sppo_rl.envs.tasks import TASKS
from sppo_rl.experiments.config import ReportConfig, SweepConfig
from sppo_rl.experiments.report import run_report
from sppo_rl.experiments.sweep import (
    control_flags,
    llm_config,
    llm_jobs,
    parse_control,
    plan,
    run_job,
    sweep,
)
from sppo_rl.runtime.logging import read_metrics

QUICK = {
    "epochs": "1",
    "minibatches": "2",
    "tensorboard": "false",
    "eval-episodes": "0",
    "init-from": "none",
    "checkpoint-every": "1",
}
TIMING = {"wall_time_s", "sps", "update_sps", "collect_frac"}


def _cfg(out: Path, **kw) -> SweepConfig:
    base = dict(
        algos=("ppo", "sppo"),
        tasks=("short-cartpole",),
        seeds=(0, 1),
        total_episodes=128,
        overrides=dict(QUICK),
        workers=2,
        out_dir=str(out),
        progress=False,
    )
    base.update(kw)
    return SweepConfig(**base)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sppo_rl", "sweep", *args], capture_output=True, text=True, timeout=timeout
    )


def _cli_args(out: Path, budget: int = 128, algos=("ppo", "sppo"), seeds=("0", "1")) -> list[str]:
    overrides = [f"{k}={v}" for k, v in QUICK.items()]
    return [
        "--algos", *algos, "--tasks", "short-cartpole", "--seeds", *seeds, "--workers", "2",
        "--total-episodes", str(budget), "--out-dir", str(out), "--no-progress", "--overrides", *overrides,
    ]  # fmt: skip


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _line(stdout: str, algo: str, seed: int) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.split()[1:3] == [algo, str(seed)]]
    return line


def test_sweep_isolates_a_failure_then_finishes_only_what_is_left(tmp_path):
    out = tmp_path / "sweep"
    runs = {(a, s): out / "short-cartpole" / a / f"seed{s}" for a in ("ppo", "sppo") for s in (0, 1)}
    # sppo seed 1 holds a corrupt checkpoint: its resume fails, the other three runs must not care
    bad = runs["sppo", 1] / "checkpoints" / "ckpt-000000001"
    bad.mkdir(parents=True)
    (bad / "meta.json").write_text('{"step": 1, "metrics_bytes": 0}')
    (bad / "state.pt").write_bytes(b"not a checkpoint")
    (runs["sppo", 1] / "metrics.jsonl").write_text("")  # what the checkpoint recorded: 0 bytes

    proc = _cli(*_cli_args(out), "--no-batch-seeds")  # a process per seed (the batched path: below)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "1 of 4 runs did not finish" in proc.stderr and "Traceback" not in proc.stderr
    assert "failed" in _line(proc.stdout, "sppo", 1) and str(runs["sppo", 1] / "log.txt") in proc.stdout
    assert "--resume" in (runs["sppo", 1] / "log.txt").read_text()
    for key in [("ppo", 0), ("ppo", 1), ("sppo", 0)]:
        assert "done" in _line(proc.stdout, *key)
        assert (runs[key] / "summary.json").is_file()
        rows = read_metrics(runs[key] / "metrics.jsonl")
        assert [r["update"] for r in rows] == [1, 2] and rows[-1]["episodes"] == 128
        saved = json.loads((runs[key] / "config.json").read_text())
        assert saved["epochs"] == 1 and saved["tensorboard"] is False and saved["seed"] == key[1]
        assert "--no-progress" in (runs[key] / "log.txt").read_text()
    assert (runs["sppo", 0] / "calibration.json").is_file()
    manifest = json.loads((out / "sweep.json").read_text())
    assert [j["name"] for j in manifest["jobs"]] == [
        "short-cartpole/ppo/seed0",
        "short-cartpole/sppo/seed0",
        "short-cartpole/ppo/seed1",
        "short-cartpole/sppo/seed1",
    ]
    assert [r["status"] for r in manifest["results"]] == ["done", "done", "done", "failed"]

    # interrupted in four ways, then the same sweep again
    a, b, c, d = runs["ppo", 0], runs["ppo", 1], runs["sppo", 0], runs["sppo", 1]
    a_rows = read_metrics(a / "metrics.jsonl")
    a_first = (a / "metrics.jsonl").read_text().splitlines()[0]
    (a / "summary.json").unlink()  # killed between update 1's checkpoint and update 2's
    shutil.rmtree(a / "checkpoints" / "ckpt-000000002")
    (b / "summary.json").unlink()  # only checkpoints left, the last one from update 1
    for p in [b / "metrics.jsonl", b / "config.json", b / "final.pt", b / "checkpoints" / "ckpt-000000002"]:
        p.unlink() if p.is_file() else shutil.rmtree(p)
    (c / "summary.json").unlink()  # killed before its first checkpoint, metrics torn
    shutil.rmtree(c / "checkpoints")
    (c / "metrics.jsonl").write_text(a_first + '\n{"update": 2, "epi')
    shutil.rmtree(d / "checkpoints")  # the corrupt checkpoint is gone: a fresh start
    (d / "metrics.jsonl").unlink()

    results = sweep(_cfg(out, batch_seeds=False))
    assert [(r.status, r.mode) for r in results] == [
        ("resumed", "resume"),
        ("done", "overwrite"),
        ("done", "overwrite"),  # checkpoints whose metrics are gone: started again, not glued
        ("done", "fresh"),
    ]
    rows = read_metrics(a / "metrics.jsonl")
    assert (a / "metrics.jsonl").read_text().splitlines()[0] == a_first  # kept byte for byte
    assert _strip(rows) == _strip(a_rows)  # the resumed run is the uninterrupted one
    assert (a / "log.txt").read_text().count("=== ") == 2
    assert [r["update"] for r in read_metrics(b / "metrics.jsonl")] == [1, 2]  # the whole run again
    assert [r["update"] for r in read_metrics(c / "metrics.jsonl")] == [1, 2]
    assert all((p / "summary.json").is_file() for p in runs.values())

    mtimes = {k: (p / "metrics.jsonl").stat().st_mtime_ns for k, p in runs.items()}
    assert [r.status for r in sweep(_cfg(out, batch_seeds=False))] == ["skipped"] * 4
    assert mtimes == {k: (p / "metrics.jsonl").stat().st_mtime_ns for k, p in runs.items()}

    # the report reads the sweep folder
    report = run_report(ReportConfig(inputs=(str(out),), smooth=1))
    assert [(g["algo"], g["seeds"], g["finished"]) for g in report["groups"]] == [
        ("ppo", 2, 2),
        ("sppo", 2, 2),
    ]
    (cal,) = report["calibration"]
    assert cal["algo"] == "sppo" and cal["runs"] == 2 and cal["start_states"] == 128
    assert {"success_vs_episodes.png", "success_vs_wall_time.png", "calibration.png"} <= {
        p.name for p in (out / "report").iterdir()
    }


@pytest.mark.slow  # about 15 s; the default suite simulates the interruptions instead
def test_sigterm_stops_the_sweep_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "sweep"
    args = _cli_args(out, budget=64 * 150, algos=("ppo",), seeds=("0",))
    args[args.index("checkpoint-every=1")] = "checkpoint-every=5"
    run = out / "short-cartpole" / "ppo" / "seed0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sppo_rl", "sweep", *args], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list((run / "checkpoints").glob("ckpt-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted" in _line(stdout, "ppo", 0)
    assert not (run / "summary.json").exists(), "the run finished before the signal; give it a bigger budget"
    done = [r["update"] for r in read_metrics(run / "metrics.jsonl")]

    again = _cli(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed" in _line(again.stdout, "ppo", 0)
    assert [r["update"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 151))
    assert len(done) < 150


def test_a_sigterm_stopped_sweep_exits_143_not_2(tmp_path):
    """A scheduler tells preemption from a bad flag by the exit status: 128 + SIGTERM, one line saying
    what stopped the sweep. Before: 2, the status of a user mistake."""
    out = tmp_path / "sweep"
    args = _cli_args(out, budget=64 * 1000, algos=("ppo",), seeds=("0",))
    run = out / "short-cartpole" / "ppo" / "seed0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sppo_rl", "sweep", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stdout + stderr
    assert "interrupted" in _line(stdout, "ppo", 0)
    assert (
        stderr.strip().splitlines()[-1].startswith("sppo-rl: stopped by SIGTERM: 1 of 1 runs did not finish")
    )


def test_a_run_held_by_another_process_is_busy_not_restarted(tmp_path):
    (job,) = plan(_cfg(tmp_path, algos=("ppo",), seeds=(0,)))
    Path(job.out_dir).mkdir(parents=True)
    fd = os.open(Path(job.out_dir) / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        result = run_job(job)
    finally:
        os.close(fd)
    assert result.status == "busy" and not (Path(job.out_dir) / "log.txt").exists()


@pytest.mark.slow
def test_ray_backend_runs_the_jobs(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        cfg = _cfg(tmp_path, algos=("sppo",), backend="ray")
        assert [r.status for r in sweep(cfg)] == ["done"]  # seeds 0 and 1 in one process
        for seed in (0, 1):
            run = tmp_path / "short-cartpole" / "sppo" / f"seed{seed}"
            assert json.loads((run / "summary.json").read_text())["episodes"] == 128
        assert [r.status for r in sweep(cfg)] == ["skipped"]
        assert ray.is_initialized(), "the sweep must not shut down a Ray instance it did not start"
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_backend_from_the_command_line_with_its_own_local_instance(tmp_path):
    proc = _cli(*_cli_args(tmp_path, algos=("ppo",)), "--backend", "ray", "--ray-address", "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all((tmp_path / "short-cartpole" / "ppo" / f"seed{s}" / "summary.json").is_file() for s in (0, 1))


@pytest.mark.parametrize(
    "kw,match",
    [
        (
            dict(algos=("ppo", "bogus")),
            "unknown algorithm\\(s\\): bogus; valid: " + re.escape(", ".join(ALGORITHMS)),
        ),
        (dict(tasks=("short-cartpole", "nope")), "unknown task\\(s\\): nope; valid: " + ", ".join(TASKS)),
        (dict(budgets={"hopper": 100}), "--budgets names task\\(s\\) not in --tasks: hopper"),
        (dict(overrides={"epoch": "1"}), "epoch: not a control setting; valid: .*hidden-sizes"),
        (dict(overrides={"seed": "3"}), "seed: set by the sweep"),
        (dict(overrides={"tensorboard": "maybe"}), "expected true or false"),
        (dict(overrides={"epochs": "many"}), "control refuses"),
        (dict(workers=0), "--workers"),
        (dict(budgets={"short-cartpole": 0}), "budgets must be >= 1 episode: short-cartpole=0"),
        (dict(seeds=()), "at least one"),
        (
            dict(primary="acc_at_tokens"),
            "--primary acc_at_tokens: not a control statistic; valid: .*acc_at_env_steps",
        ),
        (dict(margin=0.0), "--margin must be in \\(0, 1\\)"),
    ],
)
def test_bad_settings_are_refused_before_any_run(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        sweep(_cfg(tmp_path / "sweep", **kw))
    assert not (tmp_path / "sweep").exists()


def test_cli_refuses_unknown_names_clearly(tmp_path):
    proc = _cli("--algos", "ppo", "bogus", "--tasks", "short-cartpole", "--out-dir", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert "unknown algorithm(s): bogus; valid: ppo, sppo" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


def test_a_folder_with_other_settings_is_refused(tmp_path):
    run = tmp_path / "short-cartpole" / "ppo" / "seed0"
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps({"algo": "ppo", "total_episodes": 64, "epochs": 1, "threads": 4})
    )
    with pytest.raises(ValueError, match="other settings \\(total_episodes: 64 there, 128 now\\)"):
        plan(_cfg(tmp_path, seeds=(0,)))
    plan(_cfg(tmp_path, seeds=(0,), total_episodes=64))  # threads is bookkeeping: no refusal


def test_overrides_become_control_flags():
    flags = control_flags(
        {
            "hidden-sizes": "32, 16",
            "tensorboard": "false",
            "clip_high": "None",
            "extra": "k v",
            "actor-lr": 1e-3,
        }
    )
    assert flags[:4] == ["--hidden-sizes", "32", "16", "--no-tensorboard"]
    cfg = parse_control(flags)
    assert cfg == replace(
        ControlConfig(),
        hidden_sizes=(32, 16),
        tensorboard=False,
        clip_high=None,
        extra={"k": "v"},
        actor_lr=1e-3,
    )


def test_budgets_per_task_and_the_control_default(tmp_path):
    jobs = plan(
        _cfg(tmp_path, tasks=("short-cartpole", "cartpole"), algos=("ppo",), budgets={"cartpole": 640})
    )
    budget = {j.task: j.args[j.args.index("--total-episodes") + 1] for j in jobs}
    assert budget == {"short-cartpole": "128", "cartpole": "640"}
    (job,) = plan(_cfg(tmp_path, algos=("ppo",), seeds=(0,), total_episodes=None))
    assert job.args[job.args.index("--total-episodes") + 1] == str(ControlConfig().total_episodes)
    assert Path(job.out_dir) == tmp_path.resolve() / "short-cartpole" / "ppo" / "seed0"


def test_the_end_of_a_sweep_says_what_came_out_and_where(tmp_path, capsys):
    out = tmp_path / "sweep"
    sweep(_cfg(out, seeds=(0,)))  # the mean over seeds: test_the_sweeps_done_line_says_what_follows
    text = capsys.readouterr().out
    end = text[text.index("[sppo-rl] done:") :].splitlines()
    # "final" as sppo-rl report computes it (the protocol's one definition): the mean success_rate of
    # the last ceil(10 % of n) of a run's n updates; the sweep used the trainer's last 10 updates
    finals = {}
    for algo in ("ppo", "sppo"):
        values = []
        for s in (0,):
            rows = (out / "short-cartpole" / algo / f"seed{s}" / "metrics.jsonl").read_text().splitlines()
            y = [json.loads(line)["success_rate"] for line in rows if line.strip()]
            k = max(1, math.ceil(len(y) / 10))
            values.append(sum(y[-k:]) / k)
        finals[algo] = sum(values) / len(values)
    assert f"  short-cartpole / ppo: tail success {finals['ppo']:.3f} (mean of 1 seed)" in end
    assert f"  short-cartpole / sppo: tail success {finals['sppo']:.3f} (mean of 1 seed)" in end
    assert end[-1] == f"[sppo-rl] next: sppo-rl report {out}    tensorboard --logdir {out}"


# ----------------------------------------------------------------------------------- the LLM world

LLM_ARGS = (
    "--train-size 32 --val-size 8 --eval-samples 2 --max-new-tokens 6 --updates 2 --prompts-per-step 4 "
    "--eval-every 1 --checkpoint-every 1 --keep-checkpoints 2 --threads 1 --no-tensorboard"
)


def _llm_cli(out: Path, tiny: Path, cache: Path, *runs: str) -> subprocess.CompletedProcess:
    args = ["--world", "llm", "--runs", *runs, "--seeds", "0", "--workers", "2", "--out-dir", str(out)]
    args += ["--no-progress", f"--llm-args=--model {tiny} {LLM_ARGS}"]
    env = dict(os.environ, SPPO_RL_CACHE=str(cache), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "sppo_rl", "sweep", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_llm_sweep_runs_named_runs_resumes_a_stopped_one_and_skips_a_finished_one(
    tmp_path, tiny, monkeypatch
):
    from paths import LLM_TIMING

    out = tmp_path / "sweep"
    runs = ("sppo=--algo sppo", "grpo=--algo grpo --group-size 2")
    proc = _llm_cli(out, tiny, tmp_path / "cache", *runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sppo, grpo = out / "sppo" / "seed0", out / "grpo" / "seed0"
    for name, run in (("sppo", sppo), ("grpo", grpo)):
        assert "done" in _line(proc.stdout, name, 0)
        saved = json.loads((run / "config.json").read_text())
        assert (saved["algo"], saved["seed"], saved["updates"], saved["wandb_group"]) == (name, 0, 2, "sweep")
        assert [r["update"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]
        assert "-m sppo_rl llm --algo" in (run / "log.txt").read_text()
        assert "--no-progress" in (run / "log.txt").read_text()
    assert json.loads((grpo / "config.json").read_text())["resolved"]["group_size"] == 2
    manifest = json.loads((out / "sweep.json").read_text())
    assert [j["name"] for j in manifest["jobs"]] == ["sppo/seed0", "grpo/seed0"]
    assert [r["status"] for r in manifest["results"]] == ["done", "done"]
    # the headline's tail: the protocol's last ceil(10 %) of the 3 evaluations, i.e. the last one
    last = [r["val_accuracy"] for r in read_metrics(grpo / "metrics.jsonl") if "val_accuracy" in r][-1]
    g = [
        r["val_greedy_accuracy"] for r in read_metrics(grpo / "metrics.jsonl") if "val_greedy_accuracy" in r
    ][-1]
    assert (
        f"  grpo: tail val accuracy {last:.3f} sampled, {g:.3f} greedy (mean of 1 seed)"
        in proc.stdout.splitlines()
    )

    # grpo stopped between update 1's checkpoint and update 2's; sppo finished
    rows, first = read_metrics(grpo / "metrics.jsonl"), (grpo / "metrics.jsonl").read_text().splitlines()[0]
    (grpo / "summary.json").unlink()
    shutil.rmtree(grpo / "checkpoints" / "ckpt-000000002")
    before = (sppo / "metrics.jsonl").stat().st_mtime_ns
    monkeypatch.setenv("SPPO_RL_CACHE", str(tmp_path / "cache"))
    cfg = _llm(
        out, runs=dict(r.split("=", 1) for r in runs), llm_args=f"--model {tiny} {LLM_ARGS}", workers=2
    )
    assert [(r.status, r.mode) for r in sweep(cfg)] == [("skipped", "skip"), ("resumed", "resume")]
    assert (sppo / "metrics.jsonl").stat().st_mtime_ns == before
    log = (grpo / "log.txt").read_text()
    assert log.count("=== ") == 2 and "--resume" in log.split("=== ")[2]
    assert (grpo / "metrics.jsonl").read_text().splitlines()[0] == first  # kept, not started again
    strip = lambda rs: [{k: v for k, v in r.items() if k not in LLM_TIMING} for r in rs]  # noqa: E731
    assert strip(read_metrics(grpo / "metrics.jsonl")) == strip(rows)  # as if never stopped


def _llm(out: Path, **kw) -> SweepConfig:
    base = dict(world="llm", runs={"sppo": "--algo sppo"}, seeds=(0,), out_dir=str(out), progress=False)
    return SweepConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(runs={"a": "--bogus 1"}), "a: sppo-rl llm refuses its flags: Unrecognized options: --bogus"),
        (dict(runs={"a": "--algo nosuch"}), "a: sppo-rl llm refuses its flags: unknown algorithm 'nosuch'"),
        (dict(runs={"a": "--algo grpo --group-size 1"}), "needs group_size >= 2"),
        (
            dict(llm_args="--max-new-tokens 0"),
            "sppo: sppo-rl llm refuses its flags: --max-new-tokens must be >= 1",
        ),
        (dict(llm_args="--model /no/such/folder"), "/no/such/folder"),
        (dict(runs={"a": "--algo sppo --seed 3"}), "a: --seed is set by the sweep"),
        (dict(llm_args="--out-dir=/tmp/elsewhere"), "sppo: --out-dir=/tmp/elsewhere is set by the sweep"),
        (dict(llm_args="--overwrite"), "--overwrite is set by the sweep"),
        (dict(runs={"../up": "--algo sppo"}), "run name '../up'"),
        (dict(runs={"a": "--algo 'sppo"}), "--runs a: No closing quotation"),
        (dict(runs={}, algos=("sppo", "bogus")), "unknown algorithm\\(s\\): bogus"),
        (dict(tasks=("hopper",), overrides={"epochs": "2"}), "--tasks, --overrides: control settings"),
        (
            dict(world="control", runs={}, llm_args="--updates 2"),
            "--runs and --llm-args are settings of --world llm",
        ),
        (dict(seeds=()), "at least one run and one seed"),
    ],
)
def test_bad_llm_settings_are_refused_before_any_file(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        sweep(_llm(tmp_path / "sweep", **kw))
    assert not (tmp_path / "sweep").exists()


def test_cli_refuses_bad_llm_flags_in_one_line_exit_2_and_no_folder(tmp_path):
    out = tmp_path / "s"
    proc = _cli(
        "--world", "llm", "--runs", "a=--algo sppo", "b=--algo sppo --max-new-tokens 0", "--out-dir", str(out)
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "sppo-rl: error: b: sppo-rl llm refuses its flags: --max-new-tokens must be >= 1, or None for the task's "
        "default, got 0"
    ]
    assert not out.exists()


def test_llm_jobs_from_algos_and_a_folder_with_other_settings(tmp_path):
    jobs = plan(_llm(tmp_path, runs={}, algos=("sppo", "grpo"), seeds=(0, 1), llm_args="--updates 2"))
    assert [j.name for j in jobs] == ["sppo/seed0", "grpo/seed0", "sppo/seed1", "grpo/seed1"]
    run = tmp_path.resolve() / "sppo" / "seed0"
    # runs side by side (--workers unset): one thread each
    assert jobs[0].args == [
        "--algo", "sppo", "--updates", "2", "--threads", "1", "--seed", "0", "--out-dir", str(run),
        "--wandb-group", tmp_path.name,
    ]  # fmt: skip
    assert (jobs[0].command, jobs[0].task, jobs[0].out_dir, jobs[0].overwrite) == (
        "llm",
        "arithmetic",
        str(run),
        False,
    )

    # a run saved with 3 steps (and another thread count, which changes no result) is another run: the
    # sweep refuses the folder, compare_llm's --reuse (other="overwrite") starts it again
    from sppo_rl.llm.plan import as_given
    from sppo_rl.runtime.run import config_dict

    # as a run writes its config.json: flat, the defaults it fills in (max_new_tokens, actor_lr) filled
    saved = config_dict(
        as_given(llm_config("sppo", ["--algo", "sppo", "--updates", "3", "--threads", "4"], 0, str(run)))
    )
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**saved, "resolved": {"group_size": 1}}))
    cfg = _llm(tmp_path, llm_args="--updates 2")
    with pytest.raises(
        ValueError, match=re.escape(f"{run} holds a run with other settings (updates: 3 there, 2 now)")
    ):
        plan(cfg)
    (job,) = llm_jobs([("sppo", 0, ["--algo", "sppo", "--updates", "2"])], tmp_path, other="overwrite")
    assert job.overwrite
    (job,) = plan(_llm(tmp_path, llm_args="--updates 3"))  # the same settings: kept (skipped or resumed)
    assert not job.overwrite
    (job,) = llm_jobs([("sppo", 0, ["--algo", "sppo", "--updates", "3"])], tmp_path, overwrite=True)
    assert job.overwrite


@pytest.mark.slow
def test_sigterm_stops_an_llm_sweep_and_the_rerun_resumes(tmp_path, tiny):
    out, run = tmp_path / "sweep", tmp_path / "sweep" / "sppo" / "seed0"
    llm_args = f"--model {tiny} {LLM_ARGS}".replace("--updates 2", "--updates 200").replace(
        "--eval-every 1", "--eval-every 100"
    )
    args = ["--world", "llm", "--runs", "sppo=--algo sppo", "--seeds", "0", "--out-dir", str(out)]
    args += [
        "--no-progress",
        f"--llm-args={llm_args.replace('--checkpoint-every 1', '--checkpoint-every 5')}",
    ]
    env = dict(os.environ, SPPO_RL_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "sppo_rl", "sweep", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while not list((run / "checkpoints").glob("ckpt-*/meta.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted" in _line(stdout, "sppo", 0), stdout
    assert not (run / "summary.json").exists(), "the run finished before the signal; give it more steps"
    done = [r["update"] for r in read_metrics(run / "metrics.jsonl")]

    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed" in _line(again.stdout, "sppo", 0)
    assert [r["update"] for r in read_metrics(run / "metrics.jsonl")] == list(range(201))
    assert 1 < len(done) < 201


def test_the_declared_primary_and_margin_are_kept_in_sweep_json(tmp_path):
    """A sweep declares its comparison before the runs: --primary and --margin go into sweep.json, where
    sppo-rl report reads them; ten seeds by default (the decision rule's power at five is poor)."""
    from sppo_rl.experiments.sweep import plan

    assert SweepConfig().seeds == tuple(range(10))
    cfg = _cfg(
        tmp_path / "s", primary="acc_at_seconds", margin=0.1, algos=("ppo",), seeds=(0,), total_episodes=64
    )
    assert len(plan(cfg)) == 1
    sweep(cfg)
    manifest = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert (manifest["config"]["primary"], manifest["config"]["margin"]) == ("acc_at_seconds", 0.1)


def test_the_sweeps_done_line_says_what_follows(tmp_path):
    """The headline's first line is a sentence (how many runs, what the numbers below are), never a bare
    ``done: `` followed by the list; with nothing finished it says so."""
    from sppo_rl.experiments.sweep import Job, JobResult, headline

    jobs = []
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        (out / "metrics.jsonl").write_text(
            "".join(json.dumps({"success_rate": y}) + "\n" for y in (0.0, 0.5))
        )
        jobs.append(Job("short-cartpole", "ppo", seed, str(out), []))
    lines = headline(jobs, [JobResult("done")] * 2, tmp_path).splitlines()
    assert lines[0] == (
        "[sppo-rl] done: 2 finished runs; tail success (the last 10% of each run's updates) per task / algorithm:"
    )
    assert lines[1] == "  short-cartpole / ppo: tail success 0.500 (mean of 2 seeds)"
    none = headline(jobs, [JobResult("failed")] * 2, tmp_path).splitlines()
    assert none[0] == "[sppo-rl] done: no finished run with metrics" and all(x.strip() for x in none)


# ================================================================== 13. two sweeps on one folder


def test_a_sweep_on_a_folder_another_sweep_holds_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """The folder's ``.sweep.lock`` held (by this test, as a running sweep holds it): the sweep is refused
    in one line, exit 2, and the folder is left as it was (a second sweep used to run on, rewrite
    sweep.json and mark the other's runs busy)."""
    import fcntl

    out = tmp_path / "sweep"
    out.mkdir()
    holder = os.open(out / ".sweep.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        proc = subprocess.run(
            [sys.executable, "-m", "sppo_rl", "sweep", "--algos", "ppo", "--tasks", "short-cartpole", "--seeds",
             "0", "--total-episodes", "64", "--out-dir", str(out), "--no-progress"],
            capture_output=True, text=True, timeout=600, cwd=REPO,
        )  # fmt: skip
    finally:
        os.close(holder)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "in use by another sweep" in proc.stderr, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [".sweep.lock"], "nothing written"


@pytest.mark.slow  # two sweeps of two control runs each
def test_two_sweeps_on_one_folder_one_is_refused_in_one_line_and_sweep_json_stays_true(tmp_path):
    """Two ``sppo-rl sweep`` started together on one folder: one runs every job and exits 0, the other
    is refused in one line (exit 2) without writing; sweep.json lists every run finished (both used to
    exit 2, each marking runs the other finished 'busy')."""
    import json

    out = tmp_path / "sweep"
    args = [
        sys.executable, "-m", "sppo_rl", "sweep", "--algos", "ppo", "grpo", "--tasks", "short-cartpole",
        "--seeds", "0", "--workers", "1", "--total-episodes", "1280", "--out-dir", str(out), "--no-progress",
        "--overrides", "tensorboard=false", "eval-episodes=0", "init-from=none", "checkpoint-every=5",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 2], [(rc, e[-2000:]) for rc, _, e in results]
    (_, refused_out, refused_err), (_, _, ok_err) = sorted(results, key=lambda r: -r[0])
    assert refused_err.count("\n") == 1 and "in use by another sweep" in refused_err, refused_err
    assert refused_out == "", "the refused sweep printed no table: it ran nothing"
    manifest = json.loads((out / "sweep.json").read_text())
    assert [r["status"] for r in manifest["results"]] == ["done", "done"], manifest["results"]


# ============================================================ seeds batched: one process per (task, algo)


def _seed_run(run: Path) -> tuple[list[dict], dict, dict, dict]:
    """A seed folder's rows and summary (timings stripped), config (its folder aside) and final actor."""
    import torch
    from paths import CONTROL_TIMING, strip_timing

    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    config.pop("out_dir")
    return (
        strip_timing(read_metrics(run / "metrics.jsonl"), CONTROL_TIMING),
        {k: v for k, v in summary.items() if k not in ("wall_time_s", "sps")},
        config,
        torch.load(run / "final.pt", weights_only=False)["actor"],
    )


def test_a_batched_sweeps_seed_folders_are_a_per_seed_sweeps_and_skip_resume_and_fallback(tmp_path, capsys):
    """By default the seeds of a (task, algo) run as one ``sppo-rl control --seeds`` job in
    ``<root>/<task>/<algo>``; each ``seed<K>`` folder holds what the per-seed sweep (``--no-batch-seeds``)
    writes there, bit for bit (timings aside); the table and headline still have a line per seed. A
    finished job is skipped, an interrupted one resumed exactly; a folder a per-seed sweep left keeps
    per-seed jobs (stated), and ``sppo-rl report`` counts each seed once."""
    batched, single = tmp_path / "a" / "sweep", tmp_path / "b" / "sweep"  # one name: one wandb group
    cfg = _cfg(batched, algos=("ppo",), seeds=(1, 0))
    (job,) = plan(cfg)
    assert job.seeds == (0, 1) and Path(job.out_dir) == batched.resolve() / "short-cartpole" / "ppo"
    assert job.args[job.args.index("--seeds") + 1] == "0,1" and "--seed" not in job.args
    results = sweep(cfg)
    text = capsys.readouterr().out
    assert [(r.status, r.mode) for r in results] == [("done", "fresh")]
    assert "sweep: 2 runs (0 finished before) in 1 process (1 of several seeds)" in text
    assert "1 process: 1 done; sweep wall time" in text
    assert _line(text, "ppo", 0).split()[3] == "done" and _line(text, "ppo", 1).split()[3] == "done"
    assert "short-cartpole / ppo: tail success" in text and "(mean of 2 seeds)" in text
    assert [r.status for r in sweep(_cfg(single, algos=("ppo",), seeds=(0, 1), batch_seeds=False))] == [
        "done",
        "done",
    ]
    folder = batched / "short-cartpole" / "ppo"
    for k in (0, 1):
        a, b = _seed_run(folder / f"seed{k}"), _seed_run(single / "short-cartpole" / "ppo" / f"seed{k}")
        assert a[:3] == b[:3] and a[2]["seed"] == k
        assert all(torch_equal(a[3][n], b[3][n]) for n in b[3]) and a[3].keys() == b[3].keys()
    assert json.loads((folder / "config.json").read_text())["seeds"] == "0,1"

    # finished: skipped, nothing rewritten
    runs = [folder, folder / "seed0", folder / "seed1"]
    mtimes = [(p / "metrics.jsonl").stat().st_mtime_ns for p in runs]
    assert [r.status for r in sweep(cfg)] == ["skipped"]
    assert mtimes == [(p / "metrics.jsonl").stat().st_mtime_ns for p in runs]

    # killed between update 1's checkpoints and update 2's: resumed, each seed exactly its run
    before = [_seed_run(folder / f"seed{k}")[:2] for k in (0, 1)]
    for p in runs:
        (p / "summary.json").unlink()
        shutil.rmtree(p / "checkpoints" / "ckpt-000000002")
    assert [(r.status, r.mode) for r in sweep(cfg)] == [("resumed", "resume")]
    assert [_seed_run(folder / f"seed{k}")[:2] for k in (0, 1)] == before
    # killed between the seeds' checkpoints of update 2 and the set's: the set cannot resume, so each
    # seed resumes alone (stated), then the (task, algo) stays per seed
    for p in runs:
        (p / "summary.json").unlink()
    shutil.rmtree(folder / "checkpoints" / "ckpt-000000002")
    (job,) = plan(cfg)[:1]
    assert "seeds checkpointed past its last checkpoint (ckpt-000000001)" in job.why and not job.seeds
    assert [(r.status, r.mode) for r in sweep(cfg)] == [("resumed", "resume")] * 2
    assert [_seed_run(folder / f"seed{k}")[:2] for k in (0, 1)] == before
    assert [r.status for r in sweep(cfg)] == ["skipped"] * 2
    # killed before its first checkpoint (metrics without one): started again with --overwrite
    for p in runs:
        (p / "summary.json").unlink(missing_ok=True)
        shutil.rmtree(p / "checkpoints")
    assert [(r.status, r.mode) for r in sweep(cfg)] == [("done", "overwrite")]
    assert [_seed_run(folder / f"seed{k}")[:2] for k in (0, 1)] == before

    # a folder left by a per-seed sweep: per-seed jobs there, stated; a new seed runs alone
    capsys.readouterr()
    more = _cfg(single, algos=("ppo",), seeds=(0, 1, 2))
    jobs = plan(more)
    assert [(j.seed, j.seeds) for j in jobs] == [(0, ()), (1, ()), (2, ())]
    assert "holds seed folders of a per-seed sweep (seed0, seed1)" in jobs[0].why
    assert [r.status for r in sweep(more)] == ["skipped", "skipped", "done"]
    said = "holds seed folders of a per-seed sweep (seed0, seed1) and no multi-seed run: one process per seed there"
    assert said in capsys.readouterr().out
    assert not (single / "short-cartpole" / "ppo" / "config.json").exists()
    # ... and beside a multi-seed run of other seeds (only planned)
    (job0, *_) = plan(_cfg(batched, algos=("ppo",), seeds=(0, 1, 2)))
    assert "holds a multi-seed run of other seeds (0,1)" in job0.why

    # the report reads each seed once (the set's own folder, the seeds' mean, is not a run)
    report = run_report(ReportConfig(inputs=(str(batched),), smooth=1))
    assert [(g["algo"], g["seeds"], g["finished"]) for g in report["groups"]] == [("ppo", 2, 2)]


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_a_batched_job_starts_over_when_a_seed_folder_holds_a_killed_run(tmp_path):
    """A multi-seed job's folder without checkpoints whose seed folder holds metrics (killed before the
    set's first checkpoint) starts again with --overwrite, as a single run's folder would."""
    from sppo_rl.experiments.sweep import run_mode

    (tmp_path / "seed1").mkdir()
    assert run_mode(tmp_path, (0, 1)) == "fresh"
    (tmp_path / "seed1" / "metrics.jsonl").write_text("")
    assert run_mode(tmp_path, (0, 1)) == "overwrite" and run_mode(tmp_path) == "fresh"


@pytest.mark.slow  # about 20 s; the default suite simulates the interruption
def test_sigterm_stops_a_batched_sweep_and_the_rerun_resumes_every_seed(tmp_path):
    out = tmp_path / "sweep"
    args = _cli_args(out, budget=64 * 150, algos=("ppo",), seeds=("0", "1"))
    args[args.index("checkpoint-every=1")] = "checkpoint-every=5"
    folder = out / "short-cartpole" / "ppo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sppo_rl", "sweep", *args], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list((folder / "checkpoints").glob("ckpt-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "interrupted" in _line(stdout, "ppo", 0) and "interrupted" in _line(stdout, "ppo", 1)
    assert not (folder / "summary.json").exists(), (
        "the run finished before the signal; give it a bigger budget"
    )

    again = _cli(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed" in _line(again.stdout, "ppo", 0) and "resumed" in _line(again.stdout, "ppo", 1)
    for k in (0, 1):
        assert [r["update"] for r in read_metrics(folder / f"seed{k}" / "metrics.jsonl")] == list(
            range(1, 151)
        )
