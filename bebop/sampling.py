"""Logits -> sampling distributions, and the speculative rejection sampler.

The same `probabilities` processing (temperature, top-k, top-p) is applied to the target and the draft, so
that q is a distribution over the tokens the target could sample. Sampling is by inverse CDF on uniforms the
caller can supply: the engine draws every row's uniforms from that row's own generator, which makes a row's
output independent of the rest of the batch.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Float32 probabilities [..., V] after temperature, top-k and top-p. Temperature 0 is one-hot argmax, and
    so is any temperature below float32's smallest normal number (dividing by it overflows; the limit T -> 0
    is argmax anyway)."""
    logits = logits.float()
    if params.temperature < torch.finfo(torch.float32).tiny:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if params.temperature != 1:  # (at T = 1 both steps are what softmax does anyway: two full-vocab passes saved)
        # shift the maximum to 0 before dividing: a small T then sends the others to -inf, never inf - inf = NaN
        logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        # drop a token once the mass strictly before it already reaches top_p; the first token always stays
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from each row of probs [..., V] with uniforms u [...] in [0, 1): the first index whose
    CDF exceeds u * total, so a zero-probability token is never chosen. NaN and negative entries count as
    zero; a row that is all zero or NaN still yields an index inside the vocabulary.
    A large vocabulary goes by blocks (blocked_inverse_cdf), a small one in one float64 CDF (inverse_cdf).
    The choice depends on V alone, never on the batch, so a row's token does not depend on the other rows."""
    return (blocked_inverse_cdf if probs.shape[-1] >= BLOCKED_MIN_VOCAB else inverse_cdf)(probs, u)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`sample` with one float64 CDF over the whole vocabulary: cheapest for a few rows of a small one."""
    probs = torch.nan_to_num(probs, nan=0.0).clamp_min(0.0)
    cdf = probs.cumsum(-1, dtype=torch.float64)  # the CDF in float64; the clean-up above stays in float32
    target = (u.double() * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


PLACEHOLDER_TOKEN_ID = -1  # a position past a row's accepted drafts and its last token (vLLM's name)
SAMPLE_BLOCK = 256  # vocabulary entries per block of blocked_inverse_cdf
BLOCKED_MIN_VOCAB = 8192  # from this vocabulary size on, `sample` goes by blocks


def blocked_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`sample` in two levels, so that the whole vocabulary is only read by two float32 reductions (a minimum, for
    NaN and negative entries, and the block sums): the CDF over the sums of blocks of SAMPLE_BLOCK entries picks
    the block, then the float64 CDF inside that block picks the token, at the same fraction of the block's mass:
    far less than one float64 CDF over a large vocabulary. A row with NaN or negative entries (never from
    softmax) makes the whole tensor pay for cleaning them."""
    V = probs.shape[-1]
    flat = probs.reshape(-1, V)
    n, full = flat.shape[0], V - V % SAMPLE_BLOCK  # full blocks, then the rest as one shorter block

    def by_block(reduce):
        head = [reduce(flat[:, :full].view(n, -1, SAMPLE_BLOCK), -1)] if full else []
        return torch.cat(head + ([reduce(flat[:, full:], -1, keepdim=True)] if full < V else []), -1)

    if not bool((by_block(torch.amin) >= 0).all()):  # amin keeps NaN, which fails the test too
        flat = torch.nan_to_num(flat, nan=0.0).clamp_min(0.0)
    sums = by_block(torch.sum).double()
    cdf = sums.cumsum(-1)
    total = cdf[:, -1]
    # the first block whose CDF exceeds u * total, which stays strictly below the total even as u -> 1
    target = torch.minimum(u.reshape(-1).double() * total, torch.nextafter(total, torch.zeros_like(total)))
    b = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
    rows = torch.arange(n, device=probs.device)
    before = torch.where(b > 0, cdf[rows, (b - 1).clamp(min=0)], 0.0)
    # inside block b: the same fraction of its own mass, strictly below its last CDF value
    idx = b.unsqueeze(-1) * SAMPLE_BLOCK + torch.arange(SAMPLE_BLOCK, device=probs.device)
    inner_cdf = torch.where(idx < V, flat.gather(-1, idx.clamp(max=V - 1)), 0.0).cumsum(-1, dtype=torch.float64)
    inner_total = inner_cdf[:, -1]
    frac = ((target - before) / sums[rows, b]).nan_to_num(0.0).clamp(0.0, 1.0)
    inner = torch.minimum(frac * inner_total, torch.nextafter(inner_total, torch.zeros_like(inner_total)))
    i = torch.searchsorted(inner_cdf, inner.unsqueeze(-1), right=True).squeeze(-1).clamp_(max=SAMPLE_BLOCK - 1)
    return (b * SAMPLE_BLOCK + i).clamp_(max=V - 1).view(probs.shape[:-1])


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """-sum p log p per row, 0 log 0 = 0: the same values as xlogy(p, p), whose CPU kernel is slower."""
    return -(probs * probs.log().nan_to_num_(neginf=0.0)).sum(-1)


def residual(p: torch.Tensor, q: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Unnormalised residual max(p - q, 0); where it is (numerically) empty, p = q and any rejection there
    has probability ~0, so fall back to p itself rather than to an empty distribution.
    With `vocab_ids`, q [..., Vd] lives on those ids and is 0 elsewhere, where max(p - 0, 0) = p: only the
    draft vocabulary's columns are computed (the same values as scattering q to the full vocabulary)."""
    if vocab_ids is None:
        r = (p - q).clamp_min(0.0)
    else:
        r = p.clone()
        r[..., vocab_ids] = (p[..., vocab_ids] - q.to(p.dtype)).clamp_min(0.0)
    empty = r.sum(-1, keepdim=True) <= 1e-12
    return torch.where(empty, p, r) if bool(empty.any()) else r


def without_rejected_draft(correction, last_p, draft_tokens, num_accepted, fix) -> torch.Tensor:
    """Writes into `correction` [B, V] (the caller's own tensor), at the rows `fix` [B] (proposed drafts, one
    rejected), the residual against a one-hot q at the rejected draft x: max(p - one_hot(x), 0) is p with p(x)
    set to 0 (p(x) <= 1), and where nothing is left but x, p itself (as `residual`). `last_p` [B, V]: p at each
    row's last position (may be `correction` itself). Only those rows are read and written."""
    fix = fix.nonzero().squeeze(1)  # [n]
    if len(fix) == 0:
        return correction
    at = torch.arange(len(fix), device=fix.device)
    x = draft_tokens[fix, num_accepted[fix]]  # [n] the rejected draft
    p = last_p[fix]  # [n, V] (a copy)
    p_x = p[at, x]  # [n]
    p[at, x] = 0.0
    empty = p.sum(-1) <= 1e-12  # [n]
    p[at, x] = torch.where(empty, p_x, 0.0)
    correction[fix] = p
    return correction


def rejection_sample_uniform(target_probs, draft_probs, draft_tokens, accept_u, final_u, vocab_ids=None,
                             draft_lens=None, proposed=None):
    """The speculative step of Leviathan et al. / Chen et al. (2023) with explicit uniforms.

    target_probs [B, K+1, V] = p_1..p_{K+1}; draft_probs [B, K, V] = q_1..q_K; draft_tokens [B, K] = x_i ~ q_i.
    accept_u [B, K], final_u [B]: uniforms in [0, 1).
    Step 1 (accept): x_i is accepted iff u_i < p_i(x_i) / q_i(x_i), walking i = 1..K until the first rejection.
    Step 2 (correct): at the first rejected position j, emit a token from the residual norm(max(p_j - q_j, 0));
    if all K were accepted, emit a bonus token from p_{K+1}.
    vocab_ids: a reduced draft vocabulary (sorted token ids): draft_probs is then [B, K, Vd] over those ids
    (q = 0 elsewhere) and is never expanded to V. The test u*q(x) < p(x) needs q only at the drafted ids, and
    the residual max(p - q, 0) is p outside the draft vocabulary, so only the draft vocabulary's columns change.
    draft_lens [B]: a draft length per row, k_r <= K (None: K for every row). Row r's drafts past k_r are
    padding, never accepted: if its k_r drafts are all accepted its bonus token comes from p_{k_r+1}, as if the
    step had drafted k_r (k_r = 0: a plain step, one token from p_1).
    proposed [B] bool: rows whose drafts were proposed, not sampled (a history draft's): q is one-hot at each
    of their drafts, so x is accepted iff u < p(x) and the residual is p without x. Whatever draft_probs holds
    for their rows is ignored, and draft_probs may be None where every row's drafts were proposed: the same
    draws as a dense one-hot q, without its [B, K, V] tensor.
    Returns tokens [B, K+1] (accepted drafts, the residual/bonus token, then PLACEHOLDER_TOKEN_ID) and num_accepted [B]."""
    B, K = draft_tokens.shape
    device = target_probs.device
    rows = torch.arange(B, device=device)
    if K == 0:
        return sample(target_probs[:, 0], final_u).unsqueeze(1), torch.zeros(B, dtype=torch.long, device=device)
    p_x = target_probs[:, :K].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).double()
    if draft_probs is None:  # every row's drafts proposed
        q_x, proposed = torch.ones_like(p_x), torch.ones(B, dtype=torch.bool, device=device)
    elif vocab_ids is None:
        q_x = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).double()
    else:
        idx = torch.searchsorted(vocab_ids, draft_tokens).clamp_(max=len(vocab_ids) - 1)
        q_x = draft_probs.gather(-1, idx.unsqueeze(-1)).squeeze(-1).double()
        q_x = torch.where(vocab_ids[idx] == draft_tokens, q_x, 0.0)  # a token outside the draft vocab: q = 0
    if proposed is not None:
        q_x = torch.where(proposed.unsqueeze(1), 1.0, q_x)
    # u < p/q written as u*q < p: no division, and q(x) = 0 (a token the draft could not have drawn) rejects
    accepted = (accept_u.double() * q_x < p_x) & (q_x > 0)
    lens = torch.full((B,), K, device=device) if draft_lens is None else draft_lens.to(device)
    accepted &= torch.arange(K, device=device).unsqueeze(0) < lens.unsqueeze(1)  # padding is never accepted
    num_accepted = accepted.long().cumprod(-1).sum(-1)
    # the last token comes from position num_accepted: the residual at the first rejected draft, or p_{k+1}
    # when all k of the row's drafts were accepted, where q counts as 0 and the residual max(p - 0, 0) is p itself
    last_p = target_probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < lens  # [B]
    if draft_probs is None:
        correction = last_p
    else:
        last_q = torch.where(rejected.unsqueeze(-1), draft_probs[rows, num_accepted.clamp(max=K - 1)], 0.0)
        correction = residual(last_p, last_q, vocab_ids)
    if proposed is not None:
        correction = without_rejected_draft(correction, last_p, draft_tokens, num_accepted, proposed & rejected)
    last = sample(correction, final_u)
    tokens = torch.full((B, K + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    keep = torch.arange(K, device=device).unsqueeze(0) < num_accepted.unsqueeze(1)
    tokens[:, :K] = torch.where(keep, draft_tokens, PLACEHOLDER_TOKEN_ID)
    tokens[rows, num_accepted] = last
    return tokens, num_accepted


def rejection_sample(target_probs, draft_probs, draft_tokens, generator=None):
    """Public entry point: `rejection_sample_uniform` with float64 uniforms drawn from `generator`.
    Greedy drafting is the same call with one-hot draft_probs."""
    B, K = draft_tokens.shape
    u = torch.rand(B, K + 1, dtype=torch.float64, generator=generator).to(target_probs.device)
    return rejection_sample_uniform(target_probs, draft_probs, draft_tokens, u[:, :K], u[:, K])


def token_stats(p, q):
    """Per-position statistics for target p and draft q, both probabilities [..., V].

    Returns a dict of tensors shaped like the leading dims:
      target_entropy, draft_entropy: nats, with 0 log 0 = 0
      alpha: sum_v min(p, q), acceptance prob of x ~ q with min(1, p/q)
      greedy_accept_prob: p(argmax q), acceptance prob of x = argmax q (ties -> lowest id)
      target_max_prob: max_v p, the greedy oracle (q = p)
    """
    if p.shape != q.shape:
        raise ValueError(f"token_stats: p has shape {tuple(p.shape)} but q has {tuple(q.shape)}")
    # bf16/fp16 sums over a 100k+ vocab lose too much; do the reductions in fp32 at least
    dtype = torch.promote_types(p.dtype, torch.float32)
    p, q = p.to(dtype), q.to(dtype)
    # xlogy(0, 0) is exactly 0, which is the convention we want for unsupported tokens
    target_entropy = (-torch.special.xlogy(p, p).sum(-1)).clamp_min(0.0)
    draft_entropy = (-torch.special.xlogy(q, q).sum(-1)).clamp_min(0.0)
    alpha = torch.minimum(p, q).sum(-1)
    greedy_accept_prob = p.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1)
    target_max_prob = p.amax(-1)
    return dict(target_entropy=target_entropy, draft_entropy=draft_entropy, alpha=alpha,
                greedy_accept_prob=greedy_accept_prob, target_max_prob=target_max_prob)
