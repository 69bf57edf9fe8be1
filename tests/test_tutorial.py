"""``docs/tutorial.md`` runs: its Python blocks are executed in order, in one namespace, in a fresh
working folder, as its notebook (``docs/tutorial.ipynb``) runs them, and the numbers the text quotes are
checked against what they print and compute; the notebook's own cells run and draw their plots."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(TUTORIAL.read_text()) if lang == language]


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[dict, list[str]]:
    """Run the tutorial as its notebook runs (``scripts/tutorial_notebook.py``: every ```python block in
    order, in one namespace, with the notebook's own cells, PPO on the LLM and the plots, between them);
    return the shared namespace and the printed output of each of the page's blocks. The notebook's
    cells, outputs included, are in the namespace as ``__cells__``."""
    from tests.paths import script_module

    work = tmp_path_factory.mktemp("tutorial")
    with script_module("tutorial_notebook") as tn:
        cells = tn.cells()
        namespace = tn.execute(cells, work)
        page = [c for c in cells if c["cell_type"] == "code" and tn.OWN not in c["metadata"].get("tags", [])]
    outputs = [
        "".join("".join(o["text"]) for o in c["outputs"] if o["output_type"] == "stream") for c in page
    ]
    namespace["__work__"], namespace["__cells__"] = work, cells
    return namespace, outputs


def test_the_tutorial_has_its_sections_and_every_block_prints(executed):
    _, outputs = executed
    assert len(outputs) == len(blocks("python")) == 8
    assert all(out.strip() for out in outputs), "every block shows a result"


def test_advantages_of_the_tiny_batch(executed):
    ns, outputs = executed
    import torch

    mask = ns["mask"]
    want_gae = torch.tensor([[0.5, 0.3, 0.1], [0.5, 0.2, 0.0], [-0.5, -0.3, -0.1], [-0.5, 0.0, 0.0]])
    assert torch.allclose(ns["adv_gae"], want_gae, atol=1e-6)
    s = math.sqrt(1 / 3)  # sample std of [1, 1, 0, 0]
    assert torch.allclose(ns["adv_grpo"], torch.tensor([0.5, 0.5, -0.5, -0.5])[:, None] / (s + 1e-6) * mask)
    assert torch.allclose(ns["adv_grpo"][0, 0], torch.tensor(0.866), atol=1e-3)
    assert torch.allclose(ns["adv_grpo_pop"], torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None] * mask, atol=1e-5)
    assert torch.allclose(ns["adv_sppo"], torch.tensor([0.35, 0.35, -0.65, -0.65])[:, None] * mask, atol=1e-6)
    assert (ns["adv_sppo"][mask == 0] == 0).all() and (ns["adv_gae"][mask == 0] == 0).all()
    assert "0.8660" in outputs[0] and "0.3500" in outputs[0] and "-0.6500" in outputs[0]
    # GRPO = SPPO's advantage over sqrt(p (1 - p)) for binary rewards
    assert "p = 0.65" in outputs[1]
    assert "right +0.7338, wrong -1.3628" in outputs[1]
    assert "right +0.3500, wrong -0.6500" in outputs[1]


def test_the_clipped_loss_worked_example(executed):
    ns, outputs = executed
    assert ns["objective"] == pytest.approx(0.3558, abs=1e-4)
    assert ns["objective"] == pytest.approx((0.385 + 0.42 + 0.2625) / 3, abs=1e-6)
    assert "token-mean objective 0.3558, clipfrac 0.333" in outputs[2]
    assert "[[0.3850, 0.4200, 0.2625]]" in outputs[2]
    assert "[[-0.7150, -0.8775, -0.5200]]" in outputs[2]
    assert "token-mean objective -0.7042" in outputs[2]
    assert ns["bce_right"] == pytest.approx(-math.log(0.65), abs=1e-6) == pytest.approx(0.4308, abs=1e-4)
    assert ns["bce_wrong"] == pytest.approx(-math.log(0.35), abs=1e-6)
    assert "R = 1 -> 0.4308" in outputs[2]


def test_the_control_runs(executed):
    ns, outputs = executed
    rows = ns["control_rows"]
    assert set(rows) == {"ppo", "grpo", "sppo"}
    for algo, r in rows.items():
        assert [x["episodes"] for x in r] == [64 * i for i in range(1, 7)], algo
        # "All three learn within a few hundred episodes": from about the random policy's one in ten
        # (0.09 at the first update on this seed) to 0.6-0.7 at the sixth (64 episodes each)
        assert r[0]["success_rate"] <= 0.25, algo
        assert r[-1]["success_rate"] >= r[0]["success_rate"] + 0.3, algo
    # SPPO's critic tracks the success rate: it starts at sigmoid(0) = 0.5 whatever the success rate
    # (0.09), falls towards the low rate (0.08 at the third update), and rises with it to end close to
    # it (0.52 against 0.66); an untrained critic would stay at 0.5
    v0 = [x["v0_mean"] for x in rows["sppo"]]
    assert abs(v0[0] - 0.5) < 0.05
    assert min(v0) < 0.3 and v0[-1] > min(v0) + 0.2
    assert abs(v0[-1] - rows["sppo"][-1]["success_rate"]) < 0.25
    assert "success rate per update" in outputs[3] and "SPPO's last update" in outputs[3]


def test_the_llm_run(executed):
    ns, outputs = executed
    rows = ns["llm_rows"]
    assert [r["update"] for r in rows] == [0, 1, 2, 3]
    assert ns["llm_summary"]["updates"] == 3 and ns["llm_summary"]["algo"] == "sppo"
    rewards = [r["reward_mean"] for r in rows[1:]]
    assert any(0.0 < x < 1.0 for x in rewards), "the digit reward must give both outcomes"
    assert (ns["__work__"] / "tutorial_runs" / "llm" / "sppo" / "final" / "actor" / "config.json").is_file()
    assert outputs[4].count("step ") == 3
    # GRPO with 4 samples per prompt generates about 4 times SPPO's tokens for the same 3 updates
    sppo_tokens, grpo_tokens = ns["llm_summary"]["generated_tokens"], ns["grpo_summary"]["generated_tokens"]
    assert 3 * sppo_tokens < grpo_tokens < 5 * sppo_tokens
    assert f"{sppo_tokens:>14d}{grpo_tokens:>14d}" in outputs[5]


def test_the_tail_effect(executed):
    ns, outputs = executed
    t = ns["ppo_tail"]
    assert t["successes"] > 0 and t["failures"] > 0
    assert len(t["bins"]["gap"]) == 20
    # what the text says the run shows: no separation at the start, clear separation at the end
    assert t["auc_first"] < 0.7 < t["auc_last"]
    assert t["tail_share"] > 0.15
    # SPPO's V(s_0) does not separate the outcomes (the text: no better than chance) but says about
    # the policy's success rate, a little behind it (0.657 and 0.654 against 48 successes in 64)
    s = ns["sppo_tail"]
    assert s["sequences"] == s["successes"] + s["failures"] == 64 and s["successes"] * s["failures"] > 0
    assert abs(s["v0_success_mean"] - s["v0_failure_mean"]) < 0.05
    assert abs(s["auc_v0"] - 0.5) < 0.25
    assert abs(s["v0_success_mean"] - s["successes"] / s["sequences"]) < 0.2
    assert "tail share" in outputs[6] and "SPPO V(s_0)" in outputs[6]
    png = ns["__work__"] / "tutorial_runs" / "report" / "tail_effect.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "('ppo', 'step')" in outputs[7] and "('sppo', 'sequence')" in outputs[7]


def test_shell_lines_name_real_subcommands():
    from sppo_rl.cli import _commands

    lines = [line for body in blocks("bash") for line in body.splitlines() if line.startswith("sppo-rl ")]
    inline = re.findall(r"`(sppo-rl [a-z]+)[^`]*`", TUTORIAL.read_text())
    assert lines and inline
    for cmd in lines + inline:
        assert cmd.split()[1] in _commands(), cmd


def test_the_notebooks_own_cells_run_and_draw_the_plots(executed):
    ns, _ = executed
    code = [c for c in ns["__cells__"] if c["cell_type"] == "code"]
    assert all(c["outputs"] for c in code), "every notebook cell shows a result"
    pngs = [o["data"]["image/png"] for c in code for o in c["outputs"] if "image/png" in o.get("data", {})]
    assert len(pngs) == 3
    text = "".join("".join(o.get("text", [])) for c in code for o in c["outputs"])
    for algo in ("ppo", "grpo", "sppo"):  # the three methods in the LLM world too
        assert f"{algo:5s} reward per update:" in text
    assert (ns["__work__"] / "tutorial_runs" / "llm" / "ppo" / "final" / "actor" / "config.json").is_file()
