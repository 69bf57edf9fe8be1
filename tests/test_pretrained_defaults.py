"""What a pretrained model needs: no actor update when every reward of a batch is equal, SPPO's critic initialised from the first batch's success
rate, checkpoints that keep only the newest K and may leave out the optimizer states, and the defaults
a named model brings (the lenient ``boxed-or-last-number`` reward itself is checked in ``test_reward.py``).

Runs use the small Llama with a real BPE tokenizer and a chat template built in ``test_pretrained.py``
(seconds each); nothing is downloaded."""

from __future__ import annotations

from functools import partial

import pytest
from configs import llm_config

from sppo_rl.llm.config import LLMConfig, Overlong

# --------------------------------------------------------------------------------- small runs


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from test_pretrained import build_small_llama

    return build_small_llama(tmp_path_factory.mktemp("llama"))


def _reward_file(folder, paid: int):
    """A reward that pays the first ``paid`` responses it scores in the run (one worker process scores
    them all; with ``eval_every=0`` only training rollouts are scored), and nothing afterwards."""
    path = folder / f"pay_first_{paid}.py"
    path.write_text(
        f"CALLS = [0]\n\ndef score(response, truth):\n    CALLS[0] += 1\n    return float(CALLS[0] <= {paid})\n"
    )
    return f"{path}:score"


_cfg = partial(
    llm_config, algo="sppo", updates=6, val_size=2, eval_samples=1, eval_every=0, max_new_tokens=4,
    actor_lr=1e-2, critic_lr=1e-2,
)  # fmt: skip


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _moved(before, module) -> bool:
    import torch

    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def _one_update(cfg):
    from sppo_rl.llm.trainer import LLMRun

    run = LLMRun(cfg)
    try:
        critic_module = run.models.critic_engine.module if run.models.critic_engine is not None else None
        actor = _weights(run.models.actor_engine.module)
        critic = _weights(critic_module) if critic_module is not None else None
        row = run.update()
        critic_moved = _moved(critic, critic_module) if critic_module is not None else None
        return row, _moved(actor, run.models.actor_engine.module), critic_moved
    finally:
        run.close()


def test_sppo_leaves_the_actor_alone_on_all_zero_rewards_and_still_trains_the_critic(tmp_path, llama):
    zero, one = _reward_file(tmp_path, 0), _reward_file(tmp_path, 1)
    row, actor_moved, critic_moved = _one_update(_cfg(tmp_path, llama, "zero", reward_fn=zero))
    assert row["reward_mean"] == 0.0 and row["rewards_all_equal"] == 1 and row["actor_skipped"] == 1
    assert not actor_moved and critic_moved
    # one success in the batch: the rewards differ, the actor takes its step
    row, actor_moved, critic_moved = _one_update(_cfg(tmp_path, llama, "one", reward_fn=one))
    assert row["reward_mean"] == 0.25 and row["rewards_all_equal"] == 0 and row["actor_skipped"] == 0
    assert actor_moved and critic_moved
    # the former behaviour, asked for: A = R - V = -V on every row moves the actor blindly
    old = _cfg(tmp_path, llama, "old", reward_fn=zero, skip_equal_rewards=False)
    row, actor_moved, _ = _one_update(old)
    assert row["actor_skipped"] == 0 and actor_moved


def test_ppo_and_remax_skip_equal_rewards_too(tmp_path, llama):
    zero = _reward_file(tmp_path, 0)
    for algo in ("ppo", "remax"):  # GAE's A = R - V and ReMax's R - R_greedy, with every R = R_greedy = 0
        row, actor_moved, critic_moved = _one_update(_cfg(tmp_path, llama, algo, algo=algo, reward_fn=zero))
        assert row["rewards_all_equal"] == 1 and row["actor_skipped"] == 1 and not actor_moved, algo
        assert critic_moved is (True if algo == "ppo" else None), algo


def test_outcomes_equal_over_valid_rows():
    import torch

    from sppo_rl.agents.learner import outcomes_equal

    R = torch.tensor([0.0, 0.0, 1.0])
    assert not outcomes_equal(R)
    assert outcomes_equal(R, torch.tensor([True, True, False]))  # the differing row is invalid
    assert outcomes_equal(torch.tensor([0.3, 0.3]))  # equal, not only zero
    assert outcomes_equal(R, torch.tensor([False, False, False]))  # nothing valid: nothing to learn


# ------------------------------------------------------------------------------- critic init


def test_init_critic_bias_is_the_logit_of_the_success_rate(tmp_path, llama):
    import torch

    from sppo_rl.agents.learner import LOCAL
    from sppo_rl.llm.build import init_critic_bias
    from sppo_rl.llm.models.critic import SequenceCritic

    critic = SequenceCritic.from_backbone(llama)
    R = torch.tensor([1.0] * 3 + [0.0] * 47)  # p0 = 3 / 50 = 0.06
    valid = torch.ones(50, dtype=torch.bool)
    assert init_critic_bias(critic, R, valid, LOCAL) == pytest.approx(0.06)
    assert float(critic.head.bias.detach()) == pytest.approx(-2.7515, abs=1e-4)  # log(0.06 / 0.94)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert float(torch.sigmoid(critic(ids, torch.ones_like(ids)))) == pytest.approx(0.06, abs=2e-3)
    # invalid rows do not count: 3 successes among 4 valid rows
    valid[4:] = False
    assert init_critic_bias(critic, R, valid, LOCAL) == pytest.approx(0.75)
    # all zero is clipped to 0.01: a finite logit, log(0.01 / 0.99) = -4.5951
    assert init_critic_bias(critic, torch.zeros(4), torch.ones(4, dtype=torch.bool), LOCAL) == 0.0
    assert float(critic.head.bias.detach()) == pytest.approx(-4.5951, abs=1e-4)


def test_sppo_starts_its_critic_at_the_first_batch_rate_with_a_model_and_resumes_exactly(tmp_path, llama):
    three = _reward_file(tmp_path, 3)
    kw = dict(reward_fn=three, prompts_per_step=50, updates=2, checkpoint_every=1)
    from sppo_rl.llm.trainer import LLMRun

    run = LLMRun(_cfg(tmp_path, llama, "init", **kw))
    try:
        row = run.update()
        bias_after_1 = float(run.models.critic_engine.module.head.bias.detach())
        run.save_checkpoint()
    finally:
        run.close()
    assert row["reward_mean"] == pytest.approx(0.06) and row["critic_init_p0"] == pytest.approx(0.06)
    assert row["v0_mean"] == pytest.approx(0.06, abs=2e-3)  # the critic's first prediction: p0, not 0.5
    assert -3.5 < bias_after_1 < -2.0  # one step from -2.7515, not from 0
    # --critic-init none (the embedded model's default under auto): the critic starts at 0.5
    row = _one_update(_cfg(tmp_path, llama, "none", critic_init="none", **kw))[0]
    assert "critic_init_p0" not in row and row["v0_mean"] == pytest.approx(0.5, abs=2e-3)
    # a resumed run does not initialise again: its critic is the checkpoint's
    resumed = LLMRun(_cfg(tmp_path, llama, "init", resume=True, **kw))
    try:
        assert resumed.state.critic_init_p0 == pytest.approx(0.06)
        assert float(resumed.models.critic_engine.module.head.bias.detach()) == bias_after_1
        row2 = resumed.update()
        assert "critic_init_p0" not in row2
    finally:
        resumed.close()


# ------------------------------------------------------------------------------- checkpoints


def _parity_reward(folder):
    """A stateless reward that varies with the response (pays an even length), so that the actor moves."""
    path = folder / "parity.py"
    path.write_text("def score(response, truth):\n    return float(len(response) % 2 == 0)\n")
    return f"{path}:score"


def _folder_bytes(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _final_actor(out):
    from safetensors.torch import load_file

    return load_file(str(next((out / "final" / "actor").glob("*.safetensors"))))


def _weight_files(out):
    """``{inode: bytes}`` of the actor's weight files in ``out``'s checkpoints and final export."""
    files = [*out.glob("checkpoints/*/actor/*.safetensors"), *(out / "final" / "actor").glob("*.safetensors")]
    return {p.stat().st_ino: p.stat().st_size for p in files}


def test_one_checkpoint_by_default_its_weights_stored_once_and_resume_is_bit_identical(tmp_path, llama):
    import torch

    from sppo_rl.llm.trainer import LLMRun, run_llm
    from sppo_rl.runtime.checkpoint import CheckpointManager
    from sppo_rl.runtime.logging import read_metrics
    from sppo_rl.runtime.run import RunError

    kw = dict(reward_fn=_parity_reward(tmp_path), checkpoint_every=1, updates=6)
    whole = _cfg(tmp_path, llama, "whole", **kw)
    run_llm(whole)
    ckpts = sorted(p.name for p in (tmp_path / "whole" / "checkpoints").iterdir())
    assert ckpts == ["ckpt-000000006"]  # 6 saves, each deleting the one before once it verified
    # the final export's weights are the checkpoint's file (a hard link), not a second copy of them
    ckpt6 = tmp_path / "whole" / "checkpoints" / "ckpt-000000006"
    final = tmp_path / "whole" / "final" / "actor" / "model.safetensors"
    assert final.samefile(ckpt6 / "actor" / "model.safetensors")
    assert len(_weight_files(tmp_path / "whole")) == 1
    critic = tmp_path / "whole" / "final" / "critic"
    assert (critic / "model.safetensors").samefile(ckpt6 / "critic" / "model.safetensors")
    assert (critic / "value_head.safetensors").samefile(ckpt6 / "critic" / "value_head.safetensors")
    for part in ("actor", "critic"):
        assert "module" not in torch.load(ckpt6 / part / "engine.pt", weights_only=True)
    # killed after the export, before summary.json: the resumed run exports again into new files
    (tmp_path / "whole" / "summary.json").unlink()
    run_llm(_cfg(tmp_path, llama, "whole", resume=True, **kw))
    assert CheckpointManager(ckpt6.parent).verify(ckpt6) and final.samefile(
        ckpt6 / "actor" / "model.safetensors"
    )
    assert (critic / "model.safetensors").samefile(ckpt6 / "critic" / "model.safetensors")
    rows = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    assert any(
        r.get("actor_skipped") == 0 for r in rows
    )  # the actor did move: the comparison means something
    # 3 updates, then resumed to 6 from the one checkpoint kept: the same weights, bit for bit
    run_llm(_cfg(tmp_path, llama, "split", **{**kw, "updates": 3}))
    assert sorted(p.name for p in (tmp_path / "split" / "checkpoints").iterdir()) == ["ckpt-000000003"]
    run_llm(_cfg(tmp_path, llama, "split", resume=True, **kw))
    a, b = _final_actor(tmp_path / "whole"), _final_actor(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with_adam = _folder_bytes(tmp_path / "whole" / "checkpoints" / "ckpt-000000006")

    # without the optimizer states: about a third of the size (weights only, Adam's two moments gone)
    lean = _cfg(tmp_path, llama, "lean", optimizer_state=False, **{**kw, "updates": 2})
    run_llm(lean)
    ckpt = tmp_path / "lean" / "checkpoints" / "ckpt-000000002"
    state = torch.load(ckpt / "actor" / "engine.pt", weights_only=True)
    assert "optimizer" not in state and (ckpt / "actor" / "model.safetensors").is_file()
    assert _folder_bytes(ckpt) < 0.45 * with_adam
    # resuming it would not be exact: refused before anything is written, unless asked for
    metrics = (tmp_path / "lean" / "metrics.jsonl").read_bytes()
    with pytest.raises(RunError, match="--resume-without-optimizer"):
        LLMRun(_cfg(tmp_path, llama, "lean", optimizer_state=False, resume=True, **{**kw, "updates": 3}))
    assert (tmp_path / "lean" / "metrics.jsonl").read_bytes() == metrics
    run_llm(
        _cfg(
            tmp_path, llama, "lean", optimizer_state=False, resume=True, resume_without_optimizer=True,
            **{**kw, "updates": 3},
        )
    )  # fmt: skip
    assert [r["update"] for r in read_metrics(tmp_path / "lean" / "metrics.jsonl") if r["update"] > 0][
        -1
    ] == 3


# ------------------------------------------------------------------------------- defaults of a named model


def test_a_named_model_brings_its_own_learning_rate_and_response_length():
    """Left unset, ``--actor-lr`` and ``--max-new-tokens`` are the named model's (smollm2-135m: 2e-5,
    32 tokens on arithmetic, 256 on a data file), and stay the tiny model's (1e-4, 16) for the embedded
    default and any model folder; set, they win. No model is loaded: the registry alone decides."""
    from sppo_rl.llm.config import default_actor_lr, default_max_new_tokens
    from sppo_rl.llm.data.scratchpad import max_new_tokens

    assert default_actor_lr("smollm2-135m") == default_actor_lr("smollm2-135m:layers=4") == 2e-5
    assert default_actor_lr(None) == default_actor_lr("/models/smollm2-135m") == 1e-4
    assert default_actor_lr("smollm2-135m:layers=x") == 1e-4  # malformed: refused later, by the model check
    assert default_max_new_tokens("arithmetic", (1,), "smollm2-135m") == 32
    assert default_max_new_tokens("data/gsm8k.parquet", (1,), "smollm2-135m") == 256
    assert default_max_new_tokens("arithmetic", (1,), None) == default_max_new_tokens("x.jsonl", (1,)) == 16
    assert default_max_new_tokens("scratchpad", (5,), "smollm2-135m") == max_new_tokens((5,)) == 234
    # the overlong buffer is checked against the length the run will have
    assert LLMConfig(model="smollm2-135m", overlong=Overlong(buffer=30)).problems() == []
    assert LLMConfig(overlong=Overlong(buffer=30)).problems() == [
        "--overlong-buffer must be >= 0 and <= --max-new-tokens, got 30"
    ]


def test_the_plan_resolves_an_unset_learning_rate_and_keeps_a_given_one(tmp_path, llama):
    from sppo_rl.llm.models.engines import launcher_dist
    from sppo_rl.llm.plan import resolve

    plan, _ = resolve(_cfg(tmp_path, llama, "lr", actor_lr=None), launcher_dist())
    assert plan.models.actor_lr == plan.given.actor_lr == 1e-4, (
        "a model folder: the tiny model's rate, saved as such"
    )
    plan, _ = resolve(_cfg(tmp_path, llama, "lr2", actor_lr=3e-6), launcher_dist())
    assert plan.models.actor_lr == 3e-6


def test_a_named_model_trains_in_token_budget_micro_batches_unless_a_micro_batch_flag_is_given():
    from sppo_rl.llm.plan import as_given

    assert as_given(LLMConfig(model="smollm2-135m")).max_tokens_per_micro_batch == 1024
    assert as_given(LLMConfig(model="smollm2-135m", micro_batch_size=4)).max_tokens_per_micro_batch is None
    assert (
        as_given(LLMConfig(model="smollm2-135m", max_tokens_per_micro_batch=300)).max_tokens_per_micro_batch
        == 300
    )
    assert as_given(LLMConfig()).max_tokens_per_micro_batch is None  # the tiny model: whole minibatches
    given = as_given(LLMConfig(model="smollm2-135m"))
    assert (given.actor_lr, given.max_new_tokens) == (2e-5, 32)


def test_a_named_model_brings_its_small_critic_to_a_method_that_trains_one():
    """SPPO and PPO without --critic-model get the model's first 4 layers as critic (recorded in
    config.json's settings); a group method gets none; a given critic (the full model included) wins;
    a model folder or the tiny model keeps the actor as critic (critic_model unset)."""
    from sppo_rl.llm.plan import as_given

    for algo in ("sppo", "ppo", "sppo-seq"):
        assert as_given(LLMConfig(model="smollm2-135m", algo=algo)).critic_model == "smollm2-135m:layers=4"
    assert as_given(LLMConfig(model="smollm2-135m", algo="grpo")).critic_model is None
    full = LLMConfig(model="smollm2-135m", algo="sppo", critic_model="smollm2-135m")
    assert as_given(full).critic_model == "smollm2-135m"
    assert as_given(LLMConfig(algo="sppo")).critic_model is None


def test_a_named_model_on_arithmetic_is_asked_for_the_number_and_paid_for_it():
    """An instruct model writes '59 + 63 = 122', never the tiny model's box: on the generated arithmetic
    task a named model gets "Answer with just the number." and, for --reward-fn auto, the lenient
    reward; whatever the user sets wins, data files keep auto's strict choice."""
    from sppo_rl.llm.plan import as_given

    given = as_given(LLMConfig(model="smollm2-135m"))
    assert (given.instruction, given.reward_fn) == ("Answer with just the number.", "boxed-or-last-number")
    mine = as_given(LLMConfig(model="smollm2-135m", instruction="Be brief.", reward_fn="integer"))
    assert (mine.instruction, mine.reward_fn) == ("Be brief.", "integer")
    data = as_given(LLMConfig(model="smollm2-135m", task="gsm8k.parquet"))
    assert (data.instruction, data.reward_fn) == (None, "auto")
    tiny = as_given(LLMConfig())
    assert (tiny.instruction, tiny.reward_fn) == (None, "auto")


def test_a_named_model_words_arithmetic_prompts_as_questions_unless_told_otherwise():
    """Unset, --arithmetic-prompt is the named model's ('question') and 'equation' otherwise; a given
    form wins; on any task but arithmetic it stays unset, and setting it there is refused."""
    from sppo_rl.llm.plan import as_given

    assert as_given(LLMConfig(model="smollm2-135m")).arithmetic_prompt == "question"
    assert as_given(LLMConfig(model="smollm2-135m", arithmetic_prompt="equation")).arithmetic_prompt == (
        "equation"
    )
    assert as_given(LLMConfig()).arithmetic_prompt == "equation"  # the tiny model learned on '41+74='
    assert as_given(LLMConfig(arithmetic_prompt="question")).arithmetic_prompt == "question"
    assert as_given(LLMConfig(model="smollm2-135m", task="gsm8k.parquet")).arithmetic_prompt is None
    assert LLMConfig(task="scratchpad", arithmetic_prompt="question").problems() == [
        "--arithmetic-prompt must be left unset unless --task arithmetic, got 'question'"
    ]


@pytest.mark.parametrize(
    "equation, question",
    [
        ("41+74=", "What is 41 + 74?"),
        ("9-3=", "What is 9 - 3?"),
        ("12*7+5=", "What is 12 * 7 + 5?"),
        ("0-0-0=", "What is 0 - 0 - 0?"),
    ],
)
def test_as_question_spaces_every_operator(equation, question):
    from sppo_rl.llm.data.arithmetic import as_question

    assert as_question(equation) == question


def test_question_prompts_keep_the_splits_and_answers_of_the_equations(tmp_path):
    """load_task with 'question' gives the same examples as 'equation', prompt for prompt in words
    (answers, levels, order unchanged), still disjoint between splits and free of duplicates, on every
    level."""
    from sppo_rl.llm.data.arithmetic import as_question
    from sppo_rl.llm.data.tasks import load_task

    base = dict(task="arithmetic", level=(1, 2, 3, 4), train_size=300, val_size=60)
    eq_train, eq_val, fn = load_task(LLMConfig(**base, arithmetic_prompt="equation"))
    q_train, q_val, q_fn = load_task(LLMConfig(**base, arithmetic_prompt="question"))
    assert fn == q_fn
    for eq, q in ((eq_train, q_train), (eq_val, q_val)):
        assert [as_question(e.prompt) for e in eq] == [e.prompt for e in q]
        assert [(e.answer, e.meta) for e in eq] == [(e.answer, e.meta) for e in q]
        assert all(e.prompt.startswith("What is ") and e.prompt.endswith("?") for e in q)
    prompts = [e.prompt for e in q_train + q_val]
    assert len(set(prompts)) == len(prompts), "as_question must stay one-to-one"
    assert any("-" in p for p in prompts) and any("*" in p for p in prompts)
