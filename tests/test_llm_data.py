"""Loaders for local data files, prompt rendering, and the synthetic arithmetic task."""

from __future__ import annotations

import ast
import json
import operator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from paths import FIXTURES  # noqa: E402
from paths import MATH_DATA as DATA  # noqa: E402

from sppo_rl.llm.data.arithmetic import LEVELS, capacity, charset, make_arithmetic, reference_response
from sppo_rl.llm.data.files import DataError, Example, detect_format, load_examples, render_prompt
from sppo_rl.llm.rewards.verify import verify_integer, verify_math

ROWS = {
    "dapo-math-17k_dedup.parquet": 17_398,
    "math__aime_repeated_8x_240.parquet": 240,
    "math__aime2025_2025.parquet": 30,
    "math__amc23_2025.parquet": 40,
    "math__math_500.parquet": 500,
    "math__minerva_math_2025_processed.parquet": 272,
}
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="the paper's math data is not on this machine")


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------------ paper data


@needs_data
@pytest.mark.parametrize("name, rows", ROWS.items())
def test_reads_the_paper_files(name, rows):
    examples = load_examples(DATA / name)
    assert len(examples) == rows
    assert [e.index for e in examples[:3]] == [0, 1, 2]
    for e in examples:
        assert isinstance(e.prompt, list) and e.prompt[-1]["role"] == "user"
        assert e.prompt[-1]["content"].rstrip().endswith("\\boxed{}.")
        assert e.answer and e.answer == e.answer.strip()
        assert e.source
        assert "ability" in e.meta and "abality" not in e.meta
    first = pq.read_table(DATA / name).slice(0, 1).to_pylist()[0]
    assert examples[0].answer == first["reward_model"]["ground_truth"].strip()
    assert examples[0].source == first["data_source"]


@pytest.mark.parametrize("name", ROWS)
def test_reads_the_shipped_subsets(name):
    examples = load_examples(FIXTURES / name)
    assert len(examples) == 24
    assert all(isinstance(e.prompt, list) and e.answer for e in examples)


@needs_data
def test_limit_reads_only_the_head():
    examples = load_examples(DATA / "dapo-math-17k_dedup.parquet", limit=5)
    assert len(examples) == 5
    assert load_examples(DATA / "math__amc23_2025.parquet", limit=0) == []


# ------------------------------------------------------------------------------------- formats


def test_gsm8k_style(tmp_path):
    path = _jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
            {"question": "How many cents in $12?", "answer": "12 * 100 = 1200\n#### 1,200"},
        ],
    )
    examples = load_examples(path)
    assert [e.answer for e in examples] == ["7", "1200"]
    assert examples[0].prompt.startswith("Tom") and examples[0].source == "gsm8k"


def test_math_style(tmp_path):
    path = _jsonl(
        tmp_path / "math.jsonl",
        [
            {"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"},
            {"problem": "A set?", "solution": "First \\boxed{1}, finally \\boxed{\\{1, 2\\}}."},
            {"problem": "With an answer field", "solution": "long text \\boxed{x}", "answer": "3"},
        ],
    )
    examples = load_examples(path)
    assert [e.answer for e in examples] == ["\\frac{1}{2}", "\\{1, 2\\}", "3"]
    assert examples[0].meta == {"level": "Level 1", "solution": "It is $\\boxed{\\frac{1}{2}}$."}


def test_verl_records_in_jsonl_and_plain_records(tmp_path):
    verl = {
        "data_source": "mine",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
        "abality": "math",
        "reward_model": {"ground_truth": " 2 ", "style": "rule"},
    }
    (e,) = load_examples(_jsonl(tmp_path / "verl.jsonl", [verl]))
    assert e.answer == "2" and e.source == "mine" and e.meta["ability"] == "math"
    assert e.prompt == verl["prompt"]
    (p,) = load_examples(_jsonl(tmp_path / "plain.jsonl", [{"prompt": "2+2=", "answer": 4}]))
    assert (p.prompt, p.answer, p.source) == ("2+2=", "4", "plain")


def test_custom_keys_with_dotted_paths(tmp_path):
    path = _jsonl(tmp_path / "custom.jsonl", [{"q": "What?", "meta": {"gold": "42"}, "other": 1}])
    (e,) = load_examples(path, prompt_key="q", answer_key="meta.gold")
    assert (e.prompt, e.answer, e.meta) == ("What?", "42", {"other": 1})


def test_json_list_and_parquet_round_trip(tmp_path):
    records = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(5)]
    (tmp_path / "d.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    for name in ("d.json", "d.parquet"):
        examples = load_examples(tmp_path / name, limit=3)
        assert [(e.prompt, e.answer, e.index) for e in examples] == [
            ("0+1=", "1", 0),
            ("1+1=", "2", 1),
            ("2+1=", "3", 2),
        ]


def test_detect_format():
    assert detect_format({"prompt", "reward_model", "data_source"}).name == "verl"
    assert detect_format(["question", "answer"]).name == "gsm8k"
    assert detect_format(["problem", "solution", "answer"]).name == "math"
    assert detect_format(["prompt", "answer"]).name == "plain"
    assert detect_format(["text"]) is None


# -------------------------------------------------------------------------------------- errors


GOOD = {"prompt": "1+1=", "answer": "2"}


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"prompt": "1+1=", "answer": ', r"bad\.jsonl:3: invalid JSON"),
        ({"prompt": "1+1="}, r"bad\.jsonl:3: missing key 'answer' \(keys: prompt\)"),
        ({"prompt": 5, "answer": "2"}, r"bad\.jsonl:3: prompt must be a string or a non-empty list"),
        ({"prompt": [{"role": "user"}], "answer": "2"}, r"bad\.jsonl:3: prompt message 0 is not"),
        ({"prompt": "1+1=", "answer": "  "}, r"bad\.jsonl:3: empty answer"),
        (
            {"prompt": "1+1=", "answer": {"x": 1}},
            r"bad\.jsonl:3: answer must be a string or a number, got dict",
        ),
        (
            {"prompt": "1+1=", "answer": None},
            r"bad\.jsonl:3: answer must be a string or a number, got NoneType",
        ),
        ({"prompt": "", "answer": "2"}, r"bad\.jsonl:3: empty prompt"),
        ("[1, 2]", r"bad\.jsonl:3: expected a JSON object, got list"),
    ],
)
def test_a_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = _jsonl(tmp_path / "bad.jsonl", [GOOD, "", bad_line, GOOD])  # line 2 is blank
    with pytest.raises(DataError, match=message):
        load_examples(path)


@pytest.mark.parametrize(
    "line, where",
    [
        ('{"prompt": "\\ud800 1+2=", "answer": "3"}', r"prompt at character 0 \(\\ud800\)"),
        ('{"prompt": "1+2=", "answer": "3\\udfff"}', r"answer at character 1 \(\\udfff\)"),
        (
            '{"prompt": [{"role": "user", "content": "x\\udc80"}], "answer": "3"}',
            r"prompt\.0\.content at character 1",
        ),
    ],
    ids=["prompt", "answer", "chat-message"],
)
def test_a_lone_surrogate_is_refused_naming_file_line_and_field(tmp_path, line, where):
    """A JSON escape of one half of a UTF-16 pair decodes to a string that is no Unicode text (a
    tokenizer raises ``TypeError`` on it): the record is refused naming the file, its line and the
    field; a well-formed pair (an emoji) is read."""
    path = tmp_path / "s.jsonl"
    path.write_text('{"prompt": "\\ud83d\\ude00 1+1=", "answer": "2"}\n' + line + "\n")
    with pytest.raises(DataError, match=r"s\.jsonl:2: a lone surrogate in " + where):
        load_examples(path)
    assert load_examples(path, limit=1)[0].prompt == "\U0001f600 1+1="


def test_a_malformed_parquet_row_names_the_row(tmp_path):
    rows = [GOOD, GOOD, {"prompt": "3+3=", "answer": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: row 2: answer must be"):
        load_examples(tmp_path / "bad.parquet")
    assert len(load_examples(tmp_path / "bad.parquet", limit=2)) == 2


def test_file_level_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found"):
        load_examples(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_examples(tmp_path / "d.csv")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="junk.parquet: not a readable Parquet file"):
        load_examples(tmp_path / "junk.parquet")
    with pytest.raises(DataError, match=r"u\.jsonl:1: cannot tell the record layout .*\(text\)"):
        load_examples(_jsonl(tmp_path / "u.jsonl", [{"text": "x"}]))
    (tmp_path / "l.json").write_text('{"prompt": "x"}')
    with pytest.raises(DataError, match="expected a JSON list"):
        load_examples(tmp_path / "l.json")
    with pytest.raises(ValueError, match="unknown format"):
        load_examples(_jsonl(tmp_path / "ok.jsonl", [GOOD]), format="csv")
    with pytest.raises(ValueError, match="limit"):
        load_examples(tmp_path / "ok.jsonl", limit=-1)


# -------------------------------------------------------------------------------- render_prompt


def _chat_tokenizer():
    """A real (tiny, local) fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return tok


def test_render_plain_and_chat_prompts():
    assert render_prompt(Example("12+35=", "47")) == "12+35="
    assert render_prompt(Example("Q", "1"), suffix=" Think.") == "Q Think."
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render_prompt(Example(chat, "1")) == "S\n\nU"
    assert render_prompt(chat, suffix="!") == "S\n\nU!"
    assert chat[1]["content"] == "U"  # not modified in place
    tok = _chat_tokenizer()
    assert render_prompt(Example(chat, "1"), tok) == "<|system|>S\n<|user|>U\n<|assistant|>"
    assert render_prompt(Example(chat, "1"), tok, suffix="!") == "<|system|>S\n<|user|>U!\n<|assistant|>"
    tok.chat_template = None
    assert render_prompt(Example(chat, "1"), tok) == "S\n\nU"


@needs_data
def test_render_a_paper_prompt():
    (e,) = load_examples(DATA / "math__aime2025_2025.parquet", limit=1)
    text = render_prompt(e, _chat_tokenizer())
    assert text.startswith("<|user|>Find the sum") and text.endswith("<|assistant|>")


# ------------------------------------------------------------------------------ arithmetic task

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(prompt: str) -> int:
    """An independent evaluator: Python's own parse tree of the expression, walked by hand."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    assert prompt.endswith("=")
    return walk(ast.parse(prompt[:-1], mode="eval").body)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_arithmetic_levels(level):
    train, val = make_arithmetic(seed=3, n_train=2000, n_val=300, level=level)
    assert len(train) == 2000 and len(val) == 300
    allowed = set(charset())
    spec = LEVELS[level]
    for split, examples in (("train", train), ("val", val)):
        assert [e.index for e in examples] == list(range(len(examples)))
        for e in examples:
            assert e.meta == {"level": level, "split": split} and e.source == "arithmetic"
            assert int(e.answer) == _value(e.prompt)
            response = reference_response(e)
            assert response == f"\\boxed{{{e.answer}}}"
            assert set(e.prompt) | set(response) <= allowed
            assert len(e.prompt) <= 12 and len(response) <= 14
            body = e.prompt[:-1]
            assert set(body) - set("0123456789") <= set(spec.ops)
            assert body.count("*") <= 1
            assert body.count("+") + body.count("-") + body.count("*") + 1 in spec.operands


def test_reference_responses_pass_both_verifiers():
    train, val = make_arithmetic(0, 200, 50, level=(1, 2, 3, 4, 5))
    for e in train + val:
        assert verify_integer(reference_response(e), e.answer) == 1.0
        assert verify_math(reference_response(e), e.answer) == 1.0
        assert verify_integer(f"\\boxed{{{int(e.answer) + 1}}}", e.answer) == 0.0


def test_arithmetic_is_deterministic_disjoint_and_stable():
    a_train, a_val = make_arithmetic(7, 500, 100, level=(1, 2))
    b_train, b_val = make_arithmetic(7, 500, 100, level=(1, 2))
    assert a_train == b_train and a_val == b_val
    c_train, c_val = make_arithmetic(8, 500, 100, level=(1, 2))
    assert [e.prompt for e in c_train] != [e.prompt for e in a_train]
    prompts_train = [e.prompt for e in a_train]
    prompts_val = [e.prompt for e in a_val]
    assert len(set(prompts_train)) == 500 and len(set(prompts_val)) == 100
    assert not set(prompts_train) & set(prompts_val)
    # a larger training split extends the same list; the validation split ignores n_train
    d_train, d_val = make_arithmetic(7, 800, 100, level=(1, 2))
    assert d_val == a_val and d_train[:500] == a_train
    assert {e.meta["level"] for e in a_train} == {1, 2}


def test_levels_get_harder():
    """Each level widens the range of answers and has more distinct prompts than the one before."""
    spreads, sizes = [], []
    for level in sorted(LEVELS):
        _, val = make_arithmetic(0, 0, 2000, level=level)
        answers = [int(e.answer) for e in val]
        spreads.append(max(answers) - min(answers))
        sizes.append(capacity(LEVELS[level]))
    assert spreads == sorted(spreads) and len(set(spreads)) == len(spreads)
    assert sizes == sorted(sizes) and sizes[0] == 100 * 100


def test_arithmetic_refuses_impossible_requests():
    with pytest.raises(ValueError, match="at most 10000 distinct prompts"):
        make_arithmetic(0, 9_000, 2_000, level=1)
    train, val = make_arithmetic(0, 9_000, 1_000, level=1)  # exactly all of them
    assert len({e.prompt for e in train + val}) == 10_000
    with pytest.raises(ValueError, match="unknown level"):
        make_arithmetic(0, 1, 1, level=9)
    with pytest.raises(ValueError, match="unknown level"):
        make_arithmetic(0, 1, 1, level=())
    with pytest.raises(ValueError, match=">= 0"):
        make_arithmetic(0, -1, 1)


def test_a_csv_task_is_refused_for_its_type_first(tmp_path, capsys):
    """``--task data.csv`` without ``--model``: the one line says CSV is not read (not that the embedded
    model needs a generated task), exit 2, nothing written; ``--val-data`` alike."""
    from sppo_rl.cli import main

    csv = tmp_path / "data.csv"
    csv.write_text("prompt,answer\n1+1=,2\n")
    good = tmp_path / "data.jsonl"
    good.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    for args in (["--task", str(csv)], ["--task", str(good), "--val-data", str(csv)]):
        with pytest.raises(SystemExit) as e:
            main(["llm", *args, "--out-dir", str(tmp_path / "run")])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, err
        assert f"{csv}: CSV files are not read; use one of .jsonl, .json, .parquet" in err[0]
        assert not (tmp_path / "run").exists()
