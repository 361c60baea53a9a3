"""bebop.autodraft: the K that maximises expected tokens per second, the running acceptance, the cost table."""

import itertools
import json

import pytest
import torch

import bebop.autodraft as autodraft
from bebop.autodraft import Acceptance, bucket, choose_draft_len, step_costs
from bebop.engine import generate
from bebop.models.registry import chat_ids
from bebop.mtp import new_mtp


def brute_force(alphas, costs, max_k):
    def rate(K):
        return (1 + sum(torch.prod(torch.tensor(alphas[:j + 1])).item() for j in range(K))) / costs[K]
    return max(range(max_k + 1), key=rate)


def test_choose_draft_len_maximises_tokens_per_second():
    assert choose_draft_len(torch.tensor([0.9, 0.9, 0.9]), [1.0, 1.1, 1.2, 1.3], 3) == 3  # cheap drafts, accepted
    assert choose_draft_len(torch.tensor([0.1, 0.1, 0.1]), [1.0, 1.5, 2.0, 2.5], 3) == 0  # costly and rejected
    assert choose_draft_len(torch.tensor([0.9, 0.9, 0.9]), [1.0, 1.1, 1.2, 1.3], 1) == 1  # capped
    for alphas in itertools.product([0.2, 0.6, 0.95], repeat=3):
        for costs in ([1.0, 1.13, 1.37, 1.61], [1.0, 1.91, 2.83, 3.71], [1.0, 1.07, 2.03, 2.11]):  # no ties
            assert choose_draft_len(torch.tensor(alphas, dtype=torch.float64), costs, 3) == \
                brute_force(alphas, costs, 3)


def test_acceptance_counts_conditional_rates_and_forgets():
    acc = Acceptance(3, prior=0.5, weight=2.0, decay=1.0)
    assert acc.alphas().tolist() == [0.5, 0.5, 0.5]
    acc.update(2, torch.tensor([0, 1, 2, 2]))  # draft 1: 3 of 4 accepted; draft 2: reached by 3, accepted by 2
    assert acc.alphas().tolist() == pytest.approx([(3 + 1) / (4 + 2), (2 + 1) / (3 + 2), 0.5])
    fading = Acceptance(1, prior=0.5, decay=0.9)
    fading.update(1, torch.zeros(100, dtype=torch.long))  # everything rejected
    low = float(fading.alphas()[0])
    for _ in range(50):
        fading.update(0, torch.zeros(100, dtype=torch.long))  # steps without drafts: no evidence
    assert low < 0.05 and float(fading.alphas()[0]) > 0.3  # drifts back, so drafting is tried again


def test_step_costs_are_probed_once_and_cached(tiny_llama, tmp_path, monkeypatch):
    model, _ = tiny_llama
    mtp = new_mtp(model, 0)
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    probes, probe = [], autodraft.probe_costs
    monkeypatch.setattr(autodraft, "probe_costs", lambda *a, **k: probes.append(a[2]) or probe(*a, **k))
    costs = step_costs(model, mtp, 3, 2)
    assert len(costs) == 3 and all(c > 0 for c in costs) and probes == [4]  # batch 3 probed as its bucket, 4
    assert step_costs(model, mtp, 4, 2) == costs and probes == [4]  # from the file
    assert len(step_costs(model, mtp, 4, 1)) == 2 and probes == [4]
    step_costs(model, mtp, 5, 2)
    assert probes == [4, 8]
    assert len(json.loads((tmp_path / autodraft.COST_FILE).read_text())) == 2
    (tmp_path / autodraft.COST_FILE).write_text("{not json")  # a broken cache is re-probed, not an error
    assert len(step_costs(model, mtp, 1, 2)) == 3
    assert [bucket(b) for b in (1, 2, 3, 16, 17)] == [1, 2, 4, 16, 32]


def test_generate_with_auto_draft_len(tiny_qwen3, tmp_path, monkeypatch):
    model, tok = tiny_qwen3
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    prompts = [chat_ids(tok, t) for t in ["hello", "What is 2+2?"]]
    gen = generate(model, prompts, 20, mode="spec", mtp=new_mtp(model, 0), draft_len="auto", max_draft_len=3,
                   seed=1, eos_ids=[])
    assert all(len(r.tokens) == 20 for r in gen.rollouts)
    st = gen.stats
    assert st.draft_len == 3 and len(st.accepted_at) == 3 and st.drafted <= 3 * st.steps
    assert st.steps == 0 or 0 < st.mean_draft_len <= 3
    with pytest.raises(ValueError):
        generate(model, prompts, 4, mode="spec", mtp=new_mtp(model, 0), draft_len="auto", max_draft_len=-1)
    with pytest.raises(ValueError):
        generate(model, prompts, 4, mode="spec", mtp=new_mtp(model, 0), draft_len="sometimes")


def test_step_costs_are_corrected_by_measured_steps(monkeypatch):
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0, 1.2, 1.4][:max_k + 1])
    costs = autodraft.StepCosts(None, None, 2, decay=0.5)
    assert costs(16) == [1.0, 1.2, 1.4]
    costs.record(16, 1, 2.4)  # a real K = 1 step takes twice the probe: one sample is not trusted yet ...
    assert costs(16) == pytest.approx([2.0, 2.4, 2.8])  # ... but scales the probe
    costs.record(16, 1, 3.6)
    assert costs(16)[1] == pytest.approx(3.0)  # measured twice: its running average
    assert costs(16)[0] == pytest.approx(1.0 * (2.0 + 3.0) / 2)
    assert costs(3) == pytest.approx([2.5, 3.0, 3.5])  # another batch bucket: probe times the mean ratio
    assert costs.wants_baseline(16)
    costs.record(16, 0, 1.5)
    costs.record(9, 0, 1.5)  # the same bucket as 16
    assert not costs.wants_baseline(16) and costs(16)[0] == pytest.approx(1.5) and costs.wants_baseline(8)


def test_measured_costs_follow_the_row_count_within_a_bucket(monkeypatch):
    """33..64 rows share a bucket, but a step at 40 rows is cheaper than one at 64: what is learnt is the ratio
    to the probe interpolated at the exact row count, so a K measured on a drained batch is not taken for
    cheap at the full one."""
    tables = {32: [1.0, 2.0], 64: [2.0, 4.0]}
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: tables[batch])
    costs = autodraft.StepCosts(None, None, 1, decay=0.5)
    assert costs.probe(48) == [1.5, 3.0] and costs.probe(64) == [2.0, 4.0] and costs.probe(33)[0] > 1.0
    costs.record(64, 0, 4.0)
    costs.record(64, 0, 4.0)  # plain steps at the full batch: twice the probe
    costs.record(40, 1, 3.0)
    costs.record(40, 1, 3.0)  # drafting steps after rows finished: probe(40) = [1.25, 2.5], so 1.2x the probe
    assert costs(64) == pytest.approx([4.0, 4.8]) and costs(40) == pytest.approx([2.5, 3.0])


def test_plain_steps_are_measured_again_and_old_measurements_fade(monkeypatch):
    """The baseline is taken again after `refresh` steps without it, and a measurement made many steps ago
    hardly weighs against a new one (a baseline measured in a generation's first, slow steps must not stay)."""
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0, 1.2, 1.4][:max_k + 1])
    costs = autodraft.StepCosts(None, None, 2, decay=0.5, refresh=4)
    costs.record(16, 0, 2.0)
    costs.record(16, 0, 2.0)
    wanted = []
    for _ in range(4):
        wanted.append(costs.wants_baseline(16))
        costs.record(16, 1, 1.2)
    assert wanted == [False] * 4 and costs.wants_baseline(16)
    costs.record(16, 0, 1.0)
    assert not costs.wants_baseline(16)
    assert costs(16)[0] == pytest.approx(0.5 ** 5 * 2.0 + (1 - 0.5 ** 5) * 1.0)  # 5 steps old: weight 1/32
    assert costs(16)[1] == pytest.approx(1.2)


def test_probe_buckets_covers_every_bucket_a_draining_batch_passes(monkeypatch):
    seen = []
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: seen.append((batch, max_k)))
    autodraft.probe_buckets(None, None, 5, 3)
    assert seen == [(1, 3), (2, 3), (4, 3), (8, 3)]


def test_step_costs_are_kept_across_generate_calls(tiny_llama, tmp_path, monkeypatch):
    """The forced plain steps and the measured costs belong to the (target, kernels, MTP, max K), not to one
    generate call: a second call at the same batch size takes no forced plain step."""
    import copy

    model, tok = tiny_llama
    mtp = new_mtp(model, seed=4)
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    plain_steps = []
    real = autodraft.StepCosts.wants_baseline
    monkeypatch.setattr(autodraft.StepCosts, "wants_baseline",
                        lambda self, batch: plain_steps.append(real(self, batch)) or plain_steps[-1])
    prompts = [chat_ids(tok, "hello")] * 2
    generate(model, prompts, 8, mode="spec", mtp=mtp, draft_len="auto", max_draft_len=2, eos_ids=[])
    first = autodraft.step_costs_for(model, mtp, 2)
    assert plain_steps.count(True) == 2 and first.measured[(2, 0)][1] >= 2  # two forced plain steps, measured
    plain_steps.clear()
    generate(model, prompts, 8, mode="spec", mtp=mtp, draft_len="auto", max_draft_len=2, eos_ids=[])
    assert plain_steps and not any(plain_steps) and autodraft.step_costs_for(model, mtp, 2) is first
    assert autodraft.step_costs_for(model, mtp, 3) is not first  # another max K: its own costs
    other = copy.deepcopy(model)
    other.attention = ("matmul", "matmul")  # other kernels cost otherwise
    assert autodraft.step_costs_for(other, mtp, 2) is not first
