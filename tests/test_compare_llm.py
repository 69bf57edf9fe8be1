"""scripts/compare_llm.py: the figures of a multi-seed comparison, worked by hand on made-up metrics rows
(the pooled target rule that no method's lucky evaluation can set, every run read on the common window
between its raw evaluations, comparisons paired by seed with their interval, A/A null and verdict in
the printed table), the run sets (PPO as the project's recipe runs it), bad input refused before any
file is touched; the runs through ``sppo-rl sweep``'s runner (``--reuse`` keeps a finished run and
resumes a stopped one); and the script end to end on a tiny model with two seeds."""

from __future__ import annotations

import json
import os
import shutil
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
    rows = [{"update": 0, "wall_time_s": 0.0, "generated_tokens": 0, "val_accuracy": acc[0]}]
    for step in range(1, every * (len(acc) - 1) + 1):
        row = {
            "update": step,
            "wall_time_s": step * seconds_per_update,
            "generated_tokens": step * tokens_per_update,
            "reward_mean": 0.5,
        }
        if step % every == 0:
            row["val_accuracy"] = acc[step // every]
        rows.append(row)
    return rows


def test_target_is_the_pooled_rule_not_a_method_s_best(cmp):
    # grpo seed 0 has one lucky evaluation (0.9 at update 10); yesterday's rule took GRPO's best mean
    # smoothed curve as the target. Now: starts all 0.3; finals (the last 1 of 5 evaluations) 0.6, 0.6,
    # 0.5, 0.7: median 0.6 -> target 0.3 + 0.5 * (0.6 - 0.3) = 0.45, whichever method is which
    grpo = {0: rows_of([0.3, 0.9, 0.4, 0.5, 0.6]), 1: rows_of([0.3, 0.4, 0.5, 0.5, 0.6])}
    sppo = {0: rows_of([0.3, 0.4, 0.4, 0.5, 0.5]), 1: rows_of([0.3, 0.5, 0.6, 0.7, 0.7])}
    report = cmp.compare({"grpo": grpo, "sppo": sppo})
    assert report["target"]["value"] == pytest.approx(0.45)
    assert cmp.compare({"x": grpo, "sppo": sppo})["target"]["value"] == pytest.approx(0.45)
    # grpo seed 0 (evaluations at 0, 20, ..., 80 s): below 0.45 from 0 to 5 s (0.3 -> 0.9 over 0-20 s) and
    # from 38 s (0.9 -> 0.4 over 20-40 s) to 50 s (0.4 -> 0.5 over 40-60 s): 5 + 12 = 17 s; the first
    # crossing alone says 5 s
    seeds = report["methods"]["grpo"]["per_seed"]
    assert seeds[0]["seconds_to_target"] == pytest.approx(5.0 + 12.0)
    assert seeds[0]["seconds_first_crossing"] == pytest.approx(5.0)
    assert seeds[1]["final_val_accuracy"] == 0.6
    given = cmp.compare({"grpo": grpo, "sppo": sppo}, target=0.55)
    assert given["target"] == {"value": 0.55, "rule": "given", "gain": 0.5}


def test_every_run_is_read_on_the_window_all_runs_cover(cmp):
    # grpo at 6 s per update (evaluated every 60 s), sppo at 1 s (every 10 s): the window ends at sppo's
    # 40 s; grpo's accuracy there is read between its raw evaluations 0.3 (0 s) and 0.7 (60 s): 0.5667,
    # not its next evaluation 0.7 at 60 s
    rows = {
        "grpo": {0: rows_of([0.3, 0.7, 0.7], seconds_per_update=6.0, tokens_per_update=800)},
        "sppo": {0: rows_of([0.3, 0.4, 0.5, 0.5, 0.6], seconds_per_update=1.0)},
    }
    report = cmp.compare(rows, target=0.45)
    assert report["windows"] == {"seconds": [0.0, 40.0], "tokens": [0.0, 4000.0]}
    grpo, sppo = report["methods"]["grpo"]["per_seed"][0], report["methods"]["sppo"]["per_seed"][0]
    assert grpo["acc_at_seconds"] == pytest.approx(0.3 + 0.4 * 40 / 60)
    assert grpo["acc_at_tokens"] == pytest.approx(0.3 + 0.4 * 4000 / 8000)  # 8000 tokens at 60 s
    assert sppo["acc_at_seconds"] == pytest.approx(0.6)
    # AUC over 0-40 s: sppo (10 * 0.35 + 10 * 0.45 + 10 * 0.5 + 10 * 0.55) / 40
    assert sppo["auc_seconds"] == pytest.approx(18.5 / 40)
    # seconds to 0.45: grpo 0.3 -> 0.7 over 60 s crosses at 22.5 s; sppo 0.4 -> 0.5 over 10-20 s at 15 s
    assert grpo["seconds_to_target"] == pytest.approx(22.5) and sppo["seconds_to_target"] == pytest.approx(15)
    pair = report["pairs"]["grpo_vs_sppo"]
    assert pair["seconds_to_target"]["point"] == pytest.approx(1.5)
    assert pair["acc_at_seconds"]["verdict"] == "no test (1 seed pair with values)"


def test_comparisons_pair_seeds_and_print_the_interval_and_the_null(cmp):
    # five seeds; sppo better by 0.1 at the end in every seed
    grpo = {k: rows_of([0.3, 0.4 + 0.02 * k, 0.5 + 0.01 * k]) for k in range(5)}
    sppo = {k: rows_of([0.3, 0.5 + 0.02 * k, 0.6 + 0.01 * k]) for k in range(5)}
    sppo[5] = rows_of([0.3, 0.55, 0.65])  # a seed grpo does not have: in sppo's null, in no pair
    report = cmp.compare({"grpo": grpo, "sppo": sppo})
    acc = report["pairs"]["grpo_vs_sppo"]["acc_at_seconds"]
    assert acc["seeds"] == [0, 1, 2, 3, 4] and acc["per_seed"] == pytest.approx([-0.1] * 5)
    assert acc["point"] == pytest.approx(-0.1) and acc["interval"] == pytest.approx([-0.1, -0.1])
    # -0.1 in every seed pair: no spread, p = 0; the primary (no FLOPs logged: accuracy at equal tokens)
    assert acc["p"] == 0 and acc["verdict"] == "difference (Holm p = 0)" and acc["role"] == "secondary"
    tok = report["pairs"]["grpo_vs_sppo"]["acc_at_tokens"]
    assert tok["role"] == "primary" and tok["verdict"] == "difference (Holm p = 0)"
    assert (
        report["decision"]["primary"] == "acc_at_tokens"
        and "no flops_total" in report["decision"]["notes"][-1]
    )
    for name in ("grpo", "sppo"):
        report["methods"][name].update(group_size=1, peak_rss_mib=1.0, model_state_mib=1.0)
    md = cmp.markdown(report)
    assert "Primary statistic (declared before the runs): accuracy at equal generated tokens" in md
    primary = md.split("Primary:")[1].split("Secondary (exploratory):")[0]
    line = next(x for x in primary.splitlines() if x.startswith("| grpo vs sppo |"))
    # at the window's end grpo 0.50-0.54 (mean and IQM 0.52), sppo 0.60-0.64 over the common seeds (0.62)
    assert line.startswith(
        "| grpo vs sppo | accuracy at equal generated tokens (A - B) | 5 | 0.520 (0.520) | 0.620 (0.620) | -0.100 | "
        "[-0.100, -0.100] | 0 (0) | 0.00 | 0.000 | 1 | difference (Holm p = 0) |"
    )
    assert "Collapsed runs (final at 0 or below the run's own start): grpo 0/5, sppo 0/6" in md
    assert "Note: these runs log no flops_total" in md
    # finals 0.50-0.54 and 0.60-0.65 (11 runs): median 0.60 -> target 0.3 + 0.5 * 0.3
    assert "Target 0.450: start + 0.5 x (median of the pooled finals" in md


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
    report = cmp.compare({"latent-grpo": seeds}, target=0.9)
    f = report["methods"]["latent-grpo"]
    assert f["per_seed"][0]["final_pass_at_k"] == 0.8 and f["per_seed"][0]["start_pass_at_k"] == 0.5
    assert f["per_seed"][0]["response_length"] == pytest.approx(20.0)  # 10 updates at 10, 10 at 30
    assert (f["k"], f["final_pass_at_k"]["mean"]) == (4, pytest.approx(0.7))
    assert (f["response_length"]["mean"], f["response_length"]["n"]) == (pytest.approx(20.0), 2)
    extra = {"group_size": 8, "peak_rss_mib": 600.0, "model_state_mib": 15.2}  # main() adds these
    f.update(extra)
    assert "| k=4: 0.700 ± 0.141 | 20.0 |" in cmp.markdown(report).splitlines()[2]
    seeds[1] = with_extras([0.5, 0.7, 0.6], [20.0, 20.0], k=2)
    mixed = cmp.compare({"x": seeds}, target=0.9)
    assert mixed["methods"]["x"]["k"] is None
    mixed["methods"]["x"].update(extra)
    assert "| — | 20.0 |" in cmp.markdown(mixed).splitlines()[2]


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
    # token-level PPO as the project's PPO recipe runs it: whitened advantages, value clipping 0.5
    recipe = json.loads((REPO / "sppo_rl" / "recipes" / "ppo-1.5b-deepscaler.json").read_text())
    assert (recipe["whiten"], recipe["value_clip"]) == (True, 0.5)
    for name in ("ppo", "ppo-vc"):
        flags = methods[name]
        assert "--whiten" in flags and flags[flags.index("--value-clip") + 1] == "0.5", name
    real = dict(sets["real"])  # a real pretrained model: the same samples per update for every method
    assert list(real) == ["sppo", "grpo", "ppo", "spo", "astar-po"]
    assert "--critic-model" not in real["spo"] + real["astar-po"]  # their baselines are not learned
    assert all(f[f.index("--model") + 1] == "smollm2-135m" for f in real.values())
    for name in ("sppo", "ppo"):
        assert real[name][real[name].index("--critic-model") + 1] == "smollm2-135m:layers=4"
    assert "--whiten" in real["ppo"] and real["ppo"][real["ppo"].index("--value-clip") + 1] == "0.5"
    latent = dict(sets["latent"])
    assert list(latent) == ["latent-grpo", "latent-grpo-naive", "grpo", "sppo"]
    for explicit in ("grpo", "sppo"):  # explicit runs start from the curriculum's explicit stage
        assert latent[explicit][latent[explicit].index("--model") + 1] == cmp.EXPLICIT


def test_the_precision_and_single_sample_sets(cmp):
    """The precision set: SPPO on the real model as the real set runs it, float32 against bf16, nothing else
    different. The single-sample set: one response per prompt for its single-sample methods, and the group
    references at the same samples per update (--prompts-per-step / N prompts x N)."""
    sets = cmp.run_sets()
    precision = dict(sets["precision"])
    real_sppo = dict(sets["real"])["sppo"]
    assert precision == {
        "sppo": [*real_sppo, "--precision", "fp32"],
        "sppo-bf16": [*real_sppo, "--precision", "bf16"],
    }
    assert cmp.set_design("precision")[0] == cmp.REAL_SEEDS
    single = dict(sets["single"])
    assert list(single) == [
        "sppo", "spo", "astar-po", "opo-batch", "reinforce-batch", "reinforce", "sao", "crf-ntf", "shrinkage-4",
        "v05-4", "grpo-4", "grpo-8",
    ]  # fmt: skip
    args = cmp.parse(["--set", "single", "--prompts-per-step", "32"])
    for name, flags in single.items():
        run = cmp.llm_flags(flags, args, 0, cmp.SMALL, resolve=False)
        group = int(run[run.index("--group-size") + 1]) if "--group-size" in run else 1
        assert int(run[run.index("--prompts-per-step") + 1]) * group == 32, name
        assert cmp.flag_problem(name, run) is None, name


def test_a_group_method_of_the_real_set_gets_the_same_samples_per_update(cmp):
    """GRPO (N = 4) runs --prompts-per-step / 4 prompts, so that every method of the set samples 32
    responses per update; its own flag replaces the script's (one --prompts-per-step in the command)."""
    real = dict(cmp.run_sets()["real"])
    args = cmp.parse(["--set", "real", "--seconds", "60", "--prompts-per-step", "32"])
    grpo = cmp.llm_flags(real["grpo"], args, 0, cmp.SMALL, resolve=False)
    sppo = cmp.llm_flags(real["sppo"], args, 0, cmp.SMALL, resolve=False)
    assert grpo.count("--prompts-per-step") == 1 and grpo[grpo.index("--prompts-per-step") + 1] == "8"
    assert sppo.count("--prompts-per-step") == 1 and sppo[sppo.index("--prompts-per-step") + 1] == "32"
    args = cmp.parse(["--set", "real", "--prompts-per-step", "2"])
    grpo = cmp.llm_flags(real["grpo"], args, 0, cmp.SMALL, resolve=False)
    assert grpo[grpo.index("--prompts-per-step") + 1] == "1"  # never 0 prompts


def test_format_rates_start_final_table_and_figure(cmp, tmp_path):
    """The bare-number and boxed rates a run logs at each evaluation: start (the first evaluation) and
    final (the protocol's final) per seed, their mean over seeds in a table of their own, and a figure;
    runs that did not log them (older folders) get no table row and no figure."""

    def with_formats(number: list[float], boxed: list[float]):
        rows = rows_of([0.1] * len(number))
        for r, n, b in zip(cmp.evaluations(rows), number, boxed):
            r.update(val_number_rate=n, val_boxed_rate=b)
        return rows

    seeds = {
        0: with_formats([0.0, 0.5, 0.9], [0.0, 0.0, 0.1]),
        1: with_formats([0.2, 0.6, 0.7], [0.0, 0.1, 0.1]),
    }
    report = cmp.compare(
        {"sppo": seeds, "old": {0: rows_of([0.1, 0.2, 0.3]), 1: rows_of([0.1, 0.2, 0.2])}},
        target=0.9,
    )
    f = report["methods"]["sppo"]
    assert (f["per_seed"][0]["start_number_rate"], f["per_seed"][0]["final_number_rate"]) == (0.0, 0.9)
    assert f["final_number_rate"]["mean"] == pytest.approx(0.8) and f["start_boxed_rate"]["mean"] == 0.0
    assert report["methods"]["old"]["final_number_rate"]["n"] == 0
    for name in report["methods"]:
        report["methods"][name].update(group_size=1, peak_rss_mib=1.0, model_state_mib=1.0)
    md = cmp.markdown(report)
    assert "| sppo | 0.100 ± 0.141 -> 0.800 ± 0.141 | 0.000 ± 0.000 -> 0.100 ± 0.000 |" in md
    assert "| old |" not in md.split("bare-number rate start")[1].split("Format")[0]
    assert cmp.plot_formats(report, tmp_path / "f.png", "t") and (tmp_path / "f.png").stat().st_size > 0
    del report["methods"]["sppo"]
    assert not cmp.plot_formats(report, tmp_path / "g.png", "t") and not (tmp_path / "g.png").exists()


def test_latent_set_passes_the_flag_check_without_building_its_warm_start(cmp):
    """The per-seed explicit warm start is a placeholder in the pre-run check: a missing-folder check on
    '{explicit}' would refuse the set; resolving it would build a model before anything is validated."""
    args = cmp.parse(["--set", "latent", "--updates", "2"])
    flags = cmp.llm_flags(dict(cmp.run_sets()["latent"])["grpo"], args, 0, cmp.SMALL, resolve=False)
    assert cmp.EXPLICIT in flags and "--seed" not in flags  # the seed is the sweep's
    assert cmp.flag_problem("grpo", flags) is None
    bad = cmp.llm_flags(
        ["--algo", "grpo", "--model", "/nonexistent/folder"], args, 0, cmp.SMALL, resolve=False
    )
    assert "/nonexistent/folder" in cmp.flag_problem("grpo", bad)
    assert "grpo: --seed is set by the sweep" in cmp.flag_problem("grpo", [*flags, "--seed", "3"])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--set", "long", "--only", "gspo"], "--only gspo: not in --set long"),
        (["--seeds", "0", "0"], "--seeds 0 0"),
        (["--seeds", "x"], "invalid int value"),
        (["--target-gain", "0"], "--target-gain 0"),
        (["--margin", "0"], "--margin 0.0: out of range"),
        (["--primary", "acc_at_nothing"], "invalid choice"),
        (["--only", "sppo", "--baseline", "grpo"], "--baseline grpo: not among the runs"),
        (["--only", "sppo", "--llm-args", "--bogus 1"], "sppo: sppo-rl llm refuses its flags: Unrecognized"),
        (["--only", "sppo", "--llm-args", "--max-new-tokens 0"], "--max-new-tokens must be >= 1"),
        (["--only", "grpo", "--llm-args", "--model /no/such/folder"], "--model /no/such/folder"),
        (["--only", "grpo", "--llm-args", "--recipe nosuch"], "--recipe nosuch: no such built-in recipe"),
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


def _compare(
    out: Path, tiny: Path, cache: Path, steps: int, *names: str, seeds: tuple[str, ...] = ("0", "1")
) -> subprocess.CompletedProcess:
    llm_args = (
        f"--model {tiny} --train-size 32 --val-size 8 --eval-samples 2 --max-new-tokens 6 --threads 1 "
        "--no-tensorboard --checkpoint-every 1"
    )
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--out",
        str(out),
        "--seeds",
        *seeds,
        "--updates",
        str(steps),
        "--prompts-per-step",
        "4",
        "--eval-every",
        "1",
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
    # the target from the runs' own metrics, recomputed here: start + 0.5 (median pooled final - start),
    # final = the last of 3 evaluations (10 %, at least one)
    starts, finals = [], []
    for name in ("sppo", "grpo"):
        for seed in (0, 1):
            run = out / name / f"seed{seed}"
            assert json.loads((run / "config.json").read_text())["seed"] == seed
            acc = [
                json.loads(line).get("val_accuracy")
                for line in (run / "metrics.jsonl").read_text().splitlines()
            ]
            acc = [a for a in acc if a is not None]
            assert len(acc) == 3  # the start and after each of the 2 updates
            starts.append(acc[0])
            finals.append(acc[-1])
    s0 = sum(starts) / 4
    target = s0 + 0.5 * (sorted(finals)[1] / 2 + sorted(finals)[2] / 2 - s0)
    assert report["target"]["value"] == pytest.approx(target)
    grpo, sppo = report["methods"]["grpo"], report["methods"]["sppo"]
    assert grpo["group_size"] == 8 and sppo["group_size"] == 1
    assert sppo["updates"]["mean"] == 2 and sppo["tokens"]["n"] == 2
    assert sppo["model_state_mib"] > grpo["model_state_mib"] > 0  # the critic's state
    table = (out / "compare.md").read_text()
    assert "| grpo | 8 | 2 |" in table and "| sppo | 1 | 2 |" in table
    assert f"Target {target:.3f}: start + 0.5 x (median of the pooled finals" in table
    rows = [line for line in table.splitlines() if line.startswith("| grpo vs sppo |")]
    # the runs log FLOPs: the primary is accuracy at equal FLOPs, then six secondary statistics
    assert len(rows) == 7 and all(line.count("|") == 13 for line in rows)
    assert rows[0].startswith("| grpo vs sppo | accuracy at equal FLOPs (A - B) |")
    # two seed pairs: whatever the verdict, it is one of the rule's words
    assert all(
        any(w in line for w in ("| difference (", "| inconclusive: ", "| equivalent ", "| no test"))
        for line in rows
    )
    assert (out / "compare.png").stat().st_size > 0
    # accuracy against FLOPs: three evaluations are too few for the sigmoid, and the table says so
    assert "| sppo | 2 |" in table and "did not converge: 2 points above C = 0, a fit needs 4" in table
    assert [f["fit"]["A"] for f in report["scaling"]] == [None, None]

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
    assert [json.loads(line)["update"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3]


@pytest.mark.slow  # about a minute on a busy machine: three tiny runs; tests/test_sweep.py has the fast one
def test_reuse_keeps_a_finished_run_and_resumes_a_stopped_one(cmp, tmp_path, tiny, capsys, monkeypatch):
    """The runs go through the sweep's runner: with --reuse a finished run is kept and a run stopped
    after a checkpoint continues from it (the old runner started it again with --overwrite), both lines
    on stderr as before; the report reads every run."""
    monkeypatch.setenv("SPPO_RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    out = tmp_path / "cmp"
    argv = [
        "--out",
        str(out),
        "--seeds",
        "0",
        "--updates",
        "2",
        "--prompts-per-step",
        "4",
        "--eval-every",
        "1",
    ]
    argv += ["--workers", "2", "--reuse", "--only", "sppo", "grpo", "--llm-args"]
    argv += [
        f"--model {tiny} --train-size 32 --val-size 8 --eval-samples 2 --max-new-tokens 6 --checkpoint-every 1"
    ]
    cmp.main(argv)
    first = capsys.readouterr()
    for name in ("sppo", "grpo"):
        (line,) = [x for x in first.err.splitlines() if x.startswith(f"{name} seed 0: val ")]
        assert " in 2 updates, " in line
    assert "| grpo | 8 | 1 |" in first.out and (out / "sweep.json").is_file()
    grpo = out / "grpo" / "seed0"
    rows = (grpo / "metrics.jsonl").read_text().splitlines()
    (grpo / "summary.json").unlink()  # stopped between update 1's checkpoint and update 2's
    for p in sorted((grpo / "checkpoints").glob("ckpt-*"))[1:]:
        shutil.rmtree(p)
    sppo_metrics = (out / "sppo" / "seed0" / "metrics.jsonl").stat().st_mtime_ns
    cmp.main(argv)
    err = capsys.readouterr().err.splitlines()
    assert f"sppo seed 0: reusing the finished run in {out / 'sppo' / 'seed0'}" in err
    assert any(x.startswith("grpo seed 0: val ") and " in 2 updates, " in x for x in err)
    assert (out / "sppo" / "seed0" / "metrics.jsonl").stat().st_mtime_ns == sppo_metrics
    log = (grpo / "log.txt").read_text()
    assert log.count("=== ") == 2 and "--resume" in log.split("=== ")[2] and "--overwrite" not in log
    after = (grpo / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == rows[:2] and len(after) == 3  # rows 0 and 1 kept byte for byte, row 2 again
    report = json.loads((out / "compare.json").read_text())
    assert report["methods"]["grpo"]["updates"]["mean"] == 2


def test_recorded_model_folders_include_named_models_of_older_run_folders(cmp, tmp_path, monkeypatch):
    """A run folder's ``config.json`` records the critic as a folder; older ones recorded a named
    model's reference (``smollm2-135m:layers=4``), which must map to that model's cache folder (the
    4-layer one, not the full model's) rather than be read as a relative path."""
    monkeypatch.setenv("SPPO_RL_CACHE", str(tmp_path / "cache"))
    assert cmp.recorded_folder("smollm2-135m:layers=4") == tmp_path / "cache" / "smollm2-135m-layers4-v1"
    assert cmp.recorded_folder("smollm2-135m") == tmp_path / "cache" / "smollm2-135m-v1"
    folder = tmp_path / "smollm2-135m"  # a folder given by path stays that folder
    folder.mkdir()
    assert cmp.recorded_folder(str(folder)) == folder
    # a run given --cache-dir: its named models lie there, not in the default cache
    own = tmp_path / "own"
    assert cmp.recorded_folder("smollm2-135m:layers=4", str(own)) == own / "smollm2-135m-layers4-v1"


def test_no_comparison_says_why(cmp):
    """One method and no pairs: the table says whether the baseline was the only method run (``--only
    sppo``) or is missing from the runs, never that a method it did run is missing."""
    extra = {"group_size": 1, "peak_rss_mib": 1.0, "model_state_mib": 1.0}
    seeds = {k: rows_of([0.2, 0.3 + 0.01 * k]) for k in range(2)}
    alone = cmp.compare({"sppo": seeds}, target=0.9)
    alone["methods"]["sppo"].update(extra)
    assert "No comparison against the baseline (sppo): it is the only method run." in cmp.markdown(alone)
    other = cmp.compare({"grpo": seeds}, target=0.9)
    other["methods"]["grpo"].update(extra)
    md = cmp.markdown(other)
    assert "No comparison against the baseline (sppo): it is not among the runs (--baseline NAME)." in md


def test_a_row_per_seed_says_when_it_took_off_and_whether_it_drifted_to_the_length_limit(cmp):
    """Seed 0 reaches the target 0.3 at its second evaluation (update 20) and is never cut; seed 1
    never reaches it and its cut share rises from 0.1 (first 5 updates) to 0.9 (last 5). The start's
    greedy accuracy is read from the step-0 evaluation."""
    took_off, drifted = rows_of([0.0, 0.1, 0.5, 0.6]), rows_of([0.02, 0.0, 0.02, 0.0])
    for rows, first, last in ((took_off, 0.0, 0.0), (drifted, 0.1, 0.9)):
        rows[0]["val_greedy_accuracy"] = 0.0625
        for r in rows[1:]:
            r["response_clip_frac"] = first if r["update"] <= 5 else last if r["update"] > 25 else 0.5
    report = cmp.compare({"sppo": {0: took_off, 1: drifted}}, target=0.3)
    seeds = report["methods"]["sppo"]["per_seed"]
    assert (seeds[0]["first_update_at_target"], seeds[1]["first_update_at_target"]) == (20, None)
    assert seeds[1]["cut_first"] == pytest.approx(0.1) and seeds[1]["cut_last"] == pytest.approx(0.9)
    report["methods"]["sppo"].update(group_size=1, peak_rss_mib=1.0, model_state_mib=1.0)
    md = cmp.markdown(report).splitlines()
    # no greedy accuracy past the start and no flops_total logged: those cells say so
    assert "| sppo | 0 | 0.000 (0.062) | 0.600 (—) | — | 20 | 0% -> 0% | 30 | 3,000 | — |" in md
    assert "| sppo | 1 | 0.020 (0.062) | 0.000 (—) | — | never | 10% -> 90% | 30 | 3,000 | — |" in md


def test_greedy_finals_and_flops_are_reported_per_seed_and_per_method(cmp):
    """Every evaluation with its greedy accuracy and every row with its cumulative ``flops_total``: the
    final greedy is the same tail mean as the sampled final (the last evaluation of four), the training
    FLOPs the last row's, and accuracy at equal FLOPs is read at the FLOPs window's end (the smaller
    run's total: seed 1 spends 2e9 an update, seed 0 1e9, so the window ends at 3e10 and seed 1 is read at
    its update 15, halfway between its evaluations 0.2 and 0.4)."""
    seeds = {0: rows_of([0.0, 0.1, 0.5, 0.6]), 1: rows_of([0.0, 0.2, 0.4, 0.4])}
    for k, rows in seeds.items():
        for r in rows:
            r["flops_total"] = (k + 1) * 1e9 * r["update"]
            if "val_accuracy" in r:
                r["val_greedy_accuracy"] = r["val_accuracy"] + 0.25
    report = cmp.compare({"sppo": seeds}, target=0.3)
    per_seed = report["methods"]["sppo"]["per_seed"]
    assert per_seed[0]["final_greedy_accuracy"] == pytest.approx(0.85)
    assert per_seed[1]["flops"] == pytest.approx(6e10) and per_seed[0]["flops"] == pytest.approx(3e10)
    assert per_seed[0]["acc_at_flops"] == pytest.approx(0.6) and per_seed[1]["acc_at_flops"] == pytest.approx(
        0.3
    )
    report["methods"]["sppo"].update(group_size=1, peak_rss_mib=1.0, model_state_mib=1.0)
    md = cmp.markdown(report).splitlines()
    assert "| sppo | 1 | 0.000 (0.250) | 0.400 (0.650) | 0.300 | 20 | — -> — | 30 | 3,000 | 6e+10 |" in md
    row = next(line for line in md if line.startswith("| sppo | 1 | 2 |"))
    assert (
        "| 0.500 ± 0.141 | 0.750 ± 0.141 | 0.450 ± 0.212 |" in row
        and "| 4.50e+10 (3.00e+10-6.00e+10) |" in row
    )
    assert any(line.endswith(", 0-3e+10 training FLOPs.") for line in md)


def test_default_seeds_and_design_are_declared_per_set(cmp):
    """The seeds scripts/power.py gives for a difference of 0.05: 14 for the tiny-model sets (the docs'
    median paired spread 0.06; a run takes tens of seconds), 6 for the real model (the pilot's paired
    spread 0.034); the margin 0.05 unless --margin; the primary the default (None) unless --primary."""
    from sppo_rl.experiments import decision

    for name in ("long", "methods", "latent", "all"):
        args = cmp.parse(["--set", name])
        assert args.seeds == list(range(14)) == list(range(decision.seeds_needed(0.06, 0.05)))
        assert args.margin == 0.05 and args.primary is None
    assert (
        cmp.parse(["--set", "real"]).seeds
        == list(range(6))
        == list(range(decision.seeds_needed(0.034, 0.05)))
    )
    args = cmp.parse(["--seeds", "3", "4", "--margin", "0.02", "--primary", "acc_at_seconds"])
    assert (args.seeds, args.margin, args.primary) == ([3, 4], 0.02, "acc_at_seconds")
