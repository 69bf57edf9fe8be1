"""scripts/bench_rollout.py's parts: the floor in a precision, the float32 head, the A/A range, live rows."""

from __future__ import annotations

import torch
from paths import script_module


def test_the_floor_adds_the_layers_in_the_bodys_dtype_and_the_head_in_float32():
    with script_module("bench_rollout") as bench:
        assert bench.PRECISIONS == {
            "fp32": (torch.float32, torch.float32),
            "bf16": (torch.bfloat16, torch.float32),
        }
        shapes = [(8, 8, 3), (8, 16, 1)]  # three layers' 8 x 8 matmuls, then an 8 x 16 head
        for precision in bench.PRECISIONS:
            assert 0 < bench.floor_seconds(shapes, 4, 2, precision) < 1.0
        assert 0 < bench.matmul_gflops(shapes, 4, seconds=0.02, dtype=torch.bfloat16) < 1e4


def test_aa_range_and_live_rows():
    with script_module("bench_rollout") as bench:
        assert bench.aa_range([(100.0, 95.0), (100.0, 110.0)]) == "0.95-1.10"
        mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
        assert bench.live_rows(mask) == 5 / 4  # 2, 1, 1, 1 rows still going at the 4 steps


def test_the_floor_at_a_calls_own_rows_sums_its_steps_at_their_live_rows():
    """Two calls: the floor sums a step's matmul seconds at each column's live rows (a column with no row
    left costs nothing) over the call's CPU seconds; the median over the calls."""
    with script_module("bench_rollout") as bench:
        cost = {4: 1.0, 2: 0.6, 1: 0.5}
        got = bench.own_rows_floor([[4, 2, 1, 0], [4, 4]], [4.2, 4.0], cost.__getitem__)
        assert got == (2.1 / 4.2 + 2.0 / 4.0) / 2
        timed = bench.step_floor([(8, 8, 2), (8, 16, 1)], "fp32")
        assert timed(3) == timed(3) > 0  # each row count timed once
