"""The README a newcomer reads: about 1,500 words (at most 1,600), the path install -> demo -> own data
and reward -> Python API in it, every command it shows taking only real flags, its TRL-style reward
working as written, every link landing on a page and heading that exist; and no internal labels (issue
numbers, seed or round names) anywhere in the repository's prose."""

from __future__ import annotations

import re

import pytest

from tests.paths import REPO

README = REPO / "README.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_readme_fits_on_a_few_screens():
    words = len(README.read_text(encoding="utf-8").split())  # as `wc -w` counts
    assert words <= 1600, f"README.md has {words} words (at most 1,600)"


def test_the_readme_holds_the_newcomers_path():
    text = README.read_text(encoding="utf-8")
    # install: make setup, and the CPU build named correctly (a plain pip install gets the CUDA build)
    assert "make setup" in text
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert "CUDA" in text
    # the two commands
    assert "make demo " in text and "make test " in text and "make demo-real" in text
    # own data and a TRL-style reward
    shell = "\n".join(_blocks(text, "bash"))
    assert re.search(r"sppo-rl llm .*--task \S+\.jsonl", shell) and "--reward-fn reward.py:" in shell
    assert any("def " in b and "completions" in b for b in _blocks(text, "python"))
    # the Python API, and the formula of SPPO
    assert any("train_control(" in b for b in _blocks(text, "python"))
    assert "sigmoid(V(s_p))" in text and "A_t = R - p" in text


def _commands(text: str) -> list[list[str]]:
    import shlex

    out = []
    for block in _blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0] if " # " in line or line.lstrip().startswith("#") else line
            words = shlex.split(line) if line.strip() else []
            for i, w in enumerate(words):
                if w == "sppo-rl" or (w == "sppo_rl" and words[i - 1] == "-m"):
                    out.append(words[i + 1 :])
                    break
    return out


def test_every_command_in_the_readme_takes_only_real_flags():
    from sppo_rl.cli import _commands as commands
    from sppo_rl.cli import unknown_flag

    shown = _commands(README.read_text(encoding="utf-8"))
    assert len(shown) >= 5
    table = commands()
    for args in shown:
        assert args[0] in table, args
        assert unknown_flag(args[0], table[args[0]][0], args[1:]) is None, args


def test_the_readmes_trl_style_reward_scores_as_written(tmp_path):
    from sppo_rl.llm.rewards.scorer import RewardScorer

    text = README.read_text(encoding="utf-8")
    code = next(b for b in _blocks(text, "python") if "completions" in b)
    (tmp_path / "reward.py").write_text(code, encoding="utf-8")
    name = re.search(r"def (\w+)\(completions", code)[1]
    with RewardScorer(f"{tmp_path / 'reward.py'}:{name}", timeout_s=10.0) as scorer:
        res = scorer.score(["41 + 74 = 115", "I think 114"], ["115", "115"], columns=[{"prompts": "q"}] * 2)
    assert res.scores.tolist() == [1.0, 0.0] and res.errors == 0


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in (REPO / "docs").glob("*.md"))])
def test_links_land_on_pages_and_headings_that_exist(page):
    path = REPO / page if page == "README.md" else REPO / "docs" / page
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{page}: {target}: no such file"
        if anchor and dest.suffix == ".md":
            headings = re.findall(
                r"^#+ (.*)$", re.sub(r"```.*?```", "", dest.read_text(encoding="utf-8"), flags=re.S), re.M
            )
            assert anchor in {_slug(h) for h in headings}, f"{page}: {target}: no such heading"


LABELS = re.compile(
    r"\bissues? #?\d+\b|\(seed 0\d\d\)|\bseed 0\d\d\b|\b[Rr]ound (?:one|two|three|four|2|3|4)\b(?! of)"
    r"|\bthe issue's\b|-{5,} item \d+:|\bfinding \d+\b",
    re.I,
)
"""How a work item's label reads (``issue 25``, ``(seed 003)``, ``round three``, ``item 5:``): the
project's prose says what a thing is instead."""


def test_no_internal_labels_in_the_repositorys_prose():
    files = [README, *(REPO / "docs").glob("*.md"), *(REPO / "docs").glob("*.ipynb")]
    for folder in ("sppo_rl", "scripts", "tests"):
        files += [p for p in (REPO / folder).rglob("*.py") if p.name != "test_readme.py"]
    found = []
    for p in files:
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            m = LABELS.search(line)
            if m:
                found.append(f"{p.relative_to(REPO)}:{i}: {m[0]}")
    assert not found, found
