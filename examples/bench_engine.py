"""Engine measurements that `bebop bench` does not make, as ratios taken in one process, interleaved.

    # fixed K vs K chosen by cost, against plain decoding, at several batch sizes (every row runs to the limit)
    PYTHONPATH=. OMP_NUM_THREADS=1 python examples/bench_engine.py draft-len --batch-sizes 1,16,64
    # continuous batching: N requests with EOS stops through max_batch rows vs fixed batches of max_batch
    PYTHONPATH=. OMP_NUM_THREADS=1 python examples/bench_engine.py batching --requests 64 --max-batch 16
    # the attention kernel of verification steps (several new tokens per row), against plain decoding
    PYTHONPATH=. python examples/bench_engine.py attention --batch-sizes 16 --draft-lens 1,3 --dtype bfloat16

Every variant gets the same prompts and per-request seeds; tokens/s is total tokens over total time across
repetitions, and each repetition runs the variants in a rotated order.
"""

import argparse
import time

import torch

from bebop.engine.generation import generate
from bebop.models.cpu import cpu_model
from bebop.models.registry import chat_ids, load_model
from bebop.drafts.registry import default_mtp
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts


def interleave(variants: dict, repeats: int) -> dict:
    """name -> fn() returning (tokens, stats); returns name -> (tokens/s, seconds, last stats)."""
    acc = {k: [0, 0.0, None] for k in variants}
    names = list(variants)
    for rep in range(repeats):
        for i in range(len(names)):
            name = names[(i + rep) % len(names)]
            start = time.perf_counter()
            tokens, stats = variants[name]()
            acc[name][1] += time.perf_counter() - start
            acc[name][0] += tokens
            acc[name][2] = stats
    return {k: (t / s, s, st) for k, (t, s, st) in acc.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("draft-len", "batching", "attention"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--draft-lens", default="3,auto")
    ap.add_argument("--mode", default="ar", help="batching: the mode of both variants (ar or spec)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--kernels", default="sdpa,folded", help="attention: verification kernels to compare")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    args = ap.parse_args()
    model, tok = load_model(args.model, dtype=args.dtype)
    mtp = default_mtp(model)
    params = SamplingParams(args.temperature)
    print(f"model {args.model}, dtype {str(model.embed.weight.dtype).removeprefix('torch.')} (--dtype {args.dtype}), "
          f"CPU {cpu_model()}, {torch.get_num_threads()} threads")
    if args.what in ("draft-len", "attention"):
        lens = [x if x == "auto" else int(x) for x in args.draft_lens.split(",")]
        kernels = args.kernels.split(",") if args.what == "attention" else [model.attention[1]]
        one_token = model.attention[0]  # plain decoding steps keep the probed kernel throughout
        for b in [int(x) for x in args.batch_sizes.split(",")]:
            prompts = [chat_ids(tok, t) for t in default_prompts(b)]
            def run(mode, K, kernel=kernels[0]):
                def f():
                    model.attention = (one_token, kernel)
                    g = generate(model, prompts, args.max_new_tokens, params, mode=mode, draft=mtp, draft_len=K,
                                 seed=0, eos_ids=[])
                    return g.stats.tokens, g.stats
                return f
            variants = {"ar": run("ar", 0), **{f"spec K={K}" + (f" {a}" if len(kernels) > 1 else ""): run("spec", K, a)
                                               for K in lens for a in kernels}}
            # warm-up; for "auto" this also probes (once per machine) the cost table of this batch size
            generate(model, prompts, 4, params, mode="spec", draft=mtp, draft_len="auto", eos_ids=[])
            res = interleave(variants, args.repeats)
            base = res["ar"][0]
            for name, (tps, secs, st) in res.items():
                extra = "" if not st.steps else (f"  mean K {st.mean_draft_len:.2f}  accept {st.acceptance_rate:.3f}"
                                                 f"  mean len {st.mean_acceptance_length:.2f}")
                print(f"batch {b:>3}  {name:<19} {tps:8.1f} tok/s  {tps / base:5.2f}x ar  ({secs:.1f} s){extra}")
    else:
        n, mb = args.requests, args.max_batch
        prompts = [chat_ids(tok, t) for t in default_prompts(n)]
        seeds = [1_000_003 * 7 + i for i in range(n)]
        kw = dict(mode=args.mode, draft=mtp, draft_len=3)

        def continuous():
            g = generate(model, prompts, args.max_new_tokens, params, seed=seeds, max_batch=mb, **kw)
            return g.stats.tokens, g.stats

        def fixed():
            tokens = 0
            for s in range(0, n, mb):
                tokens += generate(model, prompts[s:s + mb], args.max_new_tokens, params, seed=seeds[s:s + mb],
                                   **kw).stats.tokens
            return tokens, None

        res = interleave({"continuous": continuous, "fixed": fixed}, args.repeats)
        st = res["continuous"][2]
        print(f"{n} requests, EOS stops, {args.mode}, max {args.max_new_tokens} new tokens: "
              f"{st.tokens / n:.1f} tokens per request on average")
        for name, (tps, secs, _) in res.items():
            print(f"{name:<11} max_batch={mb}  {tps:8.1f} tok/s  ({secs:.1f} s)  "
                  f"{tps / res['fixed'][0]:.2f}x fixed batches")


if __name__ == "__main__":
    main()
