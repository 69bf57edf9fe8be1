"""The run config both worlds share: one dataclass holding the fields that ``sppo-rl control`` and
``sppo-rl llm`` both have, with the same meaning and default (import-light: no torch).

Each world's config (:class:`~sppo_rl.control.config.ControlConfig`,
:class:`~sppo_rl.llm.config.LLMConfig`) extends it with its own fields and with the settings whose
defaults differ between the worlds (learning rates, epochs, minibatches, lambda, clipping norm, ...).

Every setting's type and range is checked in one place, :meth:`RunConfig.validate` (the trainers and the
CLI call it before any work): each class lists its fields' ranges in ``checks()``, chaining to its
parent's, and a value out of range is refused in one line naming the flag and what it may be.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints


class ConfigError(ValueError):
    """A setting out of its type or range; the message names every such flag and what it may be."""


AggName = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
"""The loss aggregations ``--agg`` offers (:data:`sppo_rl.agents.losses.AGG_MODES`)."""

Check = tuple[str, Callable[[Any], bool], str]
"""One line of a config's range table: the field, a predicate its value must meet, the allowed range
in words (``"> 0"``, ``"in [0, 1]"``, ...)."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def gt(lo: float) -> Callable[[Any], bool]:
    """A finite number ``> lo``."""
    return lambda v: _number(v) and v > lo


def ge(lo: float) -> Callable[[Any], bool]:
    """A finite number ``>= lo``."""
    return lambda v: _number(v) and v >= lo


def within(lo: float, hi: float, *, open_lo: bool = False) -> Callable[[Any], bool]:
    """A number in ``[lo, hi]`` (``(lo, hi]`` with ``open_lo``)."""
    return lambda v: _number(v) and (v > lo if open_lo else v >= lo) and v <= hi


def _name(v: Any) -> bool:
    """A string that is not blank."""
    return isinstance(v, str) and v.strip() != ""


def _tags(v: Any) -> bool:
    """wandb tags: non-blank strings of at most 64 characters."""
    return all(_name(t) and len(t) <= 64 for t in v)


def optional(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """None, or a value ``ok`` accepts."""
    return lambda v: v is None or ok(v)


def flag(name: str) -> str:
    """The command-line flag of a field: ``checkpoint_every`` -> ``--checkpoint-every``."""
    return "--" + name.replace("_", "-")


MAX_COUNT = 10**9
"""The largest integer setting (steps, sizes, episodes, tokens, ...): a larger one is a typo, never a
budget a run could spend (a billion updates, a billion-token response)."""
UNBOUNDED_INTS = ("seed", "data_seed", "bootstrap_seed")
"""Integer settings that are names rather than counts (not bounded by :data:`MAX_COUNT`)."""
MAX_SEED = 2**48 - 1
"""The largest ``--seed``: every seed the run derives from it (``seed * 7919 + update`` of the minibatch
order, ``seed + k``) stays within the 64 bits a torch generator takes (``torch.manual_seed(2**70)`` fails
with "Overflow when unpacking long long", a message that names no setting)."""
THREADS_PER_CPU = 4
"""``--threads`` may be at most this many times the machine's CPUs (:func:`max_threads`)."""


def max_threads() -> int:
    """The most ``--threads`` a run may ask for: :data:`THREADS_PER_CPU` x ``os.cpu_count()`` (more
    threads than that only contend for the same cores; with ``--threads 5000`` a one-update LLM run had
    not finished after 60 s on 2 cores)."""
    import os

    return THREADS_PER_CPU * (os.cpu_count() or 1)


def _too_big(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_COUNT


def _type_ok(tp: Any, v: Any) -> bool:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return v is None
    if origin in (Union, types.UnionType):
        return any(_type_ok(a, v) for a in args)
    if origin is Literal:
        return any(v == a and type(v) is type(a) for a in args)
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is str:
        return isinstance(v, str)
    if origin is tuple:
        if not isinstance(v, (tuple, list)):  # a list from JSON or Python code is as good as a tuple
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_type_ok(args[0], x) for x in v)
        return len(v) == len(args) and all(_type_ok(a, x) for a, x in zip(args, v))
    if origin is dict:
        return isinstance(v, dict) and all(
            _type_ok(args[0], k) and _type_ok(args[1], x) for k, x in v.items()
        )
    return True  # a type this table does not know: not checked


def _type_words(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_words(a) for a in args)
    if tp is type(None):
        return "None (null)"
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple:
        return f"a list of {_type_words(args[0]).removeprefix('an ').removeprefix('a ')}s"
    if origin is dict:
        return "an object of strings"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


@dataclass
class Section:
    """A family of settings that share a flag prefix, held by a config as one field: field ``rank`` of
    the section a config holds as ``lora`` is ``cfg.lora.rank`` in Python, the flag ``--lora-rank`` and
    the key ``lora_rank`` of ``config.json`` and of recipes (its *flat key*, :func:`flat_keys`); a field's
    ``metadata["key"]`` names another (wandb's ``enabled`` is ``--wandb``). ``config.json`` stays flat,
    one key per flag, so files written before the sections existed read the same."""


def _section_type(f: Any) -> type | None:
    kind = f.default_factory
    return kind if isinstance(kind, type) and issubclass(kind, Section) else None


def flat_keys(cls: Any) -> dict[str, tuple[str, str | None]]:
    """Every flat key of the config class (or instance) ``cls``, in field order, each as
    ``(field, section field or None)``."""
    cls = cls if isinstance(cls, type) else type(cls)
    out: dict[str, tuple[str, str | None]] = {}
    for f in fields(cls):
        section = _section_type(f)
        if section is None:
            out[f.name] = (f.name, None)
        else:
            for g in fields(section):
                out[g.metadata.get("key", f"{f.name}_{g.name}")] = (f.name, g.name)
    return out


def key_type(cls: Any, key: str) -> Any:
    """The type hint of flat key ``key`` of the config class ``cls``."""
    cls = cls if isinstance(cls, type) else type(cls)
    top, inner = flat_keys(cls)[key]
    hints = get_type_hints(cls)
    return hints[top] if inner is None else get_type_hints(_section_type(_field(cls, top)))[inner]


def _field(cls: type, name: str) -> Any:
    return next(f for f in fields(cls) if f.name == name)


def get_flat(cfg: Any, key: str) -> Any:
    """The value of flat key ``key`` (``"lora_rank"`` -> ``cfg.lora.rank``)."""
    top, inner = flat_keys(cfg)[key]
    value = getattr(cfg, top)
    return value if inner is None else getattr(value, inner)


def flat_dict(cfg: Any) -> dict[str, Any]:
    """``{flat key: value}`` of a config, sections expanded in place (values deep-copied)."""
    return {key: copy.deepcopy(get_flat(cfg, key)) for key in flat_keys(cfg)}


def unknown_keys(cls: Any, keys: Any) -> list[str]:
    """The keys of ``keys`` that are no flat key of ``cls``, sorted."""
    return sorted(set(keys) - set(flat_keys(cls)))


def _by_field(cls: Any, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Flat ``values`` split into top-level fields and ``{section: {its field: value}}``; an unknown key
    is a :class:`TypeError` naming it, as an unknown keyword is."""
    unknown = unknown_keys(cls, values)
    if unknown:
        name = cls.__name__ if isinstance(cls, type) else type(cls).__name__
        raise TypeError(f"{name}: unknown setting(s) {', '.join(unknown)}")
    keys = flat_keys(cls)
    top: dict[str, Any] = {}
    inner: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        name, sub = keys[key]
        if sub is None:
            top[name] = value
        else:
            inner.setdefault(name, {})[sub] = value
    return top, inner


def from_flat(cls: type, values: dict[str, Any]) -> Any:
    """``cls`` from flat keys, each left out at its default (``{"lora_rank": 8}`` ->
    ``cls(lora=LoRA(rank=8))``)."""
    top, inner = _by_field(cls, values)
    for name, sub_values in inner.items():
        top[name] = _section_type(_field(cls, name))(**sub_values)
    return cls(**top)


def replace_flat(cfg: Any, **changes: Any) -> Any:
    """:func:`dataclasses.replace` by flat key: ``replace_flat(cfg, lora_rank=8)`` is
    ``replace(cfg, lora=replace(cfg.lora, rank=8))``."""
    top, inner = _by_field(cfg, changes)
    for name, sub_values in inner.items():
        top[name] = dataclasses.replace(getattr(cfg, name), **sub_values)
    return dataclasses.replace(cfg, **top)


@dataclass
class WandB(Section):
    """Weights & Biases logging (off by default; offline when on, unless --wandb-mode online)."""

    enabled: bool = field(default=False, metadata={"key": "wandb"})
    """Also log to Weights & Biases."""
    mode: Literal["offline", "online"] = "offline"
    """wandb mode (offline by default: nothing leaves the machine)."""
    project: str = "sppo_rl"
    """wandb project name."""
    entity: str | None = None
    """wandb entity (user or team) the run belongs to (None: wandb's default)."""
    group: str | None = None
    """wandb group of the run (a sweep sets its folder's name, so that its runs are grouped)."""
    tags: tuple[str, ...] = ()
    """wandb tags of the run."""


@dataclass
class RunConfig:
    """Settings every training run has: algorithm, seed, the PPO update, the run folder, logging."""

    THREADS_MIN: ClassVar[int] = 1
    """The smallest ``--threads`` (0 where a world resolves 0 as auto)."""

    algo: str = "sppo"
    """Algorithm: a name of the registry :data:`sppo_rl.agents.algorithms.ALGORITHMS` (``--help`` and ``sppo-rl info`` list them)."""
    seed: int = 0
    """Seed of everything: contexts (start states / prompt order), sampling, minibatch order, network init."""
    group_size: int | None = None
    """Samples per context (episodes per start state, responses per prompt) for group methods.
    Default: the algorithm's (GRPO 8, RLOO 5); in the control world capped so that an update holds at
    least two start states; 1 for non-group methods."""
    micro_batch_size: int | None = None
    """Rows (episodes / responses) per forward/backward pass in every pass; a minibatch's gradients
    accumulate over its micro-batches (None: a whole minibatch per pass). The update equals the unsplit one."""
    max_tokens_per_micro_batch: int | None = None
    """Token (step) budget of a pass: rows are packed longest first while (rows x longest row) fits, each
    micro-batch cut to its own longest row (verl's dynamic batch size). None: no budget, except that a
    named LLM (--model smollm2-135m) brings its own (1,024) when --micro-batch-size is unset too."""
    clip: float | None = None
    """PPO clip range epsilon (both sides). None: the algorithm's own (gspo: 3e-4 with --clip-high 4e-4,
    the GSPO paper's), else 0.2."""
    clip_high: float | None = None
    """Upper clip range if different from --clip (asymmetric clipping); CISPO's weight cap 1 + clip_high.
    None: --clip (or, with --clip unset too, the algorithm's own)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (off by default)."""
    value_clip: float | None = None
    """Clip range of a per-step (token) critic's clipped MSE around its old values (None: plain MSE; verl: 0.5)."""
    agg: AggName | None = None
    """Loss aggregation over positions: token-mean (every step/token equal; verl's default and the paper's),
    seq-mean-token-mean (every sequence equal), seq-mean-token-sum (sum over positions, mean over
    sequences: verl's), seq-mean-token-sum-norm (that divided by the horizon: Dr. GRPO, TRL; verl's mode
    of this name is B times larger).
    None: the algorithm's own (Dr. GRPO: seq-mean-token-sum-norm; GSPO: seq-mean-token-mean; else token-mean)."""
    ratio_level: Literal["token", "sequence", "sequence-token"] | None = None
    """Importance ratio per token (PPO), or per sequence: the geometric mean of its token ratios, clipped
    as a whole (GSPO); sequence-token: that ratio's value with each token's own gradient (GSPO-token, for
    per-token advantages; `--algo gspo --ratio-level sequence-token` is GSPO-token); any estimator can
    use each. None: the algorithm's own (gspo, sppo-seq: sequence)."""
    policy_loss: Literal["ppo", "cispo", "dis"] | None = None
    """Surrogate: PPO's clipped ratio, CISPO's REINFORCE weighted by a clipped stop-gradient ratio
    (no token's gradient is ever dropped), or DIS (SAO's): REINFORCE weighted by the stop-gradient ratio
    inside (1 - clip, 1 + clip_high) and masked outside it, whatever the advantage's sign. None: the
    algorithm's own (cispo: cispo; sao: dis)."""
    tis_cap: float | None = None
    """Truncated importance sampling against the sampler's own log-probs mu (LLM world): each token's loss
    is weighted by min(pi_old / mu, C); the mismatch |log pi_old - log mu| is logged either way."""
    critic_warmup: int = 0
    """Updates during which only the critic is trained (the actor waits; VAPO's value pre-training)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rates of the actor and the critic over the run's K updates (after --warmup-updates W):
    constant, linear (anneal to 0 as CleanRL: factor 1 - k/K), cosine (TRL/verl's decay). sppo_rl/runtime/schedule.py."""
    warmup_updates: int = 0
    """Linear learning-rate warm-up: update k < W runs at (k + 1) / W of the base rate."""
    lam_critic: float | None = None
    """GAE lambda of the critic's targets when it differs from the actor's --lam (VC-PPO: 1.0). None: --lam."""
    lam_alpha: float | None = None
    """Length-adaptive actor lambda (VAPO): lambda = 1 - 1 / (alpha * length) per sequence. None: --lam."""
    group_std_threshold: float = 0.05
    """Groups whose outcome std is at most this get advantage 0 (GRPO, GSPO, CISPO): never divide noise by a
    tiny std. With binary outcomes any mixed group of G <= 64 has std >= 0.125."""
    gamma: float = 1.0
    """Discount of the step critic / GAE (1: the outcome is what counts)."""
    whiten: bool = False
    """Standardise GAE advantages over the batch's valid positions (ppo, ppo-bce, sao: refused with any other
    algorithm, whose estimator would ignore it; verl's PPO always whitens)."""
    grpo_std: Literal["population", "sample"] = "sample"
    """Std convention of GRPO's normalisation (sample = torch.std, as verl)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    bppo_prefix_ratio: float = 0.4
    """BPPO: fraction of each selected sequence's positions trained on (its prefix)."""
    bppo_accuracy_threshold: float = 0.5
    """BPPO: below this batch accuracy the full groups are trained on (GRPO); at or above it, the binary prefix pairs."""
    astar_samples: int = 8
    """A*-PO: samples of the reference policy (the initial actor) per context (prompt / pool start state)
    from which V* is estimated once, before update 1 (TRL's num_value_samples, the authors' 8)."""
    astar_beta1: float = 0.5
    """A*-PO: beta1 of V* = beta1 log mean_i exp(r_i / beta1) (TRL's and the authors' 0.5)."""
    astar_beta2: float = 1e-3
    """A*-PO: beta2 of the regression (beta2 sum_t log pi / pi_ref - (R - V*))^2 (TRL's and the authors' 1e-3)."""
    resume: bool = False
    """Continue the run in --out-dir from its latest checkpoint (metrics continue exactly)."""
    overwrite: bool = False
    """Start over in an --out-dir that already holds a run: once every setting is validated, everything in
    the folder is deleted (metrics, checkpoints, final exports, ...) except the lock files and a sweep's log.txt."""
    max_seconds: float | None = None
    """Wall-clock budget of training in seconds: the last update is the first to end past it (None: none)."""
    threads: int = 1
    """torch threads on CPU (1 is fastest for small MLPs and the tiny model)."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events to <out_dir>/tb."""
    wandb: WandB = field(default_factory=WandB)
    """Weights & Biases logging (off by default; offline when on, unless --wandb-mode online)."""
    exp_name: str | None = None
    """Name of the run in wandb (None: <task>/<algo>/seed<k>)."""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form tags stored with the config (e.g. sweep coordinates)."""

    # ------------------------------------------------------------------------------------- validation

    def checks(self) -> list[Check]:
        """The range of every numeric field (a subclass adds its own to ``super().checks()``). Fields
        both worlds define with their own defaults (learning rates, epochs, ...) are listed here too;
        a line whose field a config lacks is skipped."""
        return [
            ("seed", within(0, MAX_SEED), f"an integer in [0, 2^48 - 1 = {MAX_SEED}]"),
            ("group_size", optional(ge(1)), ">= 1, or None for the algorithm's default"),
            ("micro_batch_size", optional(ge(1)), ">= 1, or None for a whole minibatch per pass"),
            ("max_tokens_per_micro_batch", optional(ge(1)), ">= 1, or None for no token budget"),
            ("clip", optional(gt(0)), "> 0, or None for the algorithm's default"),
            ("clip_high", optional(gt(0)), "> 0, or None for --clip"),
            ("dual_clip", optional(gt(1)), "> 1, or None for off"),
            ("value_clip", optional(gt(0)), "> 0, or None for plain MSE"),
            ("tis_cap", optional(gt(0)), "> 0, or None for off"),
            ("critic_warmup", ge(0), ">= 0 (updates)"),
            ("warmup_updates", ge(0), ">= 0 (updates)"),
            ("lam_critic", optional(within(0, 1)), "in [0, 1], or None for --lam"),
            ("lam_alpha", optional(gt(0)), "> 0, or None for --lam"),
            ("group_std_threshold", ge(0), ">= 0"),
            ("gamma", within(0, 1), "in [0, 1]"),
            ("ent_coef", ge(0), ">= 0"),
            ("bppo_prefix_ratio", within(0, 1, open_lo=True), "in (0, 1]"),
            ("bppo_accuracy_threshold", within(0, 1), "in [0, 1]"),
            ("astar_samples", ge(1), ">= 1"),
            ("astar_beta1", gt(0), "> 0"),
            ("astar_beta2", gt(0), "> 0"),
            ("max_seconds", optional(gt(0)), "> 0 seconds, or None for no budget"),
            (
                "threads",
                within(self.THREADS_MIN, max_threads()),
                f"in [{self.THREADS_MIN}, {max_threads()}] ({THREADS_PER_CPU} x this machine's CPUs)"
                + ("; 0: auto" if self.THREADS_MIN == 0 else ""),
            ),
            # fields both worlds have, each with its own default
            ("actor_lr", optional(gt(0)), "> 0 (LLM: or None for the model's default)"),
            ("critic_lr", gt(0), "> 0"),
            ("epochs", ge(1), ">= 1"),
            ("minibatches", ge(1), ">= 1"),
            ("lam", within(0, 1), "in [0, 1]"),
            ("lampo_temperature", gt(0), "> 0"),
            ("max_grad_norm", gt(0), "> 0"),
            ("checkpoint_every", ge(1), ">= 1 (updates)"),
            ("keep_checkpoints", ge(1), ">= 1"),
            ("eval_every", ge(0), ">= 0 (0: off)"),
            # names (their type is checked first)
            ("wandb_entity", optional(_name), "a non-empty name, or None for wandb's default"),
            ("wandb_group", optional(_name), "a non-empty name, or None for no group"),
            ("exp_name", optional(_name), "a non-empty name, or None for <task>/<algo>/seed<k>"),
            ("wandb_tags", _tags, "non-empty tags of at most 64 characters each"),
        ]

    def field_problems(self) -> list[tuple[str, str]]:
        """``(flat key, "must be ..., got ...")`` for every setting of the wrong type or out of its range
        (one per key: a key of the wrong type is not range-checked, and only its first failed check
        counts); a section field holding anything but its section is one problem for each of its keys."""
        out: list[tuple[str, str]] = []
        keys = flat_keys(self)
        broken = {
            f.name
            for f in fields(self)
            if _section_type(f) and not isinstance(getattr(self, f.name), _section_type(f))
        }
        values = {}
        for key, (top, _) in keys.items():
            if top in broken:
                out.append(
                    (
                        key,
                        f"must be in a {_section_type(_field(type(self), top)).__name__} section, got {getattr(self, top)!r}",
                    )
                )
                continue
            value = get_flat(self, key)
            values[key] = value
            if not _type_ok(key_type(self, key), value):
                out.append((key, f"must be {_type_words(key_type(self, key))}, got {value!r}"))
        wrong_type = {key for key, _ in out}
        for (
            key,
            value,
        ) in values.items():  # an absurd count (steps 10^30) is no budget: refused before any work
            many = value if isinstance(value, (tuple, list)) else (value,)
            if key not in wrong_type and key not in UNBOUNDED_INTS and any(_too_big(v) for v in many):
                wrong_type.add(key)
                out.append((key, f"must be at most {MAX_COUNT:,} (a count or budget), got {value!r}"))
        for name, ok, allowed in self.checks():
            if name in wrong_type or name not in values or any(name == n for n, _ in out):
                continue  # a key of the wrong type, or already refused: one message per key
            value = values[name]
            try:
                good = bool(ok(value))
            except (
                TypeError,
                AttributeError,
            ):  # a cross-field check reading another setting of the wrong type
                continue
            if not good:
                out.append((name, f"must be {allowed}, got {value!r}"))
        return out

    def problems(self) -> list[str]:
        """Every setting out of its type or range, one ``"--flag must be ..., got ..."`` each."""
        return [f"{flag(name)} {message}" for name, message in self.field_problems()]

    def validate(self) -> None:
        """Raise :class:`ConfigError` (one line naming every bad flag) unless all settings are valid."""
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(problems))
