import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.errors import BebopError
from bebop.models.registry import load_model
from bebop.drafts.registry import load_mtp, new_mtp


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model("tiny-llama")
    return model


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


def test_new_mtp_blocks_start_from_the_last_target_layers(tiny):
    mtp = new_mtp(tiny, layers=2, feature_layers=(0, 1))
    for block, layer in zip(mtp.blocks, tiny.layers[-2:]):
        for (k, a), (_, b) in zip(block.state_dict().items(), layer.state_dict().items()):
            assert torch.equal(a, b), k
    assert mtp.fc.weight.shape == (tiny.cfg.dim, 2 * tiny.cfg.dim)
    assert len(mtp.new_cache(1, 4).k) == 2  # one KV cache layer per block


def test_unroll_gradients_reach_mtp_only(tiny):
    mtp = new_mtp(tiny, seed=0)
    tokens = torch.randint(0, tiny.cfg.vocab_size, (2, 10))
    with torch.no_grad():
        hidden = tiny.forward_full(tokens)
    outs = mtp.unroll(tokens, hidden, 3)
    sum(mtp.draft_logits(o).logsumexp(-1).sum() for o in outs).backward()
    assert mtp.eh_proj.weight.grad is not None and mtp.eh_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny.parameters())


def test_checkpoint_round_trip_and_reduced_vocab(tiny, tmp_path):
    mtp = new_mtp(tiny, seed=3)
    mtp.set_draft_vocab(torch.tensor([5, 2, 9, 40, 2]))
    mtp.save(tmp_path / "m", loss="tv")
    back = load_mtp(tmp_path / "m", tiny)
    assert back.vocab_ids.tolist() == [2, 5, 9, 40]
    assert back.config.meta["loss"] == "tv"
    for (k, a), (_, b) in zip(mtp.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    h = torch.randn(3, tiny.cfg.dim)
    q = back.full_vocab(back.draft_logits(h).softmax(-1))
    assert q.shape == (3, tiny.cfg.vocab_size)
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    outside = torch.ones(tiny.cfg.vocab_size, dtype=torch.bool)
    outside[back.vocab_ids] = False
    assert q[:, outside].abs().max() == 0


def test_checkpoint_round_trip_of_the_architecture(tiny, tmp_path):
    mtp = new_mtp(tiny, seed=4, layers=2, feature_layers=(1, 0))
    mtp.save(tmp_path / "m")
    back = load_mtp(tmp_path / "m", tiny)
    assert (back.config.layers, back.feature_layers) == (2, (1, 0))
    for (k, a), (_, b) in zip(mtp.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    # a checkpoint from before multi-block MTPs names its one block "block."
    one = new_mtp(tiny, seed=5)
    one.save(tmp_path / "old")
    state = {k.replace("blocks.0.", "block."): v for k, v in load_file(str(tmp_path / "old.safetensors")).items()}
    save_file(state, str(tmp_path / "old.safetensors"), metadata={"save_id": json.loads((tmp_path / "old.json").read_text())["save_id"]})
    old = load_mtp(tmp_path / "old", tiny)
    for (k, a), (_, b) in zip(one.state_dict().items(), old.state_dict().items()):
        assert torch.equal(a, b), k
    # feature layers the model does not have
    raw = json.loads((tmp_path / "m.json").read_text())
    raw["feature_layers"] = [0, 7]
    (tmp_path / "m.json").write_text(json.dumps(raw))
    with pytest.raises(BebopError, match="does not fit"):
        load_mtp(tmp_path / "m", tiny)


def test_mismatched_or_broken_checkpoint_is_a_clear_error(tiny, tmp_path):
    other, _ = load_model("tiny-qwen3")
    new_mtp(other).save(tmp_path / "qwen")
    with pytest.raises(BebopError, match="does not fit"):
        load_mtp(tmp_path / "qwen", tiny)
    with pytest.raises(BebopError, match="needs both"):
        load_mtp(tmp_path / "missing", tiny)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BebopError, match="cannot read"):
        load_mtp(tmp_path / "bad", tiny)
