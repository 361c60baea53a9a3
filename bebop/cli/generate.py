"""`bebop generate`, `bench`, `export` and `check-exactness`: sampling from the model and its draft."""

import json
import sys
import tempfile
from pathlib import Path

from bebop.backends.vllm import engine as vllm_engine
from bebop.cli.checks import (at_least, check_context, check_draft_args, check_draft_len, check_output_dir, check_output_file,
                              check_text, number_list, sampling_params)
from bebop.cli.loading import load, pick_mtp
from bebop.drafts.eagle3 import Eagle3
from bebop.drafts.formats import export_eagle3
from bebop.drafts.registry import shipped_draft
from bebop.engine.generation import MODES as ENGINE_MODES
from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.models.registry import chat_ids, hf_dir, load_hf, load_model
from bebop.studies.bench import COMPILED, environment, format_table, run_bench
from bebop.studies.exactness import check_exactness
from bebop.tasks import default_prompts, load_prompts_file


def cmd_generate(args):
    params = sampling_params(args)
    check_draft_len(args)
    if (args.prompt is None) == (args.prompts is None):
        raise BebopError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    at_least(args, 1, "num_samples")
    check_draft_args(args)
    if args.prompt is not None:
        check_text(args.prompt, "--prompt")
    if args.output is not None:
        check_output_file(args.output, "--output")
    texts = [args.prompt] if args.prompt is not None else load_prompts_file(args.prompts)
    model, tok, mtp = load(args, need_mtp=args.mode != "ar")
    index = [i for i in range(len(texts)) for _ in range(args.num_samples)]
    prompts = [chat_ids(tok, texts[i]) for i in index]
    check_context(model, prompts, args.max_new_tokens)
    if args.output is not None:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    out = open(args.output, "w") if args.output is not None else sys.stdout

    def write(i, r):  # one line per request as soon as it finishes: an interruption keeps what was done
        out.write(json.dumps({"index": i, "prompt_index": index[i], "tokens": r.tokens,
                              "text": tok.decode(r.tokens, skip_special_tokens=True), "logprobs": r.logprobs,
                              "stop_reason": r.stop_reason}) + "\n")
        out.flush()

    try:
        g = generate(model, prompts, args.max_new_tokens, params, mode=args.mode, draft=mtp, draft_len=args.draft_len,
                     seed=args.seed, progress=True, max_batch=args.max_batch, max_draft_len=args.max_draft_len,
                     on_finish=write)
    finally:
        if out is not sys.stdout:
            out.close()
    print(json.dumps({"mode": args.mode, **g.stats.summary()}), file=sys.stderr)


def start_vllm(args, model, mtp, modes: list[str], tmp: Path) -> dict:
    """A vLLM engine per vLLM mode of bench, in the model's dtype; vllm-spec with the draft's EAGLE-3 export,
    vllm-ngram with vLLM's n-gram drafter."""
    if not modes:
        return {}
    if not vllm_engine.installed():
        raise BebopError("the vllm modes need vLLM: pip install 'bebop-rl[vllm]'")
    if "vllm-spec" in modes and getattr(mtp, "arch", None) != "eagle3":
        raise BebopError("vllm-spec needs an EAGLE-3 draft (--draft DIR, an EAGLE-3 checkpoint, or random-eagle3): "
                         "the DeepSeek MTP layout loads in bebop's engine only")
    model_dir, dtype = hf_dir(args.model), str(model.embed.weight.dtype).removeprefix("torch.")
    draft = export_eagle3(mtp, tmp / "eagle3") if "vllm-spec" in modes else None
    k = args.draft_len if isinstance(args.draft_len, int) else 3
    engines = {}
    try:
        for mode in modes:
            print(f"bebop: starting vLLM for {mode} (minutes the first time: it compiles the model)", file=sys.stderr)
            engines[mode] = vllm_engine.VllmEngine(model_dir, dtype, draft={"vllm-spec": draft, "vllm-ngram": vllm_engine.NGRAM}.get(mode),
                                                   num_speculative_tokens=k, seed=args.seed)
    except BebopError:
        for engine in engines.values():
            engine.close()
        raise
    return engines


def cmd_bench(args):
    params = sampling_params(args)
    check_draft_len(args)
    batch_sizes = number_list(args.batch_sizes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = (*ENGINE_MODES, *(m + COMPILED for m in ENGINE_MODES), "hf", "vllm", "vllm-spec", "vllm-ngram")
    bad = [m for m in modes if m not in known]
    if bad or not modes:
        raise BebopError(f"unknown mode(s) {bad or modes}: choose from {', '.join(known)}")
    at_least(args, 1, "repeats")
    check_draft_args(args)
    if args.output is not None:
        check_output_file(args.output, "--output")
    texts = load_prompts_file(args.prompts) if args.prompts else default_prompts(max(batch_sizes) * args.repeats)
    model, tok, mtp = load(args, need_mtp=any("spec" in m for m in modes))
    prompts = [chat_ids(tok, t) for t in texts]
    check_context(model, prompts, args.max_new_tokens)
    hf_model = load_hf(args.model)[0].to(model.embed.weight.device, model.embed.weight.dtype) if "hf" in modes else None
    with tempfile.TemporaryDirectory() as tmp:
        vllm = start_vllm(args, model, mtp, [m for m in modes if m.startswith("vllm")], Path(tmp))
        try:
            results = run_bench(model, prompts, batch_sizes, modes, args.draft_len, params, args.max_new_tokens,
                                seed=args.seed, repeats=args.repeats, mtp=mtp, hf_model=hf_model, tokenizer=tok,
                                ignore_eos=args.ignore_eos, vllm=vllm)
        finally:
            for engine in vllm.values():
                engine.close()
    env = environment(model)
    print(f"{args.model}, --dtype {args.dtype}: " + ", ".join(f"{k} {v}" for k, v in env.items())
          + (", fixed length (--ignore-eos)" if args.ignore_eos else ", requests stop at EOS"))
    print(format_table(results))
    if args.output is not None:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        mtp_name = None if mtp is None else (args.draft or mtp.config.meta.get("name", "random"))
        Path(args.output).write_text(json.dumps({"model": args.model, "mtp": mtp_name, **env, "dtype_requested": args.dtype,
                                               "ignore_eos": args.ignore_eos, "results": results}, indent=1))


def cmd_export(args):
    if args.format != "eagle3":  # the only layout so far; --format names it for when there are more
        raise BebopError(f"--format must be eagle3, got {args.format}")
    check_draft_args(args)
    check_output_dir(args.out, "--out")
    if Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        raise BebopError(f"--out {args.out}: exists and is not empty; choose another directory")
    model, _ = load_model(args.model, dtype="float32")  # the draft is written in the dtype it was trained in
    if args.draft:
        draft = pick_mtp(args.draft, model)
    else:
        draft = shipped_draft(model, Eagle3.arch)
        if draft is None:
            raise BebopError(f"no EAGLE-3 draft ships for '{args.model}': pass --draft (a checkpoint trained with "
                             f"`bebop train-draft --kind eagle3`, or an EAGLE-3 directory)")
    out = export_eagle3(draft, args.out)
    print(f"wrote {out}/config.json, {out}/model.safetensors (EAGLE-3: vLLM speculative_config "
          f"{{\"method\": \"eagle3\", \"model\": \"{out}\"}}; SGLang --speculative-algorithm EAGLE3 "
          f"--speculative-draft-model-path {out})", file=sys.stderr)


def cmd_check_exactness(args):
    params = sampling_params(args)
    if args.mode not in ENGINE_MODES or args.mode == "ar":
        raise BebopError(f"--mode must be spec or spec-greedy, got {args.mode}")
    at_least(args, 1, "draft_len", "max_new_tokens")
    at_least(args, 100, "num_samples")
    check_draft_args(args)
    model, tok, draft = load(args)
    prompt = chat_ids(tok, args.prompt)
    check_context(model, [prompt], args.max_new_tokens + args.draft_len + 2)
    result = check_exactness(model, draft, prompt, params, mode=args.mode, samples=args.num_samples, tokens=args.max_new_tokens,
                             draft_len=args.draft_len, seed=args.seed, alpha=args.alpha)
    for t in result["tests"]:
        print(f"{t['test']:<40} p = {t['p_value']:.4f}")
    verdict = "consistent with exact sampling" if result["passed"] else "NOT exact: a test rejected at"
    rate = result["acceptance_rate"]  # None: nothing was drafted (a history draft that found no match)
    print(f"{args.mode}, K = {args.draft_len}, T = {args.temperature:g}, {args.num_samples} samples, acceptance "
          f"{'- (nothing drafted)' if rate is None else f'{rate:.3f}'}: {verdict} (family alpha {args.alpha:g}, each test at "
          f"{result['threshold']:.2g})")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))
    if not result["passed"]:
        sys.exit(1)
