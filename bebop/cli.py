"""The `bebop` command line. Bad input gets one line on stderr and exit status 2, never a traceback."""

import argparse
import json
import sys
from pathlib import Path

from bebop.errors import BebopError

MODES = ("ar", "spec", "spec-greedy")


def number_list(text: str, kind=int, minimum=1) -> list:
    """'1,4,16' -> [1, 4, 16]; every value must be a `kind` >= minimum."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BebopError(f"expected comma-separated {kind.__name__} values, got '{text}'") from None
    if not values or min(values) < minimum:
        raise BebopError(f"expected values >= {minimum}, got '{text}'")
    return values


def add_model_args(p):
    p.add_argument("--model", default="smollm2-135m", help="registry name or local Hugging Face model directory")
    p.add_argument("--mtp", default=None, help="MTP checkpoint (NAME.safetensors + NAME.json) or 'random'; default: "
                                               "the committed one for smollm2-135m, else a seeded random MTP")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights and activations")


def add_sampling_args(p, temperature=1.0):
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)


def sampling_params(args):
    from bebop.sampling import SamplingParams

    if args.draft_len < 0:
        raise BebopError(f"--draft-len must be >= 0, got {args.draft_len}")
    if args.max_new_tokens < 1:
        raise BebopError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    try:
        return SamplingParams(args.temperature, args.top_p, args.top_k)
    except ValueError as e:
        raise BebopError(str(e)) from None


def pick_mtp(spec: str | None, model):
    """--mtp: a checkpoint path, 'random' (seeded fresh MTP), or None (the model's default)."""
    from bebop.mtp import default_mtp, load_mtp, new_mtp

    if spec == "random":
        return new_mtp(model)
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
    from bebop.engine import generate
    from bebop.models.registry import chat_ids
    from bebop.tasks import load_prompts_file

    params = sampling_params(args)
    if (args.prompt is None) == (args.prompts is None):
        raise BebopError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    if args.num_samples < 1:
        raise BebopError(f"--num-samples must be >= 1, got {args.num_samples}")
    texts = [args.prompt] if args.prompt is not None else load_prompts_file(args.prompts)
    model, tok, mtp = load(args, need_mtp=args.mode != "ar")
    index = [i for i in range(len(texts)) for _ in range(args.num_samples)]
    prompts = [chat_ids(tok, texts[i]) for i in index]
    g = generate(model, prompts, args.max_new_tokens, params, mode=args.mode, mtp=mtp, draft_len=args.draft_len,
                 seed=args.seed, progress=True)
    lines = [json.dumps({"prompt_index": i, "tokens": r.tokens, "text": tok.decode(r.tokens, skip_special_tokens=True),
                         "logprobs": r.logprobs, "stop_reason": r.stop_reason}) + "\n"
             for i, r in zip(index, g.rollouts)]
    if args.output:
        Path(args.output).write_text("".join(lines))
    else:
        sys.stdout.writelines(lines)
    print(json.dumps({"mode": args.mode, **g.stats.summary()}), file=sys.stderr)


def cmd_bench(args):
    from bebop.bench import format_table, run_bench
    from bebop.engine import MODES as ENGINE_MODES
    from bebop.models.registry import chat_ids, load_hf
    from bebop.tasks import default_prompts, load_prompts_file

    params = sampling_params(args)
    batch_sizes = number_list(args.batch_sizes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in (*ENGINE_MODES, "hf")]
    if bad or not modes:
        raise BebopError(f"unknown mode(s) {bad or modes}: choose from {', '.join((*ENGINE_MODES, 'hf'))}")
    if args.repeats < 1:
        raise BebopError(f"--repeats must be >= 1, got {args.repeats}")
    texts = load_prompts_file(args.prompts) if args.prompts else default_prompts(max(batch_sizes))
    model, tok, mtp = load(args, need_mtp=any(m.startswith("spec") for m in modes))
    hf_model = load_hf(args.model)[0].to(model.embed.weight.dtype) if "hf" in modes else None
    prompts = [chat_ids(tok, t) for t in texts]
    results = run_bench(model, prompts, batch_sizes, modes, args.draft_len, params, args.max_new_tokens,
                        seed=args.seed, repeats=args.repeats, mtp=mtp, hf_model=hf_model, tokenizer=tok)
    print(format_table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        mtp_name = None if mtp is None else (args.mtp or mtp.config.meta.get("name", "random"))
        Path(args.json).write_text(json.dumps({"model": args.model, "mtp": mtp_name, "dtype": args.dtype,
                                               "results": results}, indent=1))


def cmd_make_data(args):
    from bebop.data import make_data

    params = sampling_params(args)
    if args.num_samples < 1 or args.heldout_samples < 1:
        raise BebopError("--num-samples and --heldout-samples must be >= 1")
    if args.prompts != "builtin" and not Path(args.prompts).is_file():
        raise BebopError(f"--prompts must be 'builtin' or a JSONL file; '{args.prompts}' is neither")
    model, tok, _ = load(args, need_mtp=False)
    out = make_data(model, tok, args.out, source=args.prompts, num_samples=args.num_samples,
                    heldout_samples=args.heldout_samples, params=params, max_new_tokens=args.max_new_tokens,
                    batch_size=args.batch_size, seed=args.seed, model_name=args.model)
    print(f"wrote {out}/train.jsonl, {out}/heldout.jsonl", file=sys.stderr)


def train_config(args):
    from bebop.train_mtp import LOSSES, TrainConfig

    if args.loss not in LOSSES:
        raise BebopError(f"unknown loss '{args.loss}' (choose from {', '.join(LOSSES)})")
    for name in ("steps", "batch_size", "draft_len"):
        if getattr(args, name) < 1:
            raise BebopError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.lr > 0:
        raise BebopError(f"--lr must be > 0, got {args.lr}")
    return TrainConfig(loss=args.loss, draft_len=args.draft_len, steps=args.steps, batch_size=args.batch_size,
                       lr=args.lr, draft_vocab=args.draft_vocab, eval_every=args.eval_every,
                       save_every=args.save_every, eval_prompts=args.eval_prompts, seed=args.seed,
                       max_seq_len=args.max_seq_len)


def cmd_train_mtp(args):
    from bebop.models.registry import load_model
    from bebop.train_mtp import train_mtp

    cfg = train_config(args)
    model, _ = load_model(args.model)
    train_mtp(model, args.data, args.out, cfg, init=args.init, resume=args.resume,
              command="bebop " + " ".join(sys.argv[1:]))
    print(f"wrote {args.out}.safetensors and {args.out}.json", file=sys.stderr)


def cmd_compare_losses(args):
    from bebop.compare import compare_losses
    from bebop.models.registry import load_model
    from bebop.train_mtp import LOSSES

    names = [x.strip() for x in args.losses.split(",") if x.strip()]
    bad = [x for x in names if x not in LOSSES]
    if bad or not names:
        raise BebopError(f"unknown loss(es) {bad or names}: choose from {', '.join(LOSSES)}")
    args.loss = names[0]
    cfg = train_config(args)
    temperatures = number_list(args.temperatures, float, 0)
    model, _ = load_model(args.model)
    compare_losses(model, args.data, names, cfg, args.out, temperatures=temperatures,
                   eval_prompts=args.eval_samples, eval_new_tokens=args.eval_new_tokens, seed=args.seed)
    print((Path(args.out) / "compare.md").read_text())


def cmd_analyze_entropy(args):
    from bebop.analysis.entropy import collect, summarize, write_report
    from bebop.models.registry import chat_ids, load_model
    from bebop.tasks import default_prompts, load_prompts_file

    temperatures = number_list(args.temperatures, float, 0)
    if args.draft_len < 1:
        raise BebopError(f"--draft-len must be >= 1, got {args.draft_len}")
    texts = load_prompts_file(args.prompts) if args.prompts else default_prompts(args.num_prompts)
    policies = [(args.model, "base")] + [(p, Path(p).name) for p in args.policy]
    parts = []
    for path, label in policies:
        model, tok = load_model(path)
        mtp = pick_mtp(args.mtp, model)
        prompts = [chat_ids(tok, t) for t in texts]
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
    from bebop.rl.pipeline import run_rl
    from bebop.tasks import rewards, rl_tasks

    cfg = RLConfig(**{f.name: getattr(args, f.name) for f in fields(RLConfig)}).validate()
    train = rl_tasks(cfg.task, cfg.steps * cfg.prompts_per_step, cfg.seed, "train", cfg.difficulty)
    heldout = rl_tasks(cfg.task, cfg.eval_prompts, cfg.seed, "heldout", cfg.difficulty)
    policy, tok = load_model(cfg.model)  # fp32 master weights; rollouts use their own --rollout-dtype copy
    mtp = pick_mtp(cfg.mtp, policy) if cfg.rollout != "ar" else None
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
    from bebop.rl.report import write_report

    print(write_report(args.runs, args.out))


def add_rl_args(p):
    from bebop.rl.config import (ASYNC_MODES, AUTOCAST, DTYPES, LOSS_TYPES, MTP_STRATEGIES, ROLLOUTS, SCALE_REWARDS,
                                 RLConfig)

    d = RLConfig()
    p.add_argument("--model", default=d.model, help="registry name or local Hugging Face model directory")
    p.add_argument("--mtp", default=d.mtp, help="MTP checkpoint or 'random'; default: the model's shipped MTP")
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
    p.add_argument("--draft-len", type=int, default=d.draft_len)
    p.add_argument("--mtp-strategy", default=d.mtp_strategy, help=f"{'|'.join(MTP_STRATEGIES)}")
    p.add_argument("--mtp-learning-rate", type=float, default=d.mtp_learning_rate)
    p.add_argument("--async-mode", default=d.async_mode, help=f"{'|'.join(ASYNC_MODES)}")
    p.add_argument("--rollout-dtype", default=d.rollout_dtype, help=f"{'|'.join(DTYPES)}")
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


def build_parser():
    parser = argparse.ArgumentParser(prog="bebop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="sample completions (plain or speculative)")
    add_model_args(p)
    p.add_argument("--prompt")
    p.add_argument("--prompts", help="JSONL file, one {\"prompt\": ...} per line")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--mode", choices=MODES, default="spec")
    p.add_argument("--output", help="JSONL output (default: stdout)")
    add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", help="tokens/s and acceptance per mode and batch size, interleaved")
    add_model_args(p)
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--modes", default="ar,spec,spec-greedy", help="any of ar, spec, spec-greedy, hf (transformers)")
    p.add_argument("--prompts", help="JSONL prompts (default: built-in held-out task prompts)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    add_sampling_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("make-data", help="self-distillation data: the target's own samples")
    add_model_args(p)
    p.add_argument("--prompts", default="builtin", help="'builtin' (chat, math and code tasks) or a JSONL file")
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
    try:
        args.func(args)
    except BebopError as e:
        print(f"bebop: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("bebop: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
