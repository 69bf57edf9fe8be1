"""The end of a control run: its summary (``summary.json``), its exports (``final.pt``,
``calibration.json``, ``critic_trace.npz``) and the console's headline. The summary is computed from the
rows of ``metrics.jsonl`` (so a resumed run summarises the whole run), the run's counters and its plan,
never from the trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sppo_rl.config import flat_dict
from sppo_rl.control.actor_files import save_actor_file
from sppo_rl.control.evaluate import calibration, critic_trace
from sppo_rl.control.networks import Actor, Critic
from sppo_rl.control.plan import Plan
from sppo_rl.runtime.curves import tail_value
from sppo_rl.runtime.files import atomic_write_text
from sppo_rl.runtime.trace import TRACE_FILE

if TYPE_CHECKING:
    from sppo_rl.control.trainer import RunState


def summary_of(rows: list[dict[str, Any]], state: RunState, plan: Plan) -> dict[str, Any]:
    """The run's summary: who and what (algorithm, task, seed), the counters of ``state``, and
    ``tail_success_rate``, the comparison protocol's tail (:func:`sppo_rl.runtime.curves.tail_value`:
    the mean ``success_rate`` of the last ``max(1, ceil(0.1 n))`` of the ``n`` updates in ``rows``; None
    when no row has one), the number ``sppo-rl sweep`` and ``sppo-rl report`` print for the same run."""
    final = tail_value([r.get("success_rate") for r in rows])
    return {
        "algo": plan.algo.name,
        "task": plan.spec.name,
        "seed": plan.loop.seed,
        "updates": state.update,
        "episodes": state.episodes,
        "env_steps": state.env_steps,
        "wall_time_s": state.elapsed,
        "sps": state.env_steps / max(state.elapsed, 1e-9),
        "tail_success_rate": None if math.isnan(final) else final,
    }


def write_exports(
    out: Path, plan: Plan, actor: Actor, critic: Critic | None, summary: dict[str, Any]
) -> None:
    """``calibration.json`` (a per-episode critic's), ``critic_trace.npz`` (any critic's) and
    ``final.pt``: the actor with the summary, the config and the observation's settings as its meta."""
    cal = calibration(actor, critic, plan)
    if cal is not None:
        atomic_write_text(out / "calibration.json", json.dumps(cal) + "\n")
    critic_trace(actor, critic, plan, out / TRACE_FILE)
    meta = {"summary": summary, "config": flat_dict(plan.given)}
    meta["observation"] = {"horizon": plan.resolved.horizon, "appended": plan.spec.appended}
    save_actor_file(out / "final.pt", actor, meta)


def headline(s: dict[str, Any]) -> str:
    """The summary's headline numbers in one line (the console's ``done:`` line)."""
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    return (
        f"{s['algo']} on {s['task']}, seed {s['seed']}: success {fmt(s['tail_success_rate'])} (tail: mean of the last 10% of updates)"
        + (f", greedy {fmt(s['final_eval_success_rate'])}" if "final_eval_success_rate" in s else "")
        + f"; {s['updates']} updates, {s['episodes']} episodes in {s['wall_time_s']:.1f} s of training"
    )
