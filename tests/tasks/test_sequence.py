import pytest

from bebop.tasks import SEQUENCE_LEVELS, TASKS, Task, rewards, rl_tasks, split_of


def _terms(task):
    return [int(x) for x in task.answer.split(",")]


def test_registered_with_levels_and_a_default():
    src = TASKS["sequence"]
    assert src.difficulties == tuple(SEQUENCE_LEVELS) and src.default == "count"


@pytest.mark.parametrize("level", list(SEQUENCE_LEVELS))
def test_tasks_are_deterministic_in_their_split_and_their_terms_what_the_prompt_asks(level):
    tasks = rl_tasks("sequence", 60, seed=2, split="heldout", difficulty=level)
    assert tasks == rl_tasks("sequence", 60, seed=2, split="heldout", difficulty=level)
    assert all(split_of(t.prompt) == "heldout" and t.kind == "sequence" for t in tasks)
    for t in tasks:
        terms = _terms(t)
        steps = {b - a for a, b in zip(terms, terms[1:])}
        assert len(steps) == 1 and 40 <= len(terms) <= 60
        step = steps.pop()
        assert (step == 1) == ("going up by" not in t.prompt) and (level != "count" or step == 1)
        # the prompt names the first and last terms and shows the first three
        assert f"from {terms[0]} to {terms[-1]}" in t.prompt
        assert f"{terms[0]}, {terms[1]}, {terms[2]}, ..." in t.prompt
    train = {t.prompt for t in rl_tasks("sequence", 300, seed=0, difficulty=level)}
    assert train.isdisjoint(t.prompt for t in tasks)


def test_reward_is_the_longest_correct_run_from_the_first_term():
    t = Task("sequence", "List every number from 5 to 14 ...", answer=",".join(str(x) for x in range(5, 15)))
    whole = ", ".join(str(x) for x in range(5, 15))
    got = rewards([t] * 7, [
        whole,
        f"Here are the numbers from 5 to 14: {whole}.",        # a preamble naming the ends does not break the run
        "5, 6, 7, 8, 10, 11, 12, 13, 14",                      # a skipped term ends the run at 4 of 10
        "6, 7, 8, 9, 10, 11, 12, 13, 14",                      # not from the first term: no run at all
        "5, 6, 7\n\n5, 6, 7, 8, 9, 10",                        # the longer of two attempts counts
        "5.5, 6, 7",                                           # 5.5 is not 5
        "",
    ])
    assert got == [1.0, 1.0, 0.4, 0.0, 0.6, 0.0, 0.0]


def test_rewards_are_in_unit_interval_for_its_own_answer_and_a_cut_one():
    for t in rl_tasks("sequence", 20, seed=1, difficulty="mixed"):
        terms = _terms(t)
        full, half = ", ".join(map(str, terms)), ", ".join(map(str, terms[:len(terms) // 2]))
        assert t.reward(full) == 1.0
        assert t.reward(half) == pytest.approx((len(terms) // 2) / len(terms))
