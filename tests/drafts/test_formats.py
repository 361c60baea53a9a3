"""bebop.drafts.formats, EAGLE-3 draft directories: export -> import is the identity, with the fields and weight
names both engines read; directories that are not EAGLE-3 drafts, or do not fit, are refused by name; a directory
as SpecForge writes it imports; `bebop export` writes one."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.cli import main
from bebop.drafts.eagle3 import Eagle3, default_feature_layers
from bebop.errors import BebopError
from bebop.drafts.formats import export_eagle3, load_eagle3
from bebop.drafts.registry import load_mtp, new_mtp

from .eagle3_helpers import VOCAB, scrambled


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("vocab", [None, VOCAB], ids=["full-vocab", "draft-vocab"])
def test_export_then_import_is_the_identity(name, vocab, load_models, tmp_path):
    """Identical draft logits at every depth (max abs difference 0 in fp32), the format's fields as both
    engines read them, and `--mtp DIR` / load_mtp take the directory."""
    _, model, _ = load_models(name)
    draft = scrambled(model, 2, vocab)
    export_eagle3(draft, tmp_path)
    back = load_mtp(tmp_path, model)
    assert isinstance(back, Eagle3) and back.feature_layers == draft.feature_layers
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 7), generator=g)
    feats = torch.randn(2, 7, 3 * model.cfg.dim, generator=g)
    with torch.no_grad():
        for a, b in zip(draft.unroll(tokens, draft.features(feats), 3), back.unroll(tokens, back.features(feats), 3)):
            assert torch.equal(draft.draft_logits(a), back.draft_logits(b))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["max_position_embeddings"] == model.max_len and config["norm_before_residual"] is False
    layers = list(draft.feature_layers)
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in layers]  # vLLM: input of layer i + 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == layers  # SGLang adds one itself
    files = load_file(str(tmp_path / "model.safetensors"))
    assert files["fc.weight"].shape == (model.cfg.dim, 3 * model.cfg.dim)
    assert files["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * model.cfg.dim
    if vocab is None:
        assert "d2t" not in files and config["draft_vocab_size"] == model.cfg.vocab_size
    else:
        assert files["d2t"].dtype == torch.int64 and files["t2d"].dtype == torch.bool
        assert torch.equal(files["d2t"] + torch.arange(len(VOCAB)), VOCAB) and int(files["t2d"].sum()) == len(VOCAB)
        assert config["draft_vocab_size"] == len(VOCAB)


def refused(tmp_path, load_models, edit_config=None, edit_files=None):
    _, model, _ = load_models("tiny-llama")
    export_eagle3(scrambled(model, 4, VOCAB), tmp_path)
    if edit_config:
        config = json.loads((tmp_path / "config.json").read_text())
        edit_config(config)
        (tmp_path / "config.json").write_text(json.dumps(config))
    if edit_files:
        files = load_file(str(tmp_path / "model.safetensors"))
        edit_files(files)
        save_file(files, str(tmp_path / "model.safetensors"))
    with pytest.raises(BebopError) as e:
        load_eagle3(tmp_path, model)
    return str(e.value)


@pytest.mark.parametrize("edit_config,edit_files,says", [
    (lambda c: c.update(architectures=["LlamaForCausalLM"]), None, "is not an EAGLE-3 draft"),
    (lambda c: c.update(hidden_size=128), None, "hidden_size 128 (the model's 64)"),
    (lambda c: c.update(vocab_size=1000), None, "vocab_size 1000"),
    (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 9]), None, "target layers [0, 1, 8]"),
    (lambda c: c.update(norm_before_residual=True), None, "norm_before_residual true"),
    (None, lambda f: f.pop("midlayer.hidden_norm.weight"), "missing weights ['midlayer.hidden_norm.weight']"),
    (None, lambda f: f.update({"midlayer.self_attn.q_proj.weight": f["midlayer.self_attn.q_proj.weight"][:, :64].contiguous()}),
     "weight shapes of ['midlayer.self_attn.q_proj.weight']"),
    (None, lambda f: f.update(d2t=-f["d2t"]), "d2t does not map"),
])
def test_a_directory_that_does_not_fit_is_refused_by_name(tmp_path, load_models, edit_config, edit_files, says):
    assert says in refused(tmp_path, load_models, edit_config, edit_files)


def test_export_command(tmp_path, capsys):
    """`bebop export`: an EAGLE-3 draft is written and loads back through --mtp; a DeepSeek-layout MTP, a model
    without a shipped EAGLE-3 draft and a bad directory are one error line each, exit 2."""
    def error(argv):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bebop: error: ")
        return err[0]

    main(["export", "--model", "tiny-llama", "--draft", "random-eagle3", "--out", str(tmp_path / "e3")])
    assert "vLLM speculative_config" in capsys.readouterr().err
    main(["generate", "--model", "tiny-llama", "--draft", str(tmp_path / "e3"), "--prompt", "Hi", "--max-new-tokens", "4",
          "--output", str(tmp_path / "out.jsonl")])
    assert json.loads((tmp_path / "out.jsonl").read_text())["tokens"]
    capsys.readouterr()
    assert "vLLM and SGLang load EAGLE-3 drafts only" in error(["export", "--model", "tiny-llama", "--draft", "random",
                                                                "--out", str(tmp_path / "no")])
    assert "no EAGLE-3 draft ships for 'tiny-llama'" in error(["export", "--model", "tiny-llama", "--out", str(tmp_path / "no")])
    assert "exists and is not empty" in error(["export", "--model", "tiny-llama", "--draft", "random-eagle3",
                                               "--out", str(tmp_path / "e3")])
    (tmp_path / "empty").mkdir()
    assert "not an EAGLE-3 directory" in error(["generate", "--model", "tiny-llama", "--draft", str(tmp_path / "empty"),
                                                "--prompt", "Hi"])
    config_file = tmp_path / "e3" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"hidden_size": 32}))
    assert "does not fit model 'tiny-llama': hidden_size 32" in error(["generate", "--model", "tiny-llama", "--draft",
                                                                       str(tmp_path / "e3"), "--prompt", "Hi"])


def test_an_mtp_is_not_an_eagle3_draft(tiny_llama, tmp_path):
    with pytest.raises(BebopError, match="DeepSeek-layout MTP"):
        export_eagle3(new_mtp(tiny_llama[0]), tmp_path)


def test_a_specforge_directory_imports(tiny_llama, tmp_path):
    """A directory as SpecForge writes it, not by bebop: its own embed_tokens copy (ignored: both engines use
    the target's), layer ids only in eagle_config (SGLang's count, taken as bebop's), no norm_before_residual;
    and one with no ids at all, which reads the engines' default layers."""
    model, _ = tiny_llama
    c, d = model.cfg, model.cfg.dim
    g = torch.Generator().manual_seed(5)
    used = torch.tensor([1, 2, 9, 30, 31, 200])
    files = {"fc.weight": torch.randn(d, 3 * d, generator=g), "norm.weight": torch.rand(d, generator=g) + 0.5,
             "lm_head.weight": torch.randn(len(used), d, generator=g), "embed_tokens.weight": torch.randn(c.vocab_size, d),
             "d2t": used - torch.arange(len(used)), "t2d": torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, used, True)}
    shapes = {"self_attn.q_proj": (c.n_heads * c.head_dim, 2 * d), "self_attn.k_proj": (c.n_kv_heads * c.head_dim, 2 * d),
              "self_attn.v_proj": (c.n_kv_heads * c.head_dim, 2 * d), "self_attn.o_proj": (d, c.n_heads * c.head_dim),
              "mlp.gate_proj": (c.hidden_dim, d), "mlp.up_proj": (c.hidden_dim, d), "mlp.down_proj": (d, c.hidden_dim)}
    files |= {f"midlayer.{k}.weight": torch.randn(*s, generator=g) * 0.1 for k, s in shapes.items()}
    files |= {f"midlayer.{k}.weight": torch.rand(d, generator=g) + 0.5
              for k in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
              "intermediate_size": c.hidden_dim, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
              "num_hidden_layers": 1, "vocab_size": c.vocab_size, "draft_vocab_size": len(used), "rms_norm_eps": c.norm_eps,
              "rope_theta": c.rope_theta, "max_position_embeddings": 4096, "tie_word_embeddings": False,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0, 1], "use_aux_hidden_state": True}}
    save_file(files, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    draft = load_mtp(tmp_path, model)
    assert draft.feature_layers == (-1, 0, 1) and torch.equal(draft.vocab_ids, used)
    assert torch.equal(draft.lm_head.weight, files["lm_head.weight"]) and torch.equal(draft.fc.weight, files["fc.weight"])
    q, k, v = draft.blocks[0].wqkv.weight.split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim])
    assert torch.equal(k, files["midlayer.self_attn.k_proj.weight"])
    del config["eagle_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_mtp(tmp_path, model).feature_layers == tuple(default_feature_layers(c.n_layers))
