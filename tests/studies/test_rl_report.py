"""`bebop rl` and `bebop report` end to end on tiny-llama, and their one-line errors."""

import json

import pytest

from bebop.cli import main
from bebop.studies.rl_report import amdahl


def write_run(path, acceptance, step_s=1.0, cpu=None, **config):
    """A written `bebop rl` output directory: one step per acceptance value (None in an ar run), half of each
    step in rollouts; `config` over a frozen spec run's; run.json with `cpu` when given."""
    path.mkdir()
    config = {"model": "m", "task": "arithmetic", "rollout": "spec", "draft_strategy": "frozen", "async_mode": "off",
              "seed": 0, **config}
    (path / "config.json").write_text(json.dumps(config))
    if cpu is not None:
        (path / "run.json").write_text(json.dumps({"cpu": cpu, "cpu_capability": "AVX512"}))
    rows = [{"step": i + 1, "reward_mean": 0.1, "entropy_mean": 1.0, "tokens": 100, "step_s": step_s,
             "acceptance_rate": a, "rollout_s": step_s / 2, "train_s": step_s / 2, "mtp_train_s": 0.0, "sync_s": 0.0,
             "policy_version_lag": 0} for i, a in enumerate(acceptance)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)

RUN = ["rl", "--model", "tiny-llama", "--draft", "random", "--task", "arithmetic", "--steps", "1",
       "--prompts-per-step", "2", "--num-generations", "2", "--max-completion-length", "6", "--eval-prompts", "2",
       "--autocast", "off", "--threads", "1"]


def test_rl_then_report(tmp_path, capsys):
    main(RUN + ["--rollout", "ar", "--out", str(tmp_path / "ar")])
    main(RUN + ["--rollout", "spec", "--out", str(tmp_path / "spec")])
    main(["report", str(tmp_path / "ar"), str(tmp_path / "spec"), "--out", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert "Amdahl bound" in out and "Projection" in out
    summary = json.loads((tmp_path / "report" / "report.json").read_text())
    spec = summary[1]
    assert spec["rollout"] == "spec" and spec["baseline"] == str(tmp_path / "ar")
    assert spec["amdahl_bound"] == pytest.approx(amdahl(spec["baseline_rollout_share"], spec["rollout_ratio_r"]))
    assert spec["speedup"] == pytest.approx(summary[0]["wall_s"] / spec["wall_s"])
    assert (tmp_path / "report" / "report.png").stat().st_size > 10_000


def test_amdahl():
    assert amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl(0.0, 3.0) == 1.0 and amdahl(1.0, 3.0) == pytest.approx(3.0)


@pytest.mark.parametrize("argv,message", [
    (["rl", "--model", "tiny-llama", "--num-generations", "1"], "--num-generations must be >= 2"),
    (["rl", "--model", "tiny-llama", "--task", "nope"], "unknown task 'nope'"),
    (["rl", "--model", "tiny-llama", "--rollout", "beam"], "--rollout must be one of"),
    (["rl", "--model", "tiny-llama", "--learning-rate", "0"], "--learning-rate must be > 0"),
    (["rl", "--model", "no-such-model", "--steps", "1"], "unknown model 'no-such-model'"),
    (["rl", "--model", "tiny-llama", "--draft", "random", "--resume"], "cannot resume: no checkpoint"),
    (["report", "NOWHERE"], "not a `bebop rl` output directory"),
])
def test_bad_input_one_line(argv, message, tmp_path, capsys):
    if argv[0] == "rl":
        argv = argv + ["--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("bebop: error:") and message in err and "\n" not in err


def test_drift_and_entropy_fit_decide_what_the_data_say():
    from bebop.studies.rl_report import drift, entropy_fit

    flat = drift([0.40, 0.42, 0.41, 0.39] * 5)  # no change: the interval holds 0
    assert flat["steps_each"] == 10 and flat["change_ci95"][0] < 0 < flat["change_ci95"][1]
    falling = drift([0.5 + 0.01 * (i % 3) for i in range(10)] + [0.3 + 0.01 * (i % 3) for i in range(10)])
    assert falling["change"] == pytest.approx(-0.2) and falling["change_ci95"][1] < 0
    assert drift([0.4, 0.5, 0.6])["steps_each"] == 1 and drift([0.4]) is None  # short runs: half each
    rows = [{"entropy_mean": h, "acceptance_rate": 0.8 - 0.2 * h + 0.01 * (-1) ** i} for i, h in
            enumerate([0.5, 0.8, 1.1, 1.4, 1.7, 2.0])]
    fit = entropy_fit(rows)
    assert fit["slope"] == pytest.approx(-0.2, abs=0.02) and fit["slope_ci95"][1] < 0 and fit["n"] == 6
    assert entropy_fit(rows[:2]) is None and entropy_fit([{"entropy_mean": 1.0, "acceptance_rate": None}] * 5) is None


def test_report_tables_and_plots_drift_and_the_entropy_fit_of_a_long_run(tmp_path):
    """A written 24-step run (entropy rising, acceptance falling with it): the report's drift row and fit."""
    from bebop.studies.rl_report import write_report

    run = tmp_path / "spec"
    run.mkdir()
    config = {"model": "m", "task": "arithmetic", "rollout": "spec", "draft_strategy": "frozen", "async_mode": "off",
              "seed": 0}
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"step": i + 1, "reward_mean": 0.1, "entropy_mean": 1.0 + 0.05 * i,
             "acceptance_rate": 0.6 - 0.1 * (1.0 + 0.05 * i) + 0.005 * (-1) ** i, "tokens": 100, "step_s": 1.0,
             "rollout_s": 0.5, "train_s": 0.5, "mtp_train_s": 0.0, "sync_s": 0.0, "policy_version_lag": 0}
            for i in range(24)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report([str(run)], str(tmp_path / "report"))
    assert "## Acceptance through the run" in md
    s = json.loads((tmp_path / "report" / "report.json").read_text())[0]
    assert s["drift"]["steps_each"] == 10 and s["drift"]["change_ci95"][1] < 0
    assert s["acceptance_vs_entropy"]["slope"] == pytest.approx(-0.1, abs=0.01)
    assert (tmp_path / "report" / "report.png").stat().st_size > 10_000


def test_report_compares_drafts_step_by_step_and_labels_runs_by_directory(tmp_path):
    """Two written 30-step runs of the same seed whose drafts differ (one 0.05 more accepted at every step,
    with noise): each run is labelled by its directory and draft, and the second is compared with the first
    per step, the paired interval excluding 0; a run of another seed is not compared."""
    from bebop.studies.rl_report import write_report

    def write(name, mtp, shift, seed=0):
        acc = [0.4 + 0.1 * (i % 5) / 5 + shift + 0.01 * (-1) ** (i // (2 + seed + (shift > 0))) for i in range(30)]
        return write_run(tmp_path / name, acc, seed=seed, draft=f"runs/{mtp}")

    dirs = [write("spec-ce", "draft-ce", 0.0), write("spec-tv", "draft-tv", 0.05), write("other", "draft-ce", 0.0, 1)]
    md = write_report(dirs, str(tmp_path / "report"))
    s = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [x["label"] for x in s] == ["spec-ce: spec (frozen), off, draft draft-ce",
                                       "spec-tv: spec (frozen), off, draft draft-tv", "other: spec (frozen), off, draft draft-ce"]
    assert "versus" not in s[0] and "versus" not in s[2]
    v = s[1]["versus"]
    assert v["steps"] == 30 and v["mean"] == pytest.approx(0.05, abs=0.002) and 0 < v["ci95"][0] < 0.05 < v["ci95"][1]
    assert "## Drafts compared" in md and "| spec-tv: spec (frozen), off, draft draft-tv | spec-ce:" in md


def test_a_run_saved_before_the_draft_fields_were_renamed_reads_under_the_names_now(tmp_path):
    """config.json of runs from before RLConfig's mtp, mtp_strategy were named draft, draft_strategy."""
    from bebop.studies.rl_report import read_run, summarize

    old = tmp_path / "old"
    write_run(old, [0.5, 0.6], mtp="runs/draft-ce")
    config = json.loads((old / "config.json").read_text())
    config["mtp_strategy"] = config.pop("draft_strategy")
    (old / "config.json").write_text(json.dumps(config | {"mtp_strategy": "online-kl"}))
    s = summarize(read_run(old))
    assert s["label"] == "old: spec (online-kl), off, draft draft-ce" and s["draft_strategy"] == "online-kl"


def test_speedup_over_ar_only_on_the_same_cpu(tmp_path):
    """Three written runs of one seed: ar and spec on one CPU, spec on another. A paused step is counted as a
    stall. Only the spec run beside ar gets a speedup (ar's 2.0 s per step over its 1.0 s); the other is named as
    having no ar run on its CPU, and the fastest run is named among the runs of one CPU, not against the faster
    machine's."""
    from bebop.studies.rl_report import write_report

    def write(name, rollout, step_s, cpu):
        acc = [None if rollout == "ar" else 0.5 + 0.01 * i for i in range(4)]
        return write_run(tmp_path / name, acc, step_s=step_s, cpu=cpu, rollout=rollout, draft=None)

    dirs = [write("ar", "ar", 2.0, "Intel"), write("spec-here", "spec", 1.0, "Intel"),
            write("spec-there", "spec", 0.5, "AMD")]
    rows = [json.loads(x) for x in (tmp_path / "ar" / "metrics.jsonl").read_text().splitlines()]
    rows[0]["step_s"] = 600.0  # paused for a benchmark: its 598 s beyond the median are counted, not hidden
    (tmp_path / "ar" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(dirs, str(tmp_path / "report"))
    assert "| ar: ar, off | 4 | 606.0 (1: 598) |" in md and "| spec-here: spec (frozen), off | 4 | 4.0 |" in md
    rows[0]["step_s"] = 2.0  # the speedup below from unpaused runs
    (tmp_path / "ar" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(dirs, str(tmp_path / "report"))
    s = json.loads((tmp_path / "report" / "report.json").read_text())
    assert s[1]["speedup"] == pytest.approx(2.0) and "speedup" not in s[2] and s[2]["cpu"] == "AMD, AVX512"
    assert "No `ar` run of the same seed, async mode and CPU for: spec-there." in md
    assert "- Intel, AVX512: ar, spec-here" in md and "- AMD, AVX512: spec-there" in md
    assert "Fastest here on Intel, AVX512: **spec-here" in md and "Fastest here on AMD" not in md


def test_replicates_are_runs_of_one_recipe_compared_on_run_means(tmp_path):
    """Two recipes, each run twice (the second CE run with another seed, which still makes it a replicate, and
    saved after RLConfig gained `device`, at its default):
    each recipe's run means and their spread, and CE against e2e-TV on run means, whose interval is wide with two
    runs each; a run of a third recipe (greedy drafting) is in no group."""
    from bebop.studies.rl_report import replicates, summarize, read_run

    def write(name, mtp, level, seed=0, rollout="spec", **more):
        acc = [level + 0.01 * (-1) ** i for i in range(10)]
        return write_run(tmp_path / name, acc, seed=seed, rollout=rollout, draft=f"runs/{mtp}", **more)

    dirs = [write("tv", "draft-tv", 0.52), write("ce", "draft-ce", 0.50), write("tv-again", "draft-tv", 0.53),
            write("ce-seed1", "draft-ce", 0.49, seed=1, device="auto"), write("greedy", "draft-tv", 0.45, rollout="spec-greedy")]
    reps = replicates([summarize(read_run(d)) for d in dirs])
    assert [len(r["runs"]) for r in reps] == [2, 2] and "versus" not in reps[0]
    assert reps[0]["means"] == pytest.approx([0.52, 0.53]) and reps[0]["sd"] == pytest.approx(0.00707, abs=1e-4)
    v = reps[1]["versus"]
    assert v["difference"] == pytest.approx(-0.03) and v["ci95"][0] < -0.03 < v["ci95"][1] < 0.1
    assert v["ci95"][1] - v["ci95"][0] > 0.05  # two runs a recipe: wide


def test_a_gpu_run_is_placed_on_its_gpu(tmp_path):
    """run.json names the device: a GPU run's wall times belong to that GPU, not to the host's CPU."""
    from bebop.studies.rl_report import read_run

    path = write_run(tmp_path / "gpu", [0.5, 0.6], cpu="AMD EPYC")
    (tmp_path / "gpu" / "run.json").write_text(json.dumps({"device": "NVIDIA H200", "cpu": "AMD EPYC",
                                                           "cpu_capability": "AVX512"}))
    assert read_run(path)["cpu"] == "NVIDIA H200"
    (tmp_path / "gpu" / "run.json").write_text(json.dumps({"device": "cpu", "cpu": "AMD EPYC",
                                                           "cpu_capability": "AVX512"}))
    assert read_run(path)["cpu"] == "AMD EPYC, AVX512"
