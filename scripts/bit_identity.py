"""Fingerprints of short fixed-seed runs of every algorithm in both worlds, to show that a refactor changed
no number: ``python scripts/bit_identity.py --out before.json`` on the old code, ``--against before.json``
on the new one (exit 1 and the first differing run, update and key where they differ).

A run's fingerprint is two SHA-256 digests: of its ``metrics.jsonl`` rows without the keys that measure
time or memory (:data:`TIMING`), floats written with ``repr`` (exact), and of its final weights (every
tensor of ``final/`` in name order, its dtype, shape and bytes). Equal digests mean bit-identical numbers.
A row key renamed since (:data:`~sppo_rl.runtime.logging.OLD_ROW_KEYS`: the LLM world's ``step``, now
``update``) is digested under its name now, on both sides: the stored rows (``kept``) of a fingerprint
file written before the rename are digested again.
The LLM runs use the embedded tiny model (built and warm-started once into the cache), 3 updates of 4
prompts; the control runs 3 updates of ``ShortCartPole``. Each run is one process (``sppo-rl ...``), as a
user runs it, with one torch thread. ``--ignore KEY ...`` leaves more keys out of the rows' digest (the
same list on both sides): for a change that is meant to move a diagnostic alone, e.g. the sampler's own
log-probs (``rollout_logp_diff``, ``rollout_mismatch_mean``) when only the rollout's arithmetic changes
and its tokens, the trained weights and every other number must stay bit-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sppo_rl.runtime.logging import OLD_ROW_KEYS  # noqa: E402
from sppo_rl.runtime.logging import TIMING_KEYS as TIMING  # noqa: E402
from sppo_rl.runtime.run import renamed  # noqa: E402

LLM_COMMON = [
    "--updates", "3", "--prompts-per-step", "4", "--eval-every", "3", "--val-size", "8", "--eval-samples", "2",
    "--checkpoint-every", "100", "--no-progress", "--no-tensorboard", "--seed", "3",
]  # fmt: skip
LLM_RUNS: dict[str, list[str]] = {
    "sppo": ["--algo", "sppo"],
    "sppo-seq": ["--algo", "sppo-seq"],
    "ppo": ["--algo", "ppo", "--whiten", "--value-clip", "0.5"],
    "ppo-epochs": ["--algo", "ppo", "--epochs", "2", "--minibatches", "4", "--micro-batch-size", "3"],
    "grpo": ["--algo", "grpo", "--group-size", "4"],
    "drgrpo": ["--algo", "drgrpo", "--group-size", "4"],
    "rloo": ["--algo", "rloo", "--group-size", "4"],
    "remax": ["--algo", "remax"],
    "gspo": ["--algo", "gspo", "--group-size", "4"],
    "gspo-token": ["--algo", "gspo", "--group-size", "4", "--ratio-level", "sequence-token"],
    "cispo": ["--algo", "cispo", "--group-size", "4"],
    "bppo": ["--algo", "bppo", "--group-size", "4"],
    "lampo": ["--algo", "lampo", "--group-size", "4"],
    "reinforce++": ["--algo", "reinforce++"],
    "reinforce++-baseline": ["--algo", "reinforce++-baseline", "--group-size", "4"],
    "dapo": [
        "--algo",
        "grpo",
        "--group-size",
        "4",
        "--clip-high",
        "0.28",
        "--overlong-filter",
        "--overlong-buffer",
        "4",
        "--dynamic-sampling-rounds",
        "2",
    ],  # fmt: skip
    "grpo-tis-kl": ["--algo", "grpo", "--group-size", "4", "--tis-cap", "2", "--kl-coef", "0.05"],
    "sppo-lora-kl": ["--algo", "sppo", "--lora-rank", "4", "--kl-coef", "0.05", "--kl-in", "reward"],
    "sppo-critic-init": ["--algo", "sppo", "--critic-init", "first-batch", "--lr-schedule", "cosine"],
    "grpo-sampling": [
        "--algo",
        "grpo",
        "--group-size",
        "4",
        "--top-k",
        "8",
        "--min-p",
        "0.05",
        "--repetition-penalty",
        "1.2",
        "--top-p",
        "0.9",
        "--temperature",
        "0.8",
    ],  # fmt: skip
    "reinforce": ["--algo", "reinforce"],
    "opo": ["--algo", "opo", "--group-size", "4"],
    "opo-batch": ["--algo", "opo-batch"],
    "spo": ["--algo", "spo"],
    "shrinkage": ["--algo", "shrinkage", "--group-size", "4"],
    "ppo-bce": ["--algo", "ppo-bce"],
    # two processes under DeepSpeed ZeRO-2 and -3 (the launcher prefix is added by ``run``)
    "ds-zero2": ["--algo", "sppo", "--engine", "deepspeed", "--zero-stage", "2"],
    "ds-zero3": ["--algo", "grpo", "--group-size", "4", "--engine", "deepspeed", "--zero-stage", "3"],
    # 2 updates, then resumed to 3 in a second process
    "sppo-resume": ["--algo", "sppo"],
    "spo-resume": ["--algo", "spo"],
    **{
        name: ["--algo", name, "--group-size", "4", "--model", "{actor}", "--latent-steps", "2"]
        for name in ("latent-grpo", "latent-grpo-naive")
    },
}
CONTROL_COMMON = ["--task", "short-cartpole", "--total-episodes", "96", "--no-progress", "--no-tensorboard",
                  "--seed", "2", "--init-from", "none"]  # fmt: skip
CONTROL_RUNS: dict[str, list[str]] = {
    name: ["--algo", name]
    for name in (
        "sppo",
        "ppo",
        "grpo",
        "rloo",
        "remax",
        "bppo",
        "lampo",
        "gspo",
        "spo",
        "opo-batch",
        "reinforce",
    )
}
CONTROL_RUNS["sppo-resume"] = ["--algo", "sppo"]
CONTROL_RUNS["spo-contexts"] = ["--algo", "spo", "--spo-contexts", "128"]


def _float(x: object) -> object:
    return repr(x) if isinstance(x, float) else x


def rows_digest(path: Path, ignore: frozenset[str] = frozenset()) -> tuple[str, list[dict]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    left_out = set(TIMING) | ignore
    kept = [{k: _float(v) for k, v in sorted(r.items()) if k not in left_out} for r in rows]
    return kept_digest(kept)


def kept_digest(kept: list[dict]) -> tuple[str, list[dict]]:
    """The digest of kept rows, each key under its name now (:data:`OLD_ROW_KEYS`: a fingerprint file
    written before a rename compares equal when only the names changed), and those rows."""
    kept = [dict(sorted(renamed(r, OLD_ROW_KEYS).items())) for r in kept]
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest(), kept


def weights_digest(folder: Path) -> str:
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    files = sorted(folder.rglob("*.safetensors")) + sorted(folder.rglob("*.pt"))
    for f in files:
        state = load_file(f) if f.suffix == ".safetensors" else torch.load(f, weights_only=False)
        if not isinstance(state, dict):
            continue
        flat = _tensors(state, "")
        for name in sorted(flat):
            t = flat[name].detach().cpu().contiguous()
            h.update(f"{f.relative_to(folder)}:{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _tensors(obj: object, prefix: str) -> dict:
    import torch

    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out: dict = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: str, args: list[str], out: Path, ignore: frozenset[str] = frozenset(), name: str = "") -> dict:
    """One run as a user starts it; ``ds-*`` under a two-process launcher; ``*-resume`` stopped after
    one update less and resumed by a second process."""
    prefix = [sys.executable]
    if name.startswith("ds-"):
        prefix += ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port())]
    cmd = [*prefix, "-m", "sppo_rl", world, *args, "--out-dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    steps = []
    if name.endswith("-resume"):
        if world == "llm":
            steps = [["--updates", "2"], ["--updates", "3", "--resume"]]
        else:
            steps = [["--total-episodes", "64"], ["--total-episodes", "96", "--resume"]]
    for extra in steps or [[]]:
        p = subprocess.run([*cmd, *extra], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            return {"error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]!s}"}
    rows, kept = rows_digest(out / "metrics.jsonl", ignore)
    final = out / "final"
    if not final.is_dir():  # the control world's final policy is one file
        final = Path(tempfile.mkdtemp())
        (final / "final.pt").symlink_to(out / "final.pt")
    weights = weights_digest(final)
    return {
        "rows": rows,
        "weights": weights,
        "n_rows": len(kept),
        "last": kept[-1] if kept else {},
        "kept": kept,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the fingerprints here (JSON)")
    ap.add_argument("--against", type=Path, help="compare with fingerprints written before")
    ap.add_argument("--only", nargs="*", help="run names to run (default: all)")
    ap.add_argument(
        "--ignore",
        nargs="*",
        default=[],
        help="metrics keys left out of the rows' digest besides the timing ones (give the same list to "
        "--out and --against; recorded in the file)",
    )
    a = ap.parse_args(argv)
    ignore = frozenset(a.ignore)
    before = json.loads(a.against.read_text()) if a.against else None
    if before is not None and sorted(before.pop("_ignore", [])) != sorted(ignore):
        ap.error(f"{a.against} was written with another --ignore list")
    for b in (before or {}).values():  # its rows' keys under their names now, as this run's are
        if "kept" in b:
            b["rows"], b["kept"] = kept_digest(b["kept"])
            b["last"] = b["kept"][-1] if b["kept"] else {}
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        actor = None
        for world, runs, common in (("llm", LLM_RUNS, LLM_COMMON), ("control", CONTROL_RUNS, CONTROL_COMMON)):
            for name, flags in runs.items():
                key = f"{world}/{name}"
                if a.only and name not in a.only and key not in a.only:
                    continue
                if "{actor}" in flags:
                    if actor is None:  # the embedded tiny model's folder, as the first LLM run resolved it
                        actor = _embedded_actor(base)
                    flags = [actor if f == "{actor}" else f for f in flags]
                r = run(world, [*common, *flags], base / key, ignore, name)
                result[key] = r
                same = ""
                if before is not None and key in before:
                    b = before[key]
                    same = (
                        "same"
                        if (b.get("rows"), b.get("weights")) == (r.get("rows"), r.get("weights"))
                        else "DIFFERENT"
                    )
                print(
                    f"{key:32s} {r.get('rows', r.get('error'))[:16]} {r.get('weights', '')[:16]} {same}",
                    flush=True,
                )
    if a.out:
        a.out.write_text(json.dumps({**result, "_ignore": sorted(ignore)}, indent=1, sort_keys=True) + "\n")
    if before is None:
        return 0
    bad = [
        k
        for k in result
        if k in before
        and (before[k].get("rows"), before[k].get("weights"))
        != (result[k].get("rows"), result[k].get("weights"))
    ]
    for k in bad:
        b, r = before[k].get("last", {}), result[k].get("last", {})
        diff = sorted(x for x in set(b) | set(r) if b.get(x) != r.get(x))
        print(f"{k}: differs; last row keys that differ: {diff[:8]}")
    print(f"{len(result) - len(bad)} of {len(result)} runs bit-identical")
    return 1 if bad else 0


def _embedded_actor(base: Path) -> str:
    from sppo_rl.llm.models.sources import default_cache_dir

    config = (
        json.loads((base / "llm/sppo" / "config.json").read_text()) if (base / "llm/sppo").is_dir() else {}
    )
    actor = config.get("resolved", {}).get("actor")
    if actor:
        return actor
    tiny = sorted(default_cache_dir().glob("tiny-*"))
    return str(tiny[0] / "model") if tiny else "none"


if __name__ == "__main__":
    raise SystemExit(main())
