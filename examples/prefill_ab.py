"""Interleaved A/B of how prompts are prefilled, in plain decoding (ar) on the default model: one forward padded
to the longest prompt against forwards over groups of like lengths (bebop.engine.scheduler.length_groups);
the built-in held-out prompts, T=1, no EOS stop, 3 timed rounds after a warm-up round, the order alternating.

    .venv/bin/python examples/prefill_ab.py BATCH [NEW_TOKENS]
"""

import sys
import time

import torch

from bebop.engine import scheduler
from bebop.engine.generation import generate
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts

batch = int(sys.argv[1])
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
model, tok = load_model("smollm2-135m", dtype="auto")
prompts = [chat_ids(tok, t) for t in default_prompts(batch)]
print(f"{cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {model.embed.weight.dtype}, "
      f"linear {model.linear}, attention {model.attention}; prompts of {min(map(len, prompts))}-"
      f"{max(map(len, prompts))} tokens", flush=True)
variants = {"one padded forward": lambda p: [p] if p else [], "length groups": scheduler.length_groups}
res = {k: [] for k in variants}
for rep in range(4):
    for name in (list(variants) if rep % 2 == 0 else list(variants)[::-1]):
        scheduler.length_groups = variants[name]
        start = time.perf_counter()
        g = generate(model, prompts, new_tokens, SamplingParams(), mode="ar", seed=rep, eos_ids=[])
        if rep:  # rep 0 warms up
            res[name].append(g.stats.tokens / (time.perf_counter() - start))
base = max(res["one padded forward"])
for name, v in res.items():
    print(f"batch {batch}, {new_tokens} new tokens, ar, T=1: {name}: tok/s {[round(x, 1) for x in v]}, "
          f"best {max(v):.1f} ({max(v) / base:.2f}x)")
