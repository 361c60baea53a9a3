"""Exactness of speculative rejection sampling (Leviathan et al. 2023) and of the sampling helpers.

The statistical tests run large batches at fixed seeds. For the stream tests the target distribution p is the
same at every position, so every emitted token must be distributed as p and, across a row's concatenated
steps, the stream must be i.i.d. p (pairs ~ p x p) -- whatever the draft distributions q_i are. Within a
single step, the token at stream index j of the rows that reached it (num_accepted >= j) is a draw from p_j
even when the p_j differ by position. Each check is also run against deliberately wrong samplers to show
that it would catch them.
"""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import bebop.sampling as S
from bebop.sampling import (SamplingParams, entropy, probabilities, rejection_sample, rejection_sample_uniform, residual,
                            sample, without_rejected_draft)

V, K, B = 5, 3, 200_000
P_OK, P_BAD = 1e-3, 1e-6

P = [0.05, 0.10, 0.15, 0.30, 0.40]
CASES = {
    # q strongly different from p, and different at every depth
    "different": (P, [[0.40, 0.30, 0.15, 0.10, 0.05], [0.2] * 5, [0.60, 0.05, 0.05, 0.05, 0.25]]),
    # q has zeros where p has mass (the residual must supply those tokens); q_2 is one-hot
    "q_zeros": (P, [[0.5, 0.5, 0, 0, 0], [0, 0, 0, 0, 1.0], [0, 0.3, 0, 0.7, 0]]),
    # q has mass where p is zero (those drafts must always be rejected); q_2 lies entirely outside p's support
    "q_beyond_p": ([0.5, 0, 0.3, 0, 0.2], [[0.1, 0.4, 0.1, 0.3, 0.1], [0, 0.5, 0, 0.5, 0], [0.2] * 5]),
    # q == p: every draft accepted, the bonus token does all the sampling
    "equal": (P, [P, P, P]),
    # greedy drafting: one-hot q at argmax of a q unlike p
    "greedy": (P, [[0.40, 0.30, 0.15, 0.10, 0.05], [0.1, 0.1, 0.6, 0.1, 0.1], [0.05, 0.05, 0.05, 0.05, 0.8]]),
}


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


def gof(values, probs, what=""):
    """Chi-square goodness-of-fit p-value of integer samples against probs; a sample in a zero-probability
    cell fails outright."""
    probs = np.asarray(probs, dtype=np.float64)
    counts = np.bincount(np.asarray(values), minlength=len(probs))
    assert len(counts) == len(probs), f"{what}: out-of-range values"
    assert counts[probs == 0].sum() == 0, f"{what}: {counts[probs == 0].sum()} samples of zero-probability cells"
    keep = probs > 0
    if keep.sum() == 1:
        return 1.0
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return chisquare(counts[keep], expected).pvalue


def drafts_from(q, n, gen, greedy):
    """q [K, V] -> (draft_probs [n, K, V], draft_tokens [n, K]): x_i ~ q_i, or one-hot argmax when greedy."""
    if greedy:
        x = q.argmax(-1).expand(n, -1).clone()
        return torch.zeros(n, *q.shape, dtype=q.dtype).scatter_(-1, x.unsqueeze(-1), 1.0), x
    x = torch.stack([torch.multinomial(qi, n, replacement=True, generator=gen) for qi in q], 1)
    return q.expand(n, -1, -1), x


def one_step(p, q, n, seed, greedy=False, sampler=rejection_sample):
    """p [K+1, V], q [K, V]: one speculative step for n rows. Returns (tokens, num_accepted, drafts)."""
    gen = torch.Generator().manual_seed(seed)
    qd, x = drafts_from(q, n, gen, greedy)
    tokens, acc = sampler(p.expand(n, -1, -1), qd, x, gen)
    return tokens, acc, x


def stream(p, q, n, length, seed, greedy=False, sampler=rejection_sample):
    """Each row runs speculative steps (target p at every position) until it has emitted `length` tokens;
    returns the concatenated streams [n, length] and the first step's (tokens, num_accepted)."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((n, length), -1, dtype=torch.long)
    filled = torch.zeros(n, dtype=torch.long)
    first = None
    pk = p.expand(n, q.shape[0] + 1, -1)
    while (filled < length).any():
        qd, x = drafts_from(q, n, gen, greedy)
        tokens, acc = sampler(pk, qd, x, gen)
        if first is None:
            first = (tokens, acc)
        for j in range(q.shape[0] + 1):
            dest = filled + j
            ok = (j <= acc) & (dest < length)
            out[ok, dest[ok]] = tokens[ok, j]
        filled += acc + 1
    return out, first


def residual_from_p(p, q, vocab_ids=None):  # a classic mistake: resample from p after a rejection
    return p


def ignore_q_sampler(target_probs, draft_probs, draft_tokens, generator):
    """Wrong: treat q as 1 everywhere (accept x with probability p(x); the residual degenerates to p)."""
    return rejection_sample(target_probs, torch.ones_like(draft_probs), draft_tokens, generator)


@pytest.fixture(params=["one CDF", "by blocks"])
def sampler(request, monkeypatch):
    """Run a test with each of `sample`'s two ways; by blocks of 2 here, so that these 5-token vocabularies
    have two full blocks and a shorter last one."""
    if request.param == "by blocks":
        monkeypatch.setattr(S, "SAMPLE_BLOCK", 2)
        monkeypatch.setattr(S, "BLOCKED_MIN_VOCAB", 0)
    return request.param


# ---------------------------------------------------------------------------------------------------------
# the stream is i.i.d. p


@pytest.mark.parametrize("case", list(CASES))
def test_stream_is_iid_target(case, sampler):
    p_list, q_list = CASES[case]
    p, q = t64(p_list), t64(q_list)
    length = K + 2  # crosses the boundary between a row's first and second step
    s, (tokens, acc) = stream(p, q, B, length, seed=list(CASES).index(case), greedy=case == "greedy")
    assert (s >= 0).all() and (s < V).all()
    pv = {"first emitted": gof(tokens[:, 0], p, case)}
    for j in range(length):
        pv[f"stream index {j}"] = gof(s[:, j], p, case)
    pp = np.outer(p, p).ravel()
    for j in range(length - 1):
        pv[f"pair ({j},{j + 1})"] = gof(s[:, j] * V + s[:, j + 1], pp, case)
    bad = {k: v for k, v in pv.items() if v <= P_OK}
    assert not bad, f"{case}: chi-square p-values too small: {bad}"
    # the case exercised what it is meant to: rejections (residual tokens) and acceptances (drafts, bonus)
    if case == "equal":
        assert (acc == K).all()
    else:
        assert (acc == 0).sum() > 1000 and (acc > 0).sum() > 1000
    if case == "q_beyond_p":
        assert (acc < 2).all()  # q_2 has no overlap with p


@pytest.mark.parametrize("case", ["different", "q_zeros", "greedy"])
def test_stream_check_catches_residual_from_p(case, monkeypatch):
    p_list, q_list = CASES[case]
    p, q = t64(p_list), t64(q_list)
    monkeypatch.setattr(S, "residual", residual_from_p)
    s, _ = stream(p, q, B, K + 1, seed=1, greedy=case == "greedy")
    assert min(gof(s[:, j], p) for j in range(K + 1)) < P_BAD


def test_stream_check_catches_ignoring_q():
    p, q = t64(CASES["different"][0]), t64(CASES["different"][1])
    s, _ = stream(p, q, B, K + 1, seed=2, sampler=ignore_q_sampler)
    assert gof(s[:, 0], p) < P_BAD


def test_pair_check_catches_correlated_stream():
    """A sampler with exact marginals but correlated consecutive tokens (one uniform reused for the whole
    step): every stream index passes, the pair test must not."""
    p = t64(CASES["different"][0])

    def reused_uniform(target_probs, draft_probs, draft_tokens, generator):
        n, k = draft_tokens.shape
        u = torch.rand(n, dtype=torch.float64, generator=generator)
        tokens = sample(target_probs[:, :1].expand(n, k + 1, -1), u.unsqueeze(1).expand(n, k + 1))
        return tokens, torch.full((n,), k)

    s, _ = stream(p, t64(CASES["different"][1]), B, K + 1, seed=3, sampler=reused_uniform)
    assert all(gof(s[:, j], p) > P_OK for j in range(K + 1))
    assert gof(s[:, 0] * V + s[:, 1], np.outer(p, p).ravel()) < P_BAD


# ---------------------------------------------------------------------------------------------------------
# one step with a different target at every position: index j is drawn from p_j; acceptance rates


P_POS = [[0.05, 0.10, 0.15, 0.30, 0.40], [0.6, 0.1, 0.1, 0.1, 0.1], [0.0, 0.3, 0.3, 0.0, 0.4], [0.2, 0.2, 0.5, 0.05, 0.05]]
Q_POS = [[0.40, 0.30, 0.15, 0.10, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6], [0.2, 0.2, 0.2, 0.2, 0.2]]
Q_GREEDY = [[0, 0, 0, 1.0, 0], [1.0, 0, 0, 0, 0], [0, 0, 0, 0, 1.0]]  # greedy drafts 3, 0, 4


def q_pos(greedy):
    return t64(Q_GREEDY if greedy else Q_POS)


@pytest.mark.parametrize("greedy", [False, True])
def test_position_dependent_targets(greedy, sampler):
    p, q = t64(P_POS), q_pos(greedy)
    tokens, acc, x = one_step(p, q, B, seed=4, greedy=greedy)
    for j in range(K + 1):
        reached = acc >= j
        assert reached.sum() > 1000
        pv = gof(tokens[reached, j], p[j], f"index {j}")
        assert pv > P_OK, f"stream index {j}: p-value {pv:.2e}"
    # layout: accepted drafts, then the residual/bonus token, then -1 padding
    pos = torch.arange(K + 1)
    accepted = pos[:K] < acc.unsqueeze(1)
    assert torch.equal(tokens[:, :K][accepted], x[accepted])
    assert (tokens[pos > acc.unsqueeze(1)] == -1).all()
    assert ((tokens >= 0) == (pos <= acc.unsqueeze(1))).all()


def test_position_check_catches_bonus_from_wrong_position():
    """Wrong: the bonus token drawn from p_K instead of p_{K+1}."""
    p, q = t64(P_POS), t64(Q_POS)

    def off_by_one(target_probs, draft_probs, draft_tokens, generator):
        shifted = torch.cat([target_probs[:, :K], target_probs[:, K - 1:K]], 1)
        return rejection_sample(shifted, draft_probs, draft_tokens, generator)

    tokens, acc, _ = one_step(p, q, B, seed=5, sampler=off_by_one)
    assert (acc == K).sum() > 1000
    assert gof(tokens[acc == K, K], p[K]) < P_BAD


def ragged_step(p, q, n, seed, greedy, ragged=True):
    """One step for n rows where row r drafts its own k_r in 0..K (uniform over rows); returns (tokens,
    num_accepted, k). ragged=False is a wrong way to get there: every row drafts K and its padding is rejected
    through the rejection rule (accept u = 1), so the bonus of a row whose k_r drafts were all accepted comes
    from the residual of p_{k_r+1} and a q that was never drafted."""
    gen = torch.Generator().manual_seed(seed)
    qd, x = drafts_from(q, n, gen, greedy)
    k = torch.randint(K + 1, (n,), generator=gen)
    u = torch.rand(n, K + 1, dtype=torch.float64, generator=gen)
    if ragged:
        tokens, acc = rejection_sample_uniform(p.expand(n, -1, -1), qd, x, u[:, :K], u[:, K], draft_lens=k)
    else:
        padding = torch.arange(K).unsqueeze(0) >= k.unsqueeze(1)
        tokens, acc = rejection_sample_uniform(p.expand(n, -1, -1), qd, x, u[:, :K].masked_fill(padding, 1.0), u[:, K])
    return tokens, acc, k


@pytest.mark.parametrize("greedy", [False, True])
def test_a_draft_length_per_row_keeps_every_position_exact(greedy, sampler):
    """Rows of one step with their own draft lengths k_r (0: a plain step): none accepts past its k_r, and the
    token at stream index j of the rows that reached it is a draw from p_j, at every k_r apart."""
    p, q = t64(P_POS), q_pos(greedy)
    tokens, acc, k = ragged_step(p, q, B, seed=8, greedy=greedy)
    assert (acc <= k).all()
    assert ((tokens >= 0) == (torch.arange(K + 1) <= acc.unsqueeze(1))).all()
    for kr in range(K + 1):
        for j in range(kr + 1):
            reached = (k == kr) & (acc >= j)
            assert reached.sum() > 1000
            pv = gof(tokens[reached, j], p[j], f"k={kr}, index {j}")
            assert pv > P_OK, f"k={kr}, stream index {j}: p-value {pv:.2e}"


def test_ragged_check_catches_padding_rejected_by_the_rule():
    p, q = t64(P_POS), t64(Q_POS)
    tokens, acc, k = ragged_step(p, q, B, seed=9, greedy=False, ragged=False)
    bonus = (k == 1) & (acc == 1)  # the row's one draft accepted: its next token must come from p_2
    assert bonus.sum() > 1000
    assert gof(tokens[bonus, 1], p[1]) < P_BAD


@pytest.mark.parametrize("greedy", [False, True])
def test_acceptance_rate_is_overlap(greedy):
    p, q = t64(P_POS), q_pos(greedy)
    tokens, acc, _ = one_step(p, q, B, seed=6, greedy=greedy)
    for j in range(K):
        if greedy:
            alpha = float(p[j, q[j].argmax()])
        else:
            alpha = float(torch.minimum(p[j], q[j]).sum())
        reached = acc >= j
        n = int(reached.sum())
        rate = float((acc[reached] > j).double().mean())
        se = math.sqrt(max(alpha * (1 - alpha), 1e-12) / n)
        assert abs(rate - alpha) < 5 * se + 1e-12, f"depth {j}: rate {rate:.4f} vs alpha {alpha:.4f} (se {se:.1e})"


def test_acceptance_rate_check_catches_wrong_ratio():
    """Wrong: accept with probability min(1, p/q) squared, i.e. u^(1/2) < p/q."""
    p, q = t64(P_POS), t64(Q_POS)
    gen = torch.Generator().manual_seed(7)
    qd, x = drafts_from(q, B, gen, False)
    u = torch.rand(B, K + 1, dtype=torch.float64, generator=gen)
    _, acc = rejection_sample_uniform(p.expand(B, -1, -1), qd, x, u[:, :K].sqrt(), u[:, K])
    alpha = float(torch.minimum(p[0], q[0]).sum())
    rate = float((acc > 0).double().mean())
    assert abs(rate - alpha) > 20 * math.sqrt(alpha * (1 - alpha) / B)


# ---------------------------------------------------------------------------------------------------------
# deterministic cases and robustness


@pytest.mark.parametrize("greedy", [False, True])
def test_one_hot_target_emits_argmax(greedy, sampler):
    """Temperature 0: the output is the target's argmax at every position, drafts matching or not."""
    n = 4000
    gen = torch.Generator().manual_seed(8)
    best = torch.randint(0, V, (n, K + 1), generator=gen)
    p = torch.zeros(n, K + 1, V, dtype=torch.float64).scatter_(-1, best.unsqueeze(-1), 1.0)
    q = torch.softmax(torch.randn(n, K, V, generator=gen, dtype=torch.float64), -1)
    x = q.argmax(-1) if greedy else torch.multinomial(q.view(-1, V), 1, generator=gen).view(n, K)
    # make half the rows' drafts mostly right, so that all acceptance lengths occur
    x[: n // 2] = torch.where(torch.rand(n // 2, K, generator=gen) < 0.7, best[: n // 2, :K], x[: n // 2])
    if greedy:
        q = torch.zeros_like(q).scatter_(-1, x.unsqueeze(-1), 1.0)
    tokens, acc = rejection_sample(p, q, x, gen)
    match = (x == best[:, :K]).long().cumprod(-1).sum(-1)
    assert torch.equal(acc, match)
    assert (acc == K).any() and (acc == 0).any() and ((acc > 0) & (acc < K)).any()
    pos = torch.arange(K + 1)
    emitted = pos <= acc.unsqueeze(1)
    assert torch.equal(tokens[emitted], best[emitted])
    assert (tokens[~emitted] == -1).all()


def test_degenerate_rows_give_valid_tokens(sampler):
    n = 12
    gen = torch.Generator().manual_seed(9)
    p = torch.softmax(torch.randn(n, K + 1, V, generator=gen), -1)
    q = torch.softmax(torch.randn(n, K, V, generator=gen), -1)
    x = torch.randint(0, V, (n, K), generator=gen)
    p[0] = 0.0  # all-zero target
    p[1, 0] = float("nan")  # NaN target row
    p[2, :, 3] = float("nan")  # one NaN entry
    q[3] = 0.0  # all-zero draft
    q[4, 1] = float("nan")
    q[5, :, 0] = float("nan")
    p[6], q[6] = float("nan"), float("nan")
    p[7, K] = 0.0  # zero bonus row
    q[7] = p[7, :K]  # ...reached: all drafts accepted
    x[7] = p[7, :K].argmax(-1)
    p[8] = float("inf")
    for _ in range(20):
        tokens, acc = rejection_sample(p, q, x, gen)
        assert tokens.shape == (n, K + 1) and acc.shape == (n,)
        assert ((acc >= 0) & (acc <= K)).all()
        last = tokens[torch.arange(n), acc]
        assert ((last >= 0) & (last < V)).all()
        assert (tokens[torch.arange(K + 1) <= acc.unsqueeze(1)] >= 0).all()
    # float32 inputs too, and a one-row batch
    tokens, acc = rejection_sample(p[3:4].float(), q[3:4].float(), x[3:4], gen)
    assert 0 <= int(tokens[0, acc[0]]) < V


def test_k0_is_one_sample_from_p(sampler):
    p = t64(P_POS[0])
    gen = torch.Generator().manual_seed(10)
    tokens, acc = rejection_sample(p.expand(B, 1, V), torch.zeros(B, 0, V, dtype=torch.float64),
                                   torch.zeros(B, 0, dtype=torch.long), gen)
    assert tokens.shape == (B, 1) and (acc == 0).all()
    assert gof(tokens[:, 0], p) > P_OK


def test_uniform_version_is_deterministic_in_its_uniforms():
    p, q = t64(P_POS), t64(Q_POS)
    gen = torch.Generator().manual_seed(11)
    qd, x = drafts_from(q, 1000, gen, False)
    u = torch.rand(1000, K + 1, dtype=torch.float64, generator=gen)
    a = rejection_sample_uniform(p.expand(1000, -1, -1), qd, x, u[:, :K], u[:, K])
    b = rejection_sample_uniform(p.expand(1000, -1, -1), qd, x, u[:, :K], u[:, K])
    c = rejection_sample(p.expand(1000, -1, -1), qd, x, torch.Generator().manual_seed(123))
    d = rejection_sample(p.expand(1000, -1, -1), qd, x, torch.Generator().manual_seed(123))
    assert torch.equal(a[0], b[0]) and torch.equal(c[0], d[0]) and torch.equal(c[1], d[1])
    # accept iff u * q(x) < p(x), walking depths in order
    px = p[:K].gather(-1, x.T).T
    qx = qd.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    expect = (u[:, :K] * qx < px).long().cumprod(-1).sum(-1)
    assert torch.equal(a[1], expect)


# ---------------------------------------------------------------------------------------------------------
# probabilities and sample


def ref_probabilities(logits, temperature, top_k, top_p):
    z = np.asarray(logits, dtype=np.float64) / temperature
    out = np.zeros_like(z)
    for i, row in enumerate(z.reshape(-1, z.shape[-1])):
        keep = np.ones(len(row), bool)
        if 0 < top_k < len(row):
            keep[np.argsort(-row)[top_k:]] = False
        e = np.where(keep, np.exp(row - row[keep].max()), 0.0)
        pr = e / e.sum()
        if top_p < 1:
            order = np.argsort(-pr)
            mass, kept = 0.0, []
            for t in order:
                if mass >= top_p:
                    break
                kept.append(t)
                mass += pr[t]
            mask = np.zeros(len(row), bool)
            mask[kept] = True
            pr = np.where(mask, pr, 0.0)
            pr /= pr.sum()
        out.reshape(-1, z.shape[-1])[i] = pr
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.6, 0, 1.0), (1.0, 5, 1.0), (0.5, 3, 1.0), (1.0, 0, 0.8), (1.3, 0, 0.33),
    (0.8, 10, 0.9), (1.0, 1, 1.0), (1.0, 100, 1.0), (1.0, 0, 0.01)])
def test_probabilities_match_reference(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(3, 4, 37, generator=gen) * 3
    got = probabilities(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert got.dtype == torch.float32 and got.shape == logits.shape
    ref = ref_probabilities(logits.numpy(), temperature, top_k, top_p)
    np.testing.assert_allclose(got.numpy(), ref, atol=2e-6)
    np.testing.assert_array_equal(got.numpy() == 0, ref == 0)  # the same support exactly


def test_probabilities_temperature_zero_is_one_hot_argmax():
    logits = torch.randn(4, 6, 50, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    for params in [SamplingParams(temperature=0), SamplingParams(temperature=0, top_k=3, top_p=0.5)]:
        got = probabilities(logits, params)
        assert got.dtype == torch.float32
        assert torch.equal(got.sum(-1), torch.ones(4, 6))
        assert torch.equal(got.argmax(-1), logits.float().argmax(-1))
        assert ((got == 0) | (got == 1)).all()


@pytest.mark.parametrize("temperature", [1e-30, 1e-38, 1e-40, 1e-45, 5e-324])
def test_tiny_temperatures_are_greedy_never_nan(temperature):
    """Dividing by a temperature near or below float32's smallest number overflowed to inf - inf = NaN."""
    logits = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(3)) * 20
    for params in [SamplingParams(temperature), SamplingParams(temperature, top_k=4, top_p=0.7)]:
        got = probabilities(logits, params)
        assert not got.isnan().any()
        assert torch.equal(got, probabilities(logits, SamplingParams(0)))


def test_tiny_temperature_rollouts_have_finite_logprobs_and_entropies(tiny_llama):
    from bebop.engine.generation import generate
    from bebop.drafts.mtp import new_mtp

    model, _ = tiny_llama
    for mode in ("ar", "spec"):
        g = generate(model, [[1, 70, 71], [1, 80]], 6, SamplingParams(1e-40), mode=mode, draft=new_mtp(model),
                     draft_len=2, eos_ids=[])
        greedy = generate(model, [[1, 70, 71], [1, 80]], 6, SamplingParams(0), mode="ar", eos_ids=[])
        for r, ref in zip(g.rollouts, greedy.rollouts):
            assert r.tokens == ref.tokens
            assert all(math.isfinite(x) for x in r.logprobs + r.entropies), (r.logprobs, r.entropies)


def test_sampling_params_validation():
    for bad in [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
                dict(top_k=-1)]:
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_sample_never_picks_zero_probability_tokens(sampler):
    rows = t64([
        [0, 0, 1, 0, 0],
        [0.3, 0.7, 0, 0, 0],  # trailing zeros: u near 1 must not run off the end
        [0, 0, 0, 0.5, 0.5],  # leading zeros: u = 0 must not pick token 0
        [0.2, 0, 0.3, 0, 0.5],
        [1e-300, 0, 0, 0, 1e-300],
        [3.7, 0, 0, 1.0, 0],  # unnormalised
        [0.1, 0.2, 0, 0, 0.0],
    ])
    tiny = [0.0, 5e-324, 1e-300, 1e-17, 1e-9]
    near_one = [1 - 2 ** -53, 1 - 2 ** -52, 1 - 1e-15, 1 - 1e-9, 0.999999, float(np.float32(1 - 2 ** -24))]
    u = torch.cat([t64(tiny + near_one), torch.rand(20_000, dtype=torch.float64,
                                                    generator=torch.Generator().manual_seed(14))])
    for dtype in [torch.float64, torch.float32]:
        probs = rows.to(dtype)
        if dtype == torch.float32:
            probs[4] = t64([1e-30, 0, 0, 0, 1e-30]).float()
        for r in range(len(probs)):
            idx = sample(probs[r].expand(len(u), -1), u)
            assert (probs[r][idx] > 0).all(), f"row {r} ({dtype}) picked a zero-probability token"
            uf = u.float()
            uf = uf[uf < 1]  # float32 uniforms (those that did not round up to 1, which is out of range)
            assert (probs[r][sample(probs[r].expand(len(uf), -1), uf)] > 0).all()
    # inverse CDF: u = 0 picks the first supported token, u -> 1 the last
    assert sample(rows[2], t64(0.0)).item() == 3 and sample(rows[1], t64(1 - 2 ** -53)).item() == 1
    assert sample(rows[3], t64(0.2)).item() == 2 and sample(rows[3], t64(0.1999)).item() == 0


def test_sample_matches_distribution_and_handles_garbage(sampler):
    p = t64([0.1, 0.0, 0.25, 0.4, 0.25])
    u = torch.rand(B, dtype=torch.float64, generator=torch.Generator().manual_seed(15))
    assert gof(sample(p.expand(B, -1), u), p) > P_OK
    garbage = t64([[0, 0, 0], [float("nan")] * 3, [float("nan"), 0, 0], [-1.0, -2.0, 0]])
    idx = sample(garbage, t64([0.5, 0.5, 0.999, 0.3]))
    assert ((idx >= 0) & (idx < 3)).all()
    idx = sample(t64([[float("nan"), 0.5, 0.5], [-1.0, 0, 2.0]]), t64([0.0, 0.0]))
    assert idx.tolist() == [1, 2]  # NaN and negative entries count as zero


def test_reduced_draft_vocab_gives_the_same_draws_as_its_full_vocab_q():
    """q kept on the draft vocabulary (never scattered to V) must decide exactly as the scattered q does."""
    g = torch.Generator().manual_seed(0)
    B, K, V = 512, 3, 40
    vocab_ids = torch.tensor([1, 4, 5, 9, 17, 22, 30, 31, 38])
    p = torch.rand(B, K + 1, V, generator=g).pow(4)
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(B, K, len(vocab_ids), generator=g).pow(4)
    q = q / q.sum(-1, keepdim=True)
    q_full = torch.zeros(B, K, V).index_copy_(-1, vocab_ids, q)
    drafts = vocab_ids[torch.randint(len(vocab_ids), (B, K), generator=g)]
    drafts[:5, 0] = 2  # a token outside the draft vocabulary: q = 0, always rejected
    u, f = torch.rand(B, K, dtype=torch.float64, generator=g), torch.rand(B, dtype=torch.float64, generator=g)
    full = rejection_sample_uniform(p, q_full, drafts, u, f)
    reduced = rejection_sample_uniform(p, q, drafts, u, f, vocab_ids=vocab_ids)
    assert torch.equal(full[0], reduced[0]) and torch.equal(full[1], reduced[1])
    assert (reduced[1][:5] == 0).all() and 0 < reduced[1].float().mean() < K


@pytest.mark.parametrize("reduced", [False, True])
def test_proposed_rows_give_the_same_draws_as_a_dense_one_hot_q(reduced):
    """Rows whose drafts were proposed (q one-hot, never built) must decide exactly as the dense one-hot q does,
    beside rows whose drafts were sampled from q, and with every row proposed (no q at all)."""
    g = torch.Generator().manual_seed(1)
    B, K, V = 512, 3, 40
    vocab_ids = torch.tensor([1, 4, 5, 9, 17, 22, 30, 31, 38]) if reduced else torch.arange(V)
    p = torch.randn(B, K + 1, V, generator=g).mul(3).softmax(-1)  # peaked, as a policy's often is
    q = torch.rand(B, K, len(vocab_ids), generator=g).pow(4)
    q = q / q.sum(-1, keepdim=True)
    sampled = vocab_ids[torch.randint(len(vocab_ids), (B, K), generator=g)]
    proposed = p[:, :K].argmax(-1)  # likely drafts, so that rows get deep before the first rejection
    proposed[::3] = torch.randint(V, (len(proposed[::3]), K), generator=g)  # and unlikely ones
    from_history = torch.rand(B, generator=g) < 0.5
    drafts = torch.where(from_history[:, None], proposed, sampled)
    lens = torch.randint(K + 1, (B,), generator=g)
    u, f = torch.rand(B, K, dtype=torch.float64, generator=g), torch.rand(B, dtype=torch.float64, generator=g)
    q_full = torch.zeros(B, K, V).index_copy_(-1, vocab_ids, q)
    dense = torch.where(from_history[:, None, None], torch.zeros(B, K, V).scatter_(-1, drafts.unsqueeze(-1), 1.0), q_full)
    expected = rejection_sample_uniform(p, dense, drafts, u, f, draft_lens=lens)
    got = rejection_sample_uniform(p, q, drafts, u, f, vocab_ids if reduced else None, lens, from_history)
    assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])
    rejected = from_history & (got[1] < lens)
    assert rejected.sum() > 20 and (from_history & (got[1] == lens) & (lens > 0)).sum() > 20  # both outcomes seen
    one_hot = torch.zeros(B, K, V).scatter_(-1, proposed.unsqueeze(-1), 1.0)
    expected = rejection_sample_uniform(p, one_hot, proposed, u, f, draft_lens=lens)
    got = rejection_sample_uniform(p, None, proposed, u, f, draft_lens=lens)
    assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])


def test_a_rejected_proposed_draft_leaves_p_without_it_and_p_where_nothing_else_is_left():
    """The residual against a one-hot q, rows at a time: p with the draft's entry 0, as `residual` computes it
    from a dense one-hot q, and p itself where the draft held all of p's mass (an empty residual)."""
    g = torch.Generator().manual_seed(2)
    B, K, V = 6, 2, 30
    p = torch.randn(B, V, generator=g).mul(3).softmax(-1)
    p[4] = 0.0
    p[4, 7] = 1.0  # all the mass on the draft: nothing else is left
    drafts = torch.randint(V, (B, K), generator=g)
    drafts[4, 1] = 7
    num_accepted = torch.tensor([0, 1, 0, 1, 1, 0])
    fix = torch.tensor([True, True, False, True, True, False])
    x = drafts[torch.arange(B), num_accepted]
    dense = residual(p, torch.zeros_like(p).scatter_(-1, x.unsqueeze(-1), 1.0))
    got = without_rejected_draft(p.clone(), p, drafts, num_accepted, fix)
    assert torch.equal(got[fix], dense[fix]) and torch.equal(got[~fix], p[~fix])
    others = fix & (torch.arange(B) != 4)
    assert got[4, 7] == 1.0 and (got[others].gather(-1, x[others].unsqueeze(-1)) == 0).all()


def test_entropy_is_minus_sum_p_log_p_with_0_log_0_as_0():
    p = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)).mul(4).softmax(-1)
    p[:, ::3] = 0.0  # zeros, as top-k / top-p leave them
    p[1] = 0.0
    p[1, 7] = 1.0  # one-hot: entropy 0, not NaN
    p[2] = 1 / 1000  # uniform: log 1000
    p[3:] /= p[3:].sum(-1, keepdim=True)
    h = entropy(p)
    assert torch.equal(h, -torch.special.xlogy(p, p).sum(-1))
    assert h[1] == 0 and h[2].item() == pytest.approx(math.log(1000), rel=1e-5)


def test_sampling_by_blocks_picks_what_one_cdf_picks():
    """The two ways are the same inverse CDF: on the same uniforms they pick the same tokens (up to float
    rounding at a CDF step, which these draws do not hit), over a real vocabulary size with a shorter last
    block, for float32 and float64 rows."""
    gen = torch.Generator().manual_seed(16)
    V = 9 * S.SAMPLE_BLOCK + 100
    for dtype in (torch.float32, torch.float64):
        probs = torch.softmax(3 * torch.randn(64, V, generator=gen, dtype=dtype), -1)
        probs[:8, ::3] = 0  # zeros inside blocks
        probs[8:16, : 4 * S.SAMPLE_BLOCK] = 0  # whole blocks of zeros
        u = torch.rand(64, dtype=torch.float64, generator=gen)
        u[:4] = t64([0.0, 1 - 2 ** -53, 0.5, 1e-300])
        assert torch.equal(S.blocked_inverse_cdf(probs, u), S.inverse_cdf(probs, u))
        assert S.blocked_inverse_cdf(probs[:3].unsqueeze(1), u[:3].unsqueeze(1)).shape == (3, 1)
