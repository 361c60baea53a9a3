"""Seeds every process derives the same way: a request's seed from its batch's (`row_seed`, `row_seeds`), so
that bebop's engine, its Ray and vLLM workers and the TRL integration sample a row alike, and an RL step's
batch seed (`batch_seed`)."""

ROW_STRIDE = 1_000_003  # a prime: the rows of one batch seed never meet those of the next


def row_seed(seed: int, row: int) -> int:
    """The seed of row `row` of a batch whose seed is `seed`."""
    return seed * ROW_STRIDE + row


def row_seeds(seed: int, n: int, first: int = 0) -> list[int]:
    """The seeds of rows first..first + n - 1 of a batch whose seed is `seed`."""
    return [row_seed(seed, first + b) for b in range(n)]


def batch_seed(seed: int, step: int) -> int:
    """The seed of RL step `step`'s batch in a run whose seed is `seed` (31 bits)."""
    return (seed * ROW_STRIDE + step * 7919 + 17) % (2 ** 31)
