"""SpecStats: the one place speculative counters are added up and turned into figures."""

import torch

from bebop.engine.stats import SpecStats


def test_count_step_counts_what_vllm_counts():
    s = SpecStats(draft_len=3, accepted_at=[0, 0, 0])
    s.count_step(3, torch.tensor([0, 2, 3]))
    assert (s.steps, s.drafted, s.accepted, s.accepted_at) == (3, 9, 5, [2, 2, 1])
    assert s.acceptance_rate == 5 / 9 and s.mean_acceptance_length == 1 + 5 / 3 and s.mean_draft_len == 3


def test_adding_sums_counts_and_reforms_ratios():
    a = SpecStats(2, steps=4, drafted=8, accepted=5, accepted_at=[3, 2], tokens=10, entropy_sum=2.0)
    b = SpecStats(2, steps=2, drafted=4, accepted=1, accepted_at=[1, 0], tokens=5, entropy_sum=1.0)
    total = SpecStats.total([a, b])
    assert (total.steps, total.drafted, total.accepted, total.accepted_at, total.tokens) == (6, 12, 6, [4, 2], 15)
    assert total.mean_entropy == 3.0 / 15 and total.per_position_acceptance == [4 / 6, 2 / 6]
    assert SpecStats.total([SpecStats(tokens=3, entropy_sum=None), a]).mean_entropy is None  # unmeasured somewhere


def test_a_summary_adds_up_as_its_counters_do():
    a = SpecStats(2, steps=4, drafted=8, accepted=5, accepted_at=[3, 2], tokens=10, entropy_sum=2.5)
    b = SpecStats(2, tokens=4, entropy_sum=1.0, accepted_at=[0, 0])  # plain steps only
    merged = SpecStats.total(SpecStats.from_summary(s.summary()) for s in (a, b)).summary()
    assert merged == SpecStats.total([a, b]).summary()


def test_from_vllm_counters():
    s = SpecStats.from_vllm({"drafts": 4, "drafted": 12, "accepted": 6, "accepted_at": [3, 2, 1]})
    assert (s.draft_len, s.steps, s.acceptance_rate, s.per_position_acceptance) == (3, 4, 0.5, [0.75, 0.5, 0.25])
    s.tokens = 10
    assert s.mean_entropy is None  # vLLM measures no entropy
    assert SpecStats.from_vllm({"drafts": 0, "drafted": 0, "accepted": 0, "accepted_at": []}).summary()[
        "per_position_acceptance"] == []
