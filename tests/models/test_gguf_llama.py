"""bebop.models.gguf_llama: a llama model written to GGUF as llama.cpp writes it (q and k rows permuted for its
rope, tensors under GGUF names) comes back as the same Hugging Face model: same weights, same logits, same
tokenizer."""

import numpy as np
import pytest
import torch

from bebop.errors import BebopError
from bebop.models import gguf_llama, registry

gguf = pytest.importorskip("gguf")


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`, as it writes q and k."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_gguf(model, tok, path):
    """The seeded tiny llama as a GGUF file: llama metadata, a gpt2-style tokenizer, fp32 tensors."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if i < 3 else gguf.TokenType.NORMAL for _, i in vocab])
    writer.add_token_scores([0.0] * len(vocab))  # no merges: a byte-level vocabulary
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_pad_token_id(tok.pad_token_id)
    to_gguf = {hf.replace("{i}", "{}"): name.replace("{i}", "{}") for name, hf in gguf_llama.WEIGHT_NAMES.items()}
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for name, weight in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the embedding, as in SmolLM2
            continue
        array = weight.numpy()
        if name.split(".")[-2] in heads:
            array = llama_cpp_permute(array, heads[name.split(".")[-2]])
        parts = name.split(".")
        template = ".".join(parts[:2] + ["{}"] + parts[3:]) if parts[1] == "layers" else name
        gguf_name = to_gguf[template].format(parts[2]) if parts[1] == "layers" else to_gguf[template]
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_llama_cpp_gguf_converts_back_to_the_model_it_was_written_from(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = registry.tiny_model("tiny-llama")
    write_gguf(model, tok, tmp_path / "tiny.gguf")
    gguf_llama.convert(tmp_path / "tiny.gguf", tmp_path / "hf")

    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    original = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert original.keys() <= back.state_dict().keys()
    for name, weight in original.items():
        assert torch.equal(back.state_dict()[name], weight), name
    ids = torch.tensor([tok.encode("The sea, in three lines.")])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").encode("héllo <|im_end|>") == tok.encode("héllo <|im_end|>")


def test_unpermute_inverts_llama_cpp_permute():
    weight = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    for heads in (1, 3):
        back = gguf_llama.unpermute(torch.from_numpy(llama_cpp_permute(weight, heads)), heads)
        assert torch.equal(back, torch.from_numpy(weight))


def test_a_tensor_outside_the_name_table_is_one_clear_error():
    assert gguf_llama.hf_name("blk.7.ffn_up.weight") == "model.layers.7.mlp.up_proj.weight"
    with pytest.raises(BebopError, match="blk.0.ssm_conv1d.weight"):
        gguf_llama.hf_name("blk.0.ssm_conv1d.weight")
