"""Built-in prompt sources: math, code and chat tasks generated from templates.

They serve three purposes:
  1. default prompts for benchmarks (the held-out split, so a draft is never
     benchmarked on prompts it was distilled on),
  2. self-distillation data for training the MTP draft (the train split),
  3. RL tasks with verifiable rewards (math answers, code asserts, long arithmetic sequences).

RL API: rl_tasks(name, n, seed, split, difficulty) -> [Task] for name in TASKS; task.reward(completion)
and rewards(tasks, completions) give floats in [0, 1]. TASKS[name].difficulties lists the levels, easiest
first; TASKS[name].default is the level calibrated for the default model (examples/task_accuracy.py).

Adding a task is one file: a stream of Tasks decorated with @register_task(name, difficulties, default) and,
for a new kind of answer, a batch reward decorated with @register_reward(kind); then import it below.

Everything is generated from templates with a seeded random.Random, so a
(n, seed, split) triple always gives the same tasks on every machine. Tasks
are deliberately simple: the target models are small (SmolLM2-135M).
"""

# each kind registers itself on import; this order (chat, math, code) is KINDS' order
from bebop.tasks.base import (HELDOUT_PER_MILLE, REWARDS, SPLITS, STREAMS, TASKS, Task, TaskSource, default_prompts,
                               mixed_tasks, parse_mix, register_kind, register_reward, register_task, rewards, rl_tasks, split_of)
from bebop.tasks.chat import chat_tasks
from bebop.tasks.arithmetic import ANSWER_MARKER, ARITHMETIC_LEVELS, MATH_INSTRUCTION, check_math_answer, math_tasks
from bebop.tasks.code import CODE_INSTRUCTION, CODE_LEVELS, code_rewards, code_tasks, extract_code
from bebop.tasks.sequence import SEQUENCE_LEVELS, sequence_reward
from bebop.tasks.files import load_prompts_file

KINDS = tuple(STREAMS)
