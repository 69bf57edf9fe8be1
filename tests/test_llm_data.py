"""Loaders for local data files, prompt rendering, and the synthetic arithmetic task."""

from __future__ import annotations

import ast
import json
import operator
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from paths import FIXTURES, REPO, run_cli, write_jsonl
from paths import MATH_DATA as DATA

from sppo_rl.llm.data.arithmetic import LEVELS, capacity, charset, make_arithmetic, reference_response
from sppo_rl.llm.data.files import (
    DataError,
    Example,
    detect_format,
    fit_prompts,
    load_examples,
    render_prompt,
)
from sppo_rl.llm.rewards.verify import verify_integer, verify_math
from sppo_rl.runtime.logging import read_metrics

ROWS = {
    "dapo-math-17k_dedup.parquet": 17_398,
    "math__aime_repeated_8x_240.parquet": 240,
    "math__aime2025_2025.parquet": 30,
    "math__amc23_2025.parquet": 40,
    "math__math_500.parquet": 500,
    "math__minerva_math_2025_processed.parquet": 272,
}
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="the paper's math data is not on this machine")


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
    path = write_jsonl(
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
    path = write_jsonl(
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
    (e,) = load_examples(write_jsonl(tmp_path / "verl.jsonl", [verl]))
    assert e.answer == "2" and e.source == "mine" and e.meta["ability"] == "math"
    assert e.prompt == verl["prompt"]
    (p,) = load_examples(write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "2+2=", "answer": 4}]))
    assert (p.prompt, p.answer, p.source) == ("2+2=", "4", "plain")


def test_custom_keys_with_dotted_paths(tmp_path):
    path = write_jsonl(tmp_path / "custom.jsonl", [{"q": "What?", "meta": {"gold": "42"}, "other": 1}])
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
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, "", bad_line, GOOD])  # line 2 is blank
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
        load_examples(write_jsonl(tmp_path / "u.jsonl", [{"text": "x"}]))
    (tmp_path / "l.json").write_text('{"prompt": "x"}')
    with pytest.raises(DataError, match="expected a JSON list"):
        load_examples(tmp_path / "l.json")
    with pytest.raises(ValueError, match="unknown format"):
        load_examples(write_jsonl(tmp_path / "ok.jsonl", [GOOD]), format="csv")
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


FIXTURE_REWARDS = REPO / "tests" / "fixtures" / "math" / "reward_fns.py"


# ================================================================== 6. oversized input


def _write_data(path: Path, huge_chars: int = 30 * 2**20) -> None:
    """Six ordinary problems, one 30 MB question, one 1.5 MB one and one of 100,000 characters."""
    with path.open("w") as f:
        for i in range(3):
            f.write(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")
        f.write(json.dumps({"prompt": "1" * huge_chars + "+1=", "answer": "2"}) + "\n")
        f.write(json.dumps({"prompt": "2" * 1_500_000 + "+1=", "answer": "3"}) + "\n")
        f.write(json.dumps({"prompt": "3" * 100_000 + "+1=", "answer": "4"}) + "\n")
        for i in range(3, 6):
            f.write(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")


def test_oversized_records_are_skipped_and_counted_without_being_read_whole(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    _write_data(path)
    tracemalloc.start()
    try:
        examples = load_examples(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, f"the 30 MB line was held in memory ({peak / 2**20:.0f} MiB)"
    assert [e.answer for e in examples] == ["0", "2", "4", "4", "6", "8", "10"]
    assert [e.index for e in examples] == list(range(7))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipped 2 oversized record(s)" in err and str(path) in err
    assert "data.jsonl:4" in err and "data.jsonl:5" in err


def test_prompts_longer_than_the_limit_are_dropped_without_tokenizing_the_huge_ones(tiny, capsys):
    from sppo_rl.llm.data.files import Example
    from sppo_rl.llm.models.tiny import load_tokenizer

    tok = load_tokenizer(tiny)
    seen: list[int] = []

    class Spy:
        chat_template = None

        def __call__(self, texts, **kw):
            seen.extend(len(t) for t in texts)
            return tok(texts, **kw)

    examples = [
        Example("1+1=", "2"),
        Example("9" * 100_000, "1"),
        Example("8" * 90, "1"),
        Example("2+2=", "4"),
    ]
    kept = fit_prompts(examples, Spy(), 64, where="d.jsonl", why="test")
    assert [e.answer for e in kept] == ["2", "4"]
    assert max(seen) <= 8 * 64, "a prompt over 8 characters per allowed token is never tokenized"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d.jsonl: skipped 2 of 4 prompt(s) longer than 64 tokens" in err


MEASURE = """
import resource, runpy, sys
sys.argv = ["sppo_rl", *sys.argv[1:]]
try:
    runpy.run_module("sppo_rl", run_name="__main__")
finally:
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def test_llm_run_on_data_with_a_30mb_question_skips_it_and_stays_small(tmp_path, tiny):
    data = tmp_path / "data.jsonl"
    _write_data(data)
    out = tmp_path / "run"
    args = [
        "llm", "--task", str(data), "--val-data", str(data), "--val-size", "4", "--model", str(tiny),
        "--reward-fn", f"{FIXTURE_REWARDS}:exact", "--updates", "4", "--prompts-per-step", "2", "--algo", "grpo",
        "--group-size", "2", "--max-new-tokens", "4", "--eval-every", "1000", "--no-progress",
        "--no-tensorboard", "--out-dir", str(out),
    ]  # fmt: skip

    def cap_memory() -> None:  # the unfixed code tried to tokenize (and run) a 30 M-token prompt
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30))

    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        preexec_fn=cap_memory,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_mb = int(proc.stderr.split("PEAK_RSS_KB")[1].split()[0]) / 1024
    assert peak_mb < 1500, f"peak RSS {peak_mb:.0f} MiB"
    assert took < 240
    # the loader skips the 30 MB and 1.5 MB records (in both files), the trainer the 100,000-character
    # prompt: the model's context is 512 tokens, minus 4 for the response
    assert proc.stderr.count("skipped 2 oversized record(s)") == 2
    assert f"{data}: skipped 1 of 7 prompt(s) longer than 508 tokens" in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["train_examples"] == 6
    assert [r["update"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_no_prompt_that_fits_is_refused_in_one_line(tmp_path, tiny):
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": "7" * 600, "answer": "1"}) + "\n" for _ in range(3)))
    proc = run_cli(
        ["llm", "--task", str(data), "--model", str(tiny), "--no-progress", "--out-dir", str(tmp_path / "r")]
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "none of its 3 prompts fits in 496 tokens" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


# ------------------------------------------------------------------------------------- data columns


def test_trl_prompt_and_solution_columns_load_without_flags(tmp_path):
    from sppo_rl.llm.data.files import load_examples

    path = tmp_path / "trl.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": "Half of 1?"}], "solution": "So it is $\\boxed{\\frac12}$."},
        {"prompt": "2+2?", "solution": "\\boxed{4}", "level": 1},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = load_examples(path)
    assert a.prompt == rows[0]["prompt"] and a.answer == "\\frac12"
    assert a.meta["solution"] == rows[0]["solution"]  # a TRL-style reward gets the column as it is
    assert (b.prompt, b.answer, b.meta["level"]) == ("2+2?", "4", 1)


def test_an_unknown_layout_names_the_cli_flags(tmp_path):
    from sppo_rl.llm.data.files import DataError, load_examples

    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"text": "hi", "gold": "1"}) + "\n")
    with pytest.raises(DataError, match="--prompt-key and --answer-key") as e:
        load_examples(path)
    assert "prompt_key" not in str(e.value)
    path.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(DataError, match=r"missing key 'answer' \(keys: prompt\); --answer-key names"):
        load_examples(path, format="plain")
