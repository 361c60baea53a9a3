"""The compiled decode and verify step against eager, one target forward plus logits per shape: compile time,
the L1 distance of the next-token distributions, and the step-time ratio from interleaved pairs (medians).

    python examples/compiled_step.py --model smollm2-135m --shapes 1x1,16x1,64x1,1x4,16x4
    python examples/compiled_step.py --per-layer ...   # one compiled Block.forward that every layer calls instead
"""

import argparse
import time

import torch

from bebop.models import compiled, cpu, decoder
from bebop.models.registry import load_model

PROMPT = "Write a short story about a robot who learns to paint, in the style of a fairy tale. Once upon a time"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--shapes", default="1x1,16x1,64x1,1x4,16x4", help="rows x new tokens per row")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--per-layer", action="store_true",
                    help="compile one layer's forward (one graph per shape class that all layers share) instead of "
                         "the whole stack: a few seconds to compile, a guard check per layer per forward")
    args = ap.parse_args()
    if args.per_layer:
        compiled.layers = per_layer
    model, tok = load_model(args.model, dtype="auto")
    print(f"{args.model}: {str(model.embed.weight.dtype)[6:]}, attention {model.attention}, linear {model.linear}, "
          f"cpu {cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads")
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        for shape in args.shapes.split(","):
            B, T = map(int, shape.split("x"))
            model.compiled = False
            cache = model.new_cache(B, ids.shape[1] + 8)
            model(ids[:, :-T].expand(B, -1).contiguous(), cache)
            cache.lengths[:] = ids.shape[1] - T
            tokens = ids[:, -T:].expand(B, -1).contiguous()

            def step(flag):
                model.compiled = flag
                start = time.perf_counter()
                p = model.logits(model(tokens, cache)).softmax(-1)
                return time.perf_counter() - start, p

            _, eager = step(False)
            compile_s, comp = step(True)
            times = {False: [], True: []}
            for _ in range(args.pairs):
                for flag in (False, True):
                    times[flag].append(step(flag)[0])
            med = {f: sorted(t)[len(t) // 2] for f, t in times.items()}
            print(f"{B} rows x {T} tokens: first compiled call {compile_s:.1f} s, L1 {float((eager - comp).abs().sum(-1).max()):.4f}, "
                  f"eager {1e3 * med[False]:.2f} ms, compiled {1e3 * med[True]:.2f} ms, compiled / eager "
                  f"{med[True] / med[False]:.3f}", flush=True)


def per_layer(model, fn):
    """A stand-in for compiled.layers: run_layers with each layer through one compiled Block.forward."""
    compiled.refresh_fast_weights(model)
    step = compiled.compiled(decoder.Block.forward)

    def run(model, tokens, cos, sin, k_caches, v_caches, positions, rows, bias, capture):
        x = model.embed(tokens)
        for i, layer in enumerate(model.layers):
            x = step(layer, x, cos, sin, k_caches[i], v_caches[i], positions, rows, bias, model.attention)
        return x

    return run


if __name__ == "__main__":
    main()
