"""The entropy study's tests share a synthetic trace (`synthetic_table`)."""

import numpy as np
import pytest

from bebop.studies.entropy import TABLE_COLUMNS


def _synthetic_table(prob_slope=-0.1, greedy_slope=-0.3, temps=(0.6, 0.8, 1.0, 1.2, 1.4), n=300, seed=0):
    """Tokens whose expected acceptance is linear in entropy, with a known slope per mode."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in TABLE_COLUMNS}
    for T in temps:
        for depth in (0, 1, 2):
            m = n if depth == 0 else n // (2 * depth)
            h = T * rng.uniform(0.2, 2.0, m)  # hotter runs have higher entropy
            alpha = np.clip(0.95 + prob_slope * h + rng.normal(0, 0.03, m), 0, 1)
            greedy = np.clip(0.9 + greedy_slope * h + rng.normal(0, 0.03, m), 0, 1)
            cols["run"] += [f"T={T}"] * m
            cols["temperature"] += [T] * m
            cols["policy"] += ["base"] * m
            cols["depth"] += [depth] * m
            cols["target_entropy"] += list(h)
            cols["draft_entropy"] += list(h * 1.1)
            cols["alpha"] += list(alpha)
            cols["greedy_accept_prob"] += list(greedy)
            cols["target_max_prob"] += list(np.clip(greedy + 0.05, 0, 1))
            cols["accepted"] += list(rng.random(m) < alpha)
    return {k: np.asarray(v) for k, v in cols.items()}



@pytest.fixture
def synthetic_table():
    """The `_synthetic_table` function, as a fixture (test modules should not import conftest)."""
    return _synthetic_table
