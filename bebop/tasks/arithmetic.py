"""Arithmetic word problems with exact integer answers, and the answer check."""

import itertools
import random
import re

from bebop.tasks.base import Task, register_kind, register_reward, register_task

ANSWER_MARKER = "Answer:"
MATH_INSTRUCTION = f'Work it out briefly, then give the final answer on the last line as "{ANSWER_MARKER} <number>".'


_NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Maya", "Ben", "Zoe", "Ivan", "Priya", "Kofi", "Lena"]
_ITEMS = ["apples", "pencils", "marbles", "stickers", "cookies", "books", "cards", "eggs"]


def _m_add(rng):
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    return f"What is {a} + {b}?", a + b


def _m_sub(rng):
    a = rng.randint(20, 999)
    b = rng.randint(1, a)  # keep answers non-negative; small models stumble on signs
    return f"What is {a} - {b}?", a - b


def _m_mul(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 19)
    return f"What is {a} * {b}?", a * b


def _m_div(rng):
    b, q = rng.randint(2, 12), rng.randint(2, 50)
    return f"What is {b * q} / {b}?", q  # exact by construction


def _m_mul_sub(rng):
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    c = rng.randint(1, a * b)
    return f"Compute ({a} * {b}) - {c}.", a * b - c


def _m_add_mul(rng):
    a, b, c = rng.randint(1, 50), rng.randint(1, 50), rng.randint(2, 9)
    return f"Compute ({a} + {b}) * {c}.", (a + b) * c


def _m_two_products(rng):
    a, b, c, d = (rng.randint(2, 15) for _ in range(4))
    return f"Compute {a} * {b} + {c} * {d}.", a * b + c * d


def _m_add_sub(rng):
    a, b = rng.randint(10, 200), rng.randint(10, 200)
    c = rng.randint(1, a + b)
    return f"Compute {a} + {b} - {c}.", a + b - c


def _m_boxes(rng):
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 24)
    c = rng.randint(1, a * b - 1)
    q = f"{name} has {a} boxes of {b} {item}. {name} gives away {c} {item}. How many {item} does {name} have left?"
    return q, a * b - c


def _m_change(rng):
    name = rng.choice(_NAMES)
    a, p = rng.randint(2, 9), rng.randint(2, 15)
    bill = next(x for x in (20, 50, 100, 200) if x > a * p)
    q = f"{name} buys {a} notebooks at {p} dollars each and pays with a {bill}-dollar bill. How many dollars of change does {name} get?"
    return q, bill - a * p


def _m_pages(rng):
    name = rng.choice(_NAMES)
    a, d, c = rng.randint(5, 40), rng.randint(2, 14), rng.randint(1, 30)
    q = f"{name} reads {a} pages a day for {d} days and then reads {c} more pages. How many pages does {name} read in total?"
    return q, a * d + c


def _m_groups(rng):
    g, s = rng.randint(2, 9), rng.randint(2, 12)
    return f"A teacher splits {g * s} students into {g} equal groups. How many students are in each group?", s


def _m_train(rng):
    v, h = rng.randint(20, 120), rng.randint(2, 9)
    return f"A train travels at {v} km per hour for {h} hours. How many km does it travel?", v * h


def _m_savings(rng):
    name = rng.choice(_NAMES)
    a, w = rng.randint(3, 30), rng.randint(2, 12)
    c = rng.randint(1, a * w)
    q = f"{name} saves {a} dollars every week. After {w} weeks, {name} spends {c} dollars on a gift. How many dollars does {name} have left?"
    return q, a * w - c


def _m_legs(rng):
    c, k = rng.randint(1, 30), rng.randint(1, 20)
    return f"A farm has {c} chickens and {k} cows. How many legs do these animals have in total?", 2 * c + 4 * k


_MATH_TEMPLATES = [
    _m_add, _m_sub, _m_mul, _m_div, _m_mul_sub, _m_add_mul, _m_two_products, _m_add_sub,
    _m_boxes, _m_change, _m_pages, _m_groups, _m_train, _m_savings, _m_legs,
]


@register_kind("math")
def _math_stream(rng):
    while True:
        question, answer = rng.choice(_MATH_TEMPLATES)(rng)
        yield Task("math", f"{question}\n{MATH_INSTRUCTION}", answer=str(answer))


def math_tasks(n: int, seed: int) -> list[Task]:
    return list(itertools.islice(_math_stream(random.Random(seed)), n))


# RL difficulty levels: "hard" is the mix above (multi-step word problems); the lower levels are single
# operations on smaller numbers. GRPO needs groups with both outcomes, so the default, "easy", is the level the
# default model solves some of the time (examples/task_accuracy.py measures each level).


def _e_add(rng):
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    return f"What is {a} + {b}?", a + b


def _e_sub(rng):
    a = rng.randint(5, 30)
    b = rng.randint(1, a)
    return f"What is {a} - {b}?", a - b


def _e_mul(rng):
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"What is {a} * {b}?", a * b


def _md_add(rng):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"What is {a} + {b}?", a + b


def _md_sub(rng):
    a = rng.randint(20, 99)
    b = rng.randint(1, a)
    return f"What is {a} - {b}?", a - b


def _md_mul(rng):
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"What is {a} * {b}?", a * b


def _md_div(rng):
    b, q = rng.randint(2, 9), rng.randint(2, 12)
    return f"What is {b * q} / {b}?", q


ARITHMETIC_LEVELS = {
    "easy": [_e_add, _e_sub, _e_mul],
    "medium": [_md_add, _md_sub, _md_mul, _md_div],
    "hard": _MATH_TEMPLATES,
}


@register_task("arithmetic", difficulties=tuple(ARITHMETIC_LEVELS), default="easy")
def _arithmetic_stream(rng, difficulty):
    templates = ARITHMETIC_LEVELS[difficulty]
    while True:
        question, answer = rng.choice(templates)(rng)
        yield Task("math", f"{question}\n{MATH_INSTRUCTION}", answer=str(answer), difficulty=difficulty)


# a number as written in a reply: optional sign (not a hyphen inside "12-7"),
# optional thousands separators, optional decimals
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")


def _parse_number(s: str) -> int | None:
    s = s.replace(",", "")
    if "." in s:
        whole, frac = s.split(".")
        if frac.strip("0"):
            return None  # "42.5" is not the integer 42
        s = whole
    return int(s)


def check_math_answer(task: Task, completion: str) -> bool:
    if task.kind != "math" or task.answer is None:
        raise ValueError(f"check_math_answer needs a math task, got kind={task.kind!r}")
    # the instruction asks for the answer after the marker; trust the last one,
    # since a model may restate the question's format earlier in its reply
    i = completion.lower().rfind(ANSWER_MARKER.lower())
    m = _NUMBER.search(completion, i + len(ANSWER_MARKER)) if i >= 0 else None
    if m is None:
        # fallback for replies that ignore the format: the last number is usually the result
        found = _NUMBER.findall(completion)
        if not found:
            return False
        text = found[-1]
    else:
        text = m.group(0)
    value = _parse_number(text)
    return value is not None and value == int(task.answer)


@register_reward("math")
def math_rewards(tasks: list[Task], completions: list[str]) -> list[float]:
    """1.0 when the completion's final number equals the task's answer, else 0.0."""
    return [float(check_math_answer(t, c)) for t, c in zip(tasks, completions)]
