"""The trace's columns and its statistics: least-squares fits with bootstrap intervals, binned means, and the
summary of a trace (per-run means, entropy bins, fits and the verdict)."""

import numpy as np

from bebop.errors import BebopError

# column -> type; the trace must have all of these (extra columns are carried along)
TABLE_COLUMNS = {
    "run": str,
    "temperature": float,
    "policy": str,
    "depth": int,
    "target_entropy": float,
    "draft_entropy": float,
    "alpha": float,
    "greedy_accept_prob": float,
    "target_max_prob": float,
    "accepted": bool,
}
# the per-token statistics we average
STAT_COLUMNS = ("target_entropy", "draft_entropy", "alpha", "greedy_accept_prob", "target_max_prob")
# a run-level bootstrap over pairs needs a few points before its interval means
# anything (with 3 points most resamples have 2 distinct x and fit them exactly)
MIN_RUNS_FOR_RUN_VERDICT = 4


def fit_line(x, y, n_boot=1000, seed=0):
    """Least-squares y = slope * x + intercept, with 95% bootstrap percentile intervals.

    The bootstrap resamples (x, y) pairs, so it makes no assumption about the
    noise being constant across x (acceptance noise is not: it shrinks near 0 and 1).
    Non-finite pairs are dropped. With fewer than 2 distinct x everything is nan.
    Note: pooled tokens from one sequence are correlated, so token-level intervals
    are somewhat optimistic; the run-level fit does not have that problem.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise BebopError(f"fit_line: x has {x.size} values but y has {y.size}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(x.size)
    nan = float("nan")
    out = dict(slope=nan, intercept=nan, r2=nan, slope_ci=(nan, nan), intercept_ci=(nan, nan), n=n)
    if n < 2:
        return out
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    if not sxx > 0:
        return out
    slope = ((x - xm) * (y - ym)).sum() / sxx
    intercept = ym - slope * xm
    ss_res = ((y - (slope * x + intercept)) ** 2).sum()
    ss_tot = ((y - ym) ** 2).sum()
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else nan

    # vectorised bootstrap, chunked so n_boot x n index matrices stay ~ 32 MB
    rng = np.random.default_rng(seed)
    chunk = max(1, int(4_000_000 // n))
    slopes, intercepts = [], []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))
        xs, ys = x[idx], y[idx]
        xbm, ybm = xs.mean(1, keepdims=True), ys.mean(1, keepdims=True)
        sxx_b = ((xs - xbm) ** 2).sum(1)
        sxy_b = ((xs - xbm) * (ys - ybm)).sum(1)
        # a resample that drew a single x value has no slope; leave it out
        ok = sxx_b > 1e-9 * sxx
        s = np.where(ok, sxy_b / np.where(ok, sxx_b, 1.0), nan)
        slopes.append(s)
        intercepts.append(ybm[:, 0] - s * xbm[:, 0])
    slopes, intercepts = np.concatenate(slopes), np.concatenate(intercepts)

    def ci(v):
        v = v[np.isfinite(v)]
        if v.size == 0:
            return (nan, nan)
        lo, hi = np.percentile(v, [2.5, 97.5])
        return (float(lo), float(hi))

    out.update(slope=float(slope), intercept=float(intercept), r2=float(r2),
               slope_ci=ci(slopes), intercept_ci=ci(intercepts))
    return out


def bin_edges(x, bins):
    if np.ndim(bins) == 0:
        x = np.asarray(x, dtype=np.float64)
        x = x[np.isfinite(x)]
        lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 1.0)
        if hi <= lo:  # all the same value: one bin around it
            lo, hi = lo - 0.5, hi + 0.5
        return np.linspace(lo, hi, int(bins) + 1)
    edges = np.asarray(bins, dtype=np.float64)
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise BebopError("binned_means: bin edges must be a 1-D increasing sequence of 2+ values")
    return edges


def binned_means(x, y, bins):
    """Mean of y in bins of x. bins: a number of equal-width bins over x's range, or edges.

    Bins are [lo, hi), except the last which includes hi. Empty bins are skipped.
    Returns a list of dict(lo, hi, center, mean, count).
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    edges = bin_edges(x, bins)
    keep = np.isfinite(x) & np.isfinite(y) & (x >= edges[0]) & (x <= edges[-1])
    x, y = x[keep], y[keep]
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, edges.size - 2)
    out = []
    for b in range(edges.size - 1):
        sel = which == b
        count = int(sel.sum())
        if count == 0:
            continue
        lo, hi = float(edges[b]), float(edges[b + 1])
        out.append(dict(lo=lo, hi=hi, center=0.5 * (lo + hi), mean=float(y[sel].mean()), count=count))
    return out


def check_table(table):
    """Validate the trace and return it as typed numpy arrays (extra columns kept)."""
    missing = [c for c in TABLE_COLUMNS if c not in table]
    if missing:
        raise BebopError(f"entropy trace is missing columns: {', '.join(missing)}")
    cols = {k: np.asarray(v).ravel() for k, v in table.items()}
    lengths = {k: v.size for k, v in cols.items()}
    if len(set(lengths.values())) != 1:
        raise BebopError(f"entropy trace columns have different lengths: {lengths}")
    if next(iter(lengths.values())) == 0:
        raise BebopError("entropy trace is empty: no draft positions were examined")
    for k, kind in TABLE_COLUMNS.items():
        cols[k] = cols[k].astype(str) if kind is str else cols[k].astype(kind)
    return cols


def _means(t, sel):
    """Mean statistics over the rows selected by boolean mask sel."""
    count = int(sel.sum())
    m = {k: (float(t[k][sel].mean()) if count else float("nan")) for k in STAT_COLUMNS}
    m["accepted_rate"] = float(t["accepted"][sel].mean()) if count else float("nan")
    m["count"] = count
    return m


def _compare(fits):
    """Is greedy's slope more negative than probabilistic's, with disjoint 95% intervals?"""
    g, p = fits["greedy"], fits["probabilistic"]
    # nan comparisons are False, so a fit that could not be made never passes
    disjoint = g["slope_ci"][1] < p["slope_ci"][0]
    return dict(greedy_steeper=bool(g["slope"] < p["slope"] and disjoint),
                greedy_slope=g["slope"], greedy_slope_ci=g["slope_ci"],
                probabilistic_slope=p["slope"], probabilistic_slope_ci=p["slope_ci"],
                intervals_disjoint=bool(disjoint), n=g["n"])


def _run_row(t, name, at_depth):
    """One run's means at the fit depth, its gaps to the oracles, and its means over all depths and per depth."""
    in_run = t["run"] == name
    first = int(np.flatnonzero(in_run)[0])
    row = dict(run=name, policy=str(t["policy"][first]), temperature=float(t["temperature"][first]))
    row.update(_means(t, in_run & at_depth))
    row["gap_probabilistic"] = 1.0 - row["alpha"]
    row["gap_greedy"] = row["target_max_prob"] - row["greedy_accept_prob"]
    row["all_depths"] = _means(t, in_run)
    row["by_depth"] = [dict(depth=int(d), **_means(t, in_run & (t["depth"] == d)))
                       for d in np.unique(t["depth"][in_run])]
    return row


def _entropy_bins(t, at_depth, n_bins):
    """Means per target-entropy bin: one set of edges shared by the pooled view and every policy, so the curves
    can be compared bin by bin."""
    edges = bin_edges(t["target_entropy"][at_depth], n_bins)

    def bin_table(sel):
        cols = {k: binned_means(t["target_entropy"][sel], t[k][sel], edges)
                for k in ("alpha", "greedy_accept_prob", "target_max_prob")}
        return [dict(lo=b["lo"], hi=b["hi"], center=b["center"], count=b["count"],
                     **{k: cols[k][i]["mean"] for k in cols})
                for i, b in enumerate(cols["alpha"])]

    policies = list(dict.fromkeys(t["policy"].tolist()))
    return dict(edges=edges.tolist(), pooled=bin_table(at_depth),
                by_policy={pol: bin_table(at_depth & (t["policy"] == pol)) for pol in policies})


def summarize(table, n_boot=1000, seed=0, depth=0, n_bins=10):
    """Summarise a trace; see the package docstring (bebop.studies.entropy) for why fits use depth 0 only.

    Returns a JSON-friendly dict with keys:
      fit_depth, n_rows, n_fit_rows, n_boot, seed
      runs: list (in order of first appearance) of dict(run, policy, temperature,
            <STAT_COLUMNS>, accepted_rate, count -- means over the run's rows at fit_depth,
            gap_probabilistic = 1 - alpha, gap_greedy = target_max_prob - greedy_accept_prob,
            all_depths: the same means over every depth, by_depth: [dict(depth, means...)])
      bins: dict(edges, pooled, by_policy) -- per target-entropy bin (fit_depth rows):
            dict(lo, hi, center, count, alpha, greedy_accept_prob, target_max_prob)
      fits: dict(token=..., run=...), each dict(probabilistic, greedy, greedy_oracle) of
            fit_line results for alpha / greedy_accept_prob / target_max_prob on target
            entropy; token = pooled fit_depth rows, run = per-run means (the paper's plot)
      verdict: dict(greedy_steeper, basis, token, run) -- token/run are _compare results;
            basis is "run" when at least MIN_RUNS_FOR_RUN_VERDICT runs exist, else "token"
      oracle_reference: dict(temperature, runs) -- runs at the temperature closest to 1.0
    """
    t = check_table(table)
    runs = list(dict.fromkeys(t["run"].tolist()))
    at_depth = t["depth"] == depth
    if not at_depth.any():
        raise BebopError(f"entropy trace has no rows at draft depth {depth}")

    run_rows = [_run_row(t, name, at_depth) for name in runs]
    h = t["target_entropy"][at_depth]
    bins = _entropy_bins(t, at_depth, n_bins)

    modes = dict(probabilistic="alpha", greedy="greedy_accept_prob", greedy_oracle="target_max_prob")
    fits = dict(
        token={m: fit_line(h, t[k][at_depth], n_boot, seed) for m, k in modes.items()},
        run={m: fit_line([r["target_entropy"] for r in run_rows], [r[k] for r in run_rows], n_boot, seed)
             for m, k in modes.items()},
    )
    n_run_points = fits["run"]["greedy"]["n"]
    basis = "run" if n_run_points >= MIN_RUNS_FOR_RUN_VERDICT else "token"
    verdict = dict(token=_compare(fits["token"]), run=_compare(fits["run"]), basis=basis)
    verdict["greedy_steeper"] = verdict[basis]["greedy_steeper"]

    # the oracle gap is quoted at T = 1.0 (sampling from the policy as trained) when
    # the trace has it; otherwise at the closest temperature present
    temps = np.array([r["temperature"] for r in run_rows])
    ref_t = float(temps[np.argmin(np.abs(temps - 1.0))])
    oracle_reference = dict(temperature=ref_t,
                            runs=[r["run"] for r in run_rows if r["temperature"] == ref_t])

    return dict(fit_depth=depth, n_rows=int(t["run"].size), n_fit_rows=int(at_depth.sum()),
                n_boot=n_boot, seed=seed, runs=run_rows, bins=bins, fits=fits,
                verdict=verdict, oracle_reference=oracle_reference)
