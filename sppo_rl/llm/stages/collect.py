"""Stage 1, ``collect``: this rank's prompts of the next update, ``G`` samples each, scored.

- **Data order** (:class:`PromptOrder`): a seeded shuffle of the training set, drawn from its end and
  reshuffled when used up (epoch after epoch); every rank draws the same global list of
  ``prompts_per_step`` prompts and keeps its contiguous share of ``prompts_per_step / ranks``.
- **Seeds** (:func:`prompt_seeds`): one sampling seed per prompt, a function of the run seed, a base
  (the update index; -1 for validation, -2 for the critic trace) and the prompt's position in the whole
  batch, never of the rank that samples it. Round ``r`` of an update samples positions
  ``r * prompts_per_step + i``, so no two rounds share a seed.
- **Rounds** (:meth:`Collector.collect`): without dynamic sampling one round, all of its groups. With
  ``K = --dynamic-sampling-rounds`` (DAPO) each group is classified by
  :func:`~sppo_rl.agents.algorithms.group_signal`; only mixed ones (two valid outcomes that differ) are
  kept, the first ``prompts_per_step / ranks`` in order. Another round is drawn while any rank is short,
  at most ``K`` extra ones (the shortfall is summed over ranks, so every rank draws as many rounds). At
  the cap the groups found are trained on, and the rest of the batch is filled with dropped groups made
  invalid (no loss), so every rank trains on the same number of rows.
- **Ahead of the learner** (``--max-staleness K``): a round is *requested* (prompts drawn, generation
  submitted to the sampler: :class:`Pending`) apart from being *finished* (its samples waited for, then
  scored). Update ``u`` first requests the first rounds of updates up to ``u + K`` that are not yet
  requested, so each is sampled by the weights of the update that requested it (``version``): update
  ``u``'s batch by those after ``u - K`` updates, and a worker process
  (:class:`~sppo_rl.llm.rollout.worker.RolloutWorker`) generates it while the learner trains on the ones
  before. DAPO's extra rounds of update ``u`` are requested and finished at once, by update ``u``'s
  weights. A checkpoint keeps the requested rounds' samples (:meth:`Collector.saved`); K = 0 requests
  each round when it is finished: the synchronous update.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor

from sppo_rl.agents.algorithms import group_signal
from sppo_rl.llm.data.files import Example, render_prompt
from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.llm.stages.row import StageTimer
from sppo_rl.llm.stages.score import Scoring, give_up_if_cut

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from sppo_rl.llm.models.engines import Dist
    from sppo_rl.llm.outputs.completions import CompletionLog
    from sppo_rl.llm.plan import Plan
    from sppo_rl.llm.rollout.base import Rollout, SamplingParams


def prompt_seeds(seed: int, base: int, positions: list[int]) -> list[int]:
    """``(seed * 1_000_003 + base) * 65_537 + i`` for each position ``i``."""
    return [(seed * 1_000_003 + base) * 65_537 + i for i in positions]


class PromptOrder:
    """The order in which the ``n`` training prompts are drawn (see the module docstring)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def draw(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if not self.order:
                self.order = list(range(self.n))
                self.rng.shuffle(self.order)
            out.append(self.order.pop())
        return out

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (and an abandoned update rolls back to)."""
        return {"data_rng": self.rng.getstate(), "order": list(self.order)}

    def load(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["data_rng"])
        self.order = list(state["order"])


class Sampler:
    """The rollout at the run's sampling settings (:class:`~sppo_rl.llm.rollout.base.SamplingParams`),
    seeded per prompt from the run seed."""

    def __init__(self, rollout: Rollout, params: SamplingParams, seed: int) -> None:
        self.rollout, self.params, self.seed = rollout, params, seed

    def sample(self, prompts: list[str], n: int, base: int, positions: list[int]) -> RolloutBatch:
        """``n`` responses per prompt (adjacent rows), prompt ``j`` seeded by position ``positions[j]``."""
        params = dataclasses.replace(self.params, n=n)
        return self.rollout.generate(prompts, params, seeds=prompt_seeds(self.seed, base, positions))

    def greedy(self, prompts: list[str]) -> RolloutBatch:
        """One greedy decode per prompt."""
        return self.rollout.generate(prompts, self.params.as_greedy())

    def sample_and_greedy(
        self, prompts: list[str], n: int, base: int, positions: list[int]
    ) -> tuple[RolloutBatch, RolloutBatch]:
        """``(sample(prompts, n, base, positions), greedy(prompts))``: in one batched pass where the
        rollout has ``generate_with_greedy`` (:meth:`~sppo_rl.llm.rollout.hf.HFRollout.generate_with_greedy`,
        the same tokens), else as the two calls."""
        both = getattr(self.rollout, "generate_with_greedy", None)
        if both is None:
            return self.sample(prompts, n, base, positions), self.greedy(prompts)
        params = dataclasses.replace(self.params, n=n)
        return cast(
            tuple[RolloutBatch, RolloutBatch], both(prompts, params, prompt_seeds(self.seed, base, positions))
        )

    def submit(self, prompts: list[str], n: int, base: int, positions: list[int]) -> Ticket:
        """:meth:`sample` handed to the sampler without waiting, where it can (a rollout with ``submit``:
        the worker process); else done at once."""
        params = dataclasses.replace(self.params, n=n)
        seeds = prompt_seeds(self.seed, base, positions)
        submit = getattr(self.rollout, "submit", None)
        if submit is not None:
            return cast(Ticket, submit(prompts, params, seeds))
        return Done(self.rollout.generate(prompts, params, seeds=seeds))

    def submit_greedy(self, prompts: list[str]) -> Ticket:
        """:meth:`greedy`, like :meth:`submit`."""
        submit = getattr(self.rollout, "submit", None)
        params = self.params.as_greedy()
        return (
            cast(Ticket, submit(prompts, params))
            if submit is not None
            else Done(self.rollout.generate(prompts, params))
        )


class Ticket(Protocol):
    """A generation in flight: :meth:`result` waits for its :class:`RolloutBatch`."""

    def result(self) -> RolloutBatch: ...


class Done:
    """A generation already done (the inline sampler's, or one restored from a checkpoint)."""

    def __init__(self, rb: RolloutBatch) -> None:
        self.rb = rb

    def result(self) -> RolloutBatch:
        return self.rb


@dataclass
class Pending:
    """A requested generation round (see the module docstring): round ``index`` of update ``step``, this
    rank's prompts (``drawn``: training-set indices; ``prompts``: rendered; ``positions`` in the whole
    round), its samples and ReMax's greedy decodes in flight, and ``version``: the updates done when it
    was requested (the weights that sample it)."""

    step: int
    index: int
    drawn: list[int]
    prompts: list[str]
    positions: list[int]
    sample: Ticket
    greedy: Ticket | None
    version: int

    def saved(self) -> dict[str, Any]:
        """Plain data for a checkpoint (waits for the samples)."""
        out = {k: getattr(self, k) for k in ("step", "index", "drawn", "prompts", "positions", "version")}
        out["sample"] = batch_record(self.sample.result())
        out["greedy"] = batch_record(self.greedy.result()) if self.greedy is not None else None
        return out

    @classmethod
    def load(cls, d: dict[str, Any]) -> Pending:
        greedy = Done(batch_of(d["greedy"])) if d["greedy"] is not None else None
        keys = ("step", "index", "drawn", "prompts", "positions")
        return cls(
            **{k: d[k] for k in keys},
            sample=Done(batch_of(d["sample"])),
            greedy=greedy,
            version=d["version"],
        )


def batch_record(rb: RolloutBatch) -> dict[str, Any]:
    """A :class:`RolloutBatch` (or a subclass: the latent one) as plain data: its class's name under
    ``kind`` and its fields by name, on the CPU (:func:`batch_of` reads it back)."""
    rb = rb.to("cpu")
    return {"kind": type(rb).__name__, **{f.name: getattr(rb, f.name) for f in dataclasses.fields(rb)}}


def batch_of(record: dict[str, Any]) -> RolloutBatch:
    """The batch of a :func:`batch_record`."""
    classes: list[type[RolloutBatch]] = [RolloutBatch]
    classes += RolloutBatch.__subclasses__()
    kinds = {c.__name__: c for c in classes}
    fields = {k: v for k, v in record.items() if k != "kind"}
    return kinds[record.get("kind", "RolloutBatch")](**fields)


@dataclass
class Round:
    """One generation round of an update, this rank's share: prompts, samples and their scores."""

    examples: list[Example]
    rb: RolloutBatch
    greedy: RolloutBatch | None
    R: Tensor  # [rows] float32 outcome (a 0.0 placeholder where invalid)
    valid: Tensor  # [rows] bool: the verifier gave the row (and its greedy baseline, if any) a score
    baseline: Tensor | None  # [rows] the greedy outcome of the row's prompt (ReMax)
    baseline_valid: Tensor | None  # [rows] bool
    errors: int
    kinds: Tensor | None = None  # [prompts] index into GROUP_KINDS (dynamic sampling only)
    version: int = 0  # the updates done when the round was requested (its sampler's weights)


@dataclass
class Collected:
    """An update's rounds, the ``(round, prompt)`` groups to train on, and the per-reward-function sums
    over its training samples (``[k, 3]``: valid scores' sum, their count, failures)."""

    rounds: list[Round]
    groups: list[tuple[int, int]]
    fn: np.ndarray = field(default_factory=lambda: np.zeros((1, 3)))


class Collector:
    """Stages 1 and 2 of an update for this rank: draw prompts, sample, score (see the module docstring).

    Args:
        train: the training prompts (rendered); order: their :class:`PromptOrder`.
        sampler: the rollout (:class:`Sampler`); scoring: the reward workers (:class:`Scoring`).
        plan: the run's :class:`~sppo_rl.llm.plan.Plan`; dist: its ranks; device: the reductions' device.
        completions: the run's :class:`~sppo_rl.llm.outputs.completions.CompletionLog`.
        tokenizer: renders a prompt (:func:`~sppo_rl.llm.data.files.render_prompt`).
    """

    def __init__(
        self,
        train: list[Example],
        order: PromptOrder,
        sampler: Sampler,
        scoring: Scoring,
        plan: Plan,
        dist: Dist,
        device: torch.device,
        tokenizer: PreTrainedTokenizerBase,
        completions: CompletionLog,
    ) -> None:
        self.train, self.order, self.sampler, self.scoring = train, order, sampler, scoring
        self.plan, self.dist, self.device, self.tokenizer = plan, dist, device, tokenizer
        self.completions = completions
        self.queue: deque[Pending] = deque()  # requested rounds, oldest first

    def _next_prompts(self) -> tuple[list[int], list[int]]:
        """This rank's prompts of the next round (training-set indices) and their positions in the whole
        round."""
        drawn = self.order.draw(self.plan.rollout.prompts_per_step)
        n = self.plan.rollout.local_prompts
        lo = self.dist.rank * n
        return drawn[lo : lo + n], list(range(lo, lo + n))

    def request(self, index: int, step: int, version: int) -> Pending:
        """Round ``index`` of update ``step`` (0-based) requested: its prompts drawn, its generation
        handed to the sampler (:meth:`Sampler.submit`), by the weights after ``version`` updates."""
        G, per_round = self.plan.rollout.group_size, self.plan.rollout.prompts_per_step
        drawn, positions = self._next_prompts()
        prompts = [render_prompt(self.train[i], self.tokenizer) for i in drawn]
        sample = self.sampler.submit(prompts, G, step, [p + index * per_round for p in positions])
        greedy = self.sampler.submit_greedy(prompts) if self.plan.algo.requires.greedy_baseline else None
        return Pending(step, index, drawn, prompts, positions, sample, greedy, version)

    def finish(self, p: Pending, timer: StageTimer, by_function: np.ndarray) -> Round:
        """The requested round ``p`` waited for and scored; adds the training samples' per-function sums
        to ``by_function``. A preemption that cut the scoring raises :class:`Preempted`."""
        with timer("gen"):
            rb = p.sample.result()
            greedy_rb = p.greedy.result() if p.greedy is not None else None
        examples, prompts, index, step = [self.train[i] for i in p.drawn], p.prompts, p.index, p.step
        with timer("score"):
            rows = [examples[int(i)] for i in rb.prompt_index]
            s = self.scoring(rb.texts, [e.answer for e in rows], rows)
            by_function += s.fn
            R, valid, errors, cut = s.R, s.valid, s.errors, s.cut
            if index == 0 and self.completions.due(step + 1):
                self.completions.write_batch(
                    step + 1, "train", prompts, rb, [e.answer for e in examples], R, valid
                )
            baseline = baseline_valid = None
            if greedy_rb is not None:
                g = self.scoring(greedy_rb.texts, [e.answer for e in examples], examples)
                errors, cut = errors + g.errors, cut or g.cut
                baseline, baseline_valid = g.R[rb.prompt_index.cpu()], g.valid[rb.prompt_index.cpu()]
                valid = valid & baseline_valid  # no baseline, no advantage
        give_up_if_cut(cut, self.dist, self.device)
        return Round(examples, rb, greedy_rb, R, valid, baseline, baseline_valid, errors, version=p.version)

    def round(self, index: int, step: int, timer: StageTimer, by_function: np.ndarray, version: int) -> Round:
        """Round ``index`` of update ``step`` requested and finished at once (:meth:`request`, :meth:`finish`)."""
        with timer("gen"):
            p = self.request(index, step, version)
        return self.finish(p, timer, by_function)

    def snapshot(self) -> tuple[dict[str, Any], list[Pending]]:
        """What :meth:`restore` takes back to: the prompt order's state and the requested rounds."""
        return self.order.state(), list(self.queue)

    def restore(self, snap: tuple[dict[str, Any], list[Pending]]) -> None:
        """Back to :meth:`snapshot`'s state (an update given up: its rounds are requested again on resume,
        by the same weights)."""
        self.order.load(snap[0])
        self.queue = deque(snap[1])

    def saved(self) -> dict[str, Any]:
        """The requested rounds for a checkpoint (plain data; waits for their samples)."""
        return {"pending": [p.saved() for p in self.queue]}

    def load(self, saved: dict[str, Any]) -> None:
        """The requested rounds of a checkpoint's :meth:`saved` (none in one written before them)."""
        self.queue = deque(Pending.load(d) for d in saved.get("pending", []))

    def collect(self, step: int, timer: StageTimer, version: int) -> Collected:
        """The rounds of update ``step`` and the groups to train on (see the module docstring); rounds it
        requests are sampled by the weights after ``version`` updates."""
        settings = self.plan.rollout
        G = settings.group_size
        K, n = settings.dynamic_sampling_rounds, settings.local_prompts
        by_function = np.zeros((len(self.scoring.names), 3))
        with timer("gen"):  # the first rounds up to update step + max_staleness requested
            for s in range(
                self.queue[-1].step + 1 if self.queue else step, step + settings.max_staleness + 1
            ):
                self.queue.append(self.request(0, s, version))
        first = self.queue.popleft()
        if first.step != step:
            raise RuntimeError(f"update {step} found the round requested for update {first.step}")
        rounds = [self.finish(first, timer, by_function)]
        if K == 0:
            return Collected(rounds, [(0, k) for k in range(n)], by_function)
        keep: list[tuple[int, int]] = []
        while True:
            r = rounds[-1]
            r.kinds = group_signal(r.R.view(-1, G), r.valid.view(-1, G))
            keep += [(len(rounds) - 1, int(k)) for k in torch.nonzero(r.kinds == 0).flatten()]
            short = self.dist.all_sum([float(max(0, n - len(keep)))], self.device)[0]
            if short == 0 or len(rounds) > K:
                break
            rounds.append(self.round(len(rounds), step, timer, by_function, version))
        keep = keep[:n]
        kinds = [cast(Tensor, r.kinds) for r in rounds]  # every round's groups were classified above
        filler = [(i, int(k)) for i, kind in enumerate(kinds) for k in torch.nonzero(kind != 0).flatten()]
        return Collected(rounds, keep + filler[: n - len(keep)], by_function)
