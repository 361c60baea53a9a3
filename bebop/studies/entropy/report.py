"""The report files of the entropy study: tokens.csv (the trace), report.json, report.md and three PNG plots."""

import csv
import gzip
import json
import math
import os

import numpy as np

from bebop.errors import BebopError
from bebop.studies.entropy.fit import MIN_RUNS_FOR_RUN_VERDICT, TABLE_COLUMNS, check_table


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
    t = check_table(table)
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
    """Load a tokens.csv written by write_report back into a trace table (or tokens.csv.gz: the traces kept
    under results/ are gzipped)."""
    with (gzip.open(path, "rt", newline="") if str(path).endswith(".gz") else open(path, newline="")) as f:
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
    check_table(out)
    return out


def _f(v, digits=3):
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _ci(fit, key, digits=3):
    lo, hi = fit[key + "_ci"]
    return f"{_f(fit[key], digits)} [{_f(lo, digits)}, {_f(hi, digits)}]"


COLORS = dict(probabilistic="tab:blue", greedy="tab:red", greedy_oracle="tab:red")


def _new_figure():
    """A Figure on its own Agg canvas, so that pyplot's global backend and state are never touched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _fit_line(ax, fit, xs, **kw):
    if math.isfinite(fit["slope"]):
        ax.plot(xs, fit["slope"] * xs + fit["intercept"], **kw)


def _token_plot(t, summary, out_dir):
    """Token level: light scatter, binned means, fits, oracles."""
    sel = t["depth"] == summary["fit_depth"]
    fig, ax = _new_figure()
    h = t["target_entropy"][sel]
    rng = np.random.default_rng(summary["seed"])
    sub = rng.choice(h.size, size=min(h.size, 3000), replace=False)
    ax.scatter(h[sub], t["alpha"][sel][sub], s=3, alpha=0.12, color=COLORS["probabilistic"], lw=0)
    ax.scatter(h[sub], t["greedy_accept_prob"][sel][sub], s=3, alpha=0.12, color=COLORS["greedy"], lw=0)
    b = summary["bins"]["pooled"]
    c = np.array([r["center"] for r in b])
    xs = np.linspace(summary["bins"]["edges"][0], summary["bins"]["edges"][-1], 50)
    for mode, key in (("probabilistic", "alpha"), ("greedy", "greedy_accept_prob")):
        fit = summary["fits"]["token"][mode]
        ax.plot(c, [r[key] for r in b], "o", color=COLORS[mode], label=f"{mode} (binned mean)")
        _fit_line(ax, fit, xs, color=COLORS[mode], lw=1.5, label=f"{mode} fit, slope {_f(fit['slope'])}")
    ax.axhline(1.0, color=COLORS["probabilistic"], ls=":", label="probabilistic oracle (q = p)")
    ax.plot(c, [r["target_max_prob"] for r in b], ls=":", marker=".", color=COLORS["greedy_oracle"],
            label="greedy oracle (binned mean max p)")
    ax.set(xlabel="target entropy H(p) [nats]", ylabel="acceptance probability", ylim=(-0.02, 1.05),
           title=f"Acceptance vs entropy, draft depth {summary['fit_depth']}, all runs pooled")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "acceptance_vs_entropy.png"))


def _run_plot(summary, out_dir):
    """Run level: one point per run per mode, with the run-level fits."""
    fig, ax = _new_figure()
    runs = summary["runs"]
    hr = np.array([r["target_entropy"] for r in runs])
    xs = np.linspace(np.nanmin(hr), np.nanmax(hr), 50) if np.isfinite(hr).any() else np.array([])
    for mode, key in (("probabilistic", "alpha"), ("greedy", "greedy_accept_prob")):
        fit = summary["fits"]["run"][mode]
        ys = [r[key] for r in runs]
        ax.plot(hr, ys, "o", color=COLORS[mode], label=mode)
        _fit_line(ax, fit, xs, color=COLORS[mode], lw=1.2,
                  label=f"{mode} fit, slope {_f(fit['slope'])}, r² {_f(fit['r2'], 2)}")
        for r, y in zip(runs, ys):
            ax.annotate(r["run"], (r["target_entropy"], y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="mean target entropy H(p) [nats]", ylabel="mean acceptance probability",
           title=f"Per-run means, draft depth {summary['fit_depth']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "runs_acceptance_vs_entropy.png"))


def _depth_plot(summary, out_dir):
    """By depth: solid = probabilistic alpha, dashed = greedy, one colour per run."""
    from matplotlib.ticker import MaxNLocator

    runs = summary["runs"]
    fig, ax = _new_figure()
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


def _plots(table, summary, out_dir):
    t = check_table(table)
    _token_plot(t, summary, out_dir)
    _run_plot(summary, out_dir)
    _depth_plot(summary, out_dir)


def _runs_section(s) -> list[str]:
    """What was measured, and the per-run table at the fit depth."""
    d = s["fit_depth"]
    L = [
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
    return L


def _fits_section(s) -> list[str]:
    """The linear fits, token and run level, with their intervals."""
    d = s["fit_depth"]
    L = ["", "## Linear fits: acceptance = slope x H(p) + intercept", "",
         f"95% intervals are bootstrap percentiles over resampled pairs ({s['n_boot']} resamples).",
         f"Token level pools all depth-{d} tokens (tokens of one sequence are correlated, so these",
         "intervals are optimistic); run level fits one point per run (the paper's plot).",
         "", "| level | mode | slope [95% CI] | intercept [95% CI] | r² | n |", "|---|---|---|---|---|---|"]
    for level in ("token", "run"):
        for mode in ("probabilistic", "greedy", "greedy_oracle"):
            fit = s["fits"][level][mode]
            L.append(f"| {level} | {mode.replace('_', ' ')} | {_ci(fit, 'slope')} | {_ci(fit, 'intercept')} "
                     f"| {_f(fit['r2'])} | {fit['n']} |")
    return L


def _verdict_section(s) -> list[str]:
    """Does greedy acceptance fall faster with entropy than probabilistic acceptance?"""
    d = s["fit_depth"]
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
    L = ["", "## Verdict", "",
         f"Measured on {level}: {sentence} (greedy slope {_ci(b, 'greedy_slope')} vs probabilistic "
         f"{_ci(b, 'probabilistic_slope')} per nat).", ""]
    other = "token" if v["basis"] == "run" else "run"
    if v["basis"] == "token":
        L.append(f"(Fewer than {MIN_RUNS_FOR_RUN_VERDICT} runs, so the verdict uses pooled tokens rather than "
                 "the run-level fit.)")
    L.append(f"At {other} level the same test gives: greedy steeper with disjoint intervals = "
             f"{v[other]['greedy_steeper']}.")
    return L


def _oracle_section(s) -> list[str]:
    """The gap to the oracle bounds at the reference temperature."""
    ref = s["oracle_reference"]
    at = "T = 1.0" if ref["temperature"] == 1.0 else f"T = {ref['temperature']:g} (closest to 1.0 in this trace)"
    L = ["", f"## Gap to the oracle bounds at {at}", ""]
    for r in s["runs"]:
        if r["run"] in ref["runs"]:
            L.append(f"- {r['run']}: probabilistic {_f(r['alpha'])} vs oracle 1 (gap {_f(r['gap_probabilistic'])}); "
                     f"greedy {_f(r['greedy_accept_prob'])} vs oracle {_f(r['target_max_prob'])} "
                     f"(gap {_f(r['gap_greedy'])}).")
    return L


def _depth_section(s) -> list[str]:
    """The means per draft depth."""
    L = ["", "## By draft depth", "",
         "Deeper positions are conditional on every earlier draft in the block having been accepted.", "",
         "| run | depth | positions | H(p) | alpha | greedy p(argmax q) | max p | accepted rate |",
         "|---|---|---|---|---|---|---|---|"]
    for r in s["runs"]:
        for x in r["by_depth"]:
            L.append(f"| {r['run']} | {x['depth']} | {x['count']} | {_f(x['target_entropy'])} | {_f(x['alpha'])} "
                     f"| {_f(x['greedy_accept_prob'])} | {_f(x['target_max_prob'])} | {_f(x['accepted_rate'])} |")
    return L


def _markdown(summary):
    L = ["# Draft acceptance vs. policy entropy", ""]
    for section in (_runs_section, _fits_section, _verdict_section, _oracle_section, _depth_section):
        L += section(summary)
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
