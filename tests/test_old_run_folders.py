"""Run folders written before both worlds shared one vocabulary are read as before.

The LLM world once wrote ``"step"`` in its metrics rows, ``"steps"`` in ``summary.json`` and ``config.json``
(the flag ``--steps``); the control summary wrote the mean success of its last 10 % of updates as
``"final_success_rate"``. Now: ``"update"``, ``"updates"`` (``--updates``), ``"tail_success_rate"``. Each
reader maps an old key to its name now where the new one is absent, in one place each:
``runtime.logging.read_metrics`` (rows), ``runtime.logging.read_summary`` / ``summary_now`` (summaries, also
an actor file's), ``runtime.run.saved_config`` / ``config_now`` (configs: resume, report, sweep).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sppo_rl.runtime.logging import read_metrics, read_summary, summary_now
from sppo_rl.runtime.run import config_now, saved_config


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_old_rows_summaries_and_configs_are_read_under_the_names_now(tmp_path):
    _jsonl(tmp_path / "metrics.jsonl", [{"step": 0, "val_accuracy": 0.5}, {"update": 1, "reward_mean": 0.25}])
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows == [{"update": 0, "val_accuracy": 0.5}, {"update": 1, "reward_mean": 0.25}]
    assert list(rows[0]) == ["update", "val_accuracy"]  # in the old key's place
    control = {"update": 3, "env_steps": 96, "success_rate": 1.0}  # never renamed: it says update already
    assert config_now(control) is control and summary_now(control) is control
    (tmp_path / "summary.json").write_text(
        json.dumps({"algo": "sppo", "steps": 4, "final_val_accuracy": 0.5})
    )
    assert read_summary(tmp_path / "summary.json") == {
        "algo": "sppo",
        "updates": 4,
        "final_val_accuracy": 0.5,
    }
    old_control = {"updates": 3, "final_success_rate": 0.75, "final_eval_success_rate": 1.0}
    assert summary_now(old_control) == {
        "updates": 3,
        "tail_success_rate": 0.75,
        "final_eval_success_rate": 1.0,
    }
    both = {"updates": 2, "steps": 9}  # the name now wins where both are there
    assert summary_now(both) == both
    (tmp_path / "config.json").write_text(json.dumps({"algo": "grpo", "steps": 7, "resolved": {"x": 1}}))
    assert saved_config(tmp_path) == {"algo": "grpo", "updates": 7}


def test_a_control_policy_reads_an_old_summary_under_its_name_now():
    from sppo_rl.api import Policy
    from sppo_rl.control.networks import Actor

    actor = Actor(4, 2, True)
    old = {"algo": "sppo", "updates": 3, "final_success_rate": 0.5, "final_eval_success_rate": 1.0}
    for policy in (
        Policy(actor, summary=old),
        Policy(actor, meta={"summary": old}),
    ):  # summary.json, final.pt
        assert policy.summary["tail_success_rate"] == 0.5 and policy.summary["final_eval_success_rate"] == 1.0
        assert "final_success_rate" not in policy.summary


def _llm_run(folder: Path, seed: int, evals: dict[int, float], *, old: bool) -> None:
    """An LLM run folder as the trainer writes it (before the rename with ``old``): one row per update,
    100 generated tokens and 2 s per update, ``val_accuracy`` at the updates in ``evals``."""
    update, updates = ("step", "steps") if old else ("update", "updates")
    folder.mkdir(parents=True)
    cfg = {"algo": "sppo", "task": "arithmetic", "seed": seed, updates: max(evals), "prompts_per_step": 8}
    (folder / "config.json").write_text(json.dumps({**cfg, "out_dir": str(folder), "resolved": {}}))
    rows = []
    for k in range(max(evals) + 1):
        row = {update: k, "generated_tokens": 100 * k, "wall_time_s": 2.0 * k}
        rows.append({**row, "val_accuracy": evals[k]} if k in evals else {**row, "reward_mean": 0.5})
    _jsonl(folder / "metrics.jsonl", rows)
    (folder / "summary.json").write_text(json.dumps({"algo": "sppo", "seed": seed, updates: max(evals)}))


def test_an_old_llm_run_folder_is_reported_with_new_ones_as_one_group(tmp_path):
    """Two runs written before the rename and one after, with the same settings: one group of three seeds,
    its updates counted from the rows, its curve on the update axis."""
    from sppo_rl.experiments.config import ReportConfig
    from sppo_rl.experiments.report import run_report

    root = tmp_path / "llm"
    _llm_run(root / "seed0", 0, {0: 0.25, 2: 0.5, 4: 0.75}, old=True)
    _llm_run(root / "seed1", 1, {0: 0.25, 2: 0.25, 4: 0.5}, old=True)
    _llm_run(root / "seed2", 2, {0: 0.25, 2: 0.5, 4: 1.0}, old=False)
    report = run_report(ReportConfig(inputs=(str(root),), bootstrap_reps=200, grid_points=5))
    (group,) = report["llm_groups"]
    assert (group["label"], group["seeds"], group["evaluations"], group["updates"]) == ("sppo", 3, 3, 4)
    (c,) = report["llm_curves"]
    assert c["update"]["x"] == [0, 1, 2, 3, 4] and c["update"]["mean"][-1] == pytest.approx(0.75)


def test_an_old_llm_run_resumes_from_its_config_and_rows(tmp_path, tiny):
    """A run written before the rename (rows with ``step``, ``config.json`` with ``steps`` 3, stopped after
    update 2) resumes from its config.json alone (``--resume``, no budget given): it runs update 3, appends
    it after the old rows, and its summary counts 3 updates."""
    from sppo_rl.cli import main, resume_defaults
    from sppo_rl.llm.config import LLMConfig

    out = tmp_path / "run"
    common = ["--model", str(tiny), "--task", "arithmetic", "--algo", "sppo", "--prompts-per-step", "2"]
    common += ["--train-size", "16", "--val-size", "2", "--eval-samples", "1", "--eval-every", "2"]
    common += ["--max-new-tokens", "4", "--checkpoint-every", "2", "--no-progress", "--no-tensorboard"]
    main(["llm", *common, "--updates", "2", "--out-dir", str(out)])
    # as the code before the rename wrote it: the rows' key, the metrics' length the checkpoint counts on,
    # the config's and the summary's key; a budget of 3, stopped after update 2
    text = (out / "metrics.jsonl").read_text().replace('"update":', '"step":')
    (out / "metrics.jsonl").write_text(text)
    for meta in out.glob("checkpoints/*/meta.json"):
        record = json.loads(meta.read_text())
        meta.write_text(json.dumps({**record, "metrics_bytes": len(text.encode())}))
    config = json.loads((out / "config.json").read_text())
    config = {("steps" if k == "updates" else k): (3 if k == "updates" else v) for k, v in config.items()}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "summary.json").unlink()
    assert resume_defaults(LLMConfig, ["--out-dir", str(out)]).updates == 3

    main(["llm", "--out-dir", str(out), "--resume"])
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2, 3]
    assert [("step" in r, "update" in r) for r in map(json.loads, (out / "metrics.jsonl").open())] == [
        (True, False)
    ] * 3 + [(False, True)]  # the old rows kept byte for byte, the new one under the name now
    assert read_summary(out / "summary.json")["updates"] == 3
    assert json.loads((out / "config.json").read_text())["updates"] == 3
