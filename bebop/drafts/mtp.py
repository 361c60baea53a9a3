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

A checkpoint is `NAME.safetensors` (the MTP's own weights) plus `NAME.json` (its config and provenance).
"""

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from bebop.errors import BebopError
from bebop.models.cache import KVCache, step_positions
from bebop.models.decoder import Block, Decoder, RMSNorm
from bebop.models.kernels import PAGED, Linear, set_linear


@dataclass
class MTPConfig:
    dim: int
    draft_vocab_size: int = 0  # 0 = the target's full vocabulary
    layers: int = 1  # decoder blocks per depth (DeepSeek-V3: 1)
    arch: str = "mtp"  # the draft kind: "mtp" (DeepSeek-V3 layout) or "eagle3" (bebop.drafts.eagle3)
    feature_layers: list[int] = field(default_factory=list)  # target layers fed in (EAGLE-3); [] = last hidden
    meta: dict = field(default_factory=dict)  # provenance: loss, draft length, data, step, command


class MTP(nn.Module):
    """A draft the engine, training and analysis drive through one interface: `features` (what it reads of the
    target), `forward` (one step with its own KV cache), `draft_logits` (over the draft vocabulary), `unroll`
    (training), `save`. The EAGLE-3 draft (bebop.drafts.eagle3) is the other kind; `arch` names it in checkpoints."""

    arch = "mtp"

    def __init__(self, target: Decoder, config: MTPConfig | None = None):
        super().__init__()
        self.config = config or MTPConfig(dim=target.cfg.dim)
        self.config.arch = self.arch
        self.check(target.cfg)
        self.feature_layers = tuple(self.config.feature_layers)
        self.build(target)
        # the target's modules, shared and frozen; kept out of this module's parameters and state dict
        object.__setattr__(self, "target", target)
        self.register_buffer("vocab_ids", torch.arange(0), persistent=True)
        self.set_draft_vocab(None)
        set_linear(self, target.linear)  # multiply as the target does (packed weights where the probe chose them)

    def check(self, cfg):
        if self.config.layers < 1:
            raise BebopError(f"an MTP needs at least 1 layer, got {self.config.layers}")
        bad = [i for i in self.config.feature_layers if not -1 <= i < cfg.n_layers]
        if bad or len(set(self.config.feature_layers)) != len(self.config.feature_layers):
            raise BebopError(f"feature layers must be distinct layer indices of the target in 0..{cfg.n_layers - 1} "
                             f"(or -1, the embeddings), got {self.config.feature_layers}")

    def build(self, target: Decoder):
        """This kind's own modules."""
        cfg = target.cfg
        if self.feature_layers:
            self.fc = Linear(len(self.feature_layers) * cfg.dim, cfg.dim, bias=False)
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.eh_proj = Linear(2 * cfg.dim, cfg.dim, bias=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(self.config.layers))

    # ----- vocabulary -----
    def set_draft_vocab(self, vocab_ids: torch.Tensor | None):
        """Restrict the draft head to `vocab_ids` (sorted unique token ids), or None for the full vocabulary."""
        ids = torch.arange(0) if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long).unique()
        self.vocab_ids = ids
        self.config.draft_vocab_size = len(ids)
        w = self.target.lm_head.weight.detach()  # frozen; a plain tensor so it never enters our state dict
        self.head_weight = w if len(ids) == 0 else w[ids].contiguous()

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., Vd] from MTP hidden states."""
        return F.linear(self.target.norm(h), self.head_weight).float()

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
                       paged=self.target.attention[0] == PAGED)

    def features(self, target_out: torch.Tensor) -> torch.Tensor:
        """The depth-1 input [.., d] from what the target gives the MTP (target_forward): its last hidden state
        as is, or the projection by `fc` of the `feature_layers` outputs it captured (EAGLE-3)."""
        return self.fc(target_out) if self.feature_layers else target_out

    def fuse(self, tokens, hidden):
        """The first block's input [B, T, d] from the next tokens and the previous hidden states, and what its
        attention output is added to (None: that input itself)."""
        return self.eh_proj(torch.cat([self.enorm(self.target.embed(tokens)), self.hnorm(hidden)], dim=-1)), None

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One MTP step over T new positions per row: tokens [B, T] are the tokens one ahead of the positions
        whose previous hidden states are `hidden` [B, T, d] (`features` of the target's, or the MTP's own output).
        Returns MTP hidden states [B, T, d]; like the target, the cache's lengths are left for the caller."""
        positions, mask = step_positions(cache, tokens.shape[1], self.target.cfg.n_heads)
        cos, sin = self.target.rope(positions)
        rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1)
        x, residual = self.fuse(tokens, hidden)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.k[i], cache.v[i], positions, rows, mask, self.target.attention, residual)
            residual = None
        return x

    # ----- training: K depths unrolled on the MTP's own hidden states, as at inference -----
    def unroll(self, tokens: torch.Tensor, hidden: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Training-time unrolling over whole sequences. tokens [B, S]; hidden [B, S, d]: the target's hidden
        states (teacher forcing from one target forward). Returns `depth` tensors [B, S - k, d]: entry k-1,
        anchored at position t, predicts token t + k + 1.

        Attention reproduces inference exactly: at inference the depth-k draft anchored at t (its query sits at
        position t + k - 1) attends to depth-1 entries for positions <= t (written from the target's hidden
        states when the MTP catches up on accepted tokens) plus its own chain's depth 2..k entries. So here a
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
        matching pair from one torn by a crash between the two renames (load_mtp refuses that)."""
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


def target_forward(target: Decoder, mtp: MTP | None, tokens, cache):
    """The target's hidden states [B, T, d] and what the MTP reads of the same positions, before its own
    projection (MTP.features): the same tensor, or the outputs of the target layers an EAGLE-3 MTP reads
    [B, T, n*d]. The engine keeps them unprojected until the MTP reads them: after plain steps it may never."""
    if mtp is None or not mtp.feature_layers:
        hidden = target(tokens, cache)
        return hidden, hidden
    return target(tokens, cache, capture=mtp.feature_layers)


def target_signature(target: Decoder) -> dict:
    c = target.cfg
    return {"name": getattr(target, "name", None), "dim": c.dim, "vocab_size": c.vocab_size,
            "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "hidden_dim": c.hidden_dim}


def new_mtp(target: Decoder, seed: int = 0, layers: int = 1, feature_layers=()) -> MTP:
    """A fresh MTP: seeded random projections; its blocks start as copies of the target's last `layers` layers,
    the usual warm start (random blocks train much slower), which also makes the 'random' MTP a sane draft."""
    torch.manual_seed(seed)
    mtp = MTP(target, MTPConfig(dim=target.cfg.dim, layers=layers, feature_layers=list(feature_layers)))
    nn.init.normal_(mtp.eh_proj.weight, std=0.02)
    if mtp.feature_layers:
        nn.init.normal_(mtp.fc.weight, std=0.02)
    for block, layer in zip(mtp.blocks, target.layers[-layers:]):
        block.load_state_dict(layer.state_dict())
    return mtp.to(target.embed.weight.dtype).eval()


CHECKPOINTS = Path(__file__).parent.parent / "checkpoints"


def shipped_draft(target: Decoder, arch: str = "mtp") -> MTP | None:
    """The committed trained draft of kind `arch` for the target (bebop/checkpoints/NAME-ARCH.*), if any."""
    shipped = CHECKPOINTS / f"{getattr(target, 'name', '')}-{arch}.safetensors"
    return load_mtp(shipped, target) if shipped.exists() else None


def default_mtp(target: Decoder) -> MTP:
    """The target's committed trained draft: its EAGLE-3 draft if one ships (bebop/checkpoints/NAME-eagle3.*, the
    one draft that bebop's engine, vLLM and SGLang all run), else its DeepSeek-layout MTP (NAME-mtp.*), else a
    fresh seeded MTP."""
    return shipped_draft(target, "eagle3") or shipped_draft(target) or new_mtp(target)


def load_mtp(path: str | Path, target: Decoder) -> MTP:
    """Load a checkpoint written by `MTP.save`, or an EAGLE-3 directory (bebop.drafts.formats), checking that it fits
    `target`."""
    path = Path(path)
    if path.is_dir():
        from bebop.drafts.formats import load_eagle3  # (bebop.drafts.formats builds on this module)

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
    return mtp_from_state(target, state, raw, str(path))


def mtp_from_state(target: Decoder, state: dict, raw: dict, where: str) -> MTP:
    """An MTP for `target` from a state dict and its config (as MTP.save writes it), checking that it fits."""
    config = MTPConfig(dim=raw.get("dim", 0), draft_vocab_size=raw.get("draft_vocab_size", 0),
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
    return mtp.to(target.embed.weight.dtype).eval()


def build_draft(target: Decoder, config: MTPConfig) -> MTP:
    """An untrained draft of the kind `config.arch` names, shaped for `target`."""
    from bebop.drafts.eagle3 import Eagle3  # (bebop.drafts.eagle3 builds on this module)

    kinds = {"mtp": MTP, "eagle3": Eagle3}
    if config.arch not in kinds:
        raise BebopError(f"unknown draft kind '{config.arch}' (choose from {', '.join(kinds)})")
    return kinds[config.arch](target, config)
