"""The task record, the registries, held-out splits and mixing.

Every task kind lives in its own module and registers itself here with decorators:
  @register_kind(kind)          its endless prompt stream, for benchmark prompts and distillation data (mixed_tasks)
  @register_reward(kind)        its batch reward, rewards(tasks, completions) -> floats in [0, 1]
  @register_task(name, levels)  an RL task with difficulty levels (rl_tasks, TASKS)
Adding a task is one new file plus its import in bebop/tasks/__init__.py.
"""

import hashlib
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bebop.errors import BebopError

SPLITS = ("train", "heldout")
HELDOUT_PER_MILLE = 100  # ~10% of distinct prompts are held out


@dataclass(frozen=True)
class Task:
    kind: str  # "math", "code", "chat" or "sequence"
    prompt: str  # the user message (plain text; the caller applies the chat template)
    answer: str | None = None  # math: the exact final answer, e.g. "42"; sequence: its terms, "3,7,11"; else None
    tests: str | None = None  # code: python assert lines checking the requested function; else None
    # code: a reference implementation that passes `tests`. Never shown to the
    # model; it exists so the test suite can prove every generated task is solvable.
    solution: str | None = field(default=None, repr=False)
    difficulty: str | None = None  # RL tasks: the level they were drawn at (rl_tasks); else None

    def reward(self, completion: str) -> float:
        """The verifiable reward of one completion, in [0, 1]."""
        return rewards([self], [completion])[0]


# kind -> stream(rng) yielding Tasks forever; filled by each kind's module
STREAMS = {}


def register_kind(kind: str):
    def register(stream):
        STREAMS[kind] = stream
        return stream
    return register


# kind -> batch reward fn(tasks, completions) -> list[float]; a batch lets code run its sandboxes in parallel
REWARDS = {}


def register_reward(kind: str):
    def register(fn):
        REWARDS[kind] = fn
        return fn
    return register


def rewards(tasks: list[Task], completions: list[str]) -> list[float]:
    """Reward of each completion for its task, in [0, 1]; tasks of different kinds may be mixed."""
    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
    out = [0.0] * len(tasks)
    for kind in dict.fromkeys(t.kind for t in tasks):
        if kind not in REWARDS:
            raise ValueError(f"{kind!r} tasks have no verifiable reward (rewarded kinds: {', '.join(REWARDS)})")
        idx = [i for i, t in enumerate(tasks) if t.kind == kind]
        for i, r in zip(idx, REWARDS[kind]([tasks[i] for i in idx], [completions[i] for i in idx])):
            out[i] = float(r)
    return out


@dataclass(frozen=True)
class TaskSource:
    """An RL task: `stream(rng, difficulty)` yields Tasks forever; `difficulties` from easiest to hardest."""
    stream: Callable[[random.Random, str], Iterator[Task]]
    difficulties: tuple[str, ...]
    default: str  # calibrated so the default model starts between 10% and 50% (examples/task_accuracy.py)


# RL task name -> TaskSource
TASKS: dict[str, TaskSource] = {}


def register_task(name: str, difficulties, default: str):
    if default not in difficulties:
        raise ValueError(f"default difficulty {default!r} is not one of {tuple(difficulties)}")

    def register(stream):
        TASKS[name] = TaskSource(stream, tuple(difficulties), default)
        return stream
    return register


def rl_tasks(name: str, n: int, seed: int, split: str = "train", difficulty: str | None = None) -> list[Task]:
    """n tasks of RL task `name`, all in `split`; the same (name, n, seed, split, difficulty) always gives the
    same tasks, and rl_tasks(n) is a prefix of rl_tasks(n + 1)."""
    if name not in TASKS:
        raise BebopError(f"unknown task '{name}' (choose from {', '.join(TASKS)})")
    source = TASKS[name]
    difficulty = source.default if difficulty is None else difficulty
    if difficulty not in source.difficulties:
        raise BebopError(f"unknown difficulty '{difficulty}' for task '{name}' "
                         f"(choose from {', '.join(source.difficulties)})")
    if split not in SPLITS:
        raise BebopError(f"unknown split '{split}' (choose from {', '.join(SPLITS)})")
    if n < 0:
        raise BebopError(f"number of tasks must be >= 0, got {n}")
    stream = source.stream(random.Random(f"{seed}/{name}/{difficulty}"), difficulty)
    return list(itertools.islice(_only_split(stream, split), n))


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
    """n tasks of the kinds in `mix`: a sequence of kinds (equal shares) or {kind: weight}. Any prefix follows
    the weights as closely as whole tasks allow, and mixed_tasks(n) is a prefix of mixed_tasks(n + 1)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}, expected one of {SPLITS}")
    weights = dict(mix) if isinstance(mix, dict) else {k: 1.0 for k in mix}
    if not weights:
        raise ValueError("mix must name at least one kind")
    for kind, w in weights.items():
        if kind not in STREAMS:
            raise ValueError(f"unknown task kind {kind!r}, expected one of {tuple(STREAMS)}")
        if not w > 0:
            raise ValueError(f"the weight of {kind!r} must be > 0, got {w}")
    total = sum(weights.values())
    share = {k: w / total for k, w in weights.items()}
    # one independent stream per kind (seeded by kind too), so adding a kind to
    # the mix doesn't change the tasks drawn for the others
    streams = {k: _only_split(STREAMS[k](random.Random(f"{seed}/{k}")), split) for k in weights}
    # deficit round-robin: task i goes to the kind furthest below its share of i + 1 tasks (ties: mix order);
    # with equal weights this is plain round-robin
    counts, out = dict.fromkeys(weights, 0), []
    for i in range(n):
        kind = max(weights, key=lambda k: share[k] * (i + 1) - counts[k])
        counts[kind] += 1
        out.append(next(streams[kind]))
    return out


def parse_mix(text: str) -> dict[str, float]:
    """'math=0.4,code=0.3,chat=0.3' -> {kind: weight}; a clear BebopError for anything else."""
    weights = {}
    for part in text.split(","):
        kind, eq, w = part.strip().partition("=")
        try:
            value = float(w)
        except ValueError:
            value = None
        if not eq or value is None or not value > 0 or value == float("inf"):
            raise BebopError(f"--mix: '{part.strip()}' is not KIND=WEIGHT with a weight > 0 (e.g. math=0.4,code=0.3,chat=0.3)")
        if kind not in STREAMS:
            raise BebopError(f"--mix: unknown task kind '{kind}' (choose from {', '.join(STREAMS)})")
        if kind in weights:
            raise BebopError(f"--mix: '{kind}' given twice")
        weights[kind] = value
    return weights


def default_prompts(n: int) -> list[str]:
    return [t.prompt for t in mixed_tasks(n, seed=0, split="heldout")]
