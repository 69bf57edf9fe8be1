"""A run's task: the generated ones (arithmetic, scratchpad) or a data file, its training and
validation examples and the reward function that scores them; a missing or unreadable file is refused
in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sppo_rl.llm.config import LLMConfig
from sppo_rl.llm.data.files import Example, load_examples
from sppo_rl.runtime.run import RunError

GENERATED_TASKS = ("arithmetic", "scratchpad")
"""The tasks generated from ``--data-seed`` that the embedded tiny model is built and warm-started for."""


def load_task(cfg: LLMConfig) -> tuple[list[Example], list[Example], str]:
    """Training and validation examples, and the reward function that scores them. A missing data
    file or a directory is refused naming the flag; a malformed record raises a ``DataError`` naming
    the file and the line."""
    if cfg.val_data:
        data_file("--val-data", cfg.val_data)
    if cfg.task in GENERATED_TASKS:
        task = generated_task(cfg.task)
        try:
            train, val = task.make(cfg.data_seed, cfg.train_size, cfg.val_size, tuple(cfg.level))
        except ValueError as e:
            raise RunError(f"--task {cfg.task}: {e}") from None
        if cfg.task == "arithmetic" and cfg.arithmetic_prompt == "question":
            from sppo_rl.llm.data.arithmetic import as_question

            train, val = (
                [dataclasses.replace(e, prompt=as_question(str(e.prompt))) for e in s] for s in (train, val)
            )
        return train, val, (task.REWARD_FN if cfg.reward_fn == "auto" else cfg.reward_fn)
    path = Path(cfg.task)
    if not path.suffix and not path.is_dir():
        raise RunError(
            f"unknown task {cfg.task!r}; valid: 'arithmetic', 'scratchpad' or a .jsonl/.json/.parquet file"
        )
    data_file("--task", cfg.task)
    train = load_examples(path, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key)
    val = (
        load_examples(cfg.val_data, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key, limit=cfg.val_size)
        if cfg.val_data
        else []
    )
    return train, val, data_reward(cfg, train, val)


GSM8K_REWARD = "sppo_rl.llm.rewards.verify:verify_gsm8k"
"""The ``math`` reward on data in GSM8K's layout: ``\\boxed{}`` or GSM8K's own ``#### n``."""


def data_reward(cfg: LLMConfig, train: list[Example], val: list[Example]) -> str:
    """The reward function of a data file's run, checked against its references (in place: drops the
    references the math verifier can never pay, with a warning): ``--reward-fn integer`` on
    non-integer references is refused in one line; ``math`` (and ``auto``) on GSM8K's layout becomes
    :data:`GSM8K_REWARD`, which also reads GSM8K's ``#### n`` final answer."""
    from sppo_rl.llm.data.files import drop_unpayable_references, non_integer_references
    from sppo_rl.llm.rewards.answers import MAX_ANSWER_CHARS

    reward = "math" if cfg.reward_fn == "auto" else cfg.reward_fn
    if reward == "integer":
        for flag, examples in (("--task", train), ("--val-data", val)):
            bad = non_integer_references(examples)
            if bad:
                raise RunError(
                    f"--reward-fn integer: {len(bad)} of {len(examples)} references of {flag} "
                    f"{cfg.task if flag == '--task' else cfg.val_data} are not integers (record {bad[0].index}: "
                    f"{bad[0].answer!r:.40}), and would never be paid; use --reward-fn math"
                )
    if reward == "math":
        train[:] = drop_unpayable_references(train, MAX_ANSWER_CHARS, cfg.task)
        val[:] = drop_unpayable_references(val, MAX_ANSWER_CHARS, str(cfg.val_data))
        if train and all(e.format == "gsm8k" for e in train[:1]):
            return GSM8K_REWARD
    return reward


def generated_task(task: str) -> Any:
    """The module of a generated task, with ``make(seed, n_train, n_val, levels)``, ``REWARD_FN`` and
    ``reference_response(example)``: :mod:`sppo_rl.llm.data.arithmetic` or :mod:`sppo_rl.llm.data.scratchpad`."""
    import types

    if task == "arithmetic":
        from sppo_rl.llm.data import arithmetic as module

        make = module.make_arithmetic
    elif task == "scratchpad":
        from sppo_rl.llm.data import scratchpad as module

        make = module.make_scratchpad
    else:
        raise ValueError(f"not a generated task: {task!r}; valid: {', '.join(GENERATED_TASKS)}")
    return types.SimpleNamespace(
        make=make, REWARD_FN=module.REWARD_FN, reference_response=module.reference_response
    )


def data_file(flag: str, value: str) -> Path:
    """``value`` as the data file ``flag`` names, refused in one line if it is a folder or missing."""
    path = Path(value)
    if path.is_dir():
        raise RunError(f"{flag} {value}: is a folder, not a data file (.jsonl, .json or .parquet)")
    if not path.is_file():
        raise RunError(f"{flag} {value}: file not found")
    return path


def readable_type(flag: str, value: str) -> None:
    """Refuse in one line a data file whose extension the loader does not read (``.csv``, ``.txt``)."""
    from sppo_rl.llm.data.files import _READERS

    suffix = Path(value).suffix.lower()
    if suffix and suffix not in _READERS:
        what = "CSV files are not read" if suffix == ".csv" else f"{suffix} files are not read"
        raise RunError(
            f"{flag} {value}: {what}; use one of {', '.join(_READERS)} (a CSV becomes JSON lines with "
            "Python's csv.DictReader and json.dumps, one object per row)"
        )
