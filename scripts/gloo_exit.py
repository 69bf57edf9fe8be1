"""How often a finished two-rank gloo job aborts at exit, by how the process leaves its group.

Each trial launches ``torchrun --nproc-per-node 2`` on this file as a worker: the worker joins a gloo
group, does a few collectives (all-gather, an object broadcast) and returns. The arms:

- ``left to teardown``: the group is left to the interpreter's finalization;
- ``destroyed at exit``: joined through :func:`sppo_rl.llm.models.engines.init_process_group`, whose exit
  hook destroys the group while Python is whole;
- ``destroyed at exit, still held``: the same, but the worker keeps a reference to the group, as
  DeepSpeed's ZeRO-3 does on every parameter: destroying then only forgets it, and its worker
  threads live into finalization;
- ``end_process``: held as well, and the worker ends through
  :func:`sppo_rl.llm.models.engines.end_process` (``os._exit`` after leaving the group), as ``sppo-rl`` does.

A trial fails when torchrun exits non-zero (a rank aborted: "terminate called without an active
exception", SIGABRT).

    python scripts/gloo_exit.py --trials 30

prints the failed trials of each arm and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ARMS = {
    "left to teardown": "teardown",
    "destroyed at exit": "hook",
    "destroyed at exit, still held": "held",
    "end_process": "end",
}
HELD = []  # a reference to the group, as ZeRO-3's parameters keep one


def worker(arm: str) -> None:
    import torch
    import torch.distributed as dist

    if arm == "teardown":
        dist.init_process_group("gloo")
    else:
        from sppo_rl.llm.models.engines import init_process_group

        init_process_group(60.0)
    if arm in ("held", "end"):
        HELD.append(dist.group.WORLD)
    rank = dist.get_rank()
    for _ in range(3):
        out = [torch.empty(1) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.tensor([float(rank)]))
        box = [{"rank": rank}]
        dist.broadcast_object_list(box, src=0)
    if arm == "end":
        from sppo_rl.llm.models.engines import end_process

        end_process(0)


def trial(arm: str) -> bool:
    """One two-rank job; True when it exited cleanly."""
    from sppo_rl.llm.models.engines import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(free_port()), __file__, "--worker", arm]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300).returncode == 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="jobs per arm (default 40)")
    parser.add_argument("--worker", choices=sorted(ARMS.values()), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    failed = {}
    for name, arm in ARMS.items():
        failed[name] = sum(not trial(arm) for _ in range(args.trials))
        print(f"{name}: {failed[name]} of {args.trials} two-rank jobs aborted at exit")
    print(json.dumps({"trials": args.trials, "failed": failed}))


if __name__ == "__main__":
    main()
