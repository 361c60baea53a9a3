"""bebop.drafts.eagle3: bebop's Eagle3 computes what vLLM's llama_eagle3 computes, read from the exported file by
the engines' weight names (an independent forward written from vLLM's code below); vLLM's default target layers;
a reduced vocabulary keeps the draft's kernels; an export is studied and trained through RL."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from bebop.cli import main
from bebop.drafts.eagle3 import default_feature_layers, new_eagle3
from bebop.drafts.formats import export_eagle3
from bebop.drafts.registry import load_mtp

from .eagle3_helpers import VOCAB, scrambled


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference_logits(files, config, embed, feats, tokens):
    """vLLM's Eagle3 LlamaForCausalLM at depth 1 over a sequence (every anchor t: token t + 1, the target's
    features at t, RoPE position t, causal attention), written from its code and the exported tensors alone:
    combine_hidden_states (fc), layer 0 (input_layernorm of the embedding, hidden_norm of the hidden state with
    the residual taken before it, q/k/v over the concatenation, o_proj, post_attention_layernorm, SwiGLU MLP),
    the fused add-and-norm, lm_head, logits scattered to the full vocabulary at base + d2t.
    Returns logits [S - 1, V] (-inf outside the draft vocabulary) and the pre-norm output (the next depth's h)."""
    w = {k: v.double() if v.is_floating_point() else v for k, v in files.items()}
    eps, H, Hkv, D = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    e = embed[tokens[1:]].double()
    h = feats[:-1].double() @ w["fc.weight"].T
    n = len(e)
    residual = h
    x = torch.cat([rms(e, w["midlayer.input_layernorm.weight"], eps), rms(h, w["midlayer.hidden_norm.weight"], eps)], -1)
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, H, D).transpose(0, 1)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, Hkv, D).transpose(0, 1)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, Hkv, D).transpose(0, 1)
    inv = 1.0 / config["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rotate(t):  # Llama's rotate_half
        return t * cos + torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1) * sin

    q, k = rotate(q), rotate(k).repeat_interleave(H // Hkv, 0)
    v = v.repeat_interleave(H // Hkv, 0)
    scores = (q @ k.transpose(-1, -2)) / D ** 0.5 + torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, H * D)
    residual = residual + attn @ w["midlayer.self_attn.o_proj.weight"].T
    y = rms(residual, w["midlayer.post_attention_layernorm.weight"], eps)
    y = (F.silu(y @ w["midlayer.mlp.gate_proj.weight"].T) * (y @ w["midlayer.mlp.up_proj.weight"].T)) @ \
        w["midlayer.mlp.down_proj.weight"].T
    prenorm = residual + y
    logits = rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T
    if "d2t" not in w:
        return logits, prenorm
    full = torch.full((n, config["vocab_size"]), float("-inf"), dtype=torch.float64)
    full[:, torch.arange(len(w["d2t"])) + w["d2t"]] = logits
    return full, prenorm


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("vocab", [None, VOCAB], ids=["full-vocab", "draft-vocab"])
def test_eagle3_computes_what_vllm_computes_from_the_export(name, vocab, load_models, tmp_path):
    _, model, _ = load_models(name)
    draft = scrambled(model, 1, vocab)
    export_eagle3(draft, tmp_path)
    files, config = load_file(str(tmp_path / "model.safetensors")), json.loads((tmp_path / "config.json").read_text())
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (9,), generator=g)
    feats = torch.randn(9, 3 * model.cfg.dim, generator=g)
    want, prenorm = reference_logits(files, config, model.embed.weight.detach(), feats, tokens)
    with torch.no_grad():
        h = draft.unroll(tokens[None], draft.features(feats[None]), 1)[0][0]
        got = draft.draft_logits(h).double()
    torch.testing.assert_close(h.double(), prenorm, rtol=1e-3, atol=1e-3)  # the next depth is fed the pre-norm output
    if vocab is not None:
        got = torch.full_like(want, float("-inf")).index_copy_(-1, draft.vocab_ids, got)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)  # (fp32 against fp64)


def test_default_target_layers_are_vllms():
    """vLLM's default (2, L // 2, L - 3) counts layer inputs: bebop's outputs one lower."""
    assert [i + 1 for i in default_feature_layers(30)] == [2, 15, 27]


def test_an_export_is_studied_and_trained_through_rl(tmp_path, capsys):
    """`analyze entropy` reads an EAGLE-3 directory, and GRPO runs with one trained online (its own head is
    part of the weights synced to the rollout worker)."""
    from bebop.models.registry import load_model
    from bebop.rl.config import RLConfig
    from bebop.rl.loop import run_rl

    main(["export", "--model", "tiny-llama", "--mtp", "random-eagle3", "--out", str(tmp_path / "e3")])
    main(["analyze", "entropy", "--model", "tiny-llama", "--mtp", str(tmp_path / "e3"), "--num-prompts", "2",
          "--temperatures", "0.8,1.2", "--max-new-tokens", "6", "--bootstrap", "20", "--out", str(tmp_path / "ent")])
    assert any((tmp_path / "ent").iterdir())
    policy, tok = load_model("tiny-llama", dtype="float32")
    draft = load_mtp(tmp_path / "e3", policy)
    cfg = RLConfig(model="tiny-llama", steps=2, prompts_per_step=2, num_generations=2, max_completion_length=8,
                   learning_rate=1e-3, micro_batch_size=4, autocast="off", rollout="spec", eval_prompts=1, threads=2,
                   rollout_dtype="float32", async_mode="one-step", draft_strategy="online-e2e-tv", draft_len=3)

    class Task:
        prompt = "say hi"

        def reward(self, completion):
            return float(len(completion) % 2)

    before = draft.lm_head.weight.detach().clone()
    rows = run_rl(cfg, tmp_path / "rl", policy, tok, [Task()] * 4, [Task()], draft, progress=False)
    assert len(rows) == 2 and all(r["mtp_train_s"] > 0 and 0 <= r["acceptance_rate"] <= 1 for r in rows)
    assert not torch.equal(draft.lm_head.weight, before)  # the draft's own head trained


def test_a_reduced_draft_vocabulary_keeps_the_drafts_kernels(tiny_llama):
    """set_draft_vocab builds the draft's head anew: it multiplies with the kernels the rest of the draft uses, a
    kernel per row count included (it fell back to the plain product before)."""
    model, _ = tiny_llama
    model.linear = "plain:1,packed"
    try:
        draft = new_eagle3(model, seed=0)
        draft.set_draft_vocab(VOCAB)
        assert draft.lm_head.weight.shape[0] == len(VOCAB)
        assert (draft.lm_head.kind, draft.lm_head.rows) == (draft.fc.kind, draft.fc.rows) == \
            ("plain:1,packed", ((1, "plain"), (float("inf"), "packed")))
    finally:
        model.linear = "plain"
