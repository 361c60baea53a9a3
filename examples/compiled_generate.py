"""`ar` generations at batch 1, compiled and eager alternating in one process (the first compiled pass pays the
compiles): tokens per second of each pass.

    python examples/compiled_generate.py   # the first 6 held-out hand-written prompts, 48 new tokens, T=1
"""

import json
import time

from bebop.engine.generation import generate
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams

model, tok = load_model("smollm2-135m", dtype="auto")
with open("results/prompts/heldout-handwritten.jsonl") as f:
    prompts = [chat_ids(tok, json.loads(line)["prompt"]) for line in f][:6]
for flag in (True, False, True, False):
    model.compiled = flag
    start, tokens = time.perf_counter(), 0
    for p in prompts:
        tokens += generate(model, [p], 48, SamplingParams(1.0), mode="ar", seed=1).stats.tokens
    print("compiled" if flag else "eager", f"{tokens / (time.perf_counter() - start):.1f} tok/s", flush=True)
