"""The control run's own "final" (summary.json's ``final_success_rate`` and the console headline) is the
comparison protocol's (:func:`sppo_rl.runtime.curves.final_value`), the number ``sppo-rl sweep``
and ``sppo-rl report`` print for the same run; it used to be the mean of the last 10 updates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sppo_rl.control.config import ControlConfig
from sppo_rl.control.trainer import ControlRun, run_control
from sppo_rl.experiments.config import ReportConfig
from sppo_rl.experiments.report import run_report


def _cfg(tmp_path: Path, **kw) -> ControlConfig:
    base = dict(
        task="short-cartpole",
        algo="grpo",
        total_episodes=64 * 12,
        init_from="none",
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
        eval_episodes=0,
    )
    return ControlConfig(**{**base, **kw})


def test_summary_final_is_the_last_tenth_of_the_updates(tmp_path):
    """20 updates: 18 at 0.0, then 1.0 and 0.5. The protocol's final is the mean of the last
    ceil(0.1 * 20) = 2: 0.75; the last 10 updates gave 0.15, the last update 0.5."""
    run = ControlRun(_cfg(tmp_path))
    try:
        rows = [{"update": i + 1, "success_rate": y} for i, y in enumerate([0.0] * 18 + [1.0, 0.5])]
        assert run.finish(rows)["final_success_rate"] == pytest.approx(0.75)
        # 7 updates (one a row without a success rate, which does not count): the last one
        rows = [{"update": i + 1, "success_rate": y} for i, y in enumerate([0.0] * 6 + [0.25])]
        assert run.finish(rows + [{"update": 8}])["final_success_rate"] == 0.25
        assert run.finish([])["final_success_rate"] is None
    finally:
        run.close()


def test_headline_summary_and_report_agree(tmp_path, capsys):
    summary = run_control(_cfg(tmp_path))
    out = capsys.readouterr()
    assert "(final: last 10% of updates)" in out.out + out.err
    assert "last 10 updates" not in out.out + out.err
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    report = run_report(ReportConfig(inputs=(str(tmp_path / "run"),), out=str(tmp_path / "report")))
    (group,) = report["groups"]
    assert saved["final_success_rate"] == summary["final_success_rate"] == group["final_success_mean"]
