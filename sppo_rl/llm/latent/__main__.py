"""``python -m sppo_rl.llm.latent explicit-model|latent-model [sppo-rl llm flags]``: build the warm starts."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from sppo_rl.llm.latent.plugin import LATENT_FIXES
from sppo_rl.llm.latent.warmstart import explicit_model


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sppo_rl.llm.latent explicit-model|latent-model [sppo-rl llm flags]``: build (once) and
    print the folder of the explicit-reasoning warm start (stage 0: the comparable start of explicit
    GRPO, ``sppo-rl llm --algo grpo --model <folder>``) or of the latent one."""
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.models.engines import launcher_dist
    from sppo_rl.llm.plan import resolve
    from sppo_rl.runtime.flags import parse

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("explicit-model", "latent-model"):
        print(
            "usage: python -m sppo_rl.llm.latent explicit-model|latent-model [sppo-rl llm flags]",
            file=sys.stderr,
        )
        return 2
    what, rest = args[0], args[1:]
    cfg = parse(LLMConfig, rest, default=LLMConfig(algo="latent-grpo"), prog=f"latent {what}")
    if what == "latent-model" and cfg.algo not in LATENT_FIXES:
        cfg = dataclasses.replace(cfg, algo="latent-grpo")
    plan, task = resolve(cfg, launcher_dist())  # the run's own settings, as `sppo-rl llm` resolves them
    if what == "explicit-model":
        folder = explicit_model(plan.models.warmstart, task.train)[0]
    else:
        assert plan.latent is not None
        folder = plan.latent.embedded_model(plan.models.warmstart, task.train)[0]
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
