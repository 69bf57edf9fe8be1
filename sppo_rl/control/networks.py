"""Policy and critic networks for the control world (small MLPs, CleanRL-style orthogonal init).

The hot path (acting in ``collect``) avoids ``torch.distributions``: sampling and log-probs are
written with plain tensor ops, which is several times faster for batches of a few dozen rows.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sppo_rl.agents.losses import entropy_from_logits

LOG_2PI = math.log(2 * math.pi)

TANH_CLIP = 7.90531110763549805
"""``tanh`` is +-1 in float32 beyond this (:func:`rational_tanh`)."""


def mlp(sizes: list[int], activation: str = "tanh", out_gain: float = 1.0) -> nn.Sequential:
    """``Linear -> act -> ... -> Linear``; hidden layers orthogonal(sqrt 2), last layer orthogonal(out_gain)."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(act())
    return nn.Sequential(*layers)


def rational_tanh(x: Tensor) -> Tensor:
    """``tanh(x)`` as ``x P(x^2) / Q(x^2)`` (degrees 6 and 3 in ``x^2``) with ``x`` clipped to ``[-TANH_CLIP,
    TANH_CLIP]``: within 3.6e-7 of ``torch.tanh`` in float32 (``tests/test_compile.py``). Plain
    multiply-adds, which ``torch.compile`` fuses into one vectorised loop (eager torch's own ``tanh`` is 2.3-3.6 ns an element on these CPUs)."""
    x = x.clamp(-7.90531110763549805, 7.90531110763549805)  # TANH_CLIP (a literal: torch.compile traces it)
    x2 = x * x
    # the minimax coefficients of the float tanh in Eigen and XLA
    p = x2 * -2.76076847742355e-16 + 2.00018790482477e-13
    p = x2 * p + -8.60467152213735e-11
    p = x2 * p + 5.12229709037114e-08
    p = x2 * p + 1.48572235717979e-05
    p = x2 * p + 6.37261928875436e-04
    p = x2 * p + 4.89352455891786e-03
    q = x2 * 1.19825839466702e-06 + 1.18534705686654e-04
    q = x2 * q + 2.26843463243900e-03
    q = x2 * q + 4.89352518554385e-03
    return x * p / q


class _RationalTanhFn(torch.autograd.Function):
    """:func:`rational_tanh` forward; backward ``g (1 - y^2)`` from the output ``y``, as ``torch.tanh``'s
    (not the derivative of the rational function)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        y = rational_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


class RationalTanh(nn.Module):
    """``nn.Tanh`` by :func:`rational_tanh` (no parameters: a state dict is the same with either)."""

    def forward(self, x: Tensor) -> Tensor:
        return _RationalTanhFn.apply(x)


def use_rational_tanh(module: nn.Module) -> None:
    """Replace every ``nn.Tanh`` inside ``module`` by :class:`RationalTanh`, in place (``--compile on``)."""
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Tanh):
                setattr(parent, name, RationalTanh())


class ObsNormalizer(nn.Module):
    """Running mean / variance of observations (parallel-variance update); ``normalize(x) = clip((x - mu) / sd)``.

    Stored as buffers, so it travels with the state dict. ``frozen`` stops updates (used after a warm
    start so the behaviour-cloned policy keeps seeing inputs on the scale it was trained on).
    """

    def __init__(self, dim: int, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.register_buffer("frozen", torch.tensor(False))
        self.clip = clip

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        if bool(self.frozen) or x.numel() == 0:
            return
        x = x.reshape(-1, x.shape[-1]).double()
        b_mean, b_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = b_mean - self.mean
        tot = self.count + n
        self.mean += delta * n / tot
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / tot
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def forward(self, x: Tensor) -> Tensor:
        sd = torch.sqrt(self.var + 1e-8).to(x.dtype)
        return torch.clamp((x - self.mean.to(x.dtype)) / sd, -self.clip, self.clip)


class Actor(nn.Module):
    """Categorical (discrete) or diagonal Gaussian with a state-independent log-std (continuous) policy."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        discrete: bool,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = -0.5,
    ) -> None:
        super().__init__()
        self.obs_dim, self.action_dim, self.discrete = obs_dim, action_dim, discrete
        self.hidden_sizes, self.activation = tuple(hidden_sizes), activation
        self.norm = ObsNormalizer(obs_dim)
        self.body = mlp([obs_dim, *hidden_sizes, action_dim], activation, out_gain=0.01)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def arch(self) -> dict:
        return {
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "discrete": self.discrete,
            "hidden_sizes": list(self.hidden_sizes),
            "activation": self.activation,
        }

    def forward(self, obs: Tensor) -> Tensor:
        """Logits (discrete) or the Gaussian mean (continuous)."""
        return self.body(self.norm(obs))

    @torch.no_grad()
    def act(self, obs: Tensor, greedy: Tensor | None = None, generator: torch.Generator | None = None):
        """Sample actions for a batch; rows where ``greedy`` is True take the argmax / the mean.

        Returns ``(actions, logp)``: ``actions`` long ``[N]`` or float ``[N, A]``; ``logp`` ``[N]``.
        """
        out = self(obs)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            u = torch.rand(out.shape, generator=generator).clamp_(1e-12, 1.0)
            a = torch.argmax(logp_all - torch.log(-torch.log(u)), -1)  # Gumbel-max sample
            if greedy is not None:
                a = torch.where(greedy, out.argmax(-1), a)
            return a, logp_all.gather(-1, a[:, None])[:, 0]
        std = torch.exp(self.log_std)
        noise = torch.randn(out.shape, generator=generator)
        if greedy is not None:
            noise = noise * (~greedy)[:, None]
        a = out + std * noise
        logp = (-0.5 * noise**2 - self.log_std - 0.5 * LOG_2PI).sum(-1)
        return a, logp

    def logp_entropy(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability of ``actions`` and the policy entropy at ``obs`` (both ``[N]``, differentiable)."""
        out = self(obs)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            return logp_all.gather(-1, actions.long()[:, None])[:, 0], entropy_from_logits(out)
        z = (actions - out) / torch.exp(self.log_std)
        logp = (-0.5 * z**2 - self.log_std - 0.5 * LOG_2PI).sum(-1)
        ent = (self.log_std + 0.5 * (1.0 + LOG_2PI)).sum().expand(out.shape[0])
        return logp, ent


class Critic(nn.Module):
    """Scalar critic ``V(s)``; as a start-state (sequence) critic it outputs a success logit."""

    def __init__(
        self,
        obs_dim: int,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        norm: ObsNormalizer | None = None,
    ) -> None:
        super().__init__()
        self.norm = norm if norm is not None else ObsNormalizer(obs_dim)  # shared with the actor when given
        self.body = mlp([obs_dim, *hidden_sizes, 1], activation, out_gain=1.0)

    def forward(self, obs: Tensor) -> Tensor:
        return self.body(self.norm(obs))[..., 0]


class StepCritic(Critic):
    """PPO's critic: ``values(obs [B, T, D]) -> V(s_t)`` ``[B, T]``, one value per step."""

    def values(self, obs: Tensor) -> Tensor:
        return self(obs)


class StartStateCritic(Critic):
    """SPPO's critic: ``values(obs [B, T, D]) -> V(s_0)`` ``[B]``, one success logit per episode read
    from its start state only."""

    def values(self, obs: Tensor) -> Tensor:
        return self(obs[:, 0])


CRITICS: dict[str, type[Critic]] = {"step": StepCritic, "sequence": StartStateCritic}
"""The critic class for each :attr:`~sppo_rl.agents.advantages.Requirements.critic` kind."""
