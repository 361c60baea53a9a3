"""`bebop make-data`, `train-draft` and `compare-losses`: self-distillation data and draft training."""

import math
import os
import sys
from pathlib import Path

from bebop.cli.checks import (MAX_DRAFT_LEN, at_least, check_model_args, check_mtp_file, check_output_dir,
                              check_output_file, check_seed, check_text, number_list, parse_layers, sampling_params)
from bebop.cli.loading import compile_arg, load
from bebop.errors import BebopError
from bebop.models.registry import load_model
from bebop.studies.compare_losses import compare_losses
from bebop.tasks import load_prompts_file, parse_mix
from bebop.training.data import load_meta, load_split, make_data
from bebop.training.losses import LOSSES
from bebop.training.train import TrainConfig, has_checkpoint, paths, train_draft


def cmd_make_data(args):
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
    if args.loss not in LOSSES:
        raise BebopError(f"unknown loss '{args.loss}' (choose from {', '.join(LOSSES)})")
    at_least(args, 1, "steps", "batch_size", "draft_len", "max_seq_len", "eval_every", "save_every",
             "eval_sequences", "mtp_layers")
    at_least(args, 0, "draft_vocab", "eval_prompts")
    if args.draft_len > MAX_DRAFT_LEN:
        raise BebopError(f"--draft-len must be in 1..{MAX_DRAFT_LEN}, got {args.draft_len}")
    if not (args.learning_rate > 0 and math.isfinite(args.learning_rate)):
        raise BebopError(f"--learning-rate must be a finite number > 0, got {args.learning_rate}")
    check_seed(args)
    check_model_args(args)
    check_text(args.data, "--data")
    load_meta(args.data)
    load_split(args.data, "train")
    load_split(args.data, "heldout")
    return TrainConfig(loss=args.loss, draft_len=args.draft_len, steps=args.steps, batch_size=args.batch_size,
                       lr=args.learning_rate, draft_vocab=args.draft_vocab, eval_every=args.eval_every,
                       save_every=args.save_every, eval_prompts=args.eval_prompts, seed=args.seed,
                       max_seq_len=args.max_seq_len, eval_sequences=args.eval_sequences, kind=args.kind,
                       mtp_layers=args.mtp_layers,
                       feature_layers=parse_layers(args.feature_layers),
                       features_dtype=args.features_dtype, autocast=args.autocast)


def cmd_train_draft(args):
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
    model, _ = load_model(args.model, compile=compile_arg(args), dtype="float32", device=args.device)
    train_draft(model, args.data, args.out, cfg, init=args.init, resume=args.resume,
              command="bebop " + " ".join(sys.argv[1:]))
    print(f"wrote {args.out}.safetensors and {args.out}.json", file=sys.stderr)


def cmd_compare_losses(args):
    names = [x.strip() for x in args.losses.split(",") if x.strip()]
    bad = [x for x in names if x not in LOSSES]
    if bad or not names:
        raise BebopError(f"unknown loss(es) {bad or names}: choose from {', '.join(LOSSES)}")
    args.loss = names[0]
    cfg = train_config(args)
    temperatures = number_list(args.temperatures, float, 0)
    at_least(args, 1, "final_eval_prompts", "max_new_tokens", "seeds")
    check_output_dir(args.out, "--out")
    model, _ = load_model(args.model, compile=compile_arg(args), dtype="float32", device=args.device)
    compare_losses(model, args.data, names, cfg, args.out, temperatures=temperatures,
                   eval_prompts=args.final_eval_prompts, eval_new_tokens=args.max_new_tokens, seed=args.seed,
                   seeds=args.seeds, keep=args.keep)
    print((Path(args.out) / "compare.md").read_text())
