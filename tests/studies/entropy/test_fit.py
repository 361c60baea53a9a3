"""Tests for bebop.studies.entropy: per-token statistics, fits, summary and report files."""

import json
import math
import os

import numpy as np
import pytest
import torch

from bebop.studies.entropy import (TABLE_COLUMNS, binned_means, fit_line, read_table, summarize,
                                    token_stats, write_report)
from bebop.errors import BebopError


# -----------------------------------------------------------------------------
# token_stats

def test_uniform_entropy_is_log_n_with_zero_padding():
    V = 64
    for n in (1, 2, 7, 64):
        p = torch.zeros(V, dtype=torch.float64)
        p[:n] = 1.0 / n  # the zeros must contribute 0 log 0 = 0, not nan
        s = token_stats(p, p)
        assert s["target_entropy"].item() == pytest.approx(math.log(n), abs=1e-12)
        assert s["draft_entropy"].item() == pytest.approx(math.log(n), abs=1e-12)
        assert s["target_max_prob"].item() == pytest.approx(1.0 / n)


def test_p_equals_q_hits_both_oracles():
    p = torch.softmax(torch.randn(4, 100, generator=torch.Generator().manual_seed(0)), -1)
    s = token_stats(p, p.clone())
    torch.testing.assert_close(s["alpha"], torch.ones(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(s["greedy_accept_prob"], s["target_max_prob"])


def test_disjoint_supports_accept_nothing():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.9, 0.1])
    s = token_stats(p, q)
    assert s["alpha"].item() == 0.0
    assert s["greedy_accept_prob"].item() == 0.0
    assert s["target_max_prob"].item() == 0.5


def test_two_point_distributions_by_hand():
    # p = (0.7, 0.3), q = (0.4, 0.6): min = (0.4, 0.3) -> alpha 0.7; argmax q = 1 -> p = 0.3
    p = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    q = torch.tensor([[0.4, 0.6], [0.1, 0.9]], dtype=torch.float64)
    s = token_stats(p, q)
    torch.testing.assert_close(s["alpha"], torch.tensor([0.7, 0.9], dtype=torch.float64))
    torch.testing.assert_close(s["greedy_accept_prob"], torch.tensor([0.3, 0.8], dtype=torch.float64))
    torch.testing.assert_close(s["target_max_prob"], torch.tensor([0.7, 0.8], dtype=torch.float64))
    h = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    assert s["target_entropy"][0].item() == pytest.approx(h, abs=1e-12)
    hq = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    assert s["draft_entropy"][1].item() == pytest.approx(hq, abs=1e-12)


def test_random_batch_matches_numpy_reference():
    rng = np.random.default_rng(1)
    shape, V = (3, 5), 50
    p = rng.dirichlet(np.full(V, 0.3), size=shape)
    q = rng.dirichlet(np.full(V, 0.3), size=shape)
    p[..., :5] = 0.0  # some exact zeros in both
    q[..., 3:8] = 0.0
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)

    def ent(a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.where(a > 0, a * np.log(a), 0.0).sum(-1)

    ref = dict(target_entropy=ent(p), draft_entropy=ent(q), alpha=np.minimum(p, q).sum(-1),
               greedy_accept_prob=np.take_along_axis(p, q.argmax(-1)[..., None], -1)[..., 0],
               target_max_prob=p.max(-1))
    s = token_stats(torch.from_numpy(p), torch.from_numpy(q))
    for k, v in ref.items():
        assert s[k].shape == shape
        np.testing.assert_allclose(s[k].numpy(), v, rtol=1e-10, atol=1e-12, err_msg=k)


def test_low_precision_input_is_reduced_in_fp32():
    p = torch.softmax(torch.randn(2, 1000, generator=torch.Generator().manual_seed(2)), -1)
    s = token_stats(p.bfloat16(), p.bfloat16())
    assert s["alpha"].dtype == torch.float32
    with pytest.raises(ValueError, match="shape"):
        token_stats(p, p[:, :10])


# -----------------------------------------------------------------------------
# fit_line, binned_means

def test_fit_line_recovers_known_slope():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 3, 2000)
    y = 0.9 - 0.2 * x + rng.normal(0, 0.05, x.size)
    f = fit_line(x, y, n_boot=500, seed=0)
    assert f["n"] == 2000
    assert f["slope"] == pytest.approx(-0.2, abs=0.01)
    assert f["slope_ci"][0] < f["slope"] < f["slope_ci"][1]
    assert f["slope_ci"][0] < -0.2 < f["slope_ci"][1]
    assert f["slope_ci"][1] - f["slope_ci"][0] < 0.02
    assert f["intercept_ci"][0] < 0.9 < f["intercept_ci"][1]
    assert f["r2"] > 0.8
    # same seed, same interval
    assert fit_line(x, y, n_boot=500, seed=0)["slope_ci"] == f["slope_ci"]


def test_fit_line_interval_covers_truth_at_about_95_percent():
    rng = np.random.default_rng(3)
    hits = 0
    trials = 60
    for i in range(trials):
        x = rng.uniform(0, 2, 150)
        y = 0.5 + 0.3 * x + rng.normal(0, 0.2, x.size)
        lo, hi = fit_line(x, y, n_boot=300, seed=i)["slope_ci"]
        hits += lo < 0.3 < hi
    assert hits >= 0.85 * trials


def test_fit_line_degenerate_inputs_are_nan():
    assert math.isnan(fit_line([1.0], [2.0])["slope"])
    f = fit_line([1.0, 1.0, 1.0], [0.0, 1.0, 2.0])
    assert math.isnan(f["slope"]) and math.isnan(f["slope_ci"][0])
    f = fit_line([0.0, 1.0, np.nan, 2.0], [0.0, 2.0, 5.0, 4.0], n_boot=50)  # nan pair dropped
    assert f["n"] == 3 and f["slope"] == pytest.approx(2.0) and f["r2"] == pytest.approx(1.0)


def test_binned_means():
    x = np.array([0.0, 0.1, 0.5, 0.9, 2.5, 3.0])
    y = np.array([1.0, 3.0, 5.0, 7.0, 9.0, 100.0])
    # [1, 2) is empty and skipped; 2.5 falls in the last bin (right edge inclusive); 3.0 is outside
    b = binned_means(x, y, [0.0, 0.5, 1.0, 2.0, 2.5])
    assert [(r["lo"], r["hi"], r["count"], r["mean"]) for r in b] == [
        (0.0, 0.5, 2, 2.0), (0.5, 1.0, 2, 6.0), (2.0, 2.5, 1, 9.0)]
    assert b[0]["center"] == 0.25
    b = binned_means(x, y, 3)  # equal width over [0, 3]: last edge inclusive
    assert [(r["count"], r["mean"]) for r in b] == [(4, 4.0), (2, 54.5)]  # [1, 2) empty


# -----------------------------------------------------------------------------
# summarize / write_report / read_table

def synthetic_table(prob_slope=-0.1, greedy_slope=-0.3, temps=(0.6, 0.8, 1.0, 1.2, 1.4), n=300, seed=0):
    """Tokens whose expected acceptance is linear in entropy, with a known slope per mode."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in TABLE_COLUMNS}
    for T in temps:
        for depth in (0, 1, 2):
            m = n if depth == 0 else n // (2 * depth)
            h = T * rng.uniform(0.2, 2.0, m)  # hotter runs have higher entropy
            alpha = np.clip(0.95 + prob_slope * h + rng.normal(0, 0.03, m), 0, 1)
            greedy = np.clip(0.9 + greedy_slope * h + rng.normal(0, 0.03, m), 0, 1)
            cols["run"] += [f"T={T}"] * m
            cols["temperature"] += [T] * m
            cols["policy"] += ["base"] * m
            cols["depth"] += [depth] * m
            cols["target_entropy"] += list(h)
            cols["draft_entropy"] += list(h * 1.1)
            cols["alpha"] += list(alpha)
            cols["greedy_accept_prob"] += list(greedy)
            cols["target_max_prob"] += list(np.clip(greedy + 0.05, 0, 1))
            cols["accepted"] += list(rng.random(m) < alpha)
    return {k: np.asarray(v) for k, v in cols.items()}


def test_summarize_and_report_greedy_steeper(tmp_path):
    table = synthetic_table()
    s = summarize(table, n_boot=300)
    assert s["fit_depth"] == 0 and s["n_fit_rows"] == 5 * 300
    assert [r["run"] for r in s["runs"]] == ["T=0.6", "T=0.8", "T=1.0", "T=1.2", "T=1.4"]
    for level in ("token", "run"):
        assert s["fits"][level]["probabilistic"]["slope"] == pytest.approx(-0.1, abs=0.02)
        assert s["fits"][level]["greedy"]["slope"] == pytest.approx(-0.3, abs=0.02)
        assert s["verdict"][level]["greedy_steeper"] is True
    assert s["verdict"]["basis"] == "run" and s["verdict"]["greedy_steeper"] is True
    r = s["runs"][2]
    assert r["count"] == 300 and [d["depth"] for d in r["by_depth"]] == [0, 1, 2]
    assert r["gap_probabilistic"] == pytest.approx(1 - r["alpha"])
    assert r["gap_greedy"] == pytest.approx(r["target_max_prob"] - r["greedy_accept_prob"])
    assert abs(r["accepted_rate"] - r["alpha"]) < 0.1
    assert s["oracle_reference"] == dict(temperature=1.0, runs=["T=1.0"])
    assert sum(b["count"] for b in s["bins"]["pooled"]) == 1500
    assert list(s["bins"]["by_policy"]) == ["base"]
    # probabilistic acceptance sits above greedy in every bin for this table
    assert all(b["alpha"] > b["greedy_accept_prob"] for b in s["bins"]["pooled"])

    paths = write_report(table, s, str(tmp_path))
    for name in ("tokens.csv", "report.json", "report.md", "acceptance_vs_entropy.png",
                 "runs_acceptance_vs_entropy.png", "acceptance_by_depth.png"):
        assert os.path.getsize(tmp_path / name) > 0 and paths[name] == str(tmp_path / name)
    for name in ("acceptance_vs_entropy.png", "runs_acceptance_vs_entropy.png", "acceptance_by_depth.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["verdict"]["greedy_steeper"] is True and len(rep["runs"]) == 5
    md = (tmp_path / "report.md").read_text()
    assert "greedy acceptance falls faster with entropy than probabilistic acceptance" in md
    assert "Gap to the oracle bounds at T = 1.0" in md and "![" in md

    # round trip: the csv loads back to the same table and the same summary
    back = read_table(tmp_path / "tokens.csv")
    assert set(back) == set(table)
    for k, kind in TABLE_COLUMNS.items():
        if kind is float:
            np.testing.assert_allclose(back[k], table[k], rtol=1e-5, err_msg=k)
        else:
            assert back[k].dtype == np.asarray(table[k]).dtype or kind is str, k
            np.testing.assert_array_equal(back[k], table[k], err_msg=k)
    s2 = summarize(back, n_boot=300)
    assert s2["fits"]["run"]["greedy"]["slope"] == pytest.approx(s["fits"]["run"]["greedy"]["slope"], rel=1e-4)
    assert s2["verdict"]["greedy_steeper"] is True


def test_reversed_slopes_verdict_false(tmp_path):
    table = synthetic_table(prob_slope=-0.3, greedy_slope=-0.1, seed=1)
    s = summarize(table, n_boot=300)
    assert s["verdict"]["greedy_steeper"] is False
    assert s["verdict"]["token"]["greedy_steeper"] is False
    write_report(table, s, str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "does not fall faster" in md


def test_few_runs_fall_back_to_token_verdict_and_closest_temperature():
    table = synthetic_table(temps=(0.5, 1.2), n=200, seed=2)
    s = summarize(table, n_boot=200)
    assert s["verdict"]["basis"] == "token" and s["verdict"]["greedy_steeper"] is True
    assert s["oracle_reference"] == dict(temperature=1.2, runs=["T=1.2"])  # no T = 1.0: nearest


def test_bad_tables_raise():
    table = synthetic_table(temps=(1.0,), n=20)
    with pytest.raises(BebopError, match="missing"):
        summarize({k: v for k, v in table.items() if k != "alpha"})
    with pytest.raises(BebopError, match="depth 5"):
        summarize(table, depth=5)
    with pytest.raises(BebopError, match="different lengths"):
        summarize({**table, "alpha": table["alpha"][:-1]})
