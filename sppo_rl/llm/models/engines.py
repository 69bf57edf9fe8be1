"""Training engines: one interface over plain torch and DeepSpeed ZeRO, plus the process group.

The trainer calls only these methods, so the same update code runs in one CPU process or in a
multi-GPU DeepSpeed job:

- ``engine.module``: what to call for a forward pass (the model, or DeepSpeed's wrapper of it);
- ``engine.boundary(last)`` before each micro-batch, ``engine.backward(loss)`` for each, then
  ``engine.step() -> grad_norm`` once per minibatch (clip, optimizer step, zero grads);
- ``engine.save(folder)`` / ``engine.load(folder)``: resumable state (weights and optimizer; with
  DeepSpeed every rank writes its own ZeRO shard, so all ranks call them);
- ``engine.full_state_items()``: ``(name, full tensor)`` pairs one at a time (ZeRO-3 gathers each
  parameter only while it is yielded), for pushing weights into a rollout engine and for exports;
- ``engine.save_pretrained(folder)``: a Hugging Face folder of the full model, written by rank 0;
- ``engine.sync_state_items()``: what a rollout copy of the model needs after an update.

With LoRA adapters in the module (:func:`sppo_rl.llm.models.lora.apply_lora`) the same methods hold only
what trains: checkpoints keep the trainable tensors (adapters, a critic's head) and their optimizer
state, the base weights coming back from the model folder on resume; ``full_state_items`` and
``save_pretrained`` give the merged weights under the base model's names (a plain HF folder);
``sync_state_items`` only the merged weights and biases of the wrapped modules.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from sppo_rl.agents.learner import TorchEngine as CoreTorchEngine
from sppo_rl.llm.models.lora import lora_layers, merged_state_items
from sppo_rl.runtime.checkpoint import torch_load, torch_save
from sppo_rl.runtime.files import follow_umask
from sppo_rl.runtime.launcher import launcher_env


@dataclass(frozen=True)
class Dist:
    """This process's place in the job (``world = 1`` without a launcher)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def all_sum(self, values: list[float], device: torch.device | str = "cpu") -> list[float]:
        """Elementwise sum of ``values`` over ranks (float64)."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def gather_lists(self, items: list[Any]) -> list[Any]:
        """The concatenation of every rank's ``items``, in rank order, on every rank."""
        if self.world == 1:
            return list(items)
        boxes: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(boxes, items)
        return [x for box in boxes for x in box]

    def all_max(self, values: list[float], device: torch.device | str = "cpu") -> list[float]:
        """Elementwise maximum of ``values`` over ranks."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t.tolist()

    def on(self, device: torch.device | str) -> Any:
        """A :class:`sppo_rl.agents.learner.Reducer` whose reductions run on ``device`` (nccl needs GPU tensors)."""
        from types import SimpleNamespace

        return SimpleNamespace(
            world=self.world,
            all_sum=lambda v: self.all_sum(v, device),
            all_max=lambda v: self.all_max(v, device),
        )

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def launcher_dist() -> Dist:
    """Rank and world size from the launcher's environment (torchrun / deepspeed set RANK, WORLD_SIZE),
    checked by :func:`launcher_env`."""
    env = launcher_env()
    return Dist(rank=env["RANK"], world=env["WORLD_SIZE"], local_rank=env["LOCAL_RANK"])


def init_process_group(timeout_s: float = 600.0, always: bool = False) -> Dist:
    """Join the job's process group (gloo on CPU, nccl on GPUs) when launched with several processes;
    with ``always`` a single process gets a group of one (DeepSpeed needs one even without a launcher).

    ``timeout_s`` bounds every collective: a rank that dies or hangs makes the others fail with an
    error after that long instead of waiting forever. The group is destroyed at interpreter exit,
    while Python is still whole: left to the interpreter's own teardown, gloo's worker threads
    outlive it and abort the process ("terminate called without an active exception", SIGABRT) on
    15 of 30 finished two-rank jobs here, 0 of 30 with the hook (``scripts/gloo_exit.py``). When
    something else still holds the group (ZeRO-3 does), the hook is not enough: see
    :func:`end_process`.
    """
    d = launcher_dist()
    if (d.world > 1 or always) and not torch.distributed.is_initialized():
        if d.world == 1:
            env = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
            }
            for key, value in env.items():
                os.environ.setdefault(key, value)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(d.local_rank)
        torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        atexit.register(leave_process_group)
    return d


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now (a group of one's rendezvous; a ``torchrun --master-port``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def leave_process_group() -> None:
    """Destroy the default process group if one is up (not a collective: each rank leaves alone)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def end_process(code: int) -> None:
    """In a process that joined a process group: flush stdout and stderr, leave the group and end with
    ``os._exit(code)``, skipping the interpreter's finalization. Returns when no group is up.

    Destroying the group at exit (the hook of :func:`init_process_group`) is not enough when something
    else still holds it: gloo has no shutdown, destroying only forgets the group, and DeepSpeed's ZeRO-3
    keeps it on every parameter, so its worker threads live into finalization, where one still
    releasing a finished collective's tensors takes the GIL and aborts the process ("terminate called
    without an active exception"): 8 of 30 finished two-rank jobs holding their group aborted with the
    hook, 0 of 30 ended by this function (``scripts/gloo_exit.py``). Everything a run owns
    (logs, checkpoints, the scorer's processes) is closed before the CLI calls this.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    leave_process_group()
    os._exit(code)


def load_pretrained_weights(module: nn.Module, folder: Path) -> None:
    """Load into ``module`` the weights its ``save_pretrained`` wrote to ``folder`` (``*.safetensors``,
    tied copies such as a tied LM head written once); ``RuntimeError`` naming a weight the files lack
    (not tied to one they hold) or one the module does not have."""
    from safetensors.torch import load_file

    weights: dict[str, Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(file))
    missing, unexpected = module.load_state_dict(weights, strict=False)
    own = module.state_dict()
    held = {own[k].data_ptr() for k in weights if k in own}
    untied = [k for k in missing if own[k].data_ptr() not in held]
    if untied or unexpected:
        raise RuntimeError(
            f"{folder}: its weights do not fit the model (missing {untied[:3]}, unexpected {unexpected[:3]})"
        )


class HFTorchEngine(CoreTorchEngine):
    """Plain PyTorch: AdamW over the module's trainable parameters, global-norm gradient clipping
    (:class:`sppo_rl.agents.learner.TorchEngine`), plus resumable state and exports."""

    def __init__(
        self,
        module: nn.Module,
        lr: float,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        **_: Any,
    ):
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))
        super().__init__(module, optimizer, max_grad_norm)
        self.lora = bool(lora_layers(module))

    def _trainable(self) -> dict[str, Tensor]:
        return {n: p.detach() for n, p in self.module.named_parameters() if p.requires_grad}

    def save(self, folder: Path, optimizer: bool = True) -> None:
        """``engine.pt``: unless ``optimizer`` is false the optimizer's state (AdamW: two tensors per
        weight), and the module's: with LoRA its trainable tensors only; a transformers model's weights
        (or a critic's, :meth:`~sppo_rl.llm.models.critic._ValueHeadModel.load_saved`) as its
        ``save_pretrained`` writes them (``model.safetensors`` and its ``config.json`` beside
        ``engine.pt``: the very bytes of the final export, which then links to them,
        :func:`~sppo_rl.runtime.checkpoint.link_identical`); else its whole state."""
        folder.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {"trainable_only": self.lora}
        if self.lora:
            state["module"] = self._trainable()
        elif isinstance(self.module, PreTrainedModel) or hasattr(self.module, "load_saved"):
            self.module.save_pretrained(folder)  # a critic: its backbone's folder and its head
            follow_umask(folder)  # safetensors' files are private (0600)
            state["weights"] = "save_pretrained"
        else:
            state["module"] = self.module.state_dict()
        if optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        torch_save(state, folder / "engine.pt")

    def load(self, folder: Path) -> None:
        state = torch_load(folder / "engine.pt")
        if state.get("trainable_only", False) != self.lora:
            raise RuntimeError(
                f"{folder}: written {'with' if state.get('trainable_only') else 'without'} LoRA, "
                f"loaded {'with' if self.lora else 'without'} it"
            )
        if self.lora:  # exactly the trainable tensors; the frozen base weights are the model folder's
            expected = set(self._trainable())
            if set(state["module"]) != expected:
                raise RuntimeError(
                    f"{folder}: its trainable tensors differ from the model's "
                    f"({sorted(set(state['module']) ^ expected)[:3]})"
                )
            self.module.load_state_dict(state["module"], strict=False)
        elif "module" in state:
            self.module.load_state_dict(state["module"])
        elif hasattr(self.module, "load_saved"):
            self.module.load_saved(folder)
        else:
            load_pretrained_weights(self.module, folder)
        if "optimizer" in state:  # absent: saved without it (--no-optimizer-state); fresh moments
            self.optimizer.load_state_dict(state["optimizer"])

    def full_state_items(self) -> Iterator[tuple[str, Tensor]]:
        if self.lora:
            yield from merged_state_items(self.module)
        else:
            yield from self.module.state_dict().items()

    def sync_state_items(self) -> Iterator[tuple[str, Tensor]]:
        """With LoRA the merged weights and biases of the wrapped modules only, else the full state."""
        if self.lora:
            yield from merged_state_items(self.module, only_adapted=True)
        else:
            yield from self.full_state_items()

    def save_pretrained(self, folder: str | Path, **kwargs: Any) -> None:
        if self.lora:
            kwargs["state_dict"] = dict(merged_state_items(self.module))
        self.module.save_pretrained(folder, **kwargs)


def deepspeed_config(
    zero_stage: int, max_grad_norm: float | None, offload: str, dtype: torch.dtype
) -> dict[str, Any]:
    """The DeepSpeed config this project uses: ZeRO ``zero_stage`` (2 or 3), clipping, optional CPU
    offload of optimizer states (``"optimizer"``) or of optimizer states and parameters (``"all"``,
    ZeRO-3 only), bf16 / fp16 mixed precision when the model's dtype asks for it."""
    if zero_stage not in (2, 3):
        raise ValueError(f"--zero-stage must be 2 or 3, got {zero_stage}")
    if offload not in ("none", "optimizer", "all"):
        raise ValueError(f"--offload must be none, optimizer or all, got {offload!r}")
    if offload == "all" and zero_stage != 3:
        raise ValueError("--offload all (parameters too) needs --zero-stage 3")
    zero: dict[str, Any] = {"stage": zero_stage}
    if offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if offload == "all":
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if max_grad_norm is not None:
        cfg["gradient_clipping"] = max_grad_norm
    return cfg


class DeepSpeedEngine:
    """DeepSpeed ZeRO-2/3 around a module (data parallel over the launcher's ranks).

    Gradients are averaged over ranks; the learner weighs each rank's loss so that the average equals
    the loss of the whole batch (:mod:`sppo_rl.agents.learner`). With optimizer offload DeepSpeed's CPU Adam is
    used (built on first use, into ``$TORCH_EXTENSIONS_DIR``); otherwise ``torch.optim.AdamW``.
    """

    def __init__(
        self,
        module: nn.Module,
        lr: float,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        *,
        zero_stage: int = 2,
        offload: str = "none",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        import deepspeed

        self.zero_stage = zero_stage
        self.lora = bool(lora_layers(module))
        params = [p for p in module.parameters() if p.requires_grad]
        if offload in ("optimizer", "all"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)
        else:
            optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        config = deepspeed_config(zero_stage, max_grad_norm, offload, dtype)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=config
        )
        self.module = self.engine

    @property
    def inner(self) -> nn.Module:
        return self.engine.module

    def boundary(self, last: bool) -> None:
        """Before each micro-batch: only the last one's backward reduces the gradients over ranks, and
        ``step`` then steps once per minibatch."""
        self.engine.set_gradient_accumulation_boundary(last)

    def backward(self, loss: Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> float:
        self.engine.step()
        gn = self.engine.get_global_grad_norm()
        return float(gn) if gn is not None else 0.0

    def save(self, folder: Path, optimizer: bool = True) -> None:
        """Every rank's ZeRO shard (with LoRA: the frozen base weights left out), optimizer states
        always (the trainer refuses --no-optimizer-state with DeepSpeed)."""
        self.engine.save_checkpoint(
            str(folder), tag="ds", save_latest=False, exclude_frozen_parameters=self.lora
        )

    def load(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder), tag="ds", load_module_strict=not self.lora)
        if path is None:
            raise RuntimeError(f"no DeepSpeed checkpoint in {folder}")

    def full_state_items(self) -> Iterator[tuple[str, Tensor]]:
        """Each parameter whole (gathered one at a time under ZeRO-3), then the persistent buffers
        (the names of ``state_dict()``; non-persistent ones such as rotary tables are rebuilt by the
        receiving model)."""
        inner = self.inner
        if self.lora:
            yield from merged_state_items(inner, self._gather)
            return
        persistent = set(inner.state_dict().keys())
        if self.zero_stage == 3:
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters

            for name, p in inner.named_parameters():
                with GatheredParameters([p], modifier_rank=None):
                    yield name, p.data
        else:
            yield from ((n, p.data) for n, p in inner.named_parameters())
        yield from ((n, b) for n, b in inner.named_buffers() if n in persistent)

    def _gather(self, params: list[nn.Parameter]) -> Any:
        """A context in which ``params`` are whole (ZeRO-3 gathers them on every rank)."""
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        return GatheredParameters(params, modifier_rank=None)

    def sync_state_items(self) -> Iterator[tuple[str, Tensor]]:
        """With LoRA the merged weights and biases of the wrapped modules only (ZeRO-3: gathered one
        module at a time, all ranks together), else :meth:`full_state_items`."""
        if self.lora:
            yield from merged_state_items(self.inner, self._gather, only_adapted=True)
        else:
            yield from self.full_state_items()

    def save_pretrained(self, folder: str | Path, **kwargs: Any) -> None:
        """Gather the full weights to CPU and write a Hugging Face folder on rank 0 (all ranks call this)."""
        state = {name: t.detach().to("cpu", copy=True) for name, t in self.full_state_items()}
        if torch.distributed.get_rank() == 0:
            self.inner.save_pretrained(folder, state_dict=state, **kwargs)


def make_engine(kind: str, module: nn.Module, lr: float, **kwargs: Any) -> HFTorchEngine | DeepSpeedEngine:
    if kind == "torch":
        return HFTorchEngine(
            module, lr, **{k: v for k, v in kwargs.items() if k in ("weight_decay", "max_grad_norm")}
        )
    if kind == "deepspeed":
        return DeepSpeedEngine(module, lr, **kwargs)
    raise ValueError(f"unknown engine {kind!r}; valid: torch, deepspeed")
