"""bebop.engine.draft_len: the K that maximises expected tokens per second, the running acceptance, the cost table."""

import itertools
import json

import pytest
import torch

import bebop.engine.draft_len as autodraft
from bebop.engine.draft_len import (Acceptance, bucket, choose_draft_len, choose_row_draft_lens, drain_seconds, step_costs,
                                   time_per_token)
from bebop.engine.generation import generate
from bebop.models.registry import chat_ids
from bebop.drafts.mtp import new_mtp


def brute_force(alphas, costs, max_k):
    """The K with the most tokens per second, if it beats plain decoding's time per token by the margin."""
    def rate(K):
        return (1 + sum(torch.prod(torch.tensor(alphas[:j + 1])).item() for j in range(K))) / costs[K]
    best = max(range(max_k + 1), key=rate)
    return best if 1 / rate(best) < (1 - autodraft.DRAFT_MARGIN) / rate(0) else 0


def test_choose_draft_len_maximises_tokens_per_second():
    assert choose_draft_len(torch.tensor([0.9, 0.9, 0.9]), [1.0, 1.1, 1.2, 1.3], 3) == 3  # cheap drafts, accepted
    assert choose_draft_len(torch.tensor([0.1, 0.1, 0.1]), [1.0, 1.5, 2.0, 2.5], 3) == 0  # costly and rejected
    assert choose_draft_len(torch.tensor([0.9, 0.9, 0.9]), [1.0, 1.1, 1.2, 1.3], 1) == 1  # capped
    for alphas in itertools.product([0.2, 0.6, 0.95], repeat=3):
        for costs in ([1.0, 1.13, 1.37, 1.61], [1.0, 1.91, 2.83, 3.71], [1.0, 1.07, 2.03, 2.11]):  # no ties
            assert choose_draft_len(torch.tensor(alphas, dtype=torch.float64), costs, 3) == \
                brute_force(alphas, costs, 3)


def test_drafting_must_beat_plain_decoding_by_the_margin(monkeypatch):
    m = autodraft.DRAFT_MARGIN
    alphas = torch.tensor([0.1])  # a step with one draft emits 1.1 tokens per row
    assert choose_draft_len(alphas, [1.0, 1.1 * (1 - m) * 0.99], 1) == 1
    assert choose_draft_len(alphas, [1.0, 1.1 * (1 - m) * 1.01], 1) == 0  # better per token, but within the margin
    # and for a draining batch, on the expected seconds until its last row finishes
    drain = (torch.full((4, 2), 0.5), torch.zeros(4), torch.full((4,), 32), [0.5, 0.6, 0.7], 0.0)
    for seconds, K in (([1.0, 0.99 * (1 - m), 2.0], 1), ([1.0, 1.01 * (1 - m), 2.0], 0), ([1.0, 2.0, 0.5], 2)):
        monkeypatch.setattr(autodraft, "drain_seconds", lambda *a, s=seconds: torch.tensor(s).numpy())
        assert choose_draft_len(alphas, [1.0, 1.0, 1.0], 2, drain) == K


def test_a_draining_batch_waits_for_its_slowest_row():
    """Per token, drafting pays (1.3 / 1.76 of a plain step); when no request waits for a row, the batch lasts
    until its last row finishes, and one row whose drafts are rejected makes drafting lose."""
    costs, fixed, rows = [1.0, 1.3], [0.8, 1.0], 16
    fast = torch.full((rows, 1), 0.8)
    assert choose_draft_len(torch.tensor([0.76]), costs, 1) == 1
    known = torch.zeros(rows)  # rows whose acceptance is known
    assert choose_draft_len(torch.tensor([0.8]), costs, 1, (fast, known, torch.full((rows,), 32), fixed, 0.0)) == 1
    slow = fast.clone()
    slow[3] = 0.1
    assert choose_draft_len(torch.tensor([0.76]), costs, 1, (slow, known, torch.full((rows,), 32), fixed, 0.0)) == 0
    unsure = torch.full((rows,), 0.8)  # the same estimates, but some row may well be the slow one
    assert choose_draft_len(torch.tensor([0.8]), costs, 1, (fast, unsure, torch.full((rows,), 32), fixed, 0.0)) == 0
    piled = (fast, known, torch.full((rows,), 32), fixed, 10.0)  # 10 s to feed the MTP what plain steps piled up
    assert choose_draft_len(torch.tensor([0.8]), costs, 1, piled) == 0
    one = (torch.tensor([[0.1]]), torch.zeros(1), torch.tensor([32]), fixed, 0.0)  # alone, it pays like any row
    assert choose_draft_len(torch.tensor([0.1]), costs, 1, one) == int(1.3 / 1.1 < 1.0)


@pytest.mark.parametrize("rows,remaining,K,mixed,spread", [(64, 64, 1, False, 0), (64, 64, 2, False, 0),
                                                            (16, 64, 4, False, 0), (4, 32, 3, False, 0),
                                                            (16, 64, 2, True, 0), (16, 64, 3, False, 0.25)])
def test_drain_time_matches_a_simulated_batch(rows, remaining, K, mixed, spread):
    """drain_seconds against simulated batches: `rows` rows each needing `remaining` tokens, drafts accepted
    with their row's chain alpha (with `mixed`, half the rows accept far less; with `spread`, each row's alphas
    are the estimate times 1 + spread * N(0, 1), unknown to the model but for their spread), a step costing
    a + b * (rows still running) until the last row is done."""
    alphas = torch.tensor([0.6, 0.65, 0.6, 0.55], dtype=torch.float64).repeat(rows, 1)
    if mixed:
        alphas[::2] *= 0.5
    a, b = 1.0, 0.02
    gen = torch.Generator().manual_seed(0)
    total, reps = 0.0, 300
    for _ in range(reps):
        noise = 1 + spread * torch.randn(rows, 1, generator=gen, dtype=torch.float64)
        row_alphas = (alphas[:, :K] * noise).clamp(0, 1)
        left = torch.full((rows,), remaining)
        while (left > 0).any():
            alive = left > 0
            total += a + b * int(alive.sum())
            accepted = (torch.rand(rows, K, generator=gen, dtype=torch.float64) < row_alphas).long().cumprod(1)
            left = torch.where(alive, left - 1 - accepted.sum(1), left)
    costs, fixed = [a + b * rows] * (K + 1), [a + b] * (K + 1)  # the same for every K: only E_K and V_K differ
    predicted = drain_seconds(alphas, torch.full((rows,), remaining), costs, fixed, K, torch.full((rows,), spread))
    assert float(predicted[K]) == pytest.approx(total / reps, rel=0.05)
    assert float(predicted[0]) == pytest.approx(remaining * (a + b * rows))  # plain decoding: every row in step
    per_token = float(time_per_token(alphas.mean(0), costs, K)[K]) * remaining
    assert total / reps - per_token > 0.5 * (float(predicted[K]) - per_token)  # the tail is real, not a rounding


def simulated_drain(choose, alphas, remaining, a, b, K, seed=0, reps=100):
    """Mean seconds until the last row finishes when every step each row drafts what `choose(alphas, left)` [n]
    gives it (its drafts accepted with their chain alphas), a step costing a[K] + sum_r b[k_r] over the rows
    still running (K the deepest k_r)."""
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(reps):
        left = remaining.clone()
        while (left > 0).any():
            alive = (left > 0).nonzero().squeeze(1)
            k = torch.as_tensor(choose(alphas[alive], left[alive]), dtype=torch.long)
            total += a[int(k.max())] + sum(b[int(x)] for x in k)
            draws = torch.rand(len(alive), K, generator=gen, dtype=torch.float64) < alphas[alive]
            accepted = (draws & (torch.arange(K) < k.unsqueeze(1))).long().cumprod(1).sum(1)
            left[alive] -= 1 + accepted
    return total / reps


def step_costs_ab(a, b, n, K):
    return [a[k] + b[k] * n for k in range(K + 1)], [a[k] + b[k] for k in range(K + 1)]


@pytest.mark.parametrize("low,tail", [(1.0, False), (0.6, False), (0.3, True)])
def test_rows_drafting_their_own_lengths_drain_no_slower_than_one_length_for_all(low, tail):
    """Per-row lengths against the one K of the batch (choose_draft_len's drain rule) and plain decoding, on a
    simulated batch whose step has a large fixed part (as a CPU or GPU step at small batch): 16 rows, half of
    which accept `low` times as much; with `tail`, one row is far behind the others (the long tail of a
    rollout)."""
    K, n = 3, 16
    alphas = torch.tensor([0.8, 0.75, 0.7], dtype=torch.float64).repeat(n, 1)
    alphas[::2] *= low
    remaining = torch.full((n,), 24)
    if tail:
        remaining[1] = 96
    a, b = [1.0, 1.08, 1.16, 1.24], [0.03, 0.045, 0.06, 0.075]

    def per_row(al, left):
        costs, fixed = step_costs_ab(a, b, len(left), K)
        return choose_row_draft_lens(al, left, costs, fixed, K)

    def uniform(al, left):
        costs, fixed = step_costs_ab(a, b, len(left), K)
        return [choose_draft_len(al.mean(0), costs, K, (al, None, left, fixed, 0.0))] * len(left)

    plain = simulated_drain(lambda al, left: [0] * len(left), alphas, remaining, a, b, K)
    one_k = simulated_drain(uniform, alphas, remaining, a, b, K)
    own = simulated_drain(per_row, alphas, remaining, a, b, K)
    assert own < 0.95 * plain and own < 1.03 * one_k  # (the plan is a heuristic: within 3% where rows are alike)
    if tail:  # the rows ahead need not draft: only the one behind decides when the batch is done
        assert own < 0.95 * one_k


def test_row_draft_lengths_go_where_they_pay():
    K, n = 3, 8
    a, b = [1.0, 1.15, 1.3, 1.45], [0.03, 0.06, 0.09, 0.12]
    costs, fixed = step_costs_ab(a, b, n, K)
    sure = torch.full((n, K), 0.9, dtype=torch.float64)
    remaining = torch.tensor([2, 3, 40, 40, 40, 40, 40, 40])
    lens = choose_row_draft_lens(sure, remaining, costs, fixed, K)
    assert lens.max() > 0 and all(k <= max(r - 1, 0) for k, r in zip(lens.tolist(), remaining.tolist()))
    assert choose_row_draft_lens(torch.full((n, K), 0.05, dtype=torch.float64), remaining, costs, fixed, K).max() == 0
    dear = step_costs_ab([1.0, 3.0, 5.0, 7.0], b, n, K)
    assert choose_row_draft_lens(sure, remaining, *dear, K).max() == 0  # accepted, but dearer than it gains
    # one row: the uniform drain rule, whose every K it weighs alike
    for alpha in (0.3, 0.6, 0.9):
        one = torch.full((1, K), alpha, dtype=torch.float64)
        c, f = step_costs_ab(a, b, 1, K)
        assert choose_row_draft_lens(one, torch.tensor([40]), c, f, K).tolist() == \
            [choose_draft_len(one[0], c, K, (one, None, torch.tensor([40]), f, 0.0))]


def test_acceptance_counts_only_the_drafts_a_row_verified_of_its_source():
    """With a length per row, a row's drafts past k_r were not examined, and a row with k_r = 0 (a plain step,
    or another source's drafts: a hybrid draft's history) counts nothing, whatever it accepted."""
    acc = Acceptance(2, rows=3, decay=1.0)
    acc.update(2, torch.tensor([1, 2, 2]), torch.tensor([1, 2, 0]))
    assert acc.row_reached.tolist() == [[1, 0], [1, 1], [0, 0]]
    assert acc.row_accepted.tolist() == [[1, 0], [1, 1], [0, 0]]
    assert (acc.alphas() <= 1).all()


def test_row_spread_is_measured_from_the_rows_and_shrinks_with_their_evidence():
    acc = Acceptance(1, rows=8, decay=1.0, prior_spread=0.25, row_weight=4.0)
    assert acc.row_spread().tolist() == pytest.approx([0.25] * 8)  # no evidence: the prior (the last generation's)
    same = torch.tensor([1, 0] * 4)
    for _ in range(20):
        acc.update(1, same)
        acc.update(1, 1 - same)  # every row accepts half: rows differ only by luck
    assert float(acc.row_spread().max()) < 0.05 and acc.spread < 0.05  # measured, and kept
    apart = Acceptance(1, rows=8, decay=1.0, prior_spread=0.25, row_weight=4.0)
    for _ in range(40):
        apart.update(1, torch.tensor([1, 1, 1, 1, 0, 0, 0, 1]))  # rows that always / never accept
    rates = torch.tensor([1, 1, 1, 1, 0, 0, 0, 1], dtype=torch.float64)  # no binomial part: always or never
    assert apart.row_spread().tolist() == pytest.approx([float(rates.std() / rates.mean()) * (4 / 44) ** 0.5] * 8)


def test_acceptance_counts_conditional_rates_and_forgets():
    acc = Acceptance(3, rows=4, prior=0.5, weight=2.0, decay=1.0, row_weight=4.0)
    assert acc.alphas().tolist() == [0.5, 0.5, 0.5]
    acc.update(2, torch.tensor([0, 1, 2, 2]))  # draft 1: 3 of 4 accepted; draft 2: reached by 3, accepted by 2
    batch = [(3 + 1) / (4 + 2), (2 + 1) / (3 + 2), 0.5]
    assert acc.alphas().tolist() == pytest.approx(batch)
    # each row's own: its one step, with the batch's estimate worth 4 steps
    rows = acc.row_alphas()
    assert rows[0].tolist() == pytest.approx([4 * batch[0] / 5, batch[1], batch[2]])  # rejected draft 1
    assert rows[1].tolist() == pytest.approx([(1 + 4 * batch[0]) / 5, 4 * batch[1] / 5, batch[2]])
    assert rows[2].tolist() == pytest.approx([(1 + 4 * batch[0]) / 5, (1 + 4 * batch[1]) / 5, batch[2]])
    acc.keep_rows(torch.tensor([2, 1]))  # rows 0 and 3 finished; row 2 moves up
    acc.reset_row(1)  # a new request in row 1
    assert acc.row_alphas()[0].tolist() == pytest.approx(rows[2].tolist())
    assert acc.row_alphas()[1].tolist() == pytest.approx(batch)
    fading = Acceptance(1, rows=100, prior=0.5, decay=0.9)
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
    # (taken as consistent: a tiny model's sub-millisecond steps may well come out inconsistent, tested below)
    monkeypatch.setattr(autodraft, "probe_costs", lambda *a, **k: probes.append(a[2]) or (probe(*a, **k)[0], True))
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


def test_a_probe_that_contradicts_itself_is_used_but_not_kept(tiny_llama, tmp_path, monkeypatch):
    """Noise that makes a step with more drafts come out cheaper than one with fewer (a busy host) marks the
    probe inconsistent: this process uses it, the disk cache does not keep it, the next process probes again."""
    model, _ = tiny_llama
    mtp = new_mtp(model, 0)

    def timer_for(seconds):  # each timed step (rep 0: K = 0, 1, 2, then rep 1: ...) takes the next of `seconds`
        it, now, calls = iter(seconds), [0.0], [0]

        def timer():
            calls[0] += 1
            if calls[0] % 2 == 0:  # a step's end
                now[0] += next(it)
            return now[0]
        return timer

    costs, consistent = autodraft.probe_costs(model, mtp, 2, 2, repeats=2, timer=timer_for([1, 2, 3, 5, 2, 3]))
    assert consistent and costs == [1.0, 2.0, 3.0]  # one slow repetition is what the minimum is for
    costs, consistent = autodraft.probe_costs(model, mtp, 2, 2, repeats=2, timer=timer_for([3, 2, 4, 3, 2, 4]))
    assert not consistent and costs == [3.0, 3.0, 4.0]  # K = 1 beat K = 0: noise; the costs stay monotone

    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    monkeypatch.setattr(autodraft, "_unsaved", {})
    probes, probe = [], autodraft.probe_costs
    verdict = iter([False, True])
    monkeypatch.setattr(autodraft, "probe_costs",
                        lambda *a, **k: probes.append(a[2]) or (probe(*a, **k)[0], next(verdict)))
    first = step_costs(model, mtp, 2, 2)
    assert step_costs(model, mtp, 2, 2) == first and probes == [2]  # used for the rest of this process
    assert not (tmp_path / autodraft.COST_FILE).exists()  # never kept
    monkeypatch.setattr(autodraft, "_unsaved", {})  # a new process
    step_costs(model, mtp, 2, 2)
    assert probes == [2, 2] and (tmp_path / autodraft.COST_FILE).exists()  # probed again, consistent: kept


def test_generate_with_auto_draft_len(tiny_qwen3, tmp_path, monkeypatch):
    model, tok = tiny_qwen3
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    prompts = [chat_ids(tok, t) for t in ["hello", "What is 2+2?"]]
    gen = generate(model, prompts, 20, mode="spec", draft=new_mtp(model, 0), draft_len="auto", max_draft_len=3,
                   seed=1, eos_ids=[])
    assert all(len(r.tokens) == 20 for r in gen.rollouts)
    st = gen.stats
    assert st.draft_len == 3 and len(st.accepted_at) == 3 and st.drafted <= 3 * st.steps
    assert st.steps == 0 or 0 < st.mean_draft_len <= 3
    with pytest.raises(ValueError):
        generate(model, prompts, 4, mode="spec", draft=new_mtp(model, 0), draft_len="auto", max_draft_len=-1)
    with pytest.raises(ValueError):
        generate(model, prompts, 4, mode="spec", draft=new_mtp(model, 0), draft_len="sometimes")


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


def test_a_drafting_step_costs_what_smaller_batches_showed_relative_to_plain_ones(monkeypatch):
    """A K not yet measured at this batch bucket: this bucket's plain-step ratio to the probe, times that K's
    ratio relative to plain steps where both were measured (the nearest such bucket), not the bare probe."""
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0, 2.0, 3.0][:max_k + 1])
    costs = autodraft.StepCosts(None, None, 2, decay=0.5)
    for K, seconds in ((0, 1.0), (0, 1.0), (1, 3.0), (1, 3.0)):  # batch 16: K = 1 takes 1.5x its probe
        costs.record(16, K, seconds)
    for K, seconds in ((0, 1.5), (0, 2.0), (2, 3.0), (2, 3.0)):  # batch 2, further away: K = 1 not measured
        costs.record(2, K, seconds)
    costs.record(64, 0, 2.0)
    costs.record(64, 0, 2.0)  # batch 64: plain steps at twice the probe
    assert costs(64) == pytest.approx([2.0, 2.0 * 2.0 * 1.5, 3.0 * 2.0 * 3.0 / 3.0 / 1.75])
    assert costs(128)[1] == pytest.approx(2.0 * costs.ratio_sum / costs.ratio_n * 1.5)  # no plain steps there yet


def test_catch_up_cost_is_measured_per_position():
    costs = autodraft.StepCosts(None, None, 2, decay=0.5)
    assert costs.catch_up_seconds(10) == 0.0  # nothing measured yet
    costs.record_catch_up(100, 0.5)
    assert costs.catch_up_seconds(10) == pytest.approx(0.05)
    costs.record_catch_up(100, 1.5)
    assert costs.catch_up_seconds(10) == pytest.approx(0.1) and costs.catch_up_seconds(0) == 0.0


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
    generate(model, prompts, 8, mode="spec", draft=mtp, draft_len="auto", max_draft_len=2, eos_ids=[])
    first = autodraft.step_costs_for(model, mtp, 2)
    assert plain_steps.count(True) == 2 and first.measured[(2, 0)][1] >= 2  # two forced plain steps, measured
    plain_steps.clear()
    generate(model, prompts, 8, mode="spec", draft=mtp, draft_len="auto", max_draft_len=2, eos_ids=[])
    assert plain_steps and not any(plain_steps) and autodraft.step_costs_for(model, mtp, 2) is first
    assert autodraft.step_costs_for(model, mtp, 3) is not first  # another max K: its own costs
    other = copy.deepcopy(model)
    other.attention = ("matmul", "matmul")  # other kernels cost otherwise
    assert autodraft.step_costs_for(other, mtp, 2) is not first


def test_a_copied_history_draft_keeps_its_costs_but_not_a_copy_of_the_target(tiny_llama, tmp_path, monkeypatch):
    """The costs kept on a draft refer to the target they measured: a copy of the draft (history_epochs.py
    copies a history draft between rounds) refers to the same target, while the costs' own tables are its own;
    copied with its draft, a cost table refers to the draft's copy."""
    import copy

    from bebop.drafts.history import HistoryDraft

    model, tok = tiny_llama
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    history = HistoryDraft()
    generate(model, [chat_ids(tok, "hello")] * 2, 8, mode="spec", draft=history, draft_len="auto", max_draft_len=2,
             eos_ids=[])
    costs = autodraft.step_costs_for(model, history, 2)
    twin = copy.deepcopy(history)
    twin_costs = autodraft.step_costs_for(model, twin, 2)
    assert twin_costs is not costs and twin_costs.target is model and twin_costs.mtp is twin
    assert twin_costs.measured == costs.measured and twin_costs.measured is not costs.measured


def test_compiled_and_eager_steps_have_costs_of_their_own(tiny_llama, tmp_path, monkeypatch):
    """The compiled step makes the target's forward cheaper and leaves the draft's as it was, so K pays
    otherwise: its costs are probed, kept on disk and measured apart from eager's (a bench interleaves both)."""
    import copy

    model = copy.deepcopy(tiny_llama[0])
    mtp = new_mtp(model, 0)
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    probes = []
    monkeypatch.setattr(autodraft, "probe_costs",
                        lambda target, *a, **k: probes.append(target.compiled) or ([1.0, 2.0, 3.0], True))
    eager = autodraft.step_costs_for(model, mtp, 2)
    for flag in (False, True, False, True):
        model.compiled = flag
        step_costs(model, mtp, 4, 2)
    assert probes == [False, True]  # once each, then from the file
    assert len(json.loads((tmp_path / autodraft.COST_FILE).read_text())) == 2
    assert autodraft.step_costs_for(model, mtp, 2) is not eager


def test_a_dear_measurement_fades_back_to_the_estimate_once_old(monkeypatch):
    """A K measured dear is not chosen again, so its measurement cannot be corrected by new ones: once
    `refresh` steps old it fades (by `forget` a step) towards what the plain steps and the probe say."""
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0, 1.2, 1.4][:max_k + 1])
    costs = autodraft.StepCosts(None, None, 2, decay=0.5, refresh=4, forget=0.5)
    for K, seconds in ((0, 1.0), (0, 1.0), (2, 7.0), (2, 7.0)):  # K = 2 measured at 5x its probe (a hiccup)
        costs.record(1, K, seconds)
    assert costs(1)[2] == pytest.approx(7.0)
    for step in range(12):  # then only K = 1, at its probe
        costs.record(1, 1, 1.2)
        age = step + 1
        w = 0.5 ** max(0, age - 4)
        assert costs(1)[2] == pytest.approx(1.4 * (w * 5.0 + (1 - w) * 1.0))
    assert costs(1)[2] < 1.5  # back near the probe: K = 2 will be tried again
    assert choose_draft_len(torch.tensor([0.9, 0.9]), costs(1), 2) == 2


def test_a_step_whose_rows_draft_their_own_numbers_costs_its_total_drafts(monkeypatch):
    """Packed, a step whose 16 rows draft 8 tokens in all costs about a step with half a draft per row: the
    probe between K = 0 and 1, times what such steps measured against it (the plain steps' ratio before)."""
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0, 2.0, 3.0][:max_k + 1])
    costs = autodraft.StepCosts(None, None, 2, decay=0.5)
    costs.record(16, 0, 2.0)
    costs.record(16, 0, 2.0)  # plain steps at twice the probe
    assert costs.ragged(16, [8, 16, 32]) == pytest.approx([3.0, 4.0, 6.0])
    costs.record(16, 2, 3.0, drafts=8)
    costs.record(16, 2, 3.0, drafts=8)  # 2x the probe at 0.5 drafts per row: not K = 2's cost
    assert costs.ragged(16, [8, 24]) == pytest.approx([3.0, 5.0]) and costs(16)[2] == pytest.approx(6.0)


def test_what_steps_of_drafts_per_row_measured_prices_every_drafting_k(monkeypatch):
    """A draining batch's steps draft per row (measured apart, as RAGGED), and the plan that chooses the rows'
    drafts prices them from the K costs: those must take what the bucket's drafting steps measured, not the
    plain steps' ratio (with which the plan kept drafting at 5-8 rows where a drafting step cost 2-2.7x a plain
    one on an AVX2 EPYC, and lost a third of the speed)."""
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: [1.0, 2.0, 3.0][:max_k + 1])
    costs = autodraft.StepCosts(None, None, 2, decay=0.5, refresh=4, forget=0.5)
    costs.record(8, 0, 1.0)
    costs.record(8, 0, 1.0)  # plain steps at their probe
    costs.record(8, 2, 4.0, drafts=8)
    costs.record(8, 2, 4.0, drafts=8)  # drafting steps at twice theirs (the probe says 2.0 at one draft a row)
    assert costs(8) == pytest.approx([1.0, 4.0, 6.0])
    assert costs(16) == pytest.approx([1.5, 3.0, 4.5])  # another bucket, none measured: the mean ratio for all
    for _ in range(12):  # then plain steps only: the drafting measurement fades back towards the plain ratio
        costs.record(8, 0, 1.0)
    assert costs(8)[1] == pytest.approx(2.0, rel=0.01)
