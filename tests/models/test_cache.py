"""bebop.models.cache: the KV cache's buffers and its row moves."""

import pytest
import torch

from bebop.models.cache import KVCache, step_positions


def test_kv_cache_layers_share_no_storage():
    """Each layer's K and V buffer is an allocation of its own: writes through views of one base are what
    torch.compile miscompiled (bebop.models.compiled)."""
    for paged in (False, True):
        cache = KVCache(3, 2, 1, 40, 4, paged=paged)
        cache.keep_rows(torch.tensor([1]))
        bases = {t.untyped_storage().data_ptr() for t in cache.k + cache.v}
        assert len(bases) == 6


def test_kv_cache_keep_rows_moves_only_what_changes_place():
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


@pytest.mark.parametrize("paged", [False, True])
def test_a_forward_past_the_cache_is_refused_before_anything_is_written(paged):
    """A paged cache's kernel writes wherever a position points (past the last row: outside the buffer, a
    crash much later), so the positions are checked for every kind of cache before the forward."""
    cache = KVCache(1, 2, 1, 40, 4, paged=paged)
    cache.lengths = torch.tensor([30, 37])
    with pytest.raises(RuntimeError, match="position 40, past the KV cache's 40"):
        step_positions(cache, 4, 1)
    if not paged:  # (a paged one builds the kernel's step, which needs vLLM's kernels loaded)
        positions, _ = step_positions(cache, 3, 1)
        assert positions.tolist() == [[30, 31, 32], [37, 38, 39]]
