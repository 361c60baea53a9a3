"""The MTP draft module, DeepSeek-V3 layout, applied recursively for K depths.

For depth k at position t, with h the previous hidden state (the target's features for k = 1, the MTP's own
output for k > 1) and e the embedding of the token at position t + k:
    x  = eh_proj [enorm(e) ; hnorm(h)]          (2d -> d, no bias)
    h' = Block_L(...Block_1(x))                 (`layers` decoder layers of the target's shape; 1 in DeepSeek-V3)
    q  = softmax(lm_head(final_norm(h')))       (embedding, final norm and LM head: the target's, frozen)
The target's features are its last hidden state, or, with `feature_layers` (EAGLE-3's input), the outputs of
those target layers (e.g. a low, a middle and the last) concatenated and projected by `fc` (n*d -> d).
An optional reduced draft vocabulary (`vocab_ids`) restricts the draft's LM head to the most frequent tokens,
as EAGLE-3 and FR-Spec do: drafting gets cheaper and rejection sampling stays exact (q is 0 elsewhere).

The draft interface, its checkpoints and the shared step and training unroll are bebop.drafts.base's.
"""

import torch
import torch.nn.functional as F
from torch import nn

from bebop.drafts.base import Draft, DraftConfig, register_draft
from bebop.models.decoder import Block, Decoder, RMSNorm
from bebop.models.kernels import Linear


@register_draft("mtp")
class MTP(Draft):
    """The DeepSeek-V3 MTP module: its own projection and blocks, the target's final norm and LM head."""

    def build(self, target: Decoder):
        cfg = target.cfg
        if self.feature_layers:
            self.fc = Linear(len(self.feature_layers) * cfg.dim, cfg.dim, bias=False)
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.eh_proj = Linear(2 * cfg.dim, cfg.dim, bias=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(self.config.layers))

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., Vd] from MTP hidden states."""
        return F.linear(self.target.norm(h), self.head_weight).float()

    def fuse(self, tokens, hidden):
        return self.eh_proj(torch.cat([self.enorm(self.target.embed(tokens)), self.hnorm(hidden)], dim=-1)), None

    @classmethod
    def fresh(cls, target: Decoder, seed: int = 0, layers: int = 1, feature_layers=()) -> "MTP":
        """A fresh MTP: seeded random projections; its blocks start as copies of the target's last `layers`
        layers, the usual warm start (random blocks train much slower), which also makes the 'random' MTP a sane
        draft."""
        torch.manual_seed(seed)
        mtp = cls(target, DraftConfig(dim=target.cfg.dim, layers=layers, feature_layers=list(feature_layers)))
        nn.init.normal_(mtp.eh_proj.weight, std=0.02)
        if mtp.feature_layers:
            nn.init.normal_(mtp.fc.weight, std=0.02)
        for block, layer in zip(mtp.blocks, target.layers[-layers:]):
            block.load_state_dict(layer.state_dict())
        return mtp.to(target.embed.weight.device, target.embed.weight.dtype).eval()


new_mtp = MTP.fresh  # old name, kept for one release
