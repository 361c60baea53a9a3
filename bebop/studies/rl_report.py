"""`bebop report DIR...`: compare `bebop rl` runs. Markdown + JSON + one PNG of curves against step, and each
run's end-to-end speedup over the `ar` run with the same seed and async mode on the same CPU.

Speedup arithmetic (Amdahl): with r the rollout-only ratio (ar's rollout seconds per token over the run's) and
s the share of the ar run's step time spent in rollouts, speculative rollouts can make a step at most
1 / ((1 - s) + s / r) times faster. The same r at rollout shares 0.5 / 0.7 / 0.9 (GPU clusters sit at 0.9+)
is printed as a projection, not a measurement.

Drift (the paper's finding 4: does a frozen draft stay accepted through RL?): each run's mean per-step
acceptance over its first and last DRIFT_STEPS steps (fewer, half the run each, in a short run), with 95%
t-intervals, and Welch's interval for the difference. Acceptance against the policy's entropy (finding 1 in its
RL form, entropy moved by training rather than by temperature): per step, least squares with the slope's 95%
interval. An interval that excludes 0 decides; one that straddles 0 says the run was too short or too noisy.

Drafts compared (finding 4, comparative): every speculative run against the first speculative run given with
the same seed, task and model, step by step (the same seed draws the same prompts at every step): the mean of
the per-step differences in acceptance over the steps both ran, with its paired 95% t-interval, and what the
run's own draft updates cost (online strategies) beside it. The runs' policies differ (each draft changes which
samples the seeds give) and neighbouring steps are alike, so the interval is if anything too narrow.

Replicates: runs whose configs differ at most in the seed (a rerun, another machine, another seed) are runs of
one recipe. The spread of their mean acceptance is the run-to-run variation that the paired intervals leave
out, and recipes with two runs or more are compared on those run means (Welch's 95% interval): with few runs
the interval is wide, which is what the data say.

Stalls: a step that took over STALL_FACTOR times the run's median step time was paused (a resumed run's
process stopped, a benchmark given the cores) or starved; the table counts them and the seconds they add beyond
the median, since every wall-time sum includes them.
"""

import json
import math
import statistics
from dataclasses import MISSING, fields
from pathlib import Path

from scipy import stats

from bebop.errors import BebopError
from bebop.rl.config import RLConfig, with_current_names

PROJECTED_SHARES = (0.5, 0.7, 0.9)
DRIFT_STEPS = 10
STALL_FACTOR = 5  # a step this many times the run's median step time was paused or stalled, not computed


def mean_ci(x: list[float]) -> tuple[float, list[float] | None]:
    """Mean and its 95% t-interval (None from a single value)."""
    m = sum(x) / len(x)
    if len(x) < 2:
        return m, None
    half = stats.t.ppf(0.975, len(x) - 1) * stats.sem(x)
    return m, [m - half, m + half]


def drift(acc: list[float], n: int = DRIFT_STEPS) -> dict | None:
    """First n steps' mean acceptance against the last n's (n at most half the run), Welch's 95% interval
    for last - first. None with fewer than 2 steps."""
    n = min(n, len(acc) // 2)
    if n < 1:
        return None
    first, last = acc[:n], acc[-n:]
    (m0, ci0), (m1, ci1) = mean_ci(first), mean_ci(last)
    diff_ci = None
    if n >= 2:
        v0, v1 = stats.tvar(first) / n, stats.tvar(last) / n
        se = math.sqrt(v0 + v1)
        dof = (v0 + v1) ** 2 / (v0 ** 2 / (n - 1) + v1 ** 2 / (n - 1)) if v0 + v1 > 0 else 2 * n - 2
        half = stats.t.ppf(0.975, dof) * se
        diff_ci = [m1 - m0 - half, m1 - m0 + half]
    return {"steps_each": n, "first": m0, "first_ci95": ci0, "last": m1, "last_ci95": ci1, "change": m1 - m0,
            "change_ci95": diff_ci}


def entropy_fit(rows: list[dict]) -> dict | None:
    """acceptance_rate = intercept + slope * entropy_mean over the run's steps, with the slope's 95% interval."""
    pts = [(r["entropy_mean"], r["acceptance_rate"]) for r in rows
           if r.get("entropy_mean") is not None and r.get("acceptance_rate") is not None]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return None
    fit = stats.linregress(*zip(*pts))
    half = stats.t.ppf(0.975, len(pts) - 2) * fit.stderr
    return {"n": len(pts), "slope": fit.slope, "slope_ci95": [fit.slope - half, fit.slope + half],
            "intercept": fit.intercept, "r": fit.rvalue, "entropy_range": [min(x for x, _ in pts), max(x for x, _ in pts)]}


def paired(a: list[float | None], b: list[float | None]) -> dict | None:
    """Per-step differences a - b over the steps where both have a value: mean and paired 95% t-interval."""
    d = [x - y for x, y in zip(a, b) if x is not None and y is not None]
    if len(d) < 2:
        return None
    m, c = mean_ci(d)
    return {"steps": len(d), "mean": m, "ci95": c}


RL_DEFAULTS = {f.name: f.default for f in fields(RLConfig) if f.default is not MISSING}


def replicates(summaries: list[dict]) -> list[dict]:
    """The recipes (config without the seed) of the speculative runs that have two runs or more: their runs'
    mean acceptance, and each recipe after the first against the first, on run means (Welch)."""
    groups = {}
    for s in summaries:
        if s["rollout"] != "ar" and s["acceptance_mean"] is not None:
            config = {**RL_DEFAULTS, **s["config"]}  # a field added since a run was saved had its default then
            recipe = json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True)
            groups.setdefault(recipe, []).append(s)
    out = []
    for runs in (g for g in groups.values() if len(g) >= 2):
        means = [s["acceptance_mean"] for s in runs]
        out.append({"label": runs[0]["label"], "runs": [s["dir"] for s in runs], "means": means,
                    "mean": sum(means) / len(means), "sd": statistics.stdev(means)})
    for r in out[1:]:
        t = stats.ttest_ind(r["means"], out[0]["means"], equal_var=False)
        c = t.confidence_interval(0.95)  # (nan where every run of both recipes has the same mean)
        r["versus"] = {"label": out[0]["label"], "difference": r["mean"] - out[0]["mean"],
                       "ci95": None if math.isnan(c.low) else [float(c.low), float(c.high)]}
    return out


def read_run(path) -> dict:
    path = Path(path)
    try:
        config = with_current_names(json.loads((path / "config.json").read_text()))
        rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if x.strip()]
        evals = [json.loads(x) for x in (path / "eval.jsonl").read_text().splitlines() if x.strip()] \
            if (path / "eval.jsonl").exists() else []
    except (OSError, ValueError) as e:
        raise BebopError(f"'{path}' is not a `bebop rl` output directory: {e}") from None
    if not rows:
        raise BebopError(f"'{path}' has no steps in metrics.jsonl")
    try:  # the machine it ran on (runs from before run.json existed have none)
        machine = json.loads((path / "run.json").read_text())
    except (OSError, ValueError):
        machine = {}
    cpu = f"{machine['cpu']}, {machine.get('cpu_capability', '?')}" if machine.get("cpu") else None
    if machine.get("device", "cpu") != "cpu":  # a GPU run: its GPU is the machine its wall times belong to
        cpu = machine["device"]
    return {"dir": str(path), "config": config, "rows": rows, "evals": evals, "cpu": cpu}


def amdahl(s: float, r: float) -> float:
    return 1 / ((1 - s) + s / r)


def summarize(run: dict) -> dict:
    c, rows, evals = run["config"], run["rows"], run["evals"]
    total = lambda k: sum(r.get(k) or 0 for r in rows)
    tokens = total("tokens")
    acc = [r["acceptance_rate"] for r in rows if r["acceptance_rate"] is not None]
    step_s = [r["step_s"] for r in rows]
    median_s = statistics.median(step_s)
    stalls = [x - median_s for x in step_s if x > STALL_FACTOR * median_s]
    label = c["rollout"] if c["rollout"] == "ar" else f"{c['rollout']} ({c['draft_strategy']})"
    backend = c.get("rollout_backend", "bebop")  # (runs from before the vLLM backend generated with bebop's)
    draft = f", draft {Path(c['draft']).name}" if c["rollout"] != "ar" and c.get("draft") else ""
    return {"dir": run["dir"], "label": f"{Path(run['dir']).name}: {label}, {c['async_mode']}"
            + (", vllm" if backend == "vllm" else "") + draft, "acceptance": [r["acceptance_rate"] for r in rows],
            "rollout": c["rollout"], "rollout_backend": backend,
            "draft_strategy": c["draft_strategy"], "async_mode": c["async_mode"], "seed": c["seed"],
            "model": c["model"], "task": c["task"], "cpu": run.get("cpu"), "config": c, "steps": len(rows),
            "acceptance_mean": sum(acc) / len(acc) if acc else None, "tokens": tokens,
            "wall_s": total("step_s"), "rollout_s": total("rollout_s"), "train_s": total("train_s"),
            "stalled_steps": len(stalls), "stalled_s": sum(stalls),
            "mtp_train_s": total("mtp_train_s"), "sync_s": total("sync_s"), "sync_check_s": total("sync_check_s"),
            "wall_s_per_token": total("step_s") / max(tokens, 1),
            "rollout_share": total("rollout_s") / max(total("step_s"), 1e-9),
            "rollout_s_per_token": total("rollout_s") / max(tokens, 1),
            "reward_first": rows[0]["reward_mean"], "reward_last": rows[-1]["reward_mean"],
            "heldout_first": evals[0] if evals else None, "heldout_last": evals[-1] if evals else None,
            "acceptance_first": acc[0] if acc else None, "acceptance_last": acc[-1] if acc else None,
            "acceptance_max_drift": max(abs(a - acc[0]) for a in acc) if acc else None,
            "drift": drift(acc), "acceptance_vs_entropy": entropy_fit(rows),
            "policy_version_lag_max": max(r["policy_version_lag"] for r in rows)}


def compare(summaries: list[dict]) -> None:
    """Add, to each run, its speedup over the ar run of the same seed, model, task, async mode, rollout
    backend and CPU (wall times from two machines do not divide); r; the Amdahl bound from the synchronous ar
    run's rollout share; and projections. Add to each speculative run after the first of its seed, model and
    task its acceptance against that first run's (paired by step)."""
    firsts = {}
    for s in summaries:
        if s["rollout"] == "ar":
            continue
        ref = firsts.setdefault((s["seed"], s["model"], s["task"]), s)
        if ref is not s:
            s["versus"] = {"dir": ref["dir"], "label": ref["label"],
                           **(paired(s["acceptance"], ref["acceptance"]) or {"steps": 0})}

    def find(s, mode):
        key = lambda b: (b["rollout"], b["async_mode"], b["seed"], b["model"], b["task"], b["rollout_backend"],
                         b["cpu"])
        for b in summaries:
            if key(b) == ("ar", mode, s["seed"], s["model"], s["task"], s["rollout_backend"], s["cpu"]):
                return b
        return None

    for s in summaries:
        base = find(s, s["async_mode"])
        sync_base = find(s, "off") or base
        if base is None or base is s:
            continue
        s["baseline"] = base["dir"]
        s["speedup"] = base["wall_s"] / s["wall_s"]
        s["speedup_per_token"] = (base["wall_s"] / max(base["tokens"], 1)) / (s["wall_s"] / max(s["tokens"], 1))
        r = base["rollout_s_per_token"] / s["rollout_s_per_token"]
        share = sync_base["rollout_share"]
        s["rollout_ratio_r"] = r
        s["baseline_rollout_share"] = share
        s["amdahl_bound"] = amdahl(share, r)
        s["projected"] = {str(p): amdahl(p, r) for p in PROJECTED_SHARES}


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def ci(c) -> str:
    return "" if c is None else f" ({c[0]:.3f} to {c[1]:.3f})"


def heldout(e) -> str:
    if e is None:
        return "-"
    return f"{e['heldout_reward']:.3f} (n={e['heldout_n']}, {e['heldout_ci95'][0]:.2f}-{e['heldout_ci95'][1]:.2f})"


def runs_table(summaries: list[dict]) -> list[str]:
    """One row per run: times, rewards, acceptance."""
    lines = ["| run | steps | wall s (stalled steps: s) | rollout s | train s | mtp s | sync s (+ check) | rollout share | "
             "reward first -> last | held-out start -> end (n, 95% CI) | acceptance first -> last (max drift) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        stalled = f" ({s['stalled_steps']}: {s['stalled_s']:.0f})" if s["stalled_steps"] else ""
        lines.append(f"| {s['label']} | {s['steps']} | {s['wall_s']:.1f}{stalled} | {s['rollout_s']:.1f} | {s['train_s']:.1f} | "
                     f"{s['mtp_train_s']:.1f} | {s['sync_s']:.2f} (+{s['sync_check_s']:.2f}) | {s['rollout_share']:.2f} | "
                     f"{s['reward_first']:.3f} -> {s['reward_last']:.3f} | {heldout(s['heldout_first'])} -> "
                     f"{heldout(s['heldout_last'])} | {fmt(s['acceptance_first'])} -> {fmt(s['acceptance_last'])} "
                     f"({fmt(s['acceptance_max_drift'])}) |")
    return lines


def cpus_section(summaries: list[dict]) -> list[str]:
    """Which runs share a CPU (wall times compare only within one), and the fastest on each."""
    lines = []
    cpus = list(dict.fromkeys(s["cpu"] for s in summaries))
    if len(cpus) > 1:
        lines += ["", "These runs ran on more than one CPU; wall times, and speedups over `ar`, compare only within "
                  "one:", ""] + [f"- {cpu or 'CPU not recorded'}: " + ", ".join(Path(s["dir"]).name for s in
                                 summaries if s["cpu"] == cpu) for cpu in cpus]
    for cpu in cpus:
        same = [s for s in summaries if s["cpu"] == cpu]
        if len(same) > 1:
            best = min(same, key=lambda s: s["wall_s_per_token"])
            lines += ["", f"Fastest here{f' on {cpu}' if len(cpus) > 1 else ''}: **{best['label']}** "
                      f"({best['wall_s_per_token'] * 1000:.1f} ms of wall time per generated token over the run; "
                      f"{best['dir']})."]
    return lines


def drift_section(summaries: list[dict]) -> list[str]:
    """Acceptance through each run: first against last steps, and its fit on the entropy."""
    lines = []
    drifting = [s for s in summaries if s["drift"] or s["acceptance_vs_entropy"]]
    if drifting:
        lines += ["", "## Acceptance through the run", "",
                  f"Drift: mean per-step acceptance of the first and last {DRIFT_STEPS} steps (half the run each when "
                  "shorter), 95% t-intervals; change = last - first with Welch's interval. Fit: acceptance = a + b * "
                  "entropy over the run's steps, b's 95% interval.", "",
                  "| run | steps each | first | last | change | b per nat | a | r | entropy range (nats) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in drifting:
            d, f = s["drift"] or {}, s["acceptance_vs_entropy"] or {}
            lines.append(
                f"| {s['label']} | {d.get('steps_each', '-')} | {fmt(d.get('first'))}{ci(d.get('first_ci95'))} | "
                f"{fmt(d.get('last'))}{ci(d.get('last_ci95'))} | {fmt(d.get('change'), '+.3f')}{ci(d.get('change_ci95'))} | "
                f"{fmt(f.get('slope'), '+.3f')}{ci(f.get('slope_ci95'))} | {fmt(f.get('intercept'))} | {fmt(f.get('r'), '.2f')} | "
                + (f"{f['entropy_range'][0]:.2f}-{f['entropy_range'][1]:.2f} |" if f else "- |"))
    return lines


def versus_section(summaries: list[dict]) -> list[str]:
    """Each speculative run's acceptance against the first run of its seed, model and task."""
    lines = []
    versus = [s for s in summaries if "versus" in s]
    if versus:
        lines += ["", "## Drafts compared", "",
                  "Acceptance of each speculative run minus that of the first run of its seed, model and task, step by "
                  "step over the steps both ran: mean and paired 95% t-interval (the policies differ and neighbouring "
                  "steps are alike: if anything too narrow); an interval that excludes 0 decides. Draft updates' "
                  "cost: the run's mtp s per step, and their share of its step time.", "",
                  "| run | against | steps | mean acceptance | difference | mtp s per step (share) |",
                  "|---|---|---|---|---|---|"]
        for s in versus:
            v = s["versus"]
            mean = mean_ci([a for a in s["acceptance"] if a is not None])
            lines.append(f"| {s['label']} | {v['label']} | {v['steps']} | {fmt(mean[0])}{ci(mean[1])} | "
                         f"{fmt(v.get('mean'), '+.3f')}{ci(v.get('ci95'))} | {s['mtp_train_s'] / s['steps']:.2f} "
                         f"({s['mtp_train_s'] / max(s['wall_s'], 1e-9):.2f}) |")
    return lines


def replicates_section(summaries: list[dict]) -> list[str]:
    """Runs of one recipe: the run-to-run spread, and recipes compared on run means."""
    lines = []
    reps = replicates(summaries)
    if reps:
        lines += ["", "## Replicates: runs of one recipe", "",
                  "Runs whose configs differ at most in the seed: the spread of their mean acceptance is the run-to-run "
                  "variation the paired intervals above leave out. Recipes compared on run means, Welch's 95% "
                  "interval.", "",
                  "| recipe (its first run) | runs | mean acceptance of each | mean | SD across runs | against "
                  "the first recipe |", "|---|---|---|---|---|---|"]
        for r in reps:
            v = r.get("versus")
            lines.append(f"| {r['label']} | {len(r['runs'])} | {', '.join(f'{m:.3f}' for m in r['means'])} | "
                         f"{r['mean']:.3f} | {r['sd']:.3f} | "
                         + (f"{v['difference']:+.3f}{ci(v['ci95'])} |" if v else "- |"))
    return lines


def speedup_section(summaries: list[dict]) -> list[str]:
    """End-to-end speedups over the `ar` run, the Amdahl bound, and its projection."""
    lines = []
    fast = [s for s in summaries if "speedup" in s]
    if fast:
        lines += ["", "## End-to-end speedup over `ar` (same seed, async mode and CPU)", "",
                  "r = ar rollout s/token over the run's; s = rollout share of the synchronous ar run's step time; "
                  "bound = 1/((1-s)+s/r).", "",
                  "| run | speedup (wall) | speedup (per token) | r | s | Amdahl bound | measured / bound |",
                  "|---|---|---|---|---|---|---|"]
        for s in fast:
            lines.append(f"| {s['label']} | {s['speedup']:.2f}x | {s['speedup_per_token']:.2f}x | "
                         f"{s['rollout_ratio_r']:.2f}x | {s['baseline_rollout_share']:.2f} | "
                         f"{s['amdahl_bound']:.2f}x | "
                         f"{s['speedup'] / s['amdahl_bound']:.2f} |")
        lines += ["", "**Projection** (not measured): the bound with each run's measured r at other rollout shares.",
                  "", "| run | " + " | ".join(f"s = {p}" for p in PROJECTED_SHARES) + " |",
                  "|---|" + "---|" * len(PROJECTED_SHARES)]
        for s in fast:
            lines.append(f"| {s['label']} | " + " | ".join(f"{v:.2f}x" for v in s["projected"].values()) + " |")
        alone = [Path(s["dir"]).name for s in summaries if s["rollout"] != "ar" and "speedup" not in s]
        if alone:
            lines += ["", "No `ar` run of the same seed, async mode and CPU for: " + ", ".join(alone) + "."]
    return lines


def markdown(summaries: list[dict]) -> str:
    lines = ["# RL runs", ""]
    for section in (runs_table, cpus_section, drift_section, versus_section, replicates_section, speedup_section):
        lines += section(summaries)
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], summaries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward_mean", "reward (train batch)"), (None, "held-out reward"), ("entropy_mean", "entropy (nats)"),
              ("acceptance_rate", "acceptance rate"), ("step_s", "step time (s)"), ("rollout_s", "rollout time (s)"),
              ("fit", "acceptance vs entropy, per step")]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    axes.flat[-1].axis("off")
    for ax, (key, title) in zip(axes.flat, panels):
        for i, (run, s) in enumerate(zip(runs, summaries)):
            colour = f"C{i % 10}"  # one colour per run in every panel, even where a run has no points
            if key == "fit":
                pts = [(r["entropy_mean"], r["acceptance_rate"]) for r in run["rows"]
                       if r.get("entropy_mean") is not None and r.get("acceptance_rate") is not None]
                if pts:
                    ax.scatter(*zip(*pts), s=8, color=colour, label=s["label"])
                f = s["acceptance_vs_entropy"]
                if f:
                    xs = f["entropy_range"]
                    ax.plot(xs, [f["intercept"] + f["slope"] * x for x in xs], color=colour)
                continue
            if key is None:
                e = run["evals"]
                if e:
                    y = [x["heldout_reward"] for x in e]
                    lo, hi = zip(*(x["heldout_ci95"] for x in e))
                    err = [[v - a for v, a in zip(y, lo)], [b - v for v, b in zip(y, hi)]]
                    ax.errorbar([x["step"] for x in e], y, yerr=err, marker="o", capsize=3, color=colour,
                                label=s["label"])
                continue
            pts = [(r["step"], r[key]) for r in run["rows"] if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker=".", color=colour, label=s["label"])
        ax.set_title(title)
        ax.set_xlabel("entropy (nats)" if key == "fit" else "step")
    axes.flat[-1].legend(*axes.flat[0].get_legend_handles_labels(), loc="center", fontsize=8)  # the spare panel
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(dirs: list[str], out: str | None = None) -> str:
    runs = [read_run(d) for d in dirs]
    summaries = [summarize(r) for r in runs]
    compare(summaries)
    out = Path(out) if out else Path(dirs[0]).parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(summaries)
    (out / "report.md").write_text(md + "\n![curves](report.png)\n")
    (out / "report.json").write_text(json.dumps(summaries, indent=1))
    plot(runs, summaries, out / "report.png")
    return md
