"""A tiny Qwen2-architecture causal LM with a character-level tokenizer, built locally.

It is the LLM world's test model: it runs the same code paths as a real Hugging Face checkpoint
(config + safetensors + ``tokenizer.json``), is built offline from a seed, and is small enough to
learn short arithmetic on a couple of CPU cores.

The tokenizer maps every character of ``charset`` (spaces and newlines included) to one token, after
three special tokens::

    0 <pad>   1 <eos>   2 <unk>   3.. one per character of charset (first occurrence order)

``<eos>`` doubles as the beginning-of-sequence token in the model config; nothing is prepended to
prompts. It is saved as a Qwen2-style byte-level BPE (``tokenizer_class: Qwen2Tokenizer``): each
token's string is the character's UTF-8 bytes in the GPT-2 byte alphabet (a space is ``"Ġ"``, a newline
``"Ċ"``; printable ASCII is itself) and there are no merges between characters, so it is still one token
per character. That is the pipeline transformers' ``AutoTokenizer`` gives every ``qwen2`` folder (in
transformers 5 it rebuilds Qwen2's byte-level pre-tokenizer and decoder whatever ``tokenizer.json``
says), so ``AutoTokenizer.from_pretrained(folder)`` (vLLM, TRL, ``pipeline``) and :func:`load_tokenizer`
give the same ids, and ``decode(encode(text)) == text`` for any (NFC-normalised) text over ``charset``.
A character outside ``charset`` has no token and is dropped (byte-level BPE has no unknown token;
``<unk>`` keeps its id but is never produced). A non-ASCII character is built from its UTF-8 bytes by
merges, so its byte pieces are extra tokens after the charset's (ASCII charsets have none).
:func:`load_tokenizer` loads it, or any real model's tokenizer, ready for left padding.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from sppo_rl.llm.data.tasks import GENERATED_TASKS
from sppo_rl.runtime.files import cache_build, follow_umask

PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
TINY_FORMAT_VERSION = 2
"""Bumped whenever :func:`build_tiny_model` changes what it writes; part of the cache key.

2: the tokenizer is a byte-level BPE that ``AutoTokenizer`` round-trips (1: a word-level tokenizer that
``AutoTokenizer`` loaded as Qwen2's byte-level one, dropping every space; only :func:`load_tokenizer`
read it right)."""
TOKENIZER_CLASS = "Qwen2Tokenizer"
"""The ``tokenizer_class`` written to ``tokenizer_config.json``: the class transformers 5 uses for a
``qwen2`` folder anyway, and one transformers 4 knows (it loads ``tokenizer.json`` as saved)."""
# Qwen2's pre-tokenizer split (transformers' ``models/qwen2/tokenization_qwen2.py``). Merges never
# cross a character, so the split does not change the ids; it is copied so the saved pipeline is the
# one transformers rebuilds.
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)

# Classes a tokenizer_config.json names when the folder's tokenizer.json is the whole pipeline (the
# word-level tokenizer of TINY_FORMAT_VERSION 1 folders, saved by transformers 4.x or 5.x, which
# AutoTokenizer misreads: it rebuilds Qwen2's byte-level pipeline, which drops spaces there).
_GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
_COMPLETE_MARKER = "tiny_model.json"


def char_vocab(charset: str) -> dict[str, int]:
    """Token -> id: the special tokens, then each distinct character of ``charset`` in order."""
    chars = [c for c in dict.fromkeys(charset) if c not in SPECIAL_TOKENS]
    if not chars:
        raise ValueError("charset must contain at least one character")
    return {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the alphabet of every byte-level BPE vocabulary)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in keep}
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + len(out) - len(keep))
    return out


_BYTE_ALPHABET = _byte_alphabet()


def byte_level(text: str) -> str:
    """``text``'s UTF-8 bytes in the byte-level alphabet: the token string of a character."""
    return "".join(_BYTE_ALPHABET[b] for b in text.encode("utf-8"))


def byte_level_vocab(charset: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The tokenizer's vocabulary (token string -> id) and merges for ``charset``.

    Ids as :func:`char_vocab` (special tokens, then one per distinct character), each character under
    its :func:`byte_level` string; then, for non-ASCII characters only, the byte pieces (every proper
    prefix of a character's string, and every byte after the first) that merges join into it.
    """
    chars = char_vocab(charset)
    vocab = {(tok if tok in SPECIAL_TOKENS else byte_level(tok)): i for tok, i in chars.items()}
    merges: list[tuple[str, str]] = []
    for tok in chars:
        if tok in SPECIAL_TOKENS:
            continue
        s = byte_level(tok)
        for j in range(1, len(s)):
            for piece in (s[:j], s[j]):
                vocab.setdefault(piece, len(vocab))
            if (s[:j], s[j]) not in merges:
                merges.append((s[:j], s[j]))
    return vocab, merges


def build_char_tokenizer(charset: str, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over ``charset`` as a byte-level BPE (see the module docstring).

    The pipeline is Qwen2's, the one ``AutoTokenizer`` builds for a ``qwen2`` folder: NFC normaliser,
    Qwen2's split then the byte-level pre-tokenizer, a BPE model without unknown token, a byte-level
    decoder; ``clean_up_tokenization_spaces`` is off so decoding never edits spaces around punctuation.
    """
    vocab, merges = byte_level_vocab(charset)
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def save_char_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: str | os.PathLike) -> None:
    """``tokenizer.save_pretrained(folder)``, naming :data:`TOKENIZER_CLASS` in ``tokenizer_config.json``."""
    folder = Path(folder)
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = TOKENIZER_CLASS
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def build_tiny_model(
    folder: str | os.PathLike,
    *,
    charset: str,
    hidden_size: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int | None = 2,
    intermediate_size: int | None = None,
    seed: int = 0,
    max_position_embeddings: int = 512,
) -> Path:
    """Build a randomly initialised Qwen2 causal LM + char-level tokenizer and save it to ``folder``.

    Writes a standard Hugging Face folder: ``config.json``, ``model.safetensors`` (float32),
    ``generation_config.json`` (eos = bos = ``<eos>``, pad = ``<pad>``), ``tokenizer.json`` and
    ``tokenizer_config.json`` (``Qwen2Tokenizer``, pad/eos set, left padding). Input and output
    embeddings are tied, as in the small Qwen2.5 models. ``intermediate_size`` defaults to
    ``4 * hidden_size``; ``kv_heads`` (grouped-query attention, as in Qwen2) defaults to 2, ``None``
    means ``heads``.

    The defaults (hidden 128, 4 layers, about 0.8 M parameters) learn short arithmetic within minutes
    on two CPU cores. Building is deterministic: the same arguments give byte-identical weights.
    The global RNG is left untouched.
    """
    folder = Path(folder)
    tokenizer = build_char_tokenizer(charset, model_max_length=max_position_embeddings)
    vocab = tokenizer.get_vocab()
    pad_id, eos_id = vocab[PAD_TOKEN], vocab[EOS_TOKEN]
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_cache=True,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    save_char_tokenizer(tokenizer, folder)
    return folder


def _tiny_key(charset: str, settings: dict[str, int | None]) -> str:
    return json.dumps(
        {"charset": charset, "settings": settings, "format": TINY_FORMAT_VERSION}, sort_keys=True
    )


def tiny_model_folder(cache_dir: str | os.PathLike, charset: str, **settings: int | None) -> Path:
    """The folder :func:`ensure_tiny_model` keeps the tiny model of ``charset`` and ``settings`` in."""
    return Path(cache_dir) / f"tiny-{hashlib.sha256(_tiny_key(charset, settings).encode()).hexdigest()[:16]}"


def tiny_model_built(folder: Path) -> bool:
    """Whether ``folder`` holds a finished tiny model."""
    return (folder / _COMPLETE_MARKER).is_file()


def ensure_tiny_model(
    cache_dir: str | os.PathLike,
    charset: str,
    **settings: int | None,
) -> Path:
    """The folder of the tiny model built with ``charset`` and ``settings``, building it on first use.

    The folder is ``cache_dir / "tiny-<hash>"`` where the hash covers the charset, the settings
    (keywords of :func:`build_tiny_model`) and :data:`TINY_FORMAT_VERSION`. The model is built into a
    temporary sibling and renamed into place, so concurrent callers never see a half-written folder
    (:func:`~sppo_rl.runtime.files.cache_build`: what killed builds left is cleaned, the folder's modes
    follow the umask, a full disk is a one-line storage error).
    """
    key = _tiny_key(charset, settings)
    cache_dir = Path(cache_dir)
    folder = tiny_model_folder(cache_dir, charset, **settings)
    if tiny_model_built(folder):
        return folder
    with cache_build(folder) as tmp:
        build_tiny_model(tmp, charset=charset, **settings)
        (tmp / _COMPLETE_MARKER).write_text(json.dumps(json.loads(key), indent=2) + "\n")
        follow_umask(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / _COMPLETE_MARKER).is_file():  # not a concurrent builder: a real failure
                raise
    return folder


def load_tokenizer(folder: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer of a local model folder, set for left padding and with a pad token.

    Loaded through ``AutoTokenizer``, as vLLM, TRL and ``pipeline`` load it, so the ids are theirs: a
    tiny model built by :func:`build_tiny_model` or a real Qwen2.5 / R1-Distill / Llama checkpoint. A
    folder whose ``tokenizer_config.json`` names the generic fast class is loaded as
    ``PreTrainedTokenizerFast`` straight from its ``tokenizer.json``: for such a folder that is what
    ``AutoTokenizer`` gives too, except for the word-level tiny tokenizer of :data:`TINY_FORMAT_VERSION`
    1, which ``AutoTokenizer`` misreads (it drops the spaces). If the tokenizer has
    no pad token, the eos token is used for padding (padding is always masked out). Offline only.
    """
    folder = Path(folder)
    config_file = folder / "tokenizer_config.json"
    tokenizer_class = None
    if config_file.is_file():
        tokenizer_class = json.loads(config_file.read_text()).get("tokenizer_class")
    if tokenizer_class in _GENERIC_TOKENIZER_CLASSES and (folder / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer in {folder} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


TINY_CHARSET = "".join(
    chr(c) for c in range(32, 127)
)  # printable ASCII: every character a tiny-task text uses


TINY_SETTINGS = dict(hidden_size=128, layers=4, heads=4, kv_heads=2, seed=0, max_position_embeddings=256)
"""The embedded base model of ``--task arithmetic`` (see :func:`tiny_settings`)."""


def tiny_settings(task: str) -> dict[str, Any]:
    """The settings of the embedded base model for ``task`` (keywords of
    :func:`sppo_rl.llm.models.tiny.build_tiny_model`): :data:`TINY_SETTINGS` for arithmetic (its cache key
    unchanged); for scratchpad the same width and depth with a context of 512 positions, which holds the
    longest prompt (18 tokens) and the longest default response budget (234 tokens, level 5) with room to
    spare (RoPE: the context adds no weights). ``ValueError`` for any other task."""
    if task == "arithmetic":
        return dict(TINY_SETTINGS)
    if task == "scratchpad":
        return {**TINY_SETTINGS, "max_position_embeddings": 512}
    raise ValueError(f"no embedded model for task {task!r}; valid: {', '.join(GENERATED_TASKS)}")
