"""Acceptance vs. policy entropy: the study behind `bebop analyze entropy`.

The claim under test: the draft's acceptance rate falls roughly linearly as the
policy's (target's) entropy rises, and it falls much faster for greedy drafting
(x = argmax q, accepted with probability p(x)) than for probabilistic drafting
(x ~ q, accepted with min(1, p/q), overall probability alpha = sum_v min(p, q)).

Input is a trace: one row per examined draft position, a dict of equal-length
1-D numpy arrays (see TABLE_COLUMNS). Every acceptance number here is an
expected acceptance probability computed from the full p and q at that position
(token_stats), not the coin flip of the actual run, so both drafting modes are
measured on the same tokens; the actual run's `accepted` flag is only reported
as a sanity check (for a probabilistic run its mean should track mean alpha).

Which draft positions go into the fits: depth 0 only, by default. Position 0 is
examined for every draft block, so its rows are an unbiased sample of the
policy's tokens. Position k > 0 is only examined when positions 0..k-1 were
accepted in the actual run, so deeper rows over-represent easy (low-entropy)
contexts, and their q is conditioned on a draft prefix the policy agreed with.
Mixing them in would tilt the entropy/acceptance relationship by a selection
effect that depends on the run's drafting mode. Deeper positions are still
summarised, per run and per depth, separately.
"""

import csv
import json
import math
import os

import numpy as np
import torch

from bebop.errors import BebopError
from bebop.sampling import token_stats  # noqa: F401  (re-exported: the per-token quantities studied here)

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


# -----------------------------------------------------------------------------
# per-token statistics (called by the engine on its p/q tensors)

# -----------------------------------------------------------------------------
# small statistics helpers (numpy only)

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


def _bin_edges(x, bins):
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
    edges = _bin_edges(x, bins)
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


# -----------------------------------------------------------------------------
# the study

def _check_table(table):
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


def summarize(table, n_boot=1000, seed=0, depth=0, n_bins=10):
    """Summarise a trace; see the module docstring for why fits use depth 0 only.

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
    t = _check_table(table)
    runs = list(dict.fromkeys(t["run"].tolist()))
    at_depth = t["depth"] == depth
    if not at_depth.any():
        raise BebopError(f"entropy trace has no rows at draft depth {depth}")

    run_rows = []
    for name in runs:
        in_run = t["run"] == name
        first = int(np.flatnonzero(in_run)[0])
        row = dict(run=name, policy=str(t["policy"][first]), temperature=float(t["temperature"][first]))
        row.update(_means(t, in_run & at_depth))
        row["gap_probabilistic"] = 1.0 - row["alpha"]
        row["gap_greedy"] = row["target_max_prob"] - row["greedy_accept_prob"]
        row["all_depths"] = _means(t, in_run)
        row["by_depth"] = [dict(depth=int(d), **_means(t, in_run & (t["depth"] == d)))
                           for d in np.unique(t["depth"][in_run])]
        run_rows.append(row)

    # entropy bins: one set of edges shared by the pooled view and every policy, so
    # the curves can be compared bin by bin
    h = t["target_entropy"][at_depth]
    edges = _bin_edges(h, n_bins)

    def bin_table(sel):
        cols = {k: binned_means(t["target_entropy"][sel], t[k][sel], edges)
                for k in ("alpha", "greedy_accept_prob", "target_max_prob")}
        return [dict(lo=b["lo"], hi=b["hi"], center=b["center"], count=b["count"],
                     **{k: cols[k][i]["mean"] for k in cols})
                for i, b in enumerate(cols["alpha"])]

    policies = list(dict.fromkeys(t["policy"].tolist()))
    bins = dict(edges=edges.tolist(), pooled=bin_table(at_depth),
                by_policy={pol: bin_table(at_depth & (t["policy"] == pol)) for pol in policies})

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


# -----------------------------------------------------------------------------
# files

def _jsonable(v, digits=6):
    """numpy -> python, floats to `digits` significant digits, nan/inf -> null."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x, digits) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_jsonable(x, digits) for x in (v.tolist() if isinstance(v, np.ndarray) else v)]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return float(f"{v:.{digits}g}") if math.isfinite(v) else None
    return v


def _write_csv(table, path):
    t = _check_table(table)
    names = list(TABLE_COLUMNS) + [k for k in t if k not in TABLE_COLUMNS]

    def fmt(col):
        a = t[col]
        if a.dtype == bool:
            return a.astype(np.int8).astype(str)
        if np.issubdtype(a.dtype, np.integer):
            return a.astype(str)
        if np.issubdtype(a.dtype, np.floating):
            # 6 significant digits: plenty for probabilities and entropies, ~half the bytes of repr
            return np.char.mod("%.6g", a)
        return a.astype(str)

    cols = [fmt(c) for c in names]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows(zip(*cols))


def read_table(path):
    """Load a tokens.csv written by write_report back into a trace table."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise BebopError(f"{path}: no rows")
    header, body = rows[0], rows[1:]
    raw = {name: [r[i] for r in body] for i, name in enumerate(header)}
    out = {}
    for name, vals in raw.items():
        kind = TABLE_COLUMNS.get(name)
        if kind is bool:
            out[name] = np.array([v.strip().lower() in ("1", "true") for v in vals])
        elif kind is str:
            out[name] = np.array(vals, dtype=str)
        elif kind is not None:
            out[name] = np.array(vals, dtype=np.float64).astype(kind)
        else:  # an extra column: numeric if it parses, text otherwise
            try:
                out[name] = np.array(vals, dtype=np.float64)
            except ValueError:
                out[name] = np.array(vals, dtype=str)
    _check_table(out)
    return out


def _f(v, digits=3):
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _ci(fit, key, digits=3):
    lo, hi = fit[key + "_ci"]
    return f"{_f(fit[key], digits)} [{_f(lo, digits)}, {_f(hi, digits)}]"


def _plots(table, summary, out_dir):
    # Figure + Agg canvas directly, so we never touch pyplot's global backend/state
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    t = _check_table(table)
    sel = t["depth"] == summary["fit_depth"]
    colors = dict(probabilistic="tab:blue", greedy="tab:red", greedy_oracle="tab:red")

    def new():
        fig = Figure(figsize=(7, 4.8), dpi=120)
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    def line(ax, fit, xs, **kw):
        if math.isfinite(fit["slope"]):
            ax.plot(xs, fit["slope"] * xs + fit["intercept"], **kw)

    # 1) token level: light scatter, binned means, fits, oracles
    fig, ax = new()
    h = t["target_entropy"][sel]
    rng = np.random.default_rng(summary["seed"])
    sub = rng.choice(h.size, size=min(h.size, 3000), replace=False)
    ax.scatter(h[sub], t["alpha"][sel][sub], s=3, alpha=0.12, color=colors["probabilistic"], lw=0)
    ax.scatter(h[sub], t["greedy_accept_prob"][sel][sub], s=3, alpha=0.12, color=colors["greedy"], lw=0)
    b = summary["bins"]["pooled"]
    c = np.array([r["center"] for r in b])
    xs = np.linspace(summary["bins"]["edges"][0], summary["bins"]["edges"][-1], 50)
    for mode, key in (("probabilistic", "alpha"), ("greedy", "greedy_accept_prob")):
        fit = summary["fits"]["token"][mode]
        ax.plot(c, [r[key] for r in b], "o", color=colors[mode], label=f"{mode} (binned mean)")
        line(ax, fit, xs, color=colors[mode], lw=1.5, label=f"{mode} fit, slope {_f(fit['slope'])}")
    ax.axhline(1.0, color=colors["probabilistic"], ls=":", label="probabilistic oracle (q = p)")
    ax.plot(c, [r["target_max_prob"] for r in b], ls=":", marker=".", color=colors["greedy_oracle"],
            label="greedy oracle (binned mean max p)")
    ax.set(xlabel="target entropy H(p) [nats]", ylabel="acceptance probability", ylim=(-0.02, 1.05),
           title=f"Acceptance vs entropy, draft depth {summary['fit_depth']}, all runs pooled")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "acceptance_vs_entropy.png"))

    # 2) run level: one point per run per mode, with the run-level fits
    fig, ax = new()
    runs = summary["runs"]
    hr = np.array([r["target_entropy"] for r in runs])
    xs = np.linspace(np.nanmin(hr), np.nanmax(hr), 50) if np.isfinite(hr).any() else np.array([])
    for mode, key in (("probabilistic", "alpha"), ("greedy", "greedy_accept_prob")):
        fit = summary["fits"]["run"][mode]
        ys = [r[key] for r in runs]
        ax.plot(hr, ys, "o", color=colors[mode], label=mode)
        line(ax, fit, xs, color=colors[mode], lw=1.2,
             label=f"{mode} fit, slope {_f(fit['slope'])}, r² {_f(fit['r2'], 2)}")
        for r, y in zip(runs, ys):
            ax.annotate(r["run"], (r["target_entropy"], y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="mean target entropy H(p) [nats]", ylabel="mean acceptance probability",
           title=f"Per-run means, draft depth {summary['fit_depth']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "runs_acceptance_vs_entropy.png"))

    # 3) by depth: solid = probabilistic alpha, dashed = greedy, one colour per run
    fig, ax = new()
    for i, r in enumerate(runs):
        d = [x["depth"] for x in r["by_depth"]]
        color = f"C{i % 10}"
        ax.plot(d, [x["alpha"] for x in r["by_depth"]], "o-", color=color, label=r["run"])
        ax.plot(d, [x["greedy_accept_prob"] for x in r["by_depth"]], "s--", color=color)
    ax.set(xlabel="draft depth", ylabel="mean acceptance probability",
           title="Acceptance by draft depth (solid: probabilistic, dashed: greedy)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "acceptance_by_depth.png"))


def _markdown(summary):
    s = summary
    d = s["fit_depth"]
    L = ["# Draft acceptance vs. policy entropy", ""]
    L += [
        "## What was measured",
        "",
        "For every examined draft position of each speculative generation run we have the target",
        "(policy) next-token distribution p at the sampling temperature and the MTP draft's",
        "distribution q. From them:",
        "",
        "- **target entropy** H(p) and draft entropy H(q), in nats;",
        "- **probabilistic acceptance** alpha = sum_v min(p, q): the chance a draft x ~ q is accepted",
        "  with probability min(1, p/q). Its oracle (q = p) is 1;",
        "- **greedy acceptance** p(argmax q): the chance the draft x = argmax q is accepted.",
        "  Its oracle (q = p) is max_v p.",
        "",
        "These are exact expected acceptance probabilities, so both drafting modes are compared on the",
        "same tokens. 'accepted rate' is the fraction of drafts the actual run accepted (a sanity check).",
        f"Fits and entropy bins use draft depth {d} only: that position is examined for every draft",
        "block, while deeper positions are only reached after the earlier ones were accepted, which",
        "over-samples easy contexts. Deeper positions are summarised per depth below.",
        "",
        f"Rows: {s['n_rows']} draft positions, {s['n_fit_rows']} at depth {d}, {len(s['runs'])} runs.",
        "",
        "## Per run (depth %d)" % d,
        "",
        "| run | policy | T | tokens | H(p) | H(q) | alpha | greedy p(argmax q) | max p | accepted rate |"
        " gap to prob. oracle | gap to greedy oracle |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in s["runs"]:
        L.append(f"| {r['run']} | {r['policy']} | {r['temperature']:g} | {r['count']} | {_f(r['target_entropy'])} "
                 f"| {_f(r['draft_entropy'])} | {_f(r['alpha'])} | {_f(r['greedy_accept_prob'])} "
                 f"| {_f(r['target_max_prob'])} | {_f(r['accepted_rate'])} | {_f(r['gap_probabilistic'])} "
                 f"| {_f(r['gap_greedy'])} |")

    L += ["", "## Linear fits: acceptance = slope x H(p) + intercept", "",
          f"95% intervals are bootstrap percentiles over resampled pairs ({s['n_boot']} resamples).",
          f"Token level pools all depth-{d} tokens (tokens of one sequence are correlated, so these",
          "intervals are optimistic); run level fits one point per run (the paper's plot).",
          "", "| level | mode | slope [95% CI] | intercept [95% CI] | r² | n |", "|---|---|---|---|---|---|"]
    for level in ("token", "run"):
        for mode in ("probabilistic", "greedy", "greedy_oracle"):
            fit = s["fits"][level][mode]
            L.append(f"| {level} | {mode.replace('_', ' ')} | {_ci(fit, 'slope')} | {_ci(fit, 'intercept')} "
                     f"| {_f(fit['r2'])} | {fit['n']} |")

    v = s["verdict"]
    b = v[v["basis"]]
    level = "per-run means" if v["basis"] == "run" else f"pooled depth-{d} tokens"
    if not (math.isfinite(b["greedy_slope"]) and math.isfinite(b["probabilistic_slope"])):
        sentence = "the slopes could not be fitted (too few distinct entropy values)"
    elif v["greedy_steeper"]:
        sentence = "greedy acceptance falls faster with entropy than probabilistic acceptance"
    elif b["greedy_slope"] < b["probabilistic_slope"]:
        sentence = ("greedy acceptance has the more negative slope, but the 95% intervals overlap, so the "
                    "difference is not established")
    else:
        sentence = "greedy acceptance does not fall faster with entropy than probabilistic acceptance"
    L += ["", "## Verdict", "",
          f"Measured on {level}: {sentence} (greedy slope {_ci(b, 'greedy_slope')} vs probabilistic "
          f"{_ci(b, 'probabilistic_slope')} per nat).", ""]
    other = "token" if v["basis"] == "run" else "run"
    if v["basis"] == "token":
        L.append(f"(Fewer than {MIN_RUNS_FOR_RUN_VERDICT} runs, so the verdict uses pooled tokens rather than "
                 "the run-level fit.)")
    L.append(f"At {other} level the same test gives: greedy steeper with disjoint intervals = "
             f"{v[other]['greedy_steeper']}.")

    ref = s["oracle_reference"]
    at = "T = 1.0" if ref["temperature"] == 1.0 else f"T = {ref['temperature']:g} (closest to 1.0 in this trace)"
    L += ["", f"## Gap to the oracle bounds at {at}", ""]
    for r in s["runs"]:
        if r["run"] in ref["runs"]:
            L.append(f"- {r['run']}: probabilistic {_f(r['alpha'])} vs oracle 1 (gap {_f(r['gap_probabilistic'])}); "
                     f"greedy {_f(r['greedy_accept_prob'])} vs oracle {_f(r['target_max_prob'])} "
                     f"(gap {_f(r['gap_greedy'])}).")

    L += ["", "## By draft depth", "",
          "Deeper positions are conditional on every earlier draft in the block having been accepted.", "",
          "| run | depth | positions | H(p) | alpha | greedy p(argmax q) | max p | accepted rate |",
          "|---|---|---|---|---|---|---|---|"]
    for r in s["runs"]:
        for x in r["by_depth"]:
            L.append(f"| {r['run']} | {x['depth']} | {x['count']} | {_f(x['target_entropy'])} | {_f(x['alpha'])} "
                     f"| {_f(x['greedy_accept_prob'])} | {_f(x['target_max_prob'])} | {_f(x['accepted_rate'])} |")

    L += ["", "## Plots", "",
          "![Acceptance vs entropy, pooled tokens](acceptance_vs_entropy.png)", "",
          "![Per-run mean acceptance vs mean entropy](runs_acceptance_vs_entropy.png)", "",
          "![Acceptance by draft depth](acceptance_by_depth.png)", ""]
    return "\n".join(L)


def write_report(table, summary, out_dir):
    """Write tokens.csv, report.json, report.md and three PNG plots into out_dir.

    Returns a dict name -> path of the files written.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in (
        "tokens.csv", "report.json", "report.md",
        "acceptance_vs_entropy.png", "runs_acceptance_vs_entropy.png", "acceptance_by_depth.png")}
    _write_csv(table, paths["tokens.csv"])
    with open(paths["report.json"], "w") as f:
        json.dump(_jsonable(summary), f, indent=1)
        f.write("\n")
    with open(paths["report.md"], "w") as f:
        f.write(_markdown(summary))
    _plots(table, summary, out_dir)
    return paths


# -----------------------------------------------------------------------------
# collecting the trace with the engine


def collect(target, mtp, prompts, temperatures, draft_len, max_new_tokens=64, seed=0, policy="base",
            mode="spec", progress=True):
    """Run the engine at each temperature with trace=True and return one table (TABLE_COLUMNS plus `row`)."""
    from tqdm import tqdm

    from bebop.engine.generation import generate
    from bebop.sampling import SamplingParams

    parts = []
    for T in tqdm(temperatures, desc=f"entropy study ({policy})", disable=not progress):
        g = generate(target, prompts, max_new_tokens, SamplingParams(T), mode=mode, mtp=mtp, draft_len=draft_len,
                     seed=seed, trace=True)
        if g.trace is None:
            continue
        n = len(g.trace["depth"])
        label = f"T={T:g}" if policy == "base" else f"{policy},T={T:g}"
        parts.append({**g.trace, "run": np.array([label] * n), "temperature": np.full(n, float(T)),
                      "policy": np.array([policy] * n)})
    if not parts:
        raise BebopError("no draft positions were examined (draft length 0 or no tokens generated)")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
