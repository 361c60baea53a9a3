"""Generation with a history draft (bebop.drafts.history): rows draft their own number of tokens from earlier
rollouts of their prompt, and the output is still the target's distribution, token for token equal to plain
decoding at temperature 0 and, with a fixed history, independent of the other rows. A history filled with the
model's own samples makes its drafts often right (the case that exercises acceptance), and the checks must
fail on an engine that accepts them with the wrong rule."""

import itertools

import numpy as np
import pytest
import torch

import bebop.engine.step as step
import bebop.sampling as sampling
from bebop.drafts.history import HistoryDraft
from bebop.engine.draft_len import DRAFT_MARGIN
from bebop.engine.generation import drafts_worth_verifying, generate
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams
from bebop.studies.exactness import goodness_of_fit as gof
from bebop.studies.exactness import two_sample
from generation_helpers import TEXTS, assert_exact_and_like_ar, exact_marginals, sharpened, token_matrix

P_OK, P_BAD = 1e-3, 1e-6
ROWS = 3000
SHARP = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def sharp(tiny_llama):
    """(sharpened model, prompt, exact marginals of tokens 0..2, ar generation, history of 300 earlier
    rollouts of the prompt, half of them cut after two tokens: where they are the only match, a row drafts
    one token where the others draft two)."""
    model = sharpened(tiny_llama[0], 8.0)
    prompt = tiny_llama[1]("Hi!", add_special_tokens=False)["input_ids"]
    exact = exact_marginals(model, prompt, SHARP)
    ar = generate(model, [prompt] * ROWS, 3, SHARP, mode="ar", seed=11, eos_ids=[])
    earlier = generate(model, [prompt] * 300, 3, SHARP, mode="ar", seed=12, eos_ids=[])
    return model, prompt, exact, ar, [r.tokens[:2 + i % 2] for i, r in enumerate(earlier.rollouts)]


def history_of(prompt, completions, **options) -> HistoryDraft:
    history = HistoryDraft(**options)
    for c in completions:
        history.add(prompt, c)
    return history


@pytest.mark.parametrize("learn", [False, True])
def test_history_drafts_keep_the_target_distribution(sharp, learn):
    """Drafts from a history of earlier samples, fixed or fed with the rows as they are written: tokens and
    pairs as the exact marginals and plain sampling; both acceptance and rejection happen, and rows draft
    different lengths in one step."""
    model, prompt, exact, ar, earlier = sharp
    history = history_of(prompt, earlier, min_chain=0.0, learn=learn)
    # 4 tokens, so that the step after token 0 may draft 2 (the checks read tokens 0..2)
    gen = generate(model, [prompt] * ROWS, 4, SHARP, mode="spec", draft=history, draft_len=2, seed=13, eos_ids=[])
    st = gen.stats
    assert 0.2 < st.acceptance_rate < 0.9
    assert st.steps > 0 and 1 < st.drafted / st.steps < 2  # some rows drafted one token, some two
    assert_exact_and_like_ar(model, gen, exact, ar, f"history learn={learn}")


def test_history_check_catches_a_wrong_residual(sharp, monkeypatch):
    """Resampling from p after a rejected one-hot draft (instead of p without that token) must fail."""
    model, prompt, exact, _, earlier = sharp
    # (a proposed draft's residual is sampling.without_rejected_draft; left out, the correction is p itself)
    monkeypatch.setattr(sampling, "without_rejected_draft", lambda correction, *rest: correction)
    gen = generate(model, [prompt] * ROWS, 4, SHARP, mode="spec", draft=history_of(prompt, earlier, min_chain=0.0),
                   draft_len=2, seed=13, eos_ids=[])
    toks = token_matrix(gen)
    assert min(gof(toks[:, j], exact[j]) for j in range(3)) < P_BAD


def test_history_check_catches_drafts_accepted_as_if_q_were_p(sharp, monkeypatch):
    """Accepting a history draft with probability min(1, p/q) for q = its share of the history (a rule for
    sampled drafts, wrong for a draft that always proposes the same token) must fail."""
    model, prompt, exact, ar, earlier = sharp
    original = sampling.rejection_sample_uniform

    def share_as_q(target_probs, draft_probs, draft_tokens, accept_u, final_u, vocab_ids=None, draft_lens=None,
                   proposed=None):  # q(x) = 1/2 at every draft instead of one-hot
        half = torch.zeros_like(target_probs[:, 1:]).scatter_(-1, draft_tokens.unsqueeze(-1), 0.5)
        return original(target_probs, half, draft_tokens, accept_u, final_u, None, draft_lens)

    monkeypatch.setattr(step, "rejection_sample_uniform", share_as_q)
    gen = generate(model, [prompt] * ROWS, 4, SHARP, mode="spec", draft=history_of(prompt, earlier, min_chain=0.0),
                   draft_len=2, seed=13, eos_ids=[])
    toks, ref = token_matrix(gen), token_matrix(ar)
    assert min(two_sample(toks[:, j], ref[:, j]) for j in range(1, 3)) < P_BAD


def test_history_drafts_at_temperature_zero_equal_ar(warm):
    model, _, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS]
    greedy = SamplingParams(temperature=0)
    ar = generate(model, prompts, 24, greedy, mode="ar", seed=0, eos_ids=[])
    # earlier rollouts: the greedy ones (drafts all right) and another model's (drafts often wrong)
    other = generate(sharpened(model, 0.5), prompts, 24, SamplingParams(temperature=1.0), mode="ar", seed=1, eos_ids=[])
    history = HistoryDraft(min_chain=0.0)
    for p, a, b in zip(prompts, ar.rollouts, other.rollouts):
        history.add(p, a.tokens[:12])
        history.add(p, b.tokens)
    gen = generate(model, prompts, 24, greedy, mode="spec", draft=history, draft_len=3, seed=5, eos_ids=[])
    for i, (a, b) in enumerate(zip(ar.rollouts, gen.rollouts)):
        assert b.tokens == a.tokens, f"row {i}"
    st = gen.stats
    assert 0 < st.accepted < st.drafted  # both the multi-token and the correction path ran


def test_rows_drafting_from_a_fixed_history_are_independent_of_the_batch(warm):
    model, _, tok = warm
    prompts = [chat_ids(tok, t) for t in TEXTS + ["x"]]
    seeds = [101, 7, 55, 3]
    params = SamplingParams(temperature=1.0)
    earlier = generate(model, prompts * 8, 16, params, mode="ar", seed=9, eos_ids=[])
    history = HistoryDraft(min_chain=0.0, learn=False)
    for r in earlier.rollouts:
        history.add(prompts[r.prompt_index % len(prompts)], r.tokens)
    kw = dict(params=params, mode="spec", draft=history, draft_len=3, eos_ids=[])
    batch = generate(model, prompts, 16, seed=seeds, **kw)
    assert batch.stats.accepted > 0
    for i, p in enumerate(prompts):
        alone = generate(model, [p], 16, seed=[seeds[i]], **kw).rollouts[0]
        assert batch.rollouts[i].tokens == alone.tokens, f"row {i}"
        np.testing.assert_allclose(batch.rollouts[i].logprobs, alone.logprobs, atol=1e-5, rtol=0)


def test_a_history_draft_learns_from_the_rows_it_generates(warm):
    """Fed as rows write, a history with nothing in it at first drafts for the later samples of a prompt; a
    fixed empty one drafts nothing, and its output is plain decoding's, token for token (no match: K = 0)."""
    model, _, tok = warm
    prompts = [chat_ids(tok, "hello")] * 8
    params = SamplingParams(temperature=1.0)
    ar = generate(model, prompts, 16, params, mode="ar", seed=3, eos_ids=[], max_batch=2)
    empty = generate(model, prompts, 16, params, mode="spec", draft=HistoryDraft(learn=False), draft_len=3, seed=3,
                     eos_ids=[], max_batch=2)
    assert empty.stats.drafted == 0
    assert [r.tokens for r in empty.rollouts] == [r.tokens for r in ar.rollouts]
    history = HistoryDraft(min_chain=0.0)
    learnt = generate(model, prompts, 16, params, mode="spec", draft=history, draft_len=3, seed=3, eos_ids=[],
                      max_batch=2)
    assert learnt.stats.drafted > 0
    assert sum(h.size for h in history.prompts.values()) == sum(len(r.tokens) for r in learnt.rollouts)


class LinearCosts:
    """A plain step costs 1; each draft verified adds `per_draft` (the packed verify's per-token work)."""

    def __init__(self, per_draft):
        self.per_draft = per_draft

    def __call__(self, batch):
        return [1.0]

    def ragged(self, batch, drafts):
        return 1.0 + self.per_draft * np.asarray(drafts, dtype=np.float64)


def test_each_row_verifies_the_drafts_worth_their_cost():
    """A row deep in a familiar answer drafts deep while rows in new text draft nothing, in the same step;
    and the choice is the fewest expected seconds per token over every way to cut the rows' proposals."""
    batch = 16
    chances = [[0.95, 0.9, 0.86, 0.8]] + [[0.2]] * 15
    assert drafts_worth_verifying(chances, LinearCosts(0.02), batch) == [4] + [0] * 15
    assert drafts_worth_verifying(chances, LinearCosts(0.2), batch) == [0] * 16  # dearer than it promises
    assert drafts_worth_verifying([[]] * batch, LinearCosts(0.0), batch) == [0] * 16
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = [np.cumprod(rng.uniform(0.2, 1.0, rng.integers(0, 3))).tolist() for _ in range(3)]
        costs = LinearCosts(rng.uniform(0.01, 0.5))

        def seconds(keep):
            return costs.ragged(3, sum(keep)) / (3 + sum(sum(c[:k]) for c, k in zip(rows, keep)))
        best = min(itertools.product(*(range(len(c) + 1) for c in rows)), key=seconds)
        want = list(best) if seconds(best) < (1 - DRAFT_MARGIN) * seconds((0, 0, 0)) else [0, 0, 0]
        assert drafts_worth_verifying(rows, costs, 3) == want
