"""Rollouts over several epochs of the same RL prompts: plain sampling (`ar`) against the history draft
(bebop.drafts.history, which learns from every rollout it drafts for, the earlier epochs' and the group's), the
model's trained draft alone, and the hybrid of both (bebop.drafts.hybrid: per row and step, the one that
promises more), all under auto draft lengths.

    python examples/history_epochs.py [--task code] [--prompts 2] [--group 8] [--epochs 3] [--max-new-tokens 96]
        [--temperature 1.0] [--max-draft-len 4] [--drafts history,model,hybrid] [--dtype float32] [--repeats 1]
        [--out results/bench/history-epochs.json]

Each epoch samples every prompt `group` times (one batch of prompts x group rows, EOS stops) in every arm, the
order rotating, with the same seeds; time per generated token is compared within the epoch (the machine's
speed drifts between epochs). The histories start empty: epoch 0 drafts only from the group's text. With
--repeats R every arm runs R rounds of an epoch, each round from the history the epoch started with (the last
round's rollouts are the ones it learns) and with its own seed, the same in every arm. An epoch's speedup is
ar's seconds per token over the arm's, each summed over the rounds: EOS makes a round's length (and how long
its batch spends in the few-row tail) a draw of the sampling, which differs between arms in a round since
auto K changes the draws, so one round's ratio swings with its lengths while the sums converge. Beside it,
the speedup per batch: ar's seconds over the arm's, summed over the rounds, the wall time an RL step waits
for its rollouts (the same in expectation: the drafts are lossless, so every arm's lengths have one
distribution; steadier where the longest row, which sets a batch's time, mostly runs to the token limit).
"""

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft, history_of
from bebop.drafts.registry import trained_draft
from bebop.engine.draft_len import probe_buckets
from bebop.engine.generation import generate
from bebop.engine.memory import retain_freed_memory
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import rl_tasks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="code")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-draft-len", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafts", default="history,model,hybrid", help="the speculative arms beside ar")
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds of every arm per epoch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    retain_freed_memory()  # as in the engine's processes (bebop.engine.memory)
    model, tok = load_model(args.model, dtype=args.dtype)
    tasks = rl_tasks(args.task, args.prompts, seed=0, split="train")
    prompts = [chat_ids(tok, t.prompt) for t in tasks for _ in range(args.group)]
    params = SamplingParams(temperature=args.temperature)
    trained = trained_draft(model)
    drafts = {"history": lambda: HistoryDraft(), "model": lambda: trained,
              "hybrid": lambda: HybridDraft(trained, HistoryDraft())}
    arms = {"ar": None, **{name: drafts[name]() for name in args.drafts.split(",")}}
    machine = f"{cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {args.dtype}"
    print(f"{args.model}, {machine}; {len(prompts)} rows ({args.prompts} prompts x {args.group}), T={args.temperature}, "
          f"max_draft_len {args.max_draft_len}", flush=True)

    def run(arm, seed):
        start = time.perf_counter()
        g = generate(model, prompts, args.max_new_tokens, params, mode="ar" if arm == "ar" else "spec", draft=arms[arm],
                     draft_len="auto", max_draft_len=args.max_draft_len, seed=seed)
        return time.perf_counter() - start, g

    # auto's one-off cost probes, at every batch size a draining batch passes through, before anything is timed
    probe_buckets(model, HistoryDraft(), len(prompts), args.max_draft_len)
    probe_buckets(model, trained, len(prompts), args.max_draft_len)
    for arm in arms:  # warm-up (the histories are emptied below)
        run(arm, 999)
    for draft in arms.values():
        if history_of(draft) is not None:
            history_of(draft).prompts.clear()
    names, epochs = list(arms), []
    for epoch in range(args.epochs):
        start = {arm: copy.deepcopy(history_of(d)) for arm, d in arms.items() if history_of(d) is not None}
        rounds = []
        for r in range(args.repeats):
            out = {}
            shift = (epoch + r) % len(names)
            for arm in names[shift:] + names[:shift]:
                if arm in start:  # every round drafts from the history the epoch started with
                    set_history(arms, arm, copy.deepcopy(start[arm]))
                seconds, g = run(arm, 1000 + epoch * args.repeats + r)
                out[arm] = {"seconds": seconds, "tokens": g.stats.tokens, "stats": g.stats.summary()}
            rounds.append(out)
        per_token = [{arm: o[arm]["seconds"] / o[arm]["tokens"] for arm in o} for o in rounds]
        summed = {arm: sum(o[arm]["seconds"] for o in rounds) / sum(o[arm]["tokens"] for o in rounds) for arm in names}
        speedup = {arm: summed["ar"] / summed[arm] for arm in names}
        seconds = {arm: sum(o[arm]["seconds"] for o in rounds) for arm in names}  # what an RL step waits for
        row = {"epoch": epoch, **rounds[-1], "speedup_per_token": speedup,
               "speedup_per_batch": {arm: seconds["ar"] / seconds[arm] for arm in names},
               "rounds_speedup_per_token": [{arm: p["ar"] / p[arm] for arm in names} for p in per_token],
               "rounds_seconds_tokens": [{arm: [o[arm]["seconds"], o[arm]["tokens"]] for arm in names} for o in rounds]}
        epochs.append(row)
        out = rounds[-1]
        for arm in names[1:]:
            s = out[arm]["stats"]
            share = f", history drafted {s['history_drafted'] / s['drafted']:.2f} of it" if arm == "hybrid" and s["drafted"] else ""
            print(f"epoch {epoch} {arm:8s}: {row['speedup_per_token'][arm]:.2f}x ar per token, "
                  f"{row['speedup_per_batch'][arm]:.2f}x per batch; acceptance "
                  f"{s['acceptance_rate'] or 0:.2f}, mean acceptance length {s['mean_acceptance_length'] or 1:.2f}, "
                  f"drafted {s['drafted']}{share}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": vars(args), "machine": machine, "rows": len(prompts),
                                              "epochs": epochs}, indent=1))


def set_history(arms: dict, arm: str, history: HistoryDraft) -> None:
    if isinstance(arms[arm], HistoryDraft):
        arms[arm] = history
    else:
        arms[arm].history = history


if __name__ == "__main__":
    main()
