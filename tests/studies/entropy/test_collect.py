"""The per-token statistics the study's collected trace holds (`token_stats`, bebop.sampling's, which
bebop.studies.entropy re-exports): entropies, alpha and the greedy acceptance probability against hand-worked
cases and a numpy reference."""

import math

import numpy as np
import pytest
import torch

from bebop.studies.entropy import token_stats


def test_uniform_entropy_is_log_n_with_zero_padding():
    V = 64
    for n in (1, 2, 7, 64):
        p = torch.zeros(V, dtype=torch.float64)
        p[:n] = 1.0 / n  # the zeros must contribute 0 log 0 = 0, not nan
        s = token_stats(p, p)
        assert s["target_entropy"].item() == pytest.approx(math.log(n), abs=1e-12)
        assert s["draft_entropy"].item() == pytest.approx(math.log(n), abs=1e-12)
        assert s["target_max_prob"].item() == pytest.approx(1.0 / n)


def test_p_equals_q_hits_both_oracles():
    p = torch.softmax(torch.randn(4, 100, generator=torch.Generator().manual_seed(0)), -1)
    s = token_stats(p, p.clone())
    torch.testing.assert_close(s["alpha"], torch.ones(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(s["greedy_accept_prob"], s["target_max_prob"])


def test_disjoint_supports_accept_nothing():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.9, 0.1])
    s = token_stats(p, q)
    assert s["alpha"].item() == 0.0
    assert s["greedy_accept_prob"].item() == 0.0
    assert s["target_max_prob"].item() == 0.5


def test_two_point_distributions_by_hand():
    # p = (0.7, 0.3), q = (0.4, 0.6): min = (0.4, 0.3) -> alpha 0.7; argmax q = 1 -> p = 0.3
    p = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    q = torch.tensor([[0.4, 0.6], [0.1, 0.9]], dtype=torch.float64)
    s = token_stats(p, q)
    torch.testing.assert_close(s["alpha"], torch.tensor([0.7, 0.9], dtype=torch.float64))
    torch.testing.assert_close(s["greedy_accept_prob"], torch.tensor([0.3, 0.8], dtype=torch.float64))
    torch.testing.assert_close(s["target_max_prob"], torch.tensor([0.7, 0.8], dtype=torch.float64))
    h = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    assert s["target_entropy"][0].item() == pytest.approx(h, abs=1e-12)
    hq = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    assert s["draft_entropy"][1].item() == pytest.approx(hq, abs=1e-12)


def test_random_batch_matches_numpy_reference():
    rng = np.random.default_rng(1)
    shape, V = (3, 5), 50
    p = rng.dirichlet(np.full(V, 0.3), size=shape)
    q = rng.dirichlet(np.full(V, 0.3), size=shape)
    p[..., :5] = 0.0  # some exact zeros in both
    q[..., 3:8] = 0.0
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)

    def ent(a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.where(a > 0, a * np.log(a), 0.0).sum(-1)

    ref = dict(target_entropy=ent(p), draft_entropy=ent(q), alpha=np.minimum(p, q).sum(-1),
               greedy_accept_prob=np.take_along_axis(p, q.argmax(-1)[..., None], -1)[..., 0],
               target_max_prob=p.max(-1))
    s = token_stats(torch.from_numpy(p), torch.from_numpy(q))
    for k, v in ref.items():
        assert s[k].shape == shape
        np.testing.assert_allclose(s[k].numpy(), v, rtol=1e-10, atol=1e-12, err_msg=k)


def test_low_precision_input_is_reduced_in_fp32():
    p = torch.softmax(torch.randn(2, 1000, generator=torch.Generator().manual_seed(2)), -1)
    s = token_stats(p.bfloat16(), p.bfloat16())
    assert s["alpha"].dtype == torch.float32
    with pytest.raises(ValueError, match="shape"):
        token_stats(p, p[:, :10])
