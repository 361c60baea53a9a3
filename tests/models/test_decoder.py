"""Our Decoder (built from a transformers model by `Decoder.from_hf`) against transformers itself: full-prompt
logits through the KV cache, the same prompt fed in uneven chunks, and right-padded ragged batches whose rows
sit at different positions -- the shapes the engine produces (prefill, then verify steps of K+1 tokens)."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from bebop.errors import BebopError
from bebop.models import cpu, registry
from bebop.models.decoder import ATTENTION, ATTENTION_KINDS, DECODE_MAX_T, Decoder

NAMES = ["tiny-llama", "tiny-qwen3", "smollm2-135m"]
ATOL = 2e-3
TEXTS = ["What is the capital of France?", "Hi", "Write a short poem about the sea, please, in three lines."]


@pytest.fixture(scope="module", params=NAMES)
def trio(request, load_models):
    return load_models(request.param)


def hf_logits(hf, ids):
    """transformers' fp32 logits [S, V] for one unpadded sequence."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def check_close(ours, ref, what):
    diff = (ours - ref).abs().max().item()
    assert diff < ATOL, f"{what}: max |logit diff| {diff:.2e}"
    mismatch = (ours.argmax(-1) != ref.argmax(-1)).nonzero().flatten().tolist()
    assert not mismatch, f"{what}: argmax differs at positions {mismatch}"


def test_load_hf_gives_model_and_tokenizer(trio):
    hf, model, tok = trio
    assert isinstance(model, Decoder)
    assert hf.config.model_type in registry.SUPPORTED_TYPES
    assert model.cfg.vocab_size == hf.config.vocab_size
    assert next(hf.parameters()).dtype == torch.float32 and model.embed.weight.dtype == torch.float32
    ids = registry.chat_ids(tok, TEXTS[0])
    assert tok.decode(ids).count(TEXTS[0]) == 1  # the chat template wraps the message, tokens round-trip
    assert model.eos_ids and all(0 <= e < model.cfg.vocab_size for e in model.eos_ids)
    if model.cfg.tie_embeddings:
        assert model.lm_head.weight is model.embed.weight
    else:
        torch.testing.assert_close(model.lm_head.weight, hf.lm_head.weight, rtol=0, atol=0)


def test_cached_forward_matches_transformers(trio):
    hf, model, tok = trio
    ids = registry.chat_ids(tok, TEXTS[0])
    ref = hf_logits(hf, ids)
    cache = model.new_cache(1, len(ids) + 4)
    hidden = model(torch.tensor([ids]), cache)
    check_close(model.logits(hidden)[0], ref, "one cached forward")
    # the uncached training path agrees too
    check_close(model.logits(model.forward_full(torch.tensor([ids])))[0], ref, "forward_full")


def test_chunked_prompt_through_kv_cache(trio):
    hf, model, tok = trio
    ids = registry.chat_ids(tok, TEXTS[2])
    ref = hf_logits(hf, ids)
    cache = model.new_cache(1, len(ids) + 8)
    # garbage written past the committed length (a rejected draft) must be overwritten, never attended to
    chunks, out, start = [5, 1, 7, 2, 3, 1, 11], [], 0
    while start < len(ids):
        n = chunks[len(out) % len(chunks)]
        piece = ids[start:start + n]
        junk = torch.randint(0, model.cfg.vocab_size, (1, 3), generator=torch.Generator().manual_seed(start))
        model(torch.cat([torch.tensor([piece]), junk], 1), cache)  # a speculative forward, then rolled back
        out.append(model.logits(model(torch.tensor([piece]), cache))[0])
        cache.lengths += len(piece)
        start += len(piece)
    assert int(cache.lengths[0]) == len(ids)
    check_close(torch.cat(out), ref, "chunked")


@pytest.mark.parametrize("attention", [(a, a) for a in ATTENTION_KINDS] + [("sdpa", "folded")])
def test_ragged_right_padded_batch(trio, attention, monkeypatch):
    hf, model, tok = trio
    monkeypatch.setattr(model, "attention", attention)  # steps of 1-3 tokens take the chosen decode kernels
    seqs = [registry.chat_ids(tok, t) for t in TEXTS]
    assert len({len(s) for s in seqs}) == len(seqs)
    refs = [hf_logits(hf, s) for s in seqs]
    B, L = len(seqs), max(map(len, seqs))
    pad = torch.full((B, L), 7, dtype=torch.long)  # a real token as padding: it must not leak into any row
    for i, s in enumerate(seqs):
        pad[i, :len(s)] = torch.tensor(s)

    # (a) one right-padded prefill
    cache = model.new_cache(B, L + 4)
    logits = model.logits(model(pad, cache))
    for i, s in enumerate(seqs):
        check_close(logits[i, :len(s)], refs[i], f"ragged prefill row {i}")

    # (b) rows at different positions: a ragged prefill of a different-size prefix per row, then steps of
    # 3 tokens per row (padded where a row has fewer left), each row advancing by its own count
    cache = model.new_cache(B, L + 8)
    first = [4, 9, 1]
    got = [[] for _ in seqs]
    prefix = torch.full((B, max(first)), 7, dtype=torch.long)
    for i, s in enumerate(seqs):
        prefix[i, :first[i]] = torch.tensor(s[:first[i]])
    lg = model.logits(model(prefix, cache))
    for i in range(B):
        got[i].append(lg[i, :first[i]])
    cache.lengths = torch.tensor(first)
    pos = list(first)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        step = torch.full((B, 3), 7, dtype=torch.long)
        take = [min(3, len(s) - p) for p, s in zip(pos, seqs)]
        for i, s in enumerate(seqs):
            if take[i]:
                step[i, :take[i]] = torch.tensor(s[pos[i]:pos[i] + take[i]])
        lg = model.logits(model(step, cache))
        for i in range(B):
            got[i].append(lg[i, :take[i]])
            pos[i] += take[i]
        cache.lengths += torch.tensor(take)
    for i in range(B):
        check_close(torch.cat(got[i]), refs[i], f"ragged chunked row {i}")


@pytest.mark.parametrize("kernel", ATTENTION_KINDS)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_decode_attention_kernels_equal_sdpa(kernel, dtype, atol):
    """Every decode kernel computes SDPA's function: random GQA inputs, ragged rows (each its own cache length,
    stale values past it), the causal bias that step_positions builds; against an fp64 reference and SDPA."""
    from bebop.models.decoder import KVCache, step_positions

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


def test_unknown_model_name():
    with pytest.raises(BebopError, match="unknown model"):
        registry.load_hf("no-such-model-xyz")
    with pytest.raises(BebopError):
        registry.load_model("no-such-model-xyz")


def test_directory_without_config(tmp_path):
    with pytest.raises(BebopError, match="config.json"):
        registry.load_hf(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8)
    with pytest.raises(BebopError):
        registry.load_model(str(tmp_path))


def test_directory_with_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(BebopError, match="not supported"):
        registry.load_hf(str(tmp_path))


def test_context_length_comes_from_the_config(tmp_path, load_models):
    hf, _, tok = load_models("tiny-qwen3")
    old, hf.config.max_position_embeddings = hf.config.max_position_embeddings, 300
    try:
        hf.save_pretrained(tmp_path)
    finally:
        hf.config.max_position_embeddings = old
    tok.save_pretrained(tmp_path)
    model, _ = registry.load_model(str(tmp_path))
    assert model.max_len == 300
    assert registry.load_model("tiny-llama")[0].max_len == 4096
    smollm2 = registry.cache_dir() / "smollm2-135m" / "config.json"
    if smollm2.exists():  # SmolLM2's own config (the cached copy; not loaded here, that costs seconds)
        assert json.loads(smollm2.read_text())["max_position_embeddings"] == 8192


@pytest.mark.parametrize("broken", ["config", "weights", "tokenizer"])
def test_broken_model_directory_is_one_clear_error(tmp_path, load_models, broken):
    hf, _, tok = load_models("tiny-llama")
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    if broken == "config":
        (tmp_path / "config.json").write_text('{"model_type": "llama", ')
    elif broken == "weights":
        (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    else:
        for f in tmp_path.glob("tokenizer*"):
            f.unlink()
    with pytest.raises(BebopError, match="config.json is unreadable|cannot load model|no tokenizer"):
        registry.load_model(str(tmp_path))


@pytest.mark.parametrize("kind", ["packed", "amx", "onednn", "amx:4,onednn"])
def test_a_fast_linear_computes_what_f_linear_does(load_models, kind):
    """bf16 weights kept in a faster kernel's layout (Decoder.linear = "packed": oneDNN's; "amx": vLLM's AMX
    GEMM; "onednn": vLLM's oneDNN matmul; or a kernel per row count): the same logits as plain F.linear on
    decode steps and a prefill, rebuilt after an in-place weight update and after .to(), and never used where
    gradients are wanted (training takes the autograd path). test_dtype.py pretends a CPU without them."""
    from bebop.models.decoder import Linear, amx_weights, linear_rows, onednn_weights, packs_weights

    kinds = [k for _, k in linear_rows(kind)]
    runs = {"packed": packs_weights, "amx": amx_weights, "onednn": onednn_weights}

    def runs_here(dtype, device):
        return all(runs[k](dtype, device) for k in kinds)

    if not runs_here(torch.bfloat16, torch.device("cpu")):
        pytest.skip(f"this CPU ({cpu.describe()}) cannot run {kind} bf16 linears (vLLM installed: "
                    f"{cpu.vllm_cpu_ops()})")
    _, model, _ = load_models("tiny-llama")
    model = copy.deepcopy(model).to(torch.bfloat16)
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
    model.float()  # fp32 has nothing to pack: plain products, no stale bf16 copy
    assert "_packed" not in model.layers[0].w13.__dict__
    torch.testing.assert_close(run()[0], plain_after[0], rtol=0.05, atol=0.05)
    model.to(torch.bfloat16)
    with torch.enable_grad():
        x = torch.randn(2, model.cfg.dim, dtype=torch.bfloat16, requires_grad=True)
        model.layers[0].wo(x).sum().backward()  # the packed path has no backward: this must be F.linear
    assert x.grad is not None


def test_a_linear_kind_per_row_count_is_parsed_and_checked():
    from bebop.models.decoder import linear_rows

    assert linear_rows("amx") == ((math.inf, "amx"),)
    assert linear_rows("amx:1,onednn:4,amx") == ((1, "amx"), (4, "onednn"), (math.inf, "amx"))
    for bad in ("fast", "amx:4", "amx,onednn", "amx:x,onednn", "amx:4,turbo"):
        with pytest.raises(ValueError, match="unknown linear kind"):
            linear_rows(bad)


def test_rms_norm_with_vllms_kernel_equals_torchs():
    """Where vLLM's CPU kernels are loaded, a bf16 RMSNorm outside autograd runs vLLM's kernel: the same
    values as F.rms_norm (both accumulate in fp32), also on a non-contiguous input (q/k heads); with gradients
    it is F.rms_norm."""
    from bebop.models.decoder import RMSNorm

    if not (torch.cpu._is_avx512_bf16_supported() and cpu.vllm_cpu_ops()):
        pytest.skip(f"vLLM's CPU kernels are not loaded on this CPU ({cpu.describe()})")
    norm = RMSNorm(64, 1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 2, 64, dtype=torch.bfloat16).transpose(1, 2)  # [3, 2, 5, 64], not contiguous
    with torch.no_grad():
        got = norm(x)
    want = F.rms_norm(x.float(), (64,), norm.weight.float(), 1e-5)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got, F.rms_norm(x, (64,), norm.weight, 1e-5), rtol=8e-3, atol=8e-3)
    assert (got.float() - want).abs().max() < 0.05 and not torch.equal(got, torch.zeros_like(got))
    x.requires_grad_(True)
    norm(x).sum().backward()
    assert x.grad is not None


def test_paged_attention_computes_what_sdpa_does(vllm_model_dir):
    """vLLM's CPU attention over a paged cache (attention kind "paged"): logits as close to an fp32 SDPA
    reference as bf16 SDPA's own, over a prefill, ragged rows, decode and verification steps, rows moved by
    keep_rows and rows copied in by write_rows (continuous batching); its cache is paged, the others' not."""
    from bebop.models.decoder import PAGE, paged_runs

    bf16, _ = registry.load_model(vllm_model_dir, dtype="bfloat16")
    if not paged_runs(torch.bfloat16, torch.device("cpu"), bf16.cfg.head_dim):
        pytest.skip(f"vLLM's CPU attention does not run on this CPU ({cpu.describe()})")
    bf16.linear = "plain"
    fp32 = copy.deepcopy(bf16).float()
    g = torch.Generator().manual_seed(0)
    V = bf16.cfg.vocab_size
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
    paged, sdpa = run(bf16, ("paged", "paged")), run(bf16, ("sdpa", "sdpa"))
    for p, s_, r in zip(paged, sdpa, ref):
        err_paged, err_sdpa = (p - r).abs().max().item(), (s_ - r).abs().max().item()
        assert err_paged <= 2 * err_sdpa + 0.02, (err_paged, err_sdpa)
    assert PAGE % 32 == 0  # the kernel reads blocks of a multiple of 32 positions


def test_kv_cache_layers_share_no_storage():
    """Each layer's K and V buffer is an allocation of its own: writes through views of one base are what
    torch.compile miscompiled (bebop.models.compiled)."""
    from bebop.models.decoder import KVCache

    for paged in (False, True):
        cache = KVCache(3, 2, 1, 40, 4, paged=paged)
        cache.keep_rows(torch.tensor([1]))
        bases = {t.untyped_storage().data_ptr() for t in cache.k + cache.v}
        assert len(bases) == 6


def test_kv_cache_keep_rows_moves_only_what_changes_place():
    from bebop.models.decoder import KVCache

    cache = KVCache(2, 5, 1, 4, 3)
    for k, v in zip(cache.k, cache.v):  # every entry of row r holds r
        k.copy_(torch.arange(5.0).view(5, 1, 1, 1).expand_as(k))
        v.copy_(-k)
    cache.lengths = torch.tensor([10, 11, 12, 13, 14])
    for rows, want in ((torch.tensor([0, 4, 2]), [0, 4, 2]), (torch.tensor([2, 0]), [2, 0]), (torch.tensor([1]), [0])):
        cache.keep_rows(rows)
        assert all(k.shape[0] == len(rows) and k.is_contiguous() for k in cache.k)
        assert [int(cache.k[1][i].unique()) for i in range(len(rows))] == want  # rows as named, each whole
        for k, v in zip(cache.k, cache.v):
            torch.testing.assert_close(v, -k)
    assert cache.lengths.tolist() == [10]  # [10, 14, 12] -> [12, 10] -> [10]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_bit_identical_to_transformers_rotate_half(dtype):
    """The sign of rotate_half lives in our sin table; the products and the sum are the same IEEE operations."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from bebop.models.decoder import DecoderConfig, apply_rope, rope_tables

    cfg = DecoderConfig(vocab_size=8, dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, hidden_dim=8)
    cos, signed_sin = rope_tables(cfg, 50)
    positions = torch.tensor([[3, 4, 5], [40, 41, 49]])
    c, s = cos[positions].unsqueeze(1).to(dtype), signed_sin[positions].unsqueeze(1).to(dtype)
    sin = torch.cat([s[..., 16:], s[..., 16:]], -1)  # the plain sin table transformers uses
    q, k = torch.randn(2, 2, 3, 32, dtype=dtype), torch.randn(2, 1, 3, 32, dtype=dtype)
    ref_q, ref_k = apply_rotary_pos_emb(q, k, c.squeeze(1), sin.squeeze(1))
    assert torch.equal(apply_rope(q, c, s), ref_q) and torch.equal(apply_rope(k, c, s), ref_k)
