"""bebop.studies.entropy.fit: least-squares fits with bootstrap intervals, binned means, and the summary's
verdict (its fallback with few runs, tables it refuses)."""

import math

import numpy as np
import pytest

from bebop.studies.entropy import binned_means, fit_line, summarize
from bebop.errors import BebopError


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
# summarize

def test_few_runs_fall_back_to_token_verdict_and_closest_temperature(synthetic_table):
    table = synthetic_table(temps=(0.5, 1.2), n=200, seed=2)
    s = summarize(table, n_boot=200)
    assert s["verdict"]["basis"] == "token" and s["verdict"]["greedy_steeper"] is True
    assert s["oracle_reference"] == dict(temperature=1.2, runs=["T=1.2"])  # no T = 1.0: nearest


def test_bad_tables_raise(synthetic_table):
    table = synthetic_table(temps=(1.0,), n=20)
    with pytest.raises(BebopError, match="missing"):
        summarize({k: v for k, v in table.items() if k != "alpha"})
    with pytest.raises(BebopError, match="depth 5"):
        summarize(table, depth=5)
    with pytest.raises(BebopError, match="different lengths"):
        summarize({**table, "alpha": table["alpha"][:-1]})
