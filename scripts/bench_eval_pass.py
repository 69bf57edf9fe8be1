"""Validation's generation on SmolLM2-135M-Instruct: the sampled mean@k rows and the greedy rows in one
batched pass (:meth:`~sppo_rl.llm.stages.collect.Sampler.sample_and_greedy` over
:meth:`~sppo_rl.llm.rollout.hf.HFRollout.generate_with_greedy`) against the two calls it replaces
(``Sampler.sample`` then ``Sampler.greedy``).

``--prompts`` arithmetic validation prompts (chat template, "Answer with just the number."), ``--k``
samples each at temperature 1 plus one greedy decode, ``--new-tokens`` at most. Each repetition times,
in this order, the two calls (A), the one pass (B) and the two calls again (A2): A against A2 is the
null (the same code twice, alternated), and its spread is how much of B / A is noise. Seconds are this
process's CPU seconds of each call (``time.process_time``: on a shared machine wall seconds count the
other processes' share too; with one torch thread CPU time is the work), wall seconds beside them;
every pass checks that B's tokens equal A's.

    OMP_NUM_THREADS=1 python scripts/bench_eval_pass.py --prompts 40 --k 4 --new-tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sppo_rl.llm.data.arithmetic import make_arithmetic
    from sppo_rl.llm.data.prompts import PromptFormat, render
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.sources import default_cache_dir
    from sppo_rl.llm.models.tiny import load_tokenizer
    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout
    from sppo_rl.llm.stages.collect import Sampler

    folder = pretrained.resolve(pretrained.parse_ref("smollm2-135m"), default_cache_dir())
    tok = load_tokenizer(folder)
    rollout = HFRollout(load_actor(folder, dtype=torch.float32), tok, add_special_tokens=False)
    _, val = make_arithmetic(0, 1, args.prompts)
    fmt = PromptFormat(instruction="Answer with just the number.")
    prompts = [render(e.prompt, tok, fmt) for e in val[: args.prompts]]
    positions = list(range(len(prompts)))
    sampler = Sampler(rollout, SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens), seed=0)

    def two_calls():
        return sampler.sample(prompts, args.k, -1, positions), sampler.greedy(prompts)

    def one_pass():
        return sampler.sample_and_greedy(prompts, args.k, -1, positions)

    print(
        f"SmolLM2-135M-Instruct, {len(prompts)} prompts x ({args.k} sampled + 1 greedy), <= {args.new_tokens} "
        f"new tokens, {args.threads} torch thread(s), 1-min load average {os.getloadavg()[0]:.1f}"
    )
    seconds: dict[str, list[float]] = {"A": [], "B": [], "A2": []}
    wall: dict[str, float] = {}
    for rep in range(args.repeats):
        results = {}
        for name, call in (("A", two_calls), ("B", one_pass), ("A2", two_calls)):
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = call()
            seconds[name].append(time.process_time() - c0)
            wall[name] = time.perf_counter() - t0
        for a, b in zip(results["A"], results["B"]):
            assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts, "the passes diverge"
        shown = ", ".join(f"{k} {v[-1]:.1f} s CPU ({wall[k]:.1f} s wall)" for k, v in seconds.items())
        print(f"repeat {rep}: {shown}; same tokens")
    med = {k: statistics.median(v) for k, v in seconds.items()}
    aa = [a2 / a for a, a2 in zip(seconds["A"], seconds["A2"])]
    ba = [b / ((a + a2) / 2) for a, b, a2 in zip(seconds["A"], seconds["B"], seconds["A2"])]
    print(
        f"median CPU seconds: two calls {med['A']:.1f} s / {med['A2']:.1f} s, one pass {med['B']:.1f} s; "
        f"one pass / two calls {statistics.median(ba):.2f} (range {min(ba):.2f}-{max(ba):.2f}); "
        f"A/A null A2/A {statistics.median(aa):.2f} (range {min(aa):.2f}-{max(aa):.2f})"
    )


if __name__ == "__main__":
    main()
