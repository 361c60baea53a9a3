"""The EAGLE-3 draft (`LlamaForCausalLMEagle3`): what vLLM's and SGLang's `llama_eagle3` compute.

For depth k at anchor t, with e the embedding of the token at t + k (the target's embedding, shared and frozen)
and h the previous hidden state: for depth 1 `fc` over three target layers' outputs, concatenated; deeper, this
draft's own output at depth k - 1 (`fc` is not applied again):
    a  = Attention(q, k, v = W_qkv [input_layernorm(e) ; hidden_norm(h)])   (2d wide; RoPE at position t + k - 1)
    r  = h + o_proj(a)                                                        (the residual is h itself)
    h' = r + MLP(post_attention_layernorm(r))                                 (pre-norm output: the next depth's h)
    q  = softmax(lm_head(norm(h')))                                           (its own norm and head)
Its `lm_head` covers a reduced draft vocabulary (`vocab_ids`, EAGLE-3's d2t/t2d); q is 0 elsewhere, so
rejection sampling stays exact. The engine, training, losses and analysis drive it through the Draft interface
(bebop.drafts.base), as the DeepSeek MTP (bebop.drafts.mtp); bebop names map to the engines' names in
bebop.drafts.formats.
"""

import dataclasses

import torch
from torch import nn

from bebop.drafts.base import Draft, DraftConfig, register_draft
from bebop.errors import BebopError
from bebop.models.decoder import EMBEDDINGS, Block, Decoder, RMSNorm
from bebop.models.kernels import Linear, set_linear

N_FEATURE_LAYERS = 3  # vLLM's and SGLang's fc is [d, 3d]


def default_feature_layers(n_layers: int) -> list[int]:
    """The target layers both engines read when a draft names none: vLLM's (2, L // 2, L - 3), which count
    "the input of layer i" (bebop.drafts.formats), as bebop's indices of "the output of layer i". A target too shallow
    for them (the tiny test models) reads its embeddings (-1), a middle layer and its last."""
    if n_layers >= 8:
        return [1, n_layers // 2 - 1, n_layers - 4]
    return [EMBEDDINGS, n_layers // 2 - 1, n_layers - 1]


class Eagle3Layer(Block):
    """A Llama decoder layer whose attention reads 2d (the draft normalises the embedding and the hidden state
    itself, so there is no input norm here) and whose residual is the hidden state (Block.forward's
    `residual`). Llama's: no qk-norm and no attention bias, whatever the target's family."""

    def __init__(self, cfg):
        cfg = dataclasses.replace(cfg, qk_norm=False, attention_bias=False)
        super().__init__(cfg)
        self.attn_norm = nn.Identity()
        self.wqkv = Linear(2 * cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)


@register_draft("eagle3")
class Eagle3(Draft):
    """The EAGLE-3 draft: `fc` over three target layers, one Eagle3Layer, its own norm and reduced-vocabulary
    head."""

    def check(self, cfg):
        super().check(cfg)
        layers = self.config.feature_layers
        if self.config.layers != 1:
            raise BebopError(f"an EAGLE-3 draft has one decoder layer, got {self.config.layers}")
        if len(layers) != N_FEATURE_LAYERS or layers != sorted(layers):
            raise BebopError(f"an EAGLE-3 draft reads {N_FEATURE_LAYERS} target layers in increasing order, got {layers}")

    def build(self, target: Decoder):
        cfg = target.cfg
        self.fc = Linear(N_FEATURE_LAYERS * cfg.dim, cfg.dim, bias=False)
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps)  # the engines' midlayer.input_layernorm (of the embedding)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)  # midlayer.hidden_norm
        self.blocks = nn.ModuleList([Eagle3Layer(cfg)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False)  # resized by set_draft_vocab

    def set_draft_vocab(self, vocab_ids: torch.Tensor | None):
        """As Draft.set_draft_vocab (which keeps the target's head rows for the teacher, `head_weight`); the
        draft's own head is resized to the new vocabulary and started from those rows, or kept as it is where
        the vocabulary did not change (a weight sync refreshing `head_weight`)."""
        before = self.vocab_ids
        super().set_draft_vocab(vocab_ids)
        if len(self.vocab_ids) == len(before) and torch.equal(self.vocab_ids, before) \
                and self.lm_head.weight.shape[0] == len(self.head_weight):
            return
        w = self.lm_head.weight
        self.lm_head = Linear(w.shape[1], len(self.head_weight), bias=False).to(w.device, w.dtype)
        set_linear(self.lm_head, self.fc.kind)  # as the rest of the draft multiplies (its kernel per row count too)
        with torch.no_grad():
            self.lm_head.weight.copy_(self.head_weight)

    def fuse(self, tokens, hidden):
        return torch.cat([self.enorm(self.target.embed(tokens)), self.hnorm(hidden)], dim=-1), hidden

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h)).float()


    @classmethod
    def fresh(cls, target: Decoder, seed: int = 0, feature_layers=None) -> "Eagle3":
        """A fresh EAGLE-3 draft that already drafts sanely: `fc` passes the highest feature layer through
        (plus seeded noise), the layer is the target's last one reading the hidden half (its input norm folded
        into the weights, the embedding half small noise), the norm and head are the target's."""
        cfg = target.cfg
        layers = list(feature_layers) if feature_layers else default_feature_layers(cfg.n_layers)
        torch.manual_seed(seed)
        draft = cls(target, DraftConfig(dim=cfg.dim, feature_layers=layers))
        last, layer = target.layers[-1], draft.blocks[0]
        d = cfg.dim
        with torch.no_grad():
            draft.fc.weight.normal_(std=0.02)
            draft.fc.weight[:, -d:] += torch.eye(d)
            layer.wqkv.weight[:, :d].normal_(std=0.02)
            layer.wqkv.weight[:, d:].copy_(last.wqkv.weight.float() * last.attn_norm.weight.float())
            for name in ("wo", "w13", "w2", "mlp_norm"):
                getattr(layer, name).load_state_dict(getattr(last, name).state_dict())
            draft.norm.weight.copy_(target.norm.weight)
        draft.set_draft_vocab(None)
        return draft.to(target.embed.weight.device, target.embed.weight.dtype).eval()


new_eagle3 = Eagle3.fresh  # old name, kept for one release
