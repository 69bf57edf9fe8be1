"""``sppo-rl sweep``: algorithms x tasks x seeds of ``sppo-rl control`` runs, or (``--world llm``) named
runs x seeds of ``sppo-rl llm`` runs, resumable.

Every job is a subprocess ``python -m sppo_rl control ... --no-progress`` (``llm``) whose output goes to
``<job>/log.txt``, so a crash or a kill of one job never takes the sweep down. A control job trains all the
seeds of one (task, algorithm) in one process (``sppo-rl control --seeds``, :mod:`sppo_rl.control.seeds`)
in ``<out_dir>/<task>/<algo>``, seed ``k``'s run in its folder ``<out_dir>/<task>/<algo>/seed<k>`` bit for
bit the run of ``--seed k`` alone; with ``--no-batch-seeds``, with one seed, or for a (task, algorithm)
whose folder holds seed folders but no multi-seed run of these seeds (a per-seed sweep's, stated at the
start: :func:`per_seed_reason`), a job is one seed's run in ``<out_dir>/<task>/<algo>/seed<k>``, as before
(LLM world: always, ``<out_dir>/<name>/seed<k>``). When a job starts it looks at its folder to decide how
to run:

- ``summary.json`` present: the run is finished and is skipped;
- a checkpoint and ``metrics.jsonl`` present: it continues with ``--resume`` (its metrics continue
  exactly; a metrics file shorter than its checkpoint recorded is refused by the run, never glued);
- checkpoints without ``metrics.jsonl`` (its history is gone): it starts again with ``--overwrite``;
- ``metrics.jsonl`` or ``checkpoints/`` but no checkpoint (a run killed before its first one; a multi-seed
  job: also in a seed folder): ``--overwrite``;
- nothing: a fresh start.

Re-running the same command after a kill therefore finishes only what is left. While a run's subprocess
lives it holds an exclusive ``flock`` on ``<run>/.lock`` (the descriptor is inherited), so a second sweep
on the same folder, or a rerun while the children of a SIGKILLed sweep still run, never starts a run twice:
such a run is reported ``busy``. The sweep itself holds ``<out_dir>/.sweep.lock``: a second sweep on the
same folder is refused in one line (exit 2) before it writes anything. SIGTERM / Ctrl-C stops the sweep cleanly: no new run starts, each running
one gets SIGTERM, saves a checkpoint and exits (``interrupted``).

A job made with ``overwrite`` (:func:`llm_jobs`, for ``scripts/compare_llm.py`` without ``--reuse``)
starts again with ``--overwrite`` whatever its folder holds. Before any of this, :func:`plan` refuses a
folder that holds a run with other settings (those of :data:`BOOKKEEPING` / :data:`LLM_BOOKKEEPING` aside).

Jobs run seed by seed (every task and algorithm of the first seed first), so a partial sweep is balanced.
The status table and the headline have a line per seed either way (a multi-seed job's seeds share its
status and wall time), read from the seed folders.
``<out_dir>/sweep.json`` records the config, the jobs and their results.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
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

from sppo_rl.config import flat_dict, flat_keys, key_type, replace_flat
from sppo_rl.experiments.config import SweepConfig
from sppo_rl.runtime.files import atomic_write_text

# ControlConfig fields the sweep sets itself (not allowed in --overrides)
SWEEP_OWNED = {
    "algo",
    "task",
    "seed",
    "seeds",
    "total_episodes",
    "out_dir",
    "resume",
    "overwrite",
    "progress",
}
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
# LLMConfig fields that change no result (the LLM world's BOOKKEEPING)
LLM_BOOKKEEPING = BOOKKEEPING - {"eval_episodes", "calibration_contexts", "calibration_samples"} | {
    "cache_dir",
    "log_completions_every",
    "export_adapter",
    "collective_timeout",
    "optimizer_state",
    "resume_without_optimizer",
}
# sppo-rl llm flags the sweep sets itself (not allowed in --runs or --llm-args)
LLM_OWNED = ("--seed", "--out-dir", "--resume", "--no-resume", "--overwrite", "--no-overwrite", "--progress")
LLM_OWNED += ("--no-progress",)
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # one folder name, e.g. reinforce++-baseline
FINISHED = ("done", "resumed", "skipped")
LOCK = ".lock"
SWEEP_LOCK = ".sweep.lock"
STOP_GRACE_S = 120.0  # how long a stopped run may take to save its checkpoint before it is killed

_LIVE: set[subprocess.Popen] = set()  # running control subprocesses of this process


@dataclass
class Job:
    """One ``sppo-rl control`` (``llm``) run of the sweep."""

    task: str
    algo: str
    """The algorithm; an LLM job: the run's name."""
    seed: int
    out_dir: str
    args: list[str]
    """Control (llm) flags, without --resume / --overwrite / --no-progress (chosen when the job starts)."""
    command: str = "control"
    """The ``sppo-rl`` subcommand: control | llm."""
    overwrite: bool = False
    """Start again with --overwrite whatever the folder holds (no skip, no resume)."""
    seeds: tuple[int, ...] = ()
    """A multi-seed job's seeds (``sppo-rl control --seeds``: ``out_dir`` is the set's folder, seed ``k``'s
    run ``out_dir/seed<k>``; ``seed`` is the first); (): the one run of ``seed`` in ``out_dir``."""
    why: str = ""
    """Why a job of one seed although seeds are batched (:func:`per_seed_reason`); "" otherwise."""

    @property
    def name(self) -> str:
        if self.command == "llm":
            return f"{self.algo}/seed{self.seed}"
        if self.seeds:
            return f"{self.task}/{self.algo}/seeds{','.join(map(str, self.seeds))}"
        return f"{self.task}/{self.algo}/seed{self.seed}"

    @property
    def runs(self) -> list[tuple[int, Path]]:
        """Each seed's run of the job: ``(seed, its folder)``."""
        if self.seeds:
            return [(k, Path(self.out_dir) / f"seed{k}") for k in self.seeds]
        return [(self.seed, Path(self.out_dir))]


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

    hints = {key: key_type(ControlConfig, key) for key in flat_keys(ControlConfig)}
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

    from sppo_rl.control.config import ControlConfig
    from sppo_rl.runtime.flags import parse

    text = io.StringIO()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            return parse(ControlConfig, flags)
    except SystemExit:
        raise ValueError(
            f"--overrides: sppo-rl control refuses {shlex.join(flags)}\n{text.getvalue()}"
        ) from None


def _unique(items: tuple) -> list:
    return list(dict.fromkeys(items))


def other_settings(out: Path, config: Any, bookkeeping: set[str] = BOOKKEEPING) -> str:
    """The settings (``config``'s fields outside ``bookkeeping``) on which the run saved in
    ``out/config.json`` differs, as ``"k: <there> there, <now> now; ..."``; "" if none or no config."""
    from sppo_rl.runtime.run import config_now

    try:
        saved = config_now(json.loads((out / "config.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return ""
    want = json.loads(json.dumps(flat_dict(config), default=str))
    diff = [k for k, v in want.items() if k not in bookkeeping and k in saved and saved[k] != v]
    return "; ".join(f"{k}: {saved[k]!r} there, {want[k]!r} now" for k in diff)


def check_same_settings(out: Path, config: Any, bookkeeping: set[str] = BOOKKEEPING) -> None:
    """Refuse to reuse a run folder whose ``config.json`` has other settings (bookkeeping fields aside)."""
    what = other_settings(out, config, bookkeeping)
    if what:
        raise ValueError(
            f"{out} holds a run with other settings ({what}); use another --out-dir or delete that folder"
        )


def check_design(cfg: SweepConfig) -> None:
    """The declared primary statistic is one the world's comparison computes, the margin in (0, 1)."""
    from sppo_rl.experiments.protocol import statistic_names

    axes = ("seconds", "episodes", "env_steps") if cfg.world == "control" else ("seconds", "tokens", "flops")
    valid = [n for names in statistic_names(axes) for n in names]
    if cfg.primary is not None and cfg.primary not in valid:
        raise ValueError(f"--primary {cfg.primary}: not a {cfg.world} statistic; valid: {', '.join(valid)}")
    if not 0 < cfg.margin < 1:
        raise ValueError(f"--margin must be in (0, 1), got {cfg.margin}")


def plan(cfg: SweepConfig) -> list[Job]:
    """Check every name and setting, then list the jobs (nothing is started or written)."""
    check_design(cfg)
    if cfg.world == "llm":
        return _plan_llm(cfg)
    if cfg.runs or cfg.llm_args:
        raise ValueError("--runs and --llm-args are settings of --world llm")
    from sppo_rl.agents.algorithms import ALGORITHMS
    from sppo_rl.envs.tasks import TASKS

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
    group = base.wandb.group or root.name  # the runs of a sweep form one wandb group
    batched, single = [], []
    for task in tasks:
        for algo in algos:
            budget = cfg.budgets.get(task, cfg.total_episodes or base.total_episodes)
            folder = root / task / algo
            control = replace(base, algo=algo, task=task, total_episodes=budget, out_dir=str(folder))
            control = replace_flat(control, wandb_group=group)
            coords = ["--algo", algo, "--task", task, "--total-episodes", str(budget)]
            if base.wandb.group is None:
                coords += ["--wandb-group", group]
            for seed in seeds:  # each seed's run as it runs alone: the same settings in either layout
                one = replace(control, seed=seed, out_dir=str(folder / f"seed{seed}"))
                check_same_settings(folder / f"seed{seed}", one)
            why = per_seed_reason(folder, seeds) if cfg.batch_seeds and len(seeds) > 1 else ""
            if cfg.batch_seeds and len(seeds) > 1 and not why:
                text = ",".join(map(str, sorted(seeds)))
                check_same_settings(folder, replace(control, seeds=text))
                args = [*coords, "--seeds", text, "--out-dir", str(folder), *flags]
                batched.append(Job(task, algo, min(seeds), str(folder), args, seeds=tuple(sorted(seeds))))
                continue
            for seed in seeds:
                out = folder / f"seed{seed}"
                args = [*coords, "--seed", str(seed), "--out-dir", str(out), *flags]
                single.append(Job(task, algo, seed, str(out), args, why=why))
    # one seed's jobs seed by seed (every task and algorithm of the first seed first): a partial sweep
    # is balanced
    return batched + sorted(single, key=lambda j: seeds.index(j.seed))


def per_seed_reason(folder: Path, seeds: list[int]) -> str:
    """Why the seeds of ``folder`` (a task and algorithm's) cannot run as one multi-seed job there, in a
    few words; "" when they can: the folder is new, or holds a multi-seed run of these seeds (a folder
    that ``sppo-rl control --seeds`` marked as its own). Not: it holds seed folders without such a run
    (an earlier per-seed sweep's: a multi-seed run there would refuse them as files it did not write), a
    multi-seed run of other seeds, or an unfinished one whose seeds' last checkpoints are not the set's
    (killed between the seeds' checkpoints and the set's: the set cannot resume, each seed alone can)."""
    from sppo_rl.control.config import parse_seeds
    from sppo_rl.runtime.run import is_marked

    if is_marked(folder):
        try:
            there = json.loads((folder / "config.json").read_text()).get("seeds")
        except (OSError, json.JSONDecodeError, AttributeError):
            return ""  # a multi-seed run stopped before it wrote its config: it starts again
        if not there or sorted(parse_seeds(str(there), strict=False)) != sorted(seeds):
            return f"{folder} holds a multi-seed run of other seeds ({there})"
        last = _last_checkpoint(folder)
        if (folder / "summary.json").is_file() or last is None:
            return ""
        if any(_last_checkpoint(folder / f"seed{k}") != last for k in seeds):
            return (
                f"{folder} holds a multi-seed run whose seeds checkpointed past its last checkpoint ({last})"
            )
        return ""
    old = sorted(p.name for p in folder.glob("seed*")) if folder.is_dir() else []
    if old:
        shown = ", ".join(old[:3]) + ", ..." * (len(old) > 3)
        return f"{folder} holds seed folders of a per-seed sweep ({shown}) and no multi-seed run"
    return ""


def _plan_llm(cfg: SweepConfig) -> list[Job]:
    """The LLM world's jobs: every run of ``--runs`` (else one per ``--algos``: ``--algo NAME``) with
    ``--llm-args`` after its own flags, for every seed (:func:`llm_jobs`)."""
    from dataclasses import fields

    from sppo_rl.agents.algorithms import ALGORITHMS

    default = {f.name: f.default_factory() if callable(f.default_factory) else f.default for f in fields(cfg)}
    names = ("tasks", "total_episodes", "budgets", "overrides")
    control = ["--" + k.replace("_", "-") for k in names if getattr(cfg, k) != default[k]]
    if control:
        raise ValueError(
            f"{', '.join(control)}: control settings; an LLM run's task and budget are sppo-rl llm flags "
            '(e.g. --llm-args="--task scratchpad --updates 100")'
        )
    if cfg.workers is not None and cfg.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {cfg.workers}")
    if cfg.runs:
        runs = {}
        for name, text in cfg.runs.items():
            try:
                runs[name] = shlex.split(text)
            except ValueError as e:
                raise ValueError(f"--runs {name}: {e}") from None
    else:
        algos = _unique(cfg.algos)
        bad = [a for a in algos if a not in ALGORITHMS]
        if bad:
            raise ValueError(f"unknown algorithm(s): {', '.join(bad)}; valid: {', '.join(ALGORITHMS)}")
        runs = {a: ["--algo", a] for a in algos}
    try:
        common = shlex.split(cfg.llm_args)
    except ValueError as e:
        raise ValueError(f"--llm-args: {e}") from None
    seeds = _unique(cfg.seeds)
    return llm_jobs(
        [(name, seed, [*flags, *common]) for seed in seeds for name, flags in runs.items()],
        cfg.out_dir,
        threads=None if cfg.workers == 1 else 1,  # runs side by side: one thread each
    )


def parse_llm(flags: list[str], check: bool = True):  # -> LLMConfig
    """The LLMConfig that ``sppo-rl llm <flags>`` would run (tyro's parser; ``--recipe NAME`` or ``--recipe-file FILE`` gives
    the defaults as on the command line), checked as the run checks it before its folder is touched
    (:func:`sppo_rl.llm.plan.resolve`: every setting, the algorithm with its group size and batch shape,
    the model folders, the data and the reward function; ``check=False``: the parse and ``validate`` alone, for a run
    whose settings differ from a checked one only in its seed and folder, which ``resolve`` reads no further);
    ValueError in one line if refused."""
    import contextlib
    import io

    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.models.engines import launcher_dist
    from sppo_rl.llm.plan import resolve
    from sppo_rl.runtime.flags import parse
    from sppo_rl.runtime.recipes import recipe_default
    from sppo_rl.runtime.run import RunError

    try:
        default, flags = recipe_default(LLMConfig, flags)
    except RunError as e:
        raise ValueError(str(e)) from None
    text = io.StringIO()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            cfg = parse(LLMConfig, flags, default=default)
    except SystemExit:
        words = [w.strip(" │╭╮╰╯─-") for w in text.getvalue().splitlines()]
        words = [w for w in words if w and not w.startswith("For full helptext")]
        raise ValueError(" ".join(words[1:] or words) or "refused") from None
    try:
        if check:
            resolve(cfg, launcher_dist())
        else:  # every setting's type and range still (the seed's among them)
            cfg.validate()
    except (RunError, ValueError) as e:
        raise ValueError(str(e)) from None
    return cfg


def llm_config(
    name: str, flags: list[str], seed: int = 0, out_dir: str | None = None, check: bool = True
):  # -> LLMConfig
    """The checked LLMConfig (:func:`parse_llm`) of the run ``name`` with ``flags`` (its own and the common
    ones), seed ``seed``, folder ``out_dir``; ValueError in one line naming the run when ``name`` is no
    plain folder name (:data:`RUN_NAME`), ``flags`` hold a flag the sweep sets (:data:`LLM_OWNED`) or
    ``sppo-rl llm`` refuses them."""
    if not RUN_NAME.fullmatch(name):
        raise ValueError(
            f"run name {name!r}: letters, digits and . _ + - only, starting with a letter or digit"
        )
    owned = [f for f in flags if f.split("=")[0].replace("_", "-") in LLM_OWNED]
    if owned:
        raise ValueError(
            f"{name}: {owned[0]} is set by the sweep (--seeds, --out-dir; --resume or --overwrite as the "
            "run's folder says)"
        )
    full = [*flags, "--seed", str(seed), *(["--out-dir", out_dir] if out_dir else [])]
    try:
        return parse_llm(full, check)
    except ValueError as e:
        raise ValueError(f"{name}: sppo-rl llm refuses its flags: {e}") from None


def llm_jobs(
    specs: list[tuple[str, int, list[str]]],
    out_dir: str | Path,
    *,
    other: typing.Literal["refuse", "overwrite"] = "refuse",
    overwrite: bool = False,
    threads: int | None = None,
) -> list[Job]:
    """The jobs of LLM runs given as ``(name, seed, flags)``, in this order, each in
    ``<out_dir>/<name>/seed<seed>`` with ``--seed``, ``--out-dir`` and the sweep's ``--wandb-group`` (the
    folder's name, unless ``flags`` set one); every run checked first (:func:`llm_config`; ValueError,
    nothing written). A folder holding a run with other settings (:data:`LLM_BOOKKEEPING` aside) is
    refused (``other="refuse"``) or started again (``"overwrite"``); ``overwrite``: every run starts again.
    ``threads``: the ``--threads`` of every run whose flags give none (runs side by side: 1 each, not the
    auto default that takes every CPU; None: their own default)."""
    from sppo_rl.llm.plan import as_given

    root = Path(out_dir).resolve()
    pairs = [(name, seed) for name, seed, _ in specs]
    twice = sorted({f"{n} seed {k}" for n, k in pairs if pairs.count((n, k)) > 1})
    if twice:
        raise ValueError(f"run given twice: {', '.join(twice)}")
    if not specs:
        raise ValueError("a sweep needs at least one run and one seed")
    jobs = []
    checked: set[tuple[str, ...]] = set()  # flag sets resolved once: their other seeds read the same data
    for name, seed, flags in specs:
        if seed < 0:
            raise ValueError(f"seed {seed}: seeds are integers >= 0")
        out = root / name / f"seed{seed}"
        if threads is not None and not any(f == "--threads" or f.startswith("--threads=") for f in flags):
            flags = [*flags, "--threads", str(threads)]
        config = llm_config(name, flags, seed, str(out), check=tuple(flags) not in checked)
        checked.add(tuple(flags))
        args = [*flags, "--seed", str(seed), "--out-dir", str(out)]
        if config.wandb.group is None:  # the runs of a sweep form one wandb group
            args += ["--wandb-group", root.name]
            config = replace_flat(config, wandb_group=root.name)
        diff = other_settings(out, as_given(config), LLM_BOOKKEEPING)  # as its config.json records it
        if diff and other == "refuse":
            raise ValueError(
                f"{out} holds a run with other settings ({diff}); use another --out-dir or delete that folder"
            )
        jobs.append(Job(config.task, name, seed, str(out), args, "llm", overwrite or bool(diff)))
    return jobs


# ------------------------------------------------------------------------------------- one job


def _last_checkpoint(run: Path) -> str | None:
    """The name of ``run``'s last complete checkpoint (``ckpt-<update>`` with its ``meta.json``), or None."""
    names = sorted(p.parent.name for p in (run / "checkpoints").glob("ckpt-*/meta.json"))
    return names[-1] if names else None


def run_mode(out: Path, seeds: tuple[int, ...] = ()) -> str:
    """skip | resume | overwrite | fresh, from what the run folder holds (see the module docstring);
    ``seeds``: ``out`` is a multi-seed run's, whose seed folders count for ``overwrite`` too."""
    if (out / "summary.json").is_file():
        return "skip"
    if any((out / "checkpoints").glob("ckpt-*/meta.json")) and (out / "metrics.jsonl").is_file():
        return "resume"
    for run in [out, *(out / f"seed{k}" for k in seeds)]:
        if (run / "metrics.jsonl").exists() or (run / "checkpoints").exists():
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
        mode = run_mode(out, job.seeds)
        if job.overwrite and mode != "fresh":
            mode = "overwrite"
        if mode == "skip":
            return JobResult("skipped", 0, log=str(log), mode=mode)
        cmd = [sys.executable, "-m", "sppo_rl", job.command, *job.args, "--no-progress"]
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
        self.signum: int | None = None  # the first signal that stopped the sweep

    def handler(self, signum: int, frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop.set()
        if self.signum is None:
            self.signum = signum
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
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def status_table(jobs: list[Job], results: list[JobResult]) -> str:
    """One line per run: task, algo (LLM: the run's name), seed, status, wall seconds, and the log of a
    run that did not finish."""
    what = "run" if any(j.command == "llm" for j in jobs) else "algo"
    lines = [f"{'task':24s} {what:10s} {'seed':>5s}  {'status':16s} {'wall s':>8s}  log"]
    for job, r in zip(jobs, results):
        status = r.status + (f" (rc {r.returncode})" if r.status == "failed" and r.returncode else "")
        log = "" if r.status in FINISHED else r.error if r.status == "busy" else r.log
        for seed, _ in job.runs:  # a multi-seed job's seeds share its status, wall time and log
            lines.append(f"{job.task:24s} {job.algo:10s} {seed:5d}  {status:16s} {r.wall_time_s:8.1f}  {log}")
    return "\n".join(lines)


OnJob = Callable[[Job, JobResult], None]


class SweepResults(list):  # list[JobResult]
    """One :class:`JobResult` per job, and the signal that stopped the sweep (``stopped_by``: its number,
    None when the sweep ran to its end); ``jobs``: the jobs (for counting runs, a seed each)."""

    stopped_by: int | None = None
    jobs: list[Job] | None = None


def sweep(cfg: SweepConfig, jobs: list[Job] | None = None, on_done: OnJob | None = None) -> list[JobResult]:
    """Run the sweep; returns one result per job (in :func:`plan`'s order). Raises only for a bad config, or a folder another sweep
    holds (refused in one line). ``jobs``: these instead of :func:`plan`'s (a script's own run set, made
    by :func:`llm_jobs`; ``cfg`` gives the folder, workers and backend); ``on_done(job, result)``: called
    as each run ends, in place of the sweep's own printing (the sweep then prints nothing)."""
    jobs = plan(cfg) if jobs is None else jobs
    workers = cfg.workers or os.cpu_count() or 1
    root = Path(cfg.out_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    fd = _lock_sweep(root)
    try:
        return _sweep(cfg, jobs, workers, root, on_done)
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


def _sweep(
    cfg: SweepConfig, jobs: list[Job], workers: int, root: Path, report: OnJob | None
) -> list[JobResult]:
    say = print if report is None else lambda *a, **k: None
    manifest: dict[str, Any] = {
        "config": asdict(cfg),
        "started": datetime.now().isoformat(timespec="seconds"),
        "jobs": [{"name": j.name, **asdict(j)} for j in jobs],
    }
    _write_json(root / "sweep.json", manifest)
    runs = [run for j in jobs for _, run in j.runs]
    finished_before = sum((run / "summary.json").is_file() for run in runs)
    batched = sum(bool(j.seeds) for j in jobs)
    say(
        f"sweep: {_count(len(runs), 'run')} ({finished_before} finished before)"
        + (
            f" in {_count(len(jobs), 'process')} ({batched} of several seeds)"
            if len(jobs) < len(runs)
            else ""
        )
        + f", {workers} {cfg.backend} workers -> {root}"
    )
    for why in dict.fromkeys(j.why for j in jobs if j.why):
        say(f"sweep: {why}: one process per seed there")
    results: list[JobResult | None] = [None] * len(jobs)
    count = 0
    lock = threading.Lock()

    def on_done(i: int, r: JobResult) -> None:
        nonlocal count
        with lock:
            results[i] = r
            count += 1
            if report is not None:
                report(jobs[i], r)
            if cfg.progress:
                say(
                    f"[{count}/{len(jobs)}] {r.status:11s} {jobs[i].name} ({r.wall_time_s:.1f} s)", flush=True
                )

    t0 = time.monotonic()
    stop = threading.Event()
    with _Signals(stop) as signals:
        if cfg.backend == "ray":
            _run_ray(jobs, cfg, workers, stop, on_done)
        else:
            _run_local(jobs, workers, stop, on_done)
    final = SweepResults(r or JobResult("not started") for r in results)
    final.stopped_by = signals.signum
    final.jobs = jobs
    wall = time.monotonic() - t0
    manifest.update(
        finished=datetime.now().isoformat(timespec="seconds"),
        wall_time_s=wall,
        results=[{"name": j.name, **asdict(r)} for j, r in zip(jobs, final)],
    )
    _write_json(root / "sweep.json", manifest)
    counts = {s: sum(r.status == s for r in final) for s in dict.fromkeys(r.status for r in final)}
    say("\n" + status_table(jobs, final))
    say(
        f"{_count(len(jobs), 'run' if len(jobs) == len(runs) else 'process')}: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; sweep wall time {wall:.1f} s"
    )
    say(headline(jobs, final, root))
    return final


def _count(n: int, noun: str) -> str:
    """``3 processes``, ``1 process``, ``2 runs``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"


def headline(jobs: list[Job], results: list[JobResult], root: Path) -> str:
    """The sweep's end: tail success of each (task, algorithm) over its finished seeds (the protocol's
    :func:`~sppo_rl.runtime.curves.tail_value` of each run's logged ``success_rate``, as
    ``sppo-rl report`` computes it; LLM runs: of ``val_accuracy``, sampled, and beside it of
    ``val_greedy_accuracy``, greedy, per run name), the folder and the next commands."""
    from sppo_rl.runtime.curves import tail_value
    from sppo_rl.runtime.logging import read_metrics

    llm = any(j.command == "llm" for j in jobs)
    finals: dict[tuple[str, str], list[float]] = {}
    greedy: dict[tuple[str, str], list[float]] = {}
    for job, r in zip(jobs, results):
        for _, run in job.runs:
            metrics = run / "metrics.jsonl"
            if r.status not in FINISHED or not metrics.is_file():
                continue
            key = "val_accuracy" if job.command == "llm" else "success_rate"
            rows = read_metrics(metrics)
            value = tail_value([row.get(key) for row in rows])
            if not math.isnan(value):
                finals.setdefault((job.task, job.algo), []).append(value)
                g = (
                    tail_value([row.get("val_greedy_accuracy") for row in rows])
                    if job.command == "llm"
                    else math.nan
                )
                if not math.isnan(g):
                    greedy.setdefault((job.task, job.algo), []).append(g)
    what = "val accuracy" if llm else "success"

    def greedy_part(key: tuple[str, str], n: int) -> str:
        g = greedy.get(key, [])
        return f" sampled, {sum(g) / len(g):.3f} greedy" if len(g) == n else ""

    lines = [
        f"  {algo if llm else f'{task} / {algo}'}: tail {what} {sum(v) / len(v):.3f}"
        f"{greedy_part((task, algo), len(v))} (mean of {len(v)} seed{'s' * (len(v) > 1)})"
        for (task, algo), v in finals.items()
    ]
    runs = sum(len(v) for v in finals.values())
    first = (
        f"[sppo-rl] done: {runs} finished run{'s' * (runs > 1)}; tail {what} (the last 10% of each run's "
        f"{'evaluations' if llm else 'updates'}) per {'run name' if llm else 'task / algorithm'}:"
        if lines
        else "[sppo-rl] done: no finished run with metrics"
    )
    return "\n".join(
        [first, *lines]
        + [
            f"[sppo-rl] sweep folder: {root} (sweep.json, {'<name>' if llm else '<task>/<algo>'}/seed<k>/)",
            f"[sppo-rl] next: sppo-rl report {root}    tensorboard --logdir {root}",
        ]
    )


def run_sweep(cfg: SweepConfig) -> list[JobResult]:
    """Entry point of ``sppo-rl sweep``: exits non-zero when any run did not finish: ``128 + n`` when
    signal ``n`` stopped the sweep (143 for SIGTERM, 130 for SIGINT: a preemption, told apart from a
    bad flag's 2), else 2 (RunError)."""
    from sppo_rl.runtime.run import RunError

    results = sweep(cfg)
    jobs = getattr(results, "jobs", None) or [None] * len(results)
    seeds = [len(j.runs) if j is not None else 1 for j in jobs]  # runs: a seed each
    total = sum(seeds)
    unfinished = sum(n for n, r in zip(seeds, results) if r.status not in FINISHED)
    stopped_by = getattr(results, "stopped_by", None)
    if stopped_by is not None:
        print(
            f"sppo-rl: stopped by {signal.Signals(stopped_by).name}: {unfinished} of {total} runs "
            "did not finish; run the same command again to finish them",
            file=sys.stderr,
        )
        sys.exit(128 + stopped_by)
    if unfinished:
        raise RunError(
            f"{unfinished} of {total} runs did not finish (logs in the table above); "
            "run the same command again to finish them"
        )
    return results
