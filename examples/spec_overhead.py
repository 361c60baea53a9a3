"""Where `spec` with auto K spends its time against `ar` at one batch size: the engine's steps (drafting,
verifying, sampling), the per-step choice of draft lengths, prefill and bookkeeping, each summed over a
generation. Interleaved rounds on the default model and its shipped draft, loaded as `bebop bench` loads them
(--dtype auto, --compile auto); T=1, EOS stops, 64 new tokens, the built-in held-out prompts (a fresh batch each
round; round 0 is a warm-up).

    .venv/bin/python examples/spec_overhead.py BATCH [ROUNDS]      (e.g. 16 5)
"""

import sys
import time
from collections import defaultdict

import torch

import bebop.engine.generation as generation
import bebop.engine.scheduler as scheduler
from bebop.drafts.registry import trained_draft
from bebop.models import cpu
from bebop.models.registry import chat_ids, load_model
from bebop.sampling import SamplingParams
from bebop.tasks import default_prompts

# (module, attribute, label): what is timed, each call's seconds added to its label
TIMED = ((generation, "speculative_step", "steps (draft, verify, sample)"),
         (generation, "choose_step_draft_len", "choosing K (per step)"),
         (generation, "choose_row_draft_lens", "  of which: each row's k_r"),
         (scheduler.Scheduler, "fill", "prefill (target and draft)"),
         (scheduler.Scheduler, "record", "recording tokens"))


def main():
    batch, rounds = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5
    model, tok = load_model("smollm2-135m", dtype="auto", compile="auto")
    draft = trained_draft(model)
    seconds = defaultdict(float)  # (mode, label) -> seconds over the timed rounds
    mode_now = ["ar"]

    def timed(f, label):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                seconds[mode_now[0], label] += time.perf_counter() - start
        return call

    for owner, name, label in TIMED:
        setattr(owner, name, timed(getattr(owner, name), label))
    texts = default_prompts(batch * rounds)
    tokens = defaultdict(int)
    for rnd in range(rounds):
        prompts = [chat_ids(tok, t) for t in texts[batch * rnd:batch * (rnd + 1)]]
        for mode in ("ar", "spec") if rnd % 2 == 0 else ("spec", "ar"):
            mode_now[0] = mode if rnd else "warm-up"
            start = time.perf_counter()
            g = generation.generate(model, prompts, 64, SamplingParams(1.0), seed=rnd, mode=mode,
                                    draft=draft if mode == "spec" else None)
            if rnd:
                seconds[mode, "whole generation"] += time.perf_counter() - start
                tokens[mode] += g.stats.tokens
    print(f"smollm2-135m, {cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, "
          f"{model.embed.weight.dtype}, compiled {model.compiled}; {batch} rows, {rounds - 1} timed rounds")
    labels = ["whole generation"] + [label for *_, label in TIMED]
    print(f"{'':32s} {'ar s':>8s} {'spec s':>8s}  spec - ar")
    for label in labels:
        ar, spec = seconds["ar", label], seconds["spec", label]
        print(f"{label:32s} {ar:8.3f} {spec:8.3f}  {spec - ar:+8.3f}")
    rate = {m: tokens[m] / seconds[m, "whole generation"] for m in ("ar", "spec")}
    print(f"tokens/s: ar {rate['ar']:.1f}, spec {rate['spec']:.1f} ({rate['spec'] / rate['ar']:.3f}x ar)")


if __name__ == "__main__":
    main()
