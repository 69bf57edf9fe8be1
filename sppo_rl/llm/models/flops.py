"""Compute (FLOPs) of a causal LM, counted analytically from its config, and an update's FLOPs by part.

A multiply-add is 2 FLOPs. With ``L`` layers of width ``h``, ``H`` query heads of size ``d`` (attention
width ``A = H d``), ``K`` key/value heads, MLP width ``I`` and vocabulary ``V``, the matmul weights of
the layers (the non-embedding parameters without norms and biases) are::

    N = L (h A + 2 h K d + A h + m h I)        m = 3 for a gated MLP (Llama, Qwen2), 2 for a plain one

A forward over ``n`` tokens of one sequence, no cache, with ``k`` positions through the LM head
(``V h``; tied or not, it is a matmul) and ``j`` through a critic's value head (``h``)::

    F(n, k, j) = 2 N n + 4 L A n^2 + 2 V h k + 2 h j

where ``4 L A n^2`` is attention's ``Q K^T`` and ``softmax(.) V``, counted over the full ``n x n``
product as the SDPA and eager kernels compute it (a causal kernel that skips the masked half does about
half of it). A KV-cached decode step for a token that attends over ``c`` keys (itself included)::

    D(c) = 2 N + 4 L A c + 2 V h

Backward costs twice the forward (a matmul's input and weight gradients), so a training pass is
``3 F``; under LoRA the frozen weights get no weight gradient, ``2 F`` (the adapters' own matmuls, about
``3 r / h`` of the layers' at rank ``r``, are left out); gradient checkpointing adds the layers' forward
``F(n, 0, 0)`` again (the heads are not recomputed; an upper bound, as torch's non-reentrant checkpoint
stops recomputing once the backward has what it needs). Embedding look-ups, norms, activations, softmax, rotary embeddings and the loss are elementwise
and left out, as :class:`torch.utils.flop_counter.FlopCounterMode` leaves them out.

What an update spends (:func:`update_flops`), per row with its own prompt length ``p`` and response
length ``r`` (padding is not counted: the model's FLOPs, not a kernel's)::

    rollout    per prompt F(p, 1, 0) (the prefill, shared by its samples), per sample
               sum_{i=1}^{r-1} D(p + i)  (the first token comes from the prefill), every round of
               dynamic sampling (DAPO) counted
    greedy     the same for ReMax's greedy rollout (one sample per prompt)
    actor      F(p + r, r + 1, 0) for the old log-probs (unless the update is fused) and
               epochs x 3 F(p + r, r + 1, 0) when the actor trains (the LM head reads the last r + 1
               positions, as ``logits_to_keep`` does)
    reference  F(p + r, r + 1, 0) when a KL reference runs
    critic     at its own size: a sequence critic (SPPO) reads the prompt only, F(p, 0, 1); a per-token
               critic (PPO, ``step``) F(p + r, 0, r); once for the values, then epochs x 3 F
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PARTS = ("rollout", "greedy", "actor", "reference", "critic")
"""The parts of an update's FLOPs, in the order the metrics rows list them (``flops_<part>``)."""

_PLAIN_MLP = frozenset(
    {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "gpt_bigcode", "codegen"}
)
_KEYS = {
    "vocab": ("vocab_size",),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
}


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder that its FLOPs depend on (see the module docstring)."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    intermediate: int
    vocab: int
    gated: bool = True

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From a ``transformers`` config or a ``config.json`` dict (a nested ``text_config`` read
        first); ``ValueError`` naming a missing size."""
        c = config if isinstance(config, dict) else config.to_dict()
        c = c["text_config"] if isinstance(c.get("text_config"), dict) else c
        got: dict[str, int] = {}
        for name, keys in _KEYS.items():
            key = next((k for k in keys if c.get(k) is not None), None)
            if key is None:
                raise ValueError(f"model config: no {' / '.join(keys)}")
            got[name] = int(c[key])
        h, H = got["hidden"], got["heads"]
        d = int(c.get("head_dim") or h // H)
        inter = next((c[k] for k in ("intermediate_size", "n_inner", "ffn_dim") if c.get(k)), 4 * h)
        kv = int(c.get("num_key_value_heads") or H)
        return cls(
            got["layers"], h, H, d, kv, int(inter), got["vocab"], c.get("model_type") not in _PLAIN_MLP
        )

    @property
    def body(self) -> int:
        """``N``: the layers' matmul weights."""
        h, A, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * (h * A + 2 * h * kv + A * h + (3 if self.gated else 2) * h * self.intermediate)

    @property
    def attn(self) -> int:
        """``L A``: the attention width summed over layers."""
        return self.layers * self.heads * self.head_dim


def forward(s: Shape, n: int, logits: int = 0, values: int = 0) -> int:
    """``F(n, logits, values)``: one forward over ``n`` tokens without a cache."""
    return 2 * s.body * n + 4 * s.attn * n * n + 2 * s.vocab * s.hidden * logits + 2 * s.hidden * values


def decode(s: Shape, context: int) -> int:
    """``D(context)``: one KV-cached step of one token attending over ``context`` keys."""
    return 2 * s.body + 4 * s.attn * context + 2 * s.vocab * s.hidden


def decode_tail(s: Shape, p: int, r: int) -> int:
    """``sum_{i=1}^{r-1} D(p + i)``: the decode steps after the prefill of a response of ``r`` tokens."""
    k = max(r - 1, 0)
    return k * (2 * s.body + 2 * s.vocab * s.hidden) + 4 * s.attn * (k * p + k * (k + 1) // 2)


def rollout(s: Shape, prompts: Sequence[int], responses: Sequence[int], n: int) -> int:
    """Sampling ``n`` responses per prompt (rows ``n j .. n j + n - 1`` belong to prompt ``j``): one
    prefill per prompt, then each row's decode steps."""
    if len(responses) != n * len(prompts):
        raise ValueError(f"{len(responses)} responses for {len(prompts)} prompts x {n}")
    total = sum(forward(s, p, logits=1) for p in prompts)
    return total + sum(decode_tail(s, prompts[i // n], r) for i, r in enumerate(responses))


def policy_pass(s: Shape, rows: Iterable[tuple[int, int]], head: bool = True) -> int:
    """One forward of a policy over ``(p, r)`` rows, log-probs of the last ``r + 1`` positions (``head``
    False: the layers alone, what gradient checkpointing runs again)."""
    return sum(forward(s, p + r, logits=(r + 1) * head) for p, r in rows)


def critic_pass(s: Shape, rows: Iterable[tuple[int, int]], kind: str, head: bool = True) -> int:
    """One forward of a critic (backbone and value head) over ``(p, r)`` rows: ``"sequence"`` reads the
    prompt only, its head at the last prompt position; ``"step"`` every response position (``head``
    False: the backbone alone)."""
    if kind == "sequence":
        return sum(forward(s, p, values=int(head)) for p, _ in rows)
    if kind != "step":
        raise ValueError(f"critic kind must be 'sequence' or 'step', got {kind!r}")
    return sum(forward(s, p + r, values=r * head) for p, r in rows)


@dataclass(frozen=True)
class UpdateShape:
    """What an update's FLOPs depend on besides its lengths: the actor's and critic's shapes, the
    critic's kind (None: no critic), whether a reference runs, the epochs, whether the old log-probs
    come from a pass of their own (not fused), the training pass's cost in forwards (3: forward and
    backward; 2 under LoRA) and whether gradient checkpointing runs the layers' forward again in the
    backward (not the LM or value head)."""

    actor: Shape
    critic: Shape | None = None
    critic_kind: str | None = None
    reference: bool = False
    epochs: int = 1
    old_logp_pass: bool = True
    train_passes: int = 3
    recompute: bool = False


def update_flops(
    u: UpdateShape,
    rounds: Sequence[tuple[Sequence[int], Sequence[int], int, Sequence[int] | None]],
    trained: Sequence[tuple[int, int]],
    actor_trained: bool,
) -> dict[str, int]:
    """An update's FLOPs by part (:data:`PARTS`; see the module docstring). ``rounds``: each generation
    round's ``(prompt lengths, response lengths, samples per prompt, greedy response lengths or None)``;
    ``trained``: the ``(p, r)`` of every row the update trained on; ``actor_trained``: the actor's
    training passes ran (not skipped)."""
    out = dict.fromkeys(PARTS, 0)
    for prompts, responses, n, greedy in rounds:
        out["rollout"] += rollout(u.actor, prompts, responses, n)
        if greedy is not None:
            out["greedy"] += rollout(u.actor, prompts, greedy, 1)
    one = policy_pass(u.actor, trained)
    train = u.train_passes * one + (policy_pass(u.actor, trained, head=False) if u.recompute else 0)
    out["actor"] = one * int(u.old_logp_pass) + (u.epochs * train if actor_trained else 0)
    out["reference"] = one if u.reference else 0
    if u.critic is not None and u.critic_kind is not None:
        c = critic_pass(u.critic, trained, u.critic_kind)
        again = critic_pass(u.critic, trained, u.critic_kind, head=False) if u.recompute else 0
        out["critic"] = c + u.epochs * (u.train_passes * c + again)
    return out


# ------------------------------------------------------------------------------------- a run's counter


def _model(engine: Any) -> Any:
    """The model a training engine wraps: under DeepSpeed ``engine.module`` is DeepSpeed's own engine
    (whose ``config`` is DeepSpeed's), the model its ``inner``."""
    return getattr(engine, "inner", engine.module)


def run_shape(plan: Any, models: Any) -> UpdateShape:
    """The :class:`UpdateShape` of an LLM run (:class:`~sppo_rl.llm.build.Models` built by its
    :class:`~sppo_rl.llm.plan.Plan`). A training pass is 3 forwards; 2 under LoRA (the frozen weights
    get no weight gradient; the adapters' own matmuls are left out), plus the layers' forward again with
    gradient checkpointing."""
    settings, kind = plan.models, plan.algo.requires.critic
    critic = _model(models.critic_engine) if models.critic_engine is not None else None
    return UpdateShape(
        actor=Shape.of(_model(models.actor_engine).config),
        critic=Shape.of(critic.config) if critic is not None else None,
        critic_kind=kind if critic is not None else None,
        reference=models.ref is not None,
        epochs=plan.learner.epochs,
        old_logp_pass=not plan.update.fused,
        train_passes=2 if settings.lora.rank else 3,
        recompute=settings.gradient_checkpointing,
    )


def row_lengths(rb: Any) -> list[tuple[int, int]]:
    """``(prompt tokens, response tokens)`` of every row of a rollout batch (padding not counted)."""
    return list(zip(rb.prompt_mask.sum(-1).tolist(), rb.response_mask.sum(-1).tolist()))


def round_lengths(rb: Any, n: int, greedy: Any = None) -> tuple[list[int], list[int], int, list[int] | None]:
    """A generation round as :func:`update_flops` reads it: ``rb`` holds ``n`` adjacent samples per
    prompt; ``greedy`` the greedy rollout of the same prompts (or None)."""
    rows = row_lengths(rb)
    return (
        [p for p, _ in rows[::n]],
        [r for _, r in rows],
        n,
        [r for _, r in row_lengths(greedy)] if greedy is not None else None,
    )
