"""`bebop demo`: the point of bebop on this machine in a few minutes, and a verdict a person reads without code.

Two GRPO runs of the default model from one seed: plain rollouts (`ar`) and speculative ones with the model's
shipped draft (`spec`: frozen, a fixed draft length so that every step drafts, synchronous so that a step's time
is its rollouts plus its training). They run in interleaved rounds (ar then spec, then spec then ar, ...; each
round resumes each run where the last left it), so a machine that slows down partway slows both. Then the
exactness check (bebop.studies.exactness) on a few hundred samples of the trained policy and its draft, then
`bebop report` on the two runs, and the verdict:

  rollouts     r = ar's rollout seconds per token over spec's, with spec's acceptance
  exactness    the chi-square tests' smallest p-value against the threshold that rejects
  end to end   the measured speedup in wall time per generated token, and its Amdahl bound 1/((1-s) + s/r),
               s = the rollouts' share of ar's step time on this machine
  on a GPU     the same bound at the rollout share of a GPU RL run (GPU_ROLLOUT_SHARE): a projection, labelled so
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

from bebop.drafts.registry import trained_draft
from bebop.errors import BebopError
from bebop.models.registry import chat_ids, load_model
from bebop.rl.loop import run_rl
from bebop.sampling import SamplingParams
from bebop.studies.demo_config import DemoConfig
from bebop.studies.exactness import check_exactness
from bebop.studies.rl_report import amdahl, write_report
from bebop.tasks import rewards, rl_tasks

GPU_ROLLOUT_SHARE = 0.7  # rollouts' share of a GPU GRPO step, on the low side (FastGRPO reports 91-98%)


def run_demo(out, cfg: DemoConfig = DemoConfig()) -> str:
    """Run the demo into `out` (a new directory): out/ar, out/spec (`bebop rl` runs), out/exactness.json,
    out/report/ (`bebop report`), out/verdict.md. Returns the verdict."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BebopError(f"{out} is not empty: remove it or choose another --out")
    configs = {name: cfg.rl(name) for name in ("ar", "spec")}
    total = configs["ar"].steps
    train = rl_tasks(cfg.task, total * cfg.prompts_per_step, cfg.seed, "train")
    heldout = rl_tasks(cfg.task, cfg.eval_prompts, cfg.seed, "heldout")
    policies = {name: load_model(cfg.model, dtype="float32", device=cfg.device) for name in configs}  # fp32 masters, trained in place
    tok = policies["ar"][1]
    draft = trained_draft(policies["spec"][0])
    if draft is None:
        raise BebopError(f"'{cfg.model}' ships no trained draft; the demo needs one")
    for i in range(cfg.rounds):
        for name in ("ar", "spec") if i % 2 == 0 else ("spec", "ar"):
            run_rl(replace(configs[name], steps=(i + 1) * cfg.steps_per_round), out / name, policies[name][0], tok,
                   train, heldout, draft if name == "spec" else None, score=rewards, resume=i > 0)
    exact = check_exactness(policies["spec"][0], draft, chat_ids(tok, heldout[0].prompt), SamplingParams(1.0),
                            samples=cfg.exactness_samples, draft_len=cfg.draft_len, seed=cfg.seed)
    (out / "exactness.json").write_text(json.dumps(exact, indent=1))
    write_report([str(out / "ar"), str(out / "spec")], str(out / "report"))
    for name in configs:  # the policies' checkpoints (1.6 GB a run for the default model) only served the rounds
        shutil.rmtree(out / name / "ckpt", ignore_errors=True)
    summaries = json.loads((out / "report" / "report.json").read_text())
    run = json.loads((out / "spec" / "run.json").read_text())
    if run.get("device", "cpu") == "cpu":
        machine = f"{run['cpu']}, {run['cpu_capability']}; rollouts in {run['rollout_dtype']} on {run['rollout_threads']} threads"
    else:
        machine = f"{run['device']}; rollouts in {run['rollout_dtype']}"
    text = verdict({s["rollout"]: s for s in summaries}, exact, cfg, machine, out / "report" / "report.png")
    (out / "verdict.md").write_text(text + "\n")
    return text


def verdict(runs: dict, exact: dict, cfg: DemoConfig, machine: str, picture: Path) -> str:
    """The demo's findings in plain words, from the report's summaries of the ar and spec runs and the exactness
    check's result."""
    ar, spec = runs["ar"], runs["spec"]
    r, s, bound = spec["rollout_ratio_r"], spec["baseline_rollout_share"], spec["amdahl_bound"]
    measured = spec["speedup_per_token"]
    batch = cfg.prompts_per_step * cfg.num_generations
    worst = min(t["p_value"] for t in exact["tests"])
    faster = lambda x: f"{x:.2f}x " + ("faster" if x >= 1 else "as fast, that is slower,")  # noqa: E731
    lines = [
        f"# bebop demo: plain against speculative rollouts in GRPO, {cfg.model}",
        "",
        f"Two runs of {ar['steps']} GRPO steps, {batch} completions of up to {cfg.max_completion_length} tokens a "
        f"step, T = 1, in {cfg.rounds} interleaved rounds. Speculative rollouts: the model's shipped draft, frozen, "
        f"{cfg.draft_len} draft tokens per step. Machine: {machine}.",
        "",
        f"- Rollouts: speculative {faster(r)} per token than plain (acceptance {spec['acceptance_mean']:.2f}: "
        f"the share of drafted tokens the policy kept).",
        "- Same distribution? " + (
            f"Yes, as far as {exact['samples']} samples tell: {len(exact['tests'])} chi-square tests of the first "
            f"tokens against plain sampling and the model's own probabilities, smallest p = {worst:.3f} (a test "
            f"rejects below {exact['threshold']:.1e})." if exact["passed"] else
            f"NO: a chi-square test rejected (p = {worst:.2g} < {exact['threshold']:.1e}); speculative sampling here "
            f"is not exact: please report it."),
        f"- End to end: a step is {faster(measured)} per generated token with speculative rollouts (measured). "
        f"The most it could be here is {bound:.2f}x (Amdahl): rollouts are {s:.0%} of a plain step on this machine "
        f"and speculation leaves the trainer's {1 - s:.0%} as it is"
        + ("; the measurement above the bound is the runs' noise." if measured > bound else "."),
        f"- On a GPU (projection, not measured): where rollouts are {GPU_ROLLOUT_SHARE:.0%} of a step (GPU RL runs "
        f"report 70% and more), this rollout speedup would make a step up to {amdahl(GPU_ROLLOUT_SHARE, r):.2f}x "
        f"faster.",
    ]
    if r < 1:
        lines.append(f"- Why no rollout speedup: on this CPU, at {batch} rows per batch, verifying "
                     f"{cfg.draft_len + 1} tokens in one policy forward cost more than the accepted drafts saved.")
    lines += ["", f"Curves: {picture}; tables: {picture.parent / 'report.md'}."]
    return "\n".join(lines)
