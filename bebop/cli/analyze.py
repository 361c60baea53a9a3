"""`bebop analyze entropy`: draft acceptance against the policy's entropy."""

from pathlib import Path

import numpy as np

from bebop.cli.checks import (MAX_DRAFT_LEN, at_least, check_context, check_draft_args, check_output_dir,
                              check_seed, check_text, number_list)
from bebop.cli.loading import compile_arg, pick_mtp
from bebop.errors import BebopError
from bebop.models.registry import chat_ids, check_model, load_model
from bebop.studies.entropy import collect, summarize, write_report
from bebop.tasks import default_prompts, load_prompts_file


def cmd_analyze_entropy(args):
    temperatures = number_list(args.temperatures, float, 0)
    at_least(args, 1, "draft_len", "num_prompts", "max_new_tokens", "bootstrap")
    if args.draft_len > MAX_DRAFT_LEN:
        raise BebopError(f"--draft-len must be in 1..{MAX_DRAFT_LEN}, got {args.draft_len}")
    check_seed(args)
    check_draft_args(args)
    for path in args.policy:  # a registry name or a model directory, like --model
        check_text(path, "--policy")
        check_model(path)
    check_output_dir(args.out, "--out")
    texts = load_prompts_file(args.prompts) if args.prompts else default_prompts(args.num_prompts)
    policies = [(args.model, "base")] + [(p, Path(p).name) for p in args.policy]
    parts = []
    for path, label in policies:
        model, tok = load_model(path, compile=compile_arg(args), dtype="float32", device=args.device)
        mtp = pick_mtp(args.draft, model)
        prompts = [chat_ids(tok, t) for t in texts]
        check_context(model, prompts, args.max_new_tokens)
        parts.append(collect(model, mtp, prompts, temperatures, args.draft_len, args.max_new_tokens,
                             seed=args.seed, policy=label))
    table = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    summary = summarize(table, n_boot=args.bootstrap, seed=args.seed)
    write_report(table, summary, args.out)
    print((Path(args.out) / "report.md").read_text())
