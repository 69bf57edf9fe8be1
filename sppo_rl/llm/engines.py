"""Training engines: one interface over plain torch and DeepSpeed ZeRO.

The trainer calls only these methods, so the same update code runs on one CPU process or on a
multi-GPU DeepSpeed job:

- ``engine.module``: the model to call (``forward``);
- ``engine.backward(loss)`` then ``engine.step() -> grad_norm`` (clip, optimizer step, zero grads);
- ``engine.optimizer_state()`` / ``engine.load_optimizer_state(state)`` for checkpoints;
- ``engine.full_state_items()``: ``(name, full tensor)`` pairs one at a time (ZeRO-3 gathers each
  parameter only while it is yielded), for saving and for pushing weights into a rollout engine;
- ``engine.save_pretrained(folder)``: a Hugging Face folder of the full model, written by rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn


class TrainEngine(Protocol):
    module: nn.Module

    def backward(self, loss: Tensor) -> None: ...

    def step(self) -> float: ...

    def zero_grad(self) -> None: ...

    def optimizer_state(self) -> dict[str, Any]: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def full_state_items(self) -> Iterator[tuple[str, Tensor]]: ...

    def save_pretrained(self, folder: str | Path, **kwargs: Any) -> None: ...


class TorchEngine:
    """Plain PyTorch: AdamW over the module's trainable parameters, global-norm gradient clipping."""

    def __init__(
        self, module: nn.Module, lr: float, weight_decay: float = 0.0, max_grad_norm: float | None = 1.0
    ):
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))
        self.max_grad_norm = max_grad_norm

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def grad_norm(self) -> float:
        """Global gradient norm before clipping (clips in place when ``max_grad_norm`` is set)."""
        if self.max_grad_norm is None:
            norms = [p.grad.detach().norm() for p in self.params if p.grad is not None]
            return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
        return float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))

    def step(self) -> float:
        """Clip, check, step, zero. A non-finite gradient norm skips the step and is returned as is."""
        gn = self.grad_norm()
        if torch.isfinite(torch.tensor(gn)):
            self.optimizer.step()
        self.zero_grad()
        return gn

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def full_state_items(self) -> Iterator[tuple[str, Tensor]]:
        yield from self.module.state_dict().items()

    def save_pretrained(self, folder: str | Path, **kwargs: Any) -> None:
        self.module.save_pretrained(folder, **kwargs)
