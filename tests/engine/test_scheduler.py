"""bebop.engine.scheduler: continuous batching. Requests that join rows freed mid-way get the tokens they get alone,
the samples of one prompt share one prefill, waiting prompts are prefilled a batch at a time in groups of like
lengths, and finished rows are dropped by `compaction`."""

import numpy as np
import pytest

from bebop.engine.generation import generate
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams
from generation_helpers import TEXTS, token_matrix


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_rows_joining_a_busy_batch_match_running_alone(warm, mode):
    """Through max_batch=2, requests 2..5 join rows freed by EOS or the limit while the other row is mid-way;
    each request's tokens must be those it gets alone."""
    model, mtp, tok = warm
    texts = TEXTS + ["x", "Explain, in detail, how rejection sampling keeps the output distribution exact.", "ok"]
    prompts = [chat_ids(tok, t) for t in texts]
    seeds = [101, 7, 55, 3, 1234, 9]
    kw = dict(params=SamplingParams(temperature=1.0), mode=mode, draft=mtp, draft_len=3)
    free = generate(model, prompts, 16, seed=seeds, eos_ids=[], **kw)
    kw["eos_ids"] = np.argsort(np.bincount(token_matrix(free).ravel()))[-6:].tolist()
    finished = []
    joined = generate(model, prompts, 16, seed=seeds, max_batch=2, on_finish=lambda i, r: finished.append((i, r)),
                      **kw)
    assert sorted(i for i, _ in finished) == list(range(len(prompts)))  # once per request
    assert all(r is joined.rollouts[i] for i, r in finished)
    assert len({len(r.tokens) for r in joined.rollouts}) > 1  # rows really stop (and free their row) at odd times
    for i, p in enumerate(prompts):
        alone = generate(model, [p], 16, seed=[seeds[i]], **kw).rollouts[0]
        b = joined.rollouts[i]
        assert b.prompt_index == i and b.tokens == alone.tokens, f"row {i}"
        assert b.stop_reason == alone.stop_reason
        np.testing.assert_allclose(b.logprobs, alone.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(b.entropies, alone.entropies, atol=1e-5, rtol=0)
    assert joined.stats.tokens == sum(len(r.tokens) for r in joined.rollouts)


def test_samples_of_one_prompt_share_one_prefill(warm, monkeypatch):
    """G samples of one prompt pay for one prefill, even when they join at different times."""
    model, mtp, tok = warm
    a, b = chat_ids(tok, "Tell me a story about a cat who lived on a boat."), chat_ids(tok, "hello")
    prompts, seeds = [a] * 5 + [b], [3, 4, 5, 6, 7, 8]
    kw = dict(params=SamplingParams(), mode="spec", draft=mtp, draft_len=2, eos_ids=[])
    alone = [generate(model, [p], 6, seed=[s], **kw).rollouts[0].tokens for p, s in zip(prompts, seeds)]
    widths, forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda tokens, cache, **kw: widths.append(tokens.shape[1]) or forward(tokens, cache, **kw))
    gen = generate(model, prompts, 6, seed=seeds, max_batch=2, **kw)
    assert sorted(w for w in widths if w > 3) == sorted([len(a), len(b)])  # one prefill per distinct prompt
    assert [r.tokens for r in gen.rollouts] == alone
    assert len({tuple(t) for t in alone[:5]}) > 1  # the samples differ (their own seeds)


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_waiting_prompts_are_prefilled_a_batch_at_a_time(warm, mode, monkeypatch):
    """Rows free up at different steps (EOS), but waiting prompts are prefilled max_batch at a time; each
    request's tokens stay those of running it alone."""
    model, mtp, tok = warm
    prompts = [chat_ids(tok, f"Question {i}: " + "why? " * i) for i in range(10)]
    kw = dict(params=SamplingParams(), mode=mode, draft=mtp, draft_len=2, eos_ids=list(range(0, model.cfg.vocab_size, 5)))
    alone = [generate(model, [p], 12, seed=[i], **kw).rollouts[0].tokens for i, p in enumerate(prompts)]
    assert len({len(t) for t in alone}) > 2  # rows really finish at different steps
    prefills, forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda tokens, cache, **kw: (
        prefills.append(tokens.shape[0]) if tokens.shape[1] > 3 else None) or forward(tokens, cache, **kw))
    gen = generate(model, prompts, 12, seed=list(range(10)), max_batch=4, **kw)
    assert [r.tokens for r in gen.rollouts] == alone
    assert len(prefills) <= 3 and sum(prefills) == 10, prefills  # 4 + 4 + 2, not one forward per admission


def test_prompts_of_unlike_lengths_are_prefilled_in_groups_of_like_lengths(warm, monkeypatch):
    """Short and long prompts in one batch: prefilled in forwards of similar lengths, whose padding stays within
    PREFILL_PADDING of the prompts' tokens (one padded forward computed 1.7x its tokens on held-out chat
    prompts); each request's tokens stay those of running it alone."""
    from bebop.engine.scheduler import PREFILL_PADDING, length_groups

    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in ["hi", "ok", "Tell me a long story about " + "a cat and a boat, " * 12,
                                          "yes", "Explain " + "why the sky is blue and " * 10 + "why."]]
    lengths = sorted(map(len, prompts))
    assert lengths[-1] > 2 * lengths[0]
    kw = dict(params=SamplingParams(), mode="spec", draft=mtp, draft_len=2, eos_ids=[])
    alone = [generate(model, [p], 6, seed=[i], **kw).rollouts[0].tokens for i, p in enumerate(prompts)]
    shapes, forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda tokens, cache, **kw: (
        shapes.append(tuple(tokens.shape)) if tokens.shape[1] > 3 else None) or forward(tokens, cache, **kw))
    gen = generate(model, prompts, 6, seed=list(range(len(prompts))), **kw)
    assert [r.tokens for r in gen.rollouts] == alone
    assert len(shapes) == 2 and sum(b for b, _ in shapes) == len(prompts), shapes  # the short ones, the long ones
    assert sum(b * t for b, t in shapes) <= (1 + PREFILL_PADDING) * sum(lengths)
    # the rule itself: every prompt once, shortest first, each group's padding within bounds
    groups = length_groups([[0] * n for n in [40, 36, 107, 62, 45, 98, 71, 64, 38]])
    assert [len(p) for g in groups for p in g] == [36, 38, 40, 45, 62, 64, 71, 98, 107]
    assert all(len(g) * len(g[-1]) <= (1 + PREFILL_PADDING) * sum(map(len, g)) for g in groups)
    assert length_groups([]) == []


def test_compaction_fills_finished_slots_with_the_last_rows():
    from bebop.engine.scheduler import compaction

    assert compaction(6, {1, 4}).tolist() == [0, 5, 2, 3]  # row 5 moves into 1; 4 is beyond the new size
    assert compaction(4, {0, 1}).tolist() == [3, 2]
    assert compaction(3, set()).tolist() == [0, 1, 2] and compaction(2, {0, 1}).tolist() == []
    assert compaction(5, {4}).tolist() == [0, 1, 2, 3]  # the last row finishing moves nothing
