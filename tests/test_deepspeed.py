"""DeepSpeed ZeRO-2/3 with two CPU processes (gloo) trains exactly like one plain-torch process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import assert_rows_match, outside_a_launcher

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

from sppo_rl.llm.models.engines import free_port  # noqa: E402
from sppo_rl.runtime.logging import read_metrics  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COMPARED = (
    "reward_mean",
    "response_length",
    "policy_loss",
    "critic_bce",
    "grad_norm",
    "critic_grad_norm",
    "entropy",
    "val_accuracy",
    "v0_mean",
)


def _args(tiny: Path, out: Path) -> list[str]:
    return [
        "llm",
        "--algo",
        "sppo",
        "--task",
        "arithmetic",
        "--updates",
        "2",
        "--seed",
        "0",
        "--model",
        str(tiny),
        "--out-dir",
        str(out),
        "--prompts-per-step",
        "8",
        "--train-size",
        "64",
        "--val-size",
        "8",
        "--max-new-tokens",
        "8",
        "--minibatches",
        "1",
        "--epochs",
        "2",
        "--eval-every",
        "2",
        "--actor-lr",
        "1e-3",
        "--critic-lr",
        "1e-3",
        "--temperature",
        "2.0",
        "--no-progress",
        "--threads",
        "1",
        "--no-tensorboard",
        "--critic-init",  # torch-engine only: the one-process reference would start from another head
        "none",
        "--no-skip-equal-rewards",  # the untrained model may score all 0; the weights must move
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _two_ranks(tiny: Path, out: Path, *flags: str) -> None:
    """``sppo-rl`` with ``_args`` and then ``flags`` on two ranks under torchrun (a free port)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-port", str(free_port())]
    _run([*torchrun, "-m", "sppo_rl", *_args(tiny, out), *flags])


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    _run([sys.executable, "-m", "sppo_rl", *_args(tiny, out)])
    return out


@pytest.mark.parametrize(
    "stage,split",
    [
        (2, []),
        pytest.param(3, [], marks=pytest.mark.slow),  # ZeRO-3 also runs below, split by tokens
        pytest.param(2, ["--micro-batch-size", "3"], marks=pytest.mark.slow),  # ZeRO-3 splits by tokens below
        (3, ["--max-tokens-per-micro-batch", "40"]),
    ],
    ids=["zero2", "zero3", "zero2-micro3", "zero3-tokens40"],
)
def test_two_process_zero_matches_one_process(tiny, reference, tmp_path, stage, split):
    """Two ranks (each half the prompts), optionally in micro-batches with gradient accumulation
    (DeepSpeed's accumulation boundary at the last one), train like one unsplit process."""
    out = tmp_path / "ds"
    _two_ranks(tiny, out, "--engine", "deepspeed", "--zero-stage", str(stage), *split)
    a, b = read_metrics(reference / "metrics.jsonl"), read_metrics(out / "metrics.jsonl")
    assert [r["update"] for r in a] == [r["update"] for r in b] == [0, 1, 2]
    assert b[-1]["time_sync_s"] > 0, "the rollout replica is refreshed after every update"
    assert 0.0 < a[1]["reward_mean"] < 1.0 or a[2]["policy_loss"] != 0.0, "the run should learn something"
    assert_rows_match(a, b, COMPARED)
    wa = load_file(reference / "final" / "actor" / "model.safetensors")
    wb = load_file(out / "final" / "actor" / "model.safetensors")
    assert wa.keys() == wb.keys()
    diffs = {k: float((wa[k] - wb[k]).abs().max()) for k in wa}
    assert max(diffs.values()) < 1e-5, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    init = load_file(tiny / "model.safetensors")
    assert any(not torch.equal(init[k], wb[k]) for k in init), "training changed the weights"
    ca = load_file(reference / "final" / "critic" / "value_head.safetensors")
    cb = load_file(out / "final" / "critic" / "value_head.safetensors")
    assert all(torch.allclose(ca[k], cb[k], atol=1e-5) for k in ca)


@pytest.mark.slow
def test_two_ranks_each_with_a_rollout_worker_match_one_process_at_k1(tiny, tmp_path):
    """``--max-staleness 1`` under ZeRO-2: every rank has its own rollout worker process (its own
    replica, pushed after each update) and samples its half of the prompts one update ahead; the two
    ranks train like one process with its one worker."""
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "sppo_rl", *_args(tiny, one), "--updates", "3", "--max-staleness", "1"])
    _two_ranks(
        tiny, two, "--updates", "3", "--max-staleness", "1", "--engine", "deepspeed", "--zero-stage", "2"
    )
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r.get("staleness") for r in b if r["update"] > 0] == [0.0, 1.0, 1.0]
    assert_rows_match(a, b, COMPARED)


# ------------------------------------------------------------------------------------ LoRA

LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--kl-coef", "0.1", "--kl-in", "loss"]


@pytest.fixture(scope="module")
def lora_reference(tiny, tmp_path_factory) -> Path:
    pytest.importorskip("peft")
    out = tmp_path_factory.mktemp("lora-ref") / "run"
    _run([sys.executable, "-m", "sppo_rl", *_args(tiny, out), *LORA])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_two_process_zero_with_lora_matches_one_process(tiny, lora_reference, tmp_path, stage):
    """LoRA on actor and critic (KL in the loss against the adapters-off base): two ranks under ZeRO-2/3
    train like one plain-torch process. Only adapters (and the value head) train, so the merged export
    differs from the base in the adapted projections only; the HF rollout replica gets only those
    modules after each update and still samples what the trainer scores."""
    out = tmp_path / "ds"
    _two_ranks(tiny, out, *LORA, "--engine", "deepspeed", "--zero-stage", str(stage))
    a, b = read_metrics(lora_reference / "metrics.jsonl"), read_metrics(out / "metrics.jsonl")
    assert [r["update"] for r in a] == [r["update"] for r in b] == [0, 1, 2]
    assert a[1]["kl"] == 0.0 and a[2]["kl"] > 0.0, "the reference is the base: KL 0 until the adapters move"
    assert_rows_match(a, b, (*COMPARED, "kl"))
    for r in b[1:]:
        assert r["rollout_logp_diff"] < 1e-4, "the replica got every module that changed"
    wa = load_file(lora_reference / "final" / "actor" / "model.safetensors")
    wb = load_file(out / "final" / "actor" / "model.safetensors")
    init = load_file(tiny / "model.safetensors")
    assert wa.keys() == wb.keys() == init.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    changed = {k for k in init if not torch.equal(init[k], wb[k])}
    assert changed and all(k.split(".")[-2].endswith("_proj") for k in changed), changed
    ca = load_file(lora_reference / "final" / "critic" / "value_head.safetensors")
    cb = load_file(out / "final" / "critic" / "value_head.safetensors")
    assert all(torch.allclose(ca[k], cb[k], atol=1e-5) for k in ca)


_HARNESS = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('exit hooks ran', flush=True))\n"
    "sys.argv = ['sppo-rl', *sys.argv[1:]]\n"
    "from sppo_rl.cli import entry\n"
    "entry()\n"
)


def _entry(args: list[str]) -> subprocess.CompletedProcess:
    """``sppo-rl`` in a fresh process (a DeepSpeed run joins a group of one) with an exit hook that
    prints when the interpreter's normal exit runs."""
    env = outside_a_launcher(_env())
    return subprocess.run(
        [sys.executable, "-c", _HARNESS, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO,
    )


def test_a_rank_ends_past_the_interpreters_teardown_with_everything_written(tiny, tmp_path):
    """ZeRO-3 keeps the process group on every parameter, so destroying it at exit leaves gloo's threads
    alive into finalization, where they can abort a finished rank: a process that joined a group ends
    with ``os._exit`` (the exit hooks do not run), after the run's files and its output are written."""
    out = tmp_path / "run"
    done = _entry([*_args(tiny, out), "--engine", "deepspeed", "--zero-stage", "3"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exit hooks ran" not in done.stdout
    assert "[sppo-rl] done: sppo, seed 0" in done.stdout + done.stderr, "the last lines were flushed"
    assert json.loads((out / "summary.json").read_text())["updates"] == 2
    assert [r["update"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2]


def test_bad_input_in_a_rank_is_one_line_and_exit_2(tiny, tmp_path):
    """A mistake found once the group is joined (``--resume`` of a folder without a checkpoint: the run
    folder is looked at only then) still gets its one line and status 2 through the same way out, and no
    run folder is made; a mistake in the settings (a model folder that is not there) is refused before the
    group is joined (:func:`sppo_rl.llm.plan.resolve`)."""
    out = tmp_path / "run"
    done = _entry([*_args(tiny, out), "--engine", "deepspeed", "--resume"])
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("sppo-rl: error:")]
    assert len(errors) == 1 and "no checkpoint" in errors[0], done.stderr[-3000:]
    assert "exit hooks ran" not in done.stdout  # it had joined the group: ended by end_process
    assert not out.exists()
    args = _args(tiny, out)
    args[args.index("--model") + 1] = str(tmp_path / "no-such-model")
    done = _entry([*args, "--engine", "deepspeed"])
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("sppo-rl: error:")]
    assert len(errors) == 1 and "no-such-model" in errors[0], done.stderr[-3000:]
    assert not out.exists()
