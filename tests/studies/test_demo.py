"""`bebop demo` on tiny-llama with a random draft standing in for the shipped one: interleaved rounds, the runs,
the exactness check, the report and a verdict that says what the figures say."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bebop.drafts.mtp import new_mtp
from bebop.errors import BebopError
from bebop.studies import demo
from bebop.studies.demo_config import DemoConfig

TINY = DemoConfig(model="tiny-llama", rounds=2, steps_per_round=1, prompts_per_step=2, num_generations=2,
                  max_completion_length=8, eval_prompts=2, exactness_samples=100)


def test_demo_interleaves_rounds_and_ends_with_a_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "trained_draft", lambda model: new_mtp(model, seed=1))
    calls, run_rl = [], demo.run_rl

    def recorded(cfg, out, *args, **kwargs):
        calls.append((Path(out).name, cfg.steps, kwargs["resume"]))
        return run_rl(cfg, out, *args, **kwargs)

    monkeypatch.setattr(demo, "run_rl", recorded)
    text = demo.run_demo(tmp_path / "demo", TINY)
    # ar first in odd rounds, spec first in even ones; every round after the first resumes both runs
    assert calls == [("ar", 1, False), ("spec", 1, False), ("spec", 2, True), ("ar", 2, True)]
    for name in ("ar", "spec"):
        rows = [json.loads(x) for x in (tmp_path / "demo" / name / "metrics.jsonl").read_text().splitlines()]
        evals = [json.loads(x) for x in (tmp_path / "demo" / name / "eval.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        assert [e["step"] for e in evals] == [0, 1, 2]  # the held-out reward after every round
    exact = json.loads((tmp_path / "demo" / "exactness.json").read_text())
    assert exact["samples"] == 100 and exact["passed"]
    assert (tmp_path / "demo" / "report" / "report.png").stat().st_size > 0
    assert (tmp_path / "demo" / "verdict.md").read_text() == text + "\n"
    assert not (tmp_path / "demo" / "ar" / "ckpt").exists()  # the rounds' checkpoints are gone, the logs stay
    assert "Same distribution? Yes" in text and "projection, not measured" in text
    summaries = {s["rollout"]: s for s in json.loads((tmp_path / "demo" / "report" / "report.json").read_text())}
    assert f"{summaries['spec']['rollout_ratio_r']:.2f}x" in text
    with pytest.raises(BebopError, match="not empty"):  # never over a user's earlier demo
        demo.run_demo(tmp_path / "demo", TINY)


def summary(**kw):
    return {"steps": 6, "cpu": "AMD EPYC, AVX2 (bf16 emulated)", "acceptance_mean": 0.6, "rollout_ratio_r": 1.5,
            "baseline_rollout_share": 0.4, "amdahl_bound": 1 / (0.6 + 0.4 / 1.5), "speedup_per_token": 1.1, **kw}


EXACT = {"samples": 300, "threshold": 2e-4, "passed": True, "tests": [{"test": "t", "p_value": 0.31}]}


def test_verdict_reads_the_figures():
    text = demo.verdict({"ar": summary(), "spec": summary()}, EXACT, DemoConfig(), "AMD EPYC, AVX2",
                        Path("runs/demo/report/report.png"))
    assert "1.50x faster per token" in text and "acceptance 0.60" in text
    assert "smallest p = 0.310" in text
    assert "1.10x faster per generated token" in text and "most it could be here is 1.15x" in text
    assert "rollouts are 40% of a plain step" in text and "noise" not in text
    assert f"up to {1 / (0.3 + 0.7 / 1.5):.2f}x faster" in text  # the projection at a 70% rollout share
    assert "Why no rollout speedup" not in text


def test_verdict_says_when_speculation_lost_or_sampling_is_not_exact():
    slow = summary(rollout_ratio_r=0.8, speedup_per_token=0.9, amdahl_bound=0.9)
    failed = {**EXACT, "passed": False, "tests": [{"test": "t", "p_value": 1e-6}]}
    text = demo.verdict({"ar": summary(), "spec": slow}, failed, replace(DemoConfig(), draft_len=3),
                        "AMD EPYC, AVX2", Path("report.png"))
    assert "0.80x as fast, that is slower" in text
    assert "Why no rollout speedup" in text and "verifying 4 tokens" in text
    assert "Same distribution? NO" in text
    above = demo.verdict({"ar": summary(), "spec": summary(speedup_per_token=1.2)}, EXACT, DemoConfig(), "cpu",
                         Path("report.png"))
    assert "1.20x faster per generated token" in above and "above the bound is the runs' noise" in above
