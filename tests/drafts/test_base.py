"""bebop.drafts.base, the interface every draft kind shares: the training unroll computes what inference computes
(catch up, then recurse on its own hidden states), and trains the draft only."""

import pytest
import torch

from bebop.drafts.registry import new_mtp


@pytest.mark.parametrize("layers,feature_layers", [(1, ()), (2, ()), (1, (0, 1)), (2, (1, 0))])
def test_training_unroll_equals_inference_recursion(tiny, layers, feature_layers):
    """The training-time unroll must compute, for every anchor t and depth k, exactly the hidden state the
    engine computes when it catches up on positions <= t with the target's features and then recurses: for the
    one-block MTP, a two-block one and one reading several target layers (EAGLE-3)."""
    torch.manual_seed(0)
    mtp = new_mtp(tiny, seed=1, layers=layers, feature_layers=feature_layers)
    torch.nn.init.normal_(mtp.eh_proj.weight, std=0.3)  # make every input matter
    if feature_layers:
        torch.nn.init.normal_(mtp.fc.weight, std=0.3)
    S, K = 12, 3
    tokens = torch.randint(0, tiny.cfg.vocab_size, (1, S))
    with torch.no_grad():
        out = tiny.forward_full(tokens, capture=mtp.feature_layers)
        feats = mtp.features(out[1] if feature_layers else out)
        outs = mtp.unroll(tokens, feats, K)
        # the engine's features come from the cached forward: the same function of the same tokens
        hidden, captured = tiny(tokens, tiny.new_cache(1, S), capture=(1, 0))
        full, full_captured = tiny.forward_full(tokens, capture=(1, 0))
        torch.testing.assert_close(captured, full_captured, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hidden, full_captured[..., :tiny.cfg.dim], atol=1e-5, rtol=1e-5)
    for t in range(S - K - 1):
        cache = mtp.new_cache(1, S + K)
        h = mtp(tokens[:, 1:t + 2], feats[:, :t + 1], cache)[:, -1:]
        cache.lengths += t + 1
        torch.testing.assert_close(h[0, 0], outs[0][0, t], atol=1e-5, rtol=1e-5)
        for k in range(2, K + 1):
            h = mtp(tokens[:, t + k:t + k + 1], h, cache)
            cache.lengths += 1
            torch.testing.assert_close(h[0, 0], outs[k - 1][0, t], atol=1e-5, rtol=1e-5)


def test_unroll_gradients_reach_mtp_only(tiny):
    mtp = new_mtp(tiny, seed=0)
    tokens = torch.randint(0, tiny.cfg.vocab_size, (2, 10))
    with torch.no_grad():
        hidden = tiny.forward_full(tokens)
    outs = mtp.unroll(tokens, hidden, 3)
    sum(mtp.draft_logits(o).logsumexp(-1).sum() for o in outs).backward()
    assert mtp.eh_proj.weight.grad is not None and mtp.eh_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny.parameters())
