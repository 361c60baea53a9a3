import math

import pytest
import torch
import torch.nn.functional as F

from bebop.training.losses import (acceptance, ce_loss, e2e_tv_loss, expected_accepted_length, kl_loss, lk_loss,
                          tv_loss)

B, T, K, V = 2, 3, 3, 7


def _dists(*shape, seed, dtype=torch.float64, peaked=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(peaked * torch.randn(*shape, generator=g, dtype=torch.float64), -1).to(dtype)


def _inputs(seed=0):
    p = _dists(B, T, K, V, seed=seed)
    z = torch.randn(B, T, K, V, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    z.requires_grad_(True)
    g = torch.Generator().manual_seed(seed + 2)
    mask = torch.rand(B, T, K, generator=g) < 0.6
    mask[0, 0] = True   # one fully valid position
    mask[0, 1] = False  # one fully masked position
    mask[1, 0] = torch.tensor([True, False, True])  # a hole: depth 3 must not count
    return p, z, mask


# naive references: loops over positions and depths, python sums over the vocabulary

def _ref_alpha(p, q):
    return sum(min(p[v], q[v]) for v in range(len(p)))


def _ref_kl(p, q):
    return sum(p[v] * torch.log(p[v] / q[v]) for v in range(len(p)) if p[v] > 0)


def _ref_entries(p, q, mask, f):
    """Mean of f(p_bt_k, q_bt_k) over valid (b, t, k)."""
    vals = [f(p[b, t, k], q[b, t, k]) for b in range(B) for t in range(T) for k in range(K) if mask[b, t, k]]
    return sum(vals) / len(vals)


def _ref_lk(p, q, eta):
    a = _ref_alpha(p, q)
    lam = math.exp(-eta * a.item())  # a python float: constant by construction
    return lam * _ref_kl(p, q) + (1 - lam) * (1 - a)


def _ref_e2e(p, q, mask):
    losses = []
    for b in range(B):
        for t in range(T):
            ea, run, n = 0.0, 1.0, 0
            for k in range(K):
                if not mask[b, t, k]:
                    break
                run = run * _ref_alpha(p[b, t, k], q[b, t, k])
                ea = ea + run
                n += 1
            if n:
                losses.append(1 - ea / n)
    return sum(losses) / len(losses)


def _check(loss, ref, z):
    (g,) = torch.autograd.grad(loss, z, retain_graph=True)
    (g_ref,) = torch.autograd.grad(ref, z)
    assert loss.shape == ()
    torch.testing.assert_close(loss, ref, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-8)
    assert g.abs().sum() > 0


@pytest.mark.parametrize("name", ["tv", "kl", "lk", "e2e"])
@pytest.mark.parametrize("masked", [True, False])
def test_losses_match_naive_reference(name, masked):
    p, z, mask = _inputs()
    if not masked:
        mask = torch.ones(B, T, K, dtype=torch.bool)
    q = torch.softmax(z, -1)
    m = mask if masked else None
    if name == "tv":
        loss, ref = tv_loss(p, q, m), _ref_entries(p, q, mask, lambda a, b: 1 - _ref_alpha(a, b))
    elif name == "kl":
        loss, ref = kl_loss(p, q, m), _ref_entries(p, q, mask, _ref_kl)
    elif name == "lk":
        loss, ref = lk_loss(p, q, m, eta=2.5), _ref_entries(p, q, mask, lambda a, b: _ref_lk(a, b, 2.5))
    else:
        loss, ref = e2e_tv_loss(p, q, m), _ref_e2e(p, q, mask)
    _check(loss, ref, z)


def test_ce_matches_reference_and_torch():
    _, z, mask = _inputs(seed=3)
    labels = torch.randint(0, V, (B, T, K), generator=torch.Generator().manual_seed(4))
    labels[~mask] = -1  # padding labels (out of range) must be ignored, not crash
    loss = ce_loss(z, labels, mask)
    vals = [torch.logsumexp(z[b, t, k], 0) - z[b, t, k, labels[b, t, k]]
            for b in range(B) for t in range(T) for k in range(K) if mask[b, t, k]]
    _check(loss, sum(vals) / len(vals), z)
    torch.testing.assert_close(loss, F.cross_entropy(z[mask], labels[mask]))
    full = torch.randint(0, V, (B, T, K))
    torch.testing.assert_close(ce_loss(z, full), F.cross_entropy(z.reshape(-1, V), full.reshape(-1)))


def test_acceptance_is_one_minus_tv():
    p, z, _ = _inputs(seed=5)
    q = torch.softmax(z, -1)
    alpha = acceptance(p, q)
    assert alpha.shape == (B, T, K)
    torch.testing.assert_close(alpha, 1 - 0.5 * (p - q).abs().sum(-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(acceptance(p, p), torch.ones(B, T, K, dtype=p.dtype))


def test_e2e_matches_simulated_acceptance_walk():
    """1 - e2e_tv = E[A]/K, with E[A] the mean number of drafts kept by a walk that stops at the first rejection."""
    p, q = _dists(K + 1, V, seed=6), _dists(K + 1, V, seed=7)
    alpha = acceptance(p, q)
    ea = expected_accepted_length(alpha)
    n = 200_000
    u = torch.rand(n, K + 1, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    accepted = (u < alpha).to(torch.int64).cumprod(-1).sum(-1).double()
    se = accepted.std() / math.sqrt(n)
    assert abs(accepted.mean() - ea) < 5 * se
    assert abs((1 - accepted.mean() / (K + 1)) - e2e_tv_loss(p, q)) < 5 * se / (K + 1)


def test_acceptance_matches_token_level_rejection_sampling():
    """Draw x ~ q, keep it with prob min(1, p(x)/q(x)), stop at the first rejection: the real rule."""
    depth, n, v = 3, 100_000, 6
    p, q = _dists(depth, v, seed=9, peaked=2.0), _dists(depth, v, seed=10, peaked=2.0)
    alpha = acceptance(p, q)
    g = torch.Generator().manual_seed(11)
    x = torch.stack([torch.multinomial(q[k], n, replacement=True, generator=g) for k in range(depth)], -1)
    ratio = (p.gather(1, x.T) / q.gather(1, x.T)).T.clamp(max=1)  # [n, depth]
    keep = torch.rand(n, depth, generator=g, dtype=torch.float64) < ratio
    rate = keep.double().mean(0)  # per depth, each depth on its own
    assert (rate - alpha).abs().max() < 5 * (alpha * (1 - alpha) / n).sqrt().max()
    walk = keep.to(torch.int64).cumprod(-1).sum(-1).double()
    assert abs(walk.mean() - expected_accepted_length(alpha)) < 5 * walk.std() / math.sqrt(n)


def test_masked_depth_ends_the_product():
    p, z, _ = _inputs(seed=12)
    q = torch.softmax(z, -1)
    p, q = p[0, 0], q[0, 0]  # [K, V]
    mask = torch.tensor([True, False, True])
    alpha = acceptance(p, q)
    torch.testing.assert_close(expected_accepted_length(alpha, mask), alpha[0])
    loss = e2e_tv_loss(p, q, mask)
    torch.testing.assert_close(loss, e2e_tv_loss(p[:1], q[:1]))
    torch.testing.assert_close(loss, 1 - alpha[0])
    (g,) = torch.autograd.grad(loss, z)
    assert g[0, 0, 1:].abs().max() == 0 and g[0, 0, 0].abs().max() > 0
    # a hole is not the same as an all-valid row (guards against ignoring the mask)
    assert not torch.allclose(loss, e2e_tv_loss(p, q))


def test_expected_accepted_length_closed_form():
    alpha = torch.tensor([[0.5, 0.4, 0.0, 0.9], [1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(expected_accepted_length(alpha), torch.tensor([0.5 + 0.2, 4.0]))
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    torch.testing.assert_close(expected_accepted_length(alpha, mask), torch.tensor([0.7, 3.0]))


def test_kl_with_zero_q_is_finite():
    p = torch.tensor([[0.5, 0.5, 0.0]])
    q = torch.tensor([[0.7, 0.3, 0.0]])  # q = 0 only where p = 0
    q0 = torch.tensor([[1.0, 0.0, 0.0]], requires_grad=True)  # q = 0 where p > 0
    for loss, big in ((kl_loss(p, q0), 40.0), (lk_loss(p, q0), 5.0)):  # ~0.5 * 87 nats for the zero
        (g,) = torch.autograd.grad(loss, q0)
        assert torch.isfinite(loss) and loss > big and torch.isfinite(g).all()
    # 0 log 0 = 0: p = 0 entries add nothing
    assert abs(kl_loss(p, q).item() - (0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3))) < 1e-6
    # a p that itself requires grad must not get nan gradients at its zeros
    pg = p.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(kl_loss(pg, q), pg)
    assert torch.isfinite(g).all()


def test_lk_lambda_is_detached_exp_of_acceptance():
    p, z, _ = _inputs(seed=13)
    q = torch.softmax(z, -1)
    eta = 3.0
    alpha = acceptance(p, q)
    kl = (p * (p.log() - q.log())).sum(-1)
    lam = torch.exp(-eta * alpha).detach()  # an explicit constant
    ref = (lam * kl + (1 - lam) * (1 - alpha)).mean()
    loss = lk_loss(p, q, eta=eta)
    torch.testing.assert_close(loss, ref)
    (g,) = torch.autograd.grad(loss, z, retain_graph=True)
    (g_ref,) = torch.autograd.grad(ref, z, retain_graph=True)
    torch.testing.assert_close(g, g_ref)
    lam_live = torch.exp(-eta * alpha)  # what a non-detached lambda would give: a different gradient
    (g_live,) = torch.autograd.grad((lam_live * kl + (1 - lam_live) * (1 - alpha)).mean(), z)
    assert (g - g_live).abs().max() > 1e-4
    # endpoints of the schedule
    torch.testing.assert_close(lk_loss(p, q, eta=0.0), kl_loss(p, q))
    torch.testing.assert_close(lk_loss(p, p, eta=eta), torch.zeros((), dtype=p.dtype))


def test_all_masked_is_zero_not_nan():
    p, z, _ = _inputs(seed=14)
    q = torch.softmax(z, -1)
    none = torch.zeros(B, T, K, dtype=torch.bool)
    for f in (tv_loss, kl_loss, lk_loss, e2e_tv_loss):
        loss = f(p, q, none)
        (g,) = torch.autograd.grad(loss, z, retain_graph=True)
        assert loss == 0 and (g == 0).all()


def test_float32_large_vocab_matches_float64():
    """V ~ 50k in float32, including a draft that underflows to exact zeros."""
    n, v = 4, 50_000
    p64 = _dists(n, 2, v, seed=15, peaked=4.0)
    z = torch.randn(n, 2, v, generator=torch.Generator().manual_seed(16), dtype=torch.float64) * 4
    z[0, 0, :100] = -200  # softmax in float32 gives exact zeros here, while p > 0
    q64 = torch.softmax(z, -1)
    p32, z32 = p64.float(), z.float().requires_grad_(True)
    q32 = torch.softmax(z32, -1)
    assert (q32 == 0).any()
    for f in (tv_loss, kl_loss, lk_loss, e2e_tv_loss):
        l32, l64 = f(p32, q32), f(p64, q64)
        (g,) = torch.autograd.grad(l32, z32, retain_graph=True)
        assert torch.isfinite(l32) and torch.isfinite(g).all()
        # float64 clamps at a far smaller tiny, so on the zeroed row KL differs; compare the rest tightly
        if f in (kl_loss, lk_loss):
            l32, l64 = f(p32[1:], q32[1:]), f(p64[1:], q64[1:])
        assert abs(l32.double() - l64) < 1e-4 * max(1.0, l64.abs())
