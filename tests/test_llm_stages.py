"""The LLM update's stages on hand-made inputs: the data order, the per-prompt seeds, the named sums of the
metrics row, DAPO's counts, the groups ``pick`` lays out, and ``resolve`` leaving the user's config alone."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sppo_rl.llm.rollout.base import RolloutBatch
from sppo_rl.llm.stages.collect import Collected, PromptOrder, Round, prompt_seeds
from sppo_rl.llm.stages.row import StageTimer, dynamic_sampling_row, reward_fn_row, update_row, update_sums
from sppo_rl.llm.stages.to_batch import pick


class OneRank:
    world, rank, main = 1, 0, True

    def all_sum(self, values, device="cpu"):
        return list(values)


def _rb(lengths: list[int], finished: list[bool], T: int = 4, P: int = 2) -> RolloutBatch:
    B = len(lengths)
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    return RolloutBatch(
        prompt_ids=torch.ones(B, P, dtype=torch.long),
        prompt_mask=torch.ones(B, P, dtype=torch.long),
        response_ids=torch.arange(B * T).view(B, T) * mask,
        response_mask=mask,
        logprobs=torch.zeros(B, T),
        sampling_logprobs=torch.zeros(B, T),
        texts=[f"r{i}" for i in range(B)],
        prompt_index=torch.arange(B) // 2,
        finished=torch.tensor(finished),
        num_generated_tokens=int(mask.sum()),
    )


def _round(
    R: list[float], valid: list[bool], lengths: list[int], finished: list[bool], errors: int = 0
) -> Round:
    return Round(
        examples=[None] * (len(R) // 2),
        rb=_rb(lengths, finished),
        greedy=None,
        R=torch.tensor(R),
        valid=torch.tensor(valid),
        baseline=None,
        baseline_valid=None,
        errors=errors,
    )


def test_prompt_order_is_a_seeded_shuffle_drawn_from_its_end_epoch_after_epoch():
    order = PromptOrder(5, seed=7)
    first = order.draw(3)
    rng = random.Random(7)
    want = list(range(5))
    rng.shuffle(want)
    assert first == want[::-1][:3]  # popped from the end
    state = order.state()
    rest = order.draw(4)  # the 2 left of epoch 1, then a new shuffle
    assert rest[:2] == want[::-1][3:] and sorted(rest[2:] + order.order) == list(range(5))
    order.load(state)
    assert order.draw(4) == rest  # a rolled-back update draws the same prompts again


def test_prompt_seeds_depend_on_the_position_not_the_rank():
    # (seed * 1_000_003 + base) * 65_537 + i
    assert prompt_seeds(2, 5, [0, 3]) == [(2 * 1_000_003 + 5) * 65_537, (2 * 1_000_003 + 5) * 65_537 + 3]
    assert prompt_seeds(2, 5, [3]) == prompt_seeds(2, 5, [0, 3])[1:]
    assert prompt_seeds(2, -1, [0]) != prompt_seeds(2, -2, [0])  # validation and the trace differ


def test_update_sums_and_row_are_the_hand_counts():
    # round 0: 4 rows, R = [1, 0, 1, 0], the last invalid; round 1 (dynamic sampling): 2 rows, both valid
    r0 = _round(
        [1.0, 0.0, 1.0, 0.0], [True, True, True, False], [2, 4, 1, 3], [True, False, True, True], errors=1
    )
    r1 = _round([1.0, 1.0], [True, True], [1, 1], [True, True])
    r0.kinds, r1.kinds = torch.tensor([0, 0]), torch.tensor([1])  # mixed, mixed | all correct
    mask = torch.ones(2, 4)
    kl = torch.full((2, 4), 0.25)
    tot = update_sums([r0, r1], 2, mask, kl, True, OneRank(), "cpu")
    assert tot["reward"] == 4.0 and tot["valid"] == 5.0 and tot["rows"] == 6.0 and tot["invalid"] == 1.0
    assert tot["response_tokens"] == 12.0 and tot["generated"] == 12.0 and tot["cut"] == 1.0
    assert tot["errors"] == 1.0 and tot["kl"] == 2.0 and tot["kl_tokens"] == 8.0
    assert (tot["kind/mixed"], tot["kind/all_correct"], tot["kind/all_wrong"]) == (2.0, 1.0, 0.0)
    timer = StageTimer()
    timer.seconds = {"gen": 2.0, "score": 0.5, "train": 1.0, "sync": 0.0}
    totals = {"generated_tokens": 100, "wall_time_s": 9.0, "step_time_s": 3.5}
    row = update_row(3, tot, timer, totals, {"learning_rate": 1e-4})
    assert row["reward_mean"] == pytest.approx(4 / 5)  # valid rows only
    assert row["response_length"] == pytest.approx(12 / 6) and row["response_clip_frac"] == pytest.approx(
        1 / 6
    )
    assert row["gen_tokens_per_s"] == pytest.approx(12 / 2.0) and row["invalid_rollouts"] == 1
    assert row["update"] == 3 and row["generated_tokens"] == 100 and row["learning_rate"] == 1e-4
    ds = dynamic_sampling_row(tot, rounds=2, prompts_per_step=3)
    assert ds["dynamic_sampling/groups_sampled"] == 3 and ds["dynamic_sampling/groups_kept"] == 2
    assert ds["dynamic_sampling/short"] == 1 and ds["dynamic_sampling/extra_rounds"] == 1
    assert ds["dynamic_sampling/dropped_all_correct"] == 1 and ds["dynamic_sampling/surplus"] == 0


def test_reward_fn_row_means_each_function_over_its_valid_scores():
    fn = np.array([[1.5, 3.0, 0.0], [0.0, 2.0, 1.0]])  # sum, valid count, failures per function
    row = reward_fn_row(["math", "fmt.py:tags"], fn, OneRank(), "cpu")
    assert row == {
        "rewards/math": 0.5,
        "reward_errors/math": 0,
        "rewards/fmt.py:tags": 0.0,
        "reward_errors/fmt.py:tags": 1,
    }
    assert reward_fn_row(["math"], fn[:1], OneRank(), "cpu") == {}


def test_pick_lays_out_kept_groups_of_several_rounds_and_invalidates_the_filler():
    r0 = _round([1.0, 0.0, 1.0, 1.0], [True] * 4, [2, 4, 1, 1], [True] * 4)
    r1 = _round([0.0, 1.0, 0.0, 0.0], [True] * 4, [3, 3, 2, 2], [True] * 4)
    r0.kinds, r1.kinds = torch.tensor([0, 1]), torch.tensor([0, 2])
    # keep: round 1's group 0 (mixed), then round 0's group 1 (all correct) as filler
    got = Collected([r0, r1], [(1, 0), (0, 1)])
    p = pick(got, G=2, pad_id=0, dynamic=True, latent=None)
    assert p.R.tolist() == [0.0, 1.0, 1.0, 1.0] and p.informative == 1
    assert p.valid.tolist() == [True, True, False, False]  # the filler group gets no loss
    assert p.rb.prompt_index.tolist() == [0, 0, 1, 1] and p.rb.texts == ["r0", "r1", "r2", "r3"]
    assert p.rb.response_mask.shape[1] == 3  # cut to the longest kept response
    same = pick(Collected([r0], [(0, 0), (0, 1)]), G=2, pad_id=0, dynamic=False, latent=None)
    assert same.rb is r0.rb and same.informative == 0  # one round, all of it: the batch as it came


def test_resolve_leaves_the_users_config_alone_and_fills_the_methods_defaults(tmp_path):
    from sppo_rl.llm.config import LLMConfig
    from sppo_rl.llm.plan import resolve

    cfg = LLMConfig(algo="gspo", group_size=4, prompts_per_step=4, out_dir=str(tmp_path / "run"))
    plan, task = resolve(cfg, OneRank())
    assert cfg.max_new_tokens is None and cfg.clip is None  # as given
    assert plan.given.max_new_tokens == 16 and plan.rollout.max_new_tokens == 16  # arithmetic's default
    assert plan.learner.clip == pytest.approx(3e-4)  # GSPO's own clip range
    assert (
        plan.unset["clip"] == pytest.approx(3e-4)
        and plan.rollout.local_prompts == 4
        and plan.rows_per_step == 16
    )
    assert task.train and not (tmp_path / "run").exists()  # nothing written
    from sppo_rl.llm.models.sources import default_cache_dir
    from sppo_rl.runtime.plan import RunPlan

    # the plan shape both worlds share, and the LLM world's sections: resolved once
    assert isinstance(plan, RunPlan) and plan.loop.updates == cfg.updates and plan.loop.seed == cfg.seed
    assert plan.rollout.max_new_tokens == 16 and plan.rollout.group_size == plan.group_size == 4
    assert plan.models.cache == default_cache_dir() and plan.update.kl_in == "loss"
    assert plan.data.prompt_format.instruction == plan.given.instruction
    assert not hasattr(plan, "cfg")  # the sections own every setting


def test_spo_order_draws_distinct_prompts_by_the_trackers_uncertainty_and_restores():
    """``w = sqrt(p (1 - p)) + 0.05``: a prompt the tracker is sure of (weight 0.05) is the first drawn
    with probability 0.05 / (0.05 + 3 * 0.55) = 0.029; each unseen one with 0.324."""
    from sppo_rl.llm.stages.spo import SpoOrder

    order = SpoOrder(4, seed=0)
    order.tracker.alpha[0], order.tracker.beta[0] = 1e9, 0.0
    first = [order.draw(1)[0] for _ in range(4000)]
    assert 60 <= first.count(0) <= 180 and all(1000 <= first.count(c) <= 1600 for c in (1, 2, 3))
    assert sorted(order.draw(4)) == [0, 1, 2, 3]
    state = order.state()
    again = SpoOrder(4, seed=1)
    again.load(state)
    assert again.draw(3) == order.draw(3) and again.tracker == order.tracker


def test_vstar_order_draws_as_the_data_order_and_gives_each_row_its_prompts_v_star():
    """A*-PO's table rides on the plain data order (the same draw as :class:`PromptOrder` of the same
    seed), is restored with it, and each row of an update gets the ``V*`` of the prompt it answers
    (rows ``[0, 0, 1, 1]`` of drawn prompts ``[5, 2]``: ``V*_5, V*_5, V*_2, V*_2``)."""
    from sppo_rl.agents.batch import SequenceBatch
    from sppo_rl.llm.stages.collect import PromptOrder
    from sppo_rl.llm.stages.to_batch import UpdateBatch
    from sppo_rl.llm.stages.vstar import VStarOrder, optimal_values

    order, plain = VStarOrder(8, seed=3), PromptOrder(8, seed=3)
    order.v_star = [0.1 * i for i in range(8)]
    assert order.draw(2) == plain.draw(2) == order.drawn
    rb = _rb([2, 1, 3, 2], [True] * 4)
    batch = SequenceBatch(mask=rb.response_mask.float(), logp_old=None, rewards=torch.ones(4))
    prepared = UpdateBatch(batch, rb, rb.response_lengths, rb.response_lengths, torch.zeros(4), None, None)
    got = optimal_values(order, prepared)
    a, b = order.drawn
    assert batch.optimal_values.tolist() == pytest.approx([0.1 * a, 0.1 * a, 0.1 * b, 0.1 * b])
    assert got["astar_v_star"] == pytest.approx(0.1 * (a + b) / 2)
    again = VStarOrder(8, seed=0)
    again.load(order.state())
    assert again.v_star == order.v_star and again.draw(3) == order.draw(3)
