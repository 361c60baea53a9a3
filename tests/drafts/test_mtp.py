"""bebop.drafts.mtp: a fresh MTP's blocks are copies of the target's last layers."""

import torch

from bebop.drafts.registry import new_mtp


def test_new_mtp_blocks_start_from_the_last_target_layers(tiny):
    mtp = new_mtp(tiny, layers=2, feature_layers=(0, 1))
    for block, layer in zip(mtp.blocks, tiny.layers[-2:]):
        for (k, a), (_, b) in zip(block.state_dict().items(), layer.state_dict().items()):
            assert torch.equal(a, b), k
    assert mtp.fc.weight.shape == (tiny.cfg.dim, 2 * tiny.cfg.dim)
    assert len(mtp.new_cache(1, 4).k) == 2  # one KV cache layer per block


