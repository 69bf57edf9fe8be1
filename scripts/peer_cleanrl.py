"""Throughput peer: CleanRL's single-file PPO (``ppo.py``, discrete actions), run as its author wrote it.

CleanRL is not part of this project: pass the path of its ``ppo.py`` (a checkout of the CleanRL
repository's ``cleanrl/ppo.py``, the Gymnasium version with ``tyro`` arguments). This runner executes that
file as ``__main__`` with the arguments after ``--``, one torch thread, and ``time.time`` read as this
process's CPU time, so the ``SPS:`` line the script prints after every iteration (its env steps since
``start_time``, set when its training loop starts, over the clock) is steps per CPU-second of training.
Its TensorBoard files go to the working directory (``runs/``): run it in a scratch folder.

Prints one JSON line: ``sps_cpu`` (the last ``SPS:`` line), ``iterations`` (``SPS:`` lines seen).

    python scripts/peer_cleanrl.py --ppo ~/cleanrl/cleanrl/ppo.py -- --env-id CartPole-v1 --num-envs 64 \\
        --num-steps 500 --num-minibatches 4 --update-epochs 4 --total-timesteps 128000 --no-cuda
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import runpy
import sys
import time


def last_sps(text: str) -> tuple[float | None, int]:
    """The value of the last ``SPS: N`` line of ``text`` (None if there is none) and how many there are."""
    found = re.findall(r"^SPS:\s*([0-9.]+)\s*$", text, flags=re.MULTILINE)
    return (float(found[-1]) if found else None), len(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ppo", required=True, help="path of CleanRL's ppo.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then ppo.py's own arguments")
    a = ap.parse_args()
    rest = a.args[1:] if a.args[:1] == ["--"] else a.args

    import torch

    torch.set_num_threads(1)
    time.time = time.process_time  # ppo.py's clock: CPU seconds of this process
    out = io.StringIO()
    sys.argv = [a.ppo, *rest]
    with contextlib.redirect_stdout(out):
        runpy.run_path(a.ppo, run_name="__main__")
    sps, n = last_sps(out.getvalue())
    if sps is None:
        sys.exit(f"no 'SPS:' line in the output of {a.ppo}")
    print(json.dumps({"impl": "cleanrl", "sps_cpu": sps, "iterations": n}))


if __name__ == "__main__":
    main()
