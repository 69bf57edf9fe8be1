"""Seeds as a batch dimension: ``S`` control agents' actors as one stacked network, to act.

A multi-seed run (:mod:`sppo_rl.control.seeds`) steps its ``S`` seeds' episodes in one vector env; a
:class:`StackedActor` runs their ``S`` actors (one architecture) as tensors with a leading seed dimension
(``weight [S, out, in]``, ``bias [S, out]``, the observation statistics ``[S, D]``), stacked from the seeds'
own :class:`~sppo_rl.control.networks.Actor` modules once per collection, over inputs ``[S, n, D]`` (seed
``k``'s rows are slice ``k``). The single-seed run acts through the stack of one, so that seed ``k`` of a
stack of 16 acts exactly as the run ``--seed k`` alone, when each batched kernel's slice ``k`` is
independent of ``S``. What the kernels give, measured on this CPU build (torch 2.13, one thread;
``tests/test_seed_batch.py`` pins what the stack relies on):

- ``torch.baddbmm`` (a layer with ``out >= 2``): slice ``k`` independent of ``S``; against ``nn.Linear``
  (``F.linear``) equal, except for tiny products (about ``rows x out x in <= 384``, e.g. three envs or fewer
  at the 64 -> 2 head), where ``F.linear`` takes another kernel;
- with more than one thread a batched kernel may split its work by ``S``: on a Zen 2 CPU (AMD EPYC, AVX2)
  with two threads, 5-11 rows of a 64-wide layer came out differently in a stack of 2-16 than alone, so
  the exactness holds at one thread (a control run's default ``--threads 1``);
- a layer with ``out == 1`` (a one-dimensional Gaussian mean): ``baddbmm``'s slice changed with ``S`` and
  no batched op matched ``F.linear`` (a matrix-vector kernel), so such a layer runs ``F.linear`` seed by
  seed (exact, ``S`` small calls).

Training is not stacked: each seed trains with its own modules, optimisers and the shared learner, as
the single run does (exact by construction). A stacked training pass (16 seeds, 4-64-64-2 actor and step
critic, forward + backward, one thread, alternated on a busy 2-core machine: ``python
scripts/bench_seeds.py --train-pass --sizes 16 --repeats 4``) took 19-27 / 66-79 / 197-235 ms against the
seed-by-seed loop's 35-58 / 66-91 / 166-212 ms at 200 / 800 / 3200 rows per seed: it pays only for small
minibatches (short episodes), and there it cannot be exact, since the seeds' rows differ in number and
padding them to the longest changes the weight gradients' sums (at 300 rows, 7, 64 or 700 rows of padding
changed the weight gradient of each 64-wide layer: ``python scripts/bench_seeds.py --padding --rows 64
100 300 517 1000``). Acting is where a stack pays at every size: a step's 64 rows per seed are too few
for one seed's kernels to amortise their overhead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sppo_rl.control.compiled import compiled
from sppo_rl.control.networks import LOG_2PI, Actor


def stacked_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x [S, M, in] -> [S, M, out]``, slice ``k`` a function of ``x[k], weight[k], bias[k]`` only:
    one ``baddbmm``, or seed by seed with ``F.linear`` when ``out`` is 1 (see the module docstring)."""
    if weight.shape[1] == 1:
        return torch.stack([F.linear(x[k], weight[k], bias[k]) for k in range(x.shape[0])])
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


def _stack(tensors: Sequence[Tensor]) -> Tensor:
    return torch.stack([t.detach() for t in tensors])


class StackedMLP:
    """``S`` copies of one :func:`~sppo_rl.control.networks.mlp` (``Linear -> act -> ... -> Linear``) as
    stacked tensors ``weights[i] [S, out, in]``, ``biases[i] [S, out]`` (copies, no gradient)."""

    def __init__(self, bodies: Sequence[nn.Sequential]) -> None:
        linears = [[m for m in body if isinstance(m, nn.Linear)] for body in bodies]
        acts = {type(m) for body in bodies for m in body if not isinstance(m, nn.Linear)}
        if len(acts) > 1 or len({tuple(tuple(lin.weight.shape) for lin in ls) for ls in linears}) != 1:
            raise ValueError("a stack's networks must share one architecture")
        self.act = acts.pop()() if acts else nn.Identity()
        layers = range(len(linears[0]))
        self.weights = [_stack([ls[i].weight for ls in linears]) for i in layers]
        self.biases = [_stack([ls[i].bias for ls in linears]) for i in layers]

    def __call__(self, x: Tensor) -> Tensor:
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = stacked_linear(x, w, b)
            if i < last:
                x = self.act(x)
        return x


class StackedNorm:
    """``S`` :class:`~sppo_rl.control.networks.ObsNormalizer` as ``mean, var [S, D]`` (copies);
    ``normalize(x [S, M, D])`` is each seed's ``ObsNormalizer.forward`` on its slice."""

    def __init__(self, norms: Sequence[nn.Module]) -> None:
        self.mean = torch.stack([n.mean.detach() for n in norms])
        self.var = torch.stack([n.var.detach() for n in norms])
        self.clip = norms[0].clip

    def __call__(self, x: Tensor) -> Tensor:
        sd = torch.sqrt(self.var + 1e-8).to(x.dtype)[:, None, :]
        return torch.clamp((x - self.mean.to(x.dtype)[:, None, :]) / sd, -self.clip, self.clip)


class StackedActor:
    """``S`` actors of one architecture (:class:`~sppo_rl.control.networks.Actor`) as one stacked network
    over inputs ``[S, M, D]``: a copy of their weights and observation statistics, to act with."""

    def __init__(self, actors: Sequence[Actor], compiled: bool = False) -> None:
        """``compiled``: :meth:`act`'s forward and sample through ``torch.compile`` (``--compile on``:
        :mod:`sppo_rl.control.compiled`)."""
        a0 = actors[0]
        self.compiled = compiled
        if any(a.arch() != a0.arch() for a in actors):
            raise ValueError("a stack's actors must share one architecture")
        self.discrete, self.action_dim = a0.discrete, a0.action_dim
        self.norm = StackedNorm([a.norm for a in actors])
        self.body = StackedMLP([a.body for a in actors])
        self.log_std = None if self.discrete else _stack([a.log_std for a in actors])

    def __call__(self, obs: Tensor) -> Tensor:
        """``obs [S, M, D]`` -> logits or Gaussian means ``[S, M, A]``."""
        return self.body(self.norm(obs))

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        greedy: Tensor | None,
        generators: Sequence[torch.Generator | None],
        active: Sequence[bool],
    ) -> tuple[Tensor, Tensor]:
        """:meth:`Actor.act <sppo_rl.control.networks.Actor.act>` per seed on ``obs [S, n, D]``: seed ``k``
        draws from ``generators[k]`` only when ``active[k]`` (an inactive seed's rows are not to be
        read). ``greedy`` ``[n]`` marks the same rows in every seed. Returns ``actions [S, n]`` /
        ``[S, n, A]`` and ``logp [S, n]``."""
        shape = (obs.shape[1], self.action_dim)
        draw = torch.rand if self.discrete else torch.randn
        noise = torch.stack(
            [draw(shape, generator=g) if on else obs.new_ones(shape) for g, on in zip(generators, active)]
        )
        return compiled(StackedActor.sample, self.compiled)(self, obs, noise, greedy)

    def sample(self, obs: Tensor, noise: Tensor, greedy: Tensor | None) -> tuple[Tensor, Tensor]:
        """:meth:`act` given its draws ``noise [S, n, A]`` (uniform for a categorical policy's Gumbel-max
        sample, standard normal for a Gaussian's), eager."""
        out = self(obs)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            u = noise.clamp(1e-12, 1.0)
            a = torch.argmax(logp_all - torch.log(-torch.log(u)), -1)  # Gumbel-max sample
            if greedy is not None:
                a = torch.where(greedy[None, :], out.argmax(-1), a)
            return a, logp_all.gather(-1, a[..., None])[..., 0]
        assert self.log_std is not None
        log_std = self.log_std[:, None, :]
        if greedy is not None:
            noise = noise * (~greedy)[None, :, None]
        a = out + torch.exp(log_std) * noise
        logp = (-0.5 * noise**2 - log_std - 0.5 * LOG_2PI).sum(-1)
        return a, logp
