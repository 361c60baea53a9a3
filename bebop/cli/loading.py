"""The model and draft a command names (--model, --draft), loaded."""

from bebop.drafts.registry import default_draft, load_draft, new_draft
from bebop.models.registry import load_model


def pick_mtp(spec: str | None, model):
    """--draft: a checkpoint path or EAGLE-3 directory, 'random' / 'random-eagle3' (seeded fresh drafts), or None
    (the model's default)."""
    if spec == "random":
        return new_draft(model, "mtp")
    if spec == "random-eagle3":
        return new_draft(model, "eagle3")
    return load_draft(spec, model) if spec else default_draft(model)



def load(args, need_mtp=True):
    """(model, tokenizer, mtp) from --model / --draft."""
    model, tok = load_model(args.model, dtype=getattr(args, "dtype", "float32"), compile=args.compile)
    mtp = None
    if need_mtp:
        mtp = pick_mtp(args.mtp, model)
    return model, tok, mtp
