import random

from bebop.tasks import CODE_LEVELS, TASKS, Task, code_rewards, extract_code, rewards, rl_tasks
from bebop.tasks.code import _CODE_TEMPLATES, _code_stream, function_name
from bebop.tasks.sandbox import Limits

LIMITS = Limits(wall_seconds=3.0)


def fenced(code, lang="python"):
    return f"Here you go:\n```{lang}\n{code}```\nIt returns the result."


def test_extract_code():
    assert extract_code(fenced("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"
    assert extract_code(fenced("def f(x): pass\n", lang="py")) == "def f(x): pass\n"
    assert extract_code(fenced("def f(x): pass\n", lang="")) == "def f(x): pass\n"
    assert extract_code("```python\ndef f(x):\n    return x") == "def f(x):\n    return x"  # cut at the length limit
    assert extract_code("def f(x):\n    return x\n") is None  # the instruction asks for a block
    two = "```python\nprint(f(2))\n```\nand\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(two, "f") == "def f(x):\n    return x\n"
    assert extract_code(two) == "print(f(2))\n"
    # the definition first, then only a closing fence: taken when it defines the function asked for
    closing_only = "def f(x):\n    return x\n```\nThis returns x.\n```python\nprint(f(1))\n```"
    assert extract_code(closing_only, "f") == "def f(x):\n    return x\n"
    assert extract_code(closing_only, "g") == "This returns x.\n"  # no definition: the fences pair up as written


def test_rl_code_tasks_and_levels():
    assert "code" in TASKS and TASKS["code"].default in TASKS["code"].difficulties == tuple(CODE_LEVELS)
    easy = rl_tasks("code", 100, seed=0, difficulty="easy")
    assert easy == rl_tasks("code", 100, seed=0, difficulty="easy")
    assert all(t.kind == "code" and t.difficulty == "easy" and t.tests.startswith("assert ") for t in easy)
    names = {function_name(t) for t in easy}
    assert "fizz" not in names and len(names) > 5


def test_reference_solutions_score_one_in_the_sandbox():
    # a sample of templates (test_tasks.py checks every one in-process; each sandbox is a process start):
    # the reference gets 1.0, a stub that returns None 0.0, and a reply without a code block 0.0
    templates = random.Random(0).sample(_CODE_TEMPLATES, 8)
    tasks = [next(_code_stream(random.Random(i), [template])) for i, template in enumerate(templates)]
    stubs = [f"def {function_name(t)}(*args):\n    return None\n" for t in tasks[:3]]
    scores = code_rewards(tasks + tasks[:4],
                          [fenced(t.solution) for t in tasks] + [fenced(s) for s in stubs] + [tasks[0].solution],
                          limits=LIMITS)
    assert scores == [1.0] * len(tasks) + [0.0] * 4


def test_partial_credit_is_the_fraction_of_asserts():
    t = Task("code", "inc", tests="assert inc(1) == 2\nassert inc(2) == 3\nassert inc(3) == 4\nassert inc(4) == 5\n")
    wrong_above_2 = "def inc(x):\n    return x + 1 if x <= 2 else 0\n"
    assert rewards([t, t], [fenced(wrong_above_2), fenced("def inc(x):\n    return x + 1\n")]) == [0.5, 1.0]
