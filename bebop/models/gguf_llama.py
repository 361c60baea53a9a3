"""A llama-architecture GGUF file -> a plain fp32 Hugging Face directory (config, tokenizer, safetensors).

transformers can load a GGUF itself, but its loader parses the file's metadata three times (tokenizer, config,
weights) and builds its name map per submodule. This reads the file once with `gguf` and names the tensors from one
explicit table: for SmolLM2-135M on a 2-core AVX2 EPYC, 16 s against transformers' 45 s (two interleaved runs
each, examples/gguf_conversion_ab.py).

GGUF stores llama's q and k projections with the rows of each head interleaved for llama.cpp's rope
(`convert_hf_to_gguf.py`, `LlamaModel.permute`); `unpermute` puts them back in Hugging Face's order.
"""

from pathlib import Path

import torch
from safetensors.torch import save_file

from bebop.errors import BebopError

# GGUF metadata key (after "llama.") -> LlamaConfig field
CONFIG_FIELDS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
}
TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
             "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}

# GGUF tensor name -> Hugging Face parameter name; "{i}" is the block index
WEIGHT_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        template = ".".join(["blk", "{i}", *parts[2:]])
        if template in WEIGHT_NAMES:
            return WEIGHT_NAMES[template].format(i=parts[1])
    elif gguf_name in WEIGHT_NAMES:
        return WEIGHT_NAMES[gguf_name]
    raise BebopError(f"GGUF tensor '{gguf_name}' has no Hugging Face name in a llama model")


def unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's rope permutation of a q or k projection: [heads * head_dim, hidden] in both orders."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)


def field(reader, key: str):
    """One scalar or string metadata value of a GGUFReader."""
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return bytes(value).decode() if f.types[0].name == "STRING" else value.item()


def convert(gguf_path: str | Path, out: Path) -> None:
    """Write `out` as a Hugging Face llama directory holding the GGUF's weights dequantised to fp32."""
    from gguf import GGUFReader, dequantize
    from transformers import GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

    reader = GGUFReader(str(gguf_path))
    if field(reader, "general.architecture") != "llama":
        raise BebopError(f"{gguf_path} is not a llama GGUF (it says '{field(reader, 'general.architecture')}')")
    names = {t.name for t in reader.tensors}
    ids = {hf: field(reader, f"tokenizer.ggml.{key}") for key, hf in TOKEN_IDS.items()
           if f"tokenizer.ggml.{key}" in reader.fields}
    config = LlamaConfig(**{hf: field(reader, f"llama.{key}") for key, hf in CONFIG_FIELDS.items()},
                         vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
                         tie_word_embeddings="output.weight" not in names, dtype=torch.float32, **ids)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}

    weights = {}
    for tensor in reader.tensors:
        weight = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()
        kind = tensor.name.split(".")[-2]
        if kind in heads:
            weight = unpermute(weight, heads[kind])
        weights[hf_name(tensor.name)] = weight.contiguous()

    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(Path(gguf_path).parent), gguf_file=Path(gguf_path).name)
    tokenizer.save_pretrained(out)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
