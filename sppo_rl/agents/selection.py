"""Selectors: which positions of a batch the policy loss is taken over.

A selector is a plain function registered in :data:`SELECTORS`, with the keyword contract::

    loss_mask = SELECTORS[name](mask=..., rewards=..., group_ids=..., advantages=..., **params)

returning a ``[B, T]`` float mask that is a subset of ``mask`` (1 = the position is trained on).
An :class:`~sppo_rl.agents.algorithms.Algorithm` names its selector; without one, every valid
position is trained on. Extra keywords are ignored.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

Selector = Callable[..., Tensor]
SELECTORS: dict[str, Selector] = {}


def register_selector(name: str) -> Callable[[Selector], Selector]:
    """Decorator: add ``fn`` to :data:`SELECTORS` under ``name``."""

    def deco(fn: Selector) -> Selector:
        if name in SELECTORS:
            raise ValueError(f"selector {name!r} is already registered")
        SELECTORS[name] = fn
        return fn

    return deco


def get_selector(name: str) -> Selector:
    """The selector registered as ``name`` (the variants' own register when :mod:`sppo_rl.agents` is
    imported, which happens before any of its modules)."""
    try:
        return SELECTORS[name]
    except KeyError:
        raise KeyError(f"unknown selector {name!r}; valid: {', '.join(sorted(SELECTORS))}") from None
