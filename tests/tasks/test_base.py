import itertools

from bebop.tasks import TASKS, Task, register_reward, register_task, rewards, rl_tasks
from bebop.tasks.base import REWARDS


def test_a_new_task_is_a_stream_and_a_reward():
    @register_task("echo", difficulties=("short", "long"), default="short")
    def echo_stream(rng, difficulty):
        width = 3 if difficulty == "short" else 12
        for i in itertools.count():
            word = "".join(rng.choice("abcdef") for _ in range(width))
            yield Task("echo", f"Repeat exactly: {word} ({i})", answer=word, difficulty=difficulty)

    @register_reward("echo")
    def echo_rewards(tasks, completions):
        return [float(c.strip() == t.answer) for t, c in zip(tasks, completions)]

    try:
        tasks = rl_tasks("echo", 4, seed=0, split="heldout", difficulty="long")
        assert [len(t.answer) for t in tasks] == [12] * 4
        assert rl_tasks("echo", 1, seed=0)[0].difficulty == "short"
        assert rewards(tasks, [tasks[0].answer, "no", tasks[2].answer + " ", ""]) == [1.0, 0.0, 1.0, 0.0]
        # mixed kinds in one batch come back in order
        math = rl_tasks("arithmetic", 1, seed=0)[0]
        assert rewards([math, tasks[1]], [f"Answer: {math.answer}", tasks[1].answer]) == [1.0, 1.0]
    finally:
        TASKS.pop("echo")
        REWARDS.pop("echo")
