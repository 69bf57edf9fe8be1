"""``docs/tutorial.ipynb``: the tutorial page as an executed notebook (``scripts/tutorial_notebook.py``
builds and runs it). The committed file holds exactly the page's prose and code plus the notebook's own
cells (PPO on the tiny LLM beside SPPO and GRPO, and the plots), every code cell's output and its plots as
PNGs. That it runs from scratch is ``tests/test_tutorial.py``'s (it executes the notebook's cells)."""

from __future__ import annotations

import base64
import json

import pytest

from tests.paths import REPO, script_module

NOTEBOOK = REPO / "docs" / "tutorial.ipynb"
PNG = b"\x89PNG\r\n\x1a\n"


def _pngs(nb: dict) -> list[bytes]:
    return [
        base64.b64decode(o["data"]["image/png"])
        for c in nb["cells"]
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]


def test_the_notebook_holds_the_page_and_its_own_cells():
    with script_module("tutorial_notebook") as tn:
        built = tn.notebook(tn.cells())
        committed = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
        assert tn._sources(committed) == tn._sources(built), "stale: run python scripts/tutorial_notebook.py"
        page = tn.PAGE.read_text(encoding="utf-8")
    code = ["".join(c["source"]) for c in committed["cells"] if c["cell_type"] == "code"]
    python_blocks = page.count("```python\n")
    assert python_blocks == 8 and len(code) == python_blocks + 4  # the page's blocks, PPO on the LLM, 3 plots
    assert any('algo="ppo"' in c and "run_llm" in c for c in code), "PPO in the LLM world too"
    assert sum('algo="grpo"' in c or '"grpo"' in c for c in code) >= 2 and any(
        'algo="sppo"' in c for c in code
    )


def test_the_committed_notebook_is_executed_with_its_plots_inline():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    assert all(c["outputs"] for c in code), "every code cell shows a result"
    pngs = _pngs(nb)
    assert len(pngs) == 3 and all(p.startswith(PNG) for p in pngs)


def test_the_notebook_is_valid_nbformat_where_nbformat_is_installed():
    nbformat = pytest.importorskip("nbformat")  # not in the [dev] extra: the notebook is built without it
    nbformat.validate(nbformat.reads(NOTEBOOK.read_text(encoding="utf-8"), as_version=4))
