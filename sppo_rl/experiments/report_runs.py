"""The runs a report reads (:func:`find_runs`: every folder with ``metrics.jsonl`` and ``config.json``)
and how they are told apart: their task (LLM data files by content), their label (the algorithm and the
settings that differ between its runs, :func:`label_runs`), the order of the labels and each one's colour
and line style in every figure."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.experiments.sweep import BOOKKEEPING
from sppo_rl.runtime.logging import read_metrics
from sppo_rl.runtime.run import RunError, config_now

# one colour per algorithm, the same in every figure; other names get EXTRA colours in sorted order
PALETTE = {
    "ppo": "#1f77b4",
    "sppo": "#d62728",
    "grpo": "#2ca02c",
    "drgrpo": "#bcbd22",
    "rloo": "#9467bd",
    "remax": "#8c564b",
    "reinforce": "#e377c2",
    "ppo-bce": "#ff7f0e",
    "bppo": "#17becf",
    "lampo": "#7f7f7f",
    "gspo": "#005a32",
    "sppo-seq": "#fb6a4a",
    "cispo": "#3f007d",
    "reinforce++": "#ae017e",
    "reinforce++-baseline": "#e6ab02",
    "latent-grpo": "#e7298a",
    "latent-grpo-naive": "#66a61e",
    "opo": "#fdae6b",
    "opo-batch": "#a6761d",
    "spo": "#08519c",
    "astar-po": "#54278f",
    "shrinkage": "#a50f15",
    "sao": "#006d2c",
    "crf-ntf": "#7a0177",
    "v05": "#b35806",
    "reinforce-batch": "#f781bf",
}


EXTRA = ["#393b79", "#637939", "#8c6d31", "#843c39"]


LINESTYLES = ["-", "--", ":", "-."]


# config fields that change no result (or that a run derives from the others): never a reason to split a
# group. The sweep's bookkeeping, the seed, free-form tags, the resolved values (they follow from the
# config), and where / on what / how verbosely a run computes.
IGNORED = BOOKKEEPING | {
    "seed",
    "extra",
    "resolved",
    "cache_dir",
    "device",
    "collective_timeout",
    "gradient_checkpointing",
    "vllm_gpu_memory_utilization",
    "vllm_sleep",
    "eval_samples",
}


@dataclass
class Run:
    path: Path
    task: str
    algo: str
    seed: int
    finished: bool
    config: dict[str, Any]
    rows: list[dict[str, Any]]  # the score rows: success_rate (control) or val_accuracy (LLM)
    calibration: dict[str, list[float]] | None
    world: str = "control"  # "control" or "llm"
    last: dict[str, Any] = field(default_factory=dict)  # the last metrics row of any kind
    label: str = ""  # algo and the settings that tell its groups apart (see label_runs)
    settings: dict[str, Any] = field(default_factory=dict)
    content: tuple[str, str] | None = (
        None  # LLM data files' hashes (training, validation): the task's identity
    )


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


NUMBER_KEYS = (
    "update",
    "update",
    "episodes",
    "success_rate",
    "val_accuracy",
    "wall_time_s",
    "sps",
    "generated_tokens",
)
"""The metrics the report reads as numbers: in every row that has one, a finite number (or null)."""


def _bad_value(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> str | None:
    """Why a run cannot be reported (a value of :data:`NUMBER_KEYS` that is no finite number, as NaN
    or a list; a row that is no object; a seed that is no integer), naming the row; None if it can."""
    seed = cfg.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        return f"config.json: seed is {seed!r:.40}, not an integer"
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            return f"row {i} is {type(row).__name__}, not an object"
        for key in NUMBER_KEYS:
            value = row.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"row {i}: {key} is {value!r:.40}, not a finite number"
    return None


def find_runs(inputs: tuple[str, ...], skip: Path | None = None) -> list[Run]:
    """Every folder under ``inputs`` with ``metrics.jsonl`` and a readable ``config.json``, labelled
    (:func:`label_runs`); a multi-seed run's own folder (``sppo-rl control --seeds``: the seeds' mean) is
    not a run, its ``seed<K>`` folders are. A run whose metrics hold a value the report cannot read as a number
    (:func:`_bad_value`: NaN, a list) is skipped, with one line on stderr naming its file and row."""
    seen, runs = set(), []
    for top in inputs:
        if not Path(top).is_dir():
            raise RunError(f"{top}: no such folder")
        for metrics in sorted(Path(top).resolve().rglob("metrics.jsonl")):
            folder = metrics.parent
            if folder in seen or (skip is not None and folder.is_relative_to(skip)):
                continue
            cfg = read_json(folder / "config.json")
            if not isinstance(cfg, dict) or "algo" not in cfg:
                continue
            if cfg.get("seeds"):  # a multi-seed run (control --seeds): its runs are its seed<K> folders
                continue
            cfg = config_now(cfg)  # keys under their names now (a run saved before a rename)
            seen.add(folder)
            rows = read_metrics(metrics)
            bad = _bad_value(rows, cfg)
            if bad is not None:
                print(f"report: skipped {metrics}: {bad}", file=sys.stderr)
                continue
            success = [r for r in rows if r.get("success_rate") is not None]
            evals = [r for r in rows if r.get("val_accuracy") is not None]
            if success or evals:
                world = "control" if success else "llm"
            else:  # nothing logged yet: the config says which world
                world = "llm" if "prompts_per_step" in cfg else "control"
            cal = read_json(folder / "calibration.json")
            runs.append(
                Run(
                    path=folder,
                    task=(cfg.get("resolved") or {}).get("task", cfg.get("task", "?")),
                    algo=cfg["algo"],
                    seed=int(cfg.get("seed", 0)),
                    finished=(folder / "summary.json").is_file(),
                    config=cfg,
                    rows=success if world == "control" else evals,
                    calibration=cal if isinstance(cal, dict) and cal.get("predicted") else None,
                    world=world,
                    last=rows[-1] if rows else {},
                )
            )
    name_tasks_by_content(runs)
    label_runs(runs)
    return runs


def data_hash(path: str | Path, prompt_key: str | None = None, answer_key: str | None = None) -> str | None:
    """The first 12 hex digits of the SHA-256 of a data file's examples, read as the LLM trainer reads
    them (prompt, answer; every record in file order): the same data as ``.parquet``, ``.jsonl`` or
    ``.json`` has one hash. None when the file cannot be read (moved, or not data)."""
    import hashlib

    from sppo_rl.llm.data.files import load_examples

    try:
        examples = load_examples(path, prompt_key=prompt_key, answer_key=answer_key, max_chars=None)
    except (OSError, ValueError):
        return None
    text = json.dumps([[e.prompt, e.answer] for e in examples], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _content_key(run: Run, hashes: dict[tuple, str | None]) -> tuple[str | None, str] | None:
    """``(training data hash, validation data hash or '')`` of an LLM run whose ``--task`` is a data
    file (None for a generated task, or a file that cannot be read)."""
    cfg = run.config

    def of(path: Any) -> str | None:
        if not path:
            return ""
        key = (str(path), cfg.get("prompt_key"), cfg.get("answer_key"))
        if key not in hashes:
            hashes[key] = data_hash(*key) if Path(path).is_file() else None
        return hashes[key]

    train = of(cfg.get("task"))
    val = of(cfg.get("val_data"))
    return None if not train or val is None else (train, val)


def name_tasks_by_content(runs: list[Run]) -> None:
    """LLM runs on the same data are one task whatever its file's name or format: each run whose
    ``--task`` (and ``--val-data``) is a readable data file gets as ``task`` the stem of the first such
    file (by path) with that content, with ``#<hash>`` appended where two contents share a stem."""
    hashes: dict[tuple, str | None] = {}
    keys = {id(r): _content_key(r, hashes) for r in runs if r.world == "llm"}
    firsts: dict[tuple, str] = {}
    for r in sorted((r for r in runs if keys.get(id(r))), key=lambda r: str(r.config.get("task"))):
        firsts.setdefault(keys[id(r)], Path(str(r.config["task"])).stem)
    stems = defaultdict(set)
    for key, stem in firsts.items():
        stems[stem].add(key)
    for r in runs:
        key = keys.get(id(r))
        if key:
            r.content = key
            stem = firsts[key]
            r.task = stem if len(stems[stem]) == 1 else f"{stem}#{key[0][:8]}"


def _same(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def effective(run: Run, key: str) -> Any:
    """A setting's value as the run used it: a field left at None ("the default") counts as the value the
    run resolved it to (``config.json``'s ``resolved``, e.g. ``group_size``), so that leaving a default
    and spelling it out are the same setting."""
    if run.content is not None and key in ("task", "val_data"):  # the data's content, not its file's name
        return run.content[0 if key == "task" else 1]
    value = run.config.get(key)
    resolved = run.config.get("resolved")
    if value is None and isinstance(resolved, dict) and key in resolved:
        return resolved[key]
    return value


def setting_keys(runs: list[Run]) -> list[str]:
    """The config keys that tell these runs (one algorithm of one world) apart: keys that every run's config
    has (a setting added by a later version is left out), other than :data:`IGNORED`, whose value
    (:func:`effective`) differs between two runs of the same task. A key that only differs between tasks
    (e.g. the budget of each task) is not one."""
    if not runs:
        return []
    keys = set.intersection(*(set(r.config) for r in runs)) - IGNORED
    by_task: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_task[r.task].append(r)
    return sorted(
        k for k in keys if any(len({_same(effective(r, k)) for r in rs}) > 1 for rs in by_task.values())
    )


def _setting(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def label_runs(runs: list[Run]) -> None:
    """Set each run's ``settings`` (its values of :func:`setting_keys` over the runs with rows of its world
    and algorithm) and ``label`` (``"sppo actor_lr=0.001"``; the bare algorithm where nothing differs)."""
    by_algo: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        by_algo[r.world, r.algo].append(r)
    for members in by_algo.values():
        keys = setting_keys([r for r in members if r.rows])
        for r in members:
            r.settings = {k: effective(r, k) for k in keys}
            r.label = " ".join([r.algo] + [f"{k}={_setting(v)}" for k, v in r.settings.items()])


def algo_order(algos) -> list[str]:
    known = [a for a in PALETTE if a in algos]
    return known + sorted(set(algos) - set(known))


def _sortable(value: Any) -> tuple:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, 0.0, _same(value))
    return (0, float(value), "")


def label_order(runs: list[Run]) -> list[str]:
    """Labels by algorithm (:func:`algo_order`), then by their settings' values (numbers by value)."""
    rank = {a: i for i, a in enumerate(algo_order({r.algo for r in runs}))}
    first = {}
    for r in runs:
        first.setdefault(r.label, r)
    return sorted(
        first, key=lambda lb: (rank[first[lb].algo], [_sortable(v) for v in first[lb].settings.values()])
    )


def colours(algos) -> dict[str, str]:
    others = sorted(set(algos) - set(PALETTE))
    return {**PALETTE, **{a: EXTRA[i % len(EXTRA)] for i, a in enumerate(others)}}


def _shade(colour: str, i: int) -> str:
    """The i-th variant of an algorithm's colour (0: itself; then darker, lighter, ...)."""
    from matplotlib.colors import to_hex, to_rgb

    if i == 0:
        return colour
    rgb = np.array(to_rgb(colour))
    f = 0.55 ** ((i + 1) // 2)
    return to_hex(rgb * f if i % 2 else 1 - (1 - rgb) * f)


def styles(runs: list[Run], labels: list[str]) -> dict[str, tuple[str, str]]:
    """(colour, line style) of each label: its algorithm's colour; the algorithm's further settings in
    other shades and line styles."""
    algo = {r.label: r.algo for r in runs}
    colour = colours(set(algo.values()))
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for label in labels:
        i = seen[algo[label]]
        seen[algo[label]] += 1
        out[label] = (_shade(colour[algo[label]], i), LINESTYLES[i % len(LINESTYLES)])
    return out


def groups_by_label(runs: list[Run]) -> list[tuple[str, str, list[Run]]]:
    """(task, label, seeds sorted) in task order, then label order."""
    order = label_order(runs)
    out = []
    for task in sorted({r.task for r in runs}):
        for label in order:
            members = sorted((r for r in runs if (r.task, r.label) == (task, label)), key=lambda r: r.seed)
            if members:
                out.append((task, label, members))
    return out


def algo_of(runs: list[Run], label: str) -> str:
    return next(r.algo for r in runs if r.label == label)
