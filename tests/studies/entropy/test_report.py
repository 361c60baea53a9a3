"""bebop.studies.entropy.report: the report files of a summarised trace (tokens.csv, report.json, report.md, the
plots), the verdict in words, and tokens.csv read back to the same table and summary."""

import gzip
import json
import os

import numpy as np
import pytest

from bebop.studies.entropy import TABLE_COLUMNS, read_table, summarize, write_report


def test_summarize_and_report_greedy_steeper(synthetic_table, tmp_path):
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
    (tmp_path / "tokens.csv.gz").write_bytes(gzip.compress((tmp_path / "tokens.csv").read_bytes()))
    zipped = read_table(tmp_path / "tokens.csv.gz")  # as the traces under results/ are kept
    assert all(np.array_equal(zipped[k], back[k]) for k in back)
    s2 = summarize(back, n_boot=300)
    assert s2["fits"]["run"]["greedy"]["slope"] == pytest.approx(s["fits"]["run"]["greedy"]["slope"], rel=1e-4)
    assert s2["verdict"]["greedy_steeper"] is True


def test_reversed_slopes_verdict_false(synthetic_table, tmp_path):
    table = synthetic_table(prob_slope=-0.3, greedy_slope=-0.1, seed=1)
    s = summarize(table, n_boot=300)
    assert s["verdict"]["greedy_steeper"] is False
    assert s["verdict"]["token"]["greedy_steeper"] is False
    write_report(table, s, str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "does not fall faster" in md
