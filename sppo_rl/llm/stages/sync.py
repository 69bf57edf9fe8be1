"""Stage 6, ``sync``: the rollout samples the next update with the actor's new weights. A rollout that
samples from the trained module itself (``shares_actor``) needs nothing; any other is woken (vLLM's sleep
mode) and gets the actor's state, with LoRA the adapted modules' merged weights only (``partial``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sppo_rl.llm.build import TrainingEngine
    from sppo_rl.llm.rollout.base import Rollout


def sync(rollout: Rollout, actor_engine: TrainingEngine, lora: bool) -> None:
    """Push ``actor_engine``'s weights into ``rollout`` unless it samples from the actor itself."""
    if rollout.shares_actor:
        return
    rollout.wake_up()
    rollout.update_weights(
        actor_engine.sync_state_items(), partial=lora
    )  # with LoRA: adapted modules, merged
