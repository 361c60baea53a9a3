"""`bebop compare-losses`: one MTP per loss from the same seed, data and budget, then the engine's real
acceptance for each on the held-out split at several temperatures, with `spec` and (for the record)
`spec-greedy`. Writes compare.md, compare.json and compare.png in the output directory. Training resumes, so
an interrupted comparison picks up where it stopped."""

import json
from dataclasses import replace
from pathlib import Path

from bebop.training.data import load_split
from bebop.engine.generation import generate
from bebop.drafts.registry import load_draft
from bebop.sampling import SamplingParams
from bebop.training.train import TrainConfig, has_checkpoint, train_draft


def evaluate_mtp(target, mtp, prompts, temperatures, draft_len, max_new_tokens, seed=0) -> list[dict]:
    rows = []
    for T in temperatures:
        for mode in ("spec", "spec-greedy"):
            s = generate(target, prompts, max_new_tokens, SamplingParams(T), mode=mode, draft=mtp, draft_len=draft_len,
                         seed=seed).stats
            rows.append({"temperature": T, "mode": mode, "acceptance_rate": s.acceptance_rate,
                         "mean_acceptance_length": s.mean_acceptance_length,
                         "per_position_acceptance": s.per_position_acceptance, "mean_entropy": s.mean_entropy})
    return rows


def compare_losses(target, data_dir, loss_names, cfg: TrainConfig, out_dir, temperatures=(0.6, 1.0, 1.2),
                   eval_prompts=32, eval_new_tokens=64, seed=0) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [r["prompt_ids"] for r in load_split(data_dir, "heldout")[:eval_prompts]]
    results, teacher_forced = [], {}
    for name in loss_names:
        ckpt = out / f"mtp-{name}"
        train_draft(target, data_dir, ckpt, replace(cfg, loss=name), resume=has_checkpoint(ckpt))
        done = out / f"eval-{name}.json"  # evaluations are kept too, so a rerun only does what is missing
        saved = json.loads(done.read_text()) if done.exists() else {}
        # as JSON stores them (tuples become lists), or a saved evaluation never matches
        settings = json.loads(json.dumps({"temperatures": list(temperatures), "prompts": len(prompts),
                                          "new_tokens": eval_new_tokens, "seed": seed,
                                          "config": vars(replace(cfg, loss=name))}))
        if saved.get("settings") != settings:
            rows = evaluate_mtp(target, load_draft(ckpt, target), prompts, temperatures, cfg.draft_len,
                                eval_new_tokens, seed)
            saved = {"settings": settings, "rows": rows}
            done.write_text(json.dumps(saved))
        results += [{"loss": name, **row} for row in saved["rows"]]
        teacher_forced[name] = last_heldout_eval(ckpt)
    report = {"data": str(data_dir), "config": vars(cfg), "temperatures": list(temperatures),
              "eval_prompts": len(prompts), "eval_new_tokens": eval_new_tokens, "results": results,
              "teacher_forced": teacher_forced}
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    (out / "compare.md").write_text(markdown(report))
    plot(report, out / "compare.png")
    return report


def last_heldout_eval(ckpt) -> dict:
    """The training run's final teacher-forced held-out evaluation: expected acceptance per depth and E[A]
    from the full p and q (no sampling noise), at the training temperature."""
    rows = [json.loads(x) for x in Path(f"{ckpt}.metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "heldout_alpha" in r][-1]
    return {"step": last["step"], "alpha": last["heldout_alpha"], "expected_accepted": last["heldout_expected_accepted"]}


def markdown(report) -> str:
    cfg = report["config"]
    lines = [f"# MTP losses compared (draft length {cfg['draft_len']}, {cfg['steps']} steps, batch {cfg['batch_size']}, "
             f"draft vocab {cfg['draft_vocab'] or 'full'})", "",
             f"Data: `{report['data']}`; evaluation: {report['eval_prompts']} held-out prompts, "
             f"{report['eval_new_tokens']} new tokens each, real speculative decoding with the engine.", "",
             "| loss | T | mode | acceptance rate | mean acceptance length | per-position acceptance | entropy |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        ppa = ", ".join(f"{x:.3f}" for x in r["per_position_acceptance"])
        lines.append(f"| {r['loss']} | {r['temperature']:g} | {r['mode']} | {r['acceptance_rate']:.3f} | "
                     f"{r['mean_acceptance_length']:.3f} | {ppa} | {r['mean_entropy']:.2f} |")
    lines += ["", "Teacher-forced on held-out sequences at the training temperature (exact expected acceptance from "
              "p and q at every position, no sampling noise):", "",
              "| loss | alpha per depth | E[accepted drafts] | mean acceptance length (1 + E[A]) |", "|---|---|---|---|"]
    for name, tf in report["teacher_forced"].items():
        lines.append(f"| {name} | {', '.join(f'{a:.3f}' for a in tf['alpha'])} | {tf['expected_accepted']:.3f} | "
                     f"{1 + tf['expected_accepted']:.3f} |")
    lines += ["", "![acceptance per loss and temperature](compare.png)", ""]
    return "\n".join(lines)


def plot(report, path):
    from matplotlib.figure import Figure

    losses = list(dict.fromkeys(r["loss"] for r in report["results"]))
    temps = report["temperatures"]
    fig = Figure(figsize=(11, 4))
    for ax, key in zip(fig.subplots(1, 2), ("acceptance_rate", "mean_acceptance_length")):
        width = 0.8 / len(temps)
        for j, T in enumerate(temps):
            vals = [next(r[key] for r in report["results"] if r["loss"] == l and r["temperature"] == T
                         and r["mode"] == "spec") for l in losses]
            greedy = [next(r[key] for r in report["results"] if r["loss"] == l and r["temperature"] == T
                           and r["mode"] == "spec-greedy") for l in losses]
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
