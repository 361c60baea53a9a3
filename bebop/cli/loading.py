"""The model and draft a command names (--model, --mtp), loaded."""

from bebop.drafts.eagle3 import new_eagle3
from bebop.drafts.mtp import default_mtp, load_mtp, new_mtp
from bebop.models.registry import load_model


def pick_mtp(spec: str | None, model):
    """--mtp: a checkpoint path or EAGLE-3 directory, 'random' / 'random-eagle3' (seeded fresh drafts), or None
    (the model's default)."""
    if spec == "random":
        return new_mtp(model)
    if spec == "random-eagle3":
        return new_eagle3(model)
    return load_mtp(spec, model) if spec else default_mtp(model)



def load(args, need_mtp=True):
    """(model, tokenizer, mtp) from --model / --mtp."""
    model, tok = load_model(args.model, dtype=getattr(args, "dtype", "float32"))
    mtp = None
    if need_mtp:
        mtp = pick_mtp(args.mtp, model)
    return model, tok, mtp
