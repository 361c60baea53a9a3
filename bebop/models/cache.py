"""The KV cache of a decoder (target or draft): static K/V buffers per layer and each row's committed length,
and the positions and attention bias of one forward's new tokens over it."""

import torch

from bebop.models.kernels import PAGE, PagedStep


class KVCache:
    """Static K/V buffers, one pair per layer, and each row's committed length. Plain: a layer's buffer is
    [B, n_kv_heads, max_len, head_dim]. Paged (`paged`, for vLLM's CPU attention kernel, attention kind "paged"):
    each row's positions in blocks of PAGE, [B, blocks, n_kv_heads, PAGE, head_dim], written and read only by
    that kernel (its layout inside a block is its own). Rows are whole either way, so moving and copying rows
    is the same code. Each layer's buffer is its own allocation, not a slice of one [n_layers, ...] tensor: a
    compiled forward (bebop.models.compiled) writes every layer's buffer in one graph, and torch.compile
    miscompiled those writes when the buffers were views of one base."""

    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim, dtype=torch.float32, paged=False, device=None):
        self.max_len, self.paged = max_len, paged
        shape = (batch, -(-max_len // PAGE), n_kv_heads, PAGE, head_dim) if paged else \
            (batch, n_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` [n], in that order, as rows 0..n-1, so later forwards do no work for the others.
        Only rows that change place are copied (the engine fills a finished row's slot with one of the last
        rows), then each buffer becomes a view of its first n rows, still contiguous."""
        n, rows = len(rows), rows.to(self.lengths.device)
        dst = (rows != torch.arange(n, device=rows.device)).nonzero().squeeze(1)
        src = rows[dst]
        for buffers in (self.k, self.v):
            for i, buf in enumerate(buffers):
                if len(dst):
                    buf[dst] = buf[src]  # the right-hand side is gathered before any write
                buffers[i] = buf[:n]
        self.lengths = self.lengths[rows]

    def write_rows(self, rows: torch.Tensor, src: "KVCache", src_rows: torch.Tensor) -> None:
        """Copy rows `src_rows` of another cache of the same kind (a freshly prefilled prompt) into `rows` of
        this one, lengths included: continuous batching puts a new request into a finished row, and one
        prefilled prompt can fill several rows (N samples of one prompt pay for one prefill)."""
        assert src.paged == self.paged
        for mine, theirs in zip(self.k + self.v, src.k + src.v):
            if self.paged:  # blocks
                mine[rows, :theirs.shape[1]] = theirs[src_rows]
            else:  # positions
                mine[rows, :, :theirs.shape[2]] = theirs[src_rows]
        self.lengths[rows] = src.lengths[src_rows]


def step_positions(cache: KVCache, T: int, n_heads: int = 0, valid: torch.Tensor | None = None):
    """Positions [B, T] of T new tokens per row, and the additive causal bias [B, 1, T, S] over the cache
    (0 where a row may attend, -inf elsewhere), built once per forward in the cache's dtype (every layer and
    every attention kernel takes it as is); for a paged cache, a PagedStep (for `n_heads` query heads, and
    with `valid` [B, T] for a packed step's real tokens only) instead of the bias."""
    device = cache.lengths.device
    positions = cache.lengths.unsqueeze(1) + torch.arange(T, device=device)
    S = int(positions.max()) + 1
    if S > cache.max_len:  # (a paged cache's kernel checks nothing: past the last row it writes outside memory)
        raise RuntimeError(f"{T} new tokens reach position {S - 1}, past the KV cache's {cache.max_len}")
    if cache.paged:
        return positions, PagedStep.build(cache, positions, n_heads, valid)
    allowed = torch.arange(S, device=device).view(1, 1, 1, S) <= positions.view(-1, 1, T, 1)
    bias = torch.zeros(allowed.shape, dtype=cache.dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return positions, bias
