"""What every draft kind is: the interface the engine, training and studies drive (Draft), its config and
checkpoint (DraftConfig, Draft.save), the registry of kinds (register_draft), and what a draft reads of the
target (target_forward, target_signature).

A draft extends the target's sequence K tokens at a time. Each kind defines its own modules (`build`), how a
step's first block input is made from the next tokens and the previous hidden states (`fuse`) and its logits
over the draft vocabulary (`draft_logits`); the rest is shared: the target's features it reads (`features`),
one draft step with its own KV cache (`forward`), the reduced draft vocabulary (`set_draft_vocab`,
`full_vocab`), the training unroll (`unroll`) and checkpoints (`save`).

A checkpoint is `NAME.safetensors` (the draft's own weights) plus `NAME.json` (its config, `arch` naming the
kind, and provenance).
"""

import json
import uuid
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from bebop.errors import BebopError
from bebop.models.cache import KVCache, step_positions
from bebop.models.decoder import EMBEDDINGS, Decoder
from bebop.models.kernels import PAGED, set_linear

DRAFT_KINDS: dict[str, type["Draft"]] = {}  # checkpoint "arch" -> the Draft subclass (register_draft)


def register_draft(arch: str):
    """Class decorator: the Draft subclass is the kind `arch` (its checkpoints' "arch" field)."""
    def register(cls):
        cls.arch = arch
        DRAFT_KINDS[arch] = cls
        return cls
    return register


@dataclass
class DraftConfig:
    dim: int
    draft_vocab_size: int = 0  # 0 = the target's full vocabulary
    layers: int = 1  # decoder blocks per depth (DeepSeek-V3: 1)
    arch: str = "mtp"  # the draft kind (DRAFT_KINDS): "mtp" (bebop.drafts.mtp) or "eagle3" (bebop.drafts.eagle3)
    feature_layers: list[int] = field(default_factory=list)  # target layers fed in (EAGLE-3); [] = last hidden
    meta: dict = field(default_factory=dict)  # provenance: loss, draft length, data, step, command


MTPConfig = DraftConfig  # old name, kept for one release


def draft_or_old_mtp(draft, mtp, where: str, stacklevel: int = 3):
    """`draft`, or what a caller passed as `mtp=`, the old name of `draft=` in `where` (kept for one release,
    with a DeprecationWarning)."""
    if mtp is None:
        return draft
    warnings.warn(f"{where}(mtp=...) is now {where}(draft=...); mtp= goes in the next release",
                  DeprecationWarning, stacklevel=stacklevel)
    return mtp if draft is None else draft


class Draft(nn.Module):
    """A draft the engine, training and analysis drive through one interface: `features` (what it reads of the
    target), `forward` (one step with its own KV cache), `draft_logits` (over the draft vocabulary),
    `full_vocab`, `new_cache`, `unroll` (training), `save`. A kind subclasses it with @register_draft and
    defines `build`, `fuse` and `draft_logits`."""

    arch = ""  # set by register_draft

    def __init__(self, target: Decoder, config: DraftConfig | None = None):
        super().__init__()
        self.config = config or DraftConfig(dim=target.cfg.dim)
        self.config.arch = self.arch
        self.check(target.cfg)
        self.feature_layers = tuple(self.config.feature_layers)
        self.build(target)
        # the target's modules, shared and frozen; kept out of this module's parameters and state dict
        object.__setattr__(self, "target", target)
        self.register_buffer("vocab_ids", torch.arange(0), persistent=True)
        self.set_draft_vocab(None)
        set_linear(self, target.linear)  # multiply as the target does (packed weights where the tuning chose them)

    def check(self, cfg):
        """Refuse a config that does not fit the target's `cfg`."""
        if self.config.layers < 1:
            raise BebopError(f"an MTP needs at least 1 layer, got {self.config.layers}")
        bad = [i for i in self.config.feature_layers if not EMBEDDINGS <= i < cfg.n_layers]
        if bad or len(set(self.config.feature_layers)) != len(self.config.feature_layers):
            raise BebopError(f"feature layers must be distinct layer indices of the target in 0..{cfg.n_layers - 1} "
                             f"(or -1, the embeddings), got {self.config.feature_layers}")

    def build(self, target: Decoder):
        """This kind's own modules (`blocks` among them)."""
        raise NotImplementedError

    def fuse(self, tokens, hidden):
        """The first block's input [B, T, d] from the next tokens [B, T] and the previous hidden states
        [B, T, d], and what its attention output is added to (None: that input itself)."""
        raise NotImplementedError

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., Vd] from draft hidden states [..., d]."""
        raise NotImplementedError

    # ----- vocabulary -----
    def set_draft_vocab(self, vocab_ids: torch.Tensor | None):
        """Restrict the draft head to `vocab_ids` (sorted unique token ids), or None for the full vocabulary."""
        w = self.target.lm_head.weight.detach()  # frozen; a plain tensor so it never enters our state dict
        ids = torch.arange(0) if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long).unique()
        self.vocab_ids = ids = ids.to(w.device)
        self.config.draft_vocab_size = len(ids)
        self.head_weight = w if len(ids) == 0 else w[ids].contiguous()

    def full_vocab(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """Scatter probabilities over the draft vocabulary [..., Vd] into the target's vocabulary [..., V]."""
        if len(self.vocab_ids) == 0:
            return draft_probs
        out = draft_probs.new_zeros(*draft_probs.shape[:-1], self.target.cfg.vocab_size)
        return out.index_copy_(-1, self.vocab_ids, draft_probs)

    # ----- inference: recursive drafting with a KV cache -----
    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.target.cfg
        return KVCache(len(self.blocks), batch, c.n_kv_heads, max_len, c.head_dim, self.enorm.weight.dtype,
                       paged=self.target.attention[0] == PAGED, device=self.enorm.weight.device)

    def features(self, target_out: torch.Tensor) -> torch.Tensor:
        """The depth-1 input [.., d] from what the target gives the draft (target_forward): its last hidden state
        as is, or the projection by `fc` of the `feature_layers` outputs it captured (EAGLE-3)."""
        return self.fc(target_out) if self.feature_layers else target_out

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One draft step over T new positions per row: tokens [B, T] are the tokens one ahead of the positions
        whose previous hidden states are `hidden` [B, T, d] (`features` of the target's, or the draft's own
        output). Returns draft hidden states [B, T, d]; like the target, the cache's lengths are left for the caller."""
        positions, mask = step_positions(cache, tokens.shape[1], self.target.cfg.n_heads)
        cos, sin = self.target.rope(positions)
        rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1)
        x, residual = self.fuse(tokens, hidden)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.k[i], cache.v[i], positions, rows, mask, self.target.attention, residual)
            residual = None
        return x

    # ----- training: K depths unrolled on the draft's own hidden states, as at inference -----
    def unroll(self, tokens: torch.Tensor, hidden: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Training-time unrolling over whole sequences. tokens [B, S]; hidden [B, S, d]: the target's hidden
        states (teacher forcing from one target forward). Returns `depth` tensors [B, S - k, d]: entry k-1,
        anchored at position t, predicts token t + k + 1.

        Attention reproduces inference exactly: at inference the depth-k draft anchored at t (its query sits at
        position t + k - 1) attends to depth-1 entries for positions <= t (written from the target's hidden
        states when the draft catches up on accepted tokens) plus its own chain's depth 2..k entries. So here a
        depth-k query attends causally to the depth-1 keys and, on the diagonal, to the same anchor's keys of
        depths 2..k (the "training-time test" of EAGLE-3)."""
        B, S, _ = hidden.shape
        cfg = self.target.cfg
        scale = cfg.head_dim ** -0.5
        group = cfg.n_heads // cfg.n_kv_heads
        outs, h = [], hidden
        first = [None] * len(self.blocks)  # per block: depth-1 keys and values
        chains = [([], []) for _ in self.blocks]  # per block: keys and values of depths 2..k
        for k in range(1, depth + 1):
            n = S - k  # anchors t = 0..S-k-1 still have the input token t + k
            if n <= 0:
                break
            pos = torch.arange(k - 1, k - 1 + n, device=hidden.device).expand(B, n)
            cos, sin = self.target.rope(pos)
            x, residual = self.fuse(tokens[:, k:k + n], h[:, :n])
            for b, blk in enumerate(self.blocks):
                q, kk, vv = blk.qkv(x, cos, sin)
                kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
                causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
                if k == 1:  # depth-1 keys, attended causally by every depth
                    first[b] = kk, vv
                    scores = (q @ kk.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
                    attn = scores.softmax(-1) @ vv
                else:
                    k1, v1 = first[b]
                    chain_k, chain_v = chains[b]
                    chain_k.append(kk)
                    chain_v.append(vv)
                    base = (q @ k1[:, :, :n].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
                    diag = torch.stack([(q * ck[:, :, :n]).sum(-1) * scale for ck in chain_k], dim=-1)
                    weights = torch.cat([base, diag], dim=-1).softmax(-1)
                    attn = weights[..., :n] @ v1[:, :, :n]
                    attn = attn + sum(weights[..., n + j:n + j + 1] * cv[:, :, :n] for j, cv in enumerate(chain_v))
                x = blk.finish(x if residual is None else residual, attn)
                residual = None
            h = x
            outs.append(h)
        return outs

    # ----- checkpoints -----
    def save(self, path: str | Path, **meta):
        """Write NAME.safetensors + NAME.json. Both carry the same random `save_id` (the weights in their
        safetensors metadata), and each is written to a temporary name then renamed, so a reader can tell a
        matching pair from one torn by a crash between the two renames (load_draft refuses that)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.config.meta.update(meta)
        save_id = uuid.uuid4().hex
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        weights, config_path = path.with_suffix(".safetensors"), path.with_suffix(".json")
        tmp_weights, tmp_config = path.with_suffix(".safetensors.tmp"), path.with_suffix(".json.tmp")
        save_file(state, str(tmp_weights), metadata={"save_id": save_id})
        config = asdict(self.config) | {"target": target_signature(self.target), "save_id": save_id}
        tmp_config.write_text(json.dumps(config, indent=1))
        tmp_weights.replace(weights)
        tmp_config.replace(config_path)


def target_forward(target: Decoder, mtp: Draft | None, tokens, cache, valid=None):
    """The target's hidden states [B, T, d] and what the draft reads of the same positions, before its own
    projection (Draft.features): the same tensor, or the outputs of the target layers an EAGLE-3 draft reads
    [B, T, n*d]. The engine keeps them unprojected until the draft reads them: after plain steps it may never.
    `valid` [B, T]: the real tokens of a padded step (Decoder.forward)."""
    if mtp is None or not mtp.feature_layers:
        hidden = target(tokens, cache, valid=valid)
        return hidden, hidden
    return target(tokens, cache, capture=mtp.feature_layers, valid=valid)


def target_signature(target: Decoder) -> dict:
    c = target.cfg
    return {"name": getattr(target, "name", None), "dim": c.dim, "vocab_size": c.vocab_size,
            "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "hidden_dim": c.hidden_dim}


