"""Interleaved A/B of a draining batch's draft lengths on the default model and its shipped EAGLE-3 draft:
`ar`, `spec` with one K for the whole batch (the drain rule every row shared before), and `spec` with each row
its own k_r (bebop.engine.draft_len.choose_row_draft_lens, the engine's default). T=1, EOS stops, 64 new tokens,
the built-in held-out prompts (a fresh batch each round), a warm-up, then `rounds` timed rounds with the order
rotating; prints each arm's tokens/s, its ratio to `ar`, what it drafted and its mean acceptance length.

    .venv/bin/python examples/row_lengths_ab.py BATCH [ROUNDS] [--compile auto]   (e.g. 16; eager by default)
"""

import sys
import time

import torch

import bebop.engine.generation as engine
from bebop.drafts.registry import trained_draft
from bebop.engine.draft_len import choose_draft_len, choose_row_draft_lens, probe_buckets
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts


def one_k_for_all(row_alphas, remaining, costs, fixed_costs, max_k, row_spread=None, backlog=0.0):
    """The drain rule with one K for every row (choose_draft_len), as lengths per row."""
    K = choose_draft_len(row_alphas.mean(0), costs, max_k, (row_alphas, row_spread, remaining, fixed_costs, backlog))
    return torch.full((len(remaining),), K).numpy()


args = [a for a in sys.argv[1:] if not a.startswith("--")]
batch, rounds = int(args[0]), int(args[1]) if len(args) > 1 else 4
model, tok = load_model("smollm2-135m", dtype="float32", compile="auto" if "--compile" in sys.argv else "0")
draft = trained_draft(model)
print(f"{cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {model.embed.weight.dtype}, "
      f"linear {model.linear}, attention {model.attention}, compiled {model.compiled}", flush=True)
prompts = [chat_ids(tok, t) for t in default_prompts(batch * (rounds + 1))]
probe_buckets(model, draft, batch, 4)  # auto K's one-off step-cost probes, before any timing
arms = {"ar": ("ar", None), "spec one K": ("spec", one_k_for_all), "spec per row": ("spec", choose_row_draft_lens)}


def run(arm, batch_prompts, new_tokens, seed):
    mode, rule = arms[arm]
    engine.choose_row_draft_lens = rule or choose_row_draft_lens
    return engine.generate(model, batch_prompts, new_tokens, SamplingParams(), mode=mode, draft=draft, seed=seed)


for arm in arms:  # warm-up
    run(arm, prompts[:batch], 8, 0)
seconds, tokens, drafted, steps, accepted = ({a: 0 for a in arms} for _ in range(5))
names = list(arms)
for r in range(1, rounds + 1):
    for arm in names[r % 3:] + names[:r % 3]:
        t = time.perf_counter()
        g = run(arm, prompts[batch * r:batch * (r + 1)], 64, r)
        seconds[arm] += time.perf_counter() - t
        tokens[arm] += g.stats.tokens
        drafted[arm] += g.stats.drafted
        steps[arm] += g.stats.steps
        accepted[arm] += g.stats.accepted
print(f"batch {batch}, {rounds} rounds, T=1, 64 new tokens, EOS stops")
for arm in arms:
    rate = tokens[arm] / seconds[arm]
    mal = f", mean acceptance length {1 + accepted[arm] / steps[arm]:.2f}" if steps[arm] else ""
    print(f"  {arm:13s} {rate:7.1f} tok/s  {rate / (tokens['ar'] / seconds['ar']):.3f}x ar  drafted {drafted[arm]}"
          f"{mal}", flush=True)
