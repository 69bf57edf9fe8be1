"""What an LLM run leaves behind: ``final/`` (the actor as a transformers folder with its tokenizer and model
card, the critic, with ``--export-adapter`` the actor's LoRA adapters alone), and ``summary.json``: the
headline numbers of a finished run (:func:`summary_of`), or the reason and counts of a stopped one
(:func:`stopped_summary`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sppo_rl.llm.models.lora import save_adapter
from sppo_rl.llm.stages.row import peak_memory_mb
from sppo_rl.runtime.checkpoint import link_identical, unshare

if TYPE_CHECKING:
    from sppo_rl.llm.build import Models
    from sppo_rl.llm.models.engines import Dist
    from sppo_rl.llm.plan import Plan
    from sppo_rl.llm.trainer import RunState


def export(folder: Path, m: Models, plan: Plan, dist: Dist, ckpt: Path | None = None) -> None:
    """``folder/actor`` (with ``prompt_format.json``: the run's chat template, system prompt and
    instruction), ``folder/critic`` and ``folder/actor-adapter`` of the run's models ``m``
    (:class:`~sppo_rl.llm.build.Models`); all ranks call this (ZeRO-3 gathers the weights), rank 0 writes.
    ``ckpt``: the checkpoint of the same weights (the run's last): the actor's and the critic's weight
    files it holds in the same bytes are hard links to its own (:func:`~sppo_rl.runtime.checkpoint.link_identical`), stored
    once."""
    if dist.main:  # linked by an earlier export: new files, the checkpoint's untouched
        unshare(folder / "actor")
        unshare(folder / "critic")
    m.actor_engine.save_pretrained(folder / "actor")
    if dist.main and ckpt is not None:
        link_identical(folder / "actor", ckpt, "actor")
    if dist.main:
        from sppo_rl.llm.data.prompts import save_format

        m.tokenizer.save_pretrained(folder / "actor")
        save_format(folder / "actor", plan.data.prompt_format)  # how prompts were rendered: read back on load
    if plan.models.export_adapter and m.adapter_config is not None:  # the adapters alone, for peft
        engine = m.actor_engine
        save_adapter(
            getattr(engine, "inner", engine.module),
            folder / "actor-adapter",
            m.adapter_config,
            m.actor_path,
            getattr(engine, "_gather", None),
            write=dist.main,
        )
    if m.critic_engine is not None:
        state = {n: t.detach().to("cpu", copy=True) for n, t in m.critic_engine.full_state_items()}
        if dist.main:
            m.critic.save_pretrained(folder / "critic", tokenizer=m.tokenizer, state_dict=state)
            if ckpt is not None:
                link_identical(folder / "critic", ckpt, "critic")
    dist.barrier()


def greedy_numbers(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The greedy decode's validation accuracy (``val_greedy_accuracy``) at the first and the last
    evaluation that measured it, beside the sampled ``val_accuracy`` (empty when none did)."""
    greedy = [r["val_greedy_accuracy"] for r in evals if r.get("val_greedy_accuracy") is not None]
    if not greedy:
        return {}
    return {"start_greedy_accuracy": greedy[0], "final_greedy_accuracy": greedy[-1]}


def summary_of(
    plan: Plan, state: RunState, rows: list[dict[str, Any]], warmstart: dict[str, Any], dist: Dist, out: Path
) -> dict[str, Any]:
    """A finished run's summary from every row of ``metrics.jsonl``, the run's ``state`` after its last
    update and its ``plan``; ``warmstart``: what the embedded model's warm start reported. Rank 0 also
    writes the exported actor's model card (with the run's not-learning warnings) into ``out/final`` and
    makes ``final/`` readable as the umask allows."""
    evals = [r for r in rows if r.get("val_accuracy") is not None]
    summary = {
        "algo": plan.algo.name,
        "seed": plan.loop.seed,
        "updates": state.updates,
        "group_size": plan.rollout.group_size,
        "ranks": dist.world,
        "wall_time_s": state.elapsed,
        "generated_tokens": state.generated_tokens,
        "flops_total": sum(state.flops.values()),
        **{f"flops_{k}": v for k, v in state.flops.items()},
        "start_val_accuracy": evals[0]["val_accuracy"] if evals else None,
        "final_val_accuracy": evals[-1]["val_accuracy"] if evals else None,
        "best_val_accuracy": max(r["val_accuracy"] for r in evals) if evals else None,
        **greedy_numbers(evals),
        "peak_memory_mb": peak_memory_mb(plan.device),
        "warmstart": warmstart,
    }
    if dist.main:
        from sppo_rl.llm.outputs.card import write_model_card
        from sppo_rl.runtime.files import follow_umask
        from sppo_rl.runtime.watch import not_learning

        warnings = [w["message"] for w in not_learning(rows)]
        write_model_card(out / "final" / "actor", plan, summary, rows, warnings)
        follow_umask(out / "final")
    return summary


def stopped_summary(
    out: Path, plan: Plan, state: RunState, row: dict[str, Any], reason: str, last_error: str | None
) -> None:
    """``summary.json`` of a run stopped by :class:`~sppo_rl.runtime.run.RunFailed`: ``stopped`` (the
    reason), the run's counts from its ``state``, the stopping update's ``row`` and the verifier's
    ``last_error`` (rank 0)."""
    from sppo_rl.runtime.files import atomic_write_text
    from sppo_rl.runtime.logging import json_safe

    summary = {
        "algo": plan.algo.name,
        "seed": plan.loop.seed,
        "updates": state.updates,
        "stopped": reason,
        "flops_total": sum(state.flops.values()),
        "reward_failed_updates": state.fail_streak,
        "verifier_errors": row.get("verifier_errors"),
        "last_error": last_error,
    }
    text = json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False)
    atomic_write_text(out / "summary.json", text + "\n")
