"""The paper's LLM comparison at small scale, over several seeds: every method from the same warm start,
the same prompts per update and the same number of updates (or the same wall-clock budget), each
(method, seed) its own ``sppo-rl llm`` process writing to ``<out>/<name>/seed<k>/``, run by ``sppo-rl
sweep``'s runner (:func:`sppo_rl.experiments.sweep.sweep` on :func:`~sppo_rl.experiments.sweep.llm_jobs`:
its locks, signal handling and ``<out>/sweep.json``); the script then
reads the metrics back and computes every figure itself into ``<out>/compare.json`` (every number),
``<out>/compare.md`` (the two tables, also printed) and ``<out>/compare.png``
(mean raw validation accuracy over seeds with its min-max band, against updates, generated tokens and
wall-clock seconds), and ``<out>/compare_flops.png`` (accuracy against training FLOPs with ScaleRL's
sigmoid fitted per method, its table in ``compare.md``: :mod:`sppo_rl.experiments.scaling`).

    # the long-horizon comparison: SPPO (N=1), GRPO (N=8), RLOO, PPO, SPPO with a small critic
    python scripts/compare_llm.py --set long --task scratchpad --seconds 600 --out runs/cmp_long
    # the methods: SPPO, GRPO, GSPO, SPPO-seq, GRPO with TIS, DAPO-style GRPO, PPO, PPO with VC-PPO's fixes
    python scripts/compare_llm.py --set methods --updates 150 --out runs/cmp_methods
    # Latent-GRPO, its unfixed variant, explicit GRPO and SPPO from the curriculum's explicit stage (per seed)
    python scripts/compare_llm.py --set latent --updates 30 --prompts-per-step 8 --out runs/cmp_latent \
        --llm-args "--val-size 128 --eval-samples 4 --actor-lr 3e-5"

Run sets (``--set``, narrowed by ``--only NAME ...``): ``long``, ``methods``, ``latent``, ``real``, ``async`` (SPPO
with ``--max-staleness`` 0, 1 and 2), ``all`` (every method; the default). ``--seconds S`` gives every run the same training wall-clock (``--max-seconds`` of ``sppo-rl
llm``: the last update is the first to end past S; validation is not counted); ``--updates K`` the same
number of updates. ``--workers N`` runs N processes at a time: wall-clock figures are only comparable
on a quiet machine with N no larger than its free cores. ``--reuse`` keeps a run whose folder holds a
finished run with the same settings and continues (``--resume``) one stopped after a checkpoint (the
sweep's rules); without it every run starts again.

How the figures are computed: by the comparison protocol of :mod:`sppo_rl.experiments.protocol`
(stated in docs/results.md, each function tested on hand-made numbers and on simulated A/A runs in
``tests/test_protocol.py``; this script's use of it on hand-made rows in ``tests/test_compare_llm.py``):

- each seed's raw validation accuracy (every ``--eval-every`` updates and at the start and end), read as
  straight lines between evaluations, on the seconds and tokens window every run covers;
- the **target**: ``start + --target-gain x (median of the pooled finals of every run - start)``, the
  same for every method (no method's own maximum), or ``--target X`` fixed before the runs;
- per seed: accuracy at equal wall-clock and at equal generated tokens (the window's end), the area
  under accuracy-vs-seconds (normalised), seconds and tokens to the target (the time spent below it),
  final accuracy (the protocol's "final": the last 10 % of the evaluations, at least one);
- a row per seed: start accuracy (sampled, and greedy), final, the first update whose evaluation reaches
  the target, the share of responses cut at the length limit over the first and the last 5 updates
  (a run drifting to the limit), its updates and generated tokens;
- every method against ``--baseline`` (default SPPO), over the seeds both have, by the decision rule
  of :mod:`sppo_rl.experiments.decision`: the set's ONE primary statistic, declared before the runs
  (``--primary``; default the accuracy at equal compute at the window's end: FLOPs where the runs log
  ``flops_total``, else generated tokens, said so) and its equivalence margin (``--margin``, default
  0.05); a paired t-test per statistic (ratios on log-ratios), its 95 % interval, Holm's correction over
  the primary table and over the secondary (exploratory) table, beside an inconclusive result the
  minimum detectable effect at 80 % power, a TOST against the margin, the means with rliable's IQM and
  probability of improvement, and the runs that collapsed with Fisher's exact test.

Seeds: 14 by default (a tiny-model run takes tens of seconds), 6 for the real-model set (minutes a
run; :data:`REAL_SEEDS` says why).

Model-state memory is counted exactly: parameters + gradients + two AdamW moments, in float32, for the
trainable models (actor and critic); peak RSS is the process's (the largest over seeds), dominated at
this size by the Python and torch runtime.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sppo_rl.experiments import decision, protocol
from sppo_rl.experiments.config import SweepConfig
from sppo_rl.experiments.scaling import method_colour
from sppo_rl.experiments.sweep import Job, JobResult, llm_config, llm_jobs, sweep
from sppo_rl.runtime.curves import TAIL_FRAC, tail_value
from sppo_rl.runtime.logging import read_metrics, read_summary

REPO = Path(__file__).resolve().parents[1]

SMALL = "{small}"  # stands for the small critic's folder, built on first use
EXPLICIT = (
    "{explicit}"  # stands for the seed's explicit-reasoning warm start (Latent-GRPO's comparable start)
)
# the value of a group method's --prompts-per-step that gives it the single-sample methods' samples per
# update: the script's --prompts-per-step divided by the run's --group-size (at least 1)
SAME_SAMPLES = "{same-samples}"
REAL_MODEL = "smollm2-135m"  # the real pretrained model of the "real" set, and its 4-layer critic
REAL_CRITIC = f"{REAL_MODEL}:layers=4"
# token-level PPO as the project's PPO recipe (ppo-1.5b-deepscaler.json) and verl run it: whitened
# advantages, value clipping 0.5
PPO = ["--algo", "ppo", "--whiten", "--value-clip", "0.5"]
ALL = [
    ("sppo", ["--algo", "sppo"]),
    ("grpo", ["--algo", "grpo", "--group-size", "8"]),
    ("rloo", ["--algo", "rloo", "--group-size", "5"]),
    ("remax", ["--algo", "remax"]),
    ("ppo", PPO),
    ("sppo-small-critic", ["--algo", "sppo", "--critic-model", SMALL]),
    ("bppo", ["--algo", "bppo", "--group-size", "8"]),
    ("lampo", ["--algo", "lampo", "--group-size", "8"]),
    ("gspo", ["--algo", "gspo", "--group-size", "8"]),
    ("sppo-seq", ["--algo", "sppo-seq"]),
    ("cispo", ["--algo", "cispo", "--group-size", "8"]),
    ("reinforce++", ["--algo", "reinforce++"]),
    ("reinforce++-baseline", ["--algo", "reinforce++-baseline", "--group-size", "8"]),
    # token-level PPO with VC-PPO / VAPO's critic fixes: unbiased critic targets, length-adaptive actor
    # lambda (alpha 1: lambda 0.9 at 10 tokens; VAPO's 0.05 is for responses of hundreds), value pre-training
    ("ppo-vc", [*PPO, "--lam-critic", "1.0", "--lam-alpha", "1.0", "--critic-warmup", "5"]),
]
SET_NAMES = ("long", "methods", "latent", "real", "async", "precision", "single", "all")
BASELINE = "sppo"  # every other method is compared against it (--baseline)
TINY_SEEDS = 14
"""Default seeds of the tiny-model sets (a run takes tens of seconds): the five-seed tables in the docs
show paired spreads of 0.01-0.15 on the primary statistic, median 0.06 (``python
scripts/restate_claims.py``), and ``python scripts/power.py --sd 0.06 --effect 0.05`` asks for 14 seeds
to detect a difference of 0.05 (the equivalence margin) with power 0.8."""
REAL_SEEDS = 6
"""Default seeds of the real-model set (a run takes minutes): SPPO's five-seed pilot on SmolLM2 ended at
0.569 with sd 0.024; two such methods with independent seeds differ per seed with sd 0.024 x sqrt 2 =
0.034, and ``python scripts/power.py --sd 0.034 --effect 0.05`` asks for 6 seeds to detect 0.05."""


def set_design(name: str) -> tuple[int, decision.Design]:
    """What each set declares before its runs: its default seed count and its primary statistic (the
    default: accuracy at equal compute, FLOPs where logged, else generated tokens) with the equivalence
    margin 0.05 in accuracy."""
    return (REAL_SEEDS if name in ("real", "precision") else TINY_SEEDS), decision.Design(
        primary=None, margin=decision.MARGIN
    )


def run_sets() -> dict[str, list[tuple[str, list[str]]]]:
    """The named run sets. DAPO-style GRPO takes clip-higher (0.28), overlong filtering and dynamic
    sampling (at most 3 extra generation rounds per update) from the flags this ``sppo-rl llm`` has (its
    ``LLMConfig`` fields)."""
    from sppo_rl.config import flat_keys
    from sppo_rl.llm.config import LLMConfig

    fields = set(flat_keys(LLMConfig))  # config.json's keys: one per flag
    flags = dict(ALL)
    dapo = ["--algo", "grpo", "--group-size", "8"]
    dapo += ["--clip-high", "0.28"] if "clip_high" in fields else []
    dapo += ["--overlong-filter"] if "overlong_filter" in fields else []
    dapo += ["--dynamic-sampling-rounds", "3"] if "dynamic_sampling_rounds" in fields else []
    methods = [(n, flags[n]) for n in ("sppo", "grpo", "gspo", "sppo-seq")]
    methods += [("grpo-tis", [*flags["grpo"], "--tis-cap", "2"]), ("dapo", dapo)]
    methods += [(n, flags[n]) for n in ("ppo", "ppo-vc")]
    real_sppo = ["--algo", "sppo", "--model", REAL_MODEL, "--critic-model", REAL_CRITIC]
    return {
        "long": [(n, flags[n]) for n in ("sppo", "grpo", "rloo", "ppo", "sppo-small-critic")],
        "methods": methods,
        # Latent-GRPO beside its unfixed variant and explicit GRPO and SPPO from the same
        # curriculum's stage 0 (explicit reasoning lines), built per seed; "grpo" is the target's reference
        "latent": [
            ("latent-grpo", ["--algo", "latent-grpo", "--group-size", "8"]),
            ("latent-grpo-naive", ["--algo", "latent-grpo-naive", "--group-size", "8"]),
            ("grpo", ["--algo", "grpo", "--group-size", "8", "--model", EXPLICIT, "--max-new-tokens", "32"]),
            ("sppo", ["--algo", "sppo", "--model", EXPLICIT, "--max-new-tokens", "32"]),
        ],
        # a real pretrained model (SmolLM2-135M-Instruct, its named defaults: chat template, "What is
        # 41 + 74? Answer with just the number.", boxed-or-last-number, lr 2e-5, 32 new tokens); the
        # same samples per update for every method (GRPO: --prompts-per-step / 4 prompts x 4 samples);
        # SPPO and PPO with the model's first 4 layers as their critic
        "real": [
            ("sppo", real_sppo),
            (
                "grpo",
                [
                    "--algo",
                    "grpo",
                    "--group-size",
                    "4",
                    "--prompts-per-step",
                    SAME_SAMPLES,
                    "--model",
                    REAL_MODEL,
                ],
            ),
            ("ppo", [*PPO, "--model", REAL_MODEL, "--critic-model", REAL_CRITIC]),
            # the two single-sample rivals with no learned critic: SPO's per-prompt tracker, A*-PO's V*
            # from 8 reference samples of every training prompt before update 1 (its cost counted)
            ("spo", ["--algo", "spo", "--model", REAL_MODEL]),
            ("astar-po", ["--algo", "astar-po", "--model", REAL_MODEL]),
        ],  # fmt: skip
        # asynchronous rollouts: SPPO synchronous (K = 0) against its sampler 1 and 2 updates ahead in a
        # worker process (decoupled PPO's correction, the default with staleness); equal FLOPs per update
        "async": [
            ("sppo", flags["sppo"]),
            ("sppo-k1", [*flags["sppo"], "--max-staleness", "1"]),
            ("sppo-k2", [*flags["sppo"], "--max-staleness", "2"]),
        ],
        # mixed precision: SPPO on the real model in float32 against --precision bf16 (bfloat16 matmuls, the
        # LM and value heads in float32), the same seeds; equal FLOPs per update (bf16 does the same work)
        "precision": [
            ("sppo", [*real_sppo, "--precision", "fp32"]),
            ("sppo-bf16", [*real_sppo, "--precision", "bf16"]),
        ],
        # the single-sample methods (one response per prompt, a baseline that is not a group mean) beside
        # the group methods as the reference, all at the same samples per update (a group method: --prompts-
        # per-step / N prompts x N); run on arithmetic and on the scratchpad (--task scratchpad, --llm-args
        # "--level 1" or "--level 5")
        "single": [
            ("sppo", flags["sppo"]),
            ("spo", ["--algo", "spo"]),
            ("astar-po", ["--algo", "astar-po"]),
            ("opo-batch", ["--algo", "opo-batch"]),
            # REINFORCE with a batch baseline, A = R - mean R over the batch, and without one, A = R (with
            # 0/1 outcomes: only the successes are pushed up)
            ("reinforce-batch", ["--algo", "reinforce-batch"]),
            ("reinforce", ["--algo", "reinforce"]),
            ("sao", ["--algo", "sao"]),
            ("crf-ntf", ["--algo", "crf-ntf"]),
            *[
                (f"{name}-{n}", ["--algo", name, "--group-size", str(n), "--prompts-per-step", SAME_SAMPLES])
                for name, n in (("shrinkage", 4), ("v05", 4), ("grpo", 4), ("grpo", 8))
            ],
        ],
        "all": list(ALL),
    }


# ----------------------------------------------------------------------------------------- the maths


def evaluations(rows: list[dict]) -> list[dict]:
    """The metrics rows that carry a validation accuracy, in order."""
    return [r for r in rows if r.get("val_accuracy") is not None]


def spread(values: list[float | None]) -> dict:
    """Over the values that exist (None and NaN do not): ``mean``, ``min``, ``max``, the sample standard
    deviation ``sd`` (None under two values), ``n`` of ``of``."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    return {
        "mean": statistics.fmean(xs) if xs else None,
        "min": min(xs) if xs else None,
        "max": max(xs) if xs else None,
        "sd": statistics.stdev(xs) if len(xs) > 1 else None,
        "n": len(xs),
        "of": len(values),
    }


def seed_figures(rows: list[dict]) -> dict:
    """One seed's raw curve and what it logged: start and final accuracy and pass@k (final: the
    protocol's :func:`~sppo_rl.runtime.curves.tail_value` over the evaluations), the start's
    greedy accuracy, the mean response length over the updates, the mean share of responses cut at the
    length limit over the first and over the last :data:`CUT_UPDATES` updates, the totals of its last
    row."""
    evals = evaluations(rows)
    acc = [r["val_accuracy"] for r in evals]
    passk = [r.get("pass_at_k") for r in evals]
    greedy = [r.get("val_greedy_accuracy") for r in evals]
    formats = {key: [r.get(f"val_{key}") for r in evals] for key in FORMATS}
    lengths = [r["response_length"] for r in rows if r.get("response_length") is not None]
    cut = [r["response_clip_frac"] for r in rows if r.get("response_clip_frac") is not None]
    last = rows[-1] if rows else {}
    return {
        "curve": {
            "updates": [r["update"] for r in evals],
            "tokens": [r["generated_tokens"] for r in evals],
            "seconds": [r["wall_time_s"] for r in evals],
            "val_accuracy": acc,
        },
        "format_curve": {key: v for key, v in formats.items() if v and None not in v},
        **{
            f"{when}_{key}": (v[0] if when == "start" else tail_value(v)) if v and None not in v else None
            for key, v in formats.items()
            for when in ("start", "final")
        },
        "start_val_accuracy": acc[0] if acc else None,
        "start_greedy_accuracy": evals[0].get("val_greedy_accuracy") if evals else None,
        "cut_first": statistics.fmean(cut[:CUT_UPDATES]) if cut else None,
        "cut_last": statistics.fmean(cut[-CUT_UPDATES:]) if cut else None,
        "final_val_accuracy": tail_value(acc) if acc else None,
        "final_greedy_accuracy": tail_value(greedy) if greedy and None not in greedy else None,
        "k": evals[-1].get("val_k") if evals else None,
        "start_pass_at_k": passk[0] if passk and passk[0] is not None else None,
        "final_pass_at_k": tail_value(passk) if any(p is not None for p in passk) else None,
        "response_length": statistics.fmean(lengths) if lengths else None,
        "updates": last.get("update"),
        "tokens": last.get("generated_tokens"),
        "seconds": last.get("wall_time_s"),
        "flops": last.get("flops_total"),
    }


CUT_UPDATES = 5
"""How many updates at each end of a run :func:`seed_figures` averages ``response_clip_frac`` over."""


def first_update_at(rows: list[dict], target: float) -> int | None:
    """The update of the first evaluation whose accuracy is at least ``target`` (None: never)."""
    return next((r["update"] for r in evaluations(rows) if r["val_accuracy"] >= target), None)


FORMATS = ("number_rate", "boxed_rate")
"""The format-learning rates a run logs at each evaluation (``val_number_rate``, ``val_boxed_rate``: the
shares of sampled validation responses that are a bare number or hold a closed box, right or wrong)."""
RUN_STATS = ("acc_at_seconds", "acc_at_tokens", "auc_seconds", "seconds_to_target", "tokens_to_target")


def method_figures(per_seed: dict[int, dict]) -> dict:
    """The summaries over seeds (:func:`spread`) of each seed's figures and protocol statistics."""
    seeds = sorted(per_seed)
    out: dict[str, Any] = {"seeds": seeds}
    keys = ("start_val_accuracy", "final_val_accuracy", "final_greedy_accuracy", "start_pass_at_k")
    keys += ("final_pass_at_k", "acc_at_flops", "flops")
    keys += tuple(f"{when}_{key}" for key in FORMATS for when in ("start", "final"))
    for key in (*keys, *RUN_STATS, "response_length", "updates", "tokens", "seconds"):
        out[key] = spread([per_seed[k].get(key) for k in seeds])
    ks = {per_seed[k]["k"] for k in seeds} - {None}
    out["k"] = ks.pop() if len(ks) == 1 else None
    out["reached"] = {"n": sum(per_seed[k]["reached_seconds"] for k in seeds), "of": len(seeds)}
    return out


def compare(
    rows: dict[str, dict[int, list[dict]]],
    target: float | None = None,
    gain: float = protocol.TARGET_GAIN,
    baseline: str = BASELINE,
    design: decision.Design | None = None,
) -> dict:
    """Every figure from the metrics rows of each method and seed, by the protocol
    (:mod:`sppo_rl.experiments.protocol`): the common windows, the target (given, or the pooled rule),
    each seed's figures and statistics, their summaries over seeds, and every other method against
    ``baseline`` by the decision rule of ``design`` (:mod:`sppo_rl.experiments.decision`: the primary
    statistic, paired t-tests, Holm, MDE, TOST, collapse counts)."""
    curves = {
        name: {k: protocol.Curve.of_rows(seeds[k]) for k in sorted(seeds)} for name, seeds in rows.items()
    }
    pairs = [(name, baseline) for name in rows if name != baseline and baseline in rows]
    result = protocol.protocol(curves, pairs, target=target, gain=gain, design=design)
    figures = {}
    for name, seeds in rows.items():
        per_seed = {
            k: {
                **seed_figures(seeds[k]),
                **result["runs"][name][k],
                "first_update_at_target": first_update_at(seeds[k], result["target"]["value"]),
            }
            for k in sorted(seeds)
        }
        figures[name] = {**method_figures(per_seed), "per_seed": per_seed}
    return {
        "target": {**result["target"], "gain": gain},
        "windows": result["windows"],
        "baseline": baseline,
        "methods": figures,
        "pairs": result["pairs"],
        "decision": {k: result[k] for k in ("axes", "primary", "design", "notes", "table", "collapse")},
    }


# ------------------------------------------------------------------------------------------ the runs


def model_state_mib(folder: Path) -> float:
    """Parameters x 4 copies (weights, gradients, AdamW m and v) x 4 bytes, in MiB."""
    from safetensors import safe_open

    n = 0
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for k in f.keys():
            n += math.prod(f.get_slice(k).get_shape())
    return n * 4 * 4 / 2**20


def run_facts(dirs: list[Path]) -> dict:
    """What a method's run folders say beside its curves: the group size, the peak RSS over seeds and
    the model state (actor, plus the critic if any) of the first seed's resolved models."""
    summaries = [read_summary(d / "summary.json") for d in dirs]
    config = json.loads((dirs[0] / "config.json").read_text())
    resolved = config["resolved"]
    models = [resolved["actor"]] + ([resolved["critic"]] if resolved["critic"] != "none" else [])
    return {
        "group_size": summaries[0]["group_size"],
        "peak_rss_mib": max(s["peak_memory_mb"] for s in summaries),
        "model_state_mib": sum(model_state_mib(recorded_folder(m, config.get("cache_dir"))) for m in models),
    }


def recorded_folder(value: str, cache_dir: str | None = None) -> Path:
    """The model folder a run's ``config.json`` records: a folder; or, in folders written before the
    critic was recorded as one, a named model (``smollm2-135m:layers=4``), whose folder in the run's
    ``cache_dir`` (None: the default cache) is returned without building or verifying it."""
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.sources import default_cache_dir

    ref = None if Path(value).is_dir() else pretrained.parse_ref(value)
    if ref is None:
        return Path(value)
    return (Path(cache_dir) if cache_dir else default_cache_dir()) / ref.folder_name


def small_critic(task: str) -> Path:
    """The critic smaller than the actor: the embedded base model's settings for ``task`` with hidden 64,
    2 layers, 2 heads (1 key-value head), the same tokenizer; built once into the cache."""
    from sppo_rl.llm.models.sources import default_cache_dir
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model, tiny_settings

    settings = {**tiny_settings(task), "hidden_size": 64, "layers": 2, "heads": 2, "kv_heads": 1}
    return ensure_tiny_model(default_cache_dir(), TINY_CHARSET, **settings)


def explicit_model(args: argparse.Namespace, seed: int) -> str:
    """The seed's explicit-reasoning warm start (stage 0 of the latent curriculum), built once into the
    cache by ``python -m sppo_rl.llm.latent explicit-model`` with the run's task and flags."""
    cmd = [
        sys.executable,
        "-m",
        "sppo_rl.llm.latent",
        "explicit-model",
        "--task",
        args.task,
        "--seed",
        str(seed),
    ]
    cmd += [f for f in shlex.split(args.llm_args) if f != "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"explicit warm start for seed {seed} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip().splitlines()[-1]


def llm_flags(
    flags: list[str], args: argparse.Namespace, seed: int, small: str, resolve: bool = True
) -> list[str]:
    """The ``sppo-rl llm`` flags of one (method, seed) run, without ``--seed`` and ``--out-dir`` (the
    sweep's); ``resolve=False`` keeps the ``{explicit}`` placeholder: nothing is built."""
    budget = ["--updates", str(args.updates)]
    if args.seconds is not None:
        budget += ["--max-seconds", str(args.seconds)]
    group = int(flags[flags.index("--group-size") + 1]) if "--group-size" in flags else 1
    same_samples = str(max(1, args.prompts_per_step // group))
    own = [
        f.replace(SMALL, small)
        .replace(EXPLICIT, explicit_model(args, seed) if resolve and f == EXPLICIT else f)
        .replace(SAME_SAMPLES, same_samples)
        for f in flags
    ]
    prompts = [] if "--prompts-per-step" in own else ["--prompts-per-step", str(args.prompts_per_step)]
    return [
        *own,
        *budget,
        "--task",
        args.task,
        *prompts,
        "--eval-every",
        str(args.eval_every),
        *shlex.split(args.llm_args),
    ]


def flag_problem(name: str, flags: list[str]) -> str | None:
    """Why the sweep or ``sppo-rl llm`` would refuse run ``name``'s ``flags``
    (:func:`~sppo_rl.experiments.sweep.llm_config`), in one line; None if taken. A flag whose value is a
    placeholder (``{small}``, ``{explicit}``: built only after this check) is left out, so the default
    stands in for it."""
    holders = (SMALL, EXPLICIT)
    kept = [
        f
        for i, f in enumerate(flags)
        if f not in holders and flags[i + 1 : i + 2] not in ([SMALL], [EXPLICIT])
    ]
    try:
        llm_config(name, kept)
    except ValueError as e:
        return str(e)
    return None


def run_all(runs: list[tuple[str, list[str]]], args: argparse.Namespace, small: str) -> list[str]:
    """Every (method, seed) through the sweep's runner, ``--workers`` at a time, each line printed as its
    run ends; the errors of the runs that did not finish. ``--reuse``: the sweep's rules (a finished run
    with the same settings kept, a stopped one resumed, one with other settings started again); without
    it every run starts again (``--overwrite``)."""
    specs = [(name, seed, llm_flags(flags, args, seed, small)) for seed in args.seeds for name, flags in runs]
    from sppo_rl.runtime.run import RunError

    try:
        jobs = llm_jobs(specs, args.out, other="overwrite", overwrite=not args.reuse, threads=1)
    except ValueError as e:
        raise SystemExit(refuse(str(e))) from None
    os.environ["OMP_NUM_THREADS"] = "1"  # every run's process on one thread (wall-clock comparisons)
    cfg = SweepConfig(world="llm", out_dir=args.out, workers=args.workers, progress=False)
    try:
        results = sweep(cfg, jobs, on_done=lambda job, r: said(job, r, Path(args.out)))
    except RunError as e:  # another sweep holds the folder
        raise SystemExit(refuse(str(e))) from None
    return [error(job, r) for job, r in zip(jobs, results) if r.status not in ("done", "resumed", "skipped")]


def said(job: Job, r: JobResult, out: Path) -> None:
    """The line on stderr as a run ends: reused, or its validation accuracy from start to end."""
    name, seed, run_dir = job.algo, job.seed, out / job.algo / f"seed{job.seed}"
    if r.status == "skipped":
        print(f"{name} seed {seed}: reusing the finished run in {run_dir}", file=sys.stderr)
    elif r.status in ("done", "resumed"):
        s = read_summary(run_dir / "summary.json")
        acc = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        print(
            f"{name} seed {seed}: val {acc(s['start_val_accuracy'])} -> {acc(s['final_val_accuracy'])} "
            f"in {s['updates']} updates, {s['wall_time_s']:.0f} s",
            file=sys.stderr,
        )


def error(job: Job, r: JobResult) -> str:
    """A run that did not finish: its status and the tail of its last attempt's log."""
    if r.status != "failed":
        return f"{job.algo} seed {job.seed} {r.status}" + (f": {r.error}" if r.error else "")
    log = Path(r.log).read_text(errors="replace") if r.log and Path(r.log).is_file() else ""
    last = log.rpartition("\n=== ")[2]  # the sweep starts each attempt's part of log.txt with "=== "
    return f"{job.algo} seed {job.seed} failed ({r.returncode}):\n{last[-3000:]}"


def read_rows(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir / "metrics.jsonl")


# --------------------------------------------------------------------------------------- the outputs


def _mean_range(s: dict, fmt: str) -> str:
    if s["mean"] is None:
        return "—"
    if s["n"] < 2 or s["min"] == s["max"]:
        return format(s["mean"], fmt)
    return f"{s['mean']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def _pass_at_k(f: dict) -> str:
    """``pass@k final`` cell: ``k=<k>: mean ± sd`` (``—`` when no evaluation sampled k > 1)."""
    if not f.get("k") or f["k"] < 2 or not f["final_pass_at_k"]["n"]:
        return "—"
    return f"k={f['k']}: {_mean_sd(f['final_pass_at_k'])}"


def _mean_sd(s: dict, fmt: str = ".3f") -> str:
    if s["mean"] is None:
        return "—"
    return format(s["mean"], fmt) + ("" if s["sd"] is None else f" ± {s['sd']:{fmt}}")


STAT_LABELS = {
    "acc_at_flops": "accuracy at equal FLOPs",
    "acc_at_seconds": "accuracy at equal wall-clock",
    "acc_at_tokens": "accuracy at equal generated tokens",
    "auc_seconds": "area under accuracy-vs-seconds",
    "seconds_to_target": "seconds below target",
    "tokens_to_target": "tokens below target",
    "flops_to_target": "FLOPs below target",
}


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "—" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _interval(lo: float, hi: float, fmt: str) -> str:
    return "—" if math.isnan(lo) or math.isnan(hi) else f"[{lo:{fmt}}, {hi:{fmt}}]"


def markdown(report: dict) -> str:
    """The table of methods (a row per method), the window and target lines, and the table of
    comparisons against the baseline: for every statistic the seeds, the per-seed spread, the point
    estimate, its paired bootstrap interval, the A/A null interval and the verdict."""
    t, w = report["target"], report["windows"]
    lines = [
        "| run | samples/prompt | seeds | start | final | final greedy | acc @ equal FLOPs | acc @ equal s | "
        "acc @ equal tokens | AUC (s) | s to target | tokens to target | reached | pass@k final | length | "
        "wall s | gen tokens | training FLOPs | peak RSS MiB | model-state MiB |",
        "|" + "---|" * 20,
    ]
    for name, f in report["methods"].items():
        lines.append(
            f"| {name} | {f['group_size']} | {len(f['seeds'])} | {_mean_sd(f['start_val_accuracy'])} | "
            f"{_mean_sd(f['final_val_accuracy'])} | {_mean_sd(f['final_greedy_accuracy'])} | "
            f"{_mean_sd(f['acc_at_flops'])} | {_mean_sd(f['acc_at_seconds'])} | "
            f"{_mean_sd(f['acc_at_tokens'])} | {_mean_sd(f['auc_seconds'])} | "
            f"{_mean_sd(f['seconds_to_target'], '.0f')} | {_mean_sd(f['tokens_to_target'], ',.0f')} | "
            f"{f['reached']['n']}/{f['reached']['of']} | {_pass_at_k(f)} | "
            f"{_mean_range(f['response_length'], '.1f')} | {_mean_range(f['seconds'], '.0f')} | "
            f"{_mean_range(f['tokens'], ',.0f')} | {_mean_range(f['flops'], '.2e')} | "
            f"{f['peak_rss_mib']:.0f} | {f['model_state_mib']:.1f} |"
        )
    lines += [
        "",
        f"Common window (every run covers it): 0-{w['seconds'][1]:.0f} training seconds, "
        f"0-{w['tokens'][1]:,.0f} generated tokens (from {w['seconds'][0]:.0f} s, {w['tokens'][0]:,.0f})"
        + (f", 0-{w['flops'][1]:.3g} training FLOPs." if "flops" in w else "."),
        (
            f"Target {t['value']:.3f}: "
            + (
                "given (--target)."
                if t["rule"] == "given"
                else f"start + {t['gain']:g} x (median of the pooled finals of every run - start)."
            )
        ),
    ]
    lines += [
        "",
        "| run | seed | start (greedy) | final (greedy) | acc @ equal FLOPs | first update at target | "
        f"cut: first -> last {CUT_UPDATES} updates | updates | generated tokens | training FLOPs |",
        "|" + "---|" * 10,
    ]
    for name, f in report["methods"].items():
        for k, r in f["per_seed"].items():
            lines.append(
                f"| {name} | {k} | {_num(r['start_val_accuracy'])} ({_num(r['start_greedy_accuracy'])}) | "
                f"{_num(r['final_val_accuracy'])} ({_num(r['final_greedy_accuracy'])}) | "
                f"{_num(r.get('acc_at_flops'))} | "
                f"{'never' if r['first_update_at_target'] is None else r['first_update_at_target']} | "
                f"{_pct(r['cut_first'])} -> {_pct(r['cut_last'])} | {r['updates']} | "
                f"{_num(r['tokens'], ',.0f')} | {_num(r['flops'], '.3g')} |"
            )
    with_formats = {n: f for n, f in report["methods"].items() if f["final_number_rate"]["n"]}
    if with_formats:
        lines += [
            "",
            "| run | bare-number rate start -> final | boxed rate start -> final |",
            "|---|---|---|",
        ]
        for name, f in with_formats.items():
            lines.append(
                f"| {name} | {_mean_sd(f['start_number_rate'])} -> {_mean_sd(f['final_number_rate'])} | "
                f"{_mean_sd(f['start_boxed_rate'])} -> {_mean_sd(f['final_boxed_rate'])} |"
            )
        lines.append(
            "Format (sampled validation responses, right or wrong): a bare number (what 'Answer with just "
            "the number.' asks for) or a closed \\boxed{} (sppo_rl.llm.rewards.answers.answer_format)."
        )
    if not report["pairs"]:
        why = (
            "it is the only method run"
            if set(report["methods"]) == {report["baseline"]}
            else "it is not among the runs (--baseline NAME)"
        )
        lines.append(f"No comparison against the baseline ({report['baseline']}): {why}.")
    else:
        lines += ["", *decision.table_lines(report["decision"], lambda n: STAT_LABELS.get(n, n))]
    lines.append(
        "Cells: mean ± sample sd over seeds. Each run is read as the straight lines between its raw "
        "evaluations: acc @ equal s (tokens) at the window's end, AUC the mean accuracy over the seconds "
        "window, s (tokens) to target the time spent below the target in the window (a run that never "
        "reaches it counts the whole window; reached: seeds whose curve reaches it). final: mean over the "
        f"last {TAIL_FRAC:.0%} of a run's evaluations (at least one). A vs B: over the seeds "
        "both have, a paired t-test (sppo_rl.experiments.decision); 'difference' when Holm's p < alpha, "
        "'equivalent within ±margin' when TOST shows it, else 'inconclusive' with the difference the "
        "seeds could have detected (80% power). The time below the target is secondary: biased by how "
        "often a run is evaluated when the curve rises fast (scripts/decision_sim.py). pass@k: a "
        "validation prompt solved by any of "
        "its k samples; length: mean response length in positions over the updates; final greedy: the "
        "same tail mean of the greedy accuracy; acc @ equal FLOPs: at the FLOPs window's end; training "
        "FLOPs: flops_total at the run's end (validation not counted). Per seed: start (greedy) the "
        "sampled and the greedy accuracy of the start's evaluation, final (greedy) likewise at the end; "
        "cut: the mean share of responses that hit the length limit."
    )
    return "\n".join(lines)


def plot_formats(report: dict, path: Path, title: str) -> bool:
    """The format-learning curves: mean bare-number and boxed rates of the sampled validation responses
    over seeds (straight lines between evaluations, min-max band) against training seconds, one colour
    per method; False (nothing written) when no run logged them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    drawn = False
    for i, (name, f) in enumerate(report["methods"].items()):
        color = method_colour(i, len(report["methods"]))
        for ax, key in zip(axes, FORMATS):
            runs = [
                protocol.Curve(
                    np.asarray(c["curve"]["seconds"], dtype=float),
                    np.asarray(c["curve"]["tokens"], dtype=float),
                    np.asarray(c["curve"]["updates"], dtype=float),
                    np.asarray(c["format_curve"][key], dtype=float),
                )
                for c in (f["per_seed"][k] for k in f["seeds"])
                if key in c["format_curve"]
            ]
            if not runs:
                continue
            x, y = protocol.on_grid(runs, "seconds", points=101)
            ax.plot(x, y.mean(axis=0), color=color, label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=color, alpha=0.15)
            drawn = True
    if not drawn:
        plt.close(fig)
        return False
    for ax, label in zip(axes, ("bare-number rate", "boxed rate")):
        ax.set_title(label)
        ax.set_xlabel("training wall-clock seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of sampled validation responses")
    axes[0].legend(loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot(report: dict, path: Path, title: str) -> None:
    """Mean raw validation accuracy over seeds with its min-max band, each method on a grid over the
    part of the axis all its seeds cover (straight lines between evaluations), against updates,
    generated tokens and seconds; the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16.5, 4), sharey=True)
    for i, (name, f) in enumerate(report["methods"].items()):
        curves = [f["per_seed"][k]["curve"] for k in f["seeds"]]
        runs = [
            protocol.Curve(
                *(np.asarray(c[key], dtype=float) for key in ("seconds", "tokens", "updates", "val_accuracy"))
            )
            for c in curves
            if c["val_accuracy"]
        ]
        if not runs:
            continue
        color = method_colour(i, len(report["methods"]))
        for ax, key in zip(axes, ("updates", "tokens", "seconds")):
            x, y = protocol.on_grid(runs, key, points=101)
            ax.plot(x, y.mean(axis=0), color=color, label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=color, alpha=0.15)
    target = report["target"]["value"]
    for ax, label in zip(
        axes, ("optimizer steps (updates)", "generated tokens", "training wall-clock seconds")
    ):
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    # thousands of tokens as "40k": six-digit tick labels run into each other
    axes[1].xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))
    axes[0].set_ylabel("validation accuracy (raw evaluations)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ the script


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise SystemExit(refuse(message))


def refuse(message: str) -> int:
    print(f"compare_llm: error: {message}", file=sys.stderr)
    return 2


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/compare_llm")
    ap.add_argument("--set", default="all", choices=SET_NAMES, help="the named run set (default: all)")
    ap.add_argument("--only", nargs="*", help="run only these names of the set")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help=f"seeds of every method (default: 0..{TINY_SEEDS - 1}; the real and precision sets 0..{REAL_SEEDS - 1})",
    )
    ap.add_argument(
        "--task", default="arithmetic", help="--task of every run (arithmetic, scratchpad, a file)"
    )
    ap.add_argument(
        "--updates", type=int, default=None, help="updates per run (default 150; with --seconds: a cap)"
    )
    ap.add_argument("--seconds", type=float, default=None, help="equal training wall-clock budget per run")
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--target", type=float, default=None, help="the accuracy to reach, fixed before the runs")
    ap.add_argument(
        "--target-gain",
        type=float,
        default=protocol.TARGET_GAIN,
        help="target = start + GAIN x (median pooled final - start) (default 0.5)",
    )
    ap.add_argument(
        "--baseline", default=None, help="the method every other is compared with (default sppo, if run)"
    )
    ap.add_argument(
        "--primary",
        default=None,
        choices=sorted(STAT_LABELS),
        help="the primary statistic, declared before the runs (default: accuracy at equal FLOPs where the "
        "runs log them, else at equal generated tokens)",
    )
    ap.add_argument(
        "--margin",
        type=float,
        default=None,
        help=f"equivalence margin of an accuracy difference, declared before the runs (default {decision.MARGIN})",
    )
    ap.add_argument("--workers", type=int, default=1, help="runs at a time (wall-clock: keep <= free cores)")
    ap.add_argument(
        "--llm-args",
        default="",
        help='more `sppo-rl llm` flags for every run, one string (e.g. "--model /path --max-new-tokens 8")',
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep a run whose folder already holds a finished run with the same settings instead of rerunning it",
    )
    args = ap.parse_args(argv)
    if args.updates is None:
        args.updates = 150 if args.seconds is None else 1_000_000
    seeds, design = set_design(args.set)
    args.seeds = list(range(seeds)) if args.seeds is None else args.seeds
    args.margin = design.margin if args.margin is None else args.margin
    return args


def problems(args: argparse.Namespace, names: list[str]) -> str | None:
    """The first thing wrong with the script's own settings, in one line; None if nothing is."""
    valid = [n for n, _ in run_sets()[args.set]]
    unknown = [n for n in args.only or [] if n not in valid]
    if unknown:
        return f"--only {' '.join(unknown)}: not in --set {args.set} ({', '.join(valid)})"
    if not names:
        return "no run selected"
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        return f"--seeds {' '.join(map(str, args.seeds))}: distinct integers >= 0"
    for flag, value, ok in (
        ("--updates", args.updates, args.updates >= 1),
        ("--seconds", args.seconds, args.seconds is None or args.seconds > 0),
        ("--prompts-per-step", args.prompts_per_step, args.prompts_per_step >= 1),
        ("--eval-every", args.eval_every, args.eval_every >= 1),
        ("--target-gain", args.target_gain, 0 < args.target_gain <= 1),
        ("--margin", args.margin, 0 < args.margin < 1),
        ("--workers", args.workers, args.workers >= 1),
        ("--target", args.target, args.target is None or 0 <= args.target <= 1),
    ):
        if not ok:
            return f"{flag} {value}: out of range"
    if args.baseline is not None and args.baseline not in names:
        return f"--baseline {args.baseline}: not among the runs ({', '.join(names)})"
    try:
        shlex.split(args.llm_args)
    except ValueError as e:
        return f"--llm-args: {e}"
    return None


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    runs = [(n, f) for n, f in run_sets()[args.set] if not args.only or n in args.only]
    names = [n for n, _ in runs]
    problem = problems(args, names)
    for name, flags in runs if problem is None else []:
        problem = flag_problem(name, llm_flags(flags, args, args.seeds[0], SMALL, resolve=False))
        if problem:
            break
    if problem:
        raise SystemExit(refuse(problem))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    small = str(small_critic(args.task)) if any(SMALL in f for _, f in runs) else SMALL
    errors = run_all(runs, args, small)
    if errors:
        print("\n\n".join(errors), file=sys.stderr)
        n = len(runs) * len(args.seeds)
        raise SystemExit(f"{len(errors)} of {n} runs failed; the finished ones are kept (--reuse)")

    rows = {name: {seed: read_rows(out / name / f"seed{seed}") for seed in args.seeds} for name in names}
    silent = [f"{n} seed {k}" for n in names for k in args.seeds if not evaluations(rows[n][k])]
    if silent:  # no validation: nothing to compare (e.g. --llm-args "--val-size 0")
        raise SystemExit(
            f"no validation accuracy logged by {', '.join(silent)}: nothing to compare (--val-size)"
        )
    design = decision.Design(primary=args.primary, margin=args.margin)
    report = compare(rows, args.target, args.target_gain, args.baseline or BASELINE, design)
    for name in names:
        report["methods"][name].update(run_facts([out / name / f"seed{seed}" for seed in args.seeds]))
    report["settings"] = {
        k: getattr(args, k)
        for k in (
            "set",
            "only",
            "seeds",
            "task",
            "updates",
            "seconds",
            "prompts_per_step",
            "eval_every",
            "target",
            "target_gain",
            "baseline",
            "primary",
            "margin",
        )
    } | {"llm_args": args.llm_args, "workers": args.workers}
    from sppo_rl.experiments.scaling import scaling_section

    by_method = {name: [rows[name][k] for k in args.seeds] for name in names}  # accuracy against FLOPs
    fit_lines, report["scaling"] = scaling_section(by_method, out / "compare_flops.png", reps=1000)
    md = markdown(report) + "\n" + "\n".join(fit_lines)
    print(md)
    (out / "compare.md").write_text(md + "\n")
    from sppo_rl.runtime.logging import json_safe

    (out / "compare.json").write_text(json.dumps(json_safe(report), indent=2) + "\n")
    model = "SmolLM2-135M-Instruct" if args.set == "real" else "tiny Qwen2"
    title = f"{model} on {args.task}, same start, seeds {args.seeds}"
    plot(report, out / "compare.png", title)
    plot_formats(report, out / "compare_format.png", f"answer format: {title}")


if __name__ == "__main__":
    main()
