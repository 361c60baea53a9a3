"""The up-front checks: every command validates its options (ranges, files that must exist, outputs that must be
writable) before any model loads. Each check raises BebopError naming the option."""

import math
import os
from pathlib import Path

from bebop.errors import BebopError
from bebop.models.registry import check_model
from bebop.sampling import SamplingParams

MAX_DRAFT_LEN = 64  # far beyond any useful draft; bounds the per-step buffers
RANDOM_DRAFTS = ("random", "random-eagle3")
HISTORY_DRAFT = "history"  # --draft history: drafts read from earlier rollouts (bebop.drafts.history), no file
HYBRID_DRAFT = "hybrid"  # --draft hybrid: the model's trained draft and a history draft, per row (bebop.drafts.hybrid)


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



def check_mtp_file(spec, flag="--draft"):
    """A given MTP checkpoint or EAGLE-3 directory must exist, whatever the mode ('random' is a name, not a
    file)."""
    if spec is None or spec in RANDOM_DRAFTS or spec in (HISTORY_DRAFT, HYBRID_DRAFT):
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
    check_text(args.model, "--model")
    check_model(args.model)


def check_draft_args(args):
    """--model and --draft, for the commands that use a draft."""
    check_model_args(args)
    check_mtp_file(args.draft)


def check_draft_len(args):
    if args.draft_len != "auto" and not 0 <= args.draft_len <= MAX_DRAFT_LEN:
        raise BebopError(f"--draft-len must be 'auto' or in 0..{MAX_DRAFT_LEN}, got {args.draft_len}")



def check_context(model, prompts, max_new_tokens):
    """A request must fit the model's context: prompt + new tokens <= max_position_embeddings."""
    longest = max(map(len, prompts))
    if longest + max_new_tokens > model.max_len:
        raise BebopError(f"prompt of {longest} tokens + --max-new-tokens {max_new_tokens} exceeds the context of "
                         f"'{model.name}' ({model.max_len} tokens)")



def sampling_params(args):
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



def parse_layers(text: str) -> tuple[int, ...]:
    """'2,15,-1' -> (2, 15, -1): layer indices of the target (negative: from the last), in the order given;
    train-draft checks them against the model."""
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
