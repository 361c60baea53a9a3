"""Built-in prompt sources: math, code and chat tasks generated from templates.

They serve three purposes:
  1. default prompts for benchmarks (the held-out split, so a draft is never
     benchmarked on prompts it was distilled on),
  2. self-distillation data for training the MTP draft (the train split),
  3. RL tasks with verifiable rewards (math answers, code asserts).

Everything is generated from templates with a seeded random.Random, so a
(n, seed, split) triple always gives the same tasks on every machine. Tasks
are deliberately simple: the target models are small (SmolLM2-135M).
"""

import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from bebop.errors import BebopError

KINDS = ("chat", "math", "code")
SPLITS = ("train", "heldout")
HELDOUT_PER_MILLE = 100  # ~10% of distinct prompts are held out

ANSWER_MARKER = "Answer:"
MATH_INSTRUCTION = f'Work it out briefly, then give the final answer on the last line as "{ANSWER_MARKER} <number>".'
CODE_INSTRUCTION = "Reply with the complete function in a single ```python code block."


@dataclass(frozen=True)
class Task:
    kind: str  # "math", "code" or "chat"
    prompt: str  # the user message (plain text; the caller applies the chat template)
    answer: str | None = None  # math: the exact final answer, e.g. "42"; else None
    tests: str | None = None  # code: python assert lines checking the requested function; else None
    # code: a reference implementation that passes `tests`. Never shown to the
    # model; it exists so the test suite can prove every generated task is solvable.
    solution: str | None = field(default=None, repr=False)


# -----------------------------------------------------------------------------
# math

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


def _math_stream(rng):
    while True:
        question, answer = rng.choice(_MATH_TEMPLATES)(rng)
        yield Task("math", f"{question}\n{MATH_INSTRUCTION}", answer=str(answer))


def math_tasks(n: int, seed: int) -> list[Task]:
    return list(itertools.islice(_math_stream(random.Random(seed)), n))


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


# -----------------------------------------------------------------------------
# code
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


def _code_stream(rng):
    while True:
        sig, desc, sol, cases = rng.choice(_CODE_TEMPLATES)(rng)
        name = sig.split("(")[0]
        tests = "\n".join(f"assert {name}({', '.join(map(repr, args))}) == {want!r}" for args, want in cases)
        prompt = f"Write a Python function {sig} that {desc}.\n{CODE_INSTRUCTION}"
        yield Task("code", prompt, tests=tests + "\n", solution=sol)


def code_tasks(n: int, seed: int) -> list[Task]:
    return list(itertools.islice(_code_stream(random.Random(seed)), n))


# -----------------------------------------------------------------------------
# chat

_CONCEPTS = [
    "photosynthesis", "how a rainbow forms", "gravity", "the water cycle", "how vaccines work", "inflation",
    "compound interest", "how the internet works", "machine learning", "black holes", "why the sky is blue",
    "how bees make honey", "the greenhouse effect", "how a bicycle stays upright", "supply and demand",
    "the immune system", "plate tectonics", "how batteries work", "the phases of the moon", "recycling",
    "how airplanes fly", "DNA", "volcanoes", "electricity", "why we have seasons", "democracy",
    "how a compiler works", "encryption", "ocean tides", "earthquakes", "how sleep affects memory",
    "the food chain", "how a refrigerator works", "the stock market", "evolution", "how clouds form",
    "magnets", "the solar system", "how GPS works", "sound waves",
]
_CONCEPT_TEMPLATES = [
    "Explain {} in simple terms.",
    "Summarize {} in two sentences.",
    "Describe {} to a ten-year-old.",
]
_SUBJECTS = [
    "the ocean", "autumn leaves", "a rainy morning", "a lost cat", "the city at night", "friendship",
    "a cup of coffee", "mountains", "the first snow", "an old library", "a lighthouse", "the moon",
    "a garden in spring", "a long train ride", "the desert", "a thunderstorm", "a sleepy dog", "the stars",
    "a river", "homework", "a birthday party", "the wind", "a forest path", "a robot learning to dance",
    "the sunrise", "a quiet lake", "a busy kitchen", "an empty beach", "a paper boat", "a fox in winter",
]
_SUBJECT_TEMPLATES = [
    "Write a short poem about {}.",
    "Write a haiku about {}.",
    "Write a four-line rhyming poem about {}.",
    "Write a two-sentence story about {}.",
]
_ACTIVITIES = [
    "learning a new language", "staying focused while studying", "sleeping better", "saving money",
    "starting to run", "keeping houseplants alive", "writing clear emails", "public speaking",
    "cooking on a budget", "making friends in a new city", "preparing for a job interview",
    "reducing screen time", "learning to code", "traveling light", "drinking enough water",
    "organizing a small apartment", "taking better photos with a phone", "managing stress", "reading more books",
    "giving constructive feedback", "planning a road trip", "keeping a journal", "learning to play guitar",
    "working from home", "teaching a child to ride a bike", "hosting a dinner party", "getting up early",
    "remembering names", "writing a good essay", "staying safe online",
]
_ACTIVITY_TEMPLATES = [
    "Give three tips for {}.",
    "What are the main benefits of {}?",
    "What are common mistakes people make when {}?",
    "Give a short step-by-step plan for {}.",
]
_PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("Python", "JavaScript"), ("trains", "planes"), ("books", "movies"),
    ("summer", "winter"), ("renting a home", "buying a home"), ("the Sun", "the Moon"),
    ("electric cars", "gasoline cars"), ("city life", "country life"), ("email", "phone calls"),
    ("running", "swimming"), ("paper books", "e-readers"), ("chess", "checkers"), ("oceans", "lakes"),
    ("solar power", "wind power"), ("viruses", "bacteria"), ("weather", "climate"), ("frogs", "toads"),
    ("baking", "frying"), ("laptops", "desktop computers"), ("working alone", "working in a team"),
    ("the violin", "the cello"), ("sharks", "dolphins"), ("breakfast", "dinner"),
]
_PAIR_TEMPLATES = [
    "Compare {} and {}.",
    "What are the main differences between {} and {}?",
    "Give one advantage of {0} over {1} and one advantage of {1} over {0}.",
]


def _chat_prompts() -> list[str]:
    # fixed order (no sets), so shuffling it with a seeded rng is reproducible
    out = [t.format(x) for t in _CONCEPT_TEMPLATES for x in _CONCEPTS]
    out += [t.format(x) for t in _SUBJECT_TEMPLATES for x in _SUBJECTS]
    out += [t.format(x) for t in _ACTIVITY_TEMPLATES for x in _ACTIVITIES]
    out += [t.format(a, b) for t in _PAIR_TEMPLATES for a, b in _PAIRS]
    return out


def _chat_stream(rng):
    # the pool is finite (a few hundred), so walk it in shuffled epochs rather
    # than drawing with replacement: no repeats until every prompt has been used
    prompts = _chat_prompts()
    while True:
        rng.shuffle(prompts)
        for p in prompts:
            yield Task("chat", p)


def chat_tasks(n: int, seed: int) -> list[Task]:
    return list(itertools.islice(_chat_stream(random.Random(seed)), n))


# -----------------------------------------------------------------------------
# splits and mixing

_STREAMS = {"chat": _chat_stream, "math": _math_stream, "code": _code_stream}


def split_of(prompt: str) -> str:
    # a stable hash of the text (not Python's salted hash()), so a prompt lands in
    # the same split for every seed, process and machine: train and heldout can't overlap
    h = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")
    return "heldout" if h % 1000 < HELDOUT_PER_MILLE else "train"


def _only_split(stream, split):
    misses = 0
    for task in stream:
        if split_of(task.prompt) == split:
            misses = 0
            yield task
        else:
            misses += 1
            if misses > 100_000:  # a template pool with no prompt in this split would loop forever
                raise RuntimeError(f"no {task.kind} prompts fall in the {split!r} split")


def mixed_tasks(n: int, seed: int, split: str = "train", mix=("chat", "math", "code")) -> list[Task]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}, expected one of {SPLITS}")
    mix = tuple(mix)
    if not mix:
        raise ValueError("mix must name at least one kind")
    for kind in mix:
        if kind not in KINDS:
            raise ValueError(f"unknown task kind {kind!r}, expected one of {KINDS}")
    # one independent stream per kind (seeded by kind too), so adding a kind to
    # the mix doesn't change the tasks drawn for the others
    streams = {k: _only_split(_STREAMS[k](random.Random(f"{seed}/{k}")), split) for k in dict.fromkeys(mix)}
    # round-robin: any prefix is balanced, and mixed_tasks(n) is a prefix of mixed_tasks(n + 1)
    return [next(streams[mix[i % len(mix)]]) for i in range(n)]


def default_prompts(n: int) -> list[str]:
    return [t.prompt for t in mixed_tasks(n, seed=0, split="heldout")]


# -----------------------------------------------------------------------------
# user prompt files


def load_prompts_file(path) -> list[str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BebopError(f"{path}: prompts file not found") from None
    except IsADirectoryError:
        raise BebopError(f"{path}: is a directory, expected a JSONL prompts file") from None
    except UnicodeDecodeError:
        raise BebopError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise BebopError(f"{path}: cannot read prompts file ({e.strerror})") from None

    prompts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BebopError(f'{where}: invalid JSON ({e.msg}); expected {{"prompt": "..."}}') from None
        if not isinstance(obj, dict):
            raise BebopError(f'{where}: expected a JSON object like {{"prompt": "..."}}, got {type(obj).__name__}')
        if "prompt" not in obj:
            raise BebopError(f'{where}: missing "prompt" key')
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise BebopError(f'{where}: "prompt" must be a string, got {type(prompt).__name__}')
        if not prompt.strip():
            raise BebopError(f'{where}: "prompt" is empty')
        prompts.append(prompt)
    if not prompts:
        raise BebopError(f"{path}: no prompts found (expected one JSON object per line)")
    return prompts
