"""The `bebop` command line. Bad input gets one line on stderr and exit status 2, never a traceback.

Every command checks all of its options first (ranges, files that must exist, outputs that must be
writable), before any model loads, so a mistake costs a second rather than a run.
"""

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from safetensors import SafetensorError

from bebop.errors import BebopError
from bebop.engine.memory import retain_freed_memory

MODES = ("ar", "spec", "spec-greedy")
MAX_DRAFT_LEN = 64  # far beyond any useful draft; bounds the per-step buffers


class Parser(argparse.ArgumentParser):
    """argparse's own errors (a missing option, 'abc' for a number) in the same one-line form as ours."""

    def error(self, message):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"bebop: error: {command}{message}", file=sys.stderr)
        sys.exit(2)


def number_list(text: str, kind=int, minimum=1) -> list:
    """'1,4,16' -> [1, 4, 16]; every value must be a `kind` >= minimum."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BebopError(f"expected comma-separated {kind.__name__} values, got '{text}'") from None
    if not all(map(math.isfinite, values)):
        raise BebopError(f"expected finite values, got '{text}'")
    if not values or min(values) < minimum:
        raise BebopError(f"expected values >= {minimum}, got '{text}'")
    return values


def add_model_args(p):
    p.add_argument("--model", default="smollm2-135m", help="registry name or local Hugging Face model directory")
    p.add_argument("--mtp", default=None, help="the draft: an MTP checkpoint (NAME.safetensors + NAME.json), an EAGLE-3 "
                   "directory (config.json + *.safetensors, as SpecForge writes and `bebop export` writes), 'random' or "
                   "'random-eagle3' (seeded fresh drafts); default: the committed one for smollm2-135m (its EAGLE-3 "
                   "draft), else random")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="weights and activations for generating (generate, bench, make-data); auto: bfloat16 where a "
                        "short probe, cached per machine and model, measures it faster, else float32")


def draft_len_arg(text: str):
    """--draft-len: an int, or 'auto' (chosen every step by cost, up to --max-draft-len)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got '{text}'") from None


def add_sampling_args(p, temperature=1.0):
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--draft-len", type=draft_len_arg, default="auto", help="drafts per step, or 'auto'")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)


# ----- up-front checks: each raises BebopError naming the option -----

def at_least(args, minimum, *names):
    for name in names:
        value = getattr(args, name)
        if value < minimum:
            raise BebopError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def check_seed(args):
    if not 0 <= args.seed < 2**63:
        raise BebopError(f"--seed must be in 0..2**63-1, got {args.seed}")


def check_text(text, flag):
    """Command-line text arrives with undecodable bytes as surrogates (PEP 383): refuse them here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BebopError(f"{flag} is not valid UTF-8 text") from None


def writable_parent(path: Path, flag: str):
    """The nearest existing ancestor of `path` must be a writable directory (missing ones are made later)."""
    parent = path.parent.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BebopError(f"{flag} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BebopError(f"{flag} {path}: directory {parent} is not writable")


def check_output_file(path, flag):
    check_text(path, flag)
    path = Path(path)
    if path.is_dir():
        raise BebopError(f"{flag} {path}: is a directory, expected a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise BebopError(f"{flag} {path}: file is not writable")
    writable_parent(path, flag)


def check_output_dir(path, flag):
    check_text(path, flag)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BebopError(f"{flag} {path}: exists and is not a directory")
    if path.exists() and not os.access(path, os.W_OK | os.X_OK):
        raise BebopError(f"{flag} {path}: directory is not writable")
    writable_parent(path, flag)


def check_mtp_file(spec, flag="--mtp"):
    """A given MTP checkpoint or EAGLE-3 directory must exist, whatever the mode ('random' is a name, not a
    file)."""
    if spec is None or spec in RANDOM_DRAFTS:
        return
    check_text(spec, flag)
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            raise BebopError(f"{flag} {spec}: not an EAGLE-3 directory (needs config.json and *.safetensors)")
        return
    weights, config = path.with_suffix(".safetensors"), path.with_suffix(".json")
    if not weights.is_file() or not config.is_file():
        raise BebopError(f"{flag} {spec}: no MTP checkpoint there (needs {weights.name} and {config.name})")


def check_model_args(args):
    from bebop.models.registry import check_model

    check_text(args.model, "--model")
    check_model(args.model)
    check_mtp_file(args.mtp)


def check_context(model, prompts, max_new_tokens):
    """A request must fit the model's context: prompt + new tokens <= max_position_embeddings."""
    longest = max(map(len, prompts))
    if longest + max_new_tokens > model.max_len:
        raise BebopError(f"prompt of {longest} tokens + --max-new-tokens {max_new_tokens} exceeds the context of "
                         f"'{model.name}' ({model.max_len} tokens)")


def sampling_params(args):
    from bebop.sampling import SamplingParams

    if args.draft_len != "auto" and not 0 <= args.draft_len <= MAX_DRAFT_LEN:
        raise BebopError(f"--draft-len must be 'auto' or in 0..{MAX_DRAFT_LEN}, got {args.draft_len}")
    if not 0 <= getattr(args, "max_draft_len", 0) <= MAX_DRAFT_LEN:
        raise BebopError(f"--max-draft-len must be in 0..{MAX_DRAFT_LEN}, got {args.max_draft_len}")
    if getattr(args, "max_batch", None) is not None and args.max_batch < 1:
        raise BebopError(f"--max-batch must be >= 1, got {args.max_batch}")
    at_least(args, 1, "max_new_tokens")
    check_seed(args)
    if not math.isfinite(args.temperature):
        raise BebopError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    try:
        return SamplingParams(args.temperature, args.top_p, args.top_k)
    except ValueError as e:
        raise BebopError(str(e)) from None


RANDOM_DRAFTS = ("random", "random-eagle3")


def pick_mtp(spec: str | None, model):
    """--mtp: a checkpoint path or EAGLE-3 directory, 'random' / 'random-eagle3' (seeded fresh drafts), or None
    (the model's default)."""
    from bebop.drafts.eagle3 import new_eagle3
    from bebop.drafts.registry import default_mtp, load_mtp, new_mtp

    if spec == "random":
        return new_mtp(model)
    if spec == "random-eagle3":
        return new_eagle3(model)
    return load_mtp(spec, model) if spec else default_mtp(model)


def load(args, need_mtp=True):
    """(model, tokenizer, mtp) from --model / --mtp."""
    from bebop.models.registry import load_model
    model, tok = load_model(args.model, dtype=getattr(args, "dtype", "float32"))
    mtp = None
    if need_mtp:
        mtp = pick_mtp(args.mtp, model)
    return model, tok, mtp


def cmd_generate(args):
    from bebop.engine.generation import generate
    from bebop.models.registry import chat_ids
    from bebop.tasks import load_prompts_file, parse_mix

    params = sampling_params(args)
    if (args.prompt is None) == (args.prompts is None):
        raise BebopError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    at_least(args, 1, "num_samples")
    check_model_args(args)
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
        g = generate(model, prompts, args.max_new_tokens, params, mode=args.mode, mtp=mtp, draft_len=args.draft_len,
                     seed=args.seed, progress=True, max_batch=args.max_batch, max_draft_len=args.max_draft_len,
                     on_finish=write)
    finally:
        if out is not sys.stdout:
            out.close()
    print(json.dumps({"mode": args.mode, **g.stats.summary()}), file=sys.stderr)


def start_vllm(args, model, mtp, modes: list[str], tmp: Path) -> dict:
    """A vLLM engine per vLLM mode of bench, in the model's dtype; vllm-spec with the draft's EAGLE-3 export."""
    from bebop.backends.vllm import engine as vllm

    if not modes:
        return {}
    if not vllm.installed():
        raise BebopError("the vllm modes need vLLM: pip install 'bebop[vllm]'")
    if "vllm-spec" in modes and mtp.arch != "eagle3":
        raise BebopError("vllm-spec needs an EAGLE-3 draft (--mtp DIR, an EAGLE-3 checkpoint, or random-eagle3): "
                         "the DeepSeek MTP layout loads in bebop's engine only")
    from bebop.drafts.formats import export_eagle3
    from bebop.models.registry import hf_dir

    model_dir, dtype = hf_dir(args.model), str(model.embed.weight.dtype).removeprefix("torch.")
    draft = export_eagle3(mtp, tmp / "eagle3") if "vllm-spec" in modes else None
    k = args.draft_len if isinstance(args.draft_len, int) else 3
    engines = {}
    try:
        for mode in modes:
            print(f"bebop: starting vLLM for {mode} (minutes the first time: it compiles the model)", file=sys.stderr)
            engines[mode] = vllm.VllmEngine(model_dir, dtype, draft=draft if mode == "vllm-spec" else None,
                                            num_speculative_tokens=k, seed=args.seed)
    except BebopError:
        for engine in engines.values():
            engine.close()
        raise
    return engines


def cmd_bench(args):
    from bebop.studies.bench import COMPILED, environment, format_table, run_bench
    from bebop.engine.generation import MODES as ENGINE_MODES
    from bebop.models.registry import chat_ids, load_hf
    from bebop.tasks import default_prompts, load_prompts_file

    params = sampling_params(args)
    batch_sizes = number_list(args.batch_sizes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = (*ENGINE_MODES, *(m + COMPILED for m in ENGINE_MODES), "hf", "vllm", "vllm-spec")
    bad = [m for m in modes if m not in known]
    if bad or not modes:
        raise BebopError(f"unknown mode(s) {bad or modes}: choose from {', '.join(known)}")
    at_least(args, 1, "repeats")
    check_model_args(args)
    if args.json is not None:
        check_output_file(args.json, "--json")
    texts = load_prompts_file(args.prompts) if args.prompts else default_prompts(max(batch_sizes) * args.repeats)
    model, tok, mtp = load(args, need_mtp=any("spec" in m for m in modes))
    prompts = [chat_ids(tok, t) for t in texts]
    check_context(model, prompts, args.max_new_tokens)
    hf_model = load_hf(args.model)[0].to(model.embed.weight.dtype) if "hf" in modes else None
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
    if args.json is not None:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        mtp_name = None if mtp is None else (args.mtp or mtp.config.meta.get("name", "random"))
        Path(args.json).write_text(json.dumps({"model": args.model, "mtp": mtp_name, **env, "dtype_requested": args.dtype,
                                               "ignore_eos": args.ignore_eos, "results": results}, indent=1))


def cmd_export(args):
    from bebop.drafts.eagle3 import Eagle3
    from bebop.drafts.formats import export_eagle3
    from bebop.models.registry import load_model
    from bebop.drafts.registry import shipped_draft

    check_model_args(args)
    check_output_dir(args.out, "--out")
    if Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        raise BebopError(f"--out {args.out}: exists and is not empty; choose another directory")
    model, _ = load_model(args.model, dtype="float32")  # the draft is written in the dtype it was trained in
    if args.mtp:
        draft = pick_mtp(args.mtp, model)
    else:
        draft = shipped_draft(model, Eagle3.arch)
        if draft is None:
            raise BebopError(f"no EAGLE-3 draft ships for '{args.model}': pass --mtp (a checkpoint trained with "
                             f"`bebop train-mtp --arch eagle3`, or an EAGLE-3 directory)")
    out = export_eagle3(draft, args.out)
    print(f"wrote {out}/config.json, {out}/model.safetensors (EAGLE-3: vLLM speculative_config "
          f"{{\"method\": \"eagle3\", \"model\": \"{out}\"}}; SGLang --speculative-algorithm EAGLE3 "
          f"--speculative-draft-model-path {out})", file=sys.stderr)


def cmd_check_exactness(args):
    from bebop.studies.exactness import check_exactness
    from bebop.engine.generation import MODES as ENGINE_MODES
    from bebop.models.registry import chat_ids

    params = sampling_params(args)
    if args.mode not in ENGINE_MODES or args.mode == "ar":
        raise BebopError(f"--mode must be spec or spec-greedy, got {args.mode}")
    if args.draft_len == "auto":
        raise BebopError("--draft-len: give a number (the test fixes K so that drafts are made every step)")
    at_least(args, 1, "draft_len", "tokens")
    at_least(args, 100, "samples")
    check_model_args(args)
    model, tok, draft = load(args)
    prompt = chat_ids(tok, args.prompt)
    check_context(model, [prompt], args.tokens + args.draft_len + 2)
    result = check_exactness(model, draft, prompt, params, mode=args.mode, samples=args.samples, tokens=args.tokens,
                             draft_len=args.draft_len, seed=args.seed, alpha=args.alpha)
    for t in result["tests"]:
        print(f"{t['test']:<40} p = {t['p_value']:.4f}")
    verdict = "consistent with exact sampling" if result["passed"] else "NOT exact: a test rejected at"
    print(f"{args.mode}, K = {args.draft_len}, T = {args.temperature:g}, {args.samples} samples, acceptance "
          f"{result['acceptance_rate']:.3f}: {verdict} (family alpha {args.alpha:g}, each test at "
          f"{result['threshold']:.2g})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if not result["passed"]:
        sys.exit(1)


def cmd_make_data(args):
    from bebop.training.data import make_data

    from bebop.tasks import load_prompts_file, parse_mix

    params = sampling_params(args)
    at_least(args, 1, "num_samples", "heldout_samples", "batch_size")
    check_model_args(args)
    check_output_dir(args.out, "--out")
    if args.prompts != "builtin":
        if not Path(args.prompts).is_file():
            raise BebopError(f"--prompts must be 'builtin' or a JSONL file; '{args.prompts}' is neither")
        if len(load_prompts_file(args.prompts)) < 2:
            raise BebopError(f"{args.prompts}: needs at least 2 prompts to hold one out")
    mix = parse_mix(args.mix) if args.mix else None
    if mix and args.prompts != "builtin":
        raise BebopError("--mix weights the built-in task kinds; it cannot be used with a --prompts file")
    model, tok, _ = load(args, need_mtp=False)
    out = make_data(model, tok, args.out, source=args.prompts, num_samples=args.num_samples,
                    heldout_samples=args.heldout_samples, params=params, max_new_tokens=args.max_new_tokens,
                    batch_size=args.batch_size, seed=args.seed, model_name=args.model, mix=mix)
    print(f"wrote {out}/train.jsonl, {out}/heldout.jsonl", file=sys.stderr)


def train_config(args):
    from bebop.training.data import load_meta, load_split
    from bebop.training.losses import LOSSES
    from bebop.training.train import TrainConfig

    if args.loss not in LOSSES:
        raise BebopError(f"unknown loss '{args.loss}' (choose from {', '.join(LOSSES)})")
    at_least(args, 1, "steps", "batch_size", "draft_len", "max_seq_len", "eval_every", "save_every",
             "eval_sequences", "mtp_layers")
    at_least(args, 0, "draft_vocab", "eval_prompts")
    if args.draft_len > MAX_DRAFT_LEN:
        raise BebopError(f"--draft-len must be in 1..{MAX_DRAFT_LEN}, got {args.draft_len}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise BebopError(f"--lr must be a finite number > 0, got {args.lr}")
    check_seed(args)
    check_model_args(args)
    check_text(args.data, "--data")
    load_meta(args.data)
    load_split(args.data, "train")
    load_split(args.data, "heldout")
    return TrainConfig(loss=args.loss, draft_len=args.draft_len, steps=args.steps, batch_size=args.batch_size,
                       lr=args.lr, draft_vocab=args.draft_vocab, eval_every=args.eval_every,
                       save_every=args.save_every, eval_prompts=args.eval_prompts, seed=args.seed,
                       max_seq_len=args.max_seq_len, eval_sequences=args.eval_sequences, arch=args.arch,
                       mtp_layers=args.mtp_layers,
                       feature_layers=parse_layers(args.feature_layers),
                       features_dtype=args.features_dtype, autocast=args.autocast)


def cmd_train_mtp(args):
    from bebop.models.registry import load_model
    from bebop.training.train import has_checkpoint, paths, train_mtp

    cfg = train_config(args)
    check_mtp_file(args.init, "--init")
    check_text(args.out, "--out")
    if Path(args.out).is_dir() or args.out.endswith(os.sep):
        raise BebopError(f"--out {args.out}: is a directory; --out is a path prefix (OUT.safetensors, OUT.json, ...)")
    for path in paths(args.out)[:2]:
        check_output_file(str(path), "--out")
    if args.resume and not has_checkpoint(args.out):
        raise BebopError(f"nothing to resume: no checkpoint in {paths(args.out)[2]} (run without --resume to start)")
    if not args.resume and has_checkpoint(args.out):
        raise BebopError(f"{args.out} already holds a training run ({paths(args.out)[2]}); pass --resume to "
                         f"continue it, or choose another --out")
    model, _ = load_model(args.model)
    train_mtp(model, args.data, args.out, cfg, init=args.init, resume=args.resume,
              command="bebop " + " ".join(sys.argv[1:]))
    print(f"wrote {args.out}.safetensors and {args.out}.json", file=sys.stderr)


def cmd_compare_losses(args):
    from bebop.studies.compare_losses import compare_losses
    from bebop.models.registry import load_model
    from bebop.training.losses import LOSSES

    names = [x.strip() for x in args.losses.split(",") if x.strip()]
    bad = [x for x in names if x not in LOSSES]
    if bad or not names:
        raise BebopError(f"unknown loss(es) {bad or names}: choose from {', '.join(LOSSES)}")
    args.loss = names[0]
    cfg = train_config(args)
    temperatures = number_list(args.temperatures, float, 0)
    at_least(args, 1, "eval_samples", "eval_new_tokens")
    check_output_dir(args.out, "--out")
    model, _ = load_model(args.model)
    compare_losses(model, args.data, names, cfg, args.out, temperatures=temperatures,
                   eval_prompts=args.eval_samples, eval_new_tokens=args.eval_new_tokens, seed=args.seed)
    print((Path(args.out) / "compare.md").read_text())


def cmd_analyze_entropy(args):
    from bebop.studies.entropy import collect, summarize, write_report
    from bebop.models.registry import chat_ids, check_model, load_model
    from bebop.tasks import default_prompts, load_prompts_file

    temperatures = number_list(args.temperatures, float, 0)
    at_least(args, 1, "draft_len", "num_prompts", "max_new_tokens", "bootstrap")
    if args.draft_len > MAX_DRAFT_LEN:
        raise BebopError(f"--draft-len must be in 1..{MAX_DRAFT_LEN}, got {args.draft_len}")
    check_seed(args)
    check_model_args(args)
    for path in args.policy:  # a registry name or a model directory, like --model
        check_text(path, "--policy")
        check_model(path)
    check_output_dir(args.out, "--out")
    texts = load_prompts_file(args.prompts) if args.prompts else default_prompts(args.num_prompts)
    policies = [(args.model, "base")] + [(p, Path(p).name) for p in args.policy]
    parts = []
    for path, label in policies:
        model, tok = load_model(path)
        mtp = pick_mtp(args.mtp, model)
        prompts = [chat_ids(tok, t) for t in texts]
        check_context(model, prompts, args.max_new_tokens)
        parts.append(collect(model, mtp, prompts, temperatures, args.draft_len, args.max_new_tokens,
                             seed=args.seed, policy=label))
    import numpy as np

    table = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    summary = summarize(table, n_boot=args.bootstrap, seed=args.seed)
    write_report(table, summary, args.out)
    print((Path(args.out) / "report.md").read_text())


def cmd_rl(args):
    from dataclasses import fields

    from bebop.models.registry import load_model
    from bebop.rl.config import RLConfig
    from bebop.rl.loop import run_rl
    from bebop.tasks import rewards, rl_tasks

    cfg = RLConfig(**{f.name: getattr(args, f.name) for f in fields(RLConfig)}).validate()
    train = rl_tasks(cfg.task, cfg.steps * cfg.prompts_per_step, cfg.seed, "train", cfg.difficulty)
    heldout = rl_tasks(cfg.task, cfg.eval_prompts, cfg.seed, "heldout", cfg.difficulty)
    if cfg.rollout_backend == "vllm":  # what vLLM cannot run: one line before any model loads
        from bebop.backends.vllm.engine import installed
        from bebop.models.registry import hf_dir

        if not installed():
            raise BebopError("--rollout-backend vllm needs vLLM: pip install 'bebop[vllm]'")
        hf_dir(cfg.model)
    policy, tok = load_model(cfg.model)  # fp32 master weights; rollouts use their own --rollout-dtype copy
    mtp = None
    if cfg.rollout != "ar" and cfg.rollout_backend == "vllm" and cfg.mtp is None:
        from bebop.drafts.registry import shipped_draft

        mtp = shipped_draft(policy, "eagle3")  # vLLM loads EAGLE-3 drafts: the model's shipped one
        if mtp is None:
            raise BebopError(f"--rollout-backend vllm with --rollout {cfg.rollout} needs an EAGLE-3 draft (--mtp DIR "
                             f"or random-eagle3): '{cfg.model}' ships none")
    elif cfg.rollout != "ar":
        mtp = pick_mtp(cfg.mtp, policy)
        if cfg.rollout_backend == "vllm" and mtp.arch != "eagle3":
            raise BebopError(f"--rollout-backend vllm: '{cfg.mtp}' is a DeepSeek-layout MTP; vLLM loads EAGLE-3 drafts "
                             "only (--mtp an EAGLE-3 directory or checkpoint, or random-eagle3)")
    rows = run_rl(cfg, args.out, policy, tok, train, heldout, mtp, score=rewards, resume=args.resume)
    evals = [json.loads(x) for x in (Path(args.out) / "eval.jsonl").read_text().splitlines()]
    for e in evals[:1] + evals[-1:]:
        lo, hi = e["heldout_ci95"]
        print(f"step {e['step']}: held-out reward {e['heldout_reward']:.3f} (n={e['heldout_n']}, 95% CI "
              f"{lo:.2f}-{hi:.2f})", file=sys.stderr)
    if rows:
        acc = [r["acceptance_rate"] for r in rows if r["acceptance_rate"] is not None]
        print(f"{len(rows)} steps in {sum(r['step_s'] for r in rows):.1f}s; reward {rows[0]['reward_mean']:.3f} -> "
              f"{rows[-1]['reward_mean']:.3f}" + (f"; acceptance {acc[0]:.3f} -> {acc[-1]:.3f}" if acc else ""),
              file=sys.stderr)


def cmd_report(args):
    from bebop.studies.rl_report import write_report

    print(write_report(args.runs, args.out))


def add_rl_args(p):
    from bebop.rl.config import (ASYNC_MODES, AUTOCAST, BACKENDS, DTYPES, LOSS_TYPES, MTP_STRATEGIES, ROLLOUTS,
                                 SCALE_REWARDS, RLConfig)

    d = RLConfig()
    p.add_argument("--model", default=d.model, help="registry name or local Hugging Face model directory")
    p.add_argument("--mtp", default=d.mtp, help="the draft, as for generate: a checkpoint, an EAGLE-3 directory, 'random' or "
                   "'random-eagle3'; default: the model's shipped draft (EAGLE-3 for smollm2-135m)")
    p.add_argument("--task", default=d.task, help="RL task (arithmetic, code)")
    p.add_argument("--difficulty", default=d.difficulty, help="task difficulty level (default: the task's)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    p.add_argument("--num-generations", type=int, default=d.num_generations, help="G: completions per prompt")
    p.add_argument("--max-completion-length", type=int, default=d.max_completion_length)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--learning-rate", type=float, default=d.learning_rate)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm)
    p.add_argument("--beta", type=float, default=d.beta, help="KL coefficient to the initial policy")
    p.add_argument("--epsilon", type=float, default=d.epsilon, help="clip range")
    p.add_argument("--epsilon-high", type=float, default=d.epsilon_high, help="upper clip range (default: epsilon)")
    p.add_argument("--loss-type", default=d.loss_type, help=f"{'|'.join(LOSS_TYPES)}")
    p.add_argument("--scale-rewards", default=d.scale_rewards, help=f"{'|'.join(SCALE_REWARDS)}")
    p.add_argument("--num-iterations", type=int, default=d.num_iterations, help="updates per batch of rollouts")
    p.add_argument("--importance-sampling-cap", type=float, default=d.importance_sampling_cap,
                   help="truncated importance sampling cap between rollout and training log-probs")
    p.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size)
    p.add_argument("--autocast", default=d.autocast, help=f"{'|'.join(AUTOCAST)}: bf16 autocast for training "
                                                          "(auto: a short probe picks the faster)")
    p.add_argument("--rollout", default=d.rollout, help=f"{'|'.join(ROLLOUTS)}")
    p.add_argument("--rollout-backend", default=d.rollout_backend,
                   help=f"{'|'.join(BACKENDS)}: the engine that generates rollouts (vllm: EAGLE-3 drafts only, "
                        "default the model's shipped one; its log goes to OUT/vllm.log)")
    p.add_argument("--draft-len", type=draft_len_arg, default=d.draft_len,
                   help="draft tokens per step, or 'auto' (chosen every step by cost, up to --max-draft-len; "
                        "--rollout-backend vllm needs a number: its num_speculative_tokens)")
    p.add_argument("--max-draft-len", type=int, default=d.max_draft_len,
                   help="the largest K --draft-len auto may pick (and the depth an online MTP strategy trains)")
    p.add_argument("--ray", nargs="?", const="local", default=d.ray, metavar="ADDRESS",
                   help="rollout workers as Ray actors (bebop[ray]): no ADDRESS starts a local Ray, 'auto' joins "
                        "the running cluster, or host:port")
    p.add_argument("--rollout-workers", type=int, default=d.rollout_workers,
                   help="Ray rollout actors; the rollout threads are split between them")
    p.add_argument("--mtp-strategy", default=d.mtp_strategy, help=f"{'|'.join(MTP_STRATEGIES)}")
    p.add_argument("--mtp-learning-rate", type=float, default=d.mtp_learning_rate)
    p.add_argument("--async-mode", default=d.async_mode, help=f"{'|'.join(ASYNC_MODES)}")
    p.add_argument("--rollout-dtype", default=d.rollout_dtype,
                   help=f"auto|{'|'.join(DTYPES)} (auto: as --dtype auto chooses for the model on this machine)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads in all (0: the usable CPUs); "
                                                                   "one-step splits them between the two processes")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="held-out evaluation period (0: first/last)")
    p.add_argument("--eval-prompts", type=int, default=d.eval_prompts)
    p.add_argument("--save-every", type=int, default=d.save_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")


def add_train_args(p):
    p.add_argument("--data", required=True, help="directory written by `bebop make-data`")
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--draft-vocab", type=int, default=0, help="restrict the draft head to the N most frequent "
                                                                "training tokens (0 = full vocabulary)")
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts for real speculative acceptance")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-sequences", type=int, default=64, help="held-out sequences for teacher-forced acceptance")
    p.add_argument("--arch", default="mtp", choices=("mtp", "eagle3"),
                   help="the draft kind: mtp (DeepSeek-V3 layout, bebop's engine) or eagle3 (LlamaForCausalLMEagle3, "
                   "which vLLM and SGLang load: `bebop export`); eagle3 reads 3 target layers, by default vLLM's")
    p.add_argument("--mtp-layers", type=int, default=1, help="decoder blocks of a fresh MTP (DeepSeek-V3: 1)")
    p.add_argument("--feature-layers", default="", help="target layers a fresh MTP reads, concatenated and "
                   "projected (EAGLE-3), e.g. 2,15,29; default: the last hidden state alone")
    p.add_argument("--features-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the target forward that computes the training features (auto: the faster here)")
    p.add_argument("--autocast", default="auto", choices=("auto", "bf16", "off"),
                   help="bf16 autocast of training steps over fp32 weights (auto: if a probe finds it faster)")


def parse_layers(text: str) -> tuple[int, ...]:
    """'2,15,-1' -> (2, 15, -1): layer indices of the target (negative: from the last), in the order given;
    train-mtp checks them against the model."""
    if not text.strip():
        return ()
    layers = []
    for part in text.split(","):
        try:
            i = int(part)
        except ValueError:
            raise BebopError(f"--feature-layers: '{part.strip()}' is not a layer index") from None
        layers.append(i)
    if len(set(layers)) != len(layers):
        raise BebopError(f"--feature-layers: a layer is given twice ({text})")
    return tuple(layers)


def build_parser():
    parser = Parser(prog="bebop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="sample completions (plain or speculative)")
    add_model_args(p)
    p.add_argument("--prompt")
    p.add_argument("--prompts", help="JSONL file, one {\"prompt\": ...} per line")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--mode", choices=MODES, default="spec")
    p.add_argument("--output", help="JSONL output (default: stdout)")
    p.add_argument("--max-batch", type=int, default=None, help="rows decoded at once; a finished row takes the "
                                                               "next waiting request (default: all at once)")
    p.add_argument("--max-draft-len", type=int, default=4, help="the largest K --draft-len auto may pick")
    add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", help="tokens/s and acceptance per mode and batch size, interleaved")
    add_model_args(p)
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--modes", default="ar,spec,spec-greedy",
                   help="any of ar, spec, spec-greedy, hf (transformers), vllm (vLLM's plain decoding), vllm-spec "
                        "(vLLM with the draft's EAGLE-3 export; vLLM has no auto K: it drafts --draft-len, 3 for auto); "
                        "ar-compiled, spec-compiled: on the compiled decode step, against the others run eager")
    p.add_argument("--prompts", help="JSONL prompts (default: built-in held-out task prompts)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--ignore-eos", action="store_true", help="every request generates exactly --max-new-tokens "
                                                             "(default: stop at EOS and count the tokens produced)")
    add_sampling_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("export", help="write a draft in the EAGLE-3 layout vLLM and SGLang load")
    add_model_args(p)
    p.add_argument("--format", default="eagle3", choices=("eagle3",), help="the layout (SpecForge's EAGLE-3 directory)")
    p.add_argument("--out", required=True, help="directory to write config.json and model.safetensors to")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("check-exactness", help="test that speculative sampling with this model and draft is lossless")
    add_model_args(p)
    p.add_argument("--mode", default="spec", help="spec or spec-greedy")
    p.add_argument("--prompt", default="Tell me a short story.", help="the prompt whose first tokens are sampled")
    p.add_argument("--samples", type=int, default=2000, help="samples per mode (more: more power)")
    p.add_argument("--tokens", type=int, default=3, help="tokens sampled per sample")
    p.add_argument("--alpha", type=float, default=1e-3, help="false-alarm rate of the whole family of tests")
    p.add_argument("--json", help="write the p-values here")
    add_sampling_args(p)
    p.set_defaults(func=cmd_check_exactness, draft_len=2)

    p = sub.add_parser("make-data", help="self-distillation data: the target's own samples")
    add_model_args(p)
    p.add_argument("--prompts", default="builtin", help="'builtin' (chat, math and code tasks) or a JSONL file")
    p.add_argument("--mix", default=None, help="shares of the built-in kinds, e.g. math=0.4,code=0.3,chat=0.3 "
                   "(the default)")
    p.add_argument("--num-samples", type=int, default=512, help="training sequences")
    p.add_argument("--heldout-samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", required=True)
    add_sampling_args(p)
    p.set_defaults(func=cmd_make_data)

    p = sub.add_parser("train-mtp", help="train the MTP draft with ce, kl, tv, e2e-tv, lk or kl+e2e-tv")
    add_model_args(p)
    add_train_args(p)
    p.add_argument("--loss", default="e2e-tv")
    p.add_argument("--out", required=True, help="checkpoint path prefix: OUT.safetensors, OUT.json, ...")
    p.add_argument("--init", help="start from this MTP checkpoint")
    p.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")
    p.set_defaults(func=cmd_train_mtp)

    p = sub.add_parser("compare-losses", help="train one MTP per loss on the same budget and compare acceptance")
    add_model_args(p)
    add_train_args(p)
    p.add_argument("--losses", default="ce,kl,tv,e2e-tv,lk,kl+e2e-tv")
    p.add_argument("--temperatures", default="0.6,1.0,1.2")
    p.add_argument("--eval-samples", type=int, default=32, help="held-out prompts for the final evaluation")
    p.add_argument("--eval-new-tokens", type=int, default=64)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_compare_losses)

    p = sub.add_parser("analyze", help="studies: `analyze entropy`")
    studies = p.add_subparsers(dest="study", required=True)
    p = studies.add_parser("entropy", help="acceptance vs the policy's entropy, probabilistic and greedy drafting")
    add_model_args(p)
    p.add_argument("--policy", action="append", default=[], help="another policy checkpoint (model directory) "
                                                                  "to study with the same MTP; repeatable")
    p.add_argument("--prompts", help="JSONL prompts (default: built-in held-out task prompts)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--temperatures", default="0.4,0.6,0.8,1.0,1.2,1.4,1.6")
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the fit intervals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_analyze_entropy)

    p = sub.add_parser("rl", help="GRPO with plain or speculative rollouts, synchronous or one step off-policy")
    add_rl_args(p)
    p.set_defaults(func=cmd_rl)

    p = sub.add_parser("report", help="compare RL runs: Markdown, JSON and plots; speedups over the ar run")
    p.add_argument("runs", nargs="+", help="directories written by `bebop rl`")
    p.add_argument("--out", default=None, help="output directory (default: the first run's parent)/report")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    retain_freed_memory()  # this process runs the engine: decode steps reuse freed blocks (bebop.engine.memory)
    try:
        args.func(args)
    except BebopError as e:
        print(f"bebop: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("bebop: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (`bebop generate ... | head -1`): stop quietly, like `cat`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(141)
    except OSError as e:  # the disk or the file system refused (full, read-only, vanished): one line, no trace
        where = f" ({e.filename})" if e.filename else ""
        print(f"bebop: error: {e.strerror or e}{where}", file=sys.stderr)
        sys.exit(2)
    except SafetensorError as e:  # safetensors' own I/O error (a full disk while saving weights), not an OSError
        print(f"bebop: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
