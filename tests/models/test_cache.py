"""bebop.models.cache: the KV cache's buffers and its row moves."""

import torch

from bebop.models.cache import KVCache


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
