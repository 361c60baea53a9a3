"""EAGLE-3 draft directories, the layout SpecForge writes and vLLM and SGLang load, to and from bebop's Eagle3.

A directory holds `config.json` (a Llama config of the draft: architectures ["LlamaForCausalLMEagle3"], one
layer, the target's sizes, rope and context) and `model.safetensors`, whose weight names are NAMES (bebop's
name -> the engines' names, concatenated along dim 0), plus, with a reduced vocabulary, d2t int64 [Vd] (target
id - draft id) and t2d bool [V] for bebop's `vocab_ids`. A directory must have every name in NAMES.
The embedding is the target's in both engines; an `embed_tokens.weight` in an imported directory is ignored.

Target layers, the trap: bebop's feature layer i is the OUTPUT of target layer i (-1: the embeddings). vLLM's
id j is the input of layer j (the output of layer j - 1) and it reads the top-level
`eagle_aux_hidden_state_layer_ids` first; SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` and adds
one. So an export writes i + 1 at the top level and i in eagle_config: the same layers in both engines.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bebop.drafts.eagle3 import N_FEATURE_LAYERS, Eagle3, default_feature_layers
from bebop.drafts.base import Draft, DraftConfig
from bebop.errors import BebopError
from bebop.models.decoder import Decoder

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # vLLM's registry knows both names
WEIGHTS = "model.safetensors"
# bebop name -> the engines' names (vLLM and SGLang name them alike), concatenated along dim 0 in this order
NAMES = {
    "fc.weight": ["fc.weight"],
    "enorm.weight": ["midlayer.input_layernorm.weight"],
    "hnorm.weight": ["midlayer.hidden_norm.weight"],
    "blocks.0.wqkv.weight": [f"midlayer.self_attn.{x}_proj.weight" for x in "qkv"],
    "blocks.0.wo.weight": ["midlayer.self_attn.o_proj.weight"],
    "blocks.0.mlp_norm.weight": ["midlayer.post_attention_layernorm.weight"],
    "blocks.0.w13.weight": ["midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"],
    "blocks.0.w2.weight": ["midlayer.mlp.down_proj.weight"],
    "norm.weight": ["norm.weight"],
    "lm_head.weight": ["lm_head.weight"],
}
# config flags of variants bebop does not compute; each must be false (vLLM's default when absent)
VARIANTS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def split_sizes(cfg, ours: str, rows: int) -> list[int]:
    """Rows of each engine tensor that bebop's `ours` (with `rows` rows) concatenates (NAMES)."""
    return {"blocks.0.wqkv.weight": [cfg.n_heads * cfg.head_dim] + [cfg.n_kv_heads * cfg.head_dim] * 2,
            "blocks.0.w13.weight": [cfg.hidden_dim] * 2}.get(ours, [rows])


def export_eagle3(draft: Draft, out: str | Path) -> Path:
    """Write `draft` as an EAGLE-3 directory. A DeepSeek-layout MTP is refused: neither engine computes it."""
    if not isinstance(draft, Eagle3):
        raise BebopError("this draft is a DeepSeek-layout MTP (eh_proj over [embedding ; hidden], the target's head); "
                         "vLLM and SGLang load EAGLE-3 drafts only: train one with `bebop train-draft --kind eagle3`")
    target, c = draft.target, draft.target.cfg
    layers = list(draft.feature_layers)
    vocab = draft.vocab_ids.cpu()
    config = {
        "architectures": [ARCHITECTURES[0]], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": c.dim, "intermediate_size": c.hidden_dim, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "max_position_embeddings": target.max_len,
        "vocab_size": c.vocab_size, "draft_vocab_size": len(vocab) or c.vocab_size, "tie_word_embeddings": False,
        "attention_bias": False, **{flag: False for flag in VARIANTS},
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in layers],  # vLLM: the input of layer i + 1
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},  # SGLang: +1
        "torch_dtype": str(draft.fc.weight.dtype).removeprefix("torch."),
        "bebop": {"target": getattr(target, "name", None), "meta": draft.config.meta},
    }
    state = {k: v.detach().cpu() for k, v in draft.state_dict().items()}
    tensors = {}
    for ours, theirs in NAMES.items():
        parts = state[ours].split(split_sizes(c, ours, len(state[ours])))
        tensors.update({name: part.contiguous() for name, part in zip(theirs, parts)})
    if len(vocab):
        tensors["d2t"] = vocab - torch.arange(len(vocab))
        tensors["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, vocab, True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def feature_layers_of(config: dict, n_layers: int) -> list[int]:
    """bebop's feature layers for a directory's config: vLLM's top-level ids minus one, else SGLang's nested
    ids as they are, else the layers both engines default to."""
    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top:
        return [int(j) - 1 for j in top]
    if nested:
        return [int(j) for j in nested]
    return default_feature_layers(n_layers)


def load_eagle3(path: str | Path, target: Decoder) -> Eagle3:
    """An Eagle3 for `target` from an EAGLE-3 directory, refusing with one line what is not one or does not fit."""
    path = Path(path)
    where = f"EAGLE-3 directory '{path}'"
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise BebopError(f"{where}: no readable config.json ({type(e).__name__})") from None
    archs = config.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise BebopError(f"{where} is not an EAGLE-3 draft: architectures {archs}, expected {ARCHITECTURES[0]}")
    c = target.cfg
    want = {"hidden_size": c.dim, "intermediate_size": c.hidden_dim, "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
            "num_hidden_layers": 1}
    config.setdefault("head_dim", config.get("hidden_size", 0) // max(1, config.get("num_attention_heads", 1)))
    config.setdefault("num_key_value_heads", config.get("num_attention_heads"))
    bad = [f"{k} {config.get(k)} (the model's {v})" for k, v in want.items() if config.get(k) != v]
    bad += [f"{flag} true" for flag in VARIANTS if config.get(flag)]
    layers = feature_layers_of(config, c.n_layers)
    if len(layers) != N_FEATURE_LAYERS or not all(-1 <= i < c.n_layers for i in layers):
        bad.append(f"target layers {layers} (bebop's count; the model has 0..{c.n_layers - 1})")
    if bad:
        raise BebopError(f"{where} does not fit model '{getattr(target, 'name', '?')}': {'; '.join(bad)}")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise BebopError(f"{where}: no .safetensors weights")
    try:
        theirs = {k: v for f in files for k, v in load_file(str(f)).items()}
    except Exception as e:  # a truncated or foreign file
        raise BebopError(f"{where}: cannot read weights: {type(e).__name__}: {e}") from None
    theirs.pop("embed_tokens.weight", None)  # the target's embedding is used, as in both engines
    missing = [n for names in NAMES.values() for n in names if n not in theirs]
    if missing:
        raise BebopError(f"{where}: missing weights {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    pieces = {ours: [theirs.pop(n) for n in names] for ours, names in NAMES.items()}
    d2t = theirs.pop("d2t", None)
    theirs.pop("t2d", None)
    if theirs:
        raise BebopError(f"{where}: unexpected weights {sorted(theirs)[:4]} (an EAGLE-3 variant bebop does not compute)")
    draft = Eagle3(target, DraftConfig(dim=c.dim, feature_layers=layers, meta={"imported_from": str(path)}))
    vocab = None if d2t is None else d2t.long() + torch.arange(len(d2t))
    if vocab is not None and (len(vocab) != config.get("draft_vocab_size", len(vocab)) or
                              int(vocab.min()) < 0 or int(vocab.max()) >= c.vocab_size or
                              not bool((vocab[1:] > vocab[:-1]).all())):
        raise BebopError(f"{where}: d2t does not map the draft vocabulary to distinct ids of the model's, in order")
    draft.set_draft_vocab(vocab)
    wrong = []
    for ours, weight in draft.state_dict().items():
        if ours == "vocab_ids":
            continue
        rows, *rest = weight.shape
        wrong += [name for name, piece, n in zip(NAMES[ours], pieces[ours], split_sizes(c, ours, rows))
                  if tuple(piece.shape) != (n, *rest)]
    if wrong:
        raise BebopError(f"{where} does not fit model '{getattr(target, 'name', '?')}': weight shapes of {wrong[:4]}")
    draft.load_state_dict({ours: torch.cat(parts) for ours, parts in pieces.items()}, strict=False)
    return draft.to(target.embed.weight.device, target.embed.weight.dtype).eval()
