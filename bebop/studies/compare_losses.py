"""`bebop compare-losses`: one draft (MTP or EAGLE-3) per loss from the same seed, data and budget, then the
engine's real acceptance for each on the held-out split at several temperatures, with `spec` and (for the record)
`spec-greedy`. With `seeds` > 1, every loss is trained again from seeds cfg.seed + 1, ... (the draft's
initialisation and the order of its batches), and the losses are compared on their seed means: each measure's
mean with its 95% t-interval, and each loss against the first listed with Welch's 95% interval and, paired by
seed (one seed's drafts share their initialisation, batches and, on a machine that made the data, the data),
the t-interval of the seeds' differences. Writes
compare.md, compare.json and compare.png in the output directory. Training and evaluations resume, so an
interrupted comparison picks up where it stopped. With `keep`, each finished draft's evaluation and training metrics
(gzipped) are also copied into that directory as soon as it is done, and read back first on a later run, so a
comparison too long for one machine's session goes on from its committed files on another, without the draft."""

import gzip
import json
import shutil
import math
from dataclasses import replace
from pathlib import Path

from scipy import stats

from bebop.training.data import load_split
from bebop.engine.generation import generate
from bebop.drafts.registry import load_draft
from bebop.sampling import SamplingParams
from bebop.studies.rl_report import mean_ci
from bebop.training.train import TrainConfig, has_checkpoint, train_draft


def evaluate_draft(target, draft, prompts, temperatures, draft_len, max_new_tokens, seed=0) -> list[dict]:
    rows = []
    for T in temperatures:
        for mode in ("spec", "spec-greedy"):
            s = generate(target, prompts, max_new_tokens, SamplingParams(T), mode=mode, draft=draft, draft_len=draft_len,
                         seed=seed).stats
            rows.append({"temperature": T, "mode": mode, "acceptance_rate": s.acceptance_rate,
                         "mean_acceptance_length": s.mean_acceptance_length,
                         "per_position_acceptance": s.per_position_acceptance, "mean_entropy": s.mean_entropy})
    return rows


def compare_losses(target, data_dir, loss_names, cfg: TrainConfig, out_dir, temperatures=(0.6, 1.0, 1.2),
                   eval_prompts=32, eval_new_tokens=64, seed=0, seeds: int = 1, keep=None) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if keep is not None:
        restore(keep, out)
    prompts = [r["prompt_ids"] for r in load_split(data_dir, "heldout")[:eval_prompts]]
    results, teacher_forced = [], {}
    for name in loss_names:
        for train_seed in range(cfg.seed, cfg.seed + seeds):
            run = name if train_seed == cfg.seed else f"{name}-seed{train_seed}"  # (the first as one seed names it)
            run_cfg = replace(cfg, loss=name, seed=train_seed)
            ckpt = out / f"{cfg.kind}-{run}"  # the draft kind names the file
            done = out / f"eval-{run}.json"  # evaluations are kept too, so a rerun only does what is missing
            saved = json.loads(done.read_text()) if done.exists() else {}
            # as JSON stores them (tuples become lists), or a saved evaluation never matches
            settings = json.loads(json.dumps({"temperatures": list(temperatures), "prompts": len(prompts),
                                              "new_tokens": eval_new_tokens, "seed": seed, "config": vars(run_cfg)}))
            if saved.get("settings") != settings or not trained(ckpt, run_cfg.steps):
                train_draft(target, data_dir, ckpt, run_cfg, resume=has_checkpoint(ckpt))
                rows = evaluate_draft(target, load_draft(ckpt, target), prompts, temperatures, cfg.draft_len,
                                    eval_new_tokens, seed)
                saved = {"settings": settings, "rows": rows}
                done.write_text(json.dumps(saved))
                if keep is not None:
                    keep_run(out, keep, ckpt.name, done.name)
            results += [{"loss": name, "seed": train_seed, **row} for row in saved["rows"]]
            teacher_forced[run] = {"loss": name, "seed": train_seed, **last_heldout_eval(ckpt)}
    report = {"data": str(data_dir), "config": vars(cfg), "temperatures": list(temperatures),
              "eval_prompts": len(prompts), "eval_new_tokens": eval_new_tokens, "results": results,
              "teacher_forced": teacher_forced, "seeds": seeds}
    if seeds > 1:
        report["over_seeds"] = over_seeds(report, loss_names)
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    (out / "compare.md").write_text(markdown(report))
    plot(report, out / "compare.png")
    return report


def over_seeds(report, loss_names) -> list[dict]:
    """Each loss's seed values of every measure (teacher-forced mean acceptance length 1 + E[A] and alpha per
    depth; in the engine, `spec`'s mean acceptance length per temperature): mean, 95% t-interval, and the
    difference from the first loss's mean with Welch's 95% interval and, over the seeds both have, the
    t-interval of the per-seed differences (paired)."""
    values = {}  # (measure, loss) -> {seed: value}
    for tf in report["teacher_forced"].values():
        at = tf["seed"]
        values.setdefault(("teacher-forced mean acceptance length", tf["loss"]), {})[at] = 1 + tf["expected_accepted"]
        for depth, a in enumerate(tf["alpha"], 1):
            values.setdefault((f"teacher-forced alpha at depth {depth}", tf["loss"]), {})[at] = a
    for r in report["results"]:
        if r["mode"] == "spec":
            values.setdefault((f"mean acceptance length, T={r['temperature']:g}", r["loss"]), {})[r["seed"]] = \
                r["mean_acceptance_length"]
    rows = []
    for measure in dict.fromkeys(m for m, _ in values):
        first = values[(measure, loss_names[0])]
        for loss in loss_names:
            by_seed = values[(measure, loss)]
            x = list(by_seed.values())
            mean, ci = mean_ci(x)
            row = {"measure": measure, "loss": loss, "values": x, "mean": mean, "ci95": ci}
            if loss != loss_names[0]:
                c = stats.ttest_ind(x, list(first.values()), equal_var=False).confidence_interval(0.95)
                row["minus_first"] = mean - sum(first.values()) / len(first)
                row["minus_first_ci95"] = None if math.isnan(c.low) else [float(c.low), float(c.high)]
                paired = [by_seed[k] - first[k] for k in by_seed if k in first]
                row["minus_first_paired_ci95"] = mean_ci(paired)[1] if paired else None
            rows.append(row)
    return rows


def trained(ckpt, steps: int) -> bool:
    """Whether the draft's training metrics end with its final held-out evaluation, at `steps`."""
    metrics = Path(f"{ckpt}.metrics.jsonl")
    return metrics.exists() and last_heldout_eval(ckpt)["step"] == steps


def keep_run(out: Path, keep, draft: str, evaluation: str):
    """Copy one finished draft's evaluation and gzipped training metrics from `out` into `keep`."""
    keep = Path(keep)
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / evaluation, keep / evaluation)
    with open(out / f"{draft}.metrics.jsonl", "rb") as src, gzip.GzipFile(keep / f"{draft}.metrics.jsonl.gz", "wb",
                                                                         mtime=0) as dst:
        shutil.copyfileobj(src, dst)


def restore(keep, out: Path):
    """Copy into `out` the kept evaluations and training metrics that `out` does not hold yet."""
    for kept in sorted(Path(keep).glob("eval-*.json")):
        if not (out / kept.name).exists():
            shutil.copyfile(kept, out / kept.name)
    for kept in sorted(Path(keep).glob("*.metrics.jsonl.gz")):
        if not (out / kept.stem).exists():
            with gzip.open(kept, "rb") as src, open(out / kept.stem, "wb") as dst:
                shutil.copyfileobj(src, dst)


def last_heldout_eval(ckpt) -> dict:
    """The training run's final teacher-forced held-out evaluation: expected acceptance per depth and E[A]
    from the full p and q (no sampling noise), at the training temperature."""
    rows = [json.loads(x) for x in Path(f"{ckpt}.metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "heldout_alpha" in r][-1]
    return {"step": last["step"], "alpha": last["heldout_alpha"], "expected_accepted": last["heldout_expected_accepted"]}


def markdown(report) -> str:
    cfg = report["config"]
    lines = [f"# {cfg['kind']} draft losses compared (draft length {cfg['draft_len']}, {cfg['steps']} steps, batch {cfg['batch_size']}, "
             f"draft vocab {cfg['draft_vocab'] or 'full'})", "",
             f"Data: `{report['data']}`; evaluation: {report['eval_prompts']} held-out prompts, "
             f"{report['eval_new_tokens']} new tokens each, real speculative decoding with the engine.", "",
             "| loss | T | mode | acceptance rate | mean acceptance length | per-position acceptance | entropy |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        ppa = ", ".join(f"{x:.3f}" for x in r["per_position_acceptance"])
        run = r["loss"] if r.get("seed", cfg["seed"]) == cfg["seed"] else f"{r['loss']}-seed{r['seed']}"
        lines.append(f"| {run} | {r['temperature']:g} | {r['mode']} | {r['acceptance_rate']:.3f} | "
                     f"{r['mean_acceptance_length']:.3f} | {ppa} | {r['mean_entropy']:.2f} |")
    lines += ["", "Teacher-forced on held-out sequences at the training temperature (exact expected acceptance from "
              "p and q at every position, no sampling noise):", "",
              "| loss | alpha per depth | E[accepted drafts] | mean acceptance length (1 + E[A]) |", "|---|---|---|---|"]
    for name, tf in report["teacher_forced"].items():
        lines.append(f"| {name} | {', '.join(f'{a:.3f}' for a in tf['alpha'])} | {tf['expected_accepted']:.3f} | "
                     f"{1 + tf['expected_accepted']:.3f} |")
    if report.get("over_seeds"):
        first = report["over_seeds"][0]["loss"]
        lines += ["", f"Over {report['seeds']} seeds per loss (training seeds {cfg['seed']}..{cfg['seed'] + report['seeds'] - 1}): "
                  f"seed mean with its 95% t-interval; each loss minus {first}, Welch's 95% interval and, paired by "
                  "seed, the t-interval of the seeds' differences:", "",
                  f"| measure | loss | mean [95% CI] | minus {first} [Welch 95% CI] | paired by seed [95% CI] |",
                  "|---|---|---|---|---|"]
        for r in report["over_seeds"]:
            diff = paired = ""
            if "minus_first" in r:
                diff = f"{r['minus_first']:+.4f} {interval(r['minus_first_ci95'], '+')}"
                paired = interval(r.get("minus_first_paired_ci95"), "+")
            lines.append(f"| {r['measure']} | {r['loss']} | {r['mean']:.4f} {interval(r['ci95'])} | {diff} | {paired} |")
    lines += ["", "![acceptance per loss and temperature](compare.png)", ""]
    return "\n".join(lines)


def seed_mean(report, key, loss, temperature, mode) -> float:
    x = [r[key] for r in report["results"] if (r["loss"], r["temperature"], r["mode"]) == (loss, temperature, mode)]
    return sum(x) / len(x)


def interval(ci, sign="") -> str:
    return "[-]" if ci is None else f"[{ci[0]:{sign}.4f}, {ci[1]:{sign}.4f}]"


def plot(report, path):
    from matplotlib.figure import Figure

    losses = list(dict.fromkeys(r["loss"] for r in report["results"]))
    temps = report["temperatures"]
    fig = Figure(figsize=(11, 4))
    for ax, key in zip(fig.subplots(1, 2), ("acceptance_rate", "mean_acceptance_length")):
        width = 0.8 / len(temps)
        for j, T in enumerate(temps):
            vals, greedy = ([seed_mean(report, key, l, T, mode) for l in losses] for mode in ("spec", "spec-greedy"))
            xs = [i + (j - (len(temps) - 1) / 2) * width for i in range(len(losses))]
            ax.bar(xs, vals, width, label=f"spec T={T:g}")
            ax.scatter(xs, greedy, marker="_", color="black", s=80, zorder=3,
                       label="spec-greedy" if j == 0 else None)
        ax.set_xticks(range(len(losses)), losses)
        ax.set_title(key.replace("_", " "))
        ax.grid(axis="y", alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
