"""What carrying a trained draft costs when it drafts nothing: plain decoding (`ar`) against `spec` with the
shipped draft under auto K on prompts where auto K takes plain steps only, interleaved, the same seeds. Both
take the same steps; the difference is what the engine does for the draft beside them (capturing the target's
features, keeping each row's pile of them, choosing K).

    python examples/draft_upkeep_ab.py [--task sequence] [--prompts 8] [--group 8] [--max-new-tokens 160] \
        [--repeats 3] [--dtype auto]
"""

import argparse
import time

import torch

from bebop.drafts.registry import trained_draft
from bebop.engine.draft_len import probe_buckets
from bebop.engine.generation import generate
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import rl_tasks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="sequence")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    model, tok = load_model(args.model, dtype=args.dtype)
    prompts = [chat_ids(tok, t.prompt) for t in rl_tasks(args.task, args.prompts, seed=0, split="train")
               for _ in range(args.group)]
    draft, params = trained_draft(model), SamplingParams(temperature=args.temperature)
    print(f"{args.model}, {cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {args.dtype}; "
          f"{len(prompts)} rows, T={args.temperature}, {args.max_new_tokens} new tokens at most", flush=True)
    arms = {"ar": dict(mode="ar"), "spec": dict(mode="spec", draft=draft, draft_len="auto", max_draft_len=4)}
    probe_buckets(model, draft, len(prompts), 4)  # auto K's one-off probes, before anything is timed
    for kw in arms.values():  # warm-up
        generate(model, prompts, args.max_new_tokens, params, seed=1, **kw)
    ratios = []
    for r in range(args.repeats):
        per_token = {}
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            start = time.perf_counter()
            g = generate(model, prompts, args.max_new_tokens, params, seed=1, **arms[name])
            seconds = time.perf_counter() - start
            per_token[name] = seconds / g.stats.tokens
            print(f"round {r} {name}: {g.stats.tokens / seconds:.1f} tok/s, "
                  f"drafted {g.stats.drafted}", flush=True)
        ratios.append(per_token["ar"] / per_token["spec"])
    print("spec / ar per token, each round: " + ", ".join(f"{x:.2f}x" for x in ratios))


if __name__ == "__main__":
    main()
