"""A compact decoder-only transformer (Llama / Qwen2 / Qwen3 families) with a per-row static KV cache.

Weights come from the transformers model of the same checkpoint (`Decoder.from_hf`), so loading, tokenizers
and chat templates stay transformers' job; this file only runs the forward pass, in the shape speculative
decoding needs: every batch row sits at its own position, and a row "rolls back" rejected drafts simply by
not advancing its length (entries past a row's length are never attended to and get overwritten).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bebop.models import compiled, cpu
from bebop.models.cache import KVCache, step_positions
from bebop.models.kernels import ATTENTION, DECODE_MAX_T, PAGED, Linear, PagedStep, set_linear

EMBEDDINGS = -1  # a layer index to capture: the embeddings, the input of layer 0


@dataclass
class DecoderConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int  # SwiGLU inner size
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    qk_norm: bool = False  # Qwen3
    attention_bias: bool = False  # Qwen2
    tie_embeddings: bool = True

    @classmethod
    def from_hf(cls, hf_config) -> "DecoderConfig":
        rope = getattr(hf_config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"RoPE scaling '{rope_type}' is not supported")
        theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        n_heads = hf_config.num_attention_heads
        return cls(
            vocab_size=hf_config.vocab_size,
            dim=hf_config.hidden_size,
            n_layers=hf_config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(hf_config, "num_key_value_heads", None) or n_heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads,
            hidden_dim=hf_config.intermediate_size,
            rope_theta=float(theta),
            norm_eps=float(hf_config.rms_norm_eps),
            qk_norm=hf_config.model_type == "qwen3",
            attention_bias=bool(getattr(hf_config, "attention_bias", False)) or hf_config.model_type == "qwen2",
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        )


class RMSNorm(nn.Module):
    """F.rms_norm; outside autograd, bf16 on a CPU where vLLM's kernels are loaded (bebop.models.cpu), vLLM's
    one-pass kernel instead: the same fp32 arithmetic in one op (several small torch ops otherwise)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        w = self.weight
        loaded = compiled.VLLM_OPS if torch.compiler.is_compiling() else cpu.vllm_cpu_ops()  # (a constant there)
        if x.dtype != torch.bfloat16 or w.dtype != x.dtype or x.device.type != "cpu" or torch.is_grad_enabled() \
                or not loaded:
            return F.rms_norm(x, w.shape, w, self.eps)
        x = x.contiguous()
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, w, self.eps)
        return out


def rope_tables(cfg: DecoderConfig, max_len: int):
    """cos and the signed sin (see apply_rope) per position, [max_len, head_dim]."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1).float(), torch.cat([-sin, sin], dim=-1).float()


def apply_rope(x, cos, signed_sin):
    """x [B, H, T, D]; cos/signed_sin [B, 1, T, D]. The 'rotate half' convention of transformers' Llama,
    x * cos + cat(-x2, x1) * sin, written as x * cos + cat(x2, x1) * cat(-sin, sin): the sign moved into the
    table makes the rotation one cat of the two halves instead of two slices, a negation and a cat, with
    bit-identical results (tests/models/test_decoder.py). (x.roll(half, -1) is the same cat; compiled, its decomposition
    copies in a layout that depends on whether B or T is 1, and every graph was guarded on it.)"""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], -1) * signed_sin

class Block(nn.Module):
    """One pre-norm decoder layer: GQA attention with RoPE (optional qk-norm), then SwiGLU."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wqkv = Linear(cfg.dim, q + 2 * kv, bias=cfg.attention_bias)  # q, k, v fused: one matmul
        self.wo = Linear(q, cfg.dim, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w13 = Linear(cfg.dim, 2 * cfg.hidden_dim, bias=False)  # gate and up fused
        self.w2 = Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def qkv(self, x, cos, sin):
        """Projected, normed and rotated q [B, H, T, D], k and v [B, Hkv, T, D]."""
        cfg = self.cfg
        B, T, _ = x.shape
        qkv = self.wqkv(self.attn_norm(x)).view(B, T, cfg.n_heads + 2 * cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        qk, v = qkv.split([cfg.n_heads + cfg.n_kv_heads, cfg.n_kv_heads], dim=1)
        if cfg.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :cfg.n_heads]), self.k_norm(qk[:, cfg.n_heads:])], dim=1)
        qk = apply_rope(qk, cos, sin)  # q and k heads rotated together: half the small ops
        return qk[:, :cfg.n_heads], qk[:, cfg.n_heads:], v

    def finish(self, x, attn):
        """Residual after attention ([B, H, T, D] output), then the MLP."""
        B, _, T, _ = attn.shape
        x = x + self.wo(attn.transpose(1, 2).reshape(B, T, -1))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)

    def forward(self, x, cos, sin, k_cache, v_cache, positions, rows, bias, attention=("sdpa", "sdpa"), residual=None,
                packed=None):
        """x [B, T, dim] at `positions` [B, T] of cache rows `rows` (arange(B)[:, None], built once for all
        layers); writes this step's k/v into the row's cache slots first, then attends over the cache prefix
        allowed by the additive `bias` [B, 1, T, S] (0 or -inf), or, for a paged cache, a PagedStep.
        `attention`: the kernels (ATTENTION_KINDS) for one new token and for 2..DECODE_MAX_T new tokens.
        `residual` [B, T, dim]: what the attention's output is added to, where it is not x (EAGLE-3's layer
        attends from [embedding ; hidden] and adds to the hidden state).
        `packed` (a Packed): x [1, N, dim] holds only the valid tokens of a padded [B, T] step, at `positions` and
        cache rows `rows` [1, N] (see Packed.attend)."""
        q, k, v = self.qkv(x, cos, sin)
        if isinstance(bias, PagedStep):  # a paged cache: vLLM's kernel writes and attends, in every phase
            return self.finish(x if residual is None else residual, bias.attend(q, k, v, k_cache, v_cache))
        k_cache[rows, :, positions] = k.transpose(1, 2)  # index_put: measured no slower than scatter/index_copy
        v_cache[rows, :, positions] = v.transpose(1, 2)
        if packed is not None:
            return self.finish(x if residual is None else residual, packed.attend(q, k_cache, v_cache, attention))
        S = bias.shape[-1]
        attn = ATTENTION[kernel(x.shape[1], attention)](q, k_cache[:, :, :S], v_cache[:, :, :S], bias)
        return self.finish(x if residual is None else residual, attn)

@dataclass
class Packed:
    """The valid tokens of a padded step [B, T] (rows that verify different numbers of drafts), packed into
    one sequence [1, N]: the per-token work (norms, projections, MLP, LM head) runs on N = valid.sum() tokens
    instead of B * T. The attention runs in two parts where every row has its first token (a verify step: the
    pending token): every row's first token, a plain decoding step's attention; then the other tokens of the
    rows that have more (the drafting rows), over those rows' cache only. Otherwise on the padded layout, where
    a padded query reads the cache like any other and its output is dropped. Over a paged cache vLLM's kernel
    takes the packed queries as they are, each row its own number (a PagedStep built with `valid`)."""
    b: torch.Tensor  # [N] row of each valid token
    t: torch.Tensor  # [N] its place in the row
    B: int
    T: int
    bias: torch.Tensor | PagedStep  # [B, 1, T, S] the step's additive causal bias (a paged cache's PagedStep)
    first: torch.Tensor | None  # [B] where each row's first token is in the packed order (None: a row has none)
    drafting: torch.Tensor  # [R] the rows with more than one token
    rest: torch.Tensor  # [M] where their other tokens are in the packed order
    rest_at: tuple[torch.Tensor, torch.Tensor]  # ([M] index into drafting, [M] place after the first token)
    rest_bias: torch.Tensor | None  # [R, 1, T-1, S] the bias of the drafting rows' other tokens (None: paged)

    @classmethod
    def of(cls, valid: torch.Tensor, bias: "torch.Tensor | PagedStep") -> "Packed":
        b, t = valid.nonzero(as_tuple=True)
        B, T = valid.shape
        first = (t == 0).nonzero().squeeze(1)
        first = first if len(first) == B else None
        drafting = valid[:, 1:].any(1).nonzero().squeeze(1)  # [R]
        rest = (t > 0).nonzero().squeeze(1)  # [M]
        slot = torch.full((B,), -1, dtype=torch.long, device=b.device)
        slot[drafting] = torch.arange(len(drafting), device=b.device)
        rest_bias = None if isinstance(bias, PagedStep) else bias[drafting, :, 1:]
        return cls(b, t, B, T, bias, first, drafting, rest, (slot[b[rest]], t[rest] - 1), rest_bias)

    def attend(self, q, k_cache, v_cache, attention) -> torch.Tensor:
        """q [1, H, N, D] over the cache (its step's k/v written) -> the attention's output [1, H, N, D];
        `attention`: the kernels for one new token and for several (Decoder.attention)."""
        S = self.bias.shape[-1]
        k_cache, v_cache = k_cache[:, :, :S], v_cache[:, :, :S]
        if self.first is None:
            out = ATTENTION[kernel(self.T, attention)](self.pad(q), k_cache, v_cache, self.bias)
            return self.pack(out)
        q = q[0]  # [H, N, D]
        out = torch.empty_like(q)
        firsts = q[:, self.first].transpose(0, 1).unsqueeze(2)  # [B, H, 1, D]
        out[:, self.first] = ATTENTION[attention[0]](firsts, k_cache, v_cache, self.bias[:, :, :1])[:, :, 0].transpose(0, 1)
        if len(self.drafting):
            R, T = len(self.drafting), self.T - 1
            rest = q.new_zeros(R, T, q.shape[0], q.shape[2])  # [R, T-1, H, D]
            rest[self.rest_at] = q[:, self.rest].transpose(0, 1)
            d = self.drafting
            o = ATTENTION[kernel(T, attention)](rest.transpose(1, 2), k_cache[d], v_cache[d], self.rest_bias)
            out[:, self.rest] = o.transpose(1, 2)[self.rest_at].transpose(0, 1)
        return out.unsqueeze(0)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[1, H, N, D] -> [B, H, T, D], zeros at the padding."""
        out = x.new_zeros(self.B, self.T, x.shape[1], x.shape[3])
        out[self.b, self.t] = x[0].transpose(0, 1)
        return out.transpose(1, 2)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T, D] -> [1, H, N, D]."""
        return x.transpose(1, 2)[self.b, self.t].transpose(0, 1).unsqueeze(0)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[1, N, F] -> [B, T, F], zeros at the padding."""
        out = x.new_zeros(self.B, self.T, x.shape[-1])
        out[self.b, self.t] = x[0]
        return out


def kernel(T: int, attention: tuple[str, str]) -> str:
    """The attention kernel for T new tokens per row: the decode kernels (Decoder.attention) up to DECODE_MAX_T,
    SDPA's fused one above (prompts)."""
    return "sdpa" if T > DECODE_MAX_T else attention[1 if T > 1 else 0]


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig, max_len: int = 4096):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg, max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # attention kernels (ATTENTION_KINDS) for one new token per row and for 2..DECODE_MAX_T; chosen per
        # machine at load (bebop.models.tuning)
        self.attention = ("sdpa", "sdpa")
        self.compiled = False  # decode and verify forwards through torch.compile (bebop.models.compiled)
        self.compile_mode = "0"  # what the loader was asked (compiled.COMPILE_MODES): "auto" lets the tuning time it
        self.name: str | None = None  # what the loader knows it as (registry name or path): keys per-model caches
        self.eos_ids: list[int] = []  # tokens that end a generation (the loader reads them from the tokenizer)

    @property
    def linear(self) -> str:
        """How the linear layers multiply (LINEAR_KINDS): chosen per machine at load, like `attention`."""
        return self.__dict__.get("_linear", "plain")

    @linear.setter
    def linear(self, kind: str):
        set_linear(self, kind)
        self.__dict__["_linear"] = kind

    @property
    def max_len(self) -> int:
        """Positions the rope table covers: the model's context (its config's max_position_embeddings)."""
        return self.rope_cos.shape[0]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        if max_len > self.rope_cos.shape[0]:
            raise ValueError(f"sequence length {max_len} exceeds the model's maximum {self.rope_cos.shape[0]}")
        c = self.cfg
        return KVCache(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, self.embed.weight.dtype,
                       paged=self.attention[0] == PAGED, device=self.embed.weight.device)

    def rope(self, positions):
        return self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)

    def packs(self, cache: KVCache) -> bool:
        """Whether a step whose rows verify different numbers of drafts skips the padding's per-token work
        (eager: Packed) rather than paying for the whole padded step (compiled: one graph per padded shape)."""
        return not self.compiled

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: KVCache, capture: tuple[int, ...] = (),
                valid: torch.Tensor | None = None):
        """Run T new tokens per row [B, T] after each row's cached prefix. Returns the last layer's hidden
        states [B, T, dim] before the final norm (what an MTP module consumes); with `capture` (layer indices,
        EMBEDDINGS for the embeddings), also those layers' outputs concatenated [B, T, len(capture) * dim] (an EAGLE-3
        draft's input). The
        cache lengths are NOT advanced: the caller commits as many positions per row as it keeps.
        With `compiled` set, decode and verify forwards (up to DECODE_MAX_T new tokens) run the layers through
        torch.compile (bebop.models.compiled); prompts run eagerly.
        `valid` [B, T] (bool): which new tokens are real where rows verify different numbers of drafts; the rest
        is padding, whose outputs mean nothing. Eager the per-token work runs on the valid tokens only
        (Packed); compiled, on all of them (the padding's cache entries then lie past the row's length, as
        rejected drafts' do)."""
        packs = valid is not None and not bool(valid.all()) and self.packs(cache)
        positions, bias = step_positions(cache, tokens.shape[1], self.cfg.n_heads, valid if packs else None)
        if packs:
            packed = Packed.of(valid, bias)
            out = run_layers(self, tokens, cache.k, cache.v, positions, bias, capture, packed)
            return (packed.unpack(out[0]), packed.unpack(torch.cat(out[1], -1))) if capture else packed.unpack(out)
        layers = run_layers
        if self.compiled and tokens.shape[1] <= DECODE_MAX_T:
            layers = compiled.layers(self, run_layers)
        out = layers(self, tokens, cache.k, cache.v, positions, bias, capture)
        return (out[0], torch.cat(out[1], -1)) if capture else out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()

    def forward_full(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()):
        """Hidden states for whole sequences [B, S] without a cache (training: one causal pass, gradients
        allowed to flow if the caller wants them); `capture` as in `forward`."""
        B, S = tokens.shape
        positions = torch.arange(S, device=tokens.device).expand(B, S)
        cos, sin = self.rope(positions)
        x = self.embed(tokens)
        kept = {EMBEDDINGS: x} if EMBEDDINGS in capture else {}
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, cos, sin)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = layer.finish(x, attn)
            if i in capture:
                kept[i] = x
        return (x, torch.cat([kept[i] for i in capture], -1)) if capture else x

    @classmethod
    def from_hf(cls, hf_model, max_len: int = 4096) -> "Decoder":
        cfg = DecoderConfig.from_hf(hf_model.config)
        model = cls(cfg, max_len=max_len)
        missing, unexpected = model.load_state_dict(convert_hf_state_dict(hf_model.state_dict(), cfg), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:  # a tied head is the one allowed absentee
            raise ValueError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
        weight = next(hf_model.parameters())  # the decoder goes where the transformers model is, in its dtype
        return model.to(weight.device, weight.dtype).eval().requires_grad_(False)


def run_layers(model: Decoder, tokens, k_caches, v_caches, positions, bias, capture, packed: Packed | None = None):
    """Decoder.forward after its positions and bias: the rope, the embedding and the layer stack (what
    bebop.models.compiled compiles). Returns the last hidden states, and with `capture` also the list of the
    captured layers' outputs; `packed`: of the valid tokens only, [1, N, ...]."""
    # (the rope and the row indices are made here, so that their broadcast dimensions of size 1 are constants of
    # a compiled graph: as inputs over a paged cache their size would be a symbol, not taken to be 1)
    if packed is None:
        rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1)
    else:
        tokens, positions = tokens[packed.b, packed.t].unsqueeze(0), positions[packed.b, packed.t].unsqueeze(0)
        rows = packed.b.unsqueeze(0)
    cos, sin = model.rope(positions)
    x = model.embed(tokens)
    outputs = [x]  # the embeddings, then each layer's output: capture index i is outputs[i + 1]
    for i, layer in enumerate(model.layers):
        x = layer(x, cos, sin, k_caches[i], v_caches[i], positions, rows, bias, model.attention, packed=packed)
        if capture:
            outputs.append(x)
    # (indexing, not `i in capture`: compiled with dynamic shapes the indices are symbols, which indexing turns
    # into constants the graph is guarded on, where `in` matched none and the stack fell back to one graph per
    # layer. The caller concatenates: compiled, a concatenation of layer outputs that the next layer's vLLM
    # rms_norm also reads made inductor hand a captured output's buffer on while that norm still read it, and
    # the generated code failed on the name)
    return (x, [outputs[i + 1] for i in capture]) if capture else x


def convert_hf_state_dict(sd: dict, cfg: DecoderConfig) -> dict:
    """transformers' Llama/Qwen weight names -> ours (q/k/v and gate/up concatenated)."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.wqkv.weight"] = torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"],
                                                    sd[a + "v_proj.weight"]])
        if cfg.attention_bias:
            out[f"layers.{i}.wqkv.bias"] = torch.cat([sd[a + "q_proj.bias"], sd[a + "k_proj.bias"],
                                                      sd[a + "v_proj.bias"]])
        out[f"layers.{i}.wo.weight"] = sd[a + "o_proj.weight"]
        if cfg.qk_norm:
            out[f"layers.{i}.q_norm.weight"] = sd[a + "q_norm.weight"]
            out[f"layers.{i}.k_norm.weight"] = sd[a + "k_norm.weight"]
        out[f"layers.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[f"layers.{i}.mlp_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        out[f"layers.{i}.w13.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        out[f"layers.{i}.w2.weight"] = sd[p + "mlp.down_proj.weight"]
    return out
