"""A long-answer RL task: write out an arithmetic sequence, each term the previous one plus a fixed step.

It stands in for reasoning RL, where a rollout is hundreds of tokens and generation is most of a step: the answer
is 40-60 terms (about 200-230 tokens with SmolLM2's one-digit-per-token tokenizer), every term is one step of
arithmetic on the last, and the reward is verifiable and graded, so GRPO has a signal even where no sample is
perfect: the longest run of correct terms, in order from the first, over the number of terms.

Levels, easiest first: "count" (step 1), "step" (a step of 2-9), "mixed" (either). The default, "count", is
calibrated at T=0.7 (at T=1 a 135M model rarely finishes one): on 48 held-out prompts smollm2-135m wrote 8 whole
sequences, mean reward 0.315, 160 tokens a completion:

    PYTHONPATH=. python examples/task_accuracy.py --task sequence --difficulty count,step --n 48 \
        --max-new-tokens 320 --dtype float32 --temperature 0.7
"""

import re

from bebop.tasks.base import Task, register_reward, register_task

_INTEGER = re.compile(r"(?<![\w.])-?\d+(?![\d.]\d)")


def _prompt(start, step, n):
    # the first terms are shown: a 135M model at T=0.7 then writes the whole sequence about a third of the time
    # (examples/task_accuracy.py); asked without them, or in other words, it rarely gets past the first few
    going = "" if step == 1 else f" going up by {step}"
    return (f"List every number from {start} to {start + step * (n - 1)}{going}, separated by commas. "
            f"Start like this: {start}, {start + step}, {start + 2 * step}, ...")


def _count(rng):
    return rng.randint(10, 300), 1, rng.randint(40, 60)


def _step(rng):
    return rng.randint(1, 60), rng.randint(2, 9), rng.randint(40, 50)


SEQUENCE_LEVELS = {"count": [_count], "step": [_step], "mixed": [_count, _step]}


@register_task("sequence", difficulties=tuple(SEQUENCE_LEVELS), default="count")
def _sequence_stream(rng, difficulty):
    while True:
        start, step, n = rng.choice(SEQUENCE_LEVELS[difficulty])(rng)
        terms = ",".join(str(start + step * i) for i in range(n))
        yield Task("sequence", _prompt(start, step, n), answer=terms, difficulty=difficulty)


def sequence_reward(task: Task, completion: str) -> float:
    """The longest run of the task's terms, in order from its first term, among the integers the completion
    writes, over the number of terms: 1.0 for the whole sequence, partial credit for a correct beginning."""
    terms = [int(x) for x in task.answer.split(",")]
    written = [int(x) for x in _INTEGER.findall(completion)]
    best = 0
    for i, x in enumerate(written):
        if x != terms[0]:
            continue
        run = 0
        while run < len(terms) and i + run < len(written) and written[i + run] == terms[run]:
            run += 1
        best = max(best, run)
    return best / len(terms)


@register_reward("sequence")
def sequence_rewards(tasks: list[Task], completions: list[str]) -> list[float]:
    return [sequence_reward(t, c) for t, c in zip(tasks, completions)]
