"""`bebop rl` and `report`: GRPO runs with plain or speculative rollouts, and their comparison."""

import json
import sys
from dataclasses import fields, replace
from pathlib import Path

from bebop.backends.vllm import engine as vllm_engine
from bebop.cli.loading import compile_arg, pick_mtp
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft
from bebop.drafts.registry import shipped_draft
from bebop.errors import BebopError
from bebop.models.registry import hf_dir, load_model
from bebop.rl.config import RLConfig
from bebop.rl.loop import run_rl
from bebop.studies.rl_report import write_report
from bebop.tasks import rewards, rl_tasks


def trained_depth(draft, fallback: int) -> int:
    """The K a draft was trained for (train-draft's --draft-len, in its checkpoint's provenance), else `fallback`."""
    return int(draft.config.meta.get("draft_len") or fallback)


def cmd_rl(args):
    values = {f.name: getattr(args, f.name) for f in fields(RLConfig)}
    vllm_auto_k = args.rollout_backend == "vllm" and args.rollout != "ar" and args.draft_len == "auto"
    if vllm_auto_k:  # vLLM has no automatic K: the draft's trained depth, once the draft is known (below)
        values["draft_len"] = args.max_draft_len
    cfg = RLConfig(**values).validate()
    train = rl_tasks(cfg.task, cfg.train_prompts, cfg.seed, "train", cfg.difficulty)
    heldout = rl_tasks(cfg.task, cfg.eval_prompts, cfg.seed, "heldout", cfg.difficulty)
    if cfg.rollout_backend == "vllm":  # what vLLM cannot run: one line before any model loads
        if not vllm_engine.installed():
            raise BebopError("--rollout-backend vllm needs vLLM: pip install 'bebop-rl[vllm]'")
        hf_dir(cfg.model)
    # fp32 master weights; rollouts use their own --rollout-dtype copy
    policy, tok = load_model(cfg.model, dtype="float32", device=cfg.device, compile=compile_arg(args))
    mtp = None
    if cfg.rollout != "ar" and cfg.rollout_backend == "vllm" and cfg.draft is None:
        mtp = shipped_draft(policy, "eagle3")  # vLLM loads EAGLE-3 drafts: the model's shipped one
        if mtp is None:
            raise BebopError(f"--rollout-backend vllm with --rollout {cfg.rollout} needs an EAGLE-3 draft (--draft DIR "
                             f"or random-eagle3): '{cfg.model}' ships none")
    elif cfg.rollout != "ar" and cfg.draft == "history":
        mtp = HistoryDraft()  # learns from every rollout; a resumed run's comes from its checkpoint
    elif cfg.rollout != "ar" and cfg.draft == "hybrid":
        mtp = HybridDraft(pick_mtp(None, policy), HistoryDraft())  # the shipped draft, frozen, and a history
    elif cfg.rollout != "ar":
        mtp = pick_mtp(cfg.draft, policy, need_trained=cfg.draft_strategy == "frozen")  # online strategies train it
        if cfg.rollout_backend == "vllm" and mtp.arch != "eagle3":
            raise BebopError(f"--rollout-backend vllm: '{cfg.draft}' is a DeepSeek-layout MTP; vLLM loads EAGLE-3 drafts "
                             "only (--draft an EAGLE-3 directory or checkpoint, or random-eagle3)")
    if vllm_auto_k:
        cfg = replace(cfg, draft_len=trained_depth(mtp, cfg.max_draft_len)).validate()
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
    print(write_report(args.runs, args.out))
