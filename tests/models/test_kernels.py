"""bebop.models.kernels: every attention kernel computes SDPA's function, every fast linear F.linear's, and
vLLM's paged CPU attention what SDPA does over the same prompts."""

import copy
import gc
import math

import pytest
import torch
import torch.nn.functional as F

from bebop.models import cpu, registry
from bebop.models.cache import KVCache, step_positions
from bebop.models.kernels import (ATTENTION, ATTENTION_KINDS, DECODE_MAX_T, LINEAR_KINDS, PAGE, Linear, amx_weights,
                                  linear_rows, onednn_weights, packs_weights, paged_runs)


@pytest.mark.parametrize("kernel", ATTENTION_KINDS)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_decode_attention_kernels_equal_sdpa(kernel, dtype, atol):
    """Every decode kernel computes SDPA's function: random GQA inputs, ragged rows (each its own cache length,
    stale values past it), the causal bias that step_positions builds; against an fp64 reference and SDPA."""
    attend = ATTENTION[kernel]
    g = torch.Generator().manual_seed(3)
    B, H, Hkv, D, L = 5, 8, 2, 16, 40
    for T in (1, 4, DECODE_MAX_T):
        cache = KVCache(1, B, Hkv, L, D, dtype)
        cache.k[0].normal_(generator=g)
        cache.v[0].normal_(generator=g)
        cache.lengths = torch.randint(0, L - T, (B,), generator=g)
        positions, bias = step_positions(cache, T)
        S = bias.shape[-1]
        assert S == int(cache.lengths.max()) + T and bias.dtype == dtype
        q = (3 * torch.randn(B, H, T, D, generator=g)).to(dtype)  # peaked softmaxes, as trained models have
        k, v = cache.k[0][:, :, :S], cache.v[0][:, :, :S]
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                               attn_mask=bias.double(), enable_gqa=True)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
        ours = attend(q, k, v, bias)
        assert ours.dtype == dtype and ours.shape == (B, H, T, D)
        torch.testing.assert_close(ours.double(), ref, rtol=0, atol=atol)
        torch.testing.assert_close(ours.double(), sdpa.double(), rtol=0, atol=2 * atol)
        # entries past a row's positions are never attended: changing them changes nothing
        cache.v[0][0, :, int(positions[0, -1]) + 1:] = 1e4
        torch.testing.assert_close(attend(q, k, cache.v[0][:, :, :S], bias), ours, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["packed", "amx", "onednn", "amx:4,onednn"])
def test_a_fast_linear_computes_what_f_linear_does(load_models, kind):
    """bf16 weights kept in a faster kernel's layout (Decoder.linear = "packed": oneDNN's; "amx": vLLM's AMX
    GEMM; "onednn": vLLM's oneDNN matmul; or a kernel per row count): the same logits as plain F.linear on
    decode steps and a prefill, rebuilt after an in-place weight update and after .to(), and never used where
    gradients are wanted (training takes the autograd path). test_dtype.py pretends a CPU without them."""
    kinds = [k for _, k in linear_rows(kind)]
    runs = {"packed": packs_weights, "amx": amx_weights, "onednn": onednn_weights}

    def runs_here(dtype, device):
        return all(runs[k](dtype, device) for k in kinds)

    if not runs_here(torch.bfloat16, torch.device("cpu")):
        pytest.skip(f"this CPU ({cpu.describe()}) cannot run {kind} bf16 linears (vLLM installed: "
                    f"{cpu.vllm_cpu_ops()})")
    _, model, _ = load_models("tiny-llama")
    model = copy.deepcopy(model).to(torch.bfloat16)
    if "amx" in kinds:  # (packed and onednn multiply fp32 too: test_fast_fp32_linears_compute_what_f_linear_does)
        assert not runs_here(torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.cfg.vocab_size, (3, 11), generator=g)
    steps = [torch.randint(0, model.cfg.vocab_size, (3, t), generator=g) for t in (1, 4, 1)]

    def run():
        cache, out = model.new_cache(3, 32), []
        for tokens in [prompt, *steps]:
            out.append(model.logits(model(tokens, cache)))
            cache.lengths += tokens.shape[1]
        return out

    def same(a, b):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-2, atol=1e-2)

    model.linear = "plain"
    plain = run()
    model.linear = kind
    assert model.linear == kind and all(m.kind == kind for m in model.modules() if isinstance(m, Linear))
    same(run(), plain)
    # the fast copies are what ran: with a kernel per row count, amx for the 3-row decode steps, onednn for the
    # 33-row prefill and the 12-row verification
    assert set(model.layers[0].w13.__dict__["_packed"]) == set(kinds)
    with torch.no_grad():
        model.layers[0].w13.weight.mul_(2)  # an optimiser step or weight sync: in place
    packed_after = run()
    model.linear = "plain"
    plain_after = run()
    same(packed_after, plain_after)
    assert (plain_after[0] - plain[0]).abs().max() > 0.1  # the update changed the model: a stale copy would show
    model.linear = kind
    model.float()  # no stale bf16 copy (fp32 is packed afresh where oneDNN packs it, plain products elsewhere)
    assert "_packed" not in model.layers[0].w13.__dict__
    torch.testing.assert_close(run()[0], plain_after[0], rtol=0.05, atol=0.05)
    model.to(torch.bfloat16)
    with torch.enable_grad():
        x = torch.randn(2, model.cfg.dim, dtype=torch.bfloat16, requires_grad=True)
        model.layers[0].wo(x).sum().backward()  # the packed path has no backward: this must be F.linear
    assert x.grad is not None


@pytest.mark.parametrize("kind", ["packed", "onednn"])
def test_fast_fp32_linears_compute_what_f_linear_does(load_models, kind):
    """fp32 weights in oneDNN's layout, torch's packed linear or vLLM's oneDNN matmul (what the dtype probe may
    pick on an AVX2-only CPU): the logits of decode steps and a prefill agree with F.linear's to float rounding,
    from the fast copies, rebuilt after an in-place update (an optimiser step or weight sync)."""
    runs = {"packed": packs_weights, "onednn": onednn_weights}[kind]
    if not runs(torch.float32, torch.device("cpu")):
        pytest.skip(f"this CPU ({cpu.describe()}) cannot run {kind} fp32 linears (vLLM's kernels loaded: "
                    f"{cpu.vllm_cpu_ops()})")
    _, model, _ = load_models("tiny-llama")
    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, model.cfg.vocab_size, (3, t), generator=g) for t in (11, 1, 4, 1)]

    def run():
        cache, out = model.new_cache(3, 32), []
        for tokens in batches:
            out.append(model.logits(model(tokens, cache)))
            cache.lengths += tokens.shape[1]
        return out

    for update in (False, True):
        if update:
            with torch.no_grad():
                model.layers[0].w13.weight.mul_(2)
        model.linear = "plain"
        plain = run()
        model.linear = kind
        packed = run()
        assert kind in model.layers[0].w13.__dict__["_packed"]
        for a, b in zip(packed, plain):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # (after the update, a stale copy would not)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_copied_linear_builds_its_own_fast_weights(dtype):
    """copy.deepcopy of a model (the RL reference model, a dtype probe's copies, a draft copied with the
    history it keeps costs for) leaves the fast copies behind: a OneDNNMatmul's handler released by one
    object's copy left the other's dangling, and the process crashed later. Every fast kind that runs here
    is built, the layer copied, the copy dropped, and the original still computes F.linear's result."""
    layer = Linear(64, 96).to(dtype)
    x = torch.randn(5, 64, dtype=dtype)
    kinds = [k for k in LINEAR_KINDS if k != "plain" and layer.fast(k) is not None]
    layer.__dict__.setdefault("_packed", {})["unrunnable"] = (None, object())  # (what any machine can check)
    twin = copy.deepcopy(layer)
    assert "_packed" not in twin.__dict__ and set(layer.__dict__["_packed"]) == {*kinds, "unrunnable"}
    del twin
    gc.collect()
    layer.__dict__["_packed"].pop("unrunnable")
    for kind in kinds:
        layer.kind, layer.rows = kind, linear_rows(kind)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=2e-2, atol=2e-2)


def test_a_linear_kind_per_row_count_is_parsed_and_checked():
    assert linear_rows("amx") == ((math.inf, "amx"),)
    assert linear_rows("amx:1,onednn:4,amx") == ((1, "amx"), (4, "onednn"), (math.inf, "amx"))
    for bad in ("fast", "amx:4", "amx,onednn", "amx:x,onednn", "amx:4,turbo"):
        with pytest.raises(ValueError, match="unknown linear kind"):
            linear_rows(bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paged_attention_computes_what_sdpa_does(vllm_model_dir, dtype):
    """vLLM's CPU attention over a paged cache (attention kind "paged"): logits as close to an fp32 SDPA
    reference as SDPA's own in the same dtype (fp32: to float rounding), over a prefill, ragged rows, decode and
    verification steps, rows moved by keep_rows and rows copied in by write_rows (continuous batching); its
    cache is paged, the others' not."""
    model, _ = registry.load_model(vllm_model_dir, dtype="bfloat16")
    if not paged_runs(dtype, torch.device("cpu"), model.cfg.head_dim):
        pytest.skip(f"vLLM's CPU attention does not run {dtype} on this CPU ({cpu.describe()})")
    model.linear = "plain"
    fp32 = copy.deepcopy(model).float()
    model = model.to(dtype)
    g = torch.Generator().manual_seed(0)
    V = model.cfg.vocab_size
    prompt = torch.randint(0, V, (3, 37), generator=g)
    steps = [torch.randint(0, V, (3, t), generator=g) for t in (1, 4, 1, 12)]
    extra = torch.randint(0, V, (1, 9), generator=g)

    def run(model, attention):
        model.attention = attention
        cache, out = model.new_cache(3, 80), []
        assert cache.paged == (attention[0] == "paged")
        out.append(model.logits(model(prompt, cache)))
        cache.lengths += 37
        cache.lengths[1] -= 5  # rows of different lengths
        for tokens in steps:
            out.append(model.logits(model(tokens, cache)))
            cache.lengths += tokens.shape[1]
        cache.keep_rows(torch.tensor([2, 0]))  # a finished row
        fresh = model.new_cache(1, 9)
        model(extra, fresh)
        fresh.lengths += 9
        cache.write_rows(torch.tensor([1]), fresh, torch.tensor([0]))  # a new request in row 1
        out.append(model.logits(model(steps[0][:2], cache)))
        return out

    ref = run(fp32, ("sdpa", "sdpa"))
    paged, sdpa = run(model, ("paged", "paged")), run(model, ("sdpa", "sdpa"))
    for p, s_, r in zip(paged, sdpa, ref):
        err_paged, err_sdpa = (p - r).abs().max().item(), (s_ - r).abs().max().item()
        assert err_paged <= 2 * err_sdpa + (0.02 if dtype == torch.bfloat16 else 1e-4), (err_paged, err_sdpa)
    assert PAGE % 32 == 0  # the kernel reads blocks of a multiple of 32 positions
