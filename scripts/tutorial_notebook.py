"""``docs/tutorial.ipynb``: the tutorial (``docs/tutorial.md``) as an executed Jupyter notebook, plots inline.

The notebook is built from the Markdown page: its prose (shell blocks included) becomes Markdown cells, each
```python block a code cell, in order, and :data:`EXTRA_CELLS` adds the notebook's own cells after the
blocks they follow: token-level PPO on the tiny LLM beside the page's SPPO and GRPO runs (so the three
methods meet in both worlds), and the plots. Executing runs every code cell in one namespace in a fresh
working folder, in this process (``exec``; matplotlib's Agg backend), and stores each cell's printed text
and each figure it leaves open as a PNG, as Jupyter would: it needs neither a Jupyter kernel nor
``nbformat``/``nbclient``, only matplotlib (the ``[dev]`` extra).

    python scripts/tutorial_notebook.py                 # run it (about a minute on one core) and write the file
    python scripts/tutorial_notebook.py --check         # exit 1 if the file's cells differ from the page's

``tests/test_tutorial.py`` runs the notebook's cells (:func:`execute`) and checks the numbers the page quotes;
``tests/test_tutorial_notebook.py`` checks that the file matches the page and holds its outputs and plots.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tutorial.md"
NOTEBOOK = REPO / "docs" / "tutorial.ipynb"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n?", re.S | re.M)

INTRO = (
    "*This notebook is `docs/tutorial.md` run end to end, with plots; it is generated and executed by "
    "`python scripts/tutorial_notebook.py` (the tests check that it matches the page and that it runs). "
    "Run it from the repository's `.venv` (`make setup`); everything it writes goes to `tutorial_runs/` "
    "under the current folder.*"
)

PLOT_CONTROL = """\
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
for algo, rows in control_rows.items():
    left.plot([r["episodes"] for r in rows], [r["success_rate"] for r in rows], marker="o", label=algo.upper())
sppo_rows = control_rows["sppo"]
right.plot([r["episodes"] for r in sppo_rows], [r["success_rate"] for r in sppo_rows], marker="o", label="success rate")
right.plot([r["episodes"] for r in sppo_rows], [r["v0_mean"] for r in sppo_rows], marker="s", label="mean V(s_0)")
left.set(xlabel="episodes", ylabel="success rate", title="short-cartpole, one seed")
right.set(xlabel="episodes", title="SPPO: critic against success")
for ax in (left, right):
    ax.set_ylim(0, 1)
    ax.legend()
fig.tight_layout()
"""

PPO_LLM = """\
# The third method on the same tiny model: token-level PPO, one sample per prompt like SPPO, with a
# per-token critic instead of SPPO's prompt-only one. From the same seed PPO and SPPO sample the same
# first responses, and three small updates barely move the policy, so their rewards may coincide here:
# the difference is in what the critic reads, not in what is sampled.
ppo_summary = run_llm(LLMConfig(algo="ppo", task="arithmetic", model=str(model), updates=3,
                                prompts_per_step=8, train_size=64, val_size=16, eval_samples=2,
                                max_new_tokens=8, reward_fn="digit_reward.py:has_digit",
                                out_dir="tutorial_runs/llm/ppo", cache_dir="tutorial_runs/cache",
                                progress=False, tensorboard=False))
llm_runs = {algo: read_metrics(f"tutorial_runs/llm/{algo}/metrics.jsonl") for algo in ("ppo", "grpo", "sppo")}
for algo, rows in llm_runs.items():
    print(f"{algo:5s} reward per update:", " ".join(f"{r['reward_mean']:.3f}" for r in rows if "reward_mean" in r))
"""

PLOT_LLM = """\
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
for algo, rows in llm_runs.items():
    steps = [r for r in rows if "reward_mean" in r]
    style = dict(marker="o", linestyle="--" if algo == "ppo" else "-", label=algo.upper())
    left.plot([r["update"] for r in steps], [r["reward_mean"] for r in steps], **style)
    right.plot([r["generated_tokens"] for r in steps], [r["reward_mean"] for r in steps], **style)
left.set_xticks([r["update"] for r in steps])
left.set(xlabel="update", ylabel="mean reward (has a digit)", title="tiny LLM, one seed")
right.set(xlabel="generated tokens so far", title="the same against the tokens sampled")
for ax in (left, right):
    ax.set_ylim(0, 1)
    ax.legend()
fig.tight_layout()
"""

PLOT_TAIL = """\
fig, ax = plt.subplots(figsize=(5, 3.2))
gap = ppo_tail["bins"]["gap"]
ax.bar([(i + 0.5) / len(gap) for i in range(len(gap))], gap, width=0.9 / len(gap))
ax.axhline(0, color="black", linewidth=0.8)
ax.set(xlabel="relative position u = t / (T - 1)", ylabel="V(success) - V(failure)",
       title="PPO's step critic: the gap per bin")
fig.tight_layout()
"""

EXTRA_CELLS: dict[str, list[str]] = {
    "control_rows[algo] = read_metrics": [PLOT_CONTROL],
    "grpo_summary = run_llm": [PPO_LLM, PLOT_LLM],
    "ppo_tail = tail.step_numbers": [PLOT_TAIL],
}
"""The notebook's own cells, each list after the page's python block that contains the key."""


OWN = "notebook-only"
"""The tag of :data:`EXTRA_CELLS`' cells (and of the notebook's introduction) in the cells' metadata."""


def _cell(kind: str, source: str, own: bool = False) -> dict:
    metadata = {"tags": [OWN]} if own else {}
    cell: dict = {"cell_type": kind, "metadata": metadata, "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def cells(page: str | None = None) -> list[dict]:
    """The notebook's cells (without outputs) from the page's text."""
    text = PAGE.read_text(encoding="utf-8") if page is None else page
    out = [_cell("markdown", INTRO, own=True)]
    at = 0
    for m in FENCE.finditer(text):
        if m[1] != "python":
            continue
        prose = text[at : m.start()].strip("\n")
        if prose:
            out.append(_cell("markdown", prose))
        code = m[2].rstrip("\n")
        out.append(_cell("code", code))
        for key, extra in EXTRA_CELLS.items():
            if key in code:
                out += [_cell("code", source.rstrip("\n"), own=True) for source in extra]
        at = m.end()
    rest = text[at:].strip("\n")
    if rest:
        out.append(_cell("markdown", rest))
    return out


def notebook(cell_list: list[dict]) -> dict:
    return {
        "cells": cell_list,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "pygments_lexer": "ipython3"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def execute(cell_list: list[dict], workdir: Path) -> dict:
    """Run the code cells in order in one namespace with ``workdir`` as the working folder; each gets its
    printed text (a ``stream`` output) and a PNG (``display_data``) of every figure it leaves open; returns
    the namespace. A cell that raises stops the run with an error naming it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace: dict = {"__name__": "__main__"}
    cwd = os.getcwd()
    os.chdir(workdir)
    count = 0
    try:
        for cell in cell_list:
            if cell["cell_type"] != "code":
                continue
            count += 1
            source = "".join(cell["source"])
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    exec(compile(source, f"notebook cell {count}", "exec"), namespace)
                except Exception as e:
                    raise RuntimeError(f"notebook cell {count} failed: {e!r}\n{source}") from e
            outputs: list[dict] = []
            if buf.getvalue():
                outputs.append(
                    {"name": "stdout", "output_type": "stream", "text": buf.getvalue().splitlines(True)}
                )
            for number in plt.get_fignums():
                png = io.BytesIO()
                plt.figure(number).savefig(png, format="png", dpi=100)
                data = base64.b64encode(png.getvalue()).decode("ascii")
                outputs.append(
                    {
                        "data": {"image/png": data, "text/plain": ["<Figure>"]},
                        "metadata": {},
                        "output_type": "display_data",
                    }
                )
            plt.close("all")
            cell["execution_count"], cell["outputs"] = count, outputs
    finally:
        os.chdir(cwd)
    return namespace


def _sources(nb: dict) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare the file's cells with the page's; run nothing"
    )
    parser.add_argument("--out", type=Path, default=NOTEBOOK, help="where to write the notebook")
    args = parser.parse_args(argv)
    if args.check:
        same = NOTEBOOK.is_file() and _sources(json.loads(NOTEBOOK.read_text(encoding="utf-8"))) == _sources(
            notebook(cells())
        )
        print(
            "docs/tutorial.ipynb matches docs/tutorial.md"
            if same
            else "docs/tutorial.ipynb is stale: rerun this script"
        )
        return 0 if same else 1
    with tempfile.TemporaryDirectory(prefix="tutorial-") as work:
        cell_list = cells()
        execute(cell_list, Path(work))
        nb = notebook(cell_list)
    args.out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
