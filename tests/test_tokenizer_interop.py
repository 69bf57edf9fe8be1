"""The tiny model's saved tokenizer loads in transformers' ``AutoTokenizer`` (as vLLM, TRL and
``pipeline`` load it) and round-trips text, spaces included, with the ids of ``load_tokenizer``."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from transformers import AutoTokenizer

from sppo_rl.llm.models import tiny as tiny_module
from sppo_rl.llm.models.tiny import TINY_CHARSET, char_vocab, ensure_tiny_model, load_tokenizer

TEXTS = [
    "What is 2 + 3?",
    "a  b   c",
    "  leading and trailing  ",
    "12 + 30 = 42",
    "\\boxed{42}",
    "so the answer is \\boxed{ 7 }.",
    "x = 1 , y = 2 . is it ? don 't",  # no clean-up of spaces around punctuation
    "(x*y)/z; 1,2:3.",
    " ",
    "",
]
NEWLINE_TEXTS = ["line 1\nline 2", "a\n\n  b\n", "\n", "tab\there\t\n\\boxed{5}"]
SMALL = dict(hidden_size=32, layers=1, heads=2, kv_heads=1)


def auto(folder):
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def assert_round_trips(folder, texts):
    tok, ours = auto(folder), load_tokenizer(folder)
    for text in texts:
        ids = tok(text).input_ids
        assert tok.decode(ids, skip_special_tokens=True) == text, (type(tok).__name__, text)
        assert ours(text).input_ids == ids, f"load_tokenizer and AutoTokenizer disagree on {text!r}"
        assert ours.decode(ids, skip_special_tokens=True) == text
        assert len(ids) == len(text), "one token per character"
    return tok, ours


def test_auto_tokenizer_round_trips_the_tiny_tokenizer(tiny):
    tok, ours = assert_round_trips(tiny, TEXTS)
    enc = tok("What is 2 + 3?")
    assert tok.decode(enc.input_ids, skip_special_tokens=True) == "What is 2 + 3?"
    # same special ids, same vocabulary, left padding read from the folder
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 1, 2)
    assert tok.get_vocab() == ours.get_vocab()
    assert tok.padding_side == "left"
    batch = ["1", "What is 2 + 3?"]
    assert tok(batch, padding=True).input_ids == ours(batch, padding=True).input_ids
    ids = tok("1 + 1").input_ids + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "1 + 1"
    assert tok.decode(ids) == "1 + 1<eos>"
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer"


def test_ids_of_existing_text_are_unchanged(tiny):
    """Each character keeps the id of the word-level tokenizer (format 1), so the model's embedding
    rows, its vocabulary size and every trained weight still mean the same characters."""
    vocab = char_vocab(TINY_CHARSET)
    tok = auto(tiny)
    assert len(tok) == len(vocab)
    for text in [*TEXTS, TINY_CHARSET]:
        assert tok(text).input_ids == [vocab[c] for c in text]


def test_newlines_and_tabs_round_trip(tmp_path):
    folder = ensure_tiny_model(tmp_path, TINY_CHARSET + "\n\t", **SMALL)
    assert_round_trips(folder, TEXTS + NEWLINE_TEXTS)
    vocab = char_vocab(TINY_CHARSET + "\n\t")
    assert auto(folder)("a\nb\t").input_ids == [vocab[c] for c in "a\nb\t"]


def test_non_ascii_charset_round_trips(tmp_path):
    charset = TINY_CHARSET + "é€😀"
    folder = ensure_tiny_model(tmp_path, charset, **SMALL)
    tok, _ = assert_round_trips(folder, ["café 5 €", "😀 = 😀"])
    vocab = char_vocab(charset)
    assert tok("é€😀").input_ids == [vocab["é"], vocab["€"], vocab["😀"]]


def test_a_resaved_tokenizer_still_round_trips(tiny, tmp_path):
    """The warm start and the trainer re-save ``load_tokenizer``'s tokenizer next to the weights."""
    out = tmp_path / "resaved"
    load_tokenizer(tiny).save_pretrained(out)
    shutil.copy(tiny / "config.json", out / "config.json")
    assert_round_trips(out, TEXTS)


def test_text_generation_pipeline_keeps_spaces(tiny):
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(tiny), device="cpu")
    tok = generate.tokenizer
    ids = tok("What is 2 + 3?").input_ids
    assert len(ids) == 14 and tok.decode(ids, skip_special_tokens=True) == "What is 2 + 3?"
    out = generate("What is 2 + 3?", max_new_tokens=3, do_sample=False)
    assert out[0]["generated_text"].startswith("What is 2 + 3?")


def test_a_format_1_cache_is_not_reused(tmp_path):
    """A cache folder written before the tokenizer changed (format 1) is not picked up."""
    assert tiny_module.TINY_FORMAT_VERSION >= 2
    settings = dict(SMALL)
    key = json.dumps({"charset": TINY_CHARSET, "settings": settings, "format": 1}, sort_keys=True)
    stale = tmp_path / f"tiny-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    stale.mkdir()
    (stale / "tiny_model.json").write_text(key)
    folder = ensure_tiny_model(tmp_path, TINY_CHARSET, **settings)
    assert folder != stale and (folder / "tokenizer.json").is_file()
    assert json.loads((folder / "tiny_model.json").read_text())["format"] == tiny_module.TINY_FORMAT_VERSION


@pytest.mark.parametrize("text", ["What is 2 + 3?", "a  b"])
def test_legacy_word_level_folders_still_load_with_load_tokenizer(tmp_path, text):
    """A format-1 folder (word-level tokenizer, generic class) keeps its spaces through load_tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(char_vocab(TINY_CHARSET), unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(["<pad>", "<eos>", "<unk>"])
    legacy = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    legacy.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    vocab = char_vocab(TINY_CHARSET)
    assert tok(text).input_ids == [vocab[c] for c in text]
    assert tok.decode(tok(text).input_ids) == text
