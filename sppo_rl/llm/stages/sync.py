"""Stage 6, ``sync``: the rollout samples the next update with the actor's new weights. A rollout that
samples from the trained module itself needs nothing; any other gets the actor's state (with LoRA the
adapted modules' merged weights only, where the rollout takes a partial update)."""

from __future__ import annotations

from typing import Any


def sync(rollout: Any, actor_engine: Any, separate: bool, cfg: Any) -> None:
    """Push ``actor_engine``'s weights into ``rollout`` when it holds its own copy (``separate``)."""
    if not separate:
        return
    if cfg.vllm_sleep and hasattr(rollout, "wake_up"):
        rollout.wake_up()
    items = actor_engine.sync_state_items()  # with LoRA: the adapted modules, merged
    if cfg.lora_rank and cfg.rollout == "vllm":
        rollout.update_weights(items, partial=True)
    else:
        rollout.update_weights(items)
