"""An RL task's prompts as a prompts file for `bebop make-data --prompts`, so that a pre-RL draft is distilled
on the prompts the RL run trains on (the paper's recipe): the train split, in the order `bebop rl` draws it.

    python examples/task_prompts.py --task arithmetic --num 800 --seed 0 --out runs/rl26/arithmetic-prompts.jsonl
"""
import argparse
import json

from bebop.tasks import rl_tasks

parser = argparse.ArgumentParser()
parser.add_argument("--task", default="arithmetic")
parser.add_argument("--difficulty", default=None)
parser.add_argument("--num", type=int, default=800)
parser.add_argument("--seed", type=int, default=0, help="the RL run's --seed: the same prompts in the same order")
parser.add_argument("--split", default="train", choices=("train", "heldout"))
parser.add_argument("--out", required=True)
args = parser.parse_args()

tasks = rl_tasks(args.task, args.num, args.seed, args.split, args.difficulty)
with open(args.out, "w") as f:
    for t in tasks:
        f.write(json.dumps({"prompt": t.prompt}) + "\n")
print(f"wrote {len(tasks)} {args.task} prompts ({args.split} split, seed {args.seed}) to {args.out}")
