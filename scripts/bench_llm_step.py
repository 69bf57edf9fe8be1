"""Peer benchmark: seconds per GRPO step of this project against Hugging Face TRL's ``GRPOTrainer``.

Both train the same locally built model folder (the project's embedded tiny Qwen2, built by
:func:`sppo_rl.llm.models.tiny.ensure_tiny_model`) on the same prompts (the arithmetic task of
:func:`sppo_rl.llm.data.arithmetic.make_arithmetic`, rendered by :func:`sppo_rl.llm.data.files.render_prompt` and
exported to one ``train.jsonl`` that both read) with the same binary reward (the integer in the last
``\\boxed{}`` equals the answer: ours is the built-in ``integer`` reward, TRL's is
:func:`integer_reward` below, the same rule) and the same settings: ``--prompts`` prompts x
``--group-size`` samples per step, at most ``--max-new-tokens`` new tokens, temperature 1, top-p 1,
one epoch of one minibatch (one optimizer step per generated batch, no separate old-log-prob pass),
AdamW at a constant ``--lr``, gradient clipping at 1, no KL term and no reference model, float32 on
the CPU with ``--threads`` torch threads, no gradient checkpointing, no logging, no checkpoints.

Step time: ours is ``step_time_s`` of the run's ``metrics.jsonl`` (prompt sampling, generation,
scoring, advantage, forward/backward and optimizer step); TRL's is the wall time from
``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback`` (its ``training_step`` generates,
scores and trains inside that window). The first ``--warmup`` steps of each are dropped; the table
shows the median of the rest and ours/TRL (below 1: ours is faster), and beside it the fastest step
of each and their ratio, which a busy shared machine disturbs less.

TRL needs its own virtual environment (``.venv-trl``, made by ``make bench-trl`` from
``requirements/trl.txt``); this script runs in the project's ``.venv``, builds the model and the data,
runs ``sppo-rl llm``, then runs itself with ``--trl-worker`` under ``.venv-trl/bin/python``::

    make bench-trl
    .venv/bin/python scripts/bench_llm_step.py --steps 12 --threads 2

Caveat of the defaults: the tokenizer is per character, and the shortest correct response
``\\boxed{0}`` has 9 characters, so with at most 8 new tokens every reward is 0 and every GRPO
advantage is 0. TRL still runs the backward pass and the optimizer step on the zero loss; this
project skips the actor update when every advantage is 0 (``actor_skipped`` in its metrics, counted
in the table). ``--warm-start --max-new-tokens 16`` compares the two with a learning signal: both
train the project's own warm start of the tiny model (the actor that ``sppo-rl llm`` trains when no
``--model`` is given, taken from its cache or built there once), whose sampled answers are right about
a third of the time, so that rewards vary within groups and both run a full update every step.

``--rounds N`` runs N rounds of ours, TRL, ours (ours first and last, so that a drift in the load of a
shared machine hits both) and pools the steps; the table also shows the 1-minute load average seen. Per
round the ratio is ``median(ours) / median(TRL)`` (ours: both its runs' steps); printed is their geometric
mean over the rounds with a 95 % interval, beside the **A/A** ratio, ours' second run against its first
(the same code timed twice: the timing null the ratio is read against; :func:`time_ratio`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()

# ------------------------------------------------------------------------------------ pure helpers

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_INT_RE = re.compile(r"[+-]?[0-9]+")


def last_boxed(text: str) -> str | None:
    """The stripped content of the last ``\\boxed{...}`` of ``text``; ``None`` when there is none or it
    never closes (the rule of :func:`sppo_rl.llm.rewards.answers.extract_boxed`, without its size limits)."""
    last = None
    for last in _BOX_OPEN.finditer(text):  # noqa: B007 - the final match
        pass
    if last is None:
        return None
    i = start = last.end()
    depth = 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


def integer_reward(response: str, answer: str) -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` holds exactly the integer ``answer`` (sign and
    digits, inner spaces ignored), else 0.0: :func:`sppo_rl.llm.rewards.verify.verify_integer`'s rule."""
    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    boxed = boxed.replace(" ", "")
    return float(bool(_INT_RE.fullmatch(boxed)) and int(boxed) == int(str(answer).strip()))


def measured(times: Sequence[float], warmup: int) -> list[float]:
    """``times`` without its first ``warmup`` entries; ``ValueError`` when nothing is left."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    kept = list(times)[warmup:]
    if not kept:
        raise ValueError(f"{len(times)} step time(s) and {warmup} warm-up step(s): nothing left to measure")
    return kept


def median_after_warmup(times: Sequence[float], warmup: int) -> float:
    """Median of ``times`` after dropping the first ``warmup`` (the warm-up steps)."""
    return statistics.median(measured(times, warmup))


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs: below 1 means ours takes less time per step."""
    if not (ours > 0 and theirs > 0):
        raise ValueError(f"step times must be positive, got ours={ours} theirs={theirs}")
    return ours / theirs


def round_ratios(
    pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], trl_runs: Sequence[dict[str, Any]], warmup: int
) -> dict[str, Any]:
    """Per round (ours' two runs, TRL's run) the median step times after ``warmup`` (``ours_a``,
    ``ours_b``, ``trl``), ``ours_vs_trl``: :func:`time_ratio` of ours (the median of both its runs'
    steps) over TRL, and ``aa``: of ours' second run over its first (below 1: the first faster)."""
    from sppo_rl.experiments.decision import time_ratio

    def steps(run: dict[str, Any]) -> list[float]:
        return measured([row["step_time_s"] for row in run["rows"]], warmup)

    ours = [statistics.median(steps(first) + steps(second)) for first, second in pairs]
    a = [statistics.median(steps(first)) for first, _ in pairs]
    b = [statistics.median(steps(second)) for _, second in pairs]
    trl = [median_after_warmup(t["step_time_s"], warmup) for t in trl_runs]
    return {
        "ours_a": a,
        "ours_b": b,
        "trl": trl,
        "ours_vs_trl": time_ratio(ours, trl),
        "aa": time_ratio(b, a),
    }


def check_args(args: argparse.Namespace) -> None:
    """Reject settings that cannot give a measurement (raises ``ValueError`` with the reason)."""
    for name in ("steps", "prompts", "group_size", "max_new_tokens", "threads", "train_size", "rounds"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        raise ValueError(f"--group-size must be >= 2 (GRPO needs a group), got {args.group_size}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.steps <= args.warmup:
        raise ValueError(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    if args.train_size < args.steps * args.prompts:
        raise ValueError(
            f"--train-size ({args.train_size}) must hold --steps x --prompts = {args.steps * args.prompts} "
            "prompts, so that neither trainer starts a second pass over the data"
        )


def read_ours(metrics: Path) -> list[dict[str, Any]]:
    """The update rows of an ``sppo-rl llm`` ``metrics.jsonl`` (those with ``step_time_s``), in order."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in rows if "step_time_s" in r]


def format_table(rows: list[tuple[str, Sequence[float], str]], r: float) -> str:
    """The result table: one row per trainer (name, its measured step times, notes) with their median,
    minimum and count, then the ratio ``r`` of the medians (ours / TRL) and of the minima."""
    head = f"{'trainer':<18} {'median s/step':>13} {'min s/step':>10} {'steps':>6}  notes"
    lines = [head, "-" * len(head)]
    for name, times, notes in rows:
        lines.append(
            f"{name:<18} {statistics.median(times):>13.3f} {min(times):>10.3f} {len(times):>6}  {notes}"
        )
    mins = [min(times) for _, times, _ in rows]
    lines.append(f"{'ours / TRL':<18} {r:>13.3f} {ratio(mins[0], mins[1]):>10.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ arguments


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="GRPO steps of each trainer")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8, help="longest response in tokens")
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (constant)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (and OMP_NUM_THREADS) of each")
    p.add_argument("--rounds", type=int, default=1, help="runs of each, alternating ours and TRL")
    p.add_argument("--seed", type=int, default=0, help="sampling / data-order seed of both")
    p.add_argument("--data-seed", type=int, default=1234, help="seed of the arithmetic prompts")
    p.add_argument("--level", type=int, default=1, help="arithmetic difficulty level")
    p.add_argument("--train-size", type=int, default=512, help="prompts exported to train.jsonl")
    p.add_argument(
        "--warm-start",
        action="store_true",
        help="train the project's warm start of the tiny model (sppo-rl llm's default actor), so rewards vary; "
        "use with --max-new-tokens 16",
    )
    p.add_argument("--out", type=Path, default=REPO / "build" / "bench_llm_step", help="work folder")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the tiny model (and its warm start) are built once; default: sppo-rl's "
        "($SPPO_RL_CACHE or ~/.cache/sppo_rl)",
    )
    p.add_argument("--trl-python", default=str(REPO / ".venv-trl" / "bin" / "python"))
    p.add_argument("--sppo-rl", default=str(Path(sys.executable).with_name("sppo-rl")))
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    # internal: the TRL side, run by the main process under --trl-python
    p.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    return p


# ------------------------------------------------------------------------------------ the TRL side


def trl_worker(args: argparse.Namespace) -> None:
    """Run TRL's GRPOTrainer on ``--model`` and ``--data``; write per-step times to ``--result``."""
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    def reward_integer(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [integer_reward(c, a) for c, a in zip(completions, answer)]

    rows_per_step = args.prompts * args.group_size
    config = GRPOConfig(
        output_dir=str(args.result.parent / "trl"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=args.seed,
        max_steps=args.steps,
        num_train_epochs=1,
        # one optimizer step per generated batch of prompts x group_size completions
        per_device_train_batch_size=rows_per_step,
        gradient_accumulation_steps=1,
        generation_batch_size=rows_per_step,
        num_generations=args.group_size,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the batch: ours' default aggregation
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: float | None = None
            self.step_s: list[float] = []  # on_step_begin -> on_step_end
            self.cycle_s: list[float] = []  # on_step_end -> next on_step_end
            self.last_end: float | None = None

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.begin = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            now = time.perf_counter()
            if self.begin is not None:
                self.step_s.append(now - self.begin)
            if self.last_end is not None:
                self.cycle_s.append(now - self.last_end)
            self.last_end = now

    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_integer,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    # time generation + scoring (TRL's _generate_and_score_completions) to split each step
    gen_s: list[float] = []
    nonzero: list[float] = []
    inner = trainer._generate_and_score_completions

    def timed(batch: Any) -> Any:
        t = time.perf_counter()
        out = inner(batch)
        gen_s.append(time.perf_counter() - t)
        adv = out.get("advantages")
        nonzero.append(float("nan") if adv is None else float((adv != 0).float().mean()))
        return out

    trainer._generate_and_score_completions = timed
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    result = {
        "step_time_s": timer.step_s,
        "cycle_time_s": timer.cycle_s,
        "gen_score_s": gen_s,
        "nonzero_adv_frac": nonzero,
        "train_total_s": total,
        "versions": _versions(),
        "threads": torch.get_num_threads(),
    }
    args.result.write_text(json.dumps(result, indent=2) + "\n")


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


# ------------------------------------------------------------------------------------ the main side


def build_model(args: argparse.Namespace) -> Path:
    """The tiny model folder (the project's embedded Qwen2, in ``--cache-dir``); with ``--warm-start``,
    the project's own warm start of it: what ``sppo-rl llm --task arithmetic`` without ``--model``
    trains on (default sizes, cached under the same key, so an existing one is reused)."""
    from sppo_rl.llm.models.tiny import TINY_CHARSET, TINY_SETTINGS, ensure_tiny_model

    folder = ensure_tiny_model(args.cache_dir, TINY_CHARSET, **TINY_SETTINGS)
    if not args.warm_start:
        return folder
    from sppo_rl.llm.data.arithmetic import make_arithmetic, reference_response
    from sppo_rl.llm.models.sft import supervised_warmstart
    from sppo_rl.llm.rewards.verify import verify_integer

    # sppo-rl llm's defaults: --train-size 4000 --val-size 128 --sft-steps 1500 --sft-lr 1e-3
    # --sft-target 0.3 --temperature 1 --max-new-tokens 16
    train, _ = make_arithmetic(args.data_seed, 4000, 128, level=args.level)

    def score(texts: list[str], truths: list[str]) -> list[float]:
        return [verify_integer(t, a) for t, a in zip(texts, truths)]

    folder, record = supervised_warmstart(
        folder,
        Path(args.cache_dir),
        [str(e.prompt) for e in train],
        [reference_response(e) for e in train],
        [e.answer for e in train],
        score,
        steps=1500,
        lr=1e-3,
        target=0.3,
        temperature=1.0,
        max_new_tokens=16,
        seed=args.seed,
        key_settings={"level": [args.level], "data_seed": args.data_seed, "train_size": 4000},
        progress=True,
    )
    print(
        f"warm start {folder}: {record.get('steps')} steps, sampled accuracy {record.get('holdout_accuracy')}",
        flush=True,
    )
    return folder


def export_data(args: argparse.Namespace, model: Path, train: list[Any]) -> Path:
    """``train.jsonl``: one ``{"prompt", "answer"}`` per example, the prompt as the trainers see it."""
    from sppo_rl.llm.data.files import render_prompt
    from sppo_rl.llm.models.tiny import load_tokenizer

    tokenizer = load_tokenizer(model)
    path = args.out / "train.jsonl"
    with path.open("w") as f:
        for e in train:
            f.write(json.dumps({"prompt": render_prompt(e, tokenizer), "answer": str(e.answer)}) + "\n")
    return path


def ours_command(args: argparse.Namespace, model: Path, data: Path, out_dir: Path) -> list[str]:
    """The ``sppo-rl llm`` command of the benchmark."""
    return [
        args.sppo_rl,
        "llm",
        "--algo", "grpo",
        "--task", str(data),
        "--prompt-key", "prompt",
        "--answer-key", "answer",
        "--reward-fn", "integer",
        "--model", str(model),
        "--updates", str(args.steps),
        "--prompts-per-step", str(args.prompts),
        "--group-size", str(args.group_size),
        "--max-new-tokens", str(args.max_new_tokens),
        "--temperature", "1",
        "--top-p", "1",
        "--actor-lr", str(args.lr),
        "--weight-decay", "0",
        "--max-grad-norm", "1",
        "--epochs", "1",
        "--minibatches", "1",
        "--kl-coef", "0",
        "--seed", str(args.seed),
        "--threads", str(args.threads),
        "--device", "cpu",
        "--eval-every", "0",
        "--checkpoint-every", str(args.steps + 1),
        "--keep-checkpoints", "1",
        "--no-progress",
        "--no-tensorboard",
        "--no-wandb",
        "--out-dir", str(out_dir),
        "--overwrite",
    ]  # fmt: skip


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    print("$ " + shlex.join(cmd), flush=True)
    with log.open("w") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise SystemExit(f"command failed ({proc.returncode}); last lines of {log}:\n{tail}")


def run_ours(
    args: argparse.Namespace, model: Path, data: Path, env: dict[str, str], tag: str
) -> dict[str, Any]:
    """One ``sppo-rl llm`` run: its update rows (``metrics.jsonl``) and the load average around it."""
    out_dir = args.out / f"ours{tag}"
    load = os.getloadavg()[0]
    _run(ours_command(args, model, data, out_dir), env, args.out / f"ours{tag}.log")
    rows = read_ours(out_dir / "metrics.jsonl")
    if len(rows) != args.steps:
        raise SystemExit(f"ours logged {len(rows)} of {args.steps} steps: see {out_dir}")
    return {"rows": rows, "load": (load, os.getloadavg()[0])}


def run_trl(
    args: argparse.Namespace, model: Path, data: Path, env: dict[str, str], tag: str
) -> dict[str, Any]:
    """One TRL run in ``--trl-python``: the worker's result and the load average around it."""
    result = args.out / f"trl{tag}.json"
    result.unlink(missing_ok=True)
    worker = [
        args.trl_python, str(SCRIPT), "--trl-worker",
        "--model", str(model), "--data", str(data), "--result", str(result),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompts", str(args.prompts),
        "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
        "--lr", str(args.lr), "--threads", str(args.threads), "--seed", str(args.seed),
        "--train-size", str(args.train_size),
    ]  # fmt: skip
    trl_env = dict(env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    trl_env.setdefault("HF_HOME", str(args.out / "hf_home"))
    load = os.getloadavg()[0]
    _run(worker, trl_env, args.out / f"trl{tag}.log")
    out = json.loads(result.read_text())
    if len(out["step_time_s"]) != args.steps:
        raise SystemExit(
            f"TRL timed {len(out['step_time_s'])} of {args.steps} steps: see {args.out}/trl{tag}.log"
        )
    out["load"] = (load, os.getloadavg()[0])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        parser().error(str(e))
    if args.trl_worker:
        trl_worker(args)
        return {}
    if not Path(args.trl_python).is_file():
        raise SystemExit(f"{args.trl_python} not found: run `make bench-trl` (it creates .venv-trl) first")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from sppo_rl.llm.data.arithmetic import make_arithmetic
    from sppo_rl.llm.models.sources import default_cache_dir

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache_dir = (args.cache_dir or default_cache_dir()).resolve()
    train, _ = make_arithmetic(args.data_seed, args.train_size, 0, level=args.level)
    model = build_model(args)
    data = export_data(args, model, train)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    env.pop("CUDA_VISIBLE_DEVICES", None)

    # ours and TRL alternate, one run at a time, so that a change in the machine's load hits both
    ours_runs, trl_runs, pairs = [], [], []
    for i in range(args.rounds):
        tag = "" if args.rounds == 1 else f"-{i + 1}"
        first = run_ours(args, model, data, env, f"{tag}a")
        trl_runs.append(run_trl(args, model, data, env, tag))
        second = run_ours(args, model, data, env, f"{tag}b")
        ours_runs += [first, second]
        pairs.append((first, second))

    kept = [row for run in ours_runs for row in run["rows"][args.warmup :]]
    ours_times = [row["step_time_s"] for row in kept]
    ours_med = statistics.median(ours_times)
    breakdown = {
        k: statistics.median(row[k] for row in kept) for k in ("time_gen_s", "time_score_s", "time_train_s")
    }
    skipped = sum(int(row.get("actor_skipped", 0)) for row in kept)
    ours_reward = statistics.mean(row["reward_mean"] for row in kept)
    trl_times = [t for run in trl_runs for t in measured(run["step_time_s"], args.warmup)]
    trl_med = statistics.median(trl_times)
    trl_gen = statistics.median(t for run in trl_runs for t in measured(run["gen_score_s"], args.warmup))
    trl_nonzero = statistics.mean(
        f for run in trl_runs for f in measured(run["nonzero_adv_frac"], args.warmup)
    )
    trl_cycle = statistics.median(
        t for run in trl_runs for t in measured(run["cycle_time_s"], max(args.warmup - 1, 0))
    )
    r = ratio(ours_med, trl_med)

    n = len(kept)
    notes_ours = (
        f"gen {breakdown['time_gen_s']:.3f} + score {breakdown['time_score_s']:.3f} + "
        f"train {breakdown['time_train_s']:.3f}; mean reward {ours_reward:.3f}; "
        f"actor update skipped (all advantages 0) in {skipped}/{n} steps"
    )
    notes_trl = (
        f"gen+score {trl_gen:.3f} + train {trl_med - trl_gen:.3f}; "
        f"rows with non-zero advantage {trl_nonzero:.3f}; step_end->step_end {trl_cycle:.3f}"
    )
    table = format_table(
        [("ours (sppo-rl)", ours_times, notes_ours), ("TRL GRPOTrainer", trl_times, notes_trl)], r
    )
    repro = shlex.join(
        [
            os.path.relpath(sys.executable),
            os.path.relpath(SCRIPT),
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    print()
    print(
        f"GRPO step time on CPU ({args.threads} threads): {args.prompts} prompts x {args.group_size} samples, "
        f"<= {args.max_new_tokens} new tokens, model {model.name}; median over {args.rounds} round(s) of "
        f"steps {args.warmup + 1}..{args.steps}"
    )
    print(table)
    from sppo_rl.experiments.decision import ratio_text  # not at the top: the TRL worker's venv lacks sppo_rl

    rounds = round_ratios(pairs, trl_runs, args.warmup)
    for i, (a, b, t) in enumerate(zip(rounds["ours_a"], rounds["ours_b"], rounds["trl"])):
        print(f"round {i + 1}: ours {a:.3f} / {b:.3f} s, TRL {t:.3f} s")
    print(f"ours / TRL, per round then their geometric mean: {ratio_text(rounds['ours_vs_trl'], 'round')}")
    print(f"A/A, ours' second run / its first: {ratio_text(rounds['aa'], 'round')}")
    loads = [x for run in ours_runs + trl_runs for x in run["load"]]
    print(f"1-min load average during the runs: {min(loads):.1f}..{max(loads):.1f} on {os.cpu_count()} CPUs")
    print(f"versions: TRL side {trl_runs[0]['versions']}")
    print(f"reproduce: OMP_NUM_THREADS={args.threads} {repro}")
    summary = {
        "ours_median_step_s": ours_med,
        "trl_median_step_s": trl_med,
        "ratio_ours_over_trl": r,
        "ours_min_step_s": min(ours_times),
        "trl_min_step_s": min(trl_times),
        "ours_breakdown_median_s": breakdown,
        "ours_actor_skipped": skipped,
        "ours_reward_mean": ours_reward,
        "ours_step_time_s": [[row["step_time_s"] for row in run["rows"]] for run in ours_runs],
        "trl_gen_score_median_s": trl_gen,
        "rounds": rounds,
        "trl_runs": trl_runs,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "model": str(model),
    }
    (args.out / "result.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
