import re
from collections import Counter

import pytest

from bebop.errors import BebopError
from bebop.tasks import (
    ANSWER_MARKER,
    MATH_INSTRUCTION,
    Task,
    chat_tasks,
    check_math_answer,
    code_tasks,
    default_prompts,
    load_prompts_file,
    math_tasks,
    mixed_tasks,
    parse_mix,
    split_of,
)

# --- generation --------------------------------------------------------------


@pytest.mark.parametrize("gen", [math_tasks, code_tasks, chat_tasks])
def test_deterministic_per_seed_and_seeds_differ(gen):
    a, b, c = gen(50, 3), gen(50, 3), gen(50, 4)
    assert a == b
    assert [t.prompt for t in a] != [t.prompt for t in c]


def test_mixed_deterministic_and_prefix_stable():
    a = mixed_tasks(60, seed=7, split="heldout")
    assert a == mixed_tasks(60, seed=7, split="heldout")
    assert mixed_tasks(20, seed=7, split="heldout") == a[:20]
    assert [t.prompt for t in mixed_tasks(60, seed=8, split="heldout")] != [t.prompt for t in a]


def test_train_and_heldout_never_share_a_prompt():
    train = mixed_tasks(2000, seed=0, split="train")
    heldout = mixed_tasks(2000, seed=1, split="heldout")
    train_p, heldout_p = {t.prompt for t in train}, {t.prompt for t in heldout}
    assert not train_p & heldout_p
    assert all(split_of(p) == "train" for p in train_p)
    # the split is roughly 10% of distinct prompts, measured on plentiful math prompts
    frac = sum(split_of(t.prompt) == "heldout" for t in math_tasks(3000, 0)) / 3000
    assert 0.06 < frac < 0.14


def test_mixed_is_balanced_round_robin():
    tasks = mixed_tasks(301, seed=0)
    assert [t.kind for t in tasks[:6]] == ["chat", "math", "code"] * 2
    counts = Counter(t.kind for t in tasks)
    assert counts == {"chat": 101, "math": 100, "code": 100}
    only = mixed_tasks(10, seed=0, mix=("math", "code"))
    assert [t.kind for t in only] == ["math", "code"] * 5


def test_weighted_mix_follows_its_shares_in_every_prefix():
    mix = {"math": 0.4, "code": 0.3, "chat": 0.3}
    tasks = mixed_tasks(1000, seed=0, mix=mix)
    assert mixed_tasks(333, seed=0, mix=mix) == tasks[:333]
    for n in (10, 97, 1000):
        counts = Counter(t.kind for t in tasks[:n])
        for kind, share in mix.items():
            assert abs(counts[kind] - share * n) <= 1, (n, kind, counts)
    # a kind's tasks do not depend on the weights: only how many of them are drawn
    maths = [t for t in tasks if t.kind == "math"]
    assert maths[:50] == [t for t in mixed_tasks(150, seed=0) if t.kind == "math"][:50]
    assert mixed_tasks(9, seed=0, mix={"chat": 1, "math": 1, "code": 1}) == mixed_tasks(9, seed=0)
    assert parse_mix("math=2, code=1") == {"math": 2.0, "code": 1.0}
    for bad in ("math", "math=0", "math=x", "math=1,math=1", "poetry=1", "math=inf"):
        with pytest.raises(BebopError):
            parse_mix(bad)


def test_mixed_rejects_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        mixed_tasks(3, 0, split="test")
    with pytest.raises(ValueError, match="kind"):
        mixed_tasks(3, 0, mix=("chat", "poetry"))


def test_default_prompts_are_heldout_strings():
    p = default_prompts(30)
    assert len(p) == 30 and all(isinstance(x, str) and x for x in p)
    assert all(split_of(x) == "heldout" for x in p)
    assert p == default_prompts(30)


def test_chat_variety_and_fields():
    tasks = chat_tasks(2000, seed=0)
    assert len({t.prompt for t in tasks}) >= 300
    assert all(t.kind == "chat" and t.answer is None and t.tests is None for t in tasks)
    # shuffled epochs: no repeats within the first few hundred
    first = [t.prompt for t in tasks[:300]]
    assert len(set(first)) == 300


# --- math --------------------------------------------------------------------

_ARITH = re.compile(r"^(?:What is|Compute) ([\d\s+\-*/()]+)[?.]$")
_WORD = [  # regex over the question -> independent recomputation of the answer
    (r"has (\d+) boxes of (\d+) \w+\. \w+ gives away (\d+)", lambda a, b, c: a * b - c),
    (r"buys (\d+) notebooks at (\d+) dollars each and pays with a (\d+)-dollar", lambda a, p, bill: bill - a * p),
    (r"reads (\d+) pages a day for (\d+) days and then reads (\d+) more", lambda a, d, c: a * d + c),
    (r"splits (\d+) students into (\d+) equal groups", lambda s, g: s // g),
    (r"travels at (\d+) km per hour for (\d+) hours", lambda v, h: v * h),
    (r"saves (\d+) dollars every week\. After (\d+) weeks, \w+ spends (\d+)", lambda a, w, c: a * w - c),
    (r"has (\d+) chickens and (\d+) cows", lambda c, k: 2 * c + 4 * k),
]


def _recompute(question):
    m = _ARITH.match(question)
    if m:
        value = eval(m.group(1))  # only digits, spaces, + - * / ( ) get through the regex
        assert value == int(value), question  # divisions must be exact
        return int(value)
    for pattern, f in _WORD:
        m = re.search(pattern, question)
        if m:
            return f(*map(int, m.groups()))
    raise AssertionError(f"no independent check for: {question!r}")


def test_every_math_answer_is_correct():
    tasks = math_tasks(1500, seed=0)
    seen = set()
    for t in tasks:
        question, instruction = t.prompt.split("\n")
        assert instruction == MATH_INSTRUCTION
        assert t.kind == "math" and t.tests is None
        assert t.answer == str(_recompute(question)), t.prompt
        assert int(t.answer) >= 0
        seen.add("arith" if _ARITH.match(question) else "word")
    assert seen == {"arith", "word"}


def test_check_math_answer():
    t = Task("math", "What is 37 + 5?", answer="42")
    assert check_math_answer(t, "37 + 5 = 42.\nAnswer: 42")
    assert check_math_answer(t, f"First 30 + 5 = 35, then +7.\n**{ANSWER_MARKER}** 42")
    assert check_math_answer(t, "answer: 42.0")
    assert check_math_answer(t, "Answer: 1\nWait, let me redo it. Answer: 42")  # last marker wins
    assert check_math_answer(t, "37 + 5 is 42")  # fallback: last number
    assert not check_math_answer(t, "Answer: 41")
    assert not check_math_answer(t, "The result is 42. Answer: 43")
    assert not check_math_answer(t, "Answer: 42.5")
    assert not check_math_answer(t, "I don't know.")
    big = Task("math", "?", answer="1234")
    assert check_math_answer(big, "Answer: 1,234")
    neg = Task("math", "?", answer="-3")
    assert check_math_answer(neg, "Answer: -3")
    assert not check_math_answer(Task("math", "?", answer="7"), "12-7 = 5")  # hyphen isn't a sign
    with pytest.raises(ValueError):
        check_math_answer(Task("chat", "hi"), "Answer: 1")


def test_math_tasks_pass_check_with_their_own_answer():
    for t in math_tasks(100, seed=1):
        assert check_math_answer(t, f"Some work with numbers 3 and 99.\n{ANSWER_MARKER} {t.answer}")
        assert not check_math_answer(t, f"{ANSWER_MARKER} {int(t.answer) + 1}")


# --- code --------------------------------------------------------------------


def _passes(src, tests):
    try:
        exec(src + "\n" + tests, {})
    except AssertionError:
        return False
    return True


def test_code_tests_pass_reference_and_fail_wrong_implementations():
    tasks = code_tasks(600, seed=0)
    assert len({t.prompt.split("(")[0] for t in tasks}) >= 15  # many templates exercised
    for t in tasks:
        assert t.kind == "code" and t.answer is None
        name = re.match(r"Write a Python function (\w+)\(", t.prompt).group(1)
        assert t.tests.count("assert ") >= 3 and f"assert {name}(" in t.tests
        assert _passes(t.solution, t.tests), t.prompt
        for wrong in ("return None", "return args[0]"):
            assert not _passes(f"def {name}(*args):\n    {wrong}\n", t.tests), (wrong, t.prompt)


def test_code_solution_not_in_repr():
    t = code_tasks(1, seed=0)[0]
    assert t.solution and t.solution not in repr(t)


# --- prompt files ------------------------------------------------------------


def test_load_prompts_file_good(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello"}\n\n  \n{"prompt": "two\\nlines", "id": 3}\n', encoding="utf-8")
    assert load_prompts_file(f) == ["hello", "two\nlines"]
    assert load_prompts_file(str(f)) == ["hello", "two\nlines"]


@pytest.mark.parametrize(
    "content, needle",
    [
        ('{"prompt": "ok"}\n{"prompt": oops}\n', "p.jsonl:2: invalid JSON"),
        ('{"prompt": "ok"}\n\n["a list"]\n', "p.jsonl:3: expected a JSON object"),
        ('{"text": "hi"}\n', 'p.jsonl:1: missing "prompt"'),
        ('{"prompt": "ok"}\n{"prompt": 5}\n', 'p.jsonl:2: "prompt" must be a string'),
        ('{"prompt": "   "}\n', 'p.jsonl:1: "prompt" is empty'),
        ("\n\n", "no prompts"),
    ],
)
def test_load_prompts_file_bad(tmp_path, content, needle):
    f = tmp_path / "p.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(BebopError) as e:
        load_prompts_file(f)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_load_prompts_file_missing(tmp_path):
    with pytest.raises(BebopError, match="nope.jsonl.*not found"):
        load_prompts_file(tmp_path / "nope.jsonl")
