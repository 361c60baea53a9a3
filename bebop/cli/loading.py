"""The model and draft a command names (--model, --draft), loaded."""

from bebop.cli.checks import HISTORY_DRAFT, HYBRID_DRAFT
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft
from bebop.drafts.registry import load_draft, new_draft, trained_draft
from bebop.errors import BebopError
from bebop.models.registry import compile_mode, load_model


def no_trained_draft(name: str) -> str:
    """The error for a speculative run on a model that ships no trained draft: how to train one."""
    return (f"no trained draft for '{name}': train one with `bebop make-data --model {name} --out runs/data` then "
            f"`bebop train-draft --model {name} --data runs/data --out runs/draft` and pass --draft runs/draft "
            f"(or --draft random for an untrained, seeded random draft)")


def pick_mtp(spec: str | None, model, need_trained=True):
    """--draft: a checkpoint path or EAGLE-3 directory, 'random' / 'random-eagle3' (seeded fresh drafts), or None:
    the model's shipped trained draft. Without one, None is refused when `need_trained` (a random draft would
    silently slow speculative decoding down), else a seeded random draft (one that an online strategy trains).
    A draft model only: 'history' is no model and 'hybrid' more than one (`load` takes them)."""
    if spec in (HISTORY_DRAFT, HYBRID_DRAFT):
        raise BebopError(f"--draft {spec} drafts in generate, bench, check-exactness and rl only; this command needs a "
                         "draft model (a checkpoint, an EAGLE-3 directory, 'random' or 'random-eagle3')")
    if spec == "random":
        return new_draft(model, "mtp")
    if spec == "random-eagle3":
        return new_draft(model, "eagle3")
    if spec:
        return load_draft(spec, model)
    draft = trained_draft(model)
    if draft is None and need_trained:
        raise BebopError(no_trained_draft(getattr(model, "name", "this model")))
    return draft or new_draft(model, "mtp")


def compile_arg(args) -> str:
    """The compile mode a command runs with: --compile, else $BEBOP_COMPILE, else the command's own default."""
    return compile_mode(args.compile, args.compile_default)


def load(args, need_mtp=True):
    """(model, tokenizer, draft) from --model / --draft: a draft model (pick_mtp); for --draft history, an
    empty history draft that learns from the rollouts as they are written (a group's samples draft from each
    other's text); for --draft hybrid, the model's trained draft with such a history (bebop.drafts.hybrid)."""
    model, tok = load_model(args.model, dtype=getattr(args, "dtype", "float32"), compile=compile_arg(args),
                            device=args.device)
    mtp = None
    if need_mtp and args.draft == HISTORY_DRAFT:
        mtp = HistoryDraft()
    elif need_mtp and args.draft == HYBRID_DRAFT:
        mtp = HybridDraft(pick_mtp(None, model), HistoryDraft())
    elif need_mtp:
        mtp = pick_mtp(args.draft, model)
    return model, tok, mtp
