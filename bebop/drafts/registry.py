"""Draft kinds by name, and drafts made fresh, loaded from checkpoints or EAGLE-3 directories, or shipped with
bebop (bebop/checkpoints/NAME-ARCH-vN.*, named in SHIPPED_DRAFTS). A kind is a Draft subclass registered with
@register_draft (bebop.drafts.base) in a module imported here."""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from bebop.drafts.base import (DRAFT_KINDS, Draft, DraftConfig, MTPConfig, register_draft, target_forward,
                               target_signature)
from bebop.drafts.eagle3 import Eagle3, new_eagle3
from bebop.drafts.formats import load_eagle3
from bebop.drafts.mtp import MTP, new_mtp
from bebop.errors import BebopError
from bebop.models.decoder import Decoder

__all__ = ["DRAFT_KINDS", "SHIPPED_DRAFTS", "Draft", "DraftConfig", "Eagle3", "MTP", "MTPConfig", "build_draft",
           "default_draft", "draft_from_state", "load_draft", "new_draft", "register_draft", "shipped_draft",
           "shipped_draft_path", "target_forward", "target_signature", "default_mtp", "load_mtp", "mtp_from_state",
           "new_eagle3", "new_mtp"]

CHECKPOINTS = Path(__file__).parent.parent / "checkpoints"


def build_draft(target: Decoder, config: DraftConfig) -> Draft:
    """An untrained draft of the kind `config.arch` names, shaped for `target`."""
    if config.arch not in DRAFT_KINDS:
        raise BebopError(f"unknown draft kind '{config.arch}' (choose from {', '.join(DRAFT_KINDS)})")
    return DRAFT_KINDS[config.arch](target, config)


def new_draft(target: Decoder, kind: str = "mtp", seed: int = 0, **options) -> Draft:
    """A fresh seeded draft of kind `kind` for `target` (the kind's `fresh`; `options` are its own)."""
    if kind not in DRAFT_KINDS:
        raise BebopError(f"unknown draft kind '{kind}' (choose from {', '.join(DRAFT_KINDS)})")
    return DRAFT_KINDS[kind].fresh(target, seed=seed, **options)


# the committed drafts, by model and kind: each file name carries its version, so a cited `--mtp` path keeps
# naming the weights it was measured with when a newer version ships beside it
SHIPPED_DRAFTS = {
    ("smollm2-135m", "eagle3"): "smollm2-135m-eagle3-v2",
    ("smollm2-135m", "mtp"): "smollm2-135m-mtp-v4",
}


def shipped_draft_path(model_name: str, kind: str = "mtp") -> Path | None:
    """Where the committed draft of kind `kind` for `model_name` lies (without .safetensors / .json), if one ships."""
    name = SHIPPED_DRAFTS.get((model_name, kind))
    return CHECKPOINTS / name if name else None


def shipped_draft(target: Decoder, kind: str = "mtp") -> Draft | None:
    """The committed trained draft of kind `kind` for the target (bebop/checkpoints/NAME-KIND-vN.*), if any."""
    path = shipped_draft_path(getattr(target, "name", ""), kind)
    shipped = path.with_suffix(".safetensors") if path else None
    return load_draft(shipped, target) if shipped and shipped.exists() else None


def trained_draft(target: Decoder) -> Draft | None:
    """The target's committed trained draft: its EAGLE-3 draft if one ships (bebop/checkpoints/NAME-eagle3-vN.*, the
    one draft that bebop's engine, vLLM and SGLang all run), else its DeepSeek-layout MTP (NAME-mtp-vN.*), else None."""
    return shipped_draft(target, "eagle3") or shipped_draft(target)


def default_draft(target: Decoder) -> Draft:
    """The target's committed trained draft (trained_draft), else a fresh seeded MTP."""
    return trained_draft(target) or new_mtp(target)


def load_draft(path: str | Path, target: Decoder) -> Draft:
    """Load a checkpoint written by `Draft.save`, or an EAGLE-3 directory (bebop.drafts.formats), checking that
    it fits `target`."""
    path = Path(path)
    if path.is_dir():
        return load_eagle3(path, target)
    weights, config_path = path.with_suffix(".safetensors"), path.with_suffix(".json")
    if not weights.exists() or not config_path.exists():
        raise BebopError(f"MTP checkpoint '{path}' needs both {weights.name} and {config_path.name}")
    try:
        raw = json.loads(config_path.read_text())
        state = load_file(str(weights))
        with safe_open(str(weights), "pt") as f:
            weights_id = (f.metadata() or {}).get("save_id")
    except Exception as e:  # a truncated or foreign file: say which
        raise BebopError(f"cannot read MTP checkpoint '{path}': {e}") from None
    if not isinstance(raw, dict):
        raise BebopError(f"cannot read MTP checkpoint '{path}': {config_path.name} is not a JSON object")
    if raw.get("save_id") != weights_id:  # older checkpoints have neither: None == None
        raise BebopError(f"MTP checkpoint '{path}': {weights.name} and {config_path.name} come from different "
                         f"saves (a write was interrupted); resume the training run or save it again")
    return draft_from_state(target, state, raw, str(path))


def draft_from_state(target: Decoder, state: dict, raw: dict, where: str) -> Draft:
    """A draft for `target` from a state dict and its config (as Draft.save writes it), checking that it fits."""
    config = DraftConfig(dim=raw.get("dim", 0), draft_vocab_size=raw.get("draft_vocab_size", 0),
                       layers=raw.get("layers", 1), feature_layers=list(raw.get("feature_layers", [])),
                       arch=raw.get("arch", "mtp"), meta=raw.get("meta", {}))
    fits = f"MTP checkpoint '{where}' does not fit model '{getattr(target, 'name', '?')}'"
    try:
        mtp = build_draft(target, config)
    except BebopError as e:
        raise BebopError(f"{fits}: {e}") from None
    # checkpoints from before multi-block MTPs name their one block "block."
    state = {("blocks.0." + k[len("block."):] if k.startswith("block.") else k): v for k, v in state.items()}
    vocab_ids = state.pop("vocab_ids", torch.arange(0))
    if len(vocab_ids) and (int(vocab_ids.max()) >= target.cfg.vocab_size or int(vocab_ids.min()) < 0):
        raise BebopError(f"MTP checkpoint '{where}' has draft token ids beyond the model's vocabulary")
    mtp.set_draft_vocab(vocab_ids if len(vocab_ids) else None)  # first: an EAGLE-3 head's size follows it
    expected = {k: v.shape for k, v in mtp.state_dict().items() if k != "vocab_ids"}
    got = {k: v.shape for k, v in state.items()}
    if expected != got:
        bad = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
        raise BebopError(f"{fits}: mismatched weights {bad[:4]}{' ...' if len(bad) > 4 else ''}")
    mtp.load_state_dict(state, strict=False)
    return mtp.to(target.embed.weight.device, target.embed.weight.dtype).eval()


# old names, kept for one release
load_mtp = load_draft
default_mtp = default_draft
mtp_from_state = draft_from_state
