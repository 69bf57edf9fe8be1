"""scripts/bench_rollout.py's parts: the floor in a precision, the float32 head, the A/A range, live rows."""

from __future__ import annotations

import torch
from paths import script_module

from sppo_rl.llm.models.core import load_actor
from sppo_rl.llm.models.tiny import build_tiny_model


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


def test_float32_head_gives_float32_logits_under_autocast_and_is_undone(tmp_path):
    model = load_actor(build_tiny_model(tmp_path / "model", charset="abc", seed=0)).eval()
    ids = torch.tensor([[1, 2, 3]])
    with script_module("bench_rollout") as bench, torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(input_ids=ids).logits.dtype == torch.bfloat16
            with bench.float32_head(model):
                mixed = model(input_ids=ids).logits
            assert model(input_ids=ids).logits.dtype == torch.bfloat16
        assert "forward" not in vars(model.get_output_embeddings())
        exact = model(input_ids=ids).logits
    assert mixed.dtype == torch.float32 and (mixed - exact).abs().max() < 0.1  # the body's bfloat16 only


def test_aa_range_and_live_rows():
    with script_module("bench_rollout") as bench:
        assert bench.aa_range([(100.0, 95.0), (100.0, 110.0)]) == "0.95-1.10"
        mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
        assert bench.live_rows(mask) == 5 / 4  # 2, 1, 1, 1 rows still going at the 4 steps
