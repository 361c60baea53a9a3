"""`bebop.engine.generation.generate` end to end on the tiny random models (and SmolLM2 at temperature 0).

A random tiny model is nearly uniform, which would hide sampling bugs, so the distribution tests use a
sharpened copy (its LM head scaled up: entropy far below log V) and an MTP whose q is sharp and clearly unlike
p. The exact distribution of the first three generated tokens is computed independently (one full forward
per continuation), and every mode is checked against it and against plain sampling; deliberately broken
engines must fail the same checks.
"""

import copy
import math

import numpy as np
import pytest
import torch

import bebop.engine.draft_len as autodraft
import bebop.engine.generation as engine
import bebop.engine.step as step
import bebop.sampling as sampling
from bebop.studies.exactness import goodness_of_fit as gof
from bebop.studies.exactness import two_sample
from bebop.drafts.eagle3 import new_eagle3
from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.models import cpu
from bebop.models.registry import chat_ids
from bebop.drafts.registry import default_mtp, new_mtp, shipped_draft
from bebop.sampling import SamplingParams, probabilities
from generation_helpers import (TEXTS, agreeable_mtp, assert_exact_and_like_ar, exact_marginals, scheduled, sharpened,
                                token_matrix)

P_OK, P_BAD = 1e-3, 1e-6


# ---------------------------------------------------------------------------------------------------------
# exactness: the distribution of generated tokens is the target's, whatever the draft


ROWS = 3000
SHARP = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def sharp(tiny_llama):
    """(sharpened model, MTP, prompt, exact marginals of tokens 0..2, ar generation)."""
    model = sharpened(tiny_llama[0], 8.0)
    mtp = agreeable_mtp(model)
    prompt = tiny_llama[1]("Hi!", add_special_tokens=False)["input_ids"]
    exact = exact_marginals(model, prompt, SHARP)
    ar = generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=11, eos_ids=[])
    return model, mtp, prompt, exact, ar


def test_ar_matches_exact_distribution(sharp):
    _, _, _, exact, ar = sharp
    toks = token_matrix(ar)
    for j in range(3):
        assert gof(toks[:, j], exact[j]) > P_OK, f"ar token {j}"


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_spec_matches_exact_distribution_and_ar(sharp, mode):
    model, mtp, prompt, exact, ar = sharp
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode=mode, draft=mtp, draft_len=2, seed=12, eos_ids=[],
                   trace=True)
    # the case exercises both acceptance and rejection, with a draft clearly unlike the target
    assert 0.2 < gen.stats.acceptance_rate < 0.9
    assert gen.stats.per_position_acceptance[1] > 0.05
    alpha = gen.trace["alpha"].mean()
    assert alpha < 0.9
    assert_exact_and_like_ar(model, gen, exact, ar, mode)


def test_spec_with_a_two_block_eagle3_mtp_matches_exact_distribution(sharp):
    """The engine feeds an MTP that reads several target layers (captured in the verify forward) and has two
    blocks (two KV cache layers): still the target's distribution."""
    model, _, prompt, exact, ar = sharp
    mtp = new_mtp(model, seed=2, layers=2, feature_layers=(0, 1))
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode="spec", draft=mtp, draft_len=2, seed=13, eos_ids=[])
    assert 0.05 < gen.stats.acceptance_rate < 0.95  # both acceptance and rejection happen
    toks = token_matrix(gen)
    for j in range(3):
        assert gof(toks[:, j], exact[j]) > P_OK, f"token {j} vs exact"


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_spec_with_an_eagle3_draft_matches_exact_distribution(sharp, mode):
    """An EAGLE-3 draft (three captured layers, its own head over a reduced vocabulary that leaves out half the
    target's tokens, so q = 0 where p > 0): still the target's distribution, tokens and pairs."""
    model, _, prompt, exact, ar = sharp
    draft = new_eagle3(model, seed=4)
    draft.set_draft_vocab(torch.arange(0, model.cfg.vocab_size, 2))
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode=mode, draft=draft, draft_len=2, seed=14, eos_ids=[])
    assert 0.05 < gen.stats.acceptance_rate < 0.95  # both acceptance and rejection happen
    assert_exact_and_like_ar(model, gen, exact, ar, f"eagle3 {mode}")


def test_spec_on_the_compiled_step_matches_exact_distribution_and_ar(sharp):
    """The compiled decode and verify step (bebop.models.compiled): plain and speculative sampling on it are
    distributed as the exact target distribution, and speculative as plain."""
    model, mtp, prompt, exact, _ = sharp
    model = copy.deepcopy(model)
    model.compiled = True
    ar = generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=14, eos_ids=[])
    toks = token_matrix(ar)
    for j in range(3):
        assert gof(toks[:, j], exact[j]) > P_OK, f"compiled ar token {j}"
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode="spec", draft=mtp, draft_len=2, seed=15, eos_ids=[])
    assert 0.2 < gen.stats.acceptance_rate < 0.9
    assert_exact_and_like_ar(model, gen, exact, ar, "compiled spec")


@pytest.mark.parametrize("kind,dtype", [(kind, torch.bfloat16) for kind in ("packed", "amx", "onednn", f"onednn:{ROWS},amx")]
                         + [(kind, torch.float32) for kind in ("packed", "onednn")])  # (amx: bf16 only)
def test_spec_on_fast_linears_matches_ar(sharp, kind, dtype):
    """Weights multiplied by a fast kernel (what --dtype auto picks: oneDNN's packed layout, vLLM's AMX GEMM or
    its oneDNN matmul, or a kernel per row count; bf16 on machines with native bf16, fp32 on any with the
    kernel, as on an AVX2-only CPU): speculative sampling is
    plain sampling on the same kernels, tokens and pairs. With a kernel per row count, onednn computes the
    prefill, the plain decoding steps and the drafts (up to 3,000 rows) and amx the verification (9,000):
    plain and speculative sampling then read the target's distributions from different kernels."""
    from bebop.models.kernels import amx_weights, linear_rows, onednn_weights, packs_weights

    runs = {"packed": packs_weights, "amx": amx_weights, "onednn": onednn_weights}
    if not all(runs[k](dtype, torch.device("cpu")) for _, k in linear_rows(kind)):
        pytest.skip(f"this CPU ({cpu.describe()}) cannot run {kind} {dtype} linears")
    model = copy.deepcopy(sharp[0]).to(dtype)
    model.linear = kind
    mtp, prompt = agreeable_mtp(model), sharp[2]
    ar = generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=21, eos_ids=[])
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode="spec", draft=mtp, draft_len=2, seed=22, eos_ids=[])
    assert 0.2 < gen.stats.acceptance_rate < 0.9  # both acceptance and rejection happen
    assert set(model.layers[0].w13.__dict__["_packed"]) == {k for _, k in linear_rows(kind)}  # what ran
    toks, ref = token_matrix(gen), token_matrix(ar)
    for j in range(3):
        assert two_sample(toks[:, j], ref[:, j]) > P_OK, f"{kind} token {j} vs ar"
    pairs = lambda t: t[:, 1] * model.cfg.vocab_size + t[:, 2]  # noqa: E731
    assert two_sample(pairs(toks), pairs(ref)) > P_OK, f"{kind} tokens (1, 2) vs ar"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_spec_on_paged_attention_matches_ar(vllm_model_dir, dtype):
    """vLLM's CPU attention over a paged cache (what --dtype auto picks where it is loaded and faster): on a
    sharpened model (bf16 or fp32) with a head size it supports, speculative sampling equals plain sampling on it
    (with a model's drafts, K for every row, and with a history's, each row its own number: a packed verify), and
    plain sampling on it equals plain sampling with SDPA over the usual cache (tokens and pairs)."""
    from bebop.drafts.history import HistoryDraft
    from bebop.models.kernels import paged_runs
    from bebop.models.registry import load_model

    base, tok = load_model(vllm_model_dir, dtype=dtype)
    if not paged_runs(base.embed.weight.dtype, torch.device("cpu"), base.cfg.head_dim):
        pytest.skip(f"vLLM's CPU attention does not run {dtype} on this CPU ({cpu.describe()})")
    model = sharpened(base, 8.0)
    model.linear = "plain"
    prompt = tok("Hi!", add_special_tokens=False)["input_ids"]
    model.attention = ("sdpa", "sdpa")
    sdpa = token_matrix(generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=31, eos_ids=[]))
    model.attention = ("paged", "paged")
    mtp = agreeable_mtp(model)
    ar = token_matrix(generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=32, eos_ids=[]))
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode="spec", draft=mtp, draft_len=2, seed=33, eos_ids=[])
    assert 0.05 < gen.stats.acceptance_rate < 0.95  # both acceptance and rejection happen
    toks = token_matrix(gen)
    history = HistoryDraft(min_chain=0.0, learn=False)
    for i, r in enumerate(generate(model, [prompt] * 300, 3, SHARP, mode="ar", seed=34, eos_ids=[]).rollouts):
        history.add(prompt, r.tokens[:2 + i % 2])  # cut short: where it is the only match a row drafts one
    ragged = generate(model, [prompt] * ROWS, 4, SHARP, mode="spec", draft=history, draft_len=2, seed=35, eos_ids=[])
    assert 0.05 < ragged.stats.acceptance_rate < 0.95
    assert 1 < ragged.stats.drafted / ragged.stats.steps < 2  # some rows drafted one token, some two
    pairs = lambda t: t[:, 1] * model.cfg.vocab_size + t[:, 2]  # noqa: E731
    for label, a, b in (("spec vs ar, paged", toks, ar), ("ar paged vs ar sdpa", ar, sdpa),
                        ("history drafts vs ar, paged", token_matrix(ragged)[:, :3], ar)):
        for j in range(3):
            assert two_sample(a[:, j], b[:, j]) > P_OK, f"{label}: token {j}"
        assert two_sample(pairs(a), pairs(b)) > P_OK, f"{label}: tokens (1, 2)"
    assert len(set(sdpa[:, 0].tolist())) > 3  # the test has power: the first token varies


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_exactness_check_catches_a_wrong_residual(sharp, mode, monkeypatch):
    """An engine that resamples from p (not norm(max(p - q, 0))) after a rejection must fail the check."""
    model, mtp, prompt, exact, _ = sharp
    monkeypatch.setattr(sampling, "residual", lambda p, q, vocab_ids=None: p)
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode=mode, draft=mtp, draft_len=2, seed=13, eos_ids=[])
    toks = token_matrix(gen)
    assert min(gof(toks[:, j], exact[j]) for j in range(3)) < P_BAD


def test_exactness_check_catches_unverified_drafts(sharp, monkeypatch):
    """Emitting the drafts unverified (the draft's histogram) must differ from plain sampling."""
    model, mtp, prompt, exact, ar = sharp

    def accept_all(target_probs, draft_probs, draft_tokens, accept_u, final_u, vocab_ids=None, draft_lens=None,
                   proposed=None):
        B, K = draft_tokens.shape
        bonus = sampling.sample(target_probs[:, K], final_u)
        return torch.cat([draft_tokens, bonus[:, None]], 1), torch.full((B,), K)

    monkeypatch.setattr(step, "rejection_sample_uniform", accept_all)
    gen = generate(model, [prompt] * ROWS, 3, SHARP, mode="spec", draft=mtp, draft_len=2, seed=14, eos_ids=[])
    toks, ref = token_matrix(gen), token_matrix(ar)
    assert two_sample(toks[:, 1], ref[:, 1]) < P_BAD
    assert gof(toks[:, 1], exact[1]) < P_BAD


# ---------------------------------------------------------------------------------------------------------
# temperature 0: token-for-token equal to plain greedy decoding


# the compiled step on one model: that it computes what eager computes is tested per model in
# tests/models/test_compiled.py; here, that the engine drives it token for token as it drives eager
@pytest.mark.parametrize("name, compiled", [("tiny-llama", False), ("tiny-qwen3", False), ("tiny-llama", True)])
def test_temperature_zero_equals_ar_tiny(name, compiled, request):
    model, tok = request.getfixturevalue(name.replace("-", "_"))
    if compiled:  # the compiled decode and verify step (bebop.models.compiled)
        model = copy.deepcopy(model)
        model.compiled = True
    prompts = [chat_ids(tok, t) for t in TEXTS]
    greedy = SamplingParams(temperature=0)
    ar = generate(model, prompts, 24, greedy, mode="ar", seed=0, eos_ids=[])
    assert all(len(r.tokens) == 24 for r in ar.rollouts)
    accepted = rejected = 0
    for mtp in [new_mtp(model, 1), agreeable_mtp(model, 1.0, 0.0), new_eagle3(model, 1)]:
        for mode in ["spec", "spec-greedy"]:
            for K in [1, 3]:
                gen = generate(model, prompts, 24, greedy, mode=mode, draft=mtp, draft_len=K, seed=5, eos_ids=[])
                for i, (a, b) in enumerate(zip(ar.rollouts, gen.rollouts)):
                    assert b.tokens == a.tokens, f"{name} {mode} K={K} row {i}"
                    assert b.logprobs == [0.0] * 24
                accepted += gen.stats.accepted
                rejected += gen.stats.drafted - gen.stats.accepted
    assert accepted > 0 and rejected > 0  # both the multi-token and the correction path ran
    if name == "tiny-qwen3":  # its greedy output is not degenerate: acceptance lengths vary
        gen = generate(model, prompts, 24, greedy, mode="spec", draft=agreeable_mtp(model, 1.0, 0.0), draft_len=3,
                       seed=5, eos_ids=[])
        ppa = gen.stats.per_position_acceptance
        assert 0 < ppa[1] < ppa[0] < 1


def test_temperature_zero_equals_ar_smollm2(smollm2):
    model, tok = smollm2
    prompts = [chat_ids(tok, t) for t in ["What is the capital of France?", "Write a haiku about the sea.",
                                          "List three prime numbers, then explain why."]]
    greedy = SamplingParams(temperature=0)
    ar = generate(model, prompts, 24, greedy, mode="ar", seed=0, eos_ids=[])
    assert tok.decode(ar.rollouts[0].tokens).lstrip().startswith("The capital of France is Paris")
    # a fresh MTP, and both shipped drafts (the verify forward captures target layers for them): the default is
    # the EAGLE-3 one, the draft vLLM and SGLang load too
    assert default_mtp(model).arch == "eagle3"
    cases = [(new_mtp(model, 0), "spec", 24), (new_mtp(model, 0), "spec-greedy", 12), (default_mtp(model), "spec", 24),
             (shipped_draft(model, "mtp"), "spec", 24)]
    for mtp, mode, n in cases:  # (at temperature 0 the modes differ little: keep it short)
        gen = generate(model, prompts, n, greedy, mode=mode, draft=mtp, draft_len=3, seed=1, eos_ids=[])
        for i, (a, b) in enumerate(zip(ar.rollouts, gen.rollouts)):
            assert b.tokens == a.tokens[:n], f"{mode} row {i}: {tok.decode(b.tokens)!r} vs {tok.decode(a.tokens)!r}"
        assert gen.stats.drafted == 3 * gen.stats.steps > 0


# ---------------------------------------------------------------------------------------------------------
# batch independence, stopping, statistics


MODES = ["ar", "spec", "spec-greedy"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compiled", [False, True])
def test_rows_are_independent_of_the_batch(warm, mode, compiled):
    model, mtp, tok = warm
    if compiled:  # the compiled decode and verify step (bebop.models.compiled)
        model = copy.deepcopy(model)
        model.compiled = True
    texts = TEXTS + ["x", "Explain, in detail, how rejection sampling keeps the output distribution exact."]
    prompts = [chat_ids(tok, t) for t in texts]
    seeds = [101, 7, 55, 3, 1234]
    kw = dict(params=SamplingParams(temperature=1.0), mode=mode, draft=mtp, draft_len=3)
    free = generate(model, prompts, 16, seed=seeds, eos_ids=[], **kw)
    kw["eos_ids"] = np.argsort(np.bincount(token_matrix(free).ravel()))[-6:].tolist()  # rows stop at various steps
    batch = generate(model, prompts, 16, seed=seeds, **kw)
    assert len({len(r.tokens) for r in batch.rollouts}) > 1
    for i, p in enumerate(prompts):
        alone = generate(model, [p], 16, seed=[seeds[i]], **kw).rollouts[0]
        b = batch.rollouts[i]
        assert b.prompt_index == i
        assert b.tokens == alone.tokens, f"row {i}"
        assert b.stop_reason == alone.stop_reason
        np.testing.assert_allclose(b.logprobs, alone.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(b.entropies, alone.entropies, atol=1e-5, rtol=0)
    # the same batch in another order: each row follows its seed, not its place
    order = [3, 0, 4, 2, 1]
    shuffled = generate(model, [prompts[j] for j in order], 16, seed=[seeds[j] for j in order], **kw)
    for k, j in enumerate(order):
        assert shuffled.rollouts[k].tokens == batch.rollouts[j].tokens
    # and a different seed changes the output
    other = generate(model, prompts, 16, seed=[s + 1 for s in seeds], **kw)
    assert [r.tokens for r in other.rollouts] != [r.tokens for r in batch.rollouts]


def check_stats(gen, K, spec):
    st = gen.stats
    lengths = sum(len(r.tokens) for r in gen.rollouts)
    assert st.tokens == lengths
    if not spec:
        assert st.steps == st.drafted == st.accepted == 0 and st.per_position_acceptance == []
        assert st.mean_acceptance_length is None and st.acceptance_rate is None
        return
    assert st.draft_len == K and len(st.per_position_acceptance) == K
    assert st.drafted == K * st.steps
    assert 0 <= st.accepted <= st.drafted and sum(st.accepted_at) == st.accepted
    ppa = st.per_position_acceptance
    assert all(0 <= a <= 1 for a in ppa) and all(x >= y for x, y in zip(ppa, ppa[1:]))
    assert st.mean_acceptance_length == pytest.approx(1 + st.accepted / st.steps)
    assert st.acceptance_rate == pytest.approx(st.accepted / st.drafted)
    # each step emits 1 + accepted tokens (prefill adds one per row); truncation at EOS/limit only drops some
    assert lengths <= len(gen.rollouts) + st.steps + st.accepted
    s = st.summary()
    assert s["tokens"] == lengths and s["steps"] == st.steps


@pytest.mark.parametrize("mode", MODES)
def test_rows_stop_at_eos_and_length(warm, mode, monkeypatch):
    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS] * 4
    seed, K, limit = 3, 3, 14
    kw = dict(params=SamplingParams(), mode=mode, draft=mtp, draft_len=K, seed=seed)
    free = generate(model, prompts, limit, eos_ids=[], **kw)
    assert all(len(r.tokens) == limit and r.stop_reason == "length" for r in free.rollouts)
    check_stats(free, K, mode != "ar")
    counts = np.bincount(token_matrix(free).ravel())
    eos = [int(counts.argmax()), int(np.argsort(counts)[-2])]  # two frequent tokens as EOS
    stopped = generate(model, prompts, limit, eos_ids=eos, **kw)
    check_stats(stopped, K, mode != "ar")
    reasons = set()
    for f, s in zip(free.rollouts, stopped.rollouts):
        assert 1 <= len(s.tokens) <= limit
        first = next((i for i, t in enumerate(f.tokens) if t in eos), None)
        if first is None:
            assert s.tokens == f.tokens and s.stop_reason == "length"
        else:  # same seed: the same stream, cut right after the first EOS
            assert s.tokens == f.tokens[:first + 1]
            assert s.stop_reason == "eos"
        assert len(s.logprobs) == len(s.entropies) == len(s.tokens)
        reasons.add((s.stop_reason, len(s.tokens) < limit))
    assert ("eos", True) in reasons and ("length", False) in reasons
    # the model's own EOS list is the default
    monkeypatch.setattr(model, "eos_ids", eos)
    default = generate(model, prompts, limit, **kw)
    assert [r.tokens for r in default.rollouts] == [r.tokens for r in stopped.rollouts]


def test_argument_validation(warm):
    model, mtp, tok = warm
    prompt = [chat_ids(tok, "hi")]
    with pytest.raises(ValueError):
        generate(model, prompt, 4, mode="beam", draft_len=3)
    with pytest.raises(ValueError):
        generate(model, prompt, 4, mode="spec", draft_len=3)  # no MTP
    with pytest.raises(ValueError):
        generate(model, prompt, 4, mode="spec", draft=mtp, draft_len=-1)
    # draft length 0 is plain decoding
    a = generate(model, prompt, 6, mode="spec", draft=mtp, draft_len=0, seed=4, eos_ids=[])
    b = generate(model, prompt, 6, mode="ar", seed=4, eos_ids=[])
    assert a.rollouts[0].tokens == b.rollouts[0].tokens and a.stats.steps == 0


# ---------------------------------------------------------------------------------------------------------
# logprobs and trace


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=40, top_p=0.9)])
def test_logprobs_match_an_independent_forward(warm, mode, params):
    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS]
    gen = generate(model, prompts, 12, params, mode=mode, draft=mtp, draft_len=3, seed=21, eos_ids=[])
    for prompt, r in zip(prompts, gen.rollouts):
        seq = torch.tensor([prompt + r.tokens])
        with torch.no_grad():
            probs = probabilities(model.logits(model.forward_full(seq))[0], params).double()
        n = len(prompt)
        dist = probs[n - 1:n - 1 + len(r.tokens)]
        p_tok = dist[torch.arange(len(r.tokens)), torch.tensor(r.tokens)]
        assert (p_tok > 0).all(), "a token outside the sampling distribution's support was emitted"
        np.testing.assert_allclose(r.logprobs, p_tok.log().numpy(), atol=1e-4, rtol=0)
        ent = -torch.special.xlogy(dist, dist).sum(-1)
        np.testing.assert_allclose(r.entropies, ent.numpy(), atol=1e-4, rtol=0)
    if mode != "ar":
        assert gen.stats.accepted > 0  # logprobs of accepted drafts were checked too


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_trace_columns(warm, mode):
    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS] * 4
    K = 3
    gen = generate(model, prompts, 20, SamplingParams(), mode=mode, draft=mtp, draft_len=K, seed=8, eos_ids=[],
                   trace=True)
    tr = gen.trace
    cols = ["row", "depth", "accepted", "target_entropy", "draft_entropy", "alpha", "greedy_accept_prob",
            "target_max_prob"]
    assert set(cols) <= set(tr)
    n = len(tr["row"])
    assert n > 0 and all(len(tr[c]) == n for c in tr)
    st = gen.stats
    assert ((tr["row"] >= 0) & (tr["row"] < len(prompts))).all()
    assert ((tr["depth"] >= 0) & (tr["depth"] < K)).all()
    assert int(tr["accepted"].sum()) == st.accepted
    assert int((tr["depth"] == 0).sum()) == st.steps  # every step examines its first draft
    for d in range(K):
        assert int((tr["accepted"] & (tr["depth"] == d)).sum()) == st.accepted_at[d]
    eps = 1e-5
    assert ((tr["alpha"] >= 0) & (tr["alpha"] <= 1 + eps)).all()
    assert ((tr["greedy_accept_prob"] >= 0) & (tr["greedy_accept_prob"] <= tr["target_max_prob"] + eps)).all()
    assert ((tr["target_max_prob"] > 0) & (tr["target_max_prob"] <= 1 + eps)).all()
    V = model.cfg.vocab_size
    for c in ["target_entropy", "draft_entropy"]:
        assert ((tr[c] >= 0) & (tr[c] <= math.log(V) + eps)).all()
    # a depth is examined only when every earlier depth of that step was accepted
    for d in range(1, K):
        assert int((tr["depth"] == d).sum()) == st.accepted_at[d - 1]
    assert st.accepted_at[K - 1 if mode == "spec" else 1] > 0  # long chains were accepted sometimes
    # without trace: nothing recorded
    assert generate(model, prompts, 4, mode=mode, draft=mtp, seed=8, eos_ids=[], draft_len=3).trace is None


# ---------------------------------------------------------------------------------------------------------
# edge cases of the arguments (last in the file: they fail until the engine validates its input)


@pytest.mark.parametrize("mode", MODES)
def test_zero_new_tokens_gives_no_tokens(warm, mode):
    """max_new_tokens is a hard limit: 0 must produce empty rollouts (or be refused), never a token."""
    model, mtp, tok = warm
    try:
        gen = generate(model, [chat_ids(tok, "hi")] * 2, 0, mode=mode, draft=mtp, seed=0, eos_ids=[], draft_len=3)
    except ValueError:
        return
    assert [r.tokens for r in gen.rollouts] == [[], []]


def test_empty_prompt_is_refused(warm):
    """An empty prompt has no position to predict from; the engine must not silently continue padding."""
    model, mtp, tok = warm
    with pytest.raises(ValueError):
        generate(model, [[], chat_ids(tok, "hi")], 3, seed=0, eos_ids=[], mode="ar")


# ---------------------------------------------------------------------------------------------------------
# draft length chosen per step ("auto"): exact whatever K each step takes, K = 0 included


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_auto_draft_len_changing_every_step_is_exact(sharp, mode, monkeypatch):
    model, mtp, prompt, exact, ar = sharp
    scheduled(monkeypatch, [2, 0, 1])
    gen = generate(model, [prompt] * ROWS, 5, SHARP, mode=mode, draft=mtp, draft_len="auto", max_draft_len=2,
                   seed=15, eos_ids=[])
    assert 0 < gen.stats.mean_draft_len < 2 and gen.stats.accepted > 0
    toks, ref = token_matrix(gen)[:, :3], token_matrix(ar)
    for j in range(3):
        assert gof(toks[:, j], exact[j]) > P_OK, f"{mode} token {j} vs exact"
        assert two_sample(toks[:, j], ref[:, j]) > P_OK, f"{mode} token {j} vs ar"


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_rows_drafting_their_own_lengths_of_a_models_drafts_is_exact(sharp, mode, monkeypatch):
    """A draining batch's rows each verify their own k_r of the model's K drafts (padding past k_r): the tokens
    are still the target's, and like plain sampling's. Every row drafts 1 or 2, so a wrong rule shows from
    token 1 on (drawing the acceptance uniforms from the drafting ones: p = 3e-5 there)."""
    model, mtp, prompt, exact, ar = sharp
    scheduled(monkeypatch, [2, 1, 2], per_row="cycled")
    ragged = []
    real_step = engine.speculative_step
    def spy(*args):
        lens = args[10]  # (target, mtp, rows, cache, mcache, K, params, greedy, vocab_ids, proposal, lens, ...)
        ragged.append(lens is not None and len(set(lens.tolist())) > 1)
        return real_step(*args)
    monkeypatch.setattr(engine, "speculative_step", spy)
    gen = generate(model, [prompt] * ROWS, 5, SHARP, mode=mode, draft=mtp, draft_len="auto", max_draft_len=2,
                   seed=16, eos_ids=[])
    assert any(ragged) and gen.stats.accepted > 0
    assert 0 < gen.stats.acceptance_rate < 0.95
    assert_exact_and_like_ar(model, gen, exact, ar, f"{mode}, rows of their own lengths")


@pytest.mark.parametrize("mode", ["spec", "spec-greedy"])
def test_a_row_drafting_its_own_lengths_is_independent_of_the_batch(warm, mode, monkeypatch):
    """With each row's k_r a function of its own progress, a request's tokens are those it gets alone: its
    uniforms (2 k_r + 1 a step) come from its own generator whatever the other rows draft."""
    model, mtp, tok = warm
    scheduled(monkeypatch, [3, 0, 2, 1], per_row="own")
    prompts = [chat_ids(tok, t) for t in TEXTS]
    seeds = [101, 7, 55, 3][:len(prompts)]
    kw = dict(params=SamplingParams(temperature=1.0), mode=mode, draft=mtp, draft_len="auto", max_draft_len=3,
              eos_ids=[])
    batch = generate(model, prompts, 16, seed=seeds, **kw)
    assert batch.stats.steps > 0
    for i, p in enumerate(prompts):
        assert generate(model, [p], 16, seed=[seeds[i]], **kw).rollouts[0].tokens == batch.rollouts[i].tokens, i


def test_auto_choosing_zero_is_plain_decoding(warm, monkeypatch):
    """K = 0 in a spec mode draws the same uniforms as ar: the same tokens, and no speculative steps."""
    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS]
    scheduled(monkeypatch, [0])
    gen = generate(model, prompts, 10, mode="spec", draft=mtp, draft_len="auto", seed=4, eos_ids=[])
    ar = generate(model, prompts, 10, mode="ar", seed=4, eos_ids=[])
    assert [r.tokens for r in gen.rollouts] == [r.tokens for r in ar.rollouts] and gen.stats.steps == 0


# ---------------------------------------------------------------------------------------------------------
# the end of the context (issue 11): a request that fits never fails


@pytest.mark.parametrize("draft_len", [3, "auto"])
def test_request_filling_the_whole_context(warm, draft_len, monkeypatch):
    model, mtp, tok = warm
    short = copy.deepcopy(model)
    prompt = chat_ids(tok, "hi")
    context = len(prompt) + 12
    short.rope_cos, short.rope_sin = model.rope_cos[:context], model.rope_sin[:context]
    scheduled(monkeypatch, [3])
    greedy = SamplingParams(temperature=0)
    ar = generate(short, [prompt], 12, greedy, mode="ar", eos_ids=[])
    gen = generate(short, [prompt], 12, greedy, mode="spec", draft=agreeable_mtp(short, 1.0, 0.0),
                   draft_len=draft_len, max_draft_len=3, eos_ids=[])
    assert len(gen.rollouts[0].tokens) == 12 and gen.rollouts[0].tokens == ar.rollouts[0].tokens
    assert gen.stats.accepted > 0
    with pytest.raises(BebopError, match="context"):
        generate(short, [prompt], 13, greedy, mode="ar", eos_ids=[])


def test_the_row_spread_one_generation_measured_is_where_the_next_starts(warm, monkeypatch):
    """How far rows' acceptance differs depends on the prompts (RL groups of one task differ little, mixed chat
    prompts a lot): each generation starts from what the last one measured."""
    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS] * 2
    scheduled(monkeypatch, [2])
    costs = autodraft.step_costs_for(model, mtp, 2)
    costs.row_spread = 0.123
    priors, real = [], engine.Acceptance
    monkeypatch.setattr(engine, "Acceptance", lambda *a, **k: priors.append(k["prior_spread"]) or real(*a, **k))
    kw = dict(mode="spec", draft=mtp, draft_len="auto", max_draft_len=2, eos_ids=[])
    generate(model, prompts, 16, seed=1, **kw)
    assert priors == [0.123] and costs.row_spread != 0.123  # measured from this generation's rows
    measured = costs.row_spread
    generate(model, prompts, 16, seed=2, **kw)
    assert priors[1] == measured
