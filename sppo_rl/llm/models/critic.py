"""The critics: an ``AutoModel`` backbone plus a one-output linear head, saved as a plain Hugging Face
folder beside the head's weights and json marker.

- :class:`SequenceCritic` (SPPO) reads the hidden state of the last prompt token and returns one
  success logit per prompt, ``sigmoid(logit) = P(R = 1 | prompt)``; it never sees the response.
- :class:`StepCritic` (PPO) returns ``V(s_t)`` for every response position ``t``, read at the
  position preceding response token ``t`` (verl's convention).
- The backbone may be a smaller model than the actor's, with the same tokenizer
  (:func:`~sppo_rl.llm.models.checks.check_same_tokenizer`); rows follow the token layout of
  :mod:`sppo_rl.llm.models.core`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel, PreTrainedTokenizerBase

from sppo_rl.llm.models.core import _from_pretrained, positions_from_mask, resolve_dtype
from sppo_rl.llm.models.lora import lora_layers, merged_state_items

HEAD_WEIGHTS = "value_head.safetensors"
HEAD_CONFIG = "value_head.json"
_HEAD_FORMAT_VERSION = 1


class _HeadOnlyReport(logging.Filter):
    """Drops transformers' load report of a base model read from a causal-LM folder when all it reports
    is the language-model head's weights (``lm_head.*`` UNEXPECTED): a critic's backbone has no place for
    them, by design. Any other key (missing, mismatched, unexpected elsewhere) keeps the report."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(record.getMessage()))
        if "LOAD REPORT" not in text:
            return True
        rows = [[c.strip() for c in line.split("|")] for line in text.splitlines() if line.count("|") >= 2]
        keys = [r for r in rows[1:] if r[0] and not set(r[0]) <= set("-+")]
        return not keys or not all(k[0].startswith("lm_head.") and k[1] == "UNEXPECTED" for k in keys)


@contextlib.contextmanager
def _head_report_dropped() -> Iterator[None]:
    log = logging.getLogger("transformers.modeling_utils")
    drop = _HeadOnlyReport()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


class _ValueHeadModel(nn.Module):
    """An ``AutoModel`` backbone plus a linear head with one output (shared by both critics).

    Saved as the backbone's Hugging Face folder plus :data:`HEAD_WEIGHTS` (``weight``, ``bias``) and
    :data:`HEAD_CONFIG` (``{"kind": ..., "hidden_size": ...}``), so the backbone folder stays loadable
    by any HF tool. The head is float32 by default; backbone hidden states are cast to its dtype.
    """

    kind: ClassVar[str] = ""

    def __init__(
        self,
        backbone: PreTrainedModel,
        head: nn.Linear | None = None,
        *,
        init_bias: float = 0.0,
        init_std: float = 1e-3,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        hidden_size = _hidden_size(backbone.config)
        if head is None:
            head = nn.Linear(hidden_size, 1, device=_module_device(backbone), dtype=torch.float32)
            nn.init.normal_(head.weight, std=init_std)
            nn.init.constant_(head.bias, init_bias)
        if head.in_features != hidden_size or head.out_features != 1:
            raise ValueError(
                f"head must map {hidden_size} -> 1, got {head.in_features} -> {head.out_features}"
            )
        self.head = head

    @property
    def config(self):
        """The backbone's config."""
        return self.backbone.config

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @classmethod
    def from_backbone(
        cls,
        path: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        init_bias: float = 0.0,
        init_std: float = 1e-3,
        **kwargs: Any,
    ):
        """A fresh critic: the base model of the (causal-LM) folder ``path`` and a new head.

        ``init_bias`` is the head's initial output (a logit for :class:`SequenceCritic`: 0 means a
        prior of 0.5; the dataset's base pass rate ``p0`` gives ``log(p0 / (1 - p0))``); the head's
        weights start ``N(0, init_std^2)`` so early outputs stay near that prior.
        """
        with _head_report_dropped():
            backbone = _from_pretrained(AutoModel, path, dtype, **kwargs)
        if device is not None:
            backbone = backbone.to(device)
        return cls(backbone, init_bias=init_bias, init_std=init_std)

    def save_pretrained(
        self,
        folder: str | os.PathLike,
        tokenizer: PreTrainedTokenizerBase | None = None,
        state_dict: dict[str, Tensor] | None = None,
    ) -> Path:
        """Write the backbone (HF format), the head and its json marker (and ``tokenizer``) to ``folder``.

        ``state_dict`` (keys ``backbone.*`` and ``head.*``, e.g. gathered from ZeRO-3 shards) replaces
        the module's own tensors. A backbone with LoRA adapters is written merged (a plain HF folder).
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if state_dict is None and lora_layers(self):
            state_dict = dict(merged_state_items(self))
        if state_dict is None:
            self.backbone.save_pretrained(folder)
            weight, bias = self.head.weight, self.head.bias
        else:
            backbone = {
                k.removeprefix("backbone."): v for k, v in state_dict.items() if k.startswith("backbone.")
            }
            self.backbone.save_pretrained(folder, state_dict=backbone)
            weight, bias = state_dict["head.weight"], state_dict["head.bias"]
        head = {"weight": weight.detach().cpu().contiguous(), "bias": bias.detach().cpu().contiguous()}
        save_file(head, str(folder / HEAD_WEIGHTS), metadata={"kind": self.kind})
        marker = {
            "kind": self.kind,
            "hidden_size": self.head.in_features,
            "head_dtype": str(self.head.weight.dtype).removeprefix("torch."),
            "format_version": _HEAD_FORMAT_VERSION,
        }
        (folder / HEAD_CONFIG).write_text(json.dumps(marker, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return folder

    def load_saved(self, folder: str | os.PathLike) -> None:
        """Load back, exactly, the tensors :meth:`save_pretrained` wrote to ``folder`` (a checkpoint's
        critic: the backbone's ``model*.safetensors`` and :data:`HEAD_WEIGHTS`); a backbone file of another
        model raises ``RuntimeError`` (``load_state_dict``, strict)."""
        folder, backbone = Path(folder), {}
        for file in sorted(folder.glob("model*.safetensors")):
            backbone.update(load_file(str(file)))
        self.backbone.load_state_dict(backbone)
        self.head.load_state_dict(load_file(str(folder / HEAD_WEIGHTS)))

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ):
        """Load a critic written by :meth:`save_pretrained`; refuses a folder of the other critic kind."""
        folder = Path(folder)
        marker_file = folder / HEAD_CONFIG
        if not marker_file.is_file():
            raise FileNotFoundError(
                f"{folder} holds no critic head ({HEAD_CONFIG} missing); use from_backbone"
            )
        marker = json.loads(marker_file.read_text())
        if marker.get("kind") != cls.kind:
            raise ValueError(f"{folder} holds a {marker.get('kind')!r} critic, not a {cls.kind!r} one")
        backbone = _from_pretrained(AutoModel, folder, dtype, **kwargs)
        state = load_file(str(folder / HEAD_WEIGHTS))
        head_dtype = resolve_dtype(marker.get("head_dtype", "float32"))
        head = nn.Linear(marker["hidden_size"], 1, dtype=head_dtype)
        head.load_state_dict(state)
        if device is not None:
            backbone = backbone.to(device)
        return cls(backbone, head.to(_module_device(backbone)))

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """Activation checkpointing in the backbone (HF's switch)."""
        self.backbone.gradient_checkpointing_enable(**kwargs)

    def _hidden(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
        )
        return out.last_hidden_state

    def _head(self, hidden: Tensor) -> Tensor:
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


class SequenceCritic(_ValueHeadModel):
    """SPPO's critic ``V(s_p)``: one success logit per prompt, read at the last prompt token.

    ``forward(input_ids, attention_mask, response_len=0) -> logits [B]`` with
    ``sigmoid(logits) = P(R = 1 | prompt)``, on prompts or on ``[prompt | response]`` rows whose last
    ``response_len`` columns (the response) it drops: the same call as :class:`StepCritic`'s.
    Prompts must be left-padded, so column ``-1`` holds every row's last prompt token; the backbone is
    causal, so that hidden state summarises the whole prompt and nothing else. Trained with
    BCE-with-logits against ``R`` (:func:`sppo_rl.agents.losses.bce_value_loss`).
    """

    kind: ClassVar[str] = "sequence"

    def forward(self, input_ids: Tensor, attention_mask: Tensor, response_len: int = 0) -> Tensor:
        T = int(response_len)
        if T > 0:
            input_ids, attention_mask = input_ids[:, :-T], attention_mask[:, :-T]
        if not bool((attention_mask[:, -1] != 0).all()):
            raise ValueError("prompts must be left-padded: the last column must be a real token in every row")
        return self._head(self._hidden(input_ids, attention_mask)[:, -1])


class StepCritic(_ValueHeadModel):
    """PPO's critic ``V(s_t)`` on every response token.

    ``forward(input_ids, attention_mask, response_len) -> values [B, T]`` on ``[prompt | response]``
    rows, where ``values[:, t] = V(state before response token t)``: the head read at column
    ``P + t - 1`` (the last prompt token for ``t = 0``). Values at padded positions are meaningless.
    """

    kind: ClassVar[str] = "token"

    def forward(self, input_ids: Tensor, attention_mask: Tensor, response_len: int) -> Tensor:
        T = int(response_len)
        if T <= 0 or T >= input_ids.shape[1]:
            raise ValueError(f"response_len must be in [1, {input_ids.shape[1] - 1}], got {T}")
        hidden = self._hidden(input_ids, attention_mask)
        return self._head(hidden[:, -(T + 1) : -1])


CRITICS: dict[str, type[_ValueHeadModel]] = {"step": StepCritic, "sequence": SequenceCritic}
"""The critic class for each :attr:`~sppo_rl.agents.advantages.Requirements.critic` kind."""


def _hidden_size(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.hidden_size)


def _module_device(module: nn.Module) -> torch.device:
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")
