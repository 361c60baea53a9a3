"""Generation with a hybrid draft (bebop.drafts.hybrid): per row and step the trained draft or the history
drafts, and the output is still the target's distribution, like plain sampling, token for token plain
decoding's at temperature 0 and, with a fixed history and draft length, independent of the other rows."""

import numpy as np
import pytest
import torch

import bebop.engine.draft_len as autodraft
import bebop.engine.generation as engine
from bebop.drafts.eagle3 import new_eagle3
from bebop.drafts.history import HistoryDraft, Proposal
from bebop.drafts.hybrid import HybridDraft, choose_sources
from bebop.engine.generation import generate
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams
from generation_helpers import TEXTS, agreeable_mtp, assert_exact_and_like_ar, exact_marginals, sharpened

ROWS = 3000
SHARP = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def sharp(tiny_llama):
    """(sharpened model, an often-right MTP, prompt, exact marginals of tokens 0..2, ar generation, 300 earlier
    rollouts of the prompt, half cut after two tokens: rows that match only those propose one token, which
    the trained draft outbids, while the others propose two)."""
    model = sharpened(tiny_llama[0], 8.0)
    prompt = tiny_llama[1]("Hi!", add_special_tokens=False)["input_ids"]
    exact = exact_marginals(model, prompt, SHARP)
    ar = generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=11, eos_ids=[])
    earlier = generate(model, [prompt] * 300, 3, SHARP, mode="ar", seed=12, eos_ids=[])
    return model, agreeable_mtp(model), prompt, exact, ar, [r.tokens[:2 + i % 2] for i, r in enumerate(earlier.rollouts)]


def hybrid_of(mtp, prompt, completions, **options) -> HybridDraft:
    history = HistoryDraft(**options)
    for c in completions:
        history.add(prompt, c)
    return HybridDraft(mtp, history)


@pytest.mark.parametrize("mode,learn", [("spec", False), ("spec", True), ("spec-greedy", False)])
def test_hybrid_drafts_keep_the_target_distribution(sharp, mode, learn, monkeypatch):
    """Both sources draft in the same steps (the history's rows with q one-hot, the trained draft's with its
    q): tokens as the exact marginals and plain sampling. The trained draft promises 0.3 per depth here, so
    that the history drafts about half the tokens (verifying them against the trained draft's q instead
    fails at token 1)."""
    monkeypatch.setattr(engine, "MODEL_PRIOR", 0.3)
    model, mtp, prompt, exact, ar, earlier = sharp
    draft = hybrid_of(mtp, prompt, earlier, min_chain=0.0, learn=learn)
    gen = generate(model, [prompt] * ROWS, 4, SHARP, mode=mode, draft=draft, draft_len=2, seed=13, eos_ids=[])
    st = gen.stats
    assert 0.25 < st.history_drafted / st.drafted < 0.75  # both sources drafted
    assert 0 < st.history_accepted < st.history_drafted and 0 < st.accepted - st.history_accepted
    assert_exact_and_like_ar(model, gen, exact, ar, f"hybrid {mode} learn={learn}")


def test_steps_only_the_history_drafts_keep_the_target_distribution(sharp, monkeypatch):
    """Where the trained draft promises nothing, every row the history can draft for takes its drafts, and a
    step where all the drafting rows do runs no model drafting (its positions join the model's pile). The
    trained draft is an EAGLE-3 head over half the vocabulary: the history's q must be over the target's
    whole vocabulary in those steps too."""
    monkeypatch.setattr(engine, "MODEL_PRIOR", 0.0)
    model, _, prompt, exact, ar, earlier = sharp
    eagle3 = new_eagle3(model, seed=4)
    eagle3.set_draft_vocab(torch.arange(0, model.cfg.vocab_size, 2))
    steps, step = [], engine.speculative_step
    monkeypatch.setattr(engine, "speculative_step", lambda *a: steps.append(a[9] is not None) or step(*a))
    gen = generate(model, [prompt] * ROWS, 4, SHARP, mode="spec", draft=hybrid_of(eagle3, prompt, earlier, min_chain=0.0),
                   draft_len=2, seed=15, eos_ids=[], max_batch=8)  # (8 rows: often all take the history)
    st = gen.stats
    assert any(steps) and not all(steps)  # (a[9]: the step's proposal) steps of the history alone, and of both
    assert st.history_drafted / st.drafted > 0.5 and st.drafted > st.history_drafted
    assert_exact_and_like_ar(model, gen, exact, ar, "hybrid, history-only steps")


def test_a_hybrid_row_is_independent_of_the_batch_and_greedy_is_ar(warm):
    model, mtp, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS]
    seeds = [101, 7, 55]
    earlier = generate(model, prompts * 8, 16, SamplingParams(temperature=0.5), mode="ar", seed=3, eos_ids=[])
    history = HistoryDraft(learn=False, min_chain=0.0)
    for r in earlier.rollouts:
        history.add(prompts[r.prompt_index % len(prompts)], r.tokens)
    draft = HybridDraft(mtp, history)
    kw = dict(params=SamplingParams(temperature=0.5), mode="spec", draft=draft, draft_len=2, eos_ids=[])
    batch = generate(model, prompts, 16, seed=seeds, **kw)
    assert 0 < batch.stats.history_drafted < batch.stats.drafted
    for i, p in enumerate(prompts):
        assert generate(model, [p], 16, seed=[seeds[i]], **kw).rollouts[0].tokens == batch.rollouts[i].tokens, i
    greedy = dict(kw, params=SamplingParams(temperature=0.0))
    ar = generate(model, prompts, 16, SamplingParams(temperature=0.0), mode="ar", eos_ids=[])
    assert [r.tokens for r in generate(model, prompts, 16, **greedy).rollouts] == [r.tokens for r in ar.rollouts]


def test_a_row_drafts_from_the_source_that_promises_more():
    chain = np.cumprod(np.full((3, 3), 0.6), -1)  # the trained draft: 0.6, 0.96, 1.18 tokens at 1, 2, 3 drafts
    sure, unsure, none = Proposal([5, 6], [0.9, 0.8], []), Proposal([5], [0.5], []), Proposal([], [], [])
    assert choose_sources([sure, unsure, none], chain, [3, 3, 3]) == [True, False, False]
    assert choose_sources([sure, unsure, none], chain, [0, 0, 0]) == [True, True, False]  # it would not draft


@pytest.mark.parametrize("model_table, history_table, pays", [
    ([1.0, 3.0, 5.0], [1.0, 1.2, 1.4], False),  # drafting dear beside verifying (this CPU): the history alone
    ([1.0, 1.1, 1.2], [1.0, 1.05, 1.1], True),  # drafting nearly free (an accelerator): the trained draft joins
])
def test_the_trained_draft_joins_a_history_step_only_where_it_pays(monkeypatch, model_table, history_table, pays):
    """Two rows take the history's drafts and two the trained draft's: the step runs the model's drafting only
    where its rows' expected tokens outweigh what the model's drafting steps cost over the history's own."""
    tables = {"model": model_table, "history": history_table}
    monkeypatch.setattr(autodraft, "step_costs", lambda target, mtp, batch, max_k: tables[mtp][:max_k + 1])
    model_costs, history_costs = autodraft.StepCosts(None, "model", 2), autodraft.StepCosts(None, "history", 2)
    proposed = [Proposal([5, 6], [0.9, 0.8], []), Proposal([7, 8], [0.9, 0.8], []), Proposal([], [], []),
                Proposal([], [], [])]
    chain = np.full((4, 2), [0.5, 0.25])
    from_history = [True, True, False, False]
    assert engine.model_pays(proposed, from_history, chain, [2, 2, 2, 2], model_costs, history_costs, 4) == pays
    assert not engine.model_pays(proposed, from_history, chain, [2, 2, 0, 0], model_costs, history_costs, 4)
