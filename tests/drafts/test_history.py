"""bebop.drafts.history: what a history draft proposes, its bounds and its checkpoint."""

import pytest

from bebop.drafts.history import HistoryDraft
from bebop.errors import BebopError

PROMPT = [1, 2, 3]


def test_proposes_the_most_frequent_continuation_of_the_longest_context():
    h = HistoryDraft(max_order=3, min_chain=0.0)
    h.add(PROMPT, [10, 11, 12, 13])
    h.add(PROMPT, [10, 11, 12, 13])
    h.add(PROMPT, [20, 11, 14])
    # after "11": 12 twice, 14 once; after "10 11" only 12; after "20 11" only 14: the longest context decides
    assert h.propose(PROMPT, [10, 11], 2)[0] == [12, 13]
    assert h.propose(PROMPT, [20, 11], 2)[0] == [14]  # nothing ever followed "11 14"
    assert h.propose(PROMPT, [99, 11], 1)[0] == [12]  # "99 11" unseen: the order-1 context "11"
    assert h.propose(PROMPT, [], 1)[0] == [10]  # the prompt's end is the first token's context
    assert h.propose([7], [10, 11], 2).tokens == []  # another prompt's history is its own
    assert h.propose(PROMPT, [10, 11], 0).tokens == []


def test_chances_shrink_a_share_and_cut_the_proposal():
    h = HistoryDraft(max_order=2, min_chain=0.0)
    h.add(PROMPT, [5, 6, 7])
    tokens, chances, _ = h.propose(PROMPT, [], 3)
    assert tokens == [5, 6, 7]
    assert chances == pytest.approx([1 / 2, 1 / 4, 1 / 8])  # each context seen once: 1 / (1 + 1)
    h.min_chain = 0.2
    assert h.propose(PROMPT, [], 3)[0] == [5, 6]


def test_chances_are_calibrated_on_the_outcomes_of_drafts_of_the_same_kind():
    """Drafts from long contexts that were always accepted raise their kind's chances, drafts from short ones
    that were rejected lower theirs; a draft that does not learn keeps its calibration, and a checkpoint
    keeps it too."""
    h = HistoryDraft(max_order=4, min_chain=0.0)
    h.add(PROMPT, [5, 6, 7, 8, 9])
    long_before = h.propose(PROMPT, [5, 6, 7, 8], 1)  # context "5 6 7 8" (order 4), seen once
    short_before = h.propose([9], [], 1)  # no history
    assert long_before.chances == pytest.approx([1 / 2]) and short_before.tokens == []
    h.add([9], [1, 2])
    h.add([9], [1, 3])
    short = h.propose([9], [1], 1)  # context "1" (order 1), seen twice: share 1/3
    assert short.chances == pytest.approx([1 / 3])
    for _ in range(40):
        h.observe([long_before.kinds, short.kinds], [1, 0])
    assert h.propose(PROMPT, [5, 6, 7, 8], 1).chances[0] > 0.8  # 1/2 * (40 + 8) / (20 + 8)
    assert h.propose([9], [1], 1).chances[0] < 0.15  # 1/3 * 8 / (40/3 + 8)
    frozen = HistoryDraft.from_state(h.state(), learn=False)
    assert frozen.propose([9], [1], 1) == h.propose([9], [1], 1)
    frozen.observe([long_before.kinds], [0])
    assert frozen.propose(PROMPT, [5, 6, 7, 8], 1) == h.propose(PROMPT, [5, 6, 7, 8], 1)


def test_memory_is_bounded_per_prompt_and_in_prompts():
    h = HistoryDraft(max_order=2, min_chain=0.0, max_tokens_per_prompt=10, max_prompts=2)
    for i in range(6):
        h.add(PROMPT, [100 + i] * 4)
    history = h.prompts[tuple(PROMPT)]
    assert history.size <= 10 and history.size == sum(map(len, history.completions))
    assert list(history.completions) == [[104] * 4, [105] * 4]  # the newest rollouts are kept
    assert all(counts.keys() <= {104, 105} for counts in history.next.values())  # the table forgot the others
    h.add([4], [1])
    h.add([5], [1])
    assert list(h.prompts) == [(4,), (5,)]  # the least recently used prompt went


def test_a_live_rollout_is_indexed_as_it_grows():
    h = HistoryDraft(max_order=2, min_chain=0.0)
    rec = h.begin(PROMPT)
    rec.update([8])
    rec.update([8, 9, 8])
    assert h.propose(PROMPT, [8], 1)[0] == [9]
    assert h.prompts[tuple(PROMPT)].size == 3


def test_save_and_load_give_the_same_proposals(tmp_path):
    h = HistoryDraft(max_order=4, min_order=2, min_chain=0.1)
    h.add(PROMPT, [5, 6, 7, 8, 5, 6, 9])
    h.add([4, 4], [1, 2, 3])
    h.save(tmp_path / "history.json")
    loaded = HistoryDraft.load(tmp_path / "history.json")
    assert (loaded.max_order, loaded.min_order, loaded.min_chain) == (4, 2, 0.1)
    for prompt, completion in [(PROMPT, [5, 6]), (PROMPT, []), ([4, 4], [1])]:
        assert loaded.propose(prompt, completion, 3) == h.propose(prompt, completion, 3)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BebopError, match="cannot read a history draft"):
        HistoryDraft.load(tmp_path / "bad.json")


def test_bad_settings_are_refused():
    with pytest.raises(BebopError):
        HistoryDraft(max_order=2, min_order=3)
    with pytest.raises(BebopError):
        HistoryDraft(min_chain=1.5)
