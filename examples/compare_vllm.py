"""The same EAGLE-3 draft in vLLM and in bebop's engine: per-position acceptance on the same prompts, T and K.

    python examples/compare_vllm.py --model smollm2-135m --draft DIR --prompts results/prompts/heldout-handwritten.jsonl \\
        --draft-len 3 --max-new-tokens 96 --out results/eagle3/vllm-vs-bebop.json

`--draft` is an EAGLE-3 directory (`bebop export`). bebop generates one prompt at a time (batch 1, fixed K);
vLLM gets them all (its acceptance does not depend on the batch: both sample exactly). vLLM runs in its own
process (bebop.backends.vllm.engine), on all cores, after bebop has finished.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bebop.studies.bench import merge
from bebop.engine.generation import SpecStats, generate
from bebop.models import cpu
from bebop.models.registry import chat_ids, hf_dir, load_model
from bebop.drafts.registry import load_mtp
from bebop.sampling import SamplingParams
from bebop.tasks import load_prompts_file


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    model, tok = load_model(args.model, dtype="float32")  # vLLM runs the same fp32 weights
    draft = load_mtp(args.draft, model)
    prompts = [chat_ids(tok, t) for t in load_prompts_file(args.prompts)]
    total = SpecStats()
    for i, prompt in enumerate(prompts):
        s = generate(model, [prompt], args.max_new_tokens, SamplingParams(args.temperature), mode="spec", draft=draft,
                     draft_len=args.draft_len, seed=args.seed + i).stats
        merge(total, s)
    with tempfile.TemporaryDirectory() as tmp:
        ids = Path(tmp) / "prompts.jsonl"
        ids.write_text("".join(json.dumps({"prompt_ids": x}) + "\n" for x in prompts))
        proc = subprocess.run([sys.executable, "-m", "bebop.backends.vllm.engine", "--model", str(hf_dir(args.model)),
                               "--draft", args.draft, "--prompts", str(ids), "--num-speculative-tokens",
                               str(args.draft_len), "--temperature", str(args.temperature), "--max-tokens",
                               str(args.max_new_tokens), "--seed", str(args.seed)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-2000:])
    vllm = json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"tokens"')][-1])
    ours = {"acceptance_rate": total.acceptance_rate, "mean_acceptance_length": total.mean_acceptance_length,
            "per_position_acceptance": total.per_position_acceptance, "steps": total.steps}
    result = {"model": args.model, "draft": args.draft, "prompts": args.prompts, "n_prompts": len(prompts),
              "draft_len": args.draft_len, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "dtype": "float32", "cpu": cpu.cpu_model(), "cpu_capability": cpu.describe(), "bebop": ours,
              "vllm": {k: v for k, v in vllm.items() if k != "tokens"}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("bebop", "vllm")}, indent=1))


if __name__ == "__main__":
    main()
