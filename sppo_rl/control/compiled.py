"""``--compile``: the training pass's networks through ``torch.compile``, ``tanh`` as a rational function.

With ``--compile on`` a control run (:class:`~sppo_rl.control.trainer.ControlRun`):

- replaces its networks' ``nn.Tanh`` by :class:`~sppo_rl.control.networks.RationalTanh` (for acting, for
  training and in its evaluations, so that an episode's log-probs are recomputed exactly as they were
  sampled: the first ratio stays 1);
- runs the learner's actor pass (:meth:`~sppo_rl.control.networks.Actor.logp_entropy`), its critic pass
  and acting (:meth:`~sppo_rl.control.stack.StackedActor.sample`) through :func:`compiled`:
  ``torch.compile`` with dynamic shapes (a
  minibatch's valid steps vary), nn modules inlined, so one compiled program serves every seed and
  every minibatch size, the activation's forward and backward each one fused loop;
- steps Adam with its fused kernel (``fused=True``).

Eager torch runs ``tanh`` at 2.3-3.6 ns an element (``torch.compile`` does not make it cheaper), the
rational function compiled at ~1.0 ns, and each small op apart; what is left are the matrix products.
Measured (docs/control.md, a 2-core AMD EPYC): the floor's update 1.40x (``scripts/bench_compile.py``),
whole runs 1.12-1.18x one seed and 1.21-1.29x sixteen (``scripts/bench_throughput.py --compile``).
Compiling costs about 10 CPU-seconds once per process (the first calls), said in one line on stderr.
The eager path (``--compile off``) is the reference: its numbers are the ones every earlier run had. The
two paths differ at float rounding (``rational_tanh`` is within 3.6e-7 of ``torch.tanh``; fused Adam
sums in another order), so a run's numbers depend on the setting, which ``config.json`` records
(``resolved.compiled``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    return torch.compile(fn, dynamic=True)


def compiled(fn: F, on: bool) -> F:
    """``fn`` (a method taken from its class, ``Actor.logp_entropy``, called with the module first) through
    ``torch.compile`` with dynamic shapes when ``on``, else ``fn`` itself; one compiled function per ``fn``
    in the process, nn modules inlined, so every seed's modules share it."""
    return _compile(fn) if on else fn  # type: ignore[return-value]


def check_compiler() -> None:
    """``torch.compile`` builds C++ on the CPU: refuse ``--compile on`` in one line, before any file is
    touched, where no C++ compiler runs (``g++``, or ``$CXX``)."""
    from torch._inductor import cpp_builder

    from sppo_rl.runtime.run import RunError

    try:
        cpp_builder.get_cpp_compiler()
    except Exception:
        raise RunError(
            "--compile on: torch.compile needs a C++ compiler (g++, or the one $CXX names) and none runs here; "
            "use --compile off"
        ) from None


@functools.cache
def announce() -> None:
    """One line on stderr, once per process, when a run compiles (its first updates are slower)."""
    print(
        "[sppo-rl] --compile on: the first updates compile the training pass and acting (about 10 CPU-seconds, "
        "once per process); --compile off runs eager torch",
        file=sys.stderr,
        flush=True,
    )
