"""Small Python function-writing tasks with hidden assert tests and a reference solution."""

import itertools
import math
import random
import re

from bebop.tasks.base import Task, register_kind, register_reward, register_task
from bebop.tasks.sandbox import Limits, run_many

CODE_INSTRUCTION = "Reply with the complete function in a single ```python code block."


# Each template returns (signature, description, reference solution, cases).
# The expected values in `cases` are computed here in Python, independently of
# the solution's source text, so exec(solution + tests) is a real check.

_WORDS = [
    "apple", "river", "stone", "garden", "python", "window", "orange", "cloud", "silver", "planet",
    "music", "bridge", "forest", "candle", "tiger", "ocean", "pencil", "rocket", "yellow", "island",
]
_PALINDROMES = ["level", "racecar", "noon", "radar", "kayak", "refer", "madam", "civic", "rotor", "stats"]


def _phrase(rng, lo=1, hi=6):
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _ints(rng, k, lo=-20, hi=50):
    return [rng.randint(lo, hi) for _ in range(k)]


def _c_add_k(rng):
    k = rng.randint(1, 99)
    sol = f"def add_k(x):\n    return x + {k}\n"
    return "add_k(x)", f"returns x + {k}", sol, [((x,), x + k) for x in _ints(rng, 4)]


def _c_times_k(rng):
    k = rng.randint(2, 12)
    sol = f"def times_k(x):\n    return {k} * x\n"
    xs = _ints(rng, 4, 1, 60)  # non-zero, so returning x unchanged can't pass
    return "times_k(x)", f"returns x multiplied by {k}", sol, [((x,), x * k) for x in xs]


def _c_power(rng):
    k = rng.randint(2, 5)
    sol = f"def power_{k}(x):\n    r = 1\n    for _ in range({k}):\n        r *= x\n    return r\n"
    xs = rng.sample([-4, -3, -2, 2, 3, 4, 5, 6, 7], 4)
    return f"power_{k}(x)", f"returns x raised to the power {k}", sol, [((x,), x**k) for x in xs]


def _c_reverse(rng):
    name = rng.choice(["reverse_string", "reverse_text"])
    sol = f"def {name}(s):\n    return ''.join(reversed(s))\n"
    cases = [((w,), w[::-1]) for w in rng.sample(_WORDS, 3)] + [(("",), "")]
    return f"{name}(s)", "returns the string s reversed", sol, cases


def _c_count_vowels(rng):
    def vary(w):
        return rng.choice([w, w.upper(), w.capitalize()])

    sol = "def count_vowels(s):\n    n = 0\n    for ch in s.lower():\n        if ch in 'aeiou':\n            n += 1\n    return n\n"
    cases = []
    for _ in range(4):
        s = " ".join(vary(w) for w in _phrase(rng, 1, 4).split())
        cases.append(((s,), sum(ch in "aeiouAEIOU" for ch in s)))
    desc = "returns the number of vowels (a, e, i, o, u) in the string s, counting both lowercase and uppercase letters"
    return "count_vowels(s)", desc, sol, cases


def _c_count_char(rng):
    c = rng.choice("aeilnorst")
    sol = f"def count_char(s):\n    n = 0\n    for ch in s:\n        if ch == {c!r}:\n            n += 1\n    return n\n"
    cases = [((s,), s.count(c)) for s in (_phrase(rng) for _ in range(4))]
    return "count_char(s)", f"returns how many times the letter '{c}' appears in the string s", sol, cases


def _c_sum_list(rng):
    sol = "def sum_list(nums):\n    total = 0\n    for x in nums:\n        total += x\n    return total\n"
    lists = [_ints(rng, rng.randint(2, 6)) for _ in range(3)] + [[]]
    return "sum_list(nums)", "returns the sum of the numbers in the list nums (0 for an empty list)", sol, [((l,), sum(l)) for l in lists]


def _c_sum_above(rng):
    k = rng.randint(0, 20)
    sol = f"def sum_above(nums):\n    return sum(x for x in nums if x > {k})\n"
    lists = [_ints(rng, rng.randint(3, 7)) for _ in range(4)]
    cases = [((l,), sum(filter(lambda x: x > k, l))) for l in lists]
    return "sum_above(nums)", f"returns the sum of the numbers in the list nums that are greater than {k}", sol, cases


def _c_keep_multiples(rng):
    k = rng.randint(2, 7)
    sol = f"def keep_multiples(nums):\n    return [x for x in nums if x % {k} == 0]\n"
    lists = [_ints(rng, rng.randint(3, 8), 1, 60) for _ in range(4)]
    cases = [((l,), list(filter(lambda x: x % k == 0, l))) for l in lists]
    desc = f"returns a list of the numbers in the list nums that are divisible by {k}, in their original order"
    return "keep_multiples(nums)", desc, sol, cases


def _c_scale_list(rng):
    k = rng.randint(2, 5)
    sol = f"def scale_list(nums):\n    return [{k} * x for x in nums]\n"
    lists = [_ints(rng, rng.randint(2, 5), 1, 30) for _ in range(3)] + [[]]
    cases = [((l,), list(map(lambda x: x * k, l))) for l in lists]
    return "scale_list(nums)", f"returns a new list with every number in the list nums multiplied by {k}", sol, cases


def _c_extreme(rng):
    largest = rng.random() < 0.5
    name, word, cmp = ("largest", "largest", ">") if largest else ("smallest", "smallest", "<")
    sol = f"def {name}(nums):\n    best = nums[0]\n    for x in nums[1:]:\n        if x {cmp} best:\n            best = x\n    return best\n"
    lists = [_ints(rng, rng.randint(1, 7)) for _ in range(4)]
    cases = [((l,), max(l) if largest else min(l)) for l in lists]
    return f"{name}(nums)", f"returns the {word} number in the non-empty list nums", sol, cases


def _c_is_multiple(rng):
    k = rng.randint(2, 9)
    name = "is_even" if k == 2 else f"is_multiple_of_{k}"
    desc = "returns True if the integer x is even and False otherwise" if k == 2 else f"returns True if the integer x is divisible by {k} and False otherwise"
    sol = f"def {name}(x):\n    return x % {k} == 0\n"
    yes = [k * rng.randint(1, 20) for _ in range(2)]
    no = [k * rng.randint(0, 20) + rng.randint(1, k - 1) for _ in range(2)]
    xs = yes + no
    rng.shuffle(xs)
    return f"{name}(x)", desc, sol, [((x,), x % k == 0) for x in xs]


def _c_fizz(rng):
    a, b = rng.sample([2, 3, 5, 7], 2)
    w1, w2 = rng.sample(["Fizz", "Buzz", "Bing", "Bong", "Zap", "Pop"], 2)
    desc = (f"returns '{w1}{w2}' if n is divisible by both {a} and {b}, '{w1}' if n is divisible only by {a}, "
            f"'{w2}' if n is divisible only by {b}, and str(n) otherwise")
    sol = (f"def fizz(n):\n    out = ''\n    if n % {a} == 0:\n        out += {w1!r}\n    if n % {b} == 0:\n        out += {w2!r}\n"
           "    return out or str(n)\n")

    def expect(n):
        if n % (a * b) == 0:
            return w1 + w2
        if n % a == 0:
            return w1
        if n % b == 0:
            return w2
        return str(n)

    # one number from each of the four branches
    pools = [[n for n in range(1, 150) if (n % a == 0, n % b == 0) == flags]
             for flags in [(True, True), (True, False), (False, True), (False, False)]]
    ns = [rng.choice(p) for p in pools]
    rng.shuffle(ns)
    return "fizz(n)", desc, sol, [((n,), expect(n)) for n in ns]


def _c_factorial(rng):
    sol = "def factorial(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r\n"
    ns = [0] + rng.sample(range(2, 11), 3)
    return "factorial(n)", "returns n! (the product 1 * 2 * ... * n), with factorial(0) == 1", sol, [((n,), math.factorial(n)) for n in ns]


def _c_fib(rng):
    a, b = rng.randint(0, 3), rng.randint(1, 5)
    seq = [a, b]
    while len(seq) < 20:
        seq.append(seq[-1] + seq[-2])
    sol = f"def fib(n):\n    x, y = {a}, {b}\n    for _ in range(n):\n        x, y = y, x + y\n    return x\n"
    desc = (f"returns term n of the sequence that starts {a}, {b} and where every later term is the sum of the two "
            f"before it (so fib(0) == {a} and fib(1) == {b})")
    ns = sorted(rng.sample(range(0, 20), 4))
    return "fib(n)", desc, sol, [((n,), seq[n]) for n in ns]


def _c_clamp(rng):
    lo = rng.randint(0, 20)
    hi = lo + rng.randint(5, 50)
    sol = f"def clamp(x):\n    return max({lo}, min({hi}, x))\n"

    def expect(x):
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x

    xs = [rng.randint(lo - 30, lo - 1), rng.randint(hi + 1, hi + 30), rng.randint(lo, hi)]
    rng.shuffle(xs)
    desc = f"returns x limited to the range {lo} to {hi}: {lo} if x is smaller than {lo}, {hi} if x is larger than {hi}, and x otherwise"
    return "clamp(x)", desc, sol, [((x,), expect(x)) for x in xs]


def _c_sum_digits(rng):
    sol = "def sum_digits(n):\n    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total\n"
    ns = [rng.randint(10, 99999) for _ in range(3)] + [0]
    return "sum_digits(n)", "returns the sum of the decimal digits of the non-negative integer n", sol, [((n,), sum(map(int, str(n)))) for n in ns]


def _c_is_palindrome(rng):
    sol = ("def is_palindrome(s):\n    for i in range(len(s) // 2):\n        if s[i] != s[len(s) - 1 - i]:\n"
           "            return False\n    return True\n")
    words = rng.sample(_PALINDROMES, 2) + rng.sample(_WORDS, 2)  # _WORDS has no palindromes
    rng.shuffle(words)
    desc = "returns True if the string s reads the same forwards and backwards, and False otherwise"
    return "is_palindrome(s)", desc, sol, [((w,), w == w[::-1]) for w in words]


def _c_repeat(rng):
    k = rng.randint(2, 4)
    sep = rng.choice([" ", "-", ", ", "|"])
    sol = f"def repeat_word(s):\n    return {sep!r}.join([s] * {k})\n"

    def expect(s):
        out = s
        for _ in range(k - 1):
            out = out + sep + s
        return out

    cases = [((w,), expect(w)) for w in rng.sample(_WORDS, 3)]
    return "repeat_word(s)", f"returns s repeated {k} times, separated by {sep!r}", sol, cases


def _c_count_words(rng):
    sol = "def count_words(s):\n    return len(s.split())\n"
    phrases = [[rng.choice(_WORDS) for _ in range(rng.randint(1, 7))] for _ in range(3)]
    cases = [((" ".join(p),), len(p)) for p in phrases] + [(("",), 0)]
    desc = "returns the number of words in the string s, where words are separated by single spaces (an empty string has 0 words)"
    return "count_words(s)", desc, sol, cases


def _c_longest_word(rng):
    sol = ("def longest_word(s):\n    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n"
           "            best = w\n    return best\n")
    phrases = [_phrase(rng, 2, 6) for _ in range(4)]
    desc = "returns the longest word in the string s, where words are separated by spaces (if several words tie, return the first of them)"
    return "longest_word(s)", desc, sol, [((p,), max(p.split(), key=len)) for p in phrases]


_CODE_TEMPLATES = [
    _c_add_k, _c_times_k, _c_power, _c_reverse, _c_count_vowels, _c_count_char, _c_sum_list, _c_sum_above,
    _c_keep_multiples, _c_scale_list, _c_extreme, _c_is_multiple, _c_fizz, _c_factorial, _c_fib, _c_clamp,
    _c_sum_digits, _c_is_palindrome, _c_repeat, _c_count_words, _c_longest_word,
]


@register_kind("code")
def _code_stream(rng, templates=_CODE_TEMPLATES, difficulty=None):
    while True:
        sig, desc, sol, cases = rng.choice(templates)(rng)
        name = sig.split("(")[0]
        tests = "\n".join(f"assert {name}({', '.join(map(repr, args))}) == {want!r}" for args, want in cases)
        prompt = f"Write a Python function {sig} that {desc}.\n{CODE_INSTRUCTION}"
        yield Task("code", prompt, tests=tests + "\n", solution=sol, difficulty=difficulty)


def code_tasks(n: int, seed: int) -> list[Task]:
    return list(itertools.islice(_code_stream(random.Random(seed)), n))


# RL difficulty levels: "easy" asks for textbook one-liners and loops; "medium" is the whole mix above. The
# default, "medium", is the level the default model solves some of the time (examples/task_accuracy.py measures
# each level).
CODE_LEVELS = {
    "easy": [_c_add_k, _c_times_k, _c_power, _c_reverse, _c_sum_list, _c_scale_list, _c_extreme, _c_is_multiple,
             _c_factorial, _c_count_words],
    "medium": _CODE_TEMPLATES,
}


@register_task("code", difficulties=tuple(CODE_LEVELS), default="medium")
def _code_rl_stream(rng, difficulty):
    return _code_stream(rng, CODE_LEVELS[difficulty], difficulty)


# an opening fence (```python, ```py or a bare ```) up to its closing fence, or to the end of a truncated reply
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def extract_code(completion: str, function: str | None = None) -> str | None:
    """The code of the reply's first fenced block that defines `function` (else its first block); None when
    the reply has no fenced block, as the instruction asks for one. A reply that starts straight with the
    definition and only closes the fence (small models do) counts as a block too."""
    blocks = _FENCE.findall(completion)
    if function is not None:
        head = completion.split("```", 1)[0]
        if "```" in completion and _defines(head, function):
            blocks = [head] + blocks
        blocks = [b for b in blocks if _defines(b, function)] or blocks
    return blocks[0] if blocks else None


def _defines(code: str, function: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(function)}\s*\(", code, re.M) is not None


def function_name(task: Task) -> str:
    return re.match(r"assert (\w+)\(", task.tests).group(1)


@register_reward("code")
def code_rewards(tasks: list[Task], completions: list[str], limits: Limits = Limits()) -> list[float]:
    """The fraction of each task's hidden asserts that the reply's code passes, run in parallel sandboxes."""
    out = [0.0] * len(tasks)
    jobs, index = [], []
    for i, (task, completion) in enumerate(zip(tasks, completions)):
        code = extract_code(completion, function_name(task))
        if code is not None:
            jobs.append((code, task.tests.splitlines()))
            index.append(i)
    for i, score in zip(index, run_many(jobs, limits)):
        out[i] = score
    return out
