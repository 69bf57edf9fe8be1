"""LoRA (``--lora-rank``): what trains, the merged weights, the adapter-off reference, checkpoints, exports.

DeepSpeed ZeRO-2/3 with LoRA is in ``test_deepspeed.py``, the partial vLLM sync in ``test_vllm.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from configs import grpo_pairs_config, llm_config  # noqa: E402

from sppo_rl.llm.config import LLMConfig  # noqa: E402
from sppo_rl.llm.models.core import load_actor, sequence_logprobs
from sppo_rl.llm.models.critic import SequenceCritic
from sppo_rl.llm.models.engines import HFTorchEngine  # noqa: E402
from sppo_rl.llm.models.lora import (
    BaseModelView,
    apply_lora,
    check_lora_targets_of,
    linear_module_names,
    lora_layers,
    merged_state_items,
    merged_weight,
)
from sppo_rl.llm.trainer import LLMRun, run_llm  # noqa: E402
from sppo_rl.runtime.logging import read_metrics  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 0, 12, 13, 14, 15, 16]])
MASK = (IDS != 0).long()


def _lora_actor(tiny: Path, rank: int = 4, alpha: float = 8.0, targets=TARGETS, seed: int = 0):
    return apply_lora(load_actor(tiny, dtype=torch.float32), rank, alpha, targets, seed=seed)


def _perturb_b(model, std: float = 0.1, seed: int = 1) -> None:
    """B starts at 0 (the adapter adds nothing); give it values so the adapter matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


_cfg = partial(
    llm_config,
    algo="sppo",
    temperature=2.0,
    actor_lr=1e-2,
    lora_rank=4,
    skip_equal_rewards=False,  # the untrained model may score all 0; these tests need the adapters to move
)


# ------------------------------------------------------------------------------------ the adapters


def test_only_adapters_train_and_the_wrapped_model_starts_as_the_base(tiny):
    base = load_actor(tiny, dtype=torch.float32).eval()
    model = _lora_actor(tiny).eval()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    # one A and one B per wrapped module: 7 projections in the tiny model's one layer
    assert len(trainable) == 2 * 7 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    a, _ = sequence_logprobs(base, IDS, MASK, 3)
    b, _ = sequence_logprobs(model, IDS, MASK, 3)
    assert torch.equal(a, b), "B = 0 at the start: the adapters add exactly nothing"


def test_merged_weight_is_w_plus_alpha_over_r_b_a(tiny):
    """A = 0.1, B = 0.2 everywhere, r = 2, alpha = 4: each weight gains (4 / 2) * (2 * 0.2 * 0.1) = 0.08."""
    model = _lora_actor(tiny, rank=2, alpha=4.0, targets=("q_proj",))
    ((name, layer),) = lora_layers(model).items()
    with torch.no_grad():
        layer.lora_A["default"].weight.fill_(0.1)
        layer.lora_B["default"].weight.fill_(0.2)
    W = layer.get_base_layer().weight.detach().clone()
    assert torch.allclose(merged_weight(layer), W + 0.08, atol=1e-7)
    items = dict(merged_state_items(model))
    assert torch.allclose(items[f"{name}.weight"], W + 0.08, atol=1e-7)
    assert torch.equal(items[f"{name}.bias"], layer.get_base_layer().bias)  # the bias is not adapted
    assert not any("lora_" in k or "base_layer" in k for k in items)
    assert set(items) == set(load_file(tiny / "model.safetensors")), "the base model's names"
    layer.merge()  # peft's own merge of the adapter into the base weight agrees
    assert torch.allclose(layer.get_base_layer().weight, W + 0.08, atol=1e-7)


def test_merged_weights_compute_what_the_adapted_model_computes(tiny):
    model = _lora_actor(tiny).eval()
    _perturb_b(model)
    plain = load_actor(tiny, dtype=torch.float32).eval()
    items = dict(merged_state_items(model))
    plain.load_state_dict(items, strict=False)  # (the tied lm_head.weight is the embedding's)
    with torch.no_grad():
        a, _ = sequence_logprobs(model, IDS, MASK, 4)
        b, _ = sequence_logprobs(plain, IDS, MASK, 4)
        base, _ = sequence_logprobs(load_actor(tiny, dtype=torch.float32).eval(), IDS, MASK, 4)
    assert float((a - b).abs().max()) < 1e-5
    assert float((a - base).abs().max()) > 1e-3, "the perturbed adapters change the model"
    only = dict(merged_state_items(model, only_adapted=True))
    qkv = [
        f"model.layers.0.self_attn.{m}.{s}"
        for m in ("q_proj", "k_proj", "v_proj")
        for s in ("weight", "bias")
    ]
    rest = ["model.layers.0.self_attn.o_proj.weight"]
    rest += [f"model.layers.0.mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")]
    assert set(only) == set(qkv + rest), "the wrapped modules' weights and biases, nothing else"
    assert all(torch.equal(only[k], items[k]) for k in only)


def test_base_model_view_is_the_base_and_leaves_the_actor_alone(tiny):
    base = load_actor(tiny, dtype=torch.float32).eval()
    model = _lora_actor(tiny)
    _perturb_b(model)
    model.train()
    view = BaseModelView(model)
    view.eval().requires_grad_(False)  # what a caller may do to a reference model
    assert model.training, "the view's eval() must not reach the actor"
    assert [n for n, p in model.named_parameters() if p.requires_grad], "nor its requires_grad_"
    assert list(view.parameters()) == [], "no second copy of the weights"
    model.eval()
    with torch.no_grad():
        ref, _ = sequence_logprobs(view, IDS, MASK, 4)
        want, _ = sequence_logprobs(base, IDS, MASK, 4)
        actor, _ = sequence_logprobs(model, IDS, MASK, 4)
    assert torch.equal(ref, want)
    assert float((actor - want).abs().max()) > 1e-3
    after, _ = sequence_logprobs(model, IDS, MASK, 4)
    assert torch.equal(after, actor), "the adapters are back on after the reference pass"


def test_only_adapter_and_value_head_get_gradients_and_optimizer_state(tiny):
    critic = SequenceCritic.from_backbone(tiny, dtype=torch.float32)
    apply_lora(critic.backbone, 4, 8.0, TARGETS, seed=1)
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias"} <= trainable
    assert all(n.startswith("head.") or ".lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    engine = HFTorchEngine(critic, lr=1e-2)
    logits = critic(IDS, MASK)
    engine.backward(torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([1.0, 0.0])))
    grads = {n for n, p in critic.named_parameters() if p.grad is not None}
    assert grads == trainable
    engine.step()
    params = dict(critic.named_parameters())
    assert {id(p) for p in engine.optimizer.state} == {id(params[n]) for n in trainable}
    changed = {n for n, p in critic.named_parameters() if not torch.equal(p, before[n])}
    # step 1: B = 0 gives A no gradient, so A stays; B and the head move; the base does not
    assert changed and all(n.startswith("head.") or ".lora_B." in n for n in changed)


# ------------------------------------------------------------------------------------ bad input


def test_unknown_target_is_refused_in_one_line_naming_the_linear_modules(tiny, tmp_path):
    model = load_actor(tiny, dtype=torch.float32)
    assert linear_module_names(model) == sorted(TARGETS)  # lm_head is left out: it is tied
    with pytest.raises(ValueError, match="qproj: .*its linear modules: down_proj,gate_proj,k_proj"):
        apply_lora(model, 4, 8.0, ("q_proj", "qproj"))
    check_lora_targets_of(TARGETS, tiny, None)  # the actor, and the critic on the same backbone
    from transformers import GPTNeoXConfig  # a critic backbone of another architecture (config only)

    GPTNeoXConfig(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    ).save_pretrained(tmp_path / "neox")
    with pytest.raises(ValueError, match=r"q_proj: no linear module of the critic .*query_key_value"):
        check_lora_targets_of(("q_proj",), tiny, tmp_path / "neox")
    check_lora_targets_of(("q_proj",), tiny, False)  # no critic: nothing to check there


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--lora-rank", "4", "--lora-targets", "q_proj", "c_attn"], "c_attn: no linear module of the actor"),
        # the values' checks without a process: test_config_sections (LoRA's problems, a recipe's lora_dropout)
        pytest.param(["--lora-rank", "-1"], "lora_rank", marks=pytest.mark.slow),
        pytest.param(["--lora-rank", "4", "--lora-dropout", "1.5"], "lora_dropout", marks=pytest.mark.slow),
    ],
)
def test_cli_refuses_bad_lora_flags_before_the_run_folder(tiny, tmp_path, flags, message):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sppo_rl", "llm", "--model", str(tiny), "--out-dir", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("sppo-rl: error")]
    assert len(lines) == 1 and message.replace("_", "-") in lines[0].replace("_", "-"), proc.stderr[-2000:]
    assert not out.exists()


# ------------------------------------------------------------------------------------ the trainer


def test_kl_reference_is_the_base_model_with_the_adapters_off(tiny, tmp_path):
    """KL in the loss against the reference: at the first update the actor IS the base (B = 0), so the
    logged KL is exactly 0; after it the adapters have moved and it is positive. No second model."""
    cfg = _cfg(tmp_path, tiny, kl_coef=0.5, kl_in="loss", eval_every=0)
    run = LLMRun(cfg)
    try:
        assert (
            isinstance(run.models.ref, BaseModelView)
            and run.models.ref.module is run.models.actor_engine.module
        )
        first, second = run.update(), run.update()
    finally:
        run.close()
    assert first["kl"] == 0.0
    assert second["kl"] > 0.0


def test_checkpoint_holds_the_adapters_and_the_resume_is_exact(tiny, tmp_path):
    full = _cfg(tmp_path / "full", tiny, updates=4, checkpoint_every=2)
    run_llm(full)
    part = _cfg(tmp_path / "part", tiny, updates=2, checkpoint_every=2)
    run_llm(part)
    ckpt = tmp_path / "part" / "run" / "checkpoints" / "ckpt-000000002"
    actor = torch.load(ckpt / "actor" / "engine.pt", weights_only=False)
    assert actor["trainable_only"] and set(actor["module"]) == {
        n for n in actor["module"] if ".lora_A." in n or ".lora_B." in n
    }
    critic = torch.load(ckpt / "critic" / "engine.pt", weights_only=False)
    assert {"head.weight", "head.bias"} <= set(critic["module"])
    assert all(n.startswith("head.") or ".lora_" in n for n in critic["module"])
    run_llm(replace(part, updates=4, resume=True))
    a = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "part" / "run" / "metrics.jsonl")
    timing = {k for k in a[-1] if k.startswith("time_") or k.endswith("_s") or "per_s" in k or "memory" in k}
    assert [r["update"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k not in timing} == {
            k: v for k, v in rb.items() if k not in timing
        }, ra["update"]
    for folder in ("actor", "critic"):
        name = "model.safetensors"
        fa = load_file(tmp_path / "full" / "run" / "final" / folder / name)
        fb = load_file(tmp_path / "part" / "run" / "final" / folder / name)
        assert all(torch.equal(fa[k], fb[k]) for k in fa), folder


def test_final_actor_is_a_merged_plain_folder_loadable_without_peft(tiny, tmp_path):
    cfg = _cfg(tmp_path, tiny, updates=2, eval_every=0)
    run = LLMRun(cfg)
    try:
        run.run()
        run.models.actor.eval()
        with torch.no_grad():
            want, _ = sequence_logprobs(run.models.actor, IDS, MASK, 4)
    finally:
        run.close()
    folder = tmp_path / "run" / "final" / "actor"
    assert not (folder / "adapter_config.json").exists()
    weights = load_file(folder / "model.safetensors")
    assert set(weights) == set(load_file(tiny / "model.safetensors"))
    init = load_file(tiny / "model.safetensors")
    changed = {k for k in weights if not torch.equal(weights[k], init[k])}
    assert changed and all(k.rsplit(".", 2)[-2] in TARGETS for k in changed), changed
    probe = (
        "import sys, torch; sys.modules['peft'] = None\n"  # any import of peft now fails
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(folder)!r}, local_files_only=True).eval()\n"
        f"ids = torch.tensor({IDS.tolist()})\n"
        "from sppo_rl.llm.models.core import sequence_logprobs\n"
        "lp, _ = sequence_logprobs(m, ids, (ids != 0).long(), 4)\n"
        "print(lp.tolist())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.tensor(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert float((got - want).abs().max()) < 1e-5
    critic = SequenceCritic.from_pretrained(tmp_path / "run" / "final" / "critic")
    assert not lora_layers(critic)


def test_resume_refuses_a_checkpoint_written_without_lora(tiny, tmp_path):
    model = load_actor(tiny, dtype=torch.float32)
    HFTorchEngine(model, lr=1e-3).save(tmp_path / "plain")
    lora = HFTorchEngine(_lora_actor(tiny), lr=1e-3)
    with pytest.raises(RuntimeError, match="written without LoRA, loaded with it"):
        lora.load(tmp_path / "plain")


# ------------------------------------------------------------------------------------- LoRA


def test_all_linear_wraps_every_linear_module_but_the_head(tiny):
    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.lora import apply_lora, lora_layers

    model = apply_lora(load_actor(tiny, dtype="float32"), 2, 4.0, ("all-linear",), seed=0)
    names = {n.rsplit(".", 1)[-1] for n in lora_layers(model)}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert "lm_head" not in {n for n in lora_layers(model)}


def test_gpt2_conv1d_layers_take_lora_and_merge_exactly():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from sppo_rl.llm.models.lora import apply_lora, lora_layers, merged_state_items

    config = GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = apply_lora(GPT2LMHeadModel(config), 2, 4.0, ("c_attn", "c_proj", "c_fc"), seed=0).eval()
    assert {n.rsplit(".", 1)[-1] for n in lora_layers(model)} == {"c_attn", "c_proj", "c_fc"}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    plain = GPT2LMHeadModel(config).eval()
    state = dict(merged_state_items(model))
    plain.load_state_dict({**state, "lm_head.weight": state["transformer.wte.weight"]})
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        # Conv1D keeps W as [in, out]: the merge must add (B A)^T, else the outputs differ
        assert float((plain(ids).logits - model(ids).logits).abs().max()) < 1e-5


def test_export_adapter_writes_a_peft_folder_that_computes_the_merged_actor(tmp_path, tiny, rewards):
    import torch
    from peft import PeftModel

    from sppo_rl.llm.models.core import load_actor

    cfg = grpo_pairs_config(
        tmp_path, tiny, reward_fn=f"{rewards}:even", updates=2, lora_rank=4, export_adapter=True
    )
    cfg.actor_lr = 1e-2  # so that the adapters move visibly from B = 0
    run_llm(cfg)
    final = tmp_path / "run" / "final"
    assert sorted(p.name for p in (final / "actor-adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        merged = load_actor(final / "actor", dtype="float32").eval()(ids).logits
        base = load_actor(tiny, dtype="float32").eval()
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, str(final / "actor-adapter")).eval()(ids).logits
    assert float((adapted - merged).abs().max()) < 1e-5
    assert float((plain - merged).abs().max()) > 1e-4  # the adapters did train
    with pytest.raises(Exception, match="--export-adapter"):
        LLMConfig(export_adapter=True).validate()


def test_a_gpt2_folder_trains_sppo_with_all_linear_lora(tmp_path, tiny, rewards):
    """GPT-2's linear layers are Conv1D: before, --lora-targets could name none of them."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from sppo_rl.llm.models.core import load_actor
    from sppo_rl.llm.models.tiny import load_tokenizer

    tok = load_tokenizer(tiny)
    folder = tmp_path / "gpt2"
    config = GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=len(tok), n_positions=64,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = grpo_pairs_config(
        tmp_path, folder, algo="sppo", group_size=None, reward_fn=f"{rewards}:even", lora_rank=2
    )
    cfg.lora.targets, cfg.export_adapter, cfg.actor_lr = ("all-linear",), True, 1e-2
    run_llm(cfg)
    adapter = json.loads((tmp_path / "run" / "final" / "actor-adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["c_attn", "c_fc", "c_proj"] and adapter["fan_in_fan_out"]
    base = load_file_dict(folder / "model.safetensors")
    merged = load_file_dict(tmp_path / "run" / "final" / "actor" / "model.safetensors")
    changed = {k.rsplit(".", 2)[-2] for k in base if not torch.equal(base[k], merged[k])}
    assert changed == {"c_attn", "c_fc", "c_proj"}  # only the adapted layers, merged back
    assert load_actor(tmp_path / "run" / "final" / "actor", dtype="float32") is not None


def load_file_dict(path):
    from safetensors.torch import load_file

    return load_file(str(path))
