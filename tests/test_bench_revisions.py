"""``scripts/bench_revisions.py``'s own parts: the ABBA order, the ratio with its interval, and the
command each revision's make target runs (read from make itself)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import bench_revisions as bench  # noqa: E402


@pytest.mark.parametrize("reps", [1, 2, 3, 4, 5])
def test_the_order_alternates_abba_with_reps_runs_of_each(reps):
    order = bench.order(reps)
    assert order.count("base") == order.count("current") == reps
    assert order[:2] == ["base", "current"]
    if reps >= 2:
        assert order[:4] == ["base", "current", "current", "base"]


def test_the_ratio_is_base_over_current_with_a_paired_interval():
    same = bench.time_ratio([10.0, 12.0, 11.0], [10.0, 12.0, 11.0])
    assert same["ratio"] == pytest.approx(1.0) and same["lo"] == pytest.approx(1.0)
    r = bench.time_ratio([10.0, 12.0], [5.0, 6.5])
    assert r["per_rep"] == pytest.approx([2.0, 12 / 6.5])
    assert r["ratio"] == pytest.approx(math.sqrt(2.0 * 12 / 6.5))
    assert r["lo"] < r["ratio"] < r["hi"]
    assert bench.time_ratio([10.0], [5.0])["lo"] is None  # one pair: no interval


def test_the_demo_real_command_is_what_make_runs():
    venv = REPO / ".venv"
    cmd = bench.target_command(REPO, "demo-real", venv)
    assert cmd.startswith(f"{venv}/bin/sppo-rl llm --model smollm2-135m ")
    assert "--out-dir runs/demo-real" in cmd and "\\" not in cmd
    with pytest.raises(SystemExit, match="expected one sppo-rl command"):
        bench.target_command(REPO, "lint", venv)


def test_extra_flags_are_appended_so_that_they_win():
    """``--args`` then ``--current-args`` go after the target's own flags: the last of a repeated flag
    is the one ``sppo-rl`` takes."""
    assert bench.with_args("sppo-rl llm --threads 1", " ", "--updates 4", "--threads 2") == (
        "sppo-rl llm --threads 1 --updates 4 --threads 2"
    )
    assert bench.with_args("sppo-rl llm") == "sppo-rl llm"
