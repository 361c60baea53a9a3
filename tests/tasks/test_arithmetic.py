import pytest

from bebop.errors import BebopError
from bebop.tasks import ARITHMETIC_LEVELS, TASKS, Task, mixed_tasks, rewards, rl_tasks, split_of


def test_registry_names_and_default_level():
    assert {"arithmetic", "code"} <= set(TASKS)
    src = TASKS["arithmetic"]
    assert src.difficulties == tuple(ARITHMETIC_LEVELS) and src.default in src.difficulties
    assert all(t.difficulty == src.default for t in rl_tasks("arithmetic", 5, seed=0))


@pytest.mark.parametrize("level", list(ARITHMETIC_LEVELS))
def test_rl_tasks_deterministic_prefix_stable_and_in_split(level):
    a = rl_tasks("arithmetic", 40, seed=3, split="heldout", difficulty=level)
    assert a == rl_tasks("arithmetic", 40, seed=3, split="heldout", difficulty=level)
    assert rl_tasks("arithmetic", 10, seed=3, split="heldout", difficulty=level) == a[:10]
    assert [t.prompt for t in rl_tasks("arithmetic", 40, seed=4, split="heldout", difficulty=level)] != [t.prompt for t in a]
    assert all(split_of(t.prompt) == "heldout" and t.kind == "math" and t.difficulty == level for t in a)
    train = {t.prompt for t in rl_tasks("arithmetic", 400, seed=0, split="train", difficulty=level)}
    assert train.isdisjoint(t.prompt for t in a)


@pytest.mark.parametrize("level", list(ARITHMETIC_LEVELS))
def test_every_answer_is_the_value_of_the_question(level):
    # the simple levels are "What is a op b?": recompute independently of the template code
    for t in rl_tasks("arithmetic", 200, seed=1, difficulty=level):
        q = t.prompt.split("\n")[0]
        if q.startswith("What is "):
            a, op, b = q[len("What is "):-1].split()
            want = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op]
            assert want == int(t.answer) and want >= 0, q


def test_levels_get_harder():
    def mean_answer(level):
        ts = rl_tasks("arithmetic", 300, seed=0, difficulty=level)
        return sum(int(t.answer) for t in ts) / len(ts)
    assert mean_answer("easy") < mean_answer("medium") < mean_answer("hard")


def test_reward_uses_the_final_answer():
    t = Task("math", "What is 19 + 8?", answer="27")
    assert t.reward("19 + 8 = 27.\nAnswer: 27") == 1.0
    assert t.reward("Answer: 27.0") == 1.0
    assert t.reward("It is 27? No.\nAnswer: 28") == 0.0  # the marked answer wins over earlier numbers
    assert t.reward("The total is 27") == 1.0  # no marker: the last number
    assert t.reward("I don't know") == 0.0
    assert t.reward("Answer: 27.5") == 0.0


def test_rewards_batch_matches_single_and_mixes_kinds():
    ts = rl_tasks("arithmetic", 6, seed=0)
    outs = [f"Answer: {t.answer}" if i % 2 else "Answer: -1" for i, t in enumerate(ts)]
    assert rewards(ts, outs) == [t.reward(o) for t, o in zip(ts, outs)] == [0.0, 1.0] * 3
    with pytest.raises(ValueError, match="no verifiable reward"):
        rewards(mixed_tasks(1, seed=0, mix=("chat",)), ["hi"])
    with pytest.raises(ValueError, match="completions"):
        rewards(ts, outs[:2])


@pytest.mark.parametrize("kwargs, needle", [
    (dict(name="poetry"), "unknown task 'poetry'"),
    (dict(name="arithmetic", difficulty="insane"), "unknown difficulty 'insane'"),
    (dict(name="arithmetic", split="test"), "unknown split 'test'"),
    (dict(name="arithmetic", n=-1), ">= 0"),
])
def test_rl_tasks_rejects_bad_arguments(kwargs, needle):
    args = dict(n=3, seed=0) | kwargs
    with pytest.raises(BebopError, match=needle):
        rl_tasks(**args)
