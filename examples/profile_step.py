"""Where one speculative step's time goes: `generate` (spec, fixed K) under torch.profiler on a real model.

    PYTHONPATH=. OMP_NUM_THREADS=1 python examples/profile_step.py --batch 1 --batch 16
    (--draft-len 0: plain decoding steps, as `ar` takes them)

Prints wall ms per speculative step (steps = target verification forwards) and the top operators by self
CPU time. Uses only the engine's original arguments, so it also profiles older versions of the engine.
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bebop.engine.generation import generate
from bebop.models.registry import chat_ids, load_model
from bebop.drafts.registry import default_mtp
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, action="append", default=[])
    ap.add_argument("--draft-len", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--dtype", default="auto", help="auto (as the CLI's default), float32 or bfloat16")
    args = ap.parse_args()
    model, tok = load_model(args.model, dtype=args.dtype)
    mtp = default_mtp(model)
    texts = default_prompts(max(args.batch or [1]))
    for b in args.batch or [1]:
        prompts = [chat_ids(tok, t) for t in texts[:b]]
        kw = dict(mode="spec", mtp=mtp, draft_len=args.draft_len, seed=0, eos_ids=[])
        generate(model, prompts, 8, SamplingParams(), **kw)  # warm-up
        start = time.perf_counter()
        g = generate(model, prompts, args.max_new_tokens, SamplingParams(), **kw)
        wall = time.perf_counter() - start
        steps = g.stats.steps // b or args.max_new_tokens - 1  # stats count drafting row-steps; --draft-len 0: plain
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            generate(model, prompts, args.max_new_tokens, SamplingParams(), **kw)
        print(f"\n=== batch {b}: {1000 * wall / steps:.1f} ms per step ({steps} steps, {wall:.2f} s, "
              f"{g.stats.tokens / wall:.1f} tok/s, mean acceptance length {g.stats.mean_acceptance_length or 1:.2f})")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
