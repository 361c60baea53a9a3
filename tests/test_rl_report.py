"""`bebop rl` and `bebop report` end to end on tiny-llama, and their one-line errors."""

import json

import pytest

from bebop.cli import main
from bebop.rl.report import amdahl

RUN = ["rl", "--model", "tiny-llama", "--mtp", "random", "--task", "arithmetic", "--steps", "1",
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
    (["rl", "--model", "tiny-llama", "--resume"], "cannot resume: no checkpoint"),
    (["report", "NOWHERE"], "not a `bebop rl` output directory"),
])
def test_bad_input_one_line(argv, message, tmp_path, capsys):
    if argv[0] == "rl":
        argv = argv + ["--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("bebop: error:") and message in err and "\n" not in err
