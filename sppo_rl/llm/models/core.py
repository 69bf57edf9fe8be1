"""Actor and critics over Hugging Face causal LMs, and the trainer's log-probs.

Token layout shared by the rollout engine, the trainer and the critics (``P`` prompt columns, ``T``
response columns)::

    input_ids      = [ <pad> ... <pad> p_1 ... p_k | r_1 ... r_m <pad> ... <pad> ]   # [B, P + T]
    attention_mask = [   0   ...   0    1  ...  1  |  1  ...  1    0   ...   0   ]

Prompts are LEFT-padded (the last prompt token sits in column ``P - 1`` of every row) and responses
RIGHT-padded. Position ids count real tokens only (:func:`positions_from_mask`), exactly as during
generation, so a row's numbers do not depend on how much padding its batch needed.

- The actor is any ``AutoModelForCausalLM`` folder (:func:`load_actor`).
- :class:`SequenceCritic` (SPPO) reads the hidden state of the last prompt token and returns one
  success logit per prompt, ``sigmoid(logit) = P(R = 1 | prompt)``; it never sees the response.
- :class:`StepCritic` (PPO) returns ``V(s_t)`` for every response position ``t``, read at the
  position preceding response token ``t`` (verl's convention).
- Both critics are an ``AutoModel`` backbone (possibly a smaller model than the actor, with the same
  tokenizer: :func:`check_same_tokenizer`) plus a one-output linear head.
- LoRA (:func:`apply_lora`, ``--lora-rank``): low-rank adapters on named linear modules of the actor and
  of the critic's backbone; :func:`merged_state_items` gives the merged weights under the base model's
  names (exports, rollout engines), :class:`BaseModelView` the base model (adapters off) as KL reference.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

HEAD_WEIGHTS = "value_head.safetensors"
HEAD_CONFIG = "value_head.json"
_HEAD_FORMAT_VERSION = 1
_DEFAULT_CHUNK_ELEMENTS = 1 << 27  # logits elements per log-softmax chunk (512 MiB in float32)


# ------------------------------------------------------------------------------------ helpers


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that count real tokens: ``pos[b, i] = max(sum_{j <= i} mask[b, j] - 1, 0)``.

    Left padding gets position 0 (it is masked out anyway), the first real token position 0, and a
    token's position is the same whatever padding precedes it.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str:
    """``None`` or ``"auto"`` -> ``"auto"`` (the checkpoint's own dtype); ``"bfloat16"`` -> ``torch.bfloat16``."""
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP / DeepSpeed wrappers (their ``.module``)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def accepts_kwarg(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` (unwrapped) declares a parameter called ``name``."""
    return name in inspect.signature(_unwrap(model).forward).parameters


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


def _from_pretrained(auto_cls: Any, path: str | os.PathLike, dtype: torch.dtype | str | None, **kwargs: Any):
    """``auto_cls.from_pretrained`` offline, passing the dtype under the name this transformers uses. A
    pickled weights file that holds more than tensors (transformers reads it with ``weights_only=True``:
    nothing in it runs) is one ``ValueError`` line naming the file (:func:`check_weight_files`)."""
    import pickle

    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    kwargs.setdefault(dtype_key, resolve_dtype(dtype))
    try:
        return auto_cls.from_pretrained(path, local_files_only=True, **kwargs)
    except pickle.UnpicklingError:
        check_weight_files(
            path, "model folder"
        )  # names the file; the error's own text advises weights_only=False
        raise


PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth")
"""Weight files of a model folder written by ``torch.save`` (pickles), as opposed to ``*.safetensors``."""


def check_weight_files(folder: str | os.PathLike, flag: str) -> None:
    """Refuse (``ValueError``, one line naming the file) a model folder whose pickled weight files
    (:data:`PICKLED_WEIGHTS`) hold anything but tensors and plain data: each is opened as transformers
    opens it, ``torch.load(weights_only=True)``, memory-mapped (its tensors are not read), so no code
    in it runs. Checked only where transformers would read them: a folder with ``*.safetensors`` loads
    those."""
    import pickle

    root = Path(folder)
    if any(root.glob("*.safetensors")):
        return
    for path in sorted(p for pattern in PICKLED_WEIGHTS for p in root.glob(pattern) if p.is_file()):
        try:
            try:
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # an old (not zip) torch.save file cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ValueError(
                f"{flag} {folder}: {path.name} holds pickled objects other than tensors, which could run "
                "code when loaded; refused (nothing in it ran). Use the model's .safetensors weights"
            ) from None
        except (RuntimeError, OSError, EOFError, ValueError) as e:
            first = next((t for t in str(e).splitlines() if t.strip()), type(e).__name__)
            raise ValueError(
                f"{flag} {folder}: {path.name} is not a readable torch file ({first[:200]})"
            ) from None


def load_actor(
    path: str | os.PathLike,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """The causal LM in the local folder ``path`` (``AutoModelForCausalLM``, never downloads).

    ``dtype=None`` keeps the checkpoint's dtype; ``device`` moves the model after loading. Extra
    keywords go to ``from_pretrained`` (e.g. ``attn_implementation="flash_attention_2"``).
    """
    model = _from_pretrained(AutoModelForCausalLM, path, dtype, **kwargs)
    return model.to(device) if device is not None else model


# ------------------------------------------------------------------------------------ log-probs


def _logprob_entropy_chunk(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def logprobs_from_logits(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Per-position ``log softmax(logits / tau)[target]`` and entropy of ``softmax(logits / tau)``.

    ``logits`` ``[..., V]`` (any float dtype; computed in float32), ``targets`` ``[...]`` long.
    Rows are processed in chunks of about ``chunk_elements`` logits so the float32 copy never spans
    the whole ``[..., V]`` tensor; when gradients are on, each chunk is checkpointed so only the input
    logits are kept for the backward pass.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    shape, vocab = targets.shape, logits.shape[-1]
    flat_logits, flat_targets = logits.reshape(-1, vocab), targets.reshape(-1)
    rows = max(1, chunk_elements // vocab)
    grad = torch.is_grad_enabled() and logits.requires_grad
    logps, entropies = [], []
    for start in range(0, flat_targets.shape[0], rows):
        args = (flat_logits[start : start + rows], flat_targets[start : start + rows], temperature)
        if grad:
            lp, ent = checkpoint(_logprob_entropy_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _logprob_entropy_chunk(*args)
        logps.append(lp)
        entropies.append(ent)
    if not logps:
        empty = flat_logits.new_zeros(0, dtype=torch.float32)
        return empty.reshape(shape), empty.reshape(shape)
    return torch.cat(logps).reshape(shape), torch.cat(entropies).reshape(shape)


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_len: int,
    temperature: float = 1.0,
    chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Log-prob and entropy of every response token under ``model`` at ``temperature``.

    ``input_ids`` / ``attention_mask`` ``[B, P + T]`` in the module's layout (``T = response_len``).
    Returns ``(logp, entropy)``, both ``[B, T]`` float32, where for response position ``t``::

        logp[b, t]    = log softmax(logits[b, P + t - 1] / temperature)[input_ids[b, P + t]]
        entropy[b, t] = H(softmax(logits[b, P + t - 1] / temperature))

    i.e. the plain temperature-scaled distribution with no top-p / top-k truncation, the same one
    :class:`~sppo_rl.llm.rollout.hf.HFRollout` reports as ``logprobs``. Values at padded response
    positions are finite but meaningless; mask them. Only the last ``T + 1`` positions go through the
    LM head when the model supports ``logits_to_keep``; see :func:`logprobs_from_logits` for memory.
    """
    T = int(response_len)
    if T <= 0 or T >= input_ids.shape[1]:
        raise ValueError(f"response_len must be in [1, {input_ids.shape[1] - 1}], got {T}")
    kwargs: dict[str, Any] = {}
    if accepts_kwarg(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = T + 1
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        use_cache=False,
        **kwargs,
    )
    logits = out.logits[:, -(T + 1) : -1]
    return logprobs_from_logits(logits, input_ids[:, -T:], temperature, chunk_elements)


# ------------------------------------------------------------------------------------ critics


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


# ------------------------------------------------------------------------------------ tokenizers


_SPECIAL_IDS = ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id")


def check_same_tokenizer(
    actor_tokenizer: PreTrainedTokenizerBase, critic_tokenizer: PreTrainedTokenizerBase
) -> None:
    """Raise ``ValueError`` unless both tokenizers map every token to the same id and share special ids.

    A decoupled critic consumes the actor's token ids directly, so any difference in the vocabulary
    (tokens present in one only, or the same token under another id) or in the pad / eos / bos / unk
    ids would silently feed it garbage. The message names what differs, with examples.
    """
    problems: list[str] = []
    va, vc = actor_tokenizer.get_vocab(), critic_tokenizer.get_vocab()
    if va != vc:
        only_a, only_c = sorted(set(va) - set(vc)), sorted(set(vc) - set(va))
        moved = sorted(t for t in set(va) & set(vc) if va[t] != vc[t])
        parts = [f"actor has {len(va)} tokens, critic {len(vc)}"]
        if only_a:
            parts.append(f"{len(only_a)} only in the actor's (e.g. {_examples(only_a)})")
        if only_c:
            parts.append(f"{len(only_c)} only in the critic's (e.g. {_examples(only_c)})")
        if moved:
            ex = ", ".join(f"{t!r}: {va[t]} vs {vc[t]}" for t in moved[:5])
            parts.append(f"{len(moved)} tokens with different ids (e.g. {ex})")
        problems.append("vocabularies differ: " + "; ".join(parts))
    for name in _SPECIAL_IDS:
        a, c = getattr(actor_tokenizer, name, None), getattr(critic_tokenizer, name, None)
        if a != c:
            problems.append(f"{name} differs: actor {a!r}, critic {c!r}")
    if problems:
        raise ValueError(
            "the critic's tokenizer differs from the actor's (a decoupled critic reads the actor's token ids "
            "directly, so both must share one tokenizer): " + "; ".join(problems)
        )


def _examples(tokens: list[str], k: int = 5) -> str:
    return ", ".join(repr(t) for t in tokens[:k]) + (", ..." if len(tokens) > k else "")


# ------------------------------------------------------------------------------------ LoRA

_ADAPTER = "default"  # peft's name of the one adapter each wrapped module holds here
ALL_LINEAR = "all-linear"
"""``--lora-targets all-linear``: every linear module (:func:`linear_module_names`), as peft's own value."""


def _is_linear(module: nn.Module) -> bool:
    """``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's linear layers, weight stored ``[in, out]``)."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last names of ``model``'s linear modules (``nn.Linear`` and GPT-2's ``Conv1D``: what
    ``--lora-targets`` may name), without the output head: an adapter on a head tied to the input
    embedding would untie them."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _is_linear(m) and m is not head})


def resolve_lora_targets(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """``targets`` as module names: ``("all-linear",)`` becomes every linear module of ``model``."""
    if tuple(targets) == (ALL_LINEAR,):
        return linear_module_names(model)
    return list(targets)


def check_lora_targets(model: nn.Module, targets: Sequence[str], what: str = "the model") -> None:
    """``ValueError`` in one line unless every name of ``targets`` is a linear module of ``model``
    (``all-linear``: unless it has one); the message lists the model's linear modules."""
    names = linear_module_names(model)
    if ALL_LINEAR in targets and len(targets) > 1:
        raise ValueError(f"--lora-targets {ALL_LINEAR} stands alone (it names every linear module)")
    targets = resolve_lora_targets(model, targets)
    missing = [t for t in targets if t not in names]
    if not targets or missing:
        raise ValueError(
            f"--lora-targets {','.join(missing) or '(none)'}: no linear module of {what} has that name; "
            f"its linear modules: {','.join(names) or '(none)'}"
        )


def check_lora_targets_of(targets: Sequence[str], actor: str | os.PathLike | None, critic: Any) -> None:
    """:func:`check_lora_targets` from the models' ``config.json`` alone (each model built on the meta
    device: no weight is read), so bad targets are refused before a run folder is touched. ``actor``
    None stands for the embedded tiny Qwen2; ``critic`` is the critic backbone's folder, None for the
    actor's, False for no critic."""
    from transformers import AutoConfig, Qwen2Config

    def config(folder: Any) -> Any:
        if folder is None:  # the embedded model's architecture (its sizes do not change the names)
            return Qwen2Config(
                vocab_size=8,
                hidden_size=8,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
            )
        return AutoConfig.from_pretrained(folder, local_files_only=True)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config(actor))
        check_lora_targets(model, targets, f"the actor ({actor or 'the embedded tiny Qwen2'})")
        if critic is not False:
            folder = actor if critic is None else critic
            backbone = AutoModel.from_config(config(folder))
            check_lora_targets(backbone, targets, f"the critic ({folder or 'the embedded tiny Qwen2'})")


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    targets: Sequence[str],
    dropout: float = 0.0,
    *,
    seed: int | None = None,
) -> nn.Module:
    """Wrap each linear module of ``model`` named in ``targets`` in a LoRA adapter (peft), in place::

        y = W x + b + (alpha / r) * B A dropout(x),   A [r, in] (Kaiming-uniform), B [out, r] (zeros)

    ``targets`` are module names (``nn.Linear`` or GPT-2's ``Conv1D``, whose adapters peft keeps with
    ``fan_in_fan_out``) or ``("all-linear",)`` (:func:`resolve_lora_targets`).

    so the wrapped model starts exactly as the base model (``B = 0``). Every other parameter of
    ``model`` is frozen: only the adapters' ``A`` and ``B`` get gradients (and optimizer state). A
    critic's value head is trainable because it lies outside the backbone passed here. The model
    stays the same object, with the same ``forward`` and ``generate``; its parameter names gain
    ``.base_layer.`` and ``.lora_A.default.`` / ``.lora_B.default.`` (see :func:`merged_state_items`
    for the base model's names). ``A`` is drawn from torch's global RNG, or with ``seed`` from an RNG
    seeded with it (the global state left as it was: the adapters are the same on every rank and do
    not shift any later draw).
    """
    from peft import inject_adapter_in_model

    if rank < 1:
        raise ValueError(f"--lora-rank must be >= 1 to apply LoRA, got {rank}")
    check_lora_targets(model, targets)
    config = lora_config(model, rank, alpha, targets, dropout)
    if seed is None:
        inject_adapter_in_model(config, model)
    else:
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.2x
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # reentrant checkpoints need an input that requires grad
    return model


def lora_config(
    model: nn.Module, rank: int, alpha: float, targets: Sequence[str], dropout: float = 0.0
) -> Any:
    """The peft ``LoraConfig`` of :func:`apply_lora` (``fan_in_fan_out`` where the targets are ``Conv1D``)."""
    from peft import LoraConfig
    from transformers.pytorch_utils import Conv1D

    names = resolve_lora_targets(model, targets)
    hit = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in names and _is_linear(m)]
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=names,
        bias="none",
        fan_in_fan_out=bool(hit) and all(isinstance(m, Conv1D) for m in hit),
    )


def save_adapter(
    model: nn.Module,
    folder: str | os.PathLike,
    config: Any,
    base: str | os.PathLike,
    gather: Callable[[list[nn.Parameter]], Any] | None = None,
    write: bool = True,
) -> Path | None:
    """Write the LoRA adapters of ``model`` alone as a peft adapter folder (``adapter_config.json`` with
    ``base_model_name_or_path = base``, ``adapter_model.safetensors`` with peft's key names
    ``base_model.model.<module>.lora_A.weight``): ``PeftModel.from_pretrained(base model, folder)``
    computes what ``model`` computes. ``gather`` as in :func:`merged_state_items`; ``write`` False (ranks
    other than 0) only takes part in the gathers."""
    state: dict[str, Tensor] = {}
    enter = gather or (lambda params: contextlib.nullcontext())
    for name, p in model.named_parameters():
        if ".lora_" not in name:
            continue
        with enter([p]):
            key = "base_model.model." + name.replace(f".{_ADAPTER}.", ".")
            state[key] = p.detach().to("cpu", copy=True).contiguous()
    if not write:
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config.base_model_name_or_path = str(base)
    config.save_pretrained(str(folder))
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """``{qualified name: peft LoRA layer}`` of ``model`` (empty without LoRA, and without importing
    peft when nothing imported it: then no module can hold an adapter)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _lora_parts(layer: nn.Module) -> tuple[Tensor, Tensor, Tensor, float]:
    base = layer.get_base_layer()
    return base.weight, layer.lora_A[_ADAPTER].weight, layer.lora_B[_ADAPTER].weight, layer.scaling[_ADAPTER]


def merged_weight(layer: nn.Module) -> Tensor:
    """``W + (alpha / r) * B @ A`` of a LoRA layer (its transpose added for a ``Conv1D``, whose ``W`` is
    ``[in, out]``; computed in float32, returned in ``W``'s dtype): the plain weight that computes what
    the wrapped module computes in eval mode."""
    W, A, B, scaling = _lora_parts(layer)
    delta = B.detach().float() @ A.detach().float()
    if getattr(layer, "fan_in_fan_out", False):  # GPT-2's Conv1D keeps its weight [in, out]
        delta = delta.T
    return (W.detach().float() + scaling * delta).to(W.dtype)


def merged_state_items(
    model: nn.Module,
    gather: Callable[[list[nn.Parameter]], Any] | None = None,
    only_adapted: bool = False,
) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` pairs of ``model`` under the base model's names, LoRA merged in.

    Each LoRA-wrapped module yields ``prefix.weight`` = :func:`merged_weight` and its bias as is; the
    adapters' own tensors are not yielded. With ``only_adapted`` that is all (what a rollout copy
    that started from the base weights needs after an update: nothing else changes); otherwise every
    other parameter follows, then the persistent buffers. Without LoRA: the parameters and persistent
    buffers. ``gather(params)`` is a context manager entered around each yield (ZeRO-3 gathers the
    tensors it is given); a yielded tensor may be a view of gathered memory: copy it before the next.
    """
    enter = gather or (lambda params: contextlib.nullcontext())
    layers = lora_layers(model)
    for name, p in model.named_parameters():
        if ".lora_" in name and name.rsplit(".lora_", 1)[0] in layers:
            continue  # the adapter itself: merged into its base weight
        prefix, wrapped, suffix = name.partition(".base_layer.")
        if wrapped and prefix in layers:
            if suffix == "weight":
                W, A, B, _ = _lora_parts(layers[prefix])
                with enter([W, A, B]):
                    yield f"{prefix}.weight", merged_weight(layers[prefix])
            else:
                with enter([p]):
                    yield f"{prefix}.{suffix}", p.data
        elif not only_adapted:
            with enter([p]):
                yield name, p.data
    if not only_adapted:
        persistent = set(model.state_dict().keys())
        yield from ((n, b) for n, b in model.named_buffers() if n in persistent)


def adapted_tensor_names(model: nn.Module) -> list[str]:
    """The base-model names :func:`merged_state_items` yields with ``only_adapted`` (no tensor touched)."""
    layers = lora_layers(model)
    out = []
    for name, _ in model.named_parameters():
        prefix, wrapped, suffix = name.partition(".base_layer.")
        if wrapped and prefix in layers:
            out.append(f"{prefix}.{suffix}")
    return out


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Inside, every LoRA layer of ``model`` computes its base layer alone (``y = W x + b``).

    Sets peft's per-layer switch (``_disable_adapters``) and restores it. peft's own
    ``enable_adapters(False)`` also flips ``requires_grad`` of the adapters, which would change what
    an optimizer or DeepSpeed's gradient hooks track; only the forward is switched here.
    """
    layers = list(lora_layers(_unwrap(model)).values())
    saved = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, was in zip(layers, saved):
            layer._disable_adapters = was


class BaseModelView(nn.Module):
    """The actor with its adapters off: the base model, for a KL reference without a second copy.

    ``view(...)`` calls ``model(...)`` (the actor, or its DeepSpeed wrapper) inside
    :func:`adapters_disabled`. The actor is held as ``.module`` but not registered as a submodule, so
    ``view.eval()``, ``view.requires_grad_(False)`` or ``view.parameters()`` never reach the actor's
    parameters; :func:`accepts_kwarg` still sees the actor's ``forward``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not lora_layers(_unwrap(model)):
            raise ValueError("BaseModelView needs a model with LoRA adapters (apply_lora)")
        object.__setattr__(self, "module", model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_disabled(self.module):
            return self.module(*args, **kwargs)


# ------------------------------------------------------------------------------ model folder checks

_SIZE_KEYS = {
    "vocab_size": ("vocab_size",),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
}
MAX_CONFIG_SIZE = 10**9
"""No size of a config.json (vocabulary, width, depth, heads) is larger than this."""


def _config_sizes(config: dict[str, Any], where: str) -> dict[str, int]:
    """The model sizes ``config`` states (its own keys or a nested ``text_config``), each a positive
    integer of at most :data:`MAX_CONFIG_SIZE`; ``ValueError`` naming the key otherwise."""
    sizes: dict[str, int] = {}
    parts = [config] + ([config["text_config"]] if isinstance(config.get("text_config"), dict) else [])
    for name, keys in _SIZE_KEYS.items():
        for part in parts:
            key = next((k for k in keys if k in part and part[k] is not None), None)
            if key is None:
                continue
            v = part[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_CONFIG_SIZE:
                raise ValueError(f"{where}: {key} must be an integer in [1, {MAX_CONFIG_SIZE:,}], got {v!r}")
            sizes[name] = v
            break
    return sizes


def estimate_parameters(config: dict[str, Any]) -> int:
    """An upper estimate of a decoder's parameter count from its ``config.json`` sizes:
    ``V h (2 - tied) + L (4 h^2 + 3 h I)`` with vocabulary ``V``, width ``h``, depth ``L`` and MLP width
    ``I`` (default ``4h``): embeddings and output head, then per layer full-width attention (4 h^2,
    an upper bound under grouped KV heads) and a gated MLP (3 h I; a plain one has 2 h I)."""
    s = _config_sizes(config, "config.json")
    h, v, n = s.get("hidden_size", 0), s.get("vocab_size", 0), s.get("num_hidden_layers", 0)
    i = s.get("intermediate_size", 4 * h)
    tied = bool(config.get("tie_word_embeddings", False))
    return v * h * (1 if tied else 2) + n * (4 * h * h + 3 * h * i)


def available_memory_bytes() -> int | None:
    """Memory this machine can give a model: the host's ``MemAvailable`` (``/proc/meminfo``; the
    physical memory elsewhere) plus the total memory of every visible GPU, as ``nvidia-smi`` reports it
    (CUDA itself is not initialised here: reward workers are forked later). None where a GPU is visible
    but ``nvidia-smi`` does not answer (unknown: no bound)."""
    import subprocess

    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if not total:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    if torch.cuda.is_available():
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            total += sum(int(v) for v in out.split()) * 2**20  # MiB
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    return total


def check_model_config(
    folder: str | os.PathLike,
    flag: str,
    dtype: torch.dtype | str = torch.float32,
    *,
    memory: int | None = None,
) -> None:
    """Refuse, with one ``ValueError`` line naming ``flag`` and the folder, a model folder whose
    ``config.json`` cannot hold a model this machine can build, before anything is built or written:
    not a JSON object; a size that is not a positive integer up to :data:`MAX_CONFIG_SIZE`; weights
    (:func:`estimate_parameters` times the bytes of ``dtype``) beyond ``memory`` (default
    :func:`available_memory_bytes`, times the nodes of a multi-node launch; no bound where it is
    unknown); or any refusal of
    transformers' ``AutoConfig`` (an unknown ``model_type``, remote code, inconsistent sizes)."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(
            f"{flag} {folder}: config.json is not readable JSON ({str(e).splitlines()[0]})"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{flag} {folder}: config.json must be a JSON object, got {type(config).__name__}")
    try:
        params = estimate_parameters(config)
    except ValueError as e:
        raise ValueError(f"{flag} {folder}/{e}") from None
    width = torch.tensor([], dtype=getattr(torch, dtype) if isinstance(dtype, str) else dtype).element_size()
    if memory is None:
        from sppo_rl.runtime.launcher import launcher_env

        env = launcher_env()
        nodes = max(1, env["WORLD_SIZE"] // (env["LOCAL_WORLD_SIZE"] or 1))
        here = available_memory_bytes()
        memory = None if here is None else here * nodes
    if memory is not None and params * width > memory:
        raise ValueError(
            f"{flag} {folder}: its config.json describes about {params:.3g} parameters, "
            f"{params * width / 2**30:,.1f} GiB of weights alone, more than the {memory / 2**30:,.1f} GiB "
            "this machine has available"
        )
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # transformers raises many types for a bad config; each becomes one line
        first = next((t for t in str(e).splitlines() if t.strip()), type(e).__name__)
        raise ValueError(
            f"{flag} {folder}: transformers cannot read its config.json ({first.strip()[:300]})"
        ) from None


def quiet_transformers() -> None:
    """No weight-loading or shard-writing bars from transformers (the run has its own progress bar);
    its warnings and errors still show."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
