"""scripts/compare_llm.py: the figures of a multi-seed comparison, worked by hand on made-up metrics rows
(the smoothed mean-over-seeds target that a single noisy evaluation cannot set, seeds cut to the
shortest, a seed that never reaches the target, ratios paired by seed), the run sets, ``--reuse``'s
settings check, bad input refused before any file is touched; and the script end to end on a tiny
model with two seeds."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import script_module

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "compare_llm.py"


@pytest.fixture(scope="module")
def cmp():
    with script_module("compare_llm") as module:
        yield module


def rows_of(
    acc: list[float | None], every: int = 10, seconds_per_update: float = 2.0, tokens_per_update: int = 100
):
    """Metrics rows as ``sppo-rl llm`` logs them: the start evaluation at step 0, then one row per update,
    ``val_accuracy`` every ``every`` updates (``acc[i]`` at update ``i * every``; None: no evaluation)."""
    rows = [{"step": 0, "wall_time_s": 0.0, "generated_tokens": 0, "val_accuracy": acc[0]}]
    for step in range(1, every * (len(acc) - 1) + 1):
        row = {
            "step": step,
            "wall_time_s": step * seconds_per_update,
            "generated_tokens": step * tokens_per_update,
            "reward_mean": 0.5,
        }
        if step % every == 0:
            row["val_accuracy"] = acc[step // every]
        rows.append(row)
    return rows


def test_smoothing_is_a_trailing_mean_over_evaluations(cmp):
    assert cmp.smooth([0.2, 0.5, 0.8, 0.2], 3) == pytest.approx([0.2, 0.35, 0.5, 0.5])
    assert cmp.smooth([0.2, 0.5, 0.8, 0.2], 1) == pytest.approx([0.2, 0.5, 0.8, 0.2])
    # only the evaluation rows count: the update rows between them carry no accuracy
    assert [r["step"] for r in cmp.evaluations(rows_of([0.1, 0.2, 0.3]))] == [0, 10, 20]


def test_target_is_the_best_mean_over_seeds_of_smoothed_curves_not_one_noisy_maximum(cmp):
    # seed 0 has one lucky evaluation (0.9 at update 10); today's rule took its maximum, 0.9
    grpo = {0: rows_of([0.3, 0.9, 0.4, 0.5, 0.6]), 1: rows_of([0.3, 0.4, 0.5, 0.5, 0.6])}
    report = cmp.compare({"grpo": grpo}, window=3)
    # smoothed: seed 0 [0.3, 0.6, 0.5333, 0.6, 0.5], seed 1 [0.3, 0.35, 0.4, 0.4667, 0.5333];
    # mean [0.3, 0.475, 0.4667, 0.5333, 0.5167]: best (1.8 + 1.4) / 6 at evaluation 3
    assert report["target"]["value"] == pytest.approx(3.2 / 6)
    assert report["target"]["from"] == "grpo"
    seeds = report["methods"]["grpo"]["per_seed"]
    # seed 0's smoothed curve passes it at evaluation 1 (0.6); seed 1 only at evaluation 4, where
    # (0.5 + 0.5 + 0.6) / 3 equals the target up to float rounding
    assert seeds[0]["reach"] == {"updates": 10, "tokens": 1000, "seconds": 20.0}
    assert seeds[1]["reach"] == {"updates": 40, "tokens": 4000, "seconds": 80.0}
    s = report["methods"]["grpo"]["seconds_to_target"]
    assert (s["mean"], s["min"], s["max"], s["n"], s["of"]) == (50.0, 20.0, 80.0, 2, 2)
    assert seeds[0]["best_smoothed"] == pytest.approx(0.6)
    assert seeds[1]["final_val_accuracy"] == 0.6


def test_seeds_are_aligned_on_the_evaluation_index_and_cut_to_the_shortest(cmp):
    # seed 0 ran longer (a wall-clock budget): its late 0.9s have no partner in seed 1 and must not count
    curves = [[0.2, 0.4, 0.3, 0.9, 0.9], [0.2, 0.4, 0.3]]
    assert cmp.align(curves).shape == (2, 3)
    assert cmp.target_of(curves) == pytest.approx(0.4)
    assert cmp.target_of([[0.5], []]) is None


def test_a_seed_that_never_reaches_the_target_is_counted_apart(cmp):
    rows = {
        "grpo": {0: rows_of([0.3, 0.5, 0.7]), 1: rows_of([0.3, 0.5, 0.7])},
        "sppo": {
            0: rows_of([0.3, 0.8, 0.8], seconds_per_update=1.0),
            1: rows_of([0.3, 0.4, 0.5], seconds_per_update=1.0),  # never reaches 0.7
            2: rows_of([0.3, 0.6, 0.8], seconds_per_update=1.0),
        },
    }
    report = cmp.compare(rows, window=1)
    assert report["target"]["value"] == pytest.approx(0.7)
    sppo = report["methods"]["sppo"]
    assert sppo["per_seed"][1]["reach"] is None
    s = sppo["seconds_to_target"]
    assert (s["mean"], s["min"], s["max"], s["n"], s["of"]) == (15.0, 10.0, 20.0, 2, 3)
    assert sppo["updates_to_target"]["mean"] == 15.0
    assert sppo["tokens_to_target"]["mean"] == 1500.0
    # final accuracy: mean and sample sd over all three seeds
    final = sppo["final_val_accuracy"]
    assert final["mean"] == pytest.approx(0.7)
    assert final["sd"] == pytest.approx(math.sqrt((0.01 + 0.04 + 0.01) / 2))  # finals 0.8, 0.5, 0.8
    # the ratio pairs seed 0 with seed 0 (40 s / 10 s) only: seed 1's SPPO never reached, seed 2 has no GRPO
    r = report["ratios"]["grpo_over_sppo_seconds_to_target"]
    assert r["per_seed"] == {0: pytest.approx(4.0)} and r["pairs"] == 1
    sentence = cmp.ratio_sentence(r, report["target"]["value"])
    assert sentence.startswith("GRPO needs 4.00x SPPO's training wall-clock to reach the target 0.700")


def test_pass_at_k_and_length_columns(cmp):
    """pass@k at the first and last evaluation, the mean response length over the updates; a k that
    differs between seeds (or k = 1) prints no pass@k."""

    def with_extras(pass_k: list[float], lengths: list[float], k: int = 4):
        rows = rows_of([0.2] * len(pass_k))
        for r, p in zip(cmp.evaluations(rows), pass_k):
            r.update(pass_at_k=p, val_k=k)
        updates = [r for r in rows if "reward_mean" in r]
        for i, r in enumerate(updates):
            r["response_length"] = lengths[i * len(lengths) // len(updates)]
        return rows

    seeds = {0: with_extras([0.5, 0.6, 0.8], [10.0, 30.0]), 1: with_extras([0.5, 0.7, 0.6], [20.0, 20.0])}
    report = cmp.compare({"latent-grpo": seeds}, window=1, target=0.9)
    f = report["methods"]["latent-grpo"]
    assert f["per_seed"][0]["final_pass_at_k"] == 0.8 and f["per_seed"][0]["start_pass_at_k"] == 0.5
    assert f["per_seed"][0]["response_length"] == pytest.approx(20.0)  # 10 updates at 10, 10 at 30
    assert (f["k"], f["final_pass_at_k"]["mean"]) == (4, pytest.approx(0.7))
    assert (f["response_length"]["mean"], f["response_length"]["n"]) == (pytest.approx(20.0), 2)
    extra = {"group_size": 8, "peak_rss_mib": 600.0, "model_state_mib": 15.2}  # main() adds these
    f.update(extra)
    assert "| k=4: 0.700 ± 0.141 | 20.0 |" in cmp.markdown(report).splitlines()[2]
    seeds[1] = with_extras([0.5, 0.7, 0.6], [20.0, 20.0], k=2)
    mixed = cmp.compare({"x": seeds}, window=1, target=0.9)
    assert mixed["methods"]["x"]["k"] is None
    mixed["methods"]["x"].update(extra)
    assert "| — | 20.0 |" in cmp.markdown(mixed).splitlines()[2]


def test_ratios_pair_the_same_seed_index(cmp):
    grpo = {0: 200.0, 1: 300.0, 2: None, 3: 90.0}
    sppo = {3: 0.0, 2: 80.0, 1: 50.0, 0: 100.0}  # listed in another order; seed 3 reached at the start
    r = cmp.paired_ratios(grpo, sppo)
    assert r["per_seed"] == {0: 2.0, 1: 6.0}
    assert (r["pairs"], r["median"], r["min"], r["max"]) == (2, 4.0, 2.0, 6.0)
    assert r["ratio_of_means"] == pytest.approx(250 / 75)  # not 4.0, the mean of the ratios
    assert cmp.paired_ratios({0: None}, {0: 10.0})["median"] is None


def test_a_given_target_and_another_reference(cmp):
    rows = {"grpo": {0: rows_of([0.2, 0.4])}, "sppo": {0: rows_of([0.2, 0.6])}}
    given = cmp.compare(rows, window=1, target=0.5)
    assert given["target"] == {"value": 0.5, "from": "--target", "smooth": 1}
    assert given["methods"]["grpo"]["per_seed"][0]["reach"] is None
    other = cmp.compare(rows, window=1, target_from="sppo")
    assert other["target"]["value"] == pytest.approx(0.6)
    assert cmp.compare({"sppo": rows["sppo"]}, window=1)["target"]["value"] is None


def test_finished_with_compares_numbers_lists_and_switches(cmp, tmp_path):
    config = {"algo": "grpo", "group_size": 8, "tis_cap": 2.0, "level": [1, 2], "tensorboard": False}
    (tmp_path / "config.json").write_text(json.dumps({**config, "overwrite": True, "resolved": {}}))
    flags = ["--algo", "grpo", "--group-size", "8", "--tis-cap", "2", "--level", "1", "2", "--no-tensorboard"]
    assert not cmp.finished_with(tmp_path, flags)  # no summary.json: not finished
    (tmp_path / "summary.json").write_text("{}")
    assert cmp.finished_with(tmp_path, [*flags, "--overwrite"])
    assert cmp.finished_with(tmp_path, ["--tis-cap=2.0"])
    assert not cmp.finished_with(tmp_path, ["--tis-cap", "3"])
    assert not cmp.finished_with(tmp_path, ["--level", "1"])
    assert not cmp.finished_with(tmp_path, ["--group-size", "5"])
    assert not cmp.finished_with(tmp_path, ["--tensorboard"])


def test_run_sets(cmp):
    from dataclasses import fields

    from sppo_rl.llm.config import LLMConfig

    sets = cmp.run_sets()
    assert [n for n, _ in sets["long"]] == ["sppo", "grpo", "rloo", "ppo", "sppo-small-critic"]
    methods = dict(sets["methods"])
    assert list(methods) == ["sppo", "grpo", "gspo", "sppo-seq", "grpo-tis", "dapo", "ppo", "ppo-vc"]
    assert methods["grpo-tis"][-2:] == ["--tis-cap", "2"]
    dapo = methods["dapo"]
    assert dapo[:4] == ["--algo", "grpo", "--group-size", "8"]
    assert "--overlong-filter" in dapo and dapo[dapo.index("--clip-high") + 1] == "0.28"
    if "dynamic_sampling_rounds" in {f.name for f in fields(LLMConfig)}:
        assert dapo[dapo.index("--dynamic-sampling-rounds") + 1] == "3"
    else:
        assert "--dynamic-sampling-rounds" not in dapo
    assert [n for n, _ in sets["all"]] == [n for n, _ in cmp.ALL]
    latent = dict(sets["latent"])
    assert list(latent) == ["latent-grpo", "latent-grpo-naive", "grpo", "sppo"]
    for explicit in ("grpo", "sppo"):  # explicit runs start from the curriculum's explicit stage
        assert latent[explicit][latent[explicit].index("--model") + 1] == cmp.EXPLICIT


def test_latent_set_passes_the_flag_check_without_building_its_warm_start(cmp):
    """The per-seed explicit warm start is a placeholder in the pre-run check: a missing-folder check on
    '{explicit}' would refuse the set; resolving it would build a model before anything is validated."""
    args = cmp.parse(["--set", "latent", "--steps", "2"])
    flags = cmp.llm_flags(dict(cmp.run_sets()["latent"])["grpo"], args, 0, cmp.SMALL, resolve=False)
    assert cmp.EXPLICIT in flags
    assert cmp.flag_problem(flags) is None
    bad = cmp.llm_flags(
        ["--algo", "grpo", "--model", "/nonexistent/folder"], args, 0, cmp.SMALL, resolve=False
    )
    assert cmp.flag_problem(bad) is not None


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--set", "long", "--only", "gspo"], "--only gspo: not in --set long"),
        (["--seeds", "0", "0"], "--seeds 0 0"),
        (["--seeds", "x"], "invalid int value"),
        (["--smooth", "0"], "--smooth 0"),
        (["--target", "0.5", "--target-from", "sppo"], "not both"),
        (["--only", "sppo", "--target-from", "grpo"], "--target-from grpo: not among the runs"),
        (["--only", "sppo", "--llm-args", "--bogus 1"], "sppo: sppo-rl llm refuses its flags: Unrecognized"),
        (["--only", "sppo", "--llm-args", "--max-new-tokens 0"], "--max-new-tokens must be >= 1"),
        (["--only", "grpo", "--llm-args", "--model /no/such/folder"], "--model /no/such/folder"),
        (["--only", "grpo", "--llm-args", "--recipe nosuch"], "--recipe nosuch: no such file"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_file(cmp, tmp_path, capsys, argv, words):
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as e:
        cmp.main(["--out", str(out), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("compare_llm: error: ") and words in err, err
    assert not out.exists()


def _compare(out: Path, tiny: Path, cache: Path, steps: int, *names: str) -> subprocess.CompletedProcess:
    llm_args = (
        f"--model {tiny} --train-size 32 --val-size 8 --eval-samples 2 --max-new-tokens 6 --threads 1 "
        "--no-tensorboard"
    )
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--out",
        str(out),
        "--seeds",
        "0",
        "1",
        "--steps",
        str(steps),
        "--prompts-per-step",
        "4",
        "--eval-every",
        "1",
        "--smooth",
        "2",
        "--workers",
        "2",
        "--reuse",
        "--llm-args",
        llm_args,
        "--only",
        *names,
    ]
    env = dict(os.environ, SPPO_RL_CACHE=str(cache), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


@pytest.mark.slow
def test_two_seeds_end_to_end_and_finished_runs_are_reused(tmp_path, tiny):
    out = tmp_path / "cmp"
    proc = _compare(out, tiny, tmp_path / "cache", 2, "sppo", "grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "compare.json").read_text())
    # the target from the runs' own metrics, recomputed here: GRPO's smoothed (window 2) curves, mean over seeds
    curves = []
    for seed in (0, 1):
        run = out / "grpo" / f"seed{seed}"
        assert json.loads((run / "config.json").read_text())["seed"] == seed
        acc = [
            json.loads(line).get("val_accuracy") for line in (run / "metrics.jsonl").read_text().splitlines()
        ]
        acc = [a for a in acc if a is not None]
        assert len(acc) == 3  # the start and after each of the 2 updates
        curves.append([acc[0], (acc[0] + acc[1]) / 2, (acc[1] + acc[2]) / 2])
    target = max((a + b) / 2 for a, b in zip(*curves))
    assert report["target"]["value"] == pytest.approx(target)
    grpo, sppo = report["methods"]["grpo"], report["methods"]["sppo"]
    assert grpo["seconds_to_target"]["n"] >= 1  # the mean is reached by at least one seed
    assert grpo["group_size"] == 8 and sppo["group_size"] == 1
    assert sppo["updates"]["mean"] == 2 and sppo["tokens"]["n"] == 2
    assert sppo["model_state_mib"] > grpo["model_state_mib"] > 0  # the critic's state
    table = (out / "compare.md").read_text()
    assert "| grpo | 8 | 2 |" in table and "| sppo | 1 | 2 |" in table
    assert f"Target {target:.3f}: the best of GRPO's mean over seeds" in table
    assert table.count("SPPO's") == 2 or "No seed in which both GRPO and SPPO reached" in table
    assert (out / "compare.png").stat().st_size > 0

    # --reuse keeps finished runs whose settings match, and reruns those whose settings changed
    metrics = out / "grpo" / "seed1" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    proc = _compare(out, tiny, tmp_path / "cache", 2, "grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "grpo seed 0: reusing" in proc.stderr and "grpo seed 1: reusing" in proc.stderr
    assert metrics.stat().st_mtime_ns == before
    assert set(json.loads((out / "compare.json").read_text())["methods"]) == {"grpo"}
    proc = _compare(out, tiny, tmp_path / "cache", 3, "grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reusing" not in proc.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3]
