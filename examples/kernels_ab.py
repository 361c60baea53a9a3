"""Interleaved A/B of linear kinds and attention kernels in plain decoding (ar) on the default model in fp32: the
first configuration is the baseline; 64 new tokens, T=1, no EOS stop, the built-in held-out prompts, 3 timed
rounds after a warm-up round, the order alternating.

    .venv/bin/python examples/kernels_ab.py BATCH LINEAR[/ATTENTION_ONE/ATTENTION_SEVERAL] ...
    e.g. examples/kernels_ab.py 16 packed/sdpa/sdpa onednn/sdpa/sdpa onednn/paged/paged
"""

import sys
import time

import torch

from bebop.engine.generation import generate
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts

batch, configs = int(sys.argv[1]), [tuple(c.split("/")) for c in sys.argv[2:]]
model, tok = load_model("smollm2-135m", dtype="float32")
print(f"{cpu.cpu_model()} [{cpu.describe()}], vLLM kernels {cpu.vllm_library()}, {torch.get_num_threads()} threads; "
      f"the probe's choice: {model.linear}, {model.attention}", flush=True)
prompts = [chat_ids(tok, t) for t in default_prompts(batch)]
res = {c: [] for c in configs}
for rep in range(4):
    for c in (configs if rep % 2 == 0 else configs[::-1]):
        model.linear = c[0]
        if len(c) > 1:
            model.attention = tuple(c[1:3])
        start = time.perf_counter()
        g = generate(model, prompts, 64, SamplingParams(), mode="ar", seed=rep, eos_ids=[])
        if rep:  # rep 0 warms up
            res[c].append(g.stats.tokens / (time.perf_counter() - start))
base = max(res[configs[0]])
for c, v in res.items():
    print(f"batch {batch} {'/'.join(c)}: tok/s {[round(x, 1) for x in v]}, best {max(v):.1f} ({max(v) / base:.2f}x)")
