"""``sppo-rl control --seeds 0-15``: ``S`` seeds' runs in one process, each exactly its single run.

:class:`SeedRuns` holds one :class:`~sppo_rl.control.trainer.ControlRun` per seed, each built from the
config with ``--seed K --out-dir <out>/seed<K>`` (so ``<out>/seed<K>`` is that single run's folder:
``config.json``, ``metrics.jsonl``, ``checkpoints/``, ``final.pt``, ``summary.json``, resumable alone), and
steps them together. One update:

1. every seed draws its start states from its own ``seed_rng`` (``ControlRun.draw``), and
   :func:`~sppo_rl.control.rollout.collect_seeds` runs all ``S x n`` episodes in one vector env, the
   actors stacked (:class:`~sppo_rl.control.stack.StackedActor`), each seed sampling from its own
   generator only while its episodes run;
2. every seed trains on its own rollout with its own networks, optimisers and minibatch order
   (``ControlRun.train``, the shared learner unchanged), seed after seed: measured, a stacked
   training pass was no faster at minibatch sizes and could not be exact (:mod:`sppo_rl.control.stack`);
3. every seed's counters and row (``ControlRun.record``); the seconds are the whole update's (the
   seeds share them), so a seed's ``sps`` is its steps over the wall time and ``<out>``'s is the sum.

So seed ``K``'s run is bit for bit the single run of seed ``K`` (the single run acts through the stack of
one: ``tests/test_seed_batch.py``), its timings aside. The run loop (:func:`~sppo_rl.runtime.loop.run_loop`)
drives the set as one run: its row holds the seeds' rows (``seed_rows``), which :class:`SeedLogs` writes to
each seed's log, and their mean (sums of the counters) to ``<out>/metrics.jsonl``; a checkpoint saves every
seed's (and a preempted update's deferred row in each), then ``<out>/checkpoints`` records the update; a
resumed set resumes every seed from its checkpoint of that update. A non-finite loss in any seed stops
the whole set (the message names the step, not the seed: its folder's log ends there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sppo_rl.control.config import ControlConfig, parse_seeds
from sppo_rl.control.plan import resolve, schedule
from sppo_rl.control.rollout import collect_seeds
from sppo_rl.control.stack import StackedActor
from sppo_rl.runtime.checkpoint import CheckpointManager, torch_load, torch_save
from sppo_rl.runtime.files import atomic_write_text
from sppo_rl.runtime.logging import json_safe, read_metrics, start_logging
from sppo_rl.runtime.loop import DEFERRED, progress_bar, run_loop
from sppo_rl.runtime.run import RunError, check_resume, prepare_run_dir, unlock_run_dir
from sppo_rl.runtime.watch import not_learning

SUMMED = ("episodes", "env_steps", "sps", "update_sps")
"""Row keys ``<out>/metrics.jsonl`` sums over the seeds (the others: their mean)."""


def seed_config(cfg: ControlConfig, seed: int) -> ControlConfig:
    """Seed ``seed``'s single run in the multi-seed run of ``cfg``: ``--seed seed --out-dir <out>/seed<seed>``."""
    return replace(cfg, seeds=None, seed=seed, out_dir=str(Path(cfg.out_dir) / f"seed{seed}"))


def mean_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The seeds' rows as one: each number every row has, summed (:data:`SUMMED`) or averaged; ``update``
    as it is."""
    out: dict[str, Any] = {}
    for key, value in rows[0].items():
        values = [r.get(key) for r in rows]
        if isinstance(value, bool) or not all(isinstance(v, (int, float)) for v in values):
            continue
        out[key] = value if key == "update" else sum(values) if key in SUMMED else sum(values) / len(values)
    return out


class SeedLogs:
    """The set's metrics log: a row's ``seed_rows`` (with ``seed_evals``, the evaluation, merged in) go to
    each seed's own log at the seed's own step (its ``env_steps``), the rest to ``<out>``'s."""

    def __init__(self, main: Any, seeds: list[Any]) -> None:
        self.main, self.seeds = main, seeds

    def log(self, row: dict[str, Any], step: int) -> None:
        evals = row.get("seed_evals") or [{}] * len(self.seeds)
        for log, r, e in zip(self.seeds, row["seed_rows"], evals):
            log.log({**r, **e}, step=int(r["env_steps"]))
        self.main.log({k: v for k, v in row.items() if k not in ("seed_rows", "seed_evals")}, step)

    def position(self) -> int:
        return self.main.position()

    def close(self) -> None:
        self.main.close()


class SeedRuns:
    """The seeds of ``cfg.seeds`` as one run for :func:`~sppo_rl.runtime.loop.run_loop` (see the module
    docstring); ``make_run(cfg, env)`` builds one seed's run (:class:`~sppo_rl.control.trainer.ControlRun`,
    given by the trainer, which imports this module). Every setting is checked (the plan, each seed's)
    before a file is touched."""

    def __init__(self, cfg: ControlConfig, make_run: Callable[..., Any]) -> None:
        from sppo_rl.envs.tasks import make_episode_env

        self.seeds = parse_seeds(cfg.seeds or "")
        self.plan = plan = resolve(cfg)
        for k in self.seeds:
            resolve(seed_config(cfg, k))  # each seed's settings (its seed's range) before any file
        loop, r = plan.loop, plan.resolved
        self.out = prepare_run_dir(loop.out_dir, resume=loop.resume, overwrite=loop.overwrite)
        if loop.resume:
            check_resume(self.out, plan.given)
        n = r.episodes_per_update + r.greedy_per_update
        self._stage_env = make_episode_env(plan.spec, num_envs=n, dense=plan.dense)  # A*-PO's stage 1
        self.runs: list[Any] = []  # ControlRun
        self.rng: list[torch.Tensor] = []  # each seed's torch generator state (as in its checkpoint)
        for k in self.seeds:
            self.runs.append(make_run(seed_config(cfg, k), env=self._stage_env))
            self.rng.append(torch.get_rng_state())
        self.env = make_episode_env(plan.spec, num_envs=len(self.seeds) * n, dense=plan.dense)
        self.ckpts = CheckpointManager(self.out / "checkpoints", keep=loop.keep_checkpoints)

        def load(ckpt: Path) -> None:
            update = int(torch_load(ckpt / "state.pt")["update"])
            behind = [k for k, run in zip(self.seeds, self.runs) if run.updates != update]
            if behind:
                raise RunError(
                    f"{ckpt} is update {update} but seed(s) {behind} resumed at another update: resume "
                    "each seed alone (sppo-rl control --out-dir <out>/seed<K> --resume)"
                )

        ckpt = self.ckpts.resume(load) if loop.resume else None
        resolved = {"seeds": self.seeds, "seed_dirs": [run.out.name for run in self.runs]}
        self.logger = SeedLogs(
            start_logging(self.out, plan.given, resolved, ckpt, world="control"),
            [run.logger for run in self.runs],
        )

    @property
    def signal(self) -> str:
        return self.runs[0].signal

    @property
    def updates(self) -> int:
        return self.runs[0].updates

    @property
    def elapsed(self) -> float:
        return self.runs[0].elapsed

    def run(self, callback: Any = None) -> dict[str, Any]:
        """Train every seed to the budget (:func:`~sppo_rl.runtime.loop.run_loop`); ``callback(row)``
        receives the set's row (``seed_rows`` in it), ``False`` stops the set."""
        loop = self.plan.loop
        desc = f"{self.plan.algo.name}/{self.plan.spec.name} x{len(self.seeds)} seeds"
        return run_loop(
            self,
            schedule(loop),
            resume_hint=f"sppo-rl control --out-dir {self.out} --seeds {self.plan.given.seeds} --resume",
            bar=progress_bar(loop.progress, loop.updates, self.updates, desc),
            postfix=lambda row: {"success": f"{row['success_rate']:.2f}", "sps": f"{row['sps']:.0f}"},
            callback=callback,
        )

    def update(self) -> dict[str, Any]:
        """One update of every seed (the module docstring's steps 1-3); the set's row."""
        t0 = time.perf_counter()
        draws = [run.draw() for run in self.runs]
        for run in self.runs:
            run.actor.eval()
        episodes = collect_seeds(
            self.env,
            StackedActor([run.actor for run in self.runs], compiled=self.runs[0].compiled),
            np.stack([d[0] for d in draws]),
            self.plan.resolved.horizon,
            draws[0][2],
            [run.sample_gen for run in self.runs],
        )
        rollouts = [run.rollout(ep, d[1], d[3]) for run, ep, d in zip(self.runs, episodes, draws)]
        t_collect = time.perf_counter() - t0
        trained = []
        for i, (run, rollout) in enumerate(zip(self.runs, rollouts)):
            torch.set_rng_state(self.rng[i])
            trained.append(run.train(rollout))
            self.rng[i] = torch.get_rng_state()
        dt = time.perf_counter() - t0
        rows = [
            run.record(ro, lr, m, t_collect, dt) for run, ro, (lr, m) in zip(self.runs, rollouts, trained)
        ]
        return {**mean_row(rows), "seeds": len(rows), "seed_rows": rows}

    def evaluate(self) -> dict[str, Any]:
        """Every seed's periodic evaluation (``seed_evals``) and their mean."""
        evals = [run.evaluate() for run in self.runs]
        return {**mean_row(evals), "seed_evals": evals}

    def save_checkpoint(self) -> Path:
        """Every seed's checkpoint (a deferred row: each seed's part in its own), then the set's."""
        deferred = self.ckpts.next_meta.get(DEFERRED)
        for i, run in enumerate(self.runs):
            if deferred is not None:
                r = deferred["row"]["seed_rows"][i]
                e = (deferred["row"].get("seed_evals") or [{}] * len(self.runs))[i]
                run.ckpts.next_meta[DEFERRED] = {"row": {**r, **e}, "step": int(r["env_steps"])}
            torch.set_rng_state(self.rng[i])
            run.save_checkpoint()
            run.ckpts.next_meta.pop(DEFERRED, None)
        update = self.updates
        state = {"update": update, "seeds": self.seeds}
        meta = {
            "metrics_bytes": self.logger.position(),
            "episodes": sum(run.state.episodes for run in self.runs),
            "algo": self.plan.algo.name,
            "log_step": sum(run.state.env_steps for run in self.runs),
        }
        return self.ckpts.save(update, lambda d: torch_save(state, d / "state.pt"), meta)

    def finish(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Every seed's end as its single run's (its summary from its own rows, the exports, its
        ``summary.json`` with its warnings); the set's summary: their mean, and each seed's."""
        summaries = []
        for run in self.runs:
            seed_rows = read_metrics(run.out / "metrics.jsonl")
            s = run.finish(seed_rows)
            s["warnings"] = [w["message"] for w in not_learning(seed_rows, run.signal)]
            text = json.dumps(json_safe(s), indent=2, default=str, allow_nan=False)
            atomic_write_text(run.out / "summary.json", text + "\n")
            summaries.append(s)
        return {
            **mean_row(summaries),
            "algo": self.plan.algo.name,
            "task": self.plan.spec.name,
            "seed": None,
            "seeds": self.seeds,
            "seed_summaries": summaries,
            "tail_success_rate": _mean([s["tail_success_rate"] for s in summaries]),
        }

    def close(self) -> None:
        for run in self.runs:
            run.close()
        self.logger.close()
        self.env.close()
        self._stage_env.close()
        unlock_run_dir(self.out)


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def seeds_headline(s: dict[str, Any]) -> str:
    """The set's headline numbers in one line (the console's ``done:`` line)."""
    tails = [x["tail_success_rate"] for x in s["seed_summaries"] if x["tail_success_rate"] is not None]
    spread = f" (seeds {min(tails):.3f} to {max(tails):.3f})" if tails else ""
    mean = "n/a" if s["tail_success_rate"] is None else f"{s['tail_success_rate']:.3f}"
    return (
        f"{s['algo']} on {s['task']}, {len(s['seeds'])} seeds: mean success {mean}{spread} (tail: mean of the "
        f"last 10% of updates); {int(s['updates'])} updates each in {s['wall_time_s']:.1f} s of training"
    )
