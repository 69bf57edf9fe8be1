"""The pure parts of scripts/bench_memory.py's ``--critics`` mode (no big model, no run): the parameter
count and model-state bytes of a Qwen2 actor and critic, checked by hand and against the real modules;
the table and JSON rows when a run failed; every configuration's command shares the same settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import script_module

REPO = Path(__file__).resolve().parents[1]

# hidden 8, 2 heads of 4 (kv: 1 head = 4), MLP 16, 2 layers, vocab 10
CONFIG = dict(
    hidden_size=8,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=16,
    num_hidden_layers=2,
    vocab_size=10,
    tie_word_embeddings=True,
)
# per layer: q 8*8+8 = 72; k, v 2*(8*4+4) = 72; o 8*8 = 64; MLP 3*8*16 = 384; norms 2*8 = 16 -> 608
# model: embedding 10*8 = 80 + 2*608 + final norm 8 = 1304 (tied head); untied +80; critic +8+1
HAND_ACTOR, HAND_UNTIED, HAND_CRITIC = 1304, 1384, 1313


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_memory") as module:
        yield module


def test_qwen2_params_by_hand(bench):
    assert bench.qwen2_params(CONFIG) == HAND_ACTOR
    assert bench.qwen2_params({**CONFIG, "tie_word_embeddings": False}) == HAND_UNTIED
    assert bench.qwen2_params(CONFIG, value_head=True) == HAND_CRITIC
    # fp32 weights, gradients, AdamW m and v: 4 x 4 bytes each
    assert bench.model_state_bytes(HAND_ACTOR) == 20864


def test_qwen2_params_match_the_real_modules(bench, tiny):
    """The count equals the parameters torch holds: a Qwen2 built from CONFIG, and the project's two
    critics over the conftest tiny model (hidden 32, one layer, kv 1 of 2 heads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.critic import SequenceCritic, StepCritic

    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG))
    assert sum(p.numel() for p in model.parameters()) == HAND_ACTOR
    config = json.loads((tiny / "config.json").read_text())
    actor = load_actor(tiny)
    assert sum(p.numel() for p in actor.parameters()) == bench.qwen2_params(config)
    for cls in (SequenceCritic, StepCritic):
        critic = cls.from_backbone(tiny)
        assert sum(p.numel() for p in critic.parameters()) == bench.qwen2_params(config, value_head=True)


def run(name: str, peak: float | None, actor: int = 1000, critic: int = 0) -> dict:
    state = 16 * (actor + critic)
    return dict(name=name, actor_params=actor, critic_params=critic, state_bytes=state, peak_mib=peak)


def test_critic_rows_with_a_failed_run(bench):
    mib = 2**20
    runs = [
        run("sppo actor-size", 400.0, actor=10 * mib, critic=10 * mib),  # state 320 MiB
        run("sppo small", None, actor=10 * mib, critic=mib),  # failed
        run("grpo", 300.0, actor=10 * mib),  # state 160 MiB
    ]
    rows = bench.critic_rows(runs, base_mib=50.0)
    assert [r["state_mib"] for r in rows] == [320.0, 176.0, 160.0]
    assert rows[0]["state_frac"] == pytest.approx(0.8) and rows[0]["other_mib"] == pytest.approx(30.0)
    assert rows[0]["vs_actor_critic"] == 1.0 and rows[2]["vs_actor_critic"] == pytest.approx(0.75)
    assert rows[2]["other_mib"] == pytest.approx(90.0)
    assert rows[1]["state_frac"] is rows[1]["other_mib"] is rows[1]["vs_actor_critic"] is None
    json.dumps(rows)  # the JSON last line takes the rows as they are

    table = bench.critic_table(rows, 90.0, 50.0).splitlines()
    small = next(line for line in table if line.startswith("| sppo small"))
    assert small.count("failed") == 4  # peak, state share, rest, ratio
    assert "| 0.75 |" in next(line for line in table if line.startswith("| grpo"))
    assert any("91.5% -> 78.7%" in line and "| 0.86 |" in line for line in table)

    # the reference (actor-size critic) and the no-update run failed: no ratio, no rest; the rest stays
    rows = bench.critic_rows([run("ref", None, critic=1000), run("grpo", 300.0)], base_mib=None)
    assert rows[1]["vs_actor_critic"] is None and rows[1]["other_mib"] is None
    assert rows[1]["state_frac"] == pytest.approx(16_000 / 2**20 / 300.0)
    assert "peak failed MiB, of which failed MiB" in bench.critic_table(rows, None, None)


def test_rewards_of_the_runs_load_as_the_trainer_loads_them(bench):
    """The command's --reward-fn (this script's path and a function) loads in the project's reward
    workers; parity pays odd-length responses, the no-update reward pays nothing."""
    from sppo_rl.llm.rewards.scorer import RewardScorer

    texts, truths = ["12", "123", "", "\\boxed{7}"], ["3", "3", "3", "7"]  # lengths 2, 3, 0, 9
    for name, want in (("parity_reward", [0.0, 1.0, 0.0, 1.0]), ("zero_reward", [0.0] * 4)):
        spec = bench.critic_command("grpo", "/m", None, "/o", name)
        scorer = RewardScorer(spec[spec.index("--reward-fn") + 1], timeout_s=10.0)
        try:
            assert scorer.score(texts, truths).scores.tolist() == want
        finally:
            scorer.close()


def test_critic_commands_share_settings(bench):
    cmds = {algo: bench.critic_command(algo, "/m/actor", c, "/o") for _, algo, c in bench.CRITIC_RUNS}
    assert "--critic-model" not in cmds["grpo"]
    assert all(c[c.index("--reward-fn") + 1].endswith("bench_memory.py:parity_reward") for c in cmds.values())
    tails = {tuple(c[c.index(bench.CRITIC_FLAGS[0]) :]) for c in cmds.values()}
    assert tails == {tuple(bench.CRITIC_FLAGS + ["--out-dir", "/o"])}
    assert bench.CRITIC_RUNS[0][1:] == ("sppo", "actor")  # the reference every ratio divides by


def test_bad_threads_is_one_line_exit_2():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_memory.py"), "--critics", "--threads", "0"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "bench_memory.py: error: --threads must be >= 1, got 0"
