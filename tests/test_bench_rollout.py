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
