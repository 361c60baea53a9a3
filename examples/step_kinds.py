"""Where a speculative run's time goes: its steps by kind (plain, the trained draft's, the history's alone, both)
and by how many rows were left, with their milliseconds a step and a token, beside plain decoding's.

    python examples/step_kinds.py [--task sequence] [--prompts 2] [--group 8] [--epochs 2] [--max-new-tokens 320]
        [--temperature 0.7] [--max-draft-len 4] [--arms ar,model,history,hybrid] [--dtype float32]

Each arm generates the same prompts `epochs` times (seeds 1000, 1001, ...); a hybrid's history learns from every
epoch, so the last epochs show it as RL's later epochs meet it. A drafting kind that costs more per token than
plain steps at the same rows is where auto lengths chose wrong.
"""

import argparse
import collections
import time

import torch

import bebop.engine.generation as engine
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft
from bebop.drafts.registry import trained_draft
from bebop.engine.draft_len import probe_buckets
from bebop.engine.memory import retain_freed_memory
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import rl_tasks


def step_kind(K, proposal, history_rows) -> str:
    return "plain" if K == 0 else "history" if proposal is not None else "model" if history_rows is None else "both"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="sequence")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-draft-len", type=int, default=4)
    ap.add_argument("--arms", default="ar,model,hybrid")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    retain_freed_memory()  # as in the engine's processes (bebop.engine.memory)
    model, tok = load_model(args.model, dtype=args.dtype)
    prompts = [chat_ids(tok, t.prompt) for t in rl_tasks(args.task, args.prompts, seed=0) for _ in range(args.group)]
    params, trained = SamplingParams(temperature=args.temperature), trained_draft(model)
    print(f"{args.model}, {cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {model.embed.weight.dtype}; "
          f"{len(prompts)} rows, T={args.temperature}", flush=True)
    probe_buckets(model, trained, len(prompts), args.max_draft_len)
    probe_buckets(model, HistoryDraft(), len(prompts), args.max_draft_len)

    seen = collections.defaultdict(lambda: [0, 0.0, 0])  # (rows bucket, kind) -> steps, seconds, tokens
    step = engine.speculative_step

    def timed(target, mtp, rows, cache, mcache, K, *rest):  # (rest: params, greedy, vocab_ids, proposal, lens, history_rows)
        start = time.perf_counter()
        out = step(target, mtp, rows, cache, mcache, K, *rest)
        n = len(rows)
        entry = seen[(1 << (n - 1).bit_length(), step_kind(K, rest[3], rest[5]))]
        entry[0] += 1
        entry[1] += time.perf_counter() - start
        entry[2] += int((out[1] + 1).sum())
        return out
    engine.speculative_step = timed

    for arm in args.arms.split(","):
        draft = {"ar": None, "model": trained, "history": HistoryDraft(),
                 "hybrid": HybridDraft(trained, HistoryDraft())}[arm]
        for epoch in range(args.epochs):
            seen.clear()
            g = engine.generate(model, prompts, args.max_new_tokens, params, mode="ar" if arm == "ar" else "spec",
                                draft=draft, draft_len="auto", max_draft_len=args.max_draft_len, seed=1000 + epoch)
            print(f"{arm}, epoch {epoch}: {g.stats.tokens} tokens", flush=True)
            for (rows, kind), (steps, seconds, tokens) in sorted(seen.items()):
                print(f"   <= {rows:3d} rows, {kind:7s}: {steps:4d} steps, {1000 * seconds / steps:6.1f} ms a step, "
                      f"{tokens / steps:5.2f} tokens a step, {1000 * seconds / tokens:6.2f} ms a token", flush=True)


if __name__ == "__main__":
    main()
