"""Our Decoder (built from a transformers model by `Decoder.from_hf`) against transformers itself: full-prompt
logits through the KV cache, the same prompt fed in uneven chunks, and right-padded ragged batches whose rows
sit at different positions -- the shapes the engine produces (prefill, then verify steps of K+1 tokens)."""

import json

import pytest
import torch
import torch.nn.functional as F

from bebop.errors import BebopError
from bebop.models import cpu, registry
from bebop.models.decoder import Decoder
from bebop.models.kernels import ATTENTION_KINDS, PAGED, paged_runs

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


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("attention", [(a, a) for a in ATTENTION_KINDS] + [("sdpa", "folded")])
def test_ragged_right_padded_batch(trio, attention, packed, monkeypatch):
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
    # 3 tokens per row (padded where a row has fewer left), each row advancing by its own count; `packed`:
    # the step says which tokens are padding (`valid`, as a draft length per row does), and the per-token work
    # runs on the others only
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
        valid = torch.arange(3) < torch.tensor(take).unsqueeze(1) if packed else None
        before = cache.k[0].clone()
        lg = model.logits(model(step, cache, valid=valid))
        for i in range(B):
            got[i].append(lg[i, :take[i]])
            if packed and not cache.paged:  # the padding's work was skipped: nothing written past its tokens
                past = slice(pos[i] + take[i], pos[i] + 3)
                assert torch.equal(cache.k[0][i, :, past], before[i, :, past])
            pos[i] += take[i]
        cache.lengths += torch.tensor(take)
    for i in range(B):
        check_close(torch.cat(got[i]), refs[i], f"ragged chunked row {i}")


@pytest.mark.parametrize("paged", [False, True], ids=["plain-cache", "paged-cache"])
@pytest.mark.parametrize("lens", [[1, 4, 2], [0, 3, 1]], ids=["every-row-verifies", "a-row-without-tokens"])
def test_a_packed_step_equals_the_padded_one(trio, lens, paged, monkeypatch):
    """A step whose rows have their own numbers of new tokens: packed (the per-token work on those only, the
    attention of each row's first token apart from its others', or padded where a row has none; over a paged
    cache, vLLM's kernel on each row's own number of queries) gives the padded step's outputs and cache entries
    at every real token."""
    _, model, tok = trio
    if paged:
        if not paged_runs(model.embed.weight.dtype, model.embed.weight.device, model.cfg.head_dim):
            pytest.skip(f"vLLM's CPU attention does not run this model here ({cpu.describe()})")
        monkeypatch.setattr(model, "attention", (PAGED, PAGED))
    assert model.packs(model.new_cache(1, 8))  # (eager: every cache packs)
    seqs = [registry.chat_ids(tok, t) for t in TEXTS]
    B = len(seqs)
    caches = [model.new_cache(B, 64 + 8) for _ in range(2)]
    for cache in caches:
        for i, ids in enumerate(seqs):
            model(torch.tensor([ids[:20]]), one := model.new_cache(1, 64 + 8))
            cache.write_rows(torch.tensor([i]), one, torch.tensor([0]))
            cache.lengths[i] = len(ids[:20]) - 3 * i  # rows at different positions
    step = torch.randint(model.cfg.vocab_size, (B, 4), generator=torch.Generator().manual_seed(0))
    valid = torch.arange(4) < torch.tensor(lens).unsqueeze(1)
    padded, packed = model(step, caches[0]), model(step, caches[1], valid=valid)
    assert torch.allclose(padded[valid], packed[valid], atol=1e-4)
    b, t = valid.nonzero(as_tuple=True)
    at = caches[0].lengths[b] + t
    if not paged:
        assert torch.allclose(caches[0].k[-1][b, :, at], caches[1].k[-1][b, :, at], atol=1e-4)
    # (a paged cache lays a block out as the kernel likes: its entries are read back by the next step)
    for cache in caches:
        cache.lengths += torch.tensor(lens)
    after = [model(step[:, :1], cache) for cache in caches]
    assert torch.allclose(after[0], after[1], atol=1e-4)


def test_unknown_model_name():
    with pytest.raises(BebopError, match="unknown model"):
        registry.load_hf("no-such-model-xyz")
    with pytest.raises(BebopError):
        registry.load_model("no-such-model-xyz", dtype="float32")


def test_directory_without_config(tmp_path):
    with pytest.raises(BebopError, match="config.json"):
        registry.load_hf(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8)
    with pytest.raises(BebopError):
        registry.load_model(str(tmp_path), dtype="float32")


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
    model, _ = registry.load_model(str(tmp_path), dtype="float32")
    assert model.max_len == 300
    assert registry.load_model("tiny-llama", dtype="float32")[0].max_len == 4096
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
        registry.load_model(str(tmp_path), dtype="float32")


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
