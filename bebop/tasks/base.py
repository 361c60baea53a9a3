"""The task record, the kind registry, held-out splits and mixing.

Every task kind lives in its own module (arithmetic, code, chat) and registers its prompt stream here with
`@register_kind`; adding a kind is one new file plus its import in bebop/tasks/__init__.py.
"""

import hashlib
import random
from dataclasses import dataclass, field

SPLITS = ("train", "heldout")
HELDOUT_PER_MILLE = 100  # ~10% of distinct prompts are held out


@dataclass(frozen=True)
class Task:
    kind: str  # "math", "code" or "chat"
    prompt: str  # the user message (plain text; the caller applies the chat template)
    answer: str | None = None  # math: the exact final answer, e.g. "42"; else None
    tests: str | None = None  # code: python assert lines checking the requested function; else None
    # code: a reference implementation that passes `tests`. Never shown to the
    # model; it exists so the test suite can prove every generated task is solvable.
    solution: str | None = field(default=None, repr=False)


# kind -> stream(rng) yielding Tasks forever; filled by each kind's module
STREAMS = {}


def register_kind(kind: str):
    def register(stream):
        STREAMS[kind] = stream
        return stream
    return register


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
        if kind not in STREAMS:
            raise ValueError(f"unknown task kind {kind!r}, expected one of {tuple(STREAMS)}")
    # one independent stream per kind (seeded by kind too), so adding a kind to
    # the mix doesn't change the tasks drawn for the others
    streams = {k: _only_split(STREAMS[k](random.Random(f"{seed}/{k}")), split) for k in dict.fromkeys(mix)}
    # round-robin: any prefix is balanced, and mixed_tasks(n) is a prefix of mixed_tasks(n + 1)
    return [next(streams[mix[i % len(mix)]]) for i in range(n)]


def default_prompts(n: int) -> list[str]:
    return [t.prompt for t in mixed_tasks(n, seed=0, split="heldout")]
