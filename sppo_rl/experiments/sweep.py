"""``sppo-rl sweep``: algorithms x tasks x seeds of ``sppo-rl control`` runs, resumable.

Every run is a subprocess ``python -m sppo_rl control ... --no-progress`` whose output goes to
``<run>/log.txt``, so a crash or a kill of one run never takes the sweep down. When a job starts it looks at
its folder ``<out_dir>/<task>/<algo>/seed<k>`` to decide how to run:

- ``summary.json`` present: the run is finished and is skipped;
- a checkpoint and ``metrics.jsonl`` present: it continues with ``--resume`` (its metrics continue
  exactly; a metrics file shorter than its checkpoint recorded is refused by the run, never glued);
- checkpoints without ``metrics.jsonl`` (its history is gone): it starts again with ``--overwrite``;
- ``metrics.jsonl`` or ``checkpoints/`` but no checkpoint (a run killed before its first one): ``--overwrite``;
- nothing: a fresh start.

Re-running the same command after a kill therefore finishes only what is left. While a run's subprocess
lives it holds an exclusive ``flock`` on ``<run>/.lock`` (the descriptor is inherited), so a second sweep
on the same folder, or a rerun while the children of a SIGKILLed sweep still run, never starts a run twice:
such a run is reported ``busy``. The sweep itself holds ``<out_dir>/.sweep.lock``: a second sweep on the
same folder is refused in one line (exit 2) before it writes anything. SIGTERM / Ctrl-C stops the sweep cleanly: no new run starts, each running
one gets SIGTERM, saves a checkpoint and exits (``interrupted``).

Jobs run seed by seed (every task and algorithm of the first seed first), so a partial sweep is balanced.
``<out_dir>/sweep.json`` records the config, the jobs and their results.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sppo_rl.experiments.config import SweepConfig

# ControlConfig fields the sweep sets itself (not allowed in --overrides)
SWEEP_OWNED = {"algo", "task", "seed", "total_episodes", "out_dir", "resume", "overwrite", "progress"}
# ControlConfig fields that change no result: a run folder may have been made with other values of these
BOOKKEEPING = {
    "out_dir",
    "resume",
    "overwrite",
    "progress",
    "threads",
    "checkpoint_every",
    "keep_checkpoints",
    "tensorboard",
    "wandb",
    "wandb_mode",
    "wandb_project",
    "wandb_entity",
    "wandb_group",
    "wandb_tags",
    "exp_name",
    # evaluations after training (own environments and generators): they do not change a run's metrics
    "eval_episodes",
    "calibration_contexts",
    "calibration_samples",
}
FINISHED = ("done", "resumed", "skipped")
LOCK = ".lock"
SWEEP_LOCK = ".sweep.lock"
STOP_GRACE_S = 120.0  # how long a stopped run may take to save its checkpoint before it is killed

_LIVE: set[subprocess.Popen] = set()  # running control subprocesses of this process


@dataclass
class Job:
    """One ``sppo-rl control`` run of the sweep."""

    task: str
    algo: str
    seed: int
    out_dir: str
    args: list[str]
    """Control flags, without --resume / --overwrite / --no-progress (chosen when the job starts)."""

    @property
    def name(self) -> str:
        return f"{self.task}/{self.algo}/seed{self.seed}"


@dataclass
class JobResult:
    status: str
    """done (fresh or --overwrite) | resumed | skipped (finished before) | failed | interrupted (stopped by
    a signal, checkpoint saved) | busy (another process runs it) | not started."""
    returncode: int | None = None
    wall_time_s: float = 0.0
    log: str = ""
    mode: str = ""
    """fresh | resume | overwrite | skip: what the job found in its folder."""
    error: str = ""


# ------------------------------------------------------------------------------------- planning


def control_flags(overrides: dict[str, Any]) -> list[str]:
    """``--overrides`` as ``sppo-rl control`` flags, e.g. ``{"hidden-sizes": "32 32", "tensorboard": "false"}``
    -> ``["--hidden-sizes", "32", "32", "--no-tensorboard"]``. Keys are ControlConfig fields (``-`` or ``_``)."""
    from sppo_rl.control.config import ControlConfig

    hints = typing.get_type_hints(ControlConfig)
    flags: list[str] = []
    for key, value in overrides.items():
        name = key.replace("-", "_")
        if name in SWEEP_OWNED:
            raise ValueError(
                f"--overrides {key}: set by the sweep itself "
                "(use --algos, --tasks, --seeds, --total-episodes / --budgets, --out-dir)"
            )
        if name not in hints:
            valid = ", ".join(k.replace("_", "-") for k in hints if k not in SWEEP_OWNED)
            raise ValueError(f"--overrides {key}: not a control setting; valid: {valid}")
        flag = "--" + name.replace("_", "-")
        if hints[name] is bool:
            word = str(value).lower()
            if word not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"--overrides {key}={value}: expected true or false")
            flags.append(flag if word in ("true", "1", "yes") else "--no-" + flag[2:])
        elif typing.get_origin(hints[name]) in (tuple, dict):
            items = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
            flags += [flag, *map(str, items)]
        else:
            flags += [flag, str(value)]
    return flags


def parse_control(flags: list[str]):  # -> ControlConfig
    """The ControlConfig that ``sppo-rl control <flags>`` would run (tyro's parser; ValueError if refused)."""
    import contextlib
    import io

    import tyro

    from sppo_rl.control.config import ControlConfig

    text = io.StringIO()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            return tyro.cli(ControlConfig, args=flags)
    except SystemExit:
        raise ValueError(
            f"--overrides: sppo-rl control refuses {shlex.join(flags)}\n{text.getvalue()}"
        ) from None


def _unique(items: tuple) -> list:
    return list(dict.fromkeys(items))


def check_same_settings(out: Path, control: Any) -> None:
    """Refuse to reuse a run folder whose ``config.json`` has other settings (bookkeeping fields aside)."""
    try:
        saved = json.loads((out / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    want = json.loads(json.dumps(asdict(control), default=str))
    diff = [k for k, v in want.items() if k not in BOOKKEEPING and k in saved and saved[k] != v]
    if diff:
        what = "; ".join(f"{k}: {saved[k]!r} there, {want[k]!r} now" for k in diff)
        raise ValueError(
            f"{out} holds a run with other settings ({what}); use another --out-dir or delete that folder"
        )


def plan(cfg: SweepConfig) -> list[Job]:
    """Check every name and setting, then list the jobs (nothing is started or written)."""
    from sppo_rl.agents import ALGORITHMS
    from sppo_rl.envs import TASKS

    algos, tasks, seeds = _unique(cfg.algos), _unique(cfg.tasks), _unique(cfg.seeds)
    if not (algos and tasks and seeds):
        raise ValueError("a sweep needs at least one algorithm, one task and one seed")
    bad = [a for a in algos if a not in ALGORITHMS]
    if bad:
        raise ValueError(f"unknown algorithm(s): {', '.join(bad)}; valid: {', '.join(ALGORITHMS)}")
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown task(s): {', '.join(bad)}; valid: {', '.join(TASKS)}")
    bad = [t for t in cfg.budgets if t not in tasks]
    if bad:
        raise ValueError(f"--budgets names task(s) not in --tasks: {', '.join(bad)}")
    bad = [
        f"{t}={n}"
        for t, n in [("--total-episodes", cfg.total_episodes), *cfg.budgets.items()]
        if n is not None and n < 1
    ]
    if bad:
        raise ValueError(f"budgets must be >= 1 episode: {', '.join(bad)}")
    if cfg.workers is not None and cfg.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {cfg.workers}")
    flags = control_flags(cfg.overrides)
    base = parse_control(flags)
    base.validate()  # every setting's type and range (ConfigError names the flag), before any run
    root = Path(cfg.out_dir).resolve()
    group = base.wandb_group or root.name  # the runs of a sweep form one wandb group
    jobs = []
    for seed in seeds:
        for task in tasks:
            for algo in algos:
                budget = cfg.budgets.get(task, cfg.total_episodes or base.total_episodes)
                out = root / task / algo / f"seed{seed}"
                control = replace(
                    base, algo=algo, task=task, seed=seed, total_episodes=budget, out_dir=str(out)
                )
                control = replace(control, wandb_group=group)
                check_same_settings(out, control)
                coords = ["--algo", algo, "--task", task, "--seed", str(seed)]
                coords += ["--total-episodes", str(budget), "--out-dir", str(out)]
                if base.wandb_group is None:
                    coords += ["--wandb-group", group]
                jobs.append(Job(task, algo, seed, str(out), coords + flags))
    return jobs


# ------------------------------------------------------------------------------------- one job


def run_mode(out: Path) -> str:
    """skip | resume | overwrite | fresh, from what the run folder holds (see the module docstring)."""
    if (out / "summary.json").is_file():
        return "skip"
    if any((out / "checkpoints").glob("ckpt-*/meta.json")) and (out / "metrics.jsonl").is_file():
        return "resume"
    if (out / "metrics.jsonl").exists() or (out / "checkpoints").exists():
        return "overwrite"
    return "fresh"


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the run saves a checkpoint and exits), then SIGKILL after STOP_GRACE_S."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_job(job: Job) -> JobResult:
    """Run (or skip, or resume) one job in a subprocess; never raises for a failing run."""
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return JobResult("busy", log=str(log), error=f"another process holds {out / LOCK}")
        mode = run_mode(out)
        if mode == "skip":
            return JobResult("skipped", 0, log=str(log), mode=mode)
        cmd = [sys.executable, "-m", "sppo_rl", "control", *job.args, "--no-progress"]
        cmd += {"resume": ["--resume"], "overwrite": ["--overwrite"], "fresh": []}[mode]
        t0 = time.monotonic()
        with open(log, "a") as f:
            f.write(f"\n=== {datetime.now().isoformat(timespec='seconds')} {shlex.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(fd,)
            )
            _LIVE.add(proc)
            try:
                rc = proc.wait()
            except BaseException:  # KeyboardInterrupt (Ctrl-C, ray.cancel): stop the run cleanly
                _stop(proc)
                raise
            finally:
                _LIVE.discard(proc)
        wall = time.monotonic() - t0
        if rc == 0:
            status = "resumed" if mode == "resume" else "done"
        elif rc in (128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM):
            status = "interrupted"
        else:
            status = "failed"
        return JobResult(status, rc, wall, str(log), mode)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------- backends

OnDone = Callable[[int, JobResult], None]


def _run_local(jobs: list[Job], workers: int, stop: threading.Event, on_done: OnDone) -> None:
    def work(i: int) -> tuple[int, JobResult]:
        return i, JobResult("not started") if stop.is_set() else run_job(jobs[i])

    with ThreadPoolExecutor(min(workers, len(jobs))) as pool:
        for fut in as_completed([pool.submit(work, i) for i in range(len(jobs))]):
            on_done(*fut.result())


def _run_ray(jobs: list[Job], cfg: SweepConfig, workers: int, stop: threading.Event, on_done: OnDone) -> None:
    import ray

    started = not ray.is_initialized()
    if started and cfg.ray_address == "local":
        ray.init(address="local", num_cpus=workers, include_dashboard=False)
    elif started:
        ray.init(address=cfg.ray_address)
    remote = ray.remote(num_cpus=1, max_retries=0)(run_job)
    todo = list(range(len(jobs)))
    running: dict[Any, int] = {}
    cancelled = False
    try:
        while todo or running:
            while todo and len(running) < workers and not stop.is_set():
                i = todo.pop(0)
                running[remote.remote(jobs[i])] = i
            if stop.is_set() and not cancelled:
                cancelled = True
                for ref in running:
                    ray.cancel(ref)  # KeyboardInterrupt in run_job, which stops its run cleanly
                for i in todo:
                    on_done(i, JobResult("not started"))
                todo = []
            if not running:
                break
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in ready:
                i = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.TaskCancelledError:
                    result = JobResult("interrupted", log=str(Path(jobs[i].out_dir) / "log.txt"))
                except ray.exceptions.RayError as e:
                    result = JobResult("failed", log=str(Path(jobs[i].out_dir) / "log.txt"), error=str(e))
                on_done(i, result)
    finally:
        if started:
            ray.shutdown()


class _Signals:
    """While the sweep runs, SIGTERM / SIGINT set ``stop`` and forward SIGTERM to the running children;
    a second SIGINT raises KeyboardInterrupt. Only in the main thread; the old handlers come back after."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.old: dict[int, Any] = {}

    def handler(self, signum: int, frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop.set()
        print(f"\nsweep: {signal.Signals(signum).name}: stopping the running runs (they save a checkpoint)")
        for proc in list(_LIVE):
            if proc.poll() is None:
                proc.terminate()

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.old[sig] = signal.signal(sig, self.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.old.items():
            signal.signal(sig, old)


# ------------------------------------------------------------------------------------- the sweep


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def status_table(jobs: list[Job], results: list[JobResult]) -> str:
    """One line per run: task, algo, seed, status, wall seconds, and the log of a run that did not finish."""
    lines = [f"{'task':24s} {'algo':10s} {'seed':>5s}  {'status':16s} {'wall s':>8s}  log"]
    for job, r in zip(jobs, results):
        status = r.status + (f" (rc {r.returncode})" if r.status == "failed" and r.returncode else "")
        log = "" if r.status in FINISHED else r.error if r.status == "busy" else r.log
        lines.append(f"{job.task:24s} {job.algo:10s} {job.seed:5d}  {status:16s} {r.wall_time_s:8.1f}  {log}")
    return "\n".join(lines)


def sweep(cfg: SweepConfig) -> list[JobResult]:
    """Run the sweep; returns one result per job (in :func:`plan`'s order). Raises only for a bad config, or a folder another sweep
    holds (refused in one line)."""
    jobs = plan(cfg)
    workers = cfg.workers or os.cpu_count() or 1
    root = Path(cfg.out_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    fd = _lock_sweep(root)
    try:
        return _sweep(cfg, jobs, workers, root)
    finally:
        os.close(fd)


def _lock_sweep(root: Path) -> int:
    """Hold ``root/.sweep.lock`` (``flock``) for the sweep's lifetime: a second sweep on the same folder
    is refused in one line (``RunError``, exit 2) before it writes anything, so ``sweep.json`` is only
    ever written by the sweep that runs the jobs (two sweeps used to mark each other's finished runs
    ``busy``). The descriptor is not inherited by the runs."""
    from sppo_rl.runtime.run import RunError, try_lock

    path = root / SWEEP_LOCK
    try:
        fd = try_lock(path)
    except OSError as e:
        raise RunError(f"sweep folder {root} cannot hold its lock {path}: {e.strerror or e}") from None
    if fd is None:
        raise RunError(
            f"{root} is in use by another sweep (it holds {path}); wait for it to end, then run the same "
            "command again to finish what is left"
        ) from None
    return fd


def _sweep(cfg: SweepConfig, jobs: list[Job], workers: int, root: Path) -> list[JobResult]:
    manifest: dict[str, Any] = {
        "config": asdict(cfg),
        "started": datetime.now().isoformat(timespec="seconds"),
        "jobs": [{"name": j.name, **asdict(j)} for j in jobs],
    }
    _write_json(root / "sweep.json", manifest)
    finished_before = sum((Path(j.out_dir) / "summary.json").is_file() for j in jobs)
    print(
        f"sweep: {len(jobs)} runs ({finished_before} finished before), {workers} {cfg.backend} workers -> {root}"
    )
    results: list[JobResult | None] = [None] * len(jobs)
    count = 0
    lock = threading.Lock()

    def on_done(i: int, r: JobResult) -> None:
        nonlocal count
        with lock:
            results[i] = r
            count += 1
            if cfg.progress:
                print(
                    f"[{count}/{len(jobs)}] {r.status:11s} {jobs[i].name} ({r.wall_time_s:.1f} s)", flush=True
                )

    t0 = time.monotonic()
    stop = threading.Event()
    with _Signals(stop):
        if cfg.backend == "ray":
            _run_ray(jobs, cfg, workers, stop, on_done)
        else:
            _run_local(jobs, workers, stop, on_done)
    final = [r or JobResult("not started") for r in results]
    wall = time.monotonic() - t0
    manifest.update(
        finished=datetime.now().isoformat(timespec="seconds"),
        wall_time_s=wall,
        results=[{"name": j.name, **asdict(r)} for j, r in zip(jobs, final)],
    )
    _write_json(root / "sweep.json", manifest)
    counts = {s: sum(r.status == s for r in final) for s in dict.fromkeys(r.status for r in final)}
    print("\n" + status_table(jobs, final))
    print(
        f"{len(jobs)} runs: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; sweep wall time {wall:.1f} s"
    )
    print(headline(jobs, final, root))
    return final


def headline(jobs: list[Job], results: list[JobResult], root: Path) -> str:
    """The sweep's end: final success of each (task, algorithm) over its finished seeds (the protocol's
    :func:`~sppo_rl.experiments.protocol.final_value` of each run's logged ``success_rate``, as
    ``sppo-rl report`` computes it), the folder and the next commands."""
    from sppo_rl.experiments.protocol import final_value
    from sppo_rl.runtime.logging import read_metrics

    finals: dict[tuple[str, str], list[float]] = {}
    for job, r in zip(jobs, results):
        metrics = Path(job.out_dir) / "metrics.jsonl"
        if r.status in FINISHED and metrics.is_file():
            value = final_value([row.get("success_rate") for row in read_metrics(metrics)])
            if not math.isnan(value):
                finals.setdefault((job.task, job.algo), []).append(value)
    lines = [
        f"  {task} / {algo}: final success {sum(v) / len(v):.3f} (mean of {len(v)} seed{'s' * (len(v) > 1)})"
        for (task, algo), v in finals.items()
    ]
    return "\n".join(
        ["[sppo-rl] done: " + ("" if lines else "no finished run with metrics"), *lines]
        + [
            f"[sppo-rl] sweep folder: {root} (sweep.json, <task>/<algo>/seed<k>/)",
            f"[sppo-rl] next: sppo-rl report {root}    tensorboard --logdir {root}",
        ]
    )


def run_sweep(cfg: SweepConfig) -> list[JobResult]:
    """Entry point of ``sppo-rl sweep``: exits non-zero (RunError) when any run did not finish."""
    from sppo_rl.runtime.run import RunError

    results = sweep(cfg)
    unfinished = [r for r in results if r.status not in FINISHED]
    if unfinished:
        raise RunError(
            f"{len(unfinished)} of {len(results)} runs did not finish (logs in the table above); "
            "run the same command again to finish them"
        )
    return results
