"""What a speculative step costs against a plain one on this machine, and so the most any draft can gain here.

    python examples/verify_ceiling.py [--batch-sizes 1,16,64] [--context 256] [--max-draft-len 4]
        [--accepted-through 0.96,0.77,0.52,0.37] [--dtype auto] [--out results/bench/verify-ceiling.json]

Times the engine's own step (bebop.engine.draft_len.probe_costs: verify, rejection sampling, the entropies the
engine records) with K = 0..max drafts per row at each batch size after `context` cached tokens, for drafts
that cost nothing to propose (a history draft's) and for the shipped trained draft (its drafting included).
A step with K drafts per row emits at most K + 1 tokens a row, so (K + 1) / (cost(K) / cost(0)) bounds the
speedup over plain decoding of any draft, however good; with `--accepted-through` (the chance that a row's
drafts 1..j are all accepted, j = 1..max: by default the history draft's per-position acceptance on the
sequence task's second epoch at 64 rows, results/bench/history-epochs-sequence-b64-amx-bf16-packed.json) a
step emits 1 + the sum of those chances up to K, in expectation. On a GPU a verify of a few tokens a row costs about what one token does; on a
2-core CPU at RL batch sizes the forward is already busy at one token a row, and this shows by how much.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bebop.drafts.history import HistoryDraft
from bebop.drafts.registry import trained_draft
from bebop.engine.draft_len import probe_costs
from bebop.engine.memory import retain_freed_memory
from bebop.models import cpu
from bebop.models.registry import load_model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--max-draft-len", type=int, default=4)
    ap.add_argument("--accepted-through", default="0.96,0.77,0.52,0.37",
                    help="the chance that drafts 1..j are all accepted, j = 1..max")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    retain_freed_memory()  # as in the engine's processes (bebop.engine.memory)
    model, _ = load_model(args.model, dtype=args.dtype)
    K_max = args.max_draft_len
    chain = np.array([float(a) for a in args.accepted_through.split(",")][:K_max])
    expected = np.concatenate([[1.0], 1 + np.cumsum(chain)])  # [K_max + 1] tokens a row per step, by K
    machine = f"{cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads, {model.embed.weight.dtype}"
    print(f"{args.model}, {machine}, {args.context} cached tokens a row; drafts 1..j accepted with {chain.tolist()}")
    print("batch  draft    cost(K)/cost(0), K = 1..max        at most (all accepted)   with that acceptance")
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for name, draft in (("history", HistoryDraft()), ("trained", trained_draft(model))):
            costs, _ = probe_costs(model, draft, batch, K_max, context=args.context, repeats=args.repeats)
            ratio = np.array(costs) / costs[0]  # [K_max + 1]
            ceiling = (np.arange(K_max + 1) + 1) / ratio
            likely = expected[:K_max + 1] / ratio
            rows.append({"batch": batch, "draft": name, "plain_step_ms": 1e3 * costs[0], "cost_ratio": ratio.tolist(),
                         "ceiling": float(ceiling.max()), "ceiling_K": int(ceiling.argmax()),
                         "with_acceptance": float(likely.max()), "with_acceptance_K": int(likely.argmax())})
            print(f"{batch:5d}  {name:8s} {' '.join(f'{r:5.2f}' for r in ratio[1:]):34s} "
                  f"{ceiling.max():5.2f}x (K={ceiling.argmax()})         {likely.max():5.2f}x (K={likely.argmax()})",
                  flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": vars(args), "machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
