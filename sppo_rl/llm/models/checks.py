"""Refusals before a model is built: what a model folder may hold and what the machine can hold.

- :func:`check_weight_files`: pickled weight files that hold more than tensors (nothing in them runs);
- :func:`check_model_config`: a ``config.json`` that is no JSON object, states sizes that are no
  positive integers, describes more weights than this machine's memory
  (:func:`estimate_parameters`, :func:`available_memory_bytes`), or that transformers refuses;
- :func:`check_same_tokenizer`: a decoupled critic whose tokenizer differs from the actor's.

Each refusal is one ``ValueError`` line naming the flag and the folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

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
