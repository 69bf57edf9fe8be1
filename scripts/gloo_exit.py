"""How often a finished two-rank gloo job aborts at exit, with and without destroying its process group.

Each trial launches ``torchrun --nproc-per-node 2`` on this file as a worker: the worker joins a gloo
group, does a few collectives (all-gather, an object broadcast) and returns. Without ``--destroy`` it
leaves the group to the interpreter's teardown, as ``sppo-rl llm`` did before
:func:`sppo_rl.llm.engines.init_process_group` registered its exit hook; with ``--destroy`` it joins
through that function, so the hook runs. A trial fails when torchrun exits non-zero (a rank aborted:
"terminate called without an active exception", SIGABRT).

    python scripts/gloo_exit.py --trials 40

prints the failed trials of each arm and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def worker(destroy: bool) -> None:
    import torch
    import torch.distributed as dist

    if destroy:
        from sppo_rl.llm.engines import init_process_group

        init_process_group(60.0)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(3):
        out = [torch.empty(1) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.tensor([float(rank)]))
        box = [{"rank": rank}]
        dist.broadcast_object_list(box, src=0)


def trial(destroy: bool) -> bool:
    """One two-rank job; True when it exited cleanly."""
    from sppo_rl.llm.engines import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(free_port()), __file__, "--worker"] + (["--destroy"] if destroy else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300).returncode == 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="jobs per arm (default 40)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--destroy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.destroy)
        return
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    failed = {}
    for arm, destroy in (("left to teardown", False), ("destroyed at exit", True)):
        failed[arm] = sum(not trial(destroy) for _ in range(args.trials))
        print(f"{arm}: {failed[arm]} of {args.trials} two-rank jobs aborted at exit")
    print(json.dumps({"trials": args.trials, "failed": failed}))


if __name__ == "__main__":
    main()
