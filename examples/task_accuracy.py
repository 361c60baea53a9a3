"""Held-out accuracy of a model on an RL task, per difficulty level: the calibration behind each task's default.

GRPO learns nothing from a group whose samples are all right or all wrong, so a task's default level should
put the starting policy between 10% and 50%. One sample per held-out prompt at the RL temperature:

    PYTHONPATH=. OMP_NUM_THREADS=1 python examples/task_accuracy.py --model smollm2-135m --task arithmetic \
        --difficulty easy,medium,hard --n 64 --max-new-tokens 192

Prints one JSON line per level: correct, n, accuracy and its 95% Wilson interval.
"""

import argparse
import json
import time

from bebop.engine.generation import generate
from bebop.models.registry import chat_ids, load_model
from bebop.rl.loop import wilson
from bebop.sampling import SamplingParams
from bebop.tasks import TASKS, rewards, rl_tasks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arithmetic", choices=sorted(TASKS))
    ap.add_argument("--difficulty", default=None, help="comma-separated levels (default: all of the task's)")
    ap.add_argument("--n", type=int, default=64, help="held-out prompts per level, one sample each")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=0, help="print this many completions per level")
    ap.add_argument("--completions", default=None, help="also write every completion and its reward to this JSONL")
    args = ap.parse_args()

    levels = args.difficulty.split(",") if args.difficulty else list(TASKS[args.task].difficulties)
    model, tok = load_model(args.model, dtype=args.dtype)
    params = SamplingParams(temperature=args.temperature)
    saved = open(args.completions, "w") if args.completions else None
    for level in levels:
        tasks = rl_tasks(args.task, args.n, seed=args.seed, split="heldout", difficulty=level)
        texts, n_tokens, t0 = [], 0, time.perf_counter()
        for i in range(0, len(tasks), args.batch_size):
            batch = tasks[i:i + args.batch_size]
            g = generate(model, [chat_ids(tok, t.prompt) for t in batch], args.max_new_tokens, params,
                         seed=args.seed + i, mode="ar")
            texts += [tok.decode(r.tokens, skip_special_tokens=True) for r in g.rollouts]
            n_tokens += sum(len(r.tokens) for r in g.rollouts)
        scores = rewards(tasks, texts)
        if saved:
            saved.writelines(json.dumps({"difficulty": level, "prompt": t.prompt, "completion": text,
                                         "reward": s}) + "\n" for t, text, s in zip(tasks, texts, scores))
        for t, text, s in list(zip(tasks, texts, scores))[:args.show]:
            print(f"--- reward {s} | {t.prompt!r}\n{text}")
        k, n = sum(s == 1.0 for s in scores), len(scores)
        lo, hi = wilson(k, n)
        print(json.dumps({"model": args.model, "dtype": args.dtype, "task": args.task, "difficulty": level, "n": n,
                          "correct": k,
                          "accuracy": round(k / n, 3), "ci95": [round(lo, 3), round(hi, 3)],
                          "mean_reward": round(sum(scores) / n, 3), "temperature": args.temperature,
                          "max_new_tokens": args.max_new_tokens, "mean_tokens": round(n_tokens / n, 1),
                          "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    if saved:
        saved.close()


if __name__ == "__main__":
    main()
