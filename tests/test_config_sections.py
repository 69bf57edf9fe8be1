"""Config sections: each prefix family of settings (``lora_*``, ``vllm_*``, ``latent_*``, ``overlong_*``,
``sft_*``, ``wandb*``) is one nested dataclass (``cfg.lora.rank``), while the flags (``--lora-rank``), the
keys of ``config.json`` and of recipes (``lora_rank``) and the Python API's keywords stay flat, so runs
and recipes written before the sections existed still load and resume."""

from __future__ import annotations

import json

import pytest

from sppo_rl.cli import main, resume_defaults
from sppo_rl.config import WandB, flat_dict, flat_keys, from_flat, get_flat, replace_flat
from sppo_rl.control.config import ControlConfig
from sppo_rl.llm.config import SFT, VLLM, Latent, LLMConfig, LoRA, Overlong
from sppo_rl.runtime.flags import parse
from sppo_rl.runtime.logging import read_metrics

SECTION_FLAGS = [
    "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q_proj", "v_proj", "--lora-dropout", "0.1",
    "--vllm-max-model-len", "256", "--vllm-gpu-memory-utilization", "0.5", "--vllm-sleep",
    "--latent-steps", "2", "--latent-topk", "3", "--latent-gumbel-temperature", "0.5",
    "--latent-noise-scale", "0.7", "--latent-one-sided", "True", "--latent-mask-invalid", "False", "--latent-first-token", "True",
    "--latent-sft-steps", "9", "--overlong-filter", "--overlong-buffer", "2", "--overlong-penalty", "0.5",
    "--sft-steps", "7", "--sft-lr", "0.01", "--sft-target", "0.6",
    "--wandb", "--wandb-project", "p", "--wandb-entity", "e", "--wandb-group", "g", "--wandb-tags", "a", "b",
]  # fmt: skip

SECTIONS = dict(
    lora=LoRA(rank=4, alpha=8.0, targets=("q_proj", "v_proj"), dropout=0.1),
    vllm=VLLM(max_model_len=256, gpu_memory_utilization=0.5, sleep=True),
    latent=Latent(
        steps=2, topk=3, gumbel_temperature=0.5, noise_scale=0.7, one_sided=True, mask_invalid=False,
        first_token=True, sft_steps=9,
    ),
    overlong=Overlong(filter=True, buffer=2, penalty=0.5),
    sft=SFT(steps=7, lr=0.01, target=0.6),
    wandb=WandB(enabled=True, project="p", entity="e", group="g", tags=("a", "b")),
)  # fmt: skip


def test_every_section_setting_keeps_its_flat_flag_and_lands_in_its_section():
    cfg = parse(LLMConfig, SECTION_FLAGS)
    assert type(cfg) is LLMConfig and type(cfg.lora) is LoRA  # not tyro's parsing view
    assert cfg == LLMConfig(**SECTIONS)
    # tyro's own spelling of a nested flag is not a second way to say it
    with pytest.raises(SystemExit) as e:
        parse(LLMConfig, ["--lora.rank", "4"])
    assert e.value.code == 2


def test_config_json_stays_one_flat_key_per_flag_and_round_trips():
    cfg = LLMConfig(algo="grpo", **SECTIONS)
    flat = flat_dict(cfg)
    assert flat["lora_rank"] == 4 and flat["wandb"] is True and flat["wandb_tags"] == ("a", "b")
    assert flat["latent_sft_steps"] == 9 and flat["sft_steps"] == 7 and flat["overlong_filter"] is True
    assert not any(isinstance(v, dict) and k in SECTIONS for k, v in flat.items()), "no nested objects"
    assert from_flat(LLMConfig, flat) == cfg
    assert get_flat(cfg, "vllm_sleep") is True
    changed = replace_flat(cfg, lora_rank=8, wandb_group="h", updates=3)
    assert (changed.lora.rank, changed.lora.alpha, changed.wandb.group, changed.updates) == (8, 8.0, "h", 3)
    assert cfg.lora.rank == 4, "replace_flat copies, it does not change the config it is given"
    with pytest.raises(TypeError, match="lora_rnk"):
        from_flat(LLMConfig, {"lora_rnk": 2})
    # the control world has the wandb section too, with the same keys
    assert {"wandb", "wandb_mode", "wandb_tags"} <= set(flat_keys(ControlConfig))


def test_a_bad_section_value_is_refused_by_its_flag():
    assert LLMConfig(lora=LoRA(rank=-1)).problems() == ["--lora-rank must be >= 0 (0: off), got -1"]
    assert LLMConfig(latent=Latent(topk=0), sft=SFT(lr=0.0)).problems() == [
        "--sft-lr must be > 0, got 0.0",
        "--latent-topk must be >= 1, got 0",
    ]
    assert "--overlong-buffer must be >= 0 and <= --max-new-tokens" in " ".join(
        LLMConfig(max_new_tokens=4, overlong=Overlong(buffer=5)).problems()
    )
    broken = LLMConfig()
    broken.lora = 3  # a section replaced by something else: one line per setting, not a crash
    problems = broken.problems()
    assert len(problems) == 4 and all("in a LoRA section, got 3" in p for p in problems), problems


OLD_CONFIG = {  # keys as config.json held them before the sections (a subset; the rest take defaults)
    "task": "arithmetic", "algo": "sppo", "seed": 3, "updates": 2, "lora_rank": 2, "lora_alpha": 4.0,
    "lora_targets": ["q_proj", "v_proj"], "overlong_filter": True, "sft_steps": 5, "latent_topk": 7,
    "vllm_sleep": True, "wandb": False, "wandb_group": "old", "wandb_tags": ["t"],
    "resolved": {"group_size": 1},
}  # fmt: skip


def test_an_old_flat_config_json_gives_the_sections_on_resume(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(OLD_CONFIG))
    cfg = resume_defaults(LLMConfig, ["--out-dir", str(out)])
    assert (cfg.seed, cfg.lora, cfg.overlong.filter, cfg.sft.steps, cfg.latent.topk, cfg.vllm.sleep) == (
        3,
        LoRA(rank=2, alpha=4.0, targets=("q_proj", "v_proj")),
        True,
        5,
        7,
        True,
    )
    assert (cfg.wandb.enabled, cfg.wandb.group, cfg.wandb.tags) == (False, "old", ("t",))


def test_a_recipe_with_flat_section_keys_loads_and_a_misspelt_one_is_refused(tmp_path):
    from sppo_rl.runtime.recipes import load_recipe
    from sppo_rl.runtime.run import RunError

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"lora_rank": 8, "vllm_gpu_memory_utilization": 0.7, "overlong_buffer": 4}))
    cfg = load_recipe(LLMConfig, file=good)
    assert (cfg.lora.rank, cfg.vllm.gpu_memory_utilization, cfg.overlong.buffer) == (8, 0.7, 4)
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "lora_rank": 8,\n  "lora_rnk": 4\n}\n')
    with pytest.raises(RunError, match="unknown field.*lora_rnk"):
        load_recipe(LLMConfig, file=bad)
    worse = tmp_path / "worse.json"
    worse.write_text('{\n  "updates": 2,\n  "lora_dropout": 1.5\n}\n')
    with pytest.raises(RunError, match=r"worse.json:3: lora_dropout must be in \[0, 1\), got 1.5"):
        load_recipe(LLMConfig, file=worse)


def test_a_run_with_section_flags_saves_them_flat_and_resumes_from_them(tmp_path, tiny, capsys):
    """A 1-update LoRA + overlong-filter run, stopped before its end, resumes from its config.json alone
    (`--resume --updates 2`): the sections come back from the flat keys and the run goes on."""
    out = tmp_path / "run"
    common = ["--model", str(tiny), "--task", "arithmetic", "--algo", "grpo", "--group-size", "2"]
    common += ["--prompts-per-step", "2", "--train-size", "16", "--val-size", "2", "--eval-samples", "1"]
    common += ["--max-new-tokens", "4", "--no-progress", "--no-tensorboard", "--out-dir", str(out)]
    main(
        [
            "llm",
            *common,
            "--updates",
            "1",
            "--lora-rank",
            "2",
            "--lora-targets",
            "q_proj",
            "--overlong-filter",
        ]
    )
    saved = json.loads((out / "config.json").read_text())
    assert (saved["lora_rank"], saved["lora_targets"], saved["overlong_filter"]) == (2, ["q_proj"], True)
    assert "lora" not in saved and "overlong" not in saved
    (out / "summary.json").unlink()  # as if stopped before its end
    main(["llm", "--out-dir", str(out), "--resume", "--updates", "2"])
    saved = json.loads((out / "config.json").read_text())
    assert (saved["lora_rank"], saved["lora_targets"], saved["overlong_filter"], saved["updates"]) == (
        2,
        ["q_proj"],
        True,
        2,
    )
    assert [r["update"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2], (
        "update 2 appended after 1"
    )
