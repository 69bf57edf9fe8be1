"""Seeds as a batch dimension: ``S`` control agents' networks as stacked weights.

A stack holds ``S`` actors (or critics) of one architecture as tensors with a leading seed dimension
(``weight [S, out, in]``, ``bias [S, out]``, the observation statistics ``[S, D]``), built from ``S``
ordinary :class:`~sppo_rl.control.networks.Actor` / ``Critic`` modules (:meth:`StackedActor.of`) and
taken apart into them again (:meth:`StackedActor.actor`), so a seed's weights, exports and checkpoints
keep the single run's format. Inputs are ``[S, M, D]``: seed ``k``'s rows are slice ``k``.

Seed ``k``'s numbers must not depend on the other seeds, nor on ``S``: the single-seed run is the stack of
one, so seed ``k`` of a stack of 16 is the run ``--seed k`` alone exactly when every batched kernel's slice
``k`` is independent of ``S`` and of the rows padded after seed ``k``'s own. What the kernels give, measured
on this CPU build (torch 2.13, one thread; ``tests/test_seed_batch.py`` pins each fact the stack relies on):

- ``torch.baddbmm`` (a layer with ``out >= 2``): slice ``k`` of the output and of every gradient is
  independent of ``S``; and, with 64 rows or more, of zero-gradient rows padded after its own (with a
  few rows, 1 to 5, padding changed the numbers: another kernel for tiny products), so a training pass
  that pads the seeds' steps to the longest must keep each seed's own row count large or equal;
- a layer with ``out == 1`` (a critic's head, a one-dimensional Gaussian mean): ``baddbmm``'s slice
  changed with ``S``, so such a layer runs ``F.linear`` seed by seed (``S`` small calls);
- against ``nn.Linear`` (``F.linear``): equal outputs for most shapes, but not for tiny products (about
  ``rows x out x in <= 384``, where ``F.linear`` takes another kernel) nor for one output column, and the
  weight gradient of a layer with a narrow input (``in`` = 4 or 8 observations) differs by float rounding
  (~1e-4 relative). So a stack of one is *not* bit-identical to the plain ``Actor``: the single run is
  defined as the stack of one, and a stacked seed is compared with that.

Acting draws each seed's random numbers from that seed's own generator (:meth:`StackedActor.act`), on
its own slice, and only while the seed has an episode running, so its stream is the one it would use
alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sppo_rl.control.networks import LOG_2PI, Actor, Critic, ObsNormalizer


def stacked_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x [S, M, in] -> [S, M, out]``, slice ``k`` equal to ``F.linear(x[k], weight[k], bias[k])``:
    one ``baddbmm``, or seed by seed with ``F.linear`` when ``out`` is 1 (see the module docstring)."""
    if weight.shape[1] == 1:
        return torch.stack([F.linear(x[k], weight[k], bias[k]) for k in range(x.shape[0])])
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


class StackedMLP(nn.Module):
    """``S`` copies of one :func:`~sppo_rl.control.networks.mlp` (``Linear -> act -> ... -> Linear``) as
    stacked parameters ``weight_i [S, out, in]``, ``bias_i [S, out]``."""

    def __init__(self, bodies: Sequence[nn.Sequential]) -> None:
        super().__init__()
        linears = [[m for m in body if isinstance(m, nn.Linear)] for body in bodies]
        acts = {type(m) for body in bodies for m in body if not isinstance(m, nn.Linear)}
        if len(acts) > 1 or len({tuple(tuple(lin.weight.shape) for lin in ls) for ls in linears}) != 1:
            raise ValueError("a stack's networks must share one architecture")
        self.act = acts.pop()() if acts else nn.Identity()
        self.weights = nn.ParameterList(
            [
                nn.Parameter(torch.stack([ls[i].weight.detach() for ls in linears]))
                for i in range(len(linears[0]))
            ]
        )
        self.biases = nn.ParameterList(
            [
                nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears]))
                for i in range(len(linears[0]))
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = stacked_linear(x, w, b)
            if i < last:
                x = self.act(x)
        return x

    def load_into(self, k: int, body: nn.Sequential) -> None:
        """Copy seed ``k``'s weights into ``body`` (an ``mlp`` of the same shape)."""
        linears = [m for m in body if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for lin, w, b in zip(linears, self.weights, self.biases):
                lin.weight.copy_(w[k])
                lin.bias.copy_(b[k])


class StackedNorm(nn.Module):
    """``S`` :class:`~sppo_rl.control.networks.ObsNormalizer` as buffers ``mean, var [S, D]``, ``count,
    frozen [S]``; each seed's statistics move with its own observations only (:meth:`update`)."""

    def __init__(self, norms: Sequence[ObsNormalizer]) -> None:
        super().__init__()
        for name in ("mean", "var", "count", "frozen"):
            self.register_buffer(name, torch.stack([getattr(n, name).detach().clone() for n in norms]))
        self.clip = norms[0].clip

    def forward(self, x: Tensor) -> Tensor:
        """``x [S, M, D]``, each slice normalised by its seed's statistics (as ``ObsNormalizer.forward``)."""
        sd = torch.sqrt(self.var + 1e-8).to(x.dtype)[:, None, :]
        return torch.clamp((x - self.mean.to(x.dtype)[:, None, :]) / sd, -self.clip, self.clip)

    def seed(self, k: int) -> ObsNormalizer:
        """Seed ``k``'s statistics as an ``ObsNormalizer`` (a copy)."""
        n = ObsNormalizer(self.mean.shape[1], self.clip)
        for name in ("mean", "var", "count", "frozen"):
            getattr(n, name).copy_(getattr(self, name)[k])
        return n

    @torch.no_grad()
    def update(self, k: int, x: Tensor) -> None:
        """Move seed ``k``'s statistics by ``x`` (``ObsNormalizer.update`` on its slice)."""
        n = self.seed(k)
        n.update(x)
        for name in ("mean", "var", "count"):
            getattr(self, name)[k] = getattr(n, name)


class StackedActor(nn.Module):
    """``S`` actors of one architecture (:class:`~sppo_rl.control.networks.Actor`) in one module."""

    def __init__(self, actors: Sequence[Actor]) -> None:
        super().__init__()
        a0 = actors[0]
        if any(a.arch() != a0.arch() for a in actors):
            raise ValueError("a stack's actors must share one architecture")
        self.obs_dim, self.action_dim, self.discrete = a0.obs_dim, a0.action_dim, a0.discrete
        self.hidden_sizes, self.activation = a0.hidden_sizes, a0.activation
        self.seeds = len(actors)
        self.norm = StackedNorm([a.norm for a in actors])
        self.body = StackedMLP([a.body for a in actors])
        if not self.discrete:
            self.log_std = nn.Parameter(torch.stack([a.log_std.detach() for a in actors]))

    def actor(self, k: int) -> Actor:
        """Seed ``k``'s actor as an ordinary ``Actor`` (a copy; its state dict is the single run's)."""
        a = Actor(self.obs_dim, self.action_dim, self.discrete, self.hidden_sizes, self.activation)
        self.body.load_into(k, a.body)
        a.norm = self.norm.seed(k)
        if not self.discrete:
            with torch.no_grad():
                a.log_std.copy_(self.log_std[k])
        return a

    def forward(self, obs: Tensor) -> Tensor:
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
        draws from ``generators[k]`` only when ``active[k]`` (an inactive seed's rows get the greedy
        action and are not to be read). ``greedy`` ``[n]`` marks the same rows in every seed. Returns
        ``actions [S, n]`` / ``[S, n, A]`` and ``logp [S, n]``."""
        out = self(obs)
        S, n = out.shape[:2]

        def draw(fn) -> Tensor:
            return torch.stack(
                [
                    fn(out.shape[1:], generator=g) if on else out.new_zeros(out.shape[1:])
                    for g, on in zip(generators, active)
                ]
            )

        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            u = draw(torch.rand)
            u = torch.where(torch.as_tensor(list(active))[:, None, None], u, torch.ones_like(u)).clamp_(
                1e-12, 1.0
            )
            a = torch.argmax(logp_all - torch.log(-torch.log(u)), -1)  # Gumbel-max sample
            if greedy is not None:
                a = torch.where(greedy[None, :], out.argmax(-1), a)
            return a, logp_all.gather(-1, a[..., None])[..., 0]
        log_std = self.log_std[:, None, :]
        noise = draw(torch.randn)
        if greedy is not None:
            noise = noise * (~greedy)[None, :, None]
        a = out + torch.exp(log_std) * noise
        logp = (-0.5 * noise**2 - log_std - 0.5 * LOG_2PI).sum(-1)
        return a, logp


class StackedCritic(nn.Module):
    """``S`` critics of one kind (:data:`~sppo_rl.control.networks.CRITICS`) in one module; ``values(obs
    [S, B, T, D])`` is the kind's ``values`` per seed."""

    def __init__(self, critics: Sequence[Critic], norm: StackedNorm | None = None) -> None:
        super().__init__()
        self.kind = type(critics[0])
        if any(type(c) is not self.kind for c in critics):
            raise ValueError("a stack's critics must be of one kind")
        self.norm = norm if norm is not None else StackedNorm([c.norm for c in critics])
        self.body = StackedMLP([c.body for c in critics])

    def forward(self, obs: Tensor) -> Tensor:
        """``obs [S, ..., D]`` -> ``[S, ...]``."""
        flat = obs.reshape(obs.shape[0], -1, obs.shape[-1])
        return self.body(self.norm(flat))[..., 0].reshape(obs.shape[:-1])
