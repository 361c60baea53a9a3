"""bebop.seeds: every process derives a row's seed alike."""

import torch

from bebop.engine.scheduler import row_generators
from bebop.seeds import batch_seed, row_seed, row_seeds


def test_row_seeds_are_the_formula():
    assert row_seeds(7, 3) == [7 * 1_000_003, 7 * 1_000_003 + 1, 7 * 1_000_003 + 2]
    assert row_seeds(7, 2, first=5) == [row_seed(7, 5), row_seed(7, 6)]
    assert batch_seed(3, 2) == (3 * 1_000_003 + 2 * 7919 + 17) % 2 ** 31


def test_the_engines_row_generators_draw_from_the_helpers_seeds():
    for seed in (0, 11, -4):
        engine = row_generators(seed, 4)
        helper = [torch.Generator().manual_seed(s % 2 ** 64) for s in row_seeds(seed, 4)]
        for a, b in zip(engine, helper):
            assert torch.equal(torch.rand(5, generator=a, dtype=torch.float64),
                               torch.rand(5, generator=b, dtype=torch.float64))
