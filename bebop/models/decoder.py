"""A compact decoder-only transformer (Llama / Qwen2 / Qwen3 families) with a per-row static KV cache.

Weights come from the transformers model of the same checkpoint (`Decoder.from_hf`), so loading, tokenizers
and chat templates stay transformers' job; this file only runs the forward pass, in the shape speculative
decoding needs: every batch row sits at its own position, and a row "rolls back" rejected drafts simply by
not advancing its length (entries past a row's length are never attended to and get overwritten).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bebop.models import compiled, cpu


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


PAGE = 32  # positions per block of a paged cache (vLLM's CPU attention reads blocks of a multiple of 32)


class KVCache:
    """Static K/V buffers, one pair per layer, and each row's committed length. Plain: a layer's buffer is
    [B, n_kv_heads, max_len, head_dim]. Paged (`paged`, for vLLM's CPU attention kernel, attention kind "paged"):
    each row's positions in blocks of PAGE, [B, blocks, n_kv_heads, PAGE, head_dim], written and read only by
    that kernel (its layout inside a block is its own). Rows are whole either way, so moving and copying rows
    is the same code. Each layer's buffer is its own allocation, not a slice of one [n_layers, ...] tensor: a
    compiled forward (bebop.models.compiled) writes every layer's buffer in one graph, and torch.compile
    miscompiled those writes when the buffers were views of one base (distributions L1 1.5-2.0 from eager
    at batch > 1, issue 23)."""

    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim, dtype=torch.float32, paged=False):
        self.max_len, self.paged = max_len, paged
        shape = (batch, -(-max_len // PAGE), n_kv_heads, PAGE, head_dim) if paged else \
            (batch, n_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long)

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` [n], in that order, as rows 0..n-1, so later forwards do no work for the others.
        Only rows that change place are copied (the engine fills a finished row's slot with one of the last
        rows), then each buffer becomes a view of its first n rows, still contiguous. A copy of the whole
        cache per finished row cost a 32-row batch ~13 ms per EOS."""
        n = len(rows)
        dst = (rows != torch.arange(n, device=rows.device)).nonzero().squeeze(1)
        src = rows[dst]
        for buffers in (self.k, self.v):
            for i, buf in enumerate(buffers):
                if len(dst):
                    buf[dst] = buf[src]  # the right-hand side is gathered before any write
                buffers[i] = buf[:n]
        self.lengths = self.lengths[rows]

    def write_rows(self, rows: torch.Tensor, src: "KVCache", src_rows: torch.Tensor) -> None:
        """Copy rows `src_rows` of another cache of the same kind (a freshly prefilled prompt) into `rows` of
        this one, lengths included: continuous batching puts a new request into a finished row, and one
        prefilled prompt can fill several rows (N samples of one prompt pay for one prefill)."""
        assert src.paged == self.paged
        for mine, theirs in zip(self.k + self.v, src.k + src.v):
            if self.paged:  # blocks
                mine[rows, :theirs.shape[1]] = theirs[src_rows]
            else:  # positions
                mine[rows, :, :theirs.shape[2]] = theirs[src_rows]
        self.lengths[rows] = src.lengths[src_rows]


class RMSNorm(nn.Module):
    """F.rms_norm; outside autograd, bf16 on a CPU where vLLM's kernels are loaded (bebop.models.cpu), vLLM's
    one-pass kernel instead: the same fp32 arithmetic, 7-9% off a whole bf16 generation at batch 1-16 on this
    Xeon (61 norms a token, each several small torch ops otherwise)."""

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
    bit-identical results (tests/test_models.py). (x.roll(half, -1) is the same cat; compiled, its decomposition
    copies in a layout that depends on whether B or T is 1, and every graph was guarded on it.)"""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], -1) * signed_sin


def packs_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's oneDNN linear can take a pre-packed weight of this dtype here: bf16 on a CPU whose
    oneDNN computes bf16 natively (bebop.models.cpu; elsewhere the packing op raises)."""
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu.packs_bf16_linears()


def amx_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the AMX bf16 linear (vLLM's CPU kernel, bebop.models.cpu.amx_bf16_linears) can run here."""
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu.amx_bf16_linears()


def onednn_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether vLLM's oneDNN bf16 matmul (bebop.models.cpu.onednn_bf16_linears) can run here."""
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu.onednn_bf16_linears()


if hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):  # looked up once: resolving torch.ops attributes costs
    # microseconds per call, 120 calls a step
    reorder_linear_weight, linear_pointwise = torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise


def amx_fits(w: torch.Tensor) -> bool:
    """The AMX kernel's tiles: K a multiple of 32 and N of 16 (as vLLM checks before using it)."""
    n, k = w.shape
    return k % 32 == 0 and n % 16 == 0


def amx_pack(w: torch.Tensor, bias):
    """The weight in the AMX kernel's VNNI layout, and the bias in fp32 (what the kernel adds)."""
    return torch.ops._C.convert_weight_packed(w), None if bias is None else bias.float()


def amx_linear(x: torch.Tensor, packed, n: int) -> torch.Tensor:
    weight, bias = packed
    out = x.new_empty(*x.shape[:-1], n)
    torch.ops._C.weight_packed_linear(out.view(-1, n), x.reshape(-1, x.shape[-1]), weight, bias, True)
    return out


class OneDNNMatmul:
    """vLLM's oneDNN matmul for one weight [N, K]: the handler keeps its own copy of the weight in oneDNN's
    layout and its kernels per row count; released with this object."""

    def __init__(self, w: torch.Tensor, bias):
        self.n, self.bias = w.shape[0], bias
        self.pointer = torch.ops._C.create_onednn_mm_handler(w.t(), 128)
        self.handler = torch.tensor(self.pointer, dtype=torch.int64)  # what the kernel takes
        self.release = torch.ops._C.release_dnnl_matmul_handler

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(*x.shape[:-1], self.n)
        torch.ops._C.onednn_mm(out.view(-1, self.n), x.reshape(-1, x.shape[-1]), self.bias, self.handler)
        return out

    def __del__(self):  # (the int, not the tensor: this can run while torch.compile traces, on fake tensors)
        self.release(self.pointer)


LINEAR_KINDS = ("plain", "packed", "amx", "onednn")


def linear_rows(kind: str) -> tuple[tuple[float, str], ...]:
    """A linear kind: one of LINEAR_KINDS, or a kernel per row count (rows = tokens in the call, batch x new
    tokens), "amx:1,onednn:4,amx:32,onednn" meaning amx for 1 row, onednn for 2-4, amx for 5-32, onednn above.
    Returns ((up to rows, kind), ...), the last open-ended."""
    rows, parts = [], kind.split(",")
    for i, part in enumerate(parts):
        name, _, upto = part.partition(":")
        if name not in LINEAR_KINDS or (upto == "") != (i == len(parts) - 1) or (upto and not upto.isdigit()):
            raise ValueError(f"unknown linear kind {kind!r}: one of {', '.join(LINEAR_KINDS)}, or kinds per row "
                             f"count such as 'amx:1,onednn:4,amx'")
        rows.append((int(upto) if upto else math.inf, name))
    return tuple(rows)


class Linear(nn.Linear):
    """nn.Linear that can keep a copy of its weight in a faster kernel's layout (`kind`, LINEAR_KINDS), used
    outside autograd:
    - "packed": oneDNN's blocked layout (torch's mkldnn linear). torch's bf16 CPU matmul otherwise lays the whole
      weight out again on every call: at decode batch sizes that is a second pass over the weights, and the
      packed product took 0.55-0.8x the time on this Intel Xeon (issue 7).
    - "amx": the AMX bf16 GEMM vLLM multiplies small weights with on Intel CPUs (SGLang's `weight_packed_linear`,
      in the `vllm-cpu` package's kernel library): on this Xeon 2-3x faster than "packed" for 1-16 rows (issue 23).
    - "onednn": vLLM's oneDNN matmul, what it multiplies dense projections with on x86: on this Xeon 1.2-1.6x
      faster than "amx" for 2-4 and 64-128 rows, slower for 1 and 16 rows (isolated GEMMs, issue 23).
    - kinds per row count (linear_rows): the probe's choice where two of these run (bebop.models.tuning).
    The results agree with F.linear's (tests/test_models.py); each copy is rebuilt whenever the weight changes:
    in-place updates (an optimiser step, a weight sync) bump its version, `.to()` replaces it. Where this CPU
    cannot run the kind (packs_weights, amx_weights, onednn_weights), or the weight's shape does not fit its
    tiles, the layer multiplies plainly."""

    kind = "plain"
    rows = ((math.inf, "plain"),)  # linear_rows(kind)
    PACK_FOR_BATCH = 64  # the row count oneDNN lays the weight out for (with 1 its kernel changes above ~32 rows)

    def forward(self, x):
        if self.kind == "plain" or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        kind = self.rows[0][1]
        if len(self.rows) > 1:
            n = x.numel() // x.shape[-1]
            kind = next(k for upto, k in self.rows if n <= upto)
        # compiled (bebop.models.compiled), the copy is read as it was last built: the compiled forward rebuilds
        # stale copies before it runs (refresh_fast_weights), where the check, data_ptr() included, can run
        if torch.compiler.is_compiling():  # (oneDNN's packed linear has no lowering for dynamic shapes)
            fast = None if kind == "packed" else self.__dict__.get("_packed", {}).get(kind, (None, None))[1]
        else:
            fast = self.fast(kind)
        if fast is None:
            return F.linear(x, self.weight, self.bias)
        if kind == "amx":
            return amx_linear(x, fast, self.weight.shape[0])
        if kind == "onednn":
            return fast(x)
        return linear_pointwise(x, fast, self.bias, "none", [], "")

    def fast(self, kind: str):
        """This weight in `kind`'s layout, built on first use and whenever the weight or bias changed; None
        where the kind cannot run here (plain included)."""
        w, b = self.weight, self.bias
        key = (w.data_ptr(), w._version, w.dtype, None if b is None else b._version)  # amx copies the bias too
        copies = self.__dict__.get("_packed", {})
        if kind in copies and copies[kind][0] == key:
            return copies[kind][1]
        if kind == "packed" and packs_weights(w.dtype, w.device):
            fast = reorder_linear_weight(w, self.PACK_FOR_BATCH)
        elif kind == "amx" and amx_weights(w.dtype, w.device) and amx_fits(w):
            fast = amx_pack(w, self.bias)
        elif kind == "onednn" and onednn_weights(w.dtype, w.device):
            fast = OneDNNMatmul(w, self.bias)
        else:
            return None
        self.__dict__["_packed"] = {**copies, kind: (key, fast)}
        return fast

    def _apply(self, fn, *args, **kwargs):
        self.__dict__.pop("_packed", None)  # .to(), .float(), ...: the weight is about to be replaced
        return super()._apply(fn, *args, **kwargs)


def set_linear(module: nn.Module, kind: str) -> None:
    """Run every bebop Linear in `module` with the kernel `kind` (LINEAR_KINDS, or kinds per row count)."""
    rows = linear_rows(kind)
    for m in module.modules():
        if isinstance(m, Linear):
            m.kind, m.rows = kind, rows  # copies for other kinds stay until the weight changes (the probe
            # switches kinds back and forth)


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

    def forward(self, x, cos, sin, k_cache, v_cache, positions, rows, bias, attention=("sdpa", "sdpa"), residual=None):
        """x [B, T, dim] at `positions` [B, T] of cache rows `rows` (arange(B)[:, None], built once for all
        layers); writes this step's k/v into the row's cache slots first, then attends over the cache prefix
        allowed by the additive `bias` [B, 1, T, S] (0 or -inf), or, for a paged cache, a PagedStep.
        `attention`: the kernels (ATTENTION_KINDS) for one new token and for 2..DECODE_MAX_T new tokens.
        `residual` [B, T, dim]: what the attention's output is added to, where it is not x (EAGLE-3's layer
        attends from [embedding ; hidden] and adds to the hidden state)."""
        q, k, v = self.qkv(x, cos, sin)
        if isinstance(bias, PagedStep):  # a paged cache: vLLM's kernel writes and attends, in every phase
            return self.finish(x if residual is None else residual, bias.attend(q, k, v, k_cache, v_cache))
        k_cache[rows, :, positions] = k.transpose(1, 2)  # index_put: measured no slower than scatter/index_copy
        v_cache[rows, :, positions] = v.transpose(1, 2)
        S = bias.shape[-1]
        T = x.shape[1]
        kind = "sdpa" if T > DECODE_MAX_T else attention[1 if T > 1 else 0]
        attn = ATTENTION[kind](q, k_cache[:, :, :S], v_cache[:, :, :S], bias)
        return self.finish(x if residual is None else residual, attn)


# Which attention kernel is fastest for a few new tokens per row depends on the CPU, the dtype and whether a
# row brings one token (plain decoding) or several (verification): on an AMD EPYC the matmul kernel cut a bf16
# forward at batch 16 from 85 to 37 ms (issue 7); on an Intel Xeon with AMX it was 1.2-1.4x slower there, SDPA
# was fastest for one token, and for 2-4 tokens SDPA's bf16 kernel took 3x its one-token time at batch 16
# while the folded layout took 1.6x. So the choice is measured per machine and per phase (bebop.models.tuning).
# Above this many new tokens (prompts) SDPA's fused kernel won in every measurement: it never materialises
# the [T, S] scores.
DECODE_MAX_T = 8


def sdpa_attention(q, k, v, bias):
    """torch's fused scaled_dot_product_attention. q [B, H, T, D]; k, v [B, Hkv, S, D]; bias [B, 1, T, S]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


def folded_attention(q, k, v, bias):
    """SDPA on GQA folded into the token axis: the `group` query heads that share a KV head become
    group * T queries of one head ([B, Hkv, group*T, D]), the bias tiled to match. The same function as
    sdpa_attention; its bf16 CPU kernel runs this layout faster when T > 1."""
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    group = H // Hkv
    bias = bias.repeat(1, 1, group, 1)  # [B, 1, group*T, S]: rows ordered (head in group, token)
    out = F.scaled_dot_product_attention(q.reshape(B, Hkv, group * T, D), k, v, attn_mask=bias)
    return out.view(B, H, T, D)


def matmul_attention(q, k, v, bias):
    """softmax(q k^T / sqrt(D) + bias) v as two plain matrix products. q [B, H, T, D]; k, v [B, Hkv, S, D];
    bias [B, 1, T, S]. GQA without repeating K/V: the `group` query heads sharing a KV head are stacked along
    the token axis ([B, Hkv, group*T, D]). Scores are scaled, biased and softmaxed in fp32; in bf16 the
    products themselves come out rounded to bf16 (CPU matmuls have no bf16 -> fp32 output), so this kernel is
    a little less precise than SDPA's there (tests/test_models.py bounds both against fp64)."""
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = H // Hkv
    scores = (q.reshape(B, Hkv, group * T, D) @ k.transpose(-1, -2)).float().view(B, Hkv, group, T, S)
    probs = (scores * D ** -0.5 + bias.unsqueeze(2)).softmax(-1)
    return (probs.to(v.dtype).view(B, Hkv, group * T, S) @ v).view(B, H, T, D)


ATTENTION = {"sdpa": sdpa_attention, "folded": folded_attention, "matmul": matmul_attention}
ATTENTION_KINDS = tuple(ATTENTION)  # per phase (one new token, several); "paged" below is for every phase at once
PAGED = "paged"
PAGED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # what vLLM's CPU attention supports


def paged_runs(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether vLLM's CPU attention over a paged cache can run here: bf16 on a CPU where vLLM's kernels are
    loaded (bebop.models.cpu.vllm_cpu_attention), for a head size it supports."""
    return device.type == "cpu" and dtype == torch.bfloat16 and head_dim in PAGED_HEAD_DIMS \
        and cpu.vllm_cpu_attention()


@dataclass
class PagedStep:
    """What vLLM's CPU attention needs for one forward of T new tokens per row over a paged cache, built once
    for all layers (step_positions): row b's positions p live in block b * blocks + p // PAGE."""
    slots: torch.Tensor  # [B * T] int64: b * blocks * PAGE + position, where each new token's k/v is written
    seq_lens: torch.Tensor  # [B] int32: positions a row attends over after this step's (length + T)
    query_start: torch.Tensor  # [B + 1] int32: row b's queries are rows T*b .. T*b + T - 1 of the flat query
    block_table: torch.Tensor  # [B, blocks] int32
    schedule: torch.Tensor  # the kernel's work split (get_scheduler_metadata)
    isa: str  # "amx" with AMX tiles, else "vec"

    @classmethod
    def build(cls, cache: KVCache, positions: torch.Tensor, n_heads: int):
        if not cpu.vllm_cpu_attention():  # (loads the kernel library on first use)
            raise RuntimeError("a paged KV cache needs vLLM's CPU attention kernels, which are not loaded here")
        B, T = positions.shape
        _, blocks, n_kv, _, head_dim = cache.k[0].shape
        rows = torch.arange(B, dtype=torch.long, device=positions.device)
        slots = (rows[:, None] * (blocks * PAGE) + positions).reshape(-1)
        seq_lens = (positions[:, -1] + 1).to(torch.int32)
        query_start = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=positions.device)
        block_table = (rows[:, None] * blocks + torch.arange(blocks, device=positions.device)).to(torch.int32)
        isa = "amx" if cpu.amx() else "vec"
        schedule = torch.ops._C.get_scheduler_metadata(B, n_heads, n_kv, head_dim, seq_lens, cache.dtype,
                                                       query_start, True, -1, isa, False, None, "auto")
        return cls(slots, seq_lens, query_start, block_table, schedule, isa)

    def attend(self, q, k, v, k_cache, v_cache):
        """Write this step's k, v [B, Hkv, T, D] into the layer's paged cache [B, blocks, Hkv, PAGE, D], then
        causal attention of q [B, H, T, D] over each row's prefix. Returns [B, H, T, D]. Compiled, the same
        function as one opaque op (the kernels' own registration lets the compiler trace into them)."""
        attend = paged_attention_op if torch.compiler.is_compiling() else paged_attention
        return attend(q, k, v, k_cache, v_cache, self.slots, self.query_start, self.seq_lens, self.block_table,
                      self.schedule, self.isa)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, query_start: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                    schedule: torch.Tensor, isa: str) -> torch.Tensor:
    """PagedStep.attend, its fields spelled out."""
    B, H, T, D = q.shape
    n_kv = k.shape[1]
    kc, vc = k_cache.view(-1, n_kv, PAGE, D), v_cache.view(-1, n_kv, PAGE, D)
    torch.ops._C.cpu_attn_reshape_and_cache(k.transpose(1, 2).reshape(B * T, n_kv, D),
                                            v.transpose(1, 2).reshape(B * T, n_kv, D), kc, vc, slots, isa, 1.0, 1.0,
                                            "auto")
    query = q.transpose(1, 2).reshape(B * T, H, D)
    out = query.new_empty(query.shape)  # contiguous: [B, T, H, D] below, whatever layout q came in
    torch.ops._C.cpu_attention_with_kv_cache(query, kc, vc, out, query_start, seq_lens, D ** -0.5, True, None, -1,
                                             block_table, 0.0, schedule, None, None, 1.0, 1.0, "auto")
    return out.view(B, T, H, D).transpose(1, 2)


@torch.library.custom_op("bebop::paged_attention", mutates_args=("k_cache", "v_cache"))
def paged_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slots: torch.Tensor, query_start: torch.Tensor, seq_lens: torch.Tensor,
                       block_table: torch.Tensor, schedule: torch.Tensor, isa: str) -> torch.Tensor:
    """paged_attention as one op for the compiler: [B, H, T, D] as a view of the kernel's [B, T, H, D] output,
    as its fake says. (Laid out as [B, H, T, D] instead, the heads' outputs had to be transposed back for the
    output projection, and whether that needs a copy depends on T = 1: every graph was guarded on it.)"""
    return paged_attention(q, k, v, k_cache, v_cache, slots, query_start, seq_lens, block_table, schedule, isa)


@paged_attention_op.register_fake
def _(q, *args):
    B, H, T, D = q.shape
    return q.new_empty(B, T, H, D).transpose(1, 2)


def step_positions(cache: KVCache, T: int, n_heads: int = 0):
    """Positions [B, T] of T new tokens per row, and the additive causal bias [B, 1, T, S] over the cache
    (0 where a row may attend, -inf elsewhere), built once per forward in the cache's dtype (every layer and
    every attention kernel takes it as is); for a paged cache, a PagedStep (for `n_heads` query heads)
    instead of the bias."""
    device = cache.lengths.device
    positions = cache.lengths.unsqueeze(1) + torch.arange(T, device=device)
    if cache.paged:
        return positions, PagedStep.build(cache, positions, n_heads)
    S = int(positions.max()) + 1
    allowed = torch.arange(S, device=device).view(1, 1, 1, S) <= positions.view(-1, 1, T, 1)
    bias = torch.zeros(allowed.shape, dtype=cache.dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return positions, bias


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
                       paged=self.attention[0] == PAGED)

    def rope(self, positions):
        return self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: KVCache, capture: tuple[int, ...] = ()):
        """Run T new tokens per row [B, T] after each row's cached prefix. Returns the last layer's hidden
        states [B, T, dim] before the final norm (what an MTP module consumes); with `capture` (layer indices,
        -1 for the embeddings), also those layers' outputs concatenated [B, T, len(capture) * dim] (an EAGLE-3
        draft's input). The
        cache lengths are NOT advanced: the caller commits as many positions per row as it keeps.
        With `compiled` set, decode and verify forwards (up to DECODE_MAX_T new tokens) run the layers through
        torch.compile (bebop.models.compiled); prompts run eagerly."""
        positions, bias = step_positions(cache, tokens.shape[1], self.cfg.n_heads)
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
        kept = {-1: x} if -1 in capture else {}
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
        return model.to(next(hf_model.parameters()).dtype).eval().requires_grad_(False)


def run_layers(model: Decoder, tokens, k_caches, v_caches, positions, bias, capture):
    """Decoder.forward after its positions and bias: the rope, the embedding and the layer stack (what
    bebop.models.compiled compiles). Returns the last hidden states, and with `capture` also the list of the
    captured layers' outputs."""
    # (the rope and the row indices are made here, so that their broadcast dimensions of size 1 are constants of
    # a compiled graph: as inputs over a paged cache their size would be a symbol, not taken to be 1)
    cos, sin = model.rope(positions)
    rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1)
    x = model.embed(tokens)
    outputs = [x]  # the embeddings, then each layer's output: capture index i is outputs[i + 1]
    for i, layer in enumerate(model.layers):
        x = layer(x, cos, sin, k_caches[i], v_caches[i], positions, rows, bias, model.attention)
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
