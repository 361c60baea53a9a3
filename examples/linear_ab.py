"""Interleaved A/B of the linear kind in plain decoding (ar) on the default model: plain F.linear against the
kind this machine's dtype probe chose (--dtype auto); 64 new tokens, T=1, no EOS stop, 3 timed rounds after a
warm-up round, the order alternating.

    .venv/bin/python examples/linear_ab.py BATCH
"""

import sys
import time

import torch

from bebop.engine.generation import generate
from bebop.models.registry import chat_ids, load_model
from bebop.models import cpu
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts

batch = int(sys.argv[1])
model, tok = load_model("smollm2-135m", dtype="auto")
chosen = model.linear
print("probe chose", model.embed.weight.dtype, chosen, model.attention, "|", cpu.cpu_model(), cpu.describe(), torch.get_num_threads(), "threads")
prompts = [chat_ids(tok, t) for t in default_prompts(batch)]
res = {"plain": [], chosen: []}
for rep in range(4):
    for kind in (["plain", chosen] if rep % 2 == 0 else [chosen, "plain"]):
        model.linear = kind
        t = time.perf_counter()
        g = generate(model, prompts, 64, SamplingParams(), mode="ar", seed=rep, eos_ids=[])
        if rep:  # rep 0 warms up
            res[kind].append(g.stats.tokens / (time.perf_counter() - t))
for k, v in res.items():
    print(f"batch {batch} {k}: tok/s {[round(x, 1) for x in v]}, best {max(v):.1f}")
print(f"ratio of best: {max(res[chosen]) / max(res['plain']):.2f}x")
