"""Interleaved A/B of `ar` against `spec` with auto K on the default model and its shipped draft, the way `bebop
bench` loads them (--dtype auto, --compile auto): at a batch where auto K drafts little or nothing, what speculation
costs when it does not draft. T=1, EOS stops, 64 new tokens, the built-in held-out prompts (a fresh batch each
round), 4 timed rounds after a warm-up, the order alternating; prints each mode's tokens/s and how much `spec`
drafted.

    .venv/bin/python examples/spec_idle_ab.py BATCH      (e.g. 16)
"""

import sys
import time

import torch

from bebop.drafts.registry import trained_draft
from bebop.engine.draft_len import probe_buckets
from bebop.engine.generation import generate
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts

batch, rounds = int(sys.argv[1]), 4
model, tok = load_model("smollm2-135m", dtype="auto", compile="auto")
draft = trained_draft(model)
print(f"{cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {model.embed.weight.dtype}, "
      f"linear {model.linear}, attention {model.attention}, compiled {model.compiled}", flush=True)
prompts = [chat_ids(tok, t) for t in default_prompts(batch * (rounds + 1))]
probe_buckets(model, draft, batch, 4)  # auto K's one-off step-cost probes, before any timing
for mode in ("ar", "spec"):  # warm-up: compiles every shape class either mode meets
    generate(model, prompts[:batch], 8, SamplingParams(), mode=mode, draft=draft, seed=0)
seconds, tokens, drafted = {"ar": 0.0, "spec": 0.0}, {"ar": 0, "spec": 0}, 0
for r in range(1, rounds + 1):
    for mode in (("ar", "spec") if r % 2 else ("spec", "ar")):
        t = time.perf_counter()
        g = generate(model, prompts[batch * r:batch * (r + 1)], 64, SamplingParams(), mode=mode, draft=draft, seed=r)
        seconds[mode] += time.perf_counter() - t
        tokens[mode] += g.stats.tokens
        drafted += g.stats.drafted if mode == "spec" else 0
rate = {m: tokens[m] / seconds[m] for m in seconds}
print(f"batch {batch}: ar {rate['ar']:.1f} tok/s, spec {rate['spec']:.1f} tok/s ({rate['spec'] / rate['ar']:.3f}x ar), "
      f"spec drafted {drafted} tokens in {rounds} rounds")
